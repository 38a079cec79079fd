//! Router mode: LAN hosts learned, probed, forgotten and watched.

use super::*;

#[test]
fn router_learns_lan_hosts_and_answers_only_for_remote_members() {
    let mut sw = with_mode(Mode::Router);
    let mut reply = [0u8; 64];
    // Host A asks for remote member .2: answered with the remote MAC; A is learned.
    let mut a = arp_from(LAN_A, [10, 201, 0, 10], 1, [10, 201, 0, 2]);
    assert!(matches!(
        sw.handle_tap_frame(t0(), &mut a, &mut reply),
        Action::ToTap { .. }
    ));
    assert_eq!(
        sw.poll_event(),
        Some(Event::LanHostUp(Ipv4Addr::new(10, 201, 0, 10)))
    );
    // Host B asks for A: A is on the LAN, so the switch stays silent (rule b).
    let mut b = arp_from(LAN_B, [10, 201, 0, 11], 1, [10, 201, 0, 10]);
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut b, &mut reply),
        Action::Drop(DropReason::LanLocal)
    );
    assert_eq!(
        sw.poll_event(),
        Some(Event::LanHostUp(Ipv4Addr::new(10, 201, 0, 11)))
    );
    assert_eq!(sw.poll_event(), None);
    // LAN unicast flooded to the TAP is the bridge's business.
    let mut lan = ipv4_from(LAN_A, LAN_B, [10, 201, 0, 10], [10, 201, 0, 11]);
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut lan, &mut reply),
        Action::Drop(DropReason::LanLocal)
    );
    // To the remote MAC: carried to the member.
    let mut out = ipv4_from(LAN_A, REMOTE_MAC, [10, 201, 0, 10], [10, 201, 0, 2]);
    assert!(matches!(
        sw.handle_tap_frame(t0(), &mut out, &mut reply),
        Action::ToPeer { peer: 7, .. }
    ));
    // From a member to A: framed to A's MAC.
    let (action, frame) = peer_packet(&mut sw, [10, 201, 0, 2], [10, 201, 0, 10], t0());
    assert_eq!(action, Action::ToTap { len: 42 });
    assert_eq!(&frame[0..6], &LAN_A);
    assert_eq!(&frame[6..12], &REMOTE_MAC);
    // To a LAN address never seen: dropped, and the LAN is asked once.
    let (action, _) = peer_packet(&mut sw, [10, 201, 0, 2], [10, 201, 0, 12], t0());
    assert_eq!(action, Action::Drop(DropReason::NotForUs));
    let _ = peer_packet(&mut sw, [10, 201, 0, 2], [10, 201, 0, 12], t0());
    let mut buf = [0u8; 64];
    let len = sw.poll_transmit(&mut buf).unwrap();
    let arp = ArpPacket::new_checked(&buf[14..len]).unwrap();
    assert_eq!(
        (arp.operation(), arp.target_ip()),
        (ARP_REQUEST, Ipv4Addr::new(10, 201, 0, 12))
    );
    assert_eq!(
        arp.sender_ip(),
        Ipv4Addr::UNSPECIFIED,
        "a probe: no host caches it"
    );
    assert_eq!(sw.poll_transmit(&mut buf), None);
}

#[test]
fn router_probes_a_silent_host_then_forgets_it() {
    let mut sw = with_mode(Mode::Router);
    let mut a = arp_from(LAN_A, [10, 201, 0, 10], 1, [10, 201, 0, 2]);
    let _ = sw.handle_tap_frame(t0(), &mut a, &mut [0u8; 64]);
    let _ = sw.poll_event();
    let timeout = sw.config().lan_timeout;
    let mut buf = [0u8; 64];
    let mut t = t0() + timeout;
    for _ in 0..LAN_PROBES {
        assert!(sw.poll_timeout().is_some_and(|d| d <= t));
        sw.handle_timeout(t);
        assert!(sw.poll_transmit(&mut buf).is_some(), "probe");
        assert_eq!(sw.poll_event(), None);
        t += Duration::from_secs(1);
    }
    sw.handle_timeout(t);
    assert_eq!(
        sw.poll_event(),
        Some(Event::LanHostDown(Ipv4Addr::new(10, 201, 0, 10)))
    );
    assert!(sw.lan_hosts().is_empty());
    // A host that answers a probe stays.
    let _ = sw.handle_tap_frame(t, &mut a, &mut [0u8; 64]);
    let _ = sw.poll_event();
    sw.handle_timeout(t + timeout);
    let mut reply = arp_from(LAN_A, [10, 201, 0, 10], 2, [0, 0, 0, 0]);
    let _ = sw.handle_tap_frame(t + timeout, &mut reply, &mut [0u8; 64]);
    sw.handle_timeout(t + timeout + Duration::from_secs(5));
    assert_eq!(sw.lan_hosts(), vec![Ipv4Addr::new(10, 201, 0, 10)]);
}

#[test]
fn a_watched_host_is_reported_on_its_next_frame_only() {
    let mut sw = with_mode(Mode::Router);
    let host = Ipv4Addr::new(10, 201, 0, 10);
    let mut a = arp_from(LAN_A, [10, 201, 0, 10], 1, [10, 201, 0, 2]);
    let _ = sw.handle_tap_frame(t0(), &mut a, &mut [0u8; 64]);
    assert_eq!(sw.poll_event(), Some(Event::LanHostUp(host)));
    assert_eq!(sw.lan_host_mac(host), Some(LAN_A));
    assert_eq!(sw.lan_host_with_mac(LAN_A), Some(host));
    sw.probe_lan_host(host);
    let mut buf = [0u8; 64];
    assert!(sw.poll_transmit(&mut buf).is_some(), "the probe goes out");
    assert_eq!(sw.poll_event(), None, "nothing heard yet");
    let mut reply = arp_from(LAN_A, [10, 201, 0, 10], 2, [0, 0, 0, 0]);
    let _ = sw.handle_tap_frame(t0(), &mut reply, &mut [0u8; 64]);
    assert_eq!(
        sw.poll_event(),
        Some(Event::LanHostHeard {
            address: host.into(),
            mac: LAN_A
        })
    );
    let _ = sw.handle_tap_frame(t0(), &mut reply, &mut [0u8; 64]);
    assert_eq!(sw.poll_event(), None, "reported once per probe");
    // Handed off: forgotten, and no longer watched.
    sw.probe_lan_host(host);
    sw.forget_lan_host(host);
    assert_eq!(sw.lan_host_mac(host), None);
    let _ = sw.handle_tap_frame(t0(), &mut reply, &mut [0u8; 64]);
    assert_eq!(sw.poll_event(), Some(Event::LanHostUp(host)));
    assert_eq!(sw.poll_event(), None);
}
