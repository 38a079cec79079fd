//! The virtual DHCPv6 server of a router-mode LAN (RFC 8415, stateful addresses), answering
//! on the agent's behalf from its link-local address.
//!
//! As with DHCPv4, addresses are not picked here alone: an address for a client (an
//! identity association, IA_NA, of a DUID) is first asked for as an [`Output::Claim`],
//! which the agent runs as a DHT claim (the same majority lease as any member address),
//! and answered with [`Server::allocated`] or [`Server::refused`]; the ADVERTISE or REPLY
//! that waited goes out then. A client is offered the same address each time (a hash of
//! its DUID and IAID in the prefix) unless another member holds it. A release, a decline
//! and an expiry ask for [`Output::Release`]; while a client holds its address, the agent
//! renews the DHT lease.
//!
//! Served: SOLICIT (with Rapid Commit too), REQUEST, RENEW, REBIND, RELEASE, DECLINE,
//! CONFIRM and INFORMATION-REQUEST, for the first IA_NA of a message; DNS servers and the
//! domain search list; through relay agents (RELAY-FORW, answered with RELAY-REPL to the
//! nearest relay's port 547, the Interface-ID echoed; the client's link is the /64 of the
//! first relay's link-address when the prefix is wider, else the prefix). Not served:
//! temporary addresses (IA_TA), prefix delegation, reconfiguration.
//!
//! Call order: feed each request to [`Server::handle_request`] and the passage of time to
//! [`Server::handle_timeout`]; drain [`Server::poll_output`] after each.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use dhcproto::v6::{
    DhcpOption, DhcpOptions, IAAddr, Message, MessageType, OptionCode, Status, StatusCode, IANA,
};
use dhcproto::{Decodable, Decoder, Encodable, Encoder, Name};
use ipnet::Ipv6Net;

pub use relay::MAX_RELAYS;
use relay::{relay_reply, unwrap_relays, Path, RELAY_FORW, RELAY_REPL};
use sound::options_sound;

/// The UDP port of DHCPv6 clients.
pub const CLIENT_PORT: u16 = 546;
/// The UDP port of DHCPv6 servers and relay agents.
pub const SERVER_PORT: u16 = 547;
/// All DHCPv6 relay agents and servers on a link (RFC 8415 7.1): where clients send.
pub const ALL_SERVERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2);

/// Clients served at once (bindings plus claims in flight); beyond, new ones are dropped.
pub const MAX_CLIENTS: usize = 4096;
/// Declined addresses remembered (not offered again).
const MAX_DECLINED: usize = 256;
/// How long an ADVERTISE holds its address for a client that has not sent its REQUEST
/// (RFC 8415's REQUEST retransmissions give up within about a minute).
pub const OFFER_LIFETIME: Duration = Duration::from_secs(60);
/// Addresses tried for one client before it is told none is available.
const MAX_TRIES: u32 = 8;
/// How long a request waits for the claim of its address; then it is dropped (the client
/// asks again, and is answered then).
pub const CLAIM_WAIT: Duration = Duration::from_secs(30);
/// The longest DUID (RFC 8415 11.1).
const MAX_DUID: usize = 130;
/// What a namespace's DHCPv6 replies say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The namespace prefix: every address handed out is in it.
    pub prefix: Ipv6Net,
    /// The server's DUID (the Server Identifier option).
    pub server_id: Vec<u8>,
    /// DNS servers (RFC 3646): the prefix's service address.
    pub dns: Vec<Ipv6Addr>,
    /// The domain search list: the namespace's name.
    pub domain: String,
    /// Valid lifetime of an address (the lease); it is preferred for as long, renewed at
    /// half of it (T1) and rebound at 80% (T2).
    pub lease: Duration,
}

/// The DUID-LL (RFC 8415 11.4) of an Ethernet interface with `mac`: what the agent calls
/// its server.
pub fn duid_ll(mac: [u8; 6]) -> Vec<u8> {
    let mut duid = vec![0, 3, 0, 1];
    duid.extend_from_slice(&mac);
    duid
}

/// Who an address is for: a client's DUID and the identity association's IAID.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Client {
    /// The Client Identifier option (the client's DUID).
    pub duid: Vec<u8>,
    /// The IA_NA's identifier.
    pub iaid: u32,
}

/// A reply to put on the wire: UDP from port 547 to `port` at `to`: the client's port 546
/// at its link-local address, or a relay agent's port 547 at the address it sent from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The encoded DHCPv6 message (a RELAY-REPL through a relay).
    pub bytes: Vec<u8>,
    /// The sender of the request (the client, or the nearest relay agent): its address and
    /// MAC.
    pub to: (Ipv6Addr, [u8; 6]),
    /// [`CLIENT_PORT`], or [`SERVER_PORT`] for a relay agent.
    pub port: u16,
}

/// What the server wants done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send this reply.
    Reply(Reply),
    /// Claim `address` in the DHT for the client at `mac`; answer with
    /// [`Server::allocated`] or [`Server::refused`] (refuse it at once if another host of
    /// the LAN uses it).
    Claim {
        /// The address.
        address: Ipv6Addr,
        /// The client's MAC.
        mac: [u8; 6],
        /// The client renews or rebinds this address with no binding here: it had it from
        /// another server (or this one before a restart), and may have moved here with it.
        renewing: bool,
    },
    /// The address is free again (released, declined, expired, or won for a client that
    /// stopped waiting): release its DHT lease, unless a host other than the one at `mac`
    /// uses it on the LAN.
    Release {
        /// The address.
        address: Ipv6Addr,
        /// The MAC of the client it was for, if known.
        mac: Option<[u8; 6]>,
    },
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Replies sent (ADVERTISE, REPLY).
    pub replies: u64,
    /// Requests that did not parse as DHCPv6, or lacked what their kind must carry.
    pub malformed: u64,
    /// Requests not for this server, or of a kind not served.
    pub ignored: u64,
    /// New clients dropped because [`MAX_CLIENTS`] are served.
    pub full: u64,
    /// DECLINEs received.
    pub declines: u64,
    /// Requests that came through relay agents (RELAY-FORW).
    pub relayed: u64,
    /// Relayed requests dropped because the client's link (the first relay's
    /// link-address) is not in the prefix.
    pub relay_outside_prefix: u64,
}

#[derive(Debug, Clone)]
struct Binding {
    address: Ipv6Addr,
    mac: [u8; 6],
    expires: Instant,
    /// Advertised and not yet requested: it lapses after [`OFFER_LIFETIME`].
    offered: bool,
}

/// A request waiting for the claim of its address.
#[derive(Debug, Clone)]
struct Pending {
    client: Client,
    message: Message,
    from: Path,
    /// An ADVERTISE (a SOLICIT without Rapid Commit) or a REPLY.
    answer: MessageType,
    /// Only the address the client named will do (it renews or rebinds one it has).
    exact: bool,
    tries: u32,
    /// Dropped at this time if still waiting.
    until: Instant,
}

/// One namespace's DHCPv6 server.
#[derive(Debug)]
pub struct Server {
    settings: Settings,
    bindings: HashMap<Client, Binding>,
    /// By the address being claimed.
    pending: HashMap<Ipv6Addr, Pending>,
    declined: HashSet<Ipv6Addr>,
    out: VecDeque<Output>,
    stats: Stats,
}

impl Server {
    /// A server with no bindings.
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            bindings: HashMap::new(),
            pending: HashMap::new(),
            declined: HashSet::new(),
            out: VecDeque::new(),
            stats: Stats::default(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The address bound to `client`, if any (advertised or leased).
    pub fn lease_of(&self, client: &Client) -> Option<Ipv6Addr> {
        self.bindings.get(client).map(|b| b.address)
    }

    /// Migration source: the host leased `address` moved to another router, which holds
    /// the address now: its binding is dropped without a release (the address is not this
    /// router's to give back). Returns whether there was one.
    pub fn hand_over(&mut self, address: Ipv6Addr) -> bool {
        let before = self.bindings.len();
        self.bindings.retain(|_, b| b.address != address);
        self.bindings.len() != before
    }

    /// The next thing to do.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// When [`Server::handle_timeout`] next has work: a binding that expires, or a request
    /// that stops waiting for its claim.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let bindings = self.bindings.values().map(|b| b.expires);
        bindings.chain(self.pending.values().map(|p| p.until)).min()
    }

    /// Expires the bindings whose time is up (their addresses are released), and drops the
    /// requests that waited too long for a claim.
    pub fn handle_timeout(&mut self, now: Instant) {
        let out = &mut self.out;
        self.bindings.retain(|_, b| {
            let keep = b.expires > now;
            if !keep {
                out.push_back(Output::Release {
                    address: b.address,
                    mac: Some(b.mac),
                });
            }
            keep
        });
        self.pending.retain(|_, p| p.until > now);
    }

    /// A DHCPv6 message from the LAN host at `from` (its address and MAC): a client's, or
    /// a relay agent's RELAY-FORW carrying one.
    pub fn handle_request(&mut self, now: Instant, payload: &[u8], from: (Ipv6Addr, [u8; 6])) {
        let Some((payload, relays)) = unwrap_relays(payload) else {
            self.stats.malformed += 1;
            return;
        };
        if !relays.is_empty() {
            self.stats.relayed += 1;
        }
        let from = Path {
            sender: from,
            relays,
        };
        // The server hands out one prefix: the client's link must lie in it.
        if from
            .link_address()
            .is_some_and(|a| !self.settings.prefix.contains(&a))
        {
            self.stats.relay_outside_prefix += 1;
            return;
        }
        // A client's message is checked before dhcproto reads it (see `options_sound`).
        let sound = payload.len() >= 4
            && !matches!(payload[0], RELAY_FORW | RELAY_REPL)
            && options_sound(&payload[4..], 0);
        if !sound {
            self.stats.malformed += 1;
            return;
        }
        let Ok(message) = Message::decode(&mut Decoder::new(payload)) else {
            self.stats.malformed += 1;
            return;
        };
        let kind = message.msg_type();
        let server_id = match message.opts().get(OptionCode::ServerId) {
            Some(DhcpOption::ServerId(id)) => Some(id.as_slice()),
            _ => None,
        };
        // RFC 8415 16: which kinds carry a Server Identifier, and whose it must be.
        let ours = server_id == Some(self.settings.server_id.as_slice());
        let addressed = match kind {
            MessageType::Solicit | MessageType::Rebind | MessageType::Confirm => {
                server_id.is_none()
            }
            MessageType::Request
            | MessageType::Renew
            | MessageType::Release
            | MessageType::Decline => ours,
            MessageType::InformationRequest => server_id.is_none() || ours,
            _ => {
                self.stats.ignored += 1;
                return;
            }
        };
        if !addressed {
            self.stats.ignored += 1;
            return;
        }
        let duid = match message.opts().get(OptionCode::ClientId) {
            Some(DhcpOption::ClientId(duid)) if !duid.is_empty() && duid.len() <= MAX_DUID => {
                Some(duid.clone())
            }
            _ => None,
        };
        if kind == MessageType::InformationRequest {
            self.answer_information(&message, duid, &from);
            return;
        }
        let (Some(duid), Some(ia)) = (duid, first_ia_na(&message)) else {
            self.stats.malformed += 1;
            return;
        };
        let client = Client { duid, iaid: ia.id };
        let named = named_address(ia);
        match kind {
            MessageType::Solicit => {
                let rapid = message.opts().get(OptionCode::RapidCommit).is_some();
                let answer = if rapid {
                    MessageType::Reply
                } else {
                    MessageType::Advertise
                };
                self.assign(now, client, message, from, (answer, None));
            }
            MessageType::Request => {
                self.assign(now, client, message, from, (MessageType::Reply, named));
            }
            MessageType::Renew | MessageType::Rebind => {
                // The address the client has; without a binding here (the agent restarted)
                // it is claimed again, that address or none.
                let has = self.lease_of(&client);
                let link = from.link(self.settings.prefix);
                match (has, named) {
                    // Its address is not of the link it asks from (it moved): returned
                    // with lifetimes 0, and a new one found when it asks again.
                    (Some(a), _) if !link.contains(&a) => {
                        self.drop_binding(&client);
                        self.assign_exact(now, client, message, from, a);
                    }
                    (Some(a), Some(n)) if a != n => {
                        self.reply_status(&message, &client, &from, Status::NoBinding);
                    }
                    (Some(_), _) => {
                        self.assign(now, client, message, from, (MessageType::Reply, named));
                    }
                    (None, Some(n)) => self.assign_exact(now, client, message, from, n),
                    (None, None) => {
                        self.reply_status(&message, &client, &from, Status::NoBinding);
                    }
                }
            }
            MessageType::Release | MessageType::Decline => {
                if self
                    .bindings
                    .get(&client)
                    .is_some_and(|b| b.mac != from.sender.1)
                {
                    // Another host naming this client's DUID: not its to give back.
                    self.stats.ignored += 1;
                    self.reply_status(&message, &client, &from, Status::NoBinding);
                    return;
                }
                if kind == MessageType::Decline {
                    self.stats.declines += 1;
                }
                // A claim still out for it is no longer wanted.
                self.pending.retain(|_, p| p.client != client);
                if let Some(b) = self.bindings.remove(&client) {
                    if kind == MessageType::Decline && self.declined.len() < MAX_DECLINED {
                        // Someone on the link uses it: never offered again.
                        self.declined.insert(b.address);
                    }
                    self.out.push_back(Output::Release {
                        address: b.address,
                        mac: Some(b.mac),
                    });
                }
                self.send(&message, Some(&client.duid), &from, |opts| {
                    opts.insert(status(Status::Success, "done"));
                });
            }
            MessageType::Confirm => {
                // Nothing to confirm: no reply (RFC 8415 18.3.3).
                let Some(named) = named else {
                    self.stats.ignored += 1;
                    return;
                };
                let on_link = from.link(self.settings.prefix).contains(&named);
                let (code, text) = if on_link {
                    (Status::Success, "on link")
                } else {
                    (Status::NotOnLink, "not on link")
                };
                self.send(&message, Some(&client.duid), &from, |opts| {
                    opts.insert(status(code, text));
                });
            }
            _ => self.stats.ignored += 1,
        }
    }

    /// The DHT gave `address` to this member for the client that waits on it: the answer
    /// goes out.
    pub fn allocated(&mut self, address: Ipv6Addr, now: Instant) {
        let Some(p) = self.pending.remove(&address) else {
            // Won for a request that stopped waiting: not anyone's here.
            if !self.bindings.values().any(|b| b.address == address) {
                self.out.push_back(Output::Release { address, mac: None });
            }
            return;
        };
        let offered = p.answer == MessageType::Advertise;
        let lifetime = if offered {
            OFFER_LIFETIME
        } else {
            self.settings.lease
        };
        if let Some(old) = self.bindings.get(&p.client).map(|b| b.address) {
            if old != address {
                let mac = Some(p.from.sender.1);
                self.out.push_back(Output::Release { address: old, mac });
            }
        }
        let binding = Binding {
            address,
            mac: p.from.sender.1,
            expires: now + lifetime,
            offered,
        };
        self.bindings.insert(p.client.clone(), binding);
        self.answer_with(&p, address);
    }

    /// The DHT refused `address` (another member holds it): the client that waits on it is
    /// tried with another, or told none is available.
    pub fn refused(&mut self, address: Ipv6Addr) {
        let Some(mut p) = self.pending.remove(&address) else {
            return;
        };
        p.tries += 1;
        if p.exact || p.tries >= MAX_TRIES {
            let code = if p.exact {
                Status::NoBinding
            } else {
                Status::NoAddrsAvail
            };
            self.reply_status(&p.message, &p.client, &p.from, code);
            return;
        }
        match self.candidate(&p.client, p.tries, &p.from) {
            Some(next) => {
                let mac = p.from.sender.1;
                self.pending.insert(next, p);
                let claim = Output::Claim {
                    address: next,
                    mac,
                    renewing: false,
                };
                self.out.push_back(claim);
            }
            None => self.reply_status(&p.message, &p.client, &p.from, Status::NoAddrsAvail),
        }
    }

    /// SOLICIT, REQUEST, RENEW, REBIND: the client's binding if it has one (and `named`,
    /// the address it names, is that or none), else a claim first.
    fn assign(
        &mut self,
        now: Instant,
        client: Client,
        message: Message,
        from: Path,
        (answer, named): (MessageType, Option<Ipv6Addr>),
    ) {
        let link = from.link(self.settings.prefix);
        if self.lease_of(&client).is_some_and(|a| !link.contains(&a)) {
            // Bound on another link (the client moved): a new address here.
            self.drop_binding(&client);
        }
        let has = self.bindings.get(&client).map(|b| b.address);
        if let Some(address) = has.filter(|a| named.is_none_or(|n| n == *a)) {
            let offered = answer == MessageType::Advertise;
            if let Some(b) = self.bindings.get_mut(&client) {
                if !offered {
                    b.offered = false;
                    b.expires = now + self.settings.lease;
                }
            }
            let p = Pending {
                client,
                message,
                from,
                answer,
                exact: false,
                tries: 0,
                until: now,
            };
            self.answer_with(&p, address);
            return;
        }
        // A REQUEST for an address this server did not advertise (or no longer has): the
        // one it names, if usable, else a fresh one.
        let exact = named.filter(|a| self.usable(*a) && link.contains(a));
        let Some(address) = exact.or_else(|| self.candidate(&client, 0, &from)) else {
            self.reply_status(&message, &client, &from, Status::NoAddrsAvail);
            return;
        };
        self.claim(now, client, message, from, (answer, address, false));
    }

    /// RENEW or REBIND of an address this server has no binding for: that address only.
    fn assign_exact(
        &mut self,
        now: Instant,
        client: Client,
        message: Message,
        from: Path,
        named: Ipv6Addr,
    ) {
        if self.usable(named) && from.link(self.settings.prefix).contains(&named) {
            let answer = (MessageType::Reply, named, true);
            self.claim(now, client, message, from, answer);
            return;
        }
        // Not one this server can give (outside the prefix, declined, another client's):
        // returned with lifetimes 0, so the client stops using it now (RFC 8415 18.3.4).
        let p = Pending {
            client,
            message,
            from,
            answer: MessageType::Reply,
            exact: true,
            tries: 0,
            until: now,
        };
        self.answer_with_lifetimes(&p, named, 0);
    }

    fn claim(
        &mut self,
        now: Instant,
        client: Client,
        message: Message,
        from: Path,
        (answer, address, exact): (MessageType, Ipv6Addr, bool),
    ) {
        let known = self.bindings.contains_key(&client);
        if !known && self.bindings.len() + self.pending.len() >= MAX_CLIENTS {
            self.stats.full += 1;
            return;
        }
        if self.pending.values().any(|p| p.client == client) {
            // Its claim is out already; the answer to that one will do.
            return;
        }
        if self.pending.contains_key(&address) {
            return;
        }
        let p = Pending {
            client,
            message,
            from,
            answer,
            exact,
            tries: 0,
            until: now + CLAIM_WAIT,
        };
        let mac = p.from.sender.1;
        self.pending.insert(address, p);
        self.out.push_back(Output::Claim {
            address,
            mac,
            renewing: exact,
        });
    }

    /// Drops `client`'s binding (on another link than it asks from now): its address is
    /// released.
    fn drop_binding(&mut self, client: &Client) {
        if let Some(b) = self.bindings.remove(client) {
            self.out.push_back(Output::Release {
                address: b.address,
                mac: Some(b.mac),
            });
        }
    }

    /// Whether `address` may be handed out: in the prefix, neither its `::` nor its `::1`
    /// (the service address), not declined, not another client's.
    fn usable(&self, address: Ipv6Addr) -> bool {
        let prefix = self.settings.prefix;
        let host = u128::from(address) & !u128::from(prefix.netmask());
        prefix.contains(&address)
            && host > 1
            && !self.declined.contains(&address)
            && !self.bindings.values().any(|b| b.address == address)
    }

    /// The address to try for `client` on its `try`: the first is the same every time (a
    /// hash of the client in its link's part of the prefix, see [`Path::link`]), the
    /// others differ.
    fn candidate(&self, client: &Client, attempt: u32, from: &Path) -> Option<Ipv6Addr> {
        let prefix = from.link(self.settings.prefix);
        let hosts = !u128::from(prefix.netmask());
        (0..64u32).find_map(|salt| {
            let mut h = DefaultHasher::new();
            (client, attempt, salt).hash(&mut h);
            let low = u128::from(h.finish());
            let mut h = DefaultHasher::new();
            (salt, client, attempt).hash(&mut h);
            let bits = (u128::from(h.finish()) << 64) | low;
            let a = Ipv6Addr::from(u128::from(prefix.network()) | (bits & hosts));
            (self.usable(a) && !self.pending.contains_key(&a)).then_some(a)
        })
    }

    fn answer_with(&mut self, p: &Pending, address: Ipv6Addr) {
        let lease = u32::try_from(self.settings.lease.as_secs()).unwrap_or(u32::MAX);
        self.answer_with_lifetimes(p, address, lease);
    }

    fn answer_with_lifetimes(&mut self, p: &Pending, address: Ipv6Addr, lease: u32) {
        let ia = IANA {
            id: p.client.iaid,
            t1: lease / 2,
            t2: lease / 5 * 4,
            opts: {
                let mut o = DhcpOptions::new();
                o.insert(DhcpOption::IAAddr(IAAddr {
                    addr: address,
                    preferred_life: lease,
                    valid_life: lease,
                    opts: DhcpOptions::new(),
                }));
                o
            },
        };
        let rapid = p.answer == MessageType::Reply && p.message.msg_type() == MessageType::Solicit;
        let mut reply = reply_to(&p.message, p.answer);
        let opts = reply.opts_mut();
        opts.insert(DhcpOption::IANA(ia));
        if rapid {
            opts.insert(DhcpOption::RapidCommit);
        }
        self.finish(reply, Some(&p.client.duid), &p.from);
    }

    /// A REPLY whose IA_NA carries only `code` (no address).
    fn reply_status(&mut self, message: &Message, client: &Client, from: &Path, code: Status) {
        let ia = IANA {
            id: client.iaid,
            t1: 0,
            t2: 0,
            opts: {
                let mut o = DhcpOptions::new();
                o.insert(status(code, "no address for this identity association"));
                o
            },
        };
        let answer = if message.msg_type() == MessageType::Solicit
            && message.opts().get(OptionCode::RapidCommit).is_none()
        {
            MessageType::Advertise
        } else {
            MessageType::Reply
        };
        let mut reply = reply_to(message, answer);
        reply.opts_mut().insert(DhcpOption::IANA(ia));
        self.finish(reply, Some(&client.duid), from);
    }

    fn answer_information(&mut self, message: &Message, duid: Option<Vec<u8>>, from: &Path) {
        let reply = reply_to(message, MessageType::Reply);
        self.finish(reply, duid.as_deref(), from);
    }

    /// A REPLY to `message` with `fill`'s options besides the usual ones.
    fn send(
        &mut self,
        message: &Message,
        duid: Option<&[u8]>,
        from: &Path,
        fill: impl FnOnce(&mut DhcpOptions),
    ) {
        let mut reply = reply_to(message, MessageType::Reply);
        fill(reply.opts_mut());
        self.finish(reply, duid, from);
    }

    /// Adds the identifiers, DNS servers and search list, encodes and sends (wrapped in a
    /// RELAY-REPL for each relay agent the request passed).
    fn finish(&mut self, mut reply: Message, duid: Option<&[u8]>, to: &Path) {
        let opts = reply.opts_mut();
        opts.insert(DhcpOption::ServerId(self.settings.server_id.clone()));
        if let Some(duid) = duid {
            opts.insert(DhcpOption::ClientId(duid.to_vec()));
        }
        if !self.settings.dns.is_empty() {
            opts.insert(DhcpOption::DomainNameServers(self.settings.dns.clone()));
        }
        if let Ok(name) = Name::from_ascii(&self.settings.domain) {
            opts.insert(DhcpOption::DomainSearchList(vec![name]));
        }
        let mut bytes = Vec::new();
        if reply.encode(&mut Encoder::new(&mut bytes)).is_err() {
            self.stats.malformed += 1;
            return;
        }
        for hop in to.relays.iter().rev() {
            let Some(wrapped) = relay_reply(hop, &bytes) else {
                self.stats.malformed += 1;
                return;
            };
            bytes = wrapped;
        }
        let port = if to.relays.is_empty() {
            CLIENT_PORT
        } else {
            SERVER_PORT
        };
        self.stats.replies += 1;
        self.out.push_back(Output::Reply(Reply {
            bytes,
            to: to.sender,
            port,
        }));
    }
}

/// An answer of `kind` with the request's transaction id.
fn reply_to(message: &Message, kind: MessageType) -> Message {
    Message::new_with_id(kind, message.xid())
}

fn status(code: Status, text: &str) -> DhcpOption {
    DhcpOption::StatusCode(StatusCode {
        status: code,
        msg: text.to_string(),
    })
}

/// The message's first IA_NA.
fn first_ia_na(message: &Message) -> Option<&IANA> {
    message.opts().iter().find_map(|o| match o {
        DhcpOption::IANA(ia) => Some(ia),
        _ => None,
    })
}

/// The first address an IA_NA names (a client's hint, or the address it renews).
fn named_address(ia: &IANA) -> Option<Ipv6Addr> {
    ia.opts.iter().find_map(|o| match o {
        DhcpOption::IAAddr(a) => Some(a.addr),
        _ => None,
    })
}

mod relay;
mod sound;
#[cfg(test)]
mod tests;
