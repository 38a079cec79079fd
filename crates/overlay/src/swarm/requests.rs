//! Record operations: what the driver asks (claims, reads, releases, group entries), the
//! requests other members send this agent as a replica, and the quorum table's results.

use std::time::Instant;

use libp2p::kad::KBucketKey;
use libp2p::request_response;

use super::members::Awaiting;
use super::{
    clocks, network_id, owner_key, CheckedClaim, ClaimMode, NetworkId, OpId, Overlay, OverlayEvent,
    GROUP_REPLICAS_REUSE, KNOWN_MEMBERS_FOR_CLAIMS, MAX_DEFERRED, MAX_UNPROVEN_NEAR,
};
use crate::proof::NamespaceTag;
use crate::quorum::{check_claim_among, known_replicas, replicas, ClaimResult, Kind, REPLICAS};
use crate::records::{Envelope, RecordKey, RecordRequest, RecordResponse, ScopedRequest};

impl Overlay {
    /// Claims `key` with `envelope` (whose owner is the claimer): granted only by a strict
    /// majority of the key's replicas. Also renews a lease already held.
    pub fn claim(&mut self, ns: NamespaceTag, key: RecordKey, envelope: Envelope) -> OpId {
        self.start(ns, key, Kind::Claim(envelope))
    }

    /// Renews `key`, which this agent holds, with `envelope`: like [`Overlay::claim`], but
    /// when another owner's lease shows up on the replicas (partitions merged) the merge
    /// rule decides who keeps it ([`crate::lease`]).
    pub fn renew(&mut self, ns: NamespaceTag, key: RecordKey, envelope: Envelope) -> OpId {
        self.start(ns, key, Kind::Renew(envelope))
    }

    /// Moves this agent's lease on `key` to the owner of `envelope` (the new holder's own
    /// signed record) in one step on each replica: granted, like a claim, only by a strict
    /// majority, and only if this agent holds the key there. The result is a
    /// [`OverlayEvent::Claimed`]: `Won` means the lease is the new holder's now.
    pub fn transfer(&mut self, ns: NamespaceTag, key: RecordKey, envelope: Envelope) -> OpId {
        self.start(ns, key, Kind::Transfer(envelope))
    }

    /// Reads `key` from its replicas.
    pub fn get(&mut self, ns: NamespaceTag, key: RecordKey) -> OpId {
        self.start(ns, key, Kind::Get)
    }

    /// Reads `key` from the replicas among the proven members this agent is connected to,
    /// without a lookup, when it knows enough of them for a claim to go without one
    /// ([`Self::knows_replicas`]) or has not joined yet (it then asks those it knows, maybe
    /// none but itself); else as [`Self::get`]. For reads that come often and
    /// whose miss costs little (a member's name for status): every lookup asks most of a
    /// small namespace, so status scraped on every agent made a read of each member's name
    /// a lookup per member per agent (docs/BENCHMARKS.md, "Real agents at scale").
    pub fn get_near(&mut self, ns: NamespaceTag, key: RecordKey) -> OpId {
        self.start_op(ns, key, Kind::Get, ClaimMode::Checked, true)
    }

    /// Gives `key` back on its replicas (they accept it only from the owner).
    pub fn release(&mut self, ns: NamespaceTag, key: RecordKey) -> OpId {
        self.start(ns, key, Kind::Release)
    }

    /// Adds this agent to the group at `key` with `envelope` (renewed by announcing again
    /// before it expires).
    pub fn announce(&mut self, ns: NamespaceTag, key: RecordKey, envelope: Envelope) -> OpId {
        self.start(ns, key, Kind::Join(envelope))
    }

    /// Reads every member of the group at `key`.
    pub fn members(&mut self, ns: NamespaceTag, key: RecordKey) -> OpId {
        self.start(ns, key, Kind::Members)
    }

    pub(super) fn start(&mut self, ns: NamespaceTag, key: RecordKey, kind: Kind) -> OpId {
        let mode = if self.claims_without_lookup {
            ClaimMode::Known
        } else {
            ClaimMode::Checked
        };
        self.start_op(ns, key, kind, mode, false)
    }

    /// Starts an operation: a group operation with the replicas a recent lookup found, a
    /// first claim in `mode` (in `Known` mode with the replicas among the members this
    /// agent knows when it knows enough of them, else after a lookup), a read `near` as
    /// such a claim, and anything else after a lookup.
    fn start_op(
        &mut self,
        ns: NamespaceTag,
        key: RecordKey,
        kind: Kind,
        mode: ClaimMode,
        near: bool,
    ) -> OpId {
        let group = matches!(kind, Kind::Join(_) | Kind::Members);
        let claim = match &kind {
            Kind::Claim(envelope) => {
                let known = mode == ClaimMode::Known && self.knows_replicas(&ns, &key);
                let mode = match mode {
                    ClaimMode::Known if !known => ClaimMode::Checked,
                    mode => mode,
                };
                Some(CheckedClaim {
                    ns,
                    key,
                    envelope: envelope.clone(),
                    mode,
                })
            }
            _ => None,
        };
        let known_claim = claim.as_ref().is_some_and(|c| c.mode == ClaimMode::Known);
        // Before the agent has joined, a near read looks nothing up either: its lookups
        // would share the new connections with the bootstrap's, which every claim waits
        // for (a restarted agent's status, scraped at once, read every member's name).
        let near_read =
            near && matches!(kind, Kind::Get) && (!self.joined || self.knows_replicas(&ns, &key));
        let op = self.quorum.start(key, kind);
        self.key_ns.insert(key, ns);
        self.op_ns.insert(op, ns);
        if let Some(claim) = claim {
            self.checked_claims.insert(op, claim);
        }
        let (now, _) = clocks();
        let known = known_claim || near_read;
        let reuse = match known {
            true => {
                match known_claim {
                    true => self.stats.claims_without_lookup += 1,
                    false => self.stats.reads_without_lookup += 1,
                }
                Some((Vec::new(), 0))
            }
            false if group => self
                .group_replicas
                .get(&key)
                .filter(|(.., at)| now < *at + GROUP_REPLICAS_REUSE)
                .map(|(found, queried, _)| {
                    self.stats.group_lookups_saved += 1;
                    (found.clone(), *queried)
                }),
            false => None,
        };
        if let Some((found, queried)) = reuse {
            // Asked at the next `handle_timeout`, as a finished lookup would be.
            let awaiting = Awaiting {
                ns,
                found,
                queried,
                deadline: now,
                known,
            };
            self.awaiting.insert(op, awaiting);
            return op;
        }
        if group {
            self.group_lookups.insert(op, key);
        }
        let query = self
            .swarm
            .behaviour_mut()
            .kad
            .get_closest_peers(key.to_vec());
        tracing::debug!(?op, ?query, "lookup started");
        self.lookups.insert(query, op);
        op
    }

    pub(super) fn handle_records(
        &mut self,
        now: Instant,
        wall: u64,
        event: request_response::Event<ScopedRequest, RecordResponse>,
    ) {
        match event {
            request_response::Event::Message { peer, message, .. } => match message {
                request_response::Message::Request {
                    request, channel, ..
                } => {
                    if self.proofs.is_pending(&peer) {
                        // It asks before its answer to our challenge arrived: answer once
                        // it has.
                        let queue = self.deferred.entry(peer).or_default();
                        if queue.len() < MAX_DEFERRED {
                            queue.push((request, channel));
                            return;
                        }
                    }
                    self.answer_record_request(now, wall, peer, request, channel);
                }
                request_response::Message::Response {
                    request_id,
                    response,
                } => {
                    if let Some((op, replica)) = self.requests.remove(&request_id) {
                        if let RecordResponse::Replicas { peers, members } = &response {
                            self.meet_replicas(op, peers, members);
                        }
                        // A replica that does not count us as a member gives no answer.
                        let response = (response != RecordResponse::NotMember).then_some(response);
                        self.quorum.handle_answer(now, wall, op, replica, response);
                        self.flush_quorum(now, wall);
                    }
                }
            },
            request_response::Event::OutboundFailure {
                request_id, error, ..
            } => {
                self.stats.request_failures += 1;
                if let Some((op, replica)) = self.requests.remove(&request_id) {
                    tracing::debug!(%replica, %error, "record request failed");
                    self.quorum.handle_answer(now, wall, op, replica, None);
                    self.flush_quorum(now, wall);
                }
            }
            _ => {}
        }
    }

    /// A replica disputed the set of claim `op` with `peers`, its own, naming `members`
    /// among them outside the claim's set: the ones this agent is not connected to are
    /// dialled, and the claim made again waits for their proofs.
    fn meet_replicas(&mut self, op: OpId, peers: &[Vec<u8>], members: &[Vec<u8>]) {
        // A claim already decided (a late answer) keeps nothing.
        if !self.checked_claims.contains_key(&op) {
            return;
        }
        if !members.is_empty() {
            self.members_named.insert(op);
        }
        let peers = peers.iter().take(REPLICAS);
        let named = self.disputes.entry(op).or_default();
        for peer in peers.filter_map(|p| NetworkId::from_bytes(p).ok()) {
            if peer == self.local || named.contains(&peer) || named.len() >= 4 * REPLICAS {
                continue;
            }
            named.push(peer);
            if !self.swarm.is_connected(&peer) {
                let _ = self.swarm.dial(peer);
            }
        }
    }

    /// Answers a record request: only for a namespace we are a member of, and only to a
    /// peer that proved it is one too.
    pub(super) fn answer_record_request(
        &mut self,
        now: Instant,
        wall: u64,
        peer: NetworkId,
        mut scoped: ScopedRequest,
        channel: request_response::ResponseChannel<RecordResponse>,
    ) {
        let response = if !self.proofs.is_member(&peer, &scoped.ns) {
            self.stats.requests_not_member += 1;
            tracing::debug!(%peer, "record request from a peer not proven a member: refused");
            RecordResponse::NotMember
        } else if let Some(answer) = self.screen_claim_among(&mut scoped) {
            answer
        } else if let Some(keys) = self.proofs.certified_keys(&scoped.ns) {
            // Claims are checked against their owner's certificate (records::certified).
            let proofs = &self.proofs;
            let ns = scoped.ns;
            self.store.handle_certified(
                now,
                wall,
                owner_key(&peer),
                ns,
                keys,
                |owner| network_id(owner).and_then(|id| proofs.certificate(&id, &ns)),
                scoped.request,
            )
        } else {
            self.store
                .handle_in(now, wall, owner_key(&peer), Some(scoped.ns), scoped.request)
        };
        let _ = self
            .swarm
            .behaviour_mut()
            .records
            .send_response(channel, response);
    }

    /// Whether a claim of `key` can go without a lookup: this agent is connected to at
    /// least [`KNOWN_MEMBERS_FOR_CLAIMS`] proven members of `ns`, and no peer of its routing
    /// table of unknown membership is closer to the key than the replicas among them
    /// ([`known_replicas`]).
    fn knows_replicas(&mut self, ns: &NamespaceTag, key: &RecordKey) -> bool {
        let known = self.proofs.members(ns);
        if known.len() < KNOWN_MEMBERS_FOR_CLAIMS {
            return false;
        }
        let unproven = self.unproven_near(ns, key, &known);
        known_replicas(key, &known, &unproven, self.local).is_some()
    }

    /// The peers of the routing table closer to `key` than the farthest of the replicas
    /// among `candidates` and this agent (all of them while those are fewer than
    /// [`REPLICAS`]), at most [`MAX_UNPROVEN_NEAR`], whose membership of `ns` is unknown:
    /// neither proven members nor peers that answered our challenge without `ns`.
    pub(super) fn unproven_near(
        &mut self,
        ns: &NamespaceTag,
        key: &RecordKey,
        candidates: &[NetworkId],
    ) -> Vec<NetworkId> {
        let target = KBucketKey::new(key.to_vec());
        let set = replicas(key, candidates.to_vec(), self.local);
        let farthest = (set.len() >= REPLICAS)
            .then(|| set.last().map(|p| KBucketKey::from(*p).distance(&target)))
            .flatten();
        let near: Vec<NetworkId> = self
            .swarm
            .behaviour_mut()
            .kad
            .get_closest_local_peers(&target)
            .take_while(|k| farthest.is_none_or(|f| k.distance(&target) < f))
            .map(|k| *k.preimage())
            .take(MAX_UNPROVEN_NEAR)
            .collect();
        near.into_iter()
            .filter(|p| {
                *p != self.local && !self.proofs.is_member(p, ns) && !self.proofs.is_outsider(p, ns)
            })
            .collect()
    }

    /// Those of `known` (proven members) among the [`MAX_UNPROVEN_NEAR`] peers of the routing
    /// table closest to `key`: members that serve the DHT.
    fn members_in_routing_table(&mut self, key: &RecordKey, known: &[NetworkId]) -> Vec<NetworkId> {
        let target = KBucketKey::new(key.to_vec());
        self.swarm
            .behaviour_mut()
            .kad
            .get_closest_local_peers(&target)
            .take(MAX_UNPROVEN_NEAR)
            .map(|k| *k.preimage())
            .filter(|p| known.contains(p))
            .collect()
    }

    /// A claim sent to the replica set its claimer computed ([`RecordRequest::ClaimAmong`]):
    /// the answer when this agent computes another set (or the set is malformed); when it
    /// computes the same one, the request becomes a plain claim for the store.
    fn screen_claim_among(&mut self, scoped: &mut ScopedRequest) -> Option<RecordResponse> {
        let RecordRequest::ClaimAmong { key, replicas, .. } = &scoped.request else {
            return None;
        };
        let known = self.proofs.members(&scoped.ns);
        let candidates: Vec<NetworkId> = replicas
            .iter()
            .filter_map(|p| NetworkId::from_bytes(p).ok())
            .chain(known.iter().copied())
            .collect();
        let (unproven, dht_members) = RecordKey::try_from(key.as_slice())
            .map(|k| {
                let unproven = self.unproven_near(&scoped.ns, &k, &candidates);
                (unproven, self.members_in_routing_table(&k, &known))
            })
            .unwrap_or_default();
        if let Err(answer) =
            check_claim_among(key, replicas, &known, &unproven, &dht_members, self.local)
        {
            if matches!(answer, RecordResponse::Replicas { .. }) {
                self.stats.claims_disputed += 1;
            }
            return Some(answer);
        }
        let request = std::mem::replace(
            &mut scoped.request,
            RecordRequest::Members { key: Vec::new() },
        );
        if let RecordRequest::ClaimAmong { key, envelope, .. } = request {
            scoped.request = RecordRequest::Claim { key, envelope };
        }
        None
    }

    /// Sends `op`'s `request` to `replica`, or answers it from the local store when the
    /// replica is this agent.
    pub(super) fn ask_replica(
        &mut self,
        now: Instant,
        wall: u64,
        op: OpId,
        ns: NamespaceTag,
        replica: NetworkId,
        request: RecordRequest,
    ) {
        if replica == self.local {
            let own = owner_key(&self.local);
            let response = self.store.handle_in(now, wall, own, Some(ns), request);
            self.quorum
                .handle_answer(now, wall, op, replica, Some(response));
        } else {
            let rid = self
                .swarm
                .behaviour_mut()
                .records
                .send_request(&replica, ScopedRequest { ns, request });
            self.requests.insert(rid, (op, replica));
        }
    }

    /// Sends what the quorum table asks for again, the releases it asks for, and passes
    /// its events on.
    pub(super) fn flush_quorum(&mut self, now: Instant, wall: u64) {
        while let Some((op, replica, request)) = self.quorum.poll_request() {
            if let Some(ns) = self.op_ns.get(&op).copied() {
                self.ask_replica(now, wall, op, ns, replica, request);
            }
        }
        while let Some((replica, key)) = self.quorum.poll_release() {
            self.send_release(now, wall, replica, key);
        }
        while let Some(mut event) = self.quorum.poll_event() {
            if let OverlayEvent::Claimed { op, result, .. } = &mut event {
                let named = self.disputes.remove(op);
                let member_named = self.members_named.remove(op);
                if let Some(claim) = self.checked_claims.remove(op) {
                    // Without a lookup, a replica computed another set or none answered:
                    // look up. After a lookup, a replica computed another set naming only
                    // peers of unknown membership: claim on the set found again, once
                    // those were dialled. A member named: lost, made again later.
                    let next = claim.mode.after_loss(named.is_some(), member_named);
                    if member_named && claim.mode == ClaimMode::Checked {
                        self.stats.claims_lost_to_closer_members += 1;
                    }
                    if let (ClaimResult::Lost(None), Some(mode)) = (&*result, next) {
                        if mode == ClaimMode::Plain {
                            self.stats.claims_unchecked_after_dispute += 1;
                        } else {
                            self.stats.claims_looked_up_again += 1;
                        }
                        self.op_ns.remove(op);
                        let envelope = claim.envelope;
                        let again =
                            self.start_op(claim.ns, claim.key, Kind::Claim(envelope), mode, false);
                        if let Some(named) = named {
                            self.meet.insert(again, named);
                        }
                        let first = self.claims_again.remove(op).unwrap_or(*op);
                        self.claims_again.insert(again, first);
                        continue;
                    }
                }
                self.meet.remove(op);
                if let Some(first) = self.claims_again.remove(op) {
                    self.op_ns.remove(op);
                    *op = first;
                }
            }
            if let OverlayEvent::Claimed { op, .. }
            | OverlayEvent::Got { op, .. }
            | OverlayEvent::Released { op }
            | OverlayEvent::Announced { op }
            | OverlayEvent::Members { op, .. } = &event
            {
                self.op_ns.remove(op);
            }
            self.events.push_back(event);
        }
    }

    /// Gives a lease on `key` back to `replica` (this agent's own store, or a peer's).
    pub(super) fn send_release(
        &mut self,
        now: Instant,
        wall: u64,
        replica: NetworkId,
        key: RecordKey,
    ) {
        let request = RecordRequest::Release { key: key.to_vec() };
        let ns = self.key_ns.get(&key).copied();
        if replica == self.local {
            let own = owner_key(&self.local);
            self.store.handle_in(now, wall, own, ns, request);
        } else if let Some(ns) = ns {
            self.swarm
                .behaviour_mut()
                .records
                .send_request(&replica, ScopedRequest { ns, request });
        }
    }
}
