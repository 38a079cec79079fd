//! The data path: frames from the TAPs through the switches and tunnels to the underlay,
//! datagrams from the underlay back to the TAPs, broadcasts to the group, frames that
//! waited for a lookup, and what the node and switches queue on their own (handshakes,
//! hellos, ARP probes).

use std::future::poll_fn;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Instant;

use hyphae_migrate::{Announce, Presence};
use hyphae_overlay::{Event, NamespaceId, PeerHandle, Received};
use hyphae_vswitch::mtu::Fragments;
use hyphae_vswitch::offload::{
    self, complete_checksum, Gso, Offer, Segments, VirtioHeader, VIRTIO_HEADER_LEN,
};
use hyphae_vswitch::{Action, HEADROOM};
use tokio::io::unix::AsyncFd;

use crate::config::Mode;
use crate::driver::{Agent, Namespace};
use crate::services::HeldBy;
use crate::workers::{Io, Tap};

impl Agent {
    /// The datagrams of the batch this worker received: decrypt, check, switch, write to
    /// the TAP. Frames of one TCP flow leave for the TAP coalesced (written by the worker
    /// once it lets go of the agent).
    pub(crate) async fn receive_datagrams(&mut self, now: Instant) {
        // The buffer leaves `io` for the batch, so packets decrypted into it can be written
        // by methods that borrow the rest.
        let mut tx = std::mem::take(&mut self.io.tx);
        // The underlay too, while its datagrams are read.
        let Some(underlay) = self.io.underlay.take() else {
            self.io.tx = tx;
            return;
        };
        for d in underlay.datagrams() {
            let received = self
                .node
                .handle_datagram(now, d.from, d.bytes, &mut tx[HEADROOM..]);
            match received {
                Received::Deliver { ns, len, .. } => {
                    let packet = HEADROOM..HEADROOM + len;
                    let dst = tx.get(packet.start + 16..packet.start + 20);
                    if let Some(dst) = dst.and_then(|d| <[u8; 4]>::try_from(d).ok()) {
                        if let Some(peer) = self.forward_to(ns.0, dst.into(), now) {
                            self.forwards.push((peer, tx[packet].to_vec()));
                            continue;
                        }
                    }
                    let Some(n) = self.namespaces.get_mut(ns.0) else {
                        continue;
                    };
                    if let Action::ToTap { len } = n.switch.handle_peer_packet(&mut tx, len, now) {
                        if n.active() {
                            self.io.deliver(ns.0, n, &tx[..len]);
                        }
                    }
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
        self.io.tx = tx;
        self.io.underlay = Some(underlay);
        // Packets for LAN hosts that moved away go on to their new router.
        for (peer, packet) in std::mem::take(&mut self.forwards) {
            if let Some(t) = self.node.send(peer, &packet, &mut self.io.tx) {
                self.io.push_tx(&mut self.outbox, t.to, t.range).await;
            }
        }
    }

    /// The frames this worker read from a TAP: switch, encrypt, send to the member (or
    /// answer ARP). Datagrams to one member leave in GSO batches.
    pub(crate) async fn switch_frames(&mut self, now: Instant) {
        // The receive buffer leaves `io` for the batch, so frames can be switched by a
        // method that borrows the rest of the agent.
        let mut rx = std::mem::take(&mut self.io.rx);
        let frames = std::mem::take(&mut self.io.frames);
        for (i, range) in frames.iter().cloned() {
            let Some(n) = self.namespaces.get(i).filter(|n| n.active()) else {
                continue;
            };
            if n.offload {
                self.switch_super_frame(i, &mut rx[range], now).await;
            } else {
                self.switch_frame(i, &mut rx[range], now).await;
            }
        }
        self.io.rx = rx;
        self.io.frames = frames;
    }

    /// What a worker does after its batch, still holding the agent: sends what the node
    /// queued and applies its events; a router probes its LAN for hosts members sent to;
    /// wakes the control thread if the batch left it work or an earlier deadline.
    pub(crate) async fn after_batch(&mut self, now: Instant, from_members: bool) {
        self.flush_node(now).await;
        if from_members {
            for i in 0..self.namespaces.len() {
                if self.namespaces[i].mode == Mode::Router && self.namespaces[i].active() {
                    self.flush_switch(i, now);
                }
            }
        }
        let earlier = match (self.poll_timeout(), self.main_deadline) {
            (Some(t), Some(main)) => t < main,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if std::mem::take(&mut self.control_work) || earlier {
            self.poke.notify_one();
        }
    }

    /// Worker 0: sends what the control thread left in the outbox.
    pub(crate) async fn send_outbox(&mut self) {
        for (to, datagram) in std::mem::take(&mut self.outbox) {
            self.io.push(&mut Vec::new(), to, &datagram).await;
        }
    }

    /// Adds what the worker now holding the agent counted without it to the namespaces'
    /// counters.
    pub(crate) fn fold_counts(&mut self) {
        for i in 0..self.namespaces.len() {
            let p = self.io.take_pending(i);
            let n = &mut self.namespaces[i];
            n.offload_counters.coalesced_writes += p.coalesced_writes;
            n.offload_counters.coalesced_frames += p.coalesced_frames;
            n.tap_errors += p.tap_errors;
        }
    }

    /// A read from a TAP with offloads: the virtio-net header, then a frame to complete
    /// (checksum) or a super-frame to cut into tunnel-sized segments, each switched as a
    /// frame of its own. One that cannot be taken apart is a counted drop.
    async fn switch_super_frame(&mut self, i: usize, bytes: &mut [u8], now: Instant) {
        let header = match VirtioHeader::parse(bytes) {
            Ok(h) => h,
            Err(e) => return self.offload_drop(i, e),
        };
        let frame = &mut bytes[VIRTIO_HEADER_LEN..];
        match header.gso() {
            Ok(Gso::None) => match complete_checksum(&header, frame) {
                Ok(()) => self.switch_frame(i, frame, now).await,
                Err(e) => self.offload_drop(i, e),
            },
            Ok(Gso::Tcp | Gso::Udp) => {
                let mut segments = match Segments::new(&header, frame) {
                    Ok(s) => s,
                    Err(e) => return self.offload_drop(i, e),
                };
                let counters = &mut self.namespaces[i].offload_counters;
                counters.super_frames += 1;
                counters.segments += segments.count() as u64;
                // The buffer leaves `io` while segments are switched, as the receive buffer
                // does.
                let mut buf = std::mem::take(&mut self.io.segment);
                while let Some(len) = segments.next_into(&mut buf) {
                    self.switch_frame(i, &mut buf[..len], now).await;
                }
                self.io.segment = buf;
            }
            Err(e) => self.offload_drop(i, e),
        }
    }

    fn offload_drop(&mut self, i: usize, error: offload::Error) {
        self.namespaces[i].offload_counters.malformed += 1;
        tracing::trace!(?error, "TAP super-frame dropped");
    }

    /// One frame from TAP `i`: to a member, an ARP reply back to the TAP, or held while
    /// its destination resolves. The switch may rewrite it (a TCP SYN's MSS).
    pub(crate) async fn switch_frame(&mut self, i: usize, frame: &mut [u8], now: Instant) {
        let n = &mut self.namespaces[i];
        let action = n.switch.handle_tap_frame(frame, now, &mut self.io.reply);
        match action {
            Action::ToPeer { peer, packet } => {
                if let Some(t) = self.node.send(peer, &frame[packet], &mut self.io.tx) {
                    self.io.push_tx(&mut self.outbox, t.to, t.range).await;
                }
            }
            Action::Broadcast { packet } => self.broadcast(i, &frame[packet], now).await,
            Action::Fragment { peer, packet, mtu } => {
                self.send_fragments(i, peer, &frame[packet], mtu, now).await;
            }
            Action::Dhcp { payload, mac } => {
                self.control_work = true;
                self.handle_dhcp(i, &frame[payload], mac, now);
            }
            Action::Dns { payload, client } => {
                self.control_work = true;
                n.dns.handle_udp_query(
                    now,
                    &frame[payload],
                    client.ip,
                    client,
                    &HeldBy(&n.membership),
                );
            }
            Action::Service { packet, mac } => {
                self.control_work = true;
                n.dns
                    .handle_service_packet(now, &frame[packet], mac, &HeldBy(&n.membership));
            }
            Action::ToTap { len } => self.io.write(i, n, &self.io.reply[..len]),
            Action::Resolve { target } => {
                self.control_work = true;
                n.membership.hold(now, target, frame);
            }
            Action::Drop(_) => {}
        }
        // Router and hybrid switches learn LAN hosts and queue probes from what they see.
        if self.namespaces[i].mode != Mode::Interface {
            self.flush_switch(i, now);
        }
    }

    /// A packet larger than the tunnel MTU, in fragments: to `peer`, or to every member.
    async fn send_fragments(
        &mut self,
        i: usize,
        peer: Option<PeerHandle>,
        packet: &[u8],
        mtu: u16,
        now: Instant,
    ) {
        let Some(mut fragments) = Fragments::new(packet, mtu) else {
            return;
        };
        // The buffer leaves `io` while fragments are sent, as the receive buffer does.
        let mut buf = std::mem::take(&mut self.io.fragment);
        while let Some(len) = fragments.next_into(&mut buf) {
            match peer {
                Some(peer) => {
                    if let Some(t) = self.node.send(peer, &buf[..len], &mut self.io.tx) {
                        self.io.push_tx(&mut self.outbox, t.to, t.range).await;
                    }
                }
                None => self.broadcast(i, &buf[..len], now).await,
            }
        }
        self.io.fragment = buf;
    }

    /// A broadcast or multicast packet from the host or the LAN: to every member of the
    /// namespace's group.
    async fn broadcast(&mut self, i: usize, packet: &[u8], now: Instant) {
        let n = &mut self.namespaces[i];
        if n.group.is_empty() {
            n.membership.refresh_group_soon(now);
            self.control_work = true;
        }
        for k in 0..self.namespaces[i].group.len() {
            let id = self.namespaces[i].group[k];
            let Some(handle) = self.node.member_handle(NamespaceId(i), id) else {
                continue;
            };
            if let Some(t) = self.node.send(handle, packet, &mut self.io.tx) {
                self.io.push_tx(&mut self.outbox, t.to, t.range).await;
            }
        }
    }

    /// Writes what switch `i` wants on its TAP (ARP probes and deferred replies) and tells
    /// the membership what it learned about the LAN (router mode: claim or release hosts).
    pub(crate) fn flush_switch(&mut self, i: usize, now: Instant) {
        let n = &mut self.namespaces[i];
        while let Some(len) = n.switch.poll_transmit(&mut self.io.reply) {
            self.io.write(i, n, &self.io.reply[..len]);
        }
        let mut changed = false;
        let mut presences = Vec::new();
        while let Some(event) = n.switch.poll_event() {
            self.control_work = true;
            let (address, mac, announce) = match event {
                hyphae_vswitch::Event::LanHostUp(a) => {
                    n.membership.add_hosted(a, now);
                    continue;
                }
                hyphae_vswitch::Event::LanHostDown(a) => {
                    changed |= n.membership.remove_hosted(a);
                    continue;
                }
                // A host announcing itself after a migration (counted in status as
                // `lan_announcements`); a new one is claimed (LanHostUp came first), and
                // a refused claim starts the handoff (crate::migration).
                hyphae_vswitch::Event::Rarp(mac) => (None, mac, Announce::Rarp),
                hyphae_vswitch::Event::GratuitousArp { address, mac } => {
                    (Some(address), mac, Announce::GratuitousArp)
                }
                // A host a handoff probes for answered: it never left.
                hyphae_vswitch::Event::LanHostHeard { address, mac } => {
                    (Some(address), mac, Announce::Packet)
                }
            };
            tracing::debug!(namespace = %n.name, ?address, ?mac, ?announce, "LAN host seen");
            presences.push(Presence {
                address,
                mac,
                announce,
            });
        }
        if changed {
            let addresses = n.membership.addresses();
            self.node.set_addresses(now, NamespaceId(i), addresses);
        }
        for presence in presences {
            self.lan_presence(i, now, presence);
        }
    }

    /// Frames that waited for a member's addresses go through the switch again.
    async fn replay(&mut self, i: usize, frames: Vec<Vec<u8>>, now: Instant) {
        for mut frame in frames {
            self.switch_frame(i, &mut frame, now).await;
        }
    }

    /// Sends what the node queued (handshakes, hellos, announcements) and applies its
    /// events; replays frames whose destination resolved.
    pub(crate) async fn flush_node(&mut self, now: Instant) {
        for (i, frames) in std::mem::take(&mut self.replays) {
            self.replay(i, frames, now).await;
        }
        while let Some((to, datagram)) = self.node.poll_transmit() {
            self.io.push(&mut self.outbox, to, &datagram).await;
        }
        while let Some(event) = self.node.poll_event() {
            self.control_work = true;
            match event {
                Event::PeerUnreachable {
                    ns,
                    peer,
                    addresses,
                } => {
                    if let Some(n) = self.namespaces.get_mut(ns.0) {
                        n.switch.remove_peer(peer);
                        n.membership.forget(&addresses);
                    }
                }
                Event::PeerAddresses {
                    ns,
                    peer,
                    addresses,
                } => {
                    if let Some(n) = self.namespaces.get_mut(ns.0) {
                        n.switch.set_peer_addresses(peer, &addresses);
                        let frames = n.membership.take_pending(&addresses);
                        if !frames.is_empty() {
                            self.replay(ns.0, frames, now).await;
                        }
                    }
                }
            }
        }
    }
}

/// What the TAP offloads of one namespace did (`hyphae status`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct OffloadCounters {
    /// Super-frames read from the TAP and cut into segments.
    pub(crate) super_frames: u64,
    /// The segments they were cut into.
    pub(crate) segments: u64,
    /// Super-frames of coalesced member frames written to the TAP.
    pub(crate) coalesced_writes: u64,
    /// Member frames merged into them.
    pub(crate) coalesced_frames: u64,
    /// Reads whose virtio-net header or headers could not be taken apart.
    pub(crate) malformed: u64,
}

/// Resolves with the index of the first TAP queue that is readable.
pub(crate) async fn any_readable(taps: &[Option<AsyncFd<Tap>>]) -> usize {
    poll_fn(|cx| {
        for (i, tap) in taps.iter().enumerate() {
            let Some(tap) = tap else {
                continue;
            };
            // The guard is dropped with its readiness retained: the worker reads until
            // WouldBlock, which clears it.
            if let Poll::Ready(Ok(_guard)) = tap.poll_read_ready(cx) {
                return Poll::Ready(i);
            }
        }
        Poll::Pending
    })
    .await
}

/// Frames out to a namespace's TAP, and datagrams out to the underlay, from the thread that
/// holds the agent.
impl Io {
    /// Writes `frame` to TAP `i` (behind a plain virtio-net header when offloads are on):
    /// through this worker's queue, or the first on the control thread. A failure is
    /// counted.
    pub(crate) fn write(&self, i: usize, n: &mut Namespace, frame: &[u8]) {
        let tap = self
            .taps
            .get(i)
            .and_then(Option::as_ref)
            .map(AsyncFd::get_ref);
        let sent = tap.or(n.tap.as_ref()).is_some_and(|t| {
            if n.offload {
                let mut header = [0u8; VIRTIO_HEADER_LEN];
                let _ = VirtioHeader::PLAIN.emit(&mut header);
                let parts = [IoSlice::new(&header), IoSlice::new(frame)];
                t.send_vectored(&parts).is_ok()
            } else {
                t.send(frame).is_ok()
            }
        });
        if sent {
            self.counters.frames_out.fetch_add(1, Ordering::Relaxed);
        } else {
            n.tap_errors += 1;
        }
    }

    /// Writes a member's frame to TAP `i`; with offloads on, consecutive frames of one TCP
    /// flow (or UDP flow, where the TAP takes UDP segmentation offload) are held to leave
    /// as one super-frame ([`Io::flush_coalesced`]).
    pub(crate) fn deliver(&mut self, i: usize, n: &mut Namespace, frame: &[u8]) {
        if !n.offload || self.gro.len() <= i {
            return self.write(i, n, frame);
        }
        loop {
            match self.gro[i].handle_frame(frame) {
                Offer::Held => return,
                Offer::Busy => self.flush_coalesced_one(i, n.tap.as_ref()),
                Offer::Refused => return self.write(i, n, frame),
            }
        }
    }

    /// Sends `datagram`: on this worker's underlay, or (the control thread) into `outbox`
    /// for worker 0.
    pub(crate) async fn push(
        &mut self,
        outbox: &mut Vec<(SocketAddr, Vec<u8>)>,
        to: SocketAddr,
        datagram: &[u8],
    ) {
        send(&mut self.underlay, outbox, to, datagram).await;
    }

    /// Sends the datagram the node built at `range` of `tx`, as [`Io::push`] does.
    pub(crate) async fn push_tx(
        &mut self,
        outbox: &mut Vec<(SocketAddr, Vec<u8>)>,
        to: SocketAddr,
        range: std::ops::Range<usize>,
    ) {
        send(&mut self.underlay, outbox, to, &self.tx[range]).await;
    }
}

/// [`Io::push`], on the fields it needs (so a datagram in the same `Io` can be sent).
async fn send(
    underlay: &mut Option<crate::underlay::Underlay>,
    outbox: &mut Vec<(SocketAddr, Vec<u8>)>,
    to: SocketAddr,
    datagram: &[u8],
) {
    match underlay {
        Some(u) => u.push(to, datagram).await,
        None => outbox.push((to, datagram.to_vec())),
    }
}
