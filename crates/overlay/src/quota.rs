//! What a replica lets one peer make it hold, and how fast it lets it ask: the limits of
//! [`crate::records::RecordStore`] and the reasons it refuses.
//!
//! Records are keyed by MACs under the namespace secret, so a replica cannot read which
//! namespace a record belongs to; but every request carries its namespace's tag and is
//! answered only to a peer that proved membership of it, so the tag it came with is the
//! record's namespace. Per-owner and per-requester counts bound one key and one peer (a
//! stranger is refused outright); per-namespace counts and rates bound a whole namespace, so
//! the members of one (a compromised one minting peer ids included) cannot fill a replica
//! that serves others: at most [`MAX_RECORDS_PER_NAMESPACE`] records and
//! [`MAX_GROUP_ENTRIES_PER_NAMESPACE`] group entries, at
//! [`NAMESPACE_REQUESTS_PER_SEC`] requests after a burst of [`NAMESPACE_REQUEST_BURST`].
//! A member's own records are its address, its router-mode LAN hosts and DHCP clients (one
//! address lease each), and one name lease per named host; a /16 namespace has at most
//! 65,534 addresses, and with more than [`crate::quorum::REPLICAS`] members each replica
//! keeps only the share of keys closest to it.
//!
//! The figures are constants, not configuration: no real deployment comes near them, and a
//! knob nobody needs is one more thing to get wrong.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::proof::NamespaceTag;
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

/// Most records of one namespace on one replica: half the store
/// ([`crate::lease::MAX_LEASES_PER_REPLICA`]), so a replica serving several namespaces keeps
/// room for the others whatever one does. A namespace whose members share five replicas
/// and hold a full /16 with a name each would need more; with more members each replica
/// keeps a share.
pub const MAX_RECORDS_PER_NAMESPACE: usize = 32_768;

/// Most group entries of one namespace on one replica: half of
/// [`crate::records::MAX_GROUP_ENTRIES`].
pub const MAX_GROUP_ENTRIES_PER_NAMESPACE: usize = 32_768;

/// Requests all members of one namespace may send one replica in a burst: four routers
/// starting with full LANs at once.
pub const NAMESPACE_REQUEST_BURST: u32 = 4 * REQUEST_BURST;

/// Requests per second all members of one namespace may sustain at one replica.
pub const NAMESPACE_REQUESTS_PER_SEC: u32 = 8 * REQUESTS_PER_SEC;

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
    /// The namespace holds [`MAX_RECORDS_PER_NAMESPACE`] records (or
    /// [`MAX_GROUP_ENTRIES_PER_NAMESPACE`] group entries) here already.
    NamespaceQuota,
    /// The namespace's members together are over its request rate.
    NamespaceRateLimited,
    /// The namespace has an authority and the owner's certificate does not allow this
    /// claim: an address it does not pin, a name that is not its own, or a claim that does
    /// not say what it is for ([`crate::records::certified`]).
    NotAllowed,
}

impl Refusal {
    /// Every reason, in a fixed order (for counters).
    pub const ALL: [Refusal; 9] = [
        Self::OwnerQuota,
        Self::RequesterQuota,
        Self::StoreFull,
        Self::GroupFull,
        Self::GroupQuota,
        Self::RateLimited,
        Self::NamespaceQuota,
        Self::NamespaceRateLimited,
        Self::NotAllowed,
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
            Self::NamespaceQuota => "namespace_quota",
            Self::NamespaceRateLimited => "namespace_rate_limited",
            Self::NotAllowed => "not_allowed",
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

/// What is held per owner key and per placing peer (records, or group entries): the
/// counts the per-owner and per-requester quotas compare against.
#[derive(Debug, Default)]
pub(crate) struct Holdings {
    per_owner: HashMap<OwnerKey, usize>,
    per_requester: HashMap<OwnerKey, usize>,
    per_namespace: HashMap<NamespaceTag, usize>,
}

impl Holdings {
    /// One more item of `owner`, placed by `via`, in namespace `ns` if the request named one.
    pub(crate) fn add(&mut self, owner: OwnerKey, via: OwnerKey, ns: Option<NamespaceTag>) {
        *self.per_owner.entry(owner).or_default() += 1;
        *self.per_requester.entry(via).or_default() += 1;
        if let Some(ns) = ns {
            *self.per_namespace.entry(ns).or_default() += 1;
        }
    }

    /// One item of `owner`, placed by `via` in `ns`, gone.
    pub(crate) fn remove(&mut self, owner: &OwnerKey, via: &OwnerKey, ns: Option<&NamespaceTag>) {
        fn drop_one<K: Hash + Eq>(counts: &mut HashMap<K, usize>, who: &K) {
            if let Some(n) = counts.get_mut(who) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counts.remove(who);
                }
            }
        }
        drop_one(&mut self.per_owner, owner);
        drop_one(&mut self.per_requester, via);
        if let Some(ns) = ns {
            drop_one(&mut self.per_namespace, ns);
        }
    }

    /// Items held of namespace `ns`.
    pub(crate) fn of_namespace(&self, ns: &NamespaceTag) -> usize {
        self.per_namespace.get(ns).copied().unwrap_or(0)
    }

    /// Items held of `owner`.
    pub(crate) fn of_owner(&self, owner: &OwnerKey) -> usize {
        self.per_owner.get(owner).copied().unwrap_or(0)
    }

    /// Items placed by `via`.
    pub(crate) fn of_requester(&self, via: &OwnerKey) -> usize {
        self.per_requester.get(via).copied().unwrap_or(0)
    }

    /// Forgets every count (before counting afresh).
    pub(crate) fn clear(&mut self) {
        self.per_owner.clear();
        self.per_requester.clear();
        self.per_namespace.clear();
    }
}

/// A token bucket: `burst` requests at once, refilled at `per_sec`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Request rates: a token bucket for each remote peer (or, keyed by tag, each namespace).
#[derive(Debug)]
pub struct RateLimiter<K = OwnerKey> {
    burst: u32,
    per_sec: u32,
    buckets: HashMap<K, Bucket>,
}

/// Per peer: [`REQUEST_BURST`], [`REQUESTS_PER_SEC`].
impl Default for RateLimiter {
    fn default() -> Self {
        Self::new(REQUEST_BURST, REQUESTS_PER_SEC)
    }
}

/// Per namespace: [`NAMESPACE_REQUEST_BURST`], [`NAMESPACE_REQUESTS_PER_SEC`].
impl Default for RateLimiter<NamespaceTag> {
    fn default() -> Self {
        Self::new(NAMESPACE_REQUEST_BURST, NAMESPACE_REQUESTS_PER_SEC)
    }
}

impl<K: Hash + Eq> RateLimiter<K> {
    /// A limiter allowing `burst` requests at once and `per_sec` sustained, per peer.
    pub fn new(burst: u32, per_sec: u32) -> Self {
        Self {
            burst,
            per_sec,
            buckets: HashMap::new(),
        }
    }

    /// Takes one request of `peer` at `now`: whether it is within its rate.
    pub fn allow(&mut self, now: Instant, peer: K) -> bool {
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

/// The quotas as [`RecordStore`](crate::records::RecordStore) enforces them.
#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests start the clock
mod store_tests {
    use super::*;
    use crate::lease::MAX_LEASES_PER_REPLICA;
    use crate::records::{
        encode, Envelope, MemberInfo, RecordRequest, RecordResponse, RecordStore, MAX_GROUP_MEMBERS,
    };
    use crate::{Identity, NamespaceKeys};

    const NOW: u64 = 1_800_000_000;

    fn keys(secret: &[u8]) -> NamespaceKeys {
        NamespaceKeys::derive("lab", secret)
    }

    fn rng() -> rand::rngs::StdRng {
        rand::SeedableRng::from_seed([9; 32])
    }

    fn member(seed: u8) -> Identity {
        Identity::from_seed([seed; 32])
    }

    fn info() -> Vec<u8> {
        encode(&MemberInfo {
            endpoints: vec!["10.0.0.1:7400".parse().unwrap()],
            name: None,
            subject: None,
        })
    }

    /// A claim of record `i` by `who`, valid for an hour from `NOW`.
    fn claim_of(who: &Identity, i: u32) -> RecordRequest {
        let k = keys(b"0123456789abcdef");
        let mut key = [7u8; 32];
        key[..4].copy_from_slice(&i.to_be_bytes());
        let envelope = Envelope::seal(&k, who, &key, NOW + 3600, &info(), &mut rng()).unwrap();
        RecordRequest::Claim {
            key: key.to_vec(),
            envelope,
        }
    }

    /// The instant of the `i`th request of a steady sender, within every rate limit.
    fn paced(t: Instant, i: usize) -> Instant {
        t + Duration::from_millis(10 * i as u64)
    }

    /// Requests 0.1 ms apart: thousands well within a group entry's lifetime.
    fn fast(t: Instant, i: usize) -> Instant {
        t + Duration::from_micros(100 * i as u64)
    }

    #[test]
    fn one_owner_cannot_fill_the_store() {
        let t = Instant::now();
        let mut store = RecordStore::default();
        let stranger = member(66);
        let via = Some(*stranger.peer_id().as_bytes());
        for i in 0..MAX_RECORDS_PER_OWNER {
            let r = store.handle(paced(t, i), NOW, via, claim_of(&stranger, i as u32));
            assert_eq!(r, RecordResponse::Granted, "record {i}");
        }
        let at = paced(t, MAX_RECORDS_PER_OWNER);
        let over = store.handle(at, NOW, via, claim_of(&stranger, u32::MAX));
        assert_eq!(
            over,
            RecordResponse::Refused {
                reason: Refusal::OwnerQuota
            }
        );
        assert_eq!(store.len(), MAX_RECORDS_PER_OWNER);
        assert_eq!(store.stats().refusals.get(Refusal::OwnerQuota), 1);
        // Renewing a record it holds costs no quota.
        assert_eq!(
            store.handle(at, NOW, via, claim_of(&stranger, 0)),
            RecordResponse::Granted
        );
        // An honest member still claims; releasing frees the stranger's quota.
        let honest = member(1);
        let hv = Some(*honest.peer_id().as_bytes());
        assert_eq!(
            store.handle(at, NOW, hv, claim_of(&honest, u32::MAX)),
            RecordResponse::Granted
        );
        let mut key = [7u8; 32];
        key[..4].copy_from_slice(&0u32.to_be_bytes());
        store.handle(at, NOW, via, RecordRequest::Release { key: key.to_vec() });
        assert_eq!(
            store.records_of(stranger.peer_id().as_bytes()),
            MAX_RECORDS_PER_OWNER - 1
        );
        assert_eq!(
            store.handle(at, NOW, via, claim_of(&stranger, u32::MAX - 1)),
            RecordResponse::Granted
        );
        // Counts survive a sweep unchanged, and fall to zero when the leases lapse.
        store.expire(at);
        assert_eq!(
            store.records_of(stranger.peer_id().as_bytes()),
            MAX_RECORDS_PER_OWNER
        );
        store.expire(at + Duration::from_secs(3601));
        assert!(store.is_empty());
        assert_eq!(store.records_of(stranger.peer_id().as_bytes()), 0);
    }

    #[test]
    fn one_peer_cannot_place_records_under_many_owner_keys() {
        let t = Instant::now();
        let mut store = RecordStore::default();
        let relay = Some([42u8; 32]);
        for i in 0..MAX_RECORDS_PER_REQUESTER {
            // A throwaway owner key per record.
            let owner = Identity::from_seed(
                ((i as u64) << 8 | 0x5a)
                    .to_be_bytes()
                    .repeat(4)
                    .try_into()
                    .unwrap(),
            );
            let r = store.handle(paced(t, i), NOW, relay, claim_of(&owner, i as u32));
            assert_eq!(r, RecordResponse::Granted, "record {i}");
        }
        let at = paced(t, MAX_RECORDS_PER_REQUESTER);
        assert_eq!(
            store.handle(at, NOW, relay, claim_of(&member(3), u32::MAX)),
            RecordResponse::Refused {
                reason: Refusal::RequesterQuota
            }
        );
        assert_eq!(store.stats().refusals.get(Refusal::RequesterQuota), 1);
        // Another peer is not affected.
        assert_eq!(
            store.handle(at, NOW, Some([43; 32]), claim_of(&member(3), u32::MAX)),
            RecordResponse::Granted
        );
    }

    #[test]
    fn one_namespace_cannot_fill_a_replica_others_share() {
        let t = Instant::now();
        let mut store = RecordStore::default();
        let (lab, prod) = (Some([1u8; 8]), Some([2u8; 8]));
        let refused = RecordResponse::Refused {
            reason: Refusal::NamespaceQuota,
        };
        // Members of `lab` (one key each, within their own quotas) fill its share.
        let owners = MAX_RECORDS_PER_NAMESPACE / MAX_RECORDS_PER_OWNER;
        let mut i = 0;
        for o in 0..owners {
            let owner = member(100 + o as u8);
            let via = Some(*owner.peer_id().as_bytes());
            for _ in 0..MAX_RECORDS_PER_OWNER {
                let r = store.handle_in(paced(t, i), NOW, via, lab, claim_of(&owner, i as u32));
                assert_eq!(r, RecordResponse::Granted, "record {i}");
                i += 1;
            }
        }
        let at = paced(t, i);
        let newcomer = member(1);
        let via = Some(*newcomer.peer_id().as_bytes());
        let over = claim_of(&newcomer, u32::MAX);
        assert_eq!(store.handle_in(at, NOW, via, lab, over.clone()), refused);
        assert_eq!(store.stats().refusals.get(Refusal::NamespaceQuota), 1);
        // The same claim in another namespace is kept: the store has room for it.
        assert_eq!(
            store.handle_in(at, NOW, via, prod, over),
            RecordResponse::Granted
        );
        // A renewal in the full namespace costs nothing; a release makes room.
        let first = member(100);
        let first_via = Some(*first.peer_id().as_bytes());
        assert_eq!(
            store.handle_in(at, NOW, first_via, lab, claim_of(&first, 0)),
            RecordResponse::Granted
        );
        let key = [&0u32.to_be_bytes()[..], &[7u8; 28]].concat();
        store.handle_in(at, NOW, first_via, lab, RecordRequest::Release { key });
        assert_eq!(
            store.handle_in(at, NOW, via, lab, claim_of(&newcomer, u32::MAX - 1)),
            RecordResponse::Granted
        );
    }

    #[test]
    fn one_namespace_cannot_fill_a_replicas_group_entries() {
        let t = Instant::now();
        let k = keys(b"0123456789abcdef");
        // Under the namespace's request rate, a replica drops its entries (GROUP_ENTRY_TTL
        // after the last announcement) before it could hold this many: the quota is what
        // holds if that changes, so the rates are off here and the joins come fast.
        let mut store = RecordStore::without_rates();
        let (lab, prod) = (Some([1u8; 8]), Some([2u8; 8]));
        let join = |who: &Identity, group: u32| {
            let mut key = [3u8; 32];
            key[..4].copy_from_slice(&group.to_be_bytes());
            let envelope = Envelope::seal(&k, who, &key, NOW + 3600, &info(), &mut rng()).unwrap();
            RecordRequest::Join {
                key: key.to_vec(),
                envelope,
            }
        };
        // Owners (one peer each) join groups of `lab` until its share is held: each owner
        // stays within its own group quota and each group within its size.
        let per_owner = MAX_GROUPS_PER_OWNER as u32;
        let owners = (MAX_GROUP_ENTRIES_PER_NAMESPACE / MAX_GROUPS_PER_OWNER) as u32;
        let mut i = 0;
        for o in 0..owners {
            let owner = Identity::from_seed(
                [&o.to_be_bytes()[..], &[0x6e; 28]]
                    .concat()
                    .try_into()
                    .unwrap(),
            );
            let via = Some(*owner.peer_id().as_bytes());
            for g in 0..per_owner {
                i += 1;
                let r = store.handle_in(fast(t, i), NOW, via, lab, join(&owner, g));
                assert_eq!(r, RecordResponse::Joined, "owner {o} group {g}");
            }
        }
        assert_eq!(store.group_entries(), MAX_GROUP_ENTRIES_PER_NAMESPACE);
        let at = fast(t, i + 1);
        let late = member(1);
        let via = Some(*late.peer_id().as_bytes());
        assert_eq!(
            store.handle_in(at, NOW, via, lab, join(&late, 0)),
            RecordResponse::Refused {
                reason: Refusal::NamespaceQuota
            }
        );
        assert_eq!(
            store.handle_in(at, NOW, via, prod, join(&late, 1_000_000)),
            RecordResponse::Joined
        );
    }

    #[test]
    fn one_namespace_has_a_request_rate_over_all_its_members() {
        let t = Instant::now();
        let local = [9u8; 32];
        let mut store = RecordStore::new(Some(local));
        let (lab, prod) = (Some([1u8; 8]), Some([2u8; 8]));
        let get = || RecordRequest::Get { key: vec![1; 32] };
        // Many peers, each within its own rate, together spend the namespace's burst.
        let peers = NAMESPACE_REQUEST_BURST / 1000 + 1;
        let mut answered = 0;
        for p in 0..peers {
            let mut via = [0u8; 32];
            via[..4].copy_from_slice(&p.to_be_bytes());
            for _ in 0..1000 {
                if matches!(
                    store.handle_in(t, NOW, Some(via), lab, get()),
                    RecordResponse::Value { .. }
                ) {
                    answered += 1;
                }
            }
        }
        assert_eq!(answered, NAMESPACE_REQUEST_BURST);
        assert!(store.stats().refusals.get(Refusal::NamespaceRateLimited) > 0);
        // Another namespace, and the agent's own requests, are not held back.
        assert!(matches!(
            store.handle_in(t, NOW, Some([77; 32]), prod, get()),
            RecordResponse::Value { .. }
        ));
        assert!(matches!(
            store.handle_in(t, NOW, Some(local), lab, get()),
            RecordResponse::Value { .. }
        ));
        // A second later the namespace has its sustained rate again.
        let later = t + Duration::from_secs(1);
        assert!(matches!(
            store.handle_in(later, NOW, Some([78; 32]), lab, get()),
            RecordResponse::Value { .. }
        ));
    }

    #[test]
    fn the_store_is_full_at_its_total() {
        let t = Instant::now();
        let mut store = RecordStore::default();
        let owners = MAX_LEASES_PER_REPLICA / MAX_RECORDS_PER_OWNER;
        let mut i = 0;
        for o in 0..owners {
            let owner = member(100 + o as u8);
            let via = Some(*owner.peer_id().as_bytes());
            for _ in 0..MAX_RECORDS_PER_OWNER {
                let r = store.handle(paced(t, i), NOW, via, claim_of(&owner, i as u32));
                assert_eq!(r, RecordResponse::Granted);
                i += 1;
            }
        }
        assert_eq!(store.len(), MAX_LEASES_PER_REPLICA);
        let late = member(1);
        assert_eq!(
            store.handle(
                paced(t, i),
                NOW,
                Some(*late.peer_id().as_bytes()),
                claim_of(&late, u32::MAX)
            ),
            RecordResponse::Refused {
                reason: Refusal::StoreFull
            }
        );
        assert_eq!(store.stats().refusals.get(Refusal::StoreFull), 1);
    }

    #[test]
    fn requests_over_the_rate_are_refused_but_the_agents_own_are_not() {
        let t = Instant::now();
        let local = *member(1).peer_id().as_bytes();
        let mut store = RecordStore::new(Some(local));
        let get = || RecordRequest::Get { key: vec![1; 32] };
        let flooder = Some([9u8; 32]);
        let answered = (0..REQUEST_BURST + 100)
            .filter(|_| {
                store.handle(t, NOW, flooder, get())
                    != RecordResponse::Refused {
                        reason: Refusal::RateLimited,
                    }
            })
            .count();
        assert_eq!(answered, REQUEST_BURST as usize);
        assert_eq!(store.stats().refusals.get(Refusal::RateLimited), 100);
        // Another peer, and the agent itself, still get answers.
        assert_eq!(
            store.handle(t, NOW, Some([8; 32]), get()),
            RecordResponse::Value { envelope: None }
        );
        for _ in 0..REQUEST_BURST + 100 {
            assert_eq!(
                store.handle(t, NOW, Some(local), get()),
                RecordResponse::Value { envelope: None }
            );
        }
        // A second later the flooder has its rate again.
        assert_eq!(
            store.handle(t + Duration::from_secs(1), NOW, flooder, get()),
            RecordResponse::Value { envelope: None }
        );
    }

    #[test]
    fn group_joins_are_bounded_per_group_per_owner_and_per_peer() {
        let t = Instant::now();
        let k = keys(b"0123456789abcdef");
        let mut store = RecordStore::default();
        let join = |who: &Identity, group: u32| {
            let mut key = [3u8; 32];
            key[..4].copy_from_slice(&group.to_be_bytes());
            let envelope = Envelope::seal(&k, who, &key, NOW + 3600, &info(), &mut rng()).unwrap();
            RecordRequest::Join {
                key: key.to_vec(),
                envelope,
            }
        };
        // One stranger joining group after group: stopped at MAX_GROUPS_PER_OWNER.
        let stranger = member(66);
        let via = Some(*stranger.peer_id().as_bytes());
        let mut i = 0;
        let mut step = || {
            i += 1;
            paced(t, i)
        };
        for g in 0..MAX_GROUPS_PER_OWNER as u32 {
            assert_eq!(
                store.handle(step(), NOW, via, join(&stranger, g)),
                RecordResponse::Joined
            );
        }
        let refused = RecordResponse::Refused {
            reason: Refusal::GroupQuota,
        };
        assert_eq!(
            store.handle(step(), NOW, via, join(&stranger, 5000)),
            refused
        );
        // Renewing a group it is in is fine.
        assert_eq!(
            store.handle(step(), NOW, via, join(&stranger, 0)),
            RecordResponse::Joined
        );
        // Many owner keys through one peer: the peer's count stops them.
        let other = member(67);
        assert_eq!(store.handle(step(), NOW, via, join(&other, 9000)), refused);
        assert_eq!(store.stats().refusals.get(Refusal::GroupQuota), 2);
        // One group holds at most MAX_GROUP_MEMBERS members, each from its own peer.
        for m in 0..MAX_GROUP_MEMBERS as u32 {
            let who = Identity::from_seed(
                ((m as u64) << 8 | 0x77)
                    .to_be_bytes()
                    .repeat(4)
                    .try_into()
                    .unwrap(),
            );
            let v = Some(*who.peer_id().as_bytes());
            assert_eq!(
                store.handle(step(), NOW, v, join(&who, 100_000)),
                RecordResponse::Joined
            );
        }
        let late = member(68);
        assert_eq!(
            store.handle(
                step(),
                NOW,
                Some(*late.peer_id().as_bytes()),
                join(&late, 100_000)
            ),
            RecordResponse::Refused {
                reason: Refusal::GroupFull
            }
        );
        assert_eq!(
            store.group_entries(),
            MAX_GROUPS_PER_OWNER + MAX_GROUP_MEMBERS
        );
        store.expire(t + Duration::from_secs(3700));
        assert_eq!(store.group_entries(), 0);
        assert_eq!(
            store.handle(step(), NOW, via, join(&stranger, 5000)),
            RecordResponse::Joined
        );
    }
}
