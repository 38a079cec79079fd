//! Proxy ARP (IPOP 4.1): which ARP requests the switch answers with the remote MAC, and the
//! hybrid-mode LAN probe that comes first (IPOP 4.4).

use std::time::Instant;

use super::{Emit, Probe, Switch};
use crate::wire::{emit_arp_reply, ArpPacket, ARP_LEN, ARP_REQUEST, ETH_HEADER_LEN};
use crate::{Action, DropReason, Mode};

impl<P: Copy + Eq> Switch<P> {
    /// IPOP 4.1: answer only if (a) the target is a namespace address, (b) it is not the
    /// host's own nor on the local LAN, and (c) a member is known to own it. Hybrid mode
    /// first probes the LAN (IPOP 4.4).
    pub(super) fn answer_arp(
        &mut self,
        arp: &ArpPacket<&[u8]>,
        now: Instant,
        reply: &mut [u8],
    ) -> Action<P> {
        let target = arp.target_ip();
        if arp.operation() != ARP_REQUEST
            || !self.config.subnet.contains(&target)
            || target == self.config.address
            || target == arp.sender_ip()
        {
            return Action::Drop(DropReason::ArpIgnored);
        }
        let vepa = self.vepa();
        if self.config.mode != Mode::Interface && self.lan.contains_key(&target) && !vepa {
            return Action::Drop(DropReason::LanLocal);
        }
        let service = target == self.service();
        if service || (vepa && self.lan.contains_key(&target)) {
            // The virtual server lives in every agent: no lookup, no LAN probe. A VEPA
            // LAN host is reached through the switch.
        } else if self.route(target).is_none() {
            if target == self.config.subnet.network() || target == self.subnet_broadcast() {
                return Action::Drop(DropReason::ArpIgnored);
            }
            // VEPA: the request reached no other LAN host; a silent one answers the
            // switch's probe (once a second), and the host's next request is answered.
            if vepa && !self.asked.contains_key(&target) {
                self.asked.insert(target, now);
                self.emits.push_back(Emit::Probe(target));
            }
            return Action::Resolve {
                target: target.into(),
            };
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
}
