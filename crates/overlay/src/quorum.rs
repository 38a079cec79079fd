//! Quorum operations on the replicas of a key, as a pure table: no swarm, no socket, no clock.
//!
//! An operation (claim, get, release, group announcement, group read) starts with
//! [`Table::start`]; the driver then looks up the peers closest to the key (a Kademlia lookup
//! in [`crate::swarm`]) and feeds them to [`Table::handle_replicas`], which picks the
//! [`REPLICAS`] closest ([`replicas`], this agent included) and returns one request per
//! replica as values. The driver sends them (the one addressed to itself it answers from its
//! own store) and feeds every answer, or `None` for a request that failed, to
//! [`Table::handle_answer`].
//!
//! Call order: after every `handle_*` call drain [`Table::poll_request`] (requests to send
//! again: a claim asks a replica that named another holder once more),
//! [`Table::poll_release`] (leases to give back at once: a lost claim's grants, and grants
//! that reach a claim already lost) and
//! [`Table::poll_event`] (finished operations); call [`Table::handle_timeout`] by
//! [`Table::poll_timeout`], when operations whose replicas did not all answer end.
//!
//! Time comes in as arguments: `now` (monotonic) for deadlines, and `wall_secs` (Unix
//! seconds) to check the expiry of the envelopes replicas return, since envelopes expire on
//! the wall clock that members share. libp2p appears only through value types: peer ids
//! and Kademlia's XOR metric.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use libp2p::kad::KBucketKey;

use crate::lease::{self, Claim, Outcome};
use crate::records::{Envelope, OwnerKey, RecordKey, RecordRequest, RecordResponse};
use crate::swarm::{NetworkId, OverlayEvent};

/// Replicas per key: a claim needs a strict majority of them.
pub const REPLICAS: usize = 5;

/// How long a replica has to answer one request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Names one operation (claim, get or release) until its event arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(u64);

impl OpId {
    /// The operation numbered `n`, for a driver's tests that answer operations in place of
    /// the overlay (the overlay numbers its own from 1).
    pub const fn from_raw(n: u64) -> Self {
        Self(n)
    }
}

/// How a claim ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimResult {
    /// A majority of the replicas granted the lease.
    Won,
    /// Another member holds the key (most refusing replicas named it), or the replicas
    /// refused without naming anyone (`None`: full, or unreachable). For a renewal, also:
    /// this owner yields the key to the named one under the merge rule.
    Lost(Option<OwnerKey>),
    /// A renewal met another owner's lease (partitions merged) and keeps the key under the
    /// merge rule ([`crate::lease`]): claim again soon, once the other owner gave it up.
    Kept(OwnerKey),
}

/// What an operation does on the replicas.
#[derive(Debug, Clone)]
pub enum Kind {
    /// Claim the key with this envelope; its owner is the claimer.
    Claim(Envelope),
    /// Renew a key the claimer holds with this envelope: decided by the merge rule when
    /// another owner's lease shows up ([`crate::lease::Claim::renewal`]).
    Renew(Envelope),
    /// Read the key.
    Get,
    /// Give the key back.
    Release,
    /// Join (or renew) the group at the key with this entry.
    Join(Envelope),
    /// Read every entry of the group at the key.
    Members,
    /// Move this agent's lease on the key to the envelope's owner, leaving the envelope
    /// (migration handoff; [`crate::records::transfer`]). Decided like a claim, by a strict
    /// majority of grants, and reported as [`OverlayEvent::Claimed`]; nothing is given back
    /// when it is lost (the grants name the new holder, which renews or lets them lapse).
    Transfer(Envelope),
}

/// Counters for status.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Envelopes from replicas that failed verification (bad signature, expired, malformed).
    pub bad_envelopes: u64,
    /// Grants that reached a claim already lost, given straight back.
    pub late_grants_released: u64,
    /// Claims sent without a lookup that a replica answered with another replica set:
    /// given up at once ([`Table::handle_known_replicas`]).
    pub replica_sets_disputed: u64,
    /// First claims given up without asking anyone: their lookup found too few members
    /// while peers of unknown membership were near ([`Table::give_up_short`]).
    pub short_claims_given_up: u64,
}

enum Stage {
    /// Waiting for the lookup of the replicas.
    Lookup,
    Claim(Box<Claim<RecordKey, OwnerKey, NetworkId>>),
    Get {
        asked: usize,
        answers: Vec<Option<Envelope>>,
        deadline: Instant,
    },
    /// A release or a group announcement: counting answers.
    Release {
        asked: usize,
        answered: usize,
        deadline: Instant,
    },
    Members {
        asked: usize,
        answered: usize,
        envelopes: Vec<Envelope>,
        deadline: Instant,
    },
}

struct Op {
    key: RecordKey,
    kind: Kind,
    stage: Stage,
    /// Peers the replica lookup queried.
    queried: u32,
}

/// The operations in flight, and the lost claims still waiting for answers.
#[derive(Default)]
pub struct Table {
    ops: HashMap<OpId, Op>,
    /// Lost claims with replicas yet to answer: a late grant is released at once.
    lost_claims: HashMap<OpId, Box<Claim<RecordKey, OwnerKey, NetworkId>>>,
    next_op: u64,
    events: VecDeque<OverlayEvent>,
    releases: VecDeque<(NetworkId, RecordKey)>,
    /// Requests to send again (a claim asking a replica that named a holder once more).
    requests: VecDeque<(OpId, NetworkId, RecordRequest)>,
    stats: Stats,
}

impl Table {
    /// Starts an operation on `key`; it waits for [`Table::handle_replicas`].
    pub fn start(&mut self, key: RecordKey, kind: Kind) -> OpId {
        let op = OpId(self.next_op);
        self.next_op += 1;
        self.ops.insert(
            op,
            Op {
                key,
                kind,
                stage: Stage::Lookup,
                queried: 0,
            },
        );
        op
    }

    /// The lookup of `op`'s replicas ended: it found `found` after querying `queried` peers.
    /// Returns the request for each replica ([`replicas`] of `found` and `local`), `local`'s
    /// included: the caller answers that one from its own store and feeds the answer back.
    /// Nothing for an unknown operation, or a claim whose envelope names no valid owner
    /// (dropped without an event).
    pub fn handle_replicas(
        &mut self,
        now: Instant,
        id: OpId,
        found: Vec<NetworkId>,
        local: NetworkId,
        queried: u32,
    ) -> Vec<(NetworkId, RecordRequest)> {
        let Some(op) = self.ops.get_mut(&id) else {
            return Vec::new();
        };
        op.queried = queried;
        let peers = replicas(&op.key, found, local);
        let (key, asked, deadline) = (op.key, peers.len(), now + REQUEST_TIMEOUT);
        let k = key.to_vec();
        // Every replica gets the same request (a claim's set is the one its lease picked).
        let (stage, request) = match &op.kind {
            Kind::Claim(envelope) | Kind::Renew(envelope) => {
                let Some(owner) = envelope.owner() else {
                    self.ops.remove(&id);
                    return Vec::new();
                };
                let (claim, _) = Claim::new(
                    now,
                    key,
                    owner,
                    Duration::ZERO,
                    peers.clone(),
                    REQUEST_TIMEOUT,
                );
                let claim = if matches!(op.kind, Kind::Renew(_)) {
                    claim.renewal()
                } else {
                    claim
                };
                let request = RecordRequest::Claim {
                    key: k,
                    envelope: envelope.clone(),
                };
                (Stage::Claim(Box::new(claim)), request)
            }
            Kind::Transfer(envelope) => {
                let Some(to) = envelope.owner() else {
                    self.ops.remove(&id);
                    return Vec::new();
                };
                let (claim, _) =
                    Claim::new(now, key, to, Duration::ZERO, peers.clone(), REQUEST_TIMEOUT);
                let claim = claim.transfer();
                let request = RecordRequest::Transfer {
                    key: k,
                    envelope: envelope.clone(),
                };
                (Stage::Claim(Box::new(claim)), request)
            }
            Kind::Get => (
                Stage::Get {
                    asked,
                    answers: Vec::new(),
                    deadline,
                },
                RecordRequest::Get { key: k },
            ),
            Kind::Release => (
                Stage::Release {
                    asked,
                    answered: 0,
                    deadline,
                },
                RecordRequest::Release { key: k },
            ),
            Kind::Join(envelope) => (
                Stage::Release {
                    asked,
                    answered: 0,
                    deadline,
                },
                RecordRequest::Join {
                    key: k,
                    envelope: envelope.clone(),
                },
            ),
            Kind::Members => (
                Stage::Members {
                    asked,
                    answered: 0,
                    envelopes: Vec::new(),
                    deadline,
                },
                RecordRequest::Members { key: k },
            ),
        };
        op.stage = stage;
        let requests = peers.into_iter().map(|p| (p, request.clone())).collect();
        self.check_done(id, now);
        requests
    }

    /// Like [`Table::handle_replicas`], for a first claim, whose replicas are checked: each
    /// replica gets the set computed from `known` (the proven members this agent knows, or
    /// those its lookup found) with the claim ([`RecordRequest::ClaimAmong`]) and grants
    /// only if it computes the same one ([`check_replicas`]). A replica that answers with
    /// another set ends the claim at once, lost without a holder, its grants given back:
    /// the caller claims again (after a lookup). Other operations are started as by
    /// [`Table::handle_replicas`].
    pub fn handle_known_replicas(
        &mut self,
        now: Instant,
        id: OpId,
        known: Vec<NetworkId>,
        local: NetworkId,
        queried: u32,
    ) -> Vec<(NetworkId, RecordRequest)> {
        let requests = self.handle_replicas(now, id, known, local, queried);
        let set: Vec<Vec<u8>> = requests.iter().map(|(p, _)| p.to_bytes()).collect();
        requests
            .into_iter()
            .map(|(p, request)| match request {
                RecordRequest::Claim { key, envelope } => (
                    p,
                    RecordRequest::ClaimAmong {
                        key,
                        envelope,
                        replicas: set.clone(),
                    },
                ),
                other => (p, other),
            })
            .collect()
    }

    /// The key of `id` if it is a first claim whose replicas among `found` (and `local`)
    /// would be fewer than [`REPLICAS`]: a set that only a small namespace may decide
    /// ([`Table::give_up_short`]).
    pub fn short_claim(
        &self,
        id: OpId,
        found: &[NetworkId],
        local: NetworkId,
    ) -> Option<RecordKey> {
        let op = self.waiting_first_claim(id)?;
        (replicas(&op.key, found.to_vec(), local).len() < REPLICAS).then_some(op.key)
    }

    /// Operation `id` if it is a first claim still waiting for its replicas.
    fn waiting_first_claim(&self, id: OpId) -> Option<&Op> {
        self.ops
            .get(&id)
            .filter(|op| matches!(op.kind, Kind::Claim(_)) && matches!(op.stage, Stage::Lookup))
    }

    /// Ends the first claim `id` at once, lost without a holder and asking no replica:
    /// its lookup found fewer than [`REPLICAS`] members while peers of unknown membership
    /// were near ([`Table::short_claim`]). A set that short may be a corner of a larger
    /// namespace, where another claimer's set shares no replica with it, so both would win;
    /// the caller claims again later, when its knowledge has caught up.
    pub fn give_up_short(&mut self, id: OpId, replicas: usize, queried: u32) {
        if self.waiting_first_claim(id).is_none() {
            return;
        }
        let Some(op) = self.ops.remove(&id) else {
            return;
        };
        self.stats.short_claims_given_up += 1;
        self.events.push_back(OverlayEvent::Claimed {
            op: id,
            key: op.key,
            result: ClaimResult::Lost(None),
            replicas,
            queried,
        });
    }

    /// `replica`'s answer to `id`'s request, or `None` if the request failed (unreachable,
    /// timed out), which counts as a refusal. `wall_secs` (Unix seconds) checks the expiry
    /// of returned envelopes.
    pub fn handle_answer(
        &mut self,
        now: Instant,
        wall_secs: u64,
        id: OpId,
        replica: NetworkId,
        response: Option<RecordResponse>,
    ) {
        let answer = response
            .as_ref()
            .and_then(RecordResponse::to_lease)
            .unwrap_or(lease::Response::Full);
        if let Some(claim) = self.lost_claims.get_mut(&id) {
            let releases = claim.handle_response(now, replica, answer);
            let key = *claim.key();
            if claim.unanswered() == 0 {
                self.lost_claims.remove(&id);
            }
            for (replica, _) in releases {
                self.stats.late_grants_released += 1;
                self.releases.push_back((replica, key));
            }
            return;
        }
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        match &mut op.stage {
            Stage::Claim(claim) => {
                // Decided claims are not in `ops`: nothing comes back to release here.
                let _ = claim.handle_response(now, replica, answer);
                if matches!(response, Some(RecordResponse::Replicas { .. })) {
                    claim.abandon();
                    self.stats.replica_sets_disputed += 1;
                }
            }
            Stage::Get { answers, .. } => {
                let envelope = match response {
                    Some(RecordResponse::Value { envelope }) => envelope,
                    _ => None,
                };
                let envelope = envelope.filter(|e| {
                    let ok = e.verify(&op.key, wall_secs).is_ok();
                    if !ok {
                        self.stats.bad_envelopes += 1;
                    }
                    ok
                });
                answers.push(envelope);
            }
            Stage::Release { answered, .. } => *answered += 1,
            Stage::Members {
                answered,
                envelopes,
                ..
            } => {
                *answered += 1;
                if let Some(RecordResponse::Members { envelopes: got }) = response {
                    let bad = merge_members(envelopes, got, &op.key, wall_secs);
                    self.stats.bad_envelopes += bad;
                }
            }
            Stage::Lookup => {}
        }
        self.check_done(id, now);
    }

    /// Ends the operations whose deadline has passed: a claim without a majority is lost,
    /// reads return what arrived, releases and announcements count as done.
    pub fn handle_timeout(&mut self, now: Instant) {
        // In id order, so a run replays the same way.
        let mut ids: Vec<OpId> = self.ops.keys().copied().collect();
        ids.sort();
        for id in ids {
            if let Some(Op {
                kind,
                stage: Stage::Claim(claim),
                key,
                ..
            }) = self.ops.get_mut(&id)
            {
                let again = claim.handle_timeout(now);
                // (A renewal asks again too, before the merge rule yields to a rival.)
                if let Kind::Claim(envelope) | Kind::Renew(envelope) = kind {
                    for (replica, _) in again {
                        let request = RecordRequest::Claim {
                            key: key.to_vec(),
                            envelope: envelope.clone(),
                        };
                        self.requests.push_back((id, replica, request));
                    }
                }
            }
            self.check_done(id, now);
        }
    }

    /// The earliest deadline of an operation waiting for answers (a lookup has its own).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.ops
            .values()
            .filter_map(|op| match &op.stage {
                Stage::Lookup => None,
                Stage::Claim(claim) => claim.poll_timeout(),
                Stage::Get { deadline, .. }
                | Stage::Release { deadline, .. }
                | Stage::Members { deadline, .. } => Some(*deadline),
            })
            .min()
    }

    /// The next finished operation.
    pub fn poll_event(&mut self) -> Option<OverlayEvent> {
        self.events.pop_front()
    }

    /// The next request to send again, for operation `id`: its answer goes to
    /// [`Table::handle_answer`] like the first.
    pub fn poll_request(&mut self) -> Option<(OpId, NetworkId, RecordRequest)> {
        self.requests.pop_front()
    }

    /// The next lease to give back: send `RecordRequest::Release` for the key to the replica.
    pub fn poll_release(&mut self) -> Option<(NetworkId, RecordKey)> {
        self.releases.pop_front()
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    fn check_done(&mut self, id: OpId, now: Instant) {
        let Some(op) = self.ops.get(&id) else {
            return;
        };
        let (key, queried) = (op.key, op.queried);
        let event = match &op.stage {
            Stage::Lookup => return,
            Stage::Claim(claim) => {
                let Some(outcome) = claim.outcome() else {
                    return;
                };
                let result = match outcome {
                    Outcome::Won => ClaimResult::Won,
                    Outcome::Lost { holder, release_to } => {
                        if !matches!(op.kind, Kind::Transfer(_)) {
                            self.releases
                                .extend(release_to.iter().map(|replica| (*replica, key)));
                        }
                        ClaimResult::Lost(*holder)
                    }
                    Outcome::Kept { rival } => ClaimResult::Kept(*rival),
                };
                OverlayEvent::Claimed {
                    op: id,
                    key,
                    result,
                    replicas: claim.replica_count(),
                    queried,
                }
            }
            Stage::Get {
                asked,
                answers,
                deadline,
            } => {
                if answers.len() < *asked && now < *deadline {
                    return;
                }
                OverlayEvent::Got {
                    op: id,
                    key,
                    envelopes: rank(answers),
                    queried,
                }
            }
            Stage::Release {
                asked,
                answered,
                deadline,
            } => {
                if answered < asked && now < *deadline {
                    return;
                }
                match op.kind {
                    Kind::Join(_) => OverlayEvent::Announced { op: id },
                    _ => OverlayEvent::Released { op: id },
                }
            }
            Stage::Members {
                asked,
                answered,
                envelopes,
                deadline,
            } => {
                if answered < asked && now < *deadline {
                    return;
                }
                OverlayEvent::Members {
                    op: id,
                    key,
                    envelopes: envelopes.clone(),
                }
            }
        };
        if let Some(Op {
            stage: Stage::Claim(claim),
            kind,
            ..
        }) = self.ops.remove(&id)
        {
            let transfer = matches!(kind, Kind::Transfer(_));
            if !transfer
                && matches!(claim.outcome(), Some(Outcome::Lost { .. }))
                && claim.unanswered() > 0
            {
                self.lost_claims.insert(id, claim);
            }
        }
        self.events.push_back(event);
    }
}

/// The replica set of `key`: the [`REPLICAS`] closest to it (Kademlia's XOR metric) among
/// `found` and `local`, closest first, each once.
pub fn replicas(key: &RecordKey, mut found: Vec<NetworkId>, local: NetworkId) -> Vec<NetworkId> {
    let target = KBucketKey::new(key.to_vec());
    found.push(local);
    found.sort_by_key(|p| KBucketKey::from(*p).distance(&target));
    found.dedup();
    found.truncate(REPLICAS);
    found
}

/// The replica set of `key` a claim without a lookup goes to: the [`REPLICAS`] closest
/// among the proven members this agent knows (`known`) and itself, provided none of the
/// peers of unknown membership it knows (`unproven`: routing-table peers that have not
/// answered its membership challenge) is closer than one of them. `None` when one is: the
/// claim then looks its replicas up.
pub fn known_replicas(
    key: &RecordKey,
    known: &[NetworkId],
    unproven: &[NetworkId],
    local: NetworkId,
) -> Option<Vec<NetworkId>> {
    let set = replicas(key, [known, unproven].concat(), local);
    set.iter().all(|p| !unproven.contains(p)).then_some(set)
}

/// A replica's check of a claim sent to the set `proposed` without a lookup
/// ([`RecordRequest::ClaimAmong`]): `Ok` when the set this replica computes from the members
/// it knows (`known`), the peers of unknown membership it knows (`unproven`), the proposed
/// ones and itself is `proposed`; otherwise `Err` with its own set. A grant then means that
/// the claimer and this replica, each from what it knows, picked the same replicas, and that
/// this replica knows no peer closer to the key that might be a member.
pub fn check_replicas(
    key: &RecordKey,
    proposed: &[NetworkId],
    known: &[NetworkId],
    unproven: &[NetworkId],
    local: NetworkId,
) -> Result<(), Vec<NetworkId>> {
    let view = replicas(key, [known, unproven, proposed].concat(), local);
    let (mut mine, mut theirs) = (view.clone(), proposed.to_vec());
    mine.sort();
    theirs.sort();
    if mine == theirs {
        Ok(())
    } else {
        Err(view)
    }
}

/// [`check_replicas`] on a [`RecordRequest::ClaimAmong`] as it came off the wire: `key` and
/// the proposed `replicas` as bytes. `Err(Rejected)` for a malformed key or set (more than
/// [`REPLICAS`] peers, or bytes that are no peer id), `Err(Replicas)` with this replica's
/// set when it computes another one, naming those of it outside the proposed set that are
/// members serving the DHT for sure: this replica, or members proven to it that are in its
/// Kademlia routing table (`dht_members`). A member that speaks no Kademlia (the
/// compromised member of `overlay --test flood`) is never named: it holds no replica.
pub fn check_claim_among(
    key: &[u8],
    replicas: &[Vec<u8>],
    known: &[NetworkId],
    unproven: &[NetworkId],
    dht_members: &[NetworkId],
    local: NetworkId,
) -> Result<(), RecordResponse> {
    let proposed: Option<Vec<NetworkId>> = replicas
        .iter()
        .map(|p| NetworkId::from_bytes(p).ok())
        .collect();
    let (Ok(key), Some(proposed)) = (RecordKey::try_from(key), proposed) else {
        return Err(RecordResponse::Rejected);
    };
    if proposed.len() > REPLICAS {
        return Err(RecordResponse::Rejected);
    }
    check_replicas(&key, &proposed, known, unproven, local).map_err(|view| {
        let members = view
            .iter()
            .filter(|p| !proposed.contains(p) && (**p == local || dht_members.contains(p)))
            .map(|p| p.to_bytes())
            .collect();
        RecordResponse::Replicas {
            peers: view.iter().map(|p| p.to_bytes()).collect(),
            members,
        }
    })
}

/// Adds one replica's group entries to `merged`, one per owner with the latest expiry; at
/// most [`crate::records::MAX_GROUP_MEMBERS`] are read from one answer. Returns how many
/// failed verification.
fn merge_members(
    merged: &mut Vec<Envelope>,
    got: Vec<Envelope>,
    key: &RecordKey,
    wall_secs: u64,
) -> u64 {
    let mut bad = 0;
    for e in got.into_iter().take(crate::records::MAX_GROUP_MEMBERS) {
        if e.verify(key, wall_secs).is_err() {
            bad += 1;
            continue;
        }
        match merged.iter_mut().find(|k| k.owner == e.owner) {
            Some(k) if k.expires < e.expires => *k = e,
            Some(_) => {}
            None => merged.push(e),
        }
    }
    bad
}

/// Distinct envelopes, the one most replicas returned first (then the latest expiry).
fn rank(answers: &[Option<Envelope>]) -> Vec<Envelope> {
    let mut counted: Vec<(usize, Envelope)> = Vec::new();
    for e in answers.iter().flatten() {
        match counted.iter_mut().find(|(_, c)| c.owner == e.owner) {
            Some((n, c)) => {
                *n += 1;
                if e.expires > c.expires {
                    *c = e.clone();
                }
            }
            None => counted.push((1, e.clone())),
        }
    }
    counted.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.expires.cmp(&a.1.expires)));
    counted.into_iter().map(|(_, e)| e).collect()
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // a base instant for the virtual clock
mod tests {
    use super::*;
    use crate::records::MAX_GROUP_MEMBERS;
    use crate::swarm::network_id;
    use crate::{Identity, NamespaceKeys};

    /// The wall clock the replicas' envelopes are checked against, Unix seconds.
    const WALL: u64 = 1_800_000_000;

    fn keys() -> NamespaceKeys {
        NamespaceKeys::derive("lab", b"0123456789abcdef")
    }

    fn member(n: u16) -> Identity {
        let mut seed = [7u8; 32];
        seed[..2].copy_from_slice(&n.to_be_bytes());
        Identity::from_seed(seed)
    }

    fn owner(n: u16) -> OwnerKey {
        *member(n).peer_id().as_bytes()
    }

    fn peer(n: u16) -> NetworkId {
        network_id(&owner(n)).unwrap()
    }

    fn key() -> RecordKey {
        keys().address_key(std::net::Ipv4Addr::new(10, 1, 0, 5))
    }

    fn seal(n: u16, key: &RecordKey, expires: u64) -> Envelope {
        let mut rng: rand::rngs::StdRng = rand::SeedableRng::from_seed([n as u8; 32]);
        Envelope::seal(&keys(), &member(n), key, expires, b"value", &mut rng).unwrap()
    }

    fn held_by(n: u16) -> Option<RecordResponse> {
        Some(RecordResponse::Held {
            owner: owner(n).to_vec(),
            remaining_ms: 30_000,
        })
    }

    const GRANTED: Option<RecordResponse> = Some(RecordResponse::Granted);

    /// Starts an operation on `key` whose lookup found members 1 to 4 after querying 7
    /// peers, this agent being member 0: all five are its replicas.
    fn started(t: &mut Table, now: Instant, key: RecordKey, kind: Kind) -> (OpId, Vec<NetworkId>) {
        let op = t.start(key, kind);
        let requests = t.handle_replicas(now, op, (1..=4).map(peer).collect(), peer(0), 7);
        assert_eq!(requests.len(), REPLICAS);
        let replicas: Vec<NetworkId> = requests.iter().map(|(r, _)| *r).collect();
        assert!(
            replicas.contains(&peer(0)),
            "the local replica is asked too"
        );
        (op, replicas)
    }

    fn claimed(t: &mut Table) -> Option<(OpId, ClaimResult, usize, u32)> {
        match t.poll_event()? {
            OverlayEvent::Claimed {
                op,
                result,
                replicas,
                queried,
                ..
            } => Some((op, result, replicas, queried)),
            other => panic!("{other:?}"),
        }
    }

    fn releases(t: &mut Table) -> Vec<(NetworkId, RecordKey)> {
        std::iter::from_fn(|| t.poll_release()).collect()
    }

    mod known;
    mod short;
    mod transfer;

    #[test]
    fn replicas_are_the_closest_distinct_peers_and_may_include_this_agent() {
        let key = key();
        let mut found: Vec<NetworkId> = (1..=8).map(peer).collect();
        found.push(peer(3));
        let chosen = replicas(&key, found, peer(0));
        let target = KBucketKey::new(key.to_vec());
        let mut all: Vec<NetworkId> = (0..=8).map(peer).collect();
        all.sort_by_key(|p| KBucketKey::from(*p).distance(&target));
        assert_eq!(chosen, all[..REPLICAS].to_vec());
        // Alone, this agent is the whole replica set; it is never listed twice.
        assert_eq!(replicas(&key, vec![], peer(0)), vec![peer(0)]);
        assert_eq!(replicas(&key, vec![peer(0)], peer(0)), vec![peer(0)]);
    }

    #[test]
    fn claim_is_won_by_a_majority() {
        let t0 = Instant::now();
        let mut t = Table::default();
        let envelope = seal(0, &key(), WALL + 60);
        let op = t.start(key(), Kind::Claim(envelope.clone()));
        assert_eq!(t.poll_timeout(), None, "the lookup keeps its own deadline");
        let requests = t.handle_replicas(t0, op, (1..=4).map(peer).collect(), peer(0), 7);
        let claim = RecordRequest::Claim {
            key: key().to_vec(),
            envelope,
        };
        assert!(requests.iter().all(|(_, r)| *r == claim));
        let r: Vec<NetworkId> = requests.into_iter().map(|(r, _)| r).collect();
        assert_eq!(t.poll_timeout(), Some(t0 + REQUEST_TIMEOUT));
        t.handle_answer(t0, WALL, op, r[0], GRANTED);
        t.handle_answer(t0, WALL, op, r[1], GRANTED);
        assert!(claimed(&mut t).is_none());
        t.handle_answer(t0, WALL, op, r[2], GRANTED);
        // A majority; the last two are waited for a grace (one may name an older holder).
        assert!(claimed(&mut t).is_none());
        assert_eq!(t.poll_timeout(), Some(t0 + lease::GRACE));
        t.handle_timeout(t0 + lease::GRACE);
        assert_eq!(claimed(&mut t), Some((op, ClaimResult::Won, 5, 7)));
        assert_eq!(t.poll_timeout(), None);
        // A winner keeps the grants that come after.
        t.handle_answer(t0, WALL, op, r[3], GRANTED);
        assert!(claimed(&mut t).is_none());
        assert!(releases(&mut t).is_empty());
    }

    #[test]
    fn a_claim_asks_a_replica_that_named_a_holder_again_and_loses_to_it() {
        let t0 = Instant::now();
        let mut t = Table::default();
        let envelope = seal(0, &key(), WALL + 60);
        let (op, r) = started(&mut t, t0, key(), Kind::Claim(envelope.clone()));
        for &replica in &r[..4] {
            t.handle_answer(t0, WALL, op, replica, GRANTED);
        }
        t.handle_answer(t0, WALL, op, r[4], held_by(9));
        assert!(claimed(&mut t).is_none());
        let again = RecordRequest::Claim {
            key: key().to_vec(),
            envelope,
        };
        for _ in 0..lease::RECHECKS {
            let at = t.poll_timeout().expect("a recheck is due");
            t.handle_timeout(at);
            assert_eq!(t.poll_request(), Some((op, r[4], again.clone())));
            assert_eq!(t.poll_request(), None);
            t.handle_answer(at, WALL, op, r[4], held_by(9));
        }
        assert_eq!(
            claimed(&mut t),
            Some((op, ClaimResult::Lost(Some(owner(9))), 5, 7))
        );
        assert_eq!(
            releases(&mut t),
            r[..4].iter().map(|p| (*p, key())).collect::<Vec<_>>()
        );
    }

    #[test]
    fn claim_is_lost_to_the_holder_most_replicas_name_and_gives_back_its_grants() {
        let t0 = Instant::now();
        let mut t = Table::default();
        let (op, r) = started(&mut t, t0, key(), Kind::Claim(seal(0, &key(), WALL + 60)));
        t.handle_answer(t0, WALL, op, r[0], GRANTED);
        t.handle_answer(t0, WALL, op, r[1], held_by(9));
        t.handle_answer(t0, WALL, op, r[2], held_by(8));
        assert!(
            claimed(&mut t).is_none(),
            "r[3] and r[4] could still make it"
        );
        t.handle_answer(t0, WALL, op, r[3], held_by(9));
        assert_eq!(
            claimed(&mut t),
            Some((op, ClaimResult::Lost(Some(owner(9))), 5, 7))
        );
        assert_eq!(releases(&mut t), vec![(r[0], key())]);
        assert_eq!(t.stats().late_grants_released, 0);
    }

    #[test]
    fn a_renewal_that_meets_another_owner_follows_the_merge_rule() {
        let t0 = Instant::now();
        let higher = (1..=9).find(|n| owner(*n) > owner(0)).unwrap();
        let lower = (1..=9).find(|n| owner(*n) < owner(0)).unwrap();
        for (rival, keeps) in [(higher, true), (lower, false)] {
            let mut t = Table::default();
            let envelope = seal(0, &key(), WALL + 60);
            let (op, r) = started(&mut t, t0, key(), Kind::Renew(envelope));
            t.handle_answer(t0, WALL, op, r[0], GRANTED);
            t.handle_answer(t0, WALL, op, r[1], GRANTED);
            t.handle_answer(t0, WALL, op, r[2], GRANTED);
            assert!(
                claimed(&mut t).is_none(),
                "a renewal hears every replica before it is decided"
            );
            t.handle_answer(t0, WALL, op, r[3], held_by(rival));
            t.handle_answer(t0, WALL, op, r[4], held_by(rival));
            // The two replicas naming the rival are asked again, and name it each time (a
            // merged partition's owner, not a claim of the moment): then the rule decides.
            for _ in 0..lease::RECHECKS {
                assert!(claimed(&mut t).is_none(), "asked again before it decides");
                let at = t.poll_timeout().expect("a recheck is due");
                t.handle_timeout(at);
                let asked: Vec<NetworkId> = std::iter::from_fn(|| t.poll_request())
                    .map(|(_, r, _)| r)
                    .collect();
                assert_eq!(asked, r[3..].to_vec());
                for replica in asked {
                    t.handle_answer(at, WALL, op, replica, held_by(rival));
                }
            }
            if keeps {
                // Kept: the grants stay, to be completed by the next renewal.
                assert_eq!(
                    claimed(&mut t),
                    Some((op, ClaimResult::Kept(owner(rival)), 5, 7))
                );
                assert!(releases(&mut t).is_empty());
            } else {
                // Yielded although it had a majority: every grant goes back.
                assert_eq!(
                    claimed(&mut t),
                    Some((op, ClaimResult::Lost(Some(owner(rival))), 5, 7))
                );
                let back: Vec<NetworkId> = releases(&mut t).into_iter().map(|(r, _)| r).collect();
                assert_eq!(back, r[..3].to_vec());
            }
        }
    }

    #[test]
    fn claim_is_lost_without_a_holder_when_replicas_are_full_or_unreachable() {
        let t0 = Instant::now();
        let mut t = Table::default();
        let (op, r) = started(&mut t, t0, key(), Kind::Claim(seal(0, &key(), WALL + 60)));
        t.handle_answer(t0, WALL, op, r[0], Some(RecordResponse::Full));
        t.handle_answer(t0, WALL, op, r[1], None);
        assert!(claimed(&mut t).is_none());
        t.handle_answer(t0, WALL, op, r[2], Some(RecordResponse::Rejected));
        assert_eq!(claimed(&mut t), Some((op, ClaimResult::Lost(None), 5, 7)));
        assert!(releases(&mut t).is_empty());
    }

    #[test]
    fn a_grant_that_reaches_a_lost_claim_is_released() {
        let t0 = Instant::now();
        let mut t = Table::default();
        let (op, r) = started(&mut t, t0, key(), Kind::Claim(seal(0, &key(), WALL + 60)));
        for replica in &r[..3] {
            t.handle_answer(t0, WALL, op, *replica, held_by(9));
        }
        assert_eq!(
            claimed(&mut t),
            Some((op, ClaimResult::Lost(Some(owner(9))), 5, 7))
        );
        assert!(releases(&mut t).is_empty());
        t.handle_answer(t0, WALL, op, r[3], GRANTED);
        assert_eq!(releases(&mut t), vec![(r[3], key())]);
        t.handle_answer(t0, WALL, op, r[4], GRANTED);
        assert_eq!(releases(&mut t), vec![(r[4], key())]);
        assert_eq!(t.stats().late_grants_released, 2);
        // Every replica has answered: the lost claim is forgotten, a repeat does nothing.
        t.handle_answer(t0, WALL, op, r[4], GRANTED);
        assert!(releases(&mut t).is_empty());
        assert!(t.poll_event().is_none());
    }

    #[test]
    fn operations_end_at_their_deadline_with_what_arrived() {
        let t0 = Instant::now();
        let mut t = Table::default();
        let (claim, rc) = started(&mut t, t0, key(), Kind::Claim(seal(0, &key(), WALL + 60)));
        t.handle_answer(t0, WALL, claim, rc[0], GRANTED);
        t.handle_answer(t0, WALL, claim, rc[1], GRANTED);

        let get_key = keys().address_key(std::net::Ipv4Addr::new(10, 1, 0, 6));
        let value = seal(1, &get_key, WALL + 60);
        let (get, rg) = started(&mut t, t0, get_key, Kind::Get);
        let found = Some(RecordResponse::Value {
            envelope: Some(value.clone()),
        });
        t.handle_answer(t0, WALL, get, rg[0], found);
        t.handle_answer(t0, WALL, get, rg[1], None);

        let t1 = t0 + Duration::from_secs(1);
        let (release, rr) = started(&mut t, t1, key(), Kind::Release);
        t.handle_answer(t1, WALL, release, rr[0], Some(RecordResponse::Released));
        let group = keys().group_key();
        let (announce, _) = started(&mut t, t1, group, Kind::Join(seal(0, &group, WALL + 60)));

        assert_eq!(t.poll_timeout(), Some(t0 + REQUEST_TIMEOUT));
        t.handle_timeout(t0 + REQUEST_TIMEOUT - Duration::from_millis(1));
        assert!(t.poll_event().is_none());

        t.handle_timeout(t0 + REQUEST_TIMEOUT);
        assert_eq!(
            claimed(&mut t),
            Some((claim, ClaimResult::Lost(None), 5, 7))
        );
        let mut given_back = releases(&mut t);
        given_back.sort();
        let mut granted = vec![(rc[0], key()), (rc[1], key())];
        granted.sort();
        assert_eq!(given_back, granted);
        match t.poll_event() {
            Some(OverlayEvent::Got { op, envelopes, .. }) => {
                assert_eq!(op, get);
                assert_eq!(envelopes, vec![value]);
            }
            other => panic!("{other:?}"),
        }
        assert!(t.poll_event().is_none());
        assert_eq!(t.poll_timeout(), Some(t1 + REQUEST_TIMEOUT));

        t.handle_timeout(t1 + REQUEST_TIMEOUT);
        assert!(matches!(t.poll_event(), Some(OverlayEvent::Released { op }) if op == release));
        assert!(matches!(t.poll_event(), Some(OverlayEvent::Announced { op }) if op == announce));
        assert_eq!(t.poll_timeout(), None);
        // A grant after the claim timed out is given back too.
        t.handle_answer(t1 + REQUEST_TIMEOUT, WALL, claim, rc[2], GRANTED);
        assert_eq!(releases(&mut t), vec![(rc[2], key())]);
    }

    #[test]
    fn get_ranks_what_most_replicas_returned_first_and_drops_bad_envelopes() {
        let t0 = Instant::now();
        let mut t = Table::default();
        let key = key();
        let (op, r) = started(&mut t, t0, key, Kind::Get);
        let first = seal(1, &key, WALL + 60);
        let renewed = seal(1, &key, WALL + 90);
        let other = seal(2, &key, WALL + 120);
        let mut forged = seal(3, &key, WALL + 60);
        forged.expires += 1;
        let expired = seal(4, &key, WALL);
        let value = |e: &Envelope| {
            Some(RecordResponse::Value {
                envelope: Some(e.clone()),
            })
        };
        for (replica, e) in r.iter().zip([&first, &other, &renewed, &forged, &expired]) {
            assert!(t.poll_event().is_none());
            t.handle_answer(t0, WALL, op, *replica, value(e));
        }
        // Member 1's record, from two replicas, before member 2's, from one, although
        // member 2's expires later; of member 1's two versions, the later expiry.
        match t.poll_event() {
            Some(OverlayEvent::Got {
                op: got,
                key: k,
                envelopes,
                queried,
            }) => {
                assert_eq!((got, k, queried), (op, key, 7));
                assert_eq!(envelopes, vec![renewed, other]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(t.stats().bad_envelopes, 2);
    }

    #[test]
    fn members_are_merged_one_per_owner_keeping_the_latest_expiry() {
        let t0 = Instant::now();
        let mut t = Table::default();
        let group = keys().group_key();
        let (op, r) = started(&mut t, t0, group, Kind::Members);
        let entries = |envelopes: Vec<Envelope>| Some(RecordResponse::Members { envelopes });
        let mut forged = seal(3, &group, WALL + 60);
        forged.owner = owner(4).to_vec();
        t.handle_answer(
            t0,
            WALL,
            op,
            r[0],
            entries(vec![seal(1, &group, WALL + 60), seal(2, &group, WALL + 60)]),
        );
        t.handle_answer(
            t0,
            WALL,
            op,
            r[1],
            entries(vec![seal(1, &group, WALL + 90), forged]),
        );
        // One replica answers with more entries than a group holds: the excess is not read.
        let crowd: Vec<Envelope> = (0..=MAX_GROUP_MEMBERS as u16)
            .map(|n| seal(1000 + n, &group, WALL + 60))
            .collect();
        let beyond = crowd[MAX_GROUP_MEMBERS].owner.clone();
        t.handle_answer(t0, WALL, op, r[2], entries(crowd));
        t.handle_answer(t0, WALL, op, r[3], None);
        assert!(t.poll_event().is_none());
        t.handle_answer(t0, WALL, op, r[4], Some(RecordResponse::Rejected));
        let Some(OverlayEvent::Members {
            op: got,
            key,
            envelopes,
        }) = t.poll_event()
        else {
            panic!("no members event");
        };
        assert_eq!((got, key), (op, group));
        assert_eq!(envelopes.len(), 2 + MAX_GROUP_MEMBERS);
        let one: Vec<&Envelope> = envelopes.iter().filter(|e| e.owner == owner(1)).collect();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].expires, WALL + 90);
        assert!(envelopes.iter().all(|e| e.owner != beyond));
        assert!(envelopes.iter().all(|e| e.owner != owner(4)));
        assert_eq!(t.stats().bad_envelopes, 1);
    }

    #[test]
    fn unknown_operations_and_ownerless_claims_do_nothing() {
        let t0 = Instant::now();
        let mut t = Table::default();
        let mut nobody = seal(0, &key(), WALL + 60);
        nobody.owner.pop();
        let op = t.start(key(), Kind::Claim(nobody));
        assert!(t
            .handle_replicas(t0, op, vec![peer(1)], peer(0), 1)
            .is_empty());
        assert!(t
            .handle_replicas(t0, op, vec![peer(1)], peer(0), 1)
            .is_empty());
        t.handle_answer(t0, WALL, op, peer(1), GRANTED);
        t.handle_timeout(t0 + REQUEST_TIMEOUT);
        assert!(t.poll_event().is_none());
        assert!(t.poll_release().is_none());
        assert_eq!(t.poll_timeout(), None);
    }
}
