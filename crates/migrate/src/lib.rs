//! Migration handoff of a router-mode LAN host between sites: pure state machines, no I/O.
//!
//! A plain LAN host (a VM with no hyphae software) keeps its IP and MAC when its hypervisor
//! moves it from router A's LAN to router B's. IPOP Sec. 5 and Fig. 11 hand its address over
//! between the two routers; this crate does that, faster and safer. An address is IPv4 or
//! IPv6: each of a host's addresses moves by its own handoff (the messages carry them as
//! text, so an IPv4 one reads as it did when they named IPv4 only).
//!
//! 1. **Target** (B) sees the host on its LAN ([`Presence`]: a RARP frame as QEMU's
//!    announce-self sends, a gratuitous ARP, or its first packet) for an address it does not
//!    hold. It looks up the holder in the DHT ([`DhtOp::Lookup`]). No holder: it claims the
//!    address ([`DhtOp::Claim`]). A holder: it asks it ([`Message::Request`]), retrying a
//!    lost request every [`Config::request_retry`].
//!
//!    A RARP frame names only the MAC. If the driver does not know it (its LAN table has no
//!    address for it), B asks every member which address has it ([`Message::WhoHas`],
//!    pushed). The member whose LAN host it is, and which holds its address, answers
//!    [`Message::IsAt`] ([`Migrate::handle_who_has`]); B then looks that address's holder
//!    up as above, the handoff's duration still counting from the RARP frame. No answer
//!    within [`Config::mac_query_wait`]: given up ([`Event::GaveUp`]; the host's first
//!    packet starts a handoff again). A late, duplicated or unasked-for `IsAt` is ignored.
//! 2. **Source** (A) checks that the host is gone from its LAN: [`Config::probes`] ARP
//!    probes (neighbour solicitations for an IPv6 address) [`Config::probe_interval`] apart ([`Output::Probe`]; hundreds of milliseconds,
//!    not IPOP's seconds). An answer, or any frame from the host meanwhile, means it never
//!    left: [`Answer::Present`], no handoff. Silence: A transfers the lease on the replicas
//!    to B ([`DhtOp::Transfer`]: only the holder can, the record names B, so no third member
//!    takes it in between and A cannot take it back by renewing), then answers
//!    [`Answer::Transferred`] with the host's DHCP lease and names ([`HostState`]), pushes
//!    [`Message::Moved`] to every member so their routes move at once, and forwards packets
//!    still arriving for the host to B for [`Config::grace`] ([`Migrate::forward_to`]).
//! 3. The target takes the address over ([`Event::TookOver`]) with the host's state.
//!
//! If the source never answers (dead), the target waits for its lease to lapse on the
//! replicas and claims the address then ([`Event::SourceSilent`] says when): the bound is
//! `request_retry * request_tries` plus the time left on the source's lease, at most one
//! lease time. Two targets asking for one host are served one after the other: the second
//! is sent on to the new holder ([`Answer::NotHolder`]), which checks its own LAN in turn.
//!
//! Call order (as quinn-proto documents its `Connection`):
//!
//! 1. Feed each input to its `handle_*` method:
//!    - a host seen on the LAN: [`Migrate::handle_presence`] (a RARP frame with the
//!      address filled in if the driver's LAN table knows the MAC, else `address: None`);
//!    - a member's [`Message::WhoHas`]: [`Migrate::handle_who_has`], with the address of
//!      the driver's LAN host that has the MAC, if this member holds that address;
//!    - a member's [`Message::Moved`]: the driver's own route, through [`accept_moved`];
//!    - any other member's message ([`Message::Request`], [`Message::Reply`],
//!      [`Message::IsAt`]): [`Migrate::handle_message`];
//!    - the result of each [`DhtOp`]: the `handle_*` method its variant names.
//! 2. After every input, drain [`Migrate::poll_output`] until `None` and carry each
//!    output out (an output may itself lead to an input later: a DHT result, a reply).
//! 3. Call [`Migrate::handle_timeout`] when [`Migrate::poll_timeout`] is due (read it
//!    again after every input: inputs move it), then drain the outputs again.
//!
//! `P` names a member (the overlay's peer handle). No method reads a clock or draws
//! randomness, and none panics.

mod source;
mod target;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// An Ethernet MAC address.
pub type Mac = [u8; 6];

/// Timers of the handoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Time between the source's ARP probes of a host it is asked to give up.
    pub probe_interval: Duration,
    /// Probes unanswered before the source decides the host left its LAN.
    pub probes: u32,
    /// Time between a target's requests while no reply came.
    pub request_retry: Duration,
    /// Requests sent before a target decides the source is dead.
    pub request_tries: u32,
    /// How long the source forwards packets still arriving for a moved host.
    pub grace: Duration,
    /// How many holders in a row a target asks (one host moved twice, racing targets).
    pub max_hops: u32,
    /// How long a target waits for a member's [`Message::IsAt`] after asking which address
    /// a RARP frame's MAC has ([`Message::WhoHas`]).
    pub mac_query_wait: Duration,
}

/// A host on a LAN answers an ARP request in well under a millisecond; three probes 100 ms
/// apart survive two lost frames and still decide within 300 ms.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// See [`PROBE_INTERVAL`].
pub const PROBES: u32 = 3;
/// A reply needs the probe window (300 ms) plus a transfer round trip on the replicas;
/// a request repeated sooner only costs a duplicate, which the source answers the same.
pub const REQUEST_RETRY: Duration = Duration::from_millis(500);
/// Four requests (2 s) before the source counts as dead.
pub const REQUEST_TRIES: u32 = 4;
/// Members' routes move with the pushed [`Message::Moved`]; the grace period covers a
/// member that missed it until it looks the address up again.
pub const GRACE: Duration = Duration::from_secs(5);
/// A [`Message::WhoHas`] and its [`Message::IsAt`] are one round trip between members
/// (tens of milliseconds, a few hundred across continents); one second leaves room for a
/// loaded member. Not retried: QEMU sends several RARP frames, and the host's first
/// packet after the move starts a handoff anyway.
pub const MAC_QUERY_WAIT: Duration = Duration::from_secs(1);

impl Default for Config {
    fn default() -> Self {
        Self {
            probe_interval: PROBE_INTERVAL,
            probes: PROBES,
            request_retry: REQUEST_RETRY,
            request_tries: REQUEST_TRIES,
            grace: GRACE,
            max_hops: 3,
            mac_query_wait: MAC_QUERY_WAIT,
        }
    }
}

/// How a host showed itself on this router's LAN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Announce {
    /// A RARP frame (EtherType 0x8035): QEMU/KVM's announce-self after a migration. It
    /// names the MAC only.
    Rarp,
    /// A gratuitous ARP (sender and target address the same): `arping -U`, Xen, VMware.
    GratuitousArp,
    /// An unsolicited IPv6 neighbour advertisement: what a Linux guest sends for each of
    /// its IPv6 addresses when its hypervisor asks it to announce itself.
    NeighbourAdvertisement,
    /// An IPv6 duplicate address probe for an address another member holds: a host that
    /// moved here and configures its address again (or a real duplicate: the holder's
    /// answer tells).
    DuplicateProbe,
    /// Any other frame from the host: its first packet after the move.
    Packet,
}

/// A host seen on this router's LAN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Presence {
    /// Its address, if the frame carried one (a RARP frame does not).
    pub address: Option<IpAddr>,
    /// Its MAC.
    pub mac: Mac,
    /// What it sent.
    pub announce: Announce,
}

/// Who holds an address lease on the replicas, and for how long yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder<P> {
    /// The holding member.
    pub member: P,
    /// Time left on its lease.
    pub remaining: Duration,
}

/// A lease of the host's address by this router's virtual DHCP server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DhcpLease {
    /// The client identifier (or hardware address) the lease is bound to.
    pub client: Vec<u8>,
    /// Time left on it.
    pub remaining: Duration,
}

/// What moves with a host: its MAC, its DHCP lease and its DNS names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostState {
    /// The host's MAC, if known.
    pub mac: Option<Mac>,
    /// Its DHCP lease, if this router's server gave it the address.
    pub dhcp: Option<DhcpLease>,
    /// Its DNS names (the one it asked for, and its automatic one).
    pub names: Vec<String>,
}

/// A message between routers (carried over the overlay's authenticated channel: only
/// proven members send them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message<P> {
    /// Target to holder: the host at `address` is on my LAN now; hand it over.
    Request {
        /// Matches the reply to the request (unique per target).
        id: u64,
        /// The host's address.
        address: IpAddr,
        /// The target's own record for the address, signed by it (opaque here): what the
        /// replicas keep once the lease is the target's ([`DhtOp::Transfer`]).
        record: Vec<u8>,
    },
    /// Holder to target.
    Reply {
        /// The request's id.
        id: u64,
        /// The host's address.
        address: IpAddr,
        /// The outcome.
        answer: Answer<P>,
    },
    /// Old holder to every member: `address` is at `to` now.
    Moved {
        /// The host's address.
        address: IpAddr,
        /// Its new holder.
        to: P,
    },
    /// Target to every member: which address has the LAN host with this MAC? (A RARP
    /// frame named only the MAC.) Answered with [`Message::IsAt`] by the member whose LAN
    /// host it is, if it holds the address ([`Migrate::handle_who_has`]); the others stay
    /// silent.
    WhoHas {
        /// The MAC the RARP frame named.
        mac: Mac,
    },
    /// Answer to [`Message::WhoHas`]: the LAN host with this MAC is at `address` on my
    /// LAN, and I hold that address.
    IsAt {
        /// The MAC asked for.
        mac: Mac,
        /// The host's address.
        address: IpAddr,
    },
}

impl<P> Message<P> {
    /// The same message with its member names mapped by `f` (to and from their wire form);
    /// `None` if `f` refuses one.
    pub fn map_members<Q>(self, mut f: impl FnMut(P) -> Option<Q>) -> Option<Message<Q>> {
        Some(match self {
            Message::Request {
                id,
                address,
                record,
            } => Message::Request {
                id,
                address,
                record,
            },
            Message::Reply {
                id,
                address,
                answer,
            } => Message::Reply {
                id,
                address,
                answer: match answer {
                    Answer::Transferred(state) => Answer::Transferred(state),
                    Answer::Present => Answer::Present,
                    Answer::NotHolder(Some(p)) => Answer::NotHolder(Some(f(p)?)),
                    Answer::NotHolder(None) => Answer::NotHolder(None),
                    Answer::Failed => Answer::Failed,
                },
            },
            Message::Moved { address, to } => Message::Moved {
                address,
                to: f(to)?,
            },
            Message::WhoHas { mac } => Message::WhoHas { mac },
            Message::IsAt { mac, address } => Message::IsAt { mac, address },
        })
    }
}

/// The holder's answer to a [`Message::Request`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer<P> {
    /// The lease is the asker's now; the host's state comes with it.
    Transferred(HostState),
    /// The host still answers on my LAN: no handoff.
    Present,
    /// I do not hold the address (any more); `Some` names the member I gave it to.
    NotHolder(Option<P>),
    /// The transfer failed on the replicas; ask again later.
    Failed,
}

/// A DHT operation for the agent to run; the result comes back through the matching
/// `handle_*` method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DhtOp<P> {
    /// Who holds `address`? Result: [`Migrate::handle_lookup`].
    Lookup(IpAddr),
    /// Claim the (free or lapsed) `address` for this member. Result:
    /// [`Migrate::handle_claim`].
    Claim(IpAddr),
    /// Move this member's lease on `address` to `to` on the replicas, leaving `record`
    /// (the new holder's, from its request) as the value. Result:
    /// [`Migrate::handle_transfer`].
    Transfer {
        /// The address.
        address: IpAddr,
        /// The new holder.
        to: P,
        /// The new holder's signed record.
        record: Vec<u8>,
    },
}

/// What a claim came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOutcome<P> {
    /// The address is this member's.
    Won,
    /// Another member holds it.
    Held(Holder<P>),
    /// No quorum answered.
    Unanswered,
}

/// What a lookup of an address's holder came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup<P> {
    /// Nobody holds it.
    Free,
    /// A member holds it.
    Held(Holder<P>),
    /// No replica answered.
    Unanswered,
}

/// What a transfer came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferOutcome {
    /// A quorum of replicas names the new holder.
    Done,
    /// The replicas say this member does not hold the address.
    NotHolder,
    /// No quorum answered.
    Unanswered,
}

/// Something the agent acts on or reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<P> {
    /// Target: the address is this member's now; install the host's state (DHCP lease,
    /// names) and route it to the LAN. `from` is the old holder (`None`: it was free or
    /// lapsed); `took` runs from the host's first sighting to now.
    TookOver {
        /// The host's address.
        address: IpAddr,
        /// The old holder.
        from: Option<P>,
        /// What came with it (empty when the source was silent).
        state: HostState,
        /// Handoff duration.
        took: Duration,
    },
    /// Source: the host left; its address, lease and names are `to`'s now. Forget it on
    /// the LAN (packets for it go to [`Migrate::forward_to`] for the grace period).
    HandedOff {
        /// The host's address.
        address: IpAddr,
        /// The new holder.
        to: P,
        /// From the first request to the transfer.
        took: Duration,
    },
    /// Source: the host answered on this LAN; the request was refused.
    Kept {
        /// The host's address.
        address: IpAddr,
        /// Who asked.
        asker: P,
    },
    /// Target: the holder says the host is still on its LAN; the address stays its.
    Refused {
        /// The host's address.
        address: IpAddr,
        /// The holder.
        holder: P,
    },
    /// Target: the holder never answered; the address is claimed when its lease lapses.
    SourceSilent {
        /// The host's address.
        address: IpAddr,
        /// The silent holder.
        holder: P,
        /// When the claim goes out.
        claim_at: Instant,
    },
    /// Target: the handoff was given up (DHT unanswered, too many hops, no member answered
    /// for a RARP frame's MAC within [`Config::mac_query_wait`]).
    GaveUp {
        /// The host's address, if known.
        address: Option<IpAddr>,
        /// Why.
        reason: &'static str,
    },
}

/// What the agent does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output<P> {
    /// Send `message` to the member `to`.
    Send {
        /// The member.
        to: P,
        /// The message.
        message: Message<P>,
    },
    /// Send `message` to every other member of the namespace, as one-way news nobody
    /// acknowledges: [`Message::Moved`] (the driver may leave out the new holder, which
    /// knows) and [`Message::WhoHas`] (the answers come back as [`Message::IsAt`] to
    /// [`Migrate::handle_message`]; members that do not know the MAC send nothing).
    Push(Message<P>),
    /// Run a DHT operation.
    Dht(DhtOp<P>),
    /// Probe the LAN for the address: an ARP probe, or a neighbour solicitation for an
    /// IPv6 address.
    Probe(IpAddr),
    /// Report or act on an event.
    Event(Event<P>),
}

/// Counters for `hyphae status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Hosts taken over from another router (or a lapsed lease).
    pub handoffs_in: u64,
    /// Hosts handed to another router.
    pub handoffs_out: u64,
    /// Requests refused because the host still answered here.
    pub kept: u64,
    /// The last handoff's duration, either way.
    pub last: Option<Duration>,
}

/// The handoffs of one namespace on one router: those it asks for (target) and those it
/// is asked for (source).
#[derive(Debug)]
pub struct Migrate<P> {
    config: Config,
    targets: HashMap<IpAddr, target::Handoff<P>>,
    /// RARP MACs asked of the members ([`Message::WhoHas`]), with when the first frame
    /// was seen (the handoff's duration runs from there; the wait ends
    /// [`Config::mac_query_wait`] later).
    mac_queries: HashMap<Mac, Instant>,
    sources: HashMap<IpAddr, source::Handoff<P>>,
    /// Hosts handed off: forwarded to the new holder until the grace period ends.
    moved: HashMap<IpAddr, source::Moved<P>>,
    /// This member.
    local: P,
    next_id: u64,
    outputs: VecDeque<Output<P>>,
    stats: Stats,
}

impl<P: Copy + Eq + std::fmt::Debug> Migrate<P> {
    /// No handoff under way; `local` is this member.
    pub fn new(config: Config, local: P) -> Self {
        Self {
            config,
            local,
            targets: HashMap::new(),
            mac_queries: HashMap::new(),
            sources: HashMap::new(),
            moved: HashMap::new(),
            next_id: 0,
            outputs: VecDeque::new(),
            stats: Stats::default(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Source: the member packets for `address` go to during the grace period after it was
    /// handed off.
    pub fn forward_to(&self, address: IpAddr, now: Instant) -> Option<P> {
        self.moved
            .get(&address)
            .filter(|m| now < m.until)
            .map(|m| m.to)
    }

    /// Whether a handoff of `address` is under way here, either way.
    pub fn in_progress(&self, address: IpAddr) -> bool {
        self.targets.contains_key(&address) || self.sources.contains_key(&address)
    }

    /// The next thing to do.
    pub fn poll_output(&mut self) -> Option<Output<P>> {
        self.outputs.pop_front()
    }

    /// When [`Migrate::handle_timeout`] wants to run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let targets = self.targets.values().filter_map(|t| t.deadline());
        let sources = self.sources.values().filter_map(|s| s.deadline());
        let moved = self.moved.values().map(|m| m.until);
        let queries = self
            .mac_queries
            .values()
            .filter_map(|started| self.mac_query_deadline(*started));
        targets.chain(sources).chain(moved).chain(queries).min()
    }

    /// Runs the timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.moved.retain(|_, m| now < m.until);
        self.mac_queries_timeout(now);
        self.targets_timeout(now);
        self.sources_timeout(now);
    }

    /// A host showed itself on this LAN. `held`: this member holds the frame's address
    /// already (the agent's membership knows); then only a source checking that address
    /// cares (the host never left, or came back).
    ///
    /// A frame with an address answers a question about the host's MAC still out here
    /// ([`Message::WhoHas`]): it ends without [`Event::GaveUp`], and a handoff it starts
    /// counts its duration from the RARP frame.
    pub fn handle_presence(&mut self, now: Instant, presence: Presence, held: bool) {
        let mut started = now;
        if let Some(address) = presence.address {
            if let Some(asked) = self.mac_queries.remove(&presence.mac) {
                started = asked;
            }
            if self.source_sees_host(address, presence) || held {
                return;
            }
        }
        self.target_start(now, started, presence);
    }

    /// A message from the member `from` (proven by the overlay). `held`: this member holds
    /// the message's address on the replicas (only a [`Message::Request`] reads it).
    ///
    /// A [`Message::WhoHas`] needs the driver's LAN table: give it to
    /// [`Migrate::handle_who_has`] instead (here it is ignored). A [`Message::Moved`] is the
    /// driver's ([`accept_moved`]; ignored here too).
    pub fn handle_message(&mut self, now: Instant, from: P, message: Message<P>, held: bool) {
        match message {
            Message::Request {
                id,
                address,
                record,
            } => self.source_request(now, from, id, address, record, held),
            Message::Reply {
                id,
                address,
                answer,
            } => self.target_reply(now, from, id, address, answer),
            Message::IsAt { mac, address } => self.target_is_at(now, mac, address),
            // Routes are the agent's: see [`accept_moved`].
            Message::Moved { .. } => {}
            // Needs the LAN table: see [`Migrate::handle_who_has`].
            Message::WhoHas { .. } => {}
        }
    }

    fn emit(&mut self, output: Output<P>) {
        self.outputs.push_back(output);
    }

    fn event(&mut self, event: Event<P>) {
        self.outputs.push_back(Output::Event(event));
    }
}

/// Whether a member takes a [`Message::Moved`] about `address` from `from`: only from the
/// member its route for the address points to now (the old holder speaks for its own
/// address; a third member cannot redirect traffic this way). The new route is then
/// `to`; the DHT record, which names `to` already, confirms it on the next lookup.
pub fn accept_moved<P: Eq>(from: &P, current_route: Option<&P>) -> bool {
    current_route == Some(from)
}
