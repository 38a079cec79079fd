//! The tunnel endpoint of one agent: every member it talks to, in every namespace.
//!
//! A [`Node`] owns no socket. Its own logic reads no clock (every input carries `now`) and
//! draws randomness only from the generator seeded in [`Node::new`]. boringtun's `Tunn`
//! inside each tunnel is the exception: it reads the system clock for its timers and
//! handshake timestamps and the OS generator for ephemeral keys, which is why
//! [`Node::handle_timeout`] must run every [`TICK`] while a tunnel exists.
//!
//! # Call order
//!
//! The driver owns the socket and the clock, and repeats:
//!
//! 1. Feed inputs, each with the current time:
//!    - [`Node::handle_datagram`] for every datagram from the underlay;
//!    - [`Node::send`] for every packet to a member (its [`Transmit`] is ready at once);
//!    - the registry calls ([`Node::add_namespace`], [`Node::add_member`],
//!      [`Node::add_static_peer`], [`Node::set_addresses`], ...) as the configuration and
//!      the DHT change;
//!    - [`Node::handle_underlay_change`] when our own source address toward members changed;
//!    - [`Node::handle_timeout`] once the instant [`Node::poll_timeout`] returned is reached.
//! 2. After each input, drain the outputs: [`Node::poll_transmit`] until `None` (datagrams
//!    to send), and [`Node::poll_event`] until `None` (address changes, lost members).
//! 3. Ask [`Node::poll_timeout`] for the next deadline and sleep until it, or until the next
//!    input. `None` means no timer is armed: only an input can give the node work.
//!
//! Calling [`Node::handle_timeout`] early, or more often, is harmless.
//!
//! # Tunnels
//!
//! One WireGuard tunnel (boringtun's `Tunn`: Noise_IKpsk2, replay window, rekeying, cookies)
//! exists per (namespace, member) pair, with the namespace's pre-shared key, so a packet can
//! only ever be delivered into the namespace whose key decrypted it. Tunnels are opened only
//! after a hello authenticated with the namespace key (`hello.rs`); the member's source
//! addresses are checked against the addresses it announced over that tunnel. Each tunnel's
//! state and path decisions live in its `Peer` (`peer.rs`).
//!
//! When a member does not answer on its direct path (a NAT, a firewall), the node asks
//! another member that both can reach to relay (`relay.rs`): the relay forwards the two
//! members' end-to-end encrypted datagrams verbatim for one session, and both ends keep
//! probing the direct path (once a second) and return to it as soon as a probe is answered
//! on it.
//!
//! When our own underlay address changes, members are told at once with authenticated
//! probes from the new address (`roam.rs`); a member's endpoint follows the last address an
//! authenticated packet came from directly, as in WireGuard.

mod address_parts;
mod bond;
mod certified;
mod dual_stack;
mod hello;
mod layer2;
mod outputs;
mod peer;
mod relay;
mod roam;
mod shared;
mod stats;
#[cfg(test)]
mod testing;
mod tunnel;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use boringtun::noise::Tunn;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::keys::{NamespaceKeys, TAG_LEN};
use crate::wire::{Datagram, INIT_PREFIX_LEN, RELAY_HEADER_LEN, WG_DATA_OVERHEAD};
use crate::{Identity, PeerId};

pub use bond::{check_uplinks, BondLink, UplinksError};
pub use certified::CertificateStats;
pub use hello::{ANNOUNCE_INTERVAL, HELLO_INTERVAL};
pub use outputs::{Event, PeerInfo, Received, Transmit};
pub use peer::{
    KEEPALIVE_SECS, PEER_SILENT_AFTER, PROBE_INTERVAL, ROAM_PROBES, ROAM_PROBE_INTERVAL,
    RTT_INTERVAL, UNREACHABLE_AFTER,
};
pub use relay::{MAX_RELAY_SESSIONS, RELAY_AFTER, RELAY_IDLE, RELAY_RETRY};
pub use shared::{flow_shard, Opened, Sealer, Tunnel, Tunnels, SHARD_BYTE, SHARD_SHIFT};
pub use stats::{DropReason, PeerDropReason, PeerStats, RelayStats};

use hello::StaticPeer;
use peer::{Peer, Route};
use relay::RelaySession;
use stats::DropCounters;

/// boringtun's timer period: its `Tunn::update_timers` reads its own clock and counts
/// WireGuard's timers (the shortest, rekey timeout, is 5 s) in calls to it, so while a
/// tunnel exists [`Node::handle_timeout`] must run at least this often. Every per-tunnel
/// timer of the node (relay, probes, liveness) runs on the same tick.
pub const TICK: Duration = Duration::from_millis(250);

/// Most tunnels one node holds (receiver indices carry 12 bits of tunnel slot, then 3 of
/// shard: see `shared.rs`).
pub const MAX_PEERS: usize = 4096;

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

struct Namespace {
    keys: NamespaceKeys,
    addresses: Vec<Ipv4Addr>,
    /// A dual-stack namespace: the IPv6 addresses this node holds ([`Node::set_addresses6`]).
    addresses6: Vec<Ipv6Addr>,
    /// False once left: its datagrams are strangers' again.
    active: bool,
    /// With an authority: what it trusts and the certificate this member shows
    /// (`certified.rs`).
    credential: Option<crate::proof::Credential>,
    /// Other namespaces' addresses whose packets a member may send as the gateway of a
    /// link, with the gateway's address here ([`Node::set_links`]).
    links: Vec<(ipnet::Ipv4Net, Ipv4Addr)>,
    /// A layer-2 namespace: the MACs this member holds there ([`Node::set_macs`]); its
    /// members send frames in envelopes, each from a MAC the sender announced.
    macs: Option<Vec<[u8; 6]>>,
    /// Changes with `macs`: the parts of one announcement are told apart from the next's.
    mac_generation: u16,
    /// Changes with `addresses` and `addresses6` (`address_parts.rs`).
    address_generation: u16,
    /// The generation whose lists were too long for their parts, once said.
    parts_cut: Option<u16>,
}

/// The tunnel endpoint of one agent.
pub struct Node {
    identity: Identity,
    x25519_secret: x25519_dalek::StaticSecret,
    x25519_public: x25519_dalek::PublicKey,
    /// Draws relay session ids, which must not be guessable: a cryptographic generator.
    rng: StdRng,
    namespaces: Vec<Namespace>,
    /// Tunnels by slot; a handle is its slot.
    peers: Vec<Option<Peer>>,
    by_id: HashMap<(NamespaceId, PeerId), PeerHandle>,
    by_x25519: HashMap<(NamespaceId, [u8; 32]), PeerHandle>,
    static_peers: Vec<StaticPeer>,
    /// Sessions we relay for others, by session id.
    relays: HashMap<u32, RelaySession>,
    /// Sessions others relay for us, by session id: the member at the other end.
    relayed: HashMap<u32, PeerHandle>,
    relay_stats: RelayStats,
    /// Times our underlay address changed under open tunnels (see `roam.rs`).
    underlay_changes: u64,
    next_nonce: u32,
    /// When the tunnels' timers are due next ([`TICK`] after the last run); `None` while
    /// there is no tunnel.
    next_tick: Option<Instant>,
    /// Every tunnel's WireGuard state, shared with the workers.
    tunnels: Arc<Tunnels>,
    /// Shards this node's tunnels may have (see `shared.rs`).
    shards: u8,
    /// The time of day certificates are checked against, Unix seconds
    /// ([`Node::set_wall`]).
    wall: u64,
    certificate_stats: CertificateStats,
    /// Our underlay links, told to members that read them (`bond.rs`).
    uplinks: Vec<(SocketAddr, u64)>,
    /// The time of the latest input: the bonds place flows by it when a packet is sealed
    /// (sealing carries no time of its own).
    last_input: Option<Instant>,
    transmits: VecDeque<(SocketAddr, Vec<u8>)>,
    events: VecDeque<Event>,
    drops: DropCounters,
    scratch: Vec<u8>,
}

impl Node {
    /// A node with no namespaces. `seed` seeds its random number generator (relay session
    /// ids): from the operating system in production, fixed in tests.
    pub fn new(identity: Identity, seed: [u8; 32]) -> Self {
        let x25519_secret = identity.x25519();
        let x25519_public = x25519_dalek::PublicKey::from(&x25519_secret);
        Self {
            identity,
            x25519_secret,
            x25519_public,
            rng: StdRng::from_seed(seed),
            namespaces: Vec::new(),
            peers: Vec::new(),
            by_id: HashMap::new(),
            by_x25519: HashMap::new(),
            static_peers: Vec::new(),
            relays: HashMap::new(),
            relayed: HashMap::new(),
            relay_stats: RelayStats::default(),
            underlay_changes: 0,
            next_nonce: 0,
            next_tick: None,
            tunnels: Arc::default(),
            shards: 1,
            wall: 0,
            certificate_stats: CertificateStats::default(),
            uplinks: Vec::new(),
            last_input: None,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            drops: DropCounters::default(),
            scratch: vec![0; SCRATCH_LEN],
        }
    }

    /// The tunnels, for workers that seal and open outside the node (see `shared.rs`).
    pub fn tunnels(&self) -> Arc<Tunnels> {
        Arc::clone(&self.tunnels)
    }

    /// How many shards this node's tunnels may have (its workers; 1 to
    /// [`MAX_SHARDS`](crate::wire::MAX_SHARDS)), announced to members from now on.
    pub fn set_shards(&mut self, shards: u8) {
        self.shards = shards.clamp(1, crate::wire::MAX_SHARDS);
    }

    /// Gives the tunnel at `handle` `n` shards (at most what both ends accept), or takes
    /// those beyond `n` away.
    pub(super) fn set_tunnel_shards(&mut self, handle: PeerHandle, n: u8) {
        let n = n.clamp(1, self.shards);
        let secret = self.x25519_secret.clone();
        let Some(psk) = self
            .peer(handle)
            .and_then(|p| self.namespaces.get(p.ns.0))
            .map(|ns| ns.keys.psk)
        else {
            return;
        };
        let tunnels = &self.tunnels;
        let Some(peer) = self
            .peers
            .get_mut(handle.0 as usize)
            .and_then(Option::as_mut)
        else {
            return;
        };
        let Ok(theirs) = peer.id.x25519() else {
            return;
        };
        if peer.shards.len() > usize::from(n) {
            peer.shards.truncate(usize::from(n));
            tunnels.remove(handle, n);
            return;
        }
        while peer.shards.len() < usize::from(n) {
            let shard = peer.shards.len() as u8;
            // No keepalive of its own: shard 0 keeps the path and the member's liveness.
            let tunn = Tunn::new(
                secret.clone(),
                theirs,
                Some(psk),
                None,
                shared::session_index(handle, shard),
                None,
            );
            let tunnel = Arc::new(Tunnel::new(handle, shard, tunn));
            tunnels.insert(Arc::clone(&tunnel));
            peer.shards.push(tunnel);
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
            addresses6: Vec::new(),
            active: true,
            credential: None,
            links: Vec::new(),
            macs: None,
            // Random: parts left over from before a restart never join the next set.
            mac_generation: rand::random(),
            address_generation: rand::random(),
            parts_cut: None,
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
        namespace.addresses6.clear();
        // A layer-2 member holds no MAC any more either (a new generation: its members
        // take the empty set at once).
        if let Some(macs) = namespace.macs.as_mut() {
            macs.clear();
            namespace.mac_generation = namespace.mac_generation.wrapping_add(1);
        }
        for handle in self.handles_in(ns) {
            // Members with a session hear that we own nothing any more: their routes to
            // us go at once, not when we stop answering.
            if self.peer(handle).is_some_and(Peer::has_session) {
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
        self.static_peers.push(StaticPeer::new(now, ns, endpoint));
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
        self.send_hello(ns, endpoint);
        if self.peer(handle).is_some_and(|p| p.initiator) {
            self.announce(now, handle);
        }
        Ok(handle)
    }

    /// The tunnel with member `id` in `ns`, if one is open (or opening).
    /// The LAN host at `address` moved here from member `id`'s LAN: packets `id` forwards
    /// to it (from any source, what still reached it) are taken until `until`.
    pub fn accept_forwarded(
        &mut self,
        ns: NamespaceId,
        id: PeerId,
        address: IpAddr,
        until: Instant,
    ) {
        let Some(handle) = self.member_handle(ns, id) else {
            return;
        };
        if let Some(peer) = self.peer_mut(handle) {
            peer.forwards.retain(|(a, _)| *a != address);
            // Bounded: a member hands over few hosts within one grace period.
            if peer.forwards.len() >= 256 {
                peer.forwards.remove(0);
            }
            peer.forwards.push((address, until));
        }
    }

    /// Member `id` of `ns` is out of the group (it stopped announcing itself): its tunnel
    /// goes, with [`Event::PeerUnreachable`], unless the member still answers on it (a
    /// session, heard from within [`UNREACHABLE_AFTER`]). Whether it went.
    pub fn forget_member(&mut self, now: Instant, ns: NamespaceId, id: PeerId) -> bool {
        let Some(&handle) = self.by_id.get(&(ns, id)) else {
            return false;
        };
        let answering = self.peer(handle).is_some_and(|p| {
            p.has_session() && now.saturating_duration_since(p.last_heard) < UNREACHABLE_AFTER
        });
        if answering {
            return false;
        }
        let Some(peer) = self.remove_peer(handle) else {
            return false;
        };
        tracing::info!(peer = ?peer.id, "member out of the group and silent: tunnel removed");
        self.events.push_back(Event::PeerUnreachable {
            ns: peer.ns,
            peer: handle,
            id: peer.id,
            addresses: peer.addresses,
            addresses6: peer.addresses6,
        });
        true
    }

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
        namespace.address_generation = namespace.address_generation.wrapping_add(1);
        for handle in self.handles_in(ns) {
            if self
                .peer(handle)
                .is_some_and(|p| p.initiator || p.has_session())
            {
                self.announce(now, handle);
            }
        }
    }

    /// Queues a [`Event::PeerAddresses`] (and [`Event::PeerAddresses6`]) again for every
    /// member of `ns` that announced addresses (or only for `peer`): for a driver whose view of the namespace changed
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
            if p.ns == ns && !p.addresses6.is_empty() && peer.is_none_or(|h| h == handle) {
                self.events.push_back(Event::PeerAddresses6 {
                    ns,
                    peer: handle,
                    addresses: p.addresses6.clone(),
                });
            }
        }
    }

    /// Datagrams dropped before reaching a tunnel, by reason.
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops.get(reason)
    }

    /// Every tunnel, for status.
    pub fn peers(&self) -> impl Iterator<Item = PeerInfo<'_>> {
        self.peers.iter().enumerate().filter_map(|(i, p)| {
            let p = p.as_ref()?;
            let relayed_via = p.relayed_via().and_then(|r| Some(self.peer(r.via)?.id));
            Some(PeerInfo {
                relayed_via,
                rtt: p.rtt,
                handle: PeerHandle(i as u32),
                ns: p.ns,
                id: p.id,
                endpoint: p.endpoint,
                addresses: &p.addresses,
                addresses6: &p.addresses6,
                handshake_age: p.tunn().stats().0,
                shards: p.shards.len(),
                stats: &p.stats,
                links: p
                    .bond
                    .as_ref()
                    .map(bond::Bonded::status)
                    .unwrap_or_default(),
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

    /// The earliest instant at which [`Node::handle_timeout`] has work: the tunnels' tick
    /// while any tunnel exists, a hello due to a configured endpoint, a relay session going
    /// idle, a roaming probe due. `None` when nothing is armed. It may lie in the past: then the work is due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.next_tick,
            self.poll_hello_timeout(),
            self.poll_relay_timeout(),
            self.poll_roam_timeout(),
            self.poll_bond_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
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
        self.last_input = Some(now);
        let received = match Datagram::parse(datagram) {
            Err(e) => Received::Dropped(e.into()),
            Ok(Datagram::Hello { hello, bytes }) => self.handle_hello(now, from, hello, bytes),
            Ok(Datagram::Tunnel(message)) => {
                self.handle_tunnel(now, Route::Direct(from), message, out)
            }
            Ok(Datagram::Relayed {
                session,
                bytes,
                inner,
            }) => self.handle_relayed(now, from, session, bytes, inner, out),
        };
        self.count(&received);
        received
    }

    /// Counts a dropped datagram under its reason: the node's, or its tunnel's.
    fn count(&mut self, received: &Received) {
        match received {
            Received::Dropped(reason) => self.drops.count(*reason),
            Received::PeerDropped(peer, reason) => {
                if let Some(p) = self.peer_mut(*peer) {
                    p.stats.count_drop(*reason);
                }
            }
            Received::Deliver { .. } | Received::Consumed => {}
        }
    }

    /// Encrypts an IPv4 packet for `peer` into `out`, leaving the first [`SEND_HEADROOM`]
    /// bytes for a prefix. `out` must be at least `SEND_HEADROOM + packet.len() + 32` and
    /// 160 bytes long. Without a session the packet is queued in the tunnel and a handshake
    /// initiation is returned instead.
    pub fn send(&mut self, handle: PeerHandle, packet: &[u8], out: &mut [u8]) -> Option<Transmit> {
        self.send_via(handle, packet, out, None)
    }

    /// Runs timers: members gone silent are removed, paths choose relays and get probed,
    /// WireGuard's timers run (handshake retries, rekeying, keepalives), announcements are
    /// repeated and configured endpoints hello'd.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.last_input = Some(now);
        self.expire_silent(now);
        self.recheck_certificates(now);
        self.run_paths(now);
        self.run_roams(now);
        self.run_bonds(now);
        self.run_tunnel_timers();
        self.run_hellos(now);
        self.next_tick = self.peers.iter().any(Option::is_some).then_some(now + TICK);
    }

    /// Removes the tunnels of members that have not answered for [`UNREACHABLE_AFTER`].
    fn expire_silent(&mut self, now: Instant) {
        let gone: Vec<PeerHandle> = self
            .peers
            .iter_mut()
            .enumerate()
            .filter_map(|(i, p)| {
                p.as_mut()?
                    .is_unreachable(now)
                    .then_some(PeerHandle(i as u32))
            })
            .collect();
        for handle in gone {
            if let Some(peer) = self.remove_peer(handle) {
                tracing::info!(peer = ?peer.id, "member unreachable: tunnel removed");
                self.events.push_back(Event::PeerUnreachable {
                    ns: peer.ns,
                    peer: handle,
                    id: peer.id,
                    addresses: peer.addresses,
                    addresses6: peer.addresses6,
                });
            }
        }
    }

    /// Opens a tunnel with member `id` of `ns`, at `endpoint`.
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
        // One side initiates fresh tunnels (see `restart_handshake`): the lower key.
        let initiator = self.x25519_public.as_bytes() < x25519.as_bytes();
        let tunn = Tunn::new(
            self.x25519_secret.clone(),
            x25519,
            Some(self.namespaces[ns.0].keys.psk),
            Some(KEEPALIVE_SECS),
            shared::session_index(handle, 0),
            None,
        );
        tracing::debug!(peer = ?id, %endpoint, "tunnel opened");
        let tunnel = Arc::new(Tunnel::new(handle, 0, tunn));
        self.tunnels.insert(Arc::clone(&tunnel));
        self.peers[slot] = Some(Peer::new(now, ns, id, tunnel, endpoint, initiator));
        self.by_id.insert((ns, id), handle);
        self.by_x25519.insert((ns, x25519.to_bytes()), handle);
        // boringtun's timers start with the tunnel.
        self.next_tick.get_or_insert(now + TICK);
        Ok(handle)
    }

    fn remove_peer(&mut self, handle: PeerHandle) -> Option<Peer> {
        let peer = self.peers.get_mut(handle.0 as usize)?.take()?;
        self.tunnels.remove(handle, 0);
        self.by_id.remove(&(peer.ns, peer.id));
        self.by_x25519.retain(|_, h| *h != handle);
        self.relays.retain(|_, s| !s.involves(handle));
        self.relayed.retain(|_, h| *h != handle);
        // Members it relayed for us fall back to the direct path (and ask again if it
        // stays silent).
        for p in self.peers.iter_mut().flatten() {
            if let Some(session) = p.forget_relay_via(handle) {
                self.relayed.remove(&session);
            }
        }
        for sp in &mut self.static_peers {
            if sp.peer == Some(handle) {
                sp.peer = None;
            }
        }
        Some(peer)
    }

    /// Where datagrams for `handle` go now: through its relay while relayed, else direct
    /// (to a live link of its bond while the endpoint's link is dead).
    fn route(&self, handle: PeerHandle) -> Option<Route> {
        let peer = self.peer(handle)?;
        let relay_endpoint = peer.relayed_via().and_then(|r| self.endpoint_of(r.via));
        match peer.route(relay_endpoint) {
            Route::Direct(to) => Some(Route::Direct(
                peer.bond
                    .as_ref()
                    .and_then(|b| b.instead_of(to))
                    .unwrap_or(to),
            )),
            relayed => Some(relayed),
        }
    }

    fn namespace_by_tag(&self, tag: &[u8; TAG_LEN]) -> Option<NamespaceId> {
        self.namespaces
            .iter()
            .position(|n| n.active && &n.keys.tag == tag)
            .map(NamespaceId)
    }

    /// Namespace `ns` takes packets from other namespaces' addresses: each `(remote,
    /// gateway)` lets the member holding `gateway` (an address of `ns`) send from
    /// `remote`, as the gateway of a link both namespaces' policies name. Replaces the
    /// links before.
    pub fn set_links(&mut self, ns: NamespaceId, links: Vec<(ipnet::Ipv4Net, Ipv4Addr)>) {
        if let Some(n) = self.namespaces.get_mut(ns.0) {
            n.links = links;
        }
    }

    /// Whether the member of tunnel `handle` may send from `src`, which it does not hold,
    /// as the gateway of a link of its namespace.
    fn via_link(&self, handle: PeerHandle, src: Ipv4Addr) -> bool {
        self.peer(handle).is_some_and(|p| {
            !p.addresses.contains(&src)
                && self.namespaces.get(p.ns.0).is_some_and(|n| {
                    n.links
                        .iter()
                        .any(|(net, gw)| net.contains(&src) && p.addresses.contains(gw))
                })
        })
    }

    fn peer(&self, handle: PeerHandle) -> Option<&Peer> {
        self.peers.get(handle.0 as usize)?.as_ref()
    }

    fn peer_mut(&mut self, handle: PeerHandle) -> Option<&mut Peer> {
        self.peers.get_mut(handle.0 as usize)?.as_mut()
    }

    fn endpoint_of(&self, handle: PeerHandle) -> Option<SocketAddr> {
        self.peer(handle).map(|p| p.endpoint)
    }

    /// Every open tunnel, in slot order.
    fn handles(&self) -> impl Iterator<Item = PeerHandle> + '_ {
        self.peers
            .iter()
            .enumerate()
            .filter(|(_, p)| p.is_some())
            .map(|(i, _)| PeerHandle(i as u32))
    }

    /// The tunnels of `ns`.
    fn handles_in(&self, ns: NamespaceId) -> Vec<PeerHandle> {
        self.by_id
            .iter()
            .filter(|((n, _), _)| *n == ns)
            .map(|(_, h)| *h)
            .collect()
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

/// The base instant of the unit tests' virtual clock: the one clock read under `node/`.
#[cfg(test)]
#[allow(clippy::disallowed_methods)]
fn test_epoch() -> Instant {
    Instant::now()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{emit_init_prefix, emit_relay_header, Hello, WG_INIT_LEN};
    use testing::SECRET;

    fn node(seed: u8) -> (Node, NamespaceId) {
        (testing::member(seed), NamespaceId(0))
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// Moves datagrams between `a` (at port 1) and `b` (at port 2) until both are quiet.
    fn pump(a: &mut Node, b: &mut Node, now: Instant) {
        testing::pump(a, addr(1), b, addr(2), now);
    }

    #[test]
    fn an_idle_node_has_no_timeout() {
        let (mut n, _) = node(1);
        assert_eq!(n.poll_timeout(), None);
        n.handle_timeout(test_epoch());
        assert_eq!(n.poll_timeout(), None, "running the timers arms nothing");
    }

    #[test]
    fn a_pending_hello_is_a_timeout_and_backs_off() {
        let t0 = test_epoch();
        let (mut n, ns) = node(1);
        n.add_static_peer(ns, addr(2), t0);
        assert_eq!(n.poll_timeout(), Some(t0), "the first hello is due at once");
        n.handle_timeout(t0);
        assert!(n.poll_transmit().is_some(), "hello sent");
        assert_eq!(n.poll_timeout(), Some(t0 + HELLO_INTERVAL));
        let t1 = t0 + HELLO_INTERVAL;
        n.handle_timeout(t1);
        assert_eq!(
            n.poll_timeout(),
            Some(t1 + HELLO_INTERVAL * 2),
            "an endpoint that never answers is asked less often"
        );
    }

    #[test]
    fn a_tunnel_needs_the_tick() {
        let t0 = test_epoch();
        let (mut a, ns) = node(1);
        let (mut b, _) = node(2);
        a.add_static_peer(ns, addr(2), t0);
        a.handle_timeout(t0);
        pump(&mut a, &mut b, t0);
        assert!(a.peers().next().is_some_and(|p| p.handshake_age.is_some()));
        // b opened its tunnel on a's hello and never ran its timers: they start with it.
        assert_eq!(b.poll_timeout(), Some(t0 + TICK));
        let t1 = t0 + Duration::from_millis(100);
        a.handle_timeout(t1);
        let next = a.poll_timeout().unwrap();
        assert!(next > t1 && next <= t1 + TICK, "{:?}", next - t1);
        // The configured endpoint's member is live: its hello waits, the tick does not.
        assert!(a.poll_hello_timeout().unwrap() > t1 + TICK);
    }

    /// A driver that sleeps until `poll_timeout` never spins: after every timeout the next
    /// deadline lies ahead, while the tunnel is up, after the member vanished (hellos back
    /// off), and after its tunnel was dropped for silence.
    #[test]
    fn the_next_timeout_always_lies_ahead() {
        let t0 = test_epoch();
        let (mut a, ns) = node(1);
        let (mut b, _) = node(2);
        a.add_static_peer(ns, addr(2), t0);
        let mut now = t0;
        let mut steps = 0;
        let mut b_up = true;
        while now < t0 + Duration::from_secs(300) {
            a.handle_timeout(now);
            if b_up {
                b.handle_timeout(now);
                pump(&mut a, &mut b, now);
            } else {
                while a.poll_transmit().is_some() {}
            }
            // b goes away after a minute; a keeps sending it packets.
            if b_up && now >= t0 + Duration::from_secs(60) {
                b_up = false;
            }
            if !b_up {
                let peer = a.peers().next().map(|p| p.handle);
                if let Some(peer) = peer {
                    let packet = [
                        0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0, 10, 201, 0, 1, 10, 201, 0, 2,
                    ];
                    a.send(peer, &packet, &mut vec![0u8; 256]);
                }
            }
            let next = [a.poll_timeout(), b_up.then(|| b.poll_timeout()).flatten()]
                .into_iter()
                .flatten()
                .min()
                .expect("a configured endpoint always has a deadline");
            assert!(
                next > now,
                "deadline {:?} not ahead at step {steps}",
                now - next
            );
            now = next;
            steps += 1;
        }
        assert!(
            std::iter::from_fn(|| a.poll_event())
                .any(|e| matches!(e, Event::PeerUnreachable { .. })),
            "the vanished member's tunnel was dropped"
        );
        assert!(steps <= 300 * 4 + 10, "{steps} steps for 300 s");
    }

    /// One datagram of each kind that cannot reach a tunnel, and the reason it is counted
    /// under.
    #[test]
    fn every_early_drop_is_counted_under_its_reason() {
        let t0 = test_epoch();
        let (mut n, _) = node(1);
        let keys = NamespaceKeys::derive("lab", SECRET);
        let stranger = NamespaceKeys::derive("lab", b"another namespace secret");
        let member = Identity::from_seed([2; 32]).peer_id();
        let mut forged = Hello::emit(&keys, &member, false);
        forged[20] ^= 1;
        let mut init = vec![0u8; INIT_PREFIX_LEN + WG_INIT_LEN];
        emit_init_prefix(&mut init, &stranger.tag(), 0);
        init[INIT_PREFIX_LEN] = 1;
        let mut relayed = vec![0u8; RELAY_HEADER_LEN + 32];
        emit_relay_header(&mut relayed, 77);
        relayed[RELAY_HEADER_LEN] = 4;
        let mut data = vec![0u8; 48];
        data[0] = 4;
        let mut bare = vec![0u8; WG_INIT_LEN];
        bare[0] = 1;
        let cases: [(&[u8], DropReason); 8] = [
            (&[], DropReason::Malformed),
            (&[0xff, 1, 2], DropReason::Malformed),
            (&bare, DropReason::Malformed),
            (&forged, DropReason::BadMac),
            (
                &Hello::emit(&stranger, &member, false),
                DropReason::UnknownNamespace,
            ),
            (&init, DropReason::UnknownNamespace),
            (&data, DropReason::UnknownSession),
            (&relayed, DropReason::UnknownSession),
        ];
        let mut out = vec![0u8; 256];
        for (d, why) in cases {
            let before = n.drops(why);
            assert_eq!(
                n.handle_datagram(t0, addr(2), d, &mut out),
                Received::Dropped(why),
                "{d:?}"
            );
            assert_eq!(n.drops(why), before + 1);
        }
        assert_eq!(
            n.handle_datagram(
                t0,
                addr(2),
                &Hello::emit(&keys, &n.peer_id(), false),
                &mut out
            ),
            Received::Dropped(DropReason::BadIdentity),
            "our own identity"
        );
        assert_eq!(n.peers().count(), 0);
        assert!(n.poll_transmit().is_none(), "strangers get nothing back");
    }
}
