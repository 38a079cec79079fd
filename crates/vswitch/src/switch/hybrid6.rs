//! IPv6 in hybrid mode (IPOP 4.4 carried over to neighbour discovery): the host's own
//! device shares a LAN with other hosts, some of them members with agents of their own.
//! The switch learns which addresses of the prefix answer on the LAN (from frames the
//! bridge floods to it) and never answers for them; a solicitation of the host for an
//! address a member holds elsewhere is answered only after the switch's own solicitation
//! on the LAN went unanswered for `probe_timeout` (then for `REMOTE_CONFIRMED` without
//! asking again).

use std::net::Ipv6Addr;
use std::time::Instant;

use super::{Emit, Switch};
use crate::ndp::{self, Message};
use crate::wire::{EthernetFrame, Ipv6Packet};
use crate::{Action, DropReason, Mac, REMOTE_CONFIRMED};

/// A solicitation of the host waiting for the LAN probe to time out.
#[derive(Debug, Clone, Copy)]
pub(super) struct Probe6 {
    deadline: Instant,
    requester: (Ipv6Addr, Mac),
}

impl<P: Copy + Eq> Switch<P> {
    /// Hybrid mode: an IPv6 frame on the LAN that is not the host's (the bridge flooded
    /// it): what it says about who answers on the LAN is learned, and it goes no further.
    pub(super) fn learn_from_lan6(
        &mut self,
        frame: &[u8],
        eth: &EthernetFrame<&[u8]>,
        ip: &Ipv6Packet<&[u8]>,
        now: Instant,
    ) -> Action<P> {
        match ndp::parse(frame).map(|n| n.message) {
            // Only an advertisement for the sender's own link-layer address: one naming
            // another is not the sender speaking for itself.
            Some(Message::Advertisement { target, link, .. })
                if link.is_none_or(|l| l == eth.src()) =>
            {
                self.learn6(target, eth.src(), now);
            }
            Some(Message::Advertisement { .. }) => {}
            // A probe names an address someone is about to use, not one it answers for.
            Some(Message::Solicitation { .. }) if ip.src().is_unspecified() => {}
            _ => self.learn6(ip.src(), eth.src(), now),
        }
        Action::Drop(DropReason::OtherHost)
    }

    /// Hybrid mode: the host asks for `target`. A LAN host's is left to it; one a member
    /// holds elsewhere is answered once the LAN stayed silent on it.
    pub(super) fn hybrid_solicitation(
        &mut self,
        target: Ipv6Addr,
        asker: (Ipv6Addr, Mac),
        now: Instant,
        reply: &mut [u8],
    ) -> Action<P> {
        if self.lan6.contains_key(&target) {
            return Action::Drop(DropReason::LanLocal);
        }
        let service = self.config.prefix6.map(crate::service_address6) == Some(target);
        let confirmed = self.confirmed6.get(&target).is_some_and(|&t| t > now);
        if service || confirmed || self.route6(target).is_none() {
            // The service address lives in every agent; an unknown one is looked up first
            // (and probed when it comes back).
            return self.answer_solicitation(target, asker, reply);
        }
        if !self.probes6.contains_key(&target) && self.probes6.len() < crate::MAX_LAN_HOSTS {
            let probe = Probe6 {
                deadline: now + self.config.probe_timeout,
                requester: asker,
            };
            self.probes6.insert(target, probe);
            self.emits.push_back(Emit::Probe6(target));
        }
        Action::Drop(DropReason::ArpProbing)
    }

    /// Hybrid mode: probes whose time is up with no LAN answer: the member's address is
    /// confirmed remote, and the host's solicitation answered.
    pub(super) fn expire_probes6(&mut self, now: Instant) {
        let due: Vec<Ipv6Addr> = self
            .probes6
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(a, _)| *a)
            .collect();
        for target in due {
            let Some(probe) = self.probes6.remove(&target) else {
                continue;
            };
            if self.lan6.contains_key(&target) {
                continue;
            }
            self.confirmed6.insert(target, now + REMOTE_CONFIRMED);
            if self.route6(target).is_some() {
                self.emits.push_back(Emit::Reply6 {
                    target,
                    to: probe.requester,
                });
            }
        }
        self.confirmed6.retain(|_, until| *until > now);
    }

    /// When the next probe times out.
    pub(super) fn probes6_due(&self) -> Option<Instant> {
        self.probes6.values().map(|p| p.deadline).min()
    }
}
