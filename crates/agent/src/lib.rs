//! The `hyphae` agent: configuration, device setup, the event loop wiring the vswitch to the
//! overlay, the control socket, and the namespace testbed used by the demo and the tests.

pub mod config;
pub mod control;
pub mod demo;
pub mod dns;
pub mod join;
pub mod lan;
pub mod membership;
pub mod run;
pub mod testbed;
mod underlay;
