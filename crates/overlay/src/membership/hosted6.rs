//! Router mode in a dual-stack namespace: the IPv6 addresses the LAN's hosts use (found by
//! the switch, formed by the hosts themselves from the advertised prefix, or set by hand),
//! each a lease on its key won, renewed and released by the same majority rule as a LAN
//! host's IPv4 address. A lost first claim is reported ([`super::Event::HostedClaimed`]):
//! the host may have moved here from another router's LAN, and the agent's handoff asks
//! the holder for it ([`Membership::hand_off_hosted`] and [`Membership::adopt_hosted`]
//! move it). Until then the host's packets from it are not announced, so no member takes
//! them.

use std::net::Ipv6Addr;
use std::time::Instant;

use super::{
    holder_name, HostedClaim, Membership, Purpose, Request, Token, CLAIM_RETRY, CONFLICT_RETRY,
};
use crate::records::{Envelope, MemberInfo, Subject};
use crate::swarm::ClaimResult;
use crate::PeerId;

/// A LAN host's IPv6 address.
#[derive(Debug, Default)]
pub(super) struct Hosted6 {
    owned: bool,
    /// A claim of it was refused (another member holds it), and not won since.
    refused: bool,
    /// A DHCPv6 client waits for the outcome of its claim ([`super::Event::Dhcp6`]).
    for_dhcp: bool,
    /// Seen on the LAN (the switch learned it), and leased by the DHCPv6 server: it is
    /// given back when neither holds it any more.
    learned: bool,
    leased: bool,
    claiming: Option<Token>,
    next: Option<Instant>,
}

impl Membership {
    /// Every IPv6 address this member holds a lease on: its own, then its LAN hosts'.
    pub fn addresses6(&self) -> Vec<Ipv6Addr> {
        self.own6
            .owned
            .into_iter()
            .chain(
                self.hosted6
                    .iter()
                    .filter(|(_, h)| h.owned)
                    .map(|(a, _)| *a),
            )
            .collect()
    }

    /// Whether this member holds the lease on the LAN host's IPv6 `address`.
    pub(super) fn hosts6(&self, address: Ipv6Addr) -> bool {
        self.hosted6.get(&address).is_some_and(|h| h.owned)
    }

    /// Whether the LAN host's IPv6 `address` is held for a DHCPv6 lease while its host is
    /// quiet on the LAN (it may be suspended): it stays here whatever another LAN shows.
    pub(super) fn leased_quiet6(&self, address: Ipv6Addr) -> bool {
        self.hosted6
            .get(&address)
            .is_some_and(|h| h.owned && h.leased && !h.learned)
    }

    /// Router mode: the IPv6 `address` appeared on the LAN; claim it for this member.
    pub fn add_hosted6(&mut self, address: Ipv6Addr, now: Instant) {
        if self.left {
            return;
        }
        if let Some(h) = self.hosted6.get_mut(&address) {
            h.learned = true;
            return;
        }
        let usable = self.prefix6.is_some_and(|p| super::usable6(p, address));
        if !usable || self.own6.owned == Some(address) {
            tracing::warn!(namespace = %self.name, %address,
                "a LAN host uses an IPv6 address that is not a usable namespace address; not claimed");
            return;
        }
        tracing::info!(namespace = %self.name, %address, "LAN host found; claiming its IPv6 address");
        let hosted = Hosted6 {
            next: Some(now),
            learned: true,
            ..Hosted6::default()
        };
        self.hosted6.insert(address, hosted);
    }

    /// Router mode: claims `address` for a DHCPv6 client of the LAN, as a LAN host's. The
    /// outcome comes back as [`super::Event::Dhcp6`] (at once if it is held already).
    pub fn claim_for_dhcp6(&mut self, address: Ipv6Addr, now: Instant) {
        let usable = self.prefix6.is_some_and(|p| super::usable6(p, address));
        if self.left || !usable || self.own6.owned == Some(address) {
            self.events.push_back(super::Event::Dhcp6 {
                address,
                won: false,
            });
            return;
        }
        let h = self.hosted6.entry(address).or_default();
        h.leased = true;
        if h.owned {
            self.events
                .push_back(super::Event::Dhcp6 { address, won: true });
            return;
        }
        h.for_dhcp = true;
        if h.claiming.is_none() {
            h.next = Some(now);
        }
    }

    /// Router mode: the LAN host at the IPv6 `address` went away; give the address back,
    /// unless a DHCPv6 lease still holds it (the client may only be quiet). Returns whether
    /// this member's addresses changed.
    pub fn remove_hosted6(&mut self, address: Ipv6Addr) -> bool {
        match self.hosted6.get_mut(&address) {
            Some(h) if h.leased => {
                h.learned = false;
                false
            }
            Some(_) => self.give_back6(address),
            None => false,
        }
    }

    /// Router mode: the DHCPv6 lease on `address` ended (released, declined, expired).
    /// Given back unless `in_use`: another host of the LAN uses it (its own lease stays).
    /// Returns whether this member's addresses changed.
    pub fn release_dhcp6(&mut self, address: Ipv6Addr, in_use: bool) -> bool {
        match self.hosted6.get_mut(&address) {
            // Not leased here (a lease of a host that moved away and came back).
            Some(h) if !h.leased => false,
            Some(h) if in_use => {
                h.leased = false;
                h.learned = true;
                false
            }
            Some(_) => self.give_back6(address),
            None => false,
        }
    }

    /// Claims the LAN host's IPv6 `address` now (a handoff found it free, or the silent
    /// holder's lease lapsed).
    pub(super) fn claim_hosted6_now(&mut self, address: Ipv6Addr, now: Instant) {
        match self.hosted6.get_mut(&address) {
            Some(h) if h.claiming.is_none() => h.next = Some(now),
            Some(_) => {}
            None => self.add_hosted6(address, now),
        }
    }

    fn usable_hosted6(&self, address: Ipv6Addr) -> bool {
        !self.left
            && self.own6.owned != Some(address)
            && self.prefix6.is_some_and(|p| super::usable6(p, address))
    }

    /// This member's own signed record for the LAN host's IPv6 `address`.
    fn seal_hosted6(&mut self, address: Ipv6Addr, now: Instant) -> Option<Envelope> {
        let key = self.keys.address6_key(address);
        let info = MemberInfo {
            endpoints: self.endpoints.clone(),
            name: None,
            subject: Some(Subject::Address6(address)),
        };
        self.seal_record(&key, now, &crate::records::encode(&info))
    }

    /// Migration target: this member's record for the IPv6 `address` (see
    /// [`Membership::hosted_record`]).
    pub(super) fn hosted6_record(&mut self, address: Ipv6Addr, now: Instant) -> Option<Envelope> {
        if !self.usable_hosted6(address) {
            return None;
        }
        self.seal_hosted6(address, now)
    }

    /// Migration source: moves the lease on the LAN host's IPv6 `address` to the member
    /// whose record `envelope` is (see [`Membership::hand_off_hosted`]).
    pub(super) fn hand_off_hosted6(&mut self, address: Ipv6Addr, envelope: Envelope) -> bool {
        if !self
            .hosted6
            .get(&address)
            .is_some_and(|h| h.owned && h.claiming.is_none())
        {
            return false;
        }
        let key = self.keys.address6_key(address);
        let token = self.start_op(
            Request::Transfer { key, envelope },
            Purpose::HandOff(address.into()),
        );
        if let Some(h) = self.hosted6.get_mut(&address) {
            // Holds renewals back (run_hosted6 skips an address with an operation out).
            h.claiming = Some(token);
            h.next = None;
        }
        true
    }

    pub(super) fn handed_off6(
        &mut self,
        now: Instant,
        token: Token,
        address: Ipv6Addr,
        result: &ClaimResult,
    ) {
        let done = *result == ClaimResult::Won;
        match self.hosted6.get(&address) {
            Some(h) if h.claiming == Some(token) => {}
            Some(_) => return,
            None => {
                // The host went from the LAN while the lease moved: the transfer's outcome
                // still ends the handoff.
                self.events.push_back(super::Event::HandOff {
                    address: address.into(),
                    done,
                });
                return;
            }
        }
        if done {
            tracing::info!(namespace = %self.name, %address, "LAN host moved; its IPv6 address handed off");
            self.hosted6.remove(&address);
            self.events.push_back(super::Event::AddressesChanged);
        } else if let Some(h) = self.hosted6.get_mut(&address) {
            tracing::info!(namespace = %self.name, %address, "IPv6 address hand-off refused; still hosted here");
            h.claiming = None;
            h.next = Some(now);
        }
        self.events.push_back(super::Event::HandOff {
            address: address.into(),
            done,
        });
    }

    /// Migration target: the holder transferred the lease on the LAN host's IPv6
    /// `address` to this member (see [`Membership::adopt_hosted`]).
    pub(super) fn adopt_hosted6(&mut self, address: Ipv6Addr, now: Instant) {
        if !self.usable_hosted6(address) {
            return;
        }
        let renew_at = now + self.lease / 3;
        let h = self.hosted6.entry(address).or_default();
        let was = h.owned;
        h.owned = true;
        h.refused = false;
        h.learned = true;
        if h.claiming.is_none() {
            h.next = Some(renew_at);
        }
        if !was {
            tracing::info!(namespace = %self.name, %address, "LAN host's IPv6 address taken over");
            self.events.push_back(super::Event::AddressesChanged);
        }
    }

    fn give_back6(&mut self, address: Ipv6Addr) -> bool {
        let Some(h) = self.hosted6.remove(&address) else {
            return false;
        };
        tracing::info!(namespace = %self.name, %address, "LAN host gone; releasing its IPv6 address");
        if h.owned {
            self.request(Request::Release {
                key: self.keys.address6_key(address),
            });
        }
        h.owned
    }

    /// When a LAN host's IPv6 claim or renewal is due next.
    pub(super) fn hosted6_due(&self) -> Option<Instant> {
        self.hosted6
            .values()
            .filter(|h| h.claiming.is_none())
            .filter_map(|h| h.next)
            .min()
    }

    /// Brings the renewals of the held ones to `soon` at the latest.
    pub(super) fn renew_hosted6_by(&mut self, soon: Instant) {
        for h in self.hosted6.values_mut().filter(|h| h.owned) {
            h.next = Some(h.next.map_or(soon, |t| t.min(soon)));
        }
    }

    /// Claims (and renews) the LAN hosts' IPv6 addresses that are due.
    pub(super) fn run_hosted6(&mut self, now: Instant) {
        let due: Vec<(Ipv6Addr, bool)> = self
            .hosted6
            .iter()
            .filter(|(_, h)| h.claiming.is_none() && h.next.is_some_and(|t| now >= t))
            .map(|(a, h)| (*a, h.owned))
            .collect();
        for (address, renewal) in due {
            let token = self.seal_hosted6(address, now).map(|envelope| {
                let key = self.keys.address6_key(address);
                let request = Request::Claim {
                    key,
                    envelope,
                    renewal,
                };
                self.start_op(request, Purpose::Hosted6(address))
            });
            if let Some(h) = self.hosted6.get_mut(&address) {
                h.next = None;
                match token {
                    Some(token) => h.claiming = Some(token),
                    None => h.next = Some(now + CLAIM_RETRY),
                }
            }
        }
    }

    pub(super) fn hosted6_claimed(
        &mut self,
        now: Instant,
        token: Token,
        address: Ipv6Addr,
        result: &ClaimResult,
    ) {
        let renew_at = now + self.lease / 3;
        // A host that left (and maybe came back) while the claim was out: not this claim's.
        let Some(h) = self
            .hosted6
            .get_mut(&address)
            .filter(|h| h.claiming == Some(token))
        else {
            return;
        };
        h.claiming = None;
        let was = h.owned;
        let won = matches!(result, ClaimResult::Won | ClaimResult::Kept(_));
        if std::mem::take(&mut h.for_dhcp) {
            self.events.push_back(super::Event::Dhcp6 { address, won });
            if !won && !was && !h.learned {
                // A DHCPv6 candidate another member holds (or the replicas did not
                // grant): the server tries another; nothing to retry here.
                self.hosted6.remove(&address);
                return;
            }
            if !won {
                h.leased = false;
            }
        }
        match result {
            ClaimResult::Won => {
                h.owned = true;
                h.refused = false;
                h.next = Some(renew_at);
                if !was {
                    tracing::info!(namespace = %self.name, %address, "LAN host's IPv6 address claimed");
                }
            }
            ClaimResult::Kept(rival) => {
                // Partitions merged and the merge rule keeps it ours: checked again soon.
                tracing::warn!(namespace = %self.name, %address, rival = %holder_name(rival),
                    "a LAN host's IPv6 address is held by another member too (partitions merged); the merge rule keeps it ours");
                h.owned = true;
                h.next = Some(now + CLAIM_RETRY);
            }
            ClaimResult::Lost(Some(holder)) => {
                tracing::info!(namespace = %self.name, %address, holder = %holder_name(holder),
                    "a LAN host uses an IPv6 address another member holds; not carried");
                // A first claim: the agent's handoff asks the holder, and counts it if the
                // host stays the other member's. A renewal: held here, and lost.
                if was {
                    self.hosted_conflicts += 1;
                }
                h.refused = true;
                h.owned = false;
                h.next = Some(now + CONFLICT_RETRY);
            }
            ClaimResult::Lost(None) => h.next = Some(now + CLAIM_RETRY),
        }
        let owned = h.owned;
        // A host of the LAN uses it (not a DHCPv6 candidate only): the handoff learns how
        // its first claim ended.
        if !was && h.learned {
            let outcome = match result {
                ClaimResult::Won | ClaimResult::Kept(_) => HostedClaim::Won,
                ClaimResult::Lost(Some(holder)) => {
                    PeerId::from_bytes(*holder).map_or(HostedClaim::Unanswered, HostedClaim::Held)
                }
                ClaimResult::Lost(None) => HostedClaim::Unanswered,
            };
            self.events.push_back(super::Event::HostedClaimed {
                address: address.into(),
                outcome,
            });
        }
        if was != owned {
            self.events.push_back(super::Event::AddressesChanged);
        }
    }
}
