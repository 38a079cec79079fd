//! Which members this agent keeps a circuit relay reservation at: up to
//! [`RELAY_RESERVATIONS`] of those it dialled itself (so it knows they are reachable) and
//! that proved they are members, bootstrap members first. A relay serves proven members
//! only, and our proof may still be on its way when we ask: a refused reservation is asked
//! again after [`RESERVE_RETRY`], doubling up to [`RESERVE_BACKOFF`]. The swarm glue asks for what [`Relays::poll_reserve`] returns
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

/// The first wait before a member that refused a reservation (or dropped it unconfirmed)
/// is asked again: about the time our membership proof takes to reach it.
pub const RESERVE_RETRY: Duration = Duration::from_secs(1);

/// The longest wait before a member that keeps refusing reservations is asked again.
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
    /// Refusals in a row, by member: the wait doubles with each.
    refusals: HashMap<NetworkId, u32>,
    next_reserve: Instant,
}

impl Relays {
    pub(super) fn new(now: Instant) -> Self {
        Self {
            dialled: HashMap::new(),
            reservations: HashMap::new(),
            reserved: HashSet::new(),
            refused: HashMap::new(),
            refusals: HashMap::new(),
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

    /// `peer` proved it is a member: a candidate now, if we dialled it.
    pub(super) fn handle_proven(&mut self, now: Instant, peer: &NetworkId) {
        if self.dialled.contains_key(peer) && self.reservations.len() < RELAY_RESERVATIONS {
            self.next_reserve = self.next_reserve.min(now);
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
        self.refusals.remove(&relay);
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
            // Refused, or lost before it was granted: ask others first, and this one again
            // later (sooner the first times: our proof may have been on its way).
            let n = self.refusals.entry(relay).or_insert(0);
            let wait = RESERVE_RETRY
                .saturating_mul(1 << (*n).min(16))
                .min(RESERVE_BACKOFF);
            *n = n.saturating_add(1);
            self.refused.insert(relay, now + wait);
            self.next_reserve = self.next_reserve.min(now + wait);
        }
        Some(relay)
    }

    /// The relays to ask now among the members `is_member` names, each with its circuit
    /// address to listen on; report each listener with [`Relays::handle_listening`].
    pub(super) fn poll_reserve(
        &mut self,
        now: Instant,
        bootstrap: &[Multiaddr],
        is_member: impl Fn(&NetworkId) -> bool,
    ) -> Vec<(NetworkId, Multiaddr)> {
        if now < self.next_reserve || self.reservations.len() >= RELAY_RESERVATIONS {
            return Vec::new();
        }
        self.next_reserve = now + RESERVE_INTERVAL;
        self.refused.retain(|_, until| *until > now);
        let mut candidates: Vec<(NetworkId, Multiaddr)> = self
            .dialled
            .iter()
            .filter(|(p, _)| {
                is_member(p) && !self.reservations.contains_key(p) && !self.refused.contains_key(p)
            })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> NetworkId {
        libp2p::identity::Keypair::generate_ed25519()
            .public()
            .to_peer_id()
    }

    fn addr(port: u16) -> Multiaddr {
        format!("/ip4/192.0.2.1/tcp/{port}").parse().unwrap()
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // the base of a virtual clock
    fn only_proven_members_are_asked_and_refusals_back_off() {
        let t0 = Instant::now();
        let mut relays = Relays::new(t0);
        let (member, stranger) = (peer(), peer());
        relays.handle_dialled(t0, member, addr(1));
        relays.handle_dialled(t0, stranger, addr(2));
        // Neither proved anything yet: nobody is asked.
        assert!(relays.poll_reserve(t0, &[], |_| false).is_empty());
        relays.handle_proven(t0, &member);
        let asked = relays.poll_reserve(t0, &[], |p| *p == member);
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0].0, member);

        // Refused (our proof had not arrived): asked again after 1 s, then 2 s, then 4 s.
        let mut now = t0;
        for wait in [1u64, 2, 4] {
            relays.handle_listening(member, ListenerId::next());
            let listener = relays.reservations[&member];
            assert_eq!(relays.handle_listener_closed(now, listener), Some(member));
            assert_eq!(relays.poll_timeout(), Some(now + Duration::from_secs(wait)));
            let early = now + Duration::from_millis(wait * 1000 - 1);
            assert!(relays.poll_reserve(early, &[], |p| *p == member).is_empty());
            now += Duration::from_secs(wait);
            let again = relays.poll_reserve(now, &[], |p| *p == member);
            assert_eq!(again.len(), 1, "asked again after {wait} s");
        }
        // Granted: the next refusal starts over at 1 s.
        relays.handle_listening(member, ListenerId::next());
        relays.handle_accepted(member);
        let listener = relays.reservations[&member];
        relays.handle_listener_closed(now, listener);
        assert!(relays.refused.is_empty());
        assert!(relays.refusals.is_empty());
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // the base of a virtual clock
    fn the_wait_is_capped() {
        let t0 = Instant::now();
        let mut relays = Relays::new(t0);
        let member = peer();
        relays.handle_dialled(t0, member, addr(1));
        let mut now = t0;
        let mut waits = Vec::new();
        for _ in 0..40 {
            relays.handle_listening(member, ListenerId::next());
            let listener = relays.reservations[&member];
            relays.handle_listener_closed(now, listener);
            let until = relays.refused[&member];
            waits.push(until - now);
            now = until;
        }
        assert_eq!(waits[0], RESERVE_RETRY);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
        assert!(waits.iter().all(|w| *w <= RESERVE_BACKOFF));
        assert_eq!(waits[39], RESERVE_BACKOFF);
    }
}
