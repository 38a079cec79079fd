//! The WireGuard data path: tunnel messages in (handshakes, data, in-tunnel control), packets
//! out, framed for the route they take (namespace prefix of an initiation, relay header).

use std::net::Ipv4Addr;
use std::time::Instant;

use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::{Packet, Tunn, TunnResult};

use super::peer::{tunnel_error, Route};
use super::stats::{DropReason, PeerDropReason};
use super::{NamespaceId, Node, PeerHandle, Received, Transmit, SEND_HEADROOM};
use crate::keys::TAG_LEN;
use crate::wire::{
    emit_init_prefix, emit_relay_header, is_control, Control, TunnelMessage, INIT_PREFIX_LEN,
    KIND_WG_DATA, KIND_WG_INIT, KIND_WG_RESPONSE, RELAY_HEADER_LEN,
};

impl Node {
    /// A tunnel message that came by `route`.
    pub(super) fn handle_tunnel(
        &mut self,
        now: Instant,
        route: Route,
        message: TunnelMessage<'_>,
        out: &mut [u8],
    ) -> Received {
        match message {
            TunnelMessage::Init { tag, message } => self.handle_init(now, route, &tag, message),
            TunnelMessage::WireGuard {
                kind,
                receiver,
                message,
            } => self.handle_wireguard(now, route, kind, receiver, message, out),
        }
    }

    /// Whether a datagram that came by `route` may belong to `handle`: a relayed one only
    /// to the tunnel its session was offered for.
    fn route_matches(&self, route: Route, handle: PeerHandle) -> bool {
        match route {
            Route::Direct(_) => true,
            Route::Relay { session, .. } => self.relayed.get(&session) == Some(&handle),
        }
    }

    fn handle_wireguard(
        &mut self,
        now: Instant,
        route: Route,
        kind: u8,
        receiver: u32,
        datagram: &[u8],
        out: &mut [u8],
    ) -> Received {
        // Our receiver indices carry the tunnel slot above boringtun's 8-bit counter.
        let handle = PeerHandle(receiver >> 8);
        if !self.route_matches(route, handle) {
            return Received::Dropped(DropReason::UnknownSession);
        }
        let Some(peer) = self.peer_mut(handle) else {
            return Received::Dropped(DropReason::UnknownSession);
        };
        if out.len() < datagram.len() {
            return Received::PeerDropped(handle, PeerDropReason::TooLarge);
        }
        let result = peer
            .tunn
            .decapsulate(Some(route.source_ip()), datagram, out);
        // Only what the member's keys produced may refresh its endpoint and liveness: a
        // decrypted packet or keepalive, or a handshake response that completed. A cookie
        // reply, and boringtun's cookie answer to handshakes under load, prove nothing.
        let (received, authenticated) = match result {
            TunnResult::Done => (Received::Consumed, kind == KIND_WG_DATA),
            TunnResult::Err(e) => return tunnel_error(handle, e),
            TunnResult::WriteToNetwork(reply) => {
                // boringtun answers a response that completes our handshake with a keepalive.
                let completed = kind == KIND_WG_RESPONSE && reply.first() == Some(&KIND_WG_DATA);
                let reply = reply.to_vec();
                self.queue_routed(route, &reply);
                // Our handshake completed: send what was waiting for it.
                let pending = completed
                    && self
                        .peer_mut(handle)
                        .is_some_and(|p| std::mem::take(&mut p.announce_pending));
                if pending {
                    self.announce(now, handle);
                }
                (Received::Consumed, completed)
            }
            TunnResult::WriteToTunnelV4(packet, src) => {
                let len = packet.len();
                let received = if is_control(packet) {
                    let control = Control::parse(packet);
                    self.handle_control(now, handle, route, control)
                } else {
                    let dst = packet
                        .get(16..20)
                        .and_then(|d| <[u8; 4]>::try_from(d).ok())
                        .map(Ipv4Addr::from);
                    match peer.accept_packet(now, src, dst, len) {
                        Ok(()) => Received::Deliver {
                            ns: peer.ns,
                            peer: handle,
                            len,
                        },
                        Err(reason) => Received::PeerDropped(handle, reason),
                    }
                };
                (received, true)
            }
            TunnResult::WriteToTunnelV6(..) => (
                Received::PeerDropped(handle, PeerDropReason::BadPayload),
                true,
            ),
        };
        if authenticated {
            if let Some(peer) = self.peer_mut(handle) {
                peer.heard(now, route);
            }
        }
        self.flush_tunnel(handle);
        received
    }

    fn handle_init(
        &mut self,
        now: Instant,
        route: Route,
        tag: &[u8; TAG_LEN],
        message: &[u8],
    ) -> Received {
        let Some(ns) = self.namespace_by_tag(tag) else {
            return Received::Dropped(DropReason::UnknownNamespace);
        };
        let Ok(Packet::HandshakeInit(init)) = Tunn::parse_incoming_packet(message) else {
            return Received::Dropped(DropReason::Malformed);
        };
        let Ok(half) = parse_handshake_anon(&self.x25519_secret, &self.x25519_public, &init) else {
            return Received::Dropped(DropReason::Handshake);
        };
        let Some(&handle) = self.by_x25519.get(&(ns, half.peer_static_public)) else {
            return Received::Dropped(DropReason::UnknownPeer);
        };
        if !self.route_matches(route, handle) {
            return Received::Dropped(DropReason::UnknownSession);
        }
        let Some(peer) = self.peer_mut(handle) else {
            return Received::Dropped(DropReason::UnknownPeer);
        };
        let mut buf = [0u8; 256];
        match peer
            .tunn
            .decapsulate(Some(route.source_ip()), message, &mut buf)
        {
            TunnResult::WriteToNetwork(reply) => {
                // A response means the initiation verified: it was made with the member's
                // static key and a fresh timestamp. A cookie (under load) proves nothing.
                if reply.first() == Some(&KIND_WG_RESPONSE) {
                    peer.heard(now, route);
                }
                let reply = reply.to_vec();
                self.queue_routed(route, &reply);
                Received::Consumed
            }
            TunnResult::Err(e) => tunnel_error(handle, e),
            _ => Received::Consumed,
        }
    }

    fn handle_control(
        &mut self,
        now: Instant,
        handle: PeerHandle,
        route: Route,
        control: Option<Control>,
    ) -> Received {
        match control {
            None => Received::PeerDropped(handle, PeerDropReason::BadPayload),
            Some(Control::Announce(a)) => self.handle_announce(now, handle, a),
            Some(Control::Probe { nonce, ack: false }) => {
                // Answer on the path the probe came by: that is the path it tests.
                let ack = Control::Probe { nonce, ack: true }.emit();
                self.send_control(handle, &ack, Some(route));
                Received::Consumed
            }
            Some(Control::Probe { nonce, ack: true }) => {
                if let Some(peer) = self.peer_mut(handle) {
                    peer.handle_probe_ack(now, route, nonce);
                }
                Received::Consumed
            }
            Some(Control::RelayRequest { target, endpoint }) => {
                self.handle_relay_request(now, handle, target, endpoint)
            }
            Some(Control::RelayOffer {
                peer,
                endpoint,
                session,
            }) => self.handle_relay_offer(now, handle, peer, endpoint, session),
        }
    }

    /// Encrypts `packet` for `handle` by `route` (or its current route) into `out`.
    pub(super) fn send_via(
        &mut self,
        handle: PeerHandle,
        packet: &[u8],
        out: &mut [u8],
        route: Option<Route>,
    ) -> Option<Transmit> {
        let route = match route {
            Some(r) => r,
            None => self.route(handle)?,
        };
        let peer = self.peer_mut(handle)?;
        let ns = peer.ns;
        let len = peer.encapsulate(packet, out)?;
        Some(self.frame_outgoing(ns, route, out, len))
    }

    /// Wraps a WireGuard message lying at `out[SEND_HEADROOM..][..len]` for the wire: the
    /// namespace prefix of an initiation, the relay header of a relayed route.
    pub(super) fn frame_outgoing(
        &self,
        ns: NamespaceId,
        route: Route,
        out: &mut [u8],
        len: usize,
    ) -> Transmit {
        let mut start = SEND_HEADROOM;
        if out[SEND_HEADROOM] == KIND_WG_INIT {
            start -= INIT_PREFIX_LEN;
            emit_init_prefix(&mut out[start..], &self.namespaces[ns.0].keys);
        }
        if let Route::Relay { session, .. } = route {
            start -= RELAY_HEADER_LEN;
            emit_relay_header(&mut out[start..], session);
        }
        Transmit {
            to: route.addr(),
            range: start..SEND_HEADROOM + len,
        }
    }

    /// Queues a datagram built elsewhere (a reply boringtun produced) on `route`.
    fn queue_routed(&mut self, route: Route, datagram: &[u8]) {
        match route {
            Route::Direct(to) => self.queue_transmit(to, datagram.to_vec()),
            Route::Relay { via, session } => {
                let mut d = vec![0u8; RELAY_HEADER_LEN + datagram.len()];
                emit_relay_header(&mut d, session);
                d[RELAY_HEADER_LEN..].copy_from_slice(datagram);
                self.queue_transmit(via, d);
            }
        }
    }

    /// Sends what a tunnel queued while it had no session (boringtun: repeat decapsulate
    /// with an empty datagram until it is done).
    fn flush_tunnel(&mut self, handle: PeerHandle) {
        let mut buf = std::mem::take(&mut self.scratch);
        while let Some(route) = self.route(handle) {
            let Some(peer) = self.peer_mut(handle) else {
                break;
            };
            let ns = peer.ns;
            let len = match peer.tunn.decapsulate(None, &[], &mut buf[SEND_HEADROOM..]) {
                TunnResult::WriteToNetwork(d) => d.len(),
                _ => break,
            };
            let t = self.frame_outgoing(ns, route, &mut buf, len);
            self.queue_transmit(t.to, buf[t.range].to_vec());
        }
        self.scratch = buf;
    }

    /// Encrypts a control packet for `handle` and queues it, by `route` or the current one.
    pub(super) fn send_control(&mut self, handle: PeerHandle, packet: &[u8], route: Option<Route>) {
        let mut buf = std::mem::take(&mut self.scratch);
        if let Some(t) = self.send_via(handle, packet, &mut buf, route) {
            self.queue_transmit(t.to, buf[t.range].to_vec());
        }
        self.scratch = buf;
    }

    /// Runs boringtun's timers of every tunnel (handshake retries, rekeying, keepalives)
    /// and sends what they produce.
    pub(super) fn run_tunnel_timers(&mut self) {
        let mut buf = std::mem::take(&mut self.scratch);
        for handle in self.handles().collect::<Vec<_>>() {
            let Some(route) = self.route(handle) else {
                continue;
            };
            let Some(peer) = self.peer_mut(handle) else {
                continue;
            };
            let ns = peer.ns;
            if let TunnResult::WriteToNetwork(d) =
                peer.tunn.update_timers(&mut buf[SEND_HEADROOM..])
            {
                let len = d.len();
                let t = self.frame_outgoing(ns, route, &mut buf, len);
                self.queue_transmit(t.to, buf[t.range].to_vec());
            }
        }
        self.scratch = buf;
    }
}
