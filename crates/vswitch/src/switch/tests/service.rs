//! The service address: DNS, DHCP (relayed too) and the service stack.

use super::*;

#[test]
fn dns_and_other_packets_to_the_service_address_go_to_the_agent() {
    for mode in [Mode::Interface, Mode::Router, Mode::Hybrid] {
        let mut sw = with_mode(mode);
        sw.config.address = Ipv4Addr::new(10, 201, 0, 9);
        let service = Ipv4Addr::new(10, 201, 0, 1);
        let host = Ipv4Addr::new(10, 201, 0, 9);
        let mut f = [0u8; 128];
        let len = emit_udp(
            &mut f,
            (REMOTE_MAC, DEVICE_MAC),
            (host, service),
            (5353, 53),
            b"query",
        )
        .unwrap();
        let mut reply = [0u8; 64];
        let Action::Dns { payload, client } = sw.handle_tap_frame(t0(), &mut f[..len], &mut reply)
        else {
            panic!("{mode:?}: not intercepted")
        };
        assert_eq!(&f[payload], b"query");
        assert_eq!(
            client,
            Client {
                mac: DEVICE_MAC,
                ip: host.into(),
                port: 5353
            }
        );
        // The answer goes back from the service address, port 53, to the asker.
        let mut buf = [0u8; 128];
        let n = sw.emit_dns_reply(&mut buf, client, b"answer").unwrap();
        let eth = EthernetFrame::new_checked(&buf[..n]).unwrap();
        assert_eq!((eth.dst(), eth.src()), (DEVICE_MAC, REMOTE_MAC));
        let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
        assert_eq!((ip.src(), ip.dst()), (service, host));
        let (sport, dport, body) = udp_parts(ip.payload()).unwrap();
        assert_eq!(
            (sport, dport, &ip.payload()[body]),
            (53, 5353, &b"answer"[..])
        );
        // Another port or protocol (here UDP 54): the service stack's.
        let len = emit_udp(
            &mut f,
            (REMOTE_MAC, DEVICE_MAC),
            (host, service),
            (5353, 54),
            b"x",
        )
        .unwrap();
        let Action::Service { packet, mac } = sw.handle_tap_frame(t0(), &mut f[..len], &mut reply)
        else {
            panic!("{mode:?}: not for the service stack")
        };
        assert_eq!((packet, mac), (ETH_HEADER_LEN..len, DEVICE_MAC));
        let n = sw
            .emit_service_packet(&mut buf, DEVICE_MAC, &f[ETH_HEADER_LEN..len])
            .unwrap();
        assert_eq!(&buf[ETH_HEADER_LEN..n], &f[ETH_HEADER_LEN..len]);
        // From outside the subnet: dropped.
        let len = emit_udp(
            &mut f,
            (REMOTE_MAC, DEVICE_MAC),
            (Ipv4Addr::new(192, 0, 2, 1), service),
            (5353, 53),
            b"q",
        )
        .unwrap();
        assert_eq!(
            sw.handle_tap_frame(t0(), &mut f[..len], &mut reply),
            Action::Drop(DropReason::OutsideSubnet)
        );
        assert_eq!(
            (sw.counters().dns_queries, sw.counters().service_packets),
            (1, 1)
        );
        // ARP for the service address is answered in every mode, DHCP on or off.
        let mut ask = arp_from(DEVICE_MAC, [10, 201, 0, 9], 1, [10, 201, 0, 1]);
        assert!(
            matches!(
                sw.handle_tap_frame(t0(), &mut ask, &mut reply),
                Action::ToTap { .. }
            ),
            "{mode:?}"
        );
    }
    // Router: a LAN host's unicast to someone else's MAC is the bridge's business.
    let mut sw = with_mode(Mode::Router);
    let mut f = [0u8; 128];
    let len = emit_udp(
        &mut f,
        (LAN_B, LAN_A),
        (Ipv4Addr::new(10, 201, 0, 10), Ipv4Addr::new(10, 201, 0, 1)),
        (5353, 53),
        b"q",
    )
    .unwrap();
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut f[..len], &mut [0u8; 64]),
        Action::Drop(DropReason::LanLocal)
    );
}

#[test]
fn dhcp_is_intercepted_and_the_service_address_answered() {
    let mut sw = with_mode(Mode::Hybrid);
    sw.config.dhcp = true;
    sw.config.address = Ipv4Addr::UNSPECIFIED; // a DHCP host before its lease
                                               // A DISCOVER as the kernel sends it: 0.0.0.0:68 -> 255.255.255.255:67.
    let mut f = BROADCAST_MAC.to_vec();
    f.extend_from_slice(&DEVICE_MAC);
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 33, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&[0, 0, 0, 0, 255, 255, 255, 255]);
    f.extend_from_slice(&[0, 68, 0, 67, 0, 13, 0, 0, b'd', b'h', b'c', b'p', b'!']);
    let mut reply = [0u8; 64];
    let Action::Dhcp { payload, mac } = sw.handle_tap_frame(t0(), &mut f, &mut reply) else {
        panic!("not intercepted")
    };
    assert_eq!((&f[payload], mac), (&b"dhcp!"[..], DEVICE_MAC));
    assert_eq!(sw.counters().dhcp_requests, 1);
    // Not from this host's device (hybrid): not ours to answer.
    f[6..12].copy_from_slice(&LAN_B);
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut f, &mut reply),
        Action::Drop(DropReason::OtherHost)
    );
    // ARP for the service address: answered at once, no LAN probe.
    let mut ask = arp_from(DEVICE_MAC, [10, 201, 0, 9], 1, [10, 201, 0, 1]);
    assert!(matches!(
        sw.handle_tap_frame(t0(), &mut ask, &mut reply),
        Action::ToTap { .. }
    ));
    // The reply leaves from the service address and the remote MAC.
    let mut buf = [0u8; 128];
    let len = sw
        .emit_dhcp_reply(
            &mut buf,
            DEVICE_MAC,
            Ipv4Addr::new(10, 201, 0, 9),
            68,
            b"offer",
        )
        .unwrap();
    let eth = EthernetFrame::new_checked(&buf[..len]).unwrap();
    assert_eq!((eth.dst(), eth.src()), (DEVICE_MAC, REMOTE_MAC));
    let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
    assert_eq!(
        (ip.src(), ip.dst()),
        (Ipv4Addr::new(10, 201, 0, 1), Ipv4Addr::new(10, 201, 0, 9))
    );
    assert_eq!(
        udp_parts(ip.payload()).map(|(s, d, p)| (s, d, &ip.payload()[p])),
        Some((67, 68, &b"offer"[..]))
    );
    // With DHCP off, the same request is just a broadcast.
    let mut off = with_mode(Mode::Interface);
    f[6..12].copy_from_slice(&DEVICE_MAC);
    assert!(matches!(
        off.handle_tap_frame(t0(), &mut f, &mut reply),
        Action::Drop(_) | Action::Broadcast { .. }
    ));
}

/// RFC 2131 4.1: a relay agent on a router's LAN unicasts what it relays to the service
/// address, from port 67; it reaches the DHCP server with the relay's MAC, and the
/// reply goes back to it, to port 67.
#[test]
fn relayed_dhcp_is_intercepted_with_the_relays_mac() {
    let mut sw = with_mode(Mode::Router);
    sw.config.dhcp = true;
    let relay = Ipv4Addr::new(10, 201, 0, 2);
    let mut f = [0u8; 128];
    let len = emit_udp(
        &mut f,
        (REMOTE_MAC, LAN_A),
        (relay, Ipv4Addr::new(10, 201, 0, 1)),
        (67, 67),
        b"relayed",
    )
    .unwrap();
    let Action::Dhcp { payload, mac } = sw.handle_tap_frame(t0(), &mut f[..len], &mut [0u8; 64])
    else {
        panic!("not intercepted")
    };
    assert_eq!((&f[payload], mac), (&b"relayed"[..], LAN_A));
    let mut buf = [0u8; 128];
    let giaddr = Ipv4Addr::new(10, 201, 50, 1);
    let len = sw
        .emit_dhcp_reply(&mut buf, LAN_A, giaddr, 67, b"offer")
        .unwrap();
    let eth = EthernetFrame::new_checked(&buf[..len]).unwrap();
    assert_eq!((eth.dst(), eth.src()), (LAN_A, REMOTE_MAC));
    let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
    assert_eq!(ip.dst(), giaddr);
    assert_eq!(
        udp_parts(ip.payload()).map(|(s, d, _)| (s, d)),
        Some((67, 67))
    );
}
