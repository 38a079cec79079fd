//! Membership proofs: which libp2p peers hold a namespace's secret.
//!
//! Every hyphae agent can route Kademlia queries, but only a proven member of a namespace
//! may be one of its replicas, answer for its records, or ask for them. A peer proves it on
//! its authenticated (noise) connection, by challenge and response:
//!
//! ```text
//! verifier V -> prover P   Challenge { nonce }            (32 fresh random bytes)
//! P -> V                   Proof { macs }                 (one MAC per namespace of P)
//!     mac = BLAKE2s-256-MAC(proof_key(ns), label || len(P) || P || len(V) || V || nonce)
//! ```
//!
//! - `proof_key` is derived from the namespace secret ([`NamespaceKeys`]): without the secret
//!   no MAC can be made.
//! - `P` and `V` are the peer ids both ends authenticated in the noise handshake, so a MAC
//!   proves something only about the prover that made it, to the verifier it was made for:
//!   a stranger that relays a member's proof to a third agent is checked against its own
//!   peer id and fails.
//! - The nonce is fresh for each connection session of the verifier (kept until the last
//!   connection to the peer closes), so an old proof cannot be replayed either.
//! - The MACs carry no namespace name: the verifier tries each against its own namespaces'
//!   keys (a handful), so a stranger learns nothing about which namespaces a member is in,
//!   and a member of another namespace learns nothing but that it shares none.
//!
//! Both ends challenge each other when a connection opens. A member that joins a namespace
//! later pushes a fresh `Proof` over the nonce the peer sent it, and challenges its peers
//! again to learn which of them are members of the new namespace.
//!
//! This module is the pure state: the swarm glue ([`crate::swarm`]) sends the messages and
//! supplies the nonces.

use std::collections::{HashMap, HashSet};

use blake2::digest::{KeyInit, Mac};
use blake2::Blake2sMac256;
use libp2p::PeerId;
use serde::{Deserialize, Serialize};

use crate::keys::{NamespaceKeys, TAG_LEN};

/// A namespace as the control plane names it: its public tag ([`NamespaceKeys::tag`]).
pub type NamespaceTag = [u8; TAG_LEN];

/// Length of a challenge nonce and of a proof MAC.
pub const PROOF_LEN: usize = 32;

/// Most MACs one proof may carry (an agent in more namespaces proves the first ones).
pub const MAX_PROOFS: usize = 32;

/// The proof protocol's name.
pub const PROOF_PROTOCOL: &str = "/hyphae/member/1";

const LABEL: &[u8] = b"hyphae member proof v1";

/// A message of the proof protocol, sent as a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProofRequest {
    /// Prove your namespaces over this nonce.
    Challenge {
        /// Fresh random bytes.
        nonce: [u8; PROOF_LEN],
    },
    /// My namespaces, over the nonce you sent me (pushed when they change).
    Proof {
        /// One MAC per namespace.
        macs: Vec<[u8; PROOF_LEN]>,
    },
}

/// The answer to a [`ProofRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProofResponse {
    /// The answer to a challenge.
    Proof {
        /// One MAC per namespace.
        macs: Vec<[u8; PROOF_LEN]>,
    },
    /// A pushed proof was received.
    Ack,
}

/// The MAC `prover` shows `verifier` for the namespace whose proof key is `key`.
pub fn proof_mac(
    key: &[u8; 32],
    prover: &PeerId,
    verifier: &PeerId,
    nonce: &[u8; PROOF_LEN],
) -> [u8; PROOF_LEN] {
    // A 32-byte key is always a valid BLAKE2s key.
    let mut mac = <Blake2sMac256 as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("32-byte key"));
    mac.update(LABEL);
    for id in [prover.to_bytes(), verifier.to_bytes()] {
        mac.update(&(id.len() as u32).to_le_bytes());
        mac.update(&id);
    }
    mac.update(nonce);
    mac.finalize().into_bytes().into()
}

/// Where the proof exchange with one peer stands.
#[derive(Debug, Default)]
struct Peer {
    /// The nonce we challenged it with, while its answer is awaited or after.
    sent: Option<[u8; PROOF_LEN]>,
    /// Whether its answer to our challenge is still awaited.
    pending: bool,
    /// The nonce it challenged us with: pushed proofs are made over it.
    received: Option<[u8; PROOF_LEN]>,
    /// Our namespaces it proved.
    proven: HashSet<NamespaceTag>,
}

/// Counters of the proof exchange.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ProofStats {
    /// Proofs that showed at least one of our namespaces.
    pub accepted: u64,
    /// Proofs that showed none (a stranger, or a member of other namespaces only).
    pub unproven: u64,
    /// Proofs refused as malformed (too many MACs) or not asked for.
    pub refused: u64,
}

/// Which connected peers proved which of our namespaces.
#[derive(Debug)]
pub struct Proofs {
    local: PeerId,
    namespaces: Vec<(NamespaceTag, [u8; 32])>,
    peers: HashMap<PeerId, Peer>,
    stats: ProofStats,
}

impl Proofs {
    /// No namespaces and no peers yet; `local` is this agent's peer id.
    pub fn new(local: PeerId) -> Self {
        Self {
            local,
            namespaces: Vec::new(),
            peers: HashMap::new(),
            stats: ProofStats::default(),
        }
    }

    /// Adds one of our namespaces. Returns what to send each connected peer: a fresh
    /// challenge (which of them are members?) and, where the peer challenged us, our proofs
    /// (we are one now). `fresh` gives one nonce per call.
    pub fn add_namespace(
        &mut self,
        keys: &NamespaceKeys,
        mut fresh: impl FnMut() -> [u8; PROOF_LEN],
    ) -> Vec<(PeerId, ProofRequest)> {
        let tag = keys.tag();
        self.namespaces.retain(|(t, _)| *t != tag);
        self.namespaces.push((tag, keys.proof_key));
        let peers: Vec<PeerId> = self.peers.keys().copied().collect();
        let mut out = Vec::new();
        for peer in peers {
            out.push((peer, self.challenge(peer, fresh())));
            if let Some(nonce) = self.peers.get(&peer).and_then(|p| p.received) {
                let macs = self.macs(&peer, &nonce);
                out.push((peer, ProofRequest::Proof { macs }));
            }
        }
        out
    }

    /// Forgets one of our namespaces (peers that proved only it are members of nothing we
    /// hold). Peers keep our old proof: harmless, it names a namespace we have left.
    pub fn remove_namespace(&mut self, tag: &NamespaceTag) {
        self.namespaces.retain(|(t, _)| t != tag);
        for peer in self.peers.values_mut() {
            peer.proven.remove(tag);
        }
    }

    /// Whether we are in any namespace.
    pub fn has_namespaces(&self) -> bool {
        !self.namespaces.is_empty()
    }

    /// A connection to `peer` opened. Returns the challenge to send if it is the first and
    /// we are in a namespace (else [`Proofs::add_namespace`] challenges it later).
    pub fn handle_connected(
        &mut self,
        peer: PeerId,
        nonce: [u8; PROOF_LEN],
    ) -> Option<ProofRequest> {
        let state = self.peers.entry(peer).or_default();
        if state.sent.is_some() || self.namespaces.is_empty() {
            return None;
        }
        Some(self.challenge(peer, nonce))
    }

    /// The last connection to `peer` closed: its proofs and nonces are forgotten, and a
    /// new connection starts over with fresh ones.
    pub fn handle_disconnected(&mut self, peer: &PeerId) {
        self.peers.remove(peer);
    }

    /// A challenge from `peer`: the answer, our proofs over its nonce.
    pub fn handle_challenge(&mut self, peer: PeerId, nonce: [u8; PROOF_LEN]) -> ProofResponse {
        self.peers.entry(peer).or_default().received = Some(nonce);
        ProofResponse::Proof {
            macs: self.macs(&peer, &nonce),
        }
    }

    /// Proofs from `peer` (the answer to our challenge, or pushed). Returns the namespaces
    /// of ours it is now proven a member of.
    pub fn handle_proof(&mut self, peer: PeerId, macs: &[[u8; PROOF_LEN]]) -> Vec<NamespaceTag> {
        let Some(state) = self.peers.get_mut(&peer) else {
            self.stats.refused += 1;
            return Vec::new();
        };
        let Some(nonce) = state.sent else {
            self.stats.refused += 1;
            return Vec::new();
        };
        state.pending = false;
        if macs.len() > MAX_PROOFS {
            self.stats.refused += 1;
            return Vec::new();
        }
        let mut proven = Vec::new();
        for (tag, key) in &self.namespaces {
            let expected = proof_mac(key, &peer, &self.local, &nonce);
            // Compared in constant time: a MAC check must not leak how much matched.
            if macs.iter().any(|m| constant_time_eq(m, &expected)) {
                proven.push(*tag);
            }
        }
        if proven.is_empty() {
            self.stats.unproven += 1;
        } else {
            self.stats.accepted += 1;
        }
        state.proven.extend(proven.iter().copied());
        proven
    }

    /// Our challenge to `peer` went unanswered (failed or timed out).
    pub fn handle_failed(&mut self, peer: &PeerId) {
        if let Some(state) = self.peers.get_mut(peer) {
            state.pending = false;
        }
    }

    /// Whether `peer` proved it is a member of `tag`.
    pub fn is_member(&self, peer: &PeerId, tag: &NamespaceTag) -> bool {
        self.peers.get(peer).is_some_and(|p| p.proven.contains(tag))
    }

    /// Whether `peer` proved it is a member of any of our namespaces.
    pub fn is_proven(&self, peer: &PeerId) -> bool {
        self.peers.get(peer).is_some_and(|p| !p.proven.is_empty())
    }

    /// Whether our challenge to `peer` is still unanswered.
    pub fn is_pending(&self, peer: &PeerId) -> bool {
        self.peers.get(peer).is_some_and(|p| p.pending)
    }

    /// The connected peers proven members of `tag`.
    pub fn members(&self, tag: &NamespaceTag) -> Vec<PeerId> {
        let mut members: Vec<PeerId> = self
            .peers
            .iter()
            .filter(|(_, p)| p.proven.contains(tag))
            .map(|(id, _)| *id)
            .collect();
        members.sort();
        members
    }

    /// Counters.
    pub fn stats(&self) -> ProofStats {
        self.stats
    }

    fn challenge(&mut self, peer: PeerId, nonce: [u8; PROOF_LEN]) -> ProofRequest {
        let state = self.peers.entry(peer).or_default();
        state.sent = Some(nonce);
        state.pending = true;
        ProofRequest::Challenge { nonce }
    }

    fn macs(&self, verifier: &PeerId, nonce: &[u8; PROOF_LEN]) -> Vec<[u8; PROOF_LEN]> {
        self.namespaces
            .iter()
            .take(MAX_PROOFS)
            .map(|(_, key)| proof_mac(key, &self.local, verifier, nonce))
            .collect()
    }
}

fn constant_time_eq(a: &[u8; PROOF_LEN], b: &[u8; PROOF_LEN]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use libp2p::identity::Keypair;

    fn peer() -> PeerId {
        Keypair::generate_ed25519().public().to_peer_id()
    }

    fn keys(name: &str) -> NamespaceKeys {
        NamespaceKeys::derive(name, b"0123456789abcdef-secret")
    }

    fn counter() -> impl FnMut() -> [u8; PROOF_LEN] {
        let mut n = 0u8;
        move || {
            n = n.wrapping_add(1);
            [n; PROOF_LEN]
        }
    }

    /// Runs the exchange both ways between `a` and `b` as the swarm would.
    fn exchange(a: &mut Proofs, b: &mut Proofs, a_id: PeerId, b_id: PeerId) {
        let ProofRequest::Challenge { nonce: na } = a.handle_connected(b_id, [1; 32]).unwrap()
        else {
            panic!("a challenge")
        };
        let ProofRequest::Challenge { nonce: nb } = b.handle_connected(a_id, [2; 32]).unwrap()
        else {
            panic!("a challenge")
        };
        let ProofResponse::Proof { macs: from_b } = b.handle_challenge(a_id, na) else {
            panic!("a proof")
        };
        let ProofResponse::Proof { macs: from_a } = a.handle_challenge(b_id, nb) else {
            panic!("a proof")
        };
        a.handle_proof(b_id, &from_b);
        b.handle_proof(a_id, &from_a);
    }

    /// Delivers what `from` sent to `to`, and the answers back.
    fn deliver(
        sent: Vec<(PeerId, ProofRequest)>,
        (from, from_id): (&mut Proofs, PeerId),
        (to, to_id): (&mut Proofs, PeerId),
    ) {
        for (peer, request) in sent {
            assert_eq!(peer, to_id);
            match request {
                ProofRequest::Challenge { nonce } => {
                    let ProofResponse::Proof { macs } = to.handle_challenge(from_id, nonce) else {
                        panic!("a proof")
                    };
                    from.handle_proof(to_id, &macs);
                }
                ProofRequest::Proof { macs } => {
                    to.handle_proof(from_id, &macs);
                }
            }
        }
    }

    #[test]
    fn members_of_one_namespace_prove_it_to_each_other() {
        let (a_id, b_id) = (peer(), peer());
        let (mut a, mut b) = (Proofs::new(a_id), Proofs::new(b_id));
        a.add_namespace(&keys("lab"), counter());
        b.add_namespace(&keys("lab"), counter());
        exchange(&mut a, &mut b, a_id, b_id);
        let tag = keys("lab").tag();
        assert!(a.is_member(&b_id, &tag));
        assert!(b.is_member(&a_id, &tag));
        assert_eq!(a.members(&tag), vec![b_id]);
        assert!(!a.is_pending(&b_id));
        assert_eq!(a.stats().accepted, 1);
    }

    #[test]
    fn a_wrong_secret_or_another_namespace_proves_nothing() {
        let (a_id, b_id, c_id) = (peer(), peer(), peer());
        let mut a = Proofs::new(a_id);
        a.add_namespace(&keys("lab"), counter());
        let mut wrong = Proofs::new(b_id);
        wrong.add_namespace(
            &NamespaceKeys::derive("lab", b"another-secret-entirely"),
            counter(),
        );
        exchange(&mut a, &mut wrong, a_id, b_id);
        let mut other = Proofs::new(c_id);
        other.add_namespace(&keys("prod"), counter());
        exchange(&mut a, &mut other, a_id, c_id);
        let tag = keys("lab").tag();
        assert!(!a.is_member(&b_id, &tag));
        assert!(!a.is_member(&c_id, &tag));
        assert!(a.members(&tag).is_empty());
        assert_eq!(a.stats().unproven, 2);
        assert!(!wrong.is_member(&a_id, &tag));
    }

    #[test]
    fn a_proof_cannot_be_replayed_by_another_peer_or_for_another_nonce() {
        let lab = keys("lab");
        let (member, verifier, stranger) = (peer(), peer(), peer());
        let mut v = Proofs::new(verifier);
        v.add_namespace(&lab, counter());
        // The stranger is challenged by the verifier...
        let Some(ProofRequest::Challenge { nonce }) = v.handle_connected(stranger, [7; 32]) else {
            panic!("a challenge")
        };
        // ...relays the nonce to a member, who proves itself (to the stranger, the peer
        // on its connection), and hands that proof to the verifier: refused.
        let relayed = proof_mac(&lab.proof_key, &member, &stranger, &nonce);
        assert!(v.handle_proof(stranger, &[relayed]).is_empty());
        // A member's proof made for the verifier, shown by the stranger: refused (bound to
        // the prover's id).
        let stolen = proof_mac(&lab.proof_key, &member, &verifier, &nonce);
        assert!(v.handle_proof(stranger, &[stolen]).is_empty());
        // The member's proof over an old nonce: refused after reconnecting.
        v.handle_connected(member, [8; 32]);
        let old = proof_mac(&lab.proof_key, &member, &verifier, &[8; 32]);
        v.handle_disconnected(&member);
        v.handle_connected(member, [9; 32]);
        assert!(v.handle_proof(member, &[old]).is_empty());
        let fresh = proof_mac(&lab.proof_key, &member, &verifier, &[9; 32]);
        assert_eq!(v.handle_proof(member, &[fresh]), vec![lab.tag()]);
    }

    #[test]
    fn unasked_oversized_and_forgotten_proofs_are_refused() {
        let lab = keys("lab");
        let (a_id, b_id) = (peer(), peer());
        let mut a = Proofs::new(a_id);
        a.add_namespace(&lab, counter());
        // Never challenged: nothing to check a proof against.
        assert!(a.handle_proof(b_id, &[[0; 32]]).is_empty());
        a.handle_connected(b_id, [3; 32]);
        let good = proof_mac(&lab.proof_key, &b_id, &a_id, &[3; 32]);
        let mut many = vec![[0; 32]; MAX_PROOFS];
        many.push(good);
        assert!(a.handle_proof(b_id, &many).is_empty());
        assert_eq!(a.stats().refused, 2);
        assert_eq!(a.handle_proof(b_id, &[good]), vec![lab.tag()]);
        // Disconnected: forgotten.
        a.handle_disconnected(&b_id);
        assert!(!a.is_member(&b_id, &lab.tag()));
    }

    #[test]
    fn a_namespace_joined_later_is_proven_both_ways() {
        let (a_id, b_id) = (peer(), peer());
        let (mut a, mut b) = (Proofs::new(a_id), Proofs::new(b_id));
        a.add_namespace(&keys("lab"), counter());
        b.add_namespace(&keys("lab"), counter());
        exchange(&mut a, &mut b, a_id, b_id);
        // `b` joins prod, then `a`: each challenges the other again and pushes its proofs.
        let from_b = b.add_namespace(&keys("prod"), counter());
        deliver(from_b, (&mut b, b_id), (&mut a, a_id));
        let from_a = a.add_namespace(&keys("prod"), counter());
        assert_eq!(from_a.len(), 2);
        deliver(from_a, (&mut a, a_id), (&mut b, b_id));
        let prod = keys("prod").tag();
        assert!(a.is_member(&b_id, &prod));
        assert!(b.is_member(&a_id, &prod));
        a.remove_namespace(&prod);
        assert!(!a.is_member(&b_id, &prod));
        assert!(a.is_member(&b_id, &keys("lab").tag()));
    }
}
