//! The flows a policy allowed, so their replies pass: a bounded connection table
//! ([`FlowTable`]) and the check each end of a tunnel runs on every IPv4 and IPv6 packet
//! ([`Firewall::check`]).
//!
//! A flow is keyed by protocol and both ends' addresses and ports (ICMP echo: its
//! identifier as both ports), written from its initiator's side. A packet that belongs to
//! a flow in the table passes whichever way it goes; any other is decided by the rules
//! ([`super::Policy::decide`]) as a new flow from its sender and, if allowed, remembered.
//! ICMP errors pass only for a flow in the table (the packet they quote). Timeouts are
//! Nebula's: TCP 12 minutes (10 s once a FIN or RST was seen), UDP 3 minutes, anything
//! else 10 minutes. A full table evicts its least recently used flow (counted): the flow,
//! if it goes on, is decided again by its next packet.
//!
//! Non-first fragments carry no ports: they pass (the kernel reassembles them only with
//! their first fragment, which was checked).
//!
//! IPv6: the transport header is found past the extension headers (hop-by-hop, routing,
//! destination options, fragment; at most [`MAX_EXTENSIONS`]); ICMPv6 echo is keyed by
//! its identifier and ICMPv6 errors (destination unreachable, packet too big, time
//! exceeded, parameter problem) pass only for the flow they quote, as ICMP's do.

use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use hashlink::LruCache;

use super::{proto, Decision, Packet, Policy, Tags};
use crate::wire::{upper_layer6, Upper6};

/// Flows a table keeps by default.
pub const DEFAULT_FLOWS: usize = 65536;

/// An established TCP flow is forgotten after this long idle.
pub const TCP_TIMEOUT: Duration = Duration::from_secs(12 * 60);
/// A TCP flow after a FIN or RST.
pub const TCP_CLOSING_TIMEOUT: Duration = Duration::from_secs(10);
/// A UDP flow.
pub const UDP_TIMEOUT: Duration = Duration::from_secs(3 * 60);
/// Any other flow (ICMP echo, other protocols).
pub const OTHER_TIMEOUT: Duration = Duration::from_secs(10 * 60);

const TCP_FIN: u8 = 0x01;
const TCP_RST: u8 = 0x04;

const ICMP_ECHO_REPLY: u8 = 0;
const ICMP_UNREACHABLE: u8 = 3;
const ICMP_ECHO: u8 = 8;
const ICMP_TIME_EXCEEDED: u8 = 11;
const ICMP_PARAMETER_PROBLEM: u8 = 12;

/// ICMPv6 errors are types 1 to 4 (RFC 4443 2.1: below 128); echo is 128 and 129.
const ICMPV6_LAST_ERROR: u8 = 4;
const ICMPV6_ECHO: u8 = 128;
const ICMPV6_ECHO_REPLY: u8 = 129;

/// IPv6 extension headers walked before the transport header gives up (a chain longer
/// than this is malformed here, and denied).
pub use crate::wire::MAX_EXTENSIONS;

/// One direction of a flow: protocol, addresses and ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowKey {
    /// IP protocol.
    pub proto: u8,
    /// Sender.
    pub src: IpAddr,
    /// Receiver.
    pub dst: IpAddr,
    /// Sender's port (ICMP echo: its identifier).
    pub sport: u16,
    /// Receiver's port (ICMP echo: its identifier).
    pub dport: u16,
}

impl Hash for FlowKey {
    /// One word for the protocol and ports, then each address as one integer: three
    /// hasher calls a lookup whatever the family (a derived hash adds each address's
    /// variant and length; the table looks up every packet of every flow).
    fn hash<H: Hasher>(&self, state: &mut H) {
        let ports = u64::from(self.proto) << 32 | u64::from(self.sport) << 16;
        state.write_u64(ports | u64::from(self.dport));
        for address in [self.src, self.dst] {
            match address {
                IpAddr::V4(a) => state.write_u32(a.to_bits()),
                IpAddr::V6(a) => state.write_u128(a.to_bits()),
            }
        }
    }
}

impl FlowKey {
    /// The other direction.
    pub fn reverse(self) -> Self {
        Self {
            proto: self.proto,
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
        }
    }
}

/// What an IP packet is to the connection table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// A packet of a flow (`flags`: TCP flags, else 0).
    Flow {
        /// Its direction.
        key: FlowKey,
        /// TCP flags.
        flags: u8,
    },
    /// An ICMP error quoting a packet of flow `quoted` (as the quoted packet went).
    IcmpError {
        /// The quoted packet's direction.
        quoted: FlowKey,
        /// The error's own sender and receiver.
        from: IpAddr,
        /// See `from`.
        to: IpAddr,
    },
    /// A fragment after the first.
    Fragment,
    /// Too short, or neither IPv4 nor IPv6.
    Malformed,
}

/// Reads the flow of IP packet `ip` (IPv4 or IPv6).
pub fn parse(ip: &[u8]) -> Parsed {
    if ip.first().is_some_and(|b| b >> 4 == 6) {
        return parse6(ip);
    }
    let Some((key, flags, rest)) = parse_header(ip, true) else {
        return if is_later_fragment(ip) {
            Parsed::Fragment
        } else {
            Parsed::Malformed
        };
    };
    if key.proto == proto::ICMP {
        let icmp_type = rest.first().copied().unwrap_or(0);
        if matches!(
            icmp_type,
            ICMP_UNREACHABLE | ICMP_TIME_EXCEEDED | ICMP_PARAMETER_PROBLEM
        ) {
            // The quoted header starts after the 8-byte ICMP header; ports need only its
            // first 8 bytes, which every error carries.
            return match rest.get(8..).and_then(|q| parse_header(q, false)) {
                Some((quoted, _, _)) => Parsed::IcmpError {
                    quoted,
                    from: key.src,
                    to: key.dst,
                },
                None => Parsed::Malformed,
            };
        }
    }
    Parsed::Flow { key, flags }
}

fn is_later_fragment(ip: &[u8]) -> bool {
    ip.len() >= 20 && ip[0] >> 4 == 4 && (u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff) != 0
}

/// Protocol, addresses, ports (or echo id), TCP flags and the transport bytes of `ip`.
/// `whole`: the packet is whole (not a quote in an ICMP error, which may be cut short).
fn parse_header(ip: &[u8], whole: bool) -> Option<(FlowKey, u8, &[u8])> {
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ihl < 20 || ip.len() < ihl {
        return None;
    }
    if whole && (u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff) != 0 {
        return None;
    }
    // A whole packet is what its total length says (bytes after it are no part of it).
    let end = match whole {
        true => usize::from(u16::from_be_bytes([ip[2], ip[3]])),
        false => ip.len(),
    };
    let rest = ip.get(ihl..end)?;
    let proto = ip[9];
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let (sport, dport, flags) = transport(proto, rest, whole)?;
    let key = FlowKey {
        proto,
        src: src.into(),
        dst: dst.into(),
        sport,
        dport,
    };
    Some((key, flags, rest))
}

/// Ports (or an echo's identifier as both) and TCP flags of the transport header `rest`
/// of protocol `proto`. `whole`: flags are read (a quote may be cut after the ports).
fn transport(proto: u8, rest: &[u8], whole: bool) -> Option<(u16, u16, u8)> {
    let port = |i: usize| rest.get(i..i + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
    Some(match proto {
        proto::TCP => (port(0)?, port(2)?, if whole { *rest.get(13)? } else { 0 }),
        proto::UDP => (port(0)?, port(2)?, 0),
        proto::ICMP | proto::ICMPV6 => match rest.first() {
            Some(&(ICMP_ECHO | ICMP_ECHO_REPLY)) if proto == proto::ICMP => {
                let id = port(4)?;
                (id, id, 0)
            }
            Some(&(ICMPV6_ECHO | ICMPV6_ECHO_REPLY)) if proto == proto::ICMPV6 => {
                let id = port(4)?;
                (id, id, 0)
            }
            Some(_) => (0, 0, 0),
            None => return None,
        },
        _ => (0, 0, 0),
    })
}

/// Reads the flow of IPv6 packet `ip`.
fn parse6(ip: &[u8]) -> Parsed {
    match parse_header6(ip, true) {
        Header6::Parsed(key, _, rest)
            if key.proto == proto::ICMPV6
                && rest
                    .first()
                    .is_some_and(|&t| (1..=ICMPV6_LAST_ERROR).contains(&t)) =>
        {
            // The quoted packet starts after the 8-byte ICMPv6 header.
            match rest.get(8..).map(|q| parse_header6(q, false)) {
                Some(Header6::Parsed(quoted, _, _)) => Parsed::IcmpError {
                    quoted,
                    from: key.src,
                    to: key.dst,
                },
                _ => Parsed::Malformed,
            }
        }
        Header6::Parsed(key, flags, _) => Parsed::Flow { key, flags },
        Header6::LaterFragment => Parsed::Fragment,
        Header6::Malformed => Parsed::Malformed,
    }
}

enum Header6<'a> {
    Parsed(FlowKey, u8, &'a [u8]),
    LaterFragment,
    Malformed,
}

/// [`parse_header`] for IPv6: past the extension headers to the transport header. A
/// quote (`whole` false) may end after the transport header's first 8 bytes.
fn parse_header6(ip: &[u8], whole: bool) -> Header6<'_> {
    if ip.len() < 40 || ip[0] >> 4 != 6 {
        return Header6::Malformed;
    }
    // The packet is what its payload length says (bytes after it are no part of it); a
    // whole one shorter than that is malformed. A quote may be cut anywhere.
    let end = 40 + usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    let ip = match ip.get(..end) {
        Some(ip) => ip,
        None if whole => return Header6::Malformed,
        None => ip,
    };
    let address = |at: usize| {
        <[u8; 16]>::try_from(&ip[at..at + 16])
            .map(Ipv6Addr::from)
            .map(IpAddr::V6)
    };
    let (Ok(src), Ok(dst)) = (address(8), address(24)) else {
        return Header6::Malformed;
    };
    let (proto, at) = match upper_layer6(ip) {
        Upper6::At { proto, at } => (proto, at),
        Upper6::LaterFragment => return Header6::LaterFragment,
        Upper6::Malformed => return Header6::Malformed,
    };
    let rest = &ip[at..];
    let Some((sport, dport, flags)) = transport(proto, rest, whole) else {
        return Header6::Malformed;
    };
    let key = FlowKey {
        proto,
        src,
        dst,
        sport,
        dport,
    };
    Header6::Parsed(key, flags, rest)
}

/// A flow kept: when it was last seen, what it may still do, which rule allowed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Flow {
    last: Instant,
    closing: bool,
    decision: Decision,
}

/// Counters of a table.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FlowStats {
    /// Flows opened.
    pub opened: u64,
    /// Flows evicted from a full table, least recently used first.
    pub evicted: u64,
    /// Flows that timed out.
    pub expired: u64,
}

/// The connection table: at most `capacity` flows, least recently used evicted first.
pub struct FlowTable {
    flows: LruCache<FlowKey, Flow>,
    capacity: usize,
    stats: FlowStats,
}

impl FlowTable {
    /// A table of at most `capacity` flows (at least one).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            flows: LruCache::new(capacity),
            capacity,
            stats: FlowStats::default(),
        }
    }

    /// Most flows it holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Flows held.
    pub fn len(&self) -> usize {
        self.flows.len()
    }

    /// Whether it holds no flow.
    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    /// Counters.
    pub fn stats(&self) -> FlowStats {
        self.stats
    }

    fn timeout(key: &FlowKey, flow: &Flow) -> Duration {
        match key.proto {
            proto::TCP if flow.closing => TCP_CLOSING_TIMEOUT,
            proto::TCP => TCP_TIMEOUT,
            proto::UDP => UDP_TIMEOUT,
            _ => OTHER_TIMEOUT,
        }
    }

    /// The flow `key` belongs to, either way, if it is live at `now`: seen again (`flags`
    /// moves a TCP flow to closing). Returns the decision that opened it.
    pub fn touch(&mut self, now: Instant, key: FlowKey, flags: u8) -> Option<Decision> {
        for k in [key, key.reverse()] {
            let Some(flow) = self.flows.get_mut(&k) else {
                continue;
            };
            if now.saturating_duration_since(flow.last) > Self::timeout(&k, flow) {
                self.flows.remove(&k);
                self.stats.expired += 1;
                return None;
            }
            flow.last = now;
            if flags & (TCP_FIN | TCP_RST) != 0 {
                flow.closing = true;
            }
            return Some(flow.decision);
        }
        None
    }

    /// Whether flow `key` (either way) is in the table and live, without touching it.
    pub fn contains(&self, now: Instant, key: FlowKey) -> bool {
        [key, key.reverse()].iter().any(|k| {
            self.flows
                .peek(k)
                .is_some_and(|f| now.saturating_duration_since(f.last) <= Self::timeout(k, f))
        })
    }

    /// Remembers a new flow opened by `key`'s sender, allowed by `decision`.
    pub fn open(&mut self, now: Instant, key: FlowKey, flags: u8, decision: Decision) {
        if self.flows.len() >= self.capacity && !self.flows.contains_key(&key) {
            self.flows.remove_lru();
            self.stats.evicted += 1;
        }
        self.stats.opened += 1;
        self.flows.insert(
            key,
            Flow {
                last: now,
                closing: flags & (TCP_FIN | TCP_RST) != 0,
                decision,
            },
        );
    }

    /// Drops the flows that timed out by `now`.
    pub fn expire(&mut self, now: Instant) {
        let before = self.flows.len();
        self.flows
            .retain(|k, f| now.saturating_duration_since(f.last) <= Self::timeout(k, f));
        self.stats.expired += (before - self.flows.len()) as u64;
    }

    /// Keeps only the flows `keep` still allows (a new policy), each with its new decision.
    pub fn recheck(&mut self, mut keep: impl FnMut(&FlowKey) -> Option<Decision>) -> usize {
        let before = self.flows.len();
        self.flows.retain(|k, f| match keep(k) {
            Some(d) => {
                f.decision = d;
                true
            }
            None => false,
        });
        before - self.flows.len()
    }
}

/// What the firewall does with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It passes (a flow in the table, or one a rule or the default allows).
    Pass,
    /// Dropped: no rule allows it.
    Deny,
    /// Dropped, and the sender should be told (the policy rejects): a TCP reset or an
    /// ICMP port unreachable.
    Reject,
    /// Dropped: an ICMP error for no flow in the table.
    StrayIcmpError,
}

/// Counters of a firewall.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FirewallStats {
    /// Flows each rule opened (by rule index).
    pub rule_hits: Vec<u64>,
    /// Flows the default opened.
    pub default_hits: u64,
    /// Packets denied (no rule; default deny).
    pub denied: u64,
    /// Of those, answered with a reset or port unreachable.
    pub rejected: u64,
    /// ICMP errors dropped for no flow in the table.
    pub stray_icmp_errors: u64,
    /// Packets denied because their headers could not be read (too short for them, an
    /// IPv6 header chain too long): a first fragment too short for its TCP header would
    /// otherwise hide its flags and ports from the rules (RFC 1858's tiny fragments).
    /// Counted in `denied` too.
    pub unparsed: u64,
    /// Flows dropped because a new policy no longer allows them.
    pub flows_revoked: u64,
}

/// One end's policy and the flows it allowed.
pub struct Firewall {
    policy: Policy,
    flows: FlowTable,
    stats: FirewallStats,
}

impl Firewall {
    /// `policy`, with a table of `capacity` flows.
    pub fn new(policy: Policy, capacity: usize) -> Self {
        let stats = FirewallStats {
            rule_hits: vec![0; policy.rule_count()],
            ..FirewallStats::default()
        };
        Self {
            policy,
            flows: FlowTable::new(capacity),
            stats,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The connection table.
    pub fn flows(&self) -> &FlowTable {
        &self.flows
    }

    /// Counters.
    pub fn stats(&self) -> &FirewallStats {
        &self.stats
    }

    /// Whether every packet passes unchecked (no policy).
    pub fn is_open(&self) -> bool {
        self.policy.is_allow_all()
    }

    /// Decides IP packet `ip` (IPv4 or IPv6), sent by a member tagged `from` to one tagged `to`, at
    /// `now`: a packet of a live flow passes; a new flow passes if the policy allows it
    /// and is remembered.
    pub fn check(&mut self, now: Instant, ip: &[u8], from: Tags, to: Tags) -> Verdict {
        if self.is_open() {
            return Verdict::Pass;
        }
        let (key, flags) = match parse(ip) {
            Parsed::Flow { key, flags } => (key, flags),
            Parsed::IcmpError { quoted, from, to } => {
                // About a flow in the table, from its other end to the end that sent the
                // quoted packet: a member cannot break (or shrink the MTU of) a flow
                // between two others with a forged error (RFC 5927). Errors from routers
                // on the way (behind a router member) do not pass.
                let ends = from == quoted.dst && to == quoted.src;
                return if ends && self.flows.contains(now, quoted) {
                    Verdict::Pass
                } else {
                    self.stats.stray_icmp_errors += 1;
                    Verdict::StrayIcmpError
                };
            }
            Parsed::Fragment => return Verdict::Pass,
            Parsed::Malformed => {
                self.stats.unparsed += 1;
                self.stats.denied += 1;
                return Verdict::Deny;
            }
        };
        if self.flows.touch(now, key, flags).is_some() {
            return Verdict::Pass;
        }
        let packet = Packet {
            src: key.src,
            dst: key.dst,
            proto: key.proto,
            dport: key.dport,
        };
        let decision = self.policy.decide(from, to, &packet);
        match decision {
            Decision::Rule(i) => {
                if let Some(n) = self.stats.rule_hits.get_mut(usize::from(i)) {
                    *n += 1;
                }
            }
            Decision::DefaultAllow => self.stats.default_hits += 1,
            Decision::DefaultDeny => {
                self.stats.denied += 1;
                let unicast = match key.dst {
                    IpAddr::V4(a) => !a.is_multicast() && !a.is_broadcast(),
                    IpAddr::V6(a) => !a.is_multicast(),
                };
                let answerable = matches!(key.proto, proto::TCP | proto::UDP)
                    && !(key.proto == proto::TCP && flags & TCP_RST != 0)
                    && unicast;
                if self.policy.rejects() && answerable {
                    self.stats.rejected += 1;
                    return Verdict::Reject;
                }
                return Verdict::Deny;
            }
        }
        // A TCP flow is picked up mid-stream too (an agent that restarted, a flow evicted
        // from a full table): the rules decide it like a new one.
        self.flows.open(now, key, flags, decision);
        Verdict::Pass
    }

    /// Decides a layer-2 frame carrying `ethertype`, sent by a member tagged `from` to one
    /// tagged `to` ([`Policy::decide_frame`]); whether it passes. Counted as packets are.
    pub fn check_frame(&mut self, ethertype: u16, from: Tags, to: Tags) -> bool {
        if self.is_open() {
            return true;
        }
        match self.policy.decide_frame(from, to, ethertype) {
            Decision::Rule(i) => {
                if let Some(n) = self.stats.rule_hits.get_mut(usize::from(i)) {
                    *n += 1;
                }
                true
            }
            Decision::DefaultAllow => {
                self.stats.default_hits += 1;
                true
            }
            Decision::DefaultDeny => {
                self.stats.denied += 1;
                false
            }
        }
    }

    /// Forgets flows that timed out.
    pub fn expire(&mut self, now: Instant) {
        self.flows.expire(now);
    }

    /// Puts `policy` in place. Flows in the table are decided again by it, with
    /// `tags_of` giving each end's tags under the new policy: those it still allows go
    /// on, the others are dropped (their next packet is decided afresh, and denied).
    pub fn replace(&mut self, policy: Policy, mut tags_of: impl FnMut(IpAddr) -> Tags) {
        self.policy = policy;
        self.stats.rule_hits = vec![0; self.policy.rule_count()];
        let policy = &self.policy;
        let dropped = self.flows.recheck(|k| {
            let packet = Packet {
                src: k.src,
                dst: k.dst,
                proto: k.proto,
                dport: k.dport,
            };
            let d = policy.decide(tags_of(k.src), tags_of(k.dst), &packet);
            d.allows().then_some(d)
        });
        self.stats.flows_revoked += dropped as u64;
    }
}
