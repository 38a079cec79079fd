//! A layer-2 namespace's part of the node: the MACs this member holds there, announced to
//! its members, and the members' MACs the driver refused (the DHT says they are another
//! member's).

use std::time::Instant;

use super::{Event, Node, PeerHandle, PeerId};
use crate::NamespaceId;

impl Node {
    /// Makes `ns` a layer-2 namespace (if it was not) holding `macs`, and tells its
    /// members when they changed: from now on its members' packets must be frames in
    /// envelopes (`hyphae_vswitch::layer2`) from MACs they announced.
    pub fn set_macs(&mut self, now: Instant, ns: NamespaceId, mut macs: Vec<[u8; 6]>) {
        let Some(namespace) = self.namespaces.get_mut(ns.0) else {
            return;
        };
        macs.sort_unstable();
        macs.dedup();
        if namespace.macs.as_ref() == Some(&macs) {
            return;
        }
        namespace.macs = Some(macs);
        namespace.mac_generation = namespace.mac_generation.wrapping_add(1);
        for handle in self.handles_in(ns) {
            if self
                .peer(handle)
                .is_some_and(|p| p.initiator || p.has_session())
            {
                self.announce(now, handle);
            }
        }
    }

    /// The MACs the member of `handle` in `ns` announced, as it announced them (refused
    /// ones too), and its identity; `None` if the tunnel is not (or no longer) one of `ns`.
    pub fn announced_macs(
        &self,
        ns: NamespaceId,
        handle: PeerHandle,
    ) -> Option<(PeerId, &[[u8; 6]])> {
        let peer = self.peer(handle).filter(|p| p.ns == ns)?;
        Some((peer.id, &peer.macs))
    }

    /// The DHT says `mac`, which the member of `handle` announced, is another member's
    /// (`refused`), or its own after all: from now on its frames from `mac` are dropped
    /// (counted as spoofed) and frames to `mac` go to whoever else announced it, or the
    /// other way round. Reported as [`Event::PeerMacs`] for every member of the namespace
    /// that announced `mac`. Returns whether anything changed.
    pub fn refuse_mac(&mut self, handle: PeerHandle, mac: [u8; 6], refused: bool) -> bool {
        let Some(peer) = self.peer_mut(handle) else {
            return false;
        };
        let listed = peer.refused_macs.contains(&mac);
        // Only a MAC it announced is refused (so the list stays within its announcement).
        if listed == refused || (refused && !peer.macs.contains(&mac)) {
            return false;
        }
        if refused {
            // Bounded by what it announced.
            peer.refused_macs.push(mac);
            tracing::warn!(peer = ?peer.id, mac = ?mac, "a member announced a MAC another member holds: its frames from it are dropped");
        } else {
            peer.refused_macs.retain(|m| *m != mac);
        }
        let ns = peer.ns;
        for h in self.handles_in(ns) {
            if let Some(p) = self
                .peer(h)
                .filter(|p| h == handle || p.macs.contains(&mac))
            {
                let macs = p.usable_macs();
                self.events.push_back(Event::PeerMacs { ns, peer: h, macs });
            }
        }
        true
    }

    /// Whether `ns` is a layer-2 namespace.
    pub fn is_layer2(&self, ns: NamespaceId) -> bool {
        self.namespaces.get(ns.0).is_some_and(|n| n.macs.is_some())
    }
}
