//! The data path, run while the data plane is held: frames from the TAPs through the switches
//! and tunnels, datagrams from the underlay back to the TAPs, broadcasts to the group, and
//! what the node and switches queue on their own (handshakes, hellos, ARP probes). Every
//! method writes what to send and write into a [`Batch`] and does no I/O.

use std::ops::Range;
use std::time::Instant;

use hyphae_overlay::{Event, NamespaceId, PeerHandle, Received};
use hyphae_vswitch::mtu::Fragments;
use hyphae_vswitch::offload::VIRTIO_HEADER_LEN;
use hyphae_vswitch::offload::{self, complete_checksum, Gso, Segments, VirtioHeader};
use hyphae_vswitch::policy::flows::Verdict;
use hyphae_vswitch::policy::reject;
use hyphae_vswitch::qos::Paced;
use hyphae_vswitch::{Action, HEADROOM};

use super::data::{Batch, DataPlane, ToControl};
use crate::config::Mode;
use crate::underlay::Datagram;

/// Counts a worker gathered for one namespace while it did not hold the data plane.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Pending {
    pub(crate) coalesced_writes: u64,
    pub(crate) coalesced_frames: u64,
    pub(crate) tap_errors: u64,
}

impl DataPlane {
    /// Datagrams from the underlay: decrypt, check, switch; the frames for the TAPs go into
    /// `out` (members' frames, which the worker coalesces per flow). The first datagrams may
    /// have been opened already ([`Batch::open`]): those are only checked and switched.
    pub(crate) fn handle_datagrams<'a>(
        &mut self,
        now: Instant,
        datagrams: impl Iterator<Item = Datagram<'a>>,
        out: &mut Batch,
    ) {
        let mut opened = std::mem::take(&mut out.opened);
        let mut opened_iter = opened.drain(..);
        for d in datagrams {
            let received = match opened_iter.next() {
                Some((opened, at)) => {
                    let room = out.opened_room(at + HEADROOM);
                    match self.node.accept(now, d.from, opened, room) {
                        Received::Deliver { ns, peer, len } => {
                            self.deliver(now, ns.0, peer, Some(at), len, out);
                            continue;
                        }
                        other => other,
                    }
                }
                None => {
                    let room = out.frame_room(HEADROOM + d.bytes.len());
                    self.node
                        .handle_datagram(now, d.from, d.bytes, &mut room[HEADROOM..])
                }
            };
            match received {
                Received::Deliver { ns, peer, len } => {
                    self.deliver(now, ns.0, peer, None, len, out);
                }
                Received::Dropped(reason) => {
                    tracing::trace!(from = %d.from, reason = reason.as_str(), "datagram dropped");
                }
                Received::PeerDropped(_, reason) => {
                    tracing::trace!(from = %d.from, reason = reason.as_str(), "tunnel packet dropped");
                }
                Received::Consumed => {}
            }
        }
        drop(opened_iter);
        out.opened = opened;
    }

    /// A packet of `len` bytes from the member of tunnel `from`, of namespace `i`, lies in
    /// `out`'s frame area behind [`HEADROOM`] (`at`: where [`Batch::open`] opened it; else
    /// in the frame room): checked by the policy, then framed in place for the TAP, or (a
    /// LAN host that moved away) sent on.
    fn deliver(
        &mut self,
        now: Instant,
        i: usize,
        from: PeerHandle,
        at: Option<usize>,
        len: usize,
        out: &mut Batch,
    ) {
        let mut forward = std::mem::take(&mut out.forward);
        self.deliver_with(now, i, from, at, len, out, &mut forward);
        out.forward = forward;
    }

    /// [`DataPlane::deliver`], with the batch's buffer for a packet sent on to another
    /// member taken out of it.
    #[allow(clippy::too_many_arguments)]
    fn deliver_with(
        &mut self,
        now: Instant,
        i: usize,
        from: PeerHandle,
        at: Option<usize>,
        len: usize,
        out: &mut Batch,
        forward: &mut Vec<u8>,
    ) {
        let Some(lane) = self.lanes.get_mut(i) else {
            return;
        };
        if lane.l2.is_some() {
            return self.deliver_l2(now, i, from, at, len, out);
        }
        let room = out.packet_room(at, HEADROOM + len);
        let packet = &room[HEADROOM..];
        match lane
            .policy
            .inbound(now, &self.node, from, packet, lane.switch.config())
        {
            Verdict::Pass => {}
            Verdict::Reject => {
                let packet = packet.to_vec();
                return self.reject_to_member(from, &packet, out);
            }
            Verdict::Deny | Verdict::StrayIcmpError => return,
        }
        // A gateway's: for a linked namespace. (Copied out of the batch's frame area,
        // which sealing writes.)
        if let Some(j) = self.crossing(i, packet) {
            forward.clear();
            forward.extend_from_slice(packet);
            return self.cross(now, i, j, forward, out);
        }
        let lane = &mut self.lanes[i];
        if let Some(to) = lane.grace_forward(now, packet) {
            forward.clear();
            forward.extend_from_slice(packet);
            return out.seal(&mut self.node, to, forward);
        }
        let capped = match lane.caps.as_mut() {
            Some(caps) => caps.key(&self.node, from, packet, true),
            None => None,
        };
        let ip_len = len;
        if let hyphae_vswitch::Action::ToTap { len } =
            lane.switch.handle_peer_packet(now, room, len)
        {
            if !lane.active {
                return;
            }
            if let (Some((key, rate, burst)), Some(caps)) = (capped, lane.caps.as_mut()) {
                if !caps
                    .ingress
                    .send_now(now, &key, ip_len, || super::caps::pacer(rate, burst))
                {
                    // Held (a copy: the batch's frame area is reused), or dropped.
                    if let Paced::Now(frame) =
                        caps.ingress.push(now, key, room[..len].to_vec(), ip_len)
                    {
                        out.frame_room(frame.len()).copy_from_slice(&frame);
                        out.commit_frame(i, frame.len(), true);
                    }
                    return;
                }
            }
            match at {
                Some(at) => out.commit_opened(i, at, len),
                None => out.commit_frame(i, len, true),
            }
        }
    }

    /// Frames a worker read from the TAPs (namespace and range in `rx`): switch, encrypt,
    /// answer ARP, or hand to the control thread (DHCP, DNS, a lookup).
    pub(crate) fn handle_frames(
        &mut self,
        now: Instant,
        frames: &[(usize, Range<usize>)],
        rx: &mut [u8],
        out: &mut Batch,
    ) {
        // What a rate cap held goes first, in order, before new packets join its queue.
        self.release_paced(now, out);
        for (i, range) in frames.iter().cloned() {
            let Some(lane) = self.lanes.get(i).filter(|l| l.active) else {
                continue;
            };
            let Some(bytes) = rx.get_mut(range) else {
                continue;
            };
            if lane.offload {
                self.switch_super_frame(i, bytes, now, out);
            } else {
                self.switch_frame(i, bytes, now, out);
            }
        }
    }

    /// A read from a TAP with offloads: the virtio-net header, then a frame to complete
    /// (checksum) or a super-frame to cut into tunnel-sized segments, each switched as a
    /// frame of its own. One that cannot be taken apart is a counted drop.
    fn switch_super_frame(&mut self, i: usize, bytes: &mut [u8], now: Instant, out: &mut Batch) {
        let header = match VirtioHeader::parse(bytes) {
            Ok(h) => h,
            Err(e) => return self.offload_drop(i, e),
        };
        let frame = &mut bytes[VIRTIO_HEADER_LEN..];
        match header.gso() {
            Ok(Gso::None) => match complete_checksum(&header, frame) {
                Ok(()) => self.switch_frame(i, frame, now, out),
                Err(e) => self.offload_drop(i, e),
            },
            Ok(Gso::Tcp | Gso::Udp) => {
                let mut segments = match Segments::new(&header, frame) {
                    Ok(s) => s,
                    Err(e) => return self.offload_drop(i, e),
                };
                let counters = &mut self.lanes[i].offload_counters;
                counters.super_frames += 1;
                counters.segments += segments.count() as u64;
                // The buffer leaves the batch while segments are switched into it.
                let mut buf = std::mem::take(&mut out.segment);
                while let Some(len) = segments.next_into(&mut buf) {
                    self.switch_frame(i, &mut buf[..len], now, out);
                }
                out.segment = buf;
            }
            Err(e) => self.offload_drop(i, e),
        }
    }

    fn offload_drop(&mut self, i: usize, error: offload::Error) {
        self.lanes[i].offload_counters.malformed += 1;
        tracing::trace!(?error, "TAP super-frame dropped");
    }

    /// One frame from TAP `i`: to a member, an ARP reply back to the TAP, or to the control
    /// thread. The switch may rewrite it (a TCP SYN's MSS).
    pub(crate) fn switch_frame(
        &mut self,
        i: usize,
        frame: &mut [u8],
        now: Instant,
        out: &mut Batch,
    ) {
        let lane = &mut self.lanes[i];
        if let Some(l2) = lane.l2.as_mut() {
            if let Some(frame) = l2.untag(frame) {
                self.switch_l2_frame(i, frame, now, out);
            }
            return;
        }
        let action = lane.switch.handle_tap_frame(now, frame, &mut out.reply);
        match action {
            Action::ToPeer { peer, packet } => {
                match lane.policy.outbound(
                    now,
                    &self.node,
                    peer,
                    &frame[packet.clone()],
                    lane.switch.config(),
                ) {
                    Verdict::Pass => self.send_capped(now, i, peer, &frame[packet], out),
                    Verdict::Reject => reject_to_tap(i, frame, packet, out),
                    Verdict::Deny | Verdict::StrayIcmpError => {}
                }
            }
            Action::Broadcast { packet } => {
                self.broadcast(i, &frame[packet.clone()], out);
                self.copy_to_lan(now, i, frame, packet, out);
            }
            Action::Fragment { peer, packet, mtu } => {
                // The whole packet is checked once; its fragments follow it.
                let verdict = match peer {
                    Some(to) => lane.policy.outbound(
                        now,
                        &self.node,
                        to,
                        &frame[packet.clone()],
                        lane.switch.config(),
                    ),
                    None => Verdict::Pass,
                };
                if peer.is_none() {
                    self.copy_to_lan(now, i, frame, packet.clone(), out);
                }
                match verdict {
                    Verdict::Pass => self.send_fragments(now, i, peer, &frame[packet], mtu, out),
                    Verdict::Reject => reject_to_tap(i, frame, packet, out),
                    Verdict::Deny | Verdict::StrayIcmpError => {}
                }
            }
            Action::Dhcp { payload, mac } => self.tell_control(ToControl::Dhcp {
                ns: i,
                payload: frame[payload].to_vec(),
                mac,
            }),
            Action::Dhcp6 { payload, client } => self.tell_control(ToControl::Dhcp6 {
                ns: i,
                payload: frame[payload].to_vec(),
                client,
            }),
            Action::Dns { payload, client } => self.tell_control(ToControl::Dns {
                ns: i,
                payload: frame[payload].to_vec(),
                client,
            }),
            Action::Service { packet, mac } => self.tell_control(ToControl::Service {
                ns: i,
                packet: frame[packet].to_vec(),
                mac,
            }),
            Action::ToTap { len } => out.write_reply(i, len),
            Action::Hairpin { packet } => {
                let lane = &mut self.lanes[i];
                match lane.policy.local(now, &frame[packet.clone()]) {
                    Verdict::Pass => {
                        let len = packet.end;
                        out.frame_room(len).copy_from_slice(&frame[..len]);
                        out.commit_frame(i, len, true);
                    }
                    Verdict::Reject => {
                        // Back to the sender, which the switch knows by its address.
                        let sender = frame
                            .get(packet.clone())
                            .and_then(super::policy::ends)
                            .and_then(|(src, _)| lane.switch.lan_host_mac(src));
                        if let Some(sender) = sender {
                            // As it came: from the sender, to the router MAC.
                            frame.copy_within(6..12, 0);
                            frame[6..12].copy_from_slice(&sender);
                            reject_to_tap(i, frame, packet, out);
                        }
                    }
                    Verdict::Deny | Verdict::StrayIcmpError => {}
                }
            }
            Action::Resolve { target } => self.tell_control(ToControl::Hold {
                ns: i,
                target,
                frame: frame.to_vec(),
            }),
            Action::Drop(_) => {}
        }
        // Router and hybrid switches learn LAN hosts and queue probes from what they see.
        if self.lanes[i].mode != Mode::Interface {
            self.flush_switch(i, out);
        }
    }

    /// VEPA: a LAN host's broadcast `frame` (which went to the members; its IPv4 packet at
    /// `packet`) is written for each other LAN host, addressed to it from the router MAC,
    /// never to its sender: if the policy passes it between LAN hosts (members check it
    /// on arrival, as for any broadcast).
    fn copy_to_lan(
        &mut self,
        now: Instant,
        i: usize,
        frame: &[u8],
        packet: Range<usize>,
        out: &mut Batch,
    ) {
        let lane = &mut self.lanes[i];
        if lane.mode != Mode::Router
            || lane.switch.config().lan_ports != hyphae_vswitch::LanPorts::Vepa
        {
            return;
        }
        let frame = &frame[..packet.end];
        if lane.policy.local(now, &frame[packet]) != Verdict::Pass {
            return;
        }
        let mut macs = std::mem::take(&mut out.lan_copies);
        lane.switch.lan_copies(frame, &mut macs);
        for &mac in &macs {
            let room = out.frame_room(frame.len());
            room.copy_from_slice(frame);
            lane.switch.address_copy(room, mac);
            out.commit_frame(i, frame.len(), false);
        }
        out.lan_copies = macs;
    }

    /// `packet` from this member (or its LAN) to the member of tunnel `peer`: under the
    /// cap per member or host that picks it, if any, then under namespace `i`'s rate cap if
    /// it has one. Each sends at once what is within its rate, holds what is not until its
    /// tokens come, or drops it (counted) if it would wait longer than its delay. What goes
    /// on takes its turn in the uplink's shares.
    fn send_capped(
        &mut self,
        now: Instant,
        i: usize,
        peer: PeerHandle,
        packet: &[u8],
        out: &mut Batch,
    ) {
        if let Some(caps) = self.lanes[i].caps.as_mut() {
            if let Some((key, rate, burst)) = caps.key(&self.node, peer, packet, false) {
                if !caps
                    .egress
                    .send_now(now, &key, packet.len(), || super::caps::pacer(rate, burst))
                {
                    if let Paced::Now((peer, packet)) =
                        caps.egress
                            .push(now, key, (peer, packet.to_vec()), packet.len())
                    {
                        self.send_namespace_capped(now, i, peer, packet, out);
                    }
                    return;
                }
            }
        }
        let Some(pacer) = self.lanes[i].egress.as_mut() else {
            return self.send_shared_ref(now, i, peer, packet, out);
        };
        if pacer.send_now(now, packet.len()) {
            return self.send_shared_ref(now, i, peer, packet, out);
        }
        if let Paced::Now((peer, packet)) = pacer.push(now, (peer, packet.to_vec()), packet.len()) {
            self.send_shared(now, i, peer, packet, out);
        }
    }

    /// A packet a member's cap let go: under namespace `i`'s cap, then the shares.
    fn send_namespace_capped(
        &mut self,
        now: Instant,
        i: usize,
        peer: PeerHandle,
        packet: Vec<u8>,
        out: &mut Batch,
    ) {
        let Some(pacer) = self.lanes[i].egress.as_mut() else {
            return self.send_shared(now, i, peer, packet, out);
        };
        let len = packet.len();
        if let Paced::Now((peer, packet)) = pacer.push(now, (peer, packet), len) {
            self.send_shared(now, i, peer, packet, out);
        }
    }

    /// What namespace `i`'s caps per member and host held and may go at `now`: packets on
    /// to the namespace's cap, frames to the TAP.
    pub(crate) fn release_caps(&mut self, now: Instant, i: usize, out: &mut Batch) {
        while let Some((peer, packet)) =
            self.lanes[i].caps.as_mut().and_then(|c| c.egress.poll(now))
        {
            self.send_namespace_capped(now, i, peer, packet, out);
        }
        let lane = &mut self.lanes[i];
        let Some(caps) = lane.caps.as_mut() else {
            return;
        };
        caps.sweep(now);
        while let Some(frame) = caps.ingress.poll(now) {
            if lane.active {
                out.frame_room(frame.len()).copy_from_slice(&frame);
                out.commit_frame(i, frame.len(), true);
            }
        }
    }

    /// `packet` of namespace `i` for the member of tunnel `peer`, under the uplink's
    /// shares if `[agent] uplink_rate` is set: sealed now if the uplink has room and no
    /// namespace waits, else queued in namespace `i`'s turn (or dropped, counted).
    fn send_shared_ref(
        &mut self,
        now: Instant,
        i: usize,
        peer: PeerHandle,
        packet: &[u8],
        out: &mut Batch,
    ) {
        if let Some(s) = self.shares.as_mut() {
            if !s.send_now(now, i, packet.len()) {
                let flow = hyphae_vswitch::qos::flow_of(packet);
                let member = self.share_member(i, peer, packet);
                if let Some(s) = self.shares.as_mut() {
                    let _ =
                        s.push_member(now, i, member, flow, (peer, packet.to_vec()), packet.len());
                }
                return;
            }
        }
        out.seal(&mut self.node, peer, packet);
    }

    /// [`DataPlane::send_shared_ref`] for a packet already owned (one a cap held).
    pub(crate) fn send_shared(
        &mut self,
        now: Instant,
        i: usize,
        peer: PeerHandle,
        packet: Vec<u8>,
        out: &mut Batch,
    ) {
        if self.shares.is_none() {
            return out.seal(&mut self.node, peer, &packet);
        }
        let (len, flow) = (packet.len(), hyphae_vswitch::qos::flow_of(&packet));
        let member = self.share_member(i, peer, &packet);
        if let Some(s) = self.shares.as_mut() {
            if let Paced::Now((peer, packet)) =
                s.push_member(now, i, member, flow, (peer, packet), len)
            {
                out.seal(&mut self.node, peer, &packet);
            }
        }
    }

    /// Which member part of namespace `i`'s share `packet` to `peer` takes, and its weight.
    fn share_member(&mut self, i: usize, peer: PeerHandle, packet: &[u8]) -> (u64, u64) {
        match self.lanes[i].caps.as_mut() {
            Some(caps) => caps.share_member(&self.node, peer, packet),
            None => (0, 1),
        }
    }

    /// The policy rejects `packet` from the member of tunnel `to`: it is told (a TCP reset,
    /// ICMP port unreachable), through the tunnel.
    fn reject_to_member(&mut self, to: PeerHandle, packet: &[u8], out: &mut Batch) {
        let mut answer = [0u8; reject::MAX_ANSWER_LEN];
        if let Some(len) = reject::answer(packet, &mut answer) {
            out.seal(&mut self.node, to, &answer[..len]);
        }
    }

    /// A packet larger than the tunnel MTU, in fragments: to `peer`, or to every member.
    fn send_fragments(
        &mut self,
        now: Instant,
        i: usize,
        peer: Option<PeerHandle>,
        packet: &[u8],
        mtu: u16,
        out: &mut Batch,
    ) {
        let Some(mut fragments) = Fragments::new(packet, mtu) else {
            return;
        };
        // The buffer leaves the batch while fragments are sealed into it.
        let mut buf = std::mem::take(&mut out.fragment);
        while let Some(len) = fragments.next_into(&mut buf) {
            match peer {
                Some(peer) => self.send_capped(now, i, peer, &buf[..len], out),
                None => self.broadcast(i, &buf[..len], out),
            }
        }
        out.fragment = buf;
    }

    /// A broadcast or multicast packet from the host or the LAN: to every member of the
    /// namespace's group.
    fn broadcast(&mut self, i: usize, packet: &[u8], out: &mut Batch) {
        self.each_member(i, out, |node, out, handle| out.seal(node, handle, packet));
    }

    /// Calls `send` with each member of namespace `i`'s group (asking the control thread
    /// to read the group if it is not known yet).
    pub(crate) fn each_member(
        &mut self,
        i: usize,
        out: &mut Batch,
        send: impl Fn(&mut hyphae_overlay::Node, &mut Batch, PeerHandle),
    ) {
        let lane = &mut self.lanes[i];
        if lane.group.is_empty() {
            if !std::mem::replace(&mut lane.group_wanted, true) {
                self.tell_control(ToControl::GroupWanted { ns: i });
            }
            return;
        }
        for k in 0..self.lanes[i].group.len() {
            let id = self.lanes[i].group[k];
            if let Some(handle) = self.node.member_handle(NamespaceId(i), id) {
                send(&mut self.node, out, handle);
            }
        }
    }

    /// Writes what switch `i` wants on its TAP (ARP probes and deferred replies) and tells
    /// the control thread what it learned about the LAN.
    pub(crate) fn flush_switch(&mut self, i: usize, out: &mut Batch) {
        let lane = &mut self.lanes[i];
        while let Some(len) = lane.switch.poll_transmit(&mut out.reply) {
            out.write_reply(i, len);
        }
        while let Some(event) = self.lanes[i].switch.poll_event() {
            // A host seen on this LAN again is not forwarded away any more (as
            // `Migrate::forward_to` stops once the host shows up here).
            let here = match event {
                hyphae_vswitch::Event::LanHostUp(a)
                | hyphae_vswitch::Event::GratuitousArp { address: a, .. } => Some(a.into()),
                hyphae_vswitch::Event::LanHostHeard { address, .. } => Some(address),
                // An IPv6 host back here stops the forwarding when the handoff takes its
                // address back (`TookOver`): one frame from an address is no proof.
                hyphae_vswitch::Event::LanHost6Up(_)
                | hyphae_vswitch::Event::Announced6 { .. }
                | hyphae_vswitch::Event::LanHostDown(_)
                | hyphae_vswitch::Event::LanHost6Down(_)
                | hyphae_vswitch::Event::Rarp(_) => None,
            };
            if let Some(a) = here {
                self.lanes[i].grace.retain(|g| g.address != a);
            }
            self.tell_control(ToControl::Lan { ns: i, event });
        }
    }

    /// Queues what the node sends on its own (handshakes, hellos, announcements); applies
    /// its events to the switches and hands them to the control thread.
    pub(crate) fn drain_node(&mut self, now: Instant, out: &mut Batch) {
        while let Some((to, datagram)) = self.node.poll_transmit() {
            out.send(to, &datagram);
        }
        while let Some(event) = self.node.poll_event() {
            match &event {
                Event::PeerUnreachable { ns, peer, .. } => {
                    if let Some(lane) = self.lanes.get_mut(ns.0) {
                        lane.switch.remove_peer(*peer);
                        if let Some(l2) = lane.l2.as_mut() {
                            l2.remove_peer(*peer);
                        }
                        lane.policy.forget(*peer);
                        // Its handle is free for another tunnel: what waits for it in a
                        // cap or the shares goes, or it would be sealed to the next.
                        let gone = *peer;
                        if let Some(caps) = lane.caps.as_mut() {
                            caps.forget(gone);
                            caps.forget_queued(gone);
                        }
                        if let Some(p) = lane.egress.as_mut() {
                            p.retain(|(h, _)| *h != gone);
                        }
                        // Its handle is free for another tunnel: forward nothing to it.
                        lane.grace.retain(|g| g.to != *peer);
                    }
                    if let Some(s) = self.shares.as_mut() {
                        s.retain(|(h, _)| *h != *peer);
                    }
                }
                Event::PeerAddresses {
                    ns,
                    peer,
                    addresses,
                } => {
                    if let Some(lane) = self.lanes.get_mut(ns.0) {
                        lane.switch.set_peer_addresses(*peer, addresses);
                        // Its certificate may have changed with them.
                        lane.policy.forget(*peer);
                        if let Some(caps) = lane.caps.as_mut() {
                            caps.forget(*peer);
                        }
                    }
                }
                Event::PeerAddresses6 {
                    ns,
                    peer,
                    addresses,
                } => {
                    if let Some(lane) = self.lanes.get_mut(ns.0) {
                        lane.switch.set_peer_addresses6(*peer, addresses);
                        lane.policy.forget(*peer);
                    }
                }
                Event::PeerMacs { ns, peer, macs } => {
                    if let Some(l2) = self.lanes.get_mut(ns.0).and_then(|l| l.l2.as_mut()) {
                        l2.set_peer_macs(now, *peer, macs);
                    }
                    // A MAC of ours that moved to the member is no longer announced.
                    self.announce_macs(now, ns.0);
                }
            }
            self.tell_control(ToControl::Node(event));
        }
    }

    /// What a worker does after its batch, still holding the data plane: queues what the
    /// node sends; a router probes its LAN for hosts members sent to. Returns whether the
    /// control thread must be woken (the batch left it work, or an earlier deadline).
    pub(crate) fn after_batch(
        &mut self,
        now: Instant,
        from_members: bool,
        out: &mut Batch,
    ) -> bool {
        self.drain_node(now, out);
        if from_members {
            for i in 0..self.lanes.len() {
                if self.lanes[i].mode == Mode::Router && self.lanes[i].active {
                    self.flush_switch(i, out);
                }
            }
        }
        let earlier = match (self.poll_timeout(), self.control_deadline) {
            (Some(t), Some(control)) => t < control,
            (Some(_), None) => true,
            (None, _) => false,
        };
        std::mem::take(&mut self.wake_control) || earlier
    }

    /// Adds what a worker counted for namespace `i` without the data plane.
    pub(crate) fn fold_counts(&mut self, i: usize, p: Pending) {
        if let Some(lane) = self.lanes.get_mut(i) {
            lane.offload_counters.coalesced_writes += p.coalesced_writes;
            lane.offload_counters.coalesced_frames += p.coalesced_frames;
            lane.tap_errors += p.tap_errors;
        }
    }
}

/// The policy rejects the packet at `packet` in `frame`, from TAP `i`: the host is told (a
/// TCP reset, ICMP port unreachable) in a frame back to the MAC it came from.
fn reject_to_tap(i: usize, frame: &[u8], packet: Range<usize>, out: &mut Batch) {
    let (Some(macs), Some(ip)) = (frame.get(..12), frame.get(packet)) else {
        return;
    };
    let eth = HEADROOM;
    let Some(buf) = out.reply.get_mut(..eth + reject::MAX_ANSWER_LEN) else {
        return;
    };
    // The answer goes from where the packet went to where it came from.
    buf[..6].copy_from_slice(&macs[6..12]);
    buf[6..12].copy_from_slice(&macs[..6]);
    let ethertype: u16 = if ip.first().is_some_and(|b| b >> 4 == 6) {
        0x86dd
    } else {
        0x0800
    };
    buf[12..14].copy_from_slice(&ethertype.to_be_bytes());
    if let Some(len) = reject::answer(ip, &mut buf[eth..]) {
        out.write_reply(i, eth + len);
    }
}
