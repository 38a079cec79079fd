//! VEPA ports: proxy ARP for LAN hosts, hairpin, anti-spoofing and source suppression.

use super::*;
use crate::LanPorts;

const LAN_C: Mac = [0x02, 0, 0, 0, 0, 0xc];

fn vepa() -> Switch<u32> {
    let mut sw = with_mode(Mode::Router);
    sw.config.lan_ports = LanPorts::Vepa;
    sw
}

/// Lets `mac` be heard from `ip` (an ARP request for the remote member .2).
fn heard(sw: &mut Switch<u32>, mac: Mac, ip: [u8; 4]) {
    let mut reply = [0u8; 64];
    let mut f = arp_from(mac, ip, 1, [10, 201, 0, 2]);
    assert!(matches!(
        sw.handle_tap_frame(t0(), &mut f, &mut reply),
        Action::ToTap { .. }
    ));
}

#[test]
fn vepa_answers_arp_for_lan_hosts_and_reflects_their_frames() {
    let mut sw = vepa();
    let mut reply = [0u8; 64];
    heard(&mut sw, LAN_A, [10, 201, 0, 10]);
    // B asks for A: the bridge brought it only to the TAP, so the router MAC answers.
    let mut b = arp_from(LAN_B, [10, 201, 0, 11], 1, [10, 201, 0, 10]);
    let Action::ToTap { len } = sw.handle_tap_frame(t0(), &mut b, &mut reply) else {
        panic!("no ARP reply for a LAN host");
    };
    let arp = ArpPacket::new_checked(&reply[14..len]).unwrap();
    assert_eq!(
        (arp.operation(), arp.sender_mac(), arp.sender_ip()),
        (ARP_REPLY, REMOTE_MAC, Ipv4Addr::new(10, 201, 0, 10))
    );
    assert_eq!(&reply[..6], &LAN_B);
    // B's packet to A comes to the router MAC and goes back out to A, from the router MAC.
    let mut f = ipv4_from(LAN_B, REMOTE_MAC, [10, 201, 0, 11], [10, 201, 0, 10]);
    let before = f.clone();
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut f, &mut reply),
        Action::Hairpin { packet: 14..42 }
    );
    assert_eq!(&f[..6], &LAN_A);
    assert_eq!(&f[6..12], &REMOTE_MAC);
    assert_eq!(f[12..], before[12..], "the packet itself is not touched");
    assert_eq!(sw.counters().hairpinned, 1);
    assert_eq!(
        sw.lan_ports(),
        vec![(
            LAN_B,
            crate::PortCounts {
                hairpinned: 1,
                spoofed: 0
            }
        )]
    );
    // A frame addressed to A's own MAC reached the TAP only by flooding: not reflected.
    let mut direct = ipv4_from(LAN_B, LAN_A, [10, 201, 0, 11], [10, 201, 0, 10]);
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut direct, &mut reply),
        Action::Drop(DropReason::LanLocal)
    );
    // B sending to A from a member's address: not reflected.
    let mut from_member = ipv4_from(LAN_B, REMOTE_MAC, [10, 201, 0, 2], [10, 201, 0, 10]);
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut from_member, &mut reply),
        Action::Drop(DropReason::Spoofed)
    );
    assert_eq!(sw.counters().hairpinned, 1);
    // Members' traffic is as in VEB mode.
    let mut out = ipv4_from(LAN_A, REMOTE_MAC, [10, 201, 0, 10], [10, 201, 0, 2]);
    assert!(matches!(
        sw.handle_tap_frame(t0(), &mut out, &mut reply),
        Action::ToPeer { peer: 7, .. }
    ));
    // VEB: the same request is the bridge's business.
    let mut veb = with_mode(Mode::Router);
    heard(&mut veb, LAN_A, [10, 201, 0, 10]);
    let mut b = arp_from(LAN_B, [10, 201, 0, 11], 1, [10, 201, 0, 10]);
    assert_eq!(
        veb.handle_tap_frame(t0(), &mut b, &mut reply),
        Action::Drop(DropReason::LanLocal)
    );
}

#[test]
fn vepa_probes_the_lan_for_an_unknown_address() {
    let mut sw = vepa();
    let mut reply = [0u8; 64];
    let mut b = arp_from(LAN_B, [10, 201, 0, 11], 1, [10, 201, 0, 40]);
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut b, &mut reply),
        Action::Resolve {
            target: Ipv4Addr::new(10, 201, 0, 40).into()
        }
    );
    let mut buf = [0u8; 64];
    let len = sw.poll_transmit(&mut buf).expect("a probe");
    let arp = ArpPacket::new_checked(&buf[14..len]).unwrap();
    assert_eq!(
        (arp.operation(), arp.target_ip()),
        (ARP_REQUEST, Ipv4Addr::new(10, 201, 0, 40))
    );
    // Asked once a second, however often the host asks.
    let _ = sw.handle_tap_frame(t0(), &mut b, &mut reply);
    assert_eq!(sw.poll_transmit(&mut buf), None);
    // The silent host answers the probe: learned, and the next request is answered.
    let mut answer = arp_from(LAN_C, [10, 201, 0, 40], 2, [0, 0, 0, 0]);
    let _ = sw.handle_tap_frame(t0(), &mut answer, &mut reply);
    assert_eq!(sw.lan_host_mac(Ipv4Addr::new(10, 201, 0, 40)), Some(LAN_C));
    assert!(matches!(
        sw.handle_tap_frame(t0(), &mut b, &mut reply),
        Action::ToTap { .. }
    ));
}

#[test]
fn vepa_drops_a_lan_host_sending_from_what_is_not_its_own() {
    let mut sw = vepa();
    let mut reply = [0u8; 64];
    heard(&mut sw, LAN_A, [10, 201, 0, 10]);
    heard(&mut sw, LAN_B, [10, 201, 0, 11]);
    // C takes A's address: in an IPv4 packet, an ARP request, a gratuitous ARP.
    let mut ip = ipv4_from(LAN_C, REMOTE_MAC, [10, 201, 0, 10], [10, 201, 0, 11]);
    let mut arp = arp_from(LAN_C, [10, 201, 0, 10], 1, [10, 201, 0, 11]);
    let mut garp = arp_from(LAN_C, [10, 201, 0, 10], 1, [10, 201, 0, 10]);
    // ... or the gateway's, or an ARP whose sender MAC is not the frame's.
    let mut gateway = ipv4_from(LAN_C, REMOTE_MAC, [10, 201, 0, 1], [10, 201, 0, 11]);
    let mut forged = arp_from(LAN_C, [10, 201, 0, 12], 1, [10, 201, 0, 11]);
    forged[22..28].copy_from_slice(&LAN_B);
    for f in [&mut ip, &mut arp, &mut garp, &mut gateway, &mut forged] {
        assert_eq!(
            sw.handle_tap_frame(t0(), f, &mut reply),
            Action::Drop(DropReason::Spoofed)
        );
    }
    assert_eq!(sw.counters().drops(DropReason::Spoofed), 5);
    assert_eq!(sw.counters().announcements, 0, "no announcement taken");
    assert_eq!(sw.lan_host_mac(Ipv4Addr::new(10, 201, 0, 10)), Some(LAN_A));
    assert_eq!(sw.lan_host_with_mac(LAN_C), None);
    let c = sw.lan_ports().into_iter().find(|(m, _)| *m == LAN_C);
    assert_eq!(c.map(|(_, c)| c.spoofed), Some(5));
    // A source outside the subnet is nobody's to reflect.
    let mut foreign = ipv4_from(LAN_C, REMOTE_MAC, [192, 168, 1, 5], [10, 201, 0, 11]);
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut foreign, &mut reply),
        Action::Drop(DropReason::Spoofed)
    );
    // An address leased (or handed over) with a MAC is bound before its host speaks.
    sw.learn_lan_host(Ipv4Addr::new(10, 201, 0, 30), LAN_B, t0());
    sw.bind_lease(Ipv4Addr::new(10, 201, 0, 31), LAN_B);
    for src in [[10, 201, 0, 30], [10, 201, 0, 31]] {
        let mut early = ipv4_from(LAN_C, REMOTE_MAC, src, [10, 201, 0, 10]);
        assert_eq!(
            sw.handle_tap_frame(t0(), &mut early, &mut reply),
            Action::Drop(DropReason::Spoofed)
        );
    }
    // The lease's own host may; once released, the address is free to learn.
    let mut own = ipv4_from(LAN_B, REMOTE_MAC, [10, 201, 0, 31], [10, 201, 0, 10]);
    assert!(matches!(
        sw.handle_tap_frame(t0(), &mut own, &mut reply),
        Action::Hairpin { .. }
    ));
    sw.forget_lan_host(Ipv4Addr::new(10, 201, 0, 31));
    sw.unbind_lease(Ipv4Addr::new(10, 201, 0, 31));
    let mut after = ipv4_from(LAN_C, REMOTE_MAC, [10, 201, 0, 31], [10, 201, 0, 10]);
    assert!(matches!(
        sw.handle_tap_frame(t0(), &mut after, &mut reply),
        Action::Hairpin { .. }
    ));
    // VEB mode does not check: the latest sender wins, as before.
    let mut veb = with_mode(Mode::Router);
    heard(&mut veb, LAN_A, [10, 201, 0, 10]);
    let mut ip = ipv4_from(LAN_C, REMOTE_MAC, [10, 201, 0, 10], [10, 201, 0, 2]);
    assert!(matches!(
        veb.handle_tap_frame(t0(), &mut ip, &mut reply),
        Action::ToPeer { .. }
    ));
    assert_eq!(veb.counters().drops(DropReason::Spoofed), 0);
}

#[test]
fn vepa_with_a_static_table_takes_only_its_pairs() {
    let mut sw = vepa();
    sw.config.lan_table = vec![
        (Ipv4Addr::new(10, 201, 0, 10), LAN_A),
        (Ipv4Addr::new(10, 201, 0, 11), LAN_B),
    ];
    let mut reply = [0u8; 64];
    heard(&mut sw, LAN_A, [10, 201, 0, 10]);
    heard(&mut sw, LAN_B, [10, 201, 0, 11]);
    // A at B's address, and C anywhere: not in the table.
    let mut a = ipv4_from(LAN_A, REMOTE_MAC, [10, 201, 0, 11], [10, 201, 0, 2]);
    let mut c = arp_from(LAN_C, [10, 201, 0, 12], 1, [10, 201, 0, 2]);
    for f in [&mut a, &mut c] {
        assert_eq!(
            sw.handle_tap_frame(t0(), f, &mut reply),
            Action::Drop(DropReason::Spoofed)
        );
    }
    let mut ok = ipv4_from(LAN_A, REMOTE_MAC, [10, 201, 0, 10], [10, 201, 0, 11]);
    assert!(matches!(
        sw.handle_tap_frame(t0(), &mut ok, &mut reply),
        Action::Hairpin { .. }
    ));
}

#[test]
fn vepa_copies_a_broadcast_to_the_other_lan_hosts_never_its_sender() {
    let mut sw = vepa();
    let mut reply = [0u8; 64];
    heard(&mut sw, LAN_A, [10, 201, 0, 10]);
    heard(&mut sw, LAN_B, [10, 201, 0, 11]);
    heard(&mut sw, LAN_B, [10, 201, 0, 21]); // one host, two addresses
    heard(&mut sw, LAN_C, [10, 201, 0, 12]);
    let mut macs = Vec::new();
    for dst in [[10, 201, 255, 255], [255, 255, 255, 255], [239, 1, 2, 3]] {
        let mut bcast = ipv4_from(LAN_A, BROADCAST_MAC, [10, 201, 0, 10], dst);
        assert!(matches!(
            sw.handle_tap_frame(t0(), &mut bcast, &mut reply),
            Action::Broadcast { .. }
        ));
        sw.lan_copies(&bcast, &mut macs);
        assert_eq!(macs, [LAN_B, LAN_C], "to {dst:?}");
        sw.address_copy(&mut bcast, LAN_B);
        assert_eq!((&bcast[..6], &bcast[6..12]), (&LAN_B[..], &REMOTE_MAC[..]));
    }
    assert_eq!(sw.counters().lan_copies, 6);
    // Unicast is not copied, nor anything in VEB mode.
    let unicast = ipv4_from(LAN_A, REMOTE_MAC, [10, 201, 0, 10], [10, 201, 0, 11]);
    sw.lan_copies(&unicast, &mut macs);
    assert!(macs.is_empty());
    let mut veb = with_mode(Mode::Router);
    heard(&mut veb, LAN_A, [10, 201, 0, 10]);
    heard(&mut veb, LAN_B, [10, 201, 0, 11]);
    let bcast = ipv4_from(LAN_A, BROADCAST_MAC, [10, 201, 0, 10], [10, 201, 255, 255]);
    veb.lan_copies(&bcast, &mut macs);
    assert!(macs.is_empty());
}
