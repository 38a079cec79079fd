//! Leases won by a majority: the address claim protocol (DESIGN.md, "Namespaces, addresses
//! and the DHT"), as pure state machines. The libp2p glue (issue 3) carries [`Request`] and
//! [`Response`] between members and picks the replicas: the peers closest to the key.
//!
//! Kademlia's put is last-writer-wins, so it cannot decide who owns an address. Here each
//! replica does compare-and-set on its own copy ([`Replica`]): it grants a key to the first
//! claimer and refuses everyone else until that lease expires or is released. A claim
//! ([`Claim`]) asks every replica of the key and wins only with grants from a strict majority.
//! Two claimers that see the same replica set cannot both win: their majorities would share a
//! replica, which grants to one owner at a time. A claim that cannot reach a majority gives
//! back what it was granted, so a split vote leaves nothing held.
//!
//! Replica sets drift as members join, so a first claim also loses to a holder that any
//! replica names (after asking it again, in case that holder was a rival of the same moment
//! that has since lost): a lease won while the namespace was small lives on the replicas of
//! that time, and a newcomer's set may share only one of them ([`Claim::new`]).
//!
//! The owner renews by claiming again before expiry (a replica re-grants to the holder), which
//! also re-establishes the lease on replicas that joined the set since. A crashed owner stops
//! renewing and its lease lapses after its time-to-live.
//!
//! Partitions that merge: two groups that were apart may each have granted one key to a
//! different owner. Once their DHTs meet, the key's replica set mixes replicas of both, and
//! a renewal ([`Claim::renewal`]) meets the other owner's lease on some of them. Which owner
//! keeps the key is decided by a rule every owner applies alike, from the answers alone
//! ([`Claim::decide_renewal`]): a rival counts when at least [`Claim::strong`] replicas of
//! the set name it; the owner with the lower key among the owners that count keeps the
//! key ([`Outcome::Kept`]: it keeps its grants and claims again soon) and every other one
//! yields ([`Outcome::Lost`], giving back its grants, even a majority), so the keeper's next
//! renewal wins the whole set. An owner that holds fewer than [`Claim::strong`] replicas
//! does not count for its rivals either, so it yields. Both sides count the same replicas,
//! so they reach the same verdict.
//!
//! Call order, per claim: [`Claim::new`] returns the requests to send; feed each reply to
//! [`Claim::handle_response`] and the passage of time to [`Claim::handle_timeout`]; read the
//! result with [`Claim::outcome`] once it is decided, and send the releases it lists.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Most keys one replica holds leases for; beyond, new keys are refused ([`Response::Full`]).
pub const MAX_LEASES_PER_REPLICA: usize = 65536;

/// How long a first claim that has its majority still waits for the other replicas: one of
/// them may hold a lease the others never saw ([`Claim::new`]).
pub const GRACE: Duration = Duration::from_millis(300);

/// How long a first claim waits before asking again a replica that named another holder: a
/// rival claiming at the same moment gives its grants back as soon as it loses.
pub const RECHECK_DELAY: Duration = Duration::from_millis(50);

/// How many times it asks again before the named holder counts as the key's.
pub const RECHECKS: u8 = 4;

/// A message from a claimer to a replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<K, O> {
    /// Grant (or renew) `key` to `owner` for `ttl`.
    Claim {
        /// The key (e.g. the DHT key of a virtual address).
        key: K,
        /// Who asks.
        owner: O,
        /// How long the lease lasts without renewal.
        ttl: Duration,
    },
    /// Give `key` back, if `owner` holds it.
    Release {
        /// The key.
        key: K,
        /// Who releases.
        owner: O,
    },
}

/// A replica's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response<O> {
    /// The lease is the claimer's for `ttl` from now.
    Granted,
    /// Someone else holds it for `remaining`.
    Held {
        /// The holder.
        owner: O,
        /// Time left on its lease.
        remaining: Duration,
    },
    /// Released (or was not held by the releaser: nothing to do either way).
    Released,
    /// The replica holds too many leases to take a new key.
    Full,
}

struct Held<O> {
    owner: O,
    expires: Instant,
}

/// One replica's leases: compare-and-set per key.
pub struct Replica<K, O> {
    leases: HashMap<K, Held<O>>,
}

impl<K: Eq + Hash + Clone, O: Eq + Clone> Default for Replica<K, O> {
    fn default() -> Self {
        Self {
            leases: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash + Clone, O: Eq + Clone> Replica<K, O> {
    /// Answers one request.
    pub fn handle(&mut self, now: Instant, request: Request<K, O>) -> Response<O> {
        match request {
            Request::Claim { key, owner, ttl } => {
                if let Some(held) = self.leases.get_mut(&key) {
                    if held.owner != owner && held.expires > now {
                        return Response::Held {
                            owner: held.owner.clone(),
                            remaining: held.expires - now,
                        };
                    }
                    *held = Held {
                        owner,
                        expires: now + ttl,
                    };
                    return Response::Granted;
                }
                if self.leases.len() >= MAX_LEASES_PER_REPLICA {
                    self.expire(now);
                    if self.leases.len() >= MAX_LEASES_PER_REPLICA {
                        return Response::Full;
                    }
                }
                self.leases.insert(
                    key,
                    Held {
                        owner,
                        expires: now + ttl,
                    },
                );
                Response::Granted
            }
            Request::Release { key, owner } => {
                if self.leases.get(&key).is_some_and(|h| h.owner == owner) {
                    self.leases.remove(&key);
                }
                Response::Released
            }
        }
    }

    /// Moves `from`'s live lease on `key` to `to` for `ttl`, in one step: nobody else can
    /// take the key in between, and `from` cannot renew it afterwards (a claim of its gets
    /// [`Response::Held`]). Answers `Granted` once `to` holds it (also when it did already:
    /// a repeated transfer), `Held` if a third owner does, `Released` if nobody does.
    pub fn transfer(
        &mut self,
        now: Instant,
        key: &K,
        from: &O,
        to: O,
        ttl: Duration,
    ) -> Response<O> {
        let Some(held) = self.leases.get_mut(key).filter(|h| h.expires > now) else {
            return Response::Released;
        };
        if held.owner == to {
            return Response::Granted;
        }
        if held.owner != *from {
            return Response::Held {
                owner: held.owner.clone(),
                remaining: held.expires - now,
            };
        }
        *held = Held {
            owner: to,
            expires: now + ttl,
        };
        Response::Granted
    }

    /// The current holder of `key`, if its lease has not expired.
    pub fn holder(&self, now: Instant, key: &K) -> Option<&O> {
        self.leases
            .get(key)
            .filter(|h| h.expires > now)
            .map(|h| &h.owner)
    }

    /// Forgets expired leases.
    pub fn expire(&mut self, now: Instant) {
        self.leases.retain(|_, h| h.expires > now);
    }
}

/// How a claim ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<R, O> {
    /// A majority granted the lease.
    Won,
    /// No majority (or a renewal that yields under the merge rule): `holder` is who most
    /// refusing replicas named (the rival that keeps the key, for a renewal that yields),
    /// if any; the grants this claim received must be given back with [`Request::Release`]
    /// to `release_to`.
    Lost {
        /// The holder most replicas named.
        holder: Option<O>,
        /// Replicas that granted and must be released.
        release_to: Vec<R>,
    },
    /// A renewal met `rival`'s lease on part of the replica set (partitions merged) and
    /// keeps the key under the merge rule: it keeps its grants and claims again soon, once
    /// the rival has given its own back.
    Kept {
        /// The other owner (the lowest-keyed rival that counts).
        rival: O,
    },
}

/// Requests to send: (replica, request).
pub type Outgoing<R, K, O> = Vec<(R, Request<K, O>)>;

/// One claim of one key, from the claimer's side.
pub struct Claim<K, O, R> {
    key: K,
    owner: O,
    ttl: Duration,
    replicas: Vec<R>,
    granted: Vec<R>,
    refused: Vec<(R, Option<O>)>,
    deadline: Instant,
    outcome: Option<Outcome<R, O>>,
    /// The claimer holds the key already: the merge rule applies.
    renewal: bool,
    /// A first claim: it loses to a holder any replica names ([`Claim::new`]). Off for a
    /// transfer, which the majority alone decides.
    heed_holders: bool,
    /// A majority granted but replicas are still to answer: the claim waits until then.
    grace_until: Option<Instant>,
    /// When the replicas that named another holder are asked again.
    recheck_at: Option<Instant>,
    rechecks_left: u8,
    /// The replicas asked again and whom they had named.
    rechecked: Vec<(R, Option<O>)>,
}

impl<K: Clone, O: Clone + Ord, R: Clone + Eq> Claim<K, O, R> {
    /// Starts claiming `key` for `owner` from `replicas` (the peers closest to the key); the
    /// claim is decided by `now + timeout` at the latest. Returns the requests to send.
    ///
    /// A first claim wins with a strict majority of grants and no replica naming another
    /// holder. Replica sets drift as members join: a lease won while the namespace was
    /// small lives on the replicas of that time, and a newcomer's set may share only one of
    /// them with it, which then names the holder while the others grant. So the claim waits
    /// for every replica (at most [`GRACE`] once it has its majority), and a replica that
    /// names a holder is asked again ([`RECHECKS`] times, [`RECHECK_DELAY`] apart: a rival
    /// that claimed at the same moment and lost gives its grants back); still held, the
    /// claim is lost to that holder.
    pub fn new(
        now: Instant,
        key: K,
        owner: O,
        ttl: Duration,
        replicas: Vec<R>,
        timeout: Duration,
    ) -> (Self, Outgoing<R, K, O>) {
        let requests = replicas
            .iter()
            .map(|r| {
                (
                    r.clone(),
                    Request::Claim {
                        key: key.clone(),
                        owner: owner.clone(),
                        ttl,
                    },
                )
            })
            .collect();
        let mut claim = Self {
            key,
            owner,
            ttl,
            replicas,
            granted: Vec::new(),
            refused: Vec::new(),
            deadline: now + timeout,
            outcome: None,
            renewal: false,
            heed_holders: true,
            grace_until: None,
            recheck_at: None,
            rechecks_left: RECHECKS,
            rechecked: Vec::new(),
        };
        claim.decide(now, false);
        (claim, requests)
    }

    /// Marks the claim as a transfer (a migration handoff, [`crate::records::transfer`]):
    /// decided by the majority of grants alone.
    pub fn transfer(mut self) -> Self {
        self.heed_holders = false;
        self
    }

    /// Marks the claim as a renewal of a key its owner holds: it is decided only once
    /// every replica answered (or at the deadline), by the merge rule when a rival's lease
    /// shows up ([`Claim::decide_renewal`]).
    pub fn renewal(mut self) -> Self {
        self.renewal = true;
        self.outcome = None;
        if self.replicas.is_empty() {
            // Nobody to ask: unanswered (a rival needs replicas to show up).
            self.decide_renewal(None);
        }
        self
    }

    /// How many replicas of the set must hold an owner's lease for it to count in a merge:
    /// more than one in a set of five, so that one lying replica naming a rival cannot make
    /// an owner yield (two can; the majority rule itself tolerates two), and one in a
    /// smaller set.
    pub fn strong(&self) -> usize {
        (self.replicas.len().saturating_sub(1) / 2).max(1)
    }

    /// A strict majority of the replica set.
    fn majority(&self) -> usize {
        self.replicas.len() / 2 + 1
    }

    /// Feeds a replica's answer. Answers from non-replicas and repeated answers are ignored.
    ///
    /// A claim lost before every replica answered keeps listening: a grant that arrives
    /// afterwards would otherwise hold the key for a loser until its lease ran out, so it
    /// is returned as a release to send at once. Keep feeding a lost claim until
    /// [`Claim::unanswered`] is zero (or its requests have failed).
    pub fn handle_response(
        &mut self,
        now: Instant,
        from: R,
        response: Response<O>,
    ) -> Outgoing<R, K, O> {
        if !self.replicas.contains(&from)
            || self.granted.contains(&from)
            || self.refused.iter().any(|(r, _)| *r == from)
        {
            return Vec::new();
        }
        let late = self.outcome.is_some();
        let lost = matches!(self.outcome, Some(Outcome::Lost { .. }));
        match response {
            Response::Granted if lost => {
                self.granted.push(from.clone());
                return vec![(from, self.release())];
            }
            Response::Granted => self.granted.push(from),
            Response::Held { owner, .. } => self.refused.push((from, Some(owner))),
            Response::Full | Response::Released => self.refused.push((from, None)),
        }
        if !late {
            self.decide(now, false);
        }
        Vec::new()
    }

    /// Gives the claim up undecided (its replica set proved wrong): lost, naming no
    /// holder, with the grants received so far to give back. Later grants come back from
    /// [`Claim::handle_response`] as releases, as for any lost claim.
    pub fn abandon(&mut self) {
        if self.outcome.is_none() {
            self.outcome = Some(Outcome::Lost {
                holder: None,
                release_to: self.granted.clone(),
            });
        }
    }

    /// The key claimed.
    pub fn key(&self) -> &K {
        &self.key
    }

    fn answered(&self, replica: &R) -> bool {
        self.granted.contains(replica) || self.refused.iter().any(|(r, _)| r == replica)
    }

    /// Replicas that have not answered yet.
    pub fn unanswered(&self) -> usize {
        self.replicas.len() - self.granted.len() - self.refused.len()
    }

    fn release(&self) -> Request<K, O> {
        Request::Release {
            key: self.key.clone(),
            owner: self.owner.clone(),
        }
    }

    /// How many replicas the claim asked.
    pub fn replica_count(&self) -> usize {
        self.replicas.len()
    }

    /// Past the deadline, a claim without a majority is lost; past its grace, a first claim
    /// with a majority is decided without the replicas still silent. Returns the requests
    /// to send again: to the replicas that named another holder, when it is time to ask
    /// them again.
    pub fn handle_timeout(&mut self, now: Instant) -> Outgoing<R, K, O> {
        let mut again = Vec::new();
        if self.outcome.is_none() && self.recheck_at.is_some_and(|t| now >= t) {
            self.recheck_at = None;
            self.rechecks_left = self.rechecks_left.saturating_sub(1);
            let owner = &self.owner;
            let (named, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.refused)
                .into_iter()
                .partition(|(_, o)| o.as_ref().is_some_and(|o| o != owner));
            self.refused = kept;
            // Their new answers are waited for, up to the deadline.
            self.grace_until = Some(self.deadline);
            self.rechecked.clone_from(&named);
            again = named
                .into_iter()
                .map(|(r, _)| {
                    let request = Request::Claim {
                        key: self.key.clone(),
                        owner: self.owner.clone(),
                        ttl: self.ttl,
                    };
                    (r, request)
                })
                .collect();
        }
        self.decide(now, now >= self.deadline);
        again
    }

    /// When [`Claim::handle_timeout`] wants to be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.outcome.is_some() {
            return None;
        }
        [Some(self.deadline), self.grace_until, self.recheck_at]
            .into_iter()
            .flatten()
            .min()
    }

    /// The result, once decided.
    pub fn outcome(&self) -> Option<&Outcome<R, O>> {
        self.outcome.as_ref()
    }

    /// The requests that give back what this claim holds (after losing, or to release a
    /// won lease on leave).
    pub fn releases(&self) -> Outgoing<R, K, O> {
        self.granted
            .iter()
            .map(|r| (r.clone(), self.release()))
            .collect()
    }

    fn decide(&mut self, now: Instant, timed_out: bool) {
        if self.outcome.is_some() {
            return;
        }
        if self.renewal {
            if self.unanswered() == 0 || timed_out || self.replicas.is_empty() {
                self.decide_renewal((!timed_out).then_some(now));
            }
            return;
        }
        let majority = self.majority();
        let unanswered = self.unanswered();
        if !self.replicas.is_empty() && self.granted.len() >= majority {
            if !self.heed_holders {
                self.outcome = Some(Outcome::Won);
                return;
            }
            let waited =
                unanswered == 0 || timed_out || now >= *self.grace_until.get_or_insert(now + GRACE);
            if !waited {
                return;
            }
            let owner = &self.owner;
            // A replica asked again that fell silent still counts for whom it named.
            let silent = self
                .rechecked
                .iter()
                .find(|(r, _)| !self.answered(r))
                .and_then(|(_, o)| o.clone());
            let named = silent.is_some()
                || self
                    .refused
                    .iter()
                    .any(|(_, o)| o.as_ref().is_some_and(|o| o != owner));
            if !named {
                self.outcome = Some(Outcome::Won);
            } else if self.rechecks_left > 0 && !timed_out {
                self.recheck_at.get_or_insert(now + RECHECK_DELAY);
            } else {
                self.outcome = Some(Outcome::Lost {
                    holder: self.most_named_holder().or(silent),
                    release_to: self.granted.clone(),
                });
            }
            return;
        }
        let hopeless = self.granted.len() + unanswered < majority;
        if hopeless || timed_out || self.replicas.is_empty() {
            self.outcome = Some(Outcome::Lost {
                holder: self.most_named_holder(),
                release_to: self.granted.clone(),
            });
        }
    }

    /// The merge rule, once every replica answered (or the deadline passed): the rivals
    /// that count are those at least [`Claim::strong`] replicas name. This owner yields if
    /// one of them has a lower key, or if it holds fewer than that itself (its rivals do
    /// not count it); it keeps the key against rivals that count but rank after it.
    /// Without rivals that count, a majority of grants renews; fewer is a renewal that went
    /// unanswered (`Lost` with no holder and nothing to give back).
    ///
    /// Before the merge rule decides, the replicas naming a rival that counts are asked
    /// again (every [`RECHECK_DELAY`], up to [`RECHECKS`] times, within the deadline: `now`
    /// is None past it): the rival may be a first claim of the same moment, granted on
    /// replicas that lost or never had this owner's lease, which gives its grants back as
    /// soon as it loses. Yielding to it took live owners' addresses away (the history
    /// checker's seed 69). A rival from a merged partition is named again, and the rule
    /// applies.
    fn decide_renewal(&mut self, now: Option<Instant>) {
        let strong = self.strong();
        let mut rivals: Vec<&O> = Vec::new();
        for (_, owner) in &self.refused {
            let Some(owner) = owner else { continue };
            let named = self
                .refused
                .iter()
                .filter(|(_, o)| o.as_ref() == Some(owner))
                .count();
            if named >= strong && *owner != self.owner && !rivals.contains(&owner) {
                rivals.push(owner);
            }
        }
        let Some(first) = rivals.iter().min().map(|o| (*o).clone()) else {
            // No rival counts: a renewal short of its majority lacked answers (lost, or
            // late), nothing more. The owner keeps its lease, and what it was granted, and
            // renews again soon: yielding to a holder one replica names (a rival's passing
            // grant, given back since) would take a live owner's address away, and giving
            // back its own grants would weaken the lease it still holds. Found by the
            // history checker (crates/testbed/tests/history.rs, seed 29).
            self.outcome = Some(if self.granted.len() >= self.majority() {
                Outcome::Won
            } else {
                Outcome::Lost {
                    holder: None,
                    release_to: Vec::new(),
                }
            });
            return;
        };
        if let Some(now) = now.filter(|_| self.rechecks_left > 0) {
            self.recheck_at.get_or_insert(now + RECHECK_DELAY);
            return;
        }
        let keeps = self.owner < first && self.granted.len() >= strong;
        self.outcome = Some(if keeps {
            Outcome::Kept { rival: first }
        } else {
            Outcome::Lost {
                holder: Some(first),
                release_to: self.granted.clone(),
            }
        });
    }

    fn most_named_holder(&self) -> Option<O> {
        let mut best: Option<(&O, usize)> = None;
        for (_, owner) in &self.refused {
            let Some(owner) = owner else { continue };
            let n = self
                .refused
                .iter()
                .filter(|(_, o)| o.as_ref() == Some(owner))
                .count();
            if best.is_none_or(|(_, m)| n > m) {
                best = Some((owner, n));
            }
        }
        best.map(|(o, _)| o.clone())
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // a base instant for the virtual clock
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(30);

    #[test]
    fn replica_is_compare_and_set() {
        let t0 = Instant::now();
        let mut r: Replica<u32, &str> = Replica::default();
        let claim = |owner| Request::Claim {
            key: 7,
            owner,
            ttl: TTL,
        };
        assert_eq!(r.handle(t0, claim("a")), Response::Granted);
        assert_eq!(
            r.handle(t0, claim("b")),
            Response::Held {
                owner: "a",
                remaining: TTL
            }
        );
        // The holder renews.
        let t1 = t0 + Duration::from_secs(20);
        assert_eq!(r.handle(t1, claim("a")), Response::Granted);
        // Not expired at t0 + 40 s thanks to the renewal; expired at t1 + TTL.
        assert!(matches!(
            r.handle(t0 + Duration::from_secs(40), claim("b")),
            Response::Held { .. }
        ));
        assert_eq!(r.handle(t1 + TTL, claim("b")), Response::Granted);
        // Only the holder releases.
        r.handle(t1 + TTL, Request::Release { key: 7, owner: "a" });
        assert_eq!(r.holder(t1 + TTL, &7), Some(&"b"));
        r.handle(t1 + TTL, Request::Release { key: 7, owner: "b" });
        assert_eq!(r.holder(t1 + TTL, &7), None);
    }

    #[test]
    fn majority_wins_and_split_votes_release() {
        let t0 = Instant::now();
        let (mut a, reqs) = Claim::new(t0, 1u32, "a", TTL, vec![1, 2, 3, 4, 5], TTL);
        assert_eq!(reqs.len(), 5);
        a.handle_response(t0, 1, Response::Granted);
        a.handle_response(t0, 2, Response::Granted);
        assert_eq!(a.outcome(), None);
        a.handle_response(t0, 2, Response::Granted); // a repeat does not count twice
        a.handle_response(t0, 9, Response::Granted); // nor does a stranger
        assert_eq!(a.outcome(), None);
        a.handle_response(t0, 3, Response::Granted);
        // A majority: replicas 4 and 5 are waited for (one may name an older holder),
        // for a grace at most.
        assert_eq!(a.outcome(), None);
        assert_eq!(a.poll_timeout(), Some(t0 + GRACE));
        a.handle_timeout(t0 + GRACE);
        assert_eq!(a.outcome(), Some(&Outcome::Won));

        let (mut b, _) = Claim::new(t0, 1u32, "b", TTL, vec![1, 2, 3, 4, 5], TTL);
        let held = |o| Response::Held {
            owner: o,
            remaining: TTL,
        };
        b.handle_response(t0, 4, Response::Granted);
        b.handle_response(t0, 1, held("a"));
        b.handle_response(t0, 2, held("a"));
        assert_eq!(
            b.outcome(),
            None,
            "replicas 3 and 5 could still make a majority"
        );
        b.handle_response(t0, 3, held("a"));
        assert_eq!(
            b.outcome(),
            Some(&Outcome::Lost {
                holder: Some("a"),
                release_to: vec![4]
            })
        );
        // Replica 5 grants after the loss: that grant is given back at once, not held
        // for a loser until it expires; a repeat sends nothing more.
        assert_eq!(b.unanswered(), 1);
        let release = Request::Release { key: 1, owner: "b" };
        assert_eq!(
            b.handle_response(t0, 5, Response::Granted),
            vec![(5, release)]
        );
        assert_eq!(b.unanswered(), 0);
        assert_eq!(b.handle_response(t0, 5, Response::Granted), vec![]);
        // A winner keeps its late grants.
        assert_eq!(a.handle_response(t0, 4, Response::Granted), vec![]);
    }

    #[test]
    fn a_first_claim_loses_to_a_holder_one_replica_names_after_asking_again() {
        // A lease from when the namespace was small: only replica 1 of this set holds it.
        let t0 = Instant::now();
        let (mut c, _) = Claim::new(t0, 1u32, "new", TTL, vec![1, 2, 3, 4, 5], TTL);
        for r in [2, 3, 4, 5] {
            c.handle_response(t0, r, Response::Granted);
        }
        assert_eq!(c.outcome(), None, "replica 1 is waited for");
        c.handle_response(t0, 1, held("old"));
        assert_eq!(c.outcome(), None, "asked again first");
        let mut at = t0;
        for _ in 0..RECHECKS {
            at = c.poll_timeout().expect("a recheck is due");
            assert_eq!(at, t0.max(at), "time moves on");
            let again = c.handle_timeout(at);
            assert_eq!(again.len(), 1);
            assert_eq!(again[0].0, 1);
            assert!(matches!(again[0].1, Request::Claim { owner: "new", .. }));
            c.handle_response(at, 1, held("old"));
        }
        assert!(at >= t0 + RECHECK_DELAY * u32::from(RECHECKS));
        assert_eq!(
            c.outcome(),
            Some(&Outcome::Lost {
                holder: Some("old"),
                release_to: vec![2, 3, 4, 5]
            })
        );
    }

    #[test]
    fn a_rival_that_lost_at_the_same_moment_gives_way() {
        // `a` and `b` claim together: `a` gets three grants, `b` two; `b` loses at once and
        // gives its grants back, and `a`, asking replicas 4 and 5 again, wins them all.
        let t0 = Instant::now();
        let (mut a, _) = Claim::new(t0, 1u32, "a", TTL, vec![1, 2, 3, 4, 5], TTL);
        let (mut b, _) = Claim::new(t0, 1u32, "b", TTL, vec![1, 2, 3, 4, 5], TTL);
        for r in [1, 2, 3] {
            a.handle_response(t0, r, Response::Granted);
            b.handle_response(t0, r, held("a"));
        }
        for r in [4, 5] {
            b.handle_response(t0, r, Response::Granted);
            a.handle_response(t0, r, held("b"));
        }
        assert!(matches!(
            b.outcome(),
            Some(Outcome::Lost {
                holder: Some("a"),
                ..
            })
        ));
        assert_eq!(a.outcome(), None);
        let at = a.poll_timeout().expect("a recheck is due");
        assert_eq!(at, t0 + RECHECK_DELAY);
        let again = a.handle_timeout(at);
        assert_eq!(
            again.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
            vec![4, 5]
        );
        a.handle_response(at, 4, Response::Granted);
        assert_eq!(a.outcome(), None, "replica 5 is waited for");
        a.handle_response(at, 5, Response::Granted);
        assert_eq!(a.outcome(), Some(&Outcome::Won));
    }

    #[test]
    fn a_replica_asked_again_that_falls_silent_still_names_its_holder() {
        let t0 = Instant::now();
        let deadline = Duration::from_secs(2);
        let (mut c, _) = Claim::new(t0, 1u32, "new", TTL, vec![1, 2, 3], deadline);
        c.handle_response(t0, 2, Response::Granted);
        c.handle_response(t0, 3, Response::Granted);
        c.handle_response(t0, 1, held("old"));
        c.handle_timeout(t0 + RECHECK_DELAY);
        assert_eq!(c.poll_timeout(), Some(t0 + deadline));
        c.handle_timeout(t0 + deadline);
        assert_eq!(
            c.outcome(),
            Some(&Outcome::Lost {
                holder: Some("old"),
                release_to: vec![2, 3]
            })
        );
    }

    #[test]
    fn a_transfer_is_decided_by_the_majority_alone() {
        let t0 = Instant::now();
        let (c, _) = Claim::new(t0, 1u32, "to", TTL, vec![1, 2, 3], TTL);
        let mut c = c.transfer();
        c.handle_response(t0, 1, held("other"));
        c.handle_response(t0, 2, Response::Granted);
        c.handle_response(t0, 3, Response::Granted);
        assert_eq!(c.outcome(), Some(&Outcome::Won));
    }

    #[test]
    fn silence_is_a_loss_at_the_deadline() {
        let t0 = Instant::now();
        let (mut c, _) = Claim::new(t0, 1u32, "c", TTL, vec![1, 2, 3], Duration::from_secs(2));
        c.handle_response(t0, 1, Response::Granted);
        c.handle_timeout(t0 + Duration::from_secs(1));
        assert_eq!(c.outcome(), None);
        assert_eq!(c.poll_timeout(), Some(t0 + Duration::from_secs(2)));
        c.handle_timeout(t0 + Duration::from_secs(2));
        assert!(
            matches!(c.outcome(), Some(Outcome::Lost { release_to, .. }) if release_to == &vec![1])
        );
        let (empty, _) = Claim::<u32, &str, u32>::new(t0, 1, "d", TTL, vec![], TTL);
        assert!(matches!(empty.outcome(), Some(Outcome::Lost { .. })));
    }

    /// Two owners of one key meet after a merge: `a` (lower key) and `b` each renew, and
    /// the replicas answer from what they hold.
    fn renew(
        owner: &'static str,
        answers: &[(u32, Response<&'static str>)],
    ) -> Outcome<u32, &'static str> {
        let t0 = Instant::now();
        let replicas: Vec<u32> = answers.iter().map(|(r, _)| *r).collect();
        let (claim, _) = Claim::new(t0, 1u32, owner, TTL, replicas, TTL);
        let mut claim = claim.renewal();
        for (r, answer) in answers {
            assert_eq!(claim.outcome(), None, "a renewal waits for every replica");
            claim.handle_response(t0, *r, answer.clone());
        }
        // The replicas naming a rival that counts are asked again: each names it again
        // (a rival from a merged partition), until the rechecks run out.
        let mut rechecks = 0;
        while claim.outcome().is_none() {
            let at = claim.poll_timeout().expect("a recheck is due");
            assert!(at < t0 + TTL, "decided before the deadline");
            for (r, _) in claim.handle_timeout(at) {
                let (_, answer) = answers.iter().find(|(x, _)| *x == r).unwrap();
                claim.handle_response(at, r, answer.clone());
            }
            rechecks += 1;
        }
        assert!(rechecks <= usize::from(RECHECKS) + 1);
        claim.outcome().cloned().expect("decided")
    }

    fn held(owner: &'static str) -> Response<&'static str> {
        Response::Held {
            owner,
            remaining: TTL,
        }
    }

    #[test]
    fn merged_partitions_keep_the_lower_owner_key_whoever_asks_first() {
        // Two groups of two merged: each owner holds two of the four replicas.
        let a_view = [
            (1, Response::Granted),
            (2, Response::Granted),
            (3, held("b")),
            (4, held("b")),
        ];
        let b_view = [
            (1, held("a")),
            (2, held("a")),
            (3, Response::Granted),
            (4, Response::Granted),
        ];
        assert_eq!(renew("a", &a_view), Outcome::Kept { rival: "b" });
        assert_eq!(
            renew("b", &b_view),
            Outcome::Lost {
                holder: Some("a"),
                release_to: vec![3, 4]
            }
        );
        // Five replicas, `b` took the free one first and holds a majority: the rule, not
        // the majority, decides, so `b` still yields (and `a` keeps).
        let b_view = [
            (1, held("a")),
            (2, held("a")),
            (3, Response::Granted),
            (4, Response::Granted),
            (5, Response::Granted),
        ];
        assert_eq!(
            renew("b", &b_view),
            Outcome::Lost {
                holder: Some("a"),
                release_to: vec![3, 4, 5]
            }
        );
        let a_view = [
            (1, Response::Granted),
            (2, Response::Granted),
            (3, held("b")),
            (4, held("b")),
            (5, held("b")),
        ];
        assert_eq!(renew("a", &a_view), Outcome::Kept { rival: "b" });
        // Once `b` gave its grants back, `a`'s next renewal wins the whole set.
        let all = [
            (1, Response::Granted),
            (2, Response::Granted),
            (3, Response::Granted),
            (4, Response::Granted),
            (5, Response::Granted),
        ];
        assert_eq!(renew("a", &all), Outcome::Won);
    }

    #[test]
    fn an_owner_on_too_few_replicas_yields_and_one_liar_cannot_evict() {
        // In a set of five, one replica naming a lower rival does not count: `b` keeps its
        // majority (a lone liar cannot make an owner yield)...
        let b_view = [
            (1, held("a")),
            (2, Response::Granted),
            (3, Response::Granted),
            (4, Response::Granted),
            (5, Response::Granted),
        ];
        assert_eq!(renew("b", &b_view), Outcome::Won);
        // ...and `a`, on that one replica only, yields although its key is lower: `b`
        // cannot count it, so keeping would leave two owners.
        let a_view = [
            (1, Response::Granted),
            (2, held("b")),
            (3, held("b")),
            (4, held("b")),
            (5, held("b")),
        ];
        assert_eq!(
            renew("a", &a_view),
            Outcome::Lost {
                holder: Some("b"),
                release_to: vec![1]
            }
        );
        // Too few grants and no rival that counts: unanswered, and the owner keeps what it
        // has (it renews again soon); it gives nothing back.
        let quiet = [
            (1, Response::Granted),
            (2, Response::Full),
            (3, Response::Full),
        ];
        assert_eq!(
            renew("a", &quiet),
            Outcome::Lost {
                holder: None,
                release_to: Vec::new()
            }
        );
        // Three partitions: the lowest key among the rivals that count keeps.
        let c_view = [(1, held("a")), (2, held("b")), (3, Response::Granted)];
        assert_eq!(
            renew("c", &c_view),
            Outcome::Lost {
                holder: Some("a"),
                release_to: vec![3]
            }
        );
        let b_view = [(1, held("a")), (2, Response::Granted), (3, held("c"))];
        assert_eq!(
            renew("b", &b_view),
            Outcome::Lost {
                holder: Some("a"),
                release_to: vec![2]
            }
        );
        let a_view = [(1, Response::Granted), (2, held("b")), (3, held("c"))];
        assert_eq!(renew("a", &a_view), Outcome::Kept { rival: "b" });
    }

    #[test]
    fn a_renewal_asks_again_before_yielding_to_a_rival_of_the_same_moment() {
        // The history checker's seed 69: `b` renews with a majority while a newcomer `a`
        // holds passing grants on two replicas (one restarted empty, one whose lease of
        // `b`'s had run out). `a` loses and gives them back; asked again, they grant `b`.
        let t0 = Instant::now();
        let (claim, _) = Claim::new(t0, 1u32, "b", TTL, vec![1, 2, 3, 4, 5], TTL);
        let mut claim = claim.renewal();
        for (r, answer) in [
            (1, Response::Granted),
            (2, Response::Granted),
            (3, Response::Granted),
            (4, held("a")),
            (5, held("a")),
        ] {
            claim.handle_response(t0, r, answer);
        }
        assert_eq!(claim.outcome(), None, "not yet: asked again first");
        let at = claim.poll_timeout().unwrap();
        assert_eq!(at, t0 + RECHECK_DELAY);
        let again: Vec<u32> = claim
            .handle_timeout(at)
            .into_iter()
            .map(|(r, _)| r)
            .collect();
        assert_eq!(again, vec![4, 5]);
        claim.handle_response(at, 4, Response::Granted);
        claim.handle_response(at, 5, Response::Granted);
        assert_eq!(claim.outcome(), Some(&Outcome::Won));
    }

    #[test]
    fn a_renewal_short_of_answers_never_yields_to_a_rival_one_replica_names() {
        // The history checker's seed 29: two answers lost, and one replica still holding a
        // newcomer's passing grant (the newcomer lost and gave it back a moment later).
        let t0 = Instant::now();
        let (claim, _) = Claim::new(t0, 1u32, "b", TTL, vec![1, 2, 3, 4, 5], TTL);
        let mut claim = claim.renewal();
        claim.handle_response(t0, 1, Response::Granted);
        claim.handle_response(t0, 2, Response::Granted);
        claim.handle_response(t0, 3, held("a"));
        claim.handle_timeout(t0 + TTL);
        assert_eq!(
            claim.outcome(),
            Some(&Outcome::Lost {
                holder: None,
                release_to: Vec::new()
            }),
            "the owner keeps its address and its grants, and renews again"
        );
    }

    #[test]
    fn a_renewal_without_rivals_is_decided_at_the_deadline_too() {
        let t0 = Instant::now();
        let (claim, _) = Claim::new(t0, 1u32, "a", TTL, vec![1, 2, 3], Duration::from_secs(2));
        let mut claim = claim.renewal();
        claim.handle_response(t0, 1, Response::Granted);
        claim.handle_response(t0, 2, Response::Granted);
        // A majority, but replica 3 may still name a rival: not decided before it answers.
        assert_eq!(claim.outcome(), None);
        claim.handle_timeout(t0 + Duration::from_secs(2));
        assert_eq!(claim.outcome(), Some(&Outcome::Won));
    }
}
