//! A history checker for address leases (issue 33, item 5), in the manner of Jepsen's:
//! whatever runs the lease protocol (a simulation, or agents under faults) records what
//! each replica did and what each member believed, every event stamped with a Lamport
//! clock; [`History::check`] then proves offline, from the record alone, that
//!
//! 1. no key was held by two members at the same time outside a declared partition (the
//!    members' view: from a won claim to the end of its lease, its loss or its release);
//! 2. every acknowledged release took effect: a replica that acknowledged one never again
//!    names the releaser as the key's holder without granting it anew;
//! 3. no lease was lost by a live holder: a replica never grants a key to a second member
//!    while the first one's lease there runs (outside a restart, which loses its state), and
//!    a member that gives a key up to another while its lease runs does so only inside a
//!    declared partition (where the merge rule may take it).
//!
//! Times: `at` is the harness's clock (the true time, milliseconds from the start), used
//! for the members' view; a replica's `until` is on its own clock (which a test may jump),
//! and its events carry that clock's reading as `local`, so rule 3 is checked against the
//! clock the replica acted on.

use std::collections::HashMap;

/// A member (claimer and replica are both members, numbered by the harness).
pub type Member = u32;
/// A key (an address).
pub type Key = u32;

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Replica `replica` granted (or renewed) `key` to `owner` until `until` (its clock).
    Granted {
        replica: Member,
        key: Key,
        owner: Member,
        until: u64,
    },
    /// Replica `replica` moved `key` from `from` to `to`, until `until` (its clock).
    Transferred {
        replica: Member,
        key: Key,
        from: Member,
        to: Member,
        until: u64,
    },
    /// Replica `replica` acknowledged `owner`'s release of `key`.
    Released {
        replica: Member,
        key: Key,
        owner: Member,
    },
    /// Replica `replica` refused `key`, naming `holder`.
    Refused {
        replica: Member,
        key: Key,
        holder: Member,
    },
    /// Replica `replica` lost its state (killed and restarted).
    Restarted { replica: Member },
    /// Member `owner` won (or renewed) `key`: it holds it until `until` (the harness clock)
    /// unless it renews.
    Won { owner: Member, key: Key, until: u64 },
    /// Member `owner` stopped holding `key`: it gave it up to `to` (a renewal lost to
    /// another holder), or released it (`to` None).
    Gave {
        owner: Member,
        key: Key,
        to: Option<Member>,
    },
    /// Member `owner` died (kill -9): it holds nothing from now on, as far as it knows.
    Died { owner: Member },
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The Lamport clock: orders events across members.
    pub lc: u64,
    /// The harness clock, milliseconds.
    pub at: u64,
    /// The clock of the member that acted (a replica's own, possibly jumped).
    pub local: u64,
    pub op: Op,
}

/// What the checker found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// `key` was held by `a` and `b` at once, from `from` to `to` (harness clock).
    TwoHolders {
        key: Key,
        a: Member,
        b: Member,
        from: u64,
        to: u64,
    },
    /// `replica` acknowledged `owner`'s release of `key`, then named it holder again.
    ReleaseIgnored {
        replica: Member,
        key: Key,
        owner: Member,
        lc: u64,
    },
    /// `replica` granted `key` to `to` while `holder`'s lease there ran.
    LeaseTaken {
        replica: Member,
        key: Key,
        holder: Member,
        to: Member,
        lc: u64,
    },
    /// `owner` gave `key` up to `to` while its lease ran, outside any partition.
    LeaseLost {
        key: Key,
        owner: Member,
        to: Member,
        at: u64,
    },
}

/// The record of one run.
#[derive(Debug, Default, Clone)]
pub struct History {
    events: Vec<Event>,
    /// Declared partitions, harness clock: `[from, to)`, to including the time to heal.
    partitions: Vec<(u64, u64)>,
    clock: u64,
}

impl History {
    /// An empty record.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `op` at harness time `at`, the actor's clock reading `local`; its Lamport
    /// time, which a message carries to its receiver ([`History::receive`]).
    pub fn record(&mut self, at: u64, local: u64, op: Op) -> u64 {
        self.clock += 1;
        self.events.push(Event {
            lc: self.clock,
            at,
            local,
            op,
        });
        self.clock
    }

    /// A message leaves: its Lamport stamp (sending is an event of the sender's).
    pub fn send(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// A message stamped `lc` arrived: later events come after it.
    pub fn receive(&mut self, lc: u64) {
        self.clock = self.clock.max(lc);
    }

    /// Declares a partition from `from` to `to` (harness clock): two holders inside it are
    /// allowed, until `to` (which should include the time a heal takes).
    pub fn declare_partition(&mut self, from: u64, to: u64) {
        self.partitions.push((from, to));
    }

    /// The events, in record order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// How much of `[0, end)` lies in declared partitions, milliseconds (overlaps counted
    /// once): the time where two holders are excused.
    pub fn partitioned_ms(&self, end: u64) -> u64 {
        let mut spans = self.partitions.clone();
        spans.sort_unstable();
        let (mut total, mut reached) = (0, 0);
        for (from, to) in spans {
            let (from, to) = (from.max(reached), to.min(end));
            if from < to {
                total += to - from;
                reached = to;
            }
        }
        total
    }

    /// What the declared partitions excused: the violations found without them.
    pub fn excused(&self) -> Vec<Violation> {
        let whole = Self {
            partitions: Vec::new(),
            ..self.clone()
        };
        let found = self.check();
        whole
            .check()
            .into_iter()
            .filter(|v| !found.contains(v))
            .collect()
    }

    /// Whether `[from, to)` touches a declared partition.
    fn partitioned(&self, from: u64, to: u64) -> bool {
        self.partitions.iter().any(|&(a, b)| from < b && a < to)
    }

    /// Everything that breaks the three rules (see the module doc); empty for a good run.
    pub fn check(&self) -> Vec<Violation> {
        let mut found = self.two_holders();
        found.extend(self.replica_rules());
        found.extend(self.lost_leases());
        found
    }

    /// Each member's holding of each key, from its own events: `(key, owner, from, to)`.
    fn holdings(&self) -> Vec<(Key, Member, u64, u64)> {
        let mut open: HashMap<(Key, Member), (u64, u64)> = HashMap::new();
        let mut done = Vec::new();
        let close = |done: &mut Vec<_>, (key, owner), (from, until): (u64, u64), at: u64| {
            done.push((key, owner, from, until.min(at)));
        };
        for e in &self.events {
            match e.op {
                Op::Won { owner, key, until } => match open.get_mut(&(key, owner)) {
                    // A renewal within the lease extends it; after it ran out, a new one.
                    Some(h) if e.at < h.1 => h.1 = h.1.max(until),
                    _ => {
                        if let Some(old) = open.insert((key, owner), (e.at, until)) {
                            close(&mut done, (key, owner), old, e.at);
                        }
                    }
                },
                Op::Gave { owner, key, .. } => {
                    if let Some(h) = open.remove(&(key, owner)) {
                        close(&mut done, (key, owner), h, e.at);
                    }
                }
                Op::Died { owner } => {
                    let keys: Vec<_> = open.keys().filter(|(_, o)| *o == owner).copied().collect();
                    for k in keys {
                        if let Some(h) = open.remove(&k) {
                            close(&mut done, k, h, e.at);
                        }
                    }
                }
                _ => {}
            }
        }
        for (k, h) in open {
            close(&mut done, k, h, u64::MAX);
        }
        done
    }

    fn two_holders(&self) -> Vec<Violation> {
        let mut by_key: HashMap<Key, Vec<(Member, u64, u64)>> = HashMap::new();
        for (key, owner, from, to) in self.holdings() {
            if from < to {
                by_key.entry(key).or_default().push((owner, from, to));
            }
        }
        let mut found = Vec::new();
        for (key, mut spans) in by_key {
            spans.sort_by_key(|s| s.1);
            for (i, &(a, a_from, a_to)) in spans.iter().enumerate() {
                for &(b, b_from, b_to) in &spans[i + 1..] {
                    if b_from >= a_to {
                        break;
                    }
                    let (from, to) = (a_from.max(b_from), a_to.min(b_to));
                    if a != b && from < to && !self.partitioned(from, to) {
                        found.push(Violation::TwoHolders {
                            key,
                            a,
                            b,
                            from,
                            to,
                        });
                    }
                }
            }
        }
        found.sort_by_key(|v| match v {
            Violation::TwoHolders { from, .. } => *from,
            _ => 0,
        });
        found
    }

    /// Rules 2 and 3 at each replica, on its own clock.
    fn replica_rules(&self) -> Vec<Violation> {
        // (replica, key) -> the lease there: holder, until; and releases acknowledged.
        let mut leases: HashMap<(Member, Key), (Member, u64)> = HashMap::new();
        let mut released: HashMap<(Member, Key), Vec<Member>> = HashMap::new();
        let mut found = Vec::new();
        for e in &self.events {
            match e.op {
                Op::Granted {
                    replica,
                    key,
                    owner,
                    until,
                } => {
                    if let Some(&(holder, held_until)) = leases.get(&(replica, key)) {
                        if holder != owner && e.local < held_until {
                            found.push(Violation::LeaseTaken {
                                replica,
                                key,
                                holder,
                                to: owner,
                                lc: e.lc,
                            });
                        }
                    }
                    leases.insert((replica, key), (owner, until));
                    if let Some(r) = released.get_mut(&(replica, key)) {
                        r.retain(|o| *o != owner);
                    }
                }
                Op::Transferred {
                    replica,
                    key,
                    to,
                    until,
                    ..
                } => {
                    leases.insert((replica, key), (to, until));
                }
                Op::Released {
                    replica,
                    key,
                    owner,
                } => {
                    if leases
                        .get(&(replica, key))
                        .is_some_and(|(h, _)| *h == owner)
                    {
                        leases.remove(&(replica, key));
                    }
                    released.entry((replica, key)).or_default().push(owner);
                }
                Op::Refused {
                    replica,
                    key,
                    holder,
                } if released
                    .get(&(replica, key))
                    .is_some_and(|r| r.contains(&holder)) =>
                {
                    found.push(Violation::ReleaseIgnored {
                        replica,
                        key,
                        owner: holder,
                        lc: e.lc,
                    });
                }
                Op::Restarted { replica } => {
                    leases.retain(|(r, _), _| *r != replica);
                    released.retain(|(r, _), _| *r != replica);
                }
                _ => {}
            }
        }
        found
    }

    /// Rule 3 from the members' view: a key given up to another while its lease ran.
    fn lost_leases(&self) -> Vec<Violation> {
        let mut until: HashMap<(Key, Member), u64> = HashMap::new();
        let mut found = Vec::new();
        for e in &self.events {
            match e.op {
                Op::Won {
                    owner,
                    key,
                    until: u,
                } => {
                    until.insert((key, owner), u);
                }
                Op::Gave {
                    owner,
                    key,
                    to: Some(to),
                } => {
                    let running = until.get(&(key, owner)).is_some_and(|u| e.at < *u);
                    if running && !self.partitioned(e.at, e.at + 1) {
                        found.push(Violation::LeaseLost {
                            key,
                            owner,
                            to,
                            at: e.at,
                        });
                    }
                    until.remove(&(key, owner));
                }
                Op::Gave { owner, key, .. } => {
                    until.remove(&(key, owner));
                }
                _ => {}
            }
        }
        found
    }
}

/// One lease line of an agent's log (`hyphae_overlay::records::lease_log`, with
/// `HYPHAE_LOG=info,hyphae::lease=debug`): when (Unix milliseconds, from the log's UTC
/// timestamp), what, the key and the other party (both base64), and a duration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseLine {
    pub at: u64,
    pub what: String,
    pub key: String,
    pub other: String,
    pub ms: u64,
}

/// The lease lines of an agent's log; other lines are skipped.
pub fn lease_lines(log: &str) -> Vec<LeaseLine> {
    log.lines()
        .filter_map(|line| {
            let (stamp, rest) = line.split_once(' ')?;
            let rest = rest.split_once("hyphae::lease: ")?.1;
            let mut words = rest.split(' ');
            let what = words.next()?.to_string();
            let mut field = |name: &str| {
                words
                    .next()
                    .and_then(|w| w.strip_prefix(name))
                    .map(str::to_string)
            };
            Some(LeaseLine {
                at: unix_ms(stamp)?,
                what,
                key: field("key=")?,
                other: field("owner=")?,
                ms: field("ms=")?.parse().ok()?,
            })
        })
        .collect()
}

/// `2026-11-27T21:35:01.123456Z` as Unix milliseconds (UTC only, as the agents log).
pub fn unix_ms(stamp: &str) -> Option<u64> {
    let (date, time) = stamp.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<i64>().ok());
    let (h, min, sec) = (t.next()??, t.next()??, t.next()??);
    let ms: i64 = format!("{frac:0<3}").get(..3)?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from((((days * 24 + h) * 60 + min) * 60 + sec) * 1000 + ms).ok()
}

/// Builds a history from agents' logs. `logs` pairs each agent (numbered as the caller
/// likes) with its lease lines; `ids` maps identities (base64) to those numbers; `deaths`
/// are the kills the caller made (Unix ms: a killed agent holds nothing, and its replica
/// loses its state). Keys are numbered in order of appearance; owners not in `ids` get
/// numbers from 1,000,000 on. Times are Unix milliseconds (all agents of one host share
/// the clock).
pub fn from_logs(
    logs: &[(Member, Vec<LeaseLine>)],
    ids: &HashMap<String, Member>,
    deaths: &[(Member, u64)],
) -> History {
    let mut keys: HashMap<String, Key> = HashMap::new();
    let mut strangers: HashMap<String, Member> = HashMap::new();
    let mut events: Vec<(u64, Op)> = Vec::new();
    for (agent, lines) in logs {
        for l in lines {
            let n = keys.len() as Key;
            let key = *keys.entry(l.key.clone()).or_insert(n);
            let other = match ids.get(&l.other) {
                Some(m) => *m,
                None => {
                    let n = 1_000_000 + strangers.len() as Member;
                    *strangers.entry(l.other.clone()).or_insert(n)
                }
            };
            let (replica, until) = (*agent, l.at + l.ms);
            let op = match l.what.as_str() {
                "granted" => Op::Granted {
                    replica,
                    key,
                    owner: other,
                    until,
                },
                "refused" => Op::Refused {
                    replica,
                    key,
                    holder: other,
                },
                "released" => Op::Released {
                    replica,
                    key,
                    owner: other,
                },
                "won" => Op::Won {
                    owner: *agent,
                    key,
                    until,
                },
                "gave" => Op::Gave {
                    owner: *agent,
                    key,
                    to: Some(other),
                },
                _ => continue,
            };
            events.push((l.at, op));
        }
    }
    for &(m, at) in deaths {
        events.push((at, Op::Died { owner: m }));
        events.push((at, Op::Restarted { replica: m }));
    }
    events.sort_by_key(|(at, _)| *at);
    let mut h = History::new();
    for (at, op) in events {
        h.record(at, at, op);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn won(h: &mut History, at: u64, owner: Member, key: Key, ttl: u64) {
        h.record(
            at,
            at,
            Op::Won {
                owner,
                key,
                until: at + ttl,
            },
        );
    }

    #[test]
    fn holders_one_after_another_are_fine_and_overlaps_are_not() {
        let mut h = History::new();
        won(&mut h, 0, 1, 7, 100);
        won(&mut h, 50, 1, 7, 100); // renewed: holds to 150
        h.record(
            120,
            120,
            Op::Gave {
                owner: 1,
                key: 7,
                to: None,
            },
        );
        won(&mut h, 130, 2, 7, 100);
        // 1 died holding 8; 3 takes it after.
        won(&mut h, 0, 1, 8, 100);
        h.record(60, 60, Op::Died { owner: 1 });
        won(&mut h, 70, 3, 8, 100);
        assert_eq!(h.check(), vec![]);
        // A lease that ran out unrenewed ends at its `until`.
        won(&mut h, 300, 4, 9, 50);
        won(&mut h, 350, 5, 9, 50);
        assert_eq!(h.check(), vec![]);

        won(&mut h, 200, 6, 7, 100); // while 2 holds 7 (130..230)
        assert_eq!(
            h.check(),
            vec![Violation::TwoHolders {
                key: 7,
                a: 2,
                b: 6,
                from: 200,
                to: 230
            }]
        );
        // Inside a declared partition, allowed.
        h.declare_partition(190, 260);
        assert_eq!(h.check(), vec![]);
    }

    #[test]
    fn a_replica_that_ignores_a_release_or_takes_a_running_lease_is_caught() {
        let grant = |replica, owner, until| Op::Granted {
            replica,
            key: 7,
            owner,
            until,
        };
        let mut h = History::new();
        h.record(0, 0, grant(10, 1, 100));
        h.record(
            5,
            5,
            Op::Released {
                replica: 10,
                key: 7,
                owner: 1,
            },
        );
        h.record(6, 6, grant(10, 2, 106)); // after the release: fine
        h.record(7, 7, grant(10, 2, 107)); // its renewal: fine
        assert_eq!(h.check(), vec![]);
        h.record(8, 8, grant(10, 3, 108)); // 2's lease runs to 107
        h.record(
            9,
            9,
            Op::Refused {
                replica: 10,
                key: 7,
                holder: 1,
            },
        ); // 1 released
        let v = h.check();
        assert!(
            v.contains(&Violation::LeaseTaken {
                replica: 10,
                key: 7,
                holder: 2,
                to: 3,
                lc: 5
            }),
            "{v:?}"
        );
        assert!(
            v.contains(&Violation::ReleaseIgnored {
                replica: 10,
                key: 7,
                owner: 1,
                lc: 6
            }),
            "{v:?}"
        );
        // A restart loses the state: granting afresh after it is no violation.
        let mut h = History::new();
        h.record(0, 0, grant(10, 1, 100));
        h.record(1, 1, Op::Restarted { replica: 10 });
        h.record(2, 2, grant(10, 2, 102));
        assert_eq!(h.check(), vec![]);
    }

    #[test]
    fn a_lease_given_up_while_it_runs_is_lost_unless_partitioned() {
        let mut h = History::new();
        won(&mut h, 0, 1, 7, 100);
        h.record(
            40,
            40,
            Op::Gave {
                owner: 1,
                key: 7,
                to: Some(2),
            },
        );
        assert_eq!(
            h.check(),
            vec![Violation::LeaseLost {
                key: 7,
                owner: 1,
                to: 2,
                at: 40
            }]
        );
        h.declare_partition(0, 50);
        assert_eq!(h.check(), vec![]);
    }

    #[test]
    fn agent_log_lines_become_events() {
        assert_eq!(unix_ms("1970-01-01T00:00:01.5Z"), Some(1500));
        assert_eq!(
            unix_ms("2026-11-27T21:35:01.123456Z"),
            Some(1_795_815_301_123)
        );
        assert_eq!(unix_ms("2026-11-27 21:35:01"), None);
        let log = "2026-11-27T21:35:01.000000Z DEBUG hyphae::lease: granted key=K owner=A ms=20000\n\
                   2026-11-27T21:35:01.010000Z  INFO hyphae_agent: agent started\n\
                   2026-11-27T21:35:01.020000Z DEBUG hyphae::lease: won key=K owner=A ms=20000\n\
                   2026-11-27T21:35:02.000000Z DEBUG hyphae::lease: refused key=K owner=A ms=19000\n";
        let lines = lease_lines(log);
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].other, "A");
        let t0 = 1_795_815_301_000;
        let ids = HashMap::from([("A".to_string(), 1)]);
        // Agent 2 is the replica; agent 1 the owner (its own lines).
        let h = from_logs(
            &[
                (2, vec![lines[0].clone(), lines[2].clone()]),
                (1, vec![lines[1].clone()]),
            ],
            &ids,
            &[(1, t0 + 5_000)],
        );
        let ops: Vec<&Op> = h.events().iter().map(|e| &e.op).collect();
        assert_eq!(
            ops[..3],
            [
                &Op::Granted {
                    replica: 2,
                    key: 0,
                    owner: 1,
                    until: t0 + 20_000
                },
                &Op::Won {
                    owner: 1,
                    key: 0,
                    until: t0 + 20_020
                },
                &Op::Refused {
                    replica: 2,
                    key: 0,
                    holder: 1
                },
            ]
        );
        assert_eq!(ops[3], &Op::Died { owner: 1 });
        assert_eq!(h.check(), vec![]);
    }

    #[test]
    fn lamport_time_follows_messages() {
        let mut h = History::new();
        let a = h.record(0, 0, Op::Restarted { replica: 1 });
        h.receive(a + 10);
        let b = h.record(1, 1, Op::Restarted { replica: 2 });
        assert_eq!(b, a + 11);
        assert_eq!(h.events().len(), 2);
    }
}
