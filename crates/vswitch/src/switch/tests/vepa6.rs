//! IPv6 on VEPA ports: proxy answers between LAN hosts, reflection, per-address
//! anti-spoofing, duplicate address probes refused for the holder, and neighbour discovery
//! that never passes between hosts unchecked.

use std::net::Ipv6Addr;

use super::lan6::{dad, events, from, router, solicitation, LAN_A, LAN_B, PEER};
use super::v6::{a6, echo, frame6, from_peer, tap};
use super::{t0, REMOTE_MAC};
use crate::ndp::{self, Message};
use crate::switch::Switch;
use crate::wire::{EthernetFrame, ETH_HEADER_LEN, IPV6_HEADER_LEN};
use crate::{Action, DropReason, Event, Mac, MIN_REPLY_BUF};

/// A VEPA router's switch (its LAN ports isolated), which knows LAN host A at 0x50 from
/// A's duplicate address probe.
fn vepa_with_a() -> Switch<u32> {
    let mut config = router().config().clone();
    config.lan_ports = crate::LanPorts::Vepa;
    let mut sw = Switch::new(config);
    sw.set_peer_addresses6(7, &[a6(PEER)]);
    let _ = tap(&mut sw, &dad(LAN_A, a6(0x50)));
    assert_eq!(events(&mut sw), vec![Event::LanHost6Up(a6(0x50))]);
    sw
}

/// The advertisement in `reply[..len]`: its target, link-layer address and override flag,
/// and the MAC it is for.
fn advertised(reply: &[u8], action: &Action<u32>) -> (Ipv6Addr, Option<Mac>, bool, Mac) {
    let Action::ToTap { len } = *action else {
        panic!("no advertisement: {action:?}");
    };
    let eth = EthernetFrame::new_checked(&reply[..len]).unwrap();
    match ndp::parse(&reply[..len]).map(|n| n.message) {
        Some(Message::Advertisement {
            target,
            link,
            flags,
            ..
        }) => (target, link, flags.override_cache, eth.dst()),
        other => panic!("not an advertisement: {other:?}"),
    }
}

#[test]
fn a_vepa_router_answers_for_lan_hosts_and_reflects_their_ipv6() {
    let mut sw = vepa_with_a();
    sw.start(t0());
    assert!(sw.poll_timeout().is_some(), "the prefix is advertised");
    // B asks for A: only the switch hears it, and answers with the router MAC,
    // overriding what B cached (A's own MAC, before the ports were isolated).
    let (action, reply) = tap(&mut sw, &solicitation(LAN_B, a6(0x51), a6(0x50)));
    assert_eq!(
        advertised(&reply, &action),
        (a6(0x50), Some(REMOTE_MAC), true, LAN_B)
    );
    // B's packet to A comes back out to A, from the router MAC, not fitted to the tunnel.
    let mut reply = vec![0; MIN_REPLY_BUF];
    for size in [4, 1400] {
        let mut payload = vec![128, 0, 0, 0, 0, 1, 0, 1];
        payload.resize(8 + size, 7);
        let mut f = from(LAN_B, frame6(a6(0x51), a6(0x50), 58, 64, &payload));
        let before = f.clone();
        let action = sw.handle_tap_frame(t0(), &mut f, &mut reply);
        assert_eq!(
            action,
            Action::Hairpin {
                packet: ETH_HEADER_LEN..f.len()
            }
        );
        assert_eq!((&f[..6], &f[6..12]), (&LAN_A[..], &REMOTE_MAC[..]));
        assert_eq!(f[12..], before[12..], "the packet itself is not touched");
    }
    assert_eq!(sw.counters().hairpinned, 2);
    assert_eq!(sw.counters().packet_too_big, 0);
    // A member's address is the member's, as in VEB mode.
    assert!(matches!(
        tap(&mut sw, &from(LAN_B, echo(a6(0x51), a6(PEER)))).0,
        Action::ToPeer { peer: 7, .. }
    ));
    // An address not heard yet is solicited on the LAN (a silent host answers the switch)
    // while the DHT is asked.
    assert_eq!(
        tap(&mut sw, &solicitation(LAN_B, a6(0x51), a6(0x52))).0,
        Action::Resolve {
            target: a6(0x52).into()
        }
    );
    let mut out = [0u8; MIN_REPLY_BUF];
    let len = sw
        .poll_transmit(&mut out)
        .expect("a solicitation on the LAN");
    assert!(matches!(
        ndp::parse(&out[..len]).map(|n| n.message),
        Some(Message::Solicitation { target, .. }) if target == a6(0x52)
    ));
    // A's multicast of a wider scope goes to the members and to B, never back to A.
    let group = Ipv6Addr::new(0xff05, 0, 0, 0, 0, 0, 0, 0x1234);
    let mut f = from(LAN_A, echo(a6(0x50), group));
    f[..6].copy_from_slice(&[0x33, 0x33, 0, 0, 0x12, 0x34]);
    assert!(matches!(tap(&mut sw, &f).0, Action::Broadcast { .. }));
    let mut macs = Vec::new();
    sw.lan_copies(&f, &mut macs);
    assert_eq!(macs, vec![LAN_B]);
    // Link-local traffic between LAN hosts has no table to be checked against: it stays.
    let link_local = |last: u16| Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, last);
    let f = from(LAN_B, echo(link_local(0xb), link_local(0xa)));
    assert_eq!(tap(&mut sw, &f).0, Action::Drop(DropReason::LinkLocal));

    // VEB: the same solicitation and packet are the bridge's business.
    let mut veb = router();
    let _ = tap(&mut veb, &dad(LAN_A, a6(0x50)));
    assert_eq!(
        tap(&mut veb, &solicitation(LAN_B, a6(0x51), a6(0x50))).0,
        Action::Drop(DropReason::LanLocal)
    );
    assert_eq!(
        tap(&mut veb, &from(LAN_B, echo(a6(0x51), a6(0x50)))).0,
        Action::Drop(DropReason::LanLocal)
    );
}

#[test]
fn a_vepa_lan_host_may_not_send_from_or_probe_for_another_hosts_ipv6_address() {
    let mut sw = vepa_with_a();
    let spoofed = Action::Drop(DropReason::Spoofed);
    // B sends from A's address, from the service address, from the prefix's `::`.
    let service = Ipv6Addr::from(u128::from(a6(0)) | 1);
    for source in [a6(0x50), service, a6(0)] {
        let f = from(LAN_B, echo(source, a6(PEER)));
        assert_eq!(tap(&mut sw, &f).0, spoofed, "from {source}");
    }
    // B's advertisement for A's address, and a solicitation whose link-layer address is
    // not the frame's.
    let mut na = vec![0u8; ndp::ADVERTISEMENT_FRAME_LEN];
    let len = ndp::emit_defence(&mut na, (a6(0x50), LAN_B)).unwrap();
    assert_eq!(tap(&mut sw, &na[..len]).0, spoofed);
    let lying = from(LAN_B, solicitation(LAN_A, a6(0x51), a6(PEER)));
    assert_eq!(tap(&mut sw, &lying).0, spoofed);
    assert_eq!(sw.counters().drops[DropReason::Spoofed.index()], 5);
    assert_eq!(
        sw.lan_ports(),
        vec![(
            LAN_B,
            crate::PortCounts {
                hairpinned: 0,
                spoofed: 5
            }
        )]
    );
    assert_eq!(sw.lan_host6(a6(0x50)), Some(LAN_A), "A keeps its address");
    assert!(
        !events(&mut sw)
            .iter()
            .any(|e| matches!(e, Event::Announced6 { .. })),
        "a spoofed advertisement is no presence"
    );
    // B's duplicate address probe for A's address: A never hears it, the switch defends
    // it at once, to B alone (B's kernel then never uses it; A, probing again after a
    // flap, must not hear a defence of its own address). A probing again is not defended.
    let (action, reply) = tap(&mut sw, &dad(LAN_B, a6(0x50)));
    assert_eq!(
        advertised(&reply, &action),
        (a6(0x50), Some(REMOTE_MAC), true, LAN_B)
    );
    assert_eq!(sw.counters().dad_defended, 1);
    assert_eq!(
        tap(&mut sw, &dad(LAN_A, a6(0x50))).0,
        Action::Drop(DropReason::NdIgnored)
    );
    // An address leased by DHCPv6 is the client's before it speaks, until the lease ends.
    sw.bind_lease(a6(0x60), LAN_A);
    assert_eq!(
        tap(&mut sw, &from(LAN_B, echo(a6(0x60), a6(PEER)))).0,
        spoofed
    );
    assert!(matches!(
        tap(&mut sw, &dad(LAN_B, a6(0x60))).0,
        Action::ToTap { .. }
    ));
    sw.unbind_lease(a6(0x60));
    assert!(matches!(
        tap(&mut sw, &from(LAN_B, echo(a6(0x60), a6(PEER)))).0,
        Action::ToPeer { peer: 7, .. }
    ));
    // With a static table, only the MACs it lists send IPv6 at all, nor probe for it.
    let mut config = sw.config().clone();
    config.lan_table = vec![("10.201.0.10".parse().unwrap(), LAN_A)];
    let mut table = Switch::new(config);
    table.set_peer_addresses6(7, &[a6(PEER)]);
    assert_eq!(
        tap(&mut table, &from(LAN_B, echo(a6(0x51), a6(PEER)))).0,
        spoofed
    );
    assert_eq!(tap(&mut table, &dad(LAN_B, a6(0x51))).0, spoofed);
    assert_eq!(table.lan_host6(a6(0x51)), None, "not learned, not claimed");
    assert!(matches!(
        tap(&mut table, &from(LAN_A, echo(a6(0x50), a6(PEER)))).0,
        Action::ToPeer { peer: 7, .. }
    ));
}

/// `message` (ICMPv6) from `src` to `dst` behind a destination options header, hop limit
/// 255, as the LAN host with `mac` sends it to the router MAC.
fn behind_options(mac: Mac, (src, dst): (Ipv6Addr, Ipv6Addr), message: &[u8]) -> Vec<u8> {
    let mut payload = vec![58, 0, 1, 4, 0, 0, 0, 0];
    payload.extend_from_slice(message);
    let mut f = from(mac, frame6(src, dst, 60, 255, &payload));
    let at = ETH_HEADER_LEN + IPV6_HEADER_LEN + 8;
    let sum = !ndp::upper_layer_sum(&f[ETH_HEADER_LEN + 8..ETH_HEADER_LEN + 40], 58, &f[at..]);
    f[at + 2..at + 4].copy_from_slice(&sum.to_be_bytes());
    f
}

#[test]
fn neighbour_discovery_behind_extension_headers_reaches_no_host() {
    let mut sw = vepa_with_a();
    let _ = tap(&mut sw, &dad(LAN_B, a6(0x51)));
    // B tells A, in an advertisement behind a destination options header, that C's
    // address is at B: never reflected (the checks of advertisements never saw it).
    let mut na = vec![136, 0, 0, 0, 0x20, 0, 0, 0];
    na.extend_from_slice(&a6(0x52).octets());
    na.extend_from_slice(&[2, 1]);
    na.extend_from_slice(&LAN_B);
    let f = behind_options(LAN_B, (a6(0x51), a6(0x50)), &na);
    assert_eq!(tap(&mut sw, &f).0, Action::Drop(DropReason::Spoofed));
    // An echo behind the same header is reflected.
    let f = behind_options(LAN_B, (a6(0x51), a6(0x50)), &[128, 0, 0, 0, 0, 1, 0, 1]);
    assert!(matches!(tap(&mut sw, &f).0, Action::Hairpin { .. }));
    // B sending to A from a member's address: not reflected.
    let f = from(LAN_B, echo(a6(PEER), a6(0x50)));
    assert_eq!(tap(&mut sw, &f).0, Action::Drop(DropReason::Spoofed));
    assert_eq!(sw.counters().hairpinned, 1);
    // From a member, such an advertisement (or a router advertisement) reaches no LAN host
    // in any mode.
    let f = behind_options(REMOTE_MAC, (a6(PEER), a6(0x50)), &na);
    assert_eq!(
        from_peer(&mut sw, &f[ETH_HEADER_LEN..]).0,
        Action::Drop(DropReason::LinkLocal)
    );
    let mut veb = router();
    let _ = tap(&mut veb, &dad(LAN_A, a6(0x50)));
    assert_eq!(
        from_peer(&mut veb, &f[ETH_HEADER_LEN..]).0,
        Action::Drop(DropReason::LinkLocal)
    );
    let f = behind_options(
        REMOTE_MAC,
        (a6(PEER), a6(0x50)),
        &[128, 0, 0, 0, 0, 1, 0, 1],
    );
    assert!(matches!(
        from_peer(&mut veb, &f[ETH_HEADER_LEN..]).0,
        Action::ToTap { .. }
    ));
}
