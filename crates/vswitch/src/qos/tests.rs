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
