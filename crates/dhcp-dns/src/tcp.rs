//! DNS over TCP at the service address (RFC 1035 4.2.2, RFC 7766), as a sans-I/O state
//! machine over a userspace smoltcp stack.
//!
//! The [`Endpoint`] owns the service address inside the namespace subnet. Client IPv4
//! packets go in through [`Endpoint::handle_packet`]; what the stack sends back comes out of
//! [`Endpoint::poll_packet`]. On a connection every DNS message is prefixed by its length
//! (two bytes, big-endian): complete queries come out of [`Endpoint::poll_query`] without
//! the prefix, and [`Endpoint::respond`] sends a response with it. Being a real TCP/IP
//! stack, it also answers ping to the service address and resets TCP to every other port;
//! other protocols get ICMP protocol-unreachable.
//!
//! Call order, after every input (a packet, a response, a timer):
//! 1. `handle_packet`, `respond` or `handle_timeout`;
//! 2. drain `poll_query` (hand each query to the resolver, answer later with `respond`) and
//!    `poll_packet` (send each packet to its client);
//! 3. call `handle_timeout` again at `poll_at`.
//!
//! No input panics the endpoint: a packet is read through smoltcp's checked wire views
//! (length, header and checksums) before the stack sees it, and what does not parse, is
//! fragmented, or is not addressed to the service address is a counted drop
//! ([`Stats::malformed_packets`]). Every queue is bounded: [`MAX_CONNECTIONS`] sockets,
//! [`MAX_MESSAGE`] bytes a message, [`MAX_PIPELINED`] unanswered queries a connection,
//! [`MAX_QUEUED_QUERIES`] queries waiting for `poll_query` and [`MAX_QUEUED_PACKETS`]
//! packets waiting for `poll_packet`. Queries beyond the bounds wait in their sockets'
//! receive buffers, so TCP flow control, not a drop, slows a client down.

use std::collections::VecDeque;
use std::fmt;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, ChecksumCapabilities, Device, DeviceCapabilities, Medium};
use smoltcp::socket::tcp::{self, State};
use smoltcp::time::Instant as StackInstant;
use smoltcp::wire::{
    HardwareAddress, IpAddress, IpCidr, IpEndpoint, IpListenEndpoint, IpProtocol, Ipv4Packet,
    Ipv4Repr, TcpControl, TcpPacket, TcpRepr,
};

/// Connections served at once; a SYN beyond them is reset (counted).
pub const MAX_CONNECTIONS: usize = 16;

/// Largest DNS message accepted or sent over TCP (bigger ones close the connection,
/// counted). 4096 is the EDNS payload size resolvers commonly offer (RFC 6891 6.2.5), so
/// every answer that would fit a UDP response fits here too.
pub const MAX_MESSAGE: usize = 4096;

/// A connection idle this long (no query read, no response written) is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Queries of one connection handed out and not yet answered; further queries wait in the
/// socket until one is answered, so one pipelining client (RFC 7766 6.2.1.1) cannot fill
/// the query queue or hold more than this many unsent responses.
pub const MAX_PIPELINED: usize = 8;

/// Queries waiting for [`Endpoint::poll_query`] across all connections.
pub const MAX_QUEUED_QUERIES: usize = 64;

/// Packets waiting for [`Endpoint::poll_packet`]; past it the sockets hold their segments
/// back until the queue drains, and a reply produced by ingress (an ICMP echo reply, a
/// reset) is dropped and counted.
pub const MAX_QUEUED_PACKETS: usize = 256;

/// The port DNS is served on.
const DNS_PORT: u16 = 53;

/// IP MTU of the namespace interface the service address lives behind, unless
/// [`Endpoint::with_mtu`] says otherwise (the agent passes the namespace's).
const DEFAULT_MTU: usize = 1420;

/// A message with its two-byte length prefix (RFC 1035 4.2.2).
const MAX_FRAME: usize = MAX_MESSAGE + 2;

/// Bytes of each socket's receive and transmit buffer: two full frames, so a client can
/// have the next query in flight while the previous one is read, and a response can be
/// written while the previous one is still unacknowledged.
const SOCKET_BUFFER: usize = 2 * MAX_FRAME;

/// How long a connection with unanswered queries waits for `respond` before it is closed
/// anyway, so a lookup that never completes cannot pin a slot. Longer than any resolver's
/// own retry budget (glibc: 5 s x 2 attempts).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a closing connection may take to finish its FIN exchange before it is reset,
/// so a client that never closes its half (FIN-WAIT-2) or never reads (zero window) cannot
/// hold a slot.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// One connection of the endpoint: a socket slot and the generation of the connection in
/// it, so a late response to a closed (or reused) slot is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnId {
    slot: usize,
    generation: u32,
}

/// What the endpoint has done since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections accepted (SYNs given a slot).
    pub connections: u64,
    /// Query messages received.
    pub queries: u64,
    /// Response messages written to a connection.
    pub responses: u64,
    /// SYNs to the DNS port reset because every slot was busy.
    pub refused: u64,
    /// Connections closed because a query's length prefix or a response exceeded
    /// [`MAX_MESSAGE`].
    pub oversized: u64,
    /// Packets dropped unread: not IPv4, bad length or checksum, fragmented, or not
    /// addressed to the service address.
    pub malformed_packets: u64,
    /// Packets the stack produced while [`MAX_QUEUED_PACKETS`] were already waiting.
    pub dropped_packets: u64,
}

/// A userspace TCP/IP stack owning the service address that serves DNS on TCP port 53.
pub struct Endpoint {
    address: Ipv4Addr,
    iface: Interface,
    device: Queues,
    sockets: SocketSet<'static>,
    slots: Vec<Slot>,
    queries: VecDeque<(ConnId, Vec<u8>)>,
    /// The stack's clock reads time since this instant.
    epoch: Instant,
    /// The latest time passed in; time never runs backwards for the stack.
    now: Instant,
    /// When the stack's own timers (retransmission, delayed ACK) want to run, as of the
    /// last poll; `Interface::poll_at` needs `&mut`, so it is kept here for `poll_at`.
    stack_deadline: Option<Instant>,
    /// `poll_query` read from sockets (a window to reopen) or reset one: poll right away.
    needs_poll: bool,
    stats: Stats,
}

/// One socket and the connection in it, if any.
struct Slot {
    /// Where the slot is in `Endpoint::slots`; part of [`ConnId`].
    index: usize,
    handle: SocketHandle,
    /// Counts the connections the slot has accepted; part of [`ConnId`].
    generation: u32,
    conn: Option<Conn>,
}

/// Per-connection state the socket does not keep.
struct Conn {
    /// When a query was last read or a response last written.
    last_activity: Instant,
    /// Queries handed out by `poll_query` and not answered yet.
    outstanding: usize,
    /// Framed responses, in `respond` order, that did not fit the socket's transmit buffer.
    unsent: Vec<u8>,
    /// When the endpoint started closing the connection (sent its FIN).
    closing_since: Option<Instant>,
}

/// Why reading queries from a connection stopped.
enum Read {
    /// No complete message is buffered.
    Drained,
    /// A bound holds the next message back in the socket.
    Held,
    /// The next message is longer than [`MAX_MESSAGE`].
    Oversized,
}

/// What to do with an incoming packet, decided before the stack sees it.
enum Admission {
    Pass,
    /// A SYN to the DNS port that no slot can take; the stack resets it.
    Refused,
    Malformed,
}

impl Endpoint {
    /// A stack owning `address` (prefix_len of the subnet) that serves DNS on TCP port 53.
    ///
    /// Its TCP initial sequence numbers come from a seed derived from `address`; use
    /// [`Endpoint::with_seed`] to make them differ between runs. An `address` that cannot
    /// be an interface address (multicast, broadcast, unspecified) serves nothing: every
    /// packet is then counted as malformed.
    pub fn new(address: Ipv4Addr, prefix_len: u8, now: Instant) -> Self {
        let seed = u64::from(address.to_bits()) ^ 0x6879_7068_6165_0053;
        Self::with_seed(address, prefix_len, seed, now)
    }

    /// [`Endpoint::new`] with the seed of the stack's random numbers (TCP initial sequence
    /// numbers, IPv4 identification) given.
    pub fn with_seed(address: Ipv4Addr, prefix_len: u8, seed: u64, now: Instant) -> Self {
        let mut device = Queues::default();
        let mut config = Config::new(HardwareAddress::Ip);
        config.random_seed = seed;
        let mut iface = Interface::new(config, &mut device, StackInstant::ZERO);
        // smoltcp panics on a non-unicast interface address or a prefix longer than 32.
        if !address.is_unspecified() && !address.is_broadcast() && !address.is_multicast() {
            let cidr = IpCidr::new(IpAddress::Ipv4(address), prefix_len.min(32));
            iface.update_ip_addrs(|addrs| {
                // Cannot fail: the list is empty and holds at least one address.
                let _ = addrs.push(cidr);
            });
        }

        let mut sockets = SocketSet::new(Vec::with_capacity(MAX_CONNECTIONS));
        let slots = (0..MAX_CONNECTIONS)
            .map(|index| {
                let mut socket = tcp::Socket::new(
                    tcp::SocketBuffer::new(vec![0; SOCKET_BUFFER]),
                    tcp::SocketBuffer::new(vec![0; SOCKET_BUFFER]),
                );
                // A response is one write: send it at once rather than wait for an ACK.
                socket.set_nagle_enabled(false);
                // No smoltcp timeout: it aborts once the client has been silent that long,
                // even while the client is only waiting for an answer. `Conn::deadline`
                // bounds every connection instead.
                // Cannot fail: the socket is new and the port is not zero.
                let _ = socket.listen(listen_endpoint(address));
                Slot {
                    index,
                    handle: sockets.add(socket),
                    generation: 0,
                    conn: None,
                }
            })
            .collect();

        Self {
            address,
            iface,
            device,
            sockets,
            slots,
            queries: VecDeque::new(),
            epoch: now,
            now,
            stack_deadline: None,
            needs_poll: false,
            stats: Stats::default(),
        }
    }

    /// An IPv4 packet (no link header) addressed to the service address, from a client.
    pub fn handle_packet(&mut self, now: Instant, packet: &[u8]) {
        self.advance(now);
        match self.admit(packet) {
            Admission::Malformed => {
                self.stats.malformed_packets += 1;
                return;
            }
            Admission::Refused => self.stats.refused += 1,
            Admission::Pass => {}
        }
        // The queue is empty here: every packet is processed before this call returns.
        self.device.rx.push_back(packet.to_vec());
        self.run();
    }

    /// Runs timers (retransmissions, idle timeouts); call at poll_at or on a regular tick.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
        self.run();
    }

    /// When handle_timeout wants to run next, if ever.
    pub fn poll_at(&self, now: Instant) -> Option<Instant> {
        if self.needs_poll {
            return Some(now);
        }
        self.slots
            .iter()
            .filter_map(|slot| slot.conn.as_ref().map(Conn::deadline))
            .chain(self.stack_deadline)
            .min()
            .map(|at| at.max(now))
    }

    /// The same endpoint behind an interface of MTU `mtu` (its TCP segments fit it).
    pub fn with_mtu(mut self, mtu: u16) -> Self {
        self.device.mtu = usize::from(mtu);
        self
    }

    /// When handle_timeout wants to run next, if ever (as [`Endpoint::poll_at`] at the last
    /// time this endpoint was given).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.poll_at(self.now)
    }

    /// The next complete query message received (without its length prefix).
    pub fn poll_query(&mut self) -> Option<(ConnId, Vec<u8>)> {
        if self.queries.is_empty() {
            // Queries held back by a full queue wait in their sockets; reading them reopens
            // the sockets' windows, which the next poll advertises.
            let mut read = false;
            for slot in &mut self.slots {
                let socket = self.sockets.get_mut::<tcp::Socket>(slot.handle);
                read |= slot
                    .read(socket, &mut self.queries, &mut self.stats, self.now)
                    .0;
            }
            self.needs_poll |= read;
        }
        self.queries.pop_front()
    }

    /// Sends the response to a query of `conn` (the prefix is added here); dropped silently
    /// if the connection is gone.
    pub fn respond(&mut self, conn: ConnId, response: &[u8], now: Instant) {
        self.advance(now);
        if let Some(slot) = self.slots.get_mut(conn.slot) {
            if slot.generation == conn.generation {
                let socket = self.sockets.get_mut::<tcp::Socket>(slot.handle);
                slot.respond(socket, response, &mut self.stats, self.now);
            }
        }
        self.run();
    }

    /// A query of `conn` that will get no answer (dropped, rate limited): it no longer
    /// holds the connection open or counts against its pipelining bound.
    pub fn abandon(&mut self, conn: ConnId, now: Instant) {
        self.advance(now);
        if let Some(slot) = self.slots.get_mut(conn.slot) {
            if slot.generation == conn.generation {
                if let Some(c) = slot.conn.as_mut() {
                    c.outstanding = c.outstanding.saturating_sub(1);
                }
            }
        }
        self.run();
    }

    /// The next IPv4 packet to send to a client (the caller frames it in Ethernet).
    pub fn poll_packet(&mut self) -> Option<Vec<u8>> {
        self.device.tx.pop_front()
    }

    /// What the endpoint has done so far.
    pub fn stats(&self) -> Stats {
        Stats {
            dropped_packets: self.device.dropped,
            ..self.stats
        }
    }

    fn advance(&mut self, now: Instant) {
        self.now = self.now.max(now);
    }

    /// Reads the headers a decision needs, through checked views (the stack parses the
    /// packet again; DNS over TCP is rare enough that the second parse costs nothing).
    fn admit(&self, packet: &[u8]) -> Admission {
        let checksums = ChecksumCapabilities::default();
        let Ok(ip) = Ipv4Packet::new_checked(packet) else {
            return Admission::Malformed;
        };
        let Ok(ip_repr) = Ipv4Repr::parse(&ip, &checksums) else {
            return Admission::Malformed;
        };
        // The stack is built without reassembly: a fragment would be read as a whole packet.
        let fragment = ip.more_frags() || ip.frag_offset() != 0;
        // A packet from the service address itself would make the stack talk to itself.
        if ip_repr.dst_addr != self.address || ip_repr.src_addr == self.address || fragment {
            return Admission::Malformed;
        }
        if ip_repr.next_header != IpProtocol::Tcp {
            return Admission::Pass;
        }
        let (src, dst) = (
            IpAddress::Ipv4(ip_repr.src_addr),
            IpAddress::Ipv4(ip_repr.dst_addr),
        );
        let Ok(tcp) = TcpPacket::new_checked(ip.payload()) else {
            return Admission::Malformed;
        };
        let Ok(tcp_repr) = TcpRepr::parse(&tcp, &src, &dst, &checksums) else {
            return Admission::Malformed;
        };
        let opening = tcp_repr.control == TcpControl::Syn && tcp_repr.ack_number.is_none();
        if opening && tcp_repr.dst_port == DNS_PORT {
            let remote = IpEndpoint::new(src, tcp_repr.src_port);
            let (mut listening, mut known) = (false, false);
            for slot in &self.slots {
                let socket = self.sockets.get::<tcp::Socket>(slot.handle);
                listening |= socket.is_listening();
                // A retransmitted SYN of a connection in SYN-RECEIVED.
                known |= socket.remote_endpoint() == Some(remote);
            }
            if !listening && !known {
                return Admission::Refused;
            }
        }
        Admission::Pass
    }

    /// Polls the stack, serves the connections, polls again to send what serving queued
    /// (responses, FINs, resets, window updates), and puts finished slots back to listening.
    fn run(&mut self) {
        let timestamp = self.timestamp(self.now);
        self.iface
            .poll(timestamp, &mut self.device, &mut self.sockets);
        for slot in &mut self.slots {
            let socket = self.sockets.get_mut::<tcp::Socket>(slot.handle);
            slot.serve(socket, &mut self.queries, &mut self.stats, self.now);
        }
        self.iface
            .poll(timestamp, &mut self.device, &mut self.sockets);
        for slot in &mut self.slots {
            let socket = self.sockets.get_mut::<tcp::Socket>(slot.handle);
            if let Some(ended) = slot.rearm(socket, self.address) {
                // Nobody can answer these any more.
                self.queries.retain(|(conn, _)| *conn != ended);
            }
        }
        self.needs_poll = false;
        self.stack_deadline = self
            .iface
            .poll_at(timestamp, &self.sockets)
            .map(|at| self.instant(at));
    }

    /// `now` on the stack's clock.
    fn timestamp(&self, now: Instant) -> StackInstant {
        let micros = now.saturating_duration_since(self.epoch).as_micros();
        StackInstant::from_micros(i64::try_from(micros).unwrap_or(i64::MAX))
    }

    /// A time on the stack's clock as an `Instant`.
    fn instant(&self, at: StackInstant) -> Instant {
        let since_epoch = Duration::from_micros(u64::try_from(at.total_micros()).unwrap_or(0));
        self.epoch.checked_add(since_epoch).unwrap_or(self.now)
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let open = self.slots.iter().filter(|slot| slot.conn.is_some()).count();
        f.debug_struct("Endpoint")
            .field("address", &self.address)
            .field("connections", &open)
            .field("queued_queries", &self.queries.len())
            .field("queued_packets", &self.device.tx.len())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Slot {
    fn id(&self) -> ConnId {
        ConnId {
            slot: self.index,
            generation: self.generation,
        }
    }

    /// Accepts a new connection, moves its responses and queries, and closes it when the
    /// client is done or a timer ran out.
    fn serve(
        &mut self,
        socket: &mut tcp::Socket<'_>,
        queries: &mut VecDeque<(ConnId, Vec<u8>)>,
        stats: &mut Stats,
        now: Instant,
    ) {
        if !socket.is_active() {
            // Listening, or finished and waiting for `rearm`.
            return;
        }
        if self.conn.is_none() {
            self.generation = self.generation.wrapping_add(1);
            self.conn = Some(Conn::new(now));
            stats.connections += 1;
        }
        if let Some(conn) = self.conn.as_mut() {
            conn.flush(socket);
        }
        let (_, stopped) = self.read(socket, queries, stats, now);
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        if !socket.is_active() {
            // Reset for an oversized query.
            return;
        }
        if conn.closing_since.is_some() {
            if conn.deadline() <= now {
                socket.abort();
            }
            return;
        }
        // The client closed its half (some send their queries, then shut down writing):
        // close ours once every query it sent is answered and written; the FIN follows the
        // buffered data. What is left in the socket then is a message cut short.
        let client_done = socket.state() == State::CloseWait
            && matches!(stopped, Read::Drained)
            && conn.outstanding == 0
            && conn.unsent.is_empty();
        if client_done || conn.deadline() <= now {
            socket.close();
            conn.closing_since = Some(now);
        }
    }

    /// Moves complete queries from the socket to the queue, within the bounds. Returns
    /// whether it changed the socket (read a query or reset the connection), and why it
    /// stopped.
    fn read(
        &mut self,
        socket: &mut tcp::Socket<'_>,
        queries: &mut VecDeque<(ConnId, Vec<u8>)>,
        stats: &mut Stats,
        now: Instant,
    ) -> (bool, Read) {
        let id = self.id();
        let Some(conn) = self.conn.as_mut() else {
            return (false, Read::Drained);
        };
        if !socket.is_active() {
            return (false, Read::Drained);
        }
        let mut changed = false;
        loop {
            match conn.read_one(socket, queries.len()) {
                Ok(query) => {
                    queries.push_back((id, query));
                    conn.outstanding += 1;
                    conn.last_activity = now;
                    stats.queries += 1;
                    changed = true;
                }
                Err(Read::Oversized) => {
                    stats.oversized += 1;
                    socket.abort();
                    return (true, Read::Oversized);
                }
                Err(stopped) => return (changed, stopped),
            }
        }
    }

    /// Writes the response to a query of this slot's current connection.
    fn respond(
        &mut self,
        socket: &mut tcp::Socket<'_>,
        response: &[u8],
        stats: &mut Stats,
        now: Instant,
    ) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        conn.outstanding = conn.outstanding.saturating_sub(1);
        if response.len() > MAX_MESSAGE {
            stats.oversized += 1;
            socket.abort();
            return;
        }
        if conn.closing_since.is_some() || !socket.may_send() {
            return;
        }
        // Cannot fail: MAX_MESSAGE fits the prefix.
        let len = u16::try_from(response.len()).unwrap_or(u16::MAX);
        conn.unsent.extend_from_slice(&len.to_be_bytes());
        conn.unsent.extend_from_slice(response);
        conn.flush(socket);
        conn.last_activity = now;
        stats.responses += 1;
    }

    /// Puts a slot whose connection ended back to listening; returns the ended connection.
    fn rearm(&mut self, socket: &mut tcp::Socket<'_>, address: Ipv4Addr) -> Option<ConnId> {
        // LISTEN with a connection: the client reset it in SYN-RECEIVED. TIME-WAIT only
        // absorbs a retransmitted FIN; with so few slots, serving a new client matters more.
        if !matches!(
            socket.state(),
            State::Closed | State::TimeWait | State::Listen
        ) {
            return None;
        }
        if !socket.is_listening() {
            // Cannot fail: the socket is closed and the port is not zero.
            let _ = socket.listen(listen_endpoint(address));
        }
        self.conn.take().map(|_| self.id())
    }
}

impl Conn {
    fn new(now: Instant) -> Self {
        Self {
            last_activity: now,
            outstanding: 0,
            unsent: Vec::new(),
            closing_since: None,
        }
    }

    /// When the connection is closed (or, once closing, reset) for want of progress.
    fn deadline(&self) -> Instant {
        match self.closing_since {
            Some(since) => since + CLOSE_TIMEOUT,
            None if self.outstanding == 0 => self.last_activity + IDLE_TIMEOUT,
            None => self.last_activity + ANSWER_TIMEOUT,
        }
    }

    /// Moves unsent response bytes into the socket's transmit buffer, as far as they fit.
    fn flush(&mut self, socket: &mut tcp::Socket<'_>) {
        if self.unsent.is_empty() {
            return;
        }
        if let Ok(written) = socket.send_slice(&self.unsent) {
            self.unsent.drain(..written);
        }
    }

    /// The next complete query in the socket, if the bounds let it out.
    fn read_one(&self, socket: &mut tcp::Socket<'_>, queued: usize) -> Result<Vec<u8>, Read> {
        let held = self.closing_since.is_some()
            || self.outstanding >= MAX_PIPELINED
            || !self.unsent.is_empty()
            || queued >= MAX_QUEUED_QUERIES;
        if held {
            return Err(Read::Held);
        }
        let mut prefix = [0u8; 2];
        if socket.peek_slice(&mut prefix) != Ok(prefix.len()) {
            return Err(Read::Drained);
        }
        let len = usize::from(u16::from_be_bytes(prefix));
        if len > MAX_MESSAGE {
            return Err(Read::Oversized);
        }
        if socket.recv_queue() < prefix.len() + len {
            return Err(Read::Drained);
        }
        let mut query = vec![0; len];
        let complete = socket.recv_slice(&mut prefix) == Ok(prefix.len())
            && socket.recv_slice(&mut query) == Ok(len);
        if !complete {
            // Cannot happen (the bytes were counted above); were it to, the stream would be
            // out of step with its prefixes, so end the connection rather than misread it.
            return Err(Read::Oversized);
        }
        Ok(query)
    }
}

fn listen_endpoint(address: Ipv4Addr) -> IpListenEndpoint {
    IpListenEndpoint {
        addr: Some(IpAddress::Ipv4(address)),
        port: DNS_PORT,
    }
}

/// The stack's network device: packets in and out of two queues.
struct Queues {
    rx: VecDeque<Vec<u8>>,
    tx: VecDeque<Vec<u8>>,
    /// Packets produced while the transmit queue was full.
    dropped: u64,
    /// The interface MTU: the largest packet the stack sends.
    mtu: usize,
}

impl Default for Queues {
    fn default() -> Self {
        Self {
            rx: VecDeque::new(),
            tx: VecDeque::new(),
            dropped: 0,
            mtu: DEFAULT_MTU,
        }
    }
}

impl Device for Queues {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;

    fn receive(&mut self, _timestamp: StackInstant) -> Option<(Rx, Tx<'_>)> {
        let packet = self.rx.pop_front()?;
        let tx = Tx {
            queue: &mut self.tx,
            dropped: &mut self.dropped,
        };
        Some((Rx(packet), tx))
    }

    fn transmit(&mut self, _timestamp: StackInstant) -> Option<Tx<'_>> {
        // Refusing makes the sockets keep their segments for a later poll.
        if self.tx.len() >= MAX_QUEUED_PACKETS {
            return None;
        }
        Some(Tx {
            queue: &mut self.tx,
            dropped: &mut self.dropped,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ip;
        caps.max_transmission_unit = self.mtu;
        caps
    }
}

struct Rx(Vec<u8>);

impl phy::RxToken for Rx {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        f(&self.0)
    }
}

struct Tx<'a> {
    queue: &'a mut VecDeque<Vec<u8>>,
    dropped: &'a mut u64,
}

impl phy::TxToken for Tx<'_> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        let mut packet = vec![0; len];
        let result = f(&mut packet);
        if self.queue.len() < MAX_QUEUED_PACKETS {
            self.queue.push_back(packet);
        } else {
            *self.dropped += 1;
        }
        result
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // a base instant for the virtual clock
mod tests {
    use super::*;
    use smoltcp::wire::{Icmpv4Packet, Icmpv4Repr, Ipv4Address};

    const SERVICE: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 1);
    const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 9);
    const TICK: Duration = Duration::from_millis(5);

    /// A client host: a second smoltcp stack with TCP sockets.
    struct Client {
        iface: Interface,
        device: Queues,
        sockets: SocketSet<'static>,
    }

    /// The endpoint and a client, the packets between them carried by the test, on a
    /// virtual clock.
    struct Pair {
        server: Endpoint,
        client: Client,
        epoch: Instant,
        now: Instant,
    }

    impl Pair {
        fn new() -> Self {
            let epoch = Instant::now();
            let mut device = Queues::default();
            let mut config = Config::new(HardwareAddress::Ip);
            config.random_seed = 9;
            let mut iface = Interface::new(config, &mut device, StackInstant::ZERO);
            iface.update_ip_addrs(|addrs| {
                addrs
                    .push(IpCidr::new(IpAddress::Ipv4(CLIENT), 24))
                    .unwrap();
            });
            Self {
                server: Endpoint::new(SERVICE, 24, epoch),
                client: Client {
                    iface,
                    device,
                    sockets: SocketSet::new(Vec::new()),
                },
                epoch,
                now: epoch,
            }
        }

        fn client_time(&self) -> StackInstant {
            StackInstant::from_micros((self.now - self.epoch).as_micros() as i64)
        }

        /// Carries packets both ways at the current time until none move; runs the
        /// endpoint's timer whenever its `poll_at` says so.
        fn step(&mut self) {
            for _ in 0..1000 {
                let timestamp = self.client_time();
                let client = &mut self.client;
                client
                    .iface
                    .poll(timestamp, &mut client.device, &mut client.sockets);
                let mut moved = false;
                while let Some(packet) = self.client.device.tx.pop_front() {
                    self.server.handle_packet(self.now, &packet);
                    moved = true;
                }
                if self
                    .server
                    .poll_at(self.now)
                    .is_some_and(|at| at <= self.now)
                {
                    self.server.handle_timeout(self.now);
                }
                while let Some(packet) = self.server.poll_packet() {
                    self.client.device.rx.push_back(packet);
                    moved = true;
                }
                if !moved {
                    return;
                }
            }
            panic!("the pair never went quiet");
        }

        /// Moves the clock on by `by`, a tick at a time.
        fn advance(&mut self, by: Duration) {
            let end = self.now + by;
            while self.now < end {
                self.now += TICK;
                self.step();
            }
        }

        /// Settles what is in flight: a few ticks cover the delayed ACKs.
        fn settle(&mut self) {
            self.step();
            self.advance(Duration::from_millis(50));
        }

        fn connect(&mut self, local_port: u16) -> SocketHandle {
            self.connect_to(DNS_PORT, local_port)
        }

        fn connect_to(&mut self, port: u16, local_port: u16) -> SocketHandle {
            let mut socket = tcp::Socket::new(
                tcp::SocketBuffer::new(vec![0; 4 * SOCKET_BUFFER]),
                tcp::SocketBuffer::new(vec![0; 4 * SOCKET_BUFFER]),
            );
            socket
                .connect(
                    self.client.iface.context(),
                    (IpAddress::Ipv4(SERVICE), port),
                    local_port,
                )
                .unwrap();
            let handle = self.client.sockets.add(socket);
            self.settle();
            handle
        }

        fn socket(&mut self, handle: SocketHandle) -> &mut tcp::Socket<'static> {
            self.client.sockets.get_mut::<tcp::Socket>(handle)
        }

        fn send(&mut self, handle: SocketHandle, bytes: &[u8]) {
            assert_eq!(self.socket(handle).send_slice(bytes), Ok(bytes.len()));
            self.settle();
        }

        fn send_message(&mut self, handle: SocketHandle, message: &[u8]) {
            self.send(handle, &framed(message));
        }

        /// Every byte the client has received on `handle`.
        fn received(&mut self, handle: SocketHandle) -> Vec<u8> {
            let socket = self.socket(handle);
            let mut bytes = vec![0; socket.recv_queue()];
            let len = socket.recv_slice(&mut bytes).unwrap_or(0);
            bytes.truncate(len);
            bytes
        }

        fn queries(&mut self) -> Vec<(ConnId, Vec<u8>)> {
            std::iter::from_fn(|| self.server.poll_query()).collect()
        }

        fn respond(&mut self, conn: ConnId, response: &[u8]) {
            self.server.respond(conn, response, self.now);
            self.settle();
        }
    }

    fn framed(message: &[u8]) -> Vec<u8> {
        let mut bytes = (message.len() as u16).to_be_bytes().to_vec();
        bytes.extend_from_slice(message);
        bytes
    }

    /// A DNS-looking message: an ID, then filler.
    fn message(id: u16, len: usize) -> Vec<u8> {
        let mut bytes = id.to_be_bytes().to_vec();
        bytes.resize(len, id as u8);
        bytes
    }

    /// A valid TCP SYN from the client to `dst`:53.
    fn syn(dst: Ipv4Addr) -> Vec<u8> {
        let tcp = TcpRepr {
            src_port: 40000,
            dst_port: DNS_PORT,
            control: TcpControl::Syn,
            seq_number: smoltcp::wire::TcpSeqNumber(1000),
            ack_number: None,
            window_len: 1024,
            window_scale: None,
            max_seg_size: Some(1380),
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp: None,
            payload: &[],
        };
        let ip = Ipv4Repr {
            src_addr: CLIENT,
            dst_addr: dst,
            next_header: IpProtocol::Tcp,
            payload_len: tcp.buffer_len(),
            hop_limit: 64,
        };
        let mut bytes = vec![0; ip.buffer_len() + tcp.buffer_len()];
        let checksums = ChecksumCapabilities::default();
        let mut packet = Ipv4Packet::new_unchecked(&mut bytes[..]);
        ip.emit(&mut packet, &checksums);
        tcp.emit(
            &mut TcpPacket::new_unchecked(packet.payload_mut()),
            &IpAddress::Ipv4(CLIENT),
            &IpAddress::Ipv4(dst),
            &checksums,
        );
        bytes
    }

    fn echo_request(data: &[u8]) -> Vec<u8> {
        let icmp = Icmpv4Repr::EchoRequest {
            ident: 0x4242,
            seq_no: 7,
            data,
        };
        let ip = Ipv4Repr {
            src_addr: CLIENT,
            dst_addr: SERVICE,
            next_header: IpProtocol::Icmp,
            payload_len: icmp.buffer_len(),
            hop_limit: 64,
        };
        let mut bytes = vec![0; ip.buffer_len() + icmp.buffer_len()];
        let checksums = ChecksumCapabilities::default();
        let mut packet = Ipv4Packet::new_unchecked(&mut bytes[..]);
        ip.emit(&mut packet, &checksums);
        icmp.emit(
            &mut Icmpv4Packet::new_unchecked(packet.payload_mut()),
            &checksums,
        );
        bytes
    }

    #[test]
    fn one_query_one_response() {
        let mut pair = Pair::new();
        let client = pair.connect(50000);
        assert_eq!(pair.socket(client).state(), State::Established);

        let query = message(0x1234, 40);
        pair.send_message(client, &query);
        let queries = pair.queries();
        assert_eq!(queries.len(), 1);
        let (conn, received) = &queries[0];
        assert_eq!(received, &query);

        let response = message(0x1234, 120);
        pair.respond(*conn, &response);
        assert_eq!(pair.received(client), framed(&response));
        let stats = pair.server.stats();
        assert_eq!(
            (stats.connections, stats.queries, stats.responses),
            (1, 1, 1)
        );
    }

    #[test]
    fn query_split_across_segments_is_read_whole() {
        let mut pair = Pair::new();
        let client = pair.connect(50000);
        let query = framed(&message(7, 300));
        pair.send(client, &query[..1]);
        assert!(pair.queries().is_empty());
        pair.send(client, &query[1..100]);
        assert!(pair.queries().is_empty());
        pair.send(client, &query[100..]);
        let queries = pair.queries();
        assert_eq!(queries.len(), 1);
        assert_eq!(queries[0].1, message(7, 300));
    }

    #[test]
    fn pipelined_queries_answered_out_of_order() {
        let mut pair = Pair::new();
        let client = pair.connect(50000);
        let (first, second) = (message(1, 30), message(2, 50));
        let mut both = framed(&first);
        both.extend(framed(&second));
        pair.send(client, &both);

        let queries = pair.queries();
        assert_eq!(queries.len(), 2);
        assert_eq!(queries[0].1, first);
        assert_eq!(queries[1].1, second);
        assert_eq!(queries[0].0, queries[1].0, "one connection");

        // The second is answered first; responses go out in `respond` order.
        let conn = queries[0].0;
        pair.respond(conn, &message(2, 70));
        pair.respond(conn, &message(1, 90));
        let mut expected = framed(&message(2, 70));
        expected.extend(framed(&message(1, 90)));
        assert_eq!(pair.received(client), expected);
    }

    #[test]
    fn pipelining_beyond_the_bound_waits_in_the_socket() {
        let mut pair = Pair::new();
        let client = pair.connect(50000);
        let all: Vec<u8> = (0..MAX_PIPELINED as u16 + 3)
            .flat_map(|id| framed(&message(id, 20)))
            .collect();
        pair.send(client, &all);

        let queries = pair.queries();
        assert_eq!(queries.len(), MAX_PIPELINED);
        // Answering frees room for the rest, in order.
        pair.respond(queries[0].0, &message(0, 20));
        let rest = pair.queries();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].1, message(MAX_PIPELINED as u16, 20));
    }

    #[test]
    fn closed_slot_is_reused_and_late_response_is_dropped() {
        let mut pair = Pair::new();
        let client = pair.connect(50000);
        pair.send_message(client, &message(1, 30));
        let old = pair.queries()[0].0;
        pair.respond(old, &message(1, 60));
        assert_eq!(pair.received(client), framed(&message(1, 60)));

        pair.socket(client).close();
        pair.settle();
        assert!(
            matches!(pair.socket(client).state(), State::TimeWait | State::Closed),
            "the endpoint closed its half too: {}",
            pair.socket(client).state()
        );

        let again = pair.connect(50001);
        pair.send_message(again, &message(2, 30));
        let new = pair.queries()[0].0;
        assert_eq!(new.slot, old.slot, "the freed slot serves again");
        assert_ne!(new.generation, old.generation);

        // A late response to the old connection sends nothing.
        pair.server.respond(old, &message(1, 60), pair.now);
        assert_eq!(pair.server.poll_packet(), None);
        pair.settle();
        assert!(pair.received(again).is_empty());
        assert_eq!(pair.server.stats().responses, 1);
        assert_eq!(pair.server.stats().connections, 2);
    }

    #[test]
    fn half_closed_client_still_gets_its_answer() {
        let mut pair = Pair::new();
        let client = pair.connect(50000);
        pair.send_message(client, &message(5, 30));
        pair.socket(client).close();
        pair.settle();
        let conn = pair.queries()[0].0;
        assert_eq!(pair.socket(client).state(), State::FinWait2, "held open");

        // The answer comes after an asynchronous lookup.
        pair.advance(Duration::from_secs(2));
        pair.respond(conn, &message(5, 80));
        assert_eq!(pair.received(client), framed(&message(5, 80)));
        assert_eq!(pair.socket(client).state(), State::TimeWait, "then closed");
    }

    #[test]
    fn half_closed_client_behind_a_full_queue_is_answered() {
        let mut pair = Pair::new();
        // Others fill the query queue.
        for i in 0..(MAX_QUEUED_QUERIES / MAX_PIPELINED) as u16 {
            let other = pair.connect(51000 + i);
            let all: Vec<u8> = (0..MAX_PIPELINED as u16)
                .flat_map(|id| framed(&message(id, 20)))
                .collect();
            pair.send(other, &all);
        }
        assert_eq!(pair.server.queries.len(), MAX_QUEUED_QUERIES);

        // This client's queries wait in its socket, and it has closed its half.
        let client = pair.connect(50000);
        let mut both = framed(&message(0xa1, 20));
        both.extend(framed(&message(0xa2, 20)));
        pair.send(client, &both);
        pair.socket(client).close();
        pair.settle();
        assert_eq!(pair.socket(client).state(), State::FinWait2, "held open");

        let mine: Vec<_> = pair
            .queries()
            .into_iter()
            .filter(|(_, query)| query[1] >= 0xa1)
            .collect();
        assert_eq!(mine.len(), 2);
        for (conn, query) in &mine {
            pair.respond(*conn, query);
        }
        let mut expected = framed(&message(0xa1, 20));
        expected.extend(framed(&message(0xa2, 20)));
        assert_eq!(pair.received(client), expected);
        assert_eq!(pair.socket(client).state(), State::TimeWait);
    }

    #[test]
    fn more_than_max_connections_are_refused() {
        let mut pair = Pair::new();
        let clients: Vec<_> = (0..MAX_CONNECTIONS as u16 + 1)
            .map(|i| pair.connect(50000 + i))
            .collect();
        let established = clients
            .iter()
            .filter(|&&h| pair.socket(h).state() == State::Established)
            .count();
        assert_eq!(established, MAX_CONNECTIONS);
        let last = clients[MAX_CONNECTIONS];
        assert_eq!(pair.socket(last).state(), State::Closed, "reset");
        let stats = pair.server.stats();
        assert_eq!(stats.refused, 1);
        assert_eq!(stats.connections, MAX_CONNECTIONS as u64);

        // Everyone admitted is served.
        for (i, &client) in clients[..MAX_CONNECTIONS].iter().enumerate() {
            pair.send_message(client, &message(i as u16, 20));
        }
        let queries = pair.queries();
        assert_eq!(queries.len(), MAX_CONNECTIONS);
        let conns: std::collections::HashSet<_> = queries.iter().map(|q| q.0).collect();
        assert_eq!(conns.len(), MAX_CONNECTIONS);
    }

    #[test]
    fn oversized_length_prefix_resets_the_connection() {
        let mut pair = Pair::new();
        let client = pair.connect(50000);
        let mut bytes = ((MAX_MESSAGE + 1) as u16).to_be_bytes().to_vec();
        bytes.extend_from_slice(&[0; 100]);
        pair.send(client, &bytes);
        assert_eq!(pair.socket(client).state(), State::Closed, "reset");
        assert!(pair.queries().is_empty());
        assert_eq!(pair.server.stats().oversized, 1);

        // The slot listens again.
        let again = pair.connect(50001);
        pair.send_message(again, &message(1, MAX_MESSAGE));
        assert_eq!(pair.queries()[0].1.len(), MAX_MESSAGE);
    }

    #[test]
    fn oversized_response_resets_the_connection() {
        let mut pair = Pair::new();
        let client = pair.connect(50000);
        pair.send_message(client, &message(1, 30));
        let conn = pair.queries()[0].0;
        pair.respond(conn, &vec![0; MAX_MESSAGE + 1]);
        assert_eq!(pair.socket(client).state(), State::Closed);
        assert_eq!(pair.server.stats().oversized, 1);
        assert_eq!(pair.server.stats().responses, 0);
    }

    #[test]
    fn largest_response_arrives_whole() {
        let mut pair = Pair::new();
        let client = pair.connect(50000);
        pair.send_message(client, &message(1, 30));
        let conn = pair.queries()[0].0;
        let response = message(1, MAX_MESSAGE);
        pair.respond(conn, &response);
        assert_eq!(pair.received(client), framed(&response));
    }

    #[test]
    fn idle_connection_is_closed() {
        let mut pair = Pair::new();
        let client = pair.connect(50000);
        pair.advance(IDLE_TIMEOUT - Duration::from_secs(1));
        assert_eq!(pair.socket(client).state(), State::Established);
        pair.advance(Duration::from_secs(2));
        assert_eq!(
            pair.socket(client).state(),
            State::CloseWait,
            "FIN received"
        );

        // Once the client closes too, the slot is free again.
        pair.socket(client).close();
        pair.settle();
        assert_eq!(pair.socket(client).state(), State::Closed);
        assert!(pair.server.slots.iter().all(|slot| slot.conn.is_none()));
        assert_eq!(pair.server.poll_at(pair.now), None, "nothing left to time");
    }

    #[test]
    fn unanswered_queries_hold_the_connection_past_idle() {
        let mut pair = Pair::new();
        let client = pair.connect(50000);
        pair.send_message(client, &message(1, 30));
        let conn = pair.queries()[0].0;
        pair.advance(IDLE_TIMEOUT + Duration::from_secs(2));
        assert_eq!(pair.socket(client).state(), State::Established);
        pair.respond(conn, &message(1, 40));
        assert_eq!(pair.received(client), framed(&message(1, 40)));
    }

    #[test]
    fn abandoned_queries_let_the_idle_timeout_close_the_connection() {
        let mut pair = Pair::new();
        let client = pair.connect(50000);
        pair.send_message(client, &message(1, 30));
        let conn = pair.queries()[0].0;
        let now = pair.now;
        pair.server.abandon(conn, now);
        // Unlike an unanswered query, an abandoned one does not hold the connection open.
        pair.advance(IDLE_TIMEOUT + Duration::from_secs(2));
        assert_eq!(
            pair.socket(client).state(),
            State::CloseWait,
            "FIN received"
        );
        assert_eq!(pair.server.stats().responses, 0);
    }

    #[test]
    fn vanished_client_frees_its_slot() {
        let mut pair = Pair::new();
        let client = pair.connect(50000);
        pair.send_message(client, &message(1, 30));
        let conn = pair.queries()[0].0;

        // The client goes silent: nothing it sends or receives gets through. The
        // unanswered query holds the connection for ANSWER_TIMEOUT, then it is closed, and
        // reset when the FIN is never acknowledged.
        let mut now = pair.now;
        let end = now + ANSWER_TIMEOUT + CLOSE_TIMEOUT + Duration::from_secs(1);
        while let Some(at) = pair.server.poll_at(now).filter(|&at| at <= end) {
            now = at.max(now + TICK);
            pair.server.handle_timeout(now);
            while pair.server.poll_packet().is_some() {}
        }
        assert!(pair.server.slots.iter().all(|slot| slot.conn.is_none()));
        assert_eq!(pair.server.poll_at(now), None);

        // The answer comes too late to be sent.
        pair.server.respond(conn, &message(1, 30), now);
        assert_eq!(pair.server.poll_packet(), None);
        assert_eq!(pair.server.stats().responses, 0);
    }

    #[test]
    fn full_query_queue_holds_queries_in_their_sockets() {
        let mut pair = Pair::new();
        let clients: Vec<_> = (0..MAX_CONNECTIONS as u16)
            .map(|i| pair.connect(50000 + i))
            .collect();
        for (i, &client) in clients.iter().enumerate() {
            let all: Vec<u8> = (0..MAX_PIPELINED as u16)
                .flat_map(|id| framed(&message(id + 100 * i as u16, 20)))
                .collect();
            pair.send(client, &all);
        }
        let total = MAX_CONNECTIONS * MAX_PIPELINED;
        assert!(total > MAX_QUEUED_QUERIES);
        assert_eq!(pair.server.queries.len(), MAX_QUEUED_QUERIES);

        // Draining the queue reads the rest; nothing is lost.
        let mut received = Vec::new();
        while let Some((_, query)) = pair.server.poll_query() {
            assert!(pair.server.queries.len() < MAX_QUEUED_QUERIES);
            received.push(query);
        }
        pair.settle();
        assert_eq!(received.len(), total);
        assert_eq!(pair.server.stats().queries, total as u64);
    }

    #[test]
    fn full_packet_queue_drops_and_counts() {
        let now = Instant::now();
        let mut server = Endpoint::new(SERVICE, 24, now);
        let extra = 10;
        for _ in 0..MAX_QUEUED_PACKETS + extra {
            server.handle_packet(now, &echo_request(b"ping"));
        }
        assert_eq!(server.stats().dropped_packets, extra as u64);
        assert_eq!(
            std::iter::from_fn(|| server.poll_packet()).count(),
            MAX_QUEUED_PACKETS
        );
    }

    #[test]
    fn other_ports_are_reset() {
        let mut pair = Pair::new();
        let client = pair.connect_to(80, 50000);
        assert_eq!(pair.socket(client).state(), State::Closed);
        assert_eq!(pair.server.stats().connections, 0);
        assert_eq!(pair.server.stats().refused, 0);
    }

    #[test]
    fn ping_to_the_service_address_is_answered() {
        let now = Instant::now();
        let mut server = Endpoint::new(SERVICE, 24, now);
        let data = b"hyphae ping payload";
        server.handle_packet(now, &echo_request(data));

        let reply = server.poll_packet().expect("an echo reply");
        assert_eq!(server.poll_packet(), None);
        let checksums = ChecksumCapabilities::default();
        let ip = Ipv4Packet::new_checked(&reply[..]).unwrap();
        let ip_repr = Ipv4Repr::parse(&ip, &checksums).unwrap();
        assert_eq!(ip_repr.src_addr, SERVICE);
        assert_eq!(ip_repr.dst_addr, CLIENT);
        assert_eq!(ip_repr.next_header, IpProtocol::Icmp);
        let icmp = Icmpv4Packet::new_checked(ip.payload()).unwrap();
        assert_eq!(
            Icmpv4Repr::parse(&icmp, &checksums).unwrap(),
            Icmpv4Repr::EchoReply {
                ident: 0x4242,
                seq_no: 7,
                data,
            }
        );
    }

    #[test]
    fn garbage_never_panics_and_is_counted() {
        let now = Instant::now();
        let mut server = Endpoint::new(SERVICE, 24, now);
        let mut drops = 0;

        // Wrong destination: a valid SYN for someone else.
        let other = Ipv4Address::new(10, 201, 0, 2);
        server.handle_packet(now, &syn(other));
        drops += 1;

        // Every truncation of a valid SYN.
        let valid = syn(SERVICE);
        for len in 0..valid.len() {
            server.handle_packet(now, &valid[..len]);
            drops += 1;
        }

        // A fragment.
        let mut fragment = valid.clone();
        let mut packet = Ipv4Packet::new_unchecked(&mut fragment[..]);
        packet.set_more_frags(true);
        packet.fill_checksum();
        server.handle_packet(now, &fragment);
        drops += 1;

        // From the service address itself.
        let mut land = valid.clone();
        let mut packet = Ipv4Packet::new_unchecked(&mut land[..]);
        packet.set_src_addr(SERVICE);
        packet.fill_checksum();
        server.handle_packet(now, &land);
        drops += 1;

        assert_eq!(server.stats().malformed_packets, drops);
        assert_eq!(
            server.poll_packet(),
            None,
            "nothing answers a dropped packet"
        );

        // Every single-byte corruption of a valid SYN, then random bytes (xorshift, fixed
        // seed), some dressed with an IPv4 header to reach deeper.
        for i in 0..valid.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut corrupt = valid.clone();
                corrupt[i] ^= flip;
                server.handle_packet(now, &corrupt);
            }
        }
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..5000 {
            let len = (next() % 120) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if round % 2 == 0 && len >= 20 {
                bytes[..20].copy_from_slice(&valid[..20]);
            }
            server.handle_packet(now, &bytes);
        }
        while server.poll_packet().is_some() {}
        server.handle_timeout(now + Duration::from_secs(60));
        assert_eq!(server.poll_query(), None);

        // The endpoint still serves a real client afterwards.
        let mut pair = Pair::new();
        pair.server = server;
        pair.epoch = now;
        pair.now = now + Duration::from_secs(60);
        let client = pair.connect(50000);
        pair.send_message(client, &message(3, 30));
        let queries = pair.queries();
        assert_eq!(queries.len(), 1);
        pair.respond(queries[0].0, &message(3, 30));
        assert_eq!(pair.received(client), framed(&message(3, 30)));
    }

    #[test]
    fn unusable_addresses_do_not_panic() {
        let now = Instant::now();
        for address in [
            Ipv4Addr::BROADCAST,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::new(224, 0, 0, 1),
        ] {
            let mut server = Endpoint::new(address, 40, now);
            server.handle_packet(now, &syn(address));
            server.handle_timeout(now);
            assert_eq!(server.poll_packet(), None);
        }
    }
}
