//! The entry points: frames from the TAP and packets from members, golden captures, and
//! hostile input.

use super::*;

#[test]
fn ipv4_goes_to_the_owner_without_link_padding() {
    let mut sw = switch();
    let mut frame = icmp_frame([10, 201, 0, 2]);
    let action = sw.handle_tap_frame(t0(), &mut frame, &mut [0u8; 64]);
    assert_eq!(
        action,
        Action::ToPeer {
            peer: 7,
            packet: 14..42
        }
    );
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut icmp_frame([10, 201, 0, 3]), &mut [0u8; 64]),
        Action::Resolve {
            target: Ipv4Addr::new(10, 201, 0, 3).into()
        }
    );
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut icmp_frame([10, 201, 255, 255]), &mut [0u8; 64]),
        Action::Broadcast { packet: 14..42 }
    );
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut icmp_frame([224, 0, 0, 251]), &mut [0u8; 64]),
        Action::Broadcast { packet: 14..42 }
    );
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut icmp_frame([8, 8, 8, 8]), &mut [0u8; 64]),
        Action::Drop(DropReason::OutsideSubnet)
    );
}

#[test]
fn peer_packet_is_framed_in_place() {
    let mut sw = switch();
    let frame = icmp_frame([10, 201, 0, 1]);
    let ip = &frame[14..42];
    let mut buf = [0u8; 128];
    buf[HEADROOM..HEADROOM + ip.len()].copy_from_slice(ip);
    let Action::ToTap { len } = sw.handle_peer_packet(t0(), &mut buf, ip.len()) else {
        panic!("expected delivery")
    };
    assert_eq!(len, 42);
    let eth = EthernetFrame::new_checked(&buf[..len]).unwrap();
    assert_eq!((eth.dst(), eth.src()), (DEVICE_MAC, REMOTE_MAC));
    assert_eq!(eth.ethertype(), ETHERTYPE_IPV4);
    assert_eq!(eth.payload(), ip);
    assert_eq!(sw.counters().to_tap, 1);
}

#[test]
fn peer_packet_for_another_host_is_dropped() {
    let mut sw = switch();
    let frame = icmp_frame([10, 201, 0, 5]);
    let ip = &frame[14..42];
    let mut buf = [0u8; 128];
    buf[HEADROOM..HEADROOM + ip.len()].copy_from_slice(ip);
    assert_eq!(
        sw.handle_peer_packet(t0(), &mut buf, ip.len()),
        Action::Drop(DropReason::NotForUs)
    );
    assert_eq!(
        sw.handle_peer_packet(t0(), &mut buf, 4000),
        Action::Drop(DropReason::Malformed)
    );
}

/// Golden test on frames captured from a live TAP: the switch's reply and framing are
/// byte for byte what the agent put on the device.
#[test]
fn captured_frames_are_reproduced_exactly() {
    use crate::captured::{ARP_REPLY, ARP_REQUEST, ECHO_REPLY, ECHO_REQUEST};
    let mut sw: Switch<u32> = Switch::new(Config::interface(
        Ipv4Addr::new(10, 201, 0, 1),
        "10.201.0.0/16".parse().unwrap(),
        [0x02, 0x48, 0xae, 0x81, 0xab, 0x18],
        [0xfe, 0xfd, 0x76, 0xa2, 0x83, 0xb0],
    ));
    sw.set_peer_addresses(3, &[Ipv4Addr::new(10, 201, 0, 2)]);
    let mut reply = [0u8; 64];
    let Action::ToTap { len } = sw.handle_tap_frame(t0(), &mut ARP_REQUEST.to_vec(), &mut reply)
    else {
        panic!("no ARP reply")
    };
    assert_eq!(&reply[..len], &ARP_REPLY[..]);
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut ECHO_REQUEST.to_vec(), &mut reply),
        Action::ToPeer {
            peer: 3,
            packet: 14..98
        }
    );
    let mut buf = [0u8; 128];
    buf[HEADROOM..HEADROOM + 84].copy_from_slice(&ECHO_REPLY[14..]);
    let Action::ToTap { len } = sw.handle_peer_packet(t0(), &mut buf, 84) else {
        panic!("not delivered")
    };
    assert_eq!(&buf[..len], &ECHO_REPLY[..]);
}

/// Every prefix and every single-byte corruption of real frames is handled without panic.
#[test]
fn hostile_frames_never_panic() {
    for mode in [Mode::Interface, Mode::Router, Mode::Hybrid] {
        hostile_frames_in(mode);
    }
}

fn hostile_frames_in(mode: Mode) {
    let mut sw = with_mode(mode);
    sw.config.dhcp = true;
    // A second subnet the switch routes to, so routed frames meet the router too.
    sw.set_routed(vec!["10.202.0.0/16".parse().unwrap()]);
    sw.set_peer_addresses(
        7,
        &[Ipv4Addr::new(10, 201, 0, 2), Ipv4Addr::new(10, 202, 0, 2)],
    );
    let mut reply = [0u8; 64];
    let mut buf = [0u8; 256];
    for mut frame in [
        arp_request([10, 201, 0, 2]),
        icmp_frame([10, 201, 0, 2]),
        icmp_frame([10, 202, 0, 2]),
        crate::captured::ECHO_REQUEST.to_vec(),
    ] {
        for n in 0..=frame.len() {
            let _ = sw.handle_tap_frame(t0(), &mut frame[..n], &mut reply);
            let m = n.min(buf.len() - HEADROOM);
            buf[HEADROOM..HEADROOM + m].copy_from_slice(&frame[..m]);
            let _ = sw.handle_peer_packet(t0(), &mut buf, n);
        }
        for i in 0..frame.len() {
            for v in [0u8, 0x0f, 0x45, 0xff] {
                let mut f = frame.clone();
                f[i] = v;
                let _ = sw.handle_tap_frame(t0(), &mut f, &mut reply);
                let _ = sw.emit_unreachable(t0(), &mut reply, &f);
            }
        }
    }
    assert!(sw.counters().drops(DropReason::Malformed) > 0);
}
