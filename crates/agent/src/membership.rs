//! One namespace's side of the DHT: the namespace record (its settings), claiming and
//! renewing this member's address, and resolving other members' addresses (with the frames
//! that wait for them).
//!
//! The namespace record holds the subnet, the lease time and the reserved addresses. It is a
//! lease like any other key, sealed and signed by the member that holds it: every member
//! that knows the settings claims it (one wins, the others read it), so it lives as long as
//! any member does. A member configured without a subnet reads it before claiming an
//! address; one configured with a different subnet stops with an error naming the keeper.
//!
//! The agent's loop calls these with the overlay's events; nothing here does I/O except
//! remembering the last address won in the state directory.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hyphae_dhcp_dns::dhcp::ClientId;
use hyphae_overlay::records::{encode, Envelope, MemberInfo, NameInfo};
use hyphae_overlay::swarm::{unix_now, ClaimResult, OpId, Overlay};
use hyphae_overlay::{Identity, NamespaceKeys, PeerId};
use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::config::{Address, Namespace};

/// Frames held per unresolved address; beyond, new ones are dropped.
pub const MAX_PENDING_FRAMES: usize = 16;

/// Unresolved addresses tracked at once per namespace.
pub const MAX_PENDING_TARGETS: usize = 256;

/// How long frames wait for a resolution (and for the member's tunnel) before being dropped.
pub const PENDING_TIMEOUT: Duration = Duration::from_secs(5);

/// After a lookup finds no owner, the address is not looked up again for this long.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(2);

/// A resolved address is looked up again after this long if still in use.
pub const RESOLVED_TTL: Duration = Duration::from_secs(60);

/// Retry delay after a claim that no replica answered.
const CLAIM_RETRY: Duration = Duration::from_secs(2);

/// Candidates an `auto` claim tries before pausing.
const MAX_AUTO_TRIES: usize = 64;

/// How often the broadcast group is read again (members that joined since).
pub const GROUP_REFRESH: Duration = Duration::from_secs(15);

/// Router mode: after a LAN host's address was found owned by another member, the claim is
/// tried again this much later.
const HOSTED_CONFLICT_RETRY: Duration = Duration::from_secs(30);

/// Router mode: the lease on one LAN host's address.
#[derive(Debug, Default)]
struct Hosted {
    owned: bool,
    claiming: Option<OpId>,
    next: Option<Instant>,
}

/// A name this member holds in the namespace zone (its own, or a DHCP client's): a lease on
/// the name's key, renewed with the address it stands for.
#[derive(Debug)]
struct NameLease {
    address: Ipv4Addr,
    owned: bool,
    /// The claim in flight, and the address it was sealed with.
    claiming: Option<(OpId, Ipv4Addr)>,
    next: Option<Instant>,
}

/// A namespace's settings, as its record holds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// The namespace subnet.
    pub subnet: Ipv4Net,
    /// Address lease time, seconds.
    pub lease_secs: u64,
    /// Addresses no member may claim.
    pub reserved: Vec<Ipv4Addr>,
}

impl Settings {
    /// Checks a record read from the DHT (it was sealed by a member, but may be nonsense).
    fn validate(&self) -> Result<(), String> {
        if self.subnet != self.subnet.trunc() || self.subnet.prefix_len() > 30 {
            return Err(format!("bad subnet {}", self.subnet));
        }
        if self.lease_secs < crate::config::MIN_LEASE_SECS || self.lease_secs > 24 * 3600 {
            return Err(format!("bad lease time {}", self.lease_secs));
        }
        if self.reserved.len() > 1024 {
            return Err("too many reserved addresses".into());
        }
        Ok(())
    }
}

/// The namespace record's state in one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SettingsOp {
    /// Claiming the record with our settings.
    Claim(OpId),
    /// Reading it.
    Get(OpId),
}

/// Frames waiting for an address to resolve.
pub struct Pending {
    /// The frames, oldest first.
    pub frames: Vec<Vec<u8>>,
    /// When the first one arrived.
    pub since: Instant,
}

/// What a decided claim means for the agent.
pub enum ClaimOutcome {
    /// Nothing to do (a renewal, or a retry was scheduled).
    Nothing,
    /// This member now owns `address`: configure it.
    Won(Ipv4Addr),
    /// A static address is another member's: the agent cannot start.
    Conflict(String),
    /// Router mode: the set of LAN host addresses this member owns changed.
    Hosted,
    /// A claim for a DHCP client ended: the address it won, or `None` (refused).
    Dhcp(ClientId, Option<Ipv4Addr>),
    /// A DHCP client's candidate address was taken: try another one for it.
    DhcpRetry(ClientId),
    /// A name claim ended: held, or held by another member (why, in words).
    Name(String, Result<(), String>),
}

/// A member that owns an address, as read from the DHT.
pub struct Resolved {
    /// The address.
    pub target: Ipv4Addr,
    /// Its owner.
    pub member: PeerId,
    /// Where to reach it.
    pub endpoints: Vec<SocketAddr>,
}

/// One namespace's DHT state.
pub struct Membership {
    /// Namespace name.
    pub name: String,
    /// Its keys.
    pub keys: NamespaceKeys,
    /// The namespace subnet, once known (configured, or read from the record).
    pub subnet: Option<Ipv4Net>,
    reserved: Vec<Ipv4Addr>,
    wanted: Address,
    lease: Duration,
    /// The settings this member puts in the namespace record.
    proposed: Option<Settings>,
    /// Whether the record was won or read: address claims wait for it.
    settings_known: bool,
    settings_op: Option<SettingsOp>,
    read_settings: bool,
    next_settings: Option<Instant>,
    /// Who keeps the namespace record (for status), once known.
    pub settings_keeper: Option<PeerId>,
    /// Set when the subnet was learned from the record: the agent configures it.
    pub subnet_learned: bool,
    /// Why this member cannot be part of the namespace (settings or address conflict).
    pub conflict: Option<String>,
    /// Left: claims nothing, resolves nothing.
    pub left: bool,
    /// The address this member holds a lease on.
    pub owned: Option<Ipv4Addr>,
    claiming: Option<(OpId, Ipv4Addr)>,
    /// The first claim of a static address decides whether the agent can run.
    confirmed: bool,
    tried: HashSet<Ipv4Addr>,
    next_claim: Option<Instant>,
    state_file: PathBuf,
    /// Frames waiting, by the address they need.
    pub pending: HashMap<Ipv4Addr, Pending>,
    resolving: HashMap<OpId, Ipv4Addr>,
    looked_up: HashMap<Ipv4Addr, Instant>,
    negative: HashMap<Ipv4Addr, Instant>,
    /// Frames dropped because their address did not resolve in time.
    pub unresolved_drops: u64,
    /// Lookups started.
    pub lookups: u64,
    /// Router mode: LAN hosts' addresses this member claims.
    hosted: BTreeMap<Ipv4Addr, Hosted>,
    /// LAN host addresses another member owns (router mode), counted for status.
    pub hosted_conflicts: u64,
    next_announce: Option<Instant>,
    next_group_read: Option<Instant>,
    group_read: Option<OpId>,
    /// Claims for DHCP clients: the client, the address, and whether only it will do.
    dhcp_claims: HashMap<OpId, (ClientId, Ipv4Addr, bool)>,
    /// Addresses already found taken, per DHCP client.
    dhcp_tried: HashMap<ClientId, HashSet<Ipv4Addr>>,
    /// The name of this member's own address (`hostname`, or `hyphae name set`).
    pub hostname: Option<String>,
    /// Names held or being claimed, by name.
    names: BTreeMap<String, NameLease>,
    /// Why this member's own name is not held, if it is not.
    pub name_error: Option<String>,
    /// Name claims lost to another member (own names and DHCP clients').
    pub name_conflicts: u64,
    /// Addresses whose record must be sealed again (a name was won while a claim that
    /// did not carry it was in flight).
    reseal: HashSet<Ipv4Addr>,
}

impl Membership {
    /// The DHT state of `ns`; `state_dir` keeps the last address won.
    pub fn new(ns: &Namespace, state_dir: &std::path::Path) -> Self {
        Self {
            name: ns.name.clone(),
            keys: NamespaceKeys::derive(&ns.name, &ns.secret),
            subnet: ns.subnet,
            reserved: ns.reserved.clone(),
            wanted: ns.address,
            lease: ns.lease,
            proposed: ns.subnet.map(|subnet| Settings {
                subnet,
                lease_secs: ns.lease.as_secs(),
                reserved: ns.reserved.clone(),
            }),
            settings_known: false,
            settings_op: None,
            read_settings: false,
            next_settings: None,
            settings_keeper: None,
            subnet_learned: false,
            conflict: None,
            left: false,
            owned: None,
            claiming: None,
            confirmed: false,
            tried: HashSet::new(),
            next_claim: None,
            state_file: state_dir.join(format!("{}.address", ns.name)),
            pending: HashMap::new(),
            resolving: HashMap::new(),
            looked_up: HashMap::new(),
            negative: HashMap::new(),
            unresolved_drops: 0,
            lookups: 0,
            hosted: BTreeMap::new(),
            hosted_conflicts: 0,
            next_announce: None,
            next_group_read: None,
            group_read: None,
            dhcp_claims: HashMap::new(),
            dhcp_tried: HashMap::new(),
            hostname: ns.hostname.clone(),
            names: BTreeMap::new(),
            name_error: None,
            name_conflicts: 0,
            reseal: HashSet::new(),
        }
    }

    /// The name held for `address`, if this member holds one.
    pub fn name_for(&self, address: Ipv4Addr) -> Option<&str> {
        self.names
            .iter()
            .find(|(_, n)| n.owned && n.address == address)
            .map(|(name, _)| name.as_str())
    }

    /// The address `name` stands for, if this member holds the name.
    pub fn address_for(&self, name: &str) -> Option<Ipv4Addr> {
        self.names.get(name).filter(|n| n.owned).map(|n| n.address)
    }

    /// Whether this member holds the lease on `address` (its own or a LAN host's).
    pub fn holds(&self, address: Ipv4Addr) -> bool {
        self.owned == Some(address) || self.hosted.get(&address).is_some_and(|h| h.owned)
    }

    /// Names this member holds, with their addresses (for status).
    pub fn held_names(&self) -> Vec<(String, Ipv4Addr)> {
        self.names
            .iter()
            .filter(|(_, n)| n.owned)
            .map(|(name, n)| (name.clone(), n.address))
            .collect()
    }

    /// Names this member's own address `hostname`. The name is claimed once the address
    /// is held, and replaces the address's other names only once it is won (a name
    /// another member holds leaves them as they were); the outcome comes back as
    /// [`ClaimOutcome::Name`].
    pub fn set_hostname(&mut self, hostname: Option<String>, now: Instant, overlay: &mut Overlay) {
        if let Some(old) = self.hostname.take() {
            // The old name goes if it is cleared or was never won; a won one stays until
            // its successor is won.
            if Some(&old) != hostname.as_ref()
                && (hostname.is_none() || self.address_for(&old).is_none())
            {
                self.unbind_name(&old, overlay);
            }
        }
        self.hostname = hostname;
        self.name_error = None;
        self.bind_own_name(now);
    }

    /// Claims the hostname for the own address, once both are known.
    fn bind_own_name(&mut self, now: Instant) {
        if let (Some(name), Some(address)) = (self.hostname.clone(), self.owned) {
            self.bind_name(name, address, now);
        }
    }

    /// The own hostname was won: the address's other names (an earlier hostname, the one
    /// the host's DHCP client sent) go, one name per address.
    fn drop_other_names(&mut self, name: &str, address: Ipv4Addr, overlay: &mut Overlay) {
        for other in self.names_of(address) {
            if other != name {
                self.unbind_name(&other, overlay);
            }
        }
    }

    /// A DHCP client at `address` calls itself `name` (option 12): hold the name for it,
    /// unless the address is this host's own and named by the config.
    pub fn name_client(
        &mut self,
        address: Ipv4Addr,
        name: String,
        now: Instant,
        overlay: &mut Overlay,
    ) {
        let own = self.owned == Some(address);
        if (own && self.hostname.is_some()) || !self.addresses().contains(&address) {
            return;
        }
        if self.names.get(&name).is_some_and(|n| n.address == address) {
            return;
        }
        if let Some(other) = self.names.get(&name) {
            tracing::warn!(namespace = %self.name, %name, %address, holder = %other.address,
                "a DHCP client asks for a name another address of this member holds; not given");
            self.name_conflicts += 1;
            return;
        }
        // One name per address: a client that renamed itself gives the old one back.
        self.unbind_address(address, overlay);
        self.bind_name(name, address, now);
    }

    fn bind_name(&mut self, name: String, address: Ipv4Addr, now: Instant) {
        let lease = self.names.entry(name).or_insert(NameLease {
            address,
            owned: false,
            claiming: None,
            next: Some(now),
        });
        if lease.address != address {
            // Our own address moved: the name follows it at the next claim.
            lease.address = address;
            lease.next = Some(now);
        }
    }

    fn unbind_name(&mut self, name: &str, overlay: &mut Overlay) {
        if let Some(lease) = self.names.remove(name) {
            if lease.owned {
                overlay.release(self.keys.name_key(name));
                tracing::info!(namespace = %self.name, %name, "name released");
            }
        }
    }

    /// The names (held or being claimed) that stand for `address`.
    fn names_of(&self, address: Ipv4Addr) -> Vec<String> {
        self.names
            .iter()
            .filter(|(_, n)| n.address == address)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Gives back every name that stands for `address` (its lease ended).
    fn unbind_address(&mut self, address: Ipv4Addr, overlay: &mut Overlay) {
        for name in self.names_of(address) {
            self.unbind_name(&name, overlay);
        }
    }

    /// Claims (and renews) the names that are due.
    fn run_names(&mut self, now: Instant, overlay: &mut Overlay, identity: &Identity) {
        let due: Vec<String> = self
            .names
            .iter()
            .filter(|(_, n)| n.claiming.is_none() && n.next.is_some_and(|t| now >= t))
            .map(|(name, _)| name.clone())
            .collect();
        for name in due {
            let Some(address) = self.names.get(&name).map(|n| n.address) else {
                continue;
            };
            let key = self.keys.name_key(&name);
            let op = self
                .seal_record(&key, identity, &encode(&NameInfo { address }))
                .map(|e| overlay.claim(key, e));
            if let Some(n) = self.names.get_mut(&name) {
                n.next = None;
                match op {
                    Some(op) => n.claiming = Some((op, address)),
                    None => n.next = Some(now + CLAIM_RETRY),
                }
            }
        }
    }

    /// A name claim was decided.
    fn name_claimed(
        &mut self,
        op: OpId,
        result: &ClaimResult,
        now: Instant,
        overlay: &mut Overlay,
    ) -> Option<ClaimOutcome> {
        let (name, lease) = self
            .names
            .iter_mut()
            .find(|(_, n)| n.claiming.is_some_and(|(o, _)| o == op))?;
        let sealed = lease.claiming.take().map(|(_, a)| a);
        let name = name.clone();
        let address = lease.address;
        let was = lease.owned;
        let own = self.hostname.as_deref() == Some(name.as_str());
        let outcome = match result {
            ClaimResult::Won => {
                lease.owned = true;
                // The address moved while the claim was out: claim again with the new one.
                lease.next = Some(if sealed == Some(address) {
                    now + self.lease / 3
                } else {
                    now
                });
                Ok(())
            }
            ClaimResult::Lost(Some(holder)) => {
                let holder = PeerId::from_bytes(*holder)
                    .map(|p| p.to_string())
                    .unwrap_or_else(|_| "an unknown member".into());
                lease.owned = false;
                lease.next = Some(now + HOSTED_CONFLICT_RETRY);
                Err(format!(
                    "namespace '{}': the name '{name}' is held by member {holder}; it keeps it until its lease lapses, so choose another name",
                    self.name
                ))
            }
            ClaimResult::Lost(None) => {
                // No replica answered: try again soon; nothing is decided.
                lease.next = Some(now + CLAIM_RETRY);
                return Some(ClaimOutcome::Nothing);
            }
        };
        match &outcome {
            Ok(()) if !was => {
                tracing::info!(namespace = %self.name, %name, %address, "name claimed");
                if own {
                    self.name_error = None;
                    self.drop_other_names(&name, address, overlay);
                }
                // The address record carries the name (its PTR): seal it again now, and
                // again after a claim already in flight (sealed without the name).
                self.reseal.insert(address);
                if self.owned == Some(address) {
                    self.next_claim = Some(now);
                } else if let Some(h) = self.hosted.get_mut(&address) {
                    h.next = Some(now);
                }
            }
            Ok(()) => {}
            Err(e) => {
                tracing::error!("{e}");
                self.name_conflicts += 1;
                if own {
                    self.name_error = Some(e.clone());
                }
            }
        }
        Some(ClaimOutcome::Name(name, outcome))
    }

    /// When the record of `address`, just won, is next claimed: at once if a name was won
    /// while that claim was out (its seal lacks it), else after a third of the lease.
    fn renewal(&self, address: Ipv4Addr, now: Instant) -> Instant {
        if self.reseal.contains(&address) {
            now
        } else {
            now + self.lease / 3
        }
    }

    /// The address lease time (the namespace record's, once read).
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Whether this member's own address comes from its host's DHCP client.
    pub fn host_uses_dhcp(&self) -> bool {
        self.wanted == Address::Dhcp
    }

    /// Claims an address in the DHT for a DHCP client: `hint` if usable, else (unless
    /// `exact`) a free one. Returns the outcome at once when there is nothing to claim.
    pub fn claim_for_dhcp(
        &mut self,
        client: ClientId,
        hint: Option<Ipv4Addr>,
        exact: bool,
        overlay: &mut Overlay,
        identity: &Identity,
        endpoints: &[SocketAddr],
    ) -> Option<ClaimOutcome> {
        if self.left || !self.settings_known {
            return Some(ClaimOutcome::Dhcp(client, None));
        }
        let tried = self.dhcp_tried.entry(client.clone()).or_default();
        let hint = hint.filter(|a| !tried.contains(a));
        let tried = tried.clone();
        let candidate = match hint.filter(|a| self.usable(*a)) {
            Some(a) => Some(a),
            None if exact => None,
            None if tried.len() >= MAX_AUTO_TRIES => None,
            None => self.random_free(&tried),
        };
        let Some(address) = candidate else {
            self.dhcp_tried.remove(&client);
            return Some(ClaimOutcome::Dhcp(client, None));
        };
        let Some(envelope) = self.seal_address(address, identity, endpoints) else {
            return Some(ClaimOutcome::Dhcp(client, None));
        };
        let op = overlay.claim(self.keys.address_key(address), envelope);
        self.dhcp_claims.insert(op, (client, address, exact));
        None
    }

    /// A DHCP lease ended (released, declined, expired): give its address back. Returns
    /// whether this member's addresses changed.
    pub fn release_dhcp(&mut self, address: Ipv4Addr, overlay: &mut Overlay) -> bool {
        if self.host_uses_dhcp() && self.owned == Some(address) {
            self.unbind_address(address, overlay);
            self.owned = None;
            self.next_claim = None;
            overlay.release(self.keys.address_key(address));
            tracing::info!(namespace = %self.name, %address, "DHCP lease ended; address released");
            return true;
        }
        self.remove_hosted(address, overlay)
    }

    /// A random usable address not in `tried`.
    fn random_free(&self, tried: &HashSet<Ipv4Addr>) -> Option<Ipv4Addr> {
        let subnet = self.subnet?;
        let hosts = (1u64 << (32 - subnet.prefix_len())).saturating_sub(2);
        let base = u32::from(subnet.network());
        for _ in 0..1000 {
            let mut r = [0u8; 8];
            getrandom::getrandom(&mut r).ok()?;
            let index = 1 + u64::from_le_bytes(r) % hosts.max(1);
            let a = Ipv4Addr::from(base + index as u32);
            if self.usable(a) && !tried.contains(&a) {
                return Some(a);
            }
        }
        None
    }

    /// Every address this member holds a lease on: its own and (router mode) its LAN
    /// hosts'.
    pub fn addresses(&self) -> Vec<Ipv4Addr> {
        self.owned
            .into_iter()
            .chain(self.hosted.iter().filter(|(_, h)| h.owned).map(|(a, _)| *a))
            .collect()
    }

    /// Router mode: `address` appeared on the LAN; claim it for this member.
    pub fn add_hosted(&mut self, address: Ipv4Addr, now: Instant) {
        if self.left || self.hosted.contains_key(&address) {
            return;
        }
        if !self.usable(address) {
            tracing::warn!(namespace = %self.name, %address,
                "a LAN host uses an address that is not a usable namespace address; not claimed");
            return;
        }
        tracing::info!(namespace = %self.name, %address, "LAN host found; claiming its address");
        self.hosted.insert(
            address,
            Hosted {
                next: Some(now),
                ..Hosted::default()
            },
        );
    }

    /// Router mode: the LAN host at `address` went away; give its address back. Returns
    /// whether this member's addresses changed.
    pub fn remove_hosted(&mut self, address: Ipv4Addr, overlay: &mut Overlay) -> bool {
        let Some(h) = self.hosted.remove(&address) else {
            return false;
        };
        tracing::info!(namespace = %self.name, %address, "LAN host gone; releasing its address");
        self.unbind_address(address, overlay);
        if h.owned {
            overlay.release(self.keys.address_key(address));
        }
        h.owned
    }

    /// Claims (and renews) the LAN hosts' addresses that are due.
    fn run_hosted(
        &mut self,
        now: Instant,
        overlay: &mut Overlay,
        identity: &Identity,
        endpoints: &[SocketAddr],
    ) {
        let due: Vec<Ipv4Addr> = self
            .hosted
            .iter()
            .filter(|(_, h)| h.claiming.is_none() && h.next.is_some_and(|t| now >= t))
            .map(|(a, _)| *a)
            .collect();
        for address in due {
            let op = self
                .seal_address(address, identity, endpoints)
                .map(|e| overlay.claim(self.keys.address_key(address), e));
            if let Some(h) = self.hosted.get_mut(&address) {
                h.next = None;
                match op {
                    Some(op) => h.claiming = Some(op),
                    None => h.next = Some(now + CLAIM_RETRY),
                }
            }
        }
    }

    /// An address record: where to reach this member (and the name held for the address),
    /// until the lease ends.
    fn seal_address(
        &mut self,
        address: Ipv4Addr,
        identity: &Identity,
        endpoints: &[SocketAddr],
    ) -> Option<Envelope> {
        // This seal carries the current name.
        self.reseal.remove(&address);
        let name = self.name_for(address).map(str::to_string);
        self.seal(&self.keys.address_key(address), identity, endpoints, name)
    }

    fn seal(
        &self,
        key: &hyphae_overlay::records::RecordKey,
        identity: &Identity,
        endpoints: &[SocketAddr],
        name: Option<String>,
    ) -> Option<Envelope> {
        let info = MemberInfo {
            endpoints: endpoints.to_vec(),
            name,
        };
        self.seal_record(key, identity, &encode(&info))
    }

    /// Seals and signs `plaintext` for `key`, valid for one lease.
    fn seal_record(
        &self,
        key: &hyphae_overlay::records::RecordKey,
        identity: &Identity,
        plaintext: &[u8],
    ) -> Option<Envelope> {
        let expires = unix_now() + self.lease.as_secs();
        Envelope::seal(&self.keys, identity, key, expires, plaintext)
            .map_err(|e| tracing::warn!(namespace = %self.name, error = %e, "cannot seal a record"))
            .ok()
    }

    /// Announces this member in the namespace's broadcast group, and reads the group, when
    /// due.
    fn run_group(
        &mut self,
        now: Instant,
        overlay: &mut Overlay,
        identity: &Identity,
        endpoints: &[SocketAddr],
    ) {
        if self.next_announce.is_some_and(|t| now >= t) {
            let key = self.keys.group_key();
            self.next_announce = Some(now + self.lease / 3);
            if let Some(e) = self.seal(&key, identity, endpoints, None) {
                overlay.announce(key, e);
            }
        }
        if self.group_read.is_none() && self.next_group_read.is_some_and(|t| now >= t) {
            self.next_group_read = None;
            self.group_read = Some(overlay.members(self.keys.group_key()));
        }
    }

    /// Reads the group again soon (a broadcast is waiting for members to send it to).
    pub fn refresh_group_soon(&mut self, now: Instant) {
        if self.group_read.is_none() && !self.left {
            let soon = now + Duration::from_secs(1);
            self.next_group_read = Some(self.next_group_read.map_or(soon, |t| t.min(soon)));
        }
    }

    /// A group read finished; `None` if it was not this namespace's. Returns the members
    /// (other than `me`) and where to reach them.
    pub fn group_members(
        &mut self,
        op: OpId,
        envelopes: &[Envelope],
        me: PeerId,
        now: Instant,
    ) -> Option<Vec<(PeerId, SocketAddr)>> {
        if self.group_read != Some(op) {
            return None;
        }
        self.group_read = None;
        self.next_group_read = Some(now + GROUP_REFRESH);
        let key = self.keys.group_key();
        Some(
            envelopes
                .iter()
                .filter_map(|e| {
                    let (owner, info) = e.read::<MemberInfo>(&self.keys, &key, unix_now()).ok()?;
                    let member = PeerId::from_bytes(owner).ok()?;
                    Some((member, *info.endpoints.first()?))
                })
                .filter(|(m, _)| *m != me)
                .collect(),
        )
    }

    /// Starts with the namespace record, then the first claim (once the overlay has joined).
    pub fn start(&mut self, now: Instant) {
        if self.left {
            return;
        }
        if self.settings_op.is_none() && self.next_settings.is_none() {
            self.next_settings = Some(now);
        }
        let claims_own = !matches!(self.wanted, Address::None | Address::Dhcp);
        if self.claiming.is_none() && self.next_claim.is_none() && claims_own {
            self.next_claim = Some(now);
        }
        if self.next_announce.is_none() {
            self.next_announce = Some(now);
            self.next_group_read = Some(now + Duration::from_secs(1));
        }
    }

    /// Renews soon: a new peer may be a replica of our address's key and must learn the
    /// lease before someone else asks it.
    pub fn renew_soon(&mut self, now: Instant) {
        // A new peer may also be the first that holds the namespace record.
        if !self.left && !self.settings_known && self.settings_op.is_none() {
            self.next_settings = Some(now);
        }
        let soon = now + Duration::from_millis(300);
        // The keeper of the namespace record renews it too, for the same reason.
        if self.settings_known && self.settings_keeper.is_none() && self.settings_op.is_none() {
            self.next_settings = Some(self.next_settings.map_or(soon, |t| t.min(soon)));
        }
        if self.owned.is_some() {
            self.next_claim = Some(self.next_claim.map_or(soon, |t| t.min(soon)));
        }
        for h in self.hosted.values_mut().filter(|h| h.owned) {
            h.next = Some(h.next.map_or(soon, |t| t.min(soon)));
        }
        for n in self.names.values_mut().filter(|n| n.owned) {
            n.next = Some(n.next.map_or(soon, |t| t.min(soon)));
        }
        if self.next_announce.is_some() {
            self.next_announce = Some(self.next_announce.map_or(soon, |t| t.min(soon)));
        }
    }

    /// Claims or renews when due (the driver expires held frames with
    /// [`Membership::expire_pending`]).
    pub fn handle_timeout(
        &mut self,
        now: Instant,
        overlay: &mut Overlay,
        identity: &Identity,
        endpoints: &[SocketAddr],
    ) {
        if self.left {
            return;
        }
        self.run_settings(now, overlay, identity);
        if self.settings_known {
            self.run_hosted(now, overlay, identity, endpoints);
            self.run_names(now, overlay, identity);
            self.run_group(now, overlay, identity, endpoints);
        }
        if !self.settings_known
            || self.claiming.is_some()
            || self.next_claim.is_none_or(|t| now < t)
        {
            return;
        }
        if self.owned.is_none() && matches!(self.wanted, Address::None | Address::Dhcp) {
            // Nothing of its own to claim: a DHCP address is claimed when the host asks.
            self.next_claim = None;
            return;
        }
        let Some(candidate) = self.owned.or_else(|| self.candidate()) else {
            tracing::warn!(namespace = %self.name, "no free address found; retrying in 10 s");
            self.tried.clear();
            self.next_claim = Some(now + Duration::from_secs(10));
            return;
        };
        match self.seal_address(candidate, identity, endpoints) {
            Some(envelope) => {
                let op = overlay.claim(self.keys.address_key(candidate), envelope);
                self.claiming = Some((op, candidate));
                self.next_claim = None;
            }
            None => self.next_claim = Some(now + CLAIM_RETRY),
        }
    }

    /// Claims (or reads) the namespace record when due.
    fn run_settings(&mut self, now: Instant, overlay: &mut Overlay, identity: &Identity) {
        if self.settings_op.is_some() || self.next_settings.is_none_or(|t| now < t) {
            return;
        }
        self.next_settings = None;
        let key = self.keys.settings_key();
        let proposed = self.proposed.as_ref().filter(|_| !self.read_settings);
        let Some(settings) = proposed else {
            self.read_settings = false;
            self.settings_op = Some(SettingsOp::Get(overlay.get(key)));
            return;
        };
        match self.seal_record(&key, identity, &encode(settings)) {
            Some(envelope) => {
                self.settings_op = Some(SettingsOp::Claim(overlay.claim(key, envelope)));
            }
            None => self.next_settings = Some(now + CLAIM_RETRY),
        }
    }

    /// The namespace record's settings are the namespace's: adopt them (or refuse them, the
    /// first time, if they contradict this member's configuration).
    fn adopt(&mut self, settings: Settings, keeper: PeerId) {
        if !self.settings_known {
            if let Some(mine) = &self.proposed {
                if mine.subnet != settings.subnet {
                    self.conflict = Some(format!(
                        "namespace '{}': its subnet is {} (namespace record kept by member {keeper}), but this config says {}; fix `subnet` or remove it",
                        self.name, settings.subnet, mine.subnet
                    ));
                    return;
                }
            }
            if let Address::Static(a) = self.wanted {
                if let Err(e) = crate::config::check_in_subnet(a, settings.subnet) {
                    self.conflict = Some(format!("namespace '{}': {e:#}", self.name));
                    return;
                }
                if settings.reserved.contains(&a) {
                    self.conflict = Some(format!(
                        "namespace '{}': address {a} is reserved in this namespace",
                        self.name
                    ));
                    return;
                }
            }
            tracing::info!(namespace = %self.name, subnet = %settings.subnet,
                lease_secs = settings.lease_secs, %keeper, "namespace record read");
        } else if self.subnet != Some(settings.subnet) {
            tracing::error!(namespace = %self.name, subnet = %settings.subnet, %keeper,
                "the namespace record changed its subnet; keeping ours");
            return;
        }
        if self.subnet.is_none() {
            self.subnet_learned = true;
        }
        self.subnet = Some(settings.subnet);
        self.lease = Duration::from_secs(settings.lease_secs);
        self.reserved = settings.reserved.clone();
        self.settings_keeper = Some(keeper);
        self.settings_known = true;
        // Members that learned the settings keep the record alive too.
        self.proposed = Some(settings);
    }

    fn candidate(&mut self) -> Option<Ipv4Addr> {
        if let Address::Static(a) = self.wanted {
            return Some(a);
        }
        if self.tried.len() >= MAX_AUTO_TRIES {
            return None;
        }
        let previous = std::fs::read_to_string(&self.state_file)
            .ok()
            .and_then(|t| t.trim().parse::<Ipv4Addr>().ok())
            .filter(|a| self.usable(*a) && !self.tried.contains(a));
        if previous.is_some() {
            return previous;
        }
        self.random_free(&self.tried)
    }

    /// Whether `auto`, a DHCP client or a LAN host may take `a`: in the subnet, not its
    /// network, broadcast or service address (where the virtual DHCP/DNS server answers),
    /// and not reserved. A static address is the operator's choice and only checked
    /// against the subnet and the reserved list.
    fn usable(&self, a: Ipv4Addr) -> bool {
        self.subnet.is_some_and(|s| {
            s.contains(&a)
                && a != s.network()
                && a != s.broadcast()
                && a != hyphae_vswitch::service_address(s)
                && !self.reserved.contains(&a)
        })
    }

    /// A claim was decided; `None` if it was not this namespace's.
    pub fn claimed(
        &mut self,
        op: OpId,
        result: &ClaimResult,
        now: Instant,
        overlay: &mut Overlay,
    ) -> Option<ClaimOutcome> {
        if self.settings_op == Some(SettingsOp::Claim(op)) {
            self.settings_op = None;
            match result {
                ClaimResult::Won => {
                    if !self.settings_known {
                        if let Some(settings) = self.proposed.clone() {
                            tracing::info!(namespace = %self.name, subnet = %settings.subnet,
                                "namespace record created");
                        }
                    }
                    self.settings_known = true;
                    self.settings_keeper = None;
                    self.next_settings = Some(now + self.lease / 3);
                }
                // Another member keeps it: read what it says.
                ClaimResult::Lost(Some(_)) => {
                    self.read_settings = true;
                    self.next_settings = Some(now);
                }
                ClaimResult::Lost(None) => self.next_settings = Some(now + CLAIM_RETRY),
            }
            return Some(ClaimOutcome::Nothing);
        }
        if let Some(outcome) = self.name_claimed(op, result, now, overlay) {
            return Some(outcome);
        }
        if let Some((client, address, exact)) = self.dhcp_claims.remove(&op) {
            return Some(match result {
                ClaimResult::Won => {
                    self.dhcp_tried.remove(&client);
                    if self.host_uses_dhcp() {
                        self.owned = Some(address);
                        self.confirmed = true;
                        self.next_claim = Some(self.renewal(address, now));
                        self.bind_own_name(now);
                    } else {
                        self.hosted.insert(
                            address,
                            Hosted {
                                owned: true,
                                claiming: None,
                                next: Some(self.renewal(address, now)),
                            },
                        );
                    }
                    tracing::info!(namespace = %self.name, %address, "address claimed for a DHCP client");
                    ClaimOutcome::Dhcp(client, Some(address))
                }
                ClaimResult::Lost(_) if exact => {
                    self.dhcp_tried.remove(&client);
                    ClaimOutcome::Dhcp(client, None)
                }
                ClaimResult::Lost(_) => {
                    self.dhcp_tried
                        .entry(client.clone())
                        .or_default()
                        .insert(address);
                    ClaimOutcome::DhcpRetry(client)
                }
            });
        }
        let hosted = self
            .hosted
            .iter()
            .find(|(_, h)| h.claiming == Some(op))
            .map(|(a, _)| *a);
        if let Some(address) = hosted {
            let renew_at = self.renewal(address, now);
            let h = self.hosted.get_mut(&address)?;
            h.claiming = None;
            let was = h.owned;
            match result {
                ClaimResult::Won => {
                    h.owned = true;
                    h.next = Some(renew_at);
                    if !was {
                        tracing::info!(namespace = %self.name, %address, "LAN host's address claimed");
                    }
                }
                ClaimResult::Lost(Some(holder)) => {
                    let holder = PeerId::from_bytes(*holder)
                        .map(|p| p.to_string())
                        .unwrap_or_else(|_| "an unknown member".into());
                    tracing::error!(namespace = %self.name, %address, %holder,
                        "a LAN host uses an address another member owns; it is not reachable through the overlay");
                    self.hosted_conflicts += 1;
                    h.owned = false;
                    h.next = Some(now + HOSTED_CONFLICT_RETRY);
                }
                ClaimResult::Lost(None) => h.next = Some(now + CLAIM_RETRY),
            }
            let changed = was != h.owned;
            if was && !h.owned {
                // Its names stood for an address that is someone else's now.
                self.unbind_address(address, overlay);
            }
            return Some(if changed {
                ClaimOutcome::Hosted
            } else {
                ClaimOutcome::Nothing
            });
        }
        let (mine, address) = self.claiming?;
        if mine != op {
            return None;
        }
        self.claiming = None;
        Some(match result {
            ClaimResult::Won => {
                self.next_claim = Some(self.renewal(address, now));
                self.confirmed = true;
                if self.owned == Some(address) {
                    return Some(ClaimOutcome::Nothing);
                }
                self.owned = Some(address);
                self.bind_own_name(now);
                let _ = std::fs::write(&self.state_file, format!("{address}\n"));
                tracing::info!(namespace = %self.name, %address, "address claimed");
                ClaimOutcome::Won(address)
            }
            ClaimResult::Lost(Some(holder)) => {
                let holder = PeerId::from_bytes(*holder)
                    .map(|p| p.to_string())
                    .unwrap_or_else(|_| "an unknown member".into());
                match self.wanted {
                    Address::Static(a) if !self.confirmed => {
                        return Some(ClaimOutcome::Conflict(format!(
                            "namespace '{}': address {a} is owned by member {holder}; choose another address or use address = \"auto\"",
                            self.name
                        )));
                    }
                    Address::Static(a) => {
                        tracing::error!(namespace = %self.name, address = %a, %holder,
                            "another member took our address; retrying");
                        self.next_claim = Some(now + CLAIM_RETRY);
                    }
                    Address::Auto | Address::None | Address::Dhcp => {
                        tracing::debug!(namespace = %self.name, %address, %holder, "address taken");
                        if self.owned == Some(address) {
                            tracing::error!(namespace = %self.name, %address, %holder,
                                "lost our address to another member; claiming a new one");
                            self.owned = None;
                            // Its names go (the hostname comes back with the next address).
                            self.unbind_address(address, overlay);
                        }
                        self.tried.insert(address);
                        self.next_claim = Some(now);
                    }
                }
                ClaimOutcome::Nothing
            }
            ClaimResult::Lost(None) => {
                tracing::debug!(namespace = %self.name, %address, "claim unanswered; retrying");
                self.next_claim = Some(now + CLAIM_RETRY);
                ClaimOutcome::Nothing
            }
        })
    }

    /// Holds `frame` until `target` resolves; starts the lookup if none is running.
    /// Returns false (and counts a drop) when it cannot wait.
    pub fn hold(
        &mut self,
        now: Instant,
        target: Ipv4Addr,
        frame: &[u8],
        overlay: &mut Overlay,
    ) -> bool {
        if self.left || self.negative.get(&target).is_some_and(|&t| now < t) {
            self.unresolved_drops += 1;
            return false;
        }
        if !self.pending.contains_key(&target) && self.pending.len() >= MAX_PENDING_TARGETS {
            self.unresolved_drops += 1;
            return false;
        }
        let pending = self.pending.entry(target).or_insert_with(|| Pending {
            frames: Vec::new(),
            since: now,
        });
        if pending.frames.len() >= MAX_PENDING_FRAMES {
            self.unresolved_drops += 1;
            return false;
        }
        pending.frames.push(frame.to_vec());
        let recent = self
            .looked_up
            .get(&target)
            .is_some_and(|&t| now.saturating_duration_since(t) < RESOLVED_TTL);
        if !self.resolving.values().any(|t| *t == target) && !recent {
            self.lookups += 1;
            let op = overlay.get(self.keys.address_key(target));
            self.resolving.insert(op, target);
        }
        true
    }

    /// A read finished; `None` if it was not this namespace's. Returns the owner found.
    pub fn got(
        &mut self,
        op: OpId,
        envelopes: &[Envelope],
        me: PeerId,
        now: Instant,
    ) -> Option<Option<Resolved>> {
        if self.settings_op == Some(SettingsOp::Get(op)) {
            self.settings_op = None;
            let key = self.keys.settings_key();
            let found = envelopes.iter().find_map(|e| {
                let (owner, settings) = e.read::<Settings>(&self.keys, &key, unix_now()).ok()?;
                settings.validate().ok()?;
                Some((settings, PeerId::from_bytes(owner).ok()?))
            });
            match found {
                Some((settings, keeper)) => {
                    self.adopt(settings, keeper);
                    self.next_settings = Some(now + self.lease / 3);
                }
                None => {
                    if self.proposed.is_none() {
                        tracing::info!(namespace = %self.name,
                            "no namespace record yet (no member with a `subnet` reachable); retrying");
                    }
                    self.next_settings = Some(now + CLAIM_RETRY);
                }
            }
            return Some(None);
        }
        let target = self.resolving.remove(&op)?;
        let key = self.keys.address_key(target);
        let found = envelopes.iter().find_map(|e| {
            let (owner, info) = e.read::<MemberInfo>(&self.keys, &key, unix_now()).ok()?;
            let member = PeerId::from_bytes(owner).ok()?;
            Some(Resolved {
                target,
                member,
                endpoints: info.endpoints,
            })
        });
        let found = found.filter(|r| r.member != me && !r.endpoints.is_empty());
        if found.is_some() {
            self.looked_up.insert(target, now);
        } else {
            tracing::debug!(namespace = %self.name, %target, "no member owns this address");
            self.negative.insert(target, now + NEGATIVE_TTL);
            if let Some(p) = self.pending.remove(&target) {
                self.unresolved_drops += p.frames.len() as u64;
            }
        }
        Some(found)
    }

    /// Leaves the namespace: releases the address (and the namespace record, if this
    /// member keeps it) and stops claiming and resolving. Returns the releases started.
    pub fn leave(&mut self, overlay: &mut Overlay) -> usize {
        let mut released = 0;
        for a in self.addresses() {
            overlay.release(self.keys.address_key(a));
            released += 1;
        }
        for (name, _) in self.held_names() {
            overlay.release(self.keys.name_key(&name));
            released += 1;
        }
        self.names.clear();
        self.owned = None;
        self.hosted.clear();
        self.next_announce = None;
        self.next_group_read = None;
        self.group_read = None;
        if self.settings_known && self.settings_keeper.is_none() {
            overlay.release(self.keys.settings_key());
            released += 1;
        }
        self.left = true;
        self.claiming = None;
        self.next_claim = None;
        self.settings_op = None;
        self.next_settings = None;
        self.pending.clear();
        self.resolving.clear();
        released
    }

    /// Frames whose wait is over.
    pub fn expire_pending(&mut self, now: Instant) {
        let mut dropped = 0;
        self.pending.retain(|_, p| {
            let keep = now.saturating_duration_since(p.since) < PENDING_TIMEOUT;
            if !keep {
                dropped += p.frames.len() as u64;
            }
            keep
        });
        self.unresolved_drops += dropped;
        self.negative.retain(|_, t| now < *t);
        self.looked_up
            .retain(|_, t| now.saturating_duration_since(*t) < RESOLVED_TTL);
    }

    /// `addresses` lost their member: look them up afresh on the next packet.
    pub fn forget(&mut self, addresses: &[Ipv4Addr]) {
        for a in addresses {
            self.looked_up.remove(a);
        }
    }

    /// Forget that `addresses` were looked up (a member announced them: its tunnel is the
    /// route now), and hand back the frames that waited for them.
    pub fn take_pending(&mut self, addresses: &[Ipv4Addr]) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        for a in addresses {
            if let Some(p) = self.pending.remove(a) {
                frames.extend(p.frames);
            }
        }
        frames
    }
}
