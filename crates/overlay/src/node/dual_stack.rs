//! IPv6 in a dual-stack namespace: the IPv6 addresses each member holds travel in its
//! announcement ([`crate::wire::Announce::list6`]) to members that said they read them; a
//! member's IPv6 packets are taken only from the addresses it announced (and, with an
//! authority, its certificate allows), as its IPv4 packets are.

use std::net::Ipv6Addr;
use std::time::Instant;

use super::{Event, NamespaceId, Node, PeerDropReason, PeerHandle, Received};
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
        namespace.address_generation = namespace.address_generation.wrapping_add(1);
        for handle in self.handles_in(ns) {
            if self
                .peer(handle)
                .is_some_and(|p| p.initiator || p.has_session())
            {
                self.announce(now, handle);
            }
        }
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
            // Nothing to take there.
            return Received::Consumed;
        }
        let certified = self
            .namespaces
            .get(ns.0)
            .is_some_and(|n| n.credential.is_some());
        if certified {
            let Some(cert) = peer.certificate.as_ref() else {
                // (The announcement carrying the list had its certificate checked first.)
                return Received::Consumed;
            };
            // As the replicas rule: only IPv6 pins restrict IPv6 addresses.
            if cert.addresses().iter().any(|a| a.is_ipv6()) {
                let before = addresses.len();
                addresses.retain(|a| cert.allows_address((*a).into()));
                if addresses.len() < before {
                    tracing::warn!(peer = ?peer.id, "member announced IPv6 addresses its certificate does not allow");
                    self.certificate_stats.address_not_allowed += (before - addresses.len()) as u64;
                }
            }
        }
        // Only its own addresses: never ours, nothing link-local or multicast.
        let ours = self.namespaces.get(ns.0).map(|n| n.addresses6.clone());
        addresses.retain(|a| {
            !a.is_multicast()
                && !a.is_unspecified()
                && !a.is_loopback()
                && a.segments()[0] & 0xffc0 != 0xfe80
                && ours.as_ref().is_none_or(|o| !o.contains(a))
        });
        addresses.sort_unstable();
        addresses.dedup();
        let Some(peer) = self.peer_mut(handle) else {
            return Received::Consumed;
        };
        if peer.addresses6 != addresses {
            tracing::info!(peer = ?peer.id, n = addresses.len(), first = ?addresses.first(), "member IPv6 addresses");
            peer.addresses6 = addresses.clone();
            self.events.push_back(Event::PeerAddresses6 {
                ns,
                peer: handle,
                addresses,
            });
        }
        Received::Consumed
    }

    /// The member of `handle` announced itself: whether it reads IPv6 address lists. One
    /// that stops reading them (an older agent restarted in its place) holds no IPv6
    /// address any more.
    pub(super) fn announced6(&mut self, handle: PeerHandle, reads: bool) {
        let Some(peer) = self.peer_mut(handle) else {
            return;
        };
        peer.speaks_addresses6 = reads;
        if !reads {
            peer.got_list6 = false;
        }
        if !reads && !peer.addresses6.is_empty() {
            peer.addresses6.clear();
            let ns = peer.ns;
            self.events.push_back(Event::PeerAddresses6 {
                ns,
                peer: handle,
                addresses: Vec::new(),
            });
        }
    }

    /// A decrypted IPv6 packet from `src`: delivered if the member holds `src`.
    pub(super) fn take_packet6(
        &mut self,
        now: Instant,
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
        let dst = packet
            .get(24..40)
            .and_then(|d| <[u8; 16]>::try_from(d).ok())
            .map(Ipv6Addr::from);
        match peer.accept_packet6(now, (src, dst), packet.len()) {
            Ok(()) => Received::Deliver {
                ns: peer.ns,
                peer: handle,
                len: packet.len(),
            },
            Err(reason) => {
                self.ask_announcement(now, handle);
                Received::PeerDropped(handle, reason)
            }
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
