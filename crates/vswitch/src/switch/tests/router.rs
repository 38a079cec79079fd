//! Multi-subnet namespaces: the switch routes to the namespace's other subnets in one hop.

use super::*;

/// An interface host 10.1.0.5 in 10.1.0.0/24, of a namespace that also has 10.2.0.0/24
/// (where member 7 holds 10.2.0.9) and 10.3.0.0/24.
fn two_subnets(mode: Mode) -> Switch<u32> {
    let mut config = Config::interface(
        Ipv4Addr::new(10, 1, 0, 5),
        "10.1.0.0/24".parse().unwrap(),
        DEVICE_MAC,
        REMOTE_MAC,
    );
    config.mode = mode;
    config.broadcast_rate = 10;
    config.routed = vec![
        "10.2.0.0/24".parse().unwrap(),
        "10.3.0.0/24".parse().unwrap(),
    ];
    if mode == Mode::Router {
        config.address = Ipv4Addr::UNSPECIFIED;
    }
    let mut sw = Switch::new(config);
    sw.set_peer_addresses(7, &[Ipv4Addr::new(10, 2, 0, 9), Ipv4Addr::new(10, 1, 0, 6)]);
    sw
}

/// A frame of the host (10.1.0.5, or `src`) to `dst` through the gateway, with `ttl`.
fn routed_frame(src: [u8; 4], dst: [u8; 4], ttl: u8) -> Vec<u8> {
    let mut f = ipv4_from(DEVICE_MAC, REMOTE_MAC, src, dst);
    f[14 + 8] = ttl;
    f[24..26].fill(0);
    let sum = crate::wire::ipv4_header_checksum(&f[14..34]);
    f[24..26].copy_from_slice(&sum.to_be_bytes());
    f
}

fn header_checksum_ok(ip: &[u8]) -> bool {
    crate::wire::ipv4_header_checksum(&ip[..20]) == 0
}

#[test]
fn a_packet_for_another_subnet_goes_to_its_holder_with_the_ttl_lowered_once() {
    for mode in [Mode::Interface, Mode::Router, Mode::Hybrid] {
        let mut sw = two_subnets(mode);
        let mut reply = [0u8; crate::MIN_REPLY_BUF];
        let mut frame = routed_frame([10, 1, 0, 5], [10, 2, 0, 9], 64);
        let action = sw.handle_tap_frame(t0(), &mut frame, &mut reply);
        assert_eq!(
            action,
            Action::ToPeer {
                peer: 7,
                packet: 14..42
            },
            "{mode:?}"
        );
        assert_eq!(frame[14 + 8], 63, "{mode:?}: TTL lowered once");
        assert!(header_checksum_ok(&frame[14..]), "{mode:?}");
        assert_eq!(sw.counters().routed, 1);
        // Inside the subnet, nothing is routed: the TTL stays.
        let mut local = routed_frame([10, 1, 0, 5], [10, 1, 0, 6], 64);
        let action = sw.handle_tap_frame(t0(), &mut local, &mut reply);
        assert_eq!(
            action,
            Action::ToPeer {
                peer: 7,
                packet: 14..42
            }
        );
        assert_eq!(local[14 + 8], 64);
        assert_eq!(sw.counters().routed, 1);
    }
}

#[test]
fn a_held_packet_is_lowered_only_when_it_leaves() {
    let mut sw = two_subnets(Mode::Interface);
    let mut reply = [0u8; crate::MIN_REPLY_BUF];
    let mut frame = routed_frame([10, 1, 0, 5], [10, 3, 0, 4], 2);
    let action = sw.handle_tap_frame(t0(), &mut frame, &mut reply);
    assert_eq!(
        action,
        Action::Resolve {
            target: Ipv4Addr::new(10, 3, 0, 4).into()
        }
    );
    assert_eq!(frame[14 + 8], 2, "held as it came");
    // The DHT answers; the held frame goes through the switch again, and leaves once.
    sw.add_route(Ipv4Addr::new(10, 3, 0, 4), 8);
    let action = sw.handle_tap_frame(t0(), &mut frame, &mut reply);
    assert_eq!(
        action,
        Action::ToPeer {
            peer: 8,
            packet: 14..42
        }
    );
    assert_eq!(frame[14 + 8], 1);
}

#[test]
fn no_ttl_left_is_answered_with_time_exceeded_from_the_gateway() {
    let mut sw = two_subnets(Mode::Interface);
    let mut reply = [0u8; crate::MIN_REPLY_BUF];
    for ttl in [0, 1] {
        let mut frame = routed_frame([10, 1, 0, 5], [10, 2, 0, 9], ttl);
        let Action::ToTap { len } = sw.handle_tap_frame(t0(), &mut frame, &mut reply) else {
            panic!("ttl {ttl}: no ICMP error");
        };
        let eth = EthernetFrame::new_checked(&reply[..len]).unwrap();
        assert_eq!((eth.dst(), eth.src()), (DEVICE_MAC, REMOTE_MAC));
        let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
        assert_eq!(ip.src(), Ipv4Addr::new(10, 1, 0, 1), "from the gateway");
        assert_eq!(ip.dst(), Ipv4Addr::new(10, 1, 0, 5));
        assert!(header_checksum_ok(eth.payload()));
        let icmp = ip.payload();
        assert_eq!((icmp[0], icmp[1]), (11, 0), "time exceeded in transit");
        assert_eq!(crate::wire::ipv4_header_checksum(icmp), 0);
        // It quotes the packet's header and 8 bytes of its payload.
        assert_eq!(&icmp[8..36], &frame[14..42]);
    }
    assert_eq!(sw.counters().ttl_exceeded, 2);
    assert_eq!(sw.counters().routed, 0);
    // An ICMP error never gets one in answer (RFC 1122 3.2.2).
    let mut error = routed_frame([10, 1, 0, 5], [10, 2, 0, 9], 1);
    error[14 + 20] = 3;
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut error, &mut reply),
        Action::Drop(DropReason::TtlExceeded)
    );
}

#[test]
fn broadcast_never_leaves_its_subnet() {
    let mut sw = two_subnets(Mode::Router);
    let mut reply = [0u8; crate::MIN_REPLY_BUF];
    let lan_host = [10, 1, 0, 20];
    // A directed broadcast to another subnet is not forwarded.
    let mut directed = routed_frame(lan_host, [10, 2, 0, 255], 64);
    directed[6..12].copy_from_slice(&LAN_A);
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut directed, &mut reply),
        Action::Drop(DropReason::OtherSubnet)
    );
    // Its own subnet's broadcast goes to the members (who keep it in the subnet).
    let mut own = ipv4_from(LAN_A, BROADCAST_MAC, lan_host, [10, 1, 0, 255]);
    assert!(matches!(
        sw.handle_tap_frame(t0(), &mut own, &mut reply),
        Action::Broadcast { .. }
    ));
    // From a member of another subnet: neither its subnet's broadcast, the limited
    // broadcast nor multicast reaches this LAN; from one of this subnet, all do.
    for dst in [[255, 255, 255, 255], [239, 1, 2, 3]] {
        let (action, _) = peer_packet(&mut sw, [10, 2, 0, 9], dst, t0());
        assert_eq!(action, Action::Drop(DropReason::OtherSubnet), "{dst:?}");
        let (action, _) = peer_packet(&mut sw, [10, 1, 0, 6], dst, t0());
        assert!(matches!(action, Action::ToTap { .. }), "{dst:?}");
    }
    let (action, _) = peer_packet(&mut sw, [10, 2, 0, 9], [10, 2, 0, 255], t0());
    assert_eq!(action, Action::Drop(DropReason::OtherSubnet));
    assert_eq!(sw.counters().drops(DropReason::OtherSubnet), 4);
}

#[test]
fn only_this_subnets_hosts_are_routed_and_no_one_holds_another_gateway() {
    let mut sw = two_subnets(Mode::Interface);
    let mut reply = [0u8; crate::MIN_REPLY_BUF];
    // Another subnet's network and gateway (service) addresses are nobody's.
    for dst in [[10, 2, 0, 0], [10, 2, 0, 1]] {
        let mut frame = routed_frame([10, 1, 0, 5], dst, 64);
        assert_eq!(
            sw.handle_tap_frame(t0(), &mut frame, &mut reply),
            Action::Drop(DropReason::NoRoute)
        );
    }
    // A source of another subnet (spoofed by the host) is not routed.
    let mut spoofed = routed_frame([10, 3, 0, 7], [10, 2, 0, 9], 64);
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut spoofed, &mut reply),
        Action::Drop(DropReason::OutsideSubnet)
    );
    // Addresses outside every subnet are still not the namespace's.
    let mut outside = routed_frame([10, 1, 0, 5], [10, 9, 0, 9], 64);
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut outside, &mut reply),
        Action::Drop(DropReason::OutsideSubnet)
    );
    // A member's packet from another subnet is framed for the host as any other.
    let (action, frame) = peer_packet(&mut sw, [10, 2, 0, 9], [10, 1, 0, 5], t0());
    assert_eq!(action, Action::ToTap { len: 42 });
    assert_eq!(&frame[0..12], &[DEVICE_MAC, REMOTE_MAC].concat()[..]);
    // Announced addresses in a routed subnet are routes; outside the namespace they are not.
    sw.set_peer_addresses(9, &[Ipv4Addr::new(10, 3, 0, 3), Ipv4Addr::new(10, 9, 0, 3)]);
    assert_eq!(sw.route(Ipv4Addr::new(10, 3, 0, 3)), Some(9));
    assert_eq!(sw.route(Ipv4Addr::new(10, 9, 0, 3)), None);
    // Fewer subnets: the routes into the one that went are forgotten.
    sw.set_routed(vec!["10.2.0.0/24".parse().unwrap()]);
    assert_eq!(sw.route(Ipv4Addr::new(10, 3, 0, 3)), None);
    assert_eq!(sw.route(Ipv4Addr::new(10, 2, 0, 9)), Some(7));
}

#[test]
fn a_destination_nobody_holds_in_another_subnet_is_answered_host_unreachable() {
    let mut sw = two_subnets(Mode::Interface);
    let mut buf = [0u8; crate::MIN_REPLY_BUF];
    let frame = routed_frame([10, 1, 0, 5], [10, 2, 0, 77], 64);
    let len = sw
        .emit_unreachable(t0(), &mut buf, &frame)
        .expect("an ICMP error");
    let eth = EthernetFrame::new_checked(&buf[..len]).unwrap();
    assert_eq!((eth.dst(), eth.src()), (DEVICE_MAC, REMOTE_MAC));
    let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
    assert_eq!(ip.src(), Ipv4Addr::new(10, 1, 0, 1), "from the gateway");
    assert_eq!(ip.dst(), Ipv4Addr::new(10, 1, 0, 5));
    let icmp = ip.payload();
    assert_eq!((icmp[0], icmp[1]), (3, 1), "host unreachable");
    assert_eq!(&icmp[8..36], &frame[14..42]);
    // Not for this subnet's addresses (the host's ARP says it), nor other sources.
    let local = routed_frame([10, 1, 0, 5], [10, 1, 0, 77], 64);
    assert_eq!(sw.emit_unreachable(t0(), &mut buf, &local), None);
    let spoofed = routed_frame([10, 3, 0, 5], [10, 2, 0, 77], 64);
    assert_eq!(sw.emit_unreachable(t0(), &mut buf, &spoofed), None);
    assert_eq!(
        sw.emit_unreachable(t0(), &mut buf, &arp_request([10, 2, 0, 77])),
        None
    );
    // At most UNREACHABLE_RATE a second, then again as the bucket refills.
    let sent = (0..crate::UNREACHABLE_RATE * 2)
        .filter(|_| sw.emit_unreachable(t0(), &mut buf, &frame).is_some())
        .count();
    assert_eq!(sent as u32 + 1, crate::UNREACHABLE_RATE);
    let later = t0() + Duration::from_millis(200);
    assert!(sw.emit_unreachable(later, &mut buf, &frame).is_some());
    assert_eq!(
        sw.counters().unreachable,
        u64::from(crate::UNREACHABLE_RATE) + 1
    );
}
