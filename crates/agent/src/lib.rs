//! The `hyphae` agent: configuration, device setup, the event loop wiring the vswitch to the
//! overlay, and the control socket.

pub mod config;
pub mod control;
pub mod dns;
pub mod join;
pub mod lan;
pub mod membership;
pub mod run;
mod underlay;
