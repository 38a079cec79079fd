//! The virtual DNS server of one namespace, as a pure function of a query and a name store.
//!
//! Inside the namespace zone (`NAMESPACE.`): `HOST.NAMESPACE` answers the address of the
//! member or DHCP client that holds the name, IPOP's automatic names answer every owned
//! address (`C250005005.NAMESPACE` is 10.250.5.5: the last three octets, three digits
//! each), reverse names in the subnet answer PTR, and anything else in the zone is
//! NXDOMAIN. In a dual-stack namespace a member's own name answers AAAA with its IPv6
//! address too, every held IPv6 address has an automatic name as well
//! (`V6--0000000000000005.NAMESPACE` is the prefix's `::5`: `v6--` and the address's bits
//! after the prefix in hex, zero-padded; a label with `--` in its third and fourth places
//! is one no host name may have, RFC 5891 4.2.3.1), and the prefix's ip6.arpa names answer PTR with
//! the name its holder gave it, else its automatic name. Outside the zone the query is
//! forwarded to the configured resolvers, or refused when there are none. Malformed queries get FORMERR when they carry a readable header,
//! and are dropped (counted) otherwise.
//!
//! Messages are parsed and built with `hickory-proto`; the store is the agent's view of the
//! names and addresses in the DHT ([`Names`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, PTR, SOA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use ipnet::{Ipv4Net, Ipv6Net};

use crate::limit::{PerSource, Verdict};

/// TTL of the answers (names move with their owners' leases).
pub const TTL: u32 = 60;

/// How long a resolver may remember that a name is not there (the SOA's minimum).
pub const NEGATIVE_TTL: u32 = 5;

/// Something the store does not know yet: the agent reads it from the DHT and asks again.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Missing {
    /// Who holds the name `host` (a lowercase label).
    Name(String),
    /// Whether someone owns `address`, and the name held with it.
    Address(Ipv4Addr),
    /// Whether someone holds the IPv6 `address`, and the name held with it.
    Address6(Ipv6Addr),
}

/// Someone who owns an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The name held for the address (its PTR), if any.
    pub name: Option<String>,
}

/// What the server knows about the namespace: the agent backs it with the DHT (what this
/// member holds, and a cache of what it read). `Err(Missing)` asks for a lookup first.
pub trait Names {
    /// The address of `host` (a lowercase label), if someone holds the name.
    fn address_of(&self, host: &str) -> Result<Option<Ipv4Addr>, Missing>;
    /// Who owns `address`, if anyone (automatic names and PTRs exist only for those).
    fn holder_of(&self, address: Ipv4Addr) -> Result<Option<Holder>, Missing>;
    /// The IPv6 address of `host`, if someone holds the name and it stands for one (read
    /// with the name: the same [`Missing::Name`]).
    fn address6_of(&self, host: &str) -> Result<Option<Ipv6Addr>, Missing>;
    /// Who holds the IPv6 `address`, if anyone.
    fn holder_of6(&self, address: Ipv6Addr) -> Result<Option<Holder>, Missing>;
}

/// A namespace's DNS settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The zone: the namespace's name, e.g. `lab.`.
    pub zone: Name,
    /// The namespace subnet (reverse names and automatic names live in it).
    pub subnet: Ipv4Net,
    /// A multi-subnet namespace's other subnets: their reverse and automatic names are the
    /// zone's too.
    pub routed: Vec<Ipv4Net>,
    /// A dual-stack namespace's IPv6 prefix: its ip6.arpa names are the zone's, and AAAA
    /// answers lie in it.
    pub prefix6: Option<Ipv6Net>,
    /// Whether queries outside the zone are forwarded (resolvers configured); otherwise
    /// they are refused.
    pub forward: bool,
    /// Queries per second each source address may send (also its burst); 0: no limit.
    pub rate: u32,
}

/// What to do with a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Send this response back.
    Reply(Vec<u8>),
    /// Ask the DHT first, then hand the same query to [`Server::handle`] again.
    Lookup(Missing),
    /// Outside the zone: forward the query unchanged to the configured resolvers, and the
    /// response back to the asker.
    Forward,
    /// Unreadable: drop it (counted).
    Drop,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Queries answered from the zone (NOERROR with or without records).
    pub answered: u64,
    /// NXDOMAIN answers.
    pub nxdomain: u64,
    /// Queries forwarded.
    pub forwarded: u64,
    /// REFUSED answers (outside the zone, no resolvers).
    pub refused: u64,
    /// FORMERR and NOTIMP answers.
    pub errors: u64,
    /// Queries dropped unread.
    pub dropped: u64,
    /// Queries over their source's rate that waited their turn ([`Server::admit`]).
    pub rate_limited_delayed: u64,
    /// Queries over their source's rate and wait, answered truncated.
    pub rate_limited_truncated: u64,
    /// Queries over their source's rate dropped.
    pub rate_limited_dropped: u64,
}

/// One namespace's DNS server.
#[derive(Debug)]
pub struct Server {
    settings: Settings,
    zone: Name,
    stats: Stats,
    limit: PerSource,
}

impl Server {
    /// A server for `settings`.
    pub fn new(settings: Settings) -> Self {
        let zone = settings.zone.to_lowercase();
        Self {
            zone,
            stats: Stats::default(),
            limit: PerSource::new(settings.rate),
            settings,
        }
    }

    /// Changes the namespace's other subnets ([`Settings::routed`]).
    pub fn set_routed(&mut self, routed: Vec<Ipv4Net>) {
        self.settings.routed = routed;
    }

    /// The namespace's subnets: this one first.
    fn subnets(&self) -> impl Iterator<Item = &Ipv4Net> {
        std::iter::once(&self.settings.subnet).chain(&self.settings.routed)
    }

    /// Whether a new UDP query (not one handed back after a lookup) from `source` is
    /// answered, waits its turn (if `can_wait`: there is room to hold it), slips (answer it
    /// with [`truncated_answer`]) or is dropped, by its source's rate ([`crate::limit`]);
    /// what is not answered at once is counted.
    pub fn admit(&mut self, now: Instant, source: impl Into<IpAddr>, can_wait: bool) -> Verdict {
        let verdict = self.limit.handle_query(now, source, can_wait);
        match verdict {
            Verdict::Answer => {}
            Verdict::Delay(_) => self.stats.rate_limited_delayed += 1,
            Verdict::Truncate => self.stats.rate_limited_truncated += 1,
            Verdict::Drop => self.stats.rate_limited_dropped += 1,
        }
        verdict
    }

    /// Whether queries outside the zone are forwarded.
    pub fn forwards(&self) -> bool {
        self.settings.forward
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Answers one query (a UDP payload, or a TCP message without its length prefix).
    pub fn handle(&mut self, query: &[u8], names: &impl Names) -> Answer {
        let request = match Message::from_vec(query) {
            Ok(m) => m,
            Err(_) => {
                // A readable id gets FORMERR; less than a header is dropped.
                let Some(id) = query.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]])) else {
                    self.stats.dropped += 1;
                    return Answer::Drop;
                };
                if query.len() < 12 || query[2] & 0x80 != 0 {
                    self.stats.dropped += 1;
                    return Answer::Drop;
                }
                self.stats.errors += 1;
                return self.encode(Message::error_msg(id, OpCode::Query, ResponseCode::FormErr));
            }
        };
        let id = request.metadata.id;
        if request.metadata.message_type != MessageType::Query {
            self.stats.dropped += 1;
            return Answer::Drop;
        }
        if request.metadata.op_code != OpCode::Query {
            self.stats.errors += 1;
            return self.encode(Message::error_msg(
                id,
                request.metadata.op_code,
                ResponseCode::NotImp,
            ));
        }
        let [query] = request.queries.as_slice() else {
            self.stats.errors += 1;
            return self.encode(Message::error_msg(id, OpCode::Query, ResponseCode::FormErr));
        };
        let name = query.name().to_lowercase();
        let qtype = query.query_type();
        let mut response = Message::response(id, OpCode::Query);
        response.metadata.recursion_desired = request.metadata.recursion_desired;
        response.metadata.recursion_available = self.settings.forward;
        response.add_query(query.clone());

        if let Some(nibbles) = reverse_nibbles(&name) {
            if let Some(answer) = self.reverse6(&nibbles, &mut response, names) {
                return answer;
            }
        }
        let reverse = reverse_octets(&name);
        if let Some(octets) = reverse.as_deref().filter(|o| o.len() < 4) {
            if self.covers(octets) {
                // A name on the way to our reverse names (e.g. 201.10.in-addr.arpa): it
                // exists, with no records of its own.
                response.metadata.authoritative = true;
                self.stats.answered += 1;
                return self.encode(response);
            }
        }
        let reverse = reverse
            .and_then(|o| <[u8; 4]>::try_from(o).ok())
            .map(Ipv4Addr::from)
            .filter(|a| self.subnets().any(|n| n.contains(a)));
        if let Some(address) = reverse {
            response.metadata.authoritative = true;
            let holder = match names.holder_of(address) {
                Ok(holder) => holder,
                Err(missing) => return Answer::Lookup(missing),
            };
            let host = holder.map(|h| h.name.unwrap_or_else(|| automatic_name(address)));
            let Some(host) = host.and_then(|h| self.in_zone(&h)) else {
                return self.nxdomain(response);
            };
            if matches!(qtype, RecordType::PTR | RecordType::ANY) {
                response.add_answer(Record::from_rdata(
                    query.name().clone(),
                    TTL,
                    RData::PTR(PTR(host)),
                ));
            }
            self.stats.answered += 1;
            return self.encode(response);
        }
        if !self.zone.zone_of(&name) {
            if self.settings.forward {
                self.stats.forwarded += 1;
                return Answer::Forward;
            }
            self.stats.refused += 1;
            response.metadata.response_code = ResponseCode::Refused;
            return self.encode(response);
        }
        response.metadata.authoritative = true;
        if name == self.zone {
            // The apex exists: its SOA, and no address.
            if matches!(qtype, RecordType::SOA | RecordType::ANY) {
                response.add_answer(self.soa());
            } else {
                response.add_authority(self.soa());
            }
            self.stats.answered += 1;
            return self.encode(response);
        }
        let host = (name.num_labels() == self.zone.num_labels() + 1)
            .then(|| name.iter().next())
            .flatten()
            .and_then(|label| std::str::from_utf8(label).ok());
        let automatic6 = host
            .zip(self.settings.prefix6)
            .and_then(|(h, p)| automatic_address6(h, p));
        if let Some(address) = automatic6 {
            // An IPv6 automatic name stands for its address while someone holds it.
            return match names.holder_of6(address) {
                Err(missing) => Answer::Lookup(missing),
                Ok(None) => {
                    response.add_authority(self.soa());
                    self.nxdomain(response)
                }
                Ok(Some(_)) => {
                    if matches!(qtype, RecordType::AAAA | RecordType::ANY) {
                        response.add_answer(Record::from_rdata(
                            query.name().clone(),
                            TTL,
                            RData::AAAA(AAAA(address)),
                        ));
                    } else {
                        response.add_authority(self.soa());
                    }
                    self.stats.answered += 1;
                    self.encode(response)
                }
            };
        }
        let lookup = match host {
            None => Ok(None),
            // Automatic names stand for whatever address someone owns.
            Some(host) => match self.subnets().find_map(|n| automatic_address(host, *n)) {
                Some(a) => names.holder_of(a).map(|holder| holder.map(|_| a)),
                None if host_name(host).is_ok() => names.address_of(host),
                None => Ok(None),
            },
        };
        let address = match lookup {
            Ok(address) => address,
            Err(missing) => return Answer::Lookup(missing),
        };
        let Some(address) = address else {
            // The SOA tells resolvers how long to remember that the name is not there.
            response.add_authority(self.soa());
            return self.nxdomain(response);
        };
        // A named member's IPv6 address (read with its name; automatic names have none).
        let address6 = match host.filter(|h| host_name(h).is_ok()) {
            Some(h) if matches!(qtype, RecordType::AAAA | RecordType::ANY) => {
                match names.address6_of(h) {
                    Ok(a) => a.filter(|a| self.settings.prefix6.is_some_and(|p| p.contains(a))),
                    Err(missing) => return Answer::Lookup(missing),
                }
            }
            _ => None,
        };
        let mut records = 0;
        if matches!(qtype, RecordType::A | RecordType::ANY) {
            response.add_answer(Record::from_rdata(
                query.name().clone(),
                TTL,
                RData::A(A(address)),
            ));
            records += 1;
        }
        if let Some(a) = address6 {
            response.add_answer(Record::from_rdata(
                query.name().clone(),
                TTL,
                RData::AAAA(AAAA(a)),
            ));
            records += 1;
        }
        if records == 0 {
            // Other types of an existing name: NOERROR with no records (NODATA).
            response.add_authority(self.soa());
        }
        self.stats.answered += 1;
        self.encode(response)
    }

    /// A name under ip6.arpa (`nibbles`, most significant first, at most 32): the PTR of an
    /// address of the prefix, the empty answer of a name on the way to them, or `None` if
    /// it is none of the zone's (forwarded or refused as any other name).
    fn reverse6(
        &mut self,
        nibbles: &[u8],
        response: &mut Message,
        names: &impl Names,
    ) -> Option<Answer> {
        let prefix = self.settings.prefix6?;
        let mut bits = 0u128;
        for (i, n) in nibbles.iter().enumerate() {
            bits |= u128::from(*n) << (124 - 4 * i);
        }
        let address = Ipv6Addr::from(bits);
        // As for IPv4's reverse names: only names at or below the prefix's own are ours.
        let within = usize::from(prefix.prefix_len()) <= 4 * nibbles.len();
        if !within || !prefix.contains(&address) {
            return None;
        }
        let mut response = std::mem::replace(response, Message::response(0, OpCode::Query));
        response.metadata.authoritative = true;
        if nibbles.len() < 32 {
            self.stats.answered += 1;
            return Some(self.encode(response));
        }
        let holder = match names.holder_of6(address) {
            Ok(holder) => holder,
            Err(missing) => return Some(Answer::Lookup(missing)),
        };
        let host = holder.map(|h| h.name.unwrap_or_else(|| automatic_name6(address, prefix)));
        let Some(host) = host.and_then(|h| self.in_zone(&h)) else {
            return Some(self.nxdomain(response));
        };
        let qtype = response.queries.first().map(|q| q.query_type());
        if matches!(qtype, Some(RecordType::PTR | RecordType::ANY)) {
            if let Some(q) = response.queries.first().cloned() {
                response.add_answer(Record::from_rdata(
                    q.name().clone(),
                    TTL,
                    RData::PTR(PTR(host)),
                ));
            }
        }
        self.stats.answered += 1;
        Some(self.encode(response))
    }

    /// The zone's SOA record: its minimum (the negative-caching time) is short, since
    /// names come and go with their leases.
    fn soa(&self) -> Record {
        let hostmaster = Name::from_ascii("hostmaster")
            .ok()
            .and_then(|h| h.append_domain(&self.zone).ok())
            .unwrap_or_else(|| self.zone.clone());
        Record::from_rdata(
            self.zone.clone(),
            NEGATIVE_TTL,
            RData::SOA(SOA::new(
                self.zone.clone(),
                hostmaster,
                1,
                3600,
                600,
                86400,
                NEGATIVE_TTL,
            )),
        )
    }

    /// Whether the reverse name of the first `octets` (1-3 of them) lies inside the
    /// subnet's reverse names.
    fn covers(&self, octets: &[u8]) -> bool {
        let mut a = [0u8; 4];
        a[..octets.len()].copy_from_slice(octets);
        self.subnets().any(|n| {
            octets.len() * 8 >= usize::from(n.prefix_len()) && n.contains(&Ipv4Addr::from(a))
        })
    }

    fn in_zone(&self, host: &str) -> Option<Name> {
        Name::from_ascii(host).ok()?.append_domain(&self.zone).ok()
    }

    fn nxdomain(&mut self, mut response: Message) -> Answer {
        self.stats.nxdomain += 1;
        response.metadata.response_code = ResponseCode::NXDomain;
        self.encode(response)
    }

    fn encode(&mut self, m: Message) -> Answer {
        match m.to_vec() {
            Ok(bytes) => Answer::Reply(bytes),
            Err(_) => {
                self.stats.dropped += 1;
                Answer::Drop
            }
        }
    }
}

/// A SERVFAIL answer to `query` (its id and question), for a query whose lookup or
/// forward failed; `None` if the query is unreadable.
pub fn servfail(query: &[u8]) -> Option<Vec<u8>> {
    let request = Message::from_vec(query).ok()?;
    let mut response = Message::response(request.metadata.id, OpCode::Query);
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    response.metadata.response_code = ResponseCode::ServFail;
    for q in request.queries {
        response.add_query(q);
    }
    response.to_vec().ok()
}

/// `response` cut to its header and question with the TC bit set, for a UDP answer too
/// large to send (the client asks again over TCP); `None` if it is unreadable.
pub fn truncated(response: &[u8]) -> Option<Vec<u8>> {
    let full = Message::from_vec(response).ok()?;
    let mut cut = Message::response(full.metadata.id, full.metadata.op_code);
    cut.metadata = full.metadata;
    cut.metadata.truncation = true;
    for q in full.queries {
        cut.add_query(q);
    }
    cut.to_vec().ok()
}

/// An empty answer to `query` with the TC bit set, for a query over its source's rate
/// (RFC 1035 4.2.1: the client asks again over TCP); `None` if the query is unreadable or
/// not a query.
pub fn truncated_answer(query: &[u8]) -> Option<Vec<u8>> {
    let request = Message::from_vec(query).ok()?;
    if request.metadata.message_type != MessageType::Query {
        return None;
    }
    let mut response = Message::response(request.metadata.id, request.metadata.op_code);
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    response.metadata.truncation = true;
    for q in request.queries {
        response.add_query(q);
    }
    response.to_vec().ok()
}

/// IPOP's automatic name of an address: `C` and the last three octets, three digits each.
pub fn automatic_name(a: Ipv4Addr) -> String {
    let o = a.octets();
    format!("c{:03}{:03}{:03}", o[1], o[2], o[3])
}

/// Longest host name (one DNS label).
pub const MAX_HOST_NAME: usize = 63;

/// `name` as a host name of the zone (lowercase), if it is one a member may hold: one DNS
/// label of letters, digits and inner hyphens, and not shaped like an automatic name
/// (those belong to whoever owns the address).
pub fn host_name(name: &str) -> Result<String, String> {
    let lower = name.to_ascii_lowercase();
    let label = !lower.is_empty()
        && lower.len() <= MAX_HOST_NAME
        && lower
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !lower.starts_with('-')
        && !lower.ends_with('-');
    if !label {
        return Err(format!(
            "'{name}' is not a host name: 1-{MAX_HOST_NAME} letters, digits and inner '-'"
        ));
    }
    if is_automatic(&lower) {
        return Err(format!(
            "'{name}' is an automatic name (c + 9 digits stands for an address); choose another"
        ));
    }
    if is_automatic6(&lower) {
        return Err(format!(
            "'{name}' is an automatic name (v6-- + hex digits stands for an IPv6 address); choose another"
        ));
    }
    Ok(lower)
}

/// The automatic name of an IPv6 address of `prefix`: `v6--` and its bits after the prefix
/// in hex, zero-padded to the prefix's host part (16 digits in a /64). The double hyphen
/// in third and fourth place marks a reserved label shape (RFC 5891 4.2.3.1), so no host
/// name a member held before these names existed can be one.
pub fn automatic_name6(a: Ipv6Addr, prefix: Ipv6Net) -> String {
    let host_bits = 128 - u32::from(prefix.prefix_len());
    let host = u128::from(a) & u128::MAX.checked_shr(128 - host_bits).unwrap_or(0);
    let width = host_bits.div_ceil(4).max(1) as usize;
    format!("v6--{host:0width$x}")
}

fn is_automatic6(host: &str) -> bool {
    host.strip_prefix("v6--")
        .is_some_and(|h| (1..=32).contains(&h.len()) && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The IPv6 address an automatic name stands for in `prefix`: exactly its host part's
/// digits, within the host part.
fn automatic_address6(host: &str, prefix: Ipv6Net) -> Option<Ipv6Addr> {
    if !is_automatic6(host) {
        return None;
    }
    let digits = host.get(4..)?;
    let host_bits = 128 - u32::from(prefix.prefix_len());
    if digits.len() != host_bits.div_ceil(4).max(1) as usize {
        return None;
    }
    let bits = u128::from_str_radix(digits, 16).ok()?;
    if bits.checked_shr(host_bits).unwrap_or(0) != 0 {
        return None;
    }
    Some(Ipv6Addr::from(u128::from(prefix.network()) | bits))
}

fn is_automatic(host: &str) -> bool {
    host.strip_prefix('c')
        .is_some_and(|d| d.len() == 9 && d.bytes().all(|b| b.is_ascii_digit()))
}

/// The address an automatic name stands for in `subnet` (its first octet is the subnet's).
fn automatic_address(host: &str, subnet: Ipv4Net) -> Option<Ipv4Addr> {
    if !is_automatic(host) {
        return None;
    }
    let digits = host.get(1..)?;
    let octet = |i: usize| digits.get(i..i + 3)?.parse::<u8>().ok();
    let a = Ipv4Addr::new(
        subnet.network().octets()[0],
        octet(0)?,
        octet(3)?,
        octet(6)?,
    );
    subnet.contains(&a).then_some(a)
}

/// `d.c.b.a.in-addr.arpa.` -> [a, b, c, d]; also the shorter names above it (`b.a.in-addr.arpa.`
/// -> [a, b]).
/// The nibbles of a name under ip6.arpa, most significant first (1 to 32 of them).
fn reverse_nibbles(name: &Name) -> Option<Vec<u8>> {
    let mut labels: Vec<&[u8]> = name.iter().collect();
    let [.., ip6, arpa] = labels.as_slice() else {
        return None;
    };
    if !ip6.eq_ignore_ascii_case(b"ip6") || !arpa.eq_ignore_ascii_case(b"arpa") {
        return None;
    }
    labels.truncate(labels.len() - 2);
    if labels.is_empty() || labels.len() > 32 {
        return None;
    }
    labels
        .iter()
        .rev()
        .map(|l| match l {
            [c] => (*c as char).to_digit(16).map(|d| d as u8),
            _ => None,
        })
        .collect()
}

fn reverse_octets(name: &Name) -> Option<Vec<u8>> {
    let mut labels: Vec<&[u8]> = name.iter().collect();
    let [.., inaddr, arpa] = labels.as_slice() else {
        return None;
    };
    if !inaddr.eq_ignore_ascii_case(b"in-addr") || !arpa.eq_ignore_ascii_case(b"arpa") {
        return None;
    }
    labels.truncate(labels.len() - 2);
    if labels.is_empty() || labels.len() > 4 {
        return None;
    }
    labels
        .iter()
        .rev()
        .map(|l| std::str::from_utf8(l).ok()?.parse::<u8>().ok())
        .collect()
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // a base instant for the virtual clock
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use std::collections::HashMap;

    /// Names in "the DHT", and what has been looked up so far.
    struct Store {
        names: HashMap<String, Ipv4Addr>,
        known: std::cell::RefCell<std::collections::HashSet<Missing>>,
    }

    impl Store {
        fn known(&self, m: Missing) -> Result<(), Missing> {
            if self.known.borrow().contains(&m) {
                Ok(())
            } else {
                Err(m)
            }
        }
    }

    impl Names for Store {
        fn address_of(&self, host: &str) -> Result<Option<Ipv4Addr>, Missing> {
            self.known(Missing::Name(host.to_string()))?;
            Ok(self.names.get(host).copied())
        }
        fn holder_of(&self, address: Ipv4Addr) -> Result<Option<Holder>, Missing> {
            self.known(Missing::Address(address))?;
            let name = self
                .names
                .iter()
                .find(|(_, a)| **a == address)
                .map(|(n, _)| n.clone());
            let owned = name.is_some() || address == Ipv4Addr::new(10, 250, 5, 5);
            Ok(owned.then_some(Holder { name }))
        }
        fn address6_of(&self, host: &str) -> Result<Option<Ipv6Addr>, Missing> {
            self.known(Missing::Name(host.to_string()))?;
            Ok((host == "web").then(|| WEB6.parse().unwrap()))
        }
        fn holder_of6(&self, address: Ipv6Addr) -> Result<Option<Holder>, Missing> {
            self.known(Missing::Address6(address))?;
            let name = (address == WEB6.parse::<Ipv6Addr>().unwrap()).then(|| "web".to_string());
            // fd12::99 is held by a member with no name.
            let held = name.is_some() || address == "fd12::99".parse::<Ipv6Addr>().unwrap();
            Ok(held.then_some(Holder { name }))
        }
    }

    const WEB6: &str = "fd12::7";

    fn aaaa_of(r: &Message) -> Vec<Ipv6Addr> {
        r.answers
            .iter()
            .filter_map(|rec| match &rec.data {
                RData::AAAA(a) => Some(a.0),
                _ => None,
            })
            .collect()
    }

    /// The ip6.arpa name of `a`.
    fn arpa6(a: &str) -> String {
        let a: Ipv6Addr = a.parse().unwrap();
        let hex: String = a.octets().iter().map(|b| format!("{b:02x}")).collect();
        let mut name: String = hex.chars().rev().map(|c| format!("{c}.")).collect();
        name.push_str("ip6.arpa.");
        name
    }

    #[test]
    fn a_members_name_answers_aaaa_and_its_ipv6_address_answers_ptr() {
        let mut s = server(false);
        assert_eq!(
            aaaa_of(&ask(&mut s, "web.lab.", RecordType::AAAA)),
            vec![WEB6.parse::<Ipv6Addr>().unwrap()]
        );
        let any = ask(&mut s, "web.lab.", RecordType::ANY);
        assert_eq!((a_of(&any).len(), aaaa_of(&any).len()), (1, 1));
        // A only for A; automatic names have no IPv6 address.
        assert!(aaaa_of(&ask(&mut s, "web.lab.", RecordType::A)).is_empty());
        let auto = ask(&mut s, "c250005005.lab.", RecordType::AAAA);
        assert_eq!(
            (auto.metadata.response_code, auto.answers.len()),
            (ResponseCode::NoError, 0)
        );
        let ptr_of = |r: &Message| -> Vec<String> {
            r.answers
                .iter()
                .map(|rec| match &rec.data {
                    RData::PTR(PTR(n)) => n.to_string(),
                    other => format!("{other:?}"),
                })
                .collect()
        };
        let r = ask(&mut s, &arpa6(WEB6), RecordType::PTR);
        assert_eq!(ptr_of(&r), ["web.lab."]);
        // Held without a name: its automatic name; not held: no PTR.
        let r = ask(&mut s, &arpa6("fd12::99"), RecordType::PTR);
        assert_eq!(ptr_of(&r), ["v6--0000000000000099.lab."]);
        let r = ask(&mut s, &arpa6("fd12::98"), RecordType::PTR);
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
        assert!(r.metadata.authoritative);
        // A name on the way to the prefix's reverse names exists, empty.
        let partial = "0.0.0.0.0.0.0.0.0.0.0.0.2.1.d.f.ip6.arpa.";
        let r = ask(&mut s, partial, RecordType::PTR);
        assert_eq!(
            (r.metadata.response_code, r.answers.len()),
            (ResponseCode::NoError, 0)
        );
        // Outside the prefix: not the zone's (refused: no resolvers here).
        let r = ask(&mut s, &arpa6("2001:db8::1"), RecordType::PTR);
        assert_eq!(r.metadata.response_code, ResponseCode::Refused);
        // Malformed nibbles are no address of ours either.
        let r = ask(&mut s, "x.0.ip6.arpa.", RecordType::PTR);
        assert_eq!(r.metadata.response_code, ResponseCode::Refused);
    }

    fn store() -> Store {
        Store {
            names: HashMap::from([("web".to_string(), Ipv4Addr::new(10, 250, 0, 7))]),
            known: Default::default(),
        }
    }

    /// Handles `query` the way the agent does: each lookup asked for is "read" and the
    /// query handed back, until an answer comes. Returns it and the lookups made.
    fn resolve(s: &mut Server, query: &[u8], store: &Store) -> (Answer, Vec<Missing>) {
        let mut lookups = Vec::new();
        loop {
            match s.handle(query, store) {
                Answer::Lookup(m) => {
                    assert!(!lookups.contains(&m), "asked twice for {m:?}");
                    lookups.push(m.clone());
                    store.known.borrow_mut().insert(m);
                }
                answer => return (answer, lookups),
            }
        }
    }

    fn server(forward: bool) -> Server {
        Server::new(Settings {
            zone: Name::from_ascii("Lab.").unwrap(),
            subnet: "10.250.0.0/16".parse().unwrap(),
            routed: Vec::new(),
            prefix6: Some("fd12::/64".parse().unwrap()),
            forward,
            rate: 500,
        })
    }

    fn ask(s: &mut Server, name: &str, qtype: RecordType) -> Message {
        let mut q = Message::query();
        q.metadata.recursion_desired = true;
        q.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        match resolve(s, &q.to_vec().unwrap(), &store()).0 {
            Answer::Reply(bytes) => {
                let r = Message::from_vec(&bytes).unwrap();
                assert_eq!(r.metadata.id, q.metadata.id);
                assert_eq!(r.metadata.message_type, MessageType::Response);
                r
            }
            other => panic!("{name}: {other:?}"),
        }
    }

    fn a_of(r: &Message) -> Vec<Ipv4Addr> {
        r.answers
            .iter()
            .filter_map(|rec| match &rec.data {
                RData::A(A(a)) => Some(*a),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn names_automatic_names_and_reverse() {
        let mut s = server(false);
        let r = ask(&mut s, "web.lab.", RecordType::A);
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
        assert!(r.metadata.authoritative);
        assert_eq!(a_of(&r), vec![Ipv4Addr::new(10, 250, 0, 7)]);
        // Case does not matter.
        assert_eq!(
            a_of(&ask(&mut s, "WEB.LAB.", RecordType::A)),
            vec![Ipv4Addr::new(10, 250, 0, 7)]
        );
        // IPOP's automatic name of an owned address, and of one nobody owns.
        assert_eq!(automatic_name(Ipv4Addr::new(10, 250, 5, 5)), "c250005005");
        let r = ask(&mut s, "C250005005.lab.", RecordType::A);
        assert_eq!(a_of(&r), vec![Ipv4Addr::new(10, 250, 5, 5)]);
        let r = ask(&mut s, "c250005006.lab.", RecordType::A);
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
        // Unknown names, deeper names: NXDOMAIN. Another type of a known name: NODATA.
        for n in ["db.lab.", "x.web.lab.", "c25000500.lab."] {
            assert_eq!(
                ask(&mut s, n, RecordType::A).metadata.response_code,
                ResponseCode::NXDomain,
                "{n}"
            );
        }
        let r = ask(&mut s, "web.lab.", RecordType::MX);
        assert_eq!(
            (r.metadata.response_code, r.answers.len()),
            (ResponseCode::NoError, 0)
        );
        assert_eq!(
            ask(&mut s, "lab.", RecordType::A).metadata.response_code,
            ResponseCode::NoError
        );
        // PTR: the held name, else the automatic name, else NXDOMAIN.
        let ptr = |r: &Message| match &r.answers[0].data {
            RData::PTR(PTR(n)) => n.to_string(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            ptr(&ask(&mut s, "7.0.250.10.in-addr.arpa.", RecordType::PTR)),
            "web.lab."
        );
        assert_eq!(
            ptr(&ask(&mut s, "5.5.250.10.in-addr.arpa.", RecordType::PTR)),
            "c250005005.lab."
        );
        let r = ask(&mut s, "9.9.250.10.in-addr.arpa.", RecordType::PTR);
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(s.stats().nxdomain, 5);
    }

    #[test]
    fn a_multi_subnet_namespaces_other_subnets_are_in_the_zone() {
        let mut s = server(false);
        let store = Store {
            names: HashMap::from([("db".to_string(), Ipv4Addr::new(10, 251, 0, 9))]),
            known: Default::default(),
        };
        let ask = |s: &mut Server, name: &str, qtype| {
            let mut q = Message::query();
            q.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
            match resolve(s, &q.to_vec().unwrap(), &store).0 {
                Answer::Reply(bytes) => Message::from_vec(&bytes).unwrap(),
                other => panic!("{name}: {other:?}"),
            }
        };
        // Before it knows the other subnet: 10.251/16 is not the namespace's.
        let r = ask(&mut s, "9.0.251.10.in-addr.arpa.", RecordType::PTR);
        assert_eq!(r.metadata.response_code, ResponseCode::Refused);
        s.set_routed(vec!["10.251.0.0/16".parse().unwrap()]);
        let r = ask(&mut s, "db.lab.", RecordType::A);
        assert_eq!(a_of(&r), vec![Ipv4Addr::new(10, 251, 0, 9)]);
        let r = ask(&mut s, "c251000009.lab.", RecordType::A);
        assert_eq!(a_of(&r), vec![Ipv4Addr::new(10, 251, 0, 9)]);
        let r = ask(&mut s, "9.0.251.10.in-addr.arpa.", RecordType::PTR);
        assert!(matches!(&r.answers[0].data, RData::PTR(PTR(n)) if n.to_string() == "db.lab."));
        let r = ask(&mut s, "251.10.in-addr.arpa.", RecordType::SOA);
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
        assert!(r.metadata.authoritative);
    }

    #[test]
    fn negative_answers_carry_the_soa_and_reverse_zone_cuts_exist() {
        let mut s = server(false);
        let r = ask(&mut s, "nobody.lab.", RecordType::A);
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
        let soa = |r: &Message| match r.authorities.first().map(|rec| &rec.data) {
            Some(RData::SOA(soa)) => soa.minimum,
            other => panic!("no SOA: {other:?}"),
        };
        assert_eq!(soa(&r), NEGATIVE_TTL);
        // NODATA too; and the apex answers its SOA.
        assert_eq!(soa(&ask(&mut s, "web.lab.", RecordType::MX)), NEGATIVE_TTL);
        let apex = ask(&mut s, "lab.", RecordType::SOA);
        assert!(matches!(apex.answers[0].data, RData::SOA(_)));
        // 10.250.0.0/16: 250.10.in-addr.arpa and below are ours (no records of their own);
        // 10.in-addr.arpa is not (refused here: no resolvers), nor is 9.10.in-addr.arpa.
        for (n, code) in [
            ("250.10.in-addr.arpa.", ResponseCode::NoError),
            ("0.250.10.in-addr.arpa.", ResponseCode::NoError),
            ("10.in-addr.arpa.", ResponseCode::Refused),
            ("9.10.in-addr.arpa.", ResponseCode::Refused),
            ("x.250.10.in-addr.arpa.", ResponseCode::Refused),
        ] {
            let r = ask(&mut s, n, RecordType::SOA);
            assert_eq!(r.metadata.response_code, code, "{n}");
            assert!(r.answers.is_empty(), "{n}");
        }
    }

    #[test]
    fn each_answer_asks_only_for_what_it_needs() {
        let mut s = server(false);
        let query = |name: &str, t| {
            let mut q = Message::query();
            q.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
            q.to_vec().unwrap()
        };
        let st = store();
        let (a, lookups) = resolve(&mut s, &query("web.lab.", RecordType::A), &st);
        assert!(matches!(a, Answer::Reply(_)));
        assert_eq!(lookups, vec![Missing::Name("web".into())]);
        // An automatic name reads the address, never a name record.
        let (_, lookups) = resolve(&mut s, &query("c250005005.lab.", RecordType::A), &st);
        assert_eq!(
            lookups,
            vec![Missing::Address(Ipv4Addr::new(10, 250, 5, 5))]
        );
        let (_, lookups) = resolve(
            &mut s,
            &query("9.0.250.10.in-addr.arpa.", RecordType::PTR),
            &st,
        );
        assert_eq!(
            lookups,
            vec![Missing::Address(Ipv4Addr::new(10, 250, 0, 9))]
        );
        // Labels no one may hold, the apex, and names outside the zone: no lookup.
        for n in ["bad_name.lab.", "lab.", "example.com.", "x.web.lab."] {
            let (a, lookups) = resolve(&mut s, &query(n, RecordType::A), &st);
            assert!(matches!(a, Answer::Reply(_)), "{n}");
            assert!(lookups.is_empty(), "{n}: {lookups:?}");
        }
    }

    #[test]
    fn servfail_and_truncation_keep_the_id_and_question() {
        let mut q = Message::query();
        q.add_query(Query::query(
            Name::from_ascii("example.com.").unwrap(),
            RecordType::A,
        ));
        let r = Message::from_vec(&servfail(&q.to_vec().unwrap()).unwrap()).unwrap();
        assert_eq!(
            (r.metadata.id, r.metadata.response_code, r.queries.len()),
            (q.metadata.id, ResponseCode::ServFail, 1)
        );
        let mut big = Message::response(q.metadata.id, OpCode::Query);
        big.add_query(q.queries[0].clone());
        for i in 0..200u8 {
            big.add_answer(Record::from_rdata(
                Name::from_ascii("example.com.").unwrap(),
                TTL,
                RData::A(A(Ipv4Addr::new(192, 0, 2, i))),
            ));
        }
        let cut = truncated(&big.to_vec().unwrap()).unwrap();
        assert!(cut.len() < 64);
        let r = Message::from_vec(&cut).unwrap();
        assert!(r.metadata.truncation && r.answers.is_empty());
        assert_eq!((r.metadata.id, r.queries.len()), (q.metadata.id, 1));
        assert_eq!(servfail(b"junk"), None);
    }

    #[test]
    fn host_names_are_labels_and_never_automatic_names() {
        assert_eq!(host_name("Web-1").unwrap(), "web-1");
        for bad in [
            "",
            "-web",
            "web-",
            "we b",
            "web.lab",
            "c250005005",
            "v6--0000000000000099",
            "V6--ab",
            &"a".repeat(64),
        ] {
            assert!(host_name(bad).is_err(), "{bad:?}");
        }
        assert!(host_name("c25000500").is_ok());
        assert!(host_name("v6-web").is_ok());
        assert!(
            host_name("v6-cafe").is_ok(),
            "one hyphen: a name like any other"
        );
    }

    #[test]
    fn held_ipv6_addresses_have_automatic_names() {
        let p64: Ipv6Net = "fd12::/64".parse().unwrap();
        let a: Ipv6Addr = "fd12::99".parse().unwrap();
        assert_eq!(automatic_name6(a, p64), "v6--0000000000000099");
        assert_eq!(automatic_address6("v6--0000000000000099", p64), Some(a));
        // Other widths: the host part's digits, no more, no fewer.
        let p120: Ipv6Net = "fd12::/120".parse().unwrap();
        assert_eq!(automatic_name6(a, p120), "v6--99");
        assert_eq!(automatic_address6("v6--99", p120), Some(a));
        assert_eq!(automatic_address6("v6--099", p120), None);
        assert_eq!(automatic_address6("v6--99", p64), None);
        let p0: Ipv6Net = "::/0".parse().unwrap();
        assert_eq!(
            automatic_name6(a, p0),
            format!("v6--{:032x}", u128::from(a))
        );
        assert_eq!(automatic_address6(&automatic_name6(a, p0), p0), Some(a));
        let p126: Ipv6Net = "fd12::98/126".parse().unwrap();
        assert_eq!(
            automatic_address6("v6--4", p126),
            None,
            "beyond the host part"
        );
        assert_eq!(automatic_address6("v6--1", p126), "fd12::99".parse().ok());

        let mut s = server(false);
        // Held (without a name): AAAA, and no A; not held: NXDOMAIN.
        let r = ask(&mut s, "V6--0000000000000099.lab.", RecordType::AAAA);
        assert!(r.metadata.authoritative);
        assert_eq!(aaaa_of(&r), vec![a]);
        let r = ask(&mut s, "v6--0000000000000099.lab.", RecordType::A);
        assert_eq!(
            (r.metadata.response_code, r.answers.len()),
            (ResponseCode::NoError, 0)
        );
        let r = ask(&mut s, "v6--0000000000000098.lab.", RecordType::AAAA);
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
        // A named member's address has one too.
        let r = ask(&mut s, "v6--0000000000000007.lab.", RecordType::ANY);
        assert_eq!(aaaa_of(&r), vec![WEB6.parse::<Ipv6Addr>().unwrap()]);
        // Not of the prefix's width: no such name.
        let r = ask(&mut s, "v6--99.lab.", RecordType::AAAA);
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
    }

    #[test]
    fn a_flood_is_cut_to_its_sources_rate_and_counted_by_reason() {
        let mut s = server(false);
        let t = Instant::now();
        let noisy = Ipv4Addr::new(10, 250, 0, 66);
        let verdicts: Vec<_> = (0..2000).map(|_| s.admit(t, noisy, true)).collect();
        let answered = verdicts.iter().filter(|v| **v == Verdict::Answer).count();
        assert_eq!(answered, 500);
        let st = s.stats();
        // Rate 500: half a second of queue, the rate in truncated answers, the rest dropped.
        assert_eq!(
            (
                st.rate_limited_delayed,
                st.rate_limited_truncated,
                st.rate_limited_dropped
            ),
            (250, 500, 750)
        );
        // Another source has its own bucket.
        assert_eq!(
            s.admit(t, Ipv4Addr::new(10, 250, 0, 7), true),
            Verdict::Answer
        );
        // A second later the queue has drained and half the rate is back.
        let later = t + std::time::Duration::from_secs(1);
        let again = (0..500)
            .filter(|_| s.admit(later, noisy, true) == Verdict::Answer)
            .count();
        assert_eq!(again, 250);
    }

    #[test]
    fn a_truncated_answer_is_empty_with_tc_and_the_question() {
        let mut q = Message::query();
        q.metadata.id = 0x4242;
        q.metadata.recursion_desired = true;
        q.add_query(Query::query(
            Name::from_ascii("web.lab.").unwrap(),
            RecordType::A,
        ));
        let r = Message::from_vec(&truncated_answer(&q.to_vec().unwrap()).unwrap()).unwrap();
        assert_eq!(
            (
                r.metadata.id,
                r.metadata.message_type,
                r.metadata.truncation,
                r.metadata.recursion_desired
            ),
            (0x4242, MessageType::Response, true, true)
        );
        assert_eq!(r.queries, q.queries);
        assert!(r.answers.is_empty());
        assert_eq!(truncated_answer(b"junk"), None);
        let answer = r.to_vec().unwrap();
        assert_eq!(truncated_answer(&answer), None, "an answer is not a query");
    }

    #[test]
    fn outside_the_zone_is_forwarded_or_refused() {
        let mut s = server(false);
        let r = ask(&mut s, "example.com.", RecordType::A);
        assert_eq!(r.metadata.response_code, ResponseCode::Refused);
        assert!(!r.metadata.recursion_available);
        // A reverse name outside the subnet is outside the zone too.
        let r = ask(&mut s, "1.1.168.192.in-addr.arpa.", RecordType::PTR);
        assert_eq!(r.metadata.response_code, ResponseCode::Refused);
        let mut f = server(true);
        let mut q = Message::query();
        q.add_query(Query::query(
            Name::from_ascii("example.com.").unwrap(),
            RecordType::A,
        ));
        assert_eq!(f.handle(&q.to_vec().unwrap(), &store()), Answer::Forward);
        assert!(f.forwards() && !s.forwards());
        assert_eq!(f.stats().forwarded, 1);
    }

    #[test]
    fn malformed_queries_get_formerr_or_are_dropped() {
        let mut s = server(false);
        let mut q = Message::query();
        q.add_query(Query::query(
            Name::from_ascii("web.lab.").unwrap(),
            RecordType::A,
        ));
        let good = q.to_vec().unwrap();
        // Header only and a cut question: FORMERR with the id.
        match s.handle(&good[..good.len() - 3], &store()) {
            Answer::Reply(b) => {
                let r = Message::from_vec(&b).unwrap();
                assert_eq!(
                    (r.metadata.id, r.metadata.response_code),
                    (q.metadata.id, ResponseCode::FormErr)
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.handle(&good[..5], &store()), Answer::Drop);
        // A response is never answered (no reflection loops).
        let mut resp = q.clone();
        resp.metadata.message_type = MessageType::Response;
        assert_eq!(s.handle(&resp.to_vec().unwrap(), &store()), Answer::Drop);
        // Two questions: FORMERR. Every prefix and corruption: no panic.
        let mut two = q.clone();
        two.add_query(Query::query(
            Name::from_ascii("db.lab.").unwrap(),
            RecordType::A,
        ));
        assert!(matches!(
            s.handle(&two.to_vec().unwrap(), &store()),
            Answer::Reply(_)
        ));
        for n in 0..good.len() {
            let _ = s.handle(&good[..n], &store());
            for v in [0u8, 0x3f, 0xc0, 0xff] {
                let mut c = good.clone();
                c[n] = v;
                let _ = s.handle(&c, &store());
            }
        }
        assert!(s.stats().errors >= 2);
    }
}
