//! The `hyphae` agent: configuration, device setup, the event loop wiring the vswitch to the
//! overlay, the control socket, and the namespace testbed used by the demo and the tests.

pub mod config;
pub mod control;
mod control_server;
mod datapath;
pub mod demo;
mod driver;
mod events;
pub mod join;
pub mod lan;
mod services;
pub mod setup;
mod status;
pub mod testbed;
mod underlay;
