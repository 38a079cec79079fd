//! IPv6 in a dual-stack namespace (interface mode): IPOP's proxy ARP carried over to
//! neighbour discovery, routes to the members holding IPv6 addresses, and the rules that
//! keep link-scoped traffic on its link.
//!
//! - A neighbour solicitation from the host for an address of the prefix that is not its
//!   own is answered with the remote MAC once a member is known to hold the address (the
//!   solicitation waits while it is resolved, as an ARP request does). Duplicate address
//!   probes, solicitations for the host's own address and anything outside the prefix are
//!   not answered.
//! - Link-local sources and destinations, and link-scoped multicast (neighbour discovery,
//!   MLD, router solicitations), never cross the overlay ([`DropReason::LinkLocal`]).
//! - Multicast of a wider scope goes to every member, through the same rate limits as IPv4
//!   broadcast.
//! - IPv6 routers never fragment: a packet larger than the tunnel is answered with ICMPv6
//!   "packet too big" from the prefix's service address, and TCP SYNs have their MSS
//!   clamped both ways.

use std::net::{IpAddr, Ipv6Addr};
use std::time::Instant;

use super::Switch;
use crate::icmp6::{emit_packet_too_big, TCP_IPV6_HEADERS};
use crate::ndp::{self, Message, NaFlags, ADVERTISEMENT_FRAME_LEN, ETHERTYPE_IPV6};
use crate::wire::{
    emit_ethernet_header, may_be_nd, multicast_mac6, EthernetFrame, Ipv6Packet, ETH_HEADER_LEN,
};
use crate::{mtu, service_address6, Action, DropReason, Mode, HEADROOM};

/// Whether `a` is link-local unicast (fe80::/10).
fn link_local(a: Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

/// Whether `a` may be a member's address in `prefix`: inside it, neither its `::` (the
/// subnet-router anycast address) nor its `::1` (the service address).
pub(super) fn member_address(prefix: ipnet::Ipv6Net, a: Ipv6Addr) -> bool {
    prefix.contains(&a) && u128::from(a) & !u128::from(prefix.netmask()) > 1
}

/// Whether `a` stays on its link: link-local unicast, or multicast of interface- or
/// link-local scope (RFC 4291 2.7).
pub(super) fn stays_on_link(a: Ipv6Addr) -> bool {
    link_local(a) || (a.is_multicast() && a.octets()[1] & 0x0f <= 2)
}

impl<P: Copy + Eq> Switch<P> {
    /// Makes `peer` the holder of exactly `addresses` (IPv6): routes it had to others are
    /// removed. Addresses outside the prefix, and the host's own, are ignored.
    pub fn set_peer_addresses6(&mut self, peer: P, addresses: &[Ipv6Addr]) {
        self.routes6.retain(|_, p| *p != peer);
        let Some(prefix) = self.config.prefix6 else {
            return;
        };
        for &addr in addresses {
            if member_address(prefix, addr) && Some(addr) != self.config.address6 {
                self.routes6.insert(addr, peer);
            }
        }
    }

    /// The member that holds the IPv6 `addr`, if known: as it announced, or as the DHT
    /// said.
    pub fn route6(&self, addr: Ipv6Addr) -> Option<P> {
        self.routes6
            .get(&addr)
            .or_else(|| self.resolved6.get(&addr))
            .copied()
    }

    /// The member that holds `addr`, IPv4 or IPv6.
    pub fn route_ip(&self, addr: IpAddr) -> Option<P> {
        match addr {
            IpAddr::V4(a) => self.route(a),
            IpAddr::V6(a) => self.route6(a),
        }
    }

    /// Routes `addr` to `peer` because the DHT says `peer` holds it (IPv4 or IPv6); see
    /// [`Switch::add_route`].
    pub fn add_route_ip(&mut self, addr: IpAddr, peer: P) {
        match addr {
            IpAddr::V4(a) => self.add_route(a, peer),
            IpAddr::V6(a) => {
                let ours = Some(a) == self.config.address6;
                if self.config.prefix6.is_some_and(|p| member_address(p, a)) && !ours {
                    self.resolved6.insert(a, peer);
                }
            }
        }
    }

    /// Changes the host's own IPv6 address (won after start, or lost).
    pub fn set_address6(&mut self, address: Option<Ipv6Addr>) {
        if let Some(a) = address {
            self.routes6.remove(&a);
            self.resolved6.remove(&a);
        }
        self.config.address6 = address;
    }

    /// An IPv6 frame from the TAP.
    pub(super) fn classify_ipv6(
        &mut self,
        frame: &[u8],
        eth: &EthernetFrame<&[u8]>,
        now: Instant,
        reply: &mut [u8],
    ) -> Action<P> {
        let Some(prefix) = self.config.prefix6 else {
            return Action::Drop(DropReason::UnsupportedProtocol);
        };
        let Ok(ip) = Ipv6Packet::new_checked(eth.payload()) else {
            return Action::Drop(DropReason::Malformed);
        };
        if !self.carries_ipv6() {
            return Action::Drop(DropReason::UnsupportedProtocol);
        }
        let hybrid = self.config.mode == Mode::Hybrid;
        match self.config.mode {
            Mode::Router => return self.classify_ipv6_lan(frame, eth, &ip, now, reply),
            Mode::Hybrid if eth.src() != self.config.device_mac => {
                return self.learn_from_lan6(frame, eth, &ip, now);
            }
            Mode::Hybrid | Mode::Interface => {}
        }
        if let Some(nd) = ndp::parse(frame) {
            return match nd.message {
                Message::Solicitation { target, link } if !nd.source.is_unspecified() => {
                    let asker = (nd.source, link.unwrap_or(eth.src()));
                    if hybrid {
                        return self.hybrid_solicitation(target, asker, now, reply);
                    }
                    self.answer_solicitation(target, asker, reply)
                }
                Message::Solicitation { .. } => Action::Drop(DropReason::NdIgnored),
                // The host's own advertisements are for the link, which is this switch.
                Message::Advertisement { .. } => Action::Drop(DropReason::LinkLocal),
            };
        }
        let (src, dst) = (ip.src(), ip.dst());
        if stays_on_link(src) || stays_on_link(dst) {
            return Action::Drop(DropReason::LinkLocal);
        }
        if !prefix.contains(&src) {
            return Action::Drop(DropReason::OutsideSubnet);
        }
        // Hybrid: unicast to a LAN host, flooded before the bridge learned where it is
        // (before any size check: the LAN's MTU is not the tunnel's).
        if hybrid && !dst.is_multicast() && eth.dst() != self.config.remote_mac {
            return Action::Drop(DropReason::LanLocal);
        }
        let packet = ETH_HEADER_LEN..ETH_HEADER_LEN + ip.total_len();
        if dst == service_address6(prefix) {
            return self.to_service6(eth, &ip, packet);
        }
        if packet.len() > usize::from(self.config.tunnel_mtu) {
            return self.packet_too_big(eth.src(), &frame[packet], reply);
        }
        if dst.is_multicast() {
            if !self.bucket_out.take(self.config.broadcast_rate, now) {
                return Action::Drop(DropReason::BroadcastRateLimited);
            }
            return Action::Broadcast { packet };
        }
        if !prefix.contains(&dst) {
            return Action::Drop(DropReason::OutsideSubnet);
        }
        match self.route6(dst) {
            Some(peer) => Action::ToPeer { peer, packet },
            None if Some(dst) == self.config.address6 || dst == service_address6(prefix) => {
                Action::Drop(DropReason::NoRoute)
            }
            None if u128::from(dst) == u128::from(prefix.network()) => {
                Action::Drop(DropReason::NoRoute)
            }
            None => Action::Resolve { target: dst.into() },
        }
    }

    /// IPOP 4.1 for neighbour discovery: a solicitation for an address of the prefix, not
    /// the host's own, that a member holds, is answered with the remote MAC.
    pub(super) fn answer_solicitation(
        &mut self,
        target: Ipv6Addr,
        (asker, asker_mac): (Ipv6Addr, crate::Mac),
        reply: &mut [u8],
    ) -> Action<P> {
        let in_prefix = self.config.prefix6.is_some_and(|p| p.contains(&target));
        if !in_prefix || Some(target) == self.config.address6 || target == asker {
            return Action::Drop(DropReason::NdIgnored);
        }
        // The service address (the virtual DNS server's) is always here.
        let service = self.config.prefix6.map(service_address6) == Some(target);
        if !service && self.route6(target).is_none() {
            return Action::Resolve {
                target: target.into(),
            };
        }
        if reply.len() < ADVERTISEMENT_FRAME_LEN {
            return Action::Drop(DropReason::Malformed);
        }
        // A host's own answer: solicited, not a router; overriding what it cached in
        // interface mode (the switch is the only other node on the link), not on a LAN
        // (RFC 4861 7.2.8: a proxy's answer yields to the owner's, should one answer).
        let flags = NaFlags {
            router: false,
            override_cache: self.config.mode == Mode::Interface,
        };
        let mac = self.config.remote_mac;
        match ndp::emit_advertisement(reply, (target, mac), (asker, asker_mac), flags) {
            Some(len) => {
                self.counters.nd_replies += 1;
                Action::ToTap { len }
            }
            None => Action::Drop(DropReason::Malformed),
        }
    }

    /// ICMPv6 "packet too big" to the host for `packet`, from the service address.
    pub(super) fn packet_too_big(
        &mut self,
        to: crate::Mac,
        packet: &[u8],
        reply: &mut [u8],
    ) -> Action<P> {
        let Some(prefix) = self.config.prefix6 else {
            return Action::Drop(DropReason::TooBig);
        };
        let macs = (to, self.config.remote_mac);
        let mtu = self.config.tunnel_mtu;
        match emit_packet_too_big(reply, macs, service_address6(prefix), mtu, packet) {
            Some(len) => {
                self.counters.packet_too_big += 1;
                Action::ToTap { len }
            }
            None => Action::Drop(DropReason::TooBig),
        }
    }

    /// An IPv6 packet from a member at `buf[HEADROOM..HEADROOM + len]`, its source already
    /// checked against what the member holds: framed for the host.
    pub(super) fn frame_peer_packet6(
        &mut self,
        buf: &mut [u8],
        len: usize,
        now: Instant,
    ) -> Action<P> {
        if !self.carries_ipv6() {
            return Action::Drop(DropReason::UnsupportedProtocol);
        }
        let Some(packet) = buf.get(HEADROOM..HEADROOM + len) else {
            return Action::Drop(DropReason::Malformed);
        };
        let Ok(ip) = Ipv6Packet::new_checked(packet) else {
            return Action::Drop(DropReason::Malformed);
        };
        let (src, dst, frame_len) = (ip.src(), ip.dst(), HEADROOM + ip.total_len());
        if stays_on_link(src) || stays_on_link(dst) {
            return Action::Drop(DropReason::LinkLocal);
        }
        if self.config.prefix6.is_some_and(|p| !member_address(p, src)) {
            // The host must never see a member's packet as from the outside world, nor
            // as from the prefix's service or anycast address.
            return Action::Drop(DropReason::OutsideSubnet);
        }
        if may_be_nd(&packet[..ip.total_len()]) {
            // Router and neighbour discovery are the host's link's, never a member's (nor
            // behind extension headers).
            return Action::Drop(DropReason::LinkLocal);
        }
        let router = self.config.mode == Mode::Router;
        let dst_mac = if dst.is_multicast() {
            // A LAN host's own, back from a member: the LAN heard it already.
            if self.config.mode != Mode::Interface && self.is_lan_host6(src) {
                return Action::Drop(DropReason::BroadcastFromLan);
            }
            if !self.bucket_in.take(self.config.broadcast_rate, now) {
                return Action::Drop(DropReason::BroadcastRateLimited);
            }
            self.counters.broadcasts_in += 1;
            // The whole LAN hears it, or only the host.
            if router {
                multicast_mac6(dst)
            } else {
                self.config.device_mac
            }
        } else if router {
            match self.lan_host6_mac(dst, now) {
                Some(mac) => mac,
                None => return Action::Drop(DropReason::NotForUs),
            }
        } else if Some(dst) == self.config.address6 {
            self.config.device_mac
        } else {
            return Action::Drop(DropReason::NotForUs);
        };
        let mss = self.config.tunnel_mtu.saturating_sub(TCP_IPV6_HEADERS);
        if mtu::clamp_mss6(&mut buf[HEADROOM..frame_len], mss) {
            self.counters.mss_clamped += 1;
        }
        emit_ethernet_header(buf, dst_mac, self.config.remote_mac, ETHERTYPE_IPV6);
        Action::ToTap { len: frame_len }
    }
}
