//! One namespace's virtual DNS service at the service address: queries over UDP (that the
//! switch intercepts) and TCP (the [`tcp`] service stack) are answered by the zone
//! [`dns::Server`] from what this member holds, a short cache of DHT reads, and DHT reads
//! the query waits for; names outside the zone go to the configured resolvers.
//!
//! Sans-I/O like the rest of the crate. The driver feeds queries, service packets,
//! resolver datagrams, the results of the reads [`Service::poll_lookup`] asks for
//! ([`Service::handle_lookup`]) and [`Service::handle_timeout`] when
//! [`Service::poll_timeout`] is due; after each, it sends what [`Service::poll_udp_answer`],
//! [`Service::poll_service_packet`] and [`Service::poll_transmit`] return and
//! starts the reads of [`Service::poll_lookup`]. What this member holds itself comes from
//! a [`Held`] passed with each input. `C` is how the driver names a UDP client (its MAC,
//! address and port).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use ipnet::{Ipv4Net, Ipv6Net};

use crate::dns::{self, Answer, Holder, Missing, Names};
use crate::forward::{Forwarder, Taken, Transmit};
use crate::limit::{self, Verdict};
use crate::tcp;

/// An Ethernet address: where the service stack's packets go.
pub type Mac = [u8; 6];

/// What this member holds itself: answered without a DHT read.
pub trait Held {
    /// The address `host` stands for, if this member holds the name.
    fn address_for(&self, host: &str) -> Option<Ipv4Addr>;
    /// If this member holds `address`: the name held with it, if any.
    fn holder_of(&self, address: Ipv4Addr) -> Option<Option<String>>;
    /// The IPv6 address `host` stands for, if this member holds the name and has one.
    fn address6_for(&self, _host: &str) -> Option<Ipv6Addr> {
        None
    }
    /// If this member holds the IPv6 `address`: the name held with it, if any.
    fn holder_of6(&self, _address: Ipv6Addr) -> Option<Option<String>> {
        None
    }
}

/// What a DHT read found for a [`Missing`] key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The address a name stands for (`None`: nobody holds the name), and its IPv6 address
    /// if it has one.
    Name(Option<Ipv4Addr>, Option<Ipv6Addr>),
    /// Whether someone holds an address, and the name it carries (`None`: nobody).
    Holder(Option<Option<String>>),
}

/// How long a name or address read from the DHT is answered from the cache.
pub const CACHE_TTL: Duration = Duration::from_secs(10);

/// How long "nobody holds it" is remembered.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(2);

/// Queries waiting for DHT reads at once; beyond, new ones get SERVFAIL.
pub const MAX_WAITING: usize = 256;

/// UDP queries held back for their turn (over their source's rate) at once; beyond, a
/// query over its rate is answered truncated at once.
pub const MAX_PACED: usize = 4096;

/// A query waiting this long for a DHT read gets SERVFAIL.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(4);

/// Cache entries kept (names plus addresses); beyond, the cache starts over.
const MAX_CACHE: usize = 4096;

/// IPv6 holders cached (reverse lookups); beyond, that cache alone starts over.
const MAX_CACHE6: usize = 1024;

/// IPv4 and UDP headers: a UDP answer is at most the namespace MTU less these. A larger
/// forwarded answer is sent truncated (the client asks again over TCP).
const UDP_OVERHEAD: usize = 28;
/// The same over IPv6 (its header is 20 bytes longer). DNS over TCP is served at the IPv4
/// service address only: an IPv6 client's retry must go there.
const UDP_OVERHEAD6: usize = 48;

/// Who asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker<C> {
    /// Over UDP, from this host (or LAN host); over IPv6 if the flag is set.
    Udp(C, bool),
    /// Over a TCP connection of the service stack.
    Tcp(tcp::ConnId),
}

/// Counters, for status.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    /// Queries over UDP.
    pub udp_queries: u64,
    /// Queries over TCP.
    pub tcp_queries: u64,
    /// DHT reads started for queries.
    pub lookups: u64,
    /// Queries answered SERVFAIL (lookup or resolvers timed out, too many waiting).
    pub servfail: u64,
    /// Answers from the resolvers passed back.
    pub forwarded_answers: u64,
    /// Truncated UDP answers from the resolvers, asked again over TCP.
    pub forwarded_truncated: u64,
    /// Messages that came back for forwarded queries and were not taken (wrong resolver,
    /// id or question).
    pub resolver_rejected: u64,
    /// Queries and service packets dropped before the namespace's subnet was known.
    pub not_ready: u64,
}

struct Waiting<C> {
    query: Vec<u8>,
    asker: Asker<C>,
    missing: Missing,
    since: Instant,
}

/// A UDP query over its source's rate, held until its turn.
struct Paced<C> {
    at: Instant,
    /// Arrival order: queries due at the same instant go in order.
    seq: u64,
    query: Vec<u8>,
    client: C,
    ipv6: bool,
}

impl<C> PartialEq for Paced<C> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl<C> Eq for Paced<C> {}

impl<C> PartialOrd for Paced<C> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<C> Ord for Paced<C> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// The namespace's zone, once its subnet is known.
struct Zone {
    name: String,
    subnet: Ipv4Net,
}

/// One namespace's DNS service.
pub struct Service<C> {
    forwarder: Forwarder<Asker<C>>,
    /// The namespace MTU: the service stack's, and (less headers) the largest UDP answer.
    mtu: u16,
    /// Seeds the service stack (TCP initial sequence numbers).
    tcp_seed: u64,
    /// UDP queries per second per source (0: no limit).
    rate: u32,
    zone: Option<Zone>,
    /// A multi-subnet namespace's other subnets ([`Service::set_routed`]).
    routed: Vec<Ipv4Net>,
    server: Option<dns::Server>,
    tcp: Option<tcp::Endpoint>,
    /// Where the service stack's packets go: the MAC each client address spoke from.
    macs: HashMap<Ipv4Addr, Mac>,
    names: HashMap<String, (Option<Ipv4Addr>, Option<Ipv6Addr>, Instant)>,
    holders: HashMap<Ipv4Addr, (Option<Holder>, Instant)>,
    holders6: HashMap<Ipv6Addr, (Option<Holder>, Instant)>,
    /// A dual-stack namespace's IPv6 prefix ([`Service::set_prefix6`]).
    prefix6: Option<Ipv6Net>,
    /// Reads asked for and not answered yet.
    reading: HashSet<Missing>,
    lookups: VecDeque<Missing>,
    waiting: Vec<Waiting<C>>,
    /// UDP queries over their source's rate, earliest turn first.
    paced: BinaryHeap<Reverse<Paced<C>>>,
    paced_seq: u64,
    udp_answers: VecDeque<(C, Vec<u8>)>,
    stats: Stats,
}

impl<C: Copy> Service<C> {
    /// A service that forwards names outside the zone to `resolvers` (none: REFUSED), on
    /// a namespace of MTU `mtu`. `seed` seeds forwarded query ids and the TCP stack's
    /// sequence numbers: seed it from the OS.
    pub fn new(resolvers: Vec<SocketAddr>, mtu: u16, seed: [u8; 32]) -> Self {
        let mut tcp_seed = [0u8; 8];
        tcp_seed.copy_from_slice(&seed[..8]);
        // The forwarder's ids and the stack's numbers come from one seed, never the same
        // stream: the forwarder's RNG is keyed by the whole seed with its first byte flipped.
        let mut forward_seed = seed;
        forward_seed[0] ^= 0xff;
        Self {
            forwarder: Forwarder::new(resolvers, forward_seed),
            mtu,
            tcp_seed: u64::from_le_bytes(tcp_seed),
            rate: limit::DEFAULT_RATE,
            zone: None,
            routed: Vec::new(),
            server: None,
            tcp: None,
            macs: HashMap::new(),
            names: HashMap::new(),
            holders: HashMap::new(),
            holders6: HashMap::new(),
            prefix6: None,
            reading: HashSet::new(),
            lookups: VecDeque::new(),
            waiting: Vec::new(),
            paced: BinaryHeap::new(),
            paced_seq: 0,
            udp_answers: VecDeque::new(),
            stats: Stats::default(),
        }
    }

    /// The same service with UDP queries limited to `rate` a second per source address
    /// (also the burst; 0: no limit) instead of [`limit::DEFAULT_RATE`].
    pub fn with_rate(mut self, rate: u32) -> Self {
        self.rate = rate;
        self
    }

    /// The namespace `name` with `subnet`: queries are answered from now on (before, they
    /// are dropped and counted `not_ready`).
    pub fn set_zone(&mut self, name: &str, subnet: Ipv4Net) {
        // Queries to the service address itself would come straight back here.
        let own = std::net::IpAddr::V4(service_address(subnet));
        self.forwarder.retain_resolvers(|r| r.ip() != own);
        self.zone = Some(Zone {
            name: name.to_string(),
            subnet,
        });
    }

    /// A dual-stack namespace's IPv6 prefix: members' names answer AAAA in it, and its
    /// ip6.arpa names PTR. Set before the zone is ready.
    pub fn set_prefix6(&mut self, prefix6: Option<Ipv6Net>) {
        self.prefix6 = prefix6;
    }

    /// A multi-subnet namespace's other subnets: names of members there are the zone's
    /// too. Kept across [`Service::set_zone`].
    pub fn set_routed(&mut self, routed: Vec<Ipv4Net>) {
        if let Some(server) = self.server.as_mut() {
            server.set_routed(routed.clone());
        }
        self.routed = routed;
    }

    /// Counters: the service's, the zone server's, the TCP stack's.
    pub fn stats(&self) -> (Stats, dns::Stats, tcp::Stats) {
        (
            self.stats,
            self.server.as_ref().map(|s| s.stats()).unwrap_or_default(),
            self.tcp.as_ref().map(|t| t.stats()).unwrap_or_default(),
        )
    }

    /// The configured resolvers.
    pub fn resolvers(&self) -> &[SocketAddr] {
        self.forwarder.resolvers()
    }

    /// The zone server and the service stack, once the namespace's subnet is known.
    fn ready(&mut self, now: Instant) -> Option<&mut dns::Server> {
        let zone = self.zone.as_ref()?;
        if self.server.is_none() {
            // Namespace names are checked labels; the zone is the name as a DNS name.
            let name = format!("{}.", zone.name).parse().ok()?;
            self.server = Some(dns::Server::new(dns::Settings {
                zone: name,
                subnet: zone.subnet,
                routed: self.routed.clone(),
                prefix6: self.prefix6,
                forward: !self.forwarder.resolvers().is_empty(),
                rate: self.rate,
            }));
            self.tcp = Some(
                tcp::Endpoint::with_seed(
                    service_address(zone.subnet),
                    zone.subnet.prefix_len(),
                    self.tcp_seed,
                    now,
                )
                .with_mtu(self.mtu),
            );
        }
        self.server.as_mut()
    }

    /// A query over UDP from `client`, whose source address is `source` (what its rate
    /// limit counts).
    pub fn handle_udp_query(
        &mut self,
        now: Instant,
        query: &[u8],
        source: impl Into<IpAddr>,
        client: C,
        held: &impl Held,
    ) {
        self.stats.udp_queries += 1;
        let can_wait = self.paced.len() < MAX_PACED;
        let Some(server) = self.ready(now) else {
            self.stats.not_ready += 1;
            return;
        };
        let source = source.into();
        let ipv6 = source.is_ipv6();
        match server.admit(now, source, can_wait) {
            Verdict::Answer => self.answer(query.to_vec(), Asker::Udp(client, ipv6), now, held),
            Verdict::Delay(at) => {
                self.paced_seq += 1;
                self.paced.push(Reverse(Paced {
                    at,
                    seq: self.paced_seq,
                    query: query.to_vec(),
                    client,
                    ipv6,
                }));
            }
            Verdict::Truncate => {
                if let Some(answer) = dns::truncated_answer(query) {
                    self.udp_answers.push_back((client, answer));
                }
            }
            Verdict::Drop => {}
        }
    }

    /// A packet for the service stack (DNS over TCP, ping) from `mac`.
    pub fn handle_service_packet(
        &mut self,
        now: Instant,
        packet: &[u8],
        mac: Mac,
        held: &impl Held,
    ) {
        if self.ready(now).is_none() {
            self.stats.not_ready += 1;
            return;
        }
        if let Some(src) = packet.get(12..16) {
            let src = Ipv4Addr::new(src[0], src[1], src[2], src[3]);
            if self.macs.len() >= MAX_CACHE && !self.macs.contains_key(&src) {
                self.macs.clear();
            }
            self.macs.insert(src, mac);
        }
        let Some(tcp) = self.tcp.as_mut() else {
            return;
        };
        tcp.handle_packet(now, packet);
        self.drain_tcp(now, held);
    }

    /// Queries over TCP are not rate limited per query: each connection cost its client a
    /// handshake (no spoofed sources), and the stack bounds them ([`tcp::MAX_CONNECTIONS`]
    /// connections, [`tcp::MAX_PIPELINED`] unanswered queries each, then flow control),
    /// which is also where a client that
    /// was sent a truncated answer over UDP gets its whole answer.
    fn drain_tcp(&mut self, now: Instant, held: &impl Held) {
        while let Some((conn, query)) = self.tcp.as_mut().and_then(tcp::Endpoint::poll_query) {
            self.stats.tcp_queries += 1;
            self.answer(query, Asker::Tcp(conn), now, held);
        }
    }

    /// A query that gets no answer: a TCP connection stops waiting for it.
    fn unanswered(&mut self, asker: Asker<C>, now: Instant) {
        if let (Asker::Tcp(conn), Some(tcp)) = (asker, self.tcp.as_mut()) {
            tcp.abandon(conn, now);
        }
    }

    /// Answers `query` from what is known, or starts what it needs.
    fn answer(&mut self, query: Vec<u8>, asker: Asker<C>, now: Instant, held: &impl Held) {
        let view = View {
            held,
            names: &self.names,
            holders: &self.holders,
            holders6: &self.holders6,
            now,
        };
        let Some(server) = self.server.as_mut() else {
            return;
        };
        match server.handle(&query, &view) {
            Answer::Reply(bytes) => self.send(asker, bytes, now),
            Answer::Drop => self.unanswered(asker, now),
            Answer::Forward => {
                let tcp = matches!(asker, Asker::Tcp(_));
                if !self.forwarder.forward(&query, asker, tcp, now) {
                    self.fail(&query, asker, now);
                }
            }
            Answer::Lookup(missing) => self.wait(query, asker, missing, now),
        }
    }

    fn wait(&mut self, query: Vec<u8>, asker: Asker<C>, missing: Missing, now: Instant) {
        if self.waiting.len() >= MAX_WAITING {
            self.fail(&query, asker, now);
            return;
        }
        if self.reading.insert(missing.clone()) {
            self.stats.lookups += 1;
            self.lookups.push_back(missing.clone());
        }
        self.waiting.push(Waiting {
            query,
            asker,
            missing,
            since: now,
        });
    }

    /// The next DHT read to start: answer it with [`Service::handle_lookup`].
    pub fn poll_lookup(&mut self) -> Option<Missing> {
        self.lookups.pop_front()
    }

    /// A DHT read finished: what it found for `missing`. The queries that waited for it
    /// are answered.
    pub fn handle_lookup(
        &mut self,
        now: Instant,
        missing: &Missing,
        found: Found,
        held: &impl Held,
    ) {
        if !self.reading.remove(missing) {
            return;
        }
        if self.names.len() + self.holders.len() >= MAX_CACHE {
            self.names.clear();
            self.holders.clear();
        }
        // A /64 has room for any number of distinct reverse names: their misses never
        // push out the names and IPv4 holders.
        if self.holders6.len() >= MAX_CACHE6 {
            self.holders6.clear();
        }
        match (missing, found) {
            (Missing::Name(host), Found::Name(address, address6)) => {
                // A name only stands for an address of this namespace.
                let address = address.filter(|a| {
                    self.zone.as_ref().is_some_and(|z| z.subnet.contains(a))
                        || self.routed.iter().any(|n| n.contains(a))
                });
                let address6 = address6
                    .filter(|a| address.is_some() && self.prefix6.is_some_and(|p| p.contains(a)));
                let until = now + cache_ttl(address.is_some());
                self.names.insert(host.clone(), (address, address6, until));
            }
            (Missing::Address6(a), Found::Holder(holder)) => {
                let holder = holder.map(|name| Holder {
                    name: name.and_then(|n| dns::host_name(&n).ok()),
                });
                let until = now + cache_ttl(holder.is_some());
                self.holders6.insert(*a, (holder, until));
            }
            (Missing::Address(a), Found::Holder(holder)) => {
                let holder = holder.map(|name| Holder {
                    // A name is only shown if it is one a member may hold.
                    name: name.and_then(|n| dns::host_name(&n).ok()),
                });
                let until = now + cache_ttl(holder.is_some());
                self.holders.insert(*a, (holder, until));
            }
            // A read of the other kind answers nothing: its queries time out.
            _ => return,
        }
        let (ready, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| w.missing == *missing);
        self.waiting = rest;
        for w in ready {
            self.answer(w.query, w.asker, now, held);
        }
    }

    /// A message from resolver `from` for the query [`Service::poll_transmit`] gave with
    /// id `sent` (over TCP if `tcp`); returns false if it is not taken (not from that
    /// resolver, another id, another question: counted).
    pub fn handle_resolver_answer(
        &mut self,
        now: Instant,
        sent: [u8; 2],
        tcp: bool,
        from: SocketAddr,
        message: &[u8],
    ) -> bool {
        match self.forwarder.answer(now, sent, tcp, from, message) {
            Ok(Taken::Answer(asker, answer)) => {
                self.stats.forwarded_answers += 1;
                self.send(asker, answer, now);
                true
            }
            Ok(Taken::RetryOverTcp) => {
                self.stats.forwarded_truncated += 1;
                true
            }
            Err(_) => {
                self.stats.resolver_rejected += 1;
                false
            }
        }
    }

    fn send(&mut self, asker: Asker<C>, mut answer: Vec<u8>, now: Instant) {
        match asker {
            Asker::Udp(client, ipv6) => {
                let overhead = if ipv6 { UDP_OVERHEAD6 } else { UDP_OVERHEAD };
                if answer.len() > usize::from(self.mtu).saturating_sub(overhead) {
                    match dns::truncated(&answer) {
                        Some(cut) => answer = cut,
                        None => return,
                    }
                }
                self.udp_answers.push_back((client, answer));
            }
            Asker::Tcp(conn) => {
                if let Some(tcp) = self.tcp.as_mut() {
                    tcp.respond(conn, &answer, now);
                }
            }
        }
    }

    fn fail(&mut self, query: &[u8], asker: Asker<C>, now: Instant) {
        self.stats.servfail += 1;
        match dns::servfail(query) {
            Some(answer) => self.send(asker, answer, now),
            None => self.unanswered(asker, now),
        }
    }

    /// Timers: lookups and resolvers that took too long, the next resolver, the service
    /// stack's retransmissions, the cache.
    pub fn handle_timeout(&mut self, now: Instant, held: &impl Held) {
        while self.paced.peek().is_some_and(|Reverse(p)| p.at <= now) {
            if let Some(Reverse(p)) = self.paced.pop() {
                self.answer(p.query, Asker::Udp(p.client, p.ipv6), now, held);
            }
        }
        let (late, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| now.saturating_duration_since(w.since) >= LOOKUP_TIMEOUT);
        self.waiting = waiting;
        for w in late {
            self.fail(&w.query, w.asker, now);
        }
        for (asker, query) in self.forwarder.handle_timeout(now) {
            self.fail(&query, asker, now);
        }
        self.names.retain(|_, (_, _, t)| now < *t);
        self.holders.retain(|_, (_, t)| now < *t);
        self.holders6.retain(|_, (_, t)| now < *t);
        if let Some(tcp) = self.tcp.as_mut() {
            tcp.handle_timeout(now);
        }
        self.drain_tcp(now, held);
    }

    /// When [`Service::handle_timeout`] next has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        // The cache needs no timer: entries are checked against `now` when read, and
        // pruned whenever timers run.
        self.waiting
            .iter()
            .map(|w| w.since + LOOKUP_TIMEOUT)
            .chain(self.forwarder.poll_timeout())
            .chain(self.paced.peek().map(|Reverse(p)| p.at))
            .chain(self.tcp.as_ref().and_then(tcp::Endpoint::poll_timeout))
            .min()
    }

    /// The next UDP answer to frame for its client.
    pub fn poll_udp_answer(&mut self) -> Option<(C, Vec<u8>)> {
        self.udp_answers.pop_front()
    }

    /// The next packet of the service stack, and the MAC it goes to.
    pub fn poll_service_packet(&mut self) -> Option<(Mac, Vec<u8>)> {
        loop {
            let packet = self.tcp.as_mut()?.poll_packet()?;
            let Some(dst) = packet.get(16..20) else {
                continue;
            };
            let dst = Ipv4Addr::new(dst[0], dst[1], dst[2], dst[3]);
            if let Some(&mac) = self.macs.get(&dst) {
                return Some((mac, packet));
            }
        }
    }

    /// The next query for a resolver: send it from a socket (or TCP connection) of its
    /// own and hand what comes back to [`Service::handle_resolver_answer`].
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.forwarder.poll_transmit()
    }
}

/// The namespace's service address: the subnet's lowest usable address (the vswitch
/// hands what is sent there to the services).
fn service_address(subnet: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(subnet.network()).saturating_add(1))
}

/// How long a DHT read is cached: longer when someone holds the key.
fn cache_ttl(found: bool) -> Duration {
    if found {
        CACHE_TTL
    } else {
        NEGATIVE_TTL
    }
}

/// What the zone server sees: this member's names and addresses, then the cache.
struct View<'a, H> {
    held: &'a H,
    names: &'a HashMap<String, (Option<Ipv4Addr>, Option<Ipv6Addr>, Instant)>,
    holders: &'a HashMap<Ipv4Addr, (Option<Holder>, Instant)>,
    holders6: &'a HashMap<Ipv6Addr, (Option<Holder>, Instant)>,
    now: Instant,
}

impl<H: Held> Names for View<'_, H> {
    fn address_of(&self, host: &str) -> Result<Option<Ipv4Addr>, Missing> {
        if let Some(a) = self.held.address_for(host) {
            return Ok(Some(a));
        }
        match self.names.get(host) {
            Some((a, _, until)) if self.now < *until => Ok(*a),
            _ => Err(Missing::Name(host.to_string())),
        }
    }

    fn address6_of(&self, host: &str) -> Result<Option<Ipv6Addr>, Missing> {
        if self.held.address_for(host).is_some() {
            return Ok(self.held.address6_for(host));
        }
        match self.names.get(host) {
            Some((_, a, until)) if self.now < *until => Ok(*a),
            _ => Err(Missing::Name(host.to_string())),
        }
    }

    fn holder_of6(&self, address: Ipv6Addr) -> Result<Option<Holder>, Missing> {
        if let Some(name) = self.held.holder_of6(address) {
            return Ok(Some(Holder { name }));
        }
        match self.holders6.get(&address) {
            Some((h, until)) if self.now < *until => Ok(h.clone()),
            _ => Err(Missing::Address6(address)),
        }
    }

    fn holder_of(&self, address: Ipv4Addr) -> Result<Option<Holder>, Missing> {
        if let Some(name) = self.held.holder_of(address) {
            return Ok(Some(Holder { name }));
        }
        match self.holders.get(&address) {
            Some((h, until)) if self.now < *until => Ok(h.clone()),
            _ => Err(Missing::Address(address)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests start the clock
mod tests {
    use super::*;
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RecordType};

    /// This member holds `web`.
    struct Web;

    impl Held for Web {
        fn address_for(&self, host: &str) -> Option<Ipv4Addr> {
            (host == "web").then_some(Ipv4Addr::new(10, 201, 0, 7))
        }

        fn holder_of(&self, _: Ipv4Addr) -> Option<Option<String>> {
            None
        }
    }

    fn query(id: u16) -> Vec<u8> {
        let mut q = Message::query();
        q.metadata.id = id;
        q.metadata.recursion_desired = true;
        q.add_query(Query::query(
            Name::from_ascii("web.lab.").unwrap(),
            RecordType::A,
        ));
        q.to_vec().unwrap()
    }

    /// RRL per source: a host flooding the service is held to its own rate (every second
    /// query over it truncated, the rest dropped), and a quiet host asking at the same time
    /// gets every answer, complete.
    #[test]
    fn one_noisy_source_does_not_starve_a_quiet_one() {
        let t = Instant::now();
        let subnet: Ipv4Net = "10.201.0.0/16".parse().unwrap();
        let mut s: Service<u16> = Service::new(Vec::new(), 1420, [7; 32]).with_rate(100);
        s.set_zone("lab", subnet);
        let (noisy, quiet) = (Ipv4Addr::new(10, 201, 0, 66), Ipv4Addr::new(10, 201, 0, 9));
        let (mut full, mut cut, mut quiet_answers) = (0usize, 0usize, 0);
        // One second of traffic: 2000 queries from the noisy host, 50 from the quiet one.
        for i in 0..2000u16 {
            let now = t + Duration::from_micros(500 * u64::from(i));
            if s.poll_timeout().is_some_and(|at| at <= now) {
                s.handle_timeout(now, &Web);
            }
            s.handle_udp_query(now, &query(i), noisy, 1, &Web);
            if i % 40 == 0 {
                s.handle_udp_query(now, &query(i), quiet, 2, &Web);
            }
            while let Some((client, answer)) = s.poll_udp_answer() {
                let m = Message::from_vec(&answer).unwrap();
                match (client, m.metadata.truncation) {
                    (2, false) if m.answers.len() == 1 => quiet_answers += 1,
                    (1, false) => full += 1,
                    (1, true) => cut += 1,
                    other => panic!("{other:?}: {m:?}"),
                }
            }
        }
        assert_eq!(quiet_answers, 50, "the quiet host got every answer");
        // The noisy host: its burst at once (and what came back while it lasted); then half
        // a second of queue, which lets in one more as each token comes back, answered in
        // turn; past the queue, the rate again in truncated answers (its burst and refill);
        // the rest dropped.
        let (_, zone, _) = s.stats();
        let delayed = zone.rate_limited_delayed as usize;
        let dropped = zone.rate_limited_dropped as usize;
        let at_once = 2000 - delayed - cut - dropped;
        assert!((100..=106).contains(&at_once), "{at_once}");
        assert!((140..=151).contains(&delayed), "{delayed}");
        assert!(s.paced.len() <= 50);
        assert_eq!(
            full + s.paced.len(),
            at_once + delayed,
            "the delayed, in turn"
        );
        assert!((185..=201).contains(&cut), "{cut}");
        assert_eq!(zone.rate_limited_truncated, cut as u64);
    }
}
