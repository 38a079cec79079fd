//! What the switch answers and reports: an [`Action`] for each frame or packet, the
//! [`Event`]s it learns on the LAN, and the [`Counters`] of what it did, each drop under its
//! [`DropReason`].

use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::Range;

use crate::wire::Mac;

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
    ///
    /// [`mtu::Fragments`]: crate::mtu::Fragments
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
    /// A DHCPv6 message from a LAN host (UDP to all DHCPv6 servers, port 547), for the
    /// agent's virtual DHCPv6 server.
    Dhcp6 {
        /// Where the message (the UDP payload) lies in the frame.
        payload: Range<usize>,
        /// Its sender: MAC, link-local address and port.
        client: Client,
    },
    /// A DNS query over UDP to the service address, for the agent's virtual DNS server.
    Dns {
        /// Where the query (the UDP payload) lies in the frame.
        payload: Range<usize>,
        /// Who asked: where the answer goes ([`Switch::emit_dns_reply`]).
        ///
        /// [`Switch::emit_dns_reply`]: crate::Switch::emit_dns_reply
        client: Client,
    },
    /// Any other IPv4 packet to the service address (DNS over TCP, ping): for the agent's
    /// service stack, whose packets go back with [`Switch::emit_service_packet`].
    ///
    /// [`Switch::emit_service_packet`]: crate::Switch::emit_service_packet
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
    /// VEPA: a frame from one LAN host to another, its MACs rewritten in place (from the
    /// router MAC, to the destination host's): once the policy passes the IPv4 packet at
    /// `packet`, write the frame (`..packet.end`) back to the TAP.
    Hairpin {
        /// Where the IPv4 packet lies in the frame.
        packet: Range<usize>,
    },
    /// No member is known to own `target`, a namespace address: the frame (an ARP request
    /// or neighbour solicitation, or an IP packet) should wait while the overlay resolves it, and go through the
    /// switch again once a member announces the address.
    Resolve {
        /// The address to resolve (IPv6 in a dual-stack namespace).
        target: IpAddr,
    },
    /// Drop it, counted under the reason.
    Drop(DropReason),
}

/// The sender of a UDP datagram to the service address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    /// Its MAC.
    pub mac: Mac,
    /// Its address (IPv6 for a query to the prefix's service address).
    pub ip: IpAddr,
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
    /// Router mode, dual stack: an IPv6 address of the prefix appeared on the LAN (the
    /// agent claims it).
    LanHost6Up(Ipv6Addr),
    /// Router mode: the LAN host at this IPv6 address stopped answering.
    LanHost6Down(Ipv6Addr),
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
    /// Router mode, dual stack: a LAN host announced its IPv6 address: an unsolicited
    /// neighbour advertisement (`dad: false`; what a guest sends after a live migration),
    /// or a duplicate address probe for an address another member holds (`dad: true`;
    /// the host may have moved here, and [`Switch::defend6`] answers the probe if the
    /// holder's host is still at its site).
    ///
    /// [`Switch::defend6`]: crate::Switch::defend6
    Announced6 {
        /// The announced address.
        address: Ipv6Addr,
        /// The host's MAC.
        mac: Mac,
        /// Whether it was a duplicate address probe.
        dad: bool,
    },
    /// Router mode: a host [`Switch::probe_lan_host`] asked about sent a frame (an answer
    /// to the probe, or anything else): it is on this LAN.
    ///
    /// [`Switch::probe_lan_host`]: crate::Switch::probe_lan_host
    LanHostHeard {
        /// Its address (IPv4, or IPv6 after a neighbour solicitation).
        address: IpAddr,
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
    /// Multi-subnet namespace: a broadcast or multicast of another subnet (not forwarded
    /// there from this one, nor taken here from a member of another).
    OtherSubnet,
    /// Routed to another subnet with a TTL of 1 or less: answered with ICMP "time
    /// exceeded" when it may be.
    TtlExceeded,
    /// VEPA: a LAN host sent from a MAC or address it was not learned or leased with (or
    /// that the static table does not list), or from the gateway's address.
    Spoofed,
    /// IPv6 that stays on its link: to or from a link-local address, or to a link-scoped
    /// multicast group (MLD, router solicitations). It never crosses the overlay.
    LinkLocal,
    /// An IPv6 neighbour solicitation the switch does not answer (for the host's own
    /// address, outside the prefix, or a duplicate address probe).
    NdIgnored,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 18] = [
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
        DropReason::OtherSubnet,
        DropReason::TtlExceeded,
        DropReason::Spoofed,
        DropReason::LinkLocal,
        DropReason::NdIgnored,
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
            DropReason::OtherSubnet => "other_subnet",
            DropReason::TtlExceeded => "ttl_exceeded",
            DropReason::Spoofed => "spoofed",
            DropReason::LinkLocal => "link_local",
            DropReason::NdIgnored => "nd_ignored",
        }
    }

    pub(crate) fn index(self) -> usize {
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
    /// Proxy neighbour advertisements (IPv6) written to the TAP.
    pub nd_replies: u64,
    /// ICMPv6 "packet too big" answers to the host for IPv6 packets larger than the tunnel.
    pub packet_too_big: u64,
    /// Router mode: neighbour solicitations the switch sent on the LAN (for a host a member
    /// sends to, or one fallen silent).
    pub nd_probes: u64,
    /// Router mode: duplicate address probes for addresses other members hold, defended.
    pub dad_defended: u64,
    /// Router mode: router advertisements of the prefix written to the LAN.
    pub router_advertisements: u64,
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
    /// Packets routed to another subnet of the namespace (TTL lowered, sent to its holder).
    pub routed: u64,
    /// ICMP "time exceeded" sent back for packets routed with no TTL left.
    pub ttl_exceeded: u64,
    /// ICMP "host unreachable" sent back for packets to another subnet's address nobody
    /// holds.
    pub unreachable: u64,
    /// VEPA: frames between two LAN hosts reflected back to the LAN.
    pub hairpinned: u64,
    /// VEPA: copies of LAN hosts' broadcasts written for the other LAN hosts.
    pub lan_copies: u64,
    pub(crate) drops: [u64; DropReason::ALL.len()],
}

impl Counters {
    /// How many frames were dropped for `reason`.
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason.index()]
    }
}

/// VEPA: what the switch did with one LAN host's frames, by its MAC (its bridge port).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortCounts {
    /// Frames from it reflected to another LAN host.
    pub hairpinned: u64,
    /// Frames from it dropped as spoofed.
    pub spoofed: u64,
}
