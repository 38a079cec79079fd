//! Address lists longer than an announcement: a router with hundreds of LAN hosts (or
//! dual-stack hosts with several IPv6 addresses each) holds more addresses than one
//! announcement carries ([`MAX_ANNOUNCED`] of each family). Its announcement then names a
//! generation, and its whole lists follow in [`Control::Addresses`] parts of it, to
//! members that said they read them. A receiver keeps the lists it had until every part of
//! the named generation is in, then takes them whole, exactly as it takes an announcement's
//! (with an authority, only what the member's certificate allows). Until then its
//! `have_yours` stays clear, so the member sends them again. An older agent gets the first
//! addresses only, as before.

use std::net::IpAddr;

use super::{Event, Node, PeerHandle};
use crate::wire::{AddressPart, Control, MAX_ANNOUNCED};

impl Node {
    /// Whether our lists go to the member of `handle` in parts: it reads them, and we hold
    /// more than an announcement carries of a family it gets.
    pub(super) fn in_parts(&self, handle: PeerHandle) -> bool {
        let Some(peer) = self.peer(handle) else {
            return false;
        };
        let Some(namespace) = self.namespaces.get(peer.ns.0) else {
            return false;
        };
        let v6 = peer.speaks_addresses6 && !self.is_layer2(peer.ns);
        peer.reads_parts
            && (namespace.addresses.len() > MAX_ANNOUNCED
                || (v6 && namespace.addresses6.len() > MAX_ANNOUNCED))
    }

    /// Sends our whole lists to the member of `handle` as the parts of their generation
    /// (after the announcement that names it).
    pub(super) fn send_address_parts(&mut self, handle: PeerHandle) {
        let Some(peer) = self.peer(handle) else {
            return;
        };
        let ns = peer.ns;
        let v6 = peer.speaks_addresses6 && !self.is_layer2(ns);
        let Some(namespace) = self.namespaces.get_mut(ns.0) else {
            return;
        };
        let list6 = if v6 { &namespace.addresses6[..] } else { &[] };
        let generation = namespace.address_generation;
        let parts = AddressPart::split(generation, &namespace.addresses, list6);
        let sent: usize = parts.iter().map(|p| p.addresses.len()).sum();
        let cut = namespace.addresses.len() + list6.len() - sent;
        if cut > 0 && namespace.parts_cut != Some(generation) {
            namespace.parts_cut = Some(generation);
            tracing::warn!(cut, sent, "more addresses than an announcement's parts carry: members take packets only from those sent");
        }
        for part in parts {
            let packet = Control::Addresses(part).emit();
            self.send_control(handle, &packet, None);
        }
    }

    /// A part of the lists of the member of `handle`.
    pub(super) fn handle_address_part(&mut self, handle: PeerHandle, part: AddressPart) {
        let Some(peer) = self.peer_mut(handle) else {
            return;
        };
        if let Some(whole) = peer.address_parts.take(part) {
            peer.parts_whole = Some(whole);
            self.take_address_parts(handle);
        }
    }

    /// Takes the member's gathered lists if they are the generation its last announcement
    /// named.
    pub(super) fn take_address_parts(&mut self, handle: PeerHandle) {
        let Some(peer) = self.peer_mut(handle) else {
            return;
        };
        let expected = peer.parts_expected;
        if expected.is_none() || peer.parts_whole.as_ref().map(|(g, _)| *g) != expected {
            return;
        }
        let ns = peer.ns;
        let certified = self
            .namespaces
            .get(ns.0)
            .is_some_and(|n| n.credential.is_some());
        let Some(peer) = self.peer_mut(handle) else {
            return;
        };
        // With an authority, its certificate (checked with the announcement that named the
        // parts) says which addresses stand; without one yet, the set waits.
        if certified && peer.certificate.is_none() {
            return;
        }
        let Some((generation, all)) = peer.parts_whole.take() else {
            return;
        };
        peer.parts_expected = None;
        peer.parts_taken = Some(generation);
        let reads6 = peer.speaks_addresses6;
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        for a in all {
            match a {
                IpAddr::V4(a) => v4.push(a),
                IpAddr::V6(a) => v6.push(a),
            }
        }
        if let Some(cert) = peer.certificate.as_ref().filter(|_| certified) {
            // The first ones were counted with the announcement (the parts start with them).
            let refused = v4
                .iter()
                .skip(MAX_ANNOUNCED)
                .filter(|a| !cert.allows_address((**a).into()))
                .count();
            v4.retain(|a| cert.allows_address((*a).into()));
            if refused > 0 {
                tracing::warn!(peer = ?peer.id, refused, "member listed addresses its certificate does not allow");
                self.certificate_stats.address_not_allowed += refused as u64;
            }
        }
        let Some(peer) = self.peer_mut(handle) else {
            return;
        };
        if peer.handle_announce(&v4) {
            self.events.push_back(Event::PeerAddresses {
                ns,
                peer: handle,
                addresses: v4,
            });
        }
        if reads6 {
            self.handle_addresses6(handle, v6);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

    use crate::node::testing::{member, pump};
    use crate::node::{test_epoch, Event, NamespaceId, Node, PeerDropReason, Received};
    use crate::wire::AddressPart;

    const A: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(10, 0, 1, 2)), 7400);
    const B: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(10, 0, 2, 2)), 7400);

    fn udp4(src: Ipv4Addr) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0];
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&[10, 201, 0, 2]);
        p.extend_from_slice(b"payload!");
        p
    }

    fn udp6(src: Ipv6Addr) -> Vec<u8> {
        let mut p = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&"fd00::2".parse::<Ipv6Addr>().unwrap().octets());
        p.extend_from_slice(b"payload!");
        p
    }

    /// Members 1 (at A) and 2 (at B) with a tunnel between them.
    fn pair(now: std::time::Instant) -> (Node, Node) {
        let (mut a, mut b) = (member(1), member(2));
        a.add_static_peer(NamespaceId(0), B, now);
        a.handle_timeout(now);
        pump(&mut a, A, &mut b, B, now);
        (a, b)
    }

    #[test]
    fn a_member_holding_hundreds_of_addresses_has_every_one_taken() {
        let now = test_epoch();
        let (mut a, mut b) = pair(now);
        let ha = a.peers().next().map(|p| p.handle).expect("a has a tunnel");
        let hb = b.peers().next().map(|p| p.handle).expect("b has a tunnel");
        // A router with 300 IPv4 and 100 IPv6 addresses (its own and its LAN hosts').
        let v4: Vec<Ipv4Addr> = (1..=300u32)
            .map(|i| Ipv4Addr::from(0x0ac9_0000 + i))
            .collect();
        let v6: Vec<Ipv6Addr> = (1..=100u128)
            .map(|i| Ipv6Addr::from(0xfd00_u128 << 112 | i))
            .collect();
        a.set_addresses(now, NamespaceId(0), v4.clone());
        a.set_addresses6(now, NamespaceId(0), v6.clone());
        pump(&mut a, A, &mut b, B, now);
        let events: Vec<Event> = std::iter::from_fn(|| b.poll_event()).collect();
        let seen = b
            .peers()
            .next()
            .map(|p| (p.addresses.to_vec(), p.addresses6.to_vec()));
        assert_eq!(seen, Some((v4.clone(), v6.clone())));
        assert!(events.iter().any(|e| *e
            == Event::PeerAddresses {
                ns: NamespaceId(0),
                peer: hb,
                addresses: v4.clone()
            }));
        // Packets from the last addresses of each list are taken; others are not.
        let through = |a: &mut Node, b: &mut Node, p: &[u8]| {
            let sealer = a.sealer(ha, p).expect("a tunnel");
            let (mut out, mut rx) = (vec![0u8; 512], vec![0u8; 512]);
            let t = sealer.seal(p, &mut out).expect("sealed");
            b.handle_datagram(now, A, &out[t.range], &mut rx)
        };
        for p in [udp4(v4[299]), udp4(v4[64]), udp6(v6[99])] {
            assert!(matches!(
                through(&mut a, &mut b, &p),
                Received::Deliver { .. }
            ));
        }
        for p in [
            udp4(Ipv4Addr::new(10, 201, 9, 9)),
            udp6("fd00::bad".parse().unwrap()),
        ] {
            assert_eq!(
                through(&mut a, &mut b, &p),
                Received::PeerDropped(hb, PeerDropReason::SpoofedSource)
            );
        }
        // Shrunk back to one announcement's worth: the lists are whole in it again.
        a.set_addresses(now, NamespaceId(0), v4[..10].to_vec());
        a.set_addresses6(now, NamespaceId(0), v6[..3].to_vec());
        pump(&mut a, A, &mut b, B, now);
        let seen = b
            .peers()
            .next()
            .map(|p| (p.addresses.to_vec(), p.addresses6.to_vec()));
        assert_eq!(seen, Some((v4[..10].to_vec(), v6[..3].to_vec())));
        assert_eq!(
            through(&mut a, &mut b, &udp4(v4[299])),
            Received::PeerDropped(hb, PeerDropReason::SpoofedSource)
        );
    }

    #[test]
    fn lists_in_parts_are_taken_only_whole_and_of_the_announced_generation() {
        let now = test_epoch();
        let (mut a, mut b) = pair(now);
        let v4: Vec<Ipv4Addr> = (1..=600u32)
            .map(|i| Ipv4Addr::from(0x0ac9_0000 + i))
            .collect();
        // The announcement and its three parts: b takes nothing before the last part, and
        // says it lacks our lists until then.
        a.set_addresses(now, NamespaceId(0), v4.clone());
        let mut out = vec![0u8; 65536];
        let sent: Vec<Vec<u8>> = std::iter::from_fn(|| a.poll_transmit().map(|(_, d)| d)).collect();
        assert_eq!(sent.len(), 4, "the announcement and three parts");
        for d in &sent[..3] {
            b.handle_datagram(now, A, d, &mut out);
        }
        let hb = b.peers().next().map(|p| p.handle).expect("b has a tunnel");
        assert_eq!(
            b.peers().next().map(|p| p.addresses.to_vec()),
            Some(vec![Ipv4Addr::new(10, 201, 0, 1)]),
            "the lists it had stand until every part is in"
        );
        assert!(b.peer(hb).is_some_and(|p| !p.has_their_announcement()));
        b.handle_datagram(now, A, &sent[3], &mut out);
        assert_eq!(b.peers().next().map(|p| p.addresses.len()), Some(600));
        assert!(b.peer(hb).is_some_and(|p| p.has_their_announcement()));
        // A newer announcement: whole parts of another generation (late, or sent twice)
        // are not taken; the named generation's are.
        a.set_addresses(now, NamespaceId(0), v4[..100].to_vec());
        let newer: Vec<Vec<u8>> =
            std::iter::from_fn(|| a.poll_transmit().map(|(_, d)| d)).collect();
        assert_eq!(newer.len(), 2);
        b.handle_datagram(now, A, &newer[0], &mut out);
        let named = b
            .peer(hb)
            .and_then(|p| p.parts_expected)
            .expect("parts expected");
        for part in AddressPart::split(named.wrapping_sub(1), &v4[..70], &[]) {
            b.handle_address_part(hb, part);
        }
        assert_eq!(b.peers().next().map(|p| p.addresses.len()), Some(600));
        b.handle_datagram(now, A, &newer[1], &mut out);
        assert_eq!(
            b.peers().next().map(|p| p.addresses.to_vec()),
            Some(v4[..100].to_vec())
        );
        // Parts whole before their announcement are taken when it comes.
        a.set_addresses(now, NamespaceId(0), v4[..200].to_vec());
        let next: Vec<Vec<u8>> = std::iter::from_fn(|| a.poll_transmit().map(|(_, d)| d)).collect();
        b.handle_datagram(now, A, &next[1], &mut out);
        assert_eq!(b.peers().next().map(|p| p.addresses.len()), Some(100));
        b.handle_datagram(now, A, &next[0], &mut out);
        assert_eq!(
            b.peers().next().map(|p| p.addresses.to_vec()),
            Some(v4[..200].to_vec())
        );
    }

    #[test]
    fn two_members_both_in_parts_go_quiet() {
        let now = test_epoch();
        let (mut a, mut b) = (member(1), member(2));
        let many = |base: u32| -> Vec<Ipv4Addr> {
            (0..200u32).map(|i| Ipv4Addr::from(base + i)).collect()
        };
        // Both hold more than one announcement carries before they meet.
        a.set_addresses(now, NamespaceId(0), many(0x0ac9_0100));
        b.set_addresses(now, NamespaceId(0), many(0x0ac9_1000));
        a.add_static_peer(NamespaceId(0), B, now);
        a.handle_timeout(now);
        quiet_within(&mut a, &mut b, now, 20);
        assert_eq!(
            a.peers().next().map(|p| p.addresses.to_vec()),
            Some(many(0x0ac9_1000))
        );
        assert_eq!(
            b.peers().next().map(|p| p.addresses.to_vec()),
            Some(many(0x0ac9_0100))
        );
        // Each has the other's lists, and says so.
        assert!(a
            .peers()
            .next()
            .is_some_and(|p| a.peer(p.handle).is_some_and(|p| p.has_their_announcement())));
        assert!(b
            .peers()
            .next()
            .is_some_and(|p| b.peer(p.handle).is_some_and(|p| p.has_their_announcement())));
        // The periodic announcement names the generation taken: b waits for nothing.
        let later = now + crate::node::ANNOUNCE_INTERVAL + crate::node::TICK;
        a.handle_timeout(later);
        let sent: Vec<Vec<u8>> = std::iter::from_fn(|| a.poll_transmit().map(|(_, d)| d)).collect();
        assert!(!sent.is_empty(), "a announces again");
        let mut out = vec![0u8; 65536];
        for d in &sent {
            b.handle_datagram(later, A, d, &mut out);
            assert!(b.peers().next().is_some_and(|p| b
                .peer(p.handle)
                .is_some_and(|p| p.parts_expected.is_none() && p.has_their_announcement())));
        }
        quiet_within(&mut a, &mut b, later, 20);
    }

    /// Moves datagrams between `a` (at A) and `b` (at B) until both are quiet, failing
    /// after `most` rounds.
    fn quiet_within(a: &mut Node, b: &mut Node, now: std::time::Instant, most: usize) {
        let mut out = vec![0u8; 65536];
        for _ in 0..most {
            let from_a: Vec<Vec<u8>> =
                std::iter::from_fn(|| a.poll_transmit().map(|(_, d)| d)).collect();
            let from_b: Vec<Vec<u8>> =
                std::iter::from_fn(|| b.poll_transmit().map(|(_, d)| d)).collect();
            if from_a.is_empty() && from_b.is_empty() {
                return;
            }
            for d in &from_a {
                b.handle_datagram(now, A, d, &mut out);
            }
            for d in &from_b {
                a.handle_datagram(now, B, d, &mut out);
            }
        }
        panic!("still answering each other after {most} rounds");
    }
}
