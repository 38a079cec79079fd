//! One namespace's virtual DNS server, as the agent runs it: queries over UDP (intercepted
//! by the switch) and TCP (the service stack) are answered by the pure
//! [`hyphae_dhcp_dns::dns::Server`] from what this member holds, a short cache of DHT reads,
//! and DHT reads the query waits for; names outside the zone go to the configured
//! resolvers.
//!
//! Nothing here does I/O: answers, service-stack packets and datagrams for the resolvers
//! queue up for the agent's loop to send.

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use hyphae_dhcp_dns::dns::{self, Answer, Holder, Missing, Names};
use hyphae_dhcp_dns::forward::Forwarder;
use hyphae_dhcp_dns::tcp;
use hyphae_overlay::records::{Envelope, MemberInfo, NameInfo};
use hyphae_overlay::swarm::{unix_now, OpId, Overlay};
use hyphae_vswitch::{Client, Mac};
use ipnet::Ipv4Net;

use crate::membership::Membership;

/// How long a name or address read from the DHT is answered from the cache.
pub const CACHE_TTL: Duration = Duration::from_secs(10);

/// How long "nobody holds it" is remembered.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(2);

/// Queries waiting for DHT reads at once; beyond, new ones get SERVFAIL.
pub const MAX_WAITING: usize = 256;

/// A query waiting this long for a DHT read gets SERVFAIL.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(4);

/// Cache entries kept (names plus addresses); beyond, the cache starts over.
const MAX_CACHE: usize = 4096;

/// IPv4 and UDP headers: a UDP answer is at most the namespace MTU less these. A larger
/// forwarded answer is sent truncated (the client asks again over TCP).
const UDP_OVERHEAD: usize = 28;

/// Who asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// Over UDP, from this host (or LAN host).
    Udp(Client),
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
    /// Queries and service packets dropped before the namespace's subnet was known.
    pub not_ready: u64,
}

struct Waiting {
    query: Vec<u8>,
    asker: Asker,
    missing: Missing,
    since: Instant,
}

/// One namespace's DNS server in the agent.
pub struct Dns {
    forwarder: Forwarder<Asker>,
    /// Largest UDP answer (the namespace MTU less headers).
    max_udp: usize,
    server: Option<dns::Server>,
    tcp: Option<tcp::Endpoint>,
    /// Where the service stack's packets go: the MAC each client address spoke from.
    macs: HashMap<Ipv4Addr, Mac>,
    names: HashMap<String, (Option<Ipv4Addr>, Instant)>,
    holders: HashMap<Ipv4Addr, (Option<Holder>, Instant)>,
    lookups: HashMap<OpId, Missing>,
    waiting: Vec<Waiting>,
    udp_answers: VecDeque<(Client, Vec<u8>)>,
    stats: Stats,
}

impl Dns {
    /// A server that forwards names outside the zone to `resolvers` (none: REFUSED), on a
    /// namespace of MTU `mtu`.
    pub fn new(resolvers: Vec<SocketAddr>, mtu: u16) -> Self {
        Self {
            forwarder: Forwarder::new(resolvers),
            max_udp: usize::from(mtu).saturating_sub(UDP_OVERHEAD),
            server: None,
            tcp: None,
            macs: HashMap::new(),
            names: HashMap::new(),
            holders: HashMap::new(),
            lookups: HashMap::new(),
            waiting: Vec::new(),
            udp_answers: VecDeque::new(),
            stats: Stats::default(),
        }
    }

    /// Counters: the agent's and the zone server's.
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
    fn ready(&mut self, m: &Membership, now: Instant) -> Option<&mut dns::Server> {
        let subnet = m.subnet?;
        if self.server.is_none() {
            // Namespace names are checked labels; the zone is the name as a DNS name.
            let zone = format!("{}.", m.name).parse().ok()?;
            self.server = Some(dns::Server::new(dns::Settings {
                zone,
                subnet,
                forward: !self.forwarder.resolvers().is_empty(),
            }));
            // A random seed: TCP initial sequence numbers nobody can predict.
            let mut seed = [0u8; 8];
            getrandom::getrandom(&mut seed).ok()?;
            self.tcp = Some(tcp::Endpoint::with_seed(
                hyphae_vswitch::service_address(subnet),
                subnet.prefix_len(),
                u64::from_le_bytes(seed),
                now,
            ));
        }
        self.server.as_mut()
    }

    /// A query over UDP from `client`.
    pub fn udp_query(
        &mut self,
        query: &[u8],
        client: Client,
        now: Instant,
        m: &Membership,
        overlay: &mut Overlay,
    ) {
        self.stats.udp_queries += 1;
        self.new_query(query.to_vec(), Asker::Udp(client), now, m, overlay);
    }

    /// A packet for the service stack (DNS over TCP, ping) from `mac`.
    pub fn service_packet(
        &mut self,
        packet: &[u8],
        mac: Mac,
        now: Instant,
        m: &Membership,
        overlay: &mut Overlay,
    ) {
        if self.ready(m, now).is_none() {
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
        tcp.handle_packet(packet, now);
        self.drain_tcp(now, m, overlay);
    }

    fn drain_tcp(&mut self, now: Instant, m: &Membership, overlay: &mut Overlay) {
        while let Some((conn, query)) = self.tcp.as_mut().and_then(tcp::Endpoint::poll_query) {
            self.stats.tcp_queries += 1;
            self.new_query(query, Asker::Tcp(conn), now, m, overlay);
        }
    }

    fn new_query(
        &mut self,
        query: Vec<u8>,
        asker: Asker,
        now: Instant,
        m: &Membership,
        overlay: &mut Overlay,
    ) {
        let Some(server) = self.ready(m, now) else {
            self.stats.not_ready += 1;
            self.unanswered(asker, now);
            return;
        };
        if server.admit(now) {
            self.answer(query, asker, now, m, overlay);
        } else {
            self.unanswered(asker, now);
        }
    }

    /// A query that gets no answer: a TCP connection stops waiting for it.
    fn unanswered(&mut self, asker: Asker, now: Instant) {
        if let (Asker::Tcp(conn), Some(tcp)) = (asker, self.tcp.as_mut()) {
            tcp.abandon(conn, now);
        }
    }

    /// Answers `query` from what is known, or starts what it needs.
    fn answer(
        &mut self,
        query: Vec<u8>,
        asker: Asker,
        now: Instant,
        m: &Membership,
        overlay: &mut Overlay,
    ) {
        let view = View {
            m,
            names: &self.names,
            holders: &self.holders,
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
            Answer::Lookup(missing) => self.wait(query, asker, missing, now, m, overlay),
        }
    }

    fn wait(
        &mut self,
        query: Vec<u8>,
        asker: Asker,
        missing: Missing,
        now: Instant,
        m: &Membership,
        overlay: &mut Overlay,
    ) {
        if self.waiting.len() >= MAX_WAITING {
            self.fail(&query, asker, now);
            return;
        }
        if !self.lookups.values().any(|x| *x == missing) {
            let key = match &missing {
                Missing::Name(host) => m.keys.name_key(host),
                Missing::Address(a) => m.keys.address_key(*a),
            };
            self.stats.lookups += 1;
            self.lookups.insert(overlay.get(key), missing.clone());
        }
        self.waiting.push(Waiting {
            query,
            asker,
            missing,
            since: now,
        });
    }

    /// A DHT read finished; returns false if it was not one of ours. The queries that
    /// waited for it are answered.
    pub fn got(
        &mut self,
        op: OpId,
        envelopes: &[Envelope],
        now: Instant,
        m: &Membership,
        overlay: &mut Overlay,
    ) -> bool {
        let Some(missing) = self.lookups.remove(&op) else {
            return false;
        };
        let subnet = m
            .subnet
            .unwrap_or_else(|| Ipv4Net::from(Ipv4Addr::UNSPECIFIED));
        if self.names.len() + self.holders.len() >= MAX_CACHE {
            self.names.clear();
            self.holders.clear();
        }
        match &missing {
            Missing::Name(host) => {
                let key = m.keys.name_key(host);
                let found = envelopes.iter().find_map(|e| {
                    let (_, info) = e.read::<NameInfo>(&m.keys, &key, unix_now()).ok()?;
                    subnet.contains(&info.address).then_some(info.address)
                });
                self.names
                    .insert(host.clone(), (found, now + cache_ttl(found.is_some())));
            }
            Missing::Address(a) => {
                let key = m.keys.address_key(*a);
                let found = envelopes.iter().find_map(|e| {
                    let (_, info) = e.read::<MemberInfo>(&m.keys, &key, unix_now()).ok()?;
                    Some(Holder {
                        // A name is only shown if it is one a member may hold.
                        name: info.name.and_then(|n| dns::host_name(&n).ok()),
                    })
                });
                let until = now + cache_ttl(found.is_some());
                self.holders.insert(*a, (found, until));
            }
        }
        let (ready, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| w.missing == missing);
        self.waiting = rest;
        for w in ready {
            self.answer(w.query, w.asker, now, m, overlay);
        }
        true
    }

    /// A datagram on the forwarding socket; returns false if it answers none of this
    /// namespace's queries (not from a resolver, unknown id, another question).
    pub fn resolver_answer(&mut self, from: SocketAddr, datagram: &[u8], now: Instant) -> bool {
        match self.forwarder.answer(from, datagram) {
            Ok((asker, answer)) => {
                self.stats.forwarded_answers += 1;
                self.send(asker, answer, now);
                true
            }
            Err(_) => false,
        }
    }

    fn send(&mut self, asker: Asker, mut answer: Vec<u8>, now: Instant) {
        match asker {
            Asker::Udp(client) => {
                if answer.len() > self.max_udp {
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

    fn fail(&mut self, query: &[u8], asker: Asker, now: Instant) {
        self.stats.servfail += 1;
        match dns::servfail(query) {
            Some(answer) => self.send(asker, answer, now),
            None => self.unanswered(asker, now),
        }
    }

    /// Timers: lookups and resolvers that took too long, the next resolver, the service
    /// stack's retransmissions, the cache.
    pub fn handle_timeout(&mut self, now: Instant, m: &Membership, overlay: &mut Overlay) {
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
        self.names.retain(|_, (_, t)| now < *t);
        self.holders.retain(|_, (_, t)| now < *t);
        if let Some(tcp) = self.tcp.as_mut() {
            tcp.handle_timeout(now);
        }
        self.drain_tcp(now, m, overlay);
    }

    /// The next UDP answer to frame for its client.
    pub fn poll_udp_answer(&mut self) -> Option<(Client, Vec<u8>)> {
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

    /// The next query for a resolver.
    pub fn poll_resolver_datagram(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        self.forwarder.poll_datagram()
    }
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
struct View<'a> {
    m: &'a Membership,
    names: &'a HashMap<String, (Option<Ipv4Addr>, Instant)>,
    holders: &'a HashMap<Ipv4Addr, (Option<Holder>, Instant)>,
    now: Instant,
}

impl Names for View<'_> {
    fn address_of(&self, host: &str) -> Result<Option<Ipv4Addr>, Missing> {
        if let Some(a) = self.m.address_for(host) {
            return Ok(Some(a));
        }
        match self.names.get(host) {
            Some((a, until)) if self.now < *until => Ok(*a),
            _ => Err(Missing::Name(host.to_string())),
        }
    }

    fn holder_of(&self, address: Ipv4Addr) -> Result<Option<Holder>, Missing> {
        if self.m.holds(address) {
            return Ok(Some(Holder {
                name: self.m.name_for(address).map(str::to_string),
            }));
        }
        match self.holders.get(&address) {
            Some((h, until)) if self.now < *until => Ok(h.clone()),
            _ => Err(Missing::Address(address)),
        }
    }
}
