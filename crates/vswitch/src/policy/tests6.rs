#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::disallowed_methods)] // tests start the clock
//! Policy over IPv6: rules naming IPv6 addresses, flows past extension headers, ICMPv6,
//! and the answers of a rejecting policy.

use std::net::Ipv6Addr;
use std::time::Instant;

use super::flows::{self, Firewall, Parsed, Verdict};
use super::tests::{compile, ip, packet, sums_right, RST, SYN, SYN_ACK};
use super::*;

/// IPv6 packet builders: `ext` are extension headers put before the transport header,
/// each (its type, its bytes with the next-header byte left 0).
fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, proto: u8, ext: &[(u8, Vec<u8>)], payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; 40];
    p[0] = 0x60;
    let types: Vec<u8> = ext.iter().map(|(t, _)| *t).chain([proto]).collect();
    p[6] = types[0];
    p[7] = 64;
    p[8..24].copy_from_slice(&src.octets());
    p[24..40].copy_from_slice(&dst.octets());
    for (i, (_, bytes)) in ext.iter().enumerate() {
        let mut h = bytes.clone();
        h[0] = types[i + 1];
        p.extend_from_slice(&h);
    }
    p.extend_from_slice(payload);
    let len = (p.len() - 40) as u16;
    p[4..6].copy_from_slice(&len.to_be_bytes());
    p
}

fn v6(last: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last)
}

fn tcp6(src: (Ipv6Addr, u16), dst: (Ipv6Addr, u16), flags: u8, ext: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&src.1.to_be_bytes());
    t[2..4].copy_from_slice(&dst.1.to_be_bytes());
    t[12] = 0x50;
    t[13] = flags;
    ipv6(src.0, dst.0, proto::TCP, ext, &t)
}

fn echo6(src: Ipv6Addr, dst: Ipv6Addr, reply: bool, id: u16) -> Vec<u8> {
    let mut i = vec![if reply { 129 } else { 128 }, 0, 0, 0, 0, 0, 0, 1];
    i[4..6].copy_from_slice(&id.to_be_bytes());
    ipv6(src, dst, proto::ICMPV6, &[], &i)
}

/// A fragment header (offset in 8-byte units, more fragments).
fn fragment6(offset: u16, more: bool) -> (u8, Vec<u8>) {
    let mut h = vec![0u8; 8];
    h[2..4].copy_from_slice(&((offset << 3) | u16::from(more)).to_be_bytes());
    (44, h)
}

#[test]
fn ipv6_flows_are_decided_by_ipv6_rules_and_remembered() {
    let p = compile(
        "default = \"deny\"\n\
         [[rule]]\nfrom = [\"fd00::/120\"]\nto = [\"fd00::2\"]\nproto = \"tcp\"\nports = [\"22\"]\n\
         [[rule]]\nfrom = [\"10.0.0.0/8\"]\nto = [\"any\"]\n\
         [[rule]]\nfrom = [\"any\"]\nto = [\"fd00::/64\"]\nproto = \"icmp\"",
        false,
    )
    .unwrap();
    let none = Tags::default();
    // Decided by family: the IPv4 CIDR says nothing of IPv6 packets, and the reverse.
    assert_eq!(
        p.decide(none, none, &packet(v6(9), v6(2), proto::TCP, 22)),
        Decision::Rule(0)
    );
    assert_eq!(
        p.decide(none, none, &packet(v6(9), v6(2), proto::TCP, 80)),
        Decision::DefaultDeny
    );
    assert_eq!(
        p.decide(none, none, &packet(ip(9), ip(2), proto::TCP, 80)),
        Decision::Rule(1)
    );
    let mapped: Ipv6Addr = "::ffff:10.0.0.9".parse().unwrap();
    assert_eq!(
        p.decide(none, none, &packet(mapped, v6(2), proto::UDP, 53)),
        Decision::DefaultDeny,
        "an IPv4-mapped address is no IPv4 address"
    );
    // "icmp" is ICMPv6 for IPv6 (and ICMPv6's number means nothing for IPv4).
    assert_eq!(
        p.decide(none, none, &packet(v6(300), v6(2), proto::ICMPV6, 0)),
        Decision::Rule(2)
    );
    let icmp4 = compile(
        "default = \"deny\"\n[[rule]]\nfrom = [\"10.0.0.0/8\"]\nto = [\"any\"]\nproto = \"icmp\"",
        false,
    )
    .unwrap();
    assert_eq!(
        icmp4.decide(none, none, &packet(ip(1), ip(2), proto::ICMP, 0)),
        Decision::Rule(0)
    );
    assert_eq!(
        icmp4.decide(none, none, &packet(ip(1), ip(2), proto::ICMPV6, 0)),
        Decision::DefaultDeny,
        "58 over IPv4 is no ICMP"
    );

    let mut fw = Firewall::new(p, 16);
    let t = Instant::now();
    let (a, b) = ((v6(9), 40000), (v6(2), 22));
    assert_eq!(
        fw.check(t, &tcp6(a, b, SYN, &[]), none, none),
        Verdict::Pass
    );
    assert_eq!(
        fw.check(t, &tcp6(b, a, SYN_ACK, &[]), none, none),
        Verdict::Pass
    );
    // The other way is a new flow, denied.
    let back = ((v6(2), 50000), (v6(9), 22));
    assert_eq!(
        fw.check(t, &tcp6(back.0, back.1, SYN, &[]), none, none),
        Verdict::Deny
    );
    // Past extension headers: hop-by-hop options and a first fragment.
    let hop = (0u8, vec![0u8; 8]);
    let c = (v6(10), 40001);
    let deep = tcp6(c, b, SYN, &[hop.clone(), fragment6(0, true)]);
    assert_eq!(
        flows::parse(&deep),
        Parsed::Flow {
            key: flows::FlowKey {
                proto: proto::TCP,
                src: v6(10).into(),
                dst: v6(2).into(),
                sport: 40001,
                dport: 22
            },
            flags: SYN
        }
    );
    let denied = tcp6(
        (v6(10), 40001),
        (v6(2), 80),
        SYN,
        std::slice::from_ref(&hop),
    );
    assert_eq!(fw.check(t, &denied, none, none), Verdict::Deny);
    // A later fragment passes; a tiny first fragment (cut in its TCP header) and a chain
    // of extension headers too long to follow are denied.
    let later = tcp6(c, (v6(2), 80), SYN, &[fragment6(3, false)]);
    assert_eq!(flows::parse(&later), Parsed::Fragment);
    // (To port 22 from the /120: what a rule allows, were the header whole.)
    let mut tiny = tcp6((v6(11), 40002), b, SYN, &[fragment6(0, true)]);
    tiny.truncate(40 + 8 + 8);
    tiny[4..6].copy_from_slice(&16u16.to_be_bytes());
    let unparsed = fw.stats().unparsed;
    assert_eq!(fw.check(t, &tiny, none, none), Verdict::Deny);
    assert_eq!(fw.stats().unparsed, unparsed + 1);
    // Bytes past the payload length are no part of the packet; a packet shorter than it
    // is malformed.
    let mut padded = tiny.clone();
    padded.extend_from_slice(&tcp6((v6(11), 40002), b, SYN, &[])[40..]);
    assert_eq!(flows::parse(&padded), Parsed::Malformed);
    let whole = tcp6((v6(11), 40002), b, SYN, &[]);
    assert_eq!(flows::parse(&whole[..50]), Parsed::Malformed);
    let chain = |n: usize| -> Vec<(u8, Vec<u8>)> { (0..n).map(|_| (60, vec![0u8; 8])).collect() };
    let seven = tcp6(c, b, SYN, &chain(flows::MAX_EXTENSIONS - 1));
    assert!(matches!(flows::parse(&seven), Parsed::Flow { key, .. } if key.dport == 22));
    let long = tcp6(c, b, SYN, &chain(flows::MAX_EXTENSIONS));
    assert_eq!(flows::parse(&long), Parsed::Malformed);
    // Pings: allowed to the prefix by "icmp", the reply by the flow; an ICMPv6 error
    // passes only for a flow it quotes.
    assert_eq!(
        fw.check(t, &echo6(v6(7), v6(2), false, 5), none, none),
        Verdict::Pass
    );
    assert_eq!(
        fw.check(t, &echo6(v6(2), v6(7), true, 5), none, none),
        Verdict::Pass
    );
    let error_from = |from: Ipv6Addr, quoted: &[u8]| {
        let mut i = vec![1, 4, 0, 0, 0, 0, 0, 0];
        i.extend_from_slice(&quoted[..48]);
        ipv6(from, v6(9), proto::ICMPV6, &[], &i)
    };
    let error = |quoted: &[u8]| error_from(v6(2), quoted);
    assert_eq!(
        fw.check(t, &error(&tcp6(a, b, SYN, &[])), none, none),
        Verdict::Pass
    );
    // From a third member about that flow: forged (RFC 5927).
    assert_eq!(
        fw.check(t, &error_from(v6(3), &tcp6(a, b, SYN, &[])), none, none),
        Verdict::StrayIcmpError
    );
    assert_eq!(
        fw.check(
            t,
            &error(&tcp6((v6(9), 1), (v6(2), 2), SYN, &[])),
            none,
            none
        ),
        Verdict::StrayIcmpError
    );
}

#[test]
fn reject_answers_ipv6_with_a_reset_or_icmpv6_port_unreachable() {
    use super::reject::{answer, MAX_ANSWER_LEN, QUOTE6};
    let mut out = [0u8; MAX_ANSWER_LEN];
    let pseudo = |r: &[u8], next: u8| {
        let mut p = [0u8; 40];
        p[..32].copy_from_slice(&r[8..40]);
        p[32..36].copy_from_slice(&((r.len() - 40) as u32).to_be_bytes());
        p[39] = next;
        p
    };
    let mut syn = tcp6((v6(1), 40000), (v6(2), 22), SYN, &[]);
    syn[44..48].copy_from_slice(&1000u32.to_be_bytes());
    let len = answer(&syn, &mut out).unwrap();
    let r = &out[..len];
    assert_eq!((len, r[0] >> 4, r[6]), (60, 6, 6));
    assert_eq!(u16::from_be_bytes([r[4], r[5]]), 20);
    assert_eq!(
        (&r[8..24], &r[24..40]),
        (&v6(2).octets()[..], &v6(1).octets()[..])
    );
    assert_eq!(u16::from_be_bytes([r[40], r[41]]), 22);
    assert_eq!(u32::from_be_bytes([r[48], r[49], r[50], r[51]]), 1001);
    assert_eq!(r[53], 0x14, "RST|ACK");
    assert!(sums_right(&[&pseudo(r, 6), &r[40..]]));
    // UDP: ICMPv6 type 1 code 4, quoting the datagram's start; the firewall reads it as an
    // error about the datagram's flow.
    let mut u = vec![0u8; 8 + 200];
    u[0..2].copy_from_slice(&5353u16.to_be_bytes());
    u[2..4].copy_from_slice(&53u16.to_be_bytes());
    let datagram = ipv6(v6(1), v6(2), proto::UDP, &[], &u);
    let len = answer(&datagram, &mut out).unwrap();
    let r = &out[..len];
    assert_eq!((len, r[6], r[40], r[41]), (48 + QUOTE6, 58, 1, 4));
    assert_eq!(&r[48..], &datagram[..QUOTE6]);
    assert!(sums_right(&[&pseudo(r, 58), &r[40..]]));
    assert!(matches!(flows::parse(r), Parsed::IcmpError { quoted, .. } if quoted.dport == 53));
    // Nothing answers for a group.
    let group: Ipv6Addr = "ff05::1:3".parse().unwrap();
    let to_group = ipv6(v6(1), group, proto::UDP, &[], &u);
    assert_eq!(answer(&to_group, &mut out), None);
    // Nothing answers a reset, ICMPv6, a packet with extension headers, a multicast or
    // unspecified source, or a short packet.
    let rst = tcp6((v6(1), 1), (v6(2), 2), RST, &[]);
    assert_eq!(answer(&rst, &mut out), None);
    assert_eq!(answer(&echo6(v6(1), v6(2), false, 1), &mut out), None);
    let hop = (0u8, vec![0u8; 8]);
    assert_eq!(
        answer(&tcp6((v6(1), 1), (v6(2), 2), SYN, &[hop]), &mut out),
        None
    );
    let group: Ipv6Addr = "ff05::1".parse().unwrap();
    assert_eq!(
        answer(&tcp6((group, 1), (v6(2), 2), SYN, &[]), &mut out),
        None
    );
    let unspecified = tcp6((Ipv6Addr::UNSPECIFIED, 1), (v6(2), 2), SYN, &[]);
    assert_eq!(answer(&unspecified, &mut out), None);
    assert_eq!(answer(&syn[..50], &mut out), None);
}
