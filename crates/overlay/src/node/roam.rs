//! Roaming: our own underlay address changed (the host moved with its agent, DHCP gave it
//! another address, traffic leaves by another uplink) and the tunnels carry on.
//!
//! WireGuard already lets a member roam: an authenticated packet from a new address moves
//! the member's endpoint there (`Peer::heard`). What it does not do is tell anyone: a
//! member that only receives, or is idle, stays unreachable until it happens to send. So
//! when the driver sees our source address toward members change, the node probes each of
//! them through its tunnel at once, from the new address: the probe is authenticated, so
//! the member's endpoint moves on receipt, and its answer (sent to where the probe came
//! from) ends the probing. Unanswered, the probe is repeated every
//! [`ROAM_PROBE_INTERVAL`](super::ROAM_PROBE_INTERVAL), at most
//! [`ROAM_PROBES`](super::ROAM_PROBES) times; the path's silence detection
//! and relays take over after that. A member without a session is reached through the
//! handshake instead: the initiator starts a fresh one, the responder sends a hello, whose
//! answer starts one from the other side.

use std::time::Instant;

use super::peer::Route;
use super::{Node, PeerHandle};

impl Node {
    /// Our underlay source address toward the members behind `peers` changed: each is told
    /// at once from the new address (see the module documentation). Counted in
    /// [`Node::underlay_changes`] once per call that names a tunnel.
    pub fn handle_underlay_change(&mut self, now: Instant, peers: &[PeerHandle]) {
        let mut any = false;
        for &handle in peers {
            let Some(peer) = self.peer_mut(handle) else {
                continue;
            };
            any = true;
            if peer.start_roam(now) {
                continue;
            }
            let (ns, endpoint, initiator) = (peer.ns, peer.endpoint, peer.initiator);
            if initiator {
                self.restart_handshake(now, handle, Route::Direct(endpoint));
            } else {
                self.send_hello(ns, endpoint);
            }
        }
        if any {
            self.underlay_changes += 1;
            tracing::info!(
                members = peers.len(),
                "underlay address changed: telling members"
            );
        }
        self.run_roams(now);
    }

    /// How many times our underlay address changed under open tunnels.
    pub fn underlay_changes(&self) -> u64 {
        self.underlay_changes
    }

    /// Sends the roaming probes that are due.
    pub(super) fn run_roams(&mut self, now: Instant) {
        let mut due = Vec::new();
        for (i, p) in self.peers.iter_mut().enumerate() {
            if let Some(p) = p.as_mut() {
                if p.poll_roam(now) {
                    due.push((PeerHandle(i as u32), p.endpoint));
                }
            }
        }
        for (handle, endpoint) in due {
            self.probe(now, handle, Route::Direct(endpoint));
        }
    }

    /// The earliest roaming probe due.
    pub(super) fn poll_roam_timeout(&self) -> Option<Instant> {
        self.peers
            .iter()
            .flatten()
            .filter_map(|p| p.roam_timeout())
            .min()
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::Duration;

    use super::*;
    use crate::node::{
        test_epoch, DropReason, NamespaceId, PeerDropReason, Received, ROAM_PROBES,
        ROAM_PROBE_INTERVAL,
    };

    const A1: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(10, 0, 1, 2)), 7400);
    const A2: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(10, 0, 9, 2)), 7400);
    const B: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(10, 0, 2, 2)), 7400);

    fn node(seed: u8) -> Node {
        crate::node::testing::member(seed)
    }

    /// `a` at `a_at` and `b` at `B`: datagrams move until both are quiet; a datagram to an
    /// address that is neither is lost. Returns the datagrams `a` sent to `B`.
    fn pump(a: &mut Node, a_at: SocketAddr, b: &mut Node, now: Instant) -> Vec<Vec<u8>> {
        let mut out = vec![0u8; 65536];
        let mut from_a = Vec::new();
        for _ in 0..50 {
            let mut moved = false;
            while let Some((to, d)) = a.poll_transmit() {
                moved = true;
                if to == B {
                    b.handle_datagram(now, a_at, &d, &mut out);
                    from_a.push(d);
                }
            }
            while let Some((to, d)) = b.poll_transmit() {
                moved = true;
                if to == a_at {
                    a.handle_datagram(now, B, &d, &mut out);
                }
            }
            if !moved {
                break;
            }
        }
        from_a
    }

    /// `a` (at A1) and `b` with a session; the handles of each other's tunnel.
    fn pair(t0: Instant) -> (Node, Node, PeerHandle, PeerHandle) {
        let (mut a, mut b) = (node(1), node(2));
        a.add_static_peer(NamespaceId(0), B, t0);
        a.handle_timeout(t0);
        pump(&mut a, A1, &mut b, t0);
        let ha = a.peers().next().map(|p| p.handle).expect("a has a tunnel");
        let hb = b.peers().next().map(|p| p.handle).expect("b has a tunnel");
        assert!(a.peers().all(|p| p.handshake_age.is_some()), "handshaken");
        assert_eq!(b.peers().next().map(|p| p.endpoint), Some(A1));
        (a, b, ha, hb)
    }

    fn endpoint(n: &Node, h: PeerHandle) -> Option<SocketAddr> {
        n.peers().find(|p| p.handle == h).map(|p| p.endpoint)
    }

    fn endpoint_changes(n: &Node, h: PeerHandle) -> u64 {
        n.peers()
            .find(|p| p.handle == h)
            .map_or(0, |p| p.stats.endpoint_changes)
    }

    /// An IPv4 packet from `src` to `dst`.
    fn packet(src: u8, dst: u8) -> Vec<u8> {
        vec![
            0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0, 10, 201, 0, src, 10, 201, 0, dst,
        ]
    }

    #[test]
    fn a_member_that_moves_is_followed_at_once() {
        let t0 = test_epoch();
        let (mut a, mut b, ha, hb) = pair(t0);
        let t1 = t0 + Duration::from_secs(3);
        // a's address changes from A1 to A2: b still sends to A1, where nothing listens.
        a.handle_underlay_change(t1, &[ha]);
        assert_eq!(a.underlay_changes(), 1);
        let probes = pump(&mut a, A2, &mut b, t1);
        assert_eq!(probes.len(), 1, "one probe, at once");
        assert_eq!(
            endpoint(&b, hb),
            Some(A2),
            "the authenticated probe moved b's endpoint"
        );
        assert_eq!(endpoint_changes(&b, hb), 1);
        assert_eq!(
            a.poll_roam_timeout(),
            None,
            "b answered at the new address: no more probes"
        );
        // b's next packet goes to the new address.
        let mut out = vec![0u8; 256];
        let t = b
            .send(hb, &packet(2, 1), &mut out)
            .expect("b has a session");
        assert_eq!(t.to, A2);
        let mut rx = vec![0u8; 256];
        assert!(matches!(
            a.handle_datagram(t1, B, &out[t.range], &mut rx),
            Received::Deliver { .. }
        ));
        // Nothing more is sent for the move, however long a waits.
        a.handle_timeout(t1 + ROAM_PROBE_INTERVAL * 3);
        assert!(pump(&mut a, A2, &mut b, t1 + ROAM_PROBE_INTERVAL * 3)
            .iter()
            .all(|d| d.len() != probes[0].len()));
    }

    #[test]
    fn lost_probes_are_repeated_then_given_up() {
        let t0 = test_epoch();
        let (mut a, _b, ha, _) = pair(t0);
        let mut now = t0 + Duration::from_secs(3);
        a.handle_underlay_change(now, &[ha]);
        let mut sent = 0;
        // The new address cannot reach b yet: every probe is lost. The node asks to be
        // woken for the next one, and stops after ROAM_PROBES.
        for _ in 0..ROAM_PROBES * 3 {
            while let Some((to, _)) = a.poll_transmit() {
                assert_eq!(to, B);
                sent += 1;
            }
            let Some(next) = a.poll_roam_timeout() else {
                break;
            };
            assert_eq!(next, now + ROAM_PROBE_INTERVAL);
            assert!(a.poll_timeout().is_some_and(|t| t <= next));
            now = next;
            // Only the roaming timer: keep boringtun's and the path's timers out of it.
            a.run_roams(now);
        }
        assert_eq!(sent, ROAM_PROBES);
        assert_eq!(a.poll_roam_timeout(), None);
    }

    #[test]
    fn only_authenticated_packets_move_an_endpoint() {
        let t0 = test_epoch();
        let (mut a, mut b, ha, hb) = pair(t0);
        let t1 = t0 + Duration::from_secs(3);
        a.handle_underlay_change(t1, &[ha]);
        let probe = pump(&mut a, A2, &mut b, t1).remove(0);
        assert_eq!(endpoint(&b, hb), Some(A2));
        let mut out = vec![0u8; 256];
        let thief = SocketAddr::from(([203, 0, 113, 9], 9999));
        // The same probe replayed from elsewhere: WireGuard's replay window refuses it.
        assert_eq!(
            b.handle_datagram(t1, thief, &probe, &mut out),
            Received::PeerDropped(hb, PeerDropReason::Replay)
        );
        // A forged one (its tag does not verify).
        let mut forged = probe.clone();
        let last = forged.len() - 1;
        forged[last] ^= 1;
        forged[16] ^= 1;
        assert!(matches!(
            b.handle_datagram(t1, thief, &forged, &mut out),
            Received::PeerDropped(_, PeerDropReason::Decrypt | PeerDropReason::Replay)
                | Received::Dropped(DropReason::UnknownSession)
        ));
        assert_eq!(endpoint(&b, hb), Some(A2), "the endpoint stays");
        assert_eq!(endpoint_changes(&b, hb), 1);
    }

    #[test]
    fn without_a_session_the_handshake_carries_the_news() {
        let t0 = test_epoch();
        let (mut a, mut b) = (node(1), node(2));
        // b learned of a and opened a tunnel, but no handshake completed yet.
        let hb = b
            .add_member(t0, NamespaceId(0), a.peer_id(), A1)
            .expect("a valid member");
        while b.poll_transmit().is_some() {}
        b.handle_underlay_change(t0, &[hb]);
        let sent: Vec<_> = std::iter::from_fn(|| b.poll_transmit()).collect();
        assert!(!sent.is_empty(), "a hello or an initiation leaves at once");
        assert!(sent.iter().all(|(to, _)| *to == A1));
        assert_eq!(b.poll_roam_timeout(), None, "no probes without a session");
        // Delivered from b's new address, a's answer goes there and the tunnel comes up.
        let mut out = vec![0u8; 65536];
        for (_, d) in sent {
            a.handle_datagram(t0, B, &d, &mut out);
        }
        pump(&mut a, A1, &mut b, t0);
        assert!(b.peers().all(|p| p.handshake_age.is_some()));
    }

    #[test]
    fn a_change_with_no_tunnel_is_not_counted() {
        let t0 = test_epoch();
        let mut a = node(1);
        a.handle_underlay_change(t0, &[PeerHandle(3)]);
        assert_eq!(a.underlay_changes(), 0);
        assert!(a.poll_transmit().is_none());
    }
}
