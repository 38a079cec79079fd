//! Broadcast and multicast: the rate limit each way and the filter on arrival.

use super::*;

#[test]
fn broadcast_goes_to_members_within_the_rate_and_is_filtered_on_arrival() {
    let mut sw = with_mode(Mode::Router);
    let mut reply = [0u8; 64];
    let mut bcast = ipv4_from(LAN_A, BROADCAST_MAC, [10, 201, 0, 10], [10, 201, 255, 255]);
    // The bucket holds 10: the 11th in the same instant is dropped, and it refills.
    for _ in 0..10 {
        assert_eq!(
            sw.handle_tap_frame(t0(), &mut bcast, &mut reply),
            Action::Broadcast { packet: 14..42 }
        );
    }
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut bcast, &mut reply),
        Action::Drop(DropReason::BroadcastRateLimited)
    );
    let later = t0() + Duration::from_millis(200);
    assert!(matches!(
        sw.handle_tap_frame(later, &mut bcast, &mut reply),
        Action::Broadcast { .. }
    ));
    assert_eq!(sw.counters().broadcasts_out, 11);
    assert_eq!(sw.counters().drops(DropReason::BroadcastRateLimited), 1);
    // A spoofed source outside the namespace is not carried.
    let mut spoofed = ipv4_from(LAN_B, BROADCAST_MAC, [192, 168, 0, 9], [255, 255, 255, 255]);
    assert_eq!(
        sw.handle_tap_frame(later, &mut spoofed, &mut reply),
        Action::Drop(DropReason::OutsideSubnet)
    );
    // From a member: the whole LAN hears it (multicast to its group MAC) ...
    let (action, frame) = peer_packet(&mut sw, [10, 201, 0, 2], [255, 255, 255, 255], later);
    assert_eq!(action, Action::ToTap { len: 42 });
    assert_eq!(&frame[0..6], &BROADCAST_MAC);
    let (_, frame) = peer_packet(&mut sw, [10, 201, 0, 2], [239, 129, 2, 3], later);
    assert_eq!(&frame[0..6], &[0x01, 0x00, 0x5e, 0x01, 2, 3]);
    // ... unless its source is on this LAN (the LAN already delivered it).
    let (action, _) = peer_packet(&mut sw, [10, 201, 0, 10], [10, 201, 255, 255], later);
    assert_eq!(action, Action::Drop(DropReason::BroadcastFromLan));
    assert_eq!(sw.counters().broadcasts_in, 2);
    // An interface host gets broadcasts addressed to its device only.
    let mut host = with_mode(Mode::Interface);
    let (_, frame) = peer_packet(&mut host, [10, 201, 0, 2], [10, 201, 255, 255], later);
    assert_eq!(&frame[0..6], &DEVICE_MAC);
    // Broadcast off: nothing either way.
    let mut off = with_mode(Mode::Interface);
    off.config.broadcast_rate = 0;
    let (action, _) = peer_packet(&mut off, [10, 201, 0, 2], [10, 201, 255, 255], later);
    assert_eq!(action, Action::Drop(DropReason::BroadcastRateLimited));
}
