#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::disallowed_methods)] // the virtual clock starts from a real instant

use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::*;
use crate::qos::MAX_DELAY;

const MS: Duration = Duration::from_millis(1);

fn cap(members: &[&str], hosts: &[&str], egress: Option<&str>, ingress: Option<&str>) -> CapFile {
    CapFile {
        members: members.iter().map(|s| s.to_string()).collect(),
        hosts: hosts.iter().map(|s| s.to_string()).collect(),
        egress: egress.map(str::to_owned),
        ingress: ingress.map(str::to_owned),
        ..CapFile::default()
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn mistakes_in_a_cap_say_which_cap_and_what() {
    let cases = [
        (
            cap(&["any"], &[], None, None),
            "cap 1: needs an egress or an ingress rate",
        ),
        (
            cap(&["group:web"], &[], Some("5M"), None),
            "cap 1: 'group:web' needs a namespace with an authority",
        ),
        (
            cap(&["name:db1"], &[], Some("5M"), None),
            "cap 1: 'name:db1' needs a namespace with an authority",
        ),
        (
            cap(&["10.0.0.300"], &[], Some("5M"), None),
            "cap 1: member '10.0.0.300'",
        ),
        (cap(&[], &["lan"], Some("5M"), None), "cap 1: host 'lan'"),
        (cap(&[], &[], Some("fast"), None), "cap 1: rate 'fast'"),
        (
            CapFile {
                per: Some("flow".into()),
                ..cap(&[], &[], Some("5M"), None)
            },
            "cap 1: per 'flow': member, host or all",
        ),
    ];
    for (file, want) in cases {
        let e = Caps::compile(&[file], false).unwrap_err();
        assert!(e.starts_with(want), "{e:?} should start with {want:?}");
    }
    let many = vec![cap(&[], &[], Some("1M"), None); MAX_CAPS + 1];
    assert!(Caps::compile(&many, false)
        .unwrap_err()
        .contains("at most 64"));
    // With an authority, groups and names are fine.
    assert!(Caps::compile(
        &[cap(&["group:web", "name:db1"], &[], Some("5M"), None)],
        true
    )
    .is_ok());
}

#[test]
fn the_first_cap_with_a_rate_for_the_direction_picks_a_packet() {
    let caps = Caps::compile(
        &[
            // 0: guests, egress only.
            cap(&["group:guests"], &[], Some("10M"), None),
            // 1: a remote LAN by address, both ways.
            cap(&["192.168.5.0/24"], &[], Some("20M"), Some("20M")),
            // 2: one local LAN host, ingress only, whoever the member.
            cap(&[], &["10.1.0.7"], None, Some("5M")),
            // 3: everyone else, both ways.
            cap(&["any"], &[], Some("100M"), Some("100M")),
        ],
        true,
    )
    .unwrap();
    assert!(caps.names_certificates());
    let guest = caps.member_mask(&["guests", "x"], Some("g1"));
    let other = caps.member_mask(&["web"], Some("w1"));
    // Cap 2 names no member (any member, to its host); cap 1's addresses are per packet.
    assert_eq!(guest, 0b1101);
    assert_eq!(other, 0b1100);
    let (me, lan_host) = (ip("10.1.0.2"), ip("10.1.0.7"));
    // A guest: egress by its group, ingress by the catch-all (cap 0 has no ingress).
    assert_eq!(caps.find(guest, ip("10.1.0.9"), me, false), Some(0));
    assert_eq!(caps.find(guest, ip("10.1.0.9"), me, true), Some(3));
    // Anyone to or from the remote LAN.
    assert_eq!(caps.find(other, ip("192.168.5.4"), me, false), Some(1));
    assert_eq!(caps.find(other, ip("192.168.5.4"), me, true), Some(1));
    // The local host's ingress, before the catch-all; its egress is the catch-all's.
    assert_eq!(caps.find(other, ip("10.1.0.9"), lan_host, true), Some(2));
    assert_eq!(caps.find(other, ip("10.1.0.9"), lan_host, false), Some(3));
    // Weights: only caps that give one.
    assert!(!caps.weighs());
    let weighted = Caps::compile(
        &[
            cap(&["group:guests"], &[], Some("10M"), None),
            CapFile {
                weight: Some(5),
                ..cap(&["group:gold"], &[], None, None)
            },
        ],
        true,
    )
    .unwrap();
    assert!(weighted.weighs());
    let gold = weighted.member_mask(&["gold"], None);
    assert_eq!(weighted.find_weight(gold, ip("10.1.0.9"), me), Some(1));
    assert_eq!(
        weighted.find(gold, ip("10.1.0.9"), me, false),
        None,
        "a weight is no rate"
    );
    let guest = weighted.member_mask(&["guests"], None);
    assert_eq!(weighted.find_weight(guest, ip("10.1.0.9"), me), None);
    // A member no cap names.
    let only_guests =
        Caps::compile(&[cap(&["group:guests"], &[], Some("1M"), None)], true).unwrap();
    let m = only_guests.member_mask(&["web"], None);
    assert_eq!(only_guests.find(m, ip("10.1.0.9"), me, false), None);
}

#[test]
fn ipv6_packets_are_picked_by_ipv6_addresses_and_never_by_ipv4_ones() {
    let caps = Caps::compile(
        &[
            // 0: the remote IPv6 LAN, out.
            cap(&["fd00:5::/64"], &[], Some("10M"), None),
            // 1: this side's IPv6 host, in.
            cap(&[], &["fd00:1::7"], None, Some("5M")),
            // 2: an IPv4 LAN, both ways.
            cap(&["10.1.0.0/24"], &["10.1.0.0/24"], Some("1M"), Some("1M")),
        ],
        false,
    )
    .unwrap();
    // Cap 1 names no member: every member's mask has it.
    let m = caps.member_mask(&[], None);
    assert_eq!(m, 0b010);
    let (me6, host6) = (ip("fd00:1::2"), ip("fd00:1::7"));
    assert_eq!(caps.find(m, ip("fd00:5::9"), me6, false), Some(0));
    assert_eq!(caps.find(m, ip("fd00:5::9"), me6, true), None);
    assert_eq!(caps.find(m, ip("fd00:9::9"), host6, true), Some(1));
    assert_eq!(caps.find(m, ip("fd00:9::9"), host6, false), None);
    // An IPv4-mapped IPv6 address is no IPv4 address of the LAN.
    assert_eq!(
        caps.find(m, ip("::ffff:10.1.0.9"), ip("::ffff:10.1.0.2"), false),
        None
    );
    assert_eq!(caps.find(m, ip("10.1.0.9"), ip("10.1.0.2"), false), Some(2));
    assert_eq!(caps.caps()[1].picks, "hosts fd00:1::7");
    // Those naming IPv6 are told apart (a namespace without IPv6 warns of them).
    assert_eq!(
        caps.naming_ipv6(),
        vec![(1, "members fd00:5::/64"), (2, "hosts fd00:1::7")]
    );
    assert!(Caps::compile(&[cap(&["fd00::/129"], &[], Some("1M"), None)], false).is_err());
}

#[test]
fn per_defaults_to_the_member_or_the_host_and_burst_to_ten_milliseconds() {
    let caps = Caps::compile(
        &[
            cap(&["10.0.0.0/24"], &[], Some("80M"), None),
            cap(&[], &["10.0.0.0/24"], Some("80M"), None),
            CapFile {
                per: Some("all".into()),
                burst: Some(200_000),
                ..cap(&[], &[], Some("80M"), None)
            },
        ],
        false,
    )
    .unwrap();
    let c = caps.caps();
    assert_eq!(
        (c[0].per, c[1].per, c[2].per),
        (Per::Member, Per::Host, Per::All)
    );
    assert_eq!(c[0].burst(80_000_000), 100_000, "10 ms at 80 Mbit/s");
    assert_eq!(c[0].burst(8_000_000), 65_536, "at least 64 KiB");
    assert_eq!(c[2].burst(80_000_000), 200_000);
    assert_eq!(c[0].picks, "members 10.0.0.0/24");
    assert_eq!(c[1].picks, "hosts 10.0.0.0/24");
    assert_eq!(c[2].picks, "any");
}

#[test]
fn each_key_is_held_to_its_rate_and_does_not_slow_another() {
    let t0 = Instant::now();
    let mut k: Keyed<&'static str, (&'static str, usize)> = Keyed::new(MAX_KEYS, 1, |_| 0);
    let make = || Pacer::new(8_000_000, 0, MAX_DELAY);
    // Each millisecond "a" offers two 1000-byte packets (16 Mbit/s), and every other
    // millisecond "b" one (4 Mbit/s), against caps of 8 Mbit/s each: over 2 s a is held to
    // its rate, and b, under its own, loses nothing and waits for nothing.
    let (mut a, mut b) = (0, 0);
    let mut count = |(key, len): (&str, usize)| {
        if key == "a" {
            a += len
        } else {
            b += len
        }
    };
    for t in 0..2000 {
        let now = t0 + MS * t;
        while let Some(item) = k.poll(now) {
            count(item);
        }
        for key in ["a", "a", "b"] {
            if key == "b" && t % 2 == 1 {
                continue;
            }
            if k.send_now(now, &key, 1000, make) {
                count((key, 1000));
            } else if let Paced::Now(item) = k.push(now, key, (key, 1000), 1000) {
                count(item);
            }
        }
    }
    // 2 s at 1 MB/s plus the 64 KiB burst, give or take a packet.
    let want = 2_000_000 + 65_536;
    assert!(a.abs_diff(want) <= 2_000, "a sent {a}, want about {want}");
    assert_eq!(b, 1_000_000, "b, under its cap, lost nothing");
    let b_pacer = k.pacers().find(|(key, _)| **key == "b").unwrap().1;
    assert_eq!(b_pacer.stats().delayed, 0, "b never waited behind a");
    let totals = k.totals(0);
    assert!(totals.dropped > 0 && totals.delayed > 0, "{totals:?}");
    assert_eq!(totals.sent_bytes as usize, a + b);
}

#[test]
fn a_queued_key_says_when_it_may_go_and_keeps_its_order() {
    let t0 = Instant::now();
    let mut k: Keyed<u8, u32> = Keyed::new(MAX_KEYS, 1, |_| 0);
    let make = || Pacer::new(8_000_000, 65_536, MAX_DELAY);
    // Drain the burst.
    while k.send_now(t0, &1, 1000, make) {}
    assert_eq!(k.poll_timeout(), None);
    for n in 0..3 {
        assert_eq!(k.push(t0, 1, n, 1000), Paced::Queued);
    }
    let at = k.poll_timeout().expect("a deadline");
    assert!(at > t0 && at <= t0 + MS, "{at:?}");
    assert_eq!(k.poll(t0), None);
    let got: Vec<u32> = (1..=3).filter_map(|m| k.poll(t0 + MS * m)).collect();
    assert_eq!(got, vec![0, 1, 2]);
    assert_eq!(k.poll_timeout(), None);
}

#[test]
fn idle_keys_are_forgotten_and_a_full_table_refuses_new_ones() {
    let t0 = Instant::now();
    let mut k: Keyed<u32, ()> = Keyed::new(2, 1, |_| 0);
    let make = || Pacer::new(8_000_000, 65_536, MAX_DELAY);
    assert!(
        k.send_now(t0, &1, 65_536, make),
        "the first packet of a full bucket"
    );
    assert!(k.send_now(t0, &2, 1000, make));
    // Both buckets are below full: a third key finds no room.
    assert!(!k.send_now(t0, &3, 1000, make));
    assert_eq!(k.push(t0, 3, (), 1000), Paced::Dropped(()));
    assert_eq!((k.totals(0).dropped, k.totals(0).dropped_bytes), (1, 1000));
    // 100 ms later both are full again: forgotten, and 3 gets a pacer; what 1 and 2 had
    // sent stays in the totals.
    let later = t0 + 100 * MS;
    assert!(k.send_now(later, &3, 1000, make));
    assert_eq!(k.pacers().count(), 1);
    assert_eq!(k.totals(0).sent_bytes, 65_536 + 2 * 1000);
}

#[test]
fn forgetting_a_key_drops_its_queue_and_what_others_held_for_it() {
    let t0 = Instant::now();
    let mut k: Keyed<u8, (u8, u32)> = Keyed::new(MAX_KEYS, 1, |_| 0);
    let make = || Pacer::new(8_000_000, 65_536, MAX_DELAY);
    for key in [1u8, 2] {
        while k.send_now(t0, &key, 1000, make) {}
    }
    // Key 1 holds two items for tunnel 7; key 2 holds one for 7 and one for 8.
    for item in [(7, 0), (7, 1)] {
        assert_eq!(k.push(t0, 1, item, 1000), Paced::Queued);
    }
    for item in [(7, 2), (8, 3)] {
        assert_eq!(k.push(t0, 2, item, 1000), Paced::Queued);
    }
    let dropped_before = k.totals(0).dropped;
    // Tunnel 7 is gone: key 1 (its own) goes, and key 2 keeps only what is for 8.
    k.forget(|key| *key == 1, |item| item.0 != 7);
    assert_eq!(k.pacers().count(), 1);
    assert_eq!(k.totals(0).dropped, dropped_before + 3);
    let later = t0 + Duration::from_secs(1);
    assert_eq!(k.poll(later), Some((8, 3)));
    assert_eq!(k.poll(later), None);
    assert_eq!(k.poll_timeout(), None);
}

#[test]
fn a_full_table_is_swept_at_most_every_hundred_milliseconds() {
    let t0 = Instant::now();
    let mut k: Keyed<u32, ()> = Keyed::new(1, 1, |_| 0);
    let make = || Pacer::new(8_000_000, 65_536, MAX_DELAY);
    assert!(k.send_now(t0, &1, 65_536, make));
    // Key 1's bucket is empty: no room for key 2, and a sweep ran.
    assert!(!k.send_now(t0, &2, 1000, make));
    // By 70 ms key 1 is full again, but the last forced sweep was under 100 ms ago.
    assert!(!k.send_now(t0 + 70 * MS, &2, 1000, make));
    assert!(k.send_now(t0 + 100 * MS, &2, 1000, make));
}
