#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::disallowed_methods)] // tests start the clock

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use super::flows::{self, Firewall, FlowTable, Parsed, Verdict};
use super::*;

fn file(text: &str) -> PolicyFile {
    toml::from_str(text).unwrap()
}

pub(super) fn compile(text: &str, certified: bool) -> Result<Policy, String> {
    Policy::compile(&file(text), certified).map_err(|e| e.to_string())
}

const WEB_DB: &str = r#"
version = 3
default = "deny"
groups = ["web", "db", "ops"]

[[rule]]
from = ["group:web"]
to = ["group:db"]
proto = "tcp"
ports = ["5432", "8000-8100"]

[[rule]]
from = ["group:ops", "10.9.0.0/24"]
to = ["any"]

[[rule]]
from = ["name:backup"]
to = ["group:db"]
proto = "udp"
"#;

pub(super) fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, last)
}

pub(super) fn packet(
    src: impl Into<IpAddr>,
    dst: impl Into<IpAddr>,
    proto: u8,
    dport: u16,
) -> Packet {
    Packet {
        src: src.into(),
        dst: dst.into(),
        proto,
        dport,
    }
}

#[test]
fn rules_match_groups_names_addresses_protocols_and_ports_first_match_wins() {
    let p = compile(WEB_DB, true).unwrap();
    assert_eq!((p.version(), p.rule_count()), (3, 3));
    let web = p.tags(["web"], Some("w1"));
    let db = p.tags(["db", "unknown"], Some("d1"));
    let ops = p.tags(["ops"], None);
    let backup = p.tags([], Some("backup"));
    let nobody = Tags::default();
    let tcp = |port| packet(ip(1), ip(2), proto::TCP, port);
    assert_eq!(p.decide(web, db, &tcp(5432)), Decision::Rule(0));
    assert_eq!(p.decide(web, db, &tcp(8050)), Decision::Rule(0));
    assert_eq!(p.decide(web, db, &tcp(8101)), Decision::DefaultDeny);
    // Not the other way, and not UDP.
    assert_eq!(p.decide(db, web, &tcp(5432)), Decision::DefaultDeny);
    assert_eq!(
        p.decide(web, db, &packet(ip(1), ip(2), proto::UDP, 5432)),
        Decision::DefaultDeny
    );
    // ops reaches anyone on anything; so does an address in 10.9.0.0/24, whatever its tags.
    assert_eq!(
        p.decide(ops, nobody, &packet(ip(1), ip(2), proto::ICMP, 0)),
        Decision::Rule(1)
    );
    assert_eq!(
        p.decide(
            nobody,
            web,
            &packet(Ipv4Addr::new(10, 9, 0, 7), ip(2), 47, 0)
        ),
        Decision::Rule(1)
    );
    assert_eq!(
        p.decide(backup, db, &packet(ip(1), ip(2), proto::UDP, 9)),
        Decision::Rule(2)
    );
    assert_eq!(
        p.decide(nobody, db, &packet(ip(1), ip(2), proto::UDP, 9)),
        Decision::DefaultDeny
    );
    // Default allow: what no rule names passes.
    let open = compile("default = \"allow\"", false).unwrap();
    assert!(open.is_allow_all());
    assert_eq!(
        open.decide(nobody, nobody, &tcp(22)),
        Decision::DefaultAllow
    );
}

#[test]
fn mistakes_are_one_line_errors_naming_the_rule() {
    let cases = [
        (
            "groups = [\"web\"]\n[[rule]]\nfrom = [\"group:wbe\"]\nto = [\"any\"]",
            "policy rule 1: unknown group 'wbe' (not in `groups`)",
        ),
        (
            "[[rule]]\nfrom = [\"any\"]\nto = [\"any\"]\nproto = \"tcp\"\nports = [\"0\"]",
            "policy rule 1: port '0'",
        ),
        (
            "[[rule]]\nfrom = [\"any\"]\nto = [\"any\"]\nproto = \"tcp\"\nports = [\"70000\"]",
            "port '70000'",
        ),
        (
            "[[rule]]\nfrom = [\"any\"]\nto = [\"any\"]\nproto = \"tcp\"\nports = [\"9-3\"]",
            "port '9-3'",
        ),
        (
            "[[rule]]\nfrom = [\"any\"]\nto = [\"any\"]\nproto = \"icmp\"\nports = [\"80\"]",
            "ports need proto",
        ),
        (
            "[[rule]]\nfrom = [\"any\"]\nto = [\"any\"]\nproto = \"sctp\"",
            "proto 'sctp'",
        ),
        ("[[rule]]\nfrom = []\nto = [\"any\"]", "`from` is empty"),
        (
            "[[rule]]\nfrom = [\"10.0.0.0/33\"]\nto = [\"any\"]",
            "'10.0.0.0/33' in `from`",
        ),
        ("groups = [\"web\", \"web\"]", "group 'web' is listed twice"),
        ("groups = [\"Web\"]", "group 'Web' is not a group name"),
    ];
    for (text, expect) in cases {
        let e = compile(text, true).unwrap_err();
        assert!(e.contains(expect), "{text}: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
    let many: Vec<String> = (0..65).map(|i| format!("\"g{i}\"")).collect();
    let e = compile(&format!("groups = [{}]", many.join(",")), true).unwrap_err();
    assert!(e.contains("65 groups, at most 64"), "{e}");
    // Unknown fields are refused, not ignored.
    assert!(toml::from_str::<PolicyFile>("defualt = \"deny\"").is_err());
}

#[test]
fn without_an_authority_only_addresses_count() {
    for text in [
        "groups = [\"web\"]",
        "[[rule]]\nfrom = [\"group:web\"]\nto = [\"any\"]",
        "[[rule]]\nfrom = [\"name:alpha\"]\nto = [\"any\"]",
    ] {
        let e = compile(text, false).unwrap_err();
        assert!(e.contains("needs a namespace with an authority"), "{e}");
    }
    let p = compile(
        "default = \"deny\"\n[[rule]]\nfrom = [\"10.0.0.1\"]\nto = [\"10.0.0.0/24\"]\nproto = \"tcp\"\nports = [\"22\"]",
        false,
    )
    .unwrap();
    let none = Tags::default();
    assert_eq!(
        p.decide(none, none, &packet(ip(1), ip(2), proto::TCP, 22)),
        Decision::Rule(0)
    );
    assert_eq!(
        p.decide(none, none, &packet(ip(3), ip(2), proto::TCP, 22)),
        Decision::DefaultDeny
    );
}

/// IPv4 packet builders.
fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; 20];
    p[0] = 0x45;
    let len = (20 + payload.len()) as u16;
    p[2..4].copy_from_slice(&len.to_be_bytes());
    p[8] = 64;
    p[9] = proto;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    p.extend_from_slice(payload);
    p
}

fn tcp(src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16), flags: u8) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&src.1.to_be_bytes());
    t[2..4].copy_from_slice(&dst.1.to_be_bytes());
    t[12] = 0x50;
    t[13] = flags;
    ipv4(src.0, dst.0, proto::TCP, &t)
}

fn udp(src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16)) -> Vec<u8> {
    let mut u = vec![0u8; 8];
    u[0..2].copy_from_slice(&src.1.to_be_bytes());
    u[2..4].copy_from_slice(&dst.1.to_be_bytes());
    ipv4(src.0, dst.0, proto::UDP, &u)
}

fn echo(src: Ipv4Addr, dst: Ipv4Addr, reply: bool, id: u16) -> Vec<u8> {
    let mut i = vec![if reply { 0 } else { 8 }, 0, 0, 0, 0, 0, 0, 1];
    i[4..6].copy_from_slice(&id.to_be_bytes());
    ipv4(src, dst, proto::ICMP, &i)
}

/// An ICMP error from `from` quoting `quoted`.
fn icmp_error(from: Ipv4Addr, quoted: &[u8]) -> Vec<u8> {
    let mut i = vec![3, 3, 0, 0, 0, 0, 0, 0];
    i.extend_from_slice(&quoted[..28]);
    ipv4(from, quoted_src(quoted), proto::ICMP, &i)
}

fn quoted_src(p: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(p[12], p[13], p[14], p[15])
}

pub(super) const SYN: u8 = 0x02;
pub(super) const SYN_ACK: u8 = 0x12;
const ACK: u8 = 0x10;
const FIN_ACK: u8 = 0x11;
pub(super) const RST: u8 = 0x04;

/// A firewall with the web/db policy, and the tags of a web and a db member.
fn web_db(capacity: usize) -> (Firewall, Tags, Tags) {
    let p = compile(WEB_DB, true).unwrap();
    let (web, db) = (p.tags(["web"], None), p.tags(["db"], None));
    (Firewall::new(p, capacity), web, db)
}

#[test]
fn a_flow_allowed_one_way_lets_its_replies_through_and_nothing_else() {
    let (mut fw, web, db) = (web_db(16).0, web_db(16).1, web_db(16).2);
    let t = Instant::now();
    let (w, d) = ((ip(1), 40000), (ip(2), 5432));
    assert_eq!(fw.check(t, &tcp(w, d, SYN), web, db), Verdict::Pass);
    assert_eq!(fw.check(t, &tcp(d, w, SYN_ACK), db, web), Verdict::Pass);
    assert_eq!(fw.check(t, &tcp(w, d, ACK), web, db), Verdict::Pass);
    // db cannot open a flow of its own to web, even from the same port to another.
    assert_eq!(
        fw.check(t, &tcp(d, (ip(1), 40001), SYN), db, web),
        Verdict::Deny
    );
    assert_eq!(fw.stats().rule_hits, [1, 0, 0]);
    assert_eq!(fw.stats().denied, 1);
    // An ICMP error about the allowed flow passes; about another flow it does not.
    let quoted = tcp(w, d, ACK);
    assert_eq!(
        fw.check(t, &icmp_error(ip(2), &quoted), db, web),
        Verdict::Pass
    );
    let other = tcp(w, (ip(2), 22), ACK);
    assert_eq!(
        fw.check(t, &icmp_error(ip(2), &other), db, web),
        Verdict::StrayIcmpError
    );
    // Nor about the allowed flow from a third member (RFC 5927's blind attacks).
    assert_eq!(
        fw.check(t, &icmp_error(ip(3), &quoted), db, web),
        Verdict::StrayIcmpError
    );
    // Later fragments pass; a packet whose headers cannot be read is denied: a first
    // fragment cut inside its TCP header (RFC 1858) would hide its flags.
    let mut fragment = udp(w, d);
    fragment[7] = 10;
    assert_eq!(flows::parse(&fragment), Parsed::Fragment);
    assert_eq!(fw.check(t, &fragment, db, web), Verdict::Pass);
    assert_eq!(flows::parse(&[0x45, 0, 0]), Parsed::Malformed);
    let mut tiny = tcp((ip(1), 40002), (ip(2), 5432), SYN);
    tiny.truncate(20 + 8);
    tiny[2..4].copy_from_slice(&28u16.to_be_bytes());
    tiny[6] = 0x20; // more fragments, offset 0
    assert_eq!(flows::parse(&tiny), Parsed::Malformed);
    let unparsed = fw.stats().unparsed;
    assert_eq!(
        fw.check(t, &tiny, web, db),
        Verdict::Deny,
        "a port web may open"
    );
    assert_eq!(fw.stats().unparsed, unparsed + 1);
    // Bytes past the total length are no part of the packet.
    let mut padded = tiny.clone();
    padded.extend_from_slice(&tcp((ip(1), 40002), (ip(2), 5432), SYN)[20..]);
    assert_eq!(flows::parse(&padded), Parsed::Malformed);
}

#[test]
fn echo_replies_pass_for_the_pings_that_were_allowed() {
    let p = compile(
        "default = \"deny\"\ngroups = [\"ops\"]\n[[rule]]\nfrom = [\"group:ops\"]\nto = [\"any\"]\nproto = \"icmp\"",
        true,
    )
    .unwrap();
    let ops = p.tags(["ops"], None);
    let other = Tags::default();
    let mut fw = Firewall::new(p, 16);
    let t = Instant::now();
    assert_eq!(
        fw.check(t, &echo(ip(1), ip(2), false, 7), ops, other),
        Verdict::Pass
    );
    assert_eq!(
        fw.check(t, &echo(ip(2), ip(1), true, 7), other, ops),
        Verdict::Pass
    );
    assert_eq!(
        fw.check(t, &echo(ip(2), ip(1), false, 8), other, ops),
        Verdict::Deny
    );
}

#[test]
fn flows_time_out_on_the_virtual_clock_and_a_closed_one_soon() {
    let (mut fw, web, db) = web_db(16);
    let t = Instant::now();
    let (w, d) = ((ip(1), 40000), (ip(2), 5432));
    assert_eq!(fw.check(t, &tcp(w, d, SYN), web, db), Verdict::Pass);
    // Idle less than 12 minutes: the reply still passes.
    let later = t + flows::TCP_TIMEOUT - Duration::from_secs(1);
    assert_eq!(fw.check(later, &tcp(d, w, ACK), db, web), Verdict::Pass);
    // Idle more: it is forgotten, and db's packet is a new flow db may not open.
    let much_later = later + flows::TCP_TIMEOUT + Duration::from_secs(1);
    assert_eq!(
        fw.check(much_later, &tcp(d, w, ACK), db, web),
        Verdict::Deny
    );
    assert_eq!(fw.flows().stats().expired, 1);
    // A FIN makes the flow short-lived.
    let t2 = much_later;
    let w2 = (ip(1), 40002);
    assert_eq!(fw.check(t2, &tcp(w2, d, SYN), web, db), Verdict::Pass);
    assert_eq!(fw.check(t2, &tcp(w2, d, FIN_ACK), web, db), Verdict::Pass);
    let after = t2 + flows::TCP_CLOSING_TIMEOUT + Duration::from_secs(1);
    assert_eq!(fw.check(after, &tcp(d, w2, ACK), db, web), Verdict::Deny);
    // UDP: three minutes. expire() sweeps.
    let p = compile(
        "default = \"deny\"\n[[rule]]\nfrom = [\"any\"]\nto = [\"any\"]\nproto = \"udp\"\nports = [\"53\"]",
        true,
    )
    .unwrap();
    let none = Tags::default();
    let mut fw = Firewall::new(p, 16);
    let (c, s) = ((ip(1), 5353), (ip(2), 53));
    assert_eq!(fw.check(t, &udp(c, s), none, none), Verdict::Pass);
    assert_eq!(fw.flows().len(), 1);
    fw.expire(t + flows::UDP_TIMEOUT - Duration::from_secs(1));
    assert_eq!(fw.flows().len(), 1);
    fw.expire(t + flows::UDP_TIMEOUT + Duration::from_secs(1));
    assert!(fw.flows().is_empty());
    assert_eq!(
        fw.check(t + flows::UDP_TIMEOUT * 2, &udp(s, c), none, none),
        Verdict::Deny
    );
}

#[test]
fn a_full_table_evicts_the_least_recently_used_flow_and_counts_it() {
    let mut table = FlowTable::new(2);
    let t = Instant::now();
    let key = |port: u16| flows::FlowKey {
        proto: proto::UDP,
        src: ip(1).into(),
        dst: ip(2).into(),
        sport: port,
        dport: 53,
    };
    table.open(t, key(1), 0, Decision::Rule(0));
    table.open(t, key(2), 0, Decision::Rule(0));
    // Flow 1 is used again (its reply), so flow 2 is the least recently used.
    assert!(table.touch(t, key(1).reverse(), 0).is_some());
    table.open(t, key(3), 0, Decision::Rule(0));
    assert_eq!(table.len(), 2);
    assert_eq!(table.stats().evicted, 1);
    assert!(table.contains(t, key(1)) && table.contains(t, key(3)));
    assert!(!table.contains(t, key(2)));
}

#[test]
fn reject_answers_tcp_and_udp_but_never_a_reset() {
    let p = compile("default = \"deny\"\nreject = true", true).unwrap();
    let none = Tags::default();
    let mut fw = Firewall::new(p, 16);
    let t = Instant::now();
    let (a, b) = ((ip(1), 1000), (ip(2), 80));
    assert_eq!(fw.check(t, &tcp(a, b, SYN), none, none), Verdict::Reject);
    assert_eq!(fw.check(t, &udp(a, b), none, none), Verdict::Reject);
    assert_eq!(fw.check(t, &tcp(a, b, RST), none, none), Verdict::Deny);
    assert_eq!(
        fw.check(t, &echo(ip(1), ip(2), false, 1), none, none),
        Verdict::Deny
    );
    assert_eq!((fw.stats().denied, fw.stats().rejected), (4, 2));
}

#[test]
fn a_new_policy_keeps_the_flows_it_allows_and_ends_the_others() {
    let (mut fw, web, db) = web_db(16);
    let t = Instant::now();
    let (w, d) = ((ip(1), 40000), (ip(2), 5432));
    let (w2, d2) = ((ip(1), 40001), (ip(2), 8080));
    assert_eq!(fw.check(t, &tcp(w, d, SYN), web, db), Verdict::Pass);
    assert_eq!(fw.check(t, &tcp(w2, d2, SYN), web, db), Verdict::Pass);
    // Version 4 allows 5432 only.
    let next = compile(
        &WEB_DB
            .replace("version = 3", "version = 4")
            .replace(", \"8000-8100\"", ""),
        true,
    )
    .unwrap();
    let tags = |a: IpAddr| {
        if a == IpAddr::V4(ip(1)) {
            next.tags(["web"], None)
        } else {
            next.tags(["db"], None)
        }
    };
    fw.replace(next.clone(), tags);
    assert_eq!(fw.policy().version(), 4);
    assert_eq!(fw.stats().flows_revoked, 1);
    assert_eq!(fw.check(t, &tcp(d, w, ACK), db, web), Verdict::Pass);
    assert_eq!(fw.check(t, &tcp(d2, w2, ACK), db, web), Verdict::Deny);
    assert_eq!(fw.check(t, &tcp(w2, d2, ACK), web, db), Verdict::Deny);
}

#[test]
fn no_policy_passes_everything_unparsed() {
    let mut fw = Firewall::new(Policy::allow_all(), 16);
    let t = Instant::now();
    assert!(fw.is_open());
    assert_eq!(
        fw.check(t, &[1, 2, 3], Tags::default(), Tags::default()),
        Verdict::Pass
    );
    assert!(fw.flows().is_empty());
}

/// Whether the ones'-complement sum over `parts` checks out (0xffff).
pub(super) fn sums_right(parts: &[&[u8]]) -> bool {
    parts.iter().fold(0u16, |s, p| crate::udp::checksum(s, p)) == 0xffff
}

#[test]
fn reject_answers_a_syn_with_a_reset_and_udp_with_port_unreachable() {
    use super::reject::{answer, MAX_ANSWER_LEN};
    let mut out = [0u8; MAX_ANSWER_LEN];
    // A SYN, seq 1000: RST|ACK, ack 1001, from the server back to the client.
    let mut syn = tcp((ip(1), 40000), (ip(2), 22), SYN);
    syn[24..28].copy_from_slice(&1000u32.to_be_bytes());
    let len = answer(&syn, &mut out).unwrap();
    let r = &out[..len];
    assert_eq!(len, 40);
    assert_eq!(
        (&r[12..16], &r[16..20]),
        (&ip(2).octets()[..], &ip(1).octets()[..])
    );
    assert_eq!(
        (
            u16::from_be_bytes([r[20], r[21]]),
            u16::from_be_bytes([r[22], r[23]])
        ),
        (22, 40000)
    );
    assert_eq!(u32::from_be_bytes([r[28], r[29], r[30], r[31]]), 1001);
    assert_eq!(r[33], 0x14);
    assert!(sums_right(&[&r[..20]]));
    let mut pseudo = [0u8; 12];
    pseudo[..4].copy_from_slice(&r[12..16]);
    pseudo[4..8].copy_from_slice(&r[16..20]);
    pseudo[9] = 6;
    pseudo[11] = 20;
    assert!(sums_right(&[&pseudo, &r[20..40]]));
    // A segment with ACK: the reset takes its ack number as its sequence number.
    let mut ack = tcp((ip(1), 40000), (ip(2), 22), ACK);
    ack[28..32].copy_from_slice(&77u32.to_be_bytes());
    let len = answer(&ack, &mut out).unwrap();
    assert_eq!(u32::from_be_bytes([out[24], out[25], out[26], out[27]]), 77);
    assert_eq!(out[33], 0x04);
    assert_eq!(len, 40);
    // UDP: ICMP type 3 code 3 quoting the header and 8 bytes.
    let datagram = udp((ip(1), 5353), (ip(2), 53));
    let len = answer(&datagram, &mut out).unwrap();
    let r = &out[..len];
    assert_eq!((r[9], r[20], r[21]), (1, 3, 3));
    assert_eq!(&r[28..], &datagram[..28]);
    assert!(sums_right(&[&r[..20]]) && sums_right(&[&r[20..]]));
    assert_eq!(
        flows::parse(r),
        Parsed::IcmpError {
            quoted: match flows::parse(&datagram) {
                Parsed::Flow { key, .. } => key,
                other => panic!("{other:?}"),
            },
            from: ip(2).into(),
            to: ip(1).into(),
        }
    );
    // Nothing answers a reset, ICMP, a later fragment, a broadcast source or junk.
    assert_eq!(answer(&tcp((ip(1), 1), (ip(2), 2), RST), &mut out), None);
    assert_eq!(answer(&echo(ip(1), ip(2), false, 1), &mut out), None);
    let mut fragment = udp((ip(1), 1), (ip(2), 2));
    fragment[7] = 1;
    assert_eq!(answer(&fragment, &mut out), None);
    let broadcast = udp((Ipv4Addr::BROADCAST, 68), (ip(2), 67));
    assert_eq!(answer(&broadcast, &mut out), None);
    assert_eq!(answer(&[0x45, 0, 0], &mut out), None);
    assert_eq!(answer(&syn, &mut [0u8; 10]), None);
}

#[test]
fn links_name_a_namespace_a_gateway_and_what_it_reaches_and_mistakes_are_one_line() {
    let p = compile(
        "[[link]]\nnamespace = \"data\"\ngateway = \"10.1.0.250\"\nremote = [\"10.2.0.0/24\", \"10.3.0.9\"]\n",
        false,
    )
    .unwrap();
    let link = p.link_to("data").unwrap();
    assert_eq!(link.gateway, Ipv4Addr::new(10, 1, 0, 250));
    assert!(link.reaches(Ipv4Addr::new(10, 2, 0, 7)) && link.reaches(Ipv4Addr::new(10, 3, 0, 9)));
    assert!(!link.reaches(Ipv4Addr::new(10, 3, 0, 10)));
    assert_eq!((p.links().len(), p.link_to("shop")), (1, None));
    // A link is consent, not a rule: the default still decides traffic.
    assert!(p.is_allow_all());

    let link = |body: &str| compile(&format!("[[link]]\n{body}"), false).unwrap_err();
    for (body, expect) in [
        (
            "namespace = \"Data\"\ngateway = \"10.1.0.1\"\nremote = [\"10.2.0.0/24\"]\n",
            "policy link 1: namespace 'Data' is not a namespace name",
        ),
        (
            "namespace = \"data\"\ngateway = \"gw\"\nremote = [\"10.2.0.0/24\"]\n",
            "policy link 1: gateway 'gw' is not an IPv4 address",
        ),
        (
            "namespace = \"data\"\ngateway = \"10.1.0.1\"\nremote = []\n",
            "policy link 1: `remote` names 1 to 16",
        ),
        (
            "namespace = \"data\"\ngateway = \"10.1.0.1\"\nremote = [\"10.2.0.0/33\"]\n",
            "policy link 1: remote '10.2.0.0/33': an address or a CIDR",
        ),
        (
            "namespace = \"data\"\ngateway = \"10.1.0.1\"\nremote = [\"10.0.0.0/8\"]\n",
            "holds the gateway 10.1.0.1",
        ),
        (
            "namespace = \"data\"\ngateway = \"10.1.0.1\"\nremote = [\"224.0.0.0/4\"]\n",
            "remote 224.0.0.0/4 is not unicast",
        ),
        (
            "namespace = \"data\"\ngateway = \"10.1.0.1\"\nremote = [\"10.2.0.0/24\"]\n\
             [[link]]\nnamespace = \"data\"\ngateway = \"10.1.0.2\"\nremote = [\"10.3.0.0/24\"]\n",
            "policy link 2: namespace 'data' is linked twice",
        ),
        (
            "namespace = \"data\"\ngateway = \"10.1.0.1\"\nremote = [\"10.2.0.0/24\"]\n\
             [[link]]\nnamespace = \"logs\"\ngateway = \"10.1.0.2\"\nremote = [\"10.2.0.128/25\"]\n",
            "policy link 2: remote overlaps 10.2.0.0/24",
        ),
        (
            "namespace = \"data\"\ngateway = \"10.1.0.1\"\nremote = [\"10.2.0.0/24\"]\nvia = 1\n",
            "unknown field `via`",
        ),
    ] {
        let e = if body.contains("via") {
            toml::from_str::<PolicyFile>(&format!("[[link]]\n{body}"))
                .unwrap_err()
                .to_string()
        } else {
            link(body)
        };
        assert!(e.contains(expect), "{body}: {e}");
    }
}

const FRAMES: &str = r#"
default = "deny"
groups = ["plc", "scada"]

# the controllers talk their own protocol to the supervisors, and IP with ARP to anyone
[[rule]]
from = ["group:plc"]
to = ["group:scada"]
ethertypes = ["0x88b5", "lldp"]

[[rule]]
from = ["any"]
to = ["any"]
ethertypes = ["ipv4", "ARP"]

# operators may send anything
[[rule]]
from = ["name:ops"]
to = ["any"]
"#;

#[test]
fn a_layer2_policy_decides_frames_by_member_and_ethertype() {
    let p = compile(FRAMES, true).unwrap();
    p.check_layer(true).unwrap();
    let plc = p.tags(["plc"], None);
    let scada = p.tags(["scada"], None);
    let ops = p.tags([], Some("ops"));
    let nobody = Tags::default();
    assert_eq!(p.decide_frame(plc, scada, 0x88b5), Decision::Rule(0));
    assert_eq!(p.decide_frame(plc, scada, 0x88cc), Decision::Rule(0));
    assert_eq!(
        p.decide_frame(scada, plc, 0x88b5),
        Decision::DefaultDeny,
        "one way only"
    );
    assert_eq!(p.decide_frame(nobody, plc, 0x0806), Decision::Rule(1));
    assert_eq!(p.decide_frame(nobody, plc, 0x86dd), Decision::DefaultDeny);
    assert_eq!(p.decide_frame(ops, nobody, 0x86dd), Decision::Rule(2));
    // A rule with EtherTypes says nothing about IP flows, which have none.
    let packet = packet(ip(1), ip(2), proto::TCP, 80);
    assert_eq!(p.decide(plc, scada, &packet), Decision::DefaultDeny);
    assert_eq!(p.decide(ops, nobody, &packet), Decision::Rule(2));
    // Counted as packets are.
    let mut firewall = Firewall::new(p, 16);
    assert!(firewall.check_frame(0x88b5, plc, scada));
    assert!(!firewall.check_frame(0x88b5, scada, plc));
    assert_eq!(firewall.stats().rule_hits, vec![1, 0, 0]);
    assert_eq!(firewall.stats().denied, 1);
    // No policy: every frame passes.
    assert!(Firewall::new(Policy::allow_all(), 16).check_frame(0x1234, nobody, nobody));
}

#[test]
fn frame_rules_and_flow_rules_are_kept_to_their_namespaces() {
    let err = |text: &str| compile(text, false).unwrap_err();
    assert_eq!(
        err("[[rule]]\nfrom = [\"any\"]\nto = [\"any\"]\nethertypes = [\"ipx\"]\n"),
        "policy rule 1: ethertype 'ipx': ipv4, arp, rarp, ipv6, lldp, llc (802.3 frames) or a hex EtherType from 0x0600 (as 0x88b5)"
    );
    assert!(err(
        "[[rule]]\nfrom = [\"any\"]\nto = [\"any\"]\nproto = \"tcp\"\nethertypes = [\"ipv4\"]\n"
    )
    .contains("`ethertypes` decides a layer-2 namespace's frames"));
    assert!(
        err("[[rule]]\nfrom = [\"10.0.0.0/8\"]\nto = [\"any\"]\nethertypes = [\"ipv4\"]\n")
            .contains("have no proto, ports or addresses")
    );
    // Each compiles; the namespace decides which fits.
    let frames = compile(
        "[[rule]]\nfrom = [\"any\"]\nto = [\"any\"]\nethertypes = [\"arp\"]\n",
        false,
    )
    .unwrap();
    assert!(frames.check_layer(true).is_ok());
    assert_eq!(
        frames.check_layer(false).unwrap_err().to_string(),
        "policy rule 1: `ethertypes` needs a layer-2 namespace (layer = 2)"
    );
    let flows = compile(
        "[[rule]]\nfrom = [\"any\"]\nto = [\"any\"]\nproto = \"icmp\"\n",
        false,
    )
    .unwrap();
    assert!(flows.check_layer(false).is_ok());
    assert!(flows
        .check_layer(true)
        .unwrap_err()
        .to_string()
        .contains("not proto, ports or addresses"));
    // A rule naming only members fits both.
    let members = compile(
        "default = \"deny\"\n[[rule]]\nfrom = [\"any\"]\nto = [\"any\"]\n",
        false,
    )
    .unwrap();
    assert!(members.check_layer(true).is_ok() && members.check_layer(false).is_ok());
}
