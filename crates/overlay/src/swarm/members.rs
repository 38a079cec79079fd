//! Which peers are members: the membership proofs on every connection
//! ([`crate::proof`]), and the replica sets they decide (the proven members of a key's
//! namespace closest to it).

use std::time::Instant;

use libp2p::request_response;
use rand::rngs::StdRng;
use rand::Rng;

use super::{ClaimMode, NetworkId, OpId, Overlay};
use crate::proof::{Credential, NamespaceTag, ProofRequest, ProofResponse, PROOF_LEN};
use crate::NamespaceKeys;

/// A lookup that finished while some of the peers it found were still proving membership.
pub(super) struct Awaiting {
    pub(super) ns: NamespaceTag,
    pub(super) found: Vec<NetworkId>,
    pub(super) queried: u32,
    pub(super) deadline: Instant,
    /// A claim without a lookup: its replicas are the known members'
    /// ([`crate::quorum::Table::handle_known_replicas`]).
    pub(super) known: bool,
}

impl Overlay {
    /// Makes this agent a member of the namespace with `keys` in the control plane: it
    /// proves so to every peer (with its certificate, where the namespace has an
    /// authority), and learns which peers are members too.
    pub fn add_namespace(&mut self, keys: &NamespaceKeys, credential: Option<Credential>) {
        let rng = &mut self.rng;
        let sent = self
            .proofs
            .add_namespace(keys, credential, || fresh_nonce(rng));
        for (peer, request) in sent {
            self.send_proof_request(peer, request);
        }
    }

    /// This agent's new certificate for namespace `tag` (a renewal): pushed to every peer
    /// in a fresh proof; memberships stand meanwhile.
    pub fn renew_certificate(&mut self, tag: &NamespaceTag, certificate: Vec<u8>) {
        let rng = &mut self.rng;
        let sent = self
            .proofs
            .renew_certificate(tag, certificate, || fresh_nonce(rng));
        for (peer, request) in sent {
            self.send_proof_request(peer, request);
        }
    }

    /// Starts the operations whose lookups finished and whose found peers all proved (or
    /// failed to prove) membership, or waited [`PROOF_WAIT`].
    pub(super) fn check_awaiting(&mut self, now: Instant, wall: u64) {
        let ready: Vec<OpId> = self
            .awaiting
            .iter()
            .filter(|(_, a)| {
                now >= a.deadline || !a.found.iter().any(|p| self.proofs.is_pending(p))
            })
            .map(|(op, _)| *op)
            .collect();
        for op in ready {
            if let Some(a) = self.awaiting.remove(&op) {
                self.replicas_found(now, wall, op, a);
            }
        }
    }

    /// Sends `op`'s requests to the replicas among the proven members of its namespace that
    /// its lookup found or we are connected to (and this agent), answering its own from the
    /// local store.
    pub(super) fn replicas_found(&mut self, now: Instant, wall: u64, op: OpId, lookup: Awaiting) {
        let Awaiting {
            ns,
            found,
            queried,
            known,
            ..
        } = lookup;
        let mut members = self.proofs.members(&ns);
        let (lookup_empty, mut proving) = (found.is_empty(), 0);
        for peer in found {
            if self.proofs.is_member(&peer, &ns) {
                members.push(peer);
            } else {
                self.stats.unproven_replicas_skipped += 1;
                proving += usize::from(self.proofs.is_pending(&peer));
            }
        }
        members.sort();
        members.dedup();
        if !known && self.give_up_short(op, ns, &members, proving, lookup_empty, queried) {
            self.flush_quorum(now, wall);
            return;
        }
        tracing::debug!(?op, replicas = members.len(), "asking replicas");
        // Every first claim has its set checked by the replicas, after a lookup too: a
        // lookup that could not reach the members closest to the key (unreachable for a
        // moment, or not yet proven) ends with a set farther out, which may share no
        // replica with the set another claimer won the key on (DECISIONS, "Claims without
        // a lookup").
        let checked = self
            .checked_claims
            .get(&op)
            .is_some_and(|c| c.mode != ClaimMode::Plain);
        let requests = if checked {
            self.quorum
                .handle_known_replicas(now, op, members, self.local, queried)
        } else {
            self.quorum
                .handle_replicas(now, op, members, self.local, queried)
        };
        for (replica, request) in requests {
            self.ask_replica(now, wall, op, ns, replica, request);
        }
        self.flush_quorum(now, wall);
    }

    /// Gives up first claim `op` if its replica set among `members` would be short of
    /// [`crate::quorum::REPLICAS`] while this agent cannot tell that the namespace is that
    /// small: `proving` peers its lookup found are still proving membership (past
    /// [`super::PROOF_WAIT`]), or the lookup found no one while the routing table holds
    /// peers of unknown membership. A claimer that knows no one else decides alone (the
    /// first member; one cut off from all others), and so does one whose every found peer
    /// proved it is a member or not (or failed to answer: a silent stranger delays claims
    /// by one retry at most). DECISIONS, "Short replica sets".
    fn give_up_short(
        &mut self,
        op: OpId,
        ns: NamespaceTag,
        members: &[NetworkId],
        proving: usize,
        lookup_empty: bool,
        queried: u32,
    ) -> bool {
        let Some(key) = self.quorum.short_claim(op, members, self.local) else {
            return false;
        };
        let unsure =
            proving > 0 || (lookup_empty && !self.unproven_near(&ns, &key, members).is_empty());
        if unsure {
            tracing::debug!(
                ?op,
                members = members.len(),
                proving,
                "claim short of replicas; given up"
            );
            self.quorum.give_up_short(op, members.len() + 1, queried);
        }
        unsure
    }

    pub(super) fn send_proof_request(&mut self, peer: NetworkId, request: ProofRequest) {
        let challenge = matches!(request, ProofRequest::Challenge { .. });
        let rid = self
            .swarm
            .behaviour_mut()
            .proofs
            .send_request(&peer, request);
        if challenge {
            self.challenges.insert(rid, peer);
        }
    }

    pub(super) fn handle_proofs(
        &mut self,
        now: Instant,
        wall: u64,
        event: request_response::Event<ProofRequest, ProofResponse>,
    ) {
        let mut newly_proven = Vec::new();
        let peer = match event {
            request_response::Event::Message { peer, message, .. } => match message {
                request_response::Message::Request {
                    request, channel, ..
                } => {
                    let response = match request {
                        ProofRequest::Challenge { nonce } => {
                            let rng = &mut self.rng;
                            self.proofs
                                .handle_challenge(peer, nonce, || fresh_nonce(rng))
                        }
                        ProofRequest::Proof { macs, certificates } => {
                            newly_proven =
                                self.proofs.handle_proof(peer, &macs, &certificates, wall);
                            ProofResponse::Ack
                        }
                    };
                    let _ = self
                        .swarm
                        .behaviour_mut()
                        .proofs
                        .send_response(channel, response);
                    peer
                }
                request_response::Message::Response {
                    request_id,
                    response,
                } => {
                    if self.challenges.remove(&request_id).is_none() {
                        return;
                    }
                    if let ProofResponse::Proof { macs, certificates } = response {
                        newly_proven = self.proofs.handle_proof(peer, &macs, &certificates, wall);
                        if !newly_proven.is_empty() {
                            tracing::debug!(%peer, namespaces = newly_proven.len(), "member proven");
                        }
                    }
                    peer
                }
            },
            request_response::Event::OutboundFailure {
                peer, request_id, ..
            } => {
                if self.challenges.remove(&request_id).is_none() {
                    return;
                }
                self.proofs.handle_failed(&peer);
                peer
            }
            _ => return,
        };
        if !newly_proven.is_empty() {
            self.share_authority(peer, &newly_proven);
        }
        if self.proofs.is_proven(&peer) {
            self.relay_admission.admit(peer);
            self.relays.handle_proven(now, &peer);
        }
        if !self.proofs.is_pending(&peer) {
            for (request, channel) in self.deferred.remove(&peer).unwrap_or_default() {
                self.answer_record_request(now, wall, peer, request, channel);
            }
        }
        self.check_awaiting(now, wall);
    }
}

/// A challenge nonce.
pub(super) fn fresh_nonce(rng: &mut StdRng) -> [u8; PROOF_LEN] {
    let mut nonce = [0u8; PROOF_LEN];
    rng.fill_bytes(&mut nonce);
    nonce
}
