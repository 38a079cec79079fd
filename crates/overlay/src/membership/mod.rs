//! One namespace's side of the DHT, as a sans-IO state machine: the namespace record (its
//! settings), this member's own address, the addresses it holds for LAN hosts (router
//! mode) and DHCP clients, the names it holds in the namespace zone, the resolution of
//! other members' addresses (with the frames that wait for it), and the broadcast group.
//!
//! It never touches the swarm, a clock, the OS's RNG or a file. The driver:
//!
//! 1. builds it with [`Membership::new`] (a seed for its RNG, the time now in both clocks);
//! 2. feeds inputs: [`Membership::start`] once the overlay has joined, the results of the
//!    DHT operations it asked for ([`Membership::handle_claimed`],
//!    [`Membership::handle_got`], [`Membership::handle_members`], by [`Token`]), what the
//!    host and LAN do ([`Membership::hold`], [`Membership::add_hosted`],
//!    [`Membership::claim_for_dhcp`], ...), and [`Membership::handle_timeout`] whenever
//!    [`Membership::poll_timeout`] is due;
//! 3. after every input, starts each operation [`Membership::poll_request`] returns and
//!    acts on each [`Event`] of [`Membership::poll_event`] (configure an address, tell the
//!    tunnels, answer a DHCP client, remember the address won, ...).
//!
//! The namespace record holds the subnet, the lease time and the reserved addresses. It is
//! a lease like any other key, sealed and signed by the member that holds it: every member
//! that knows the settings claims it (one wins, the others read it), so it lives as long as
//! any member does. A member configured without a subnet reads it before claiming an
//! address; one configured with a different subnet gets a [`Event::Conflict`] naming the
//! keeper.

mod claims;
mod event;
pub use claims::{Address, AddressError};
pub use event::Event;
pub use handoff::HostedClaim;
mod address6;
mod group;
mod handoff;
mod hosted6;
mod macs;
mod member_names;
mod names;
pub use address6::{service_address6, usable6, Address6};
pub use macs::{mac_text, MacLeases, MAC_RECLAIM};
mod resolve;
mod settings;
#[cfg(test)]
#[allow(clippy::disallowed_methods)] // a base instant for the virtual clock
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use ipnet::{Ipv4Net, Ipv6Net};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::records::{Envelope, MemberInfo, RecordKey, Subject};
use crate::swarm::ClaimResult;
use crate::{Identity, NamespaceKeys, PeerId};

pub use resolve::{
    Pending, Resolved, MAX_PENDING_FRAMES, MAX_PENDING_TARGETS, NEGATIVE_TTL, PENDING_TIMEOUT,
    RESOLVED_TTL,
};
pub use settings::{
    check_address, check_subnets, Settings, MAX_LEASE_SECS, MAX_SUBNETS, MIN_LEASE_SECS,
};

use claims::{DhcpClaim, Hosted, Own};
use group::Group;
use names::NameLease;
use resolve::Resolver;
use settings::SettingsState;

pub use member_names::{MEMBER_NAME_REFRESH, MEMBER_NAME_RETRY};

/// Retry delay after a claim that no replica answered.
const CLAIM_RETRY: Duration = Duration::from_secs(2);

/// Candidates an `auto` claim tries before pausing.
const MAX_AUTO_TRIES: usize = 64;

/// After an `auto` claim ran out of candidates, the next try comes this much later.
const AUTO_PAUSE: Duration = Duration::from_secs(10);

/// How often the broadcast group is read again (members that joined since, and those
/// whose entries lapsed: with [`GROUP_HEARTBEAT`] and the replicas'
/// [`crate::records::GROUP_ENTRY_TTL`], a member that stopped without leaving is out of
/// every list within 30 s).
pub const GROUP_REFRESH: Duration = Duration::from_secs(10);

/// How often a member announces itself in the group again: its heartbeat. Replicas keep an
/// entry [`crate::records::GROUP_ENTRY_TTL`] after the last one, so one lost announcement
/// costs nothing and a member that stopped is gone from the group 12 to 20 s later.
pub const GROUP_HEARTBEAT: Duration = Duration::from_secs(8);

/// A LAN host's address or a name another member holds is claimed again this much later.
const CONFLICT_RETRY: Duration = Duration::from_secs(30);

/// A new DHT peer may be a replica of our keys: renewals are brought this close.
const RENEW_SOON: Duration = Duration::from_millis(300);

/// What a namespace's membership starts from.
#[derive(Clone)]
pub struct Config {
    /// Namespace name.
    pub name: String,
    /// Its keys.
    pub keys: NamespaceKeys,
    /// This member's subnet, if configured (else it is read from the namespace record: its
    /// first subnet).
    pub subnet: Option<Ipv4Net>,
    /// A multi-subnet namespace's every subnet, in the configured order, when configured
    /// (`subnet` is one of them); empty for one subnet, or to take them from the record.
    pub subnets: Vec<Ipv4Net>,
    /// Addresses no member may claim (with `subnet`, part of the record this member proposes).
    pub reserved: Vec<Ipv4Addr>,
    /// The address this member wants.
    pub address: Address,
    /// Address lease time (with `subnet`, part of the record this member proposes).
    pub lease: Duration,
    /// The name of this member's own address, if configured.
    pub hostname: Option<String>,
    /// The address this member held last (kept by the driver in its state directory):
    /// an `auto` claim tries it first.
    pub previous: Option<Ipv4Addr>,
    /// The namespace's IPv6 prefix (dual stack), or `None` for IPv4 only.
    pub prefix6: Option<Ipv6Net>,
    /// The IPv6 address this member wants (with `prefix6`).
    pub address6: Address6,
}

/// Names one DHT operation this membership asked for, until its result comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(u64);

/// A DHT operation for the driver to start.
#[derive(Debug, Clone)]
pub enum Request {
    /// Claim (or renew) `key` with `envelope`: answered by [`Membership::handle_claimed`].
    Claim {
        /// The key.
        key: RecordKey,
        /// The sealed, signed value.
        envelope: Envelope,
        /// This member holds the key already: a renewal, decided by the merge rule if
        /// another owner's lease shows up (`Overlay::renew`).
        renewal: bool,
    },
    /// Read `key`: answered by [`Membership::handle_got`].
    Get {
        /// The key.
        key: RecordKey,
    },
    /// Read `key` as `Get` does, but from the replicas among the members this agent is
    /// connected to, with no Kademlia lookup, when it knows enough of them (as a claim
    /// does) or has not joined the overlay yet (`Overlay::get_near`): for reads that come
    /// often and whose miss costs little,
    /// the names status shows beside each tunnel. Answered by [`Membership::handle_got`].
    GetNear {
        /// The key.
        key: RecordKey,
    },
    /// Give `key` back: nothing comes back.
    Release {
        /// The key.
        key: RecordKey,
    },
    /// Add this member to the group at `key`: nothing comes back.
    Announce {
        /// The group key.
        key: RecordKey,
        /// The sealed, signed entry.
        envelope: Envelope,
    },
    /// Read the group at `key`: answered by [`Membership::handle_members`].
    Members {
        /// The group key.
        key: RecordKey,
    },
    /// Move this member's lease on `key` to the owner of `envelope` (the new holder's own
    /// signed record): answered by [`Membership::handle_claimed`].
    Transfer {
        /// The key.
        key: RecordKey,
        /// The new holder's sealed, signed value.
        envelope: Envelope,
    },
}

/// Why an operation was started, to route its result.
#[derive(Debug, Clone)]
enum Purpose {
    SettingsClaim,
    SettingsGet,
    Own(Ipv4Addr),
    /// The own IPv6 address, sealed with this name (its PTR).
    Own6 {
        address: Ipv6Addr,
        name: Option<String>,
    },
    Hosted(Ipv4Addr),
    Hosted6(Ipv6Addr),
    HandOff(IpAddr),
    Dhcp(DhcpClaim),
    Name {
        name: String,
        sealed: Ipv4Addr,
        /// The IPv6 address sealed with it (the own name's, in a dual-stack namespace).
        sealed6: Option<Ipv6Addr>,
    },
    Resolve(IpAddr),
    ReadName(String),
    ReadHolder(Ipv4Addr),
    ReadHolder6(Ipv6Addr),
    Holder(IpAddr),
    GroupRead,
    /// Layer 2: the lease on a MAC on this side.
    Mac([u8; 6]),
    /// Layer 2: who holds a MAC a member announced.
    MacHolder([u8; 6]),
}

/// Monotonic time paired with wall-clock seconds: records carry Unix expiry times.
#[derive(Debug, Clone, Copy)]
struct Clock {
    at: Instant,
    unix: u64,
}

impl Clock {
    fn unix(&self, now: Instant) -> u64 {
        self.unix + now.saturating_duration_since(self.at).as_secs()
    }
}

/// One namespace's DHT state.
pub struct Membership {
    name: String,
    keys: NamespaceKeys,
    identity: Identity,
    rng: StdRng,
    clock: Clock,
    /// Where members reach this agent's tunnels (sealed into address records).
    endpoints: Vec<SocketAddr>,
    /// The endpoints sealed into the own-address claim in flight, and into the last one the
    /// replicas granted (what members that look us up find).
    claim_endpoints: Vec<SocketAddr>,
    published_endpoints: Vec<SocketAddr>,
    subnet: Option<Ipv4Net>,
    /// The namespace's other subnets, routed in one hop.
    routed: Vec<Ipv4Net>,
    reserved: Vec<Ipv4Addr>,
    wanted: Address,
    lease: Duration,
    settings: SettingsState,
    own: Own,
    prefix6: Option<Ipv6Net>,
    wanted6: Address6,
    own6: address6::Own6,
    hosted: BTreeMap<Ipv4Addr, Hosted>,
    hosted6: BTreeMap<Ipv6Addr, hosted6::Hosted6>,
    hosted_conflicts: u64,
    /// Times this member gave up its own address to another owner (partitions merged).
    address_conflicts: u64,
    /// Addresses already found taken, per DHCP client.
    dhcp_tried: HashMap<Vec<u8>, HashSet<Ipv4Addr>>,
    /// The DHCP client each address is claimed (or held) for. This member's claim on a
    /// key it already holds wins in the DHT, so the DHT alone cannot keep two of its own
    /// clients apart: an address claimed for one client is never claimed for another.
    dhcp_clients: HashMap<Ipv4Addr, Vec<u8>>,
    hostname: Option<String>,
    /// In a namespace with an authority, the name its certificate gives this member (its
    /// only name: `Some(None)` when the certificate's name is not a host name).
    certified_name: Option<Option<String>>,
    names: BTreeMap<String, NameLease>,
    /// Layer 2: the MACs on this member's side, each a lease.
    macs: BTreeMap<[u8; 6], macs::MacLease>,
    mac_conflicts: u64,
    name_error: Option<String>,
    name_conflicts: u64,
    /// Addresses whose record must be sealed again (a name was won while a claim that
    /// did not carry it was in flight).
    reseal: HashSet<Ipv4Addr>,
    resolver: Resolver,
    group: Group,
    /// Host names of other members' addresses, for status (see [`MEMBER_NAME_REFRESH`]).
    member_names: HashMap<Ipv4Addr, member_names::MemberName>,
    /// [`Membership::start`] was called: the overlay has joined, so claims see the
    /// replicas a converged lookup finds. Nothing is claimed before.
    started: bool,
    left: bool,
    next_token: u64,
    ops: HashMap<Token, Purpose>,
    requests: VecDeque<(Token, Request)>,
    events: VecDeque<Event>,
}

impl Membership {
    /// The DHT state of the namespace `config` describes, for the member `identity`.
    /// `seed` seeds the RNG that picks `auto` addresses and record nonces (seed it from
    /// the OS); `now` and `unix` are the same instant on the monotonic and the wall clock.
    pub fn new(
        config: Config,
        identity: Identity,
        seed: [u8; 32],
        now: Instant,
        unix: u64,
    ) -> Self {
        Self {
            settings: SettingsState::new(config.subnet.map(|subnet| Settings {
                // The record is the same at every member: the configured list's first.
                subnet: config.subnets.first().copied().unwrap_or(subnet),
                lease_secs: config.lease.as_secs(),
                reserved: config.reserved.clone(),
                routed: config.subnets.iter().skip(1).copied().collect(),
            })),
            routed: config
                .subnets
                .iter()
                .copied()
                .filter(|n| Some(*n) != config.subnet)
                .collect(),
            name: config.name,
            keys: config.keys,
            identity,
            rng: StdRng::from_seed(seed),
            clock: Clock { at: now, unix },
            endpoints: Vec::new(),
            claim_endpoints: Vec::new(),
            published_endpoints: Vec::new(),
            subnet: config.subnet,
            reserved: config.reserved,
            wanted: config.address,
            lease: config.lease,
            own: Own::new(config.previous),
            prefix6: config.prefix6,
            wanted6: config.address6,
            own6: address6::Own6::default(),
            hosted: BTreeMap::new(),
            hosted6: BTreeMap::new(),
            hosted_conflicts: 0,
            address_conflicts: 0,
            dhcp_tried: HashMap::new(),
            dhcp_clients: HashMap::new(),
            hostname: config.hostname,
            certified_name: None,
            names: BTreeMap::new(),
            macs: BTreeMap::new(),
            mac_conflicts: 0,
            name_error: None,
            name_conflicts: 0,
            reseal: HashSet::new(),
            resolver: Resolver::default(),
            group: Group::default(),
            member_names: HashMap::new(),
            started: false,
            left: false,
            next_token: 0,
            ops: HashMap::new(),
            requests: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// Namespace name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's keys.
    pub fn keys(&self) -> &NamespaceKeys {
        &self.keys
    }

    /// This member's subnet, once known (configured, or read from the record).
    pub fn subnet(&self) -> Option<Ipv4Net> {
        self.subnet
    }

    /// The namespace's other subnets (a multi-subnet namespace), routed in one hop.
    pub fn routed(&self) -> &[Ipv4Net] {
        &self.routed
    }

    /// The address lease time (the namespace record's, once read).
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The address this member holds as its own.
    pub fn owned(&self) -> Option<Ipv4Addr> {
        self.own.owned
    }

    /// Whether this member's own address comes from its host's DHCP client.
    pub fn host_uses_dhcp(&self) -> bool {
        self.wanted == Address::Dhcp
    }

    /// Whether the namespace was left: nothing is claimed or resolved any more.
    pub fn has_left(&self) -> bool {
        self.left
    }

    /// Who keeps the namespace record, once known (`None`: this member, or not read yet).
    pub fn settings_keeper(&self) -> Option<PeerId> {
        self.settings.keeper
    }

    /// LAN host addresses found owned by another member (router mode).
    pub fn hosted_conflicts(&self) -> u64 {
        self.hosted_conflicts
    }

    /// Times this member gave up its own address because another member held it too
    /// (partitions that merged): an `auto` member renumbered, a static one reports the
    /// conflict in [`Membership::address_error`].
    pub fn address_conflicts(&self) -> u64 {
        self.address_conflicts
    }

    /// The name of this member's own address (`hostname`, or `hyphae name set`).
    pub fn hostname(&self) -> Option<&str> {
        self.hostname.as_deref()
    }

    /// Why this member's own name is not held, if it is not.
    pub fn name_error(&self) -> Option<&str> {
        self.name_error.as_deref()
    }

    /// Name claims lost to another member (own names and DHCP clients').
    pub fn name_conflicts(&self) -> u64 {
        self.name_conflicts
    }

    /// Lookups started for addresses frames waited for.
    pub fn lookups(&self) -> u64 {
        self.resolver.lookups
    }

    /// Frames dropped because their address did not resolve in time.
    pub fn unresolved_drops(&self) -> u64 {
        self.resolver.unresolved_drops
    }

    /// Where members reach this agent's tunnels, sealed into the address records from
    /// the next claim on. A change once running (the host was renumbered, or moved)
    /// renews the records soon, so members that look us up find the new endpoints.
    pub fn set_endpoints(&mut self, now: Instant, endpoints: Vec<SocketAddr>) {
        if self.endpoints == endpoints {
            return;
        }
        tracing::info!(namespace = %self.name, ?endpoints, "our endpoints changed");
        self.endpoints = endpoints;
        self.renew_soon(now);
    }

    /// The endpoints our address record carries, as last granted by the replicas: where a
    /// member that looks our address up finds us.
    pub fn published_endpoints(&self) -> &[SocketAddr] {
        &self.published_endpoints
    }

    /// Every address this member holds a lease on: its own and (router mode, DHCP) its
    /// hosts'.
    pub fn addresses(&self) -> Vec<Ipv4Addr> {
        self.own
            .owned
            .into_iter()
            .chain(self.hosted.iter().filter(|(_, h)| h.owned).map(|(a, _)| *a))
            .collect()
    }

    /// Whether this member holds the lease on `address` (its own or a host's).
    pub fn holds(&self, address: Ipv4Addr) -> bool {
        self.own.owned == Some(address) || self.hosted.get(&address).is_some_and(|h| h.owned)
    }

    /// Whether this member holds the lease on `address`, IPv4 or IPv6 (its own or a
    /// host's).
    pub fn holds_ip(&self, address: IpAddr) -> bool {
        match address {
            IpAddr::V4(a) => self.holds(a),
            IpAddr::V6(a) => self.own6.owned == Some(a) || self.hosts6(a),
        }
    }

    /// Whether `address` is this member's own (not a LAN host's), IPv4 or IPv6.
    pub fn is_own(&self, address: IpAddr) -> bool {
        match address {
            IpAddr::V4(a) => self.own.owned == Some(a),
            IpAddr::V6(a) => self.own6.owned == Some(a),
        }
    }

    /// Whether `address` stays with this member whatever another router's LAN shows: its
    /// own, or a LAN host's IPv6 address held for a DHCPv6 lease while the host is quiet
    /// (a migration handoff is answered "present" at once).
    pub fn stays(&self, address: IpAddr) -> bool {
        self.is_own(address) || matches!(address, IpAddr::V6(a) if self.leased_quiet6(a))
    }

    /// The next DHT operation to start.
    pub fn poll_request(&mut self) -> Option<(Token, Request)> {
        self.requests.pop_front()
    }

    /// The next thing the driver must act on.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Membership::handle_timeout`] next has work: a claim, renewal, read or
    /// group refresh that is due, or frames whose wait ends.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.left {
            return None;
        }
        let mut due = [
            self.settings.next.filter(|_| !self.settings.busy),
            self.resolver.poll_timeout(),
            if self.settings.known {
                self.group.poll_timeout()
            } else {
                None
            },
        ]
        .into_iter()
        .flatten()
        .min();
        let mut earliest = |t: Option<Instant>| {
            if let Some(t) = t {
                due = Some(due.map_or(t, |d| d.min(t)));
            }
        };
        if self.started {
            earliest(self.macs_due());
            earliest(self.own6.due());
            earliest(self.hosted6_due());
        }
        if self.settings.known {
            earliest(self.own.next.filter(|_| self.own.claiming.is_none()));
            for h in self.hosted.values().filter(|h| h.claiming.is_none()) {
                earliest(h.next);
            }
            for n in self.names.values().filter(|n| n.claiming.is_none()) {
                earliest(n.next);
            }
        }
        due
    }

    /// Whether [`Membership::start`] was called (and it has not left).
    pub fn is_started(&self) -> bool {
        self.started && !self.left
    }

    /// Starts with the namespace record, then the first claim (call once the overlay has
    /// joined; again after a `hyphae join`).
    pub fn start(&mut self, now: Instant) {
        if self.left {
            return;
        }
        self.started = true;
        self.settings.start(now);
        let claims_own = !matches!(self.wanted, Address::None | Address::Dhcp);
        if self.own.claiming.is_none() && self.own.next.is_none() && claims_own {
            self.own.next = Some(now);
        }
        self.start6(now);
        self.group.start(now);
    }

    /// Renews soon: a new DHT peer may be a replica of our keys and must learn the leases
    /// before someone else asks it.
    pub fn renew_soon(&mut self, now: Instant) {
        // Before the overlay has joined, a new peer is no reason to claim: a lookup then
        // may find almost no replicas, and a claim they grant means nothing.
        if self.left || !self.started {
            return;
        }
        let soon = now + RENEW_SOON;
        let bring = |t: &mut Option<Instant>| *t = Some(t.map_or(soon, |t| t.min(soon)));
        self.settings.renew_soon(now, soon);
        if self.own.owned.is_some() {
            bring(&mut self.own.next);
        }
        for h in self.hosted.values_mut().filter(|h| h.owned) {
            bring(&mut h.next);
        }
        for n in self.names.values_mut().filter(|n| n.owned) {
            bring(&mut n.next);
        }
        self.renew_macs_by(soon);
        if self.own6.owned.is_some() {
            bring(&mut self.own6.next);
        }
        self.renew_hosted6_by(soon);
        self.group.renew_soon(soon);
    }

    /// Claims, renews and reads what is due; ends waits that are over. `unix` is the wall
    /// clock at `now` (records carry Unix expiry times).
    pub fn handle_timeout(&mut self, now: Instant, unix: u64) {
        self.clock = Clock { at: now, unix };
        self.resolver.expire(now);
        if self.left {
            return;
        }
        self.run_settings(now);
        if self.started {
            // A layer-2 namespace's MACs need no subnet.
            self.run_macs(now);
            // Nor does the IPv6 address: its prefix is this member's, not the record's.
            self.run_own6(now);
            self.run_hosted6(now);
        }
        if self.settings.known {
            self.run_hosted(now);
            self.run_names(now);
            self.run_group(now);
            self.run_own(now);
        }
    }

    /// A claim this membership asked for was decided.
    pub fn handle_claimed(&mut self, now: Instant, token: Token, result: &ClaimResult) {
        let Some(purpose) = self.ops.remove(&token) else {
            return;
        };
        match purpose {
            Purpose::SettingsClaim => self.settings_claimed(now, result),
            Purpose::Own(address) => self.own_claimed(now, address, result),
            Purpose::Own6 { address, name } => self.own6_claimed(now, address, name, result),
            Purpose::Hosted(address) => self.hosted_claimed(now, token, address, result),
            Purpose::Hosted6(address) => self.hosted6_claimed(now, token, address, result),
            Purpose::HandOff(IpAddr::V4(address)) => self.handed_off(now, token, address, result),
            Purpose::HandOff(IpAddr::V6(address)) => {
                self.handed_off6(now, token, address, result);
            }
            Purpose::Dhcp(claim) => self.dhcp_claimed(now, claim, result),
            Purpose::Name {
                name,
                sealed,
                sealed6,
            } => self.name_claimed(now, token, name, (sealed, sealed6), result),
            Purpose::Mac(mac) => self.mac_claimed(now, token, mac, result),
            Purpose::SettingsGet
            | Purpose::MacHolder(_)
            | Purpose::Resolve(_)
            | Purpose::ReadName(_)
            | Purpose::ReadHolder(_)
            | Purpose::ReadHolder6(_)
            | Purpose::Holder(_)
            | Purpose::GroupRead => {}
        }
    }

    /// A read this membership asked for finished: the envelopes the replicas returned.
    pub fn handle_got(&mut self, now: Instant, token: Token, envelopes: &[Envelope]) {
        match self.ops.remove(&token) {
            Some(Purpose::SettingsGet) => self.settings_got(now, envelopes),
            Some(Purpose::Resolve(target)) => self.resolved(now, target, envelopes),
            Some(Purpose::ReadName(host)) => self.name_read(now, host, envelopes),
            Some(Purpose::ReadHolder(address)) => self.holder_read(now, address, envelopes),
            Some(Purpose::ReadHolder6(address)) => self.holder6_read(now, address, envelopes),
            Some(Purpose::Holder(address)) => self.holder_found(now, address, envelopes),
            Some(Purpose::MacHolder(mac)) => self.mac_holder_found(now, mac, envelopes),
            _ => {}
        }
    }

    /// A group read this membership asked for finished.
    pub fn handle_members(&mut self, now: Instant, token: Token, envelopes: &[Envelope]) {
        if let Some(Purpose::GroupRead) = self.ops.remove(&token) {
            self.group_read(now, envelopes);
        }
    }

    /// Leaves the namespace: releases the addresses and names (and the namespace record,
    /// if this member keeps it) and stops claiming and resolving. Returns the releases
    /// started.
    pub fn leave(&mut self) -> usize {
        let mut released = self.release_held();
        self.names.clear();
        self.macs.clear();
        self.own = Own::new(None);
        self.own6 = address6::Own6::default();
        self.hosted.clear();
        self.hosted6.clear();
        self.dhcp_clients.clear();
        self.group = Group::default();
        if self.settings.known && self.settings.keeper.is_none() {
            self.request(Request::Release {
                key: self.keys.settings_key(),
            });
            released += 1;
        }
        self.settings = SettingsState::new(None);
        self.left = true;
        self.resolver.clear();
        self.ops.clear();
        released
    }

    /// Gives back every address and name this member holds (on the way out: others may
    /// take them now, not after the lease). Returns the releases started.
    pub fn release_held(&mut self) -> usize {
        let keys: Vec<RecordKey> = self
            .addresses()
            .into_iter()
            .map(|a| self.keys.address_key(a))
            .chain(
                self.names
                    .iter()
                    .filter(|(_, n)| n.owned)
                    .map(|(name, _)| self.keys.name_key(name)),
            )
            .chain(self.held_macs().map(|m| self.keys.mac_key(m)))
            .chain(
                self.addresses6()
                    .into_iter()
                    .map(|a| self.keys.address6_key(a)),
            )
            .collect();
        let released = keys.len();
        for key in keys {
            self.request(Request::Release { key });
        }
        released
    }

    /// Queues `request`; returns its token.
    fn request(&mut self, request: Request) -> Token {
        let token = Token(self.next_token);
        self.next_token += 1;
        self.requests.push_back((token, request));
        token
    }

    /// Queues an operation whose result comes back, routed to `purpose`.
    fn start_op(&mut self, request: Request, purpose: Purpose) -> Token {
        let token = self.request(request);
        self.ops.insert(token, purpose);
        token
    }

    /// Seals and signs `plaintext` for `key`, valid for one lease.
    fn seal_record(&mut self, key: &RecordKey, now: Instant, plaintext: &[u8]) -> Option<Envelope> {
        let expires = self.clock.unix(now) + self.lease.as_secs();
        Envelope::seal(
            &self.keys,
            &self.identity,
            key,
            expires,
            plaintext,
            &mut self.rng,
        )
        .map_err(|e| tracing::warn!(namespace = %self.name, error = %e, "cannot seal a record"))
        .ok()
    }

    /// A member record for `key`: where to reach this member, `name`, and the address the
    /// lease is on (none for a group entry).
    fn seal_member(
        &mut self,
        key: &RecordKey,
        now: Instant,
        name: Option<String>,
        address: Option<Ipv4Addr>,
    ) -> Option<Envelope> {
        let info = MemberInfo {
            endpoints: self.endpoints.clone(),
            name,
            subject: address.map(Subject::Address),
        };
        self.seal_record(key, now, &crate::records::encode(&info))
    }

    /// Opens the first envelope of `envelopes` that reads as a `T` for `key`: its owner
    /// and value.
    fn read_first<T: for<'de> serde::Deserialize<'de>>(
        &self,
        key: &RecordKey,
        now: Instant,
        envelopes: &[Envelope],
    ) -> Option<(PeerId, T)> {
        let unix = self.clock.unix(now);
        envelopes.iter().find_map(|e| {
            let (owner, value) = e.read::<T>(&self.keys, key, unix).ok()?;
            Some((PeerId::from_bytes(owner).ok()?, value))
        })
    }
}

/// A member named in a refusal, in words.
fn holder_name(holder: &crate::records::OwnerKey) -> String {
    PeerId::from_bytes(*holder)
        .map(|p| p.to_string())
        .unwrap_or_else(|_| "an unknown member".into())
}
