//! What the control thread asks of the host: a namespace's devices, its address and routes,
//! and the seeds of its cores' random choices. The agent's host is the kernel and the OS
//! random number generator; the driver's deterministic tests (`sim`) keep devices in
//! memory and seed from a counter.

use std::net::Ipv4Addr;
use std::sync::Arc;

use anyhow::Result;
use ipnet::Ipv4Net;

use super::workers;
use crate::config::{Address, Mode, Namespace};

/// Where a namespace's devices, addresses and routes live.
pub(crate) enum Host {
    /// This machine's kernel.
    Kernel,
    /// The driver's tests: what would have been set is written down.
    #[cfg(test)]
    Memory(Memory),
}

/// The devices, addresses and routes a test's host was given, its seeds and its clock.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct Memory {
    /// (device, address, prefix length), in the order they were set.
    pub(crate) addresses: Vec<(String, Ipv4Addr, u8)>,
    /// (device, IPv6 address, prefix length), in the order they were set.
    pub(crate) addresses6: Vec<(String, Option<std::net::Ipv6Addr>, u8)>,
    /// What sets this host's seeds apart from every other's: the agent and its start.
    seed_prefix: [u8; 2],
    /// Seeds handed out so far.
    seeds: u8,
    /// The virtual clock's start and the Unix time it stands for.
    epoch: (std::time::Instant, u64),
}

#[cfg(test)]
impl Memory {
    /// The host of agent `agent`'s `start`th start, on a clock that reads Unix time
    /// `epoch.1` at `epoch.0`.
    pub(crate) fn new(agent: u8, start: u8, epoch: (std::time::Instant, u64)) -> Self {
        Self {
            addresses: Vec::new(),
            addresses6: Vec::new(),
            seed_prefix: [agent, start],
            seeds: 0,
            epoch,
        }
    }
}

/// The control thread's end of a namespace's TAP: the first queue, which it writes through.
pub(crate) enum Device {
    Tap(workers::Tap),
    /// The driver's tests: the frames written, oldest first.
    #[cfg(test)]
    Memory(Vec<Vec<u8>>),
}

/// What a namespace runs on, once created.
pub(crate) struct Devices {
    /// The control thread's end of the TAP.
    pub(crate) tap: Device,
    /// One queue per worker, the first being `tap`'s.
    pub(crate) queues: Vec<workers::Tap>,
    /// The TAP has offloads on: a virtio-net header leads every frame.
    pub(crate) offload: bool,
    /// UDP datagrams are coalesced too.
    pub(crate) udp: bool,
    /// Router and hybrid modes: the LAN bridge's links.
    pub(crate) lan: Option<crate::lan::Lan>,
}

impl Host {
    /// Creates namespace `cfg`'s TAP `tap_name` with `queues` queues (one per worker) and,
    /// in router and hybrid modes, attaches it to the LAN.
    pub(crate) fn create(
        &mut self,
        cfg: &Namespace,
        tap_name: &str,
        macs: Macs,
        offload: bool,
        queues: usize,
    ) -> Result<Devices> {
        match self {
            Self::Kernel => {
                let (tap, offload) =
                    crate::setup::create_tap(cfg, tap_name, macs.tap, offload, queues)?;
                let udp = offload && tap.udp_gso();
                let more = crate::setup::more_queues(&tap, queues)?;
                if queues > 1 {
                    match crate::setup::steer_tap(&tap, queues) {
                        Ok(()) => tracing::debug!(
                            device = tap_name,
                            queues,
                            "TAP queues steered by flow shard"
                        ),
                        Err(e) => tracing::info!(
                            device = tap_name,
                            error = %e,
                            "TAP queue steering refused: the kernel picks each flow's queue (a one-way flow may move between workers)"
                        ),
                    }
                }
                let lan = match cfg.mode {
                    Mode::Interface => None,
                    Mode::Router | Mode::Hybrid => {
                        Some(crate::lan::attach(cfg, tap_name, macs.device)?)
                    }
                };
                if let (Mode::Hybrid, Address::Static(a), Some(subnet)) =
                    (cfg.mode, cfg.address, cfg.subnet)
                {
                    crate::lan::set_address(&cfg.device, a, subnet.prefix_len())?;
                }
                let tap = Arc::new(tap);
                let queues = std::iter::once(tap.clone())
                    .chain(more.into_iter().map(Arc::new))
                    .collect();
                Ok(Devices {
                    tap: Device::Tap(tap),
                    queues,
                    offload,
                    udp,
                    lan,
                })
            }
            #[cfg(test)]
            Self::Memory(_) => Ok(Devices {
                tap: Device::Memory(Vec::new()),
                queues: Vec::new(),
                offload: false,
                udp: false,
                lan: None,
            }),
        }
    }

    /// Gives `device` `address`/`prefix`.
    pub(crate) fn set_address(
        &mut self,
        device: &str,
        address: Ipv4Addr,
        prefix: u8,
    ) -> Result<()> {
        match self {
            Self::Kernel => crate::lan::set_address(device, address, prefix),
            #[cfg(test)]
            Self::Memory(m) => {
                m.addresses.push((device.to_string(), address, prefix));
                Ok(())
            }
        }
    }

    /// Gives `device` the IPv6 `address` in a prefix of `prefix` bits (none: takes its
    /// global IPv6 addresses away). Link-local addresses stay: neighbour discovery needs
    /// them.
    pub(crate) fn set_address6(
        &mut self,
        device: &str,
        address: Option<std::net::Ipv6Addr>,
        prefix: u8,
    ) -> Result<()> {
        match self {
            Self::Kernel => crate::lan::set_address6(device, address, prefix),
            #[cfg(test)]
            Self::Memory(m) => {
                m.addresses6.push((device.to_string(), address, prefix));
                Ok(())
            }
        }
    }

    /// Routes `net` through `gateway` on `device`.
    pub(crate) fn set_route(
        &mut self,
        device: &str,
        net: Ipv4Net,
        gateway: Ipv4Addr,
    ) -> Result<()> {
        match self {
            Self::Kernel => crate::lan::set_route(device, net, gateway),
            #[cfg(test)]
            Self::Memory(_) => Ok(()),
        }
    }

    /// Removes the route to `net` on `device`.
    pub(crate) fn del_route(&mut self, device: &str, net: Ipv4Net) -> Result<()> {
        match self {
            Self::Kernel => crate::lan::del_route(device, net),
            #[cfg(test)]
            Self::Memory(_) => Ok(()),
        }
    }

    /// A seed for a core's random choices: from the OS, or (tests) the next of a counter.
    pub(crate) fn seed(&mut self) -> Result<[u8; 32]> {
        match self {
            Self::Kernel => crate::setup::os_seed(),
            #[cfg(test)]
            Self::Memory(m) => {
                m.seeds = m.seeds.wrapping_add(1);
                let mut seed = [m.seeds; 32];
                seed[..2].copy_from_slice(&m.seed_prefix);
                Ok(seed)
            }
        }
    }

    /// Seconds since the Unix epoch at `now`: records and certificates carry wall-clock
    /// times. The kernel's clock, or (tests) the virtual one.
    pub(crate) fn wall(&self, now: std::time::Instant) -> u64 {
        match self {
            // The kernel's clock needs no instant.
            Self::Kernel => {
                let _ = now;
                super::unix_now()
            }
            #[cfg(test)]
            Self::Memory(m) => m.epoch.1 + now.saturating_duration_since(m.epoch.0).as_secs(),
        }
    }
}

/// A namespace's two MACs: its TAP's, and the device's its members see.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Macs {
    pub(crate) tap: [u8; 6],
    pub(crate) device: [u8; 6],
}

impl Device {
    /// Writes one frame; whether it was taken.
    pub(crate) fn write(&mut self, offload: bool, frame: &[u8]) -> bool {
        match self {
            Self::Tap(tap) => workers::write_to(tap, offload, frame),
            #[cfg(test)]
            Self::Memory(frames) => {
                frames.push(frame.to_vec());
                true
            }
        }
    }
}
