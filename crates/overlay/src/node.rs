//! The tunnel endpoint of one agent: every member it talks to, in every namespace.
//!
//! A [`Node`] owns no socket. The driver feeds it underlay datagrams
//! ([`Node::handle_datagram`]), packets for members ([`Node::send`]) and the passage of time
//! ([`Node::handle_timeout`], at least every [`TICK`]); it drains datagrams to send with
//! [`Node::poll_transmit`] and address changes with [`Node::poll_event`] after each call.
//!
//! One WireGuard tunnel (boringtun's `Tunn`: Noise_IKpsk2, replay window, rekeying, cookies)
//! exists per (namespace, member) pair, with the namespace's pre-shared key, so a packet can
//! only ever be delivered into the namespace whose key decrypted it. Tunnels are opened only
//! after a hello authenticated with the namespace key; the member's source addresses are
//! checked against the addresses it announced over that tunnel.

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::time::{Duration, Instant};

use boringtun::noise::errors::WireGuardError;
use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::{Packet, Tunn, TunnResult};

use crate::keys::{NamespaceKeys, TAG_LEN};
use crate::wire::{
    self, emit_init_prefix, Announce, Hello, HelloError, INIT_PREFIX_LEN, KIND_HELLO, KIND_INIT,
    KIND_WG_COOKIE, KIND_WG_DATA, KIND_WG_INIT, KIND_WG_RESPONSE, WG_DATA_OVERHEAD,
};
use crate::{Identity, PeerId};

/// How often the driver must call [`Node::handle_timeout`]: boringtun's timers count in
/// ticks of its `update_timers`, and WireGuard's shortest timer (rekey timeout) is 5 s.
pub const TICK: Duration = Duration::from_millis(250);

/// Hello retry interval to a configured endpoint with no tunnel yet.
pub const HELLO_INTERVAL: Duration = Duration::from_secs(1);

/// Re-announce addresses this often, so a member that missed one catches up.
pub const ANNOUNCE_INTERVAL: Duration = Duration::from_secs(20);

/// A configured endpoint is hello'd again when nothing was heard from it for this long
/// (twice the keepalive, plus slack): the member behind it may have restarted with no
/// memory of us.
pub const PEER_SILENT_AFTER: Duration = Duration::from_secs(60);

/// A hello request restarts the handshake only with a member silent for this long: a
/// restarted member stops sending authenticated packets at once, a live one does not.
pub const RESTART_AFTER_SILENCE: Duration = Duration::from_secs(2);

/// WireGuard persistent keepalive, seconds: keeps NAT mappings open and proves liveness.
pub const KEEPALIVE_SECS: u16 = 25;

/// A member we sent packets to and heard nothing from for this long is gone. A live one
/// answers data within WireGuard's keepalive timeout (10 s) even when it has nothing to say.
pub const UNREACHABLE_AFTER: Duration = Duration::from_secs(15);

/// Most tunnels one node holds (receiver indices carry 24 bits of tunnel slot).
pub const MAX_PEERS: usize = 4096;

/// Most control datagrams queued for sending; beyond, the oldest are dropped.
const MAX_QUEUED_TRANSMITS: usize = 1024;

/// Bytes [`Node::send`] needs in front of the packet's encryption: the wrapped-initiation
/// prefix, written in place when the tunnel has to handshake first.
pub const SEND_HEADROOM: usize = INIT_PREFIX_LEN;

/// Scratch buffer for control messages and for packets a tunnel queued before its
/// handshake: the largest datagram plus headroom.
const SCRATCH_LEN: usize = SEND_HEADROOM + WG_DATA_OVERHEAD + 65536;

/// Index of a namespace in the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespaceId(pub usize);

/// A tunnel to one member in one namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerHandle(u32);

/// Why the node dropped a datagram before it could be tied to a tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Too short, unknown kind, or a bare WireGuard initiation.
    Malformed,
    /// A namespace tag this node is not a member of (e.g. a wrong secret).
    UnknownNamespace,
    /// A hello whose MAC does not verify.
    BadMac,
    /// An identity key that is not a valid public key, or our own.
    BadIdentity,
    /// A handshake initiation from a key that never sent a valid hello.
    UnknownPeer,
    /// A WireGuard message for a tunnel or session this node does not have.
    UnknownSession,
    /// A handshake message that failed to verify.
    Handshake,
    /// No room for another tunnel.
    PeerLimit,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 8] = [
        DropReason::Malformed,
        DropReason::UnknownNamespace,
        DropReason::BadMac,
        DropReason::BadIdentity,
        DropReason::UnknownPeer,
        DropReason::UnknownSession,
        DropReason::Handshake,
        DropReason::PeerLimit,
    ];

    /// Stable snake_case name, used in status output.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::UnknownNamespace => "unknown_namespace",
            DropReason::BadMac => "bad_mac",
            DropReason::BadIdentity => "bad_identity",
            DropReason::UnknownPeer => "unknown_peer",
            DropReason::UnknownSession => "unknown_session",
            DropReason::Handshake => "handshake",
            DropReason::PeerLimit => "peer_limit",
        }
    }
}

/// Why a datagram of an established tunnel was dropped; counted per peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerDropReason {
    /// Authentication tag did not verify.
    Decrypt,
    /// Replayed or too old counter.
    Replay,
    /// Source address the member does not own.
    SpoofedSource,
    /// Decrypted payload is not an IPv4 packet, or a malformed control packet.
    BadPayload,
    /// Too large to encrypt into one datagram.
    TooLarge,
}

impl PeerDropReason {
    /// Every reason, in counter order.
    pub const ALL: [PeerDropReason; 5] = [
        PeerDropReason::Decrypt,
        PeerDropReason::Replay,
        PeerDropReason::SpoofedSource,
        PeerDropReason::BadPayload,
        PeerDropReason::TooLarge,
    ];

    /// Stable snake_case name, used in status output.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerDropReason::Decrypt => "decrypt",
            PeerDropReason::Replay => "replay",
            PeerDropReason::SpoofedSource => "spoofed_source",
            PeerDropReason::BadPayload => "bad_payload",
            PeerDropReason::TooLarge => "too_large",
        }
    }
}

/// Traffic counters of one tunnel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Packets delivered from the member.
    pub rx_packets: u64,
    /// Bytes of packets delivered from the member.
    pub rx_bytes: u64,
    /// Packets sent to the member.
    pub tx_packets: u64,
    /// Bytes of packets sent to the member.
    pub tx_bytes: u64,
    drops: [u64; PeerDropReason::ALL.len()],
}

impl PeerStats {
    /// How many packets were dropped for `reason`.
    pub fn drops(&self, reason: PeerDropReason) -> u64 {
        self.drops[reason as usize]
    }
}

/// What became of a datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// An IPv4 packet of `len` bytes from `peer` lies at the start of the output buffer; its
    /// source address is one the member owns.
    Deliver {
        /// The namespace it belongs to.
        ns: NamespaceId,
        /// The member it came from.
        peer: PeerHandle,
        /// Its length.
        len: usize,
    },
    /// Handled inside the node (handshake, hello, keepalive, control).
    Consumed,
    /// Dropped before it reached a tunnel.
    Dropped(DropReason),
    /// Dropped by a tunnel.
    PeerDropped(PeerHandle, PeerDropReason),
}

/// Something the driver must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `peer` now owns exactly `addresses` in `ns`.
    PeerAddresses {
        /// The namespace.
        ns: NamespaceId,
        /// The member.
        peer: PeerHandle,
        /// Its addresses.
        addresses: Vec<Ipv4Addr>,
    },
    /// We kept sending to `peer` and heard nothing back for [`UNREACHABLE_AFTER`]: it is
    /// gone (crashed, or moved), and its tunnel has been removed. Its addresses should be
    /// resolved again.
    PeerUnreachable {
        /// The namespace.
        ns: NamespaceId,
        /// The member (its handle is free for reuse after this event).
        peer: PeerHandle,
        /// The addresses it had announced.
        addresses: Vec<Ipv4Addr>,
    },
}

/// A datagram encrypted in place by [`Node::send`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Where to send it.
    pub to: SocketAddr,
    /// Where it lies in the output buffer.
    pub range: Range<usize>,
}

/// A read-only view of one tunnel, for status.
#[derive(Debug)]
pub struct PeerInfo<'a> {
    /// The handle.
    pub handle: PeerHandle,
    /// The namespace.
    pub ns: NamespaceId,
    /// The member's identity.
    pub id: PeerId,
    /// Its current underlay endpoint.
    pub endpoint: SocketAddr,
    /// The addresses it announced.
    pub addresses: &'a [Ipv4Addr],
    /// Time since the last completed handshake.
    pub handshake_age: Option<Duration>,
    /// Counters.
    pub stats: &'a PeerStats,
}

struct Namespace {
    keys: NamespaceKeys,
    addresses: Vec<Ipv4Addr>,
}

struct Peer {
    ns: NamespaceId,
    id: PeerId,
    tunn: Tunn,
    endpoint: SocketAddr,
    addresses: Vec<Ipv4Addr>,
    have_their_announce: bool,
    /// We initiate handshakes with this member (see [`Node::is_initiator`]).
    initiator: bool,
    /// Send our announcement once the handshake in flight completes.
    announce_pending: bool,
    /// Last time a hello request made us restart the handshake.
    last_forced: Option<Instant>,
    next_announce: Instant,
    last_heard: Instant,
    /// `stats.tx_packets` at the previous timeout, to tell whether we are sending.
    tx_seen: u64,
    stats: PeerStats,
}

struct StaticPeer {
    ns: NamespaceId,
    endpoint: SocketAddr,
    next_hello: Instant,
    /// The tunnel a hello reply from this endpoint led to.
    peer: Option<PeerHandle>,
}

/// The tunnel endpoint of one agent.
pub struct Node {
    identity: Identity,
    x25519_secret: x25519_dalek::StaticSecret,
    x25519_public: x25519_dalek::PublicKey,
    namespaces: Vec<Namespace>,
    peers: Vec<Option<Peer>>,
    by_id: HashMap<(NamespaceId, PeerId), PeerHandle>,
    by_x25519: HashMap<(NamespaceId, [u8; 32]), PeerHandle>,
    static_peers: Vec<StaticPeer>,
    transmits: VecDeque<(SocketAddr, Vec<u8>)>,
    events: VecDeque<Event>,
    drops: [u64; DropReason::ALL.len()],
    scratch: Vec<u8>,
}

impl Node {
    /// A node with no namespaces.
    pub fn new(identity: Identity) -> Self {
        let x25519_secret = identity.x25519();
        let x25519_public = x25519_dalek::PublicKey::from(&x25519_secret);
        Self {
            identity,
            x25519_secret,
            x25519_public,
            namespaces: Vec::new(),
            peers: Vec::new(),
            by_id: HashMap::new(),
            by_x25519: HashMap::new(),
            static_peers: Vec::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            drops: [0; DropReason::ALL.len()],
            scratch: vec![0; SCRATCH_LEN],
        }
    }

    /// This node's identity.
    pub fn peer_id(&self) -> PeerId {
        self.identity.peer_id()
    }

    /// Joins a namespace in which this node owns `addresses`.
    pub fn add_namespace(&mut self, keys: NamespaceKeys, addresses: Vec<Ipv4Addr>) -> NamespaceId {
        self.namespaces.push(Namespace { keys, addresses });
        NamespaceId(self.namespaces.len() - 1)
    }

    /// Adds a member endpoint to contact in `ns`; it is hello'd from the next timeout on.
    pub fn add_static_peer(&mut self, ns: NamespaceId, endpoint: SocketAddr, now: Instant) {
        self.static_peers.push(StaticPeer {
            ns,
            endpoint,
            next_hello: now,
            peer: None,
        });
    }

    /// Opens a tunnel to member `id` of `ns`, found at `endpoint` (through the DHT): a hello
    /// tells the member to open its side, and the initiator of the pair starts the handshake.
    /// A member we already have a tunnel with keeps it.
    pub fn add_member(
        &mut self,
        now: Instant,
        ns: NamespaceId,
        id: PeerId,
        endpoint: SocketAddr,
    ) -> Result<PeerHandle, DropReason> {
        if id == self.peer_id() {
            return Err(DropReason::BadIdentity);
        }
        if let Some(&handle) = self.by_id.get(&(ns, id)) {
            return Ok(handle);
        }
        let handle = self.open_tunnel(now, ns, id, endpoint)?;
        // The member has no tunnel with us yet and accepts handshakes only on one: the
        // hello makes it open one (and, if it is the initiator, start the handshake).
        let hello = Hello::emit(&self.namespaces[ns.0].keys, &self.peer_id(), false);
        self.queue_transmit(endpoint, hello.to_vec());
        if self.peer_mut(handle).is_some_and(|p| p.initiator) {
            self.announce(now, handle);
        }
        Ok(handle)
    }

    /// Replaces the addresses this node owns in `ns` and announces them to its members.
    pub fn set_addresses(&mut self, now: Instant, ns: NamespaceId, addresses: Vec<Ipv4Addr>) {
        let Some(namespace) = self.namespaces.get_mut(ns.0) else {
            return;
        };
        if namespace.addresses == addresses {
            return;
        }
        namespace.addresses = addresses;
        let handles: Vec<PeerHandle> = self
            .by_id
            .iter()
            .filter(|((n, _), _)| *n == ns)
            .map(|(_, h)| *h)
            .collect();
        for handle in handles {
            if self
                .peer_mut(handle)
                .is_some_and(|p| p.initiator || p.tunn.stats().0.is_some())
            {
                self.announce(now, handle);
            }
        }
    }

    /// Datagrams dropped before reaching a tunnel, by reason.
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason as usize]
    }

    /// Every tunnel, for status.
    pub fn peers(&self) -> impl Iterator<Item = PeerInfo<'_>> {
        self.peers.iter().enumerate().filter_map(|(i, p)| {
            let p = p.as_ref()?;
            Some(PeerInfo {
                handle: PeerHandle(i as u32),
                ns: p.ns,
                id: p.id,
                endpoint: p.endpoint,
                addresses: &p.addresses,
                handshake_age: p.tunn.stats().0,
                stats: &p.stats,
            })
        })
    }

    /// Next datagram to send.
    pub fn poll_transmit(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        self.transmits.pop_front()
    }

    /// Next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Handles a datagram from the underlay. A delivered packet is decrypted into `out`,
    /// which must be at least as long as the datagram.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
        out: &mut [u8],
    ) -> Received {
        let received = match datagram.first() {
            Some(&KIND_WG_DATA) | Some(&KIND_WG_RESPONSE) | Some(&KIND_WG_COOKIE) => {
                self.handle_wireguard(now, from, datagram, out)
            }
            Some(&KIND_INIT) => self.handle_init(now, from, datagram),
            Some(&KIND_HELLO) => self.handle_hello(now, from, datagram),
            Some(&KIND_WG_INIT) | Some(_) | None => Received::Dropped(DropReason::Malformed),
        };
        match &received {
            Received::Dropped(reason) => self.drops[*reason as usize] += 1,
            Received::PeerDropped(peer, reason) => {
                if let Some(p) = self.peer_mut(*peer) {
                    p.stats.drops[*reason as usize] += 1;
                }
            }
            Received::Deliver { .. } | Received::Consumed => {}
        }
        received
    }

    fn handle_wireguard(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
        out: &mut [u8],
    ) -> Received {
        let Some(index) = wire::receiver_index(datagram) else {
            return Received::Dropped(DropReason::Malformed);
        };
        let handle = PeerHandle(index >> 8);
        let Some(peer) = self.peer_mut(handle) else {
            return Received::Dropped(DropReason::UnknownSession);
        };
        if out.len() < datagram.len() {
            return Received::PeerDropped(handle, PeerDropReason::TooLarge);
        }
        let kind = datagram[0];
        let result = peer.tunn.decapsulate(Some(from.ip()), datagram, out);
        // Only what the member's keys produced may refresh its endpoint and liveness: a
        // decrypted packet or keepalive, or a handshake response that completed. A cookie
        // reply, and boringtun's cookie answer to handshakes under load, prove nothing.
        let (received, authenticated) = match result {
            TunnResult::Done => (Received::Consumed, kind == KIND_WG_DATA),
            TunnResult::Err(e) => return self.tunnel_error(handle, e),
            TunnResult::WriteToNetwork(reply) => {
                // boringtun answers a response that completes our handshake with a keepalive.
                let completed = kind == KIND_WG_RESPONSE && reply.first() == Some(&KIND_WG_DATA);
                let reply = reply.to_vec();
                self.queue_transmit(from, reply);
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
                let received = if Announce::is_control(packet) {
                    let announce = Announce::parse(packet);
                    self.handle_announce(now, handle, announce)
                } else if peer.addresses.contains(&src) {
                    peer.stats.rx_packets += 1;
                    peer.stats.rx_bytes += len as u64;
                    Received::Deliver {
                        ns: peer.ns,
                        peer: handle,
                        len,
                    }
                } else {
                    Received::PeerDropped(handle, PeerDropReason::SpoofedSource)
                };
                (received, true)
            }
            TunnResult::WriteToTunnelV6(..) => (
                Received::PeerDropped(handle, PeerDropReason::BadPayload),
                true,
            ),
        };
        // WireGuard roaming: the member may have moved.
        if authenticated {
            if let Some(peer) = self.peer_mut(handle) {
                peer.endpoint = from;
                peer.last_heard = now;
            }
        }
        self.flush_tunnel(handle);
        received
    }

    fn tunnel_error(&mut self, handle: PeerHandle, e: WireGuardError) -> Received {
        tracing::debug!(?handle, error = ?e, "tunnel error");
        match e {
            WireGuardError::InvalidAeadTag => {
                Received::PeerDropped(handle, PeerDropReason::Decrypt)
            }
            WireGuardError::DuplicateCounter | WireGuardError::InvalidCounter => {
                Received::PeerDropped(handle, PeerDropReason::Replay)
            }
            WireGuardError::InvalidPacket => {
                Received::PeerDropped(handle, PeerDropReason::BadPayload)
            }
            WireGuardError::WrongIndex
            | WireGuardError::NoCurrentSession
            | WireGuardError::ConnectionExpired => Received::Dropped(DropReason::UnknownSession),
            _ => Received::Dropped(DropReason::Handshake),
        }
    }

    fn handle_init(&mut self, now: Instant, from: SocketAddr, datagram: &[u8]) -> Received {
        let Some(ns) = wire::tag(datagram).and_then(|t| self.namespace_by_tag(&t)) else {
            return Received::Dropped(DropReason::UnknownNamespace);
        };
        let inner = &datagram[INIT_PREFIX_LEN.min(datagram.len())..];
        let Ok(Packet::HandshakeInit(init)) = Tunn::parse_incoming_packet(inner) else {
            return Received::Dropped(DropReason::Malformed);
        };
        let Ok(half) = parse_handshake_anon(&self.x25519_secret, &self.x25519_public, &init) else {
            return Received::Dropped(DropReason::Handshake);
        };
        let Some(&handle) = self.by_x25519.get(&(ns, half.peer_static_public)) else {
            return Received::Dropped(DropReason::UnknownPeer);
        };
        let Some(peer) = self.peer_mut(handle) else {
            return Received::Dropped(DropReason::UnknownPeer);
        };
        let mut buf = [0u8; 256];
        match peer.tunn.decapsulate(Some(from.ip()), inner, &mut buf) {
            TunnResult::WriteToNetwork(reply) => {
                // A response means the initiation verified: it was made with the member's
                // static key and a fresh timestamp. A cookie (under load) proves nothing.
                if reply.first() == Some(&KIND_WG_RESPONSE) {
                    peer.endpoint = from;
                    peer.last_heard = now;
                }
                let reply = reply.to_vec();
                self.queue_transmit(from, reply);
                Received::Consumed
            }
            TunnResult::Err(e) => self.tunnel_error(handle, e),
            _ => Received::Consumed,
        }
    }

    fn handle_hello(&mut self, now: Instant, from: SocketAddr, datagram: &[u8]) -> Received {
        let hello = match Hello::parse(datagram) {
            Ok(h) => h,
            Err(_) => return Received::Dropped(DropReason::Malformed),
        };
        let Some(ns) = self.namespace_by_tag(&hello.tag) else {
            return Received::Dropped(DropReason::UnknownNamespace);
        };
        let keys = &self.namespaces[ns.0].keys;
        match Hello::verify(datagram, keys) {
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
                if let Some(peer) = self.peer_mut(handle) {
                    if !hello.reply {
                        // A hello request means the member has no working tunnel with us
                        // (it restarted, or lost us): it no longer has our addresses, and if
                        // we are the initiator, a fresh handshake is ours to start.
                        peer.have_their_announce = false;
                        self.restart_handshake(now, handle, from);
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
                }
            }
        }
        Received::Consumed
    }

    /// Starts a fresh handshake with a member that lost its tunnel, if we are the initiator
    /// (at most once per [`HELLO_INTERVAL`]); our announcement follows once it completes.
    ///
    /// Only one side ever initiates a fresh tunnel: boringtun forgets its own initiation
    /// when it answers a crossing one, so two members initiating at once can leave both
    /// waiting as responders.
    fn restart_handshake(&mut self, now: Instant, handle: PeerHandle, to: SocketAddr) {
        let mut buf = std::mem::take(&mut self.scratch);
        if let Some(peer) = self.peer_mut(handle) {
            let recent = peer
                .last_forced
                .is_some_and(|t| now.saturating_duration_since(t) < HELLO_INTERVAL);
            // A member that still sends us authenticated packets has its tunnel: a hello
            // from it (a retry that crossed our handshake, or a replay) changes nothing.
            let alive = peer.tunn.stats().0.is_some()
                && now.saturating_duration_since(peer.last_heard) < RESTART_AFTER_SILENCE;
            if peer.initiator && !recent && !alive {
                peer.last_forced = Some(now);
                peer.announce_pending = true;
                let ns = peer.ns;
                if let TunnResult::WriteToNetwork(d) = peer
                    .tunn
                    .format_handshake_initiation(&mut buf[SEND_HEADROOM..], true)
                {
                    let len = d.len();
                    let t = self.frame_outgoing(ns, to, &mut buf, len);
                    self.queue_transmit(t.to, buf[t.range].to_vec());
                }
            }
        }
        self.scratch = buf;
    }

    fn open_tunnel(
        &mut self,
        now: Instant,
        ns: NamespaceId,
        id: PeerId,
        endpoint: SocketAddr,
    ) -> Result<PeerHandle, DropReason> {
        let x25519 = id.x25519().map_err(|_| DropReason::BadIdentity)?;
        // Two Ed25519 keys (P and -P) share one X25519 key: a second identity must not take
        // over a member's (or our own) tunnel key.
        if x25519 == self.x25519_public || self.by_x25519.contains_key(&(ns, x25519.to_bytes())) {
            return Err(DropReason::BadIdentity);
        }
        let slot = match self.peers.iter().position(Option::is_none) {
            Some(slot) => slot,
            None if self.peers.len() < MAX_PEERS => {
                self.peers.push(None);
                self.peers.len() - 1
            }
            None => return Err(DropReason::PeerLimit),
        };
        let handle = PeerHandle(slot as u32);
        let initiator = self.x25519_public.as_bytes() < x25519.as_bytes();
        let tunn = Tunn::new(
            self.x25519_secret.clone(),
            x25519,
            Some(self.namespaces[ns.0].keys.psk),
            Some(KEEPALIVE_SECS),
            handle.0,
            None,
        );
        tracing::debug!(peer = ?id, %endpoint, "tunnel opened");
        self.peers[slot] = Some(Peer {
            ns,
            id,
            tunn,
            endpoint,
            addresses: Vec::new(),
            have_their_announce: false,
            initiator,
            announce_pending: false,
            last_forced: None,
            // A responder whose initiator has not completed a handshake a second from now
            // asks it again (the timer path sends a hello rather than initiating).
            next_announce: now
                + if initiator {
                    ANNOUNCE_INTERVAL
                } else {
                    HELLO_INTERVAL
                },
            last_heard: now,
            tx_seen: 0,
            stats: PeerStats::default(),
        });
        self.by_id.insert((ns, id), handle);
        self.by_x25519.insert((ns, x25519.to_bytes()), handle);
        Ok(handle)
    }

    fn handle_announce(
        &mut self,
        now: Instant,
        handle: PeerHandle,
        announce: Option<Announce>,
    ) -> Received {
        let Some(announce) = announce else {
            return Received::PeerDropped(handle, PeerDropReason::BadPayload);
        };
        let Some(peer) = self.peer_mut(handle) else {
            return Received::Consumed;
        };
        let ns = peer.ns;
        peer.have_their_announce = true;
        if peer.addresses != announce.addresses {
            tracing::info!(peer = ?peer.id, addresses = ?announce.addresses, "member addresses");
            peer.addresses = announce.addresses.clone();
            self.events.push_back(Event::PeerAddresses {
                ns,
                peer: handle,
                addresses: announce.addresses,
            });
        }
        if !announce.have_yours {
            self.announce(now, handle);
        }
        Received::Consumed
    }

    /// Sends our addresses to `handle` through its tunnel (a handshake first, if needed).
    fn announce(&mut self, now: Instant, handle: PeerHandle) {
        let Some(peer) = self.peers.get(handle.0 as usize).and_then(Option::as_ref) else {
            return;
        };
        let packet = Announce {
            have_yours: peer.have_their_announce,
            addresses: self.namespaces[peer.ns.0].addresses.clone(),
        }
        .emit();
        let mut buf = std::mem::take(&mut self.scratch);
        if let Some(t) = self.send(handle, &packet, &mut buf) {
            self.queue_transmit(t.to, buf[t.range].to_vec());
        }
        self.scratch = buf;
        if let Some(peer) = self.peer_mut(handle) {
            peer.next_announce = now + ANNOUNCE_INTERVAL;
        }
    }

    /// Encrypts an IPv4 packet for `peer` into `out`, leaving the first [`SEND_HEADROOM`]
    /// bytes for a prefix. `out` must be at least `SEND_HEADROOM + packet.len() + 32` and
    /// 160 bytes long. Without a session the packet is queued in the tunnel and a handshake
    /// initiation is returned instead.
    pub fn send(&mut self, handle: PeerHandle, packet: &[u8], out: &mut [u8]) -> Option<Transmit> {
        let peer = self.peers.get_mut(handle.0 as usize)?.as_mut()?;
        let needed = SEND_HEADROOM + (packet.len() + WG_DATA_OVERHEAD).max(wire::WG_INIT_LEN);
        if out.len() < needed {
            peer.stats.drops[PeerDropReason::TooLarge as usize] += 1;
            return None;
        }
        let (ns, endpoint) = (peer.ns, peer.endpoint);
        let len = match peer.tunn.encapsulate(packet, &mut out[SEND_HEADROOM..]) {
            TunnResult::WriteToNetwork(d) => d.len(),
            _ => return None,
        };
        if !Announce::is_control(packet) {
            peer.stats.tx_packets += 1;
            peer.stats.tx_bytes += packet.len() as u64;
        }
        Some(self.frame_outgoing(ns, endpoint, out, len))
    }

    /// Wraps a WireGuard message lying at `out[SEND_HEADROOM..][..len]` for the wire.
    fn frame_outgoing(
        &self,
        ns: NamespaceId,
        to: SocketAddr,
        out: &mut [u8],
        len: usize,
    ) -> Transmit {
        if out[SEND_HEADROOM] == KIND_WG_INIT {
            emit_init_prefix(out, &self.namespaces[ns.0].keys);
            Transmit {
                to,
                range: 0..SEND_HEADROOM + len,
            }
        } else {
            Transmit {
                to,
                range: SEND_HEADROOM..SEND_HEADROOM + len,
            }
        }
    }

    /// Sends what a tunnel queued while it had no session (boringtun: repeat decapsulate
    /// with an empty datagram until it is done).
    fn flush_tunnel(&mut self, handle: PeerHandle) {
        let mut buf = std::mem::take(&mut self.scratch);
        while let Some(peer) = self
            .peers
            .get_mut(handle.0 as usize)
            .and_then(Option::as_mut)
        {
            let (ns, to) = (peer.ns, peer.endpoint);
            let len = match peer.tunn.decapsulate(None, &[], &mut buf[SEND_HEADROOM..]) {
                TunnResult::WriteToNetwork(d) => d.len(),
                _ => break,
            };
            let t = self.frame_outgoing(ns, to, &mut buf, len);
            self.queue_transmit(t.to, buf[t.range].to_vec());
        }
        self.scratch = buf;
    }

    /// Runs timers: WireGuard's (handshake retries, rekeying, keepalives), hellos to
    /// configured endpoints, periodic announcements.
    pub fn handle_timeout(&mut self, now: Instant) {
        let gone: Vec<PeerHandle> = self
            .peers
            .iter_mut()
            .enumerate()
            .filter_map(|(i, p)| {
                let p = p.as_mut()?;
                let sending = p.stats.tx_packets > p.tx_seen;
                p.tx_seen = p.stats.tx_packets;
                (sending && now.saturating_duration_since(p.last_heard) >= UNREACHABLE_AFTER)
                    .then_some(PeerHandle(i as u32))
            })
            .collect();
        for handle in gone {
            if let Some(peer) = self.remove_peer(handle) {
                tracing::info!(peer = ?peer.id, "member unreachable: tunnel removed");
                self.events.push_back(Event::PeerUnreachable {
                    ns: peer.ns,
                    peer: handle,
                    addresses: peer.addresses,
                });
            }
        }
        let mut buf = std::mem::take(&mut self.scratch);
        for slot in 0..self.peers.len() {
            let Some(peer) = self.peers[slot].as_mut() else {
                continue;
            };
            let (ns, to) = (peer.ns, peer.endpoint);
            if let TunnResult::WriteToNetwork(d) =
                peer.tunn.update_timers(&mut buf[SEND_HEADROOM..])
            {
                let len = d.len();
                let t = self.frame_outgoing(ns, to, &mut buf, len);
                self.queue_transmit(t.to, buf[t.range].to_vec());
            }
        }
        self.scratch = buf;

        let due: Vec<PeerHandle> = self
            .peers
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let p = p.as_ref()?;
                (now >= p.next_announce).then_some(PeerHandle(i as u32))
            })
            .collect();
        for handle in due {
            let Some(peer) = self.peer_mut(handle) else {
                continue;
            };
            if peer.initiator || peer.tunn.stats().0.is_some() {
                self.announce(now, handle);
            } else {
                // A responder never starts a fresh tunnel (see `restart_handshake`): it asks
                // the initiator with a hello.
                peer.next_announce = now + ANNOUNCE_INTERVAL;
                let (ns, to) = (peer.ns, peer.endpoint);
                let hello = Hello::emit(&self.namespaces[ns.0].keys, &self.peer_id(), false);
                self.queue_transmit(to, hello.to_vec());
            }
        }

        for i in 0..self.static_peers.len() {
            let sp = &self.static_peers[i];
            if now < sp.next_hello || self.static_peer_is_live(sp, now) {
                continue;
            }
            let (ns, endpoint) = (sp.ns, sp.endpoint);
            let hello = Hello::emit(&self.namespaces[ns.0].keys, &self.peer_id(), false);
            self.queue_transmit(endpoint, hello.to_vec());
            self.static_peers[i].next_hello = now + HELLO_INTERVAL;
        }
    }

    /// A configured endpoint needs no hello while the member its hello reply came from (or
    /// a member at that endpoint) has a completed handshake and was heard recently.
    fn static_peer_is_live(&self, sp: &StaticPeer, now: Instant) -> bool {
        let live = |p: &Peer| {
            p.tunn.stats().0.is_some()
                && now.saturating_duration_since(p.last_heard) < PEER_SILENT_AFTER
        };
        if let Some(p) = sp.peer.and_then(|h| self.peers.get(h.0 as usize)?.as_ref()) {
            return live(p);
        }
        self.peers
            .iter()
            .flatten()
            .any(|p| p.ns == sp.ns && p.endpoint == sp.endpoint && live(p))
    }

    fn remove_peer(&mut self, handle: PeerHandle) -> Option<Peer> {
        let peer = self.peers.get_mut(handle.0 as usize)?.take()?;
        self.by_id.remove(&(peer.ns, peer.id));
        self.by_x25519.retain(|_, h| *h != handle);
        for sp in &mut self.static_peers {
            if sp.peer == Some(handle) {
                sp.peer = None;
            }
        }
        Some(peer)
    }

    fn namespace_by_tag(&self, tag: &[u8; TAG_LEN]) -> Option<NamespaceId> {
        self.namespaces
            .iter()
            .position(|n| &n.keys.tag == tag)
            .map(NamespaceId)
    }

    fn peer_mut(&mut self, handle: PeerHandle) -> Option<&mut Peer> {
        self.peers.get_mut(handle.0 as usize)?.as_mut()
    }

    fn queue_transmit(&mut self, to: SocketAddr, datagram: Vec<u8>) {
        if self.transmits.len() >= MAX_QUEUED_TRANSMITS {
            self.transmits.pop_front();
        }
        self.transmits.push_back((to, datagram));
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.peer_id())
            .field("namespaces", &self.namespaces.len())
            .field("peers", &self.by_id.len())
            .finish()
    }
}
