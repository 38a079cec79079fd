//! Router mode: RARP and gratuitous ARP count as LAN presence (migration handoff).

use super::*;

/// QEMU's announce-self frame (net/announce.c, `announce_self_create`) for 52:54:00:12:34:56:
/// broadcast, EtherType 0x8035, the ARP layout with operation 3 (reverse request), the
/// guest's MAC as sender and target, no addresses, zero padding to 60 bytes.
const QEMU_RARP: [u8; 60] = [
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x80, 0x35, // eth
    0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x03, // htype, ptype, hlen, plen, op 3
    0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0, 0, 0, 0, // sender MAC, sender IP 0
    0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0, 0, 0, 0, // target MAC, target IP 0
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // padding
];

const GUEST: Mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];

#[test]
fn qemu_rarp_is_an_announcement_in_router_mode() {
    let mut sw = with_mode(Mode::Router);
    let mut reply = [0u8; 64];
    let mut frame = QEMU_RARP.to_vec();
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut frame, &mut reply),
        Action::Drop(DropReason::LanLocal)
    );
    assert_eq!(sw.poll_event(), Some(Event::Rarp(GUEST)));
    assert_eq!(sw.poll_event(), None);
    assert_eq!(sw.counters().announcements, 1);

    // Truncated: a counted drop, no event.
    let mut short = QEMU_RARP[..30].to_vec();
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut short, &mut reply),
        Action::Drop(DropReason::Malformed)
    );
    // From a remote MAC (another agent) or a group address: not a host.
    for mac in [[0xfe, 0xfd, 1, 2, 3, 4], [0x01, 0, 0x5e, 0, 0, 1]] {
        let mut f = QEMU_RARP.to_vec();
        f[22..28].copy_from_slice(&mac);
        let _ = sw.handle_tap_frame(t0(), &mut f, &mut reply);
    }
    assert_eq!(sw.poll_event(), None);
    assert_eq!(sw.counters().announcements, 1);
}

#[test]
fn rarp_is_not_interface_or_hybrid_business() {
    for mode in [Mode::Interface, Mode::Hybrid] {
        let mut sw = with_mode(mode);
        let mut reply = [0u8; 64];
        let mut frame = QEMU_RARP.to_vec();
        assert_eq!(
            sw.handle_tap_frame(t0(), &mut frame, &mut reply),
            Action::Drop(DropReason::UnsupportedProtocol)
        );
        assert_eq!(sw.poll_event(), None);
    }
}

#[test]
fn gratuitous_arp_announces_known_and_new_hosts() {
    let mut sw = with_mode(Mode::Router);
    let mut reply = [0u8; 64];
    let host = Ipv4Addr::new(10, 201, 0, 10);
    // `arping -U`: an ARP request whose sender and target address are the host's.
    let mut garp = arp_from(LAN_A, [10, 201, 0, 10], 1, [10, 201, 0, 10]);
    let _ = sw.handle_tap_frame(t0(), &mut garp.clone(), &mut reply);
    assert_eq!(sw.poll_event(), Some(Event::LanHostUp(host)));
    let announced = Event::GratuitousArp {
        address: host,
        mac: LAN_A,
    };
    assert_eq!(sw.poll_event(), Some(announced));
    // Known already: announced again all the same (a host back from another site).
    let _ = sw.handle_tap_frame(t0(), &mut garp, &mut reply);
    assert_eq!(sw.poll_event(), Some(announced));
    assert_eq!(sw.poll_event(), None);
    // A reply-style gratuitous ARP counts too; an ordinary request does not.
    let mut reply_garp = arp_from(LAN_A, [10, 201, 0, 10], 2, [10, 201, 0, 10]);
    let _ = sw.handle_tap_frame(t0(), &mut reply_garp, &mut reply);
    assert_eq!(sw.poll_event(), Some(announced));
    let mut ask = arp_from(LAN_A, [10, 201, 0, 10], 1, [10, 201, 0, 2]);
    let _ = sw.handle_tap_frame(t0(), &mut ask, &mut reply);
    assert_eq!(sw.poll_event(), None);
    // Outside the namespace: neither learned nor announced.
    let mut outside = arp_from(LAN_B, [192, 168, 1, 5], 1, [192, 168, 1, 5]);
    let _ = sw.handle_tap_frame(t0(), &mut outside, &mut reply);
    assert_eq!(sw.poll_event(), None);
    assert_eq!(sw.counters().announcements, 3);
}

#[test]
fn a_forgotten_host_is_found_again_by_its_first_packet() {
    let mut sw = with_mode(Mode::Router);
    let mut reply = [0u8; 64];
    let host = Ipv4Addr::new(10, 201, 0, 10);
    let mut packet = ipv4_from(LAN_A, LAN_B, [10, 201, 0, 10], [10, 201, 0, 11]);
    let _ = sw.handle_tap_frame(t0(), &mut packet.clone(), &mut reply);
    assert_eq!(sw.poll_event(), Some(Event::LanHostUp(host)));
    let _ = sw.handle_tap_frame(t0(), &mut packet.clone(), &mut reply);
    assert_eq!(sw.poll_event(), None);
    // Handed to another site: forgotten without LanHostDown; its next packet is news.
    sw.forget_lan_host(host);
    assert!(!sw.lan_hosts().contains(&host));
    assert_eq!(sw.poll_event(), None);
    let _ = sw.handle_tap_frame(t0(), &mut packet, &mut reply);
    assert_eq!(sw.poll_event(), Some(Event::LanHostUp(host)));
}
