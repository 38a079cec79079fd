//! IPv6 in a dual-stack namespace: the IPv6 addresses each member holds travel in their own
//! control message ([`Control::Addresses6`]) after its announcement, to members that said
//! they read it; a member's IPv6 packets are taken only from the addresses it announced
//! (and, with an authority, its certificate allows), as its IPv4 packets are.

use std::net::Ipv6Addr;
use std::time::Instant;

use super::{Event, NamespaceId, Node, PeerDropReason, PeerHandle, Received};
use crate::wire::Control;
use crate::DropReason;

impl Node {
    /// Replaces the IPv6 addresses this node holds in `ns` and announces them.
    pub fn set_addresses6(&mut self, now: Instant, ns: NamespaceId, addresses: Vec<Ipv6Addr>) {
        let Some(namespace) = self.namespaces.get_mut(ns.0) else {
            return;
        };
        if namespace.addresses6 == addresses {
            return;
        }
        namespace.addresses6 = addresses;
        for handle in self.handles_in(ns) {
            if self
                .peer(handle)
                .is_some_and(|p| p.initiator || p.has_session())
            {
                self.announce(now, handle);
            }
        }
    }

    /// Tells `handle` our IPv6 addresses, if it reads them.
    pub(super) fn send_addresses6(&mut self, handle: PeerHandle) {
        let Some(peer) = self.peer(handle) else {
            return;
        };
        if !peer.speaks_addresses6 {
            return;
        }
        let addresses = self.namespaces[peer.ns.0].addresses6.clone();
        let packet = Control::Addresses6(addresses).emit();
        self.send_control(handle, &packet, None);
    }

    /// The member of `handle` told its IPv6 addresses: in a namespace with an authority,
    /// only those its certificate (checked with its announcement) allows are taken.
    pub(super) fn handle_addresses6(
        &mut self,
        handle: PeerHandle,
        mut addresses: Vec<Ipv6Addr>,
    ) -> Received {
        let Some(peer) = self.peer(handle) else {
            return Received::Consumed;
        };
        let ns = peer.ns;
        if self.is_layer2(ns) {
            return Received::PeerDropped(handle, PeerDropReason::BadPayload);
        }
        let certified = self
            .namespaces
            .get(ns.0)
            .is_some_and(|n| n.credential.is_some());
        if certified {
            let Some(cert) = peer.certificate.as_ref() else {
                // Its announcement (and certificate) comes first in the tunnel: without
                // one checked, the member holds nothing yet.
                return Received::Consumed;
            };
            let before = addresses.len();
            addresses.retain(|a| cert.allows_address((*a).into()));
            if addresses.len() < before {
                tracing::warn!(peer = ?peer.id, "member announced IPv6 addresses its certificate does not allow");
                self.certificate_stats.address_not_allowed += (before - addresses.len()) as u64;
            }
        }
        addresses.sort_unstable();
        addresses.dedup();
        let Some(peer) = self.peer_mut(handle) else {
            return Received::Consumed;
        };
        if peer.addresses6 != addresses {
            tracing::info!(peer = ?peer.id, ?addresses, "member IPv6 addresses");
            peer.addresses6 = addresses.clone();
            self.events.push_back(Event::PeerAddresses6 {
                ns,
                peer: handle,
                addresses,
            });
        }
        Received::Consumed
    }

    /// A decrypted IPv6 packet from `src`: delivered if the member holds `src`.
    pub(super) fn take_packet6(
        &mut self,
        handle: PeerHandle,
        packet: &[u8],
        src: Ipv6Addr,
    ) -> Received {
        let layer2 = self.peer(handle).is_some_and(|p| self.is_layer2(p.ns));
        let Some(peer) = self.peer_mut(handle) else {
            return Received::Dropped(DropReason::UnknownSession);
        };
        if layer2 {
            // A layer-2 member sends frames in IPv4 envelopes, nothing else.
            return Received::PeerDropped(handle, PeerDropReason::BadPayload);
        }
        match peer.accept_packet6(src, packet.len()) {
            Ok(()) => Received::Deliver {
                ns: peer.ns,
                peer: handle,
                len: packet.len(),
            },
            Err(reason) => Received::PeerDropped(handle, reason),
        }
    }
}

/// The source of an IPv6 packet, if `packet` is one (version 6, a whole fixed header).
pub(super) fn ipv6_source(packet: &[u8]) -> Option<Ipv6Addr> {
    let header = packet.get(..40).filter(|h| h[0] >> 4 == 6)?;
    <[u8; 16]>::try_from(&header[8..24])
        .ok()
        .map(Ipv6Addr::from)
}
