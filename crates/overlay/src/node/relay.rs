//! Relays, both roles.
//!
//! As a client: a member silent on its direct path for [`RELAY_AFTER`] is reached through
//! another member both ends can reach. We ask one (the next candidate every
//! [`RELAY_RETRY`]); it answers both ends with an offer of a session, and from then on the
//! tunnel's datagrams travel in that session, end-to-end encrypted, while the direct path
//! is probed.
//!
//! As a server: we carry sessions between two members we have tunnels with, forwarding
//! each datagram verbatim, and only between the two endpoints we authenticated, so a
//! stranger can neither use a relay nor redirect a session.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::Rng;

use super::peer::{PathAction, Relay, Route};
use super::stats::{DropReason, PeerDropReason};
use super::{Node, PeerHandle, Received};
use crate::wire::{Control, ParseError, TunnelMessage, RELAY_HEADER_LEN};
use crate::PeerId;

/// A member that has not answered on its path for this long is reached through a relay.
pub const RELAY_AFTER: Duration = Duration::from_secs(3);

/// A relay request unanswered for this long goes to the next candidate.
pub const RELAY_RETRY: Duration = Duration::from_secs(1);

/// A relay session that forwarded nothing for this long is forgotten by the relay.
pub const RELAY_IDLE: Duration = Duration::from_secs(120);

/// Most relay sessions one node carries for others, in all, and per requesting member.
pub const MAX_RELAY_SESSIONS: usize = 1024;
const MAX_RELAY_SESSIONS_PER_MEMBER: usize = 32;

/// A session this node relays between two of its members.
#[derive(Debug)]
pub(super) struct RelaySession {
    a: PeerHandle,
    b: PeerHandle,
    last_used: Instant,
}

impl RelaySession {
    /// Whether `handle` is one of its ends.
    pub(super) fn involves(&self, handle: PeerHandle) -> bool {
        self.a == handle || self.b == handle
    }
}

impl Node {
    /// A datagram that came through a relay: forwarded, if this node relays its session;
    /// handled like a direct one, if it belongs to a tunnel relayed for us.
    pub(super) fn handle_relayed(
        &mut self,
        now: Instant,
        from: SocketAddr,
        session: u32,
        bytes: &[u8],
        inner: Result<TunnelMessage<'_>, ParseError>,
        out: &mut [u8],
    ) -> Received {
        if let Some(s) = self.relays.get(&session) {
            let (Some(ea), Some(eb)) = (self.endpoint_of(s.a), self.endpoint_of(s.b)) else {
                return Received::Dropped(DropReason::UnknownSession);
            };
            // Forward only between the two members' authenticated endpoints.
            let to = if from == ea {
                eb
            } else if from == eb {
                ea
            } else {
                return Received::Dropped(DropReason::RelaySource);
            };
            if let Some(s) = self.relays.get_mut(&session) {
                s.last_used = now;
            }
            self.relay_stats.packets += 1;
            self.relay_stats.bytes += bytes.len().saturating_sub(RELAY_HEADER_LEN) as u64;
            self.queue_transmit(to, bytes.to_vec());
            return Received::Consumed;
        }
        let Some(&handle) = self.relayed.get(&session) else {
            return Received::Dropped(DropReason::UnknownSession);
        };
        let via = self
            .peer(handle)
            .and_then(|p| p.relay)
            .and_then(|r| self.endpoint_of(r.via));
        if via != Some(from) {
            return Received::Dropped(DropReason::RelaySource);
        }
        match inner {
            Ok(message) => {
                self.handle_tunnel(now, Route::Relay { via: from, session }, message, out)
            }
            Err(e) => Received::Dropped(e.into()),
        }
    }

    /// A member asks us to relay its traffic to `target`.
    pub(super) fn handle_relay_request(
        &mut self,
        now: Instant,
        from: PeerHandle,
        target: [u8; 32],
        endpoint: SocketAddr,
    ) -> Received {
        let Ok(target) = PeerId::from_bytes(target) else {
            return Received::PeerDropped(from, PeerDropReason::BadPayload);
        };
        let Some(requester) = self.peer(from) else {
            return Received::Consumed;
        };
        let (ns, requester_id, requester_endpoint) =
            (requester.ns, requester.id, requester.endpoint);
        if target == self.peer_id() || target == requester_id || requester.relayed {
            return Received::Consumed;
        }
        let Some(&to) = self.by_id.get(&(ns, target)) else {
            // No tunnel with the target yet: open one; the requester asks again.
            if let Err(reason) = self.add_member(now, ns, target, endpoint) {
                tracing::debug!(reason = reason.as_str(), "cannot reach a relay target");
            }
            return Received::Consumed;
        };
        let Some(target_endpoint) = self
            .peer(to)
            .filter(|p| p.is_direct_and_live(now))
            .map(|p| p.endpoint)
        else {
            return Received::Consumed;
        };
        let existing = self
            .relays
            .iter()
            .find(|(_, s)| (s.a, s.b) == (from, to) || (s.a, s.b) == (to, from))
            .map(|(id, _)| *id);
        let session = match existing {
            Some(session) => session,
            None => {
                let per_member = self.relays.values().filter(|s| s.involves(from)).count();
                if self.relays.len() >= MAX_RELAY_SESSIONS
                    || per_member >= MAX_RELAY_SESSIONS_PER_MEMBER
                {
                    self.relay_stats.refused += 1;
                    return Received::Consumed;
                }
                let session = self.new_session_id();
                tracing::info!(a = ?requester_id, b = ?target, session, "relaying");
                self.relays.insert(
                    session,
                    RelaySession {
                        a: from,
                        b: to,
                        last_used: now,
                    },
                );
                session
            }
        };
        // Both ends hear of the session at every request, so a lost offer is made good by
        // the next request.
        let offer = Control::RelayOffer {
            peer: *target.as_bytes(),
            endpoint: target_endpoint,
            session,
        }
        .emit();
        self.send_control(from, &offer, None);
        let offer = Control::RelayOffer {
            peer: *requester_id.as_bytes(),
            endpoint: requester_endpoint,
            session,
        }
        .emit();
        self.send_control(to, &offer, None);
        Received::Consumed
    }

    /// A random session id no session of ours uses. Random, not counted, so that a session
    /// id tells a stranger nothing about other sessions.
    fn new_session_id(&mut self) -> u32 {
        loop {
            let id = self.rng.next_u32();
            if !self.relays.contains_key(&id) && !self.relayed.contains_key(&id) {
                return id;
            }
        }
    }

    /// Member `from` relays session `session` between us and `peer`.
    pub(super) fn handle_relay_offer(
        &mut self,
        now: Instant,
        from: PeerHandle,
        peer: [u8; 32],
        endpoint: SocketAddr,
        session: u32,
    ) -> Received {
        let Ok(id) = PeerId::from_bytes(peer) else {
            return Received::PeerDropped(from, PeerDropReason::BadPayload);
        };
        let Some(relay) = self.peer(from) else {
            return Received::Consumed;
        };
        let (ns, relay_id) = (relay.ns, relay.id);
        if id == self.peer_id() || id == relay_id || relay.relayed {
            return Received::Consumed;
        }
        if self.relays.contains_key(&session) {
            return Received::Consumed;
        }
        let handle = match self.by_id.get(&(ns, id)) {
            Some(&h) => h,
            // The relay vouches that the member holds the namespace key (it has a tunnel
            // with it); its handshake proves it to us.
            None => match self.open_tunnel(now, ns, id, endpoint) {
                Ok(h) => {
                    if let Some(p) = self.peer_mut(h) {
                        p.unanswered_since = Some(now);
                    }
                    h
                }
                Err(reason) => return Received::Dropped(reason),
            },
        };
        if self.relayed.get(&session).is_some_and(|&h| h != handle) {
            return Received::Consumed;
        }
        let Some(p) = self.peer_mut(handle) else {
            return Received::Consumed;
        };
        if !p.relayed {
            tracing::info!(peer = ?id, via = ?relay_id, "direct path silent: relaying");
        }
        let replaced = p.use_relay(
            now,
            Relay {
                via: from,
                session,
                observed: endpoint,
            },
        );
        let (initiator, has_session) = (p.initiator, p.has_session());
        if let Some(old) = replaced {
            self.relayed.remove(&old);
        }
        self.relayed.insert(session, handle);
        if let Some(route) = self.route(handle) {
            if initiator && !has_session {
                self.restart_handshake(now, handle, route);
            }
        }
        Received::Consumed
    }

    /// Path timers: idle relay sessions are forgotten; members silent on their path get a
    /// relay; relayed members get direct-path probes; live tunnels get round-trip probes.
    pub(super) fn run_paths(&mut self, now: Instant) {
        self.relays
            .retain(|_, s| now.saturating_duration_since(s.last_used) < RELAY_IDLE);
        for handle in self.handles().collect::<Vec<_>>() {
            let Some(action) = self.peer_mut(handle).and_then(|p| p.poll_path(now)) else {
                continue;
            };
            match action {
                PathAction::RequestRelay { attempt } => self.request_relay(now, handle, attempt),
                PathAction::ProbeDirect { known, observed } => {
                    self.probe(now, handle, Route::Direct(known));
                    if let Some(observed) = observed {
                        self.probe(now, handle, Route::Direct(observed));
                    }
                }
                PathAction::ProbeRtt => {
                    if let Some(route) = self.route(handle) {
                        self.probe(now, handle, route);
                    }
                }
            }
        }
    }

    /// The earliest instant a relay session we carry goes idle.
    pub(super) fn poll_relay_timeout(&self) -> Option<Instant> {
        self.relays.values().map(|s| s.last_used + RELAY_IDLE).min()
    }

    /// Asks a member we reach directly to relay our traffic to `handle`; each attempt asks
    /// the next candidate.
    fn request_relay(&mut self, now: Instant, handle: PeerHandle, attempt: u32) {
        let Some(peer) = self.peer(handle) else {
            return;
        };
        let ns = peer.ns;
        let request = Control::RelayRequest {
            target: *peer.id.as_bytes(),
            endpoint: peer.endpoint,
        }
        .emit();
        let candidates: Vec<PeerHandle> = self
            .handles()
            .filter(|&h| {
                h != handle
                    && self
                        .peer(h)
                        .is_some_and(|p| p.ns == ns && p.is_direct_and_live(now))
            })
            .collect();
        let Some(&via) = candidates.get(attempt as usize % candidates.len().max(1)) else {
            tracing::debug!(?handle, "member silent and no member to relay through");
            return;
        };
        self.send_control(via, &request, None);
    }

    /// Sends a probe to `handle` by `route`.
    pub(super) fn probe(&mut self, now: Instant, handle: PeerHandle, route: Route) {
        self.next_nonce = self.next_nonce.wrapping_add(1);
        let nonce = self.next_nonce;
        if let Some(peer) = self.peer_mut(handle) {
            peer.start_probe(now, nonce);
        }
        let packet = Control::Probe { nonce, ack: false }.emit();
        self.send_control(handle, &packet, Some(route));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Identity;

    #[test]
    fn session_ids_come_from_the_seed_and_skip_ids_in_use() {
        let ids = |seed: [u8; 32]| {
            let mut n = Node::new(Identity::from_seed([1; 32]), seed);
            (0..4).map(|_| n.new_session_id()).collect::<Vec<_>>()
        };
        assert_eq!(ids([7; 32]), ids([7; 32]), "a seed reproduces a run");
        assert_ne!(ids([7; 32]), ids([8; 32]));

        let first = ids([7; 32])[0];
        let mut n = Node::new(Identity::from_seed([1; 32]), [7; 32]);
        n.relayed.insert(first, PeerHandle(0));
        assert_ne!(
            n.new_session_id(),
            first,
            "a session id in use is not handed out"
        );
    }
}
