//! IPv6 in interface mode: the neighbour discovery proxy, routes to IPv6 holders, what
//! stays on the link, "packet too big", and packets from members.

use std::net::Ipv6Addr;

use super::{t0, DEVICE_MAC, REMOTE_MAC};
use crate::ndp::{self, pseudo_sum, Message};
use crate::switch::Switch;
use crate::wire::{EthernetFrame, ETH_HEADER_LEN, IPV6_HEADER_LEN};
use crate::{Action, Config, DropReason, Mode, HEADROOM, MIN_REPLY_BUF};

const PREFIX: &str = "fd12:3456:789a::/64";

pub(super) fn a6(last: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd12, 0x3456, 0x789a, 0, 0, 0, 0, last)
}

const OWN: u16 = 0x10;
const PEER: u16 = 0x20;

pub(super) fn dual(mode: Mode) -> Switch<u32> {
    let mut config = Config::interface(
        "10.201.0.1".parse().unwrap(),
        "10.201.0.0/16".parse().unwrap(),
        DEVICE_MAC,
        REMOTE_MAC,
    );
    config.mode = mode;
    config.prefix6 = Some(PREFIX.parse().unwrap());
    let mut sw = Switch::new(config);
    sw.set_address6(Some(a6(OWN)));
    sw.set_peer_addresses6(7, &[a6(PEER)]);
    sw
}

/// An IPv6 frame from the host (or, with `dst_mac`, to it) carrying `payload` after a
/// header of `next` and `hop` limit; an ICMPv6 payload gets its checksum.
pub(super) fn frame6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, hop: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = REMOTE_MAC.to_vec();
    f.extend_from_slice(&DEVICE_MAC);
    f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
    f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    f.extend_from_slice(&[next, hop]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(payload);
    if next == 58 {
        let at = ETH_HEADER_LEN + IPV6_HEADER_LEN;
        let sum = !pseudo_sum(&f[ETH_HEADER_LEN + 8..at], &f[at..]);
        f[at + 2..at + 4].copy_from_slice(&sum.to_be_bytes());
    }
    f
}

pub(super) fn echo(src: Ipv6Addr, dst: Ipv6Addr) -> Vec<u8> {
    frame6(src, dst, 58, 64, &[128, 0, 0, 0, 0, 1, 0, 1, 1, 2, 3, 4])
}

/// The host's solicitation for `target`, as the kernel sends it.
pub(super) fn solicitation(target: Ipv6Addr) -> Vec<u8> {
    let mut f = vec![0; ndp::ADVERTISEMENT_FRAME_LEN];
    let len = ndp::emit_solicitation(&mut f, (a6(OWN), DEVICE_MAC), target).unwrap();
    f.truncate(len);
    f
}

pub(super) fn tap(sw: &mut Switch<u32>, frame: &[u8]) -> (Action<u32>, Vec<u8>) {
    let mut frame = frame.to_vec();
    let mut reply = vec![0; MIN_REPLY_BUF.max(1500)];
    let action = sw.handle_tap_frame(t0(), &mut frame, &mut reply);
    (action, reply)
}

#[test]
fn a_solicitation_for_a_members_address_is_answered_with_the_remote_mac() {
    let mut sw = dual(Mode::Interface);
    let (action, reply) = tap(&mut sw, &solicitation(a6(PEER)));
    let Action::ToTap { len } = action else {
        panic!("{action:?}");
    };
    let nd = ndp::parse(&reply[..len]).expect("a valid advertisement");
    assert_eq!(nd.destination, a6(OWN));
    match nd.message {
        Message::Advertisement {
            target,
            link,
            solicited,
            flags,
        } => {
            assert_eq!(
                (target, link, solicited),
                (a6(PEER), Some(REMOTE_MAC), true)
            );
            assert!(!flags.router && flags.override_cache);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        EthernetFrame::new_checked(&reply[..len]).unwrap().dst(),
        DEVICE_MAC
    );
    assert_eq!(sw.counters().nd_replies, 1);
}

#[test]
fn a_solicitation_for_an_unknown_address_waits_for_it_to_resolve() {
    let mut sw = dual(Mode::Interface);
    let (action, _) = tap(&mut sw, &solicitation(a6(0x30)));
    assert_eq!(
        action,
        Action::Resolve {
            target: a6(0x30).into()
        }
    );
    // Once the DHT names its holder, the same solicitation is answered.
    sw.add_route_ip(a6(0x30).into(), 9);
    assert!(matches!(
        tap(&mut sw, &solicitation(a6(0x30))).0,
        Action::ToTap { .. }
    ));
    assert_eq!(sw.route6(a6(0x30)), Some(9));
}

#[test]
fn solicitations_for_the_hosts_own_address_outside_the_prefix_or_probes_are_not_answered() {
    let mut sw = dual(Mode::Interface);
    for target in [
        a6(OWN),
        "fd99::20".parse().unwrap(),
        "2001:db8::1".parse().unwrap(),
    ] {
        let (action, _) = tap(&mut sw, &solicitation(target));
        assert_eq!(action, Action::Drop(DropReason::NdIgnored), "{target}");
    }
    // A duplicate address probe: from `::` to the solicited-node group, no option.
    let (group, _) = ndp::solicited_node(a6(PEER));
    let mut probe = vec![135, 0, 0, 0, 0, 0, 0, 0];
    probe.extend_from_slice(&a6(PEER).octets());
    let dad = frame6(Ipv6Addr::UNSPECIFIED, group, 58, 255, &probe);
    assert!(ndp::parse(&dad).is_some());
    assert_eq!(tap(&mut sw, &dad).0, Action::Drop(DropReason::NdIgnored));
    assert_eq!(sw.counters().nd_replies, 0);
}

#[test]
fn packets_go_to_the_holder_or_wait_for_a_lookup() {
    let mut sw = dual(Mode::Interface);
    let f = echo(a6(OWN), a6(PEER));
    let (action, _) = tap(&mut sw, &f);
    assert_eq!(
        action,
        Action::ToPeer {
            peer: 7,
            packet: ETH_HEADER_LEN..f.len()
        }
    );
    assert_eq!(
        tap(&mut sw, &echo(a6(OWN), a6(0x31))).0,
        Action::Resolve {
            target: a6(0x31).into()
        }
    );
    // The prefix's own addresses go nowhere; the host's own neither.
    for dst in [a6(0), a6(1), a6(OWN)] {
        assert_eq!(
            tap(&mut sw, &echo(a6(OWN), dst)).0,
            Action::Drop(DropReason::NoRoute)
        );
    }
    let outside = "2001:db8::1".parse().unwrap();
    assert_eq!(
        tap(&mut sw, &echo(a6(OWN), outside)).0,
        Action::Drop(DropReason::OutsideSubnet)
    );
    assert_eq!(
        tap(&mut sw, &echo(outside, a6(PEER))).0,
        Action::Drop(DropReason::OutsideSubnet)
    );
    // A member gone: its routes go with it.
    sw.remove_peer(7);
    assert_eq!(sw.route6(a6(PEER)), None);
}

#[test]
fn link_scoped_traffic_never_leaves_and_wider_multicast_goes_to_every_member() {
    let mut sw = dual(Mode::Interface);
    let link_local: Ipv6Addr = "fe80::1".parse().unwrap();
    for (src, dst) in [
        (link_local, a6(PEER)),
        (a6(OWN), link_local),
        (a6(OWN), "ff02::1".parse().unwrap()),
        (link_local, "ff02::2".parse().unwrap()),
        (a6(OWN), "ff01::1".parse().unwrap()),
    ] {
        assert_eq!(
            tap(&mut sw, &echo(src, dst)).0,
            Action::Drop(DropReason::LinkLocal),
            "{src} -> {dst}"
        );
    }
    let site: Ipv6Addr = "ff05::1:3".parse().unwrap();
    let f = echo(a6(OWN), site);
    assert_eq!(
        tap(&mut sw, &f).0,
        Action::Broadcast {
            packet: ETH_HEADER_LEN..f.len()
        }
    );
    assert_eq!(sw.counters().broadcasts_out, 1);
}

#[test]
fn a_packet_larger_than_the_tunnel_is_answered_with_packet_too_big() {
    let mut sw = dual(Mode::Interface);
    let mtu = sw.config().tunnel_mtu;
    let big = frame6(a6(OWN), a6(PEER), 17, 64, &vec![0u8; usize::from(mtu)]);
    let (action, reply) = tap(&mut sw, &big);
    let Action::ToTap { len } = action else {
        panic!("{action:?}");
    };
    let icmp = &reply[ETH_HEADER_LEN + IPV6_HEADER_LEN..len];
    assert_eq!((icmp[0], icmp[1]), (2, 0), "ICMPv6 packet too big");
    assert_eq!(
        u32::from_be_bytes([icmp[4], icmp[5], icmp[6], icmp[7]]),
        u32::from(mtu)
    );
    let header = &reply[ETH_HEADER_LEN..ETH_HEADER_LEN + IPV6_HEADER_LEN];
    assert_eq!(pseudo_sum(&header[8..40], icmp), 0xffff, "checksum");
    assert_eq!(&header[24..40], &a6(OWN).octets(), "to the sender");
    assert_eq!(&header[8..24], &a6(1).octets(), "from the service address");
    // It quotes the start of the packet, and never exceeds the minimum MTU.
    assert_eq!(&icmp[8..48], &big[ETH_HEADER_LEN..ETH_HEADER_LEN + 40]);
    assert!(len - ETH_HEADER_LEN <= 1280);
    assert_eq!(sw.counters().packet_too_big, 1);
    // One that fits goes.
    let fits = frame6(a6(OWN), a6(PEER), 17, 64, &vec![0u8; usize::from(mtu) - 40]);
    assert!(matches!(tap(&mut sw, &fits).0, Action::ToPeer { .. }));
}

/// A member's packet placed after the headroom, as the agent hands it to the switch.
pub(super) fn from_peer(sw: &mut Switch<u32>, packet: &[u8]) -> (Action<u32>, Vec<u8>) {
    let mut buf = vec![0u8; HEADROOM];
    buf.extend_from_slice(packet);
    let action = sw.handle_peer_packet(t0(), &mut buf, packet.len());
    (action, buf)
}

#[test]
fn a_members_packet_for_the_host_is_framed_and_others_are_dropped() {
    let mut sw = dual(Mode::Interface);
    let f = echo(a6(PEER), a6(OWN));
    let (action, buf) = from_peer(&mut sw, &f[ETH_HEADER_LEN..]);
    assert_eq!(action, Action::ToTap { len: f.len() });
    let eth = EthernetFrame::new_checked(&buf[..f.len()]).unwrap();
    assert_eq!(
        (eth.dst(), eth.src(), eth.ethertype()),
        (DEVICE_MAC, REMOTE_MAC, 0x86dd)
    );
    let other = echo(a6(PEER), a6(0x40));
    assert_eq!(
        from_peer(&mut sw, &other[ETH_HEADER_LEN..]).0,
        Action::Drop(DropReason::NotForUs)
    );
    let link = echo("fe80::2".parse().unwrap(), a6(OWN));
    assert_eq!(
        from_peer(&mut sw, &link[ETH_HEADER_LEN..]).0,
        Action::Drop(DropReason::LinkLocal)
    );
    assert_eq!(
        from_peer(&mut sw, &f[ETH_HEADER_LEN..ETH_HEADER_LEN + 30]).0,
        Action::Drop(DropReason::Malformed)
    );
    // Never as from the outside world or the service address, and never the host's
    // link's own discovery.
    for src in ["2001:db8::53".parse().unwrap(), a6(1), a6(0)] {
        let outside = echo(src, a6(OWN));
        assert_eq!(
            from_peer(&mut sw, &outside[ETH_HEADER_LEN..]).0,
            Action::Drop(DropReason::OutsideSubnet),
            "{src}"
        );
    }
    // Nor is a route to them taken from a member.
    sw.set_peer_addresses6(7, &[a6(PEER), a6(1), a6(0)]);
    assert_eq!((sw.route6(a6(1)), sw.route6(a6(0))), (None, None));
    for kind in 133..=137u8 {
        let nd = frame6(a6(PEER), a6(OWN), 58, 255, &[kind, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            from_peer(&mut sw, &nd[ETH_HEADER_LEN..]).0,
            Action::Drop(DropReason::LinkLocal),
            "ICMPv6 type {kind}"
        );
    }
}

#[test]
fn a_members_syn_has_its_mss_clamped_to_the_tunnel() {
    let mut sw = dual(Mode::Interface);
    // A SYN with MSS 1440 (a member with a larger tunnel MTU), checksum 0 then filled.
    let mut tcp = vec![0u8; 24];
    tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
    tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
    tcp[12] = 6 << 4;
    tcp[13] = 0x02;
    tcp[20..24].copy_from_slice(&[2, 4, 0x05, 0xa0]);
    let mut f = frame6(a6(PEER), a6(OWN), 6, 64, &tcp);
    let at = ETH_HEADER_LEN + IPV6_HEADER_LEN;
    let tcp_sum = |f: &[u8]| {
        let mut pseudo = f[ETH_HEADER_LEN + 8..at].to_vec();
        pseudo.extend_from_slice(&(24u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, 6]);
        crate::udp::checksum(crate::udp::checksum(0, &pseudo), &f[at..])
    };
    let sum = !tcp_sum(&f);
    f[at + 16..at + 18].copy_from_slice(&sum.to_be_bytes());
    assert_eq!(tcp_sum(&f), 0xffff);
    let (action, buf) = from_peer(&mut sw, &f[ETH_HEADER_LEN..]);
    assert_eq!(action, Action::ToTap { len: f.len() });
    let out = &buf[..f.len()];
    let mss = u16::from_be_bytes([out[at + 22], out[at + 23]]);
    assert_eq!(mss, sw.config().tunnel_mtu - 60);
    assert_eq!(tcp_sum(out), 0xffff, "checksum still right");
    assert_eq!(sw.counters().mss_clamped, 1);
}

#[test]
fn without_a_prefix_ipv6_is_not_carried() {
    let mut v4 = super::switch();
    assert_eq!(
        tap(&mut v4, &echo(a6(OWN), a6(PEER))).0,
        Action::Drop(DropReason::UnsupportedProtocol)
    );
    let f = echo(a6(PEER), a6(OWN));
    assert_eq!(
        from_peer(&mut v4, &f[ETH_HEADER_LEN..]).0,
        Action::Drop(DropReason::UnsupportedProtocol)
    );
}

#[test]
fn a_dns_query_to_the_ipv6_service_address_is_answered_from_it() {
    for mode in [Mode::Interface, Mode::Router] {
        let mut sw = dual(mode);
        let service = a6(1);
        // The service address is resolved at once (no member holds it).
        let (action, _) = tap(&mut sw, &solicitation(service));
        assert!(
            matches!(action, Action::ToTap { .. }),
            "{mode:?}: {action:?}"
        );
        // UDP to port 53 from port 5353.
        let mut udp = vec![0x14, 0xe9, 0, 53, 0, 13, 0, 0];
        udp.extend_from_slice(b"query");
        let f = frame6(a6(OWN), service, 17, 64, &udp);
        let Action::Dns { payload, client } = tap(&mut sw, &f).0 else {
            panic!("{mode:?}: not intercepted");
        };
        assert_eq!(&f[payload], b"query");
        assert_eq!(
            client,
            crate::Client {
                mac: DEVICE_MAC,
                ip: a6(OWN).into(),
                port: 5353
            }
        );
        assert_eq!(sw.counters().dns_queries, 1);
        let mut buf = [0u8; 128];
        let n = sw.emit_dns_reply(&mut buf, client, b"answer").unwrap();
        let eth = EthernetFrame::new_checked(&buf[..n]).unwrap();
        assert_eq!(
            (eth.dst(), eth.src(), eth.ethertype()),
            (DEVICE_MAC, REMOTE_MAC, 0x86dd)
        );
        let ip = crate::wire::Ipv6Packet::new_checked(eth.payload()).unwrap();
        assert_eq!(
            (ip.src(), ip.dst(), ip.next_header()),
            (service, a6(OWN), 17)
        );
        let udp = ip.payload();
        assert_eq!(&udp[..4], &[0, 53, 0x14, 0xe9]);
        assert_eq!(&udp[8..], b"answer");
        let sum = ndp::upper_layer_sum(&eth.payload()[8..40], 17, udp);
        assert_eq!(sum, 0xffff, "UDP checksum");
        // Anything else to it is not served.
        let ping = echo(a6(OWN), service);
        assert_eq!(tap(&mut sw, &ping).0, Action::Drop(DropReason::NoRoute));
    }
}
