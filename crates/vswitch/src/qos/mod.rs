//! Rate caps (issue 32): a token bucket ([`TokenBucket`]) and a pacer over it ([`Pacer`])
//! that holds what exceeds the rate in a queue bounded by a worst-case delay, rather than
//! dropping it, and drops (counted) only what would wait longer than that.
//!
//! Pure: time comes in as [`Instant`]s from the caller, so the tests run on a virtual
//! clock. Nothing here allocates per packet but the queue's own growth.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

pub mod bond;
pub mod caps;
mod shares;
#[cfg(test)]
mod tests;

pub use caps::{CapFile, Caps, Keyed};

pub use shares::{ClassStats, Shares};

/// The smallest burst a bucket has, bytes: one packet of 64 KiB always passes.
pub const MIN_BURST: u64 = 65_536;

/// The worst-case delay a cap adds to what it paces (its queue holds this long at the rate).
pub const MAX_DELAY: Duration = Duration::from_millis(20);

/// A rate as written in a config: bits a second, with an optional `k`, `M` or `G` (powers
/// of 1000, as `tc` reads them): `"50M"`, `"1G"`, `"800k"`, `"2500000"`.
pub fn parse_rate(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, unit) = match t
        .char_indices()
        .find(|(_, c)| !c.is_ascii_digit() && *c != '.')
    {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let factor: f64 = match unit {
        "" => 1.0,
        "k" | "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        _ => {
            return Err(format!(
                "rate '{text}': bits a second, like 50M, 1G or 800k"
            ))
        }
    };
    let value: f64 = digits
        .parse()
        .map_err(|_| format!("rate '{text}': bits a second, like 50M, 1G or 800k"))?;
    let bits = value * factor;
    if !(8_000.0..=1e12).contains(&bits) {
        return Err(format!("rate '{text}': between 8k and 1000G"));
    }
    Ok(bits as u64)
}

/// The flow of IPv4 packet `ip`, hashed for [`Shares::push`]: its addresses, protocol and,
/// for TCP and UDP (but fragments after the first), ports. Not a keyed hash: flows that
/// collide only share a queue inside their own namespace.
pub fn flow_of(ip: &[u8]) -> u64 {
    if ip.first().is_some_and(|b| b >> 4 == 6) {
        return flow_of6(ip);
    }
    let mut key = [0u8; 13];
    if let Some(addrs) = ip.get(12..20) {
        key[..8].copy_from_slice(addrs);
    }
    let proto = ip.get(9).copied().unwrap_or(0);
    key[8] = proto;
    let ihl = usize::from(ip.first().map_or(5, |b| b & 0x0f)) * 4;
    let first_fragment = ip
        .get(6..8)
        .is_some_and(|f| u16::from_be_bytes([f[0], f[1]]) & 0x1fff == 0);
    if matches!(proto, 6 | 17) && first_fragment {
        if let Some(ports) = ip.get(ihl..ihl + 4) {
            key[9..].copy_from_slice(ports);
        }
    }
    // FNV-1a.
    key.iter().fold(0xcbf2_9ce4_8422_2325, |h: u64, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// [`flow_of`] an IPv6 packet: addresses, next header and (TCP and UDP directly behind the
/// fixed header) ports.
fn flow_of6(ip: &[u8]) -> u64 {
    let mut key = [0u8; 37];
    if let Some(addrs) = ip.get(8..40) {
        key[..32].copy_from_slice(addrs);
    }
    let next = ip.get(6).copied().unwrap_or(0);
    key[32] = next;
    if matches!(next, 6 | 17) {
        if let Some(ports) = ip.get(40..44) {
            key[33..].copy_from_slice(ports);
        }
    }
    key.iter().fold(0xcbf2_9ce4_8422_2325, |h: u64, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A token bucket: `rate` bytes a second, at most `burst` bytes at once. Tokens are kept
/// in nanobytes (bytes × 10⁹) so no rounding is lost between packets.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    /// Bytes a second.
    rate: u64,
    /// Most tokens, in nanobytes.
    capacity: u128,
    /// Tokens now, in nanobytes.
    tokens: u128,
    last: Option<Instant>,
}

const NANO: u128 = 1_000_000_000;

impl TokenBucket {
    /// A full bucket of `rate` bits a second and `burst` bytes (at least one packet of
    /// 64 KiB is always let through, whatever `burst` says: a bucket smaller than a packet
    /// would never pass it).
    pub fn new(rate_bits: u64, burst: u64) -> Self {
        let rate = (rate_bits / 8).max(1);
        let capacity = u128::from(burst.max(MIN_BURST)) * NANO;
        Self {
            rate,
            capacity,
            tokens: capacity,
            last: None,
        }
    }

    /// Bytes a second.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    fn refill(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let elapsed = now.saturating_duration_since(last).as_nanos();
            self.tokens = (self.tokens + elapsed * u128::from(self.rate)).min(self.capacity);
        }
        self.last = Some(now);
    }

    /// Takes `len` bytes' tokens if there are enough at `now`.
    pub fn take(&mut self, now: Instant, len: usize) -> bool {
        self.refill(now);
        let need = len as u128 * NANO;
        if self.tokens >= need {
            self.tokens -= need;
            true
        } else {
            false
        }
    }

    /// When `len` bytes' tokens are there, counting from the last time tokens were taken
    /// (none before the first).
    pub fn ready_at(&self, len: usize) -> Option<Instant> {
        let last = self.last?;
        let missing = (len as u128 * NANO).saturating_sub(self.tokens);
        let nanos = missing.div_ceil(u128::from(self.rate));
        Some(last + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)))
    }

    /// Whether the bucket is full at `now`: quiet long enough that forgetting it and
    /// starting a new one changes nothing.
    pub fn is_full(&self, now: Instant) -> bool {
        self.last.is_none_or(|last| {
            self.tokens + now.saturating_duration_since(last).as_nanos() * u128::from(self.rate)
                >= self.capacity
        })
    }

    /// How long from `now` until `len` bytes' tokens are there (zero if they are).
    pub fn wait(&self, now: Instant, len: usize) -> Duration {
        let tokens = match self.last {
            Some(last) => (self.tokens
                + now.saturating_duration_since(last).as_nanos() * u128::from(self.rate))
            .min(self.capacity),
            None => self.tokens,
        };
        let need = len as u128 * NANO;
        let missing = need.saturating_sub(tokens);
        // Rounded up: tokens for the whole packet at the end of the wait.
        let nanos = missing.div_ceil(u128::from(self.rate));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// What [`Pacer::push`] did with an item.
#[derive(Debug, PartialEq, Eq)]
pub enum Paced<T> {
    /// Within the rate: send it now.
    Now(T),
    /// Over the rate: queued; [`Pacer::poll`] gives it back when its time comes.
    Queued,
    /// It would wait longer than the pacer's worst-case delay: dropped (counted).
    Dropped(T),
}

/// Counters of a pacer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacerStats {
    /// Items and bytes sent (at once or after waiting).
    pub sent: u64,
    pub sent_bytes: u64,
    /// Items that waited in the queue.
    pub delayed: u64,
    /// Items dropped because the queue was full (their wait would have exceeded the
    /// worst-case delay).
    pub dropped: u64,
    pub dropped_bytes: u64,
}

/// A rate cap that paces: what exceeds the bucket waits in a queue, in order, until its
/// tokens come; the queue holds at most `max_delay` worth of bytes at the rate, so no item
/// waits longer than that (the worst-case delay a cap adds), and what would is dropped.
#[derive(Debug, Clone)]
pub struct Pacer<T> {
    bucket: TokenBucket,
    queue: VecDeque<(T, usize)>,
    queued_bytes: u64,
    /// Most bytes the queue holds: `max_delay` at the rate.
    limit: u64,
    max_delay: Duration,
    stats: PacerStats,
}

impl<T> Pacer<T> {
    /// A cap of `rate_bits` a second with a burst of `burst` bytes, adding at most
    /// `max_delay` of queueing.
    pub fn new(rate_bits: u64, burst: u64, max_delay: Duration) -> Self {
        let bucket = TokenBucket::new(rate_bits, burst);
        let limit = u64::try_from(u128::from(bucket.rate()) * max_delay.as_nanos() / NANO)
            .unwrap_or(u64::MAX);
        Self {
            bucket,
            queue: VecDeque::new(),
            queued_bytes: 0,
            limit,
            max_delay,
            stats: PacerStats::default(),
        }
    }

    /// The cap, bits a second.
    pub fn rate_bits(&self) -> u64 {
        self.bucket.rate * 8
    }

    /// The burst, bytes.
    pub fn burst(&self) -> u64 {
        u64::try_from(self.bucket.capacity / NANO).unwrap_or(u64::MAX)
    }

    /// The most queueing this cap adds.
    pub fn max_delay(&self) -> Duration {
        self.max_delay
    }

    /// Counters.
    pub fn stats(&self) -> PacerStats {
        self.stats
    }

    /// Items waiting, and their bytes.
    pub fn queued(&self) -> (usize, u64) {
        (self.queue.len(), self.queued_bytes)
    }

    /// Whether `len` bytes may go at `now` without waiting (nothing waits before them and
    /// the rate allows them); counted as sent if so. Else [`Pacer::push`] them.
    pub fn send_now(&mut self, now: Instant, len: usize) -> bool {
        if self.queue.is_empty() && self.bucket.take(now, len) {
            self.stats.sent += 1;
            self.stats.sent_bytes += len as u64;
            return true;
        }
        false
    }

    /// An item of `len` bytes to send at `now`: now if within the rate and nothing waits
    /// before it (order is kept), else queued if the queue has room, else dropped.
    pub fn push(&mut self, now: Instant, item: T, len: usize) -> Paced<T> {
        if self.queue.is_empty() && self.bucket.take(now, len) {
            self.stats.sent += 1;
            self.stats.sent_bytes += len as u64;
            return Paced::Now(item);
        }
        if self.queued_bytes + len as u64 > self.limit {
            self.stats.dropped += 1;
            self.stats.dropped_bytes += len as u64;
            return Paced::Dropped(item);
        }
        self.queued_bytes += len as u64;
        self.queue.push_back((item, len));
        self.stats.delayed += 1;
        Paced::Queued
    }

    /// The next queued item whose tokens have come by `now`, in order.
    pub fn poll(&mut self, now: Instant) -> Option<T> {
        let &(_, len) = self.queue.front()?;
        if !self.bucket.take(now, len) {
            return None;
        }
        let (item, len) = self.queue.pop_front()?;
        self.queued_bytes -= len as u64;
        self.stats.sent += 1;
        self.stats.sent_bytes += len as u64;
        Some(item)
    }

    /// When the first queued item may go, if any waits.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let &(_, len) = self.queue.front()?;
        self.bucket.ready_at(len)
    }

    /// Drops the queued items `keep` refuses (counted as dropped), in order otherwise.
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        let (stats, queued_bytes) = (&mut self.stats, &mut self.queued_bytes);
        self.queue.retain(|(item, len)| {
            let k = keep(item);
            if !k {
                stats.dropped += 1;
                stats.dropped_bytes += *len as u64;
                *queued_bytes -= *len as u64;
            }
            k
        });
    }

    /// Nothing waits and the bucket is full at `now`: the pacer may be forgotten.
    pub fn is_idle(&self, now: Instant) -> bool {
        self.queue.is_empty() && self.bucket.is_full(now)
    }
}
