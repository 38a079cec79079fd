//! What a replica lets one peer make it hold, and how fast it lets it ask: the limits of
//! [`crate::records::RecordStore`] and the reasons it refuses.
//!
//! Records are keyed by MACs under the namespace secret, so a replica cannot tell which
//! namespace a record belongs to: a per-namespace quota cannot be enforced where records are
//! kept. What bounds a namespace's share (and a stranger's) is per-owner and per-requester
//! counts, each well above what one honest member ever holds, under one total per replica.
//! A member's own records are its address, its router-mode LAN hosts and DHCP clients (one
//! address lease each), and one name lease per named host; a /16 namespace has at most
//! 65,534 addresses, and with more than [`crate::quorum::REPLICAS`] members each replica
//! keeps only the share of keys closest to it.
//!
//! The figures are constants, not configuration: no real deployment comes near them, and a
//! knob nobody needs is one more thing to get wrong.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::records::OwnerKey;

/// Most records (address and name leases) one owner key holds on one replica: 2,048 hosts
/// behind one router-mode member, each with an address and a name.
pub const MAX_RECORDS_PER_OWNER: usize = 4096;

/// Most records one remote peer may have placed on one replica, whoever signed them (a
/// member sends only its own claims, so the same figure; it stops one connection from
/// storing records under many throwaway owner keys).
pub const MAX_RECORDS_PER_REQUESTER: usize = 4096;

/// Most broadcast groups one owner key belongs to on one replica: one group per namespace,
/// and no agent serves anywhere near this many namespaces.
pub const MAX_GROUPS_PER_OWNER: usize = 64;

/// Requests one remote peer may send in a burst to the records protocol (a router-mode
/// member starting with a full LAN claims an address and a name per host at once).
pub const REQUEST_BURST: u32 = 2048;

/// Requests per second one remote peer may sustain once its burst is spent: renewals of
/// [`MAX_RECORDS_PER_OWNER`] records, group refreshes and reads fit many times over.
pub const REQUESTS_PER_SEC: u32 = 128;

/// Remote peers whose request rate a replica tracks at once; beyond, the fullest buckets
/// (peers that have been quiet longest) are forgotten first.
pub const MAX_TRACKED_REQUESTERS: usize = 8192;

/// Why a replica refused to keep (or answer) something it would otherwise accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// The owner holds [`MAX_RECORDS_PER_OWNER`] records here already.
    OwnerQuota,
    /// The requesting peer placed [`MAX_RECORDS_PER_REQUESTER`] records here already.
    RequesterQuota,
    /// The replica holds its most records ([`crate::lease::MAX_LEASES_PER_REPLICA`]).
    StoreFull,
    /// The group has [`crate::records::MAX_GROUP_MEMBERS`] members, or the replica its
    /// most group entries ([`crate::records::MAX_GROUP_ENTRIES`]).
    GroupFull,
    /// The owner is in [`MAX_GROUPS_PER_OWNER`] groups here already.
    GroupQuota,
    /// The requesting peer is over its request rate.
    RateLimited,
}

impl Refusal {
    /// Every reason, in a fixed order (for counters).
    pub const ALL: [Refusal; 6] = [
        Self::OwnerQuota,
        Self::RequesterQuota,
        Self::StoreFull,
        Self::GroupFull,
        Self::GroupQuota,
        Self::RateLimited,
    ];

    /// The reason's name in status (`owner_quota`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OwnerQuota => "owner_quota",
            Self::RequesterQuota => "requester_quota",
            Self::StoreFull => "store_full",
            Self::GroupFull => "group_full",
            Self::GroupQuota => "group_quota",
            Self::RateLimited => "rate_limited",
        }
    }
}

/// Refusals counted by reason.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Refusals([u64; Refusal::ALL.len()]);

impl Refusals {
    /// Counts one refusal.
    pub fn count(&mut self, reason: Refusal) {
        self.0[reason as usize] += 1;
    }

    /// How many refusals for `reason`.
    pub fn get(&self, reason: Refusal) -> u64 {
        self.0[reason as usize]
    }

    /// Every reason with its count.
    pub fn iter(&self) -> impl Iterator<Item = (Refusal, u64)> + '_ {
        Refusal::ALL.into_iter().map(|r| (r, self.get(r)))
    }

    /// All refusals.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// A token bucket: `burst` requests at once, refilled at `per_sec`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Per-peer request rates: a token bucket for each remote peer.
#[derive(Debug)]
pub struct RateLimiter {
    burst: u32,
    per_sec: u32,
    buckets: HashMap<OwnerKey, Bucket>,
}

impl Default for RateLimiter {
    fn default() -> Self {
        Self::new(REQUEST_BURST, REQUESTS_PER_SEC)
    }
}

impl RateLimiter {
    /// A limiter allowing `burst` requests at once and `per_sec` sustained, per peer.
    pub fn new(burst: u32, per_sec: u32) -> Self {
        Self {
            burst,
            per_sec,
            buckets: HashMap::new(),
        }
    }

    /// Takes one request of `peer` at `now`: whether it is within its rate.
    pub fn allow(&mut self, now: Instant, peer: OwnerKey) -> bool {
        if !self.buckets.contains_key(&peer) && self.buckets.len() >= MAX_TRACKED_REQUESTERS {
            self.forget_idle(now);
        }
        let burst = f64::from(self.burst);
        let bucket = self.buckets.entry(peer).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let refill =
            now.saturating_duration_since(bucket.at).as_secs_f64() * f64::from(self.per_sec);
        bucket.tokens = (bucket.tokens + refill).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Forgets peers whose bucket has refilled (they would start full anyway), and if that
    /// is not enough, the half that has been quiet longest: memory stays bounded by
    /// [`MAX_TRACKED_REQUESTERS`].
    pub fn forget_idle(&mut self, now: Instant) {
        let burst = f64::from(self.burst);
        let per_sec = f64::from(self.per_sec.max(1));
        let full_after = Duration::from_secs_f64(burst / per_sec);
        self.buckets
            .retain(|_, b| now.saturating_duration_since(b.at) < full_after && b.tokens < burst);
        if self.buckets.len() >= MAX_TRACKED_REQUESTERS {
            let mut ages: Vec<Instant> = self.buckets.values().map(|b| b.at).collect();
            ages.sort_unstable();
            let cutoff = ages[ages.len() / 2];
            self.buckets.retain(|_, b| b.at > cutoff);
        }
    }

    /// Peers tracked now.
    pub fn tracked(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests start the clock
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_a_burst_then_the_rate() {
        let t = Instant::now();
        let mut limiter = RateLimiter::new(10, 5);
        let (a, b) = ([1; 32], [2; 32]);
        assert_eq!((0..20).filter(|_| limiter.allow(t, a)).count(), 10);
        // Another peer has a bucket of its own.
        assert!(limiter.allow(t, b));
        // One second refills five requests, never more than the burst.
        let t1 = t + Duration::from_secs(1);
        assert_eq!((0..20).filter(|_| limiter.allow(t1, a)).count(), 5);
        let t2 = t1 + Duration::from_secs(3600);
        assert_eq!((0..20).filter(|_| limiter.allow(t2, a)).count(), 10);
    }

    #[test]
    fn tracked_peers_stay_bounded() {
        let t = Instant::now();
        let mut limiter = RateLimiter::new(4, 1);
        for i in 0..(MAX_TRACKED_REQUESTERS as u32 * 2) {
            let mut peer = [0u8; 32];
            peer[..4].copy_from_slice(&i.to_be_bytes());
            let at = t + Duration::from_millis(u64::from(i));
            assert!(limiter.allow(at, peer));
            assert!(limiter.tracked() <= MAX_TRACKED_REQUESTERS);
        }
        // Idle peers are forgotten once their bucket would be full again.
        limiter.forget_idle(t + Duration::from_secs(3600));
        assert_eq!(limiter.tracked(), 0);
    }

    #[test]
    fn refusals_count_by_reason() {
        let mut r = Refusals::default();
        r.count(Refusal::RateLimited);
        r.count(Refusal::RateLimited);
        r.count(Refusal::OwnerQuota);
        assert_eq!(r.get(Refusal::RateLimited), 2);
        assert_eq!(r.get(Refusal::StoreFull), 0);
        assert_eq!(r.total(), 3);
        let names: Vec<&str> = r.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names.len(), Refusal::ALL.len());
        for (i, reason) in Refusal::ALL.into_iter().enumerate() {
            assert_eq!(reason as usize, i);
        }
    }
}
