//! Peers that cannot be reached stop holding others up.
//!
//! A partition or a host that lost power leaves a TCP connection that looks open for
//! minutes: nothing is acknowledged, nothing fails. Until it closes, Kademlia keeps asking
//! through it, relay circuits are requested over it and lookups wait out their 10 s for the
//! answers; and a peer across the cut, handed out by every member that still lists it, is
//! dialled again by each lookup, which waits out the dial ([`super::DIAL_TIMEOUT`]).
//! `hyphae-agent --test cut`: a newcomer on the side of three waited 29.9 s, three lookups
//! in a row. Two rules:
//!
//! - [`Liveness`]: every connection is pinged ([`PING_INTERVAL`], libp2p ping), and one
//!   that has not answered for [`SILENT_AFTER`] is closed. The peer is then disconnected:
//!   circuits through us to it and requests to it fail at once.
//! - [`Unreachable`]: a peer whose connections were all closed as silent leaves the
//!   routing table, so that this agent no longer hands it out in its answers to lookups
//!   (a newcomer on our side of a cut was handed every peer across it, dialled them and
//!   waited a dial out before it could claim: 4.1 s in `--test cut`, even when it came
//!   8 s after the cut), and is dialled again every [`UNREACHABLE_REDIAL`] at the addresses
//!   the routing table had, for [`UNREACHABLE_FORGET`]: when the cut heals, the two sides
//!   connect again and Kademlia puts the peer back.
//! - [`Backoff`]: a peer whose dial failed slowly ([`SLOW_DIAL`]: it timed out, its SYNs
//!   dropped) is not dialled again for [`DIAL_BACKOFF`]; a lookup that meets it counts it
//!   as failed at once instead of dialling it again. A dial refused at once (a member that
//!   is not listening yet) costs nothing to repeat and is not held off. A connection with
//!   the peer (it dialled us, say) lifts the backoff at once.
//!
//! Pure bookkeeping on the caller's clock; the swarm glue feeds it libp2p's events, closes
//! what [`Liveness::silent`] returns and expires the backoff.

use std::collections::HashMap;
use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use libp2p::core::transport::PortUse;
use libp2p::core::Endpoint;
use libp2p::swarm::{
    dummy, ConnectionDenied, ConnectionId, NetworkBehaviour, THandler, THandlerInEvent,
    THandlerOutEvent, ToSwarm,
};

use super::{Multiaddr, NetworkId};

/// How often each connection is pinged.
pub(super) const PING_INTERVAL: Duration = Duration::from_secs(1);

/// How long one ping may wait for its answer (libp2p ping's own timeout; a connection is
/// closed by [`SILENT_AFTER`], not by a failed ping).
pub(super) const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection with no answered ping for this long is closed: five pings missed. A
/// lost segment costs TCP a retransmission (hundreds of milliseconds), not seconds, so
/// a connection with 1% loss is not closed; a control thread that stalls for seconds (50
/// agents starting at once on 2 cores: `hyphae-agent --test scale`) should not lose its
/// connections either, which it would dial again, adding to the load (3 s closed about a
/// hundred connections per agent there).
pub(super) const SILENT_AFTER: Duration = Duration::from_secs(5);

/// How long a peer whose dial failed is not dialled again. Long enough for the lookups a
/// claim makes in a row; short enough that a healed partition is dialled again soon (and a
/// connection either side opens lifts it at once).
pub(super) const DIAL_BACKOFF: Duration = Duration::from_secs(10);

/// A dial that failed after this long is held off; a quicker failure is not.
pub(super) const SLOW_DIAL: Duration = Duration::from_secs(1);

/// How often a peer dropped from the routing table as unreachable is dialled again. A
/// peer whose last dial timed out is held off by the [`Backoff`] for [`DIAL_BACKOFF`] and
/// skipped until a turn after that ends: across a cut, one dial about every 15 s.
pub(super) const UNREACHABLE_REDIAL: Duration = Duration::from_secs(5);

/// At most this many unreachable peers are dialled in one second (counted from the first
/// dial of the second); the others' turns move to the next second (a cut through a large
/// namespace leaves hundreds, noticed over a second or so).
pub(super) const UNREACHABLE_DIALS_PER_SECOND: usize = 8;

/// How long a peer dropped as unreachable is dialled again before it is forgotten: a
/// departed member leaves the group in 30 s (`crate::membership`); a partition may last
/// longer, and a member that comes back is found again through the group's records.
pub(super) const UNREACHABLE_FORGET: Duration = Duration::from_secs(600);

/// Peers taken out of the routing table because their connections fell silent, with the
/// addresses it had for them, to dial again until they answer.
#[derive(Debug, Default)]
pub(super) struct Unreachable {
    peers: HashMap<NetworkId, Dropped>,
    /// Peers dropped since start.
    dropped: u64,
    /// The second dials are counted in: when it started, and how many so far.
    window: Option<(Instant, usize)>,
}

#[derive(Debug)]
struct Dropped {
    addresses: Vec<Multiaddr>,
    since: Instant,
    next_dial: Instant,
}

impl Unreachable {
    /// `peer`, reachable at `addresses`, was taken out of the routing table at `now`.
    pub(super) fn handle_dropped(
        &mut self,
        peer: NetworkId,
        addresses: Vec<Multiaddr>,
        now: Instant,
    ) {
        self.dropped += 1;
        self.peers.insert(
            peer,
            Dropped {
                addresses,
                since: now,
                next_dial: now + UNREACHABLE_REDIAL,
            },
        );
    }

    /// A connection with `peer` is open: it is back (Kademlia inserts it again).
    pub(super) fn handle_connected(&mut self, peer: &NetworkId) {
        self.peers.remove(peer);
    }

    /// The peers to dial at `now`, with their addresses, at most
    /// [`UNREACHABLE_DIALS_PER_SECOND`] (the rest of those due are put off by a second),
    /// skipping those `held_off` (their turn comes again after [`UNREACHABLE_REDIAL`]);
    /// forgets those dropped [`UNREACHABLE_FORGET`] ago.
    pub(super) fn due(
        &mut self,
        now: Instant,
        held_off: impl Fn(&NetworkId) -> bool,
    ) -> Vec<(NetworkId, Vec<Multiaddr>)> {
        self.peers
            .retain(|_, d| now.saturating_duration_since(d.since) < UNREACHABLE_FORGET);
        let second = Duration::from_secs(1);
        let (start, spent) = match self.window {
            Some((start, spent)) if now < start + second => (start, spent),
            _ => (now, 0),
        };
        let mut budget = UNREACHABLE_DIALS_PER_SECOND.saturating_sub(spent);
        let mut due = Vec::new();
        for (peer, d) in &mut self.peers {
            if d.next_dial > now {
                continue;
            }
            if held_off(peer) {
                d.next_dial = now + UNREACHABLE_REDIAL;
            } else if budget > 0 {
                budget -= 1;
                d.next_dial = now + UNREACHABLE_REDIAL;
                due.push((*peer, d.addresses.clone()));
            } else {
                d.next_dial = start + second;
            }
        }
        if !due.is_empty() || spent > 0 {
            self.window = Some((start, spent + due.len()));
        }
        due
    }

    /// When the next dial is due.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.peers.values().map(|d| d.next_dial).min()
    }

    /// Peers dropped since start.
    pub(super) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Peers waiting to be dialled again now.
    pub(super) fn waiting(&self) -> usize {
        self.peers.len()
    }
}

/// When each open connection last answered a ping.
#[derive(Debug, Default)]
pub(super) struct Liveness {
    /// Pinging is on (off for in-memory swarms, whose connections cannot go silent).
    enabled: bool,
    /// Open connections that speak ping: when they last answered (or opened).
    heard: HashMap<ConnectionId, Instant>,
}

impl Liveness {
    /// Bookkeeping for a swarm that pings (`enabled`) or does not.
    pub(super) fn new(enabled: bool) -> Self {
        Self {
            enabled,
            heard: HashMap::new(),
        }
    }

    /// A connection opened: it has [`SILENT_AFTER`] to answer its first ping.
    pub(super) fn handle_established(&mut self, connection: ConnectionId, now: Instant) {
        if self.enabled {
            self.heard.insert(connection, now);
        }
    }

    /// A ping on `connection` was answered.
    pub(super) fn handle_pong(&mut self, connection: ConnectionId, now: Instant) {
        if let Some(heard) = self.heard.get_mut(&connection) {
            *heard = now;
        }
    }

    /// The peer on `connection` does not speak ping (an older agent, another libp2p
    /// node): its silence says nothing, so it is not watched.
    pub(super) fn handle_unsupported(&mut self, connection: ConnectionId) {
        self.heard.remove(&connection);
    }

    /// A connection closed.
    pub(super) fn handle_closed(&mut self, connection: ConnectionId) {
        self.heard.remove(&connection);
    }

    /// The connections silent for [`SILENT_AFTER`] at `now`, to close; each is returned
    /// once.
    pub(super) fn silent(&mut self, now: Instant) -> Vec<ConnectionId> {
        let silent: Vec<ConnectionId> = self
            .heard
            .iter()
            .filter(|(_, &heard)| now.saturating_duration_since(heard) >= SILENT_AFTER)
            .map(|(&connection, _)| connection)
            .collect();
        for connection in &silent {
            self.heard.remove(connection);
        }
        silent
    }

    /// When the next connection falls silent if nothing is heard from it before.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.heard.values().min().map(|&heard| heard + SILENT_AFTER)
    }

    /// Connections watched now.
    #[cfg(test)]
    fn watched(&self) -> usize {
        self.heard.len()
    }
}

/// Peers not dialled until a time, because their last dial failed. A behaviour, so that a
/// dial to one of them is refused before it starts (Kademlia then counts the peer as failed
/// in its lookups at once).
#[derive(Debug, Default)]
pub(super) struct Backoff {
    until: HashMap<NetworkId, Instant>,
    /// Dials in progress to a known peer: when each started.
    dialing: HashMap<ConnectionId, Instant>,
    /// Dials refused since start.
    held_off: u64,
}

/// Why a dial was refused: the peer's last dial failed (see [`Backoff`]).
#[derive(Debug, thiserror::Error)]
#[error("the last dial to this peer failed; not dialled again before its backoff ends")]
pub(super) struct HeldOff;

impl Backoff {
    /// A dial to a known peer started.
    pub(super) fn handle_dialing(&mut self, connection: ConnectionId, now: Instant) {
        self.dialing.insert(connection, now);
    }

    /// The dial `connection` to `peer` failed at `now`: held off if it took
    /// [`SLOW_DIAL`] or more and the failure says the peer is unreachable (`telling`).
    pub(super) fn handle_failed(
        &mut self,
        peer: NetworkId,
        connection: ConnectionId,
        now: Instant,
        telling: bool,
    ) {
        let started = self.dialing.remove(&connection);
        if telling && started.is_some_and(|t| now.saturating_duration_since(t) >= SLOW_DIAL) {
            self.until.insert(peer, now + DIAL_BACKOFF);
        }
    }

    /// A connection with `peer` is open: it is reachable.
    pub(super) fn handle_connected(&mut self, peer: &NetworkId, connection: ConnectionId) {
        self.until.remove(peer);
        self.dialing.remove(&connection);
    }

    /// Whether dials to `peer` are held off.
    pub(super) fn holds_off(&self, peer: &NetworkId) -> bool {
        self.until.contains_key(peer)
    }

    /// Dials refused since start.
    pub(super) fn held_off(&self) -> u64 {
        self.held_off
    }

    /// Ends the backoffs due by `now` (and forgets dials that ended some other way).
    pub(super) fn handle_timeout(&mut self, now: Instant) {
        self.until.retain(|_, until| *until > now);
        self.dialing
            .retain(|_, started| now.saturating_duration_since(*started) < DIAL_BACKOFF * 6);
    }

    /// When the next backoff ends.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.until.values().min().copied()
    }
}

impl NetworkBehaviour for Backoff {
    type ConnectionHandler = dummy::ConnectionHandler;
    type ToSwarm = Infallible;

    fn handle_pending_outbound_connection(
        &mut self,
        _connection_id: ConnectionId,
        peer: Option<NetworkId>,
        _addresses: &[Multiaddr],
        _effective_role: Endpoint,
    ) -> Result<Vec<Multiaddr>, ConnectionDenied> {
        match peer {
            Some(peer) if self.holds_off(&peer) => {
                self.held_off += 1;
                Err(ConnectionDenied::new(HeldOff))
            }
            _ => Ok(Vec::new()),
        }
    }

    fn handle_established_inbound_connection(
        &mut self,
        _connection_id: ConnectionId,
        _peer: NetworkId,
        _local_addr: &Multiaddr,
        _remote_addr: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(dummy::ConnectionHandler)
    }

    fn handle_established_outbound_connection(
        &mut self,
        _connection_id: ConnectionId,
        _peer: NetworkId,
        _addr: &Multiaddr,
        _role_override: Endpoint,
        _port_use: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(dummy::ConnectionHandler)
    }

    fn on_swarm_event(&mut self, _event: libp2p::swarm::FromSwarm) {}

    fn on_connection_handler_event(
        &mut self,
        _peer_id: NetworkId,
        _connection_id: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        match event {}
    }

    fn poll(&mut self, _: &mut Context<'_>) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::disallowed_methods)] // tests start the virtual clock
    use super::*;

    #[test]
    fn a_connection_that_answers_stays_and_one_that_falls_silent_is_closed_once() {
        let start = Instant::now();
        let (alive, dead) = (
            ConnectionId::new_unchecked(1),
            ConnectionId::new_unchecked(2),
        );
        let mut l = Liveness::new(true);
        l.handle_established(alive, start);
        l.handle_established(dead, start);
        assert_eq!(l.poll_timeout(), Some(start + SILENT_AFTER));
        // The first answers every ping; the second never after the cut.
        let mut now = start;
        let mut closed = Vec::new();
        while now < start + Duration::from_secs(10) {
            now += PING_INTERVAL;
            l.handle_pong(alive, now);
            if now <= start + Duration::from_secs(2) {
                l.handle_pong(dead, now);
            }
            closed.extend(l.silent(now));
        }
        assert_eq!(closed, vec![dead]);
        assert_eq!(l.watched(), 1);
        assert_eq!(l.poll_timeout(), Some(now + SILENT_AFTER));
    }

    #[test]
    fn a_pong_late_by_less_than_the_limit_keeps_the_connection() {
        let start = Instant::now();
        let c = ConnectionId::new_unchecked(7);
        let mut l = Liveness::new(true);
        l.handle_established(c, start);
        // A retransmitted segment: the answer comes 2.9 s after the last one.
        let late = start + SILENT_AFTER - Duration::from_millis(100);
        assert!(l.silent(late).is_empty());
        l.handle_pong(c, late);
        assert!(l.silent(late + Duration::from_secs(2)).is_empty());
        assert_eq!(l.silent(late + SILENT_AFTER), vec![c]);
    }

    #[test]
    fn peers_without_ping_closed_connections_and_memory_swarms_are_not_watched() {
        let start = Instant::now();
        let (old, gone) = (
            ConnectionId::new_unchecked(1),
            ConnectionId::new_unchecked(2),
        );
        let mut l = Liveness::new(true);
        l.handle_established(old, start);
        l.handle_established(gone, start);
        l.handle_unsupported(old);
        l.handle_closed(gone);
        assert!(l.silent(start + Duration::from_secs(60)).is_empty());
        assert_eq!(l.poll_timeout(), None);

        let mut off = Liveness::new(false);
        off.handle_established(old, start);
        assert_eq!(off.watched(), 0);
        assert!(off.silent(start + Duration::from_secs(60)).is_empty());
    }

    #[test]
    fn an_unreachable_peer_is_dialled_again_until_it_connects_or_is_forgotten() {
        let start = Instant::now();
        let (p, q) = (NetworkId::random(), NetworkId::random());
        let addr: Multiaddr = "/ip4/10.0.0.2/tcp/7400".parse().unwrap();
        let mut u = Unreachable::default();
        u.handle_dropped(p, vec![addr.clone()], start);
        u.handle_dropped(q, vec![], start);
        assert_eq!(u.dropped(), 2);
        // Nothing before its turn; then each once per UNREACHABLE_REDIAL, with its addresses.
        assert!(u.due(start, |_| false).is_empty());
        assert_eq!(u.poll_timeout(), Some(start + UNREACHABLE_REDIAL));
        let first = start + UNREACHABLE_REDIAL;
        let mut due = u.due(first, |_| false);
        due.sort_by_key(|(peer, _)| *peer != p);
        assert_eq!(due, vec![(p, vec![addr.clone()]), (q, vec![])]);
        assert!(u.due(first + Duration::from_secs(1), |_| false).is_empty());
        // Held off (its last dial timed out): skipped this turn, dialled the next.
        let second = first + UNREACHABLE_REDIAL;
        assert_eq!(
            u.due(second, |peer| *peer == q),
            vec![(p, vec![addr.clone()])]
        );
        let third = second + UNREACHABLE_REDIAL;
        assert_eq!(u.due(third, |peer| *peer == p), vec![(q, vec![])]);
        // q connects (the cut healed): no more dials for it; p is forgotten in the end.
        u.handle_connected(&q);
        assert_eq!(u.waiting(), 1);
        let late = start + UNREACHABLE_FORGET;
        assert!(u.due(late, |_| false).is_empty());
        assert_eq!((u.waiting(), u.poll_timeout()), (0, None));

        // Many, noticed over a second (each connection's pings have their own phase), the
        // driver calling at every deadline: at most the bound in any second counted from
        // its first dial, every one in its turn.
        let mut u = Unreachable::default();
        let many: Vec<NetworkId> = (0..40).map(|_| NetworkId::random()).collect();
        for (i, p) in many.iter().enumerate() {
            u.handle_dropped(*p, vec![], start + Duration::from_millis(25 * i as u64));
        }
        let mut dials: Vec<(Instant, NetworkId)> = Vec::new();
        while let Some(now) = u.poll_timeout() {
            if now > start + Duration::from_secs(12) {
                break;
            }
            dials.extend(u.due(now, |_| false).into_iter().map(|(p, _)| (now, p)));
        }
        let mut windows: Vec<(Instant, usize)> = Vec::new();
        for &(t, _) in &dials {
            match windows.last_mut() {
                Some((w, n)) if t < *w + Duration::from_secs(1) => *n += 1,
                _ => windows.push((t, 1)),
            }
        }
        assert!(
            windows
                .iter()
                .all(|&(_, n)| n <= UNREACHABLE_DIALS_PER_SECOND),
            "{windows:?}"
        );
        let mut dialled: Vec<NetworkId> = dials.iter().map(|&(_, p)| p).collect();
        dialled.sort();
        dialled.dedup();
        assert_eq!(dialled.len(), 40, "every peer dialled in its turn");
    }

    const DIAL_TIMEOUT_IN_TEST: Duration = Duration::from_secs(4);

    #[test]
    fn a_peer_whose_dial_failed_slowly_is_held_off_until_its_backoff_ends_or_it_connects() {
        let start = Instant::now();
        let (p, q, r) = (
            NetworkId::random(),
            NetworkId::random(),
            NetworkId::random(),
        );
        let mut b = Backoff::default();
        let dial = ConnectionId::new_unchecked;
        for (i, t) in [(10, start), (11, start), (12, start)] {
            b.handle_dialing(dial(i), t - DIAL_TIMEOUT_IN_TEST);
        }
        b.handle_failed(p, dial(10), start, true);
        b.handle_failed(q, dial(11), start + Duration::from_secs(1), true);
        // Refused at once (not listening yet): dialled again whenever asked.
        b.handle_dialing(dial(13), start);
        b.handle_failed(r, dial(13), start + Duration::from_millis(5), true);
        assert!(!b.holds_off(&r));
        // Timed out through a relay only, or while connected anyway: says nothing.
        b.handle_dialing(dial(14), start - DIAL_TIMEOUT_IN_TEST);
        b.handle_failed(r, dial(14), start, false);
        assert!(!b.holds_off(&r));
        let id = ConnectionId::new_unchecked(1);
        let denied = b
            .handle_pending_outbound_connection(id, Some(p), &[], Endpoint::Dialer)
            .unwrap_err();
        assert!(denied.downcast_ref::<HeldOff>().is_some());
        assert_eq!(b.held_off(), 1);
        // Dials without a peer id (bootstrap addresses) are never held off.
        assert!(b
            .handle_pending_outbound_connection(id, None, &[], Endpoint::Dialer)
            .is_ok());
        assert_eq!(b.poll_timeout(), Some(start + DIAL_BACKOFF));
        b.handle_timeout(start + DIAL_BACKOFF);
        assert!(!b.holds_off(&p) && b.holds_off(&q));
        // q dialled us: reachable, dialled again at once.
        b.handle_connected(&q, dial(99));
        assert!(!b.holds_off(&q));
        assert_eq!(b.poll_timeout(), None);
    }
}
