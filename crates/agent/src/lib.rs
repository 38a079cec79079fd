//! The `hyphae` agent: configuration, device setup, the event loop wiring the vswitch to the
//! overlay, and the control socket.

pub mod cloud_init;
pub mod config;
pub mod control;
mod control_server;
mod datapath;
pub mod doctor;
mod driver;
mod events;
pub mod join;
pub mod lan;
mod metrics;
mod migration;
mod netwatch;
mod notify;
mod progress;
mod run;
mod services;
pub mod setup;
mod status;
mod topology;
mod underlay;
mod web;
mod workers;
