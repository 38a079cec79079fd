//! The WireGuard data path: tunnel messages in (handshakes, data, in-tunnel control), packets
//! out, framed for the route they take (namespace prefix of an initiation, relay header).

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Instant;

use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::{Packet, Tunn, TunnResult};

use super::peer::{tunnel_error, Route};
use super::shared::{self, frame_outgoing, Opened, Sealer, Tunnel};
use super::stats::{DropReason, PeerDropReason};
use super::{Event, NamespaceId, Node, PeerHandle, Received, Transmit, SEND_HEADROOM};
use crate::keys::TAG_LEN;
use crate::wire::{
    emit_relay_header, is_control, Control, TunnelMessage, KIND_WG_DATA, KIND_WG_RESPONSE,
    RELAY_HEADER_LEN,
};

/// How often a member whose packets come without its announcement is sent ours again
/// (which asks for its own: `have_yours` is clear).
const ASK_ANNOUNCE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl Node {
    /// A member's packet was refused as spoofed: if its announcement (or its IPv6 list)
    /// never arrived (lost to a session the handshake replaced, say), ask for it again
    /// with ours, whose `have_yours` is clear, at most once a second.
    pub(super) fn ask_announcement(&mut self, now: Instant, handle: PeerHandle) {
        let Some(peer) = self.peer_mut(handle) else {
            return;
        };
        let due = peer
            .announce_asked
            .is_none_or(|t| now.saturating_duration_since(t) >= ASK_ANNOUNCE_EVERY);
        if due && !peer.has_their_announcement() {
            peer.announce_asked = Some(now);
            self.announce(now, handle);
        }
    }

    /// A tunnel message that came by `route`.
    pub(super) fn handle_tunnel(
        &mut self,
        now: Instant,
        route: Route,
        message: TunnelMessage<'_>,
        out: &mut [u8],
    ) -> Received {
        match message {
            TunnelMessage::Init {
                tag,
                shard,
                message,
            } => self.handle_init(now, route, &tag, shard, message),
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
        // Our receiver indices carry the tunnel slot and shard above boringtun's counter.
        let (handle, shard) = shared::parse_receiver(receiver);
        if !self.route_matches(route, handle) {
            return Received::Dropped(DropReason::UnknownSession);
        }
        let Some(tunnel) = self
            .peer(handle)
            .and_then(|p| p.shards.get(usize::from(shard)))
            .cloned()
        else {
            return Received::Dropped(DropReason::UnknownSession);
        };
        if out.len() < datagram.len() {
            return Received::PeerDropped(handle, PeerDropReason::TooLarge);
        }
        let result = tunnel
            .lock()
            .decapsulate(Some(route.source_ip()), datagram, out);
        // Announced again after the flush below: an announcement queued while there was no
        // session (older addresses) leaves with the flush, after the fresh one, and would
        // otherwise stand at the member until the next periodic one (20 s without our
        // address: seen as a first ping lost for 20 s).
        let mut reannounce = false;
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
                    && shard == 0
                    && self
                        .peer_mut(handle)
                        .is_some_and(|p| std::mem::take(&mut p.announce_pending));
                if pending {
                    self.announce(now, handle);
                    reannounce = true;
                }
                (Received::Consumed, completed)
            }
            TunnResult::WriteToTunnelV4(packet, src) => {
                (self.take_packet(now, handle, route, packet, src), true)
            }
            TunnResult::WriteToTunnelV6(packet, src) => {
                (self.take_packet6(now, handle, packet, src), true)
            }
        };
        if authenticated {
            if let Some(peer) = self.peer_mut(handle) {
                peer.heard(now, route);
            }
        }
        if authenticated {
            self.announce_first(now, handle);
        }
        self.flush_tunnel(handle, shard);
        if reannounce {
            self.announce(now, handle);
        }
        received
    }

    /// A packet the member's tunnel opened, by `route`: an in-tunnel control message, or a
    /// host packet delivered if the member owns its source `src`.
    pub(super) fn take_packet(
        &mut self,
        now: Instant,
        handle: PeerHandle,
        route: Route,
        packet: &[u8],
        src: Ipv4Addr,
    ) -> Received {
        if is_control(packet) {
            let control = Control::parse(packet);
            return self.handle_control(now, handle, route, control);
        }
        let layer2 = self.peer(handle).is_some_and(|p| self.is_layer2(p.ns));
        if layer2 {
            let Some(peer) = self.peer_mut(handle) else {
                return Received::Dropped(DropReason::UnknownSession);
            };
            use hyphae_vswitch::layer2::{parse_envelope, Envelope};
            let checked = match parse_envelope(packet) {
                Some(Envelope::Whole(frame)) => peer.accept_frame(frame, packet.len()),
                // A piece of a larger frame: the switch checks its source once whole.
                Some(Envelope::Fragment(_)) => peer.accept_piece(packet.len()),
                None => return Received::PeerDropped(handle, PeerDropReason::BadPayload),
            };
            return match checked {
                Ok(()) => Received::Deliver {
                    ns: peer.ns,
                    peer: handle,
                    len: packet.len(),
                },
                Err(reason) => Received::PeerDropped(handle, reason),
            };
        }
        let via_link = self.via_link(handle, src);
        let Some(peer) = self.peer_mut(handle) else {
            return Received::Dropped(DropReason::UnknownSession);
        };
        let dst = packet
            .get(16..20)
            .and_then(|d| <[u8; 4]>::try_from(d).ok())
            .map(Ipv4Addr::from);
        match peer.accept_packet(now, src, dst, packet.len(), via_link) {
            Ok(()) => Received::Deliver {
                ns: peer.ns,
                peer: handle,
                len: packet.len(),
            },
            Err(reason) => {
                self.ask_announcement(now, handle);
                Received::PeerDropped(handle, reason)
            }
        }
    }

    /// What a worker's [`Tunnels::open`](super::Tunnels::open) made of a datagram that came
    /// directly from `from`: a packet it opened (lying at the start of `out`) is taken as
    /// [`Node::handle_datagram`] takes one, if its tunnel is still this node's at that
    /// handle. Counted as there.
    pub fn accept(
        &mut self,
        now: Instant,
        from: std::net::SocketAddr,
        opened: Opened,
        out: &[u8],
    ) -> Received {
        self.last_input = Some(now);
        let received = match opened {
            Opened::NotData => Received::Dropped(DropReason::Malformed),
            Opened::UnknownSession => Received::Dropped(DropReason::UnknownSession),
            Opened::Refused { tunnel, received } => {
                if self.is_current(&tunnel) {
                    received
                } else {
                    Received::Dropped(DropReason::UnknownSession)
                }
            }
            Opened::Packet { tunnel, len } => {
                let handle = tunnel.handle();
                if !self.is_current(&tunnel) {
                    Received::Dropped(DropReason::UnknownSession)
                } else {
                    let route = Route::Direct(from);
                    let received = match out.get(..len).filter(|p| p.len() >= 20) {
                        // A keepalive.
                        None if len == 0 => Received::Consumed,
                        None => Received::PeerDropped(handle, PeerDropReason::BadPayload),
                        Some(packet) if packet[0] >> 4 == 6 => {
                            match super::dual_stack::ipv6_source(packet) {
                                Some(src) => self.take_packet6(now, handle, packet, src),
                                None => Received::PeerDropped(handle, PeerDropReason::BadPayload),
                            }
                        }
                        Some(packet) => {
                            let src = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
                            self.take_packet(now, handle, route, packet, src)
                        }
                    };
                    if let Some(peer) = self.peer_mut(handle) {
                        peer.heard(now, route);
                    }
                    self.announce_first(now, handle);
                    self.flush_tunnel(handle, tunnel.shard());
                    received
                }
            }
        };
        self.count(&received);
        received
    }

    /// Whether `tunnel` is a shard of the node's tunnel at its handle (not one removed
    /// since).
    fn is_current(&self, tunnel: &Arc<Tunnel>) -> bool {
        self.peer(tunnel.handle()).is_some_and(|p| {
            p.shards
                .get(usize::from(tunnel.shard()))
                .is_some_and(|t| Arc::ptr_eq(t, tunnel))
        })
    }

    /// A sealer for `handle` on its current route, on the shard of `packet`'s flow
    /// ([`Sealer::seal`] then encrypts outside the node); counts `packet` as sent to the
    /// member, as [`Node::send`] does. A bonded tunnel's host packet takes its flow's link
    /// (`bond.rs`). `None` without such a tunnel.
    pub fn sealer(&mut self, handle: PeerHandle, packet: &[u8]) -> Option<Sealer> {
        let control = is_control(packet);
        let bonded = if control {
            None
        } else {
            self.bonded_route(handle, packet)
        };
        let route = match bonded {
            Some(r) => r,
            None => self.route(handle)?,
        };
        let peer = self.peer_mut(handle)?;
        if !control {
            peer.stats.tx_packets += 1;
            peer.stats.tx_bytes += packet.len() as u64;
        }
        // A layer-2 frame's envelope (protocol 97 from 0.0.0.0) goes with the control
        // messages, on shard 0: the receiver then takes a new MAC's announcement before its
        // first frame (different shards may be opened by different workers there).
        let envelope = packet.len() >= 20
            && packet[0] >> 4 == 4
            && packet[9] == hyphae_vswitch::layer2::IPPROTO_ETHERIP
            && packet[12..20] == [0; 8];
        let shard = if control || envelope {
            0
        } else {
            shared::flow_shard(packet, peer.shards.len())
        };
        let tunnel = Arc::clone(&peer.shards[shard]);
        let fallback = (shard > 0).then(|| Arc::clone(&peer.shards[0]));
        let ns = peer.ns;
        let tag = self.namespaces[ns.0].keys.tag();
        Some(Sealer {
            tunnel,
            fallback,
            route,
            tag,
        })
    }

    fn handle_init(
        &mut self,
        now: Instant,
        route: Route,
        tag: &[u8; TAG_LEN],
        shard: u8,
        message: &[u8],
    ) -> Received {
        if shard >= self.shards {
            return Received::Dropped(DropReason::UnknownSession);
        }
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
        // The member starts a shard we have not made yet (its announcement said how many it
        // accepts, ours may not have reached it): made now, up to what we accept.
        if self
            .peer(handle)
            .is_some_and(|p| p.shards.len() <= usize::from(shard))
        {
            self.set_tunnel_shards(handle, shard + 1);
        }
        let Some(peer) = self.peer_mut(handle) else {
            return Received::Dropped(DropReason::UnknownPeer);
        };
        let Some(tunnel) = peer.shards.get(usize::from(shard)).cloned() else {
            return Received::Dropped(DropReason::UnknownSession);
        };
        let mut buf = [0u8; 256];
        let result = tunnel
            .lock()
            .decapsulate(Some(route.source_ip()), message, &mut buf);
        match result {
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
            Some(Control::Uplinks(links)) => {
                self.handle_uplinks(now, handle, links);
                Received::Consumed
            }
            Some(Control::Addresses(part)) => {
                self.handle_address_part(handle, part);
                Received::Consumed
            }
            Some(Control::Macs(macs)) => {
                let Some(peer) = self.peer_mut(handle) else {
                    return Received::Consumed;
                };
                let ns = peer.ns;
                if !self.is_layer2(ns) {
                    return Received::PeerDropped(handle, PeerDropReason::BadPayload);
                }
                let Some(peer) = self.peer_mut(handle) else {
                    return Received::Consumed;
                };
                // Reported changed or not: the switch decides again at each announcement
                // whether a MAC heard on both sides has moved (`Layer2::set_peer_macs`).
                let Some(macs) = peer.handle_macs(macs) else {
                    return Received::Consumed;
                };
                self.events.push_back(Event::PeerMacs {
                    ns,
                    peer: handle,
                    macs,
                });
                Received::Consumed
            }
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
        Some(self.frame_outgoing(ns, 0, route, out, len))
    }

    /// Wraps a WireGuard message lying at `out[SEND_HEADROOM..][..len]` for the wire: the
    /// namespace prefix of an initiation, the relay header of a relayed route.
    pub(super) fn frame_outgoing(
        &self,
        ns: NamespaceId,
        shard: u8,
        route: Route,
        out: &mut [u8],
        len: usize,
    ) -> Transmit {
        frame_outgoing(&self.namespaces[ns.0].keys.tag(), shard, route, out, len)
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

    /// Announces us to `handle` if nothing has yet, now that its tunnel has a session that
    /// just carried something of the member's: host packets that waited for a session
    /// follow our announcement, never precede it, since the member drops a packet from a
    /// source we have not announced as spoofed. (Handshakes that cross give the side that
    /// does not initiate a session before anything announced it: a first ping was lost
    /// that way, `hyphae-agent --test scale`.)
    fn announce_first(&mut self, now: Instant, handle: PeerHandle) {
        if self
            .peer(handle)
            .is_some_and(|p| !p.announced && p.has_session())
        {
            self.announce(now, handle);
        }
    }

    /// Sends what a tunnel's shard queued while it had no session (boringtun: repeat
    /// decapsulate with an empty datagram until it is done).
    fn flush_tunnel(&mut self, handle: PeerHandle, shard: u8) {
        let mut buf = std::mem::take(&mut self.scratch);
        while let Some(route) = self.route(handle) {
            let Some(peer) = self.peer(handle) else {
                break;
            };
            let Some(tunnel) = peer.shards.get(usize::from(shard)) else {
                break;
            };
            let ns = peer.ns;
            let len = match tunnel
                .lock()
                .decapsulate(None, &[], &mut buf[SEND_HEADROOM..])
            {
                TunnResult::WriteToNetwork(d) => d.len(),
                _ => break,
            };
            let t = self.frame_outgoing(ns, shard, route, &mut buf, len);
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

    /// Runs boringtun's timers of every tunnel shard (handshake retries, rekeying,
    /// keepalives) and sends what they produce. The initiator of a tunnel with a session
    /// starts the handshake of each other shard that has none (only one side initiates:
    /// see `restart_handshake`).
    pub(super) fn run_tunnel_timers(&mut self) {
        let mut buf = std::mem::take(&mut self.scratch);
        for handle in self.handles().collect::<Vec<_>>() {
            let Some(route) = self.route(handle) else {
                continue;
            };
            let Some(peer) = self.peer(handle) else {
                continue;
            };
            let (ns, shards) = (peer.ns, peer.shards.clone());
            let start_shards = peer.initiator && peer.has_session();
            for tunnel in shards {
                let mut tunn = tunnel.lock();
                let mut result = tunn.update_timers(&mut buf[SEND_HEADROOM..]);
                if start_shards
                    && tunnel.shard() > 0
                    && !matches!(result, TunnResult::WriteToNetwork(_))
                    && tunn.time_since_last_handshake().is_none()
                {
                    result = tunn.format_handshake_initiation(&mut buf[SEND_HEADROOM..], false);
                }
                let len = match result {
                    TunnResult::WriteToNetwork(d) => d.len(),
                    _ => continue,
                };
                drop(tunn);
                let t = self.frame_outgoing(ns, tunnel.shard(), route, &mut buf, len);
                self.queue_transmit(t.to, buf[t.range].to_vec());
            }
        }
        self.scratch = buf;
    }
}
