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
