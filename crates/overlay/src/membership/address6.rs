//! This member's IPv6 address in a dual-stack namespace: a lease on its key
//! ([`crate::NamespaceKeys::address6_key`]) won, renewed and released by the same majority
//! rule as the IPv4 one. An `auto` member first claims the address its stable interface
//! identifier gives (the same after every restart), then random ones.

use std::collections::HashSet;
use std::net::Ipv6Addr;
use std::time::Instant;

use ipnet::Ipv6Net;

use super::{
    holder_name, Event, Membership, Purpose, Request, CLAIM_RETRY, CONFLICT_RETRY, MAX_AUTO_TRIES,
};
use crate::records::{Envelope, MemberInfo, Subject};
use crate::swarm::ClaimResult;

/// Which IPv6 address this member wants for itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Address6 {
    /// This address, claimed in the DHT (the first claim lost is a conflict).
    Static(Ipv6Addr),
    /// The prefix plus this member's stable interface identifier, or a random one if that
    /// is taken.
    Auto,
    /// None of its own (router mode, or IPv4 only).
    None,
}

/// The own IPv6 lease.
#[derive(Debug, Default)]
pub(super) struct Own6 {
    pub(super) owned: Option<Ipv6Addr>,
    claiming: Option<Ipv6Addr>,
    /// The first claim of a static address decides whether it can be this member's.
    confirmed: bool,
    tried: HashSet<Ipv6Addr>,
    pub(super) next: Option<Instant>,
    /// Why the last claim failed, while none is held.
    error: Option<String>,
    /// The name the record granted last carries (its PTR).
    sealed_name: Option<String>,
}

impl Own6 {
    pub(super) fn due(&self) -> Option<Instant> {
        self.next.filter(|_| self.claiming.is_none())
    }
}

/// Whether `address` may be a member's in `prefix`: inside it, neither the subnet-router
/// anycast address (interface identifier 0) nor the service address (1).
pub fn usable6(prefix: Ipv6Net, address: Ipv6Addr) -> bool {
    let host = u128::from(address) & !u128::from(prefix.netmask());
    prefix.contains(&address) && host > 1
}

/// The service address of an IPv6 prefix (its virtual DNS server): interface identifier 1.
pub fn service_address6(prefix: Ipv6Net) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(prefix.network()) | 1)
}

impl Membership {
    /// The namespace's IPv6 prefix, if it is dual-stack.
    pub fn prefix6(&self) -> Option<Ipv6Net> {
        self.prefix6
    }

    /// The IPv6 address this member holds as its own.
    pub fn owned6(&self) -> Option<Ipv6Addr> {
        self.own6.owned
    }

    /// Why this member holds no IPv6 address of its own (yet), while it wants one.
    pub fn address6_error(&self) -> Option<&str> {
        self.own6
            .error
            .as_deref()
            .filter(|_| self.own6.owned.is_none())
    }

    /// Starts claiming the own IPv6 address (with the IPv4 one, once the overlay joined).
    pub(super) fn start6(&mut self, now: Instant) {
        let wants = self.prefix6.is_some() && self.wanted6 != Address6::None;
        if wants && self.own6.claiming.is_none() && self.own6.next.is_none() {
            self.own6.next = Some(now);
        }
    }

    /// Claims (or renews) the own IPv6 address when due.
    pub(super) fn run_own6(&mut self, now: Instant) {
        // The own name changed since the record was granted (won, given back, lost): seal
        // it again now, so ip6.arpa answers the name the member holds.
        let name = self.own_name();
        let held = self.own6.owned.is_some() && self.own6.claiming.is_none();
        if held && self.own6.sealed_name != name {
            self.own6.next = Some(now);
        }
        if self.own6.due().is_none_or(|t| now < t) {
            return;
        }
        let Some(candidate) = self.own6.owned.or_else(|| self.candidate6()) else {
            self.own6.error = Some("no free IPv6 address found; retrying".into());
            self.own6.tried.clear();
            self.own6.next = Some(now + super::AUTO_PAUSE);
            return;
        };
        let key = self.keys.address6_key(candidate);
        // The own name is this address's PTR too.
        let info = MemberInfo {
            endpoints: self.endpoints.clone(),
            name: name.clone(),
            subject: Some(Subject::Address6(candidate)),
        };
        let renewal = self.own6.owned == Some(candidate);
        self.own6.next = None;
        match self.seal_record(&key, now, &crate::records::encode(&info)) {
            Some(envelope) => {
                let request = Request::Claim {
                    key,
                    envelope,
                    renewal,
                };
                let purpose = Purpose::Own6 {
                    address: candidate,
                    name,
                };
                self.start_op(request, purpose);
                self.own6.claiming = Some(candidate);
            }
            None => self.own6.next = Some(now + CLAIM_RETRY),
        }
    }

    /// The static address, else the stable one, else a random one of the prefix.
    fn candidate6(&mut self) -> Option<Ipv6Addr> {
        let prefix = self.prefix6?;
        if let Address6::Static(a) = self.wanted6 {
            return Some(a);
        }
        if self.own6.tried.len() >= MAX_AUTO_TRIES {
            return None;
        }
        let network = u128::from(prefix.network());
        let hosts = !u128::from(prefix.netmask());
        let stable = network
            | (u128::from(self.keys.interface_id(self.identity.peer_id().as_bytes())) & hosts);
        let mut pick = Ipv6Addr::from(stable);
        for _ in 0..64 {
            if usable6(prefix, pick) && !self.own6.tried.contains(&pick) {
                return Some(pick);
            }
            pick = Ipv6Addr::from(network | (random_bits(&mut self.rng) & hosts));
        }
        None
    }

    /// The name the own IPv4 address holds now, if any.
    fn own_name(&self) -> Option<String> {
        self.own
            .owned
            .and_then(|a| self.name_for(a))
            .map(str::to_string)
    }

    /// Seals the own IPv6 record again now (its name changed).
    pub(super) fn renew_own6_now(&mut self, now: Instant) {
        if self.own6.owned.is_some() && self.own6.claiming.is_none() {
            self.own6.next = Some(now);
        }
    }

    /// The own name's record again now: it carries the IPv6 address, which changed.
    fn reseal_own_name(&mut self, now: Instant) {
        let Some(own) = self.own.owned else {
            return;
        };
        for lease in self.names.values_mut().filter(|n| n.address == own) {
            if lease.claiming.is_none() {
                lease.next = Some(now);
            }
        }
    }

    /// Reads who holds the IPv6 `address` and the name it carries (for the DNS service):
    /// answered as [`Event::HolderRead6`].
    pub fn read_holder6(&mut self, address: Ipv6Addr) {
        let key = self.keys.address6_key(address);
        self.start_op(Request::Get { key }, Purpose::ReadHolder6(address));
    }

    pub(super) fn holder6_read(&mut self, now: Instant, address: Ipv6Addr, envelopes: &[Envelope]) {
        let key = self.keys.address6_key(address);
        let holder = self
            .read_first::<MemberInfo>(&key, now, envelopes)
            .filter(|(_, info)| info.subject == Some(Subject::Address6(address)))
            .map(|(_, info)| info.name);
        self.events
            .push_back(Event::HolderRead6 { address, holder });
    }

    pub(super) fn own6_claimed(
        &mut self,
        now: Instant,
        address: Ipv6Addr,
        sealed_name: Option<String>,
        result: &ClaimResult,
    ) {
        self.own6.claiming = None;
        if self.left {
            return;
        }
        match result {
            ClaimResult::Won | ClaimResult::Kept(_) => {
                // (A name that changed while the claim was out is sealed at the next run.)
                self.own6.next = Some(now + self.lease / 3);
                self.own6.sealed_name = sealed_name;
                self.own6.confirmed = true;
                self.own6.error = None;
                if self.own6.owned != Some(address) {
                    self.own6.owned = Some(address);
                    tracing::info!(namespace = %self.name, %address, "IPv6 address claimed");
                    self.events.push_back(Event::AddressWon6(address));
                    self.reseal_own_name(now);
                }
            }
            ClaimResult::Lost(Some(holder)) => {
                let holder = holder_name(holder);
                let was = self.own6.owned == Some(address);
                if was {
                    tracing::warn!(namespace = %self.name, %address, %holder,
                        "IPv6 address conflict: another member holds our address (partitions merged?); it keeps it");
                    self.own6.owned = None;
                    self.address_conflicts += 1;
                    self.events.push_back(Event::AddressesChanged);
                    self.reseal_own_name(now);
                }
                self.own6.error = Some(format!("{address} is owned by member {holder}"));
                match self.wanted6 {
                    Address6::Static(a) if !self.own6.confirmed => {
                        self.events.push_back(Event::Conflict(format!(
                            "namespace '{}': IPv6 address {a} is owned by member {holder}; choose another address6 or use address6 = \"auto\"",
                            self.name
                        )));
                        self.own6.next = Some(now + CONFLICT_RETRY);
                    }
                    Address6::Static(_) => self.own6.next = Some(now + CONFLICT_RETRY),
                    Address6::Auto | Address6::None => {
                        self.own6.tried.insert(address);
                        self.own6.next = Some(now);
                    }
                }
            }
            ClaimResult::Lost(None) => {
                if self.own6.owned.is_none() {
                    self.own6.error = Some(format!(
                        "claim of {address} unanswered or refused by the replicas; retrying"
                    ));
                }
                self.own6.next = Some(now + CLAIM_RETRY);
            }
        }
    }
}

fn random_bits(rng: &mut impl rand::Rng) -> u128 {
    (u128::from(rng.next_u64()) << 64) | u128::from(rng.next_u64())
}
