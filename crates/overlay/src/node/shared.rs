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

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use boringtun::noise::{Tunn, TunnResult};

use super::peer::{tunnel_error, Route};
use super::{PeerHandle, Received, Transmit, SEND_HEADROOM};
use crate::keys::TAG_LEN;
use crate::wire::{
    emit_init_prefix, emit_relay_header, INIT_PREFIX_LEN, KIND_WG_DATA, KIND_WG_INIT,
    RELAY_HEADER_LEN, WG_DATA_OVERHEAD, WG_INIT_LEN,
};

/// One tunnel's WireGuard state, behind its own lock.
pub struct Tunnel {
    handle: PeerHandle,
    tunn: Mutex<Tunn>,
}

impl Tunnel {
    pub(super) fn new(handle: PeerHandle, tunn: Tunn) -> Self {
        Self {
            handle,
            tunn: Mutex::new(tunn),
        }
    }

    /// The node's handle of the tunnel.
    pub fn handle(&self) -> PeerHandle {
        self.handle
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
            .finish()
    }
}

/// Every tunnel of a node by receiver index, shared with the workers
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
        let i = tunnel.handle.0 as usize;
        if slots.len() <= i {
            slots.resize(i + 1, None);
        }
        slots[i] = Some(tunnel);
    }

    pub(super) fn remove(&self, handle: PeerHandle) {
        let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = slots.get_mut(handle.0 as usize) {
            *slot = None;
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
        // Our receiver indices carry the tunnel slot above boringtun's 8-bit counter.
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
            TunnResult::WriteToTunnelV4(packet, _) => {
                let len = packet.len();
                Opened::Packet { tunnel, len }
            }
            // A keepalive (a data message can get nothing else back: boringtun answers
            // only handshakes with datagrams).
            TunnResult::Done | TunnResult::WriteToNetwork(_) => Opened::Packet { tunnel, len: 0 },
            TunnResult::WriteToTunnelV6(..) => {
                let received =
                    Received::PeerDropped(tunnel.handle, super::PeerDropReason::BadPayload);
                Opened::Refused { tunnel, received }
            }
            TunnResult::Err(e) => {
                let received = tunnel_error(tunnel.handle, e);
                Opened::Refused { tunnel, received }
            }
        }
    }
}

/// Seals packets for one tunnel outside the node, as the node decided when it handed it
/// out ([`Node::sealer`](super::Node::sealer)): the tunnel, the route, and the namespace
/// tag an initiation is wrapped in.
#[derive(Debug, Clone)]
pub struct Sealer {
    pub(super) tunnel: Arc<Tunnel>,
    pub(super) route: Route,
    pub(super) tag: [u8; TAG_LEN],
}

impl Sealer {
    /// The tunnel's handle.
    pub fn handle(&self) -> PeerHandle {
        self.tunnel.handle
    }

    /// Encrypts an IPv4 packet into `out`, holding only the tunnel, as
    /// [`Node::send`](super::Node::send) does (the same room is needed; without a session
    /// the packet waits in the tunnel and an initiation, or nothing, is written instead).
    pub fn seal(&self, packet: &[u8], out: &mut [u8]) -> Option<Transmit> {
        let needed = SEND_HEADROOM + (packet.len() + WG_DATA_OVERHEAD).max(WG_INIT_LEN);
        if out.len() < needed {
            return None;
        }
        let len = match self
            .tunnel
            .lock()
            .encapsulate(packet, &mut out[SEND_HEADROOM..])
        {
            TunnResult::WriteToNetwork(d) => d.len(),
            _ => return None,
        };
        Some(frame_outgoing(&self.tag, self.route, out, len))
    }
}

/// Wraps a WireGuard message lying at `out[SEND_HEADROOM..][..len]` for the wire: the
/// namespace prefix of an initiation, the relay header of a relayed route.
pub(super) fn frame_outgoing(
    tag: &[u8; TAG_LEN],
    route: Route,
    out: &mut [u8],
    len: usize,
) -> Transmit {
    let mut start = SEND_HEADROOM;
    if out[SEND_HEADROOM] == KIND_WG_INIT {
        start -= INIT_PREFIX_LEN;
        emit_init_prefix(&mut out[start..], tag);
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
    use crate::keys::NamespaceKeys;
    use crate::node::{test_epoch, DropReason, NamespaceId, Node, PeerDropReason};
    use crate::Identity;

    const A: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(10, 0, 1, 2)), 7400);
    const B: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(10, 0, 2, 2)), 7400);

    fn node(seed: u8) -> Node {
        let mut node = Node::new(Identity::from_seed([seed; 32]), [seed; 32]);
        node.add_namespace(
            NamespaceKeys::derive("lab", b"correct horse battery staple"),
            vec![Ipv4Addr::new(10, 201, 0, seed)],
        );
        node
    }

    /// `a` at A and `b` at B with a session and each other's addresses; the handles of
    /// each other's tunnel.
    fn pair(now: Instant) -> (Node, Node, PeerHandle, PeerHandle) {
        let (mut a, mut b) = (node(1), node(2));
        a.add_static_peer(NamespaceId(0), B, now);
        a.handle_timeout(now);
        let mut out = vec![0u8; 65536];
        for _ in 0..50 {
            let mut moved = false;
            while let Some((_, d)) = a.poll_transmit() {
                moved = true;
                b.handle_datagram(now, A, &d, &mut out);
            }
            while let Some((_, d)) = b.poll_transmit() {
                moved = true;
                a.handle_datagram(now, B, &d, &mut out);
            }
            if !moved {
                break;
            }
        }
        let ha = a.peers().next().map(|p| p.handle).expect("a has a tunnel");
        let hb = b.peers().next().map(|p| p.handle).expect("b has a tunnel");
        assert!(b
            .peers()
            .all(|p| p.addresses == [Ipv4Addr::new(10, 201, 0, 1)]));
        (a, b, ha, hb)
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
}
