//! The router in one hop (Diverter): packets from the device or LAN for another subnet of
//! a multi-subnet namespace. The switch is every subnet's gateway at once: it lowers the
//! TTL as a router does, answers ICMP "time exceeded" from the gateway address when none is
//! left, and sends the packet straight to the member holding the destination. Broadcast
//! never crosses into another subnet.

use std::net::Ipv4Addr;
use std::ops::Range;

use ipnet::Ipv4Net;

use std::time::Instant;

use super::Switch;
use crate::wire::{decrement_ttl, EthernetFrame, Ipv4Packet, ETHERTYPE_IPV4};
use crate::{mtu, service_address, Action, DropReason, UNREACHABLE_RATE};

impl<P: Copy + Eq> Switch<P> {
    /// A packet of the device or LAN for `dst` in `net`, another subnet of the namespace.
    pub(super) fn route_to_subnet(
        &mut self,
        eth: &EthernetFrame<&[u8]>,
        ip: &Ipv4Packet<&[u8]>,
        net: Ipv4Net,
        packet: Range<usize>,
        reply: &mut [u8],
    ) -> Action<P> {
        let dst = ip.dst();
        // A directed broadcast is not forwarded (RFC 2644): broadcast stays in its subnet.
        if dst == net.broadcast() {
            return Action::Drop(DropReason::OtherSubnet);
        }
        // Nobody holds another subnet's network or service address.
        if dst == net.network() || dst == service_address(net) {
            return Action::Drop(DropReason::NoRoute);
        }
        // Routed only for the hosts of this subnet (a router's ingress check).
        let src = ip.src();
        if !self.config.subnet.contains(&src) || src == self.config.subnet.network() {
            return Action::Drop(DropReason::OutsideSubnet);
        }
        if ip.ttl() <= 1 {
            let macs = (eth.src(), self.config.remote_mac);
            // `packet` starts where the Ethernet payload does.
            let quoted = eth.payload().get(..packet.len()).unwrap_or(eth.payload());
            return match mtu::emit_time_exceeded(reply, macs, self.service(), quoted) {
                Some(len) => {
                    self.counters.ttl_exceeded += 1;
                    Action::ToTap { len }
                }
                None => Action::Drop(DropReason::TtlExceeded),
            };
        }
        match self.route(dst) {
            Some(peer) => Action::ToPeer { peer, packet },
            None => Action::Resolve { target: dst.into() },
        }
    }

    /// The frame `frame` of the device or LAN waited for its destination in another subnet,
    /// and no member holds it: builds ICMP "host unreachable" from the gateway into `buf`,
    /// as a router answers (at most [`UNREACHABLE_RATE`] a second). Returns its length;
    /// `None` for a destination in this subnet (the host's own ARP tells it), an ICMP error,
    /// or over the rate.
    pub fn emit_unreachable(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        frame: &[u8],
    ) -> Option<usize> {
        let eth = EthernetFrame::new_checked(frame).ok()?;
        if eth.ethertype() != ETHERTYPE_IPV4 {
            return None;
        }
        let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
        self.config.routed_subnet(ip.dst())?;
        if !self.config.subnet.contains(&ip.src()) {
            return None;
        }
        if !self.bucket_unreachable.take(UNREACHABLE_RATE, now) {
            return None;
        }
        let packet = eth.payload().get(..ip.total_len())?;
        let macs = (eth.src(), self.config.remote_mac);
        let len = mtu::emit_host_unreachable(buf, macs, self.service(), packet)?;
        self.counters.unreachable += 1;
        Some(len)
    }

    /// Lowers the TTL of `packet` (of `frame`), about to leave for a member, if it is routed
    /// to another subnet. Called once per packet that leaves (a held one is not lowered
    /// until it leaves).
    pub(super) fn lower_ttl_if_routed(&mut self, frame: &mut [u8], packet: &Range<usize>) {
        let Some(ip) = frame.get_mut(packet.clone()).filter(|ip| ip[0] >> 4 == 4) else {
            return;
        };
        let Some(dst) = ip.get(16..20).and_then(|d| <[u8; 4]>::try_from(d).ok()) else {
            return;
        };
        if self.config.routed_subnet(Ipv4Addr::from(dst)).is_some() && decrement_ttl(ip) {
            self.counters.routed += 1;
        }
    }
}
