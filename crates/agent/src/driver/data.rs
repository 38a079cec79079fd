//! The data plane: what a packet needs (the tunnel node and each namespace's switch), shared
//! by the workers and the control thread behind one mutex.
//!
//! Whoever holds it runs a batch that is synchronous and free of I/O: frames and datagrams go
//! in with `now`; what to send, what to write to which TAP and what the control thread must
//! hear come out, into the caller's [`Batch`] and the data plane's bounded inbox for the
//! control thread. The caller makes the system calls after letting go, and the AEAD is not
//! run under it either: the batch opens data messages before and seals packets after,
//! holding only the tunnel shard each uses. Nothing here reads a clock, opens a socket or
//! touches a device.

use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::time::Instant;

use hyphae_overlay::{Node, Opened, PeerHandle, PeerId, Sealer, Transmit, Tunnels};
use hyphae_vswitch::qos::{Pacer, Shares};
use hyphae_vswitch::{Client, Mac, Switch, HEADROOM};

use crate::config::Mode;

/// Largest datagram or frame: the UDP maximum, with room for headers in front.
pub(crate) const BUF_LEN: usize = 65536 + 64;

/// Requests the inbox for the control thread holds at most (DHCP requests, DNS queries,
/// service-stack packets, frames held for a lookup: one per frame a host or LAN sends, so a
/// flood could fill it between two turns). Past that they are dropped and counted
/// (`drops.control_queue` in status): the clients retry, the frames were waiting for a
/// lookup anyway. Events (a LAN host learned or lost, a tunnel's addresses or its end, a
/// broadcast that found no group) happen once each and are never dropped for requests:
/// they have [`INBOX_EVENTS_LEN`] more, which their sources (the switches' LAN tables, the
/// node's tunnels) do not reach between two turns.
pub(crate) const INBOX_LEN: usize = 4096;

/// Room in the inbox beyond [`INBOX_LEN`] for events; see there.
pub(crate) const INBOX_EVENTS_LEN: usize = 4 * INBOX_LEN;

/// The data plane: the tunnels and the switches.
pub(crate) struct DataPlane {
    pub(crate) node: Node,
    pub(crate) lanes: Vec<Lane>,
    /// What batches left for the control thread, oldest first; at most [`INBOX_LEN`].
    pub(crate) inbox: Vec<ToControl>,
    /// What did not fit in the inbox.
    pub(crate) inbox_drops: u64,
    /// A batch put something in the inbox: the control thread must be woken.
    pub(crate) wake_control: bool,
    /// When the control thread wakes next on its own; a batch that sets an earlier deadline
    /// (a handshake to retry, a probe to send) wakes it.
    pub(crate) control_deadline: Option<Instant>,
    /// `[agent] uplink_rate`: the namespaces (classes by lane index) share it by weight;
    /// what exceeds it waits in its namespace's queue (docs/QOS.md).
    pub(crate) shares: Option<Shares<(PeerHandle, Vec<u8>)>>,
}

/// One namespace as the data plane sees it.
pub(crate) struct Lane {
    /// The namespace's name (the policy's links name namespaces by it).
    pub(crate) name: String,
    pub(crate) mode: Mode,
    pub(crate) switch: Switch<PeerHandle>,
    /// A layer-2 namespace's switch, which takes every frame and packet instead of
    /// `switch` (`layer2.rs`); None in an IP namespace.
    pub(crate) l2: Option<hyphae_vswitch::layer2::Layer2<PeerHandle>>,
    /// False once the namespace was left.
    pub(crate) active: bool,
    /// The TAP has offloads on: a virtio-net header leads every read and write.
    pub(crate) offload: bool,
    /// Members of the broadcast group (the control thread reads them from the DHT).
    pub(crate) group: Vec<PeerId>,
    /// A broadcast found the group empty and asked the control thread to read it.
    pub(crate) group_wanted: bool,
    /// Router mode, after a handoff: packets for a LAN host that moved away go on to its
    /// new router until the grace period ends (`hyphae_migrate::GRACE`).
    pub(crate) grace: Vec<Grace>,
    /// Writes to the TAP that failed.
    pub(crate) tap_errors: u64,
    pub(crate) offload_counters: OffloadCounters,
    /// The namespace's policy, checked on every packet to and from a member.
    pub(crate) policy: super::policy::LanePolicy,
    /// A cap on what this member sends to the namespace's members (`rate`): packets over
    /// it wait here for their tokens, at most [`hyphae_vswitch::qos::MAX_DELAY`].
    pub(crate) egress: Option<Pacer<(PeerHandle, Vec<u8>)>>,
    /// Caps per member, group and host, both ways (`[[namespace.cap]]`); None without.
    pub(crate) caps: Option<super::caps::LaneCaps>,
}

impl Lane {
    /// Router mode, after a handoff: the member a packet from the overlay goes on to, if
    /// it is for a LAN host that moved away within its grace period.
    pub(crate) fn grace_forward(&self, now: Instant, packet: &[u8]) -> Option<PeerHandle> {
        if self.grace.is_empty() {
            return None;
        }
        let dst = match packet.first()? >> 4 {
            4 => IpAddr::from(<[u8; 4]>::try_from(packet.get(16..20)?).ok()?),
            6 => IpAddr::from(<[u8; 16]>::try_from(packet.get(24..40)?).ok()?),
            _ => return None,
        };
        self.grace
            .iter()
            .find(|g| g.address == dst && g.until > now)
            .map(|g| g.to)
    }
}

/// Packets for `address` go on to `to` until `until`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grace {
    pub(crate) address: IpAddr,
    pub(crate) to: PeerHandle,
    pub(crate) until: Instant,
}

/// The tunnels as the control thread needs them with the data plane let go (the members
/// file, roaming): copied out while it is held.
pub(crate) struct TunnelList(pub(crate) Vec<TunnelEntry>);

/// One tunnel, for [`TunnelList`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct TunnelEntry {
    pub(crate) ns: usize,
    pub(crate) id: PeerId,
    pub(crate) endpoint: SocketAddr,
    /// A handshake completed.
    pub(crate) up: bool,
}

impl TunnelList {
    pub(crate) fn of(node: &Node) -> Self {
        Self(
            node.peers()
                .map(|p| TunnelEntry {
                    ns: p.ns.0,
                    id: p.id,
                    endpoint: p.endpoint,
                    up: p.handshake_age.is_some(),
                })
                .collect(),
        )
    }

    /// Every tunnel's underlay endpoint.
    pub(crate) fn endpoints(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.0.iter().map(|t| t.endpoint)
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

/// What a batch leaves for the control thread (namespaces by index).
#[derive(Debug)]
pub(crate) enum ToControl {
    /// A DHCP request for the namespace's virtual server.
    Dhcp {
        ns: usize,
        payload: Vec<u8>,
        mac: Mac,
    },
    /// A DHCPv6 message from a LAN host for the namespace's virtual server.
    Dhcp6 {
        ns: usize,
        payload: Vec<u8>,
        client: hyphae_vswitch::Client,
    },
    /// A DNS query over UDP to the service address.
    Dns {
        ns: usize,
        payload: Vec<u8>,
        client: Client,
    },
    /// A packet for the service address's TCP stack.
    Service {
        ns: usize,
        packet: Vec<u8>,
        mac: Mac,
    },
    /// A frame for an address no route is known for: held while it is looked up.
    Hold {
        ns: usize,
        target: std::net::IpAddr,
        frame: Vec<u8>,
    },
    /// A broadcast found no group: read it.
    GroupWanted { ns: usize },
    /// What a router or hybrid switch learned about its LAN.
    Lan {
        ns: usize,
        event: hyphae_vswitch::Event,
    },
    /// What the tunnel node reported (the switches already applied their part).
    Node(hyphae_overlay::Event),
    /// A layer-2 switch's MACs on this side changed: these are held as leases.
    LocalMacs { ns: usize, macs: Vec<Mac> },
}

impl ToControl {
    /// Something that happened once (not a request a client repeats or a frame a sender
    /// retransmits): never dropped for requests.
    fn is_event(&self) -> bool {
        matches!(
            self,
            Self::GroupWanted { .. } | Self::Lan { .. } | Self::Node(_) | Self::LocalMacs { .. }
        )
    }
}

impl DataPlane {
    pub(crate) fn new(node: Node) -> Self {
        Self {
            node,
            lanes: Vec::new(),
            inbox: Vec::new(),
            inbox_drops: 0,
            wake_control: false,
            control_deadline: None,
            shares: None,
        }
    }

    /// Leaves `message` for the control thread, or counts it dropped when the inbox is full
    /// (for a request: at [`INBOX_LEN`]; for an event: only past [`INBOX_EVENTS_LEN`] more).
    pub(crate) fn tell_control(&mut self, message: ToControl) {
        let bound = match message.is_event() {
            true => INBOX_LEN + INBOX_EVENTS_LEN,
            false => INBOX_LEN,
        };
        if self.inbox.len() >= bound {
            self.inbox_drops += 1;
            tracing::trace!(?message, "the control thread's inbox is full; dropped");
            return;
        }
        self.inbox.push(message);
        self.wake_control = true;
    }

    /// The earliest deadline of the tunnels and the switches.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let switches = self.lanes.iter().filter(|l| l.active).flat_map(|l| {
            [
                l.switch.poll_timeout(),
                l.l2.as_ref().and_then(|s| s.poll_timeout()),
            ]
        });
        let paced = self.lanes.iter().flat_map(|l| {
            let caps = l.caps.as_ref();
            [
                l.egress.as_ref().and_then(Pacer::poll_timeout),
                caps.and_then(|c| c.egress.poll_timeout()),
                caps.and_then(|c| c.ingress.poll_timeout()),
            ]
        });
        std::iter::once(self.node.poll_timeout())
            .chain(switches)
            .chain(paced)
            .chain(std::iter::once(
                self.shares.as_ref().and_then(Shares::poll_timeout),
            ))
            .flatten()
            .min()
    }

    /// Runs the timers of the tunnels and switches whose deadline has come; what they send
    /// and write goes into `out`. Returns whether the node's timers ran.
    pub(crate) fn handle_timeout(&mut self, now: Instant, out: &mut Batch) -> bool {
        let due = |t: Option<Instant>| t.is_some_and(|t| t <= now);
        let node = due(self.node.poll_timeout());
        if node {
            self.node.handle_timeout(now);
        }
        for i in 0..self.lanes.len() {
            let lane = &mut self.lanes[i];
            if lane.active && due(lane.switch.poll_timeout()) {
                lane.switch.handle_timeout(now);
                self.flush_switch(i, out);
            }
            let lane = &mut self.lanes[i];
            if let Some(l2) = lane.l2.as_mut().filter(|_| lane.active) {
                if due(l2.poll_timeout()) {
                    l2.handle_timeout(now);
                    self.announce_macs(now, i);
                }
            }
            self.lanes[i].grace.retain(|g| g.until > now);
        }
        self.release_paced(now, out);
        self.drain_node(now, out);
        node
    }

    /// Sends what the lanes' rate caps and the uplink's shares held and may go at `now`:
    /// what a member's cap lets go then meets the namespace's cap, and what that lets go
    /// takes its turn in the shares. Frames an ingress cap held go to the TAP.
    pub(crate) fn release_paced(&mut self, now: Instant, out: &mut Batch) {
        for i in 0..self.lanes.len() {
            if self.lanes[i].caps.is_some() {
                self.release_caps(now, i, out);
            }
            while let Some((peer, packet)) = self.lanes[i].egress.as_mut().and_then(|p| p.poll(now))
            {
                self.send_shared(now, i, peer, packet, out);
            }
        }
        while let Some((_, (peer, packet))) = self.shares.as_mut().and_then(|s| s.poll(now)) {
            out.seal(&mut self.node, peer, &packet);
        }
    }
}

/// What one batch (a worker's, or a turn of the control thread) sends and writes, built
/// while the data plane is held and carried out after it is let go; and the scratch
/// buffers the batch works in. Kept from batch to batch: nothing is allocated once the
/// buffers have grown to the largest batch seen.
///
/// The AEAD runs outside the data plane, holding only the tunnel it uses: a batch opens
/// the data messages it received before taking the data plane ([`Batch::open`]), and seals
/// what the data plane decided to send after letting it go ([`Batch::seal_pending`]).
pub(crate) struct Batch {
    /// Datagrams to send, back to back, and where each goes.
    datagrams: Vec<u8>,
    datagrams_used: usize,
    pub(crate) sends: Vec<(SocketAddr, Range<usize>)>,
    /// Packets to seal once the data plane is let go, back to back, and the sealer of each.
    plain: Vec<u8>,
    plain_used: usize,
    seals: Vec<(Sealer, Range<usize>)>,
    /// What [`Batch::open`] made of the first datagrams of the batch, in order, and where
    /// each opened packet lies in the frame area (behind [`HEADROOM`]).
    pub(crate) opened: Vec<(Opened, usize)>,
    /// Frames to write, back to back: the namespace, the bytes, and whether it is a
    /// member's frame (which may be coalesced with the next of its flow).
    frames: Vec<u8>,
    frames_used: usize,
    pub(crate) writes: Vec<Write>,
    /// Where the switch writes a frame of its own (an ARP reply, a DHCP reply).
    pub(crate) reply: Vec<u8>,
    /// Where a packet too large for the tunnel is cut into fragments, one at a time.
    pub(crate) fragment: Vec<u8>,
    /// Where a super-frame from a TAP is cut into segments, one at a time.
    pub(crate) segment: Vec<u8>,
    /// Where a member's packet is copied to be sent on to another member (a gateway's
    /// crossing, a moved LAN host's grace period).
    pub(crate) forward: Vec<u8>,
    /// VEPA: the LAN hosts a LAN host's broadcast is copied to.
    pub(crate) lan_copies: Vec<hyphae_vswitch::Mac>,
}

/// One frame for a TAP.
#[derive(Debug, Clone)]
pub(crate) struct Write {
    pub(crate) ns: usize,
    pub(crate) range: Range<usize>,
    /// A member's frame (coalesced with the next of its flow where offloads allow).
    pub(crate) deliver: bool,
}

/// Room a tunnel needs around a packet: its header, the relay prefix and the tag, with
/// margin (`Node::send` asks for 160 bytes at least).
const SEAL_ROOM: usize = 256;

impl Default for Batch {
    fn default() -> Self {
        Self {
            datagrams: vec![0; 4 * BUF_LEN],
            datagrams_used: 0,
            sends: Vec::new(),
            plain: vec![0; 4 * BUF_LEN],
            plain_used: 0,
            seals: Vec::new(),
            opened: Vec::new(),
            frames: vec![0; 4 * BUF_LEN],
            frames_used: 0,
            writes: Vec::new(),
            reply: vec![0; BUF_LEN.max(hyphae_vswitch::MIN_REPLY_BUF)],
            fragment: vec![0; BUF_LEN],
            segment: vec![0; BUF_LEN],
            forward: Vec::new(),
            lan_copies: Vec::new(),
        }
    }
}

impl Batch {
    /// Forgets what was carried out.
    pub(crate) fn clear(&mut self) {
        self.datagrams_used = 0;
        self.sends.clear();
        self.plain_used = 0;
        self.seals.clear();
        self.opened.clear();
        self.frames_used = 0;
        self.writes.clear();
    }

    /// The bytes of a datagram to send (after [`Batch::seal_pending`]).
    pub(crate) fn datagram(&self, range: &Range<usize>) -> &[u8] {
        debug_assert!(self.seals.is_empty(), "packets left unsealed");
        &self.datagrams[range.clone()]
    }

    /// The bytes of a frame to write.
    pub(crate) fn frame(&self, range: &Range<usize>) -> &[u8] {
        &self.frames[range.clone()]
    }

    /// Queues `frame` for `peer` in an envelope (a layer-2 namespace's), as
    /// [`Batch::seal`] queues a packet.
    pub(crate) fn seal_frame(&mut self, node: &mut Node, peer: PeerHandle, frame: &[u8]) {
        let at = self.plain_used;
        let end = at + hyphae_vswitch::layer2::ENVELOPE_LEN + frame.len();
        grow(&mut self.plain, end);
        let packet = &mut self.plain[at..end];
        if hyphae_vswitch::layer2::emit_envelope(packet, frame.len()).is_none() {
            return;
        }
        packet[hyphae_vswitch::layer2::ENVELOPE_LEN..].copy_from_slice(frame);
        let Some(sealer) = node.sealer(peer, packet) else {
            return;
        };
        self.plain_used = end;
        self.seals.push((sealer, at..end));
    }

    /// Queues the piece `start..end` of `frame` (see [`Pieces`]) for `peer`, as
    /// [`Batch::seal`] queues a packet.
    ///
    /// [`Pieces`]: hyphae_vswitch::layer2::Pieces
    pub(crate) fn seal_piece(
        &mut self,
        node: &mut Node,
        peer: PeerHandle,
        pieces: &hyphae_vswitch::layer2::Pieces,
        frame: &[u8],
        (start, end): (usize, usize),
    ) {
        let at = self.plain_used;
        let stop = at + 20 + end - start;
        grow(&mut self.plain, stop);
        let packet = &mut self.plain[at..stop];
        if pieces.header(packet, start, end).is_none() {
            return;
        }
        if hyphae_vswitch::layer2::Pieces::copy(&mut packet[20..], frame, start, end).is_none() {
            return;
        }
        let Some(sealer) = node.sealer(peer, packet) else {
            return;
        };
        self.plain_used = stop;
        self.seals.push((sealer, at..stop));
    }

    /// Queues `packet` for `peer`, to be sealed once the data plane is let go
    /// ([`Batch::seal_pending`]). The node counts it as sent now.
    pub(crate) fn seal(&mut self, node: &mut Node, peer: PeerHandle, packet: &[u8]) {
        let Some(sealer) = node.sealer(peer, packet) else {
            return;
        };
        let at = self.plain_used;
        let end = at + packet.len();
        grow(&mut self.plain, end);
        self.plain[at..end].copy_from_slice(packet);
        self.plain_used = end;
        self.seals.push((sealer, at..end));
    }

    /// Seals the packets [`Batch::seal`] queued, each holding only its tunnel: the data
    /// plane must not be held. Without a session a packet waits in its tunnel and a
    /// handshake initiation (or nothing) is sent instead. Returns how many were sealed on
    /// a shard other than `own` (a worker's own shard: its index), none without one.
    pub(crate) fn seal_pending(&mut self, own: Option<u8>) -> u64 {
        let mut elsewhere = 0;
        for (sealer, range) in self.seals.drain(..) {
            if own.is_some_and(|own| sealer.shard() != own) {
                elsewhere += 1;
            }
            let at = self.datagrams_used;
            grow(&mut self.datagrams, at + range.len() + SEAL_ROOM);
            let packet = &self.plain[range];
            if let Some(Transmit { to, range }) = sealer.seal(packet, &mut self.datagrams[at..]) {
                self.sends.push((to, at + range.start..at + range.end));
                self.datagrams_used = at + range.end;
            }
        }
        self.plain_used = 0;
        elsewhere
    }

    /// Opens the datagrams a worker received, before it takes the data plane: the direct
    /// data messages, each holding only its tunnel, into the frame area, up to the first
    /// datagram that is something else (a handshake may start the session the next data
    /// message needs: from there on the data plane handles them in order).
    pub(crate) fn open<'a>(
        &mut self,
        tunnels: &Tunnels,
        datagrams: impl Iterator<Item = crate::underlay::Datagram<'a>>,
    ) {
        self.opened.clear();
        for d in datagrams {
            if !Tunnels::is_data(d.bytes) {
                break;
            }
            let at = self.frames_used;
            let end = at + HEADROOM + d.bytes.len();
            grow(&mut self.frames, end);
            let opened = tunnels.open(d.bytes, &mut self.frames[at + HEADROOM..end]);
            self.frames_used = end;
            self.opened.push((opened, at));
        }
    }

    /// The frame area from `at` on (a packet [`Batch::open`] opened lies behind
    /// [`HEADROOM`]).
    pub(crate) fn opened_room(&mut self, at: usize) -> &mut [u8] {
        &mut self.frames[at..]
    }

    /// The first `len` bytes at `at` of the frame area are a member's frame for TAP `ns`.
    pub(crate) fn commit_opened(&mut self, ns: usize, at: usize, len: usize) {
        self.writes.push(Write {
            ns,
            range: at..at + len,
            deliver: true,
        });
    }

    /// Queues a datagram built elsewhere (a handshake, a hello).
    pub(crate) fn send(&mut self, to: SocketAddr, datagram: &[u8]) {
        let at = self.datagrams_used;
        let end = at + datagram.len();
        grow(&mut self.datagrams, end);
        self.datagrams[at..end].copy_from_slice(datagram);
        self.sends.push((to, at..end));
        self.datagrams_used = end;
    }

    /// Room for a frame of up to `len` bytes at the end of the frame area.
    pub(crate) fn frame_room(&mut self, len: usize) -> &mut [u8] {
        let at = self.frames_used;
        grow(&mut self.frames, at + len);
        &mut self.frames[at..at + len]
    }

    /// The first `len` bytes where a member's packet lies: where [`Batch::open`] opened it
    /// (`at`), or else the frame room.
    pub(crate) fn packet_room(&mut self, at: Option<usize>, len: usize) -> &mut [u8] {
        match at {
            Some(at) => &mut self.opened_room(at)[..len],
            None => self.frame_room(len),
        }
    }

    /// The first `len` bytes of [`Batch::frame_room`] are a frame for TAP `ns`.
    pub(crate) fn commit_frame(&mut self, ns: usize, len: usize, deliver: bool) {
        let at = self.frames_used;
        self.writes.push(Write {
            ns,
            range: at..at + len,
            deliver,
        });
        self.frames_used = at + len;
    }

    /// Queues the first `len` bytes of the reply buffer for TAP `ns`.
    pub(crate) fn write_reply(&mut self, ns: usize, len: usize) {
        let at = self.frames_used;
        grow(&mut self.frames, at + len);
        self.frames[at..at + len].copy_from_slice(&self.reply[..len]);
        self.commit_frame(ns, len, false);
    }
}

/// Makes `buf` at least `len` long (doubling, so a batch grows it a few times at most).
fn grow(buf: &mut Vec<u8>, len: usize) {
    if buf.len() < len {
        buf.resize(len.max(2 * buf.len()), 0);
    }
}
