//! ARP suppression: requests for a member's host answered here from what that host's own
//! ARP said (EVPN-style), instead of flooded.

use std::net::Ipv4Addr;
use std::time::Instant;

use super::*;

impl<P: Copy + Eq + std::hash::Hash> Layer2<P> {
    /// The ARP answer of the last [`L2Action::Answer`].
    pub fn answer(&self) -> &[u8] {
        &self.answer
    }

    /// Answers an ARP request from this side (sender MAC, sender address, target) if a
    /// member's host holds the target: its binding heard within [`MAC_AGE`], and its MAC
    /// still announced by a member (not on this side).
    pub(super) fn suppress(
        &mut self,
        now: Instant,
        (mac, ip, target): (Mac, Ipv4Addr, Ipv4Addr),
    ) -> bool {
        let Some((held, heard)) = self.bindings.get(&target).copied() else {
            return false;
        };
        if now.saturating_duration_since(heard) >= MAC_AGE || !self.remote.contains_key(&held) {
            return false;
        }
        emit_arp_reply(&mut self.answer, held, target, mac, ip);
        self.counters.arp_suppressed += 1;
        true
    }

    /// Learns a member's host's address from its ARP packet (sent from its own MAC).
    pub(super) fn bind(&mut self, now: Instant, frame: &[u8]) {
        let Some(arp) = arp_packet(frame) else {
            return;
        };
        let (mac, ip) = (arp.sender_mac(), arp.sender_ip());
        let src = frame.get(6..12).and_then(|s| <Mac>::try_from(s).ok());
        if src != Some(mac) || ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
            return;
        }
        // One host speaks for a few addresses, not for the namespace.
        let held = self.bindings.values().filter(|(m, _)| *m == mac).count();
        if held >= MAX_BINDINGS_PER_MAC && self.bindings.get(&ip).is_none_or(|(m, _)| *m != mac) {
            return;
        }
        if self.bindings.len() >= MAX_MACS && !self.bindings.contains_key(&ip) {
            self.bindings
                .retain(|_, (_, t)| now.saturating_duration_since(*t) < MAC_AGE);
            if self.bindings.len() >= MAX_MACS {
                return;
            }
        }
        self.bindings.insert(ip, (mac, now));
    }
}

/// The ARP packet of an untagged frame, if it is one.
pub(super) fn arp_packet(frame: &[u8]) -> Option<ArpPacket<&[u8]>> {
    if frame.get(12..14)? != ETHERTYPE_ARP.to_be_bytes() {
        return None;
    }
    ArpPacket::new_checked(frame.get(ETH_HEADER_LEN..)?).ok()
}

/// An ARP request's sender MAC, sender address and target, if `frame` is a broadcast one
/// from a host with an address (not a probe: RFC 5227's sender 0.0.0.0 must reach the
/// holder, which may be anywhere).
pub(super) fn arp_request(frame: &[u8]) -> Option<(Mac, Ipv4Addr, Ipv4Addr)> {
    let arp = arp_packet(frame)?;
    let ip = arp.sender_ip();
    (arp.operation() == ARP_REQUEST && !ip.is_unspecified() && arp.sender_ip() != arp.target_ip())
        .then(|| (arp.sender_mac(), ip, arp.target_ip()))
}
