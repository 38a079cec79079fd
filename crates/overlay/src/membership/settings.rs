//! The namespace record: the subnet, lease time and reserved addresses every member
//! shares, claimed by whoever knows them and read by the others.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use super::{Address, Event, Membership, Purpose, Request, CLAIM_RETRY};
use crate::records::{encode, Envelope};
use crate::swarm::ClaimResult;
use crate::PeerId;

/// The shortest lease a namespace may have: renewals come every third of it, and a
/// replica must hear one before the lease lapses.
pub const MIN_LEASE_SECS: u64 = 6;

/// The longest lease a namespace record may carry (a replica keeps nothing longer).
pub const MAX_LEASE_SECS: u64 = 24 * 3600;

/// Reserved addresses a record may list.
const MAX_RESERVED: usize = 1024;

/// A namespace's settings, as its record holds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// The namespace subnet.
    pub subnet: Ipv4Net,
    /// Address lease time, seconds.
    pub lease_secs: u64,
    /// Addresses no member may claim.
    pub reserved: Vec<Ipv4Addr>,
    /// The namespace's further subnets (a multi-subnet namespace, routed in one hop at
    /// each sender): every member and LAN host is in `subnet` or one of these.
    pub routed: Vec<Ipv4Net>,
}

impl Settings {
    /// Checks a record read from the DHT (it was sealed by a member, but may be nonsense).
    fn validate(&self) -> Result<(), String> {
        if self.subnet != self.subnet.trunc() || self.subnet.prefix_len() > 30 {
            return Err(format!("bad subnet {}", self.subnet));
        }
        if !(MIN_LEASE_SECS..=MAX_LEASE_SECS).contains(&self.lease_secs) {
            return Err(format!("bad lease time {}", self.lease_secs));
        }
        if self.reserved.len() > MAX_RESERVED {
            return Err("too many reserved addresses".into());
        }
        check_subnets(&self.subnets())
    }

    /// Every subnet of the namespace, `subnet` first.
    pub fn subnets(&self) -> Vec<Ipv4Net> {
        std::iter::once(self.subnet)
            .chain(self.routed.iter().copied())
            .collect()
    }
}

/// The most subnets one namespace may have.
pub const MAX_SUBNETS: usize = 64;

/// Whether `subnets` can be one namespace's: each an IPv4 network of /30 or larger, at
/// most [`MAX_SUBNETS`], none overlapping another. Says why not, in words.
pub fn check_subnets(subnets: &[Ipv4Net]) -> Result<(), String> {
    if subnets.len() > MAX_SUBNETS {
        return Err(format!(
            "{} subnets; a namespace may have at most {MAX_SUBNETS}",
            subnets.len()
        ));
    }
    for (i, a) in subnets.iter().enumerate() {
        if *a != a.trunc() || a.prefix_len() > 30 {
            return Err(format!("bad subnet {a}"));
        }
        if let Some(b) = subnets[..i]
            .iter()
            .find(|b| b.contains(&a.network()) || a.contains(&b.network()))
        {
            return Err(format!("subnets {b} and {a} overlap"));
        }
    }
    Ok(())
}

/// Whether `address` can be a member's address in `subnet`: inside it, and not its
/// network, broadcast or service address. Says why not, in words.
pub fn check_address(address: Ipv4Addr, subnet: Ipv4Net) -> Result<(), String> {
    if !subnet.contains(&address) {
        return Err(format!("address {address} is outside the subnet {subnet}"));
    }
    if address == subnet.network() || address == subnet.broadcast() {
        return Err(format!(
            "address {address} is the network or broadcast address of {subnet}"
        ));
    }
    if address == hyphae_vswitch::service_address(subnet) {
        return Err(format!(
            "address {address} is the namespace's service address (its virtual DHCP and DNS server answer there); choose another"
        ));
    }
    Ok(())
}

/// The namespace record's state in one member.
#[derive(Debug)]
pub(super) struct SettingsState {
    /// The settings this member puts in the record (configured, or learned).
    proposed: Option<Settings>,
    /// Whether the record was won or read: address claims wait for it.
    pub(super) known: bool,
    /// A claim or read in flight.
    pub(super) busy: bool,
    /// The last read found no record: claim this member's proposal next. A member reads
    /// before it claims, so a newcomer whose lookup found only some of the replicas never
    /// takes over a record the others keep (their answer to the read names it).
    claim_next: bool,
    pub(super) next: Option<Instant>,
    /// Who keeps the record, once known; `None` while this member keeps it.
    pub(super) keeper: Option<PeerId>,
}

impl SettingsState {
    pub(super) fn new(proposed: Option<Settings>) -> Self {
        Self {
            proposed,
            known: false,
            busy: false,
            claim_next: false,
            next: None,
            keeper: None,
        }
    }

    pub(super) fn start(&mut self, now: Instant) {
        if !self.busy && self.next.is_none() {
            self.next = Some(now);
        }
    }

    pub(super) fn renew_soon(&mut self, now: Instant, soon: Instant) {
        // A new peer may be the first that holds the record.
        if !self.known && !self.busy {
            self.next = Some(now);
        }
        // The keeper renews it too: the new peer may be one of its replicas.
        if self.known && self.keeper.is_none() && !self.busy {
            self.next = Some(self.next.map_or(soon, |t| t.min(soon)));
        }
    }
}

impl Membership {
    /// Claims (or reads) the namespace record when due.
    pub(super) fn run_settings(&mut self, now: Instant) {
        if self.settings.busy || self.settings.next.is_none_or(|t| now < t) {
            return;
        }
        self.settings.next = None;
        let key = self.keys.settings_key();
        // The keeper renews; anyone else claims only after a read found no record.
        let keeper = self.settings.known && self.settings.keeper.is_none();
        let claim = keeper || std::mem::take(&mut self.settings.claim_next);
        let proposed = self.settings.proposed.clone().filter(|_| claim);
        let Some(settings) = proposed else {
            self.settings.busy = true;
            self.start_op(Request::Get { key }, Purpose::SettingsGet);
            return;
        };
        match self.seal_record(&key, now, &encode(&settings)) {
            Some(envelope) => {
                self.settings.busy = true;
                let request = Request::Claim {
                    key,
                    envelope,
                    renewal: keeper,
                };
                self.start_op(request, Purpose::SettingsClaim);
            }
            None => self.settings.next = Some(now + CLAIM_RETRY),
        }
    }

    pub(super) fn settings_claimed(&mut self, now: Instant, result: &ClaimResult) {
        self.settings.busy = false;
        match result {
            ClaimResult::Won => {
                if !self.settings.known {
                    if let Some(settings) = &self.settings.proposed {
                        tracing::info!(namespace = %self.name, subnet = %settings.subnet,
                            "namespace record created");
                    }
                }
                self.settings.known = true;
                self.settings.keeper = None;
                self.settings.next = Some(now + self.lease / 3);
            }
            // Another member keeps it (also when partitions merged and the merge rule gave
            // it the record): read what it says.
            ClaimResult::Lost(Some(holder)) => {
                if self.settings.known {
                    // Not the keeper any more: the next turn reads instead of claiming.
                    self.settings.keeper = PeerId::from_bytes(*holder).ok();
                }
                self.settings.next = Some(now);
            }
            // Partitions merged and the rule keeps the record ours: renew once the other
            // keeper gave it back.
            ClaimResult::Kept(_) => self.settings.next = Some(now + CLAIM_RETRY),
            ClaimResult::Lost(None) => self.settings.next = Some(now + CLAIM_RETRY),
        }
    }

    pub(super) fn settings_got(&mut self, now: Instant, envelopes: &[Envelope]) {
        self.settings.busy = false;
        let key = self.keys.settings_key();
        let unix = self.clock.unix(now);
        let found = envelopes.iter().find_map(|e| {
            let (owner, settings) = e.read::<Settings>(&self.keys, &key, unix).ok()?;
            settings.validate().ok()?;
            Some((settings, PeerId::from_bytes(owner).ok()?))
        });
        match found {
            Some((settings, keeper)) => {
                self.adopt(settings, keeper);
                self.settings.next = Some(now + self.lease / 3);
            }
            None if self.settings.proposed.is_some() => {
                // Nobody keeps it: this member's settings become the record. A member that
                // knew the record (its keeper is gone) takes over after a pause.
                self.settings.claim_next = true;
                let pause = if self.settings.known {
                    CLAIM_RETRY
                } else {
                    Duration::ZERO
                };
                self.settings.next = Some(now + pause);
            }
            None => {
                let claims_own = !matches!(self.wanted, Address::None | Address::Dhcp);
                if claims_own {
                    // Said once at info level, and in the status.
                    self.address_failed(super::AddressError::NoNamespaceRecord);
                } else {
                    tracing::info!(namespace = %self.name,
                        "no namespace record yet (no member with a `subnet` reachable); retrying");
                }
                self.settings.next = Some(now + CLAIM_RETRY);
            }
        }
    }

    /// The namespace record's settings are the namespace's: adopt them (or refuse them, the
    /// first time, if they contradict this member's configuration).
    fn adopt(&mut self, settings: Settings, keeper: PeerId) {
        if !self.settings.known {
            if let Err(reason) = self.check_settings(&settings, keeper) {
                self.events.push_back(Event::Conflict(reason));
                return;
            }
            tracing::info!(namespace = %self.name, subnet = %settings.subnet,
                routed = ?settings.routed, lease_secs = settings.lease_secs, %keeper,
                "namespace record read");
        } else if !self.same_subnets(&settings) {
            tracing::error!(namespace = %self.name, subnet = %settings.subnet,
                routed = ?settings.routed, %keeper,
                "the namespace record changed its subnets; keeping ours");
            return;
        }
        // This member's own subnet, if configured, is one of the record's (checked above);
        // else it is the record's first.
        let local = self.subnet.unwrap_or(settings.subnet);
        if self.subnet.is_none() {
            self.events.push_back(Event::SubnetLearned(local));
        }
        self.subnet = Some(local);
        let routed: Vec<Ipv4Net> = settings
            .subnets()
            .into_iter()
            .filter(|n| *n != local)
            .collect();
        if routed != self.routed {
            self.routed = routed.clone();
            self.events.push_back(Event::RoutedLearned(routed));
        }
        self.lease = Duration::from_secs(settings.lease_secs);
        self.reserved = settings.reserved.clone();
        // A record this member sealed before a restart is still its own to renew.
        self.settings.keeper = (keeper != self.identity.peer_id()).then_some(keeper);
        self.settings.known = true;
        // Members that learned the settings keep the record alive too.
        self.settings.proposed = Some(settings);
    }

    /// Whether `settings` name the same subnets this member has (its own and the routed).
    fn same_subnets(&self, settings: &Settings) -> bool {
        let mut mine: Vec<Ipv4Net> = self.subnet.into_iter().chain(self.routed.clone()).collect();
        let mut theirs = settings.subnets();
        mine.sort();
        theirs.sort();
        mine == theirs
    }

    /// Why the record's `settings` cannot be this member's, if they cannot.
    fn check_settings(&self, settings: &Settings, keeper: PeerId) -> Result<(), String> {
        if let Some(mine) = &self.settings.proposed {
            let list = |s: &Settings| {
                s.subnets()
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            // A member configured with one subnet may be in any of a multi-subnet
            // namespace's; one configured with several must name them all.
            let fits = if mine.routed.is_empty() {
                settings.subnets().contains(&mine.subnet)
            } else {
                self.same_subnets(settings)
            };
            if !fits {
                let (theirs, fix) = if settings.routed.is_empty() {
                    ("its subnet is", "fix `subnet` or remove it")
                } else {
                    ("its subnets are", "fix `subnet`/`subnets` or remove them")
                };
                return Err(format!(
                    "namespace '{}': {theirs} {} (namespace record kept by member {keeper}), but this config says {}; {fix}",
                    self.name,
                    list(settings),
                    list(mine)
                ));
            }
        }
        let local = self.subnet.unwrap_or(settings.subnet);
        if let Address::Static(a) = self.wanted {
            let problem = check_address(a, local).err().or_else(|| {
                settings
                    .reserved
                    .contains(&a)
                    .then(|| format!("address {a} is reserved in this namespace"))
            });
            if let Some(problem) = problem {
                return Err(format!("namespace '{}': {problem}", self.name));
            }
        }
        Ok(())
    }
}
