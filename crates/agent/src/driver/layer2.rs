//! The data path of a layer-2 namespace (`layer = 2`): frames from the TAP switched by MAC
//! ([`hyphae_vswitch::layer2::Layer2`]) into envelopes for one member or the whole group,
//! and members' frames out of their envelopes onto the TAP. The node has already checked
//! each member's frame against the MACs it announced; the MACs on this side are announced
//! through the node whenever the switch's table changes.

use std::time::Instant;

use hyphae_overlay::{NamespaceId, PeerHandle};
use hyphae_vswitch::layer2::{
    ethertype, parse_envelope, tag_in_place, tag_into, Envelope, L2Action, ENVELOPE_LEN,
    VLAN_TAG_LEN,
};
use hyphae_vswitch::HEADROOM;

use super::data::{Batch, DataPlane};
use crate::config::{Mode, Namespace};

/// The layer-2 switch of namespace `cfg`, if it is a layer-2 one.
pub(super) fn switch(
    cfg: &Namespace,
    device_mac: [u8; 6],
    now: Instant,
) -> Option<hyphae_vswitch::layer2::Layer2<PeerHandle>> {
    use hyphae_vswitch::layer2::{L2Config, L2Mode, Layer2};
    cfg.layer2.then(|| {
        Layer2::new(
            L2Config {
                mode: match cfg.mode {
                    Mode::Router => L2Mode::Router,
                    Mode::Interface | Mode::Hybrid => L2Mode::Interface,
                },
                device_mac,
                flood_rate: cfg.broadcast_rate,
                tunnel_mtu: usize::from(cfg.mtu),
                vlan: cfg.vlan,
                ethertypes: cfg.ethertypes.clone(),
                max_local: hyphae_overlay::wire::MAX_ANNOUNCED_MACS,
            },
            now,
        )
    })
}

impl DataPlane {
    /// One frame from TAP `i` of a layer-2 namespace (untagged, on a trunk): to the member
    /// holding its destination, or flooded to the group.
    pub(crate) fn switch_l2_frame(
        &mut self,
        i: usize,
        frame: &[u8],
        now: Instant,
        out: &mut Batch,
    ) {
        let Some(lane) = self.lanes.get_mut(i) else {
            return;
        };
        let Some(l2) = lane.l2.as_mut() else {
            return;
        };
        let action = l2.handle_tap_frame(now, frame);
        // A frame for one member is checked here (counted as the policy's); a flooded one
        // by each receiver.
        let allowed = match action {
            L2Action::ToPeer(peer) => {
                let et = ethertype(frame).unwrap_or_default();
                lane.policy.frame(&self.node, peer, et, false)
            }
            _ => true,
        };
        let Some(l2) = lane.l2.as_mut() else {
            return;
        };
        if !allowed {
            l2.count_denied(true);
        }
        let pieces = match action {
            L2Action::ToPeer(_) if !allowed => None,
            L2Action::ToPeer(_) | L2Action::Flood => l2.pieces(frame.len()),
            L2Action::Answer => {
                // An ARP request a member's host answers, answered here (tagged on a trunk).
                let answer = l2.answer();
                let len = match l2.config().vlan {
                    None => {
                        out.reply[..answer.len()].copy_from_slice(answer);
                        Some(answer.len())
                    }
                    Some(vid) => tag_into(&mut out.reply, answer, vid),
                };
                if let Some(len) = len {
                    out.write_reply(i, len);
                }
                None
            }
            L2Action::ToTap | L2Action::Held | L2Action::Drop(_) => None,
        };
        let send = |node: &mut hyphae_overlay::Node, out: &mut Batch, peer| match &pieces {
            None => out.seal_frame(node, peer, frame),
            Some(pieces) => {
                for piece in pieces.clone() {
                    out.seal_piece(node, peer, pieces, frame, piece);
                }
            }
        };
        match action {
            L2Action::ToPeer(peer) if allowed => send(&mut self.node, out, peer),
            L2Action::Flood if self.lanes[i].group.is_empty() => {
                // The group is not read yet (it is asked for): the members with a tunnel
                // hear it meanwhile, so a segment's first ARP is not lost.
                self.each_member(i, out, |_, _, _| {});
                let handles: Vec<PeerHandle> = self
                    .node
                    .peers()
                    .filter(|p| p.ns == NamespaceId(i))
                    .map(|p| p.handle)
                    .collect();
                for handle in handles {
                    send(&mut self.node, out, handle);
                }
            }
            L2Action::Flood => self.each_member(i, out, send),
            L2Action::ToPeer(_)
            | L2Action::ToTap
            | L2Action::Held
            | L2Action::Answer
            | L2Action::Drop(_) => {}
        }
        self.announce_macs(now, i);
    }

    /// Tells the namespace's members the MACs on this side, if they changed.
    pub(crate) fn announce_macs(&mut self, now: Instant, i: usize) {
        let Some(l2) = self.lanes.get_mut(i).and_then(|l| l.l2.as_mut()) else {
            return;
        };
        if l2.take_local_changed() {
            let macs = l2.local_macs();
            self.node.set_macs(now, NamespaceId(i), macs.clone());
            // Each held as a lease in the DHT, so no other member can claim them.
            self.tell_control(super::data::ToControl::LocalMacs { ns: i, macs });
        }
    }

    /// A packet of `len` bytes from member `from` of layer-2 namespace `i`, lying behind
    /// [`HEADROOM`] in `out` (`at`: where [`Batch::open`] opened it): its frame, moved to
    /// the front of the room, is written to the TAP if the switch takes it.
    pub(crate) fn deliver_l2(
        &mut self,
        now: Instant,
        i: usize,
        from: PeerHandle,
        at: Option<usize>,
        len: usize,
        out: &mut Batch,
    ) {
        let Some(lane) = self.lanes.get_mut(i) else {
            return;
        };
        let (Some(l2), true) = (lane.l2.as_mut(), lane.active) else {
            return;
        };
        let room = out.packet_room(at, HEADROOM + len);
        let frame_len = match parse_envelope(&room[HEADROOM..]) {
            None => return,
            Some(Envelope::Whole(frame)) => {
                // The policy first: a denied frame teaches the switch nothing.
                let et = ethertype(frame).unwrap_or_default();
                if !lane.policy.frame(&self.node, from, et, true) {
                    l2.count_denied(false);
                    return;
                }
                if l2.handle_peer_frame(now, from, frame) != L2Action::ToTap {
                    return;
                }
                frame.len()
            }
            Some(Envelope::Fragment(piece)) => {
                // Checked by the policy once whole, before the switch takes it.
                let (policy, node) = (&mut lane.policy, &self.node);
                let allow = |frame: &[u8]| {
                    let et = ethertype(frame).unwrap_or_default();
                    policy.frame(node, from, et, true)
                };
                if l2.handle_peer_piece(now, from, piece, allow) == L2Action::ToTap {
                    // Whole again, in the switch: written from there.
                    let frame = l2.assembled();
                    let len = match l2.config().vlan {
                        None => {
                            out.frame_room(frame.len()).copy_from_slice(frame);
                            frame.len()
                        }
                        Some(vid) => {
                            let room = out.frame_room(frame.len() + VLAN_TAG_LEN);
                            match tag_into(room, frame, vid) {
                                Some(len) => len,
                                None => return,
                            }
                        }
                    };
                    out.commit_frame(i, len, true);
                }
                return;
            }
        };
        let start = HEADROOM + ENVELOPE_LEN;
        let len = match l2.config().vlan {
            None => {
                room.copy_within(start..start + frame_len, 0);
                frame_len
            }
            Some(vid) => match tag_in_place(room, start, frame_len, vid) {
                Some(len) => len,
                None => return,
            },
        };
        match at {
            Some(at) => out.commit_opened(i, at, len),
            None => out.commit_frame(i, len, true),
        }
    }
}
