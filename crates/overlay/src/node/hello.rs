//! Hellos and address announcements.
//!
//! A hello, authenticated with the namespace key, is how two members that know only each
//! other's underlay address (a configured endpoint, or one found in the DHT) learn each
//! other's identity and open their tunnels. A hello request also tells a member that we
//! have no working tunnel with it (we restarted), so its initiator starts a fresh handshake.
//!
//! Once a tunnel exists, each member announces the addresses it owns through it, again
//! every [`ANNOUNCE_INTERVAL`], and at once when they change.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::peer::{Peer, Route, PEER_SILENT_AFTER};
use super::stats::DropReason;
use super::{Event, NamespaceId, Node, PeerHandle, Received};
use crate::wire::{Announce, Hello, HelloError};
use crate::PeerId;

/// Hello retry interval to a configured endpoint with no tunnel yet.
pub const HELLO_INTERVAL: Duration = Duration::from_secs(1);

/// Re-announce addresses this often, so a member that missed one catches up.
pub const ANNOUNCE_INTERVAL: Duration = Duration::from_secs(20);

/// Longest interval between hellos to a configured endpoint that never answers.
const MAX_HELLO_INTERVAL: Duration = Duration::from_secs(30);

/// A member endpoint from the configuration, hello'd until a member answers from it.
pub(super) struct StaticPeer {
    pub(super) ns: NamespaceId,
    pub(super) endpoint: SocketAddr,
    next_hello: Instant,
    /// Doubles while the endpoint does not answer, up to [`MAX_HELLO_INTERVAL`].
    interval: Duration,
    /// The tunnel a hello reply from this endpoint led to.
    pub(super) peer: Option<PeerHandle>,
}

impl StaticPeer {
    /// An endpoint to hello from `now` on.
    pub(super) fn new(now: Instant, ns: NamespaceId, endpoint: SocketAddr) -> Self {
        Self {
            ns,
            endpoint,
            next_hello: now,
            interval: HELLO_INTERVAL,
            peer: None,
        }
    }
}

impl Node {
    /// Handles a hello (`bytes` is the whole datagram, which its MAC covers).
    pub(super) fn handle_hello(
        &mut self,
        now: Instant,
        from: SocketAddr,
        hello: Hello,
        bytes: &[u8],
    ) -> Received {
        let Some(ns) = self.namespace_by_tag(&hello.tag) else {
            return Received::Dropped(DropReason::UnknownNamespace);
        };
        let keys = &self.namespaces[ns.0].keys;
        match Hello::verify(bytes, keys) {
            Ok(()) => {}
            Err(HelloError::BadMac) => return Received::Dropped(DropReason::BadMac),
            Err(HelloError::Malformed) => return Received::Dropped(DropReason::Malformed),
        }
        let Ok(id) = PeerId::from_bytes(hello.peer) else {
            return Received::Dropped(DropReason::BadIdentity);
        };
        if id == self.peer_id() {
            return Received::Dropped(DropReason::BadIdentity);
        }
        if !hello.reply {
            let reply = Hello::emit(keys, &self.peer_id(), true);
            self.queue_transmit(from, reply.to_vec());
        }
        let handle = match self.by_id.get(&(ns, id)).copied() {
            Some(handle) => {
                // A hello can be replayed, so it never moves the endpoint: the handshake it
                // may start goes to where the hello came from, and only the member's
                // authenticated answer moves the endpoint there.
                if !hello.reply {
                    if let Some(peer) = self.peer_mut(handle) {
                        // A hello request means the member has no working tunnel with us
                        // (it restarted, or lost us): it no longer has our addresses, and if
                        // we are the initiator, a fresh handshake is ours to start.
                        peer.have_their_announce = false;
                        // What it reads is what its next announcement says (an older
                        // agent may have restarted in its place).
                        peer.speaks_addresses6 = false;
                        peer.got_list6 = false;
                        peer.speaks_uplinks = false;
                        peer.reads_parts = false;
                        peer.parts_expected = None;
                        peer.parts_taken = None;
                        peer.parts_whole = None;
                        peer.address_parts = Default::default();
                        // Its other shards' sessions are gone with it: ours are dropped
                        // (their flows go on shard 0) and made afresh from its next
                        // announcement.
                        self.set_tunnel_shards(handle, 1);
                        self.restart_handshake(now, handle, Route::Direct(from));
                    }
                }
                handle
            }
            None => match self.open_tunnel(now, ns, id, from) {
                Ok(handle) => {
                    if self.peer_mut(handle).is_some_and(|p| p.initiator) {
                        self.announce(now, handle);
                    }
                    handle
                }
                Err(reason) => return Received::Dropped(reason),
            },
        };
        if hello.reply {
            for sp in &mut self.static_peers {
                if sp.ns == ns && sp.endpoint == from {
                    sp.peer = Some(handle);
                    sp.interval = HELLO_INTERVAL;
                }
            }
        }
        Received::Consumed
    }

    /// Queues a hello request to `to` in `ns`.
    pub(super) fn send_hello(&mut self, ns: NamespaceId, to: SocketAddr) {
        let hello = Hello::emit(&self.namespaces[ns.0].keys, &self.peer_id(), false);
        self.queue_transmit(to, hello.to_vec());
    }

    /// Starts a fresh handshake with a member that lost its tunnel, if we are the initiator
    /// (at most once per [`HELLO_INTERVAL`]); our announcement follows once it completes.
    ///
    /// Only one side ever initiates a fresh tunnel: boringtun forgets its own initiation
    /// when it answers a crossing one, so two members initiating at once can leave both
    /// waiting as responders.
    pub(super) fn restart_handshake(&mut self, now: Instant, handle: PeerHandle, route: Route) {
        let mut buf = std::mem::take(&mut self.scratch);
        if let Some(peer) = self.peer_mut(handle) {
            if peer.should_restart_handshake(now) {
                let ns = peer.ns;
                if let Some(len) = peer.format_initiation(&mut buf) {
                    let t = self.frame_outgoing(ns, 0, route, &mut buf, len);
                    self.queue_transmit(t.to, buf[t.range].to_vec());
                }
            }
        }
        self.scratch = buf;
    }

    /// The member behind `handle` announced its addresses.
    pub(super) fn handle_announce(
        &mut self,
        now: Instant,
        handle: PeerHandle,
        announce: Announce,
    ) -> Received {
        let Some(peer) = self.peer_mut(handle) else {
            return Received::Consumed;
        };
        let ns = peer.ns;
        let shards = announce.shards;
        // In a namespace with an authority, only what its certificate allows.
        let Some(addresses) = self.certified_addresses(handle, &announce) else {
            return Received::Consumed;
        };
        let Some(peer) = self.peer_mut(handle) else {
            return Received::Consumed;
        };
        let first_parts = announce.reads_parts && !peer.reads_parts;
        peer.reads_parts = announce.reads_parts;
        // Lists that follow in parts replace the ones we have when they are all in (unless
        // they are the ones we took last); the first addresses here say nothing more.
        peer.parts_expected = announce.in_parts.filter(|g| Some(*g) != peer.parts_taken);
        if announce.in_parts.is_some() {
            peer.have_their_announce = true;
        } else if peer.handle_announce(&addresses) {
            self.events.push_back(Event::PeerAddresses {
                ns,
                peer: handle,
                addresses,
            });
        }
        self.set_tunnel_shards(handle, shards);
        self.announced6(handle, announce.addresses6);
        if let Some(list) = announce.list6 {
            if let Some(peer) = self.peer_mut(handle) {
                peer.got_list6 = true;
            }
            if announce.in_parts.is_none() {
                self.handle_addresses6(handle, list);
            }
        }
        self.take_address_parts(handle);
        let first_uplinks = announce.uplinks
            && self
                .peer_mut(handle)
                .is_some_and(|p| !std::mem::replace(&mut p.speaks_uplinks, true));
        if !announce.have_yours || (first_parts && self.in_parts(handle)) {
            // (Our uplinks follow our announcement; our IPv6 list is in it if it reads
            // one: `have_yours` is clear until it has our list too. A member that now
            // reads parts gets lists it only had the first addresses of.)
            self.announce(now, handle);
        } else if first_uplinks && !self.uplinks.is_empty() {
            self.send_uplinks(handle);
        }
        Received::Consumed
    }

    /// Sends our addresses to `handle` through its tunnel (a handshake first, if needed).
    pub(super) fn announce(&mut self, now: Instant, handle: PeerHandle) {
        let Some(peer) = self.peer(handle) else {
            return;
        };
        let ns = peer.ns;
        let in_parts = self.in_parts(handle);
        let namespace = &self.namespaces[ns.0];
        let packet = Announce {
            have_yours: peer.has_their_announcement(),
            uplinks: true,
            addresses6: !self.is_layer2(ns),
            // Only to a member that reads the list (an older one refuses the longer form).
            list6: (peer.speaks_addresses6 && !self.is_layer2(ns))
                .then(|| namespace.addresses6.clone()),
            reads_parts: true,
            in_parts: in_parts.then_some(namespace.address_generation),
            addresses: namespace.addresses.clone(),
            shards: self.shards,
            certificate: self.own_certificate(peer.ns),
        }
        .emit();
        self.send_control(handle, &packet, None);
        if in_parts {
            self.send_address_parts(handle);
        }
        if let Some(macs) = &self.namespaces[ns.0].macs {
            // (The switch learns no more than one announcement carries.)
            let generation = self.namespaces[ns.0].mac_generation;
            for part in crate::wire::MacPart::split(generation, macs) {
                let packet = crate::wire::Control::Macs(part).emit();
                self.send_control(handle, &packet, None);
            }
        }
        if !self.uplinks.is_empty() {
            self.send_uplinks(handle);
        }
        if let Some(peer) = self.peer_mut(handle) {
            peer.next_announce = now + ANNOUNCE_INTERVAL;
            peer.announced = true;
        }
    }

    /// Periodic announcements to members, and hellos to configured endpoints that have no
    /// live tunnel.
    pub(super) fn run_hellos(&mut self, now: Instant) {
        let due: Vec<PeerHandle> = self
            .handles()
            .filter(|&h| self.peer(h).is_some_and(|p| now >= p.next_announce))
            .collect();
        for handle in due {
            let Some(peer) = self.peer_mut(handle) else {
                continue;
            };
            if peer.initiator || peer.has_session() {
                self.announce(now, handle);
            } else {
                // A responder never starts a fresh tunnel (see `restart_handshake`): it asks
                // the initiator with a hello.
                peer.next_announce = now + ANNOUNCE_INTERVAL;
                let (ns, to) = (peer.ns, peer.endpoint);
                self.send_hello(ns, to);
            }
        }

        for i in 0..self.static_peers.len() {
            let sp = &self.static_peers[i];
            let live = self
                .static_peer_live_until(sp)
                .is_some_and(|until| now < until);
            if now < sp.next_hello || live {
                continue;
            }
            let (ns, endpoint) = (sp.ns, sp.endpoint);
            self.send_hello(ns, endpoint);
            let sp = &mut self.static_peers[i];
            sp.next_hello = now + sp.interval;
            // An endpoint that never answers (down, or not a member) is asked less often.
            if sp.peer.is_none() {
                sp.interval = (sp.interval * 2).min(MAX_HELLO_INTERVAL);
            }
        }
    }

    /// The earliest instant a configured endpoint may need a hello: when its next hello
    /// is due, or, while its member is live, when the member falls silent.
    pub(super) fn poll_hello_timeout(&self) -> Option<Instant> {
        self.static_peers
            .iter()
            .map(|sp| match self.static_peer_live_until(sp) {
                Some(until) => sp.next_hello.max(until),
                None => sp.next_hello,
            })
            .min()
    }

    /// A configured endpoint needs no hello while the member its hello reply came from (or
    /// a member at that endpoint) has a completed handshake and was heard recently: the
    /// instant that stops being true, if a member has a session (it is live before it).
    fn static_peer_live_until(&self, sp: &StaticPeer) -> Option<Instant> {
        let until = |p: &Peer| p.has_session().then_some(p.last_heard + PEER_SILENT_AFTER);
        if let Some(p) = sp.peer.and_then(|h| self.peer(h)) {
            return until(p);
        }
        self.peers
            .iter()
            .flatten()
            .filter(|p| p.ns == sp.ns && p.endpoint == sp.endpoint)
            .filter_map(until)
            .max()
    }
}
