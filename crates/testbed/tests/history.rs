#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]
#![allow(clippy::print_stdout)] // prints its figures (run with --nocapture)
//! Issue 33, item 5: the lease protocol (`hyphae_overlay::lease`, the code the agents run)
//! under random faults, every replica's grants, refusals and releases and every member's
//! wins and losses recorded, then checked offline by `hyphae_testbed::history`.
//!
//! Thirty members, each a replica and a claimer, contend for 40 addresses over a simulated
//! network (1-20 ms delays, 2% of messages lost, 2% duplicated) on a virtual clock, for a
//! minute: members are killed (their replica state lost) and restarted, the network is cut
//! in two and healed (a declared partition), one member's clock jumps 1.5 s ahead, owners
//! renew every TTL/3 and sometimes release. A seed fixes a run; `HISTORY_SEEDS=N` runs N
//! seeds (the longer mode, by hand). Two mutations must fail the check: claimers that ask
//! only part of the replica set (the majority rule broken), and replicas that grant without
//! compare-and-set.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashSet};
use std::time::{Duration, Instant};

use hyphae_overlay::lease::{Claim, Outcome, Replica, Request, Response};
use hyphae_testbed::history::{History, Op, Violation};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MEMBERS: u32 = 30;
const KEYS: u32 = 40;
const REPLICAS: usize = 5;
const TTL_MS: u64 = 6_000;
const CLAIM_TIMEOUT: Duration = Duration::from_millis(200);
const TICK_MS: u64 = 5;
const RUN_MS: u64 = 60_000;
/// After a cut heals, owners meet their rivals at their next renewal (every TTL/3): two
/// holders are allowed until a TTL after the heal.
const HEAL_MS: u64 = TTL_MS;

#[derive(Clone, Copy, PartialEq)]
enum Mutation {
    None,
    /// Each claimer asks only two replicas of the key's five, chosen by its id: its
    /// "majority" is of what it asked.
    PartOfTheSet,
    /// Replicas grant every claim, overwriting the lease.
    NoCompareAndSet,
}

#[derive(Clone)]
enum Msg {
    Request {
        from: u32,
        to: u32,
        request: Request<u32, u32>,
        lc: u64,
    },
    Response {
        from: u32,
        to: u32,
        key: u32,
        response: Response<u32>,
        lc: u64,
    },
}

#[derive(Default)]
struct Claimer {
    /// The key held and until when (its own view: the claim's start plus the TTL).
    held: Option<(u32, u64)>,
    /// The claim in flight, whether a renewal, and when it started.
    claim: Option<(Claim<u32, u32, u32>, bool, u64)>,
    /// Lost claims still owed answers: late grants are given back.
    lost: Vec<Claim<u32, u32, u32>>,
    next_at: u64,
    /// Keys in this member's order of preference, and where it is.
    order: Vec<u32>,
    next: usize,
}

struct Sim {
    rng: StdRng,
    mutation: Mutation,
    base: Instant,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    msgs: BTreeMap<u64, Msg>,
    replicas: Vec<Replica<u32, u32>>,
    claimers: Vec<Claimer>,
    alive: Vec<bool>,
    restart_at: Vec<Option<u64>>,
    /// Each member's side while the network is cut, and when the cut heals.
    side: Option<Vec<bool>>,
    heal_at: u64,
    /// Each member's clock, ahead of the true time by this much.
    skew: Vec<u64>,
    history: History,
    faults: BTreeMap<&'static str, u32>,
    wins: u32,
}

impl Sim {
    fn new(seed: u64, mutation: Mutation) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let claimers = (0..MEMBERS)
            .map(|_| {
                let mut order: Vec<u32> = (1..=KEYS).collect();
                for i in (1..order.len()).rev() {
                    order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
                }
                Claimer {
                    order,
                    ..Claimer::default()
                }
            })
            .collect();
        Self {
            rng,
            mutation,
            base: Instant::now(),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            msgs: BTreeMap::new(),
            replicas: (0..MEMBERS).map(|_| Replica::default()).collect(),
            claimers,
            alive: vec![true; MEMBERS as usize],
            restart_at: vec![None; MEMBERS as usize],
            side: None,
            heal_at: 0,
            skew: vec![0; MEMBERS as usize],
            history: History::new(),
            faults: BTreeMap::new(),
            wins: 0,
        }
    }

    fn below(&mut self, n: u64) -> u64 {
        self.rng.next_u64() % n
    }

    /// Member `m`'s clock, as an instant for the lease code and in milliseconds.
    fn clock(&self, m: u32) -> (Instant, u64) {
        let local = self.now + self.skew[m as usize];
        (self.base + Duration::from_millis(local), local)
    }

    fn reachable(&self, a: u32, b: u32) -> bool {
        self.side
            .as_ref()
            .is_none_or(|s| s[a as usize] == s[b as usize])
    }

    fn send(&mut self, msg: Msg) {
        let (from, to) = match &msg {
            Msg::Request { from, to, .. } | Msg::Response { from, to, .. } => (*from, *to),
        };
        if !self.reachable(from, to) || self.below(1000) < 20 {
            return;
        }
        let copies = if self.below(1000) < 20 { 2 } else { 1 };
        if copies == 2 {
            *self.faults.entry("duplicated").or_default() += 1;
        }
        for _ in 0..copies {
            let at = self.now + 1 + self.below(20);
            self.msgs.insert(self.seq, msg.clone());
            self.queue.push(Reverse((at, self.seq)));
            self.seq += 1;
        }
    }

    /// The replica set of `key` as member `m` finds it: the five live members it can reach
    /// that rank first for the key (all agree while the network is whole).
    fn replicas_for(&self, m: u32, key: u32) -> Vec<u32> {
        let mut ranked: Vec<(u64, u32)> = (0..MEMBERS)
            .filter(|&r| self.alive[r as usize] && self.reachable(m, r))
            .map(|r| {
                let x = (u64::from(key) << 32 | u64::from(r)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                (x ^ (x >> 29), r)
            })
            .collect();
        ranked.sort_unstable();
        let set: Vec<u32> = ranked.into_iter().take(REPLICAS).map(|(_, r)| r).collect();
        if self.mutation == Mutation::PartOfTheSet && set.len() == REPLICAS {
            // Replicas 0 and 1 of the set, or 3 and 4: two claimers may share none.
            let start = if m.is_multiple_of(2) { 0 } else { 3 };
            return set[start..start + 2].to_vec();
        }
        set
    }

    fn start_claim(&mut self, m: u32, key: u32, renewal: bool) {
        let (now, _) = self.clock(m);
        let replicas = self.replicas_for(m, key);
        let ttl = Duration::from_millis(TTL_MS);
        let (claim, requests) = Claim::new(now, key, m, ttl, replicas, CLAIM_TIMEOUT);
        let claim = if renewal { claim.renewal() } else { claim };
        self.claimers[m as usize].claim = Some((claim, renewal, self.now));
        self.requests(m, requests);
    }

    fn requests(&mut self, from: u32, requests: Vec<(u32, Request<u32, u32>)>) {
        for (to, request) in requests {
            let lc = self.history.send();
            self.send(Msg::Request {
                from,
                to,
                request,
                lc,
            });
        }
    }

    /// A replica answers, and the history records what it did.
    fn replica(&mut self, to: u32, from: u32, request: Request<u32, u32>) {
        let (now, local) = self.clock(to);
        let (key, owner, ttl) = match &request {
            Request::Claim { key, owner, ttl } => (*key, *owner, Some(*ttl)),
            Request::Release { key, owner } => (*key, *owner, None),
        };
        let response = match (self.mutation, ttl) {
            (Mutation::NoCompareAndSet, Some(ttl)) => {
                // The holder's lease is dropped first: the claim always wins.
                let replica = &mut self.replicas[to as usize];
                if let Some(holder) = replica.holder(now, &key).copied() {
                    replica.handle(now, Request::Release { key, owner: holder });
                }
                replica.handle(now, Request::Claim { key, owner, ttl })
            }
            _ => self.replicas[to as usize].handle(now, request),
        };
        let op = match (&response, ttl) {
            (Response::Granted, Some(ttl)) => Some(Op::Granted {
                replica: to,
                key,
                owner,
                until: local + ttl.as_millis() as u64,
            }),
            (Response::Held { owner: holder, .. }, _) => Some(Op::Refused {
                replica: to,
                key,
                holder: *holder,
            }),
            (Response::Released, None) => Some(Op::Released {
                replica: to,
                key,
                owner,
            }),
            _ => None,
        };
        let lc = match op {
            Some(op) => self.history.record(self.now, local, op),
            None => 0,
        };
        self.send(Msg::Response {
            from: to,
            to: from,
            key,
            response,
            lc,
        });
    }

    fn response(&mut self, to: u32, from: u32, key: u32, response: Response<u32>) {
        let (now, _) = self.clock(to);
        let c = &mut self.claimers[to as usize];
        let releases = match c.claim.as_mut() {
            Some((claim, _, _)) if *claim.key() == key => {
                claim.handle_response(now, from, response)
            }
            _ => c
                .lost
                .iter_mut()
                .find(|l| *l.key() == key && l.unanswered() > 0)
                .map(|l| l.handle_response(now, from, response))
                .unwrap_or_default(),
        };
        self.requests(to, releases);
    }

    /// Member `m`'s timers: its claim's, then a renewal or a new claim when due.
    fn claimer(&mut self, m: u32) {
        let (now, _) = self.clock(m);
        let again = match self.claimers[m as usize].claim.as_mut() {
            Some((claim, _, _)) => claim.handle_timeout(now),
            None => Vec::new(),
        };
        self.requests(m, again);
        self.settle(m);
        let c = &self.claimers[m as usize];
        if c.claim.is_some() || self.now < c.next_at {
            return;
        }
        let (held, wanted) = (c.held, c.order[c.next]);
        match held {
            Some((key, until)) if self.now >= until => {
                // Not renewed in time: it has nothing now, and claims afresh.
                self.gave(m, key, None);
                self.start_claim(m, key, false);
            }
            Some((key, _)) if self.below(100) < 3 => {
                // Now and then an owner leaves its address.
                self.gave(m, key, None);
                let releases: Vec<_> = self
                    .replicas_for(m, key)
                    .into_iter()
                    .map(|r| (r, Request::Release { key, owner: m }))
                    .collect();
                self.requests(m, releases);
                self.next_key(m, 500);
            }
            Some((key, _)) => self.start_claim(m, key, true),
            None => self.start_claim(m, wanted, false),
        }
    }

    /// Member `m` holds `key` no more (given to `to`, or left).
    fn gave(&mut self, m: u32, key: u32, to: Option<u32>) {
        self.claimers[m as usize].held = None;
        let op = Op::Gave { owner: m, key, to };
        self.history.record(self.now, self.now, op);
    }

    /// Member `m` moves to its next key, `after` milliseconds from now.
    fn next_key(&mut self, m: u32, after: u64) {
        let c = &mut self.claimers[m as usize];
        c.next = (c.next + 1) % c.order.len();
        c.next_at = self.now + after;
    }

    /// What member `m`'s claim decided, if it did.
    fn settle(&mut self, m: u32) {
        let c = &mut self.claimers[m as usize];
        let Some(outcome) = c
            .claim
            .as_ref()
            .and_then(|(claim, _, _)| claim.outcome().cloned())
        else {
            return;
        };
        let Some((claim, renewal, started)) = c.claim.take() else {
            return;
        };
        let key = *claim.key();
        match outcome {
            Outcome::Won => {
                let until = started + TTL_MS;
                c.held = Some((key, until));
                c.next_at = self.now + TTL_MS / 3;
                self.wins += 1;
                let op = Op::Won {
                    owner: m,
                    key,
                    until,
                };
                self.history.record(self.now, self.now, op);
            }
            Outcome::Kept { .. } => c.next_at = self.now + 1_000,
            Outcome::Lost { holder, release_to } => {
                match (renewal, holder) {
                    // The merge rule gave the key to another owner.
                    (true, Some(to)) => {
                        self.gave(m, key, Some(to));
                        self.next_key(m, 0);
                    }
                    // No majority answered: try again soon, the lease still runs.
                    (true, None) => c.next_at = self.now + 500,
                    (false, holder) => {
                        if claim.unanswered() > 0 {
                            c.lost.push(claim);
                            c.lost.truncate(8);
                        }
                        let backoff = self.below(50);
                        if holder.is_some() {
                            self.next_key(m, backoff);
                        } else {
                            self.claimers[m as usize].next_at = self.now + backoff;
                        }
                    }
                }
                let releases = release_to
                    .into_iter()
                    .map(|r| (r, Request::Release { key, owner: m }))
                    .collect();
                self.requests(m, releases);
            }
        }
    }

    /// Faults, at random: a kill, a restart, a cut or its heal, a clock jump.
    fn faults(&mut self) {
        for m in 0..MEMBERS {
            if self.restart_at[m as usize].is_some_and(|t| t <= self.now) {
                self.restart_at[m as usize] = None;
                self.alive[m as usize] = true;
                self.replicas[m as usize] = Replica::default();
                self.history
                    .record(self.now, self.now, Op::Restarted { replica: m });
                let order = std::mem::take(&mut self.claimers[m as usize].order);
                self.claimers[m as usize] = Claimer {
                    order,
                    next_at: self.now,
                    ..Claimer::default()
                };
            }
        }
        if !self.now.is_multiple_of(1_000) || self.now == 0 {
            return;
        }
        let dead = self.alive.iter().filter(|a| !**a).count();
        match self.below(6) {
            0 | 1 if dead < 2 => {
                let m = self.below(u64::from(MEMBERS)) as u32;
                if self.alive[m as usize] {
                    self.alive[m as usize] = false;
                    self.restart_at[m as usize] = Some(self.now + 1_000 + self.below(3_000));
                    self.history
                        .record(self.now, self.now, Op::Died { owner: m });
                    *self.faults.entry("killed").or_default() += 1;
                }
            }
            // At most two cuts a run: the time they excuse stays a small part of it.
            2 if self.side.is_none()
                && self.now < RUN_MS - 10_000
                && self.faults.get("partitions").is_none_or(|n| *n < 2) =>
            {
                let side = (0..MEMBERS).map(|_| self.below(2) == 0).collect();
                self.side = Some(side);
                let heal = self.now + 2_000 + self.below(2_000);
                self.history.declare_partition(self.now, heal + HEAL_MS);
                self.heal_at = heal;
                *self.faults.entry("partitions").or_default() += 1;
            }
            3 if self.skew.iter().all(|s| *s == 0) => {
                let m = self.below(u64::from(MEMBERS)) as usize;
                self.skew[m] = 1_500;
                *self.faults.entry("clock jumps").or_default() += 1;
            }
            _ => {}
        }
    }

    fn heal(&mut self) {
        if self.side.is_some() && self.heal_at <= self.now {
            self.side = None;
        }
    }

    fn run(&mut self) {
        while self.now < RUN_MS {
            self.faults();
            self.heal();
            while let Some(&Reverse((at, seq))) = self.queue.peek() {
                if at > self.now {
                    break;
                }
                self.queue.pop();
                let Some(msg) = self.msgs.remove(&seq) else {
                    continue;
                };
                match msg {
                    Msg::Request {
                        from,
                        to,
                        request,
                        lc,
                    } => {
                        if self.alive[to as usize] && self.reachable(from, to) {
                            self.history.receive(lc);
                            self.replica(to, from, request);
                        }
                    }
                    Msg::Response {
                        from,
                        to,
                        key,
                        response,
                        lc,
                    } => {
                        if self.alive[to as usize] && self.reachable(from, to) {
                            self.history.receive(lc);
                            self.response(to, from, key, response);
                        }
                    }
                }
            }
            for m in 0..MEMBERS {
                if self.alive[m as usize] {
                    self.claimer(m);
                }
            }
            self.now += TICK_MS;
        }
    }
}

/// Runs seed `seed` with `mutation`: the checker's findings, and the run for its figures.
fn run(seed: u64, mutation: Mutation) -> (Vec<Violation>, Sim) {
    let mut sim = Sim::new(seed, mutation);
    sim.run();
    (sim.history.check(), sim)
}

fn seeds() -> u64 {
    std::env::var("HISTORY_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
}

#[test]
fn no_address_ever_has_two_holders_under_random_faults() {
    for seed in 1..=seeds() {
        let (violations, sim) = run(seed, Mutation::None);
        let events = sim.history.events().len();
        let holders: HashSet<u32> = sim
            .claimers
            .iter()
            .filter_map(|c| c.held.map(|(k, _)| k))
            .collect();
        let excused = sim.history.partitioned_ms(RUN_MS);
        println!(
            "seed {seed}: {events} events, {} wins, faults {:?}, {:.0}% of the run in declared \
             partitions (excusing {} two-holder spans), {} keys held at the end, {} violations",
            sim.wins,
            sim.faults,
            100.0 * excused as f64 / RUN_MS as f64,
            sim.history.excused().len(),
            holders.len(),
            violations.len()
        );
        assert!(excused < RUN_MS / 2, "seed {seed}: {excused} ms excused");
        if let Some(v) = violations.first() {
            dump(&sim, v);
        }
        assert!(
            violations.is_empty(),
            "seed {seed}: {:#?}",
            &violations[..violations.len().min(5)]
        );
        // The run did what it claims: claims won and every kind of fault injected.
        assert!(sim.wins > MEMBERS * 10, "seed {seed}: {} wins", sim.wins);
        for fault in ["killed", "partitions", "clock jumps", "duplicated"] {
            assert!(
                sim.faults.get(fault).is_some_and(|n| *n > 0),
                "seed {seed}: no {fault}"
            );
        }
    }
}

/// What the checker finds in seed 1 run with `mutation` (printed as `name`).
fn mutant(name: &str, mutation: Mutation) -> Vec<Violation> {
    let (violations, _) = run(1, mutation);
    println!(
        "{name}: {} violations, first {:?}",
        violations.len(),
        violations.first()
    );
    violations
}

#[test]
fn claimers_that_ask_part_of_the_replica_set_are_caught() {
    let violations = mutant("part of the set", Mutation::PartOfTheSet);
    assert!(
        violations
            .iter()
            .any(|v| matches!(v, Violation::TwoHolders { .. })),
        "two holders not caught: {violations:?}"
    );
}

#[test]
fn replicas_without_compare_and_set_are_caught() {
    let violations = mutant("no compare-and-set", Mutation::NoCompareAndSet);
    assert!(
        violations
            .iter()
            .any(|v| matches!(v, Violation::LeaseTaken { .. })),
        "a taken lease not caught: {violations:?}"
    );
    assert!(
        violations
            .iter()
            .any(|v| matches!(v, Violation::TwoHolders { .. })),
        "two holders not caught: {violations:?}"
    );
}

/// Prints the events around violation `v`: its key's, and the deaths and restarts, in the
/// 15 s before it.
fn dump(sim: &Sim, v: &Violation) {
    let (key, at) = match v {
        Violation::TwoHolders { key, from, .. } => (*key, *from),
        Violation::LeaseLost { key, at, .. } => (*key, *at),
        Violation::ReleaseIgnored { key, .. } | Violation::LeaseTaken { key, .. } => (*key, RUN_MS),
    };
    for e in sim.history.events() {
        let mine = match e.op {
            Op::Granted { key: k, .. }
            | Op::Transferred { key: k, .. }
            | Op::Released { key: k, .. }
            | Op::Refused { key: k, .. }
            | Op::Won { key: k, .. }
            | Op::Gave { key: k, .. } => k == key,
            Op::Restarted { .. } | Op::Died { .. } => true,
        };
        if mine && e.at + 15_000 >= at && e.at <= at + 100 {
            println!(
                "  {:>6} ms  lc {:>6}  local {:>6}  {:?}",
                e.at, e.lc, e.local, e.op
            );
        }
    }
}
