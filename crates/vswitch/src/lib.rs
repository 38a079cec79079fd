//! The virtual switch of one namespace: pure frame logic, no I/O.
//!
//! A [`Switch`] sits between the namespace's TAP device and the overlay. It is fed frames that
//! the kernel wrote to the TAP ([`Switch::handle_tap_frame`]) and IPv4 packets that arrived
//! from members ([`Switch::handle_peer_packet`]), and answers with an [`Action`]: send to a
//! member, write to the TAP, or drop with a counted [`DropReason`]. It owns no socket, no
//! device and no clock, allocates nothing per frame, and never panics on any input.
//!
//! Interface mode (IPOP Fig. 2, Sec. 4.1): the TAP carries the host's own virtual address;
//! every remote member's address is answered by proxy ARP with one locally generated MAC
//! (`FE:FD` plus four random bytes, chosen by the agent), so the host's kernel sends all
//! overlay traffic to that MAC and the switch forwards it by destination IP.

pub mod wire;

#[cfg(test)]
mod captured;

use std::collections::HashMap;
use std::hash::Hash;
use std::net::Ipv4Addr;
use std::ops::Range;

use ipnet::Ipv4Net;

pub use wire::Mac;
use wire::{
    emit_arp_reply, emit_ethernet_header, ArpPacket, EthernetFrame, Ipv4Packet, ARP_LEN,
    ARP_REQUEST, ETHERTYPE_ARP, ETHERTYPE_IPV4, ETH_HEADER_LEN,
};

/// Bytes the caller must leave in front of a packet handed to
/// [`Switch::handle_peer_packet`], so the Ethernet header is written in place.
pub const HEADROOM: usize = ETH_HEADER_LEN;

/// Smallest reply buffer [`Switch::handle_tap_frame`] may be given.
pub const MIN_REPLY_BUF: usize = ETH_HEADER_LEN + ARP_LEN;

/// Settings of one namespace's switch.
#[derive(Debug, Clone)]
pub struct Config {
    /// The host's own virtual address, carried by the TAP.
    pub address: Ipv4Addr,
    /// The namespace subnet.
    pub subnet: Ipv4Net,
    /// MAC of the TAP device itself: destination of frames written to it.
    pub device_mac: Mac,
    /// The MAC that stands for every remote member (IPOP 4.1: FE:FD plus 4 random bytes).
    pub remote_mac: Mac,
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
    /// Broadcast or multicast: not carried across the overlay yet.
    Broadcast,
    /// A packet from a member addressed to someone other than this host.
    NotForUs,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 8] = [
        DropReason::Malformed,
        DropReason::UnsupportedProtocol,
        DropReason::ArpIgnored,
        DropReason::ArpUnknownTarget,
        DropReason::NoRoute,
        DropReason::OutsideSubnet,
        DropReason::Broadcast,
        DropReason::NotForUs,
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
            DropReason::Broadcast => "broadcast",
            DropReason::NotForUs => "not_for_us",
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
    drops: [u64; DropReason::ALL.len()],
}

impl Counters {
    /// How many frames were dropped for `reason`.
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason.index()]
    }
}

/// The switch of one namespace. `P` names a member (the overlay's peer handle).
#[derive(Debug)]
pub struct Switch<P> {
    config: Config,
    routes: HashMap<Ipv4Addr, P>,
    counters: Counters,
}

impl<P: Copy + Eq> Switch<P> {
    /// A switch with no routes.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            routes: HashMap::new(),
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
    }

    /// The member that owns `addr`, if known.
    pub fn route(&self, addr: Ipv4Addr) -> Option<P> {
        self.routes.get(&addr).copied()
    }

    /// Handles a frame the kernel wrote to the TAP. A reply, if any, is built in `reply`,
    /// which must be at least [`MIN_REPLY_BUF`] long.
    pub fn handle_tap_frame(&mut self, frame: &[u8], reply: &mut [u8]) -> Action<P> {
        let action = self.classify_tap_frame(frame, reply);
        match &action {
            Action::ToPeer { .. } => self.counters.to_peer += 1,
            Action::ToTap { .. } => self.counters.arp_replies += 1,
            Action::Resolve { .. } => self.counters.resolves += 1,
            Action::Drop(reason) => self.counters.drops[reason.index()] += 1,
        }
        action
    }

    /// Changes the host's own address (an address won after start, or moved).
    pub fn set_address(&mut self, address: Ipv4Addr) {
        self.routes.remove(&address);
        self.config.address = address;
    }

    /// Changes the namespace subnet (learned after start); routes outside it are dropped.
    pub fn set_subnet(&mut self, subnet: Ipv4Net) {
        self.config.subnet = subnet;
        self.routes.retain(|a, _| subnet.contains(a));
    }

    /// Routes `addr` to `peer` (in addition to what it announced).
    pub fn add_route(&mut self, addr: Ipv4Addr, peer: P) {
        if self.config.subnet.contains(&addr) && addr != self.config.address {
            self.routes.insert(addr, peer);
        }
    }

    fn classify_tap_frame(&self, frame: &[u8], reply: &mut [u8]) -> Action<P> {
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            return Action::Drop(DropReason::Malformed);
        };
        match eth.ethertype() {
            ETHERTYPE_ARP => self.answer_arp(&eth, reply),
            ETHERTYPE_IPV4 => {
                let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
                    return Action::Drop(DropReason::Malformed);
                };
                let dst = ip.dst();
                if dst.is_multicast() || dst.is_broadcast() || dst == self.subnet_broadcast() {
                    return Action::Drop(DropReason::Broadcast);
                }
                if !self.config.subnet.contains(&dst) {
                    return Action::Drop(DropReason::OutsideSubnet);
                }
                match self.routes.get(&dst) {
                    Some(&peer) => Action::ToPeer {
                        peer,
                        packet: ETH_HEADER_LEN..ETH_HEADER_LEN + ip.total_len(),
                    },
                    None if dst == self.config.address || dst == self.config.subnet.network() => {
                        Action::Drop(DropReason::NoRoute)
                    }
                    None => Action::Resolve { target: dst },
                }
            }
            _ => Action::Drop(DropReason::UnsupportedProtocol),
        }
    }

    /// IPOP 4.1: answer only if (a) the target is a namespace address, (b) it is not the
    /// host's own, and (c) a member is known to own it.
    fn answer_arp(&self, eth: &EthernetFrame<&[u8]>, reply: &mut [u8]) -> Action<P> {
        let arp = match ArpPacket::new_checked(eth.payload()) {
            Ok(arp) => arp,
            Err(_) => return Action::Drop(DropReason::Malformed),
        };
        let target = arp.target_ip();
        if arp.operation() != ARP_REQUEST
            || !self.config.subnet.contains(&target)
            || target == self.config.address
        {
            return Action::Drop(DropReason::ArpIgnored);
        }
        if !self.routes.contains_key(&target) {
            if target == self.config.subnet.network() || target == self.subnet_broadcast() {
                return Action::Drop(DropReason::ArpIgnored);
            }
            return Action::Resolve { target };
        }
        if reply.len() < MIN_REPLY_BUF {
            return Action::Drop(DropReason::Malformed);
        }
        let len = emit_arp_reply(
            reply,
            self.config.remote_mac,
            target,
            arp.sender_mac(),
            arp.sender_ip(),
        );
        Action::ToTap { len }
    }

    /// Handles an IPv4 packet of `len` bytes from a member, lying at `buf[HEADROOM..]`; the
    /// source address has already been checked against what the member owns. On
    /// [`Action::ToTap`] the Ethernet header has been written in front of it, in place.
    pub fn handle_peer_packet(&mut self, buf: &mut [u8], len: usize) -> Action<P> {
        let action = self.frame_peer_packet(buf, len);
        match &action {
            Action::ToTap { .. } => self.counters.to_tap += 1,
            Action::Drop(reason) => self.counters.drops[reason.index()] += 1,
            Action::ToPeer { .. } | Action::Resolve { .. } => {}
        }
        action
    }

    fn frame_peer_packet(&self, buf: &mut [u8], len: usize) -> Action<P> {
        let Some(packet) = buf.get(HEADROOM..HEADROOM + len) else {
            return Action::Drop(DropReason::Malformed);
        };
        let Ok(ip) = Ipv4Packet::new_checked(packet) else {
            return Action::Drop(DropReason::Malformed);
        };
        if ip.dst() != self.config.address {
            return Action::Drop(DropReason::NotForUs);
        }
        let frame_len = HEADROOM + ip.total_len();
        emit_ethernet_header(
            buf,
            self.config.device_mac,
            self.config.remote_mac,
            ETHERTYPE_IPV4,
        );
        Action::ToTap { len: frame_len }
    }

    fn subnet_broadcast(&self) -> Ipv4Addr {
        self.config.subnet.broadcast()
    }
}

#[cfg(test)]
mod tests {
    use super::wire::{ArpPacket, EthernetFrame, ARP_REPLY};
    use super::*;

    const DEVICE_MAC: Mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
    const REMOTE_MAC: Mac = [0xfe, 0xfd, 0xa1, 0xb2, 0xc3, 0xd4];

    fn switch() -> Switch<u32> {
        let mut sw = Switch::new(Config {
            address: Ipv4Addr::new(10, 201, 0, 1),
            subnet: "10.201.0.0/16".parse().unwrap(),
            device_mac: DEVICE_MAC,
            remote_mac: REMOTE_MAC,
        });
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
        let Action::ToTap { len } = sw.handle_tap_frame(&arp_request([10, 201, 0, 2]), &mut reply)
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
        let unknown = sw.handle_tap_frame(&arp_request([10, 201, 0, 9]), &mut reply);
        assert_eq!(
            unknown,
            Action::Resolve {
                target: Ipv4Addr::new(10, 201, 0, 9)
            }
        );
        // (b) our own address (the kernel's duplicate-address probe)
        let own = sw.handle_tap_frame(&arp_request([10, 201, 0, 1]), &mut reply);
        assert_eq!(own, Action::Drop(DropReason::ArpIgnored));
        // (a) outside the namespace
        let outside = sw.handle_tap_frame(&arp_request([192, 168, 1, 1]), &mut reply);
        assert_eq!(outside, Action::Drop(DropReason::ArpIgnored));
        assert_eq!(sw.counters().drops(DropReason::ArpIgnored), 2);
        assert_eq!(sw.counters().resolves, 1);
    }

    #[test]
    fn ipv4_goes_to_the_owner_without_link_padding() {
        let mut sw = switch();
        let frame = icmp_frame([10, 201, 0, 2]);
        let action = sw.handle_tap_frame(&frame, &mut [0u8; 64]);
        assert_eq!(
            action,
            Action::ToPeer {
                peer: 7,
                packet: 14..42
            }
        );
        assert_eq!(
            sw.handle_tap_frame(&icmp_frame([10, 201, 0, 3]), &mut [0u8; 64]),
            Action::Resolve {
                target: Ipv4Addr::new(10, 201, 0, 3)
            }
        );
        assert_eq!(
            sw.handle_tap_frame(&icmp_frame([10, 201, 255, 255]), &mut [0u8; 64]),
            Action::Drop(DropReason::Broadcast)
        );
        assert_eq!(
            sw.handle_tap_frame(&icmp_frame([224, 0, 0, 251]), &mut [0u8; 64]),
            Action::Drop(DropReason::Broadcast)
        );
        assert_eq!(
            sw.handle_tap_frame(&icmp_frame([8, 8, 8, 8]), &mut [0u8; 64]),
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
    }

    #[test]
    fn peer_packet_is_framed_in_place() {
        let mut sw = switch();
        let frame = icmp_frame([10, 201, 0, 1]);
        let ip = &frame[14..42];
        let mut buf = [0u8; 128];
        buf[HEADROOM..HEADROOM + ip.len()].copy_from_slice(ip);
        let Action::ToTap { len } = sw.handle_peer_packet(&mut buf, ip.len()) else {
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
            sw.handle_peer_packet(&mut buf, ip.len()),
            Action::Drop(DropReason::NotForUs)
        );
        assert_eq!(
            sw.handle_peer_packet(&mut buf, 4000),
            Action::Drop(DropReason::Malformed)
        );
    }

    /// Golden test on frames captured from a live TAP: the switch's reply and framing are
    /// byte for byte what the agent put on the device.
    #[test]
    fn captured_frames_are_reproduced_exactly() {
        use crate::captured::{ARP_REPLY, ARP_REQUEST, ECHO_REPLY, ECHO_REQUEST};
        let mut sw: Switch<u32> = Switch::new(Config {
            address: Ipv4Addr::new(10, 201, 0, 1),
            subnet: "10.201.0.0/16".parse().unwrap(),
            device_mac: [0x02, 0x48, 0xae, 0x81, 0xab, 0x18],
            remote_mac: [0xfe, 0xfd, 0x76, 0xa2, 0x83, 0xb0],
        });
        sw.set_peer_addresses(3, &[Ipv4Addr::new(10, 201, 0, 2)]);
        let mut reply = [0u8; 64];
        let Action::ToTap { len } = sw.handle_tap_frame(&ARP_REQUEST, &mut reply) else {
            panic!("no ARP reply")
        };
        assert_eq!(&reply[..len], &ARP_REPLY[..]);
        assert_eq!(
            sw.handle_tap_frame(&ECHO_REQUEST, &mut reply),
            Action::ToPeer {
                peer: 3,
                packet: 14..98
            }
        );
        let mut buf = [0u8; 128];
        buf[HEADROOM..HEADROOM + 84].copy_from_slice(&ECHO_REPLY[14..]);
        let Action::ToTap { len } = sw.handle_peer_packet(&mut buf, 84) else {
            panic!("not delivered")
        };
        assert_eq!(&buf[..len], &ECHO_REPLY[..]);
    }

    /// Every prefix and every single-byte corruption of real frames is handled without panic.
    #[test]
    fn hostile_frames_never_panic() {
        let mut sw = switch();
        let mut reply = [0u8; 64];
        let mut buf = [0u8; 256];
        for frame in [
            arp_request([10, 201, 0, 2]),
            icmp_frame([10, 201, 0, 2]),
            crate::captured::ECHO_REQUEST.to_vec(),
        ] {
            for n in 0..=frame.len() {
                let _ = sw.handle_tap_frame(&frame[..n], &mut reply);
                let m = n.min(buf.len() - HEADROOM);
                buf[HEADROOM..HEADROOM + m].copy_from_slice(&frame[..m]);
                let _ = sw.handle_peer_packet(&mut buf, n);
            }
            for i in 0..frame.len() {
                for v in [0u8, 0x0f, 0x45, 0xff] {
                    let mut f = frame.clone();
                    f[i] = v;
                    let _ = sw.handle_tap_frame(&f, &mut reply);
                }
            }
        }
        assert!(sw.counters().drops(DropReason::Malformed) > 0);
    }
}
