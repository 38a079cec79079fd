//! The virtual DHCPv4 server of one namespace (RFC 2131), answering on the agent's behalf.
//!
//! Addresses are not picked here: a client without a lease makes the server ask for a
//! [`Output::Claim`], which the agent runs as a DHT claim (the same majority lease as any
//! member address) and answers with [`Server::allocated`] or [`Server::refused`]. The reply
//! that waited (OFFER, or ACK for a client asking for a specific address) goes out then.
//! The DHCP lease and the DHT lease move together: a renewal asks for [`Output::Renew`], a
//! release, a decline and an expiry for [`Output::Release`].
//!
//! Requests relayed by a DHCP relay agent (non-zero `giaddr`, RFC 2131 4.1) are answered
//! to the relay at `giaddr`, port 67, through the link-layer address they came from, with
//! the Relay Agent Information option (82, RFC 3046) echoed unchanged; the relay's link
//! (`giaddr`, or the link-selection sub-option of RFC 3527) must lie in the namespace
//! subnet, the only one this server hands out.
//!
//! Call order: feed each request to [`Server::handle_request`] and the passage of time to
//! [`Server::handle_timeout`]; drain [`Server::poll_output`] after each.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use dhcproto::v4::{DhcpOption, HType, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};
use ipnet::Ipv4Net;

/// Clients served at once (bindings plus claims in flight); beyond, new ones are dropped.
pub const MAX_CLIENTS: usize = 4096;

/// Declined addresses remembered (not offered again).
const MAX_DECLINED: usize = 256;

/// How long an OFFER holds its address (and its DHT claim) for a client that has not taken
/// it up. RFC 2131 4.1's retransmission backoff (4, 8, 16, 32 s): a client still without an
/// answer 60 s after its REQUEST has given this offer up and starts over with a DISCOVER.
pub const OFFER_LIFETIME: Duration = Duration::from_secs(60);

/// The UDP port of DHCP servers and relay agents (RFC 2131 4.1).
pub const SERVER_PORT: u16 = 67;

/// The UDP port of DHCP clients.
pub const CLIENT_PORT: u16 = 68;

/// The Relay Agent Information option (RFC 3046).
const AGENT_INFORMATION: u8 = 82;

/// Its link-selection sub-option (RFC 3527): the client's subnet, when `giaddr` is not on it.
const LINK_SELECTION: u8 = 5;

/// What a namespace's DHCP replies say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The namespace subnet.
    pub subnet: Ipv4Net,
    /// The server identifier (option 54): the namespace's service address.
    pub server: Ipv4Addr,
    /// DNS servers (option 6): the namespace's virtual DNS address.
    pub dns: Vec<Ipv4Addr>,
    /// The domain (option 15): the namespace's name.
    pub domain: String,
    /// A default gateway (option 3), only if the namespace configures one.
    pub router: Option<Ipv4Addr>,
    /// Classless static routes (option 121, RFC 3442): other namespaces' addresses through
    /// their gateways (the policy's links). With any, the default gateway is sent among
    /// them too, since a client that takes option 121 ignores option 3.
    pub routes: Vec<(Ipv4Net, Ipv4Addr)>,
    /// Lease time (option 51).
    pub lease: Duration,
}

/// Who a lease is for: the client identifier (option 61) if sent, else the hardware address.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(pub Vec<u8>);

/// A reply to put on the wire: the vswitch frames it as UDP from port 67 to `port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The encoded DHCP message.
    pub bytes: Vec<u8>,
    /// Ethernet destination: the client's hardware address, or the relay agent's (the
    /// sender of a relayed request), or all ones when `broadcast`.
    pub mac: [u8; 6],
    /// IPv4 destination: the client's address, the relay agent's (`giaddr`), or
    /// 255.255.255.255 when `broadcast`.
    pub dst: Ipv4Addr,
    /// UDP destination port: [`CLIENT_PORT`], or [`SERVER_PORT`] for a relay agent.
    pub port: u16,
    /// Broadcast at both layers (the client has no address yet and asked for it, or a NAK).
    pub broadcast: bool,
}

/// What the server wants done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send this reply.
    Reply(Reply),
    /// Claim an address for `client` in the DHT: `hint` if free (the address it asks for, or
    /// had), else any free one unless `exact`. Answer with [`Server::allocated`] or
    /// [`Server::refused`].
    Claim {
        /// The client.
        client: ClientId,
        /// The address it asked for.
        hint: Option<Ipv4Addr>,
        /// Only `hint` will do (a client confirming an address it believes it has).
        exact: bool,
    },
    /// The client renewed: renew the DHT lease on this address.
    Renew(Ipv4Addr),
    /// The address is free again (released, declined or expired): release its DHT lease.
    Release(Ipv4Addr),
    /// `address` is acknowledged to the client at hardware address `mac` on the server's
    /// own link (not through a relay): a switch that checks senders binds them.
    Bound {
        /// The address.
        address: Ipv4Addr,
        /// The client's hardware address.
        mac: [u8; 6],
    },
    /// The client at `address` calls itself `name` (option 12): the agent may publish it.
    Hostname {
        /// The client's address.
        address: Ipv4Addr,
        /// Its hostname, a valid DNS label.
        name: String,
    },
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests answered (OFFER, ACK, NAK).
    pub replies: u64,
    /// Requests that did not parse as DHCP.
    pub malformed: u64,
    /// Requests not for this server, of an unsupported kind, or from an unusable client.
    pub ignored: u64,
    /// New clients dropped because [`MAX_CLIENTS`] are served.
    pub full: u64,
    /// NAKs sent.
    pub naks: u64,
    /// DECLINEs received.
    pub declines: u64,
    /// Requests that came through a relay agent (non-zero `giaddr`).
    pub relayed: u64,
    /// Relayed requests dropped because the relay's link (`giaddr` or RFC 3527 link
    /// selection) is outside the namespace subnet.
    pub relay_outside_subnet: u64,
    /// OFFERs not taken up within [`OFFER_LIFETIME`]: their addresses were released.
    pub offers_lapsed: u64,
}

#[derive(Debug, Clone)]
struct Binding {
    address: Ipv4Addr,
    expires: Instant,
    /// Offered and not yet acknowledged: it lapses after [`OFFER_LIFETIME`], not a lease.
    offered: bool,
}

/// A request as received: the message and what the server keeps beside it.
#[derive(Debug, Clone)]
struct Request {
    message: Message,
    /// Every instance of option 82 as it came (code and length included), echoed in the
    /// replies unchanged (RFC 3046 2.2); empty if none.
    agent_information: Vec<u8>,
    /// The link-layer sender: the client, or the relay agent that forwarded the request.
    sender: [u8; 6],
}

impl Request {
    fn relayed(&self) -> bool {
        !self.message.giaddr().is_unspecified()
    }
}

/// A request waiting for its claim.
#[derive(Debug, Clone)]
struct Pending {
    request: Request,
    answer: MessageType,
}

/// One namespace's DHCP server.
#[derive(Debug)]
pub struct Server {
    settings: Settings,
    bindings: HashMap<ClientId, Binding>,
    pending: HashMap<ClientId, Pending>,
    declined: HashSet<Ipv4Addr>,
    out: VecDeque<Output>,
    stats: Stats,
}

impl Server {
    /// A server with no leases.
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

    /// Replaces the classless static routes sent from now on ([`Settings::routes`]);
    /// clients take them at their next renewal.
    pub fn set_routes(&mut self, routes: Vec<(Ipv4Net, Ipv4Addr)>) {
        self.settings.routes = routes;
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The address leased to `client`, if any.
    pub fn lease_of(&self, client: &ClientId) -> Option<Ipv4Addr> {
        self.bindings.get(client).map(|b| b.address)
    }

    /// Migration source: the client leasing `address` moved to another router's LAN.
    /// Its lease leaves this server without a release (the address goes with the client)
    /// and is returned: the client and the time left. `None` if nobody leases it here
    /// (an offer not taken up is no lease).
    pub fn hand_over(&mut self, address: Ipv4Addr, now: Instant) -> Option<(ClientId, Duration)> {
        let client = self
            .bindings
            .iter()
            .find(|(_, b)| b.address == address && !b.offered)
            .map(|(c, _)| c.clone())?;
        let binding = self.bindings.remove(&client)?;
        Some((client, binding.expires.saturating_duration_since(now)))
    }

    /// Migration target: `client` moved here from another router's LAN with its lease on
    /// `address` (`remaining` left): its renewals are answered as this server's own. A
    /// lease for another address this client had here is replaced.
    pub fn take_over(
        &mut self,
        client: ClientId,
        address: Ipv4Addr,
        remaining: Duration,
        now: Instant,
    ) {
        if !self.usable(address) || remaining.is_zero() {
            return;
        }
        self.pending.remove(&client);
        self.bindings.insert(
            client,
            Binding {
                address,
                expires: now + remaining.min(self.settings.lease),
                offered: false,
            },
        );
    }

    /// What the server wants done next.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// When [`Server::handle_timeout`] wants to run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.bindings.values().map(|b| b.expires).min()
    }

    /// Leases that ran out without renewal, and offers not taken up: their addresses are
    /// released.
    pub fn handle_timeout(&mut self, now: Instant) {
        let (out, stats) = (&mut self.out, &mut self.stats);
        self.bindings.retain(|_, b| {
            let keep = b.expires > now;
            if !keep {
                if b.offered {
                    stats.offers_lapsed += 1;
                }
                out.push_back(Output::Release(b.address));
            }
            keep
        });
    }

    /// Handles one DHCP message (a UDP payload sent to port 67) that `sender` (the Ethernet
    /// source: the client, or a relay agent) put on the link.
    pub fn handle_request(&mut self, now: Instant, payload: &[u8], sender: [u8; 6]) {
        let Some((clean, agent_information)) = only_options_we_read(payload) else {
            self.stats.malformed += 1;
            return;
        };
        let Ok(message) = Message::decode(&mut Decoder::new(&clean)) else {
            self.stats.malformed += 1;
            return;
        };
        if message.opcode() != Opcode::BootRequest
            || message.htype() != HType::Eth
            || message.hlen() != 6
        {
            self.stats.ignored += 1;
            return;
        }
        let request = Request {
            message,
            agent_information,
            sender,
        };
        if request.relayed() {
            self.stats.relayed += 1;
        }
        // RFC 3527 3: the link selection names the client's subnet when present; else
        // `giaddr` does (RFC 2131 4.3.1). This server hands out one subnet only.
        let link = link_selection(&request.agent_information)
            .or_else(|| request.relayed().then(|| request.message.giaddr()));
        if link.is_some_and(|l| !self.settings.subnet.contains(&l)) {
            self.stats.relay_outside_subnet += 1;
            return;
        }
        let client = client_id(&request.message);
        match request.message.opts().msg_type() {
            Some(MessageType::Discover) => self.discover(client, request, now),
            Some(MessageType::Request) => self.request(client, request, now),
            Some(MessageType::Release) => self.release(&client, &request.message),
            Some(MessageType::Decline) => self.decline(&client, &request.message),
            Some(MessageType::Inform) => self.inform(&request),
            _ => self.stats.ignored += 1,
        }
    }

    /// The DHT granted `address` to `client`'s lease: the reply that waited goes out.
    pub fn allocated(&mut self, client: &ClientId, address: Ipv4Addr, now: Instant) {
        let Some(p) = self.pending.remove(client) else {
            // Nobody waits for it any more: give it back.
            self.out.push_back(Output::Release(address));
            return;
        };
        if !self.usable(address) || self.declined.contains(&address) {
            self.out.push_back(Output::Release(address));
            self.nak(&p.request);
            return;
        }
        // An OFFER holds the address only while the client may still take it up.
        let offered = p.answer == MessageType::Offer;
        let hold = if offered {
            OFFER_LIFETIME.min(self.settings.lease)
        } else {
            self.settings.lease
        };
        self.bindings.insert(
            client.clone(),
            Binding {
                address,
                expires: now + hold,
                offered,
            },
        );
        self.hostname(&p.request.message, address);
        self.reply(&p.request, p.answer, address);
    }

    /// The DHT had no address for `client` (taken, or none free): a client that asked for
    /// a specific address is told no; one that asked for any gets nothing (it retries).
    pub fn refused(&mut self, client: &ClientId) {
        if let Some(p) = self.pending.remove(client) {
            if p.answer == MessageType::Ack {
                self.nak(&p.request);
            }
        }
    }

    fn discover(&mut self, client: ClientId, request: Request, now: Instant) {
        let offer_lifetime = OFFER_LIFETIME.min(self.settings.lease);
        if let Some(b) = self.bindings.get_mut(&client) {
            if b.offered {
                // Offered again: the client may take it up for another offer lifetime.
                b.expires = b.expires.max(now + offer_lifetime);
            }
            let address = b.address;
            self.reply(&request, MessageType::Offer, address);
            return;
        }
        if self.pending.contains_key(&client) {
            return; // a claim for it is under way
        }
        if self.bindings.len() + self.pending.len() >= MAX_CLIENTS {
            self.stats.full += 1;
            return;
        }
        let hint = requested_address(&request.message).filter(|a| self.usable(*a));
        self.pending.insert(
            client.clone(),
            Pending {
                request,
                answer: MessageType::Offer,
            },
        );
        self.out.push_back(Output::Claim {
            client,
            hint,
            exact: false,
        });
    }

    fn request(&mut self, client: ClientId, request: Request, now: Instant) {
        let m = &request.message;
        // SELECTING with another server's identifier: the client chose someone else.
        if let Some(DhcpOption::ServerIdentifier(id)) = m.opts().get(OptionCode::ServerIdentifier) {
            if *id != self.settings.server {
                self.pending.remove(&client);
                self.stats.ignored += 1;
                return;
            }
        }
        let wanted = requested_address(m).or_else(|| {
            let c = m.ciaddr();
            (!c.is_unspecified()).then_some(c)
        });
        let Some(wanted) = wanted else {
            self.nak(&request);
            return;
        };
        if let Some(b) = self.bindings.get_mut(&client) {
            if b.address == wanted {
                // Selecting what we offered, renewing, rebinding or rebooting: one answer.
                b.expires = now + self.settings.lease;
                b.offered = false;
                self.out.push_back(Output::Renew(wanted));
                self.hostname(&request.message, wanted);
                self.reply(&request, MessageType::Ack, wanted);
            } else {
                self.nak(&request);
            }
            return;
        }
        if !self.usable(wanted) || self.declined.contains(&wanted) {
            self.nak(&request);
            return;
        }
        if self.pending.contains_key(&client) {
            return;
        }
        if self.bindings.len() + self.pending.len() >= MAX_CLIENTS {
            self.stats.full += 1;
            return;
        }
        // A client rebooting with an address from an earlier lease (ours before a restart,
        // or another server's): it may keep it if the DHT says it is free.
        self.pending.insert(
            client.clone(),
            Pending {
                request,
                answer: MessageType::Ack,
            },
        );
        self.out.push_back(Output::Claim {
            client,
            hint: Some(wanted),
            exact: true,
        });
    }

    fn release(&mut self, client: &ClientId, request: &Message) {
        match self.bindings.get(client) {
            Some(b) if b.address == request.ciaddr() => {
                self.bindings.remove(client);
                self.out.push_back(Output::Release(request.ciaddr()));
            }
            _ => self.stats.ignored += 1,
        }
    }

    fn decline(&mut self, client: &ClientId, request: &Message) {
        self.stats.declines += 1;
        let Some(address) = requested_address(request) else {
            self.stats.ignored += 1;
            return;
        };
        if self
            .bindings
            .get(client)
            .is_some_and(|b| b.address == address)
        {
            self.bindings.remove(client);
            self.out.push_back(Output::Release(address));
            // Something on the LAN answers for it already: do not offer it again.
            if self.declined.len() < MAX_DECLINED {
                self.declined.insert(address);
            }
        }
    }

    fn inform(&mut self, request: &Request) {
        // The client has an address already and wants the other settings.
        self.reply(request, MessageType::Ack, Ipv4Addr::UNSPECIFIED);
    }

    fn usable(&self, a: Ipv4Addr) -> bool {
        let s = &self.settings;
        s.subnet.contains(&a)
            && a != s.subnet.network()
            && a != s.subnet.broadcast()
            && a != s.server
            && !s.dns.contains(&a)
            && Some(a) != s.router
    }

    fn hostname(&mut self, request: &Message, address: Ipv4Addr) {
        if let Some(DhcpOption::Hostname(name)) = request.opts().get(OptionCode::Hostname) {
            if let Ok(name) = crate::dns::host_name(name.trim_end_matches('\0')) {
                self.out.push_back(Output::Hostname { address, name });
            }
        }
    }

    fn nak(&mut self, request: &Request) {
        self.stats.naks += 1;
        let mut m = self.base(&request.message, MessageType::Nak);
        m.set_ciaddr(Ipv4Addr::UNSPECIFIED);
        if request.relayed() {
            // RFC 2131 4.3.2: through a relay, the broadcast bit tells it to broadcast the
            // NAK on the client's link.
            m.set_flags(m.flags().set_broadcast());
        }
        self.send(&m, request, true, Ipv4Addr::BROADCAST);
    }

    fn reply(&mut self, request: &Request, kind: MessageType, address: Ipv4Addr) {
        let s = &self.settings;
        let mut m = self.base(&request.message, kind);
        m.set_yiaddr(address);
        if kind == MessageType::Ack && !address.is_unspecified() && !request.relayed() {
            self.out.push_back(Output::Bound {
                address,
                mac: mac_of(&request.message),
            });
        }
        let opts = m.opts_mut();
        if kind != MessageType::Ack || !address.is_unspecified() {
            let lease = u32::try_from(s.lease.as_secs()).unwrap_or(u32::MAX);
            opts.insert(DhcpOption::AddressLeaseTime(lease));
            opts.insert(DhcpOption::Renewal(lease / 2));
            opts.insert(DhcpOption::Rebinding(lease / 8 * 7));
        }
        opts.insert(DhcpOption::SubnetMask(s.subnet.netmask()));
        opts.insert(DhcpOption::BroadcastAddr(s.subnet.broadcast()));
        if !s.dns.is_empty() {
            opts.insert(DhcpOption::DomainNameServer(s.dns.clone()));
        }
        if !s.domain.is_empty() {
            opts.insert(DhcpOption::DomainName(s.domain.clone()));
        }
        if let Some(r) = s.router {
            opts.insert(DhcpOption::Router(vec![r]));
        }
        if !s.routes.is_empty() {
            let mut routes = s.routes.clone();
            if let Some(r) = s.router {
                routes.push((Ipv4Net::default(), r));
            }
            opts.insert(DhcpOption::ClasslessStaticRoute(routes));
        }
        // RFC 2131 4.1: to the address the client has, else as it asked, else unicast to
        // the address offered at its hardware address (a relay is `send`'s business).
        let ciaddr = request.message.ciaddr();
        let (broadcast, dst) = if !ciaddr.is_unspecified() {
            (false, ciaddr)
        } else if request.message.flags().broadcast() {
            (true, Ipv4Addr::BROADCAST)
        } else {
            (false, address)
        };
        self.send(&m, request, broadcast || dst.is_unspecified(), dst);
    }

    fn base(&self, request: &Message, kind: MessageType) -> Message {
        let mut m = Message::default();
        m.set_opcode(Opcode::BootReply)
            .set_htype(HType::Eth)
            .set_xid(request.xid())
            .set_flags(request.flags())
            .set_ciaddr(request.ciaddr())
            .set_giaddr(request.giaddr())
            .set_chaddr(&mac_of(request));
        m.opts_mut().insert(DhcpOption::MessageType(kind));
        m.opts_mut()
            .insert(DhcpOption::ServerIdentifier(self.settings.server));
        m
    }

    /// Encodes `m` and queues it: to the relay agent if `request` came through one (RFC
    /// 2131 4.1: `giaddr`, port 67, whatever the client asked), else as `broadcast` and
    /// `dst` say.
    fn send(&mut self, m: &Message, request: &Request, broadcast: bool, dst: Ipv4Addr) {
        let mut bytes = Vec::with_capacity(300);
        if m.encode(&mut Encoder::new(&mut bytes)).is_err() || bytes.last() != Some(&255) {
            // Every field above is in range and options end with End; a failure is a bug,
            // not input.
            self.stats.ignored += 1;
            return;
        }
        // RFC 3046 2.2: option 82 echoed as it came, the last option before End.
        let end = bytes.len() - 1;
        bytes.splice(end..end, request.agent_information.iter().copied());
        self.stats.replies += 1;
        let reply = if request.relayed() {
            Reply {
                bytes,
                mac: request.sender,
                dst: request.message.giaddr(),
                port: SERVER_PORT,
                broadcast: false,
            }
        } else if broadcast {
            Reply {
                bytes,
                mac: [0xff; 6],
                dst: Ipv4Addr::BROADCAST,
                port: CLIENT_PORT,
                broadcast,
            }
        } else {
            Reply {
                bytes,
                mac: mac_of(&request.message),
                dst,
                port: CLIENT_PORT,
                broadcast,
            }
        };
        self.out.push_back(Output::Reply(reply));
    }
}

/// The fixed BOOTP header and the magic cookie (RFC 2131): options start after them.
const OPTIONS_AT: usize = 240;
const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];

/// The options this server reads, with the lengths it accepts (`None`: any, at least 1).
const READ: [(u8, Option<usize>); 6] = [
    (53, Some(1)), // message type
    (50, Some(4)), // requested address
    (54, Some(4)), // server identifier
    (61, None),    // client identifier
    (12, None),    // hostname
    (55, None),    // parameter request list
];

/// The request with every option this server does not read removed, after checking that
/// each option fits the packet, and beside it every instance of option 82 as it came;
/// `None` if an option does not fit. `dhcproto` 0.15 asserts the lengths of some options it
/// decodes (rapid commit, client FQDN, bulk lease query...) with `debug_assert!` or
/// subtracts without checking, which a hostile client could turn into a panic in a debug
/// build; only what is read here reaches it (found by the fuzz target). Option 82 is kept
/// as bytes, so that it is echoed unchanged whatever its sub-options.
fn only_options_we_read(payload: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    if payload.len() < OPTIONS_AT || payload[OPTIONS_AT - 4..OPTIONS_AT] != MAGIC_COOKIE {
        return None;
    }
    let mut out = payload[..OPTIONS_AT].to_vec();
    let mut agent_information = Vec::new();
    let mut i = OPTIONS_AT;
    while let Some(&code) = payload.get(i) {
        match code {
            0 => i += 1,
            255 => break,
            _ => {
                let len = usize::from(*payload.get(i + 1)?);
                let option = payload.get(i..i + 2 + len)?;
                if code == AGENT_INFORMATION {
                    agent_information.extend_from_slice(option);
                }
                let wanted = READ.iter().find(|(c, _)| *c == code);
                if let Some((_, want)) = wanted {
                    if len == 0 || want.is_some_and(|w| w != len) {
                        return None;
                    }
                    out.extend_from_slice(option);
                }
                i += 2 + len;
            }
        }
    }
    out.push(255);
    Some((out, agent_information))
}

/// The link-selection sub-option (RFC 3527) of option 82, given as its instances on the
/// wire (`code len data`, concatenated as RFC 3396 says). A sub-option that does not fit
/// is not read.
fn link_selection(agent_information: &[u8]) -> Option<Ipv4Addr> {
    let mut data = Vec::new();
    let mut i = 0;
    while let Some(len) = agent_information.get(i + 1) {
        data.extend_from_slice(agent_information.get(i + 2..i + 2 + usize::from(*len))?);
        i += 2 + usize::from(*len);
    }
    let mut i = 0;
    while let (Some(&code), Some(&len)) = (data.get(i), data.get(i + 1)) {
        let value = data.get(i + 2..i + 2 + usize::from(len))?;
        if code == LINK_SELECTION {
            let octets: [u8; 4] = value.try_into().ok()?;
            return Some(Ipv4Addr::from(octets));
        }
        i += 2 + usize::from(len);
    }
    None
}

/// Option 61 if present, else the hardware address.
fn client_id(m: &Message) -> ClientId {
    match m.opts().get(OptionCode::ClientIdentifier) {
        Some(DhcpOption::ClientIdentifier(id)) if !id.is_empty() => ClientId(id.clone()),
        _ => ClientId(mac_of(m).to_vec()),
    }
}

/// The client's Ethernet address (requests with another hardware type are dropped first).
fn mac_of(m: &Message) -> [u8; 6] {
    let mut mac = [0u8; 6];
    if let Some(c) = m.chaddr().get(..6) {
        mac.copy_from_slice(c);
    }
    mac
}

fn requested_address(m: &Message) -> Option<Ipv4Addr> {
    match m.opts().get(OptionCode::RequestedIpAddress) {
        Some(DhcpOption::RequestedIpAddress(a)) => Some(*a),
        _ => None,
    }
}

/// A DNS label: 1-63 letters, digits and inner hyphens.
#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests start the clock
mod tests {
    use super::*;
    use dhcproto::v4::Flags;

    const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x42];
    const SERVER: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 1);

    fn settings() -> Settings {
        Settings {
            subnet: "10.201.0.0/16".parse().unwrap(),
            server: SERVER,
            dns: vec![SERVER],
            domain: "lab".into(),
            router: None,
            routes: Vec::new(),
            lease: Duration::from_secs(600),
        }
    }

    /// A request as a client encodes it.
    fn request(kind: MessageType, ciaddr: Ipv4Addr, opts: Vec<DhcpOption>) -> Vec<u8> {
        let mut m = Message::new_with_id(
            0x1234,
            ciaddr,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &MAC,
        );
        m.opts_mut().insert(DhcpOption::MessageType(kind));
        for o in opts {
            m.opts_mut().insert(o);
        }
        let mut buf = Vec::new();
        m.encode(&mut Encoder::new(&mut buf)).unwrap();
        buf
    }

    fn outputs(s: &mut Server) -> Vec<Output> {
        std::iter::from_fn(|| s.poll_output()).collect()
    }

    fn decode(r: &Reply) -> Message {
        Message::decode(&mut Decoder::new(&r.bytes)).unwrap()
    }

    fn only_reply(out: &[Output]) -> (Reply, Message) {
        let r = out
            .iter()
            .find_map(|o| match o {
                Output::Reply(r) => Some(r.clone()),
                _ => None,
            })
            .expect("a reply");
        let m = decode(&r);
        (r, m)
    }

    fn client() -> ClientId {
        ClientId(MAC.to_vec())
    }

    #[test]
    fn discover_offer_request_ack_with_the_namespace_settings() {
        let t = Instant::now();
        let mut s = Server::new(settings());
        s.handle_request(
            t,
            &request(MessageType::Discover, Ipv4Addr::UNSPECIFIED, vec![]),
            MAC,
        );
        assert_eq!(
            outputs(&mut s),
            vec![Output::Claim {
                client: client(),
                hint: None,
                exact: false
            }]
        );
        // A retransmitted DISCOVER while the claim runs starts nothing new.
        s.handle_request(
            t,
            &request(MessageType::Discover, Ipv4Addr::UNSPECIFIED, vec![]),
            MAC,
        );
        assert!(outputs(&mut s).is_empty());
        let a = Ipv4Addr::new(10, 201, 7, 9);
        s.allocated(&client(), a, t);
        let (r, offer) = only_reply(&outputs(&mut s));
        assert_eq!(offer.opts().msg_type(), Some(MessageType::Offer));
        assert_eq!(
            (offer.yiaddr(), offer.xid(), offer.opcode()),
            (a, 0x1234, Opcode::BootReply)
        );
        assert_eq!((r.dst, r.broadcast, r.mac), (a, false, MAC));
        let o = offer.opts();
        assert_eq!(
            o.get(OptionCode::SubnetMask),
            Some(&DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 0, 0)))
        );
        assert_eq!(
            o.get(OptionCode::DomainNameServer),
            Some(&DhcpOption::DomainNameServer(vec![SERVER]))
        );
        assert_eq!(
            o.get(OptionCode::DomainName),
            Some(&DhcpOption::DomainName("lab".into()))
        );
        assert_eq!(
            o.get(OptionCode::AddressLeaseTime),
            Some(&DhcpOption::AddressLeaseTime(600))
        );
        assert_eq!(
            o.get(OptionCode::ServerIdentifier),
            Some(&DhcpOption::ServerIdentifier(SERVER))
        );
        assert_eq!(o.get(OptionCode::Router), None, "no gateway configured");

        // SELECTING: the client takes the offer.
        let req = request(
            MessageType::Request,
            Ipv4Addr::UNSPECIFIED,
            vec![
                DhcpOption::ServerIdentifier(SERVER),
                DhcpOption::RequestedIpAddress(a),
                DhcpOption::Hostname("Web-1".into()),
            ],
        );
        s.handle_request(t, &req, MAC);
        let out = outputs(&mut s);
        let (_, ack) = only_reply(&out);
        assert_eq!(
            (ack.opts().msg_type(), ack.yiaddr()),
            (Some(MessageType::Ack), a)
        );
        assert!(out.contains(&Output::Renew(a)));
        assert!(out.contains(&Output::Hostname {
            address: a,
            name: "web-1".into()
        }));
        assert_eq!(s.lease_of(&client()), Some(a));
    }

    #[test]
    fn renew_release_and_expiry_move_the_dht_lease_too() {
        let t = Instant::now();
        let mut s = Server::new(settings());
        let a = Ipv4Addr::new(10, 201, 0, 20);
        s.handle_request(
            t,
            &request(MessageType::Discover, Ipv4Addr::UNSPECIFIED, vec![]),
            MAC,
        );
        s.allocated(&client(), a, t);
        outputs(&mut s);
        // RENEWING: unicast from the address it holds.
        let later = t + Duration::from_secs(300);
        s.handle_request(later, &request(MessageType::Request, a, vec![]), MAC);
        let out = outputs(&mut s);
        let (r, ack) = only_reply(&out);
        assert_eq!(
            (ack.opts().msg_type(), r.dst, r.broadcast),
            (Some(MessageType::Ack), a, false)
        );
        assert!(out.contains(&Output::Renew(a)));
        // Renewed: still held past the first lease's end, gone after the second.
        s.handle_timeout(t + Duration::from_secs(700));
        assert_eq!(s.lease_of(&client()), Some(a));
        assert_eq!(s.poll_timeout(), Some(later + Duration::from_secs(600)));
        s.handle_timeout(later + Duration::from_secs(600));
        assert_eq!(outputs(&mut s), vec![Output::Release(a)]);
        assert_eq!(s.lease_of(&client()), None);

        // RELEASE frees both leases.
        s.handle_request(
            t,
            &request(MessageType::Discover, Ipv4Addr::UNSPECIFIED, vec![]),
            MAC,
        );
        s.allocated(&client(), a, t);
        outputs(&mut s);
        s.handle_request(t, &request(MessageType::Release, a, vec![]), MAC);
        assert_eq!(outputs(&mut s), vec![Output::Release(a)]);
        assert_eq!(s.lease_of(&client()), None);
    }

    #[test]
    fn a_lease_moves_between_servers_without_a_release() {
        let t = Instant::now();
        let (mut source, mut target) = (Server::new(settings()), Server::new(settings()));
        let a = Ipv4Addr::new(10, 201, 0, 20);
        source.handle_request(
            t,
            &request(MessageType::Discover, Ipv4Addr::UNSPECIFIED, vec![]),
            MAC,
        );
        source.allocated(&client(), a, t);
        outputs(&mut source);
        assert_eq!(source.hand_over(a, t), None, "an offer is no lease");
        source.handle_request(t, &request(MessageType::Request, a, vec![]), MAC);
        outputs(&mut source);
        let later = t + Duration::from_secs(100);
        let (who, left) = source.hand_over(a, later).expect("the lease leaves");
        assert_eq!((who.clone(), left), (client(), Duration::from_secs(500)));
        assert_eq!(source.lease_of(&client()), None);
        source.handle_timeout(t + Duration::from_secs(3600));
        assert_eq!(
            outputs(&mut source),
            vec![],
            "no release: the address went along"
        );
        // The target answers the client's renewal at once, with no claim first.
        target.take_over(who, a, left, later);
        assert_eq!(target.lease_of(&client()), Some(a));
        target.handle_request(later, &request(MessageType::Request, a, vec![]), MAC);
        let out = outputs(&mut target);
        let (_, ack) = only_reply(&out);
        assert_eq!(ack.opts().msg_type(), Some(MessageType::Ack));
        assert!(out.contains(&Output::Renew(a)));
        // Nothing taken over for an address the server does not hand out.
        let mut other = Server::new(settings());
        other.take_over(client(), Ipv4Addr::new(192, 0, 2, 1), left, later);
        assert_eq!(other.lease_of(&client()), None);
    }

    #[test]
    fn a_rebooting_client_keeps_its_address_only_if_the_dht_says_so() {
        let t = Instant::now();
        let mut s = Server::new(settings());
        let a = Ipv4Addr::new(10, 201, 3, 3);
        let reboot = request(
            MessageType::Request,
            Ipv4Addr::UNSPECIFIED,
            vec![DhcpOption::RequestedIpAddress(a)],
        );
        s.handle_request(t, &reboot, MAC);
        assert_eq!(
            outputs(&mut s),
            vec![Output::Claim {
                client: client(),
                hint: Some(a),
                exact: true
            }]
        );
        s.refused(&client());
        let (r, nak) = only_reply(&outputs(&mut s));
        assert_eq!(nak.opts().msg_type(), Some(MessageType::Nak));
        assert!(r.broadcast && r.dst == Ipv4Addr::BROADCAST);
        // Asked again and free this time: ACKed.
        s.handle_request(t, &reboot, MAC);
        outputs(&mut s);
        s.allocated(&client(), a, t);
        let (_, ack) = only_reply(&outputs(&mut s));
        assert_eq!(
            (ack.opts().msg_type(), ack.yiaddr()),
            (Some(MessageType::Ack), a)
        );
        // Another address while holding this one: NAK.
        let other = request(
            MessageType::Request,
            Ipv4Addr::UNSPECIFIED,
            vec![DhcpOption::RequestedIpAddress(Ipv4Addr::new(10, 201, 3, 4))],
        );
        s.handle_request(t, &other, MAC);
        let (_, nak) = only_reply(&outputs(&mut s));
        assert_eq!(nak.opts().msg_type(), Some(MessageType::Nak));
        // Unusable requests are refused without a claim.
        for bad in [
            Ipv4Addr::new(192, 168, 0, 1),
            SERVER,
            Ipv4Addr::new(10, 201, 255, 255),
        ] {
            let mut s = Server::new(settings());
            s.handle_request(
                t,
                &request(
                    MessageType::Request,
                    Ipv4Addr::UNSPECIFIED,
                    vec![DhcpOption::RequestedIpAddress(bad)],
                ),
                MAC,
            );
            let (_, nak) = only_reply(&outputs(&mut s));
            assert_eq!(nak.opts().msg_type(), Some(MessageType::Nak), "{bad}");
        }
    }

    #[test]
    fn linked_namespaces_are_classless_static_routes_with_the_default_among_them() {
        let t = Instant::now();
        let via = Ipv4Addr::new(10, 201, 0, 250);
        let linked: Ipv4Net = "10.202.0.0/24".parse().unwrap();
        for (router, expect) in [
            (None, vec![(linked, via)]),
            (
                Some(Ipv4Addr::new(10, 201, 0, 254)),
                vec![
                    (linked, via),
                    (Ipv4Net::default(), Ipv4Addr::new(10, 201, 0, 254)),
                ],
            ),
        ] {
            let mut s = Server::new(Settings {
                router,
                ..settings()
            });
            s.set_routes(vec![(linked, via)]);
            s.handle_request(
                t,
                &request(MessageType::Discover, Ipv4Addr::UNSPECIFIED, vec![]),
                MAC,
            );
            outputs(&mut s);
            s.allocated(&client(), Ipv4Addr::new(10, 201, 7, 9), t);
            let (_, offer) = only_reply(&outputs(&mut s));
            assert_eq!(
                offer.opts().get(OptionCode::ClasslessStaticRoute),
                Some(&DhcpOption::ClasslessStaticRoute(expect))
            );
        }
    }

    #[test]
    fn another_servers_client_decline_and_inform() {
        let t = Instant::now();
        let mut s = Server::new(Settings {
            router: Some(Ipv4Addr::new(10, 201, 0, 254)),
            ..settings()
        });
        let a = Ipv4Addr::new(10, 201, 0, 30);
        s.handle_request(
            t,
            &request(
                MessageType::Request,
                Ipv4Addr::UNSPECIFIED,
                vec![
                    DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 201, 0, 99)),
                    DhcpOption::RequestedIpAddress(a),
                ],
            ),
            MAC,
        );
        assert!(
            outputs(&mut s).is_empty(),
            "the client chose another server"
        );
        assert_eq!(s.stats().ignored, 1);

        // DECLINE: the address is in use on the LAN; it is released and never offered again.
        s.handle_request(
            t,
            &request(MessageType::Discover, Ipv4Addr::UNSPECIFIED, vec![]),
            MAC,
        );
        s.allocated(&client(), a, t);
        outputs(&mut s);
        s.handle_request(
            t,
            &request(
                MessageType::Decline,
                Ipv4Addr::UNSPECIFIED,
                vec![DhcpOption::RequestedIpAddress(a)],
            ),
            MAC,
        );
        assert_eq!(outputs(&mut s), vec![Output::Release(a)]);
        s.handle_request(
            t,
            &request(MessageType::Discover, Ipv4Addr::UNSPECIFIED, vec![]),
            MAC,
        );
        outputs(&mut s);
        s.allocated(&client(), a, t);
        let out = outputs(&mut s);
        assert!(out.contains(&Output::Release(a)));
        assert_eq!(s.lease_of(&client()), None);

        // INFORM: settings only, to the address the client has; the gateway is there.
        let b = Ipv4Addr::new(10, 201, 0, 40);
        s.handle_request(t, &request(MessageType::Inform, b, vec![]), MAC);
        let (r, ack) = only_reply(&outputs(&mut s));
        assert_eq!(
            (ack.opts().msg_type(), ack.yiaddr(), r.dst),
            (Some(MessageType::Ack), Ipv4Addr::UNSPECIFIED, b)
        );
        assert_eq!(ack.opts().get(OptionCode::AddressLeaseTime), None);
        assert_eq!(
            ack.opts().get(OptionCode::Router),
            Some(&DhcpOption::Router(vec![Ipv4Addr::new(10, 201, 0, 254)]))
        );
    }

    #[test]
    fn broadcast_flag_and_bad_hostnames() {
        let t = Instant::now();
        let mut s = Server::new(settings());
        let mut m = Message::decode(&mut Decoder::new(&request(
            MessageType::Discover,
            Ipv4Addr::UNSPECIFIED,
            vec![DhcpOption::Hostname("bad name!".into())],
        )))
        .unwrap();
        m.set_flags(Flags::default().set_broadcast());
        let mut buf = Vec::new();
        m.encode(&mut Encoder::new(&mut buf)).unwrap();
        s.handle_request(t, &buf, MAC);
        outputs(&mut s);
        s.allocated(&client(), Ipv4Addr::new(10, 201, 0, 50), t);
        let out = outputs(&mut s);
        let (r, _) = only_reply(&out);
        assert!(r.broadcast && r.dst == Ipv4Addr::BROADCAST);
        assert!(
            !out.iter().any(|o| matches!(o, Output::Hostname { .. })),
            "not a DNS label"
        );
    }

    const RELAY_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x99];
    const GIADDR: Ipv4Addr = Ipv4Addr::new(10, 201, 50, 1);

    /// A request as a relay agent forwards it: `giaddr` set, `agent_information` (option 82
    /// as bytes on the wire) appended last, as RFC 3046 2.1 has it.
    fn relayed(
        kind: MessageType,
        giaddr: Ipv4Addr,
        opts: Vec<DhcpOption>,
        agent_information: &[u8],
    ) -> Vec<u8> {
        let mut m = Message::decode(&mut Decoder::new(&request(
            kind,
            Ipv4Addr::UNSPECIFIED,
            opts,
        )))
        .unwrap();
        m.set_giaddr(giaddr).set_hops(1);
        let mut buf = Vec::new();
        m.encode(&mut Encoder::new(&mut buf)).unwrap();
        let end = buf.len() - 1;
        buf.splice(end..end, agent_information.iter().copied());
        buf
    }

    /// Option 82 with a circuit id (1) and a remote id (2), as ISC dhcrelay -a sends them.
    const AGENT_INFORMATION: [u8; 14] = [82, 12, 1, 4, b'e', b't', b'h', b'0', 2, 4, 2, 0, 0, 9];

    /// The options of an encoded reply, as (code, bytes) on the wire, End excluded.
    fn raw_options(bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        let mut i = OPTIONS_AT;
        while let Some(&code) = bytes.get(i) {
            match code {
                0 => i += 1,
                255 => break,
                _ => {
                    let len = usize::from(bytes[i + 1]);
                    out.push((code, bytes[i..i + 2 + len].to_vec()));
                    i += 2 + len;
                }
            }
        }
        out
    }

    /// RFC 2131 4.1 and RFC 3046 2.2: a relayed request is answered to the relay at
    /// `giaddr`, port 67, through the MAC it came from (whatever the client's broadcast
    /// flag), with option 82 echoed unchanged as the last option; a NAK through a relay
    /// carries the broadcast bit (RFC 2131 4.3.2).
    #[test]
    fn relayed_requests_are_answered_to_the_relay_with_option_82_echoed() {
        let t = Instant::now();
        let mut s = Server::new(settings());
        s.handle_request(
            t,
            &relayed(MessageType::Discover, GIADDR, vec![], &AGENT_INFORMATION),
            RELAY_MAC,
        );
        assert!(matches!(
            &outputs(&mut s)[..],
            [Output::Claim { exact: false, .. }]
        ));
        let a = Ipv4Addr::new(10, 201, 7, 7);
        s.allocated(&client(), a, t);
        let (r, offer) = only_reply(&outputs(&mut s));
        assert_eq!(
            (r.mac, r.dst, r.port, r.broadcast),
            (RELAY_MAC, GIADDR, SERVER_PORT, false)
        );
        assert_eq!(
            (offer.opts().msg_type(), offer.yiaddr(), offer.giaddr()),
            (Some(MessageType::Offer), a, GIADDR)
        );
        assert_eq!(offer.chaddr().get(..6), Some(&MAC[..]), "the client's");
        let options = raw_options(&r.bytes);
        assert_eq!(
            options.last(),
            Some(&(82, AGENT_INFORMATION.to_vec())),
            "{options:?}"
        );

        // SELECTING through the relay, broadcast flag set: still to the relay.
        let mut m = Message::decode(&mut Decoder::new(&relayed(
            MessageType::Request,
            GIADDR,
            vec![
                DhcpOption::ServerIdentifier(SERVER),
                DhcpOption::RequestedIpAddress(a),
            ],
            &AGENT_INFORMATION,
        )))
        .unwrap();
        m.set_flags(Flags::default().set_broadcast());
        let mut select = Vec::new();
        m.encode(&mut Encoder::new(&mut select)).unwrap();
        let end = select.len() - 1;
        select.splice(end..end, AGENT_INFORMATION);
        s.handle_request(t, &select, RELAY_MAC);
        let (r, ack) = only_reply(&outputs(&mut s));
        assert_eq!(
            (ack.opts().msg_type(), r.dst, r.port, r.mac, r.broadcast),
            (
                Some(MessageType::Ack),
                GIADDR,
                SERVER_PORT,
                RELAY_MAC,
                false
            )
        );
        assert_eq!(
            raw_options(&r.bytes).last(),
            Some(&(82, AGENT_INFORMATION.to_vec()))
        );

        // A relayed request for an address it cannot have: NAK to the relay, broadcast bit.
        s.handle_request(
            t,
            &relayed(
                MessageType::Request,
                GIADDR,
                vec![DhcpOption::RequestedIpAddress(Ipv4Addr::new(10, 201, 7, 8))],
                &[],
            ),
            RELAY_MAC,
        );
        let (r, nak) = only_reply(&outputs(&mut s));
        assert_eq!(nak.opts().msg_type(), Some(MessageType::Nak));
        assert!(nak.flags().broadcast());
        assert_eq!((r.dst, r.port, r.mac), (GIADDR, SERVER_PORT, RELAY_MAC));
        assert!(
            raw_options(&r.bytes).iter().all(|(c, _)| *c != 82),
            "no option 82 came, none goes"
        );
        assert_eq!(s.stats().relayed, 3);

        // A direct client's reply is unchanged: to port 68 at its own MAC.
        let mut s = Server::new(settings());
        s.handle_request(
            t,
            &request(MessageType::Discover, Ipv4Addr::UNSPECIFIED, vec![]),
            RELAY_MAC,
        );
        s.allocated(&client(), a, t);
        let (r, _) = only_reply(&outputs(&mut s));
        assert_eq!((r.mac, r.dst, r.port), (MAC, a, CLIENT_PORT));
        assert_eq!(s.stats().relayed, 0);
    }

    /// A relay's link must be the namespace subnet: `giaddr`, or the RFC 3527 link
    /// selection when present (then `giaddr` may be anywhere the relay is reachable).
    #[test]
    fn a_relay_link_outside_the_subnet_is_dropped_and_counted() {
        let t = Instant::now();
        let outside = Ipv4Addr::new(192, 168, 9, 1);
        let link = |a: Ipv4Addr| {
            let o = a.octets();
            vec![82, 6, LINK_SELECTION, 4, o[0], o[1], o[2], o[3]]
        };
        for (giaddr, info, answered) in [
            (outside, vec![], false),
            (GIADDR, link(outside), false),
            (outside, link(GIADDR), true),
            (GIADDR, link(GIADDR), true),
        ] {
            let mut s = Server::new(settings());
            s.handle_request(
                t,
                &relayed(MessageType::Discover, giaddr, vec![], &info),
                RELAY_MAC,
            );
            let out = outputs(&mut s);
            assert_eq!(
                (out.len(), s.stats().relay_outside_subnet),
                (usize::from(answered), u64::from(!answered)),
                "giaddr {giaddr}, option 82 {info:?}: {out:?}"
            );
            if answered {
                s.allocated(&client(), Ipv4Addr::new(10, 201, 7, 7), t);
                let (r, _) = only_reply(&outputs(&mut s));
                assert_eq!(
                    (r.dst, r.port),
                    (giaddr, SERVER_PORT),
                    "replies go to giaddr"
                );
            }
        }
        // Link selection on its own (no giaddr) is held to the subnet too.
        let mut s = Server::new(settings());
        s.handle_request(
            t,
            &relayed(
                MessageType::Discover,
                Ipv4Addr::UNSPECIFIED,
                vec![],
                &link(outside),
            ),
            MAC,
        );
        assert!(outputs(&mut s).is_empty());
        assert_eq!(s.stats().relay_outside_subnet, 1);
    }

    /// An OFFER never taken up holds its address (and DHT claim) for [`OFFER_LIFETIME`],
    /// not a lease; one taken up holds it for the lease.
    #[test]
    fn an_offer_not_taken_up_lapses_and_releases_its_claim() {
        let t = Instant::now();
        let mut s = Server::new(settings());
        let a = Ipv4Addr::new(10, 201, 7, 7);
        let discover = relayed(MessageType::Discover, GIADDR, vec![], &AGENT_INFORMATION);
        s.handle_request(t, &discover, RELAY_MAC);
        s.allocated(&client(), a, t);
        outputs(&mut s);
        assert_eq!(s.poll_timeout(), Some(t + OFFER_LIFETIME));
        // A DISCOVER again later: the same offer, for another offer lifetime.
        let later = t + Duration::from_secs(30);
        s.handle_request(later, &discover, RELAY_MAC);
        let (_, offer) = only_reply(&outputs(&mut s));
        assert_eq!(offer.yiaddr(), a);
        assert_eq!(s.poll_timeout(), Some(later + OFFER_LIFETIME));
        s.handle_timeout(later + OFFER_LIFETIME - Duration::from_secs(1));
        assert!(outputs(&mut s).is_empty());
        s.handle_timeout(later + OFFER_LIFETIME);
        assert_eq!(outputs(&mut s), vec![Output::Release(a)]);
        assert_eq!((s.lease_of(&client()), s.stats().offers_lapsed), (None, 1));

        // Taken up: the lease's lifetime, not the offer's.
        s.handle_request(t, &discover, RELAY_MAC);
        s.allocated(&client(), a, t);
        outputs(&mut s);
        s.handle_request(
            t,
            &relayed(
                MessageType::Request,
                GIADDR,
                vec![
                    DhcpOption::ServerIdentifier(SERVER),
                    DhcpOption::RequestedIpAddress(a),
                ],
                &[],
            ),
            RELAY_MAC,
        );
        outputs(&mut s);
        s.handle_timeout(t + OFFER_LIFETIME);
        assert!(outputs(&mut s).is_empty());
        assert_eq!(s.lease_of(&client()), Some(a));
        assert_eq!(s.poll_timeout(), Some(t + Duration::from_secs(600)));
    }

    /// The fuzz target's first find: a bulk-lease-query option of the wrong length made
    /// `dhcproto` assert in debug builds. Options this server does not read never reach it.
    #[test]
    fn options_we_do_not_read_are_dropped_before_decoding() {
        let t = Instant::now();
        let mut s = Server::new(settings());
        let mut r = request(MessageType::Discover, Ipv4Addr::UNSPECIFIED, vec![]);
        let end = r.iter().rposition(|&b| b == 255).unwrap();
        // Rapid commit with a length, client FQDN too short, bulk lease query times of 1 byte.
        r.splice(
            end..end,
            [
                80, 1, 0, 81, 1, 0, 157, 1, 7, 158, 1, 7, 159, 1, 7, 160, 1, 7,
            ],
        );
        s.handle_request(t, &r, MAC);
        assert!(matches!(s.poll_output(), Some(Output::Claim { .. })));
        // An option running past the end is malformed; so is a message type of 2 bytes.
        let mut cut = request(MessageType::Discover, Ipv4Addr::UNSPECIFIED, vec![]);
        cut.truncate(cut.len() - 1);
        cut.extend_from_slice(&[61, 200, 1]);
        s.handle_request(t, &cut, MAC);
        let mut long = request(MessageType::Discover, Ipv4Addr::UNSPECIFIED, vec![]);
        let at = long.iter().position(|&b| b == 53).unwrap();
        long.splice(at..at + 3, [53, 2, 1, 1]);
        s.handle_request(t, &long, MAC);
        assert_eq!(s.stats().malformed, 2);
    }

    /// Every prefix and single-byte corruption of real requests: a reply or a counted drop.
    #[test]
    fn hostile_requests_never_panic() {
        let t = Instant::now();
        let mut s = Server::new(settings());
        let reqs = [
            request(
                MessageType::Discover,
                Ipv4Addr::UNSPECIFIED,
                vec![DhcpOption::Hostname("h".into())],
            ),
            request(
                MessageType::Request,
                Ipv4Addr::new(10, 201, 0, 9),
                vec![DhcpOption::RequestedIpAddress(Ipv4Addr::new(10, 201, 0, 9))],
            ),
        ];
        for r in &reqs {
            for n in 0..=r.len() {
                s.handle_request(t, &r[..n], MAC);
            }
            for i in 0..r.len() {
                for v in [0u8, 1, 0x35, 0xff] {
                    let mut c = r.clone();
                    c[i] = v;
                    s.handle_request(t, &c, MAC);
                }
            }
        }
        while let Some(o) = s.poll_output() {
            if let Output::Claim { client, .. } = o {
                s.allocated(&client, Ipv4Addr::new(10, 201, 1, 1), t);
            }
        }
        assert!(s.stats().malformed > 0);
        assert!(s.stats().replies > 0);
    }
}
