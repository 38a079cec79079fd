//! Per-source rate limits for the virtual DNS server, as response-rate-limiting resolvers
//! apply them (BIND's RRL and its "slip"): each source address has a token bucket; over
//! it, every [`SLIP`]th query gets an empty truncated answer, so a real client retries over
//! TCP (where a handshake proves its address), and the rest are dropped. One noisy host
//! spends its own bucket only, never another's.
//!
//! The table of sources is bounded ([`MAX_SOURCES`]); when full, the source that entered it
//! first is forgotten. A forgotten source starts again with a full bucket, which only
//! matters to a flood from thousands of addresses at once, and those the vswitch already
//! holds to the namespace subnet.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::time::Instant;

/// Sources tracked at once.
pub const MAX_SOURCES: usize = 4096;

/// Over the limit, one query in this many is answered truncated; the others are dropped.
/// 2 is BIND's default slip: a client retrying over UDP gets the hint within two tries.
pub const SLIP: u32 = 2;

/// The default per-source rate, in queries per second (also the burst): far above what a
/// host's stub resolver sends, low enough that one host cannot take the agent's whole
/// capacity (tens of thousands a second).
pub const DEFAULT_RATE: u32 = 1000;

/// What to do with a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Under the limit: answer it.
    Answer,
    /// Over the limit, its turn to slip: an empty truncated answer (TC set).
    Truncate,
    /// Over the limit: no answer.
    Drop,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    refilled: Instant,
    /// Queries over the limit so far (which of them slip).
    over: u32,
}

/// Token buckets per source address.
#[derive(Debug)]
pub struct PerSource {
    /// Queries per second per source, also the burst; 0: no limit.
    rate: u32,
    buckets: HashMap<Ipv4Addr, Bucket>,
    /// Sources in the order they entered the table: the first is forgotten first.
    order: VecDeque<Ipv4Addr>,
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

    /// A query from `source` at `now`: answer it, slip or drop.
    pub fn handle_query(&mut self, now: Instant, source: Ipv4Addr) -> Verdict {
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
            refilled: now,
            over: 0,
        });
        let elapsed = now.saturating_duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(rate);
        bucket.refilled = bucket.refilled.max(now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Verdict::Answer;
        }
        let slip = bucket.over.is_multiple_of(SLIP);
        bucket.over = bucket.over.wrapping_add(1);
        if slip {
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
    use std::time::Duration;

    const NOISY: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 66);
    const QUIET: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 7);

    #[test]
    fn over_its_rate_a_source_gets_every_second_query_truncated_and_the_rest_dropped() {
        let t = Instant::now();
        let mut l = PerSource::new(100);
        let verdicts: Vec<_> = (0..300).map(|_| l.handle_query(t, NOISY)).collect();
        let count = |v| verdicts.iter().filter(|&&x| x == v).count();
        assert_eq!(
            (
                count(Verdict::Answer),
                count(Verdict::Truncate),
                count(Verdict::Drop)
            ),
            (100, 100, 100)
        );
        assert_eq!(
            verdicts[100],
            Verdict::Truncate,
            "the first over the limit slips"
        );
        // A tenth of a second refills a tenth of the rate.
        let later = t + Duration::from_millis(100);
        let again = (0..100)
            .filter(|_| l.handle_query(later, NOISY) == Verdict::Answer)
            .count();
        assert_eq!(again, 10);
        // No limit at 0.
        let mut free = PerSource::new(0);
        assert!((0..10_000).all(|_| free.handle_query(t, NOISY) == Verdict::Answer));
    }

    #[test]
    fn the_table_is_bounded_and_forgets_the_oldest_source() {
        let t = Instant::now();
        let mut l = PerSource::new(1);
        assert_eq!(l.handle_query(t, QUIET), Verdict::Answer);
        assert_eq!(l.handle_query(t, QUIET), Verdict::Truncate);
        for i in 0..MAX_SOURCES as u32 {
            l.handle_query(t, Ipv4Addr::from(0x0a00_0000 + i));
        }
        assert_eq!(l.sources(), MAX_SOURCES);
        // QUIET entered first, so it was forgotten: a full bucket again.
        assert_eq!(l.handle_query(t, QUIET), Verdict::Answer);
        assert_eq!(l.sources(), MAX_SOURCES);
    }
}
