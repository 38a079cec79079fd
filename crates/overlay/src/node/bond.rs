//! Bonding over a member's underlay links (issue 32, item 3; the KU paper's V-channel).
//!
//! An agent with several uplinks tells each member where it listens on each and at what
//! rate ([`Control::Uplinks`], sent only to members whose announcement said they read it).
//! The member then keeps a [`Bond`] for that tunnel: each flow of the tunnel's traffic is
//! placed on one link, by the links' rates, and stays there while the link lives; a link
//! that stops answering for [`DEAD_AFTER`](hyphae_vswitch::qos::bond::DEAD_AFTER) moves its
//! flows to the others at their next packet.
//!
//! - **Nothing unconfirmed carries data.** An announced link is probed (the in-tunnel probe
//!   of `relay.rs`, down that link) and takes flows only once something the member's keys
//!   produced came back on it: a member cannot point our traffic at an address that is
//!   not its own.
//! - **A bonded address never roams the tunnel.** WireGuard roaming would move the
//!   endpoint to whichever link spoke last; a packet from a bonded link only keeps that
//!   link alive ([`Peer::heard`](super::peer::Peer)).
//! - **Control stays on the endpoint** (handshakes, keepalives, announcements), moved to a
//!   live link while the endpoint's own link is dead.
//! - **Relays win.** A relayed tunnel sends through its relay; bonding is for members
//!   reached directly.

use std::net::SocketAddr;
use std::time::Instant;

use hyphae_vswitch::qos::bond::{Bond, LinkStats};

use super::peer::Route;
use super::{Node, PeerHandle};
use crate::wire::{Control, MAX_UPLINKS};

/// One link of a tunnel's bond, for status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BondLink {
    /// The member's address on it.
    pub endpoint: SocketAddr,
    /// Its counters.
    pub stats: LinkStats,
}

/// The links a member announced, and the bond over them.
#[derive(Debug, Clone)]
pub(super) struct Bonded {
    pub(super) bond: Bond,
    pub(super) links: Vec<(SocketAddr, u64)>,
}

impl Bonded {
    /// The link at `addr`, if it is one.
    pub(super) fn link_of(&self, addr: SocketAddr) -> Option<usize> {
        self.links.iter().position(|(a, _)| *a == addr)
    }

    /// Where control goes instead of `endpoint` when `endpoint` is a link of the bond that
    /// died and another lives.
    pub(super) fn instead_of(&self, endpoint: SocketAddr) -> Option<SocketAddr> {
        let at = self.link_of(endpoint)?;
        if self.bond.is_alive(at) {
            return None;
        }
        (0..self.links.len())
            .find(|&i| self.bond.is_alive(i))
            .map(|i| self.links[i].0)
    }

    pub(super) fn status(&self) -> Vec<BondLink> {
        self.links
            .iter()
            .zip(self.bond.links())
            .map(|(&(endpoint, _), stats)| BondLink { endpoint, stats })
            .collect()
    }
}

/// Why a list of uplinks is refused (config time: the agent says which).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UplinksError {
    /// One uplink is no bond.
    #[error("one uplink makes no bond: give two or more, or none")]
    One,
    /// More than a member reads.
    #[error("at most {MAX_UPLINKS} uplinks")]
    TooMany,
    /// The same address twice.
    #[error("uplink {0} is listed twice")]
    Duplicate(SocketAddr),
    /// A rate of zero.
    #[error("uplink {0} has a rate of zero")]
    ZeroRate(SocketAddr),
}

impl Node {
    /// Our underlay links, where members reach us on each and the rate each takes (bits a
    /// second): members that read them bond to us over all of them. None (the default):
    /// members reach us at the one address they know.
    pub fn set_uplinks(&mut self, uplinks: Vec<(SocketAddr, u64)>) -> Result<(), UplinksError> {
        check_uplinks(&uplinks)?;
        self.uplinks = uplinks;
        let handles: Vec<PeerHandle> = self
            .handles()
            .filter(|&h| self.peer(h).is_some_and(|p| p.speaks_uplinks))
            .collect();
        for handle in handles {
            self.send_uplinks(handle);
        }
        Ok(())
    }

    /// Tells `handle` our uplinks, if it reads them.
    pub(super) fn send_uplinks(&mut self, handle: PeerHandle) {
        if self.peer(handle).is_some_and(|p| p.speaks_uplinks) {
            let packet = Control::Uplinks(self.uplinks.clone()).emit();
            self.send_control(handle, &packet, None);
        }
    }

    /// The member of `handle` announced its uplinks: a bond over them, each link probed
    /// before it carries data. Fewer than two (or a list we would not send): no bond.
    pub(super) fn handle_uplinks(
        &mut self,
        now: Instant,
        handle: PeerHandle,
        links: Vec<(SocketAddr, u64)>,
    ) {
        let Some(peer) = self.peer_mut(handle) else {
            return;
        };
        if check_uplinks(&links).is_err() || links.len() < 2 {
            if peer.bond.take().is_some() {
                tracing::info!(peer = ?peer.id, "member bonds no more");
            }
            return;
        }
        if peer.bond.as_ref().is_some_and(|b| b.links == links) {
            return;
        }
        tracing::info!(peer = ?peer.id, ?links, "member bonds over its uplinks");
        let rates: Vec<u64> = links.iter().map(|(_, r)| *r).collect();
        peer.bond = Some(Bonded {
            bond: Bond::unconfirmed(now, &rates),
            links,
        });
        self.run_bond(now, handle);
    }

    /// Probes the bonded links of every tunnel that asks for it.
    pub(super) fn run_bonds(&mut self, now: Instant) {
        let bonded: Vec<PeerHandle> = self
            .handles()
            .filter(|&h| self.peer(h).is_some_and(|p| p.bond.is_some()))
            .collect();
        for handle in bonded {
            self.run_bond(now, handle);
        }
    }

    /// Probes the links of `handle`'s bond that are due (with a session only: a probe
    /// without one would start a handshake down the link).
    fn run_bond(&mut self, now: Instant, handle: PeerHandle) {
        loop {
            let Some(peer) = self.peer_mut(handle) else {
                return;
            };
            if !peer.has_session() {
                return;
            }
            let Some(b) = peer.bond.as_mut() else {
                return;
            };
            let Some(link) = b.bond.poll_probe(now) else {
                return;
            };
            let to = b.links[link].0;
            self.probe(now, handle, Route::Direct(to));
        }
    }

    /// When a bonded link is next due a probe or may die.
    pub(super) fn poll_bond_timeout(&self) -> Option<Instant> {
        self.peers
            .iter()
            .flatten()
            .filter_map(|p| p.bond.as_ref()?.bond.poll_timeout())
            .min()
    }

    /// The link host packet `packet` takes to `handle` (its flow's), when the tunnel is
    /// bonded, direct, and has a live link. An unbonded tunnel costs one check.
    pub(super) fn bonded_route(&mut self, handle: PeerHandle, packet: &[u8]) -> Option<Route> {
        let now = self.last_input?;
        let peer = self.peer_mut(handle)?;
        let b = peer.bond.as_mut().filter(|_| !peer.relayed)?;
        if !b.bond.any_alive() {
            return None;
        }
        let link = b
            .bond
            .pick(now, super::shared::flow_hash(packet), packet.len())?;
        Some(Route::Direct(b.links[link].0))
    }
}

/// Whether `links` may be [`Node::set_uplinks`]: none, or two to [`MAX_UPLINKS`], distinct,
/// none at rate zero.
pub fn check_uplinks(links: &[(SocketAddr, u64)]) -> Result<(), UplinksError> {
    if links.len() > MAX_UPLINKS {
        return Err(UplinksError::TooMany);
    }
    for (i, (addr, rate)) in links.iter().enumerate() {
        if *rate == 0 {
            return Err(UplinksError::ZeroRate(*addr));
        }
        if links[..i].iter().any(|(a, _)| a == addr) {
            return Err(UplinksError::Duplicate(*addr));
        }
    }
    if links.len() == 1 {
        return Err(UplinksError::One);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
