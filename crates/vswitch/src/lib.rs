//! The virtual switch of one namespace: pure frame logic, no I/O.
//!
//! A [`Switch`] sits between the namespace's TAP device and the overlay. It is fed frames that
//! the kernel wrote to the TAP ([`Switch::handle_tap_frame`]) and IPv4 packets that arrived
//! from members ([`Switch::handle_peer_packet`]), and answers with an [`Action`]: send to a
//! member, send to every member, write to the TAP, or drop with a counted [`DropReason`]. It
//! owns no socket, no device and no clock (the caller passes `now`), allocates nothing per
//! frame, and never panics on any input. Frames it wants to write on its own (ARP probes,
//! deferred ARP replies) come out of [`Switch::poll_transmit`] after
//! [`Switch::handle_timeout`]; hosts it learns or forgets on the LAN come out of
//! [`Switch::poll_event`].
//!
//! The three IPOP deployment modes (Sec. 3-4, Fig. 2-5):
//!
//! - **Interface**: the TAP carries the host's own virtual address; every remote member's
//!   address is answered by proxy ARP with one locally generated MAC (`FE:FD` plus four
//!   bytes unique to the agent), so the host's kernel sends all overlay traffic to that MAC
//!   and the switch forwards it by destination IP.
//! - **Router**: the TAP is a port of a LAN bridge whose hosts run no hyphae software. The
//!   switch learns which namespace addresses live on the LAN (ARP and IP snooping), the
//!   agent claims them for itself, and proxy ARP answers only for addresses that are not on
//!   the LAN and that a member owns (IPOP 4.1). Traffic between two LAN hosts never reaches
//!   the switch (the bridge carries it); what is flooded to it is ignored.
//! - **Hybrid**: the TAP shares a LAN bridge with the host's own virtual interface (a veth)
//!   and other hosts. The switch handles only frames of the host's device (Fig. 5's "should
//!   handle"), and before it answers ARP for a remote address it probes the LAN and answers
//!   only if nothing local replied within `probe_timeout` (IPOP 4.4).
//!
//! Broadcast and multicast (IPOP 4.2): an IPv4 broadcast (the subnet's or 255.255.255.255)
//! or multicast packet leaving the host or LAN becomes [`Action::Broadcast`] (the agent
//! sends it to every member of the namespace); one arriving from a member is framed for the
//! device unless it came from this LAN. Both directions pass a token bucket
//! (`broadcast_rate`), so a storm costs a counted drop, not the agent.
//!
//! Packets larger than the tunnel (`tunnel_mtu`, from a LAN at a larger MTU): a TCP SYN's
//! MSS is clamped in place (both directions), a DF packet is answered with ICMP
//! "fragmentation needed" ([`Action::ToTap`]), any other becomes [`Action::Fragment`]; see
//! [`mtu`].

pub mod mtu;
pub mod offload;
pub mod udp;
pub mod wire;

#[cfg(test)]
mod captured;

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::net::Ipv4Addr;
use std::ops::Range;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;

pub use wire::Mac;
use wire::{
    emit_arp_probe, emit_arp_reply, emit_ethernet_header, emit_udp, multicast_mac, udp_parts,
    ArpPacket, EthernetFrame, Ipv4Packet, ARP_LEN, ARP_REQUEST, BROADCAST_MAC, ETHERTYPE_ARP,
    ETHERTYPE_IPV4, ETHERTYPE_RARP, ETH_HEADER_LEN, IPPROTO_UDP,
};

/// Bytes the caller must leave in front of a packet handed to
/// [`Switch::handle_peer_packet`], so the Ethernet header is written in place.
pub const HEADROOM: usize = ETH_HEADER_LEN;

/// Smallest reply buffer [`Switch::handle_tap_frame`] and [`Switch::poll_transmit`] may be
/// given: room for an ICMP "fragmentation needed" quoting the largest IPv4 header (an ARP
/// reply is shorter).
pub const MIN_REPLY_BUF: usize = mtu::FRAG_NEEDED_MAX_LEN;

/// The namespace MTU the agent uses by default, [`Config::interface`]'s: equal to
/// `hyphae_overlay::DEFAULT_MTU` (1420, a full packet in a 1500-byte underlay datagram),
/// which the agent checks at compile time; vswitch does not depend on the overlay.
pub const DEFAULT_TUNNEL_MTU: u16 = 1420;

/// Most LAN hosts one switch keeps track of; beyond, new ones are not learned (counted).
pub const MAX_LAN_HOSTS: usize = 4096;

/// ARP probes sent to a silent LAN host before it is forgotten (router mode), one a second.
pub const LAN_PROBES: u8 = 3;

/// How long a remote address stays confirmed (hybrid mode: no LAN host answered the probe)
/// before ARP for it probes the LAN again.
pub const REMOTE_CONFIRMED: Duration = Duration::from_secs(60);

/// The first two bytes of every agent's remote MAC (IPOP 4.1).
pub const REMOTE_MAC_PREFIX: [u8; 2] = [0xfe, 0xfd];

/// A namespace's service address, where its virtual DHCP (and DNS) server answers: the
/// lowest usable address of the subnet, as in IPOP.
pub fn service_address(subnet: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(subnet.network()).saturating_add(1))
}

/// How a namespace attaches to the host (IPOP Sec. 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A TAP device carrying this host's virtual address.
    Interface,
    /// A TAP on a LAN bridge; the LAN hosts use namespace addresses and run no hyphae.
    Router,
    /// The host's virtual interface and the TAP on a bridge shared with a LAN.
    Hybrid,
}

/// Settings of one namespace's switch.
#[derive(Debug, Clone)]
pub struct Config {
    /// How the switch is attached.
    pub mode: Mode,
    /// The host's own virtual address, carried by its device (unspecified in router mode).
    pub address: Ipv4Addr,
    /// The namespace subnet.
    pub subnet: Ipv4Net,
    /// MAC of the host's device: destination of frames written for the host (interface:
    /// the TAP; hybrid: the host's veth).
    pub device_mac: Mac,
    /// The MAC that stands for every remote member (IPOP 4.1: FE:FD plus 4 bytes).
    pub remote_mac: Mac,
    /// Hybrid mode: how long a LAN probe waits for a local answer before the switch answers
    /// ARP for a remote address (IPOP uses 2 s).
    pub probe_timeout: Duration,
    /// Router mode: a LAN host silent this long is probed, then forgotten.
    pub lan_timeout: Duration,
    /// Broadcast and multicast packets per second, each way (also the burst); 0 carries none.
    pub broadcast_rate: u32,
    /// Intercept DHCP requests (UDP to port 67) for the agent's virtual DHCP server. The
    /// subnet's [`service_address`] (the DHCP server's identifier and the DNS server) is
    /// always answered: ARP for it at once, and packets to it go to the agent.
    pub dhcp: bool,
    /// The largest IPv4 packet a tunnel carries (the namespace MTU). Larger packets from the
    /// device are fragmented, or answered with ICMP "fragmentation needed" if they have DF
    /// set; TCP SYNs both ways have their MSS clamped to fit it (see [`mtu`]).
    pub tunnel_mtu: u16,
}

impl Config {
    /// Interface-mode settings with the default timers and broadcast rate.
    pub fn interface(address: Ipv4Addr, subnet: Ipv4Net, device_mac: Mac, remote_mac: Mac) -> Self {
        Self {
            mode: Mode::Interface,
            address,
            subnet,
            device_mac,
            remote_mac,
            probe_timeout: Duration::from_secs(2),
            lan_timeout: Duration::from_secs(30),
            broadcast_rate: 200,
            dhcp: false,
            tunnel_mtu: DEFAULT_TUNNEL_MTU,
        }
    }
}

/// What to do with a frame or packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<P> {
    /// Send the IPv4 packet at `packet` (a range of the input frame) to `peer`.
    ToPeer {
        /// The member that owns the destination address.
        peer: P,
        /// Where the IPv4 packet lies in the frame (link padding excluded).
        packet: Range<usize>,
    },
    /// Send the IPv4 broadcast or multicast packet at `packet` to every member.
    Broadcast {
        /// Where the IPv4 packet lies in the frame.
        packet: Range<usize>,
    },
    /// The IPv4 packet at `packet` is larger than the tunnel MTU and may be fragmented: send
    /// each of its [`mtu::Fragments`] for `mtu` as [`Action::ToPeer`] (to `peer`) or
    /// [`Action::Broadcast`] (`peer` is `None`) would send the whole packet.
    Fragment {
        /// The member that owns the destination address; `None`: every member.
        peer: Option<P>,
        /// Where the IPv4 packet lies in the frame.
        packet: Range<usize>,
        /// The tunnel MTU to fragment for.
        mtu: u16,
    },
    /// A DHCP request for the agent's virtual DHCP server: broadcast by a client, or
    /// unicast to the service address by a relay agent.
    Dhcp {
        /// Where the DHCP message (the UDP payload) lies in the frame.
        payload: Range<usize>,
        /// The sender's MAC: a relayed request's reply goes back through it.
        mac: Mac,
    },
    /// A DNS query over UDP to the service address, for the agent's virtual DNS server.
    Dns {
        /// Where the query (the UDP payload) lies in the frame.
        payload: Range<usize>,
        /// Who asked: where the answer goes ([`Switch::emit_dns_reply`]).
        client: Client,
    },
    /// Any other IPv4 packet to the service address (DNS over TCP, ping): for the agent's
    /// service stack, whose packets go back with [`Switch::emit_service_packet`].
    Service {
        /// Where the IPv4 packet lies in the frame.
        packet: Range<usize>,
        /// The sender's MAC.
        mac: Mac,
    },
    /// Write the first `len` bytes of the buffer to the TAP (a reply built in the reply
    /// buffer, or a frame framed in place).
    ToTap {
        /// Length of the frame.
        len: usize,
    },
    /// No member is known to own `target`, a namespace address: the frame (an ARP request
    /// or an IPv4 packet) should wait while the overlay resolves it, and go through the
    /// switch again once a member announces the address.
    Resolve {
        /// The address to resolve.
        target: Ipv4Addr,
    },
    /// Drop it, counted under the reason.
    Drop(DropReason),
}

/// The sender of a UDP datagram to the service address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    /// Its MAC.
    pub mac: Mac,
    /// Its address.
    pub ip: Ipv4Addr,
    /// Its UDP port.
    pub port: u16,
}

/// Something the switch learned that the agent acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Router mode: a namespace address appeared on the LAN (the agent claims it).
    LanHostUp(Ipv4Addr),
    /// Router mode: a LAN host stopped answering (the agent gives its address back).
    LanHostDown(Ipv4Addr),
    /// Router mode: a host announced its MAC with RARP (QEMU's announce-self after a
    /// migration); the frame carries no address (`hyphae_migrate` looks it up).
    Rarp(Mac),
    /// Router mode: a host announced its address with a gratuitous ARP (sender and target
    /// address the same), whether or not the switch knew it.
    GratuitousArp {
        /// The announced address.
        address: Ipv4Addr,
        /// The host's MAC.
        mac: Mac,
    },
    /// Router mode: a host [`Switch::probe_lan_host`] asked about sent a frame (an answer
    /// to the probe, or anything else): it is on this LAN.
    LanHostHeard {
        /// Its address.
        address: Ipv4Addr,
        /// Its MAC.
        mac: Mac,
    },
}

/// Why the switch dropped a frame. Each has a counter in [`Counters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Frame, ARP or IPv4 header failed validation.
    Malformed,
    /// An EtherType other than IPv4 and ARP (IPv6, LLDP, ...).
    UnsupportedProtocol,
    /// ARP that the switch does not answer: not a request, or for the host's own address,
    /// or for an address outside the namespace.
    ArpIgnored,
    /// ARP request for a namespace address that no known member owns.
    ArpUnknownTarget,
    /// IPv4 to a namespace address that no known member owns.
    NoRoute,
    /// IPv4 to an address outside the namespace subnet.
    OutsideSubnet,
    /// Broadcast or multicast over the rate limit, or with broadcast off.
    BroadcastRateLimited,
    /// A packet from a member addressed to someone other than this host (or its LAN).
    NotForUs,
    /// Traffic between hosts of the LAN, or ARP for a LAN host: the bridge carries it.
    LanLocal,
    /// Hybrid mode: a frame of another LAN host, not this host's device.
    OtherHost,
    /// Hybrid mode: ARP held while the LAN is probed for the address.
    ArpProbing,
    /// A broadcast from a member whose source is on this LAN (the LAN delivered it).
    BroadcastFromLan,
    /// Larger than the tunnel MTU with DF set, and no ICMP error may answer it (a broadcast,
    /// or an ICMP error itself: RFC 1122 3.2.2).
    TooBig,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 13] = [
        DropReason::Malformed,
        DropReason::UnsupportedProtocol,
        DropReason::ArpIgnored,
        DropReason::ArpUnknownTarget,
        DropReason::NoRoute,
        DropReason::OutsideSubnet,
        DropReason::BroadcastRateLimited,
        DropReason::NotForUs,
        DropReason::LanLocal,
        DropReason::OtherHost,
        DropReason::ArpProbing,
        DropReason::BroadcastFromLan,
        DropReason::TooBig,
    ];

    /// Stable snake_case name, used in status output.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::UnsupportedProtocol => "unsupported_protocol",
            DropReason::ArpIgnored => "arp_ignored",
            DropReason::ArpUnknownTarget => "arp_unknown_target",
            DropReason::NoRoute => "no_route",
            DropReason::OutsideSubnet => "outside_subnet",
            DropReason::BroadcastRateLimited => "broadcast_rate_limited",
            DropReason::NotForUs => "not_for_us",
            DropReason::LanLocal => "lan_local",
            DropReason::OtherHost => "other_host",
            DropReason::ArpProbing => "arp_probing",
            DropReason::BroadcastFromLan => "broadcast_from_lan",
            DropReason::TooBig => "too_big",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What the switch has done so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets handed to members.
    pub to_peer: u64,
    /// Packets from members written to the TAP.
    pub to_tap: u64,
    /// Proxy ARP replies written to the TAP.
    pub arp_replies: u64,
    /// Frames held for resolution of an unknown namespace address.
    pub resolves: u64,
    /// Broadcast and multicast packets sent to every member.
    pub broadcasts_out: u64,
    /// Broadcast and multicast packets from members written to the TAP.
    pub broadcasts_in: u64,
    /// ARP probes the switch sent on the LAN.
    pub arp_probes: u64,
    /// DHCP requests handed to the virtual DHCP server.
    pub dhcp_requests: u64,
    /// DNS queries over UDP handed to the virtual DNS server.
    pub dns_queries: u64,
    /// Other packets to the service address handed to the service stack.
    pub service_packets: u64,
    /// LAN hosts not learned because the table was full.
    pub lan_table_full: u64,
    /// Router mode: RARP and gratuitous ARP announcements seen on the LAN.
    pub announcements: u64,
    /// TCP SYNs whose MSS was lowered to fit the tunnel (both directions).
    pub mss_clamped: u64,
    /// Packets larger than the tunnel MTU sent in fragments.
    pub fragmented: u64,
    /// ICMP "fragmentation needed" sent back for packets larger than the tunnel MTU with DF.
    pub frag_needed: u64,
    drops: [u64; DropReason::ALL.len()],
}

impl Counters {
    /// How many frames were dropped for `reason`.
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason.index()]
    }
}

/// A namespace address seen on the LAN.
#[derive(Debug, Clone, Copy)]
struct LanHost {
    mac: Mac,
    seen: Instant,
    /// Router mode: probes sent since it was last seen.
    probes: u8,
    last_probe: Option<Instant>,
}

/// Hybrid mode: an ARP request of the host waiting for the LAN probe to time out.
#[derive(Debug, Clone, Copy)]
struct Probe {
    deadline: Instant,
    requester: (Mac, Ipv4Addr),
}

/// A frame the switch writes on its own.
#[derive(Debug, Clone, Copy)]
enum Emit {
    /// Who has `target`? (ARP probe from the remote MAC.)
    Probe(Ipv4Addr),
    /// `target` is at the remote MAC, told to the requester.
    Reply {
        target: Ipv4Addr,
        to: (Mac, Ipv4Addr),
    },
}

/// A token bucket: `rate` tokens a second, at most `rate` held.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Option<Instant>,
}

impl Bucket {
    fn take(&mut self, rate: u32, now: Instant) -> bool {
        let rate = f64::from(rate);
        let elapsed = self.last.map_or(rate, |t| {
            now.saturating_duration_since(t).as_secs_f64() * rate
        });
        self.tokens = (self.tokens + elapsed).min(rate);
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The switch of one namespace. `P` names a member (the overlay's peer handle).
#[derive(Debug)]
pub struct Switch<P> {
    config: Config,
    /// What members announced over their tunnels.
    routes: HashMap<Ipv4Addr, P>,
    /// What the DHT said (the owner's signed lease), for addresses its owner has not
    /// announced yet: a router that restarted learns its LAN hosts from this traffic.
    resolved: HashMap<Ipv4Addr, P>,
    lan: HashMap<Ipv4Addr, LanHost>,
    probes: HashMap<Ipv4Addr, Probe>,
    /// Hybrid mode: remote addresses whose LAN probe went unanswered, until when.
    confirmed: HashMap<Ipv4Addr, Instant>,
    /// Router mode: LAN addresses asked for recently (a member sent to an unknown host).
    asked: HashMap<Ipv4Addr, Instant>,
    /// Router mode: LAN addresses whose next frame is reported ([`Event::LanHostHeard`]).
    watched: HashSet<Ipv4Addr>,
    emits: VecDeque<Emit>,
    events: VecDeque<Event>,
    bucket_out: Bucket,
    bucket_in: Bucket,
    counters: Counters,
}

impl<P: Copy + Eq> Switch<P> {
    /// A switch with no routes.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            routes: HashMap::new(),
            resolved: HashMap::new(),
            lan: HashMap::new(),
            probes: HashMap::new(),
            confirmed: HashMap::new(),
            asked: HashMap::new(),
            watched: HashSet::new(),
            emits: VecDeque::new(),
            events: VecDeque::new(),
            bucket_out: Bucket {
                tokens: 0.0,
                last: None,
            },
            bucket_in: Bucket {
                tokens: 0.0,
                last: None,
            },
            counters: Counters::default(),
        }
    }

    /// The switch's settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What the switch has done so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Makes `peer` the owner of exactly `addresses`: routes it had to others are removed.
    /// Addresses outside the subnet, and the host's own address, are ignored.
    pub fn set_peer_addresses(&mut self, peer: P, addresses: &[Ipv4Addr]) {
        self.routes.retain(|_, p| *p != peer);
        for &addr in addresses {
            if self.config.subnet.contains(&addr) && addr != self.config.address {
                self.routes.insert(addr, peer);
            }
        }
    }

    /// Forgets every route to `peer`.
    pub fn remove_peer(&mut self, peer: P) {
        self.routes.retain(|_, p| *p != peer);
        self.resolved.retain(|_, p| *p != peer);
    }

    /// The member that owns `addr`, if known: as it announced, or else as the DHT said.
    pub fn route(&self, addr: Ipv4Addr) -> Option<P> {
        self.routes
            .get(&addr)
            .or_else(|| self.resolved.get(&addr))
            .copied()
    }

    /// Namespace addresses seen on the LAN (router and hybrid modes), sorted.
    pub fn lan_hosts(&self) -> Vec<Ipv4Addr> {
        let mut v: Vec<Ipv4Addr> = self.lan.keys().copied().collect();
        v.sort();
        v
    }

    /// Handles a frame the kernel wrote to the TAP at `now`. A reply, if any, is built in
    /// `reply`, which must be at least [`MIN_REPLY_BUF`] long. A TCP SYN's MSS is clamped
    /// to the tunnel in `frame` itself.
    pub fn handle_tap_frame(
        &mut self,
        frame: &mut [u8],
        now: Instant,
        reply: &mut [u8],
    ) -> Action<P> {
        let mut action = self.classify_tap_frame(frame, now, reply);
        if let Action::ToPeer { packet, .. } | Action::Broadcast { packet } = &action {
            let mtu = self.config.tunnel_mtu;
            if frame
                .get(packet.clone())
                .is_none_or(|p| mtu::needs_fitting(p, mtu))
            {
                action = match action {
                    Action::ToPeer { peer, packet } => self.fit(frame, Some(peer), packet, reply),
                    Action::Broadcast { packet } => self.fit(frame, None, packet, reply),
                    other => other,
                };
            }
        }
        match &action {
            Action::ToPeer { .. } => self.counters.to_peer += 1,
            Action::Broadcast { .. } => self.counters.broadcasts_out += 1,
            Action::Fragment { peer, .. } => {
                self.counters.fragmented += 1;
                match peer {
                    Some(_) => self.counters.to_peer += 1,
                    None => self.counters.broadcasts_out += 1,
                }
            }
            Action::Dhcp { .. } => self.counters.dhcp_requests += 1,
            Action::Dns { .. } => self.counters.dns_queries += 1,
            Action::Service { .. } => self.counters.service_packets += 1,
            // Counted where they are built: ARP replies and ICMP errors.
            Action::ToTap { .. } => {}
            Action::Resolve { .. } => self.counters.resolves += 1,
            Action::Drop(reason) => self.counters.drops[reason.index()] += 1,
        }
        action
    }

    /// Fits the IPv4 packet at `packet` of `frame`, bound for `peer` (or every member), into
    /// the tunnel: clamps a SYN's MSS, and if it is still too large asks for fragments, or
    /// with DF set answers with ICMP "fragmentation needed" from the service address (an
    /// on-link address of the LAN, so the host's reverse-path filter takes it).
    #[inline(never)]
    fn fit(
        &mut self,
        frame: &mut [u8],
        peer: Option<P>,
        packet: Range<usize>,
        reply: &mut [u8],
    ) -> Action<P> {
        let mtu = self.config.tunnel_mtu;
        let Some(ip) = frame.get_mut(packet.clone()) else {
            return Action::Drop(DropReason::Malformed);
        };
        if mtu::clamp_mss(ip, mtu.saturating_sub(mtu::TCP_IPV4_HEADERS)) {
            self.counters.mss_clamped += 1;
        }
        if ip.len() <= usize::from(mtu) {
            return match peer {
                Some(peer) => Action::ToPeer { peer, packet },
                None => Action::Broadcast { packet },
            };
        }
        if mtu::ipv4_flags(ip) & mtu::IPV4_DF == 0 {
            if mtu::Fragments::new(ip, mtu).is_none() {
                return Action::Drop(DropReason::Malformed);
            }
            return Action::Fragment { peer, packet, mtu };
        }
        // No ICMP error for a broadcast, nor from an address the host cannot have on link.
        if peer.is_none() || self.service().is_unspecified() {
            return Action::Drop(DropReason::TooBig);
        }
        let src_mac = match EthernetFrame::new_checked(&frame[..]) {
            Ok(eth) => eth.src(),
            Err(_) => return Action::Drop(DropReason::Malformed),
        };
        let ip = &frame[packet];
        let macs = (src_mac, self.config.remote_mac);
        match mtu::emit_frag_needed(reply, macs, self.service(), mtu, ip) {
            Some(len) => {
                self.counters.frag_needed += 1;
                Action::ToTap { len }
            }
            None => Action::Drop(DropReason::TooBig),
        }
    }

    /// Changes the host's own address (an address won after start, or moved).
    pub fn set_address(&mut self, address: Ipv4Addr) {
        self.routes.remove(&address);
        self.resolved.remove(&address);
        self.config.address = address;
    }

    /// Changes the namespace subnet (learned after start); routes outside it are dropped.
    pub fn set_subnet(&mut self, subnet: Ipv4Net) {
        self.config.subnet = subnet;
        self.routes.retain(|a, _| subnet.contains(a));
        self.resolved.retain(|a, _| subnet.contains(a));
        self.lan.retain(|a, _| subnet.contains(a));
    }

    /// Routes `addr` to `peer` because the DHT says `peer` owns it; announcements take
    /// precedence. Replaced by the next resolution of `addr`, dropped with the peer.
    pub fn add_route(&mut self, addr: Ipv4Addr, peer: P) {
        if self.config.subnet.contains(&addr) && addr != self.config.address {
            self.resolved.insert(addr, peer);
        }
    }

    /// The next thing learned about the LAN.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Builds the next frame the switch wants on the TAP into `buf` (at least
    /// [`MIN_REPLY_BUF`] long) and returns its length.
    pub fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<usize> {
        // Only ARP is written here.
        if buf.len() < ETH_HEADER_LEN + ARP_LEN {
            return None;
        }
        let emit = self.emits.pop_front()?;
        Some(match emit {
            Emit::Probe(target) => {
                self.counters.arp_probes += 1;
                emit_arp_probe(buf, self.config.remote_mac, target)
            }
            Emit::Reply { target, to } => {
                self.counters.arp_replies += 1;
                emit_arp_reply(buf, self.config.remote_mac, target, to.0, to.1)
            }
        })
    }

    /// When [`Switch::handle_timeout`] wants to run next, if anything waits.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let probe = self.probes.values().map(|p| p.deadline).min();
        let lan = (self.config.mode == Mode::Router)
            .then(|| {
                self.lan
                    .values()
                    .map(|h| match h.last_probe {
                        Some(t) => t + Duration::from_secs(1),
                        None => h.seen + self.config.lan_timeout,
                    })
                    .min()
            })
            .flatten();
        [probe, lan].into_iter().flatten().min()
    }

    /// Runs the timers due at `now`: hybrid probes that went unanswered become ARP replies;
    /// router-mode LAN hosts that fell silent are probed, then forgotten.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<Ipv4Addr> = self
            .probes
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(a, _)| *a)
            .collect();
        for target in due {
            let Some(probe) = self.probes.remove(&target) else {
                continue;
            };
            if self.lan.contains_key(&target) {
                continue;
            }
            self.confirmed.insert(target, now + REMOTE_CONFIRMED);
            if self.route(target).is_some() {
                // The host's ARP request is still pending: complete it.
                self.emits.push_back(Emit::Reply {
                    target,
                    to: probe.requester,
                });
            }
        }
        self.confirmed.retain(|_, until| *until > now);
        self.asked
            .retain(|_, t| now.saturating_duration_since(*t) < Duration::from_secs(1));
        if self.config.mode != Mode::Router {
            return;
        }
        let timeout = self.config.lan_timeout;
        let mut gone = Vec::new();
        for (addr, host) in &mut self.lan {
            if now.saturating_duration_since(host.seen) < timeout {
                continue;
            }
            if host
                .last_probe
                .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(1))
            {
                continue;
            }
            if host.probes >= LAN_PROBES {
                gone.push(*addr);
                continue;
            }
            host.probes += 1;
            host.last_probe = Some(now);
            self.emits.push_back(Emit::Probe(*addr));
        }
        for addr in gone {
            self.lan.remove(&addr);
            self.events.push_back(Event::LanHostDown(addr));
        }
    }

    /// A namespace address seen as the source of a LAN frame (router and hybrid modes).
    fn learn(&mut self, ip: Ipv4Addr, mac: Mac, now: Instant) {
        if ip.is_unspecified()
            || ip == self.config.address
            || !self.config.subnet.contains(&ip)
            || ip == self.config.subnet.network()
            || ip == self.subnet_broadcast()
            // FE:FD is every agent's remote MAC (ours or another hybrid agent's on this
            // LAN, writing for its own host): such a frame carries a remote member's
            // address, never a LAN host's.
            || mac[..2] == REMOTE_MAC_PREFIX
            || mac[0] & 1 != 0
        {
            return;
        }
        self.probes.remove(&ip);
        self.confirmed.remove(&ip);
        if self.watched.remove(&ip) {
            self.events
                .push_back(Event::LanHostHeard { address: ip, mac });
        }
        if let Some(host) = self.lan.get_mut(&ip) {
            host.mac = mac;
            host.seen = now;
            host.probes = 0;
            host.last_probe = None;
            return;
        }
        if self.lan.len() >= MAX_LAN_HOSTS {
            self.counters.lan_table_full += 1;
            return;
        }
        self.lan.insert(
            ip,
            LanHost {
                mac,
                seen: now,
                probes: 0,
                last_probe: None,
            },
        );
        if self.config.mode == Mode::Router {
            self.events.push_back(Event::LanHostUp(ip));
        }
    }

    fn classify_tap_frame(&mut self, frame: &[u8], now: Instant, reply: &mut [u8]) -> Action<P> {
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            return Action::Drop(DropReason::Malformed);
        };
        let mode = self.config.mode;
        // Hybrid: only the host's own device is this switch's business (IPOP Fig. 5).
        let ours = mode != Mode::Hybrid || eth.src() == self.config.device_mac;
        match eth.ethertype() {
            ETHERTYPE_ARP => {
                let Ok(arp) = ArpPacket::new_checked(eth.payload()) else {
                    return Action::Drop(DropReason::Malformed);
                };
                if mode != Mode::Interface {
                    self.learn(arp.sender_ip(), arp.sender_mac(), now);
                }
                if mode == Mode::Router && arp.sender_ip() == arp.target_ip() {
                    self.announced(Some(arp.sender_ip()), arp.sender_mac());
                }
                if !ours {
                    return Action::Drop(DropReason::OtherHost);
                }
                self.answer_arp(&arp, now, reply)
            }
            ETHERTYPE_IPV4 => {
                let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
                    return Action::Drop(DropReason::Malformed);
                };
                if mode != Mode::Interface {
                    self.learn(ip.src(), eth.src(), now);
                }
                if !ours {
                    return Action::Drop(DropReason::OtherHost);
                }
                let packet = ETH_HEADER_LEN..ETH_HEADER_LEN + ip.total_len();
                if self.config.dhcp && ip.protocol() == IPPROTO_UDP {
                    if let Some((_, 67, udp)) = udp_parts(ip.payload()) {
                        let at = packet.end - ip.payload().len();
                        return Action::Dhcp {
                            payload: at + udp.start..at + udp.end,
                            mac: eth.src(),
                        };
                    }
                }
                let dst = ip.dst();
                if dst == self.service() {
                    return self.to_service(&eth, &ip, packet);
                }
                if self.is_broadcast(dst) {
                    if !self.config.subnet.contains(&ip.src()) {
                        return Action::Drop(DropReason::OutsideSubnet);
                    }
                    if !self.bucket_out.take(self.config.broadcast_rate, now) {
                        return Action::Drop(DropReason::BroadcastRateLimited);
                    }
                    return Action::Broadcast { packet };
                }
                // Router: LAN unicast the bridge flooded before it learned where to send it.
                if mode == Mode::Router && eth.dst() != self.config.remote_mac {
                    return Action::Drop(DropReason::LanLocal);
                }
                if !self.config.subnet.contains(&dst) {
                    return Action::Drop(DropReason::OutsideSubnet);
                }
                match self.route(dst) {
                    Some(peer) => Action::ToPeer { peer, packet },
                    None if mode != Mode::Interface && self.lan.contains_key(&dst) => {
                        Action::Drop(DropReason::LanLocal)
                    }
                    None if dst == self.config.address || dst == self.config.subnet.network() => {
                        Action::Drop(DropReason::NoRoute)
                    }
                    None => Action::Resolve { target: dst },
                }
            }
            ETHERTYPE_RARP if mode == Mode::Router => {
                let Ok(rarp) = ArpPacket::new_checked(eth.payload()) else {
                    return Action::Drop(DropReason::Malformed);
                };
                self.announced(None, rarp.sender_mac());
                // Nothing for the overlay: the bridge floods it on the LAN.
                Action::Drop(DropReason::LanLocal)
            }
            _ => Action::Drop(DropReason::UnsupportedProtocol),
        }
    }

    /// Router mode: a host announced itself (RARP names only the MAC; a gratuitous ARP the
    /// address too). Not from a remote MAC or a group address, and within the namespace.
    fn announced(&mut self, address: Option<Ipv4Addr>, mac: Mac) {
        if mac[..2] == REMOTE_MAC_PREFIX || mac[0] & 1 != 0 || mac == [0; 6] {
            return;
        }
        if let Some(a) = address {
            if !self.lan.contains_key(&a) {
                // `learn` refused it (not a host address of the namespace, or table full).
                return;
            }
        }
        self.counters.announcements += 1;
        self.events.push_back(match address {
            Some(address) => Event::GratuitousArp { address, mac },
            None => Event::Rarp(mac),
        });
    }

    /// Router mode: forgets a LAN host at once, without [`Event::LanHostDown`] (it was
    /// handed to another site); its next frame here makes it [`Event::LanHostUp`] again.
    pub fn forget_lan_host(&mut self, address: Ipv4Addr) {
        self.lan.remove(&address);
        self.watched.remove(&address);
    }

    /// Router mode: asks the LAN who has `address` (an ARP probe) and reports the host's
    /// next frame, the answer or any other, as [`Event::LanHostHeard`] (a migration source
    /// checks that the host left). At most [`MAX_LAN_HOSTS`] addresses are watched.
    pub fn probe_lan_host(&mut self, address: Ipv4Addr) {
        if self.watched.len() < MAX_LAN_HOSTS || self.watched.contains(&address) {
            self.watched.insert(address);
            self.emits.push_back(Emit::Probe(address));
        }
    }

    /// Router mode: the LAN host at `address` has `mac` (it moved here and its old
    /// router said so): delivered to at once, as if it had spoken.
    pub fn learn_lan_host(&mut self, address: Ipv4Addr, mac: Mac, now: Instant) {
        self.learn(address, mac, now);
    }

    /// Stops reporting `address`'s next frame.
    pub fn unwatch_lan_host(&mut self, address: Ipv4Addr) {
        self.watched.remove(&address);
    }

    /// The MAC of the LAN host at `address`, if it is known here.
    pub fn lan_host_mac(&self, address: Ipv4Addr) -> Option<Mac> {
        self.lan.get(&address).map(|h| h.mac)
    }

    /// The address of the LAN host with `mac`, if it is known here.
    pub fn lan_host_with_mac(&self, mac: Mac) -> Option<Ipv4Addr> {
        self.lan.iter().find(|(_, h)| h.mac == mac).map(|(a, _)| *a)
    }

    /// `addr` moved to `peer` (its old owner said so): routed there at once, whatever was
    /// announced or resolved; `None` forgets every route to it (the next packet resolves it).
    pub fn move_route(&mut self, addr: Ipv4Addr, peer: Option<P>) {
        self.routes.remove(&addr);
        self.resolved.remove(&addr);
        if let Some(peer) = peer {
            self.add_route(addr, peer);
        }
    }

    /// IPOP 4.1: answer only if (a) the target is a namespace address, (b) it is not the
    /// host's own nor on the local LAN, and (c) a member is known to own it. Hybrid mode
    /// first probes the LAN (IPOP 4.4).
    fn answer_arp(&mut self, arp: &ArpPacket<&[u8]>, now: Instant, reply: &mut [u8]) -> Action<P> {
        let target = arp.target_ip();
        if arp.operation() != ARP_REQUEST
            || !self.config.subnet.contains(&target)
            || target == self.config.address
            || target == arp.sender_ip()
        {
            return Action::Drop(DropReason::ArpIgnored);
        }
        if self.config.mode != Mode::Interface && self.lan.contains_key(&target) {
            return Action::Drop(DropReason::LanLocal);
        }
        let service = target == self.service();
        if service {
            // The virtual server lives in every agent: no lookup, no LAN probe.
        } else if self.route(target).is_none() {
            if target == self.config.subnet.network() || target == self.subnet_broadcast() {
                return Action::Drop(DropReason::ArpIgnored);
            }
            return Action::Resolve { target };
        }
        if self.config.mode == Mode::Hybrid
            && !service
            && self.confirmed.get(&target).is_none_or(|&t| t <= now)
        {
            if !self.probes.contains_key(&target) {
                self.probes.insert(
                    target,
                    Probe {
                        deadline: now + self.config.probe_timeout,
                        requester: (arp.sender_mac(), arp.sender_ip()),
                    },
                );
                self.emits.push_back(Emit::Probe(target));
            }
            return Action::Drop(DropReason::ArpProbing);
        }
        if reply.len() < ETH_HEADER_LEN + ARP_LEN {
            return Action::Drop(DropReason::Malformed);
        }
        let len = emit_arp_reply(
            reply,
            self.config.remote_mac,
            target,
            arp.sender_mac(),
            arp.sender_ip(),
        );
        self.counters.arp_replies += 1;
        Action::ToTap { len }
    }

    /// Handles an IPv4 packet of `len` bytes from a member, lying at `buf[HEADROOM..]`; the
    /// source address has already been checked against what the member owns. On
    /// [`Action::ToTap`] the Ethernet header has been written in front of it, in place.
    pub fn handle_peer_packet(&mut self, buf: &mut [u8], len: usize, now: Instant) -> Action<P> {
        let action = self.frame_peer_packet(buf, len, now);
        match &action {
            Action::ToTap { .. } => self.counters.to_tap += 1,
            Action::Drop(reason) => self.counters.drops[reason.index()] += 1,
            Action::ToPeer { .. }
            | Action::Resolve { .. }
            | Action::Broadcast { .. }
            | Action::Fragment { .. }
            | Action::Dhcp { .. }
            | Action::Dns { .. }
            | Action::Service { .. } => {}
        }
        action
    }

    fn frame_peer_packet(&mut self, buf: &mut [u8], len: usize, now: Instant) -> Action<P> {
        let Some(packet) = buf.get(HEADROOM..HEADROOM + len) else {
            return Action::Drop(DropReason::Malformed);
        };
        let Ok(ip) = Ipv4Packet::new_checked(packet) else {
            return Action::Drop(DropReason::Malformed);
        };
        let (dst, src, frame_len) = (ip.dst(), ip.src(), HEADROOM + ip.total_len());
        let mode = self.config.mode;
        let dst_mac = if self.is_broadcast(dst) {
            if mode != Mode::Interface && self.lan.contains_key(&src) {
                return Action::Drop(DropReason::BroadcastFromLan);
            }
            if !self.bucket_in.take(self.config.broadcast_rate, now) {
                return Action::Drop(DropReason::BroadcastRateLimited);
            }
            self.counters.broadcasts_in += 1;
            match mode {
                // The whole LAN hears it.
                Mode::Router if dst.is_multicast() => multicast_mac(dst),
                Mode::Router => BROADCAST_MAC,
                // Only this host: other hosts of a hybrid LAN hear it from their own agent.
                Mode::Interface | Mode::Hybrid => self.config.device_mac,
            }
        } else if mode == Mode::Router {
            match self.lan.get(&dst) {
                Some(host) => host.mac,
                None => {
                    // Not seen since start (the agent restarted?): ask, once a second.
                    if self.config.subnet.contains(&dst) && !self.asked.contains_key(&dst) {
                        self.asked.insert(dst, now);
                        self.emits.push_back(Emit::Probe(dst));
                    }
                    return Action::Drop(DropReason::NotForUs);
                }
            }
        } else if dst == self.config.address {
            self.config.device_mac
        } else {
            return Action::Drop(DropReason::NotForUs);
        };
        // A member's SYN may come from an agent that does not clamp (or a larger tunnel MTU):
        // clamping here too keeps the LAN host's segments back to it within the tunnel.
        let mss = self.config.tunnel_mtu.saturating_sub(mtu::TCP_IPV4_HEADERS);
        if mtu::clamp_mss(&mut buf[HEADROOM..frame_len], mss) {
            self.counters.mss_clamped += 1;
        }
        emit_ethernet_header(buf, dst_mac, self.config.remote_mac, ETHERTYPE_IPV4);
        Action::ToTap { len: frame_len }
    }

    /// The service address (the virtual DHCP and DNS server's), if the subnet is known.
    fn service(&self) -> Ipv4Addr {
        if self.config.subnet.prefix_len() >= 31 {
            // No subnet yet (or no room for a service address).
            return Ipv4Addr::UNSPECIFIED;
        }
        service_address(self.config.subnet)
    }

    /// A packet from the host (or a LAN host) to the service address.
    fn to_service(
        &self,
        eth: &EthernetFrame<&[u8]>,
        ip: &Ipv4Packet<&[u8]>,
        packet: Range<usize>,
    ) -> Action<P> {
        // Router: unicast to someone else, flooded by the bridge.
        if self.config.mode == Mode::Router && eth.dst() != self.config.remote_mac {
            return Action::Drop(DropReason::LanLocal);
        }
        let src = ip.src();
        if !self.config.subnet.contains(&src)
            || src == self.config.subnet.network()
            || src == self.subnet_broadcast()
        {
            return Action::Drop(DropReason::OutsideSubnet);
        }
        if ip.protocol() == IPPROTO_UDP {
            if let Some((port, 53, udp)) = udp_parts(ip.payload()) {
                let at = packet.end - ip.payload().len();
                return Action::Dns {
                    payload: at + udp.start..at + udp.end,
                    client: Client {
                        mac: eth.src(),
                        ip: src,
                        port,
                    },
                };
            }
        }
        Action::Service {
            packet,
            mac: eth.src(),
        }
    }

    /// Frames an answer of the virtual DNS server (UDP 53, from the service address and
    /// the remote MAC) to `client` into `buf`; returns its length, or `None` if it does
    /// not fit.
    pub fn emit_dns_reply(&self, buf: &mut [u8], client: Client, payload: &[u8]) -> Option<usize> {
        emit_udp(
            buf,
            (client.mac, self.config.remote_mac),
            (self.service(), client.ip),
            (53, client.port),
            payload,
        )
    }

    /// Frames an IPv4 packet of the service stack (from the service address) to `dst_mac`
    /// into `buf`; returns its length, or `None` if it does not fit.
    pub fn emit_service_packet(
        &self,
        buf: &mut [u8],
        dst_mac: Mac,
        packet: &[u8],
    ) -> Option<usize> {
        let total = ETH_HEADER_LEN + packet.len();
        if buf.len() < total {
            return None;
        }
        emit_ethernet_header(buf, dst_mac, self.config.remote_mac, ETHERTYPE_IPV4);
        buf[ETH_HEADER_LEN..total].copy_from_slice(packet);
        Some(total)
    }

    /// Frames a reply of the virtual DHCP server (UDP from port 67 to `dst_port`: 68 for a
    /// client, 67 for a relay agent; from the service address and the remote MAC) into
    /// `buf`; returns its length, or `None` if it does not fit.
    pub fn emit_dhcp_reply(
        &self,
        buf: &mut [u8],
        dst_mac: Mac,
        dst: Ipv4Addr,
        dst_port: u16,
        payload: &[u8],
    ) -> Option<usize> {
        emit_udp(
            buf,
            (dst_mac, self.config.remote_mac),
            (service_address(self.config.subnet), dst),
            (67, dst_port),
            payload,
        )
    }

    /// A destination every member hears: an IPv4 broadcast (limited or the subnet's) or a
    /// multicast group.
    fn is_broadcast(&self, dst: Ipv4Addr) -> bool {
        dst.is_multicast() || dst.is_broadcast() || dst == self.subnet_broadcast()
    }

    fn subnet_broadcast(&self) -> Ipv4Addr {
        self.config.subnet.broadcast()
    }
}

#[cfg(test)]
mod tests {
    use super::wire::{ArpPacket, EthernetFrame, ARP_REPLY};
    use super::*;

    mod announce;

    const DEVICE_MAC: Mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];

    /// The virtual clock's origin (the switch only compares instants it is given).
    fn t0() -> Instant {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        #[allow(clippy::disallowed_methods)]
        *T0.get_or_init(Instant::now)
    }
    const REMOTE_MAC: Mac = [0xfe, 0xfd, 0xa1, 0xb2, 0xc3, 0xd4];

    fn switch() -> Switch<u32> {
        let mut sw = Switch::new(Config::interface(
            Ipv4Addr::new(10, 201, 0, 1),
            "10.201.0.0/16".parse().unwrap(),
            DEVICE_MAC,
            REMOTE_MAC,
        ));
        sw.set_peer_addresses(7, &[Ipv4Addr::new(10, 201, 0, 2)]);
        sw
    }

    fn arp_request(target: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&DEVICE_MAC);
        f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&DEVICE_MAC);
        f.extend_from_slice(&[10, 201, 0, 1]);
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&target);
        f
    }

    // An ICMP echo request 10.201.0.1 -> dst as the kernel writes it to the TAP, with the
    // Ethernet minimum-size padding after the 28-byte IP packet.
    fn icmp_frame(dst: [u8; 4]) -> Vec<u8> {
        let mut f = REMOTE_MAC.to_vec();
        f.extend_from_slice(&DEVICE_MAC);
        f.extend_from_slice(&[0x08, 0x00]);
        f.extend_from_slice(&[0x45, 0, 0, 28, 0x12, 0x34, 0x40, 0, 64, 1, 0, 0]);
        f.extend_from_slice(&[10, 201, 0, 1]);
        f.extend_from_slice(&dst);
        f.extend_from_slice(&[8, 0, 0xf7, 0xfe, 0, 1, 0, 0]);
        f.extend_from_slice(&[0; 18]); // padding to 60 bytes
        f
    }

    #[test]
    fn proxy_arp_answers_for_a_known_member() {
        let mut sw = switch();
        let mut reply = [0u8; 64];
        let Action::ToTap { len } =
            sw.handle_tap_frame(&mut arp_request([10, 201, 0, 2]), t0(), &mut reply)
        else {
            panic!("expected a reply")
        };
        let eth = EthernetFrame::new_checked(&reply[..len]).unwrap();
        assert_eq!(eth.dst(), DEVICE_MAC);
        assert_eq!(eth.src(), REMOTE_MAC);
        let arp = ArpPacket::new_checked(eth.payload()).unwrap();
        assert_eq!(arp.operation(), ARP_REPLY);
        assert_eq!(arp.sender_mac(), REMOTE_MAC);
        assert_eq!(arp.sender_ip(), Ipv4Addr::new(10, 201, 0, 2));
        assert_eq!(arp.target_ip(), Ipv4Addr::new(10, 201, 0, 1));
        assert_eq!(sw.counters().arp_replies, 1);
    }

    #[test]
    fn proxy_arp_follows_ipop_rules() {
        let mut sw = switch();
        let mut reply = [0u8; 64];
        // (c) no member owns it
        let unknown = sw.handle_tap_frame(&mut arp_request([10, 201, 0, 9]), t0(), &mut reply);
        assert_eq!(
            unknown,
            Action::Resolve {
                target: Ipv4Addr::new(10, 201, 0, 9)
            }
        );
        // (b) our own address (the kernel's duplicate-address probe)
        let own = sw.handle_tap_frame(&mut arp_request([10, 201, 0, 1]), t0(), &mut reply);
        assert_eq!(own, Action::Drop(DropReason::ArpIgnored));
        // (a) outside the namespace
        let outside = sw.handle_tap_frame(&mut arp_request([192, 168, 1, 1]), t0(), &mut reply);
        assert_eq!(outside, Action::Drop(DropReason::ArpIgnored));
        assert_eq!(sw.counters().drops(DropReason::ArpIgnored), 2);
        assert_eq!(sw.counters().resolves, 1);
    }

    #[test]
    fn ipv4_goes_to_the_owner_without_link_padding() {
        let mut sw = switch();
        let mut frame = icmp_frame([10, 201, 0, 2]);
        let action = sw.handle_tap_frame(&mut frame, t0(), &mut [0u8; 64]);
        assert_eq!(
            action,
            Action::ToPeer {
                peer: 7,
                packet: 14..42
            }
        );
        assert_eq!(
            sw.handle_tap_frame(&mut icmp_frame([10, 201, 0, 3]), t0(), &mut [0u8; 64]),
            Action::Resolve {
                target: Ipv4Addr::new(10, 201, 0, 3)
            }
        );
        assert_eq!(
            sw.handle_tap_frame(&mut icmp_frame([10, 201, 255, 255]), t0(), &mut [0u8; 64]),
            Action::Broadcast { packet: 14..42 }
        );
        assert_eq!(
            sw.handle_tap_frame(&mut icmp_frame([224, 0, 0, 251]), t0(), &mut [0u8; 64]),
            Action::Broadcast { packet: 14..42 }
        );
        assert_eq!(
            sw.handle_tap_frame(&mut icmp_frame([8, 8, 8, 8]), t0(), &mut [0u8; 64]),
            Action::Drop(DropReason::OutsideSubnet)
        );
    }

    #[test]
    fn routes_move_with_announcements() {
        let mut sw = switch();
        sw.set_peer_addresses(
            7,
            &[Ipv4Addr::new(10, 201, 0, 3), Ipv4Addr::new(10, 201, 0, 1)],
        );
        assert_eq!(sw.route(Ipv4Addr::new(10, 201, 0, 2)), None);
        assert_eq!(sw.route(Ipv4Addr::new(10, 201, 0, 3)), Some(7));
        assert_eq!(sw.route(Ipv4Addr::new(10, 201, 0, 1)), None, "own address");
        sw.remove_peer(7);
        assert_eq!(sw.route(Ipv4Addr::new(10, 201, 0, 3)), None);
        // The DHT's word routes an address its owner has not announced (yet) ...
        sw.add_route(Ipv4Addr::new(10, 201, 0, 4), 8);
        sw.set_peer_addresses(8, &[]);
        assert_eq!(sw.route(Ipv4Addr::new(10, 201, 0, 4)), Some(8));
        // ... an announcement wins over it, and it goes with the peer.
        sw.set_peer_addresses(9, &[Ipv4Addr::new(10, 201, 0, 4)]);
        assert_eq!(sw.route(Ipv4Addr::new(10, 201, 0, 4)), Some(9));
        sw.remove_peer(9);
        sw.remove_peer(8);
        assert_eq!(sw.route(Ipv4Addr::new(10, 201, 0, 4)), None);
    }

    #[test]
    fn peer_packet_is_framed_in_place() {
        let mut sw = switch();
        let frame = icmp_frame([10, 201, 0, 1]);
        let ip = &frame[14..42];
        let mut buf = [0u8; 128];
        buf[HEADROOM..HEADROOM + ip.len()].copy_from_slice(ip);
        let Action::ToTap { len } = sw.handle_peer_packet(&mut buf, ip.len(), t0()) else {
            panic!("expected delivery")
        };
        assert_eq!(len, 42);
        let eth = EthernetFrame::new_checked(&buf[..len]).unwrap();
        assert_eq!((eth.dst(), eth.src()), (DEVICE_MAC, REMOTE_MAC));
        assert_eq!(eth.ethertype(), ETHERTYPE_IPV4);
        assert_eq!(eth.payload(), ip);
        assert_eq!(sw.counters().to_tap, 1);
    }

    #[test]
    fn peer_packet_for_another_host_is_dropped() {
        let mut sw = switch();
        let frame = icmp_frame([10, 201, 0, 5]);
        let ip = &frame[14..42];
        let mut buf = [0u8; 128];
        buf[HEADROOM..HEADROOM + ip.len()].copy_from_slice(ip);
        assert_eq!(
            sw.handle_peer_packet(&mut buf, ip.len(), t0()),
            Action::Drop(DropReason::NotForUs)
        );
        assert_eq!(
            sw.handle_peer_packet(&mut buf, 4000, t0()),
            Action::Drop(DropReason::Malformed)
        );
    }

    /// Golden test on frames captured from a live TAP: the switch's reply and framing are
    /// byte for byte what the agent put on the device.
    #[test]
    fn captured_frames_are_reproduced_exactly() {
        use crate::captured::{ARP_REPLY, ARP_REQUEST, ECHO_REPLY, ECHO_REQUEST};
        let mut sw: Switch<u32> = Switch::new(Config::interface(
            Ipv4Addr::new(10, 201, 0, 1),
            "10.201.0.0/16".parse().unwrap(),
            [0x02, 0x48, 0xae, 0x81, 0xab, 0x18],
            [0xfe, 0xfd, 0x76, 0xa2, 0x83, 0xb0],
        ));
        sw.set_peer_addresses(3, &[Ipv4Addr::new(10, 201, 0, 2)]);
        let mut reply = [0u8; 64];
        let Action::ToTap { len } =
            sw.handle_tap_frame(&mut ARP_REQUEST.to_vec(), t0(), &mut reply)
        else {
            panic!("no ARP reply")
        };
        assert_eq!(&reply[..len], &ARP_REPLY[..]);
        assert_eq!(
            sw.handle_tap_frame(&mut ECHO_REQUEST.to_vec(), t0(), &mut reply),
            Action::ToPeer {
                peer: 3,
                packet: 14..98
            }
        );
        let mut buf = [0u8; 128];
        buf[HEADROOM..HEADROOM + 84].copy_from_slice(&ECHO_REPLY[14..]);
        let Action::ToTap { len } = sw.handle_peer_packet(&mut buf, 84, t0()) else {
            panic!("not delivered")
        };
        assert_eq!(&buf[..len], &ECHO_REPLY[..]);
    }

    // --- router and hybrid modes, broadcast -------------------------------------------

    const LAN_A: Mac = [0x02, 0, 0, 0, 0, 0xa];
    const LAN_B: Mac = [0x02, 0, 0, 0, 0, 0xb];

    fn with_mode(mode: Mode) -> Switch<u32> {
        let mut config = Config::interface(
            Ipv4Addr::new(10, 201, 0, 1),
            "10.201.0.0/16".parse().unwrap(),
            DEVICE_MAC,
            REMOTE_MAC,
        );
        config.mode = mode;
        config.broadcast_rate = 10;
        if mode == Mode::Router {
            config.address = Ipv4Addr::UNSPECIFIED;
        }
        let mut sw = Switch::new(config);
        sw.set_peer_addresses(7, &[Ipv4Addr::new(10, 201, 0, 2)]);
        sw
    }

    fn arp_from(mac: Mac, ip: [u8; 4], op: u16, target: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&mac);
        f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, op as u8]);
        f.extend_from_slice(&mac);
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&target);
        f
    }

    fn ipv4_from(src_mac: Mac, dst_mac: Mac, src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        let mut f = icmp_frame(dst);
        f[0..6].copy_from_slice(&dst_mac);
        f[6..12].copy_from_slice(&src_mac);
        f[26..30].copy_from_slice(&src);
        f
    }

    fn peer_packet(
        sw: &mut Switch<u32>,
        src: [u8; 4],
        dst: [u8; 4],
        at: Instant,
    ) -> (Action<u32>, Vec<u8>) {
        let frame = ipv4_from(REMOTE_MAC, DEVICE_MAC, src, dst);
        let ip = &frame[14..42];
        let mut buf = [0u8; 128];
        buf[HEADROOM..HEADROOM + ip.len()].copy_from_slice(ip);
        let action = sw.handle_peer_packet(&mut buf, ip.len(), at);
        (action, buf[..42].to_vec())
    }

    #[test]
    fn router_learns_lan_hosts_and_answers_only_for_remote_members() {
        let mut sw = with_mode(Mode::Router);
        let mut reply = [0u8; 64];
        // Host A asks for remote member .2: answered with the remote MAC; A is learned.
        let mut a = arp_from(LAN_A, [10, 201, 0, 10], 1, [10, 201, 0, 2]);
        assert!(matches!(
            sw.handle_tap_frame(&mut a, t0(), &mut reply),
            Action::ToTap { .. }
        ));
        assert_eq!(
            sw.poll_event(),
            Some(Event::LanHostUp(Ipv4Addr::new(10, 201, 0, 10)))
        );
        // Host B asks for A: A is on the LAN, so the switch stays silent (rule b).
        let mut b = arp_from(LAN_B, [10, 201, 0, 11], 1, [10, 201, 0, 10]);
        assert_eq!(
            sw.handle_tap_frame(&mut b, t0(), &mut reply),
            Action::Drop(DropReason::LanLocal)
        );
        assert_eq!(
            sw.poll_event(),
            Some(Event::LanHostUp(Ipv4Addr::new(10, 201, 0, 11)))
        );
        assert_eq!(sw.poll_event(), None);
        // LAN unicast flooded to the TAP is the bridge's business.
        let mut lan = ipv4_from(LAN_A, LAN_B, [10, 201, 0, 10], [10, 201, 0, 11]);
        assert_eq!(
            sw.handle_tap_frame(&mut lan, t0(), &mut reply),
            Action::Drop(DropReason::LanLocal)
        );
        // To the remote MAC: carried to the member.
        let mut out = ipv4_from(LAN_A, REMOTE_MAC, [10, 201, 0, 10], [10, 201, 0, 2]);
        assert!(matches!(
            sw.handle_tap_frame(&mut out, t0(), &mut reply),
            Action::ToPeer { peer: 7, .. }
        ));
        // From a member to A: framed to A's MAC.
        let (action, frame) = peer_packet(&mut sw, [10, 201, 0, 2], [10, 201, 0, 10], t0());
        assert_eq!(action, Action::ToTap { len: 42 });
        assert_eq!(&frame[0..6], &LAN_A);
        assert_eq!(&frame[6..12], &REMOTE_MAC);
        // To a LAN address never seen: dropped, and the LAN is asked once.
        let (action, _) = peer_packet(&mut sw, [10, 201, 0, 2], [10, 201, 0, 12], t0());
        assert_eq!(action, Action::Drop(DropReason::NotForUs));
        let _ = peer_packet(&mut sw, [10, 201, 0, 2], [10, 201, 0, 12], t0());
        let mut buf = [0u8; 64];
        let len = sw.poll_transmit(&mut buf).unwrap();
        let arp = ArpPacket::new_checked(&buf[14..len]).unwrap();
        assert_eq!(
            (arp.operation(), arp.target_ip()),
            (ARP_REQUEST, Ipv4Addr::new(10, 201, 0, 12))
        );
        assert_eq!(
            arp.sender_ip(),
            Ipv4Addr::UNSPECIFIED,
            "a probe: no host caches it"
        );
        assert_eq!(sw.poll_transmit(&mut buf), None);
    }

    #[test]
    fn router_probes_a_silent_host_then_forgets_it() {
        let mut sw = with_mode(Mode::Router);
        let mut a = arp_from(LAN_A, [10, 201, 0, 10], 1, [10, 201, 0, 2]);
        let _ = sw.handle_tap_frame(&mut a, t0(), &mut [0u8; 64]);
        let _ = sw.poll_event();
        let timeout = sw.config().lan_timeout;
        let mut buf = [0u8; 64];
        let mut t = t0() + timeout;
        for _ in 0..LAN_PROBES {
            assert!(sw.poll_timeout().is_some_and(|d| d <= t));
            sw.handle_timeout(t);
            assert!(sw.poll_transmit(&mut buf).is_some(), "probe");
            assert_eq!(sw.poll_event(), None);
            t += Duration::from_secs(1);
        }
        sw.handle_timeout(t);
        assert_eq!(
            sw.poll_event(),
            Some(Event::LanHostDown(Ipv4Addr::new(10, 201, 0, 10)))
        );
        assert!(sw.lan_hosts().is_empty());
        // A host that answers a probe stays.
        let _ = sw.handle_tap_frame(&mut a, t, &mut [0u8; 64]);
        let _ = sw.poll_event();
        sw.handle_timeout(t + timeout);
        let mut reply = arp_from(LAN_A, [10, 201, 0, 10], 2, [0, 0, 0, 0]);
        let _ = sw.handle_tap_frame(&mut reply, t + timeout, &mut [0u8; 64]);
        sw.handle_timeout(t + timeout + Duration::from_secs(5));
        assert_eq!(sw.lan_hosts(), vec![Ipv4Addr::new(10, 201, 0, 10)]);
    }

    #[test]
    fn a_watched_host_is_reported_on_its_next_frame_only() {
        let mut sw = with_mode(Mode::Router);
        let host = Ipv4Addr::new(10, 201, 0, 10);
        let mut a = arp_from(LAN_A, [10, 201, 0, 10], 1, [10, 201, 0, 2]);
        let _ = sw.handle_tap_frame(&mut a, t0(), &mut [0u8; 64]);
        assert_eq!(sw.poll_event(), Some(Event::LanHostUp(host)));
        assert_eq!(sw.lan_host_mac(host), Some(LAN_A));
        assert_eq!(sw.lan_host_with_mac(LAN_A), Some(host));
        sw.probe_lan_host(host);
        let mut buf = [0u8; 64];
        assert!(sw.poll_transmit(&mut buf).is_some(), "the probe goes out");
        assert_eq!(sw.poll_event(), None, "nothing heard yet");
        let mut reply = arp_from(LAN_A, [10, 201, 0, 10], 2, [0, 0, 0, 0]);
        let _ = sw.handle_tap_frame(&mut reply, t0(), &mut [0u8; 64]);
        assert_eq!(
            sw.poll_event(),
            Some(Event::LanHostHeard {
                address: host,
                mac: LAN_A
            })
        );
        let _ = sw.handle_tap_frame(&mut reply, t0(), &mut [0u8; 64]);
        assert_eq!(sw.poll_event(), None, "reported once per probe");
        // Handed off: forgotten, and no longer watched.
        sw.probe_lan_host(host);
        sw.forget_lan_host(host);
        assert_eq!(sw.lan_host_mac(host), None);
        let _ = sw.handle_tap_frame(&mut reply, t0(), &mut [0u8; 64]);
        assert_eq!(sw.poll_event(), Some(Event::LanHostUp(host)));
        assert_eq!(sw.poll_event(), None);
    }

    #[test]
    fn a_moved_route_wins_over_announcements_and_resolutions() {
        let mut sw = with_mode(Mode::Router);
        let a = Ipv4Addr::new(10, 201, 0, 10);
        sw.set_peer_addresses(1, &[a]);
        sw.add_route(a, 1);
        sw.move_route(a, Some(2));
        assert_eq!(sw.route(a), Some(2));
        // The old owner's announcement without it leaves the new route alone.
        sw.set_peer_addresses(1, &[]);
        assert_eq!(sw.route(a), Some(2));
        sw.move_route(a, None);
        assert_eq!(sw.route(a), None);
    }

    #[test]
    fn hybrid_handles_only_its_device_and_probes_the_lan_first() {
        let mut sw = with_mode(Mode::Hybrid);
        let mut reply = [0u8; 64];
        let mut buf = [0u8; 64];
        // Another hybrid agent on this LAN writes a remote member's packet for its own
        // host, flooded here: that address is not on the LAN.
        let mut flooded = ipv4_from(
            [0xfe, 0xfd, 9, 9, 9, 9],
            LAN_B,
            [10, 201, 0, 2],
            [10, 201, 0, 11],
        );
        assert_eq!(
            sw.handle_tap_frame(&mut flooded, t0(), &mut reply),
            Action::Drop(DropReason::OtherHost)
        );
        assert!(
            sw.lan_hosts().is_empty(),
            "learned a remote member as local"
        );
        // Another LAN host's frames are not ours (but are learned).
        let mut other = arp_from(LAN_B, [10, 201, 0, 11], 1, [10, 201, 0, 2]);
        assert_eq!(
            sw.handle_tap_frame(&mut other, t0(), &mut reply),
            Action::Drop(DropReason::OtherHost)
        );
        assert_eq!(sw.poll_event(), None, "hybrid claims nothing for the LAN");
        // The host asks for remote .2: the LAN is probed first.
        let mut ask = arp_from(DEVICE_MAC, [10, 201, 0, 1], 1, [10, 201, 0, 2]);
        assert_eq!(
            sw.handle_tap_frame(&mut ask, t0(), &mut reply),
            Action::Drop(DropReason::ArpProbing)
        );
        assert_eq!(
            sw.handle_tap_frame(&mut ask, t0(), &mut reply),
            Action::Drop(DropReason::ArpProbing)
        );
        let len = sw.poll_transmit(&mut buf).unwrap();
        assert_eq!(&buf[0..6], &BROADCAST_MAC);
        assert_eq!(
            ArpPacket::new_checked(&buf[14..len]).unwrap().target_ip(),
            Ipv4Addr::new(10, 201, 0, 2)
        );
        assert_eq!(sw.poll_transmit(&mut buf), None, "one probe per address");
        // Nothing local answers: at the timeout the host gets its reply.
        let timeout = sw.config().probe_timeout;
        sw.handle_timeout(t0() + timeout / 2);
        assert_eq!(sw.poll_transmit(&mut buf), None);
        sw.handle_timeout(t0() + timeout);
        let len = sw.poll_transmit(&mut buf).unwrap();
        let arp = ArpPacket::new_checked(&buf[14..len]).unwrap();
        assert_eq!((arp.operation(), arp.sender_mac()), (ARP_REPLY, REMOTE_MAC));
        assert_eq!(&buf[0..6], &DEVICE_MAC);
        // Now confirmed remote: answered at once.
        assert!(matches!(
            sw.handle_tap_frame(&mut ask, t0() + timeout, &mut reply),
            Action::ToTap { .. }
        ));

        // .3 is remote in the DHT but a LAN host answers the probe: never answered.
        sw.set_peer_addresses(
            7,
            &[Ipv4Addr::new(10, 201, 0, 2), Ipv4Addr::new(10, 201, 0, 3)],
        );
        let mut ask3 = arp_from(DEVICE_MAC, [10, 201, 0, 1], 1, [10, 201, 0, 3]);
        assert_eq!(
            sw.handle_tap_frame(&mut ask3, t0(), &mut reply),
            Action::Drop(DropReason::ArpProbing)
        );
        let mut local = arp_from(LAN_A, [10, 201, 0, 3], 2, [0, 0, 0, 0]);
        let _ = sw.handle_tap_frame(&mut local, t0(), &mut reply);
        sw.handle_timeout(t0() + timeout);
        while sw.poll_transmit(&mut buf).is_some() {
            assert_ne!(
                ArpPacket::new_checked(&buf[14..42]).unwrap().sender_ip(),
                Ipv4Addr::new(10, 201, 0, 3)
            );
        }
        assert_eq!(
            sw.handle_tap_frame(&mut ask3, t0() + timeout, &mut reply),
            Action::Drop(DropReason::LanLocal)
        );
        // Frames for the host come framed to its device.
        let (action, frame) = peer_packet(&mut sw, [10, 201, 0, 2], [10, 201, 0, 1], t0());
        assert_eq!(action, Action::ToTap { len: 42 });
        assert_eq!(&frame[0..6], &DEVICE_MAC);
    }

    #[test]
    fn broadcast_goes_to_members_within_the_rate_and_is_filtered_on_arrival() {
        let mut sw = with_mode(Mode::Router);
        let mut reply = [0u8; 64];
        let mut bcast = ipv4_from(LAN_A, BROADCAST_MAC, [10, 201, 0, 10], [10, 201, 255, 255]);
        // The bucket holds 10: the 11th in the same instant is dropped, and it refills.
        for _ in 0..10 {
            assert_eq!(
                sw.handle_tap_frame(&mut bcast, t0(), &mut reply),
                Action::Broadcast { packet: 14..42 }
            );
        }
        assert_eq!(
            sw.handle_tap_frame(&mut bcast, t0(), &mut reply),
            Action::Drop(DropReason::BroadcastRateLimited)
        );
        let later = t0() + Duration::from_millis(200);
        assert!(matches!(
            sw.handle_tap_frame(&mut bcast, later, &mut reply),
            Action::Broadcast { .. }
        ));
        assert_eq!(sw.counters().broadcasts_out, 11);
        assert_eq!(sw.counters().drops(DropReason::BroadcastRateLimited), 1);
        // A spoofed source outside the namespace is not carried.
        let mut spoofed = ipv4_from(LAN_B, BROADCAST_MAC, [192, 168, 0, 9], [255, 255, 255, 255]);
        assert_eq!(
            sw.handle_tap_frame(&mut spoofed, later, &mut reply),
            Action::Drop(DropReason::OutsideSubnet)
        );
        // From a member: the whole LAN hears it (multicast to its group MAC) ...
        let (action, frame) = peer_packet(&mut sw, [10, 201, 0, 2], [255, 255, 255, 255], later);
        assert_eq!(action, Action::ToTap { len: 42 });
        assert_eq!(&frame[0..6], &BROADCAST_MAC);
        let (_, frame) = peer_packet(&mut sw, [10, 201, 0, 2], [239, 129, 2, 3], later);
        assert_eq!(&frame[0..6], &[0x01, 0x00, 0x5e, 0x01, 2, 3]);
        // ... unless its source is on this LAN (the LAN already delivered it).
        let (action, _) = peer_packet(&mut sw, [10, 201, 0, 10], [10, 201, 255, 255], later);
        assert_eq!(action, Action::Drop(DropReason::BroadcastFromLan));
        assert_eq!(sw.counters().broadcasts_in, 2);
        // An interface host gets broadcasts addressed to its device only.
        let mut host = with_mode(Mode::Interface);
        let (_, frame) = peer_packet(&mut host, [10, 201, 0, 2], [10, 201, 255, 255], later);
        assert_eq!(&frame[0..6], &DEVICE_MAC);
        // Broadcast off: nothing either way.
        let mut off = with_mode(Mode::Interface);
        off.config.broadcast_rate = 0;
        let (action, _) = peer_packet(&mut off, [10, 201, 0, 2], [10, 201, 255, 255], later);
        assert_eq!(action, Action::Drop(DropReason::BroadcastRateLimited));
    }

    #[test]
    fn dns_and_other_packets_to_the_service_address_go_to_the_agent() {
        for mode in [Mode::Interface, Mode::Router, Mode::Hybrid] {
            let mut sw = with_mode(mode);
            sw.config.address = Ipv4Addr::new(10, 201, 0, 9);
            let service = Ipv4Addr::new(10, 201, 0, 1);
            let host = Ipv4Addr::new(10, 201, 0, 9);
            let mut f = [0u8; 128];
            let len = emit_udp(
                &mut f,
                (REMOTE_MAC, DEVICE_MAC),
                (host, service),
                (5353, 53),
                b"query",
            )
            .unwrap();
            let mut reply = [0u8; 64];
            let Action::Dns { payload, client } =
                sw.handle_tap_frame(&mut f[..len], t0(), &mut reply)
            else {
                panic!("{mode:?}: not intercepted")
            };
            assert_eq!(&f[payload], b"query");
            assert_eq!(
                client,
                Client {
                    mac: DEVICE_MAC,
                    ip: host,
                    port: 5353
                }
            );
            // The answer goes back from the service address, port 53, to the asker.
            let mut buf = [0u8; 128];
            let n = sw.emit_dns_reply(&mut buf, client, b"answer").unwrap();
            let eth = EthernetFrame::new_checked(&buf[..n]).unwrap();
            assert_eq!((eth.dst(), eth.src()), (DEVICE_MAC, REMOTE_MAC));
            let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
            assert_eq!((ip.src(), ip.dst()), (service, host));
            let (sport, dport, body) = udp_parts(ip.payload()).unwrap();
            assert_eq!(
                (sport, dport, &ip.payload()[body]),
                (53, 5353, &b"answer"[..])
            );
            // Another port or protocol (here UDP 54): the service stack's.
            let len = emit_udp(
                &mut f,
                (REMOTE_MAC, DEVICE_MAC),
                (host, service),
                (5353, 54),
                b"x",
            )
            .unwrap();
            let Action::Service { packet, mac } =
                sw.handle_tap_frame(&mut f[..len], t0(), &mut reply)
            else {
                panic!("{mode:?}: not for the service stack")
            };
            assert_eq!((packet, mac), (ETH_HEADER_LEN..len, DEVICE_MAC));
            let n = sw
                .emit_service_packet(&mut buf, DEVICE_MAC, &f[ETH_HEADER_LEN..len])
                .unwrap();
            assert_eq!(&buf[ETH_HEADER_LEN..n], &f[ETH_HEADER_LEN..len]);
            // From outside the subnet: dropped.
            let len = emit_udp(
                &mut f,
                (REMOTE_MAC, DEVICE_MAC),
                (Ipv4Addr::new(192, 0, 2, 1), service),
                (5353, 53),
                b"q",
            )
            .unwrap();
            assert_eq!(
                sw.handle_tap_frame(&mut f[..len], t0(), &mut reply),
                Action::Drop(DropReason::OutsideSubnet)
            );
            assert_eq!(
                (sw.counters().dns_queries, sw.counters().service_packets),
                (1, 1)
            );
            // ARP for the service address is answered in every mode, DHCP on or off.
            let mut ask = arp_from(DEVICE_MAC, [10, 201, 0, 9], 1, [10, 201, 0, 1]);
            assert!(
                matches!(
                    sw.handle_tap_frame(&mut ask, t0(), &mut reply),
                    Action::ToTap { .. }
                ),
                "{mode:?}"
            );
        }
        // Router: a LAN host's unicast to someone else's MAC is the bridge's business.
        let mut sw = with_mode(Mode::Router);
        let mut f = [0u8; 128];
        let len = emit_udp(
            &mut f,
            (LAN_B, LAN_A),
            (Ipv4Addr::new(10, 201, 0, 10), Ipv4Addr::new(10, 201, 0, 1)),
            (5353, 53),
            b"q",
        )
        .unwrap();
        assert_eq!(
            sw.handle_tap_frame(&mut f[..len], t0(), &mut [0u8; 64]),
            Action::Drop(DropReason::LanLocal)
        );
    }

    #[test]
    fn dhcp_is_intercepted_and_the_service_address_answered() {
        let mut sw = with_mode(Mode::Hybrid);
        sw.config.dhcp = true;
        sw.config.address = Ipv4Addr::UNSPECIFIED; // a DHCP host before its lease
                                                   // A DISCOVER as the kernel sends it: 0.0.0.0:68 -> 255.255.255.255:67.
        let mut f = BROADCAST_MAC.to_vec();
        f.extend_from_slice(&DEVICE_MAC);
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 33, 0, 0, 0x40, 0, 64, 17, 0, 0]);
        f.extend_from_slice(&[0, 0, 0, 0, 255, 255, 255, 255]);
        f.extend_from_slice(&[0, 68, 0, 67, 0, 13, 0, 0, b'd', b'h', b'c', b'p', b'!']);
        let mut reply = [0u8; 64];
        let Action::Dhcp { payload, mac } = sw.handle_tap_frame(&mut f, t0(), &mut reply) else {
            panic!("not intercepted")
        };
        assert_eq!((&f[payload], mac), (&b"dhcp!"[..], DEVICE_MAC));
        assert_eq!(sw.counters().dhcp_requests, 1);
        // Not from this host's device (hybrid): not ours to answer.
        f[6..12].copy_from_slice(&LAN_B);
        assert_eq!(
            sw.handle_tap_frame(&mut f, t0(), &mut reply),
            Action::Drop(DropReason::OtherHost)
        );
        // ARP for the service address: answered at once, no LAN probe.
        let mut ask = arp_from(DEVICE_MAC, [10, 201, 0, 9], 1, [10, 201, 0, 1]);
        assert!(matches!(
            sw.handle_tap_frame(&mut ask, t0(), &mut reply),
            Action::ToTap { .. }
        ));
        // The reply leaves from the service address and the remote MAC.
        let mut buf = [0u8; 128];
        let len = sw
            .emit_dhcp_reply(
                &mut buf,
                DEVICE_MAC,
                Ipv4Addr::new(10, 201, 0, 9),
                68,
                b"offer",
            )
            .unwrap();
        let eth = EthernetFrame::new_checked(&buf[..len]).unwrap();
        assert_eq!((eth.dst(), eth.src()), (DEVICE_MAC, REMOTE_MAC));
        let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
        assert_eq!(
            (ip.src(), ip.dst()),
            (Ipv4Addr::new(10, 201, 0, 1), Ipv4Addr::new(10, 201, 0, 9))
        );
        assert_eq!(
            udp_parts(ip.payload()).map(|(s, d, p)| (s, d, &ip.payload()[p])),
            Some((67, 68, &b"offer"[..]))
        );
        // With DHCP off, the same request is just a broadcast.
        let mut off = with_mode(Mode::Interface);
        f[6..12].copy_from_slice(&DEVICE_MAC);
        assert!(matches!(
            off.handle_tap_frame(&mut f, t0(), &mut reply),
            Action::Drop(_) | Action::Broadcast { .. }
        ));
    }

    /// RFC 2131 4.1: a relay agent on a router's LAN unicasts what it relays to the service
    /// address, from port 67; it reaches the DHCP server with the relay's MAC, and the
    /// reply goes back to it, to port 67.
    #[test]
    fn relayed_dhcp_is_intercepted_with_the_relays_mac() {
        let mut sw = with_mode(Mode::Router);
        sw.config.dhcp = true;
        let relay = Ipv4Addr::new(10, 201, 0, 2);
        let mut f = [0u8; 128];
        let len = emit_udp(
            &mut f,
            (REMOTE_MAC, LAN_A),
            (relay, Ipv4Addr::new(10, 201, 0, 1)),
            (67, 67),
            b"relayed",
        )
        .unwrap();
        let Action::Dhcp { payload, mac } =
            sw.handle_tap_frame(&mut f[..len], t0(), &mut [0u8; 64])
        else {
            panic!("not intercepted")
        };
        assert_eq!((&f[payload], mac), (&b"relayed"[..], LAN_A));
        let mut buf = [0u8; 128];
        let giaddr = Ipv4Addr::new(10, 201, 50, 1);
        let len = sw
            .emit_dhcp_reply(&mut buf, LAN_A, giaddr, 67, b"offer")
            .unwrap();
        let eth = EthernetFrame::new_checked(&buf[..len]).unwrap();
        assert_eq!((eth.dst(), eth.src()), (LAN_A, REMOTE_MAC));
        let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
        assert_eq!(ip.dst(), giaddr);
        assert_eq!(
            udp_parts(ip.payload()).map(|(s, d, _)| (s, d)),
            Some((67, 67))
        );
    }

    /// Every prefix and every single-byte corruption of real frames is handled without panic.
    #[test]
    fn hostile_frames_never_panic() {
        for mode in [Mode::Interface, Mode::Router, Mode::Hybrid] {
            hostile_frames_in(mode);
        }
    }

    fn hostile_frames_in(mode: Mode) {
        let mut sw = with_mode(mode);
        sw.config.dhcp = true;
        let mut reply = [0u8; 64];
        let mut buf = [0u8; 256];
        for mut frame in [
            arp_request([10, 201, 0, 2]),
            icmp_frame([10, 201, 0, 2]),
            crate::captured::ECHO_REQUEST.to_vec(),
        ] {
            for n in 0..=frame.len() {
                let _ = sw.handle_tap_frame(&mut frame[..n], t0(), &mut reply);
                let m = n.min(buf.len() - HEADROOM);
                buf[HEADROOM..HEADROOM + m].copy_from_slice(&frame[..m]);
                let _ = sw.handle_peer_packet(&mut buf, n, t0());
            }
            for i in 0..frame.len() {
                for v in [0u8, 0x0f, 0x45, 0xff] {
                    let mut f = frame.clone();
                    f[i] = v;
                    let _ = sw.handle_tap_frame(&mut f, t0(), &mut reply);
                }
            }
        }
        assert!(sw.counters().drops(DropReason::Malformed) > 0);
    }
}
