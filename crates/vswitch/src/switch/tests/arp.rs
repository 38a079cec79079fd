//! Proxy ARP, interface mode and hybrid mode's LAN probe first.

use super::*;

#[test]
fn proxy_arp_answers_for_a_known_member() {
    let mut sw = switch();
    let mut reply = [0u8; 64];
    let Action::ToTap { len } =
        sw.handle_tap_frame(t0(), &mut arp_request([10, 201, 0, 2]), &mut reply)
    else {
        panic!("expected a reply")
    };
    let eth = EthernetFrame::new_checked(&reply[..len]).unwrap();
    assert_eq!(eth.dst(), DEVICE_MAC);
    assert_eq!(eth.src(), REMOTE_MAC);
    let arp = ArpPacket::new_checked(eth.payload()).unwrap();
    assert_eq!(arp.operation(), ARP_REPLY);
    assert_eq!(arp.sender_mac(), REMOTE_MAC);
    assert_eq!(arp.sender_ip(), Ipv4Addr::new(10, 201, 0, 2));
    assert_eq!(arp.target_ip(), Ipv4Addr::new(10, 201, 0, 1));
    assert_eq!(sw.counters().arp_replies, 1);
}

#[test]
fn proxy_arp_follows_ipop_rules() {
    let mut sw = switch();
    let mut reply = [0u8; 64];
    // (c) no member owns it
    let unknown = sw.handle_tap_frame(t0(), &mut arp_request([10, 201, 0, 9]), &mut reply);
    assert_eq!(
        unknown,
        Action::Resolve {
            target: Ipv4Addr::new(10, 201, 0, 9).into()
        }
    );
    // (b) our own address (the kernel's duplicate-address probe)
    let own = sw.handle_tap_frame(t0(), &mut arp_request([10, 201, 0, 1]), &mut reply);
    assert_eq!(own, Action::Drop(DropReason::ArpIgnored));
    // (a) outside the namespace
    let outside = sw.handle_tap_frame(t0(), &mut arp_request([192, 168, 1, 1]), &mut reply);
    assert_eq!(outside, Action::Drop(DropReason::ArpIgnored));
    assert_eq!(sw.counters().drops(DropReason::ArpIgnored), 2);
    assert_eq!(sw.counters().resolves, 1);
}

#[test]
fn hybrid_handles_only_its_device_and_probes_the_lan_first() {
    let mut sw = with_mode(Mode::Hybrid);
    let mut reply = [0u8; 64];
    let mut buf = [0u8; 64];
    // Another hybrid agent on this LAN writes a remote member's packet for its own
    // host, flooded here: that address is not on the LAN.
    let mut flooded = ipv4_from(
        [0xfe, 0xfd, 9, 9, 9, 9],
        LAN_B,
        [10, 201, 0, 2],
        [10, 201, 0, 11],
    );
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut flooded, &mut reply),
        Action::Drop(DropReason::OtherHost)
    );
    assert!(
        sw.lan_hosts().is_empty(),
        "learned a remote member as local"
    );
    // Another LAN host's frames are not ours (but are learned).
    let mut other = arp_from(LAN_B, [10, 201, 0, 11], 1, [10, 201, 0, 2]);
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut other, &mut reply),
        Action::Drop(DropReason::OtherHost)
    );
    assert_eq!(sw.poll_event(), None, "hybrid claims nothing for the LAN");
    // The host asks for remote .2: the LAN is probed first.
    let mut ask = arp_from(DEVICE_MAC, [10, 201, 0, 1], 1, [10, 201, 0, 2]);
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut ask, &mut reply),
        Action::Drop(DropReason::ArpProbing)
    );
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut ask, &mut reply),
        Action::Drop(DropReason::ArpProbing)
    );
    let len = sw.poll_transmit(&mut buf).unwrap();
    assert_eq!(&buf[0..6], &BROADCAST_MAC);
    assert_eq!(
        ArpPacket::new_checked(&buf[14..len]).unwrap().target_ip(),
        Ipv4Addr::new(10, 201, 0, 2)
    );
    assert_eq!(sw.poll_transmit(&mut buf), None, "one probe per address");
    // Nothing local answers: at the timeout the host gets its reply.
    let timeout = sw.config().probe_timeout;
    sw.handle_timeout(t0() + timeout / 2);
    assert_eq!(sw.poll_transmit(&mut buf), None);
    sw.handle_timeout(t0() + timeout);
    let len = sw.poll_transmit(&mut buf).unwrap();
    let arp = ArpPacket::new_checked(&buf[14..len]).unwrap();
    assert_eq!((arp.operation(), arp.sender_mac()), (ARP_REPLY, REMOTE_MAC));
    assert_eq!(&buf[0..6], &DEVICE_MAC);
    // Now confirmed remote: answered at once.
    assert!(matches!(
        sw.handle_tap_frame(t0() + timeout, &mut ask, &mut reply),
        Action::ToTap { .. }
    ));

    // .3 is remote in the DHT but a LAN host answers the probe: never answered.
    sw.set_peer_addresses(
        7,
        &[Ipv4Addr::new(10, 201, 0, 2), Ipv4Addr::new(10, 201, 0, 3)],
    );
    let mut ask3 = arp_from(DEVICE_MAC, [10, 201, 0, 1], 1, [10, 201, 0, 3]);
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut ask3, &mut reply),
        Action::Drop(DropReason::ArpProbing)
    );
    let mut local = arp_from(LAN_A, [10, 201, 0, 3], 2, [0, 0, 0, 0]);
    let _ = sw.handle_tap_frame(t0(), &mut local, &mut reply);
    sw.handle_timeout(t0() + timeout);
    while sw.poll_transmit(&mut buf).is_some() {
        assert_ne!(
            ArpPacket::new_checked(&buf[14..42]).unwrap().sender_ip(),
            Ipv4Addr::new(10, 201, 0, 3)
        );
    }
    assert_eq!(
        sw.handle_tap_frame(t0() + timeout, &mut ask3, &mut reply),
        Action::Drop(DropReason::LanLocal)
    );
    // Frames for the host come framed to its device.
    let (action, frame) = peer_packet(&mut sw, [10, 201, 0, 2], [10, 201, 0, 1], t0());
    assert_eq!(action, Action::ToTap { len: 42 });
    assert_eq!(&frame[0..6], &DEVICE_MAC);
}
