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
//! Multi-subnet namespaces (Diverter): a namespace may have several subnets; the switch's
//! device or LAN sits in one ([`Config::subnet`]) and the switch is the router to the
//! others ([`Config::routed`]) in one hop. Hosts send to the gateway (their subnet's
//! service address, answered by ARP like the service itself); the switch lowers the TTL
//! (answering ICMP "time exceeded" from the gateway when it runs out, as a router would),
//! and sends the packet straight to the member holding the destination, which frames it
//! for its own device or LAN. Broadcast and multicast never leave their subnet: a
//! directed broadcast to another subnet is not forwarded, and one that arrives from a
//! member of another subnet is dropped (both counted as [`DropReason::OtherSubnet`]).
//!
//! VEPA ports (router mode, [`LanPorts::Vepa`]): the LAN bridge isolates its hosts' ports,
//! so a frame between two LAN hosts reaches the switch (the router MAC answers ARP for
//! them), which drops it if its sender uses a MAC or address it was not learned or leased
//! with ([`DropReason::Spoofed`]), and else reflects it to the destination host
//! ([`Action::Hairpin`]) after the agent's policy passed it; a LAN host's broadcast is
//! copied to every other LAN host ([`Switch::lan_copies`]), never back to its sender.
//!
//! Packets larger than the tunnel (`tunnel_mtu`, from a LAN at a larger MTU): a TCP SYN's
//! MSS is clamped in place (both directions), a DF packet is answered with ICMP
//! "fragmentation needed" ([`Action::ToTap`]), any other becomes [`Action::Fragment`]; see
//! [`mtu`].

#![forbid(unsafe_code)]

pub mod icmp6;
pub mod layer2;
pub mod mtu;
pub mod ndp;
pub mod offload;
pub mod policy;
pub mod qos;
pub mod ra;
pub mod udp;
pub mod wire;

mod action;
mod switch;

#[cfg(test)]
mod captured;

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ipnet::{Ipv4Net, Ipv6Net};

pub use action::{Action, Client, Counters, DropReason, Event, PortCounts};
pub use switch::Switch;
pub use wire::Mac;
use wire::ETH_HEADER_LEN;

/// Bytes the caller must leave in front of a packet handed to
/// [`Switch::handle_peer_packet`], so the Ethernet header is written in place.
pub const HEADROOM: usize = ETH_HEADER_LEN;

/// Smallest reply buffer [`Switch::handle_tap_frame`] and [`Switch::poll_transmit`] may be
/// given: room for an ICMP "fragmentation needed" quoting the largest IPv4 header and for
/// a router advertisement (an ARP reply or a neighbour advertisement is shorter).
pub const MIN_REPLY_BUF: usize = if mtu::FRAG_NEEDED_MAX_LEN > ra::ADVERTISEMENT_MAX_LEN {
    mtu::FRAG_NEEDED_MAX_LEN
} else {
    ra::ADVERTISEMENT_MAX_LEN
};

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

/// ICMP "host unreachable" a second the switch sends about routed destinations nobody
/// holds (also the burst), as a router limits its ICMP errors (RFC 1812 4.3.2.8).
pub const UNREACHABLE_RATE: u32 = 10;

/// The first two bytes of every agent's remote MAC (IPOP 4.1).
pub const REMOTE_MAC_PREFIX: [u8; 2] = [0xfe, 0xfd];

/// A namespace's service address, where its virtual DHCP (and DNS) server answers: the
/// lowest usable address of the subnet, as in IPOP.
pub fn service_address(subnet: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(subnet.network()).saturating_add(1))
}

/// A dual-stack namespace's IPv6 service address (its virtual DNS server's): the prefix
/// with interface identifier 1, as [`service_address`] is the subnet's first.
pub fn service_address6(prefix: Ipv6Net) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(prefix.network()) | 1)
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

/// How a router-mode LAN's hosts reach each other (IEEE 802.1Qbg's two port modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LanPorts {
    /// Virtual Ethernet Bridge: the LAN bridge switches frames between its hosts itself;
    /// the switch sees only what leaves the LAN.
    #[default]
    Veb,
    /// Virtual Ethernet Port Aggregator: the bridge isolates its ports, so a LAN host
    /// reaches another only through the switch (proxy ARP with the router MAC), which
    /// checks the sender against the MAC and address it was learned or leased with (or the
    /// static table), and reflects the frame back to the LAN ("hairpin"). Broadcast and
    /// multicast from a LAN host are copied to the other LAN hosts, never to the sender.
    Vepa,
}

/// Settings of one namespace's switch.
#[derive(Debug, Clone)]
pub struct Config {
    /// How the switch is attached.
    pub mode: Mode,
    /// The host's own virtual address, carried by its device (unspecified in router mode).
    pub address: Ipv4Addr,
    /// The subnet the host's device (or the LAN) sits in.
    pub subnet: Ipv4Net,
    /// The namespace's other subnets (a multi-subnet namespace): this switch is their
    /// router in one hop (Diverter). A packet from the device for one of them (sent to the
    /// gateway, the [`service_address`] of `subnet`) has its TTL lowered once and goes
    /// straight to the member holding its destination; broadcast stays in its subnet.
    pub routed: Vec<Ipv4Net>,
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
    /// Router mode: how the LAN's hosts reach each other.
    pub lan_ports: LanPorts,
    /// Router mode with [`LanPorts::Vepa`]: if not empty, the only address and MAC pairs
    /// LAN hosts may send from (the VEPA paper's static address table); frames from any
    /// other pair are dropped as spoofed.
    pub lan_table: Vec<(Ipv4Addr, Mac)>,
    /// A dual-stack namespace's IPv6 prefix (`None`: IPv4 only, IPv6 frames are dropped).
    pub prefix6: Option<Ipv6Net>,
    /// The host's own IPv6 address in it, once held (interface mode).
    pub address6: Option<Ipv6Addr>,
}

impl Config {
    /// Whether `addr` is in one of the namespace's subnets (this switch's or a routed one).
    pub fn in_namespace(&self, addr: Ipv4Addr) -> bool {
        self.subnet.contains(&addr) || self.routed_subnet(addr).is_some()
    }

    /// The routed subnet (another subnet of the namespace) `addr` is in, if any.
    pub fn routed_subnet(&self, addr: Ipv4Addr) -> Option<Ipv4Net> {
        self.routed.iter().find(|n| n.contains(&addr)).copied()
    }

    /// Interface-mode settings with the default timers and broadcast rate.
    pub fn interface(address: Ipv4Addr, subnet: Ipv4Net, device_mac: Mac, remote_mac: Mac) -> Self {
        Self {
            mode: Mode::Interface,
            address,
            subnet,
            routed: Vec::new(),
            device_mac,
            remote_mac,
            probe_timeout: Duration::from_secs(2),
            lan_timeout: Duration::from_secs(30),
            broadcast_rate: 200,
            dhcp: false,
            tunnel_mtu: DEFAULT_TUNNEL_MTU,
            lan_ports: LanPorts::Veb,
            lan_table: Vec::new(),
            prefix6: None,
            address6: None,
        }
    }
}
