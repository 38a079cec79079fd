//! Routes: announcements, DHT resolutions and moves.

use super::*;

#[test]
fn routes_move_with_announcements() {
    let mut sw = switch();
    sw.set_peer_addresses(
        7,
        &[Ipv4Addr::new(10, 201, 0, 3), Ipv4Addr::new(10, 201, 0, 1)],
    );
    assert_eq!(sw.route(Ipv4Addr::new(10, 201, 0, 2)), None);
    assert_eq!(sw.route(Ipv4Addr::new(10, 201, 0, 3)), Some(7));
    assert_eq!(sw.route(Ipv4Addr::new(10, 201, 0, 1)), None, "own address");
    sw.remove_peer(7);
    assert_eq!(sw.route(Ipv4Addr::new(10, 201, 0, 3)), None);
    // The DHT's word routes an address its owner has not announced (yet) ...
    sw.add_route(Ipv4Addr::new(10, 201, 0, 4), 8);
    sw.set_peer_addresses(8, &[]);
    assert_eq!(sw.route(Ipv4Addr::new(10, 201, 0, 4)), Some(8));
    // ... an announcement wins over it, and it goes with the peer.
    sw.set_peer_addresses(9, &[Ipv4Addr::new(10, 201, 0, 4)]);
    assert_eq!(sw.route(Ipv4Addr::new(10, 201, 0, 4)), Some(9));
    sw.remove_peer(9);
    sw.remove_peer(8);
    assert_eq!(sw.route(Ipv4Addr::new(10, 201, 0, 4)), None);
}

#[test]
fn a_moved_route_wins_over_announcements_and_resolutions() {
    let mut sw = with_mode(Mode::Router);
    let a = Ipv4Addr::new(10, 201, 0, 10);
    sw.set_peer_addresses(1, &[a]);
    sw.add_route(a, 1);
    sw.move_route(a, Some(2));
    assert_eq!(sw.route(a), Some(2));
    // The old owner's announcement without it leaves the new route alone.
    sw.set_peer_addresses(1, &[]);
    assert_eq!(sw.route(a), Some(2));
    sw.move_route(a, None);
    assert_eq!(sw.route(a), None);
}

#[test]
fn another_namespace_is_reached_through_the_gateway_a_link_names() {
    let mut sw = switch();
    let other = [10, 202, 0, 7];
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut icmp_frame(other), &mut [0u8; 64]),
        Action::Drop(DropReason::OutsideSubnet)
    );
    // Through 10.201.0.2 (member 7) first, then through 10.201.0.3, whose holder is not
    // known yet: resolved like any address of the subnet.
    sw.set_links(vec![(
        "10.202.0.0/24".parse().unwrap(),
        Ipv4Addr::new(10, 201, 0, 2),
    )]);
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut icmp_frame(other), &mut [0u8; 64]),
        Action::ToPeer {
            peer: 7,
            packet: 14..42
        }
    );
    sw.set_links(vec![(
        "10.202.0.0/24".parse().unwrap(),
        Ipv4Addr::new(10, 201, 0, 3),
    )]);
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut icmp_frame(other), &mut [0u8; 64]),
        Action::Resolve {
            target: Ipv4Addr::new(10, 201, 0, 3).into()
        }
    );
    // Outside every link: still outside the subnet.
    assert_eq!(
        sw.handle_tap_frame(t0(), &mut icmp_frame([10, 203, 0, 7]), &mut [0u8; 64]),
        Action::Drop(DropReason::OutsideSubnet)
    );
    sw.set_links(Vec::new());
    assert_eq!(sw.link_gateway(Ipv4Addr::from(other)), None);
}
