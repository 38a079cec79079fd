//! Names in the namespace zone: the hostname of this member's own address, and the names
//! its DHCP clients send. Each is a lease on the name's key, renewed with the address it
//! stands for and given back with it; one name per address.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use super::{holder_name, Event, Membership, Purpose, Request, Token, CLAIM_RETRY, CONFLICT_RETRY};
use crate::records::{encode, NameInfo, Subject};
use crate::swarm::ClaimResult;

/// A name this member holds (or claims): a lease on the name's key.
#[derive(Debug)]
pub(super) struct NameLease {
    pub(super) address: Ipv4Addr,
    pub(super) owned: bool,
    pub(super) claiming: Option<Token>,
    pub(super) next: Option<Instant>,
}

impl Membership {
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
    /// [`Event::Name`].
    pub fn set_hostname(&mut self, now: Instant, hostname: Option<String>) {
        if let Some(old) = self.hostname.take() {
            // The old name goes if it is cleared or was never won; a won one stays until
            // its successor is won.
            if Some(&old) != hostname.as_ref()
                && (hostname.is_none() || self.address_for(&old).is_none())
            {
                self.unbind_name(&old);
            }
        }
        self.hostname = hostname;
        self.name_error = None;
        self.bind_own_name(now);
        // The IPv6 record names the own address's name (its PTR): sealed again.
        self.renew_own6_now(now);
    }

    /// Claims the hostname for the own address, once both are known.
    pub(super) fn bind_own_name(&mut self, now: Instant) {
        if let (Some(name), Some(address)) = (self.hostname.clone(), self.own.owned) {
            self.bind_name(name, address, now);
        }
    }

    /// In a namespace with an authority, the certificate names this member: `name` (its
    /// certificate's name, if that is a host name) becomes its hostname and its only name.
    /// The replicas refuse it any other ([`crate::records::certified`]), so its DHCP
    /// clients and LAN hosts keep their automatic names.
    pub fn set_certified_name(&mut self, now: Instant, name: Option<String>) {
        self.certified_name = Some(name.clone());
        if self.hostname != name {
            self.set_hostname(now, name);
        }
    }

    /// The name a certificate gives this member, in a namespace with an authority
    /// (`Some(None)`: none, its certificate's name is not a host name).
    pub fn certified_name(&self) -> Option<Option<&str>> {
        self.certified_name.as_ref().map(Option::as_deref)
    }

    /// A DHCP client at `address` calls itself `name` (option 12): hold the name for it,
    /// unless the address is this host's own and named by the config, or the namespace has
    /// an authority (the certificate's name is this member's only one).
    pub fn name_client(&mut self, now: Instant, address: Ipv4Addr, name: String) {
        if self.certified_name.is_some() {
            tracing::debug!(namespace = %self.name, %name, %address, "a DHCP client's name is not claimed: the certificate names this member");
            return;
        }
        let own = self.own.owned == Some(address);
        if (own && self.hostname.is_some()) || !self.holds(address) {
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
        self.unbind_address(address);
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

    fn unbind_name(&mut self, name: &str) {
        if let Some(lease) = self.names.remove(name) {
            if lease.owned {
                self.request(Request::Release {
                    key: self.keys.name_key(name),
                });
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
    pub(super) fn unbind_address(&mut self, address: Ipv4Addr) {
        for name in self.names_of(address) {
            self.unbind_name(&name);
        }
    }

    /// Claims (and renews) the names that are due.
    pub(super) fn run_names(&mut self, now: Instant) {
        let due: Vec<(String, Ipv4Addr)> = self
            .names
            .iter()
            .filter(|(_, n)| n.claiming.is_none() && n.next.is_some_and(|t| now >= t))
            .map(|(name, n)| (name.clone(), n.address))
            .collect();
        for (name, address) in due {
            let key = self.keys.name_key(&name);
            let renewal = self.names.get(&name).is_some_and(|n| n.owned);
            // The own name stands for the own IPv6 address too.
            let address6 = self.own6.owned.filter(|_| self.own.owned == Some(address));
            let token = self
                .seal_record(
                    &key,
                    now,
                    &encode(&NameInfo {
                        address,
                        address6,
                        subject: Some(Subject::Name(name.clone())),
                    }),
                )
                .map(|envelope| {
                    let purpose = Purpose::Name {
                        name: name.clone(),
                        sealed: address,
                        sealed6: address6,
                    };
                    let request = Request::Claim {
                        key,
                        envelope,
                        renewal,
                    };
                    self.start_op(request, purpose)
                });
            if let Some(n) = self.names.get_mut(&name) {
                n.next = None;
                match token {
                    Some(token) => n.claiming = Some(token),
                    None => n.next = Some(now + CLAIM_RETRY),
                }
            }
        }
    }

    /// A name claim was decided.
    pub(super) fn name_claimed(
        &mut self,
        now: Instant,
        token: Token,
        name: String,
        (sealed, sealed6): (Ipv4Addr, Option<Ipv6Addr>),
        result: &ClaimResult,
    ) {
        // A name given back (and maybe bound again) while the claim was out: not this one's.
        let Some(lease) = self
            .names
            .get_mut(&name)
            .filter(|n| n.claiming == Some(token))
        else {
            return;
        };
        lease.claiming = None;
        let address = lease.address;
        let was = lease.owned;
        let own = self.hostname.as_deref() == Some(name.as_str());
        let address6 = self.own6.owned.filter(|_| self.own.owned == Some(address));
        let outcome = match result {
            ClaimResult::Won => {
                lease.owned = true;
                // An address moved while the claim was out: claim again with the new one.
                lease.next = Some(if sealed == address && sealed6 == address6 {
                    now + self.lease / 3
                } else {
                    now
                });
                Ok(())
            }
            ClaimResult::Lost(Some(holder)) => {
                lease.owned = false;
                lease.next = Some(now + CONFLICT_RETRY);
                if own {
                    self.renew_own6_now(now);
                }
                Err(format!(
                    "namespace '{}': the name '{name}' is held by member {}; it keeps it until its lease lapses, so choose another name",
                    self.name,
                    holder_name(holder)
                ))
            }
            ClaimResult::Lost(None) => {
                // No replica answered: try again soon; nothing is decided.
                lease.next = Some(now + CLAIM_RETRY);
                return;
            }
            ClaimResult::Kept(rival) => {
                // Partitions merged: the merge rule keeps the name ours; claim again once
                // the other owner gave it back.
                tracing::warn!(namespace = %self.name, %name, rival = %holder_name(rival),
                    "name conflict: another member holds our name too (partitions merged); the merge rule keeps it ours");
                lease.next = Some(now + CLAIM_RETRY);
                return;
            }
        };
        match &outcome {
            Ok(()) if !was => {
                tracing::info!(namespace = %self.name, %name, %address, "name claimed");
                if own {
                    self.name_error = None;
                    // One name per address: the address's other names go.
                    for other in self.names_of(address) {
                        if other != name {
                            self.unbind_name(&other);
                        }
                    }
                }
                // The address record carries the name (its PTR): seal it again now, and
                // again after a claim already in flight (sealed without the name).
                self.reseal.insert(address);
                if self.own.owned == Some(address) {
                    self.own.next = Some(now);
                    // (Its PTR in ip6.arpa too.)
                    self.renew_own6_now(now);
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
        self.events.push_back(Event::Name {
            name,
            result: outcome,
        });
    }
}
