//! IPv6 in router mode: LAN hosts learned from their packets, advertisements and duplicate
//! address probes; the proxy's rules on a LAN; the defence of members' addresses; router
//! advertisements; and members' packets delivered to LAN hosts.

use std::net::Ipv6Addr;
use std::time::Duration;

use super::v6::{a6, dual, echo, frame6, from_peer, tap};
use super::{t0, REMOTE_MAC};
use crate::ndp::{self, link_local_of, Message, NaFlags};
use crate::switch::Switch;
use crate::wire::{EthernetFrame, ETH_HEADER_LEN, IPV6_HEADER_LEN};
use crate::{ra, Action, DropReason, Event, Mac, Mode, LAN_PROBES, MIN_REPLY_BUF};

pub(super) const PEER: u16 = 0x20;
pub(super) const LAN_A: Mac = [0x02, 0, 0, 0, 0, 0x0a];
pub(super) const LAN_B: Mac = [0x02, 0, 0, 0, 0, 0x0b];

/// A router (which serves DHCP) with no IPv6 address of its own; member 7 holds PEER.
pub(super) fn router() -> Switch<u32> {
    let mut config = dual(Mode::Router).config().clone();
    config.address6 = None;
    config.dhcp = true;
    let mut sw = Switch::new(config);
    sw.set_peer_addresses6(7, &[a6(PEER)]);
    sw
}

/// `frame` as sent by the LAN host with `mac`.
pub(super) fn from(mac: Mac, mut frame: Vec<u8>) -> Vec<u8> {
    frame[6..12].copy_from_slice(&mac);
    frame
}

/// A duplicate address probe for `target`, as the kernel sends one: from `::` to the
/// solicited-node group, with no link-layer option.
pub(super) fn dad(mac: Mac, target: Ipv6Addr) -> Vec<u8> {
    let (group, group_mac) = ndp::solicited_node(target);
    let mut message = vec![135, 0, 0, 0, 0, 0, 0, 0];
    message.extend_from_slice(&target.octets());
    let mut f = frame6(Ipv6Addr::UNSPECIFIED, group, 58, 255, &message);
    f[..6].copy_from_slice(&group_mac);
    from(mac, f)
}

/// The solicitation of the LAN host at `source` (with `mac`) for `target`.
pub(super) fn solicitation(mac: Mac, source: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let mut f = vec![0; ndp::ADVERTISEMENT_FRAME_LEN];
    let len = ndp::emit_solicitation(&mut f, (source, mac), target).unwrap();
    f.truncate(len);
    f
}

pub(super) fn events(sw: &mut Switch<u32>) -> Vec<Event> {
    std::iter::from_fn(|| sw.poll_event()).collect()
}

#[test]
fn lan_hosts_are_learned_from_their_packets_and_duplicate_probes_and_claimed() {
    let mut sw = router();
    assert_eq!(
        tap(&mut sw, &dad(LAN_A, a6(0x50))).0,
        Action::Drop(DropReason::NdIgnored)
    );
    let (action, _) = tap(&mut sw, &from(LAN_B, echo(a6(0x51), a6(PEER))));
    assert!(
        matches!(action, Action::ToPeer { peer: 7, .. }),
        "{action:?}"
    );
    assert_eq!(
        events(&mut sw),
        vec![Event::LanHost6Up(a6(0x50)), Event::LanHost6Up(a6(0x51))]
    );
    assert_eq!(sw.lan_hosts6(), vec![a6(0x50), a6(0x51)]);
    // Not from another agent's remote MAC, not link-local, not the service address.
    let agent: Mac = [0xfe, 0xfd, 0, 0, 0, 9];
    let _ = tap(&mut sw, &from(agent, echo(a6(0x52), a6(PEER))));
    let _ = tap(&mut sw, &dad(LAN_A, a6(1)));
    let _ = tap(&mut sw, &dad(LAN_A, "fe80::1".parse().unwrap()));
    assert_eq!(events(&mut sw), vec![]);
    // Traffic between two LAN hosts is theirs; to an unknown member, looked up.
    let mut to_b = from(LAN_A, echo(a6(0x50), a6(0x51)));
    assert_eq!(tap(&mut sw, &to_b).0, Action::Drop(DropReason::LanLocal));
    to_b[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x0b]);
    assert_eq!(tap(&mut sw, &to_b).0, Action::Drop(DropReason::LanLocal));
    assert_eq!(
        tap(&mut sw, &from(LAN_A, echo(a6(0x50), a6(0x70)))).0,
        Action::Resolve {
            target: a6(0x70).into()
        }
    );
}

#[test]
fn a_duplicate_probe_for_a_members_address_is_reported_and_defended_if_the_holder_keeps_it() {
    let mut sw = router();
    // The host may have moved here: reported, learned (its claim is refused, and that
    // starts the handoff), and not answered yet.
    assert_eq!(
        tap(&mut sw, &dad(LAN_A, a6(PEER))).0,
        Action::Drop(DropReason::NdIgnored)
    );
    assert_eq!(
        events(&mut sw),
        vec![
            Event::LanHost6Up(a6(PEER)),
            Event::Announced6 {
                address: a6(PEER),
                mac: LAN_A,
                dad: true
            }
        ]
    );
    let mut reply = [0u8; MIN_REPLY_BUF];
    assert_eq!(sw.poll_transmit(&mut reply), None, "nothing answered yet");
    // The holder's host still answers at its site: defended within the prober's wait.
    assert!(sw.defend6(a6(PEER), t0() + Duration::from_millis(900)));
    let len = sw.poll_transmit(&mut reply).expect("the defence");
    assert!(!sw.defend6(a6(PEER), t0()), "once");
    assert!(sw.lan_hosts6().is_empty(), "the prober gives it up");
    let nd = ndp::parse(&reply[..len]).expect("a valid advertisement");
    assert_eq!(nd.destination, "ff02::1".parse::<Ipv6Addr>().unwrap());
    assert_eq!(
        nd.message,
        Message::Advertisement {
            target: a6(PEER),
            link: Some(REMOTE_MAC),
            flags: NaFlags {
                router: false,
                override_cache: true
            },
            solicited: false,
        }
    );
    assert_eq!(&reply[..6], &[0x33, 0x33, 0, 0, 0, 1]);
    assert_eq!(sw.counters().dad_defended, 1);
    // Too late for the prober (it took the address after its wait): not sent.
    let mut sw = router();
    let _ = tap(&mut sw, &dad(LAN_A, a6(PEER)));
    assert!(!sw.defend6(a6(PEER), t0() + Duration::from_secs(1)));
    assert_eq!(sw.poll_transmit(&mut reply), None);
    // An address nobody probed is not defended.
    assert!(!sw.defend6(a6(0x77), t0()));
    // Undecided by the handoff (a slow or older holder): defended anyway before the
    // prober's wait ends, and no longer the LAN's.
    let mut sw = router();
    let _ = tap(&mut sw, &dad(LAN_A, a6(PEER)));
    let _ = events(&mut sw);
    let due = sw.poll_timeout().expect("a decision is due");
    assert!(due < t0() + Duration::from_secs(1), "{due:?}");
    sw.handle_timeout(due);
    let mut out = [0u8; MIN_REPLY_BUF];
    let mut defended = false;
    while let Some(len) = sw.poll_transmit(&mut out) {
        defended |= matches!(
            ndp::parse(&out[..len]).map(|n| n.message),
            Some(Message::Advertisement { target, solicited: false, .. }) if target == a6(PEER)
        );
    }
    assert!(defended);
    assert_eq!(events(&mut sw), vec![Event::LanHost6Down(a6(PEER))]);
    assert!(sw.lan_hosts6().is_empty());
    // Taken over in time: never answered.
    let mut sw = router();
    let _ = tap(&mut sw, &dad(LAN_A, a6(PEER)));
    sw.settle6(a6(PEER));
    sw.handle_timeout(t0() + Duration::from_secs(1));
    while let Some(len) = sw.poll_transmit(&mut out) {
        assert!(!matches!(
            ndp::parse(&out[..len]).map(|n| n.message),
            Some(Message::Advertisement { target, .. }) if target == a6(PEER)
        ));
    }
    // The service address (the DNS server's) is defended at once.
    assert!(matches!(
        tap(&mut sw, &dad(LAN_A, a6(1))).0,
        Action::ToTap { .. }
    ));
    // A known LAN host's address probed by another host: left to its holder, whose MAC
    // stays.
    let _ = tap(&mut sw, &from(LAN_A, echo(a6(0x50), a6(PEER))));
    let _ = events(&mut sw);
    assert_eq!(
        tap(&mut sw, &dad(LAN_B, a6(0x50))).0,
        Action::Drop(DropReason::NdIgnored)
    );
    let f = echo(a6(PEER), a6(0x50));
    assert_eq!(&from_peer(&mut sw, &f[ETH_HEADER_LEN..]).1[..6], &LAN_A);
}

#[test]
fn a_lan_host_sending_from_a_members_address_silences_nothing() {
    let mut sw = router();
    // B sends from the member's address, and answers for it.
    let _ = tap(&mut sw, &from(LAN_B, echo(a6(PEER), a6(0x30))));
    let mut na = vec![0u8; ndp::ADVERTISEMENT_FRAME_LEN];
    let to = (link_local_of(REMOTE_MAC), REMOTE_MAC);
    ndp::emit_advertisement(&mut na, (a6(PEER), LAN_B), to, NaFlags::default()).unwrap();
    let _ = tap(&mut sw, &na);
    // Learned, as an IPv4 LAN host's is: the claim's refusal starts a handoff (B may have
    // moved here), which the holder refuses while its own host answers.
    assert_eq!(events(&mut sw), vec![Event::LanHost6Up(a6(PEER))]);
    assert_eq!(sw.lan_hosts6(), vec![a6(PEER)]);
    // The proxy still answers for the member (without overriding: a proxy's answer), and
    // A's packets to it still go to it; A's probe for it is left to B, which answers it.
    let (action, reply) = tap(&mut sw, &solicitation(LAN_A, a6(0x50), a6(PEER)));
    let Action::ToTap { len } = action else {
        panic!("{action:?}");
    };
    let Some(Message::Advertisement { flags, .. }) = ndp::parse(&reply[..len]).map(|n| n.message)
    else {
        panic!("not an advertisement");
    };
    assert!(!flags.override_cache && !flags.router);
    assert_eq!(
        tap(&mut sw, &dad(LAN_A, a6(PEER))).0,
        Action::Drop(DropReason::NdIgnored)
    );
    assert!(matches!(
        tap(&mut sw, &from(LAN_A, echo(a6(0x50), a6(PEER)))).0,
        Action::ToPeer { peer: 7, .. }
    ));
    // What reaches this router for the member's address is not B's, and the member's
    // multicast is not taken for B's own coming back.
    let f = echo(a6(0x30), a6(PEER));
    assert_eq!(
        from_peer(&mut sw, &f[ETH_HEADER_LEN..]).0,
        Action::Drop(DropReason::NotForUs)
    );
    let group: Ipv6Addr = "ff05::1:3".parse().unwrap();
    let f = echo(a6(PEER), group);
    assert!(matches!(
        from_peer(&mut sw, &f[ETH_HEADER_LEN..]).0,
        Action::ToTap { .. }
    ));
}

#[test]
fn an_unsolicited_advertisement_is_presence_and_a_probed_host_is_heard_once() {
    let mut sw = router();
    let mut na = vec![0u8; ndp::ADVERTISEMENT_FRAME_LEN];
    let len = ndp::emit_defence(&mut na, (a6(0x50), LAN_A)).unwrap();
    na.truncate(len);
    let _ = tap(&mut sw, &na);
    let announced = Event::Announced6 {
        address: a6(0x50),
        mac: LAN_A,
        dad: false,
    };
    assert_eq!(
        events(&mut sw),
        vec![Event::LanHost6Up(a6(0x50)), announced]
    );
    // Another MAC announcing it: the address is at that MAC now, as a host's packets
    // move it; a remote agent's MAC announces nothing.
    let len = ndp::emit_defence(&mut na, (a6(0x50), LAN_B)).unwrap();
    let _ = tap(&mut sw, &na[..len]);
    let by_b = Event::Announced6 {
        address: a6(0x50),
        mac: LAN_B,
        dad: false,
    };
    assert_eq!(events(&mut sw), vec![by_b]);
    let len = ndp::emit_defence(&mut na, (a6(0x50), [0xfe, 0xfd, 0, 0, 0, 9])).unwrap();
    let _ = tap(&mut sw, &na[..len]);
    assert_eq!(events(&mut sw), vec![]);
    let len = ndp::emit_defence(&mut na, (a6(0x50), LAN_A)).unwrap();
    let _ = tap(&mut sw, &na[..len]);
    assert_eq!(events(&mut sw), vec![announced]);
    // A migration source asks the LAN: a solicitation goes out, and the answer (or any
    // frame) is reported once.
    sw.probe_lan_host(a6(0x50));
    let mut out = [0u8; MIN_REPLY_BUF];
    let len = sw.poll_transmit(&mut out).expect("a solicitation");
    assert!(matches!(
        ndp::parse(&out[..len]).map(|n| n.message),
        Some(Message::Solicitation { target, .. }) if target == a6(0x50)
    ));
    assert_eq!(events(&mut sw), vec![]);
    let mut answer = vec![0u8; ndp::ADVERTISEMENT_FRAME_LEN];
    let to = (link_local_of(REMOTE_MAC), REMOTE_MAC);
    let len =
        ndp::emit_advertisement(&mut answer, (a6(0x50), LAN_A), to, NaFlags::default()).unwrap();
    answer.truncate(len);
    let _ = tap(&mut sw, &answer);
    let heard = Event::LanHostHeard {
        address: a6(0x50).into(),
        mac: LAN_A,
    };
    assert_eq!(events(&mut sw), vec![heard]);
    let _ = tap(&mut sw, &answer);
    assert_eq!(events(&mut sw), vec![], "once per probe");
    // Handed off: forgotten here, routed to its new holder; taken back: routed nowhere.
    sw.probe_lan_host(a6(0x50));
    sw.forget_lan_host(a6(0x50));
    sw.move_route(a6(0x50), Some(7));
    assert_eq!(
        (sw.lan_host_mac(a6(0x50)), sw.route6(a6(0x50))),
        (None, Some(7))
    );
    sw.move_route(a6(0x50), None);
    assert_eq!(sw.route6(a6(0x50)), None);
    sw.learn_lan_host(a6(0x50), LAN_A, t0());
    assert_eq!(sw.lan_host_mac(a6(0x50)), Some(LAN_A));
    assert_eq!(
        events(&mut sw),
        vec![Event::LanHost6Up(a6(0x50))],
        "no longer watched once forgotten"
    );
}

#[test]
fn the_switchs_link_local_address_is_answered_as_a_routers() {
    let mut sw = router();
    let own = link_local_of(REMOTE_MAC);
    let (action, reply) = tap(&mut sw, &solicitation(LAN_A, link_local_of(LAN_A), own));
    let Action::ToTap { len } = action else {
        panic!("{action:?}");
    };
    let nd = ndp::parse(&reply[..len]).unwrap();
    assert_eq!(nd.source, own);
    assert!(matches!(
        nd.message,
        Message::Advertisement { target, link: Some(REMOTE_MAC), flags, solicited: true }
            if target == own && flags.router
    ));
}

#[test]
fn solicitations_are_answered_for_members_and_never_for_lan_hosts() {
    let mut sw = router();
    let _ = tap(&mut sw, &dad(LAN_A, a6(0x50)));
    let _ = events(&mut sw);
    // B asks for A: A answers for itself.
    let ask_a = solicitation(LAN_B, a6(0x51), a6(0x50));
    assert_eq!(tap(&mut sw, &ask_a).0, Action::Drop(DropReason::LanLocal));
    // The asker is learned from its solicitation.
    assert_eq!(events(&mut sw), vec![Event::LanHost6Up(a6(0x51))]);
    let (action, reply) = tap(&mut sw, &solicitation(LAN_B, a6(0x51), a6(PEER)));
    let Action::ToTap { len } = action else {
        panic!("{action:?}");
    };
    let eth = EthernetFrame::new_checked(&reply[..len]).unwrap();
    assert_eq!((eth.dst(), eth.src()), (LAN_B, REMOTE_MAC));
    assert_eq!(sw.counters().nd_replies, 1);
    assert_eq!(
        tap(&mut sw, &solicitation(LAN_B, a6(0x51), a6(0x70))).0,
        Action::Resolve {
            target: a6(0x70).into()
        }
    );
}

#[test]
fn the_prefix_is_advertised_at_start_every_interval_and_to_a_soliciting_host() {
    let mut sw = router();
    assert_eq!(sw.poll_timeout(), None);
    sw.start(t0());
    assert_eq!(sw.poll_timeout(), Some(t0()));
    sw.handle_timeout(t0());
    let mut buf = vec![0u8; MIN_REPLY_BUF];
    let len = sw.poll_transmit(&mut buf).expect("an advertisement");
    assert_eq!(&buf[..6], &[0x33, 0x33, 0, 0, 0, 1]);
    let icmp = &buf[ETH_HEADER_LEN + IPV6_HEADER_LEN..len];
    assert_eq!(icmp[0], 134);
    assert_eq!(&icmp[24 + 16..24 + 32], &a6(0).octets(), "the prefix");
    assert_eq!(&icmp[56 + 8..56 + 24], &a6(1).octets(), "the DNS server");
    // Two more 4 s apart, then one every 200 s.
    let mut t = t0();
    for next in [4, 4, 200, 200] {
        let due = t + Duration::from_secs(next);
        assert_eq!(sw.poll_timeout(), Some(due));
        sw.handle_timeout(due);
        assert!(sw.poll_transmit(&mut buf).is_some());
        t = due;
    }
    assert_eq!(sw.counters().router_advertisements, 5);
    // A host's solicitation, from its link-local address: answered to it.
    let host = link_local_of(LAN_A);
    let mut rs = vec![0u8; 128];
    let n = ndp::emit_message(
        &mut rs,
        (LAN_A, [0x33, 0x33, 0, 0, 0, 2]),
        (host, "ff02::2".parse().unwrap()),
        16,
        |icmp| {
            icmp[0] = 133;
            icmp[8] = 1;
            icmp[9] = 1;
            icmp[10..16].copy_from_slice(&LAN_A);
        },
    )
    .unwrap();
    let (action, reply) = tap(&mut sw, &rs[..n]);
    let Action::ToTap { len } = action else {
        panic!("{action:?}");
    };
    assert_eq!(&reply[..6], &LAN_A);
    assert_eq!(
        &reply[ETH_HEADER_LEN + 24..ETH_HEADER_LEN + 40],
        &host.octets()
    );
    assert!(ra::is_advertisement(&reply[..len]));
    // From `::` (no address yet): to all nodes, at most once in 3 s.
    let mut anonymous = vec![0u8; 128];
    let n = ndp::emit_message(
        &mut anonymous,
        (LAN_B, [0x33, 0x33, 0, 0, 0, 2]),
        (Ipv6Addr::UNSPECIFIED, "ff02::2".parse().unwrap()),
        8,
        |icmp| icmp[0] = 133,
    )
    .unwrap();
    let at = t0() + Duration::from_secs(1000);
    let mut frame = anonymous[..n].to_vec();
    let mut out = vec![0u8; MIN_REPLY_BUF];
    let first = sw.handle_tap_frame(at, &mut frame, &mut out);
    assert!(matches!(first, Action::ToTap { .. }), "{first:?}");
    assert_eq!(&out[..6], &[0x33, 0x33, 0, 0, 0, 1]);
    let again = sw.handle_tap_frame(at + Duration::from_secs(1), &mut frame, &mut out);
    assert_eq!(again, Action::Drop(DropReason::NdIgnored));
    let later = sw.handle_tap_frame(at + Duration::from_secs(4), &mut frame, &mut out);
    assert!(matches!(later, Action::ToTap { .. }));
    // Another router's advertisement is the LAN's business.
    assert_eq!(
        tap(&mut sw, &from(LAN_B, reply[..len].to_vec())).0,
        Action::Drop(DropReason::LanLocal)
    );
    // An interface-mode switch advertises nothing.
    let mut iface = dual(Mode::Interface);
    iface.start(t0());
    assert_eq!(iface.poll_timeout(), None);
}

#[test]
fn a_members_packet_reaches_a_known_lan_host_and_an_unknown_one_is_solicited() {
    let mut sw = router();
    let _ = tap(&mut sw, &dad(LAN_A, a6(0x50)));
    let f = echo(a6(PEER), a6(0x50));
    let (action, buf) = from_peer(&mut sw, &f[ETH_HEADER_LEN..]);
    assert_eq!(action, Action::ToTap { len: f.len() });
    let eth = EthernetFrame::new_checked(&buf[..f.len()]).unwrap();
    assert_eq!((eth.dst(), eth.src()), (LAN_A, REMOTE_MAC));
    // An unknown one: solicited once a second, from the switch's link-local address.
    let unknown = echo(a6(PEER), a6(0x51));
    for _ in 0..2 {
        assert_eq!(
            from_peer(&mut sw, &unknown[ETH_HEADER_LEN..]).0,
            Action::Drop(DropReason::NotForUs)
        );
    }
    let mut out = vec![0u8; MIN_REPLY_BUF];
    let len = sw.poll_transmit(&mut out).expect("a solicitation");
    assert_eq!(sw.poll_transmit(&mut out[..]), None, "only one");
    let nd = ndp::parse(&out[..len]).unwrap();
    assert_eq!(nd.source, link_local_of(REMOTE_MAC));
    assert_eq!(
        nd.message,
        Message::Solicitation {
            target: a6(0x51),
            link: Some(REMOTE_MAC)
        }
    );
    assert_eq!(sw.counters().nd_probes, 1);
    // Its answer teaches the switch where it is.
    let mut na = vec![0u8; ndp::ADVERTISEMENT_FRAME_LEN];
    let answer = (link_local_of(REMOTE_MAC), REMOTE_MAC);
    ndp::emit_advertisement(&mut na, (a6(0x51), LAN_B), answer, NaFlags::default()).unwrap();
    assert_eq!(tap(&mut sw, &na).0, Action::Drop(DropReason::LanLocal));
    let (action, buf) = from_peer(&mut sw, &unknown[ETH_HEADER_LEN..]);
    assert_eq!(action, Action::ToTap { len: unknown.len() });
    assert_eq!(&buf[..6], &LAN_B);
    // Wider multicast from a member reaches the whole LAN; a LAN host's own coming back
    // does not.
    let group: Ipv6Addr = "ff05::1:3".parse().unwrap();
    let (action, buf) = from_peer(&mut sw, &echo(a6(PEER), group)[ETH_HEADER_LEN..]);
    assert!(matches!(action, Action::ToTap { .. }), "{action:?}");
    assert_eq!(&buf[..6], &[0x33, 0x33, 0, 1, 0, 3]);
    assert_eq!(
        from_peer(&mut sw, &echo(a6(0x50), group)[ETH_HEADER_LEN..]).0,
        Action::Drop(DropReason::BroadcastFromLan)
    );
}

#[test]
fn a_silent_lan_host_is_solicited_then_forgotten() {
    let mut sw = router();
    let _ = tap(&mut sw, &dad(LAN_A, a6(0x50)));
    assert_eq!(events(&mut sw), vec![Event::LanHost6Up(a6(0x50))]);
    let mut t = t0() + sw.config().lan_timeout;
    let mut buf = vec![0u8; MIN_REPLY_BUF];
    for _ in 0..LAN_PROBES {
        assert!(sw.poll_timeout().is_some_and(|d| d <= t));
        sw.handle_timeout(t);
        let len = sw.poll_transmit(&mut buf).expect("a solicitation");
        assert!(matches!(
            ndp::parse(&buf[..len]).map(|n| n.message),
            Some(Message::Solicitation { target, .. }) if target == a6(0x50)
        ));
        assert_eq!(events(&mut sw), vec![]);
        t += Duration::from_secs(1);
    }
    sw.handle_timeout(t);
    assert_eq!(events(&mut sw), vec![Event::LanHost6Down(a6(0x50))]);
    assert!(sw.lan_hosts6().is_empty());
}

#[test]
fn dhcpv6_from_a_lan_host_goes_to_the_server_and_its_reply_comes_from_the_link_local_address() {
    let mut sw = router();
    let host = link_local_of(LAN_A);
    let servers: Ipv6Addr = "ff02::1:2".parse().unwrap();
    let mut udp = vec![0x02, 0x22, 0x02, 0x23, 0, 12, 0, 0];
    udp.extend_from_slice(&[1, 0xab, 0xcd, 0xef]);
    let mut f = from(LAN_A, frame6(host, servers, 17, 1, &udp));
    f[..6].copy_from_slice(&[0x33, 0x33, 0, 1, 0, 2]);
    let Action::Dhcp6 { payload, client } = tap(&mut sw, &f).0 else {
        panic!("not intercepted");
    };
    assert_eq!(&f[payload], &[1, 0xab, 0xcd, 0xef]);
    assert_eq!(
        (client.mac, client.ip, client.port),
        (LAN_A, host.into(), 546)
    );
    assert_eq!(sw.counters().dhcp_requests, 1);
    let mut buf = vec![0u8; 256];
    let n = sw
        .emit_dhcp6_reply(&mut buf, (host, LAN_A), 546, b"reply")
        .unwrap();
    let eth = EthernetFrame::new_checked(&buf[..n]).unwrap();
    assert_eq!((eth.dst(), eth.src()), (LAN_A, REMOTE_MAC));
    let ip = crate::wire::Ipv6Packet::new_checked(eth.payload()).unwrap();
    assert_eq!((ip.src(), ip.dst()), (link_local_of(REMOTE_MAC), host));
    assert_eq!(&ip.payload()[..4], &[2, 0x23, 2, 0x22]);
    assert_eq!(
        ndp::upper_layer_sum(&eth.payload()[8..40], 17, ip.payload()),
        0xffff
    );
    // Without DHCP, or to another port: not taken.
    let mut other = f.clone();
    other[ETH_HEADER_LEN + IPV6_HEADER_LEN + 3] = 0x24;
    assert_eq!(tap(&mut sw, &other).0, Action::Drop(DropReason::LinkLocal));
    let mut config = sw.config().clone();
    config.dhcp = false;
    let mut plain = Switch::new(config);
    assert_eq!(tap(&mut plain, &f).0, Action::Drop(DropReason::LinkLocal));
    // A relay agent's RELAY-FORW, unicast to the service address from its own: taken, and
    // answered from the service address to its port 547.
    let (relay, service) = (a6(0x0e), a6(1));
    let mut udp = vec![0x02, 0x23, 0x02, 0x23, 0, 12, 0, 0];
    udp.extend_from_slice(&[12, 0, 0, 0]);
    let f = from(LAN_A, frame6(relay, service, 17, 64, &udp));
    let Action::Dhcp6 { payload, client } = tap(&mut sw, &f).0 else {
        panic!("a relay's message not intercepted");
    };
    assert_eq!(&f[payload], &[12, 0, 0, 0]);
    assert_eq!((client.ip, client.port), (relay.into(), 547));
    let n = sw
        .emit_dhcp6_reply(&mut buf, (relay, LAN_A), 547, b"reply")
        .unwrap();
    let eth = EthernetFrame::new_checked(&buf[..n]).unwrap();
    let ip = crate::wire::Ipv6Packet::new_checked(eth.payload()).unwrap();
    assert_eq!((ip.src(), ip.dst()), (service, relay));
    assert_eq!(&ip.payload()[..4], &[2, 0x23, 2, 0x23]);
    // Or to all DHCPv6 servers of the site (a relay's default).
    let site: Ipv6Addr = "ff05::1:3".parse().unwrap();
    let mut to_site = from(LAN_A, frame6(relay, site, 17, 64, &udp));
    to_site[..6].copy_from_slice(&[0x33, 0x33, 0, 1, 0, 3]);
    assert!(matches!(tap(&mut sw, &to_site).0, Action::Dhcp6 { .. }));
    // Without DHCP, a datagram to port 547 of the service address is no one's.
    assert_eq!(tap(&mut plain, &f).0, Action::Drop(DropReason::NoRoute));
}

#[test]
fn a_hybrid_host_is_answered_for_a_remote_member_only_after_the_lan_stayed_silent() {
    use super::v6::solicitation as host_asks;
    use super::DEVICE_MAC;
    let mut sw = dual(Mode::Hybrid);
    let timeout = sw.config().probe_timeout;
    // Another host on the LAN: learned from what the bridge floods, and not carried.
    assert_eq!(
        tap(&mut sw, &from(LAN_A, echo(a6(0x50), a6(0x51)))).0,
        Action::Drop(DropReason::OtherHost)
    );
    assert_eq!(
        events(&mut sw),
        vec![],
        "a hybrid switch claims no LAN host"
    );
    assert_eq!(
        tap(&mut sw, &host_asks(a6(0x50))).0,
        Action::Drop(DropReason::LanLocal)
    );
    // A member elsewhere: the LAN is asked first.
    assert_eq!(
        tap(&mut sw, &host_asks(a6(PEER))).0,
        Action::Drop(DropReason::ArpProbing)
    );
    let mut out = vec![0u8; MIN_REPLY_BUF];
    let len = sw.poll_transmit(&mut out).expect("a probe");
    assert!(matches!(
        ndp::parse(&out[..len]).map(|n| n.message),
        Some(Message::Solicitation { target, .. }) if target == a6(PEER)
    ));
    assert_eq!(sw.poll_timeout(), Some(t0() + timeout));
    sw.handle_timeout(t0() + timeout);
    let len = sw.poll_transmit(&mut out).expect("the deferred answer");
    let nd = ndp::parse(&out[..len]).unwrap();
    assert_eq!(&out[..6], &DEVICE_MAC);
    assert!(matches!(
        nd.message,
        Message::Advertisement { target, link: Some(REMOTE_MAC), .. } if target == a6(PEER)
    ));
    // Confirmed remote: answered at once from now on.
    assert!(matches!(
        tap(&mut sw, &host_asks(a6(PEER))).0,
        Action::ToTap { .. }
    ));
    // A member on this LAN answers the probe itself: the host is left to it.
    sw.set_peer_addresses6(8, &[a6(0x60)]);
    let _ = tap(&mut sw, &host_asks(a6(0x60)));
    let mut na = vec![0u8; ndp::ADVERTISEMENT_FRAME_LEN];
    let to = (link_local_of(REMOTE_MAC), REMOTE_MAC);
    ndp::emit_advertisement(&mut na, (a6(0x60), LAN_B), to, NaFlags::default()).unwrap();
    assert_eq!(tap(&mut sw, &na).0, Action::Drop(DropReason::OtherHost));
    while sw.poll_transmit(&mut out).is_some() {}
    sw.handle_timeout(t0() + timeout * 3);
    assert_eq!(
        sw.poll_transmit(&mut out),
        None,
        "no answer for a LAN member"
    );
    assert_eq!(
        tap(&mut sw, &host_asks(a6(0x60))).0,
        Action::Drop(DropReason::LanLocal)
    );
    // The host's unicast to a LAN host's MAC is the LAN's (however large: the LAN's MTU is
    // not the tunnel's); to the remote MAC, the member's.
    let mut direct = echo(a6(0x10), a6(0x60));
    direct[..6].copy_from_slice(&LAN_B);
    assert_eq!(tap(&mut sw, &direct).0, Action::Drop(DropReason::LanLocal));
    let mut large = frame6(a6(0x10), a6(0x60), 17, 64, &[0u8; 1400]);
    large[..6].copy_from_slice(&LAN_B);
    assert_eq!(tap(&mut sw, &large).0, Action::Drop(DropReason::LanLocal));
    assert_eq!(sw.counters().packet_too_big, 0);
    // A neighbour's multicast, back from a member: the host heard it on the LAN already.
    let group: Ipv6Addr = "ff05::1:3".parse().unwrap();
    assert_eq!(
        from_peer(&mut sw, &echo(a6(0x60), group)[ETH_HEADER_LEN..]).0,
        Action::Drop(DropReason::BroadcastFromLan)
    );
    // An advertisement naming another host's MAC teaches nothing.
    let mut na = vec![0u8; ndp::ADVERTISEMENT_FRAME_LEN];
    ndp::emit_advertisement(&mut na, (a6(PEER), LAN_B), to, NaFlags::default()).unwrap();
    na[6..12].copy_from_slice(&LAN_A);
    let _ = tap(&mut sw, &na);
    assert!(!sw.lan_hosts6().contains(&a6(PEER)));
    // A LAN address silent for `lan_timeout` is forgotten: the host's next solicitation for
    // it is probed again.
    let later = t0() + sw.config().lan_timeout + Duration::from_secs(1);
    assert!(sw.poll_timeout().is_some_and(|t| t <= later));
    sw.handle_timeout(later);
    assert!(sw.lan_hosts6().is_empty());
    let mut asks = host_asks(a6(0x60));
    assert_eq!(
        sw.handle_tap_frame(later, &mut asks, &mut out),
        Action::Drop(DropReason::ArpProbing)
    );
    assert!(matches!(
        tap(&mut sw, &echo(a6(0x10), a6(PEER))).0,
        Action::ToPeer { peer: 7, .. }
    ));
}
