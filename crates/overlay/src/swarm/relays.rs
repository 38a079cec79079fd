//! Which members this agent keeps a circuit relay reservation at: up to
//! [`RELAY_RESERVATIONS`] of those it dialled itself (so it knows they are reachable),
//! bootstrap members first. The swarm glue asks for what [`Relays::poll_reserve`] returns
//! and reports back how each reservation goes.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use libp2p::core::transport::ListenerId;
use libp2p::multiaddr::Protocol;

use super::{Multiaddr, NetworkId};

/// Members an agent keeps a relay reservation at.
pub const RELAY_RESERVATIONS: usize = 2;

/// How often missing relay reservations are sought again.
pub const RESERVE_INTERVAL: Duration = Duration::from_secs(10);

/// How long a member that refused a reservation (or dropped it unconfirmed) is not asked.
pub const RESERVE_BACKOFF: Duration = Duration::from_secs(300);

/// Relay reservations, held and sought.
pub(super) struct Relays {
    /// Members we hold an outbound direct connection to, and the address we dialled:
    /// relay candidates, since we reached them.
    dialled: HashMap<NetworkId, Multiaddr>,
    /// Relay reservations, pending or held, by relay.
    reservations: HashMap<NetworkId, ListenerId>,
    /// Relays whose reservation is confirmed.
    reserved: HashSet<NetworkId>,
    /// Members that refused a reservation, and until when they are not asked again.
    refused: HashMap<NetworkId, Instant>,
    next_reserve: Instant,
}

impl Relays {
    pub(super) fn new(now: Instant) -> Self {
        Self {
            dialled: HashMap::new(),
            reservations: HashMap::new(),
            reserved: HashSet::new(),
            refused: HashMap::new(),
            next_reserve: now + RESERVE_INTERVAL,
        }
    }

    /// We opened a direct connection to `peer` at `addr`: a candidate, asked at once if a
    /// reservation is missing.
    pub(super) fn handle_dialled(&mut self, now: Instant, peer: NetworkId, addr: Multiaddr) {
        self.dialled.insert(peer, addr);
        if self.reservations.len() < RELAY_RESERVATIONS {
            self.next_reserve = now;
        }
    }

    /// `peer` has no connection left.
    pub(super) fn handle_disconnected(&mut self, peer: &NetworkId) {
        self.dialled.remove(peer);
    }

    /// The relayed listener `listener` asks `relay` for a reservation.
    pub(super) fn handle_listening(&mut self, relay: NetworkId, listener: ListenerId) {
        self.reservations.insert(relay, listener);
    }

    /// `relay` confirmed (or renewed) its reservation.
    pub(super) fn handle_accepted(&mut self, relay: NetworkId) {
        self.reserved.insert(relay);
    }

    /// A listener closed: if it was a reservation, returns its relay.
    pub(super) fn handle_listener_closed(
        &mut self,
        now: Instant,
        listener: ListenerId,
    ) -> Option<NetworkId> {
        let relay = self
            .reservations
            .iter()
            .find(|(_, l)| **l == listener)
            .map(|(r, _)| *r)?;
        self.reservations.remove(&relay);
        if !self.reserved.remove(&relay) {
            // Refused, or lost before it was granted: ask others first.
            self.refused.insert(relay, now + RESERVE_BACKOFF);
        }
        Some(relay)
    }

    /// The relays to ask now, each with its circuit address to listen on; report each
    /// listener with [`Relays::handle_listening`].
    pub(super) fn poll_reserve(
        &mut self,
        now: Instant,
        bootstrap: &[Multiaddr],
    ) -> Vec<(NetworkId, Multiaddr)> {
        if now < self.next_reserve || self.reservations.len() >= RELAY_RESERVATIONS {
            return Vec::new();
        }
        self.next_reserve = now + RESERVE_INTERVAL;
        self.refused.retain(|_, until| *until > now);
        let mut candidates: Vec<(NetworkId, Multiaddr)> = self
            .dialled
            .iter()
            .filter(|(p, _)| !self.reservations.contains_key(p) && !self.refused.contains_key(p))
            .map(|(p, a)| (*p, a.clone()))
            .collect();
        // Bootstrap members first, as we dialled them first.
        candidates.sort_by_key(|(_, a)| !bootstrap.contains(a));
        let wanted = RELAY_RESERVATIONS - self.reservations.len();
        candidates
            .into_iter()
            .take(wanted)
            .map(|(relay, addr)| {
                let circuit = addr.with(Protocol::P2p(relay)).with(Protocol::P2pCircuit);
                (relay, circuit)
            })
            .collect()
    }

    /// When [`Relays::poll_reserve`] may have relays to ask.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        (self.reservations.len() < RELAY_RESERVATIONS).then_some(self.next_reserve)
    }

    /// The relays holding a confirmed reservation, sorted.
    pub(super) fn reserved(&self) -> Vec<NetworkId> {
        let mut relays: Vec<NetworkId> = self.reserved.iter().copied().collect();
        relays.sort();
        relays
    }
}
