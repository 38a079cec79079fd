//! The libp2p control plane: one swarm per agent, shared by all its namespaces.
//!
//! - **Transport**: TCP (noise, yamux) on the agent's listen port: the same number as the
//!   tunnels' UDP port, so one `host:port` names a member for both.
//! - **Kademlia** (protocol `/hyphae/kad/1`, so hyphae agents form their own DHT) finds the
//!   replicas of a key: the [`REPLICAS`] agents closest to it, this one included. Its own
//!   record store is never used: inbound puts are filtered out, because a put is
//!   last-writer-wins and checks nothing.
//! - **identify** tells us where peers listen, which feeds Kademlia's routing table.
//! - **membership proofs** (`/hyphae/member/1`, [`crate::proof`]): both ends of every
//!   connection challenge each other to prove, bound to their peer ids and a fresh nonce,
//!   which of our namespaces they hold the secret of. Only proven members count.
//! - **request-response** (`/hyphae/records/2`) carries [`RecordRequest`]s, each scoped to
//!   one namespace, to the replicas, each answered by the replica's [`RecordStore`]
//!   (compare-and-set leases on sealed, signed values, see [`crate::records`]). The replicas
//!   of a key are the [`REPLICAS`] proven members of its namespace closest to it (this agent
//!   included): the Kademlia lookup's result filtered to proven members, plus the members
//!   we are connected to. A replica answers only askers that proved they are members of
//!   the request's namespace, and only for namespaces it is a member of itself; a stranger
//!   can route lookups but never holds, refuses, hides or reads a record. What to ask and
//!   when an operation is done is decided by the pure [`crate::quorum::Table`]: this module
//!   feeds it lookups and answers and sends what it returns.
//! - **messages between members** (`/hyphae/routers/1`, [`Overlay::send_to_member`]): an
//!   opaque body scoped to one namespace, delivered ([`OverlayEvent::MemberMessage`]) only
//!   from a peer that proved it is a member of it (for the migration handoff between router
//!   sites).
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
//! This is I/O glue, so unlike the rest of the crate it reads the clocks itself, in one
//! place (`clocks()`) at the top of each entry: [`Overlay::new`], each swarm event in
//! [`Overlay::next_event`], and [`Overlay::handle_timeout`] (whose caller passes `now`; it
//! reads the wall clock). Everything below an entry takes the time as input. The driver
//! calls [`Overlay::handle_timeout`] by [`Overlay::poll_timeout`] (or more often).

mod addr;
mod authority;
mod behaviour;
mod events;
mod guard;
mod hygiene;
mod liveness;
mod members;
mod relays;
mod requests;
mod routers;
mod stats;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use futures::StreamExt;
use libp2p::request_response::{self, OutboundRequestId};
use libp2p::swarm::ConnectionId;
use libp2p::{kad, Swarm};

use crate::proof::{NamespaceTag, ProofStats, Proofs};
use crate::quorum;
use crate::records::{Envelope, RecordKey, RecordResponse, RecordStore, ScopedRequest, StoreStats};
use crate::Identity;
use addr::{ip_of, is_loopback};
use behaviour::Behaviour;
use guard::RelayAdmission;
use hygiene::Hygiene;
use liveness::Liveness;
use members::Awaiting;
use rand::rngs::StdRng;
use rand::SeedableRng;
use relays::Relays;

pub use crate::quorum::{ClaimResult, OpId, REPLICAS, REQUEST_TIMEOUT};
pub use addr::{is_relayed, network_id, owner_key, tcp_multiaddr, tunnel_endpoint};
pub use authority::{AuthorityAck, AuthorityPush, Document, AUTHORITY_PROTOCOL};
pub use guard::{
    MAX_CONNECTIONS, MAX_CONNECTIONS_PER_IP, MAX_CONNECTIONS_PER_PEER, MAX_PENDING_INCOMING,
    MAX_PENDING_OUTGOING, MAX_RELAY_CIRCUITS, MAX_RELAY_CIRCUITS_PER_PEER, MAX_RELAY_RESERVATIONS,
    MAX_RELAY_RESERVATIONS_PER_PEER,
};
pub use libp2p::{Multiaddr, PeerId as NetworkId};
pub use relays::{RELAY_RESERVATIONS, RESERVE_BACKOFF, RESERVE_INTERVAL, RESERVE_RETRY};
pub use routers::{RouterAck, RouterMessage, MAX_ROUTER_MESSAGE, ROUTERS_PROTOCOL};
pub use stats::OverlayStats;

/// How long a Kademlia lookup may take; after it, the lookup's answer is the closest peers
/// found so far. Not shorter: under load (200 members claiming at once in one process, the
/// scale test) lookups cut at 4 s returned sets that disagreed, and an address was won twice.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A claim goes without a lookup to the replica set computed from the proven members this
/// agent is connected to when it knows at least this many, so that the set is full: each
/// replica checks the set ([`crate::quorum::check_replicas`]), and a claim a replica
/// disputes is made again after a lookup (docs/DECISIONS.md, "Claims without a lookup").
pub const KNOWN_MEMBERS_FOR_CLAIMS: usize = crate::quorum::REPLICAS - 1;

/// How many routing-table peers near a key [`Overlay`] looks at when it checks a replica set
/// of a claim without a lookup (`swarm::requests`): a bound on the work, far above the
/// handful a routing table holds closer to a key than its replicas.
pub const MAX_UNPROVEN_NEAR: usize = 256;

/// How long the replicas a group's lookup found serve that group's later announcements and
/// reads: a member's heartbeat and its reads ([`crate::membership::GROUP_HEARTBEAT`],
/// [`crate::membership::GROUP_REFRESH`]) need no lookup each. A stale set costs at most a
/// late view of the group (reads take the union of every replica's entries), never an
/// address: claims always look up.
pub const GROUP_REPLICAS_REUSE: Duration = Duration::from_secs(60);

/// How long a libp2p connection's setup (TCP, noise, yamux) may take: three round trips of
/// 600 ms (a satellite link) fit twice over.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(4);

/// How often bootstrap addresses are dialled again while no peer is connected.
pub const REDIAL_INTERVAL: Duration = Duration::from_secs(3);

/// Kademlia's protocol name: hyphae agents form a DHT of their own.
pub const KAD_PROTOCOL: &str = "/hyphae/kad/1";

/// The record protocol's name.
pub const RECORDS_PROTOCOL: &str = "/hyphae/records/2";

/// How long an operation whose lookup found peers still proving their membership waits for
/// their proofs before it picks its replicas without them.
pub const PROOF_WAIT: Duration = Duration::from_secs(2);

/// Most record requests kept per peer while its proof is awaited (beyond: not answered).
const MAX_DEFERRED: usize = 64;

/// How often the replica store forgets expired records: every read checks expiry already,
/// so the sweep only frees memory, and a driver that sleeps until
/// [`Overlay::poll_timeout`] still runs it this often.
pub const STORE_SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// With only static peers as contacts: how long the agent waits for one of them to answer
/// before it starts the overlay alone ([`OverlayOptions::alone_after`]). A member that is up
/// answers a TCP dial within a round trip (a refused port at once), so the wait only delays
/// the first member up; the same wait as for mDNS answers.
pub const STATIC_PEER_WAIT: Duration = MDNS_WAIT;

/// How long an agent with mDNS and no bootstrap address listens for members on its LAN
/// before it starts an overlay of its own.
pub const MDNS_WAIT: Duration = Duration::from_secs(2);

/// How a first claim picks its replicas (DECISIONS, "Claims without a lookup").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ClaimMode {
    /// The set among the members this agent knows, no lookup, checked by each replica.
    Known,
    /// The set among the members a lookup found, checked by each replica.
    Checked,
    /// The set among the members a lookup found, not checked: only after the replicas
    /// disputed a checked set, named no member outside it (only peers of unknown
    /// membership), and this agent dialled the peers they named.
    Plain,
}

impl ClaimMode {
    /// What a first claim made in this mode does once lost without a holder: made again
    /// in the mode returned, or (`None`) lost for good, for its claimer to make again
    /// later. `disputed`: a replica answered with another set; `member_named`: one named a
    /// member (itself, or proven to it) outside the claim's set. A claim without a lookup
    /// looks up; a checked one a replica disputed goes on unchecked only when no member
    /// was named, so that a peer near a key that never proves anything cannot stop its
    /// claims for good, while a closer member this agent cannot reach (an agent under
    /// load, a relay at capacity) is never gone around: its set may hold the key for
    /// another owner (docs/DECISIONS.md, "Claims after a lookup are checked by the
    /// replicas too").
    pub(super) fn after_loss(self, disputed: bool, member_named: bool) -> Option<ClaimMode> {
        match self {
            ClaimMode::Known => Some(ClaimMode::Checked),
            ClaimMode::Checked if disputed && !member_named => Some(ClaimMode::Plain),
            ClaimMode::Checked | ClaimMode::Plain => None,
        }
    }
}

/// A first claim whose replicas check its set: what it claims again with, if they dispute.
pub(super) struct CheckedClaim {
    ns: NamespaceTag,
    key: RecordKey,
    envelope: Envelope,
    mode: ClaimMode,
}

/// How the swarm finds members besides its bootstrap addresses, and how long it keeps
/// connections.
#[derive(Debug, Clone, Copy)]
pub struct OverlayOptions {
    /// Find members on the same LAN by mDNS.
    pub mdns: bool,
    /// How long a connection nothing uses stays open (a relay reservation uses its own).
    pub idle_timeout: Duration,
    /// The bootstrap addresses are static peers only (no dedicated bootstrap agent): how
    /// long to wait for one of them to answer before starting the overlay alone, as a
    /// first member does. `None`: wait for a bootstrap address as long as it takes.
    pub alone_after: Option<Duration>,
    /// Claims go without a lookup to the replicas among the members this agent knows
    /// ([`KNOWN_MEMBERS_FOR_CLAIMS`]); off, every claim looks its replicas up first (the
    /// scale test's baseline).
    pub claims_without_lookup: bool,
}

impl Default for OverlayOptions {
    fn default() -> Self {
        Self {
            mdns: false,
            claims_without_lookup: true,
            idle_timeout: Duration::from_secs(60),
            alone_after: None,
        }
    }
}

/// What the overlay reports to its driver.
#[derive(Debug, Clone)]
pub enum OverlayEvent {
    /// The swarm listens on a new address.
    Listening {
        /// The address.
        addr: Multiaddr,
    },
    /// The swarm stopped listening on an address (listening on all addresses: the host
    /// lost it, e.g. it was renumbered).
    NotListening {
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
    /// A proven member of `ns` sent this agent a message ([`Overlay::send_to_member`]).
    MemberMessage {
        /// The namespace.
        ns: NamespaceTag,
        /// The sender.
        from: NetworkId,
        /// The message.
        body: Vec<u8>,
    },
    /// A member passed on a newer revocation list of namespace `ns`, now taken by the
    /// control plane (the tunnels must take it too).
    Revocations {
        /// The namespace.
        ns: NamespaceTag,
        /// The list as its authority signed it.
        list: Vec<u8>,
    },
    /// A member passed on a newer policy of namespace `ns`, signed by its authority (the
    /// data path must take it).
    Policy {
        /// The namespace.
        ns: NamespaceTag,
        /// The policy as its authority signed it.
        policy: Vec<u8>,
    },
}

/// The agent's libp2p swarm and its replica store.
pub struct Overlay {
    swarm: Swarm<Behaviour>,
    local: NetworkId,
    store: RecordStore,
    /// When the store next forgets expired records.
    next_sweep: Instant,
    quorum: quorum::Table,
    lookups: HashMap<kad::QueryId, OpId>,
    requests: HashMap<OutboundRequestId, (OpId, NetworkId)>,
    proofs: Proofs,
    /// Our outstanding challenges, by request.
    challenges: HashMap<OutboundRequestId, NetworkId>,
    /// The namespace of each key we operate on (a late grant's release needs it).
    key_ns: HashMap<RecordKey, NamespaceTag>,
    op_ns: HashMap<OpId, NamespaceTag>,
    awaiting: HashMap<OpId, Awaiting>,
    /// The peers the last lookup of each group key found, and when it ended.
    group_replicas: HashMap<RecordKey, (Vec<NetworkId>, u32, Instant)>,
    /// Group operations whose lookup runs: its result is kept for the next ones.
    group_lookups: HashMap<OpId, RecordKey>,
    /// First claims whose replicas check the set, with what claims again if they fail.
    checked_claims: HashMap<OpId, CheckedClaim>,
    /// Peers that replicas named when they disputed a claim's set.
    disputes: HashMap<OpId, Vec<NetworkId>>,
    /// Claims whose set a replica disputed naming a member outside it.
    members_named: HashSet<OpId>,
    /// A claim made again after a dispute: the peers named, whose proofs it waits for as
    /// for peers its lookup found.
    meet: HashMap<OpId, Vec<NetworkId>>,
    /// Claims started again after a lookup, and the operation the driver knows them as.
    claims_again: HashMap<OpId, OpId>,
    /// [`OverlayOptions::claims_without_lookup`].
    claims_without_lookup: bool,
    /// Record requests from peers whose proof is still awaited.
    deferred: HashMap<
        NetworkId,
        Vec<(
            ScopedRequest,
            request_response::ResponseChannel<RecordResponse>,
        )>,
    >,
    rng: StdRng,
    events: VecDeque<OverlayEvent>,
    bootstrap: Vec<Multiaddr>,
    next_redial: Instant,
    joined: bool,
    bootstrapping: bool,
    listen_addrs: Vec<Multiaddr>,
    connected: HashSet<NetworkId>,
    /// Open connections: the peer, and whether they go through a relay.
    connections: HashMap<ConnectionId, (NetworkId, bool)>,
    /// Peers out of the routing table because they fell silent, dialled again.
    unreachable: liveness::Unreachable,
    /// Connections closed as silent that libp2p has not reported closed yet.
    closing_silent: HashSet<ConnectionId>,
    /// Which connections answer pings; silent ones are closed.
    liveness: Liveness,
    /// Peers connected over loopback: their loopback listen addresses are theirs (another
    /// host's `127.0.0.1` would be ours).
    over_loopback: HashSet<NetworkId>,
    relays: Relays,
    /// Which peers the relay server serves: the proven members.
    relay_admission: RelayAdmission,
    /// With mDNS and no bootstrap address: when to stop waiting for LAN members.
    mdns_wait: Option<Instant>,
    /// When to start alone if no static peer answered ([`OverlayOptions::alone_after`]).
    alone_at: Option<Instant>,
    /// No static peer answered in time: the memberships run on an overlay of this agent
    /// alone, which a peer joins when it answers later (the swarm then bootstraps).
    alone: bool,
    /// Which addresses may enter the DHT as underlay addresses.
    hygiene: Hygiene,
    /// The agent listens on loopback alone: its loopback addresses are its underlay.
    listens_on_loopback: bool,
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
    /// `seed` seeds the challenge nonces (from the OS RNG). It must be polled with
    /// [`Overlay::next_event`] from inside a tokio runtime.
    pub fn new(
        identity: &Identity,
        listen: Multiaddr,
        bootstrap: Vec<Multiaddr>,
        options: OverlayOptions,
        seed: [u8; 32],
    ) -> Result<Self, OverlayError> {
        let (now, _) = clocks();
        let relay_admission = RelayAdmission::default();
        let mut swarm = behaviour::build(identity, &listen, options, &relay_admission)?;
        let local = *swarm.local_peer_id();
        let listens_on_loopback = is_loopback(&listen);
        let liveness = Liveness::new(!addr::is_memory(&listen));
        swarm
            .listen_on(listen.clone())
            .map_err(|e| OverlayError::Listen(listen, e.to_string()))?;
        let mut overlay = Self {
            swarm,
            local,
            store: RecordStore::new(owner_key(&local)),
            next_sweep: now + STORE_SWEEP_INTERVAL,
            quorum: quorum::Table::default(),
            lookups: HashMap::new(),
            requests: HashMap::new(),
            proofs: Proofs::new(local),
            challenges: HashMap::new(),
            key_ns: HashMap::new(),
            op_ns: HashMap::new(),
            awaiting: HashMap::new(),
            group_replicas: HashMap::new(),
            group_lookups: HashMap::new(),
            checked_claims: HashMap::new(),
            disputes: HashMap::new(),
            members_named: HashSet::new(),
            meet: HashMap::new(),
            claims_again: HashMap::new(),
            claims_without_lookup: options.claims_without_lookup,
            deferred: HashMap::new(),
            rng: StdRng::from_seed(seed),
            events: VecDeque::new(),
            joined: bootstrap.is_empty(),
            bootstrap,
            next_redial: now,
            bootstrapping: false,
            listen_addrs: Vec::new(),
            connected: HashSet::new(),
            connections: HashMap::new(),
            unreachable: liveness::Unreachable::default(),
            closing_silent: HashSet::new(),
            liveness,
            over_loopback: HashSet::new(),
            relays: Relays::new(now),
            relay_admission,
            mdns_wait: None,
            alone_at: None,
            alone: false,
            hygiene: Hygiene::default(),
            listens_on_loopback,
            stats: OverlayStats::default(),
        };
        if overlay.joined && options.mdns {
            // Members on the LAN may answer: join their overlay rather than start one.
            overlay.joined = false;
            overlay.mdns_wait = Some(now + MDNS_WAIT);
        }
        if overlay.joined {
            overlay.events.push_back(OverlayEvent::Joined);
        } else if let Some(wait) = options.alone_after {
            overlay.alone_at = Some(now + wait);
        }
        overlay.redial(now);
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

    /// Whether the memberships may run: the overlay was joined, or started alone because
    /// no static peer answered ([`OverlayOptions::alone_after`]).
    pub fn is_ready(&self) -> bool {
        self.joined || self.alone
    }

    /// Peers with an open connection.
    pub fn connected(&self) -> usize {
        self.connected.len()
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

    /// The addresses this agent listens on (interface addresses, once known), as IP
    /// addresses; loopback only if there is nothing else. Never one in an excluded
    /// network ([`Overlay::exclude_network`]): a TAP address is no tunnel endpoint.
    pub fn listen_ips(&self) -> Vec<IpAddr> {
        let ips: Vec<IpAddr> = self
            .listen_addrs
            .iter()
            .filter(|a| is_loopback(a) || self.hygiene.allows(a, false))
            .filter_map(ip_of)
            .collect();
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

    /// Our underlay address changed (renumbered, moved): TCP connections made from or to
    /// the old one are dead without knowing it (TCP finds out only after minutes of
    /// retransmissions), and record renewals sent over them would go nowhere. Every direct
    /// connection is closed; Kademlia dials again, from the new address, as soon as it
    /// needs a peer, and each new peer brings the renewals forward
    /// ([`OverlayEvent::NewPeer`]).
    pub fn handle_underlay_change(&mut self) {
        let direct: Vec<ConnectionId> = self
            .connections
            .iter()
            .filter(|(_, (_, relayed))| !relayed)
            .map(|(id, _)| *id)
            .collect();
        tracing::debug!(connections = direct.len(), "underlay changed: reconnecting");
        for id in direct {
            self.swarm.close_connection(id);
        }
    }

    /// Dials `addr` (e.g. a member learned out of band) and adds whoever answers.
    pub fn dial(&mut self, addr: Multiaddr) {
        if let Err(e) = self.swarm.dial(addr.clone()) {
            tracing::debug!(%addr, error = %e, "dial failed");
        }
    }

    /// The next event; drives the swarm meanwhile. Cancel-safe.
    pub async fn next_event(&mut self) -> OverlayEvent {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// Drives the swarm until it has an event for the caller, or would wait. For a caller
    /// that holds the overlay only while it polls (behind a lock shared with other threads).
    pub fn poll_event(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<OverlayEvent> {
        use std::task::Poll;
        loop {
            if let Some(event) = self.events.pop_front() {
                return Poll::Ready(event);
            }
            // The swarm's stream never ends.
            let Poll::Ready(Some(event)) = self.swarm.poll_next_unpin(cx) else {
                return Poll::Pending;
            };
            let (now, wall) = clocks();
            self.handle_swarm_event(now, wall, event);
        }
    }

    /// Runs timers: request deadlines, redials of the bootstrap addresses, record expiry,
    /// relay reservations, the end of the wait for mDNS.
    pub fn handle_timeout(&mut self, now: Instant) {
        let (_, wall) = clocks();
        // Members whose certificates expired are members no longer, and hold nothing here.
        let ended = self.proofs.revalidate(wall);
        let mut tags: Vec<NamespaceTag> = ended.iter().map(|(_, tag)| *tag).collect();
        tags.sort_unstable();
        tags.dedup();
        for (peer, _) in &ended {
            tracing::info!(%peer, "member certificate no longer valid");
        }
        for tag in &tags {
            self.drop_revoked(now, tag, &ended);
        }
        self.store.expire(now);
        self.next_sweep = now + STORE_SWEEP_INTERVAL;
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
        if self.alone_at.is_some_and(|t| now >= t) {
            self.alone_at = None;
            // A static peer that answered is being bootstrapped from: wait for that.
            if !self.joined && self.connected.is_empty() {
                tracing::info!("no static peer answered: starting the overlay alone");
                self.alone = true;
                self.events.push_back(OverlayEvent::Joined);
            }
        }
        self.check_awaiting(now, wall);
        self.quorum.handle_timeout(now);
        self.flush_quorum(now, wall);
        self.swarm.behaviour_mut().backoff.handle_timeout(now);
        let silent = self.liveness.silent(now);
        for &connection in &silent {
            if let Some((peer, relayed)) = self.connections.get(&connection) {
                tracing::debug!(%peer, relayed, "closing a silent connection");
                self.stats.silent_connections_closed += 1;
            }
            self.swarm.close_connection(connection);
            self.closing_silent.insert(connection);
        }
        // A peer left with no connection that answers leaves the routing table, to be
        // dialled again until it answers (`liveness::Unreachable`).
        for &connection in &silent {
            let Some(&(peer, _)) = self.connections.get(&connection) else {
                continue;
            };
            let answering = self.connections.iter().any(|(c, (p, _))| {
                *p == peer && !silent.contains(c) && !self.closing_silent.contains(c)
            });
            if answering {
                continue;
            }
            if let Some(entry) = self.swarm.behaviour_mut().kad.remove_peer(&peer) {
                let addresses = entry.node.value.into_vec();
                tracing::debug!(%peer, "unreachable: out of the routing table until it answers");
                self.unreachable.handle_dropped(peer, addresses, now);
            }
        }
        let backoff = &self.swarm.behaviour().backoff;
        let connected = &self.connected;
        let due = self
            .unreachable
            .due(now, |p| backoff.holds_off(p) || connected.contains(p));
        for (peer, addresses) in due {
            tracing::debug!(%peer, "dialling an unreachable peer again");
            let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer)
                .addresses(addresses)
                .build();
            if let Err(e) = self.swarm.dial(opts) {
                tracing::debug!(%peer, error = %e, "cannot dial an unreachable peer again");
            }
        }
    }

    /// When [`Overlay::handle_timeout`] wants to run next: the earliest operation deadline,
    /// bootstrap redial, relay reservation round, end of the mDNS wait or store sweep.
    /// libp2p's own timers (lookups, requests, idle connections) run inside the swarm,
    /// driven by [`Overlay::next_event`].
    pub fn poll_timeout(&self) -> Option<Instant> {
        let redial =
            (self.connected.is_empty() && !self.bootstrap.is_empty()).then_some(self.next_redial);
        [
            self.quorum.poll_timeout(),
            redial,
            self.relays.poll_timeout(),
            self.mdns_wait,
            self.alone_at,
            self.awaiting.values().map(|a| a.deadline).min(),
            self.liveness.poll_timeout(),
            self.unreachable.poll_timeout(),
            self.swarm.behaviour().backoff.poll_timeout(),
            Some(self.next_sweep),
        ]
        .into_iter()
        .flatten()
        .min()
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
        let proofs = &self.proofs;
        let candidates = self
            .relays
            .poll_reserve(now, &self.bootstrap, |p| proofs.is_proven(p));
        for (relay, circuit) in candidates {
            match self.swarm.listen_on(circuit.clone()) {
                Ok(listener) => {
                    tracing::debug!(%circuit, "asking for a relay reservation");
                    self.relays.handle_listening(relay, listener);
                }
                Err(e) => tracing::debug!(%circuit, error = %e, "cannot reserve"),
            }
        }
    }
}

/// The glue's clocks, read only here and only at the top of an entry (see the module
/// doc): the monotonic one for deadlines, and Unix seconds because envelopes expire on the
/// wall clock, which members share, not on a monotonic clock, which they do not.
#[allow(clippy::disallowed_methods)]
fn clocks() -> (Instant, u64) {
    (Instant::now(), unix_now())
}

/// The current wall clock, Unix seconds (for sealing envelopes).
#[allow(clippy::disallowed_methods)]
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An overlay whose only contact is a static peer that never answers (a closed port).
    fn waiting(alone_after: Option<Duration>) -> Overlay {
        let identity = Identity::from_seed([7; 32]);
        let options = OverlayOptions {
            alone_after,
            ..OverlayOptions::default()
        };
        let listen: Multiaddr = "/ip4/127.0.0.1/tcp/0".parse().expect("an address");
        let silent: Multiaddr = "/ip4/127.0.0.1/tcp/1".parse().expect("an address");
        Overlay::new(&identity, listen, vec![silent], options, [1; 32]).expect("an overlay")
    }

    fn joined_events(o: &mut Overlay) -> usize {
        let n = o
            .events
            .iter()
            .filter(|e| matches!(e, OverlayEvent::Joined))
            .count();
        o.events.clear();
        n
    }

    #[tokio::test]
    async fn with_only_silent_static_peers_the_overlay_starts_alone_after_the_wait() {
        let wait = Duration::from_secs(2);
        let mut o = waiting(Some(wait));
        let at = o.alone_at.expect("a wait");
        assert!(!o.is_ready());
        assert_eq!(o.poll_timeout().map(|t| t <= at), Some(true));
        o.handle_timeout(at - Duration::from_millis(1));
        assert!(!o.is_ready(), "not before the wait is over");
        assert_eq!(joined_events(&mut o), 0);
        o.handle_timeout(at);
        assert!(o.is_ready() && !o.is_joined(), "alone, not joined");
        assert_eq!(joined_events(&mut o), 1);
        // Once only.
        o.handle_timeout(at + wait);
        assert_eq!(joined_events(&mut o), 0);
    }

    #[tokio::test]
    async fn a_static_peer_that_answered_is_waited_for_and_without_the_option_nothing_starts() {
        let mut o = waiting(Some(Duration::from_secs(2)));
        let at = o.alone_at.expect("a wait");
        o.connected.insert(o.local);
        o.handle_timeout(at);
        assert!(!o.is_ready(), "a connected peer is bootstrapped from");
        assert_eq!(joined_events(&mut o), 0);

        let mut o = waiting(None);
        assert_eq!(o.alone_at, None);
        o.handle_timeout(clocks().0 + Duration::from_secs(3600));
        assert!(!o.is_ready());
    }

    #[tokio::test]
    async fn before_it_has_joined_a_near_read_looks_nothing_up_and_still_ends() {
        let mut o = waiting(None);
        let keys = crate::NamespaceKeys::derive("lab", b"0123456789abcdef");
        o.add_namespace(&keys, None);
        let key = keys.address_key(std::net::Ipv4Addr::new(10, 1, 0, 7));
        assert!(!o.is_joined());
        let near = o.get_near(keys.tag(), key);
        assert!(o.lookups.is_empty(), "a near read started a lookup");
        assert_eq!(o.stats.reads_without_lookup, 1);
        // Asked of the members it knows (none: itself) at the next timeout, and answered.
        o.handle_timeout(clocks().0);
        let got: Vec<_> = o
            .events
            .drain(..)
            .filter_map(|e| match e {
                OverlayEvent::Got { op, envelopes, .. } => Some((op, envelopes.len())),
                _ => None,
            })
            .collect();
        assert_eq!(got, vec![(near, 0)]);
        // A plain read still looks its replicas up.
        o.get(keys.tag(), key);
        assert_eq!(o.lookups.len(), 1);
    }

    #[test]
    fn a_disputed_claim_goes_around_only_peers_of_unknown_membership_never_a_member() {
        use ClaimMode::{Checked, Known, Plain};
        // Without a lookup: a dispute, or no answer at all, looks up.
        assert_eq!(Known.after_loss(true, true), Some(Checked));
        assert_eq!(Known.after_loss(false, false), Some(Checked));
        // After a lookup: only peers of unknown membership named, claimed unchecked once.
        assert_eq!(Checked.after_loss(true, false), Some(Plain));
        // A member named outside the set (the 50-agent duplicate): lost, made again later.
        assert_eq!(Checked.after_loss(true, true), None);
        // Lost with no dispute (refused, unanswered), or already unchecked: lost.
        assert_eq!(Checked.after_loss(false, false), None);
        assert_eq!(Plain.after_loss(true, false), None);
    }
}
