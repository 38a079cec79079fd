//! The tunnels as the data path's workers use them outside the node.
//!
//! Sealing and opening data messages (the AEAD) is most of what a packet costs. Each
//! tunnel's WireGuard state (boringtun's `Tunn`) lives behind its own lock in a [`Tunnel`],
//! found by receiver index in [`Tunnels`], so a worker seals and opens with only that
//! tunnel held, while whatever lock the node's owner keeps it under is held only for the
//! decisions: which member a frame goes to and how ([`Node::sealer`](super::Node::sealer)),
//! and whether an opened packet may be delivered ([`Node::accept`](super::Node::accept)).
//! Two workers sealing or opening for different members run in parallel.
//!
//! A tunnel found here may have been removed from the node since (its member left, its
//! handle reused): [`Node::accept`](super::Node::accept) refuses what a tunnel opened if it
//! is no longer the node's tunnel at that handle.
//!
//! # Shards
//!
//! One member's traffic would still be sealed and opened one packet at a time, under its
//! one lock. So a tunnel may have several WireGuard sessions with the member, its shards:
//! independent `Tunn`s (each its own handshake, keys, counters and replay window), as many
//! as both ends accept (each announces how many: its workers, at most [`MAX_SHARDS`]).
//! Each inner flow is sealed on one shard, picked by a hash of its addresses, protocol and
//! ports that is the same both ways, so it keeps its order end to end; the receiver index
//! carries the shard (above the tunnel's slot), and the receiving agent's socket group hands
//! shard `k`'s datagrams to worker `k`. Different flows of one member then use every
//! worker at both ends. Shard 0 is the tunnel as it was: handshakes on hellos, keepalives,
//! control messages, the session that says the tunnel is up. The others start their
//! handshake with their first packet, which waits in the shard for it (one round trip),
//! and keep no keepalive of their own.
//!
//! [`MAX_SHARDS`]: crate::wire::MAX_SHARDS

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use boringtun::noise::{Tunn, TunnResult};

use super::peer::{tunnel_error, Route};
use super::{PeerHandle, Received, Transmit, SEND_HEADROOM};
use crate::keys::TAG_LEN;
use crate::wire::MAX_SHARDS;
use crate::wire::{
    emit_init_prefix, emit_relay_header, INIT_PREFIX_LEN, KIND_WG_DATA, KIND_WG_INIT,
    RELAY_HEADER_LEN, WG_DATA_OVERHEAD, WG_INIT_LEN,
};

/// Bits of a tunnel's slot in the index its WireGuard sessions carry (4096 tunnels); the
/// shard is above them.
const SLOT_BITS: u32 = 12;
const _: () = assert!(super::MAX_PEERS <= 1 << SLOT_BITS);
const _: () = assert!(MAX_SHARDS as u32 <= 1 << 3);

/// Where a data message carries its shard, for a program that steers datagrams by it: in
/// the byte at [`SHARD_BYTE`], from bit [`SHARD_SHIFT`] on (3 bits). The receiver index
/// lies at bytes 4..8, little-endian, the shard at its bits `8 + SLOT_BITS` and above.
pub const SHARD_BYTE: u32 = 4 + (8 + SLOT_BITS) / 8;
/// See [`SHARD_BYTE`].
pub const SHARD_SHIFT: u32 = (8 + SLOT_BITS) % 8;

/// The index boringtun is given for `shard` of the tunnel at `handle` (it puts its own
/// 8-bit counter below: the receiver index on the wire is this shifted left by 8).
pub(super) fn session_index(handle: PeerHandle, shard: u8) -> u32 {
    handle.0 | u32::from(shard) << SLOT_BITS
}

/// The tunnel and shard a receiver index names.
pub(super) fn parse_receiver(receiver: u32) -> (PeerHandle, u8) {
    let index = receiver >> 8;
    (
        PeerHandle(index & ((1 << SLOT_BITS) - 1)),
        (index >> SLOT_BITS) as u8,
    )
}

/// One WireGuard session set of a tunnel (a shard), behind its own lock.
pub struct Tunnel {
    handle: PeerHandle,
    shard: u8,
    tunn: Mutex<Tunn>,
}

impl Tunnel {
    pub(super) fn new(handle: PeerHandle, shard: u8, tunn: Tunn) -> Self {
        Self {
            handle,
            shard,
            tunn: Mutex::new(tunn),
        }
    }

    /// The node's handle of the tunnel.
    pub fn handle(&self) -> PeerHandle {
        self.handle
    }

    /// Which of the tunnel's shards it is.
    pub fn shard(&self) -> u8 {
        self.shard
    }

    /// The WireGuard state. A worker that panicked while holding it left it as boringtun
    /// left it: still a tunnel, so the lock is taken anyway.
    pub(super) fn lock(&self) -> MutexGuard<'_, Tunn> {
        self.tunn.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnel")
            .field("handle", &self.handle)
            .field("shard", &self.shard)
            .finish()
    }
}

/// Every tunnel shard of a node by receiver index, shared with the workers
/// ([`Node::tunnels`](super::Node::tunnels)).
#[derive(Debug, Default)]
pub struct Tunnels {
    slots: RwLock<Vec<Option<Arc<Tunnel>>>>,
}

/// What [`Tunnels::open`] made of a datagram.
#[derive(Debug)]
pub enum Opened {
    /// Not a WireGuard data message sent to us directly: for the node.
    NotData,
    /// No tunnel has its receiver index.
    UnknownSession,
    /// Opened by `tunnel`: a packet of `len` bytes lies at the start of the output buffer
    /// (none: a keepalive).
    Packet {
        /// The tunnel whose keys opened it.
        tunnel: Arc<Tunnel>,
        /// The packet's length.
        len: usize,
    },
    /// The tunnel refused it (a bad tag, a replayed counter, an expired session, ...).
    Refused {
        /// The tunnel.
        tunnel: Arc<Tunnel>,
        /// What became of it.
        received: Received,
    },
}

impl Tunnels {
    pub(super) fn insert(&self, tunnel: Arc<Tunnel>) {
        let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        let i = session_index(tunnel.handle, tunnel.shard) as usize;
        if slots.len() <= i {
            slots.resize(i + 1, None);
        }
        slots[i] = Some(tunnel);
    }

    /// Forgets every shard of the tunnel at `handle` from `from` on.
    pub(super) fn remove(&self, handle: PeerHandle, from: u8) {
        let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        for shard in from..MAX_SHARDS {
            if let Some(slot) = slots.get_mut(session_index(handle, shard) as usize) {
                *slot = None;
            }
        }
    }

    /// Whether `datagram` is one [`Tunnels::open`] opens: a WireGuard data message, not
    /// relayed (a relayed one may be another pair's, which the node forwards).
    pub fn is_data(datagram: &[u8]) -> bool {
        datagram.first() == Some(&KIND_WG_DATA) && datagram.len() >= WG_DATA_OVERHEAD
    }

    /// Opens a WireGuard data message sent to us directly into `out` (at least as long as
    /// the datagram), holding only its tunnel. The node must then [`accept`] the result,
    /// with the address it came from, before anything of it is delivered.
    ///
    /// [`accept`]: super::Node::accept
    pub fn open(&self, datagram: &[u8], out: &mut [u8]) -> Opened {
        if !Self::is_data(datagram) || out.len() < datagram.len() {
            return Opened::NotData;
        }
        // Our receiver indices carry the tunnel slot and shard above boringtun's counter.
        let receiver = u32::from_le_bytes([datagram[4], datagram[5], datagram[6], datagram[7]]);
        let tunnel = {
            let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
            match slots.get((receiver >> 8) as usize) {
                Some(Some(t)) => Arc::clone(t),
                _ => return Opened::UnknownSession,
            }
        };
        let result = tunnel.lock().decapsulate(None, datagram, out);
        match result {
            TunnResult::WriteToTunnelV4(packet, _) | TunnResult::WriteToTunnelV6(packet, _) => {
                let len = packet.len();
                Opened::Packet { tunnel, len }
            }
            // A keepalive (a data message can get nothing else back: boringtun answers
            // only handshakes with datagrams).
            TunnResult::Done | TunnResult::WriteToNetwork(_) => Opened::Packet { tunnel, len: 0 },
            TunnResult::Err(e) => {
                let received = tunnel_error(tunnel.handle, e);
                Opened::Refused { tunnel, received }
            }
        }
    }
}

/// The shard of `shards` an IP packet's flow takes: a hash of its addresses, protocol
/// and (TCP and UDP, not a fragment) ports, the same both ways, so a flow and its replies
/// keep to one shard (and one worker at each end). The agent's TAP steering program
/// computes the same in BPF (`hyphae-agent`'s `underlay/bpf.rs`, checked against this for
/// IPv4 and IPv6).
pub fn flow_shard(packet: &[u8], shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    (flow_hash(packet) % shards as u64) as usize
}

/// A hash of an IPv4 packet's flow (see [`flow_shard`]), the same both ways; 0 for
/// anything shorter than an IPv4 header.
pub(super) fn flow_hash(packet: &[u8]) -> u64 {
    if packet.first().is_some_and(|b| b >> 4 == 6) {
        return flow_hash6(packet);
    }
    let Some(h) = packet.get(..20) else {
        return 0;
    };
    let ihl = usize::from(h[0] & 0x0f) * 4;
    let protocol = h[9];
    let fragment = u16::from_be_bytes([h[6], h[7]]) & 0x3fff != 0;
    let src = u32::from_be_bytes([h[12], h[13], h[14], h[15]]);
    let dst = u32::from_be_bytes([h[16], h[17], h[18], h[19]]);
    let (sport, dport) = match packet.get(ihl..ihl + 4) {
        Some(p) if !fragment && matches!(protocol, 6 | 17) => (
            u16::from_be_bytes([p[0], p[1]]),
            u16::from_be_bytes([p[2], p[3]]),
        ),
        _ => (0, 0),
    };
    let (a, b) = ((src, sport), (dst, dport));
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    let key = (u64::from(lo.0) << 32 | u64::from(hi.0))
        ^ (u64::from(lo.1) << 48 | u64::from(hi.1) << 32 | u64::from(protocol));
    mix(key)
}

/// [`flow_hash`] of an IPv6 packet: its addresses folded to 32 bits each, the next header
/// and (TCP and UDP directly behind the fixed header) the ports; 0 if shorter than a header.
fn flow_hash6(packet: &[u8]) -> u64 {
    let Some(h) = packet.get(..40) else {
        return 0;
    };
    let fold = |b: &[u8]| {
        b.chunks_exact(4).fold(0u32, |acc, c| {
            acc ^ u32::from_be_bytes([c[0], c[1], c[2], c[3]])
        })
    };
    let (src, dst, next) = (fold(&h[8..24]), fold(&h[24..40]), h[6]);
    let (sport, dport) = match packet.get(40..44) {
        Some(p) if matches!(next, 6 | 17) => (
            u16::from_be_bytes([p[0], p[1]]),
            u16::from_be_bytes([p[2], p[3]]),
        ),
        _ => (0, 0),
    };
    let (a, b) = ((src, sport), (dst, dport));
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    mix((u64::from(lo.0) << 32 | u64::from(hi.0))
        ^ (u64::from(lo.1) << 48 | u64::from(hi.1) << 32 | u64::from(next)))
}

fn mix(key: u64) -> u64 {
    // A 64-bit mix (splitmix64's finalizer): every input bit moves the shard.
    let mut x = key;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    x
}

/// Seals packets for one tunnel outside the node, as the node decided when it handed it
/// out ([`Node::sealer`](super::Node::sealer)): the tunnel, the route, and the namespace
/// tag an initiation is wrapped in.
#[derive(Debug, Clone)]
pub struct Sealer {
    /// The shard of the packet's flow.
    pub(super) tunnel: Arc<Tunnel>,
    /// Shard 0, when `tunnel` is another: taken while that one has no session (its
    /// handshake is the initiator's to start, and a packet should not wait for it).
    pub(super) fallback: Option<Arc<Tunnel>>,
    pub(super) route: Route,
    pub(super) tag: [u8; TAG_LEN],
}

impl Sealer {
    /// The tunnel's handle.
    pub fn handle(&self) -> PeerHandle {
        self.tunnel.handle
    }

    /// The shard of the packet's flow (what [`flow_shard`] picked).
    pub fn shard(&self) -> u8 {
        self.tunnel.shard
    }

    /// Encrypts an IPv4 packet into `out`, holding only the tunnel, as
    /// [`Node::send`](super::Node::send) does (the same room is needed; without a session
    /// the packet waits in the tunnel and an initiation, or nothing, is written instead).
    pub fn seal(&self, packet: &[u8], out: &mut [u8]) -> Option<Transmit> {
        let needed = SEND_HEADROOM + (packet.len() + WG_DATA_OVERHEAD).max(WG_INIT_LEN);
        if out.len() < needed {
            return None;
        }
        let mut tunn = self.tunnel.lock();
        let mut shard = self.tunnel.shard;
        if let Some(fallback) = &self.fallback {
            if tunn.time_since_last_handshake().is_none() {
                drop(tunn);
                tunn = fallback.lock();
                shard = 0;
            }
        }
        let len = match tunn.encapsulate(packet, &mut out[SEND_HEADROOM..]) {
            TunnResult::WriteToNetwork(d) => d.len(),
            _ => return None,
        };
        drop(tunn);
        Some(frame_outgoing(&self.tag, shard, self.route, out, len))
    }
}

/// Wraps a WireGuard message of `shard` lying at `out[SEND_HEADROOM..][..len]` for the
/// wire: the namespace prefix of an initiation, the relay header of a relayed route.
pub(super) fn frame_outgoing(
    tag: &[u8; TAG_LEN],
    shard: u8,
    route: Route,
    out: &mut [u8],
    len: usize,
) -> Transmit {
    let mut start = SEND_HEADROOM;
    if out[SEND_HEADROOM] == KIND_WG_INIT {
        start -= INIT_PREFIX_LEN;
        emit_init_prefix(&mut out[start..], tag, shard);
    }
    if let Route::Relay { session, .. } = route {
        start -= RELAY_HEADER_LEN;
        emit_relay_header(&mut out[start..], session);
    }
    Transmit {
        to: route.addr(),
        range: start..SEND_HEADROOM + len,
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::Instant;

    use super::*;
    use crate::node::{test_epoch, DropReason, Event, NamespaceId, Node, PeerDropReason};
    use crate::wire::Control;

    const A: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(10, 0, 1, 2)), 7400);
    const B: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(10, 0, 2, 2)), 7400);

    fn node(seed: u8) -> Node {
        crate::node::testing::member(seed)
    }

    /// `a` at A and `b` at B with a session and each other's addresses; the handles of
    /// each other's tunnel.
    fn pair(now: Instant) -> (Node, Node, PeerHandle, PeerHandle) {
        sharded_pair(now, 1, 1)
    }

    /// Moves datagrams between `a` (at A) and `b` (at B) until both are quiet.
    fn pump(a: &mut Node, b: &mut Node, now: Instant) {
        crate::node::testing::pump(a, A, b, B, now);
    }

    /// [`pair`], with `a` accepting `sa` shards and `b` `sb`, after a tick of the timers
    /// (which starts the shards' handshakes).
    fn sharded_pair(now: Instant, sa: u8, sb: u8) -> (Node, Node, PeerHandle, PeerHandle) {
        let (mut a, mut b) = (node(1), node(2));
        a.set_shards(sa);
        b.set_shards(sb);
        a.add_static_peer(NamespaceId(0), B, now);
        a.handle_timeout(now);
        pump(&mut a, &mut b, now);
        let later = now + crate::node::TICK;
        a.handle_timeout(later);
        b.handle_timeout(later);
        pump(&mut a, &mut b, later);
        let ha = a.peers().next().map(|p| p.handle).expect("a has a tunnel");
        let hb = b.peers().next().map(|p| p.handle).expect("b has a tunnel");
        assert!(b
            .peers()
            .all(|p| p.addresses == [Ipv4Addr::new(10, 201, 0, 1)]));
        (a, b, ha, hb)
    }

    /// A UDP packet from 10.201.0.`src`:`sport` to 10.201.0.`dst`:`dport`.
    fn udp(src: u8, sport: u16, dst: u8, dport: u16) -> Vec<u8> {
        let mut p = vec![
            0x45, 0, 0, 36, 0, 0, 0, 0, 64, 17, 0, 0, 10, 201, 0, src, 10, 201, 0, dst,
        ];
        p.extend_from_slice(&sport.to_be_bytes());
        p.extend_from_slice(&dport.to_be_bytes());
        p.extend_from_slice(&[0, 16, 0, 0]);
        p.extend_from_slice(b"payload!");
        p
    }

    /// The shard a data message's receiver index names.
    fn shard_of(datagram: &[u8]) -> u8 {
        parse_receiver(u32::from_le_bytes([
            datagram[4],
            datagram[5],
            datagram[6],
            datagram[7],
        ]))
        .1
    }

    /// An IPv4 packet from 10.201.0.`src` to 10.201.0.`dst`.
    fn packet(src: u8, dst: u8) -> Vec<u8> {
        let mut p = vec![
            0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 201, 0, src, 10, 201, 0, dst,
        ];
        p.extend_from_slice(b"payload!");
        p
    }

    fn seal(a: &mut Node, ha: PeerHandle, p: &[u8]) -> (Transmit, Vec<u8>) {
        let sealer = a.sealer(ha, p).expect("a tunnel");
        let mut out = vec![0u8; 512];
        let t = sealer.seal(p, &mut out).expect("sealed");
        (t, out)
    }

    #[test]
    fn a_packet_sealed_and_opened_outside_the_nodes_is_delivered() {
        let now = test_epoch();
        let (mut a, mut b, ha, hb) = pair(now);
        let p = packet(1, 2);
        let (t, out) = seal(&mut a, ha, &p);
        assert_eq!(t.to, B);
        let datagram = &out[t.range];
        assert!(Tunnels::is_data(datagram));
        let mut rx = vec![0u8; 512];
        let opened = b.tunnels().open(datagram, &mut rx);
        assert!(matches!(opened, Opened::Packet { len, .. } if len == p.len()));
        assert_eq!(&rx[..p.len()], &p[..]);
        assert_eq!(
            b.accept(now, A, opened, &rx),
            Received::Deliver {
                ns: NamespaceId(0),
                peer: hb,
                len: p.len()
            }
        );
        // Counted on both sides as the node's own path counts.
        let sent = a.peers().next().map(|p| p.stats.tx_packets);
        let got = b.peers().next().map(|p| p.stats.rx_packets);
        assert!(sent.is_some_and(|n| n >= 1) && got.is_some_and(|n| n >= 1));

        // The same datagram again: the tunnel's replay window refuses it.
        let again = b.tunnels().open(datagram, &mut rx);
        assert_eq!(
            b.accept(now, A, again, &rx),
            Received::PeerDropped(hb, PeerDropReason::Replay)
        );
    }

    #[test]
    fn what_a_removed_tunnel_opened_is_refused() {
        let now = test_epoch();
        let (mut a, mut b, ha, hb) = pair(now);
        let (t, out) = seal(&mut a, ha, &packet(1, 2));
        let mut rx = vec![0u8; 512];
        let opened = b.tunnels().open(&out[t.range.clone()], &mut rx);
        assert!(matches!(opened, Opened::Packet { .. }));
        // The member leaves between the worker's open and the node's accept.
        b.remove_peer(hb);
        assert_eq!(
            b.accept(now, A, opened, &rx),
            Received::Dropped(DropReason::UnknownSession)
        );
        // Its receiver index finds nothing any more.
        let (t, out) = seal(&mut a, ha, &packet(1, 2));
        assert!(matches!(
            b.tunnels().open(&out[t.range], &mut rx),
            Opened::UnknownSession
        ));
    }

    /// A frame from `src` to the broadcast in an envelope, as a layer-2 agent sends it.
    fn enveloped(src: [u8; 6]) -> Vec<u8> {
        let mut frame = vec![0xffu8; 6];
        frame.extend_from_slice(&src);
        frame.extend_from_slice(&[0x88, 0xb5]);
        frame.extend_from_slice(b"any ethertype");
        let mut p = vec![0u8; hyphae_vswitch::layer2::ENVELOPE_LEN];
        hyphae_vswitch::layer2::emit_envelope(&mut p, frame.len()).expect("room");
        p.extend_from_slice(&frame);
        p
    }

    #[test]
    fn a_router_with_hundreds_of_lan_hosts_announces_them_all_in_parts() {
        let now = test_epoch();
        let (mut a, mut b, _, hb) = pair(now);
        let lan: Vec<[u8; 6]> = (0..450u16)
            .map(|i| [2, 0, 0, 1, (i >> 8) as u8, i as u8])
            .collect();
        b.set_macs(now, NamespaceId(0), Vec::new());
        a.set_macs(now, NamespaceId(0), lan.clone());
        pump(&mut a, &mut b, now);
        let mut heard = None;
        while let Some(e) = b.poll_event() {
            if let Event::PeerMacs { peer, macs, .. } = e {
                assert_eq!(peer, hb);
                heard = Some(macs);
            }
        }
        assert_eq!(heard, Some(lan), "three parts, one set");
    }

    #[test]
    fn a_mac_refused_to_a_member_is_dropped_from_its_frames_and_its_set() {
        let now = test_epoch();
        let (mut a, mut b, ha, hb) = pair(now);
        let (mine, held_elsewhere) = ([2, 0, 0, 0, 0, 0xa], [2, 0, 0, 0, 0, 0xb]);
        b.set_macs(now, NamespaceId(0), Vec::new());
        a.set_macs(now, NamespaceId(0), vec![mine, held_elsewhere]);
        pump(&mut a, &mut b, now);
        while b.poll_event().is_some() {}
        assert_eq!(
            b.announced_macs(NamespaceId(0), hb)
                .map(|(_, m)| m.to_vec()),
            Some(vec![mine, held_elsewhere])
        );
        assert!(b.refuse_mac(hb, held_elsewhere, true));
        assert!(!b.refuse_mac(hb, held_elsewhere, true), "once");
        let mut reported = Vec::new();
        while let Some(e) = b.poll_event() {
            if let Event::PeerMacs { macs, .. } = e {
                reported.push(macs);
            }
        }
        assert_eq!(
            reported,
            vec![vec![mine]],
            "the switch hears the set without it"
        );
        let mut rx = vec![0u8; 512];
        for (src, expect) in [
            (held_elsewhere, Err(PeerDropReason::SpoofedSource)),
            (mine, Ok(())),
        ] {
            let p = enveloped(src);
            let (t, out) = seal(&mut a, ha, &p);
            let opened = b.tunnels().open(&out[t.range], &mut rx);
            let got = match b.accept(now, A, opened, &rx) {
                Received::Deliver { .. } => Ok(()),
                Received::PeerDropped(_, reason) => Err(reason),
                other => panic!("{other:?}"),
            };
            assert_eq!(got, expect);
        }
        // Its lease after all: allowed again.
        assert!(b.refuse_mac(hb, held_elsewhere, false));
        let p = enveloped(held_elsewhere);
        let (t, out) = seal(&mut a, ha, &p);
        let opened = b.tunnels().open(&out[t.range], &mut rx);
        assert!(matches!(
            b.accept(now, A, opened, &rx),
            Received::Deliver { .. }
        ));
    }

    #[test]
    fn a_layer2_member_delivers_frames_only_from_the_macs_it_announced() {
        let now = test_epoch();
        let (mut a, mut b, ha, hb) = pair(now);
        let (mine, other) = ([2, 0, 0, 0, 0, 0xa], [2, 0, 0, 0, 0, 0xb]);
        b.set_macs(now, NamespaceId(0), Vec::new());
        a.set_macs(now, NamespaceId(0), vec![mine, mine]);
        pump(&mut a, &mut b, now);
        let mut macs = None;
        while let Some(e) = b.poll_event() {
            if let Event::PeerMacs { peer, macs: m, .. } = e {
                assert_eq!(peer, hb);
                macs = Some(m);
            }
        }
        assert_eq!(macs, Some(vec![mine]), "announced once, deduplicated");
        let mut rx = vec![0u8; 512];
        let p = enveloped(mine);
        let (t, out) = seal(&mut a, ha, &p);
        let opened = b.tunnels().open(&out[t.range], &mut rx);
        assert_eq!(
            b.accept(now, A, opened, &rx),
            Received::Deliver {
                ns: NamespaceId(0),
                peer: hb,
                len: p.len()
            }
        );
        // Another MAC, an IPv4 packet from an address it holds, or no envelope at all.
        for (bad, reason) in [
            (enveloped(other), PeerDropReason::SpoofedSource),
            (packet(1, 2), PeerDropReason::BadPayload),
        ] {
            let (t, out) = seal(&mut a, ha, &bad);
            let opened = b.tunnels().open(&out[t.range], &mut rx);
            assert_eq!(
                b.accept(now, A, opened, &rx),
                Received::PeerDropped(hb, reason)
            );
        }
        // MACs in an IP namespace are refused.
        let (mut c, mut d, hc, hd) = pair(now);
        let (t, out) = seal(
            &mut c,
            hc,
            &Control::Macs(crate::wire::MacPart::split(1, &[mine]).remove(0)).emit(),
        );
        let opened = d.tunnels().open(&out[t.range], &mut rx);
        assert_eq!(
            d.accept(now, A, opened, &rx),
            Received::PeerDropped(hd, PeerDropReason::BadPayload)
        );
    }

    #[test]
    fn layer2_envelopes_travel_with_the_control_messages_on_shard_zero() {
        let now = test_epoch();
        let (mut a, _b, ha, _hb) = sharded_pair(now, 4, 4);
        let shards: Vec<u8> = (0..16u8)
            .map(|i| {
                let p = enveloped([2, 0, 0, 0, 1, i]);
                a.sealer(ha, &p).expect("a tunnel").shard()
            })
            .collect();
        assert_eq!(shards, vec![0; 16]);
        // Host packets still spread over the shards.
        let spread: std::collections::HashSet<u8> = (0..64u8)
            .map(|i| a.sealer(ha, &packet(i, 2)).expect("a tunnel").shard())
            .collect();
        assert!(spread.len() > 1, "{spread:?}");
    }

    /// A UDP packet from `src` to `dst` over IPv6.
    fn packet6(src: std::net::Ipv6Addr, dst: std::net::Ipv6Addr) -> Vec<u8> {
        let mut p = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        p.extend_from_slice(b"payload!");
        p
    }

    #[test]
    fn ipv6_packets_are_taken_only_from_the_addresses_the_member_announced() {
        let now = test_epoch();
        let (mut a, mut b, ha, hb) = pair(now);
        let mine: std::net::Ipv6Addr = "fd00::a".parse().unwrap();
        let other: std::net::Ipv6Addr = "fd00::bad".parse().unwrap();
        let dst: std::net::Ipv6Addr = "fd00::b".parse().unwrap();
        // Before the announcement: nothing of a's is taken.
        let (t, out) = seal(&mut a, ha, &packet6(mine, dst));
        let mut rx = vec![0u8; 512];
        let opened = b.tunnels().open(&out[t.range], &mut rx);
        assert_eq!(
            b.accept(now, A, opened, &rx),
            Received::PeerDropped(hb, PeerDropReason::SpoofedSource)
        );
        a.set_addresses6(now, NamespaceId(0), vec![mine]);
        pump(&mut a, &mut b, now);
        assert!(std::iter::from_fn(|| b.poll_event()).any(|e| e
            == Event::PeerAddresses6 {
                ns: NamespaceId(0),
                peer: hb,
                addresses: vec![mine]
            }));
        assert_eq!(
            b.peers().next().map(|p| p.addresses6.to_vec()),
            Some(vec![mine])
        );
        // Opened outside the node (a worker) and inside it, the held source is delivered.
        let p = packet6(mine, dst);
        let (t, out) = seal(&mut a, ha, &p);
        let opened = b.tunnels().open(&out[t.range], &mut rx);
        assert!(matches!(opened, Opened::Packet { len, .. } if len == p.len()));
        assert!(matches!(
            b.accept(now, A, opened, &rx),
            Received::Deliver { .. }
        ));
        let (t, out) = seal(&mut a, ha, &p);
        assert!(matches!(
            b.handle_datagram(now, A, &out[t.range], &mut rx),
            Received::Deliver { .. }
        ));
        // Any other source is refused, both ways in.
        let spoofed = packet6(other, dst);
        let (t, out) = seal(&mut a, ha, &spoofed);
        let opened = b.tunnels().open(&out[t.range], &mut rx);
        assert_eq!(
            b.accept(now, A, opened, &rx),
            Received::PeerDropped(hb, PeerDropReason::SpoofedSource)
        );
        let (t, out) = seal(&mut a, ha, &spoofed);
        assert_eq!(
            b.handle_datagram(now, A, &out[t.range], &mut rx),
            Received::PeerDropped(hb, PeerDropReason::SpoofedSource)
        );
        // Never our own address, nor link-local or multicast ones, from a member.
        a.set_addresses6(
            now,
            NamespaceId(0),
            vec![
                mine,
                dst,
                "fe80::1".parse().unwrap(),
                "ff05::1".parse().unwrap(),
            ],
        );
        b.set_addresses6(now, NamespaceId(0), vec![dst]);
        pump(&mut a, &mut b, now);
        assert_eq!(
            b.peers().next().map(|p| p.addresses6.to_vec()),
            Some(vec![mine])
        );
        // A member restarted as an agent that does not announce IPv6 holds none.
        b.announced6(hb, false);
        assert_eq!(b.peers().next().map(|p| p.addresses6.len()), Some(0));
        assert!(std::iter::from_fn(|| b.poll_event()).any(|e| e
            == Event::PeerAddresses6 {
                ns: NamespaceId(0),
                peer: hb,
                addresses: Vec::new()
            }));
        // A flow keeps one shard both ways (the reply has the ports swapped).
        let (x, mut y) = (packet6(mine, dst), packet6(dst, mine));
        y[40..44].copy_from_slice(b"ylpa");
        assert_eq!(&x[40..44], b"payl");
        assert_eq!(flow_hash(&x), flow_hash(&y));
        assert_ne!(flow_hash(&x), flow_hash(&packet6(mine, other)));
    }

    #[test]
    fn a_packet_from_an_address_the_member_does_not_own_is_refused() {
        let now = test_epoch();
        let (mut a, mut b, ha, hb) = pair(now);
        let (t, out) = seal(&mut a, ha, &packet(9, 2));
        let mut rx = vec![0u8; 512];
        let opened = b.tunnels().open(&out[t.range], &mut rx);
        assert_eq!(
            b.accept(now, A, opened, &rx),
            Received::PeerDropped(hb, PeerDropReason::SpoofedSource)
        );
    }

    #[test]
    fn only_direct_data_messages_are_opened_outside() {
        let b = node(2);
        let mut rx = vec![0u8; 512];
        for d in [
            &b"H..."[..],
            &[1u8; 148][..],
            &[b'R'; 64][..],
            &[4u8; 8][..],
            &[][..],
        ] {
            assert!(
                matches!(b.tunnels().open(d, &mut rx), Opened::NotData),
                "{d:?}"
            );
        }
        let mut unknown = [0u8; 48];
        unknown[0] = KIND_WG_DATA;
        unknown[5] = 7;
        assert!(matches!(
            b.tunnels().open(&unknown, &mut rx),
            Opened::UnknownSession
        ));
    }

    #[test]
    fn the_shard_lies_where_a_steering_program_reads_it() {
        for shard in 0..MAX_SHARDS {
            let receiver = (session_index(PeerHandle(4095), shard) << 8) | 0xff;
            let bytes = receiver.to_le_bytes();
            let byte = bytes[SHARD_BYTE as usize - 4];
            assert_eq!((byte >> SHARD_SHIFT) & 7, shard);
            assert_eq!(parse_receiver(receiver), (PeerHandle(4095), shard));
        }
    }

    #[test]
    fn a_flow_and_its_replies_keep_to_one_shard_and_flows_spread() {
        let mut seen = [0usize; 4];
        for port in 0..256u16 {
            let there = flow_shard(&udp(1, 40000 + port, 2, 5201), 4);
            let back = flow_shard(&udp(2, 5201, 1, 40000 + port), 4);
            assert_eq!(there, back, "port {port}");
            seen[there] += 1;
        }
        assert!(seen.iter().all(|&n| n > 32), "{seen:?}");
        // One shard, or not a packet: shard 0.
        assert_eq!(flow_shard(&udp(1, 1, 2, 2), 1), 0);
        assert_eq!(flow_shard(&[0x45, 0, 0], 4), 0);
        // A fragment has no ports to read: its addresses and protocol alone.
        let mut fragment = udp(1, 40000, 2, 5201);
        fragment[7] = 1;
        let mut other = udp(1, 40001, 2, 5202);
        other[7] = 1;
        assert_eq!(flow_shard(&fragment, 4), flow_shard(&other, 4));
    }

    #[test]
    fn flows_of_one_member_take_every_shard_and_are_all_delivered() {
        let now = test_epoch();
        let (mut a, mut b, ha, hb) = sharded_pair(now, 4, 4);
        assert_eq!(a.peers().next().map(|p| p.shards), Some(4));
        assert_eq!(b.peers().next().map(|p| p.shards), Some(4));
        let mut shards = [0usize; 4];
        let mut rx = vec![0u8; 512];
        for port in 0..64u16 {
            let p = udp(1, 40000 + port, 2, 5201);
            let (t, out) = seal(&mut a, ha, &p);
            let datagram = &out[t.range];
            assert!(Tunnels::is_data(datagram), "every shard has a session");
            let shard = shard_of(datagram);
            assert_eq!(usize::from(shard), flow_shard(&p, 4));
            shards[usize::from(shard)] += 1;
            let opened = b.tunnels().open(datagram, &mut rx);
            assert_eq!(
                b.accept(now, A, opened, &rx),
                Received::Deliver {
                    ns: NamespaceId(0),
                    peer: hb,
                    len: p.len()
                },
                "port {port}"
            );
        }
        assert!(shards.iter().all(|&n| n > 0), "{shards:?}");
        // The replies: each on its flow's shard.
        let p = udp(2, 5201, 1, 40007);
        let (t, out) = seal(&mut b, hb, &p);
        assert_eq!(
            usize::from(shard_of(&out[t.range])),
            flow_shard(&udp(1, 40007, 2, 5201), 4)
        );
    }

    /// A member that restarts has none of its old sessions: the other end starts every
    /// shard afresh too (on its hello), or flows on the other shards would go on being
    /// sealed for sessions nobody holds (`dht.rs`, a restarted first member).
    #[test]
    fn a_member_that_restarts_gets_every_flow_through_again() {
        let now = test_epoch();
        let (mut a, b, ha, _) = sharded_pair(now, 4, 4);
        drop(b);
        let mut b = node(2);
        b.set_shards(4);
        b.add_static_peer(NamespaceId(0), A, now);
        let mut t = now;
        for _ in 0..4 {
            a.handle_timeout(t);
            b.handle_timeout(t);
            pump(&mut a, &mut b, t);
            t += crate::node::TICK;
        }
        let hb = b
            .peers()
            .next()
            .map(|p| p.handle)
            .expect("b has a tunnel again");
        assert_eq!(a.peers().next().map(|p| p.handle), Some(ha));
        let mut rx = vec![0u8; 512];
        for port in 0..64u16 {
            let p = udp(1, 40000 + port, 2, 5201);
            let (tx, out) = seal(&mut a, ha, &p);
            let opened = b.tunnels().open(&out[tx.range], &mut rx);
            assert_eq!(
                b.accept(t, A, opened, &rx),
                Received::Deliver {
                    ns: NamespaceId(0),
                    peer: hb,
                    len: p.len()
                },
                "port {port} (shard {})",
                flow_shard(&p, 4)
            );
        }
    }

    #[test]
    fn the_pair_has_the_shards_both_accept_and_an_agent_without_them_one() {
        let now = test_epoch();
        let (a, b, _, _) = sharded_pair(now, 4, 2);
        assert_eq!(a.peers().next().map(|p| p.shards), Some(2));
        assert_eq!(b.peers().next().map(|p| p.shards), Some(2));
        let (mut a, _b, ha, _) = sharded_pair(now, 8, 1);
        assert_eq!(a.peers().next().map(|p| p.shards), Some(1));
        for port in 0..16u16 {
            let (t, out) = seal(&mut a, ha, &udp(1, 40000 + port, 2, 5201));
            assert_eq!(shard_of(&out[t.range]), 0);
        }
    }

    #[test]
    fn a_shard_without_a_session_sends_on_shard_zero() {
        let now = test_epoch();
        // b accepts 4, a 4, but no timer ran after the announcements: only shard 0 is up.
        let (mut a, mut b) = (node(1), node(2));
        a.set_shards(4);
        b.set_shards(4);
        a.add_static_peer(NamespaceId(0), B, now);
        a.handle_timeout(now);
        pump(&mut a, &mut b, now);
        let ha = a.peers().next().map(|p| p.handle).expect("a tunnel");
        let hb = b.peers().next().map(|p| p.handle).expect("a tunnel");
        assert_eq!(a.peers().next().map(|p| p.shards), Some(4));
        let mut rx = vec![0u8; 512];
        for port in 0..16u16 {
            let p = udp(1, 40000 + port, 2, 5201);
            let (t, out) = seal(&mut a, ha, &p);
            assert_eq!(shard_of(&out[t.range.clone()]), 0, "port {port}");
            let opened = b.tunnels().open(&out[t.range], &mut rx);
            assert!(matches!(
                b.accept(now, A, opened, &rx),
                Received::Deliver { peer, .. } if peer == hb
            ));
        }
    }

    #[test]
    fn an_initiation_for_a_shard_beyond_ours_is_dropped() {
        let now = test_epoch();
        let (mut a, mut b, ha, _) = sharded_pair(now, 4, 2);
        // a is made to start a shard b never accepted.
        a.set_tunnel_shards(ha, 4);
        let tunnel = a.peers[ha.0 as usize]
            .as_ref()
            .map(|p| Arc::clone(&p.shards[3]));
        let tunnel = tunnel.expect("a fourth shard");
        let mut buf = vec![0u8; 512];
        let TunnResult::WriteToNetwork(init) = tunnel
            .lock()
            .format_handshake_initiation(&mut buf[SEND_HEADROOM..], false)
        else {
            panic!("no initiation");
        };
        let len = init.len();
        let t = frame_outgoing(
            &a.namespaces[0].keys.tag(),
            3,
            Route::Direct(B),
            &mut buf,
            len,
        );
        let mut out = vec![0u8; 512];
        assert_eq!(
            b.handle_datagram(now, A, &buf[t.range], &mut out),
            Received::Dropped(DropReason::UnknownSession)
        );
        assert_eq!(b.peers().next().map(|p| p.shards), Some(2));
    }

    #[test]
    fn a_member_that_leaves_is_heard_through_the_open_path() {
        let now = test_epoch();
        let (mut a, mut b, _, _) = pair(now);
        while a.poll_event().is_some() {}
        b.remove_namespace(now, NamespaceId(0));
        let sent: Vec<_> = std::iter::from_fn(|| b.poll_transmit()).collect();
        assert!(!sent.is_empty(), "b tells a");
        let mut rx = vec![0u8; 512];
        for (_, d) in sent {
            let opened = a.tunnels().open(&d, &mut rx);
            let r = a.accept(now, B, opened, &rx);
            eprintln!("{r:?}");
        }
        let events: Vec<_> = std::iter::from_fn(|| a.poll_event()).collect();
        eprintln!("{events:?}");
        assert!(a.peers().all(|p| p.addresses.is_empty()), "{events:?}");
    }
}
