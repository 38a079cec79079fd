//! Record operations: what the driver asks (claims, reads, releases, group entries), the
//! requests other members send this agent as a replica, and the quorum table's results.

use std::time::Instant;

use libp2p::request_response;

use super::members::Awaiting;
use super::{
    clocks, network_id, owner_key, NetworkId, OpId, Overlay, OverlayEvent, GROUP_REPLICAS_REUSE,
    MAX_DEFERRED,
};
use crate::proof::NamespaceTag;
use crate::quorum::Kind;
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
        let group = matches!(kind, Kind::Join(_) | Kind::Members);
        let op = self.quorum.start(key, kind);
        self.key_ns.insert(key, ns);
        self.op_ns.insert(op, ns);
        if group {
            let (now, _) = clocks();
            if let Some((found, queried, _)) = self
                .group_replicas
                .get(&key)
                .filter(|(.., at)| now < *at + GROUP_REPLICAS_REUSE)
            {
                // Asked at the next `handle_timeout`, as a finished lookup would be.
                let found = found.clone();
                let queried = *queried;
                self.awaiting.insert(
                    op,
                    Awaiting {
                        ns,
                        found,
                        queried,
                        deadline: now,
                    },
                );
                self.stats.group_lookups_saved += 1;
                return op;
            }
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

    /// Answers a record request: only for a namespace we are a member of, and only to a
    /// peer that proved it is one too.
    pub(super) fn answer_record_request(
        &mut self,
        now: Instant,
        wall: u64,
        peer: NetworkId,
        scoped: ScopedRequest,
        channel: request_response::ResponseChannel<RecordResponse>,
    ) {
        let response = if !self.proofs.is_member(&peer, &scoped.ns) {
            self.stats.requests_not_member += 1;
            tracing::debug!(%peer, "record request from a peer not proven a member: refused");
            RecordResponse::NotMember
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
        while let Some(event) = self.quorum.poll_event() {
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
