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
//! A bootstrap address is a plain multiaddr without a peer id: whoever answers there becomes
//! our first routing-table entry, and a Kademlia bootstrap query fills in the rest.
//!
//! This is I/O glue, so unlike the rest of the crate it reads the clocks itself.
#![allow(clippy::disallowed_methods)]

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use futures::StreamExt;
use libp2p::core::ConnectedPoint;
use libp2p::multiaddr::Protocol;
use libp2p::request_response::{self, OutboundRequestId, ProtocolSupport};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{identify, kad, noise, tcp, yamux, StreamProtocol, Swarm};

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

#[derive(NetworkBehaviour)]
struct Behaviour {
    kad: kad::Behaviour<kad::store::MemoryStore>,
    identify: identify::Behaviour,
    records: request_response::json::Behaviour<RecordRequest, RecordResponse>,
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
    },
    /// A new peer entered the routing table: it may now be one of the replicas of keys we
    /// hold, so leases should be renewed soon (Kademlia republishes for the same reason).
    NewPeer,
    /// A release reached every replica that answered in time.
    Released {
        /// The release.
        op: OpId,
    },
}

/// Counters for status.
#[derive(Debug, Default, Clone, Copy)]
pub struct OverlayStats {
    /// Envelopes from replicas that failed verification (bad signature, expired, malformed).
    pub bad_envelopes: u64,
    /// Requests to replicas that failed (unreachable, timed out).
    pub request_failures: u64,
    /// Inbound Kademlia record puts refused (hyphae stores nothing through them).
    pub refused_puts: u64,
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
    Release {
        asked: usize,
        answered: usize,
        deadline: Instant,
    },
}

enum Kind {
    Claim(Envelope),
    Get,
    Release,
}

struct Op {
    key: RecordKey,
    kind: Kind,
    stage: Stage,
}

/// The agent's libp2p swarm and its replica store.
pub struct Overlay {
    swarm: Swarm<Behaviour>,
    local: NetworkId,
    store: RecordStore,
    ops: HashMap<OpId, Op>,
    lookups: HashMap<kad::QueryId, OpId>,
    requests: HashMap<OutboundRequestId, (OpId, NetworkId)>,
    events: VecDeque<OverlayEvent>,
    next_op: u64,
    bootstrap: Vec<Multiaddr>,
    next_redial: Instant,
    joined: bool,
    bootstrapping: bool,
    listen_addrs: Vec<Multiaddr>,
    connected: HashSet<NetworkId>,
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
    ) -> Result<Self, OverlayError> {
        let keypair = libp2p::identity::Keypair::ed25519_from_bytes(identity.seed())
            .map_err(|e| OverlayError::Identity(e.to_string()))?;
        let local = keypair.public().to_peer_id();
        let mut swarm = libp2p::SwarmBuilder::with_existing_identity(keypair)
            .with_tokio()
            .with_tcp(
                tcp::Config::default().nodelay(true),
                noise::Config::new,
                yamux::Config::default,
            )
            .map_err(|e| OverlayError::Build(e.to_string()))?
            .with_behaviour(|key| {
                let mut cfg = kad::Config::new(StreamProtocol::new(KAD_PROTOCOL));
                cfg.set_query_timeout(LOOKUP_TIMEOUT);
                cfg.set_record_filtering(kad::StoreInserts::FilterBoth);
                let peer = key.public().to_peer_id();
                let mut kad =
                    kad::Behaviour::with_config(peer, kad::store::MemoryStore::new(peer), cfg);
                // Every agent serves the DHT: there is no AutoNAT here to confirm that.
                kad.set_mode(Some(kad::Mode::Server));
                let identify = identify::Behaviour::new(identify::Config::new(
                    "/hyphae/1".into(),
                    key.public(),
                ));
                let records = request_response::json::Behaviour::new(
                    [(StreamProtocol::new(RECORDS_PROTOCOL), ProtocolSupport::Full)],
                    request_response::Config::default().with_request_timeout(REQUEST_TIMEOUT),
                );
                Behaviour {
                    kad,
                    identify,
                    records,
                }
            })
            .map_err(|e| OverlayError::Build(e.to_string()))?
            .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(300)))
            .build();
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
            events: VecDeque::new(),
            next_op: 0,
            joined: bootstrap.is_empty(),
            bootstrap,
            next_redial: Instant::now(),
            bootstrapping: false,
            listen_addrs: Vec::new(),
            connected: HashSet::new(),
            stats: OverlayStats::default(),
        };
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

    /// Runs timers: request deadlines, redials of the bootstrap addresses, record expiry.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.store.expire(now);
        self.redial(now);
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

    fn handle_swarm_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        let now = Instant::now();
        match event {
            SwarmEvent::NewListenAddr { address, .. } => {
                tracing::debug!(%address, "overlay listening");
                if !self.listen_addrs.contains(&address) {
                    self.listen_addrs.push(address.clone());
                    self.events
                        .push_back(OverlayEvent::Listening { addr: address });
                }
            }
            SwarmEvent::ExpiredListenAddr { address, .. } => {
                self.listen_addrs.retain(|a| a != &address);
            }
            SwarmEvent::ConnectionEstablished {
                peer_id, endpoint, ..
            } => {
                self.connected.insert(peer_id);
                if let ConnectedPoint::Dialer { address, .. } = endpoint {
                    let address = without_p2p(address);
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
                num_established: 0,
                ..
            } => {
                self.connected.remove(&peer_id);
            }
            SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received {
                peer_id,
                info,
                ..
            })) => {
                let via_loopback = self
                    .swarm
                    .behaviour_mut()
                    .kad
                    .kbucket(peer_id)
                    .and_then(|b| {
                        b.iter()
                            .find(|e| e.node.key.preimage() == &peer_id)
                            .map(|e| e.node.value.iter().any(is_loopback))
                    })
                    .unwrap_or(false);
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
                id, result, step, ..
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
        let (stage, requests): (Stage, Vec<(NetworkId, RecordRequest)>) = match &op.kind {
            Kind::Claim(envelope) => {
                let Some(owner) = envelope.owner() else {
                    self.ops.remove(&id);
                    return;
                };
                let (claim, outgoing) =
                    Claim::new(now, key, owner, Duration::ZERO, peers, REQUEST_TIMEOUT);
                let requests = outgoing
                    .into_iter()
                    .map(|(r, _)| {
                        (
                            r,
                            RecordRequest::Claim {
                                key: key.to_vec(),
                                envelope: envelope.clone(),
                            },
                        )
                    })
                    .collect();
                (Stage::Claim(claim), requests)
            }
            Kind::Get => (
                Stage::Get {
                    asked: peers.len(),
                    answers: Vec::new(),
                    deadline: now + REQUEST_TIMEOUT,
                },
                peers
                    .iter()
                    .map(|p| (*p, RecordRequest::Get { key: key.to_vec() }))
                    .collect(),
            ),
            Kind::Release => (
                Stage::Release {
                    asked: peers.len(),
                    answered: 0,
                    deadline: now + REQUEST_TIMEOUT,
                },
                peers
                    .iter()
                    .map(|p| (*p, RecordRequest::Release { key: key.to_vec() }))
                    .collect(),
            ),
        };
        if let Some(op) = self.ops.get_mut(&id) {
            op.stage = stage;
        }
        for (replica, request) in requests {
            if replica == self.local {
                let own = owner_key(&self.local);
                let response = self.store.handle(now, wall_clock(), own, request);
                self.handle_answer(id, replica, Some(response));
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
                        self.handle_answer(op, replica, Some(response));
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
                    self.handle_answer(op, replica, None);
                    self.check_done(op, now);
                }
            }
            _ => {}
        }
    }

    fn handle_answer(&mut self, id: OpId, replica: NetworkId, response: Option<RecordResponse>) {
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        match &mut op.stage {
            Stage::Claim(claim) => match response.as_ref().and_then(RecordResponse::to_lease) {
                Some(answer) => claim.handle_response(replica, answer),
                // No answer: the claim's deadline counts it as a refusal.
                None => claim.handle_response(replica, lease::Response::Full),
            },
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
            Stage::Lookup => {}
        }
    }

    fn check_done(&mut self, id: OpId, now: Instant) {
        let Some(op) = self.ops.get(&id) else {
            return;
        };
        let key = op.key;
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
                OverlayEvent::Claimed {
                    op: id,
                    key,
                    result,
                    replicas,
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
                OverlayEvent::Released { op: id }
            }
        };
        self.ops.remove(&id);
        self.events.push_back(event);
    }
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
/// agents carry tunnels on the same port number over UDP. `None` for other addresses.
pub fn tunnel_endpoint(addr: &Multiaddr) -> Option<SocketAddr> {
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
