//! The libp2p control plane: one swarm per agent, shared by all its namespaces.
//!
//! - **Transport**: TCP (noise, yamux) on the agent's listen port: the same number as the
//!   tunnels' UDP port, so one `host:port` names a member for both.
//! - **Kademlia** (protocol `/hyphae/kad/1`, so hyphae agents form their own DHT) finds the
//!   replicas of a key: the [`REPLICAS`] agents closest to it, this one included. Its own
//!   record store is never used: inbound puts are filtered out, because a put is
//!   last-writer-wins and checks nothing.
//! - **identify** tells us where peers listen, which feeds Kademlia's routing table.
//! - **request-response** (`/hyphae/records/1`) carries [`RecordRequest`]s to the replicas,
//!   each answered by the replica's [`RecordStore`] (compare-and-set leases on sealed, signed
//!   values, see [`crate::records`]), and claims are decided by [`crate::lease::Claim`]: a
//!   strict majority of the replicas must grant.
//!
//! - **circuit relay v2**: every agent with a reachable listen address serves as a relay
//!   for the control plane, and reserves a slot at up to [`RELAY_RESERVATIONS`] members it
//!   dialled itself (bootstrap members first). Its relayed address
//!   (`/ip4/R/tcp/P/p2p/R/p2p-circuit`) travels with identify into the others' routing
//!   tables, so a member whose TCP nobody can reach (behind a NAT, a firewall) is still
//!   reached, through the relay.
//! - **dcutr** turns such a relayed connection into a direct one when both ends can punch
//!   through (TCP simultaneous open to the addresses identify observed).
//! - **mDNS** (optional) finds members on the same LAN without a bootstrap address.
//!
//! A bootstrap address is a plain multiaddr without a peer id: whoever answers there becomes
//! our first routing-table entry, and a Kademlia bootstrap query fills in the rest.
//!
//! This is I/O glue, so unlike the rest of the crate it reads the clocks itself.
#![allow(clippy::disallowed_methods)]

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use futures::StreamExt;
use libp2p::core::transport::ListenerId;
use libp2p::core::ConnectedPoint;
use libp2p::multiaddr::Protocol;
use libp2p::request_response::{self, OutboundRequestId, ProtocolSupport};
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::{ConnectionId, NetworkBehaviour, SwarmEvent};
use libp2p::{dcutr, identify, kad, mdns, noise, relay, tcp, yamux, StreamProtocol, Swarm};

use crate::lease::{self, Claim, Outcome};
use crate::records::{
    Envelope, OwnerKey, RecordKey, RecordRequest, RecordResponse, RecordStore, StoreStats,
};
use crate::Identity;

pub use libp2p::{Multiaddr, PeerId as NetworkId};

/// Replicas per key: a claim needs a strict majority of them.
pub const REPLICAS: usize = 5;

/// How long a replica has to answer one request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a Kademlia lookup may take.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// How often bootstrap addresses are dialled again while no peer is connected.
pub const REDIAL_INTERVAL: Duration = Duration::from_secs(3);

/// Kademlia's protocol name: hyphae agents form a DHT of their own.
pub const KAD_PROTOCOL: &str = "/hyphae/kad/1";

/// The record protocol's name.
pub const RECORDS_PROTOCOL: &str = "/hyphae/records/1";

/// Members an agent keeps a relay reservation at.
pub const RELAY_RESERVATIONS: usize = 2;

/// How often missing relay reservations are sought again.
pub const RESERVE_INTERVAL: Duration = Duration::from_secs(10);

/// How long a member that refused a reservation (or dropped it unconfirmed) is not asked.
pub const RESERVE_BACKOFF: Duration = Duration::from_secs(300);

/// How long an agent with mDNS and no bootstrap address listens for members on its LAN
/// before it starts an overlay of its own.
pub const MDNS_WAIT: Duration = Duration::from_secs(2);

#[derive(NetworkBehaviour)]
struct Behaviour {
    kad: kad::Behaviour<kad::store::MemoryStore>,
    identify: identify::Behaviour,
    records: request_response::json::Behaviour<RecordRequest, RecordResponse>,
    relay: relay::Behaviour,
    relay_client: relay::client::Behaviour,
    dcutr: dcutr::Behaviour,
    mdns: Toggle<mdns::tokio::Behaviour>,
}

/// How the swarm finds members besides its bootstrap addresses, and how long it keeps
/// connections.
#[derive(Debug, Clone, Copy)]
pub struct OverlayOptions {
    /// Find members on the same LAN by mDNS.
    pub mdns: bool,
    /// How long a connection nothing uses stays open (a relay reservation uses its own).
    pub idle_timeout: Duration,
}

impl Default for OverlayOptions {
    fn default() -> Self {
        Self {
            mdns: false,
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// Names one operation (claim, get or release) until its event arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpId(u64);

/// How a claim ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimResult {
    /// A majority of the replicas granted the lease.
    Won,
    /// Another member holds the key (most refusing replicas named it), or the replicas
    /// refused without naming anyone (`None`: full, or unreachable).
    Lost(Option<OwnerKey>),
}

/// What the overlay reports to its driver.
#[derive(Debug, Clone)]
pub enum OverlayEvent {
    /// The swarm listens on a new address.
    Listening {
        /// The address.
        addr: Multiaddr,
    },
    /// The first bootstrap finished (or there was nothing to bootstrap from): claims made
    /// from now on see the replicas a converged lookup finds.
    Joined,
    /// A claim was decided.
    Claimed {
        /// The claim.
        op: OpId,
        /// The key.
        key: RecordKey,
        /// The decision.
        result: ClaimResult,
        /// How many replicas were asked.
        replicas: usize,
        /// How many peers the Kademlia lookup of the replicas queried.
        queried: u32,
    },
    /// A read finished: the envelopes replicas returned (signature and expiry checked),
    /// the one most replicas returned first.
    Got {
        /// The read.
        op: OpId,
        /// The key.
        key: RecordKey,
        /// Valid envelopes, most agreed first.
        envelopes: Vec<Envelope>,
        /// How many peers the Kademlia lookup of the replicas queried.
        queried: u32,
    },
    /// A new peer entered the routing table: it may now be one of the replicas of keys we
    /// hold, so leases should be renewed soon (Kademlia republishes for the same reason).
    NewPeer,
    /// A release reached every replica that answered in time.
    Released {
        /// The release.
        op: OpId,
    },
    /// A group entry reached every replica that answered in time.
    Announced {
        /// The announcement.
        op: OpId,
    },
    /// A group read finished: every valid entry the replicas returned, one per owner (the
    /// latest expiry kept).
    Members {
        /// The read.
        op: OpId,
        /// The group key.
        key: RecordKey,
        /// Valid envelopes.
        envelopes: Vec<Envelope>,
    },
}

/// Counters for status.
#[derive(Debug, Default, Clone, Copy)]
pub struct OverlayStats {
    /// Envelopes from replicas that failed verification (bad signature, expired, malformed).
    pub bad_envelopes: u64,
    /// Requests to replicas that failed (unreachable, timed out).
    pub request_failures: u64,
    /// Grants that reached a claim already lost, given straight back.
    pub late_grants_released: u64,
    /// Inbound Kademlia record puts refused (hyphae stores nothing through them).
    pub refused_puts: u64,
    /// Connections opened through a relay (either direction).
    pub relayed_connections: u64,
    /// Relayed connections that dcutr upgraded to direct ones.
    pub hole_punches: u64,
    /// dcutr attempts that failed (the connection stays relayed).
    pub hole_punch_failures: u64,
    /// Circuits this agent relays for others, opened since start.
    pub circuits_relayed: u64,
    /// Members found by mDNS.
    pub mdns_discovered: u64,
}

enum Stage {
    /// Waiting for the Kademlia lookup of the replicas.
    Lookup,
    Claim(Claim<RecordKey, OwnerKey, NetworkId>),
    Get {
        asked: usize,
        answers: Vec<Option<Envelope>>,
        deadline: Instant,
    },
    /// A release or a group announcement: counting answers.
    Release {
        asked: usize,
        answered: usize,
        deadline: Instant,
    },
    Members {
        asked: usize,
        answered: usize,
        envelopes: Vec<Envelope>,
        deadline: Instant,
    },
}

enum Kind {
    Claim(Envelope),
    Get,
    Release,
    Join(Envelope),
    Members,
}

struct Op {
    key: RecordKey,
    kind: Kind,
    stage: Stage,
    /// Peers the replica lookup queried.
    queried: u32,
}

/// The agent's libp2p swarm and its replica store.
pub struct Overlay {
    swarm: Swarm<Behaviour>,
    local: NetworkId,
    store: RecordStore,
    ops: HashMap<OpId, Op>,
    lookups: HashMap<kad::QueryId, OpId>,
    requests: HashMap<OutboundRequestId, (OpId, NetworkId)>,
    /// Lost claims with replicas yet to answer: a late grant is released at once.
    lost_claims: HashMap<OpId, Claim<RecordKey, OwnerKey, NetworkId>>,
    events: VecDeque<OverlayEvent>,
    next_op: u64,
    bootstrap: Vec<Multiaddr>,
    next_redial: Instant,
    joined: bool,
    bootstrapping: bool,
    listen_addrs: Vec<Multiaddr>,
    connected: HashSet<NetworkId>,
    /// Open connections: the peer, and whether they go through a relay.
    connections: HashMap<ConnectionId, (NetworkId, bool)>,
    /// Peers connected over loopback: their loopback listen addresses are theirs (another
    /// host's `127.0.0.1` would be ours).
    over_loopback: HashSet<NetworkId>,
    /// Members we hold an outbound direct connection to, and the address we dialled:
    /// relay candidates, since we reached them.
    dialled: HashMap<NetworkId, Multiaddr>,
    /// Relay reservations, pending or held, by relay.
    reservations: HashMap<NetworkId, ListenerId>,
    /// Relays whose reservation is confirmed.
    reserved: HashSet<NetworkId>,
    /// Members that refused a reservation, and until when they are not asked again.
    refused_relays: HashMap<NetworkId, Instant>,
    next_reserve: Instant,
    /// With mDNS and no bootstrap address: when to stop waiting for LAN members.
    mdns_wait: Option<Instant>,
    stats: OverlayStats,
}

/// Errors starting the swarm.
#[derive(Debug, thiserror::Error)]
pub enum OverlayError {
    /// The identity cannot be a libp2p key.
    #[error("identity: {0}")]
    Identity(String),
    /// The transport or behaviours could not be built.
    #[error("starting libp2p: {0}")]
    Build(String),
    /// The listen address was refused.
    #[error("cannot listen on {0} (TCP): {1}")]
    Listen(Multiaddr, String),
}

impl Overlay {
    /// Starts the swarm, listening on `listen` (a TCP multiaddr), and dials `bootstrap`.
    /// It must be polled with [`Overlay::next_event`] from inside a tokio runtime.
    pub fn new(
        identity: &Identity,
        listen: Multiaddr,
        bootstrap: Vec<Multiaddr>,
        options: OverlayOptions,
    ) -> Result<Self, OverlayError> {
        let keypair = libp2p::identity::Keypair::ed25519_from_bytes(identity.seed())
            .map_err(|e| OverlayError::Identity(e.to_string()))?;
        let local = keypair.public().to_peer_id();
        let make = move |key: &libp2p::identity::Keypair, relay_client| {
            make_behaviour(key, relay_client, options)
        };
        let build = |e: &dyn std::fmt::Display| OverlayError::Build(e.to_string());
        let builder = libp2p::SwarmBuilder::with_existing_identity(keypair).with_tokio();
        let swarm_config =
            |c: libp2p::swarm::Config| c.with_idle_connection_timeout(options.idle_timeout);
        let mut swarm = if is_memory(&listen) {
            // In-process simulations: no sockets, so hundreds of members fit in one process.
            builder
                .with_other_transport(|key| {
                    use libp2p::core::Transport as _;
                    Ok(libp2p::core::transport::MemoryTransport::default()
                        .upgrade(libp2p::core::upgrade::Version::V1)
                        .authenticate(noise::Config::new(key)?)
                        .multiplex(yamux::Config::default()))
                })
                .map_err(|e| build(&e))?
                .with_relay_client(noise::Config::new, yamux::Config::default)
                .map_err(|e| build(&e))?
                .with_behaviour(make)
                .map_err(|e| build(&e))?
                .with_swarm_config(swarm_config)
                .build()
        } else {
            builder
                .with_tcp(
                    tcp::Config::default().nodelay(true),
                    noise::Config::new,
                    yamux::Config::default,
                )
                .map_err(|e| build(&e))?
                .with_relay_client(noise::Config::new, yamux::Config::default)
                .map_err(|e| build(&e))?
                .with_behaviour(make)
                .map_err(|e| build(&e))?
                .with_swarm_config(swarm_config)
                .build()
        };
        swarm
            .listen_on(listen.clone())
            .map_err(|e| OverlayError::Listen(listen, e.to_string()))?;
        let mut overlay = Self {
            swarm,
            local,
            store: RecordStore::default(),
            ops: HashMap::new(),
            lookups: HashMap::new(),
            requests: HashMap::new(),
            lost_claims: HashMap::new(),
            events: VecDeque::new(),
            next_op: 0,
            joined: bootstrap.is_empty(),
            bootstrap,
            next_redial: Instant::now(),
            bootstrapping: false,
            listen_addrs: Vec::new(),
            connected: HashSet::new(),
            connections: HashMap::new(),
            over_loopback: HashSet::new(),
            dialled: HashMap::new(),
            reservations: HashMap::new(),
            reserved: HashSet::new(),
            refused_relays: HashMap::new(),
            next_reserve: Instant::now() + RESERVE_INTERVAL,
            mdns_wait: None,
            stats: OverlayStats::default(),
        };
        if overlay.joined && options.mdns {
            // Members on the LAN may answer: join their overlay rather than start one.
            overlay.joined = false;
            overlay.mdns_wait = Some(Instant::now() + MDNS_WAIT);
        }
        if overlay.joined {
            overlay.events.push_back(OverlayEvent::Joined);
        }
        overlay.redial(Instant::now());
        Ok(overlay)
    }

    /// This agent's libp2p peer id.
    pub fn local_id(&self) -> NetworkId {
        self.local
    }

    /// Whether the first bootstrap has finished.
    pub fn is_joined(&self) -> bool {
        self.joined
    }

    /// Peers with an open connection.
    pub fn connected(&self) -> usize {
        self.connected.len()
    }

    /// Counters.
    pub fn stats(&self) -> OverlayStats {
        self.stats
    }

    /// The relays holding a reservation for this agent.
    pub fn relays(&self) -> Vec<NetworkId> {
        let mut relays: Vec<NetworkId> = self.reserved.iter().copied().collect();
        relays.sort();
        relays
    }

    /// Peers connected only through relays.
    pub fn relayed_peers(&self) -> Vec<NetworkId> {
        let mut relayed: Vec<NetworkId> = self
            .connected
            .iter()
            .filter(|p| {
                self.connections
                    .values()
                    .filter(|(q, _)| q == *p)
                    .all(|(_, relayed)| *relayed)
            })
            .copied()
            .collect();
        relayed.sort();
        relayed
    }

    /// The peers of Kademlia's routing table.
    pub fn routing_table(&mut self) -> Vec<NetworkId> {
        self.swarm
            .behaviour_mut()
            .kad
            .kbuckets()
            .flat_map(|b| b.iter().map(|e| *e.node.key.preimage()).collect::<Vec<_>>())
            .collect()
    }

    /// The replica store's counters.
    pub fn store_stats(&self) -> StoreStats {
        self.store.stats()
    }

    /// Records this agent keeps as a replica.
    pub fn stored_records(&self) -> usize {
        self.store.len()
    }

    /// The addresses this agent listens on (interface addresses, once known), as IP
    /// addresses; loopback only if there is nothing else.
    pub fn listen_ips(&self) -> Vec<IpAddr> {
        let ips: Vec<IpAddr> = self.listen_addrs.iter().filter_map(ip_of).collect();
        let outside: Vec<IpAddr> = ips.iter().copied().filter(|ip| !ip.is_loopback()).collect();
        if outside.is_empty() {
            ips
        } else {
            outside
        }
    }

    /// The TCP addresses this agent listens on.
    pub fn listen_addrs(&self) -> &[Multiaddr] {
        &self.listen_addrs
    }

    /// Dials `addr` (e.g. a member learned out of band) and adds whoever answers.
    pub fn dial(&mut self, addr: Multiaddr) {
        if let Err(e) = self.swarm.dial(addr.clone()) {
            tracing::debug!(%addr, error = %e, "dial failed");
        }
    }

    /// Claims `key` with `envelope` (whose owner is the claimer): granted only by a strict
    /// majority of the key's replicas. Also renews a lease already held.
    pub fn claim(&mut self, key: RecordKey, envelope: Envelope) -> OpId {
        self.start(key, Kind::Claim(envelope))
    }

    /// Reads `key` from its replicas.
    pub fn get(&mut self, key: RecordKey) -> OpId {
        self.start(key, Kind::Get)
    }

    /// Gives `key` back on its replicas (they accept it only from the owner).
    pub fn release(&mut self, key: RecordKey) -> OpId {
        self.start(key, Kind::Release)
    }

    /// Adds this agent to the group at `key` with `envelope` (renewed by announcing again
    /// before it expires).
    pub fn announce(&mut self, key: RecordKey, envelope: Envelope) -> OpId {
        self.start(key, Kind::Join(envelope))
    }

    /// Reads every member of the group at `key`.
    pub fn members(&mut self, key: RecordKey) -> OpId {
        self.start(key, Kind::Members)
    }

    fn start(&mut self, key: RecordKey, kind: Kind) -> OpId {
        let op = OpId(self.next_op);
        self.next_op += 1;
        let query = self
            .swarm
            .behaviour_mut()
            .kad
            .get_closest_peers(key.to_vec());
        self.lookups.insert(query, op);
        self.ops.insert(
            op,
            Op {
                key,
                kind,
                stage: Stage::Lookup,
                queried: 0,
            },
        );
        op
    }

    /// The next event; drives the swarm meanwhile. Cancel-safe.
    pub async fn next_event(&mut self) -> OverlayEvent {
        loop {
            if let Some(event) = self.events.pop_front() {
                return event;
            }
            let event = self.swarm.select_next_some().await;
            self.handle_swarm_event(event);
        }
    }

    /// Runs timers: request deadlines, redials of the bootstrap addresses, record expiry,
    /// relay reservations, the end of the wait for mDNS.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.store.expire(now);
        self.redial(now);
        self.reserve(now);
        if self.mdns_wait.is_some_and(|t| now >= t) {
            self.mdns_wait = None;
            if !self.joined && !self.bootstrapping {
                tracing::info!("no member found by mDNS: starting a new overlay");
                self.joined = true;
                self.events.push_back(OverlayEvent::Joined);
            }
        }
        let ids: Vec<OpId> = self.ops.keys().copied().collect();
        for id in ids {
            // Reads and releases end at their deadline in `check_done`; claims keep their
            // own.
            if let Some(Op {
                stage: Stage::Claim(claim),
                ..
            }) = self.ops.get_mut(&id)
            {
                claim.handle_timeout(now);
            }
            self.check_done(id, now);
        }
    }

    fn redial(&mut self, now: Instant) {
        if !self.connected.is_empty() || self.bootstrap.is_empty() || now < self.next_redial {
            return;
        }
        self.next_redial = now + REDIAL_INTERVAL;
        for addr in self.bootstrap.clone() {
            self.dial(addr);
        }
    }

    /// Keeps up to [`RELAY_RESERVATIONS`] relay reservations, at members we dialled
    /// ourselves (bootstrap members first, as we dialled them first).
    fn reserve(&mut self, now: Instant) {
        if now < self.next_reserve || self.reservations.len() >= RELAY_RESERVATIONS {
            return;
        }
        self.next_reserve = now + RESERVE_INTERVAL;
        self.refused_relays.retain(|_, until| *until > now);
        let mut candidates: Vec<(NetworkId, Multiaddr)> = self
            .dialled
            .iter()
            .filter(|(p, _)| {
                !self.reservations.contains_key(p) && !self.refused_relays.contains_key(p)
            })
            .map(|(p, a)| (*p, a.clone()))
            .collect();
        candidates.sort_by_key(|(_, a)| !self.bootstrap.contains(a));
        let wanted = RELAY_RESERVATIONS - self.reservations.len();
        for (relay, addr) in candidates.into_iter().take(wanted) {
            let circuit = addr.with(Protocol::P2p(relay)).with(Protocol::P2pCircuit);
            match self.swarm.listen_on(circuit.clone()) {
                Ok(listener) => {
                    tracing::debug!(%circuit, "asking for a relay reservation");
                    self.reservations.insert(relay, listener);
                }
                Err(e) => tracing::debug!(%circuit, error = %e, "cannot reserve"),
            }
        }
    }

    fn handle_swarm_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        let now = Instant::now();
        match event {
            SwarmEvent::NewListenAddr { address, .. } => {
                tracing::debug!(%address, "overlay listening");
                if is_relayed(&address) {
                    return;
                }
                if !is_loopback(&address) && !is_unspecified(&address) {
                    // Agents listen where members can reach them (they announce the same
                    // addresses as tunnel endpoints): confirmed, so the relay server gives
                    // it to the members it serves.
                    self.swarm.add_external_address(address.clone());
                }
                if !self.listen_addrs.contains(&address) {
                    self.listen_addrs.push(address.clone());
                    self.events
                        .push_back(OverlayEvent::Listening { addr: address });
                }
            }
            SwarmEvent::ExpiredListenAddr { address, .. } => {
                self.swarm.remove_external_address(&address);
                self.listen_addrs.retain(|a| a != &address);
            }
            SwarmEvent::ListenerClosed {
                listener_id,
                reason,
                ..
            } => {
                let relay = self
                    .reservations
                    .iter()
                    .find(|(_, l)| **l == listener_id)
                    .map(|(r, _)| *r);
                if let Some(relay) = relay {
                    tracing::debug!(%relay, ?reason, "relay reservation ended");
                    self.reservations.remove(&relay);
                    if !self.reserved.remove(&relay) {
                        // Refused, or lost before it was granted: ask others first.
                        self.refused_relays.insert(relay, now + RESERVE_BACKOFF);
                    }
                }
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                endpoint,
                connection_id,
                ..
            } => {
                self.connected.insert(peer_id);
                self.connections
                    .insert(connection_id, (peer_id, endpoint.is_relayed()));
                if is_loopback(endpoint.get_remote_address()) {
                    self.over_loopback.insert(peer_id);
                }
                if endpoint.is_relayed() {
                    self.stats.relayed_connections += 1;
                    tracing::debug!(peer = %peer_id, "relayed connection");
                } else if let ConnectedPoint::Dialer { address, .. } = endpoint {
                    let address = without_p2p(address);
                    self.dialled.insert(peer_id, address.clone());
                    if self.reservations.len() < RELAY_RESERVATIONS {
                        self.next_reserve = now;
                    }
                    self.swarm
                        .behaviour_mut()
                        .kad
                        .add_address(&peer_id, address);
                }
                if !self.joined && !self.bootstrapping {
                    self.bootstrapping = self.swarm.behaviour_mut().kad.bootstrap().is_ok();
                }
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                connection_id,
                num_established,
                ..
            } => {
                self.connections.remove(&connection_id);
                if num_established == 0 {
                    self.connected.remove(&peer_id);
                    self.over_loopback.remove(&peer_id);
                    self.dialled.remove(&peer_id);
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::RelayClient(event)) => match event {
                relay::client::Event::ReservationReqAccepted {
                    relay_peer_id,
                    renewal,
                    ..
                } => {
                    if !renewal {
                        tracing::info!(relay = %relay_peer_id, "relay reservation accepted");
                    }
                    self.reserved.insert(relay_peer_id);
                }
                other => tracing::debug!(?other, "relay client"),
            },
            SwarmEvent::Behaviour(BehaviourEvent::Relay(relay::Event::CircuitReqAccepted {
                src_peer_id,
                dst_peer_id,
            })) => {
                self.stats.circuits_relayed += 1;
                tracing::debug!(src = %src_peer_id, dst = %dst_peer_id, "relaying a circuit");
            }
            SwarmEvent::Behaviour(BehaviourEvent::Dcutr(dcutr::Event {
                remote_peer_id,
                result,
            })) => match result {
                Ok(_) => {
                    self.stats.hole_punches += 1;
                    tracing::info!(peer = %remote_peer_id, "hole punched: direct connection");
                }
                Err(e) => {
                    self.stats.hole_punch_failures += 1;
                    tracing::debug!(peer = %remote_peer_id, error = %e, "hole punching failed");
                }
            },
            SwarmEvent::Behaviour(BehaviourEvent::Mdns(mdns::Event::Discovered(found))) => {
                for (peer, addr) in found {
                    if peer == self.local || is_relayed(&addr) {
                        continue;
                    }
                    self.swarm
                        .behaviour_mut()
                        .kad
                        .add_address(&peer, addr.clone());
                    if !self.connected.contains(&peer) {
                        self.stats.mdns_discovered += 1;
                        tracing::info!(%peer, %addr, "member found by mDNS");
                        self.dial(addr.with(Protocol::P2p(peer)));
                    }
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received {
                peer_id,
                info,
                ..
            })) => {
                let via_loopback = self.over_loopback.contains(&peer_id);
                for addr in info.listen_addrs {
                    // Another host's loopback address is ours, not its.
                    if is_loopback(&addr) && !via_loopback {
                        continue;
                    }
                    self.swarm.behaviour_mut().kad.add_address(&peer_id, addr);
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Kad(event)) => self.handle_kad(event, now),
            SwarmEvent::Behaviour(BehaviourEvent::Records(event)) => {
                self.handle_records(event, now)
            }
            _ => {}
        }
    }

    fn handle_kad(&mut self, event: kad::Event, now: Instant) {
        match event {
            kad::Event::OutboundQueryProgressed {
                id,
                result,
                step,
                stats,
            } => match result {
                kad::QueryResult::GetClosestPeers(result) => {
                    if !step.last {
                        return;
                    }
                    let peers = match result {
                        Ok(ok) => ok.peers,
                        Err(kad::GetClosestPeersError::Timeout { peers, .. }) => peers,
                    };
                    if let Some(op) = self.lookups.remove(&id) {
                        if let Some(o) = self.ops.get_mut(&op) {
                            o.queried = stats.num_successes();
                        }
                        let peers = peers.into_iter().map(|p| p.peer_id).collect();
                        self.replicas_found(op, peers, now);
                    }
                }
                kad::QueryResult::Bootstrap(_) if step.last && !self.joined => {
                    self.joined = true;
                    self.bootstrapping = false;
                    tracing::info!(
                        peers = self.connected.len(),
                        "joined the overlay (bootstrap finished)"
                    );
                    self.events.push_back(OverlayEvent::Joined);
                }
                _ => {}
            },
            kad::Event::InboundRequest {
                request: kad::InboundRequest::PutRecord { .. },
            } => self.stats.refused_puts += 1,
            kad::Event::RoutingUpdated {
                is_new_peer: true, ..
            } => self.events.push_back(OverlayEvent::NewPeer),
            _ => {}
        }
    }

    /// The replica set: the [`REPLICAS`] closest to the key among the peers the lookup
    /// found and this agent.
    fn replicas_found(&mut self, id: OpId, mut peers: Vec<NetworkId>, now: Instant) {
        let Some(op) = self.ops.get(&id) else {
            return;
        };
        let target = kad::KBucketKey::new(op.key.to_vec());
        peers.push(self.local);
        peers.sort_by_key(|p| kad::KBucketKey::from(*p).distance(&target));
        peers.dedup();
        peers.truncate(REPLICAS);
        let key = op.key;
        let (asked, deadline, k) = (peers.len(), now + REQUEST_TIMEOUT, key.to_vec());
        // Every replica gets the same request (a claim's set is the one its lease picked).
        let (stage, request) = match &op.kind {
            Kind::Claim(envelope) => {
                let Some(owner) = envelope.owner() else {
                    self.ops.remove(&id);
                    return;
                };
                let (claim, _) = Claim::new(
                    now,
                    key,
                    owner,
                    Duration::ZERO,
                    peers.clone(),
                    REQUEST_TIMEOUT,
                );
                let request = RecordRequest::Claim {
                    key: k,
                    envelope: envelope.clone(),
                };
                (Stage::Claim(claim), request)
            }
            Kind::Get => (
                Stage::Get {
                    asked,
                    answers: Vec::new(),
                    deadline,
                },
                RecordRequest::Get { key: k },
            ),
            Kind::Release => (
                Stage::Release {
                    asked,
                    answered: 0,
                    deadline,
                },
                RecordRequest::Release { key: k },
            ),
            Kind::Join(envelope) => (
                Stage::Release {
                    asked,
                    answered: 0,
                    deadline,
                },
                RecordRequest::Join {
                    key: k,
                    envelope: envelope.clone(),
                },
            ),
            Kind::Members => (
                Stage::Members {
                    asked,
                    answered: 0,
                    envelopes: Vec::new(),
                    deadline,
                },
                RecordRequest::Members { key: k },
            ),
        };
        let requests = peers.into_iter().map(|p| (p, request.clone()));
        if let Some(op) = self.ops.get_mut(&id) {
            op.stage = stage;
        }
        for (replica, request) in requests {
            if replica == self.local {
                let own = owner_key(&self.local);
                let response = self.store.handle(now, wall_clock(), own, request);
                self.handle_answer(id, replica, Some(response), now);
            } else {
                let rid = self
                    .swarm
                    .behaviour_mut()
                    .records
                    .send_request(&replica, request);
                self.requests.insert(rid, (id, replica));
            }
        }
        self.check_done(id, now);
    }

    fn handle_records(
        &mut self,
        event: request_response::Event<RecordRequest, RecordResponse>,
        now: Instant,
    ) {
        match event {
            request_response::Event::Message { peer, message, .. } => match message {
                request_response::Message::Request {
                    request, channel, ..
                } => {
                    let requester = owner_key(&peer);
                    let response = self.store.handle(now, wall_clock(), requester, request);
                    let _ = self
                        .swarm
                        .behaviour_mut()
                        .records
                        .send_response(channel, response);
                }
                request_response::Message::Response {
                    request_id,
                    response,
                } => {
                    if let Some((op, replica)) = self.requests.remove(&request_id) {
                        self.handle_answer(op, replica, Some(response), now);
                        self.check_done(op, now);
                    }
                }
            },
            request_response::Event::OutboundFailure {
                request_id, error, ..
            } => {
                self.stats.request_failures += 1;
                if let Some((op, replica)) = self.requests.remove(&request_id) {
                    tracing::debug!(%replica, %error, "record request failed");
                    self.handle_answer(op, replica, None, now);
                    self.check_done(op, now);
                }
            }
            _ => {}
        }
    }

    fn handle_answer(
        &mut self,
        id: OpId,
        replica: NetworkId,
        response: Option<RecordResponse>,
        now: Instant,
    ) {
        // No answer counts as a refusal.
        let answer = response
            .as_ref()
            .and_then(RecordResponse::to_lease)
            .unwrap_or(lease::Response::Full);
        if let Some(claim) = self.lost_claims.get_mut(&id) {
            let releases = claim.handle_response(replica, answer);
            let key = *claim.key();
            if claim.unanswered() == 0 {
                self.lost_claims.remove(&id);
            }
            for (replica, _) in releases {
                self.stats.late_grants_released += 1;
                self.send_release(replica, key, now);
            }
            return;
        }
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        match &mut op.stage {
            Stage::Claim(claim) => {
                // Decided claims are not in `ops`: nothing comes back to release here.
                let _ = claim.handle_response(replica, answer);
            }
            Stage::Get { answers, .. } => {
                let envelope = match response {
                    Some(RecordResponse::Value { envelope }) => envelope,
                    _ => None,
                };
                let envelope = envelope.filter(|e| {
                    let ok = e.verify(&op.key, wall_clock()).is_ok();
                    if !ok {
                        self.stats.bad_envelopes += 1;
                    }
                    ok
                });
                answers.push(envelope);
            }
            Stage::Release { answered, .. } => *answered += 1,
            Stage::Members {
                answered,
                envelopes,
                ..
            } => {
                *answered += 1;
                let Some(RecordResponse::Members { envelopes: got }) = response else {
                    return;
                };
                for e in got.into_iter().take(crate::records::MAX_GROUP_MEMBERS) {
                    if e.verify(&op.key, wall_clock()).is_err() {
                        self.stats.bad_envelopes += 1;
                        continue;
                    }
                    match envelopes.iter_mut().find(|k| k.owner == e.owner) {
                        Some(k) if k.expires < e.expires => *k = e,
                        Some(_) => {}
                        None => envelopes.push(e),
                    }
                }
            }
            Stage::Lookup => {}
        }
    }

    fn check_done(&mut self, id: OpId, now: Instant) {
        let Some(op) = self.ops.get(&id) else {
            return;
        };
        let (key, queried) = (op.key, op.queried);
        let event = match &op.stage {
            Stage::Lookup => return,
            Stage::Claim(claim) => {
                let Some(outcome) = claim.outcome() else {
                    return;
                };
                let replicas = claim.replica_count();
                let (result, releases) = match outcome {
                    Outcome::Won => (ClaimResult::Won, Vec::new()),
                    Outcome::Lost { holder, release_to } => {
                        (ClaimResult::Lost(*holder), release_to.clone())
                    }
                };
                for replica in releases {
                    self.send_release(replica, key, now);
                }
                OverlayEvent::Claimed {
                    op: id,
                    key,
                    result,
                    replicas,
                    queried,
                }
            }
            Stage::Get {
                asked,
                answers,
                deadline,
            } => {
                if answers.len() < *asked && now < *deadline {
                    return;
                }
                OverlayEvent::Got {
                    op: id,
                    key,
                    envelopes: rank(answers),
                    queried,
                }
            }
            Stage::Release {
                asked,
                answered,
                deadline,
            } => {
                if answered < asked && now < *deadline {
                    return;
                }
                match op.kind {
                    Kind::Join(_) => OverlayEvent::Announced { op: id },
                    _ => OverlayEvent::Released { op: id },
                }
            }
            Stage::Members {
                asked,
                answered,
                envelopes,
                deadline,
            } => {
                if answered < asked && now < *deadline {
                    return;
                }
                OverlayEvent::Members {
                    op: id,
                    key,
                    envelopes: envelopes.clone(),
                }
            }
        };
        if let Some(Op {
            stage: Stage::Claim(claim),
            ..
        }) = self.ops.remove(&id)
        {
            if matches!(claim.outcome(), Some(Outcome::Lost { .. })) && claim.unanswered() > 0 {
                self.lost_claims.insert(id, claim);
            }
        }
        self.events.push_back(event);
    }

    /// Gives a lease on `key` back to `replica` (this agent's own store, or a peer's).
    fn send_release(&mut self, replica: NetworkId, key: RecordKey, now: Instant) {
        let request = RecordRequest::Release { key: key.to_vec() };
        if replica == self.local {
            let own = owner_key(&self.local);
            self.store.handle(now, wall_clock(), own, request);
        } else {
            self.swarm
                .behaviour_mut()
                .records
                .send_request(&replica, request);
        }
    }
}

/// The behaviours of one agent's swarm.
fn make_behaviour(
    key: &libp2p::identity::Keypair,
    relay_client: relay::client::Behaviour,
    options: OverlayOptions,
) -> Result<Behaviour, Box<dyn std::error::Error + Send + Sync>> {
    let mut cfg = kad::Config::new(StreamProtocol::new(KAD_PROTOCOL));
    cfg.set_query_timeout(LOOKUP_TIMEOUT);
    cfg.set_record_filtering(kad::StoreInserts::FilterBoth);
    let peer = key.public().to_peer_id();
    let mut kad = kad::Behaviour::with_config(peer, kad::store::MemoryStore::new(peer), cfg);
    // Every agent serves the DHT: there is no AutoNAT here to confirm that.
    kad.set_mode(Some(kad::Mode::Server));
    let identify = identify::Behaviour::new(
        identify::Config::new("/hyphae/1".into(), key.public()).with_push_listen_addr_updates(true),
    );
    let records = request_response::json::Behaviour::new(
        [(StreamProtocol::new(RECORDS_PROTOCOL), ProtocolSupport::Full)],
        request_response::Config::default().with_request_timeout(REQUEST_TIMEOUT),
    );
    let relay = relay::Behaviour::new(
        peer,
        relay::Config {
            max_reservations: 1024,
            max_circuits: 64,
            max_circuits_per_peer: 8,
            ..Default::default()
        },
    );
    let mdns = match options.mdns {
        true => Some(mdns::tokio::Behaviour::new(mdns::Config::default(), peer)?),
        false => None,
    };
    Ok(Behaviour {
        kad,
        identify,
        records,
        relay,
        relay_client,
        dcutr: dcutr::Behaviour::new(peer),
        mdns: mdns.into(),
    })
}

/// Distinct envelopes, the one most replicas returned first (then the latest expiry).
fn rank(answers: &[Option<Envelope>]) -> Vec<Envelope> {
    let mut counted: Vec<(usize, Envelope)> = Vec::new();
    for e in answers.iter().flatten() {
        match counted.iter_mut().find(|(_, c)| c.owner == e.owner) {
            Some((n, c)) => {
                *n += 1;
                if e.expires > c.expires {
                    *c = e.clone();
                }
            }
            None => counted.push((1, e.clone())),
        }
    }
    counted.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.expires.cmp(&a.1.expires)));
    counted.into_iter().map(|(_, e)| e).collect()
}

fn without_p2p(mut addr: Multiaddr) -> Multiaddr {
    if matches!(addr.iter().last(), Some(Protocol::P2p(_))) {
        addr.pop();
    }
    addr
}

fn ip_of(addr: &Multiaddr) -> Option<IpAddr> {
    addr.iter().find_map(|p| match p {
        Protocol::Ip4(ip) => Some(IpAddr::V4(ip)),
        Protocol::Ip6(ip) => Some(IpAddr::V6(ip)),
        _ => None,
    })
}

fn is_loopback(addr: &Multiaddr) -> bool {
    ip_of(addr).is_some_and(|ip| ip.is_loopback())
}

fn is_memory(addr: &Multiaddr) -> bool {
    matches!(addr.iter().next(), Some(Protocol::Memory(_)))
}

fn is_unspecified(addr: &Multiaddr) -> bool {
    ip_of(addr).is_some_and(|ip| ip.is_unspecified())
}

/// Whether `addr` goes through a relay (`.../p2p-circuit/...`).
pub fn is_relayed(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| p == Protocol::P2pCircuit)
}

/// The TCP multiaddr of a socket address.
pub fn tcp_multiaddr(addr: SocketAddr) -> Multiaddr {
    Multiaddr::empty()
        .with(match addr.ip() {
            IpAddr::V4(ip) => Protocol::Ip4(ip),
            IpAddr::V6(ip) => Protocol::Ip6(ip),
        })
        .with(Protocol::Tcp(addr.port()))
}

/// The tunnel endpoint of an agent listening at a TCP multiaddr (`/ip4/A/tcp/P...`): hyphae
/// agents carry tunnels on the same port number over UDP. `None` for other addresses,
/// relayed ones included (their IP is the relay's).
pub fn tunnel_endpoint(addr: &Multiaddr) -> Option<SocketAddr> {
    if is_relayed(addr) {
        return None;
    }
    let mut it = addr.iter();
    let ip = match it.next()? {
        Protocol::Ip4(ip) => IpAddr::V4(ip),
        Protocol::Ip6(ip) => IpAddr::V6(ip),
        _ => return None,
    };
    match it.next()? {
        Protocol::Tcp(port) => Some(SocketAddr::new(ip, port)),
        _ => None,
    }
}

/// The Ed25519 key behind a libp2p peer id (hyphae agents use Ed25519 identities, whose
/// peer ids embed the key).
pub fn owner_key(id: &NetworkId) -> Option<OwnerKey> {
    let hash: &libp2p::multihash::Multihash<64> = id.as_ref();
    if hash.code() != 0 {
        return None;
    }
    let key = libp2p::identity::PublicKey::try_decode_protobuf(hash.digest()).ok()?;
    Some(key.try_into_ed25519().ok()?.to_bytes())
}

/// The libp2p peer id of an Ed25519 key.
pub fn network_id(owner: &OwnerKey) -> Option<NetworkId> {
    let key = libp2p::identity::ed25519::PublicKey::try_from_bytes(owner).ok()?;
    Some(libp2p::identity::PublicKey::from(key).to_peer_id())
}

/// Unix seconds: envelopes expire on the wall clock, which members share, not on a
/// monotonic clock, which they do not.
#[allow(clippy::disallowed_methods)]
fn wall_clock() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The current wall clock, Unix seconds (for sealing envelopes).
pub fn unix_now() -> u64 {
    wall_clock()
}
