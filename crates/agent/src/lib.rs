//! The `hyphae` agent: configuration, device setup, the event loop wiring the vswitch to the
//! overlay, and the control socket.

pub mod ca;
pub mod cloud_init;
pub mod config;
pub mod control;
mod control_server;
pub mod doctor;
mod driver;
pub mod join;
pub mod lan;
mod metrics;
mod netwatch;
mod notify;
mod progress;
pub mod setup;
mod topology;
mod underlay;
mod web;

pub use driver::up;
