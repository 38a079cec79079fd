#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::disallowed_methods)] // the virtual clock starts from a real instant

use std::time::{Duration, Instant};

use super::*;

const MS: Duration = Duration::from_millis(1);

/// Keeps every link of `b` heard from, as a live path's answers would.
fn hear_all(b: &mut Bond, now: Instant) {
    for i in 0..b.links().count() {
        b.heard(i, now);
    }
}

#[test]
fn flows_are_spread_by_the_links_rates_and_each_stays_on_its_link() {
    let t0 = Instant::now();
    // Two links of 2:1 capacity.
    let mut b = Bond::new(t0, &[200_000_000, 100_000_000]);
    hear_all(&mut b, t0);
    let mut first = Vec::new();
    for flow in 0..900u64 {
        first.push(b.pick(t0, flow, 1000).unwrap());
    }
    let flows: Vec<usize> = b.links().map(|l| l.flows).collect();
    assert_eq!(flows, vec![600, 300], "2:1, as the rates");
    // Every later packet of each flow, interleaved with new flows, takes the link its
    // first one took: no reordering inside a flow.
    for round in 1..10u64 {
        let now = t0 + MS * round as u32;
        hear_all(&mut b, now);
        for flow in 0..900u64 {
            assert_eq!(b.pick(now, flow, 1000), Some(first[flow as usize]));
            b.pick(now, 10_000 * round + flow, 1000);
        }
    }
    assert_eq!(b.moved, 0);
    let l: Vec<LinkStats> = b.links().collect();
    assert_eq!(l[0].flows, 2 * l[1].flows, "{l:?}");
}

#[test]
fn a_silent_link_dies_within_a_second_and_its_flows_move_to_the_other() {
    let t0 = Instant::now();
    let mut b = Bond::new(t0, &[100, 100]);
    hear_all(&mut b, t0);
    let on: Vec<usize> = (0..10u64).map(|f| b.pick(t0, f, 100).unwrap()).collect();
    assert_eq!(on.iter().filter(|&&l| l == 1).count(), 5);
    // Link 1 goes quiet at t0; link 0 keeps answering. The caller probes what is due.
    let mut probes = [0u32; 2];
    let mut now = t0;
    let mut died = None;
    while now < t0 + Duration::from_secs(2) {
        now = b.poll_timeout().unwrap().max(now + MS);
        b.heard(0, now);
        while let Some(l) = b.poll_probe(now) {
            probes[l] += 1;
        }
        if died.is_none() && !b.links().nth(1).unwrap().alive {
            died = Some(now - t0);
        }
    }
    let died = died.expect("link 1 declared dead");
    assert!(died <= Duration::from_secs(1), "dead after {died:?}");
    assert!(
        probes[1] >= 3,
        "the silent link was probed {} times",
        probes[1]
    );
    assert_eq!(probes[0], 0, "a link heard from is not probed");
    // Each of its flows moves at its next packet, and stays moved.
    for f in 0..10u64 {
        assert_eq!(b.pick(now, f, 100), Some(0));
    }
    assert_eq!(b.moved, 5);
    let l: Vec<LinkStats> = b.links().collect();
    assert_eq!((l[0].flows, l[1].flows, l[1].deaths), (10, 0, 1));
    // Heard again: alive for new flows; the moved ones stay where they are.
    b.heard(1, now);
    assert_eq!(b.pick(now, 99, 100), Some(1));
    for f in 0..10u64 {
        assert_eq!(b.pick(now, f, 100), Some(0));
    }
}

#[test]
fn with_every_link_dead_packets_take_the_last_one_heard() {
    let t0 = Instant::now();
    let mut b = Bond::new(t0, &[100, 100]);
    b.heard(1, t0 + 100 * MS);
    let later = t0 + Duration::from_secs(5);
    assert_eq!(b.pick(later, 7, 100), Some(1));
    assert!(b.links().all(|l| !l.alive));
    assert_eq!(Bond::new(t0, &[]).pick(t0, 7, 100), None);
}

#[test]
fn idle_flows_are_forgotten_and_placed_afresh() {
    let t0 = Instant::now();
    let mut b = Bond::new(t0, &[100, 100]);
    hear_all(&mut b, t0);
    for f in 0..4u64 {
        b.pick(t0, f, 100);
    }
    let later = t0 + FLOW_IDLE + MS;
    hear_all(&mut b, later);
    b.pick(later, 100, 100);
    let flows: usize = b.links().map(|l| l.flows).sum();
    assert_eq!(flows, 1, "the four idle flows were forgotten");
}

#[test]
fn with_every_link_dead_a_flow_on_the_last_one_heard_is_not_counted_as_moved() {
    let t0 = Instant::now();
    let mut b = Bond::new(t0, &[100, 100]);
    hear_all(&mut b, t0);
    b.heard(1, t0 + MS);
    assert_eq!(b.pick(t0 + MS, 5, 100), Some(0));
    // Both go silent; link 1 was heard last. The flow moves there once, and stays.
    let later = t0 + Duration::from_secs(2);
    for _ in 0..5 {
        assert_eq!(b.pick(later, 5, 100), Some(1));
    }
    assert_eq!(b.moved, 1);
    let flows: Vec<usize> = b.links().map(|l| l.flows).collect();
    assert_eq!(flows, vec![0, 1]);
}

#[test]
fn announced_links_take_no_flow_until_heard_and_are_probed_at_once() {
    let t0 = Instant::now();
    let mut b = Bond::unconfirmed(t0, &[100, 100]);
    assert!(!b.any_alive());
    assert_eq!(b.poll_probe(t0), Some(0), "probed at once");
    assert_eq!(b.poll_probe(t0), Some(1));
    assert_eq!(b.poll_probe(t0), None, "then once per interval");
    assert_eq!(b.poll_probe(t0 + PROBE_INTERVAL), Some(0));
    // Only the link that answered takes flows.
    b.heard(1, t0 + 10 * MS);
    assert!(b.is_alive(1) && !b.is_alive(0));
    for flow in 0..10 {
        assert_eq!(b.pick(t0 + 20 * MS, flow, 100), Some(1));
    }
    b.heard(0, t0 + 30 * MS);
    let picked: Vec<usize> = (10..20)
        .map(|flow| b.pick(t0 + 40 * MS, flow, 100).unwrap())
        .collect();
    assert!(
        picked.iter().all(|&l| l == 0),
        "new flows even the links out"
    );
    assert_eq!(
        b.links().map(|l| l.deaths).sum::<u64>(),
        0,
        "never alive, never died"
    );
}
