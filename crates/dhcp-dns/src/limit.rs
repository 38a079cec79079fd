//! Per-source rate limits for the virtual DNS server. Inside a namespace a source address
//! cannot be spoofed (the switch holds every sender to its own), so a source over its rate
//! is a real host asking a lot, and it is shaped before anything is lost:
//!
//! 1. under its rate (a token bucket per source, the rate also its burst) a query is
//!    answered at once;
//! 2. over it, the query waits its turn ([`Verdict::Delay`]), at most [`MAX_DELAY`]: a
//!    client that keeps a bounded number of queries outstanding (every stub resolver,
//!    dnsperf) slows to the rate and loses nothing;
//! 3. past that wait, the query gets an empty truncated answer (TC), as response-rate-
//!    limiting resolvers do (BIND's "slip"): a real client asks again over TCP, which is
//!    not limited per query; at most the rate again a second;
//! 4. beyond that too, it is dropped, so a flood costs the agent at most three times the
//!    rate in answers.
//!
//! One noisy host spends its own bucket only, never another's. The table of sources is
//! bounded ([`MAX_SOURCES`]); when full, the source that entered it first is forgotten and
//! starts again with a full bucket.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Sources tracked at once.
pub const MAX_SOURCES: usize = 4096;

/// The longest a query over its source's rate waits for its turn: well under the time a
/// stub resolver waits for an answer before it asks again (1 s at the least, 5 s in
/// glibc).
pub const MAX_DELAY: Duration = Duration::from_millis(500);

/// The default per-source rate, in queries per second (also the burst): far above what a
/// host's stub resolver sends, and above what a busy server (a mail relay, a crawler) asks;
/// a fifth to a tenth of what the agent answers in all, so one host cannot take it all.
pub const DEFAULT_RATE: u32 = 5000;

/// What to do with a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Under the limit: answer it.
    Answer,
    /// Over the limit: answer it at this time (at most [`MAX_DELAY`] from now).
    Delay(Instant),
    /// Over the limit and its wait: an empty truncated answer (TC set).
    Truncate,
    /// Over all of it: no answer.
    Drop,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Queries it may still send at once; below zero, how far its queue reaches.
    tokens: f64,
    /// Truncated answers it may still get.
    slips: f64,
    refilled: Instant,
}

/// Token buckets per source address.
#[derive(Debug)]
pub struct PerSource {
    /// Queries per second per source, also the burst; 0: no limit.
    rate: u32,
    buckets: HashMap<IpAddr, Bucket>,
    /// Sources in the order they entered the table: the first is forgotten first.
    order: VecDeque<IpAddr>,
}

impl PerSource {
    /// Buckets of `rate` queries per second per source (and as many in a burst); `0`
    /// limits nothing.
    pub fn new(rate: u32) -> Self {
        Self {
            rate,
            buckets: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// The rate per source (0: none).
    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// Sources tracked now.
    pub fn sources(&self) -> usize {
        self.buckets.len()
    }

    /// A query from `source` at `now`: answer it, delay it, slip or drop. `can_wait`:
    /// whether there is room to hold a delayed query (else it slips at once).
    pub fn handle_query(
        &mut self,
        now: Instant,
        source: impl Into<IpAddr>,
        can_wait: bool,
    ) -> Verdict {
        let source = source.into();
        if self.rate == 0 {
            return Verdict::Answer;
        }
        let rate = f64::from(self.rate);
        if !self.buckets.contains_key(&source) {
            while self.buckets.len() >= MAX_SOURCES {
                let Some(oldest) = self.order.pop_front() else {
                    break;
                };
                self.buckets.remove(&oldest);
            }
            self.order.push_back(source);
        }
        let bucket = self.buckets.entry(source).or_insert(Bucket {
            tokens: rate,
            slips: rate,
            refilled: now,
        });
        let elapsed = now.saturating_duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(rate);
        bucket.slips = (bucket.slips + elapsed * rate).min(rate);
        bucket.refilled = bucket.refilled.max(now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Verdict::Answer;
        }
        let owed = 1.0 - bucket.tokens;
        let wait = Duration::from_secs_f64(owed / rate);
        if can_wait && wait <= MAX_DELAY {
            bucket.tokens -= 1.0;
            return Verdict::Delay(now + wait);
        }
        if bucket.slips >= 1.0 {
            bucket.slips -= 1.0;
            Verdict::Truncate
        } else {
            Verdict::Drop
        }
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests start the clock
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const NOISY: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 66);
    const QUIET: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 7);

    fn count(verdicts: &[Verdict]) -> (usize, usize, usize, usize) {
        let n = |f: fn(&Verdict) -> bool| verdicts.iter().filter(|v| f(v)).count();
        (
            n(|v| *v == Verdict::Answer),
            n(|v| matches!(v, Verdict::Delay(_))),
            n(|v| *v == Verdict::Truncate),
            n(|v| *v == Verdict::Drop),
        )
    }

    #[test]
    fn over_its_rate_a_source_waits_then_slips_then_is_dropped() {
        let t = Instant::now();
        let mut l = PerSource::new(100);
        let verdicts: Vec<_> = (0..500).map(|_| l.handle_query(t, NOISY, true)).collect();
        // The burst, half a second of queue, the rate again in truncated answers, the rest.
        assert_eq!(count(&verdicts), (100, 50, 100, 250));
        // Each waits its turn, in order, one rate interval apart, the last at MAX_DELAY.
        let delays: Vec<Instant> = verdicts
            .iter()
            .filter_map(|v| match v {
                Verdict::Delay(at) => Some(*at),
                _ => None,
            })
            .collect();
        assert!(delays.windows(2).all(|w| w[0] < w[1]));
        assert!(delays[0] > t && delays[0] <= t + Duration::from_millis(10));
        assert!(*delays.last().unwrap() <= t + MAX_DELAY);
        assert_eq!(verdicts[150], Verdict::Truncate);
        // A second later: the queue drained, and half a second of tokens is back.
        let later = t + Duration::from_secs(1);
        let again: Vec<_> = (0..50)
            .map(|_| l.handle_query(later, NOISY, true))
            .collect();
        assert_eq!(count(&again), (50, 0, 0, 0));
        // No limit at 0.
        let mut free = PerSource::new(0);
        assert!((0..10_000).all(|_| free.handle_query(t, NOISY, true) == Verdict::Answer));
    }

    #[test]
    fn a_client_with_bounded_queries_outstanding_slows_to_the_rate_and_loses_none() {
        // 50 outstanding, each asked again as soon as answered, for 3 s at 200 a second.
        let t = Instant::now();
        let mut l = PerSource::new(200);
        let mut due: Vec<Instant> = vec![t; 50];
        let (mut answered, mut lost) = (0u32, 0u32);
        let end = t + Duration::from_secs(3);
        while let Some((i, &at)) = due.iter().enumerate().min_by_key(|(_, at)| **at) {
            if at >= end {
                break;
            }
            match l.handle_query(at, NOISY, true) {
                Verdict::Answer => {
                    answered += 1;
                    due[i] = at + Duration::from_micros(100);
                }
                Verdict::Delay(when) => {
                    assert!(when - at <= MAX_DELAY);
                    answered += 1;
                    due[i] = when + Duration::from_micros(100);
                }
                Verdict::Truncate | Verdict::Drop => {
                    lost += 1;
                    due[i] = at + Duration::from_secs(1);
                }
            }
        }
        assert_eq!(lost, 0);
        // The burst and then the rate, 200 + 3 s x 200, plus the 50 still waiting their
        // turn at the end (each counted when it was let in).
        assert!((790..=850).contains(&answered), "{answered}");
    }

    #[test]
    fn without_room_to_wait_a_query_slips_at_once() {
        let t = Instant::now();
        let mut l = PerSource::new(10);
        for _ in 0..10 {
            assert_eq!(l.handle_query(t, NOISY, false), Verdict::Answer);
        }
        assert_eq!(l.handle_query(t, NOISY, false), Verdict::Truncate);
        assert!(matches!(l.handle_query(t, NOISY, true), Verdict::Delay(_)));
        assert_eq!(l.handle_query(t, QUIET, false), Verdict::Answer);
    }

    #[test]
    fn the_table_is_bounded_and_forgets_the_oldest_source() {
        let t = Instant::now();
        let mut l = PerSource::new(1);
        assert_eq!(l.handle_query(t, QUIET, false), Verdict::Answer);
        assert_eq!(l.handle_query(t, QUIET, false), Verdict::Truncate);
        for i in 0..MAX_SOURCES as u32 {
            l.handle_query(t, Ipv4Addr::from(0x0a00_0000 + i), false);
        }
        assert_eq!(l.sources(), MAX_SOURCES);
        // QUIET entered first, so it was forgotten: a full bucket again.
        assert_eq!(l.handle_query(t, QUIET, false), Verdict::Answer);
        assert_eq!(l.sources(), MAX_SOURCES);
    }
}
