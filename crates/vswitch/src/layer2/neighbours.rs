//! Neighbour suppression (EVPN-style): ARP requests and IPv6 neighbour solicitations for a
//! member's host answered here from what that host's own ARP and advertisements said,
//! instead of flooded to every member.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use super::*;
use crate::ndp::{self, Message, NaFlags, Neighbour};

/// What a member's host said of one of its addresses.
#[derive(Debug, Clone, Copy)]
pub(super) struct Binding {
    mac: Mac,
    heard: Instant,
    /// The R and O flags of its advertisement (IPv6), copied into the answer: a router
    /// answered for without R would be dropped from its neighbours' default routers (RFC
    /// 4861 7.2.5), an anycast or proxy answer must not override a cache.
    flags: NaFlags,
}

/// A request from this side that a binding could answer.
#[derive(Debug, Clone, Copy)]
pub(super) enum Request {
    Arp {
        mac: Mac,
        ip: Ipv4Addr,
        target: Ipv4Addr,
    },
    Neighbour {
        mac: Mac,
        ip: std::net::Ipv6Addr,
        target: std::net::Ipv6Addr,
    },
}

impl<P: Copy + Eq + std::hash::Hash> Layer2<P> {
    /// The answer of the last [`L2Action::Answer`]: an ARP reply or a neighbour
    /// advertisement, from the member's host to the asker.
    pub fn answer(&self) -> &[u8] {
        &self.answer[..self.answer_len]
    }

    /// Answers `request` if a member's host holds its target: its binding heard within
    /// [`MAC_AGE`], and its MAC still announced by a member (not on this side).
    pub(super) fn suppress(&mut self, now: Instant, request: Request) -> bool {
        let target = match request {
            Request::Arp { target, .. } => IpAddr::V4(target),
            Request::Neighbour { target, .. } => IpAddr::V6(target),
        };
        let Some(b) = self.bindings.get(&target).copied() else {
            return false;
        };
        if now.saturating_duration_since(b.heard) >= MAC_AGE || !self.remote.contains_key(&b.mac) {
            return false;
        }
        match request {
            Request::Arp { mac, ip, target } => {
                self.answer_len = emit_arp_reply(&mut self.answer, b.mac, target, mac, ip);
                self.counters.arp_suppressed += 1;
            }
            Request::Neighbour { mac, ip, target } => {
                let Some(len) =
                    ndp::emit_advertisement(&mut self.answer, (target, b.mac), (ip, mac), b.flags)
                else {
                    return false;
                };
                self.answer_len = len;
                self.counters.nd_suppressed += 1;
            }
        }
        true
    }

    /// Counts a request flooded for want of a binding.
    pub(super) fn count_flooded(&mut self, request: Request) {
        match request {
            Request::Arp { .. } => self.counters.arp_flooded += 1,
            Request::Neighbour { .. } => self.counters.nd_flooded += 1,
        }
    }

    /// Learns a member's host's address from its ARP packet or neighbour advertisement
    /// (sent from its own MAC, for itself).
    pub(super) fn bind(&mut self, now: Instant, frame: &[u8]) {
        let src = frame.get(6..12).and_then(|s| <Mac>::try_from(s).ok());
        let (mac, ip, flags) = if let Some(arp) = arp_packet(frame) {
            let ip = arp.sender_ip();
            if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
                return;
            }
            (arp.sender_mac(), IpAddr::V4(ip), NaFlags::default())
        } else if let Some(Neighbour {
            message:
                Message::Advertisement {
                    target,
                    link,
                    flags,
                    ..
                },
            ..
        }) = ndp::parse(frame)
        {
            let Some(mac) = link.or(src) else {
                return;
            };
            (mac, IpAddr::V6(target), flags)
        } else {
            return;
        };
        if src != Some(mac) {
            return;
        }
        // Two members' hosts speaking for one address (a failover, or one claiming
        // another's): answered for neither for MAC_AGE, so requests reach both as without
        // suppression, however often either speaks.
        if let Some(t) = self.conflicted.get(&ip) {
            if now.saturating_duration_since(*t) < MAC_AGE {
                return;
            }
            self.conflicted.remove(&ip);
        }
        if let Some(b) = self.bindings.get(&ip) {
            let fresh = now.saturating_duration_since(b.heard) < MAC_AGE;
            if b.mac != mac && fresh && self.remote.contains_key(&b.mac) {
                self.bindings.remove(&ip);
                if self.conflicted.len() >= MAX_MACS {
                    self.conflicted
                        .retain(|_, t| now.saturating_duration_since(*t) < MAC_AGE);
                }
                if self.conflicted.len() < MAX_MACS {
                    self.conflicted.insert(ip, now);
                }
                self.counters.neighbour_conflicts += 1;
                return;
            }
        }
        // One host speaks for a few addresses, not for the namespace.
        let held = self.bindings.values().filter(|b| b.mac == mac).count();
        if held >= MAX_BINDINGS_PER_MAC && self.bindings.get(&ip).is_none_or(|b| b.mac != mac) {
            return;
        }
        if self.bindings.len() >= MAX_MACS && !self.bindings.contains_key(&ip) {
            self.bindings
                .retain(|_, b| now.saturating_duration_since(b.heard) < MAC_AGE);
            if self.bindings.len() >= MAX_MACS {
                return;
            }
        }
        let heard = now;
        self.bindings.insert(ip, Binding { mac, heard, flags });
    }

    /// An address a host on this side speaks for (its ARP, its advertisement or its
    /// solicitation) is not a member's host's any more (a failover, a new lease): never
    /// answered from a member's old binding.
    pub(super) fn unbind_local(&mut self, frame: &[u8]) {
        if let Some(arp) = arp_packet(frame) {
            self.bindings.remove(&IpAddr::V4(arp.sender_ip()));
        } else if let Some(nd) = ndp::parse(frame) {
            let ip = match nd.message {
                Message::Advertisement { target, .. } => target,
                Message::Solicitation { .. } => nd.source,
            };
            self.bindings.remove(&IpAddr::V6(ip));
        }
    }
}

/// The ARP packet of an untagged frame, if it is one.
pub(super) fn arp_packet(frame: &[u8]) -> Option<ArpPacket<&[u8]>> {
    if frame.get(12..14)? != ETHERTYPE_ARP.to_be_bytes() {
        return None;
    }
    ArpPacket::new_checked(frame.get(ETH_HEADER_LEN..)?).ok()
}

/// A request `frame` makes that a binding could answer: an ARP request from a host with
/// an address, or a neighbour solicitation to a solicited-node group from a host with an
/// address. Not a probe (RFC 5227's sender 0.0.0.0, a duplicate address probe from `::`):
/// it must reach the holder, which may be anywhere.
pub(super) fn request(frame: &[u8]) -> Option<Request> {
    if let Some(arp) = arp_packet(frame) {
        let ip = arp.sender_ip();
        let target = arp.target_ip();
        return (arp.operation() == ARP_REQUEST && !ip.is_unspecified() && ip != target).then(
            || Request::Arp {
                mac: arp.sender_mac(),
                ip,
                target,
            },
        );
    }
    let nd = ndp::parse(frame)?;
    let Message::Solicitation { target, link } = nd.message else {
        return None;
    };
    let mac = link.or_else(|| frame.get(6..12).and_then(|s| <Mac>::try_from(s).ok()))?;
    (!nd.source.is_unspecified() && nd.destination.is_multicast() && nd.source != target).then_some(
        Request::Neighbour {
            mac,
            ip: nd.source,
            target,
        },
    )
}
