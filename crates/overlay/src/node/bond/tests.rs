#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use super::*;
use crate::node::testing::member;
use crate::node::{test_epoch, NamespaceId, Received, TICK};

fn at(net: u8, host: u8) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 200 + net, 0, host)), 7400)
}

/// Two agents, each on two underlay links (10.201.0.0/24 and 10.202.0.0/24, rates 2:1),
/// and which links carry datagrams.
struct Lab {
    a: Node,
    b: Node,
    ha: PeerHandle,
    up: [bool; 2],
    /// Datagrams that crossed each link.
    crossed: [u64; 2],
    now: Instant,
}

const RATES: [u64; 2] = [200_000_000, 100_000_000];

impl Lab {
    fn new(up: [bool; 2]) -> Self {
        let now = test_epoch();
        let (mut a, mut b) = (member(1), member(2));
        a.set_uplinks(vec![(at(1, 1), RATES[0]), (at(2, 1), RATES[1])])
            .unwrap();
        b.set_uplinks(vec![(at(1, 2), RATES[0]), (at(2, 2), RATES[1])])
            .unwrap();
        a.add_static_peer(NamespaceId(0), at(1, 2), now);
        let mut lab = Lab {
            a,
            b,
            ha: PeerHandle(0),
            up,
            crossed: [0; 2],
            now,
        };
        lab.run(Duration::from_millis(500));
        lab.ha = lab.a.peers().next().expect("a has a tunnel").handle;
        lab
    }

    /// The link a datagram to `to` takes, and where it seems to come from there.
    fn link(to: SocketAddr) -> (usize, u8) {
        let IpAddr::V4(ip) = to.ip() else {
            unreachable!()
        };
        (usize::from(ip.octets()[1] - 201), ip.octets()[3])
    }

    /// Moves what both nodes queued, over the links that are up.
    fn pump(&mut self) {
        let mut out = vec![0u8; 65536];
        for _ in 0..50 {
            let mut moved = false;
            while let Some((to, d)) = self.a.poll_transmit() {
                moved = true;
                self.carry(true, to, &d, &mut out);
            }
            while let Some((to, d)) = self.b.poll_transmit() {
                moved = true;
                self.carry(false, to, &d, &mut out);
            }
            if !moved {
                return;
            }
        }
    }

    fn carry(&mut self, from_a: bool, to: SocketAddr, d: &[u8], out: &mut [u8]) -> Received {
        let (link, _) = Self::link(to);
        if !self.up[link] {
            return Received::Consumed;
        }
        self.crossed[link] += 1;
        let (node, from) = if from_a {
            (&mut self.b, at(link as u8 + 1, 1))
        } else {
            (&mut self.a, at(link as u8 + 1, 2))
        };
        node.handle_datagram(self.now, from, d, out)
    }

    /// Runs both nodes' timers every 50 ms for `d`.
    fn run(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.a.handle_timeout(self.now);
            self.b.handle_timeout(self.now);
            self.pump();
            self.now += Duration::from_millis(50);
        }
    }

    /// A UDP packet of flow `flow` from a (10.201.0.1) to b (10.201.0.2), sealed by a and
    /// carried: the link it took, if it arrived.
    fn send(&mut self, flow: u16) -> Option<usize> {
        let mut p = vec![
            0x45, 0, 0, 36, 0, 0, 0, 0, 64, 17, 0, 0, 10, 201, 0, 1, 10, 201, 0, 2,
        ];
        p.extend_from_slice(&flow.to_be_bytes());
        p.extend_from_slice(&[0x1f, 0x90, 0, 16, 0, 0]);
        p.extend_from_slice(b"payload!");
        let sealer = self.a.sealer(self.ha, &p).expect("a tunnel");
        let mut buf = vec![0u8; 512];
        let t = sealer.seal(&p, &mut buf).expect("sealed");
        let (link, _) = Self::link(t.to);
        let mut out = vec![0u8; 512];
        match self.carry(true, t.to, &buf[t.range], &mut out) {
            Received::Deliver { .. } => Some(link),
            _ => None,
        }
    }

    fn links(&self, node: &Node) -> Vec<BondLink> {
        node.peers().next().expect("a tunnel").links
    }
}

#[test]
fn flows_split_by_the_links_rates_and_no_endpoint_roams() {
    let mut lab = Lab::new([true, true]);
    for node in [&lab.a, &lab.b] {
        let links = lab.links(node);
        assert_eq!(links.len(), 2, "both bond over the other's two links");
        assert!(links.iter().all(|l| l.stats.alive), "{links:?}");
    }
    let mut on = [0u32; 2];
    let mut first = HashMap::new();
    for flow in 0..300u16 {
        let link = lab.send(flow).expect("delivered");
        on[link] += 1;
        first.insert(flow, link);
    }
    assert_eq!(on, [200, 100], "flows split as the rates, 2:1");
    // Later packets keep to their flow's link.
    for flow in 0..300u16 {
        assert_eq!(lab.send(flow), Some(first[&flow]));
    }
    // Both links carried data and probe answers, and neither end roamed between them.
    lab.run(Duration::from_secs(2));
    for node in [&lab.a, &lab.b] {
        let p = node.peers().next().unwrap();
        assert_eq!(p.stats.endpoint_changes, 0);
        assert!(p.links.iter().all(|l| l.stats.alive));
    }
    assert_eq!(lab.a.peers().next().unwrap().endpoint, at(1, 2));
}

#[test]
fn a_dead_link_moves_its_flows_within_a_second() {
    let mut lab = Lab::new([true, true]);
    let placed: Vec<usize> = (0..30u16).map(|f| lab.send(f).unwrap()).collect();
    assert!(placed.contains(&0) && placed.contains(&1));
    lab.up[0] = false;
    let cut = lab.now;
    // Flows on the dead link are lost until it is declared dead, then all arrive on the
    // other; the ones already there never stopped.
    let mut back = None;
    while lab.now < cut + Duration::from_secs(2) {
        lab.run(Duration::from_millis(50));
        let arrived: Vec<Option<usize>> = (0..30u16).map(|f| lab.send(f)).collect();
        for (f, got) in arrived.iter().enumerate() {
            if placed[f] == 1 {
                assert_eq!(*got, Some(1), "a flow on the live link was disturbed");
            }
        }
        if back.is_none() && arrived.iter().all(|g| *g == Some(1)) {
            back = Some(lab.now - cut);
        }
    }
    let back = back.expect("flows never came back");
    assert!(back <= Duration::from_secs(1), "back after {back:?}");
    let dead = lab.links(&lab.a)[0].stats;
    assert!(!dead.alive && dead.deaths == 1, "{dead:?}");
    // Control (keepalives, handshakes) leaves the dead endpoint too: the tunnel lives on.
    lab.run(Duration::from_secs(30));
    let p = lab.a.peers().next().unwrap();
    assert!(p.stats.endpoint_changes == 0 && p.relayed_via.is_none());
    assert_eq!(lab.send(7), Some(1));
    // The link comes back: it takes new flows, old ones stay put.
    lab.up[0] = true;
    lab.run(Duration::from_millis(500));
    assert!(lab.links(&lab.a)[0].stats.alive);
    assert_eq!(lab.send(7), Some(1));
    let new: Vec<usize> = (1000..1030u16).map(|f| lab.send(f).unwrap()).collect();
    assert!(new.contains(&0), "the link back takes new flows");
}

#[test]
fn an_announced_link_that_never_answers_carries_nothing() {
    let mut lab = Lab::new([true, false]);
    let links = lab.links(&lab.a);
    assert!(links[0].stats.alive && !links[1].stats.alive, "{links:?}");
    for flow in 0..50u16 {
        assert_eq!(lab.send(flow), Some(0));
    }
    assert_eq!(lab.links(&lab.a)[1].stats.packets, 0);
}

#[test]
fn uplinks_are_checked_and_a_member_that_withdraws_them_is_unbonded() {
    let mut n = member(1);
    assert_eq!(n.set_uplinks(vec![(at(1, 1), 1)]), Err(UplinksError::One));
    assert_eq!(
        n.set_uplinks(vec![(at(1, 1), 1), (at(1, 1), 2)]),
        Err(UplinksError::Duplicate(at(1, 1)))
    );
    assert_eq!(
        n.set_uplinks(vec![(at(1, 1), 1), (at(2, 1), 0)]),
        Err(UplinksError::ZeroRate(at(2, 1)))
    );
    assert_eq!(
        n.set_uplinks((1..=9).map(|h| (at(1, h), 1)).collect()),
        Err(UplinksError::TooMany)
    );
    let mut lab = Lab::new([true, true]);
    lab.b.set_uplinks(Vec::new()).unwrap();
    lab.run(TICK);
    assert!(lab.links(&lab.a).is_empty(), "a bonds no more");
    assert_eq!(lab.links(&lab.b).len(), 2, "b still bonds to a");
}
