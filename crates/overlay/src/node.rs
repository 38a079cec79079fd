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
//!
//! When a member does not answer on its direct path (a NAT, a firewall), the node asks
//! another member that both can reach to relay: the relay forwards the two members'
//! end-to-end encrypted datagrams verbatim for one session, and both ends keep probing the
//! direct path (once a second) and return to it as soon as a probe is answered on it.

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::time::{Duration, Instant};

use boringtun::noise::errors::WireGuardError;
use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::{Packet, Tunn, TunnResult};

use crate::keys::{NamespaceKeys, TAG_LEN};
use crate::wire::{
    self, emit_init_prefix, emit_relay_header, is_control, Announce, Control, Hello, HelloError,
    INIT_PREFIX_LEN, KIND_HELLO, KIND_INIT, KIND_RELAY, KIND_WG_COOKIE, KIND_WG_DATA, KIND_WG_INIT,
    KIND_WG_RESPONSE, RELAY_HEADER_LEN, WG_DATA_OVERHEAD,
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

/// A member that has not answered on its path for this long is reached through a relay.
pub const RELAY_AFTER: Duration = Duration::from_secs(3);

/// A relay request unanswered for this long goes to the next candidate.
pub const RELAY_RETRY: Duration = Duration::from_secs(1);

/// While relayed, the direct path is probed this often.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The round trip of each live tunnel's current path is measured this often.
pub const RTT_INTERVAL: Duration = Duration::from_secs(10);

/// A relay session that forwarded nothing for this long is forgotten by the relay.
pub const RELAY_IDLE: Duration = Duration::from_secs(120);

/// Most relay sessions one node carries for others, in all, and per requesting member.
pub const MAX_RELAY_SESSIONS: usize = 1024;
const MAX_RELAY_SESSIONS_PER_MEMBER: usize = 32;

/// Longest interval between hellos to a configured endpoint that never answers.
const MAX_HELLO_INTERVAL: Duration = Duration::from_secs(30);

/// Probes awaiting an answer, per tunnel.
const MAX_PROBES: usize = 4;

/// Most control datagrams queued for sending; beyond, the oldest are dropped.
const MAX_QUEUED_TRANSMITS: usize = 1024;

/// Bytes [`Node::send`] needs in front of the packet's encryption: the relay header and the
/// wrapped-initiation prefix, written in place when needed.
pub const SEND_HEADROOM: usize = RELAY_HEADER_LEN + INIT_PREFIX_LEN;

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
    /// A relayed datagram from an address that is not an end of its session.
    RelaySource,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 9] = [
        DropReason::Malformed,
        DropReason::UnknownNamespace,
        DropReason::BadMac,
        DropReason::BadIdentity,
        DropReason::UnknownPeer,
        DropReason::UnknownSession,
        DropReason::Handshake,
        DropReason::PeerLimit,
        DropReason::RelaySource,
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
            DropReason::RelaySource => "relay_source",
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
    /// The member relaying this tunnel's traffic, when the direct path does not work.
    pub relayed_via: Option<PeerId>,
    /// Round trip of the current path, from the last answered probe.
    pub rtt: Option<Duration>,
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
    /// False once left: its datagrams are strangers' again.
    active: bool,
}

/// Where a datagram goes, or came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// The member's own endpoint.
    Direct(SocketAddr),
    /// Through a relay at `via`, in `session`.
    Relay { via: SocketAddr, session: u32 },
}

impl Route {
    /// The underlay address the datagram came from or goes to.
    fn addr(self) -> SocketAddr {
        match self {
            Route::Direct(a) | Route::Relay { via: a, .. } => a,
        }
    }

    fn source_ip(self) -> std::net::IpAddr {
        self.addr().ip()
    }
}

/// A relay session carrying one member's traffic.
#[derive(Debug, Clone, Copy)]
struct Relay {
    via: PeerHandle,
    session: u32,
    /// The member's endpoint as the relay sees it: behind a NAT, its public mapping, which
    /// the direct probes try too (UDP hole punching: both ends probe at once).
    observed: SocketAddr,
}

/// A session this node relays between two of its members.
#[derive(Debug)]
struct RelaySession {
    a: PeerHandle,
    b: PeerHandle,
    last_used: Instant,
}

/// Traffic this node relayed for other members.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Sessions carried now.
    pub sessions: usize,
    /// Datagrams forwarded.
    pub packets: u64,
    /// Bytes forwarded.
    pub bytes: u64,
    /// Relay requests refused (session limits).
    pub refused: u64,
}

struct Peer {
    ns: NamespaceId,
    id: PeerId,
    tunn: Tunn,
    /// The direct path (WireGuard roaming: the last address an authenticated packet came
    /// from directly).
    endpoint: SocketAddr,
    /// The relay session for this member, once one was offered.
    relay: Option<Relay>,
    /// Sending through `relay`: the direct path did not answer.
    relayed: bool,
    /// When we first sent this member something it has not answered yet.
    unanswered_since: Option<Instant>,
    next_relay_request: Instant,
    relay_requests: u32,
    /// Next direct-path probe (while relayed) or round-trip probe.
    next_probe: Instant,
    next_rtt_probe: Instant,
    probes: VecDeque<(u32, Instant)>,
    rtt: Option<Duration>,
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
    /// Doubles while the endpoint does not answer, up to [`MAX_HELLO_INTERVAL`].
    interval: Duration,
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
    /// Sessions we relay for others, by session id.
    relays: HashMap<u32, RelaySession>,
    /// Sessions others relay for us, by session id: the member at the other end.
    relayed: HashMap<u32, PeerHandle>,
    relay_stats: RelayStats,
    next_nonce: u32,
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
            relays: HashMap::new(),
            relayed: HashMap::new(),
            relay_stats: RelayStats::default(),
            next_nonce: 0,
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
        self.namespaces.push(Namespace {
            keys,
            addresses,
            active: true,
        });
        NamespaceId(self.namespaces.len() - 1)
    }

    /// Leaves a namespace: its tunnels and configured endpoints are dropped, and its
    /// datagrams are refused from now on (its id is not reused).
    pub fn remove_namespace(&mut self, now: Instant, ns: NamespaceId) {
        let Some(namespace) = self.namespaces.get_mut(ns.0) else {
            return;
        };
        namespace.addresses.clear();
        let handles: Vec<PeerHandle> = self
            .by_id
            .iter()
            .filter(|((n, _), _)| *n == ns)
            .map(|(_, h)| *h)
            .collect();
        for handle in handles {
            // Members with a session hear that we own nothing any more: their routes to
            // us go at once, not when we stop answering.
            if self
                .peers
                .get(handle.0 as usize)
                .and_then(Option::as_ref)
                .is_some_and(|p| p.tunn.stats().0.is_some())
            {
                self.announce(now, handle);
            }
            self.remove_peer(handle);
        }
        if let Some(namespace) = self.namespaces.get_mut(ns.0) {
            namespace.active = false;
        }
        self.static_peers.retain(|sp| sp.ns != ns);
    }

    /// Adds a member endpoint to contact in `ns`; it is hello'd from the next timeout on.
    pub fn add_static_peer(&mut self, ns: NamespaceId, endpoint: SocketAddr, now: Instant) {
        self.static_peers.push(StaticPeer {
            ns,
            endpoint,
            next_hello: now,
            interval: HELLO_INTERVAL,
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
        // We want this member: if nothing answers on the direct path, a relay is asked.
        if let Some(p) = self.peer_mut(handle) {
            p.unanswered_since = Some(now);
        }
        // The member has no tunnel with us yet and accepts handshakes only on one: the
        // hello makes it open one (and, if it is the initiator, start the handshake).
        let hello = Hello::emit(&self.namespaces[ns.0].keys, &self.peer_id(), false);
        self.queue_transmit(endpoint, hello.to_vec());
        if self.peer_mut(handle).is_some_and(|p| p.initiator) {
            self.announce(now, handle);
        }
        Ok(handle)
    }

    /// The tunnel with member `id` in `ns`, if one is open (or opening).
    pub fn member_handle(&self, ns: NamespaceId, id: PeerId) -> Option<PeerHandle> {
        self.by_id.get(&(ns, id)).copied()
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

    /// Queues a [`Event::PeerAddresses`] again for every member of `ns` that announced
    /// addresses (or only for `peer`): for a driver whose view of the namespace changed
    /// (it learned the subnet, or looked up an address a member already announced).
    pub fn repeat_addresses(&mut self, ns: NamespaceId, peer: Option<PeerHandle>) {
        for (i, p) in self.peers.iter().enumerate() {
            let Some(p) = p else {
                continue;
            };
            let handle = PeerHandle(i as u32);
            if p.ns == ns && !p.addresses.is_empty() && peer.is_none_or(|h| h == handle) {
                self.events.push_back(Event::PeerAddresses {
                    ns,
                    peer: handle,
                    addresses: p.addresses.clone(),
                });
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
            let relayed_via = p
                .relay
                .filter(|_| p.relayed)
                .and_then(|r| Some(self.peers.get(r.via.0 as usize)?.as_ref()?.id));
            Some(PeerInfo {
                relayed_via,
                rtt: p.rtt,
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

    /// Traffic relayed for other members.
    pub fn relay_stats(&self) -> RelayStats {
        RelayStats {
            sessions: self.relays.len(),
            ..self.relay_stats.clone()
        }
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
                self.handle_wireguard(now, Route::Direct(from), datagram, out)
            }
            Some(&KIND_INIT) => self.handle_init(now, Route::Direct(from), datagram),
            Some(&KIND_HELLO) => self.handle_hello(now, from, datagram),
            Some(&KIND_RELAY) => self.handle_relayed(now, from, datagram, out),
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

    /// A datagram that came through a relay: forwarded, if this node relays its session;
    /// handled like a direct one, if it belongs to a tunnel relayed for us.
    fn handle_relayed(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
        out: &mut [u8],
    ) -> Received {
        let Some((session, inner)) = wire::parse_relay(datagram) else {
            return Received::Dropped(DropReason::Malformed);
        };
        if let Some(s) = self.relays.get(&session) {
            let (a, b) = (s.a, s.b);
            let (Some(ea), Some(eb)) = (
                self.peers
                    .get(a.0 as usize)
                    .and_then(Option::as_ref)
                    .map(|p| p.endpoint),
                self.peers
                    .get(b.0 as usize)
                    .and_then(Option::as_ref)
                    .map(|p| p.endpoint),
            ) else {
                return Received::Dropped(DropReason::UnknownSession);
            };
            // Forward only between the two members' authenticated endpoints: a stranger can
            // neither use the relay nor redirect a session.
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
            self.relay_stats.bytes += inner.len() as u64;
            self.queue_transmit(to, datagram.to_vec());
            return Received::Consumed;
        }
        let Some(&handle) = self.relayed.get(&session) else {
            return Received::Dropped(DropReason::UnknownSession);
        };
        let via = self
            .peers
            .get(handle.0 as usize)
            .and_then(Option::as_ref)
            .and_then(|p| p.relay)
            .and_then(|r| Some(self.peers.get(r.via.0 as usize)?.as_ref()?.endpoint));
        if via != Some(from) {
            return Received::Dropped(DropReason::RelaySource);
        }
        let route = Route::Relay { via: from, session };
        match inner.first() {
            Some(&KIND_WG_DATA) | Some(&KIND_WG_RESPONSE) | Some(&KIND_WG_COOKIE) => {
                self.handle_wireguard(now, route, inner, out)
            }
            Some(&KIND_INIT) => self.handle_init(now, route, inner),
            _ => Received::Dropped(DropReason::Malformed),
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
        datagram: &[u8],
        out: &mut [u8],
    ) -> Received {
        let Some(index) = wire::receiver_index(datagram) else {
            return Received::Dropped(DropReason::Malformed);
        };
        let handle = PeerHandle(index >> 8);
        if !self.route_matches(route, handle) {
            return Received::Dropped(DropReason::UnknownSession);
        }
        let Some(peer) = self.peer_mut(handle) else {
            return Received::Dropped(DropReason::UnknownSession);
        };
        if out.len() < datagram.len() {
            return Received::PeerDropped(handle, PeerDropReason::TooLarge);
        }
        let kind = datagram[0];
        let result = peer
            .tunn
            .decapsulate(Some(route.source_ip()), datagram, out);
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
        if authenticated {
            self.heard(now, handle, route);
        }
        self.flush_tunnel(handle);
        received
    }

    /// Something the member's keys produced arrived by `route`: it is alive, and a direct
    /// packet moves its endpoint (WireGuard roaming).
    fn heard(&mut self, now: Instant, handle: PeerHandle, route: Route) {
        if let Some(peer) = self.peer_mut(handle) {
            if let Route::Direct(from) = route {
                peer.endpoint = from;
            }
            peer.last_heard = now;
            peer.unanswered_since = None;
        }
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

    fn handle_init(&mut self, now: Instant, route: Route, datagram: &[u8]) -> Received {
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
        if !self.route_matches(route, handle) {
            return Received::Dropped(DropReason::UnknownSession);
        }
        let Some(peer) = self.peer_mut(handle) else {
            return Received::Dropped(DropReason::UnknownPeer);
        };
        let mut buf = [0u8; 256];
        match peer
            .tunn
            .decapsulate(Some(route.source_ip()), inner, &mut buf)
        {
            TunnResult::WriteToNetwork(reply) => {
                // A response means the initiation verified: it was made with the member's
                // static key and a fresh timestamp. A cookie (under load) proves nothing.
                let verified = reply.first() == Some(&KIND_WG_RESPONSE);
                let reply = reply.to_vec();
                if verified {
                    self.heard(now, handle, route);
                }
                self.queue_routed(route, &reply);
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

    /// Starts a fresh handshake with a member that lost its tunnel, if we are the initiator
    /// (at most once per [`HELLO_INTERVAL`]); our announcement follows once it completes.
    ///
    /// Only one side ever initiates a fresh tunnel: boringtun forgets its own initiation
    /// when it answers a crossing one, so two members initiating at once can leave both
    /// waiting as responders.
    fn restart_handshake(&mut self, now: Instant, handle: PeerHandle, route: Route) {
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
                    let t = self.frame_outgoing(ns, route, &mut buf, len);
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
            relay: None,
            relayed: false,
            unanswered_since: None,
            next_relay_request: now,
            relay_requests: 0,
            next_probe: now,
            next_rtt_probe: now + RTT_INTERVAL,
            probes: VecDeque::new(),
            rtt: None,
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
                self.handle_probe_ack(now, handle, route, nonce);
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

    fn handle_probe_ack(&mut self, now: Instant, handle: PeerHandle, route: Route, nonce: u32) {
        let Some(peer) = self.peer_mut(handle) else {
            return;
        };
        let Some(i) = peer.probes.iter().position(|(n, _)| *n == nonce) else {
            return;
        };
        let Some((_, sent)) = peer.probes.remove(i) else {
            return;
        };
        let direct = matches!(route, Route::Direct(_));
        // The round trip shown is the current path's (a late relayed answer is not it).
        if direct || peer.relayed {
            peer.rtt = Some(now.saturating_duration_since(sent));
        }
        if direct && peer.relayed {
            tracing::info!(peer = ?peer.id, "direct path answers: leaving the relay");
            peer.relayed = false;
        }
    }

    /// A member asks us to relay its traffic to `target`.
    fn handle_relay_request(
        &mut self,
        now: Instant,
        from: PeerHandle,
        target: [u8; 32],
        endpoint: SocketAddr,
    ) -> Received {
        let Ok(target) = PeerId::from_bytes(target) else {
            return Received::PeerDropped(from, PeerDropReason::BadPayload);
        };
        let Some(requester) = self.peers.get(from.0 as usize).and_then(Option::as_ref) else {
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
            .peers
            .get(to.0 as usize)
            .and_then(Option::as_ref)
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
                let per_member = self
                    .relays
                    .values()
                    .filter(|s| s.a == from || s.b == from)
                    .count();
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

    /// A random session id no session of ours uses.
    fn new_session_id(&mut self) -> u32 {
        loop {
            let mut b = [0u8; 4];
            let id = match getrandom::getrandom(&mut b) {
                Ok(()) => u32::from_be_bytes(b),
                Err(_) => {
                    self.next_nonce = self.next_nonce.wrapping_add(0x9e37_79b9);
                    self.next_nonce
                }
            };
            if !self.relays.contains_key(&id) && !self.relayed.contains_key(&id) {
                return id;
            }
        }
    }

    /// Member `from` relays session `session` between us and `peer`.
    fn handle_relay_offer(
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
        let Some(relay) = self.peers.get(from.0 as usize).and_then(Option::as_ref) else {
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
        let old = p.relay.replace(Relay {
            via: from,
            session,
            observed: endpoint,
        });
        let changed = old.map(|r| r.session) != Some(session);
        if !p.relayed {
            tracing::info!(peer = ?id, via = ?relay_id, "direct path silent: relaying");
        }
        p.relayed = true;
        p.next_probe = now;
        let (initiator, has_session) = (p.initiator, p.tunn.stats().0.is_some());
        if let Some(old) = old.filter(|_| changed) {
            self.relayed.remove(&old.session);
        }
        self.relayed.insert(session, handle);
        if let Some(route) = self.route(handle) {
            if initiator && !has_session {
                self.restart_handshake(now, handle, route);
            }
        }
        Received::Consumed
    }

    fn handle_announce(
        &mut self,
        now: Instant,
        handle: PeerHandle,
        announce: Announce,
    ) -> Received {
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
        self.send_control(handle, &packet, None);
        if let Some(peer) = self.peer_mut(handle) {
            peer.next_announce = now + ANNOUNCE_INTERVAL;
        }
    }

    /// Encrypts a control packet for `handle` and queues it, by `route` or the current one.
    fn send_control(&mut self, handle: PeerHandle, packet: &[u8], route: Option<Route>) {
        let mut buf = std::mem::take(&mut self.scratch);
        if let Some(t) = self.send_via(handle, packet, &mut buf, route) {
            self.queue_transmit(t.to, buf[t.range].to_vec());
        }
        self.scratch = buf;
    }

    /// Where datagrams for `handle` go now: through its relay while relayed, else direct.
    fn route(&self, handle: PeerHandle) -> Option<Route> {
        let peer = self.peers.get(handle.0 as usize)?.as_ref()?;
        if peer.relayed {
            if let Some(r) = peer.relay {
                if let Some(via) = self.peers.get(r.via.0 as usize).and_then(Option::as_ref) {
                    return Some(Route::Relay {
                        via: via.endpoint,
                        session: r.session,
                    });
                }
            }
        }
        Some(Route::Direct(peer.endpoint))
    }

    /// Encrypts an IPv4 packet for `peer` into `out`, leaving the first [`SEND_HEADROOM`]
    /// bytes for a prefix. `out` must be at least `SEND_HEADROOM + packet.len() + 32` and
    /// 160 bytes long. Without a session the packet is queued in the tunnel and a handshake
    /// initiation is returned instead.
    pub fn send(&mut self, handle: PeerHandle, packet: &[u8], out: &mut [u8]) -> Option<Transmit> {
        self.send_via(handle, packet, out, None)
    }

    fn send_via(
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
        let peer = self.peers.get_mut(handle.0 as usize)?.as_mut()?;
        let needed = SEND_HEADROOM + (packet.len() + WG_DATA_OVERHEAD).max(wire::WG_INIT_LEN);
        if out.len() < needed {
            peer.stats.drops[PeerDropReason::TooLarge as usize] += 1;
            return None;
        }
        let ns = peer.ns;
        let len = match peer.tunn.encapsulate(packet, &mut out[SEND_HEADROOM..]) {
            TunnResult::WriteToNetwork(d) => d.len(),
            _ => return None,
        };
        if !is_control(packet) {
            peer.stats.tx_packets += 1;
            peer.stats.tx_bytes += packet.len() as u64;
        }
        Some(self.frame_outgoing(ns, route, out, len))
    }

    /// Wraps a WireGuard message lying at `out[SEND_HEADROOM..][..len]` for the wire: the
    /// namespace prefix of an initiation, the relay header of a relayed route.
    fn frame_outgoing(
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

    /// Runs timers: WireGuard's (handshake retries, rekeying, keepalives), hellos to
    /// configured endpoints, periodic announcements, relays and path probes.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.expire_silent(now);
        self.run_relays(now);
        let mut buf = std::mem::take(&mut self.scratch);
        for slot in 0..self.peers.len() {
            let handle = PeerHandle(slot as u32);
            let Some(route) = self.route(handle) else {
                continue;
            };
            let Some(peer) = self.peers[slot].as_mut() else {
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
            let sp = &mut self.static_peers[i];
            sp.next_hello = now + sp.interval;
            // An endpoint that never answers (down, or not a member) is asked less often.
            if sp.peer.is_none() {
                sp.interval = (sp.interval * 2).min(MAX_HELLO_INTERVAL);
            }
        }
    }

    /// Removes the tunnels of members that have not answered for [`UNREACHABLE_AFTER`].
    fn expire_silent(&mut self, now: Instant) {
        let gone: Vec<PeerHandle> = self
            .peers
            .iter_mut()
            .enumerate()
            .filter_map(|(i, p)| {
                let p = p.as_mut()?;
                if p.stats.tx_packets > p.tx_seen && p.unanswered_since.is_none() {
                    p.unanswered_since = Some(now);
                }
                p.tx_seen = p.stats.tx_packets;
                p.unanswered_since
                    .is_some_and(|t| now.saturating_duration_since(t) >= UNREACHABLE_AFTER)
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
    }

    /// Relays: members silent on their path get one; relayed members get direct-path
    /// probes; live tunnels get round-trip probes; idle relay sessions are forgotten.
    fn run_relays(&mut self, now: Instant) {
        self.relays
            .retain(|_, s| now.saturating_duration_since(s.last_used) < RELAY_IDLE);
        for slot in 0..self.peers.len() {
            let handle = PeerHandle(slot as u32);
            let Some(peer) = self.peers[slot].as_mut() else {
                continue;
            };
            let silent = peer
                .unanswered_since
                .is_some_and(|t| now.saturating_duration_since(t) >= RELAY_AFTER);
            if silent {
                if peer.relay.is_some() && !peer.relayed {
                    // The direct path stopped answering: back to the relay we had.
                    tracing::info!(peer = ?peer.id, "direct path silent: relaying");
                    peer.relayed = true;
                    peer.unanswered_since = Some(now);
                    peer.next_probe = now + PROBE_INTERVAL;
                } else if now >= peer.next_relay_request {
                    peer.next_relay_request = now + RELAY_RETRY;
                    peer.relay_requests = peer.relay_requests.wrapping_add(1);
                    self.request_relay(now, handle);
                }
                continue;
            }
            let Some(peer) = self.peers[slot].as_mut() else {
                continue;
            };
            if peer.tunn.stats().0.is_none() {
                continue;
            }
            if peer.relayed && now >= peer.next_probe {
                peer.next_probe = now + PROBE_INTERVAL;
                let (known, observed) = (peer.endpoint, peer.relay.as_ref().map(|r| r.observed));
                self.probe(now, handle, Route::Direct(known));
                if let Some(observed) = observed.filter(|o| *o != known) {
                    self.probe(now, handle, Route::Direct(observed));
                }
            } else if now >= peer.next_rtt_probe
                && now.saturating_duration_since(peer.last_heard) < PEER_SILENT_AFTER
            {
                peer.next_rtt_probe = now + RTT_INTERVAL;
                if let Some(route) = self.route(handle) {
                    self.probe(now, handle, route);
                }
            }
        }
    }

    /// Asks a member we reach directly to relay our traffic to `handle`; each attempt asks
    /// the next candidate.
    fn request_relay(&mut self, now: Instant, handle: PeerHandle) {
        let Some(peer) = self.peers.get(handle.0 as usize).and_then(Option::as_ref) else {
            return;
        };
        let (ns, attempt) = (peer.ns, peer.relay_requests);
        let request = Control::RelayRequest {
            target: *peer.id.as_bytes(),
            endpoint: peer.endpoint,
        }
        .emit();
        let candidates: Vec<PeerHandle> = self
            .peers
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let p = p.as_ref()?;
                (i != handle.0 as usize && p.ns == ns && p.is_direct_and_live(now))
                    .then_some(PeerHandle(i as u32))
            })
            .collect();
        let Some(&via) = candidates.get(attempt as usize % candidates.len().max(1)) else {
            tracing::debug!(?handle, "member silent and no member to relay through");
            return;
        };
        self.send_control(via, &request, None);
    }

    fn probe(&mut self, now: Instant, handle: PeerHandle, route: Route) {
        self.next_nonce = self.next_nonce.wrapping_add(1);
        let nonce = self.next_nonce;
        if let Some(peer) = self.peer_mut(handle) {
            if peer.probes.len() >= MAX_PROBES {
                peer.probes.pop_front();
            }
            peer.probes.push_back((nonce, now));
        }
        let packet = Control::Probe { nonce, ack: false }.emit();
        self.send_control(handle, &packet, Some(route));
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
        self.relays.retain(|_, s| s.a != handle && s.b != handle);
        self.relayed.retain(|_, h| *h != handle);
        // Members it relayed for us fall back to the direct path (and ask again if it
        // stays silent).
        for p in self.peers.iter_mut().flatten() {
            if p.relay.is_some_and(|r| r.via == handle) {
                if let Some(r) = p.relay.take() {
                    self.relayed.remove(&r.session);
                }
                p.relayed = false;
            }
        }
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
            .position(|n| n.active && &n.keys.tag == tag)
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

impl Peer {
    /// Reached directly, with a session, and heard recently: fit to relay through.
    fn is_direct_and_live(&self, now: Instant) -> bool {
        !self.relayed
            && self.tunn.stats().0.is_some()
            && now.saturating_duration_since(self.last_heard) < PEER_SILENT_AFTER
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
