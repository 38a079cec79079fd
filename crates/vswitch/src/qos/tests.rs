#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::disallowed_methods)] // the virtual clock starts from a real instant

use std::time::{Duration, Instant};

use super::*;

const MS: Duration = Duration::from_millis(1);

#[test]
fn a_bucket_passes_its_burst_then_its_rate_and_says_how_long_to_wait() {
    let t0 = Instant::now();
    // 8 Mbit/s = 1,000,000 bytes a second; a burst of 100,000 bytes.
    let mut b = TokenBucket::new(8_000_000, 100_000);
    assert_eq!(b.rate(), 1_000_000);
    let mut sent = 0;
    while b.take(t0, 1000) {
        sent += 1000;
    }
    assert_eq!(sent, 100_000, "the burst, at once");
    assert_eq!(b.wait(t0, 1000), MS, "1000 bytes at 1 MB/s");
    assert!(!b.take(t0 + MS / 2, 1000));
    assert!(b.take(t0 + MS, 1000));
    // Idle for a long time: the bucket holds no more than its burst.
    let later = t0 + Duration::from_secs(10);
    let mut sent = 0;
    while b.take(later, 1000) {
        sent += 1000;
    }
    assert_eq!(sent, 100_000);
}

#[test]
fn rates_are_read_as_tc_reads_them_and_mistakes_say_so() {
    assert_eq!(parse_rate("50M"), Ok(50_000_000));
    assert_eq!(parse_rate("1G"), Ok(1_000_000_000));
    assert_eq!(parse_rate("800k"), Ok(800_000));
    assert_eq!(parse_rate("2.5M"), Ok(2_500_000));
    assert_eq!(parse_rate("2500000"), Ok(2_500_000));
    for bad in ["", "fast", "50Mbit", "1k", "-5M", "5000G"] {
        assert!(parse_rate(bad).is_err(), "{bad}");
    }
}

#[test]
fn flows_are_told_apart_by_addresses_protocol_and_ports() {
    // TCP 10.0.0.1:1000 -> 10.0.0.2:80.
    let mut p = vec![
        0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ];
    p.extend_from_slice(&[0x03, 0xe8, 0, 80, 0, 0, 0, 0]);
    let base = flow_of(&p);
    assert_eq!(flow_of(&p), base);
    let mut other_port = p.clone();
    other_port[21] = 81;
    assert_ne!(flow_of(&other_port), base);
    let mut udp = p.clone();
    udp[9] = 17;
    assert_ne!(flow_of(&udp), base);
    // A later fragment has no ports: its flow is its addresses and protocol.
    let mut frag = p.clone();
    frag[6..8].copy_from_slice(&[0, 10]);
    let mut frag_other = frag.clone();
    frag_other[20] = 9;
    assert_eq!(flow_of(&frag), flow_of(&frag_other));
    for n in 0..p.len() {
        let _ = flow_of(&p[..n]);
    }
}

#[test]
fn a_bucket_smaller_than_a_packet_still_passes_one() {
    let t0 = Instant::now();
    let mut b = TokenBucket::new(1_000_000, 10);
    assert!(b.take(t0, 1500));
}

/// Offered `offered` bytes a second in packets of `len` for `secs` on the virtual clock,
/// through a pacer of `rate` bits a second: the bytes it let out, the largest wait an item
/// had, and the pacer's counters. Checks that every item offered was sent, dropped or
/// still waits.
fn run(rate: u64, offered: u64, len: usize, secs: u64) -> (u64, Duration, PacerStats) {
    let t0 = Instant::now();
    let mut p: Pacer<Instant> = Pacer::new(rate, 16_000, 20 * MS);
    let gap = Duration::from_nanos(len as u64 * 1_000_000_000 / offered);
    let end = t0 + Duration::from_secs(secs);
    let (mut out, mut worst, mut pushed) = (0u64, Duration::ZERO, 0u64);
    let mut next = t0;
    let mut now = t0;
    while now < end {
        // Arrivals up to now, then what the pacer lets go.
        while next <= now {
            pushed += 1;
            match p.push(now, next, len) {
                Paced::Now(_) => out += len as u64,
                Paced::Queued | Paced::Dropped(_) => {}
            }
            next += gap;
        }
        while let Some(arrived) = p.poll(now) {
            out += len as u64;
            worst = worst.max(now - arrived);
        }
        // The next event: an arrival or the pacer's timer.
        now = match p.poll_timeout() {
            Some(t) => t.min(next),
            None => next,
        };
    }
    let stats = p.stats();
    assert_eq!(stats.sent + stats.dropped + p.queued().0 as u64, pushed);
    assert_eq!(stats.sent_bytes, out);
    (out, worst, stats)
}

#[test]
fn under_its_rate_a_pacer_delays_and_drops_nothing() {
    // 40 Mbit/s offered to a 50 Mbit/s cap.
    let (out, worst, stats) = run(50_000_000, 5_000_000, 1250, 2);
    assert_eq!((stats.delayed, stats.dropped), (0, 0));
    assert_eq!(worst, Duration::ZERO);
    assert!((9_900_000..=10_000_000).contains(&out), "{out}");
}

#[test]
fn over_its_rate_a_pacer_sends_at_the_rate_and_never_queues_past_its_delay() {
    // 80 Mbit/s, then 400 Mbit/s, offered to a 50 Mbit/s cap (6.25 MB/s) for 4 s.
    for offered in [10_000_000, 50_000_000] {
        let (out, worst, stats) = run(50_000_000, offered, 1250, 4);
        // The rate, plus the burst and the queue's bytes at most.
        let expected = 6_250_000 * 4;
        assert!(
            out >= expected * 99 / 100 && out <= expected + 16_000 + 125_000,
            "{offered}: {out} of {expected}"
        );
        assert!(worst <= 20 * MS, "{offered}: waited {worst:?}");
        assert!(stats.delayed > 0 && stats.dropped > 0, "{stats:?}");
    }
}

#[test]
fn a_pacer_keeps_order_and_its_queue_bounded() {
    let t0 = Instant::now();
    // 8 Mbit/s: 1 MB/s; the queue holds 20 ms: 20,000 bytes.
    let mut p: Pacer<u32> = Pacer::new(8_000_000, 0, 20 * MS);
    // The 64 KiB minimum burst goes at once.
    let mut i = 0;
    while let Paced::Now(_) = p.push(t0, i, 1000) {
        i += 1;
    }
    assert_eq!(i, 65);
    // That one queued; 19 more fit, the 21st is dropped.
    for k in 1..20 {
        assert_eq!(p.push(t0, i + k, 1000), Paced::Queued);
    }
    assert_eq!(p.push(t0, 999, 1000), Paced::Dropped(999));
    assert_eq!(p.queued(), (20, 20_000));
    // While anything waits, a new item waits behind it even if tokens came.
    let at = p.poll_timeout().unwrap();
    assert_eq!(
        at,
        t0 + 464 * Duration::from_micros(1),
        "65,536 - 65,000 = 536 bytes left"
    );
    assert_eq!(p.poll(at), Some(65));
    let mut got = Vec::new();
    let mut now = at;
    while let Some(t) = p.poll_timeout() {
        now = t;
        got.extend(std::iter::from_fn(|| p.poll(now)));
    }
    assert_eq!(got, (66..85).collect::<Vec<_>>());
    assert!(now - t0 <= 20 * MS, "the last waited {:?}", now - t0);
    let s = p.stats();
    assert_eq!((s.sent, s.delayed, s.dropped), (85, 20, 1));
}

/// Classes of `weights` each offered `offered` bytes a second (or nothing, where 0) in
/// packets of `len` for `secs` on the virtual clock through an uplink of `rate` bits a
/// second: the bytes each class got through.
fn share(rate: u64, weights: &[u64], offered: &[u64], len: usize, secs: u64) -> Vec<u64> {
    let t0 = Instant::now();
    let mut s: Shares<usize> = Shares::new(rate, 16_000, 20 * MS);
    for (c, w) in weights.iter().enumerate() {
        s.set_weight(c, *w);
    }
    let gaps: Vec<Option<Duration>> = offered
        .iter()
        .map(|&o| (o > 0).then(|| Duration::from_nanos(len as u64 * 1_000_000_000 / o)))
        .collect();
    let mut next: Vec<Instant> = vec![t0; weights.len()];
    let end = t0 + Duration::from_secs(secs);
    let mut got = vec![0u64; weights.len()];
    let mut now = t0;
    while now < end {
        for c in 0..weights.len() {
            let Some(gap) = gaps[c] else { continue };
            while next[c] <= now {
                if let Paced::Now(c) = s.push(now, c, 0, c, len) {
                    got[c] += len as u64;
                }
                next[c] += gap;
            }
        }
        while let Some((c, _)) = s.poll(now) {
            got[c] += len as u64;
        }
        let arrival = gaps
            .iter()
            .zip(&next)
            .filter_map(|(g, n)| g.map(|_| *n))
            .min()
            .unwrap_or(end);
        now = s
            .poll_timeout()
            .map_or(arrival, |t| t.min(arrival))
            .max(now + Duration::from_nanos(1));
    }
    got
}

/// What each class (or member) of `weights` `got` adds up to at least 99% of `rate_bytes`,
/// and each got its weight's share of it within 2 points.
fn assert_weighted(got: &[u64], weights: &[u64], rate_bytes: u64) {
    let total: u64 = got.iter().sum();
    assert!(
        total >= rate_bytes * 99 / 100,
        "{weights:?}: {total} of {rate_bytes}"
    );
    let sum: u64 = weights.iter().sum();
    for (c, w) in weights.iter().enumerate() {
        let expected = total * w / sum;
        let off = got[c].abs_diff(expected) as f64 / total as f64;
        assert!(
            off < 0.02,
            "{weights:?}: {c} got {} of {total}, share {expected}",
            got[c]
        );
    }
}

#[test]
fn a_saturated_uplink_is_shared_by_weight() {
    // 80 Mbit/s (10 MB/s) for 4 s; each of three classes offers 8 MB/s.
    let rate_bytes = 10_000_000u64 * 4;
    for weights in [[6u64, 3, 1], [1, 1, 1], [5, 3, 2]] {
        let got = share(80_000_000, &weights, &[8_000_000; 3], 1250, 4);
        assert_weighted(&got, &weights, rate_bytes);
    }
}

#[test]
fn an_idle_class_leaves_its_share_to_the_others_and_a_light_one_gets_all_it_asks() {
    // Weights 6:3:1, the first class idle: the others split 3:1.
    let got = share(80_000_000, &[6, 3, 1], &[0, 8_000_000, 8_000_000], 1250, 4);
    assert_eq!(got[0], 0);
    let total = got[1] + got[2];
    assert!(total >= 40_000_000 * 99 / 100, "{got:?}");
    assert!((got[1] as f64 / got[2] as f64 - 3.0).abs() < 0.1, "{got:?}");
    // The heavy class asks for less than its share (1 MB/s of 6/10 of 10 MB/s): it gets
    // all of it, the others the rest.
    let got = share(
        80_000_000,
        &[6, 3, 1],
        &[1_000_000, 8_000_000, 8_000_000],
        1250,
        4,
    );
    assert!(got[0] >= 4_000_000 * 99 / 100, "{got:?}");
    assert!(got.iter().sum::<u64>() >= 40_000_000 * 99 / 100, "{got:?}");
}

#[test]
fn a_sparse_flow_does_not_wait_behind_a_bulk_flow_of_its_class() {
    let t0 = Instant::now();
    // 8 Mbit/s: 1 MB/s, queues of 20 ms (20,000 bytes).
    let mut s: Shares<(u64, u32)> = Shares::new(8_000_000, 0, 20 * MS);
    // The bulk flow 1 fills the burst, then its class's queue, and keeps pushing.
    let mut n = 0;
    while let Paced::Now(_) = s.push(t0, 0, 1, (1, n), 1000) {
        n += 1;
    }
    for _ in 0..40 {
        n += 1;
        let _ = s.push(t0, 0, 1, (1, n), 1000);
    }
    assert_eq!(s.stats(0).unwrap().queued, 20, "the queue holds 20 ms");
    // A ping of flow 2 arrives: the class is full, so the bulk flow's tail makes room.
    assert_eq!(s.push(t0, 0, 2, (2, 0), 100), Paced::Queued);
    // It goes within two packets of the bulk flow, not after the twenty queued.
    let mut now = t0;
    let mut before = 0;
    loop {
        now = s.poll_timeout().unwrap().max(now);
        match s.poll(now) {
            Some((0, (2, _))) => break,
            Some(_) => before += 1,
            None => {}
        }
    }
    assert!(before <= 2, "{before} bulk packets went first");
    assert!(now - t0 <= 3 * MS, "the ping waited {:?}", now - t0);
}

/// One class through an uplink of `rate` bits a second for `secs` on the virtual clock;
/// members `(weight, flows)` each offer `offered` bytes a second spread over their flows,
/// in packets of 1250 bytes: the bytes each member got through.
fn member_share(rate: u64, members: &[(u64, u64)], offered: u64, secs: u64) -> Vec<u64> {
    let t0 = Instant::now();
    let len = 1250usize;
    let mut s: Shares<usize> = Shares::new(rate, 16_000, 20 * MS);
    let gap = Duration::from_nanos(len as u64 * 1_000_000_000 / offered);
    let mut next = vec![t0; members.len()];
    let mut sent = vec![0u64; members.len()];
    let mut got = vec![0u64; members.len()];
    let end = t0 + Duration::from_secs(secs);
    let mut now = t0;
    while now < end {
        for (m, &(weight, flows)) in members.iter().enumerate() {
            while next[m] <= now {
                let flow = 100 * m as u64 + sent[m] % flows;
                sent[m] += 1;
                if let Paced::Now(m) = s.push_member(now, 0, (m as u64, weight), flow, m, len) {
                    got[m] += len as u64;
                }
                next[m] += gap;
            }
        }
        while let Some((_, m)) = s.poll(now) {
            got[m] += len as u64;
        }
        let arrival = next.iter().min().copied().unwrap_or(end);
        now = s
            .poll_timeout()
            .map_or(arrival, |t| t.min(arrival))
            .max(now + Duration::from_nanos(1));
    }
    got
}

#[test]
fn members_of_a_namespace_share_its_turns_by_weight_not_by_flow_count() {
    // 80 Mbit/s (10 MB/s) for 4 s; each member offers 8 MB/s.
    let total_rate = 40_000_000u64;
    for members in [
        // Weights 3:1:1; the heavy member's traffic in 8 flows, the others' in one each.
        vec![(3u64, 8u64), (1, 1), (1, 1)],
        // Equal weights: the member with 16 flows gets no more than the one with 1.
        vec![(1, 16), (1, 1)],
        vec![(6, 1), (3, 4), (1, 2)],
    ] {
        let got = member_share(80_000_000, &members, 8_000_000, 4);
        let weights: Vec<u64> = members.iter().map(|m| m.0).collect();
        assert_weighted(&got, &weights, total_rate);
    }
}

#[test]
fn a_full_class_drops_from_the_member_furthest_over_its_weight() {
    let t0 = Instant::now();
    // 8 Mbit/s: 1 MB/s, queues of 20 ms (20,000 bytes).
    let mut s: Shares<(u64, u32)> = Shares::new(8_000_000, 0, 20 * MS);
    let mut n = 0;
    while let Paced::Now(_) = s.push_member(t0, 0, (1, 1), 7, (1, n), 1000) {
        n += 1;
    }
    // Member 1 fills the class's queue on its own.
    for _ in 0..30 {
        n += 1;
        let _ = s.push_member(t0, 0, (1, 1), 7, (1, n), 1000);
    }
    assert_eq!(s.stats(0).unwrap().queued, 20);
    // Member 2 (weight 4) queues ten packets: each takes the place of one of member 1's.
    for k in 0..10 {
        assert_eq!(s.push_member(t0, 0, (2, 4), 9, (2, k), 1000), Paced::Queued);
    }
    let stats = s.stats(0).unwrap();
    assert_eq!(stats.queued, 20);
    // Ten each: member 1 (weight 1) is still the furthest over its part, so it loses
    // another, not member 2's newcomer.
    assert_eq!(
        s.push_member(t0, 0, (2, 4), 9, (2, 10), 1000),
        Paced::Queued
    );
    // Draining: member 2 sends four packets for each of member 1's.
    let mut now = t0;
    let mut order = Vec::new();
    while order.len() < 10 {
        now = s.poll_timeout().unwrap().max(now);
        if let Some((_, (m, _))) = s.poll(now) {
            order.push(m);
        }
    }
    let twos = order.iter().filter(|&&m| m == 2).count();
    assert!(
        twos >= 7,
        "member 2 (weight 4) sent {twos} of the first 10: {order:?}"
    );
}

#[test]
fn retain_drops_what_waits_for_a_tunnel_gone_and_keeps_the_order_of_the_rest() {
    let t0 = Instant::now();
    let mut p: Pacer<(u8, u32)> = Pacer::new(8_000_000, 0, 20 * MS);
    let mut n = 0;
    while let Paced::Now(_) = p.push(t0, (1, n), 1000) {
        n += 1;
    }
    for k in 0..6u32 {
        assert_eq!(p.push(t0, ((k % 2) as u8, k), 1000), Paced::Queued);
    }
    p.retain(|(t, _)| *t != 1);
    assert_eq!(p.queued(), (3, 3000));
    let got: Vec<u32> = (1..=20)
        .filter_map(|m| p.poll(t0 + MS * m))
        .map(|(_, k)| k)
        .collect();
    assert_eq!(got, vec![0, 2, 4]);

    let mut s: Shares<(u8, u32)> = Shares::new(8_000_000, 0, 20 * MS);
    let mut n = 0;
    while let Paced::Now(_) = s.push_member(t0, 0, (1, 1), 5, (1, n), 1000) {
        n += 1;
    }
    for k in 0..6u32 {
        let tunnel = (k % 2) as u8;
        let item = (tunnel, k);
        assert_eq!(
            s.push_member(t0, 0, (u64::from(tunnel), 1), u64::from(k), item, 1000),
            Paced::Queued
        );
    }
    s.retain(|(t, _)| *t != 1);
    assert_eq!(s.stats(0).unwrap().queued, 3);
    let mut got = Vec::new();
    let mut now = t0;
    while let Some(at) = s.poll_timeout() {
        now = at.max(now);
        got.extend(std::iter::from_fn(|| s.poll(now)).map(|(_, (_, k))| k));
    }
    got.sort_unstable();
    assert_eq!(got, vec![0, 2, 4]);
}

#[test]
fn a_packet_larger_than_its_class_queue_is_dropped_without_emptying_it() {
    let t0 = Instant::now();
    // 8 Mbit/s: queues of 20 ms are 20,000 bytes, at least 16 KiB.
    let mut s: Shares<u32> = Shares::new(8_000_000, 0, 20 * MS);
    let mut n = 0;
    while let Paced::Now(_) = s.push(t0, 0, 1, n, 1000) {
        n += 1;
    }
    for k in 0..10 {
        assert_eq!(s.push_member(t0, 0, (2, 1), 2, k, 1000), Paced::Queued);
    }
    assert_eq!(
        s.push_member(t0, 0, (3, 1), 3, 99, 30_000),
        Paced::Dropped(99)
    );
    // (The burst's last push was queued: 11 wait.)
    assert_eq!(s.stats(0).unwrap().queued, 11, "the others' packets stay");
    assert!(s.poll_timeout().is_some());
}
