//! Address leases: this member's own address (static, `auto` or from its host's DHCP
//! client), its router LAN hosts' addresses, and the addresses its virtual DHCP server
//! hands out.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use super::{
    holder_name, Event, HostedClaim, Membership, Purpose, Request, Token, AUTO_PAUSE, CLAIM_RETRY,
    CONFLICT_RETRY, MAX_AUTO_TRIES,
};
use crate::records::Envelope;
use crate::swarm::ClaimResult;
use crate::PeerId;

/// Which address this member wants for itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Address {
    /// This address, claimed in the DHT (the first claim lost is a conflict).
    Static(Ipv4Addr),
    /// Any free address of the subnet, claimed in the DHT.
    Auto,
    /// None of its own (router mode: it claims its LAN hosts' addresses).
    None,
    /// Whatever the host's DHCP client obtains from the agent's virtual DHCP server.
    Dhcp,
}

impl Address {
    /// The static address, if any.
    pub fn fixed(self) -> Option<Ipv4Addr> {
        match self {
            Address::Static(a) => Some(a),
            Address::Auto | Address::None | Address::Dhcp => None,
        }
    }
}

/// This member's own address lease.
#[derive(Debug, Default)]
pub(super) struct Own {
    pub(super) owned: Option<Ipv4Addr>,
    /// The address a claim in flight is for.
    pub(super) claiming: Option<Ipv4Addr>,
    /// The first claim of a static address decides whether it can be this member's.
    confirmed: bool,
    /// `auto` candidates found taken.
    tried: HashSet<Ipv4Addr>,
    pub(super) next: Option<Instant>,
    /// The address held last (before a restart, or before it was lost): tried first.
    previous: Option<Ipv4Addr>,
    /// Why the last attempt to hold an address failed (cleared when one is won).
    error: Option<AddressError>,
}

/// Why this member holds no address of its own (yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressError {
    /// No member holding the namespace record (its subnet) answered yet.
    NoNamespaceRecord,
    /// Every `auto` candidate tried was taken (or the subnet is full); retried later.
    NoFreeAddress,
    /// The replicas refused without naming a holder (unreachable, or full); retried.
    Unanswered(Ipv4Addr),
    /// Another member holds the address (`holder` is its peer id).
    OwnedBy { address: Ipv4Addr, holder: String },
}

impl std::fmt::Display for AddressError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoNamespaceRecord => {
                f.write_str("no namespace record yet (no member with a `subnet` reachable)")
            }
            Self::NoFreeAddress => f.write_str("no free address found; retrying"),
            Self::Unanswered(a) => {
                write!(
                    f,
                    "claim of {a} unanswered or refused by the replicas; retrying"
                )
            }
            Self::OwnedBy { address, holder } => write!(f, "{address} is owned by member {holder}"),
        }
    }
}

impl Own {
    pub(super) fn new(previous: Option<Ipv4Addr>) -> Self {
        Self {
            previous,
            ..Self::default()
        }
    }
}

/// The lease on one LAN host's (or DHCP client's) address.
#[derive(Debug, Default)]
pub(super) struct Hosted {
    pub(super) owned: bool,
    pub(super) claiming: Option<Token>,
    pub(super) next: Option<Instant>,
}

/// A claim for a DHCP client: the client, the address, and whether only it will do.
#[derive(Debug, Clone)]
pub(super) struct DhcpClaim {
    client: Vec<u8>,
    address: Ipv4Addr,
    exact: bool,
}

impl Membership {
    /// Claims (or renews) the own address when due.
    pub(super) fn run_own(&mut self, now: Instant) {
        if self.own.claiming.is_some() || self.own.next.is_none_or(|t| now < t) {
            return;
        }
        if self.own.owned.is_none() && matches!(self.wanted, Address::None | Address::Dhcp) {
            // Nothing of its own to claim: a DHCP address is claimed when the host asks.
            self.own.next = None;
            return;
        }
        let Some(candidate) = self.own.owned.or_else(|| self.candidate()) else {
            tracing::warn!(namespace = %self.name, "no free address found; retrying in 10 s");
            self.own.error = Some(AddressError::NoFreeAddress);
            self.own.tried.clear();
            self.own.next = Some(now + AUTO_PAUSE);
            return;
        };
        match self.seal_address(candidate, now) {
            Some(envelope) => {
                let key = self.keys.address_key(candidate);
                let renewal = self.own.owned == Some(candidate);
                let request = Request::Claim {
                    key,
                    envelope,
                    renewal,
                };
                self.start_op(request, Purpose::Own(candidate));
                self.own.claiming = Some(candidate);
                self.claim_endpoints = self.endpoints.clone();
                self.own.next = None;
            }
            None => self.own.next = Some(now + CLAIM_RETRY),
        }
    }

    /// The address to claim next: the static one, else the one held last, else a random
    /// free one.
    fn candidate(&mut self) -> Option<Ipv4Addr> {
        if let Address::Static(a) = self.wanted {
            return Some(a);
        }
        if self.own.tried.len() >= MAX_AUTO_TRIES {
            return None;
        }
        let previous = self
            .own
            .previous
            .filter(|a| self.usable(*a) && !self.own.tried.contains(a));
        if previous.is_some() {
            return previous;
        }
        let tried = std::mem::take(&mut self.own.tried);
        let free = self.random_free(&tried);
        self.own.tried = tried;
        free
    }

    pub(super) fn own_claimed(&mut self, now: Instant, address: Ipv4Addr, result: &ClaimResult) {
        self.own.claiming = None;
        if self.host_uses_dhcp() && self.own.owned != Some(address) {
            // The host's DHCP client released the address while its renewal was out: the
            // renewal may have stored the lease again after the release, so release again.
            if matches!(result, ClaimResult::Won | ClaimResult::Kept(_)) {
                self.request(Request::Release {
                    key: self.keys.address_key(address),
                });
            }
            return;
        }
        let key = self.keys.address_key(address);
        match result {
            ClaimResult::Won => {
                let me = self.identity.peer_id();
                crate::records::lease_log(
                    "won",
                    &key,
                    me.as_bytes(),
                    self.lease.as_millis() as u64,
                );
                self.own.next = Some(self.renewal(address, now));
                self.own.confirmed = true;
                self.published_endpoints = self.claim_endpoints.clone();
                self.own.error = None;
                if self.own.owned == Some(address) {
                    return;
                }
                self.own.owned = Some(address);
                self.own.previous = Some(address);
                self.bind_own_name(now);
                tracing::info!(namespace = %self.name, %address, "address claimed");
                self.events.push_back(Event::Persist(address));
                self.events.push_back(Event::AddressWon(address));
            }
            ClaimResult::Lost(Some(holder)) => {
                if self.own.owned == Some(address) {
                    crate::records::lease_log("gave", &key, holder, 0);
                }
                let holder = holder_name(holder);
                if self.own.owned.is_none() || self.own.owned == Some(address) {
                    self.address_failed(AddressError::OwnedBy {
                        address,
                        holder: holder.clone(),
                    });
                }
                match self.wanted {
                    Address::Static(a) if !self.own.confirmed => {
                        self.events.push_back(Event::Conflict(format!(
                            "namespace '{}': address {a} is owned by member {holder}; choose another address or use address = \"auto\"",
                            self.name
                        )));
                    }
                    Address::Static(a) => {
                        // Partitions merged (or our lease lapsed and another member took
                        // it): the other owner keeps it, by the merge rule or by majority.
                        // Give it up and say so; claim it again later, in case it is freed.
                        if self.own.owned == Some(a) {
                            tracing::warn!(namespace = %self.name, address = %a, %holder,
                                "address conflict: another member holds our static address (partitions merged?); it keeps it, we give it up and retry in 30 s");
                            self.own.owned = None;
                            self.address_conflicts += 1;
                            self.unbind_address(a);
                            self.events.push_back(Event::AddressesChanged);
                        }
                        self.own.next = Some(now + CONFLICT_RETRY);
                    }
                    Address::Auto | Address::None | Address::Dhcp => {
                        tracing::debug!(namespace = %self.name, %address, %holder, "address taken");
                        if self.own.owned == Some(address) {
                            tracing::warn!(namespace = %self.name, %address, %holder,
                                "address conflict: another member holds our address (partitions merged?); it keeps it, claiming a new one");
                            self.own.owned = None;
                            self.address_conflicts += 1;
                            // Its names go (the hostname comes back with the next address).
                            self.unbind_address(address);
                        }
                        self.own.tried.insert(address);
                        self.own.next = Some(now);
                    }
                }
            }
            ClaimResult::Kept(rival) => {
                tracing::warn!(namespace = %self.name, %address, rival = %holder_name(rival),
                    "address conflict: another member holds our address too (partitions merged); the merge rule keeps it ours");
                self.own.next = Some(now + CLAIM_RETRY);
            }
            ClaimResult::Lost(None) => {
                tracing::debug!(namespace = %self.name, %address, "claim unanswered; retrying");
                if self.own.owned.is_none() {
                    self.address_failed(AddressError::Unanswered(address));
                }
                self.own.next = Some(now + CLAIM_RETRY);
            }
        }
    }

    /// Why this member holds no address of its own, while it holds none.
    pub fn address_error(&self) -> Option<&AddressError> {
        self.own.error.as_ref().filter(|_| self.own.owned.is_none())
    }

    /// Records why the own address was not won; says so at info level when the reason
    /// changes (a retry every few seconds for the same reason is not news).
    pub(super) fn address_failed(&mut self, error: AddressError) {
        if self.own.error.as_ref() != Some(&error) {
            tracing::info!(namespace = %self.name, reason = %error, "address not claimed");
            self.own.error = Some(error);
        }
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
    pub fn remove_hosted(&mut self, address: Ipv4Addr) -> bool {
        self.dhcp_clients.remove(&address);
        let Some(h) = self.hosted.remove(&address) else {
            return false;
        };
        tracing::info!(namespace = %self.name, %address, "LAN host gone; releasing its address");
        self.unbind_address(address);
        if h.owned {
            self.request(Request::Release {
                key: self.keys.address_key(address),
            });
        }
        h.owned
    }

    /// Migration target: this member's own signed record for the LAN host `address` (what
    /// the holder transfers its lease to), or `None` if it cannot host it (left, not a
    /// usable address).
    pub fn hosted_record(&mut self, address: impl Into<IpAddr>, now: Instant) -> Option<Envelope> {
        match address.into() {
            _ if self.left => None,
            IpAddr::V4(a) if self.usable(a) => self.seal_address(a, now),
            IpAddr::V4(_) => None,
            IpAddr::V6(a) => self.hosted6_record(a, now),
        }
    }

    /// Migration source: the LAN host at `address` moved to the member whose own record
    /// `envelope` is; move the lease to it on the replicas (only the holder can, and the
    /// old holder cannot renew it back). The result is [`Event::HandOff`]; meanwhile the
    /// lease is not renewed. Returns whether the transfer started (this member must hold
    /// the address for a LAN host, with no transfer already out).
    pub fn hand_off_hosted(&mut self, address: impl Into<IpAddr>, envelope: Envelope) -> bool {
        let address = match address.into() {
            IpAddr::V4(a) => a,
            IpAddr::V6(a) => return self.hand_off_hosted6(a, envelope),
        };
        if !self
            .hosted
            .get(&address)
            .is_some_and(|h| h.owned && h.claiming.is_none())
        {
            return false;
        }
        let key = self.keys.address_key(address);
        let token = self.start_op(
            Request::Transfer { key, envelope },
            Purpose::HandOff(address.into()),
        );
        if let Some(h) = self.hosted.get_mut(&address) {
            // Holds renewals back (run_hosted skips a host with an operation out).
            h.claiming = Some(token);
            h.next = None;
        }
        true
    }

    pub(super) fn handed_off(
        &mut self,
        now: Instant,
        token: Token,
        address: Ipv4Addr,
        result: &ClaimResult,
    ) {
        let done = *result == ClaimResult::Won;
        match self.hosted.get(&address) {
            Some(h) if h.claiming == Some(token) => {}
            Some(_) => return,
            None => {
                // The host went from the LAN while the lease moved: the transfer's outcome
                // still ends the handoff.
                self.events.push_back(Event::HandOff {
                    address: address.into(),
                    done,
                });
                return;
            }
        }
        if done {
            tracing::info!(namespace = %self.name, %address, "LAN host moved; its address handed off");
            self.hosted.remove(&address);
            self.dhcp_clients.remove(&address);
            self.unbind_address(address);
            self.events.push_back(Event::AddressesChanged);
        } else if let Some(h) = self.hosted.get_mut(&address) {
            tracing::info!(namespace = %self.name, %address, "address hand-off refused; still hosted here");
            h.claiming = None;
            h.next = Some(now);
        }
        self.events.push_back(Event::HandOff {
            address: address.into(),
            done,
        });
    }

    /// Migration target: the holder transferred the lease on the LAN host `address` to this
    /// member (the replicas keep this member's record from [`Membership::hosted_record`]);
    /// host it from now on and renew it as usual.
    pub fn adopt_hosted(&mut self, address: impl Into<IpAddr>, now: Instant) {
        let address = match address.into() {
            IpAddr::V4(a) => a,
            IpAddr::V6(a) => return self.adopt_hosted6(a, now),
        };
        if self.left || !self.usable(address) {
            return;
        }
        let renew_at = self.renewal(address, now);
        let h = self.hosted.entry(address).or_default();
        let was = h.owned;
        h.owned = true;
        if h.claiming.is_none() {
            h.next = Some(renew_at);
        }
        if !was {
            tracing::info!(namespace = %self.name, %address, "LAN host's address taken over");
            self.events.push_back(Event::AddressesChanged);
        }
    }

    /// Claims (and renews) the hosts' addresses that are due.
    pub(super) fn run_hosted(&mut self, now: Instant) {
        let due: Vec<Ipv4Addr> = self
            .hosted
            .iter()
            .filter(|(_, h)| h.claiming.is_none() && h.next.is_some_and(|t| now >= t))
            .map(|(a, _)| *a)
            .collect();
        for address in due {
            let renewal = self.hosted.get(&address).is_some_and(|h| h.owned);
            let token = self.seal_address(address, now).map(|envelope| {
                let key = self.keys.address_key(address);
                let request = Request::Claim {
                    key,
                    envelope,
                    renewal,
                };
                self.start_op(request, Purpose::Hosted(address))
            });
            if let Some(h) = self.hosted.get_mut(&address) {
                h.next = None;
                match token {
                    Some(token) => h.claiming = Some(token),
                    None => h.next = Some(now + CLAIM_RETRY),
                }
            }
        }
    }

    pub(super) fn hosted_claimed(
        &mut self,
        now: Instant,
        token: Token,
        address: Ipv4Addr,
        result: &ClaimResult,
    ) {
        let renew_at = self.renewal(address, now);
        // A host that left (and maybe came back) while the claim was out: not this claim's.
        let Some(h) = self
            .hosted
            .get_mut(&address)
            .filter(|h| h.claiming == Some(token))
        else {
            return;
        };
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
                // The host may have moved here from the holder's LAN: the agent's handoff
                // asks the holder (`HostedClaimed`), and says so if it fails.
                tracing::info!(namespace = %self.name, %address, holder = %holder_name(holder),
                    "a LAN host uses an address another member holds");
                // A first claim: the agent's handoff counts it if the host stays the other
                // member's. A renewal: this member held it and lost it.
                if was {
                    self.hosted_conflicts += 1;
                }
                h.owned = false;
                h.next = Some(now + CONFLICT_RETRY);
            }
            ClaimResult::Kept(rival) => {
                tracing::warn!(namespace = %self.name, %address, rival = %holder_name(rival),
                    "a LAN host's address is held by another member too (partitions merged); the merge rule keeps it ours");
                h.next = Some(now + CLAIM_RETRY);
            }
            ClaimResult::Lost(None) => h.next = Some(now + CLAIM_RETRY),
        }
        let owned = h.owned;
        if !was {
            let outcome = match result {
                ClaimResult::Won | ClaimResult::Kept(_) => HostedClaim::Won,
                ClaimResult::Lost(Some(holder)) => {
                    PeerId::from_bytes(*holder).map_or(HostedClaim::Unanswered, HostedClaim::Held)
                }
                ClaimResult::Lost(None) => HostedClaim::Unanswered,
            };
            self.events.push_back(Event::HostedClaimed {
                address: address.into(),
                outcome,
            });
        }
        if was && !owned {
            // Its names stood for an address that is someone else's now.
            self.unbind_address(address);
        }
        if was != owned {
            self.events.push_back(Event::AddressesChanged);
        }
    }

    /// Claims an address in the DHT for a DHCP client: `hint` if usable, else (unless
    /// `exact`) a free one. The outcome comes back as [`Event::Dhcp`].
    pub fn claim_for_dhcp(
        &mut self,
        now: Instant,
        client: Vec<u8>,
        hint: Option<Ipv4Addr>,
        exact: bool,
    ) {
        if self.left || !self.settings.known {
            self.events.push_back(Event::Dhcp {
                client,
                address: None,
            });
            return;
        }
        let tried = self.dhcp_tried.remove(&client).unwrap_or_default();
        // Not an address claimed for another of this member's clients (it would win).
        let hint = hint.filter(|a| {
            !tried.contains(a)
                && self.usable(*a)
                && self.dhcp_clients.get(a).is_none_or(|c| *c == client)
        });
        let candidate = match hint {
            Some(a) => Some(a),
            None if exact || tried.len() >= MAX_AUTO_TRIES => None,
            None => self.random_free(&tried),
        };
        let envelope = candidate.and_then(|a| Some((a, self.seal_address(a, now)?)));
        let Some((address, envelope)) = envelope else {
            self.events.push_back(Event::Dhcp {
                client,
                address: None,
            });
            return;
        };
        self.dhcp_tried.insert(client.clone(), tried);
        self.dhcp_clients.insert(address, client.clone());
        let key = self.keys.address_key(address);
        let claim = DhcpClaim {
            client,
            address,
            exact,
        };
        let request = Request::Claim {
            key,
            envelope,
            renewal: false,
        };
        self.start_op(request, Purpose::Dhcp(claim));
    }

    pub(super) fn dhcp_claimed(&mut self, now: Instant, claim: DhcpClaim, result: &ClaimResult) {
        let DhcpClaim {
            client,
            address,
            exact,
        } = claim;
        match result {
            // A DHCP claim is never a renewal: `Kept` does not come back for it.
            ClaimResult::Won | ClaimResult::Kept(_) => {
                self.dhcp_tried.remove(&client);
                let renew_at = self.renewal(address, now);
                if self.host_uses_dhcp() {
                    self.own.owned = Some(address);
                    self.own.confirmed = true;
                    self.own.next = Some(renew_at);
                    self.bind_own_name(now);
                } else {
                    self.hosted.insert(
                        address,
                        Hosted {
                            owned: true,
                            claiming: None,
                            next: Some(renew_at),
                        },
                    );
                }
                tracing::info!(namespace = %self.name, %address, "address claimed for a DHCP client");
                self.events.push_back(Event::Dhcp {
                    client,
                    address: Some(address),
                });
            }
            ClaimResult::Lost(_) if exact => {
                self.forget_dhcp_client(address, &client);
                self.dhcp_tried.remove(&client);
                self.events.push_back(Event::Dhcp {
                    client,
                    address: None,
                });
            }
            ClaimResult::Lost(_) => {
                // Taken: another address for the same client.
                self.forget_dhcp_client(address, &client);
                self.dhcp_tried
                    .entry(client.clone())
                    .or_default()
                    .insert(address);
                self.claim_for_dhcp(now, client, None, false);
            }
        }
    }

    /// `address` is no longer claimed for `client` (if it was for another, that stands).
    fn forget_dhcp_client(&mut self, address: Ipv4Addr, client: &[u8]) {
        if self.dhcp_clients.get(&address).is_some_and(|c| c == client) {
            self.dhcp_clients.remove(&address);
        }
    }

    /// A DHCP lease ended (released, declined, expired): give its address back. Returns
    /// whether this member's addresses changed.
    pub fn release_dhcp(&mut self, address: Ipv4Addr) -> bool {
        self.dhcp_clients.remove(&address);
        if self.host_uses_dhcp() && self.own.owned == Some(address) {
            self.unbind_address(address);
            self.own.owned = None;
            self.own.next = None;
            self.request(Request::Release {
                key: self.keys.address_key(address),
            });
            tracing::info!(namespace = %self.name, %address, "DHCP lease ended; address released");
            return true;
        }
        self.remove_hosted(address)
    }

    /// An address record: where to reach this member (and the name held for the address),
    /// until the lease ends.
    pub(super) fn seal_address(&mut self, address: Ipv4Addr, now: Instant) -> Option<Envelope> {
        // This seal carries the current name.
        self.reseal.remove(&address);
        let name = self.name_for(address).map(str::to_string);
        let key = self.keys.address_key(address);
        self.seal_member(&key, now, name, Some(address))
    }

    /// When the record of `address`, just won, is next claimed: at once if a name was won
    /// while that claim was out (its seal lacks it), else after a third of the lease.
    pub(super) fn renewal(&self, address: Ipv4Addr, now: Instant) -> Instant {
        if self.reseal.contains(&address) {
            now
        } else {
            now + self.lease / 3
        }
    }
}

impl Membership {
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

    /// Whether this member holds or claims `a` already (its own address, a LAN host's, a
    /// DHCP client's): such an address is no candidate for another.
    fn in_use_here(&self, a: Ipv4Addr) -> bool {
        self.own.owned == Some(a)
            || self.own.claiming == Some(a)
            || self.hosted.contains_key(&a)
            || self.dhcp_clients.contains_key(&a)
    }

    /// A random usable address not in `tried`, and not one this member holds or claims.
    fn random_free(&mut self, tried: &HashSet<Ipv4Addr>) -> Option<Ipv4Addr> {
        use rand::Rng as _;
        let subnet = self.subnet?;
        let hosts = (1u64 << (32 - subnet.prefix_len())).saturating_sub(2);
        let base = u32::from(subnet.network());
        for _ in 0..1000 {
            let index = 1 + self.rng.next_u64() % hosts.max(1);
            let a = Ipv4Addr::from(base.wrapping_add(index as u32));
            if self.usable(a) && !tried.contains(&a) && !self.in_use_here(a) {
                return Some(a);
            }
        }
        None
    }
}
