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
//! A namespace with an authority ([`crate::cert`]) asks for more than the secret: the proof
//! also carries the prover's certificate, sealed for the verifier with the namespace's
//! record seal key (ChaCha20-Poly1305, a random nonce, the two peer ids as associated data:
//! a stranger learns neither the namespace nor the member's name and groups). The verifier
//! counts a MAC for such a namespace only with a certificate that its authority signed for
//! that namespace and for the prover's own peer id, valid now and not revoked; a membership
//! whose certificate expires or is revoked later ends then ([`Proofs::revalidate`]).
//!
//! This module is the pure state: the swarm glue ([`crate::swarm`]) sends the messages and
//! supplies the nonces and the time.

use std::collections::HashMap;

use blake2::digest::{KeyInit, Mac};
use blake2::Blake2sMac256;
use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};
use libp2p::PeerId;
use serde::{Deserialize, Serialize};

use crate::cert::{Certificate, Refusal, Trust, MAX_CERT_LEN};
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
const CERT_AAD: &[u8] = b"hyphae proof certificate v1";
/// Nonce in front of a sealed certificate.
const SEAL_NONCE_LEN: usize = 12;
/// Largest sealed certificate read: nonce, certificate, tag.
const MAX_SEALED_CERT: usize = SEAL_NONCE_LEN + MAX_CERT_LEN + 16;

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
        /// One sealed certificate per namespace with an authority (none from agents
        /// before certificates).
        #[serde(default)]
        certificates: Vec<Vec<u8>>,
    },
}

/// The answer to a [`ProofRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProofResponse {
    /// The answer to a challenge.
    Proof {
        /// One MAC per namespace.
        macs: Vec<[u8; PROOF_LEN]>,
        /// One sealed certificate per namespace with an authority.
        #[serde(default)]
        certificates: Vec<Vec<u8>>,
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
    /// Whether it answered our challenge (with proofs or none).
    answered: bool,
    /// The nonce it challenged us with: pushed proofs are made over it.
    received: Option<[u8; PROOF_LEN]>,
    /// Our namespaces it proved, with its certificate where the namespace has an
    /// authority.
    proven: HashMap<NamespaceTag, Option<Certificate>>,
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
    /// Memberships refused or ended for their certificate, by reason (in
    /// [`Refusal::ALL`]'s order).
    pub certificates_refused: [u64; Refusal::ALL.len()],
}

/// What a member of a namespace with an authority shows: its certificate, and what it
/// trusts.
#[derive(Debug, Clone)]
pub struct Credential {
    /// The authority, its revocation list, the namespace.
    pub trust: Trust,
    /// This member's certificate, as signed.
    pub certificate: Vec<u8>,
}

/// One of our namespaces.
#[derive(Debug)]
struct Namespace {
    tag: NamespaceTag,
    proof_key: [u8; 32],
    seal_key: [u8; 32],
    credential: Option<Credential>,
    /// All its keys, where it has an authority (a replica opens claims with them).
    keys: Option<NamespaceKeys>,
}

/// Which connected peers proved which of our namespaces.
#[derive(Debug)]
pub struct Proofs {
    local: PeerId,
    namespaces: Vec<Namespace>,
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
        credential: Option<Credential>,
        mut fresh: impl FnMut() -> [u8; PROOF_LEN],
    ) -> Vec<(PeerId, ProofRequest)> {
        let tag = keys.tag();
        self.namespaces.retain(|n| n.tag != tag);
        self.namespaces.push(Namespace {
            tag,
            proof_key: keys.proof_key,
            seal_key: keys.seal_key,
            keys: credential.is_some().then(|| keys.clone()),
            credential,
        });
        let peers: Vec<PeerId> = self.peers.keys().copied().collect();
        let mut out = Vec::new();
        for peer in peers {
            out.push((peer, self.challenge(peer, fresh())));
            if let Some(nonce) = self.peers.get(&peer).and_then(|p| p.received) {
                let (macs, certificates) = self.proof(&peer, &nonce, &mut fresh);
                out.push((peer, ProofRequest::Proof { macs, certificates }));
            }
        }
        out
    }

    /// Our new certificate for namespace `tag` (a renewal). Returns the proofs to push to
    /// every peer that challenged us, made with it.
    pub fn renew_certificate(
        &mut self,
        tag: &NamespaceTag,
        certificate: Vec<u8>,
        mut fresh: impl FnMut() -> [u8; PROOF_LEN],
    ) -> Vec<(PeerId, ProofRequest)> {
        let Some(credential) = self
            .namespaces
            .iter_mut()
            .find(|n| n.tag == *tag)
            .and_then(|n| n.credential.as_mut())
        else {
            return Vec::new();
        };
        credential.certificate = certificate;
        let peers: Vec<(PeerId, [u8; PROOF_LEN])> = self
            .peers
            .iter()
            .filter_map(|(id, p)| Some((*id, p.received?)))
            .collect();
        peers
            .into_iter()
            .map(|(peer, nonce)| {
                let (macs, certificates) = self.proof(&peer, &nonce, &mut fresh);
                (peer, ProofRequest::Proof { macs, certificates })
            })
            .collect()
    }

    /// Forgets one of our namespaces (peers that proved only it are members of nothing we
    /// hold). Peers keep our old proof: harmless, it names a namespace we have left.
    pub fn remove_namespace(&mut self, tag: &NamespaceTag) {
        self.namespaces.retain(|n| n.tag != *tag);
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

    /// A challenge from `peer`: the answer, our proofs over its nonce (`fresh` gives the
    /// random bytes the certificates are sealed with).
    pub fn handle_challenge(
        &mut self,
        peer: PeerId,
        nonce: [u8; PROOF_LEN],
        mut fresh: impl FnMut() -> [u8; PROOF_LEN],
    ) -> ProofResponse {
        self.peers.entry(peer).or_default().received = Some(nonce);
        let (macs, certificates) = self.proof(&peer, &nonce, &mut fresh);
        ProofResponse::Proof { macs, certificates }
    }

    /// Proofs from `peer` (the answer to our challenge, or pushed) at `now` (Unix
    /// seconds). Returns the namespaces of ours it is now proven a member of.
    pub fn handle_proof(
        &mut self,
        peer: PeerId,
        macs: &[[u8; PROOF_LEN]],
        certificates: &[Vec<u8>],
        now: u64,
    ) -> Vec<NamespaceTag> {
        let Some(state) = self.peers.get_mut(&peer) else {
            self.stats.refused += 1;
            return Vec::new();
        };
        let Some(nonce) = state.sent else {
            self.stats.refused += 1;
            return Vec::new();
        };
        state.pending = false;
        state.answered = true;
        if macs.len() > MAX_PROOFS || certificates.len() > MAX_PROOFS {
            self.stats.refused += 1;
            return Vec::new();
        }
        let identity =
            crate::swarm::owner_key(&peer).and_then(|k| crate::PeerId::from_bytes(k).ok());
        let mut proven = Vec::new();
        for ns in &self.namespaces {
            let expected = proof_mac(&ns.proof_key, &peer, &self.local, &nonce);
            // Compared in constant time: a MAC check must not leak how much matched.
            if !macs.iter().any(|m| constant_time_eq(m, &expected)) {
                continue;
            }
            let Some(credential) = &ns.credential else {
                proven.push((ns.tag, None));
                continue;
            };
            // The first certificate that opens under this namespace's key decides.
            let opened = certificates
                .iter()
                .find_map(|sealed| open_certificate(&ns.seal_key, &peer, &self.local, sealed));
            let checked = match (opened, identity) {
                (None, _) => Err(Refusal::Missing),
                (Some(_), None) => Err(Refusal::OtherIdentity),
                (Some(bytes), Some(identity)) => credential.trust.check(&bytes, &identity, now),
            };
            match checked {
                Ok(cert) => proven.push((ns.tag, Some(cert))),
                Err(reason) => self.stats.count_refusal(reason),
            }
        }
        if proven.is_empty() {
            self.stats.unproven += 1;
        } else {
            self.stats.accepted += 1;
        }
        let tags = proven.iter().map(|(t, _)| *t).collect();
        state.proven.extend(proven);
        tags
    }

    /// Ends the memberships whose certificates expired by `now` (Unix seconds) or that the
    /// revocation list held now revokes; returns them.
    pub fn revalidate(&mut self, now: u64) -> Vec<(PeerId, NamespaceTag)> {
        let mut ended = Vec::new();
        for (id, peer) in &mut self.peers {
            peer.proven.retain(|tag, cert| {
                let Some(cert) = cert else {
                    return true;
                };
                let Some(credential) = self
                    .namespaces
                    .iter()
                    .find(|n| n.tag == *tag)
                    .and_then(|n| n.credential.as_ref())
                else {
                    return true;
                };
                match credential.trust.check_current(cert, now) {
                    Ok(()) => true,
                    Err(reason) => {
                        self.stats.count_refusal(reason);
                        ended.push((*id, *tag));
                        false
                    }
                }
            });
        }
        ended
    }

    /// Takes a revocation list for namespace `tag` if its authority signed it and it is
    /// newer than the one held, and ends the memberships it revokes (as
    /// [`Proofs::revalidate`] at `now`). Returns the list's version and those ended.
    pub fn update_revocations(
        &mut self,
        tag: &NamespaceTag,
        list: &[u8],
        now: u64,
    ) -> Result<(u64, Vec<(PeerId, NamespaceTag)>), Refusal> {
        let credential = self
            .namespaces
            .iter_mut()
            .find(|n| n.tag == *tag)
            .and_then(|n| n.credential.as_mut())
            .ok_or(Refusal::WrongAuthority)?;
        let version = credential.trust.update(list)?.version();
        Ok((version, self.revalidate(now)))
    }

    /// Takes a signed policy for namespace `tag` if its authority signed it and it is
    /// newer than the one held (see [`Trust::update_policy`]).
    pub fn update_policy(
        &mut self,
        tag: &NamespaceTag,
        policy: &[u8],
    ) -> Result<crate::cert::SignedPolicy, Refusal> {
        self.namespaces
            .iter_mut()
            .find(|n| n.tag == *tag)
            .and_then(|n| n.credential.as_mut())
            .ok_or(Refusal::WrongAuthority)?
            .trust
            .update_policy(policy)
    }

    /// The trust of namespace `tag`, if it has an authority.
    pub fn trust(&self, tag: &NamespaceTag) -> Option<&Trust> {
        self.namespaces
            .iter()
            .find(|n| n.tag == *tag)
            .and_then(|n| n.credential.as_ref())
            .map(|c| &c.trust)
    }

    /// The keys of namespace `tag`, if it has an authority.
    pub fn certified_keys(&self, tag: &NamespaceTag) -> Option<&NamespaceKeys> {
        self.namespaces
            .iter()
            .find(|n| n.tag == *tag)
            .and_then(|n| n.keys.as_ref())
    }

    /// The certificate `peer` proved namespace `tag` with, if it has an authority.
    pub fn certificate(&self, peer: &PeerId, tag: &NamespaceTag) -> Option<&Certificate> {
        self.peers.get(peer)?.proven.get(tag)?.as_ref()
    }

    /// Our challenge to `peer` went unanswered (failed or timed out).
    pub fn handle_failed(&mut self, peer: &PeerId) {
        if let Some(state) = self.peers.get_mut(peer) {
            state.pending = false;
        }
    }

    /// Whether `peer` proved it is a member of `tag`.
    pub fn is_member(&self, peer: &PeerId, tag: &NamespaceTag) -> bool {
        self.peers
            .get(peer)
            .is_some_and(|p| p.proven.contains_key(tag))
    }

    /// Whether `peer` answered our challenge on its connection without proving `tag`: a
    /// peer known not to be a member of that namespace (a member of others, a stranger).
    pub fn is_outsider(&self, peer: &PeerId, tag: &NamespaceTag) -> bool {
        self.peers
            .get(peer)
            .is_some_and(|p| p.answered && !p.proven.contains_key(tag))
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
            .filter(|(_, p)| p.proven.contains_key(tag))
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

    /// Our MACs over `nonce` for `verifier`, and our certificates sealed for it.
    fn proof(
        &self,
        verifier: &PeerId,
        nonce: &[u8; PROOF_LEN],
        fresh: &mut impl FnMut() -> [u8; PROOF_LEN],
    ) -> (Vec<[u8; PROOF_LEN]>, Vec<Vec<u8>>) {
        let namespaces = self.namespaces.iter().take(MAX_PROOFS);
        let macs = namespaces
            .clone()
            .map(|n| proof_mac(&n.proof_key, &self.local, verifier, nonce))
            .collect();
        let certificates = namespaces
            .filter_map(|n| {
                let credential = n.credential.as_ref()?;
                let mut nonce = [0u8; SEAL_NONCE_LEN];
                nonce.copy_from_slice(&fresh()[..SEAL_NONCE_LEN]);
                seal_certificate(
                    &n.seal_key,
                    &self.local,
                    verifier,
                    nonce,
                    &credential.certificate,
                )
            })
            .collect();
        (macs, certificates)
    }
}

impl ProofStats {
    fn count_refusal(&mut self, reason: Refusal) {
        if let Some(i) = Refusal::ALL.iter().position(|r| *r == reason) {
            self.certificates_refused[i] += 1;
        }
    }

    /// Memberships refused or ended for `reason`.
    pub fn refused_for(&self, reason: Refusal) -> u64 {
        Refusal::ALL
            .iter()
            .position(|r| *r == reason)
            .map_or(0, |i| self.certificates_refused[i])
    }
}

/// The associated data of a certificate sealed by `prover` for `verifier`.
fn certificate_aad(prover: &PeerId, verifier: &PeerId) -> Vec<u8> {
    let mut aad = CERT_AAD.to_vec();
    for id in [prover.to_bytes(), verifier.to_bytes()] {
        aad.extend_from_slice(&(id.len() as u32).to_le_bytes());
        aad.extend_from_slice(&id);
    }
    aad
}

/// `certificate` sealed by `prover` for `verifier` under a namespace's seal key: the
/// random `nonce`, then the ChaCha20-Poly1305 ciphertext.
fn seal_certificate(
    key: &[u8; 32],
    prover: &PeerId,
    verifier: &PeerId,
    nonce: [u8; SEAL_NONCE_LEN],
    certificate: &[u8],
) -> Option<Vec<u8>> {
    use chacha20poly1305::KeyInit as _;
    let cipher = ChaCha20Poly1305::new(key.into());
    let aad = certificate_aad(prover, verifier);
    let sealed = cipher
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: certificate,
                aad: &aad,
            },
        )
        .ok()?;
    let mut out = nonce.to_vec();
    out.extend(sealed);
    Some(out)
}

/// What [`seal_certificate`] sealed, if it was sealed under `key` by `prover` for
/// `verifier`.
fn open_certificate(
    key: &[u8; 32],
    prover: &PeerId,
    verifier: &PeerId,
    sealed: &[u8],
) -> Option<Vec<u8>> {
    use chacha20poly1305::KeyInit as _;
    if sealed.len() > MAX_SEALED_CERT {
        return None;
    }
    let (nonce, ciphertext) = sealed.split_at_checked(SEAL_NONCE_LEN)?;
    let cipher = ChaCha20Poly1305::new(key.into());
    let aad = certificate_aad(prover, verifier);
    cipher
        .decrypt(
            Nonce::from_slice(nonce),
            Payload {
                msg: ciphertext,
                aad: &aad,
            },
        )
        .ok()
}

fn constant_time_eq(a: &[u8; PROOF_LEN], b: &[u8; PROOF_LEN]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use libp2p::identity::Keypair;

    const NOW: u64 = 1_800_000_000;

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
        let ProofResponse::Proof {
            macs: from_b,
            certificates: certs_b,
        } = b.handle_challenge(a_id, na, counter())
        else {
            panic!("a proof")
        };
        let ProofResponse::Proof {
            macs: from_a,
            certificates: certs_a,
        } = a.handle_challenge(b_id, nb, counter())
        else {
            panic!("a proof")
        };
        a.handle_proof(b_id, &from_b, &certs_b, NOW);
        b.handle_proof(a_id, &from_a, &certs_a, NOW);
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
                    let ProofResponse::Proof { macs, certificates } =
                        to.handle_challenge(from_id, nonce, counter())
                    else {
                        panic!("a proof")
                    };
                    from.handle_proof(to_id, &macs, &certificates, NOW);
                }
                ProofRequest::Proof { macs, certificates } => {
                    to.handle_proof(from_id, &macs, &certificates, NOW);
                }
            }
        }
    }

    #[test]
    fn members_of_one_namespace_prove_it_to_each_other() {
        let (a_id, b_id) = (peer(), peer());
        let (mut a, mut b) = (Proofs::new(a_id), Proofs::new(b_id));
        a.add_namespace(&keys("lab"), None, counter());
        b.add_namespace(&keys("lab"), None, counter());
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
        a.add_namespace(&keys("lab"), None, counter());
        let mut wrong = Proofs::new(b_id);
        wrong.add_namespace(
            &NamespaceKeys::derive("lab", b"another-secret-entirely"),
            None,
            counter(),
        );
        exchange(&mut a, &mut wrong, a_id, b_id);
        let mut other = Proofs::new(c_id);
        other.add_namespace(&keys("prod"), None, counter());
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
        v.add_namespace(&lab, None, counter());
        // The stranger is challenged by the verifier...
        let Some(ProofRequest::Challenge { nonce }) = v.handle_connected(stranger, [7; 32]) else {
            panic!("a challenge")
        };
        // ...relays the nonce to a member, who proves itself (to the stranger, the peer
        // on its connection), and hands that proof to the verifier: refused.
        let relayed = proof_mac(&lab.proof_key, &member, &stranger, &nonce);
        assert!(v.handle_proof(stranger, &[relayed], &[], NOW).is_empty());
        // A member's proof made for the verifier, shown by the stranger: refused (bound to
        // the prover's id).
        let stolen = proof_mac(&lab.proof_key, &member, &verifier, &nonce);
        assert!(v.handle_proof(stranger, &[stolen], &[], NOW).is_empty());
        // The member's proof over an old nonce: refused after reconnecting.
        v.handle_connected(member, [8; 32]);
        let old = proof_mac(&lab.proof_key, &member, &verifier, &[8; 32]);
        v.handle_disconnected(&member);
        v.handle_connected(member, [9; 32]);
        assert!(v.handle_proof(member, &[old], &[], NOW).is_empty());
        let fresh = proof_mac(&lab.proof_key, &member, &verifier, &[9; 32]);
        assert_eq!(v.handle_proof(member, &[fresh], &[], NOW), vec![lab.tag()]);
    }

    #[test]
    fn unasked_oversized_and_forgotten_proofs_are_refused() {
        let lab = keys("lab");
        let (a_id, b_id) = (peer(), peer());
        let mut a = Proofs::new(a_id);
        a.add_namespace(&lab, None, counter());
        // Never challenged: nothing to check a proof against.
        assert!(a.handle_proof(b_id, &[[0; 32]], &[], NOW).is_empty());
        a.handle_connected(b_id, [3; 32]);
        let good = proof_mac(&lab.proof_key, &b_id, &a_id, &[3; 32]);
        let mut many = vec![[0; 32]; MAX_PROOFS];
        many.push(good);
        assert!(a.handle_proof(b_id, &many, &[], NOW).is_empty());
        assert_eq!(a.stats().refused, 2);
        assert_eq!(a.handle_proof(b_id, &[good], &[], NOW), vec![lab.tag()]);
        // Disconnected: forgotten.
        a.handle_disconnected(&b_id);
        assert!(!a.is_member(&b_id, &lab.tag()));
    }

    #[test]
    fn a_namespace_joined_later_is_proven_both_ways() {
        let (a_id, b_id) = (peer(), peer());
        let (mut a, mut b) = (Proofs::new(a_id), Proofs::new(b_id));
        a.add_namespace(&keys("lab"), None, counter());
        b.add_namespace(&keys("lab"), None, counter());
        exchange(&mut a, &mut b, a_id, b_id);
        // `b` joins prod, then `a`: each challenges the other again and pushes its proofs.
        let from_b = b.add_namespace(&keys("prod"), None, counter());
        deliver(from_b, (&mut b, b_id), (&mut a, a_id));
        let from_a = a.add_namespace(&keys("prod"), None, counter());
        assert_eq!(from_a.len(), 2);
        deliver(from_a, (&mut a, a_id), (&mut b, b_id));
        let prod = keys("prod").tag();
        assert!(a.is_member(&b_id, &prod));
        assert!(b.is_member(&a_id, &prod));
        a.remove_namespace(&prod);
        assert!(!a.is_member(&b_id, &prod));
        assert!(a.is_member(&b_id, &keys("lab").tag()));
    }

    mod certified {
        use super::*;
        use crate::cert::{fingerprint, AuthorityKey, CertificateRequest};
        use crate::Identity;

        const DAY: u64 = 86_400;

        /// A member: its libp2p peer id and its identity's public key (the same key).
        fn member(seed: u8) -> (PeerId, crate::PeerId) {
            let key = Keypair::ed25519_from_bytes([seed; 32]).unwrap();
            (
                key.public().to_peer_id(),
                Identity::from_seed([seed; 32]).peer_id(),
            )
        }

        fn sign(ca: &AuthorityKey, namespace: &str, identity: crate::PeerId, end: u64) -> Vec<u8> {
            ca.sign(&CertificateRequest {
                namespace: namespace.into(),
                identity,
                name: format!("m{}", identity.as_bytes()[0]),
                groups: vec!["web".into()],
                addresses: Vec::new(),
                not_before: NOW - DAY,
                not_after: end,
            })
            .unwrap()
        }

        fn credential(ca: &AuthorityKey, certificate: Vec<u8>) -> Option<Credential> {
            Some(Credential {
                trust: Trust::new("lab", ca.authority()),
                certificate,
            })
        }

        #[test]
        fn certified_members_prove_each_other_and_learn_their_certificates() {
            let ca = AuthorityKey::from_seed([40; 32]);
            let ((a_id, a_key), (b_id, b_key)) = (member(1), member(2));
            let (mut a, mut b) = (Proofs::new(a_id), Proofs::new(b_id));
            a.add_namespace(
                &keys("lab"),
                credential(&ca, sign(&ca, "lab", a_key, NOW + DAY)),
                counter(),
            );
            b.add_namespace(
                &keys("lab"),
                credential(&ca, sign(&ca, "lab", b_key, NOW + DAY)),
                counter(),
            );
            exchange(&mut a, &mut b, a_id, b_id);
            let tag = keys("lab").tag();
            assert!(a.is_member(&b_id, &tag));
            assert!(b.is_member(&a_id, &tag));
            let cert = a.certificate(&b_id, &tag).unwrap();
            assert_eq!(cert.identity(), b_key);
            assert_eq!(cert.groups(), ["web"]);
            assert_eq!(a.trust(&tag).unwrap().authority(), ca.authority());
        }

        #[test]
        fn the_secret_without_a_good_certificate_proves_nothing() {
            let ca = AuthorityKey::from_seed([40; 32]);
            let other_ca = AuthorityKey::from_seed([41; 32]);
            let (v_id, v_key) = member(1);
            let tag = keys("lab").tag();
            // Each prover holds the secret; only its certificate is wrong.
            let cases: Vec<(&str, Option<Vec<u8>>, Refusal)> = vec![
                (
                    "expired",
                    Some(sign(&ca, "lab", member(2).1, NOW - DAY)),
                    Refusal::Expired,
                ),
                (
                    "foreign authority",
                    Some(sign(&other_ca, "lab", member(3).1, NOW + DAY)),
                    Refusal::WrongAuthority,
                ),
                (
                    "another namespace",
                    Some(sign(&ca, "prod", member(4).1, NOW + DAY)),
                    Refusal::OtherNamespace,
                ),
                // Someone else's certificate, shown by member 5.
                (
                    "another identity",
                    Some(sign(&ca, "lab", v_key, NOW + DAY)),
                    Refusal::OtherIdentity,
                ),
            ];
            let mut v = Proofs::new(v_id);
            v.add_namespace(
                &keys("lab"),
                credential(&ca, sign(&ca, "lab", v_key, NOW + DAY)),
                counter(),
            );
            for (i, (what, cert, reason)) in cases.into_iter().enumerate() {
                let (p_id, _) = member(2 + i as u8);
                let mut p = Proofs::new(p_id);
                let cred = cert.map(|c| Credential {
                    trust: Trust::new("lab", ca.authority()),
                    certificate: c,
                });
                p.add_namespace(&keys("lab"), cred, counter());
                exchange(&mut v, &mut p, v_id, p_id);
                assert!(!v.is_member(&p_id, &tag), "{what}");
                assert_eq!(v.stats().refused_for(reason), 1, "{what}");
                // The prover sees the verifier as a member: the verifier's certificate is good.
                assert!(p.is_member(&v_id, &tag), "{what}");
            }
            // The secret alone (an agent configured without the authority).
            let (p_id, _) = member(9);
            let mut p = Proofs::new(p_id);
            p.add_namespace(&keys("lab"), None, counter());
            exchange(&mut v, &mut p, v_id, p_id);
            assert!(!v.is_member(&p_id, &tag));
            assert_eq!(v.stats().refused_for(Refusal::Missing), 1);
            // A good certificate without the secret: no MAC, nothing to open it with.
            let (q_id, q_key) = member(10);
            let mut q = Proofs::new(q_id);
            q.add_namespace(
                &NamespaceKeys::derive("lab", b"another-secret-entirely"),
                credential(&ca, sign(&ca, "lab", q_key, NOW + DAY)),
                counter(),
            );
            exchange(&mut v, &mut q, v_id, q_id);
            assert!(!v.is_member(&q_id, &tag));
        }

        #[test]
        fn expiry_and_revocation_end_a_membership() {
            let ca = AuthorityKey::from_seed([40; 32]);
            let ((v_id, v_key), (a_id, a_key), (b_id, b_key)) = (member(1), member(2), member(3));
            let tag = keys("lab").tag();
            let mut v = Proofs::new(v_id);
            v.add_namespace(
                &keys("lab"),
                credential(&ca, sign(&ca, "lab", v_key, NOW + 9 * DAY)),
                counter(),
            );
            let mut a = Proofs::new(a_id);
            a.add_namespace(
                &keys("lab"),
                credential(&ca, sign(&ca, "lab", a_key, NOW + DAY)),
                counter(),
            );
            let b_cert = sign(&ca, "lab", b_key, NOW + 9 * DAY);
            let mut b = Proofs::new(b_id);
            b.add_namespace(&keys("lab"), credential(&ca, b_cert.clone()), counter());
            exchange(&mut v, &mut a, v_id, a_id);
            exchange(&mut v, &mut b, v_id, b_id);
            assert_eq!(v.members(&tag).len(), 2);

            // A day and a bit later, a's certificate has expired: its membership ends.
            assert!(v.revalidate(NOW + 2 * DAY).contains(&(a_id, tag)));
            assert!(!v.is_member(&a_id, &tag));
            assert!(v.is_member(&b_id, &tag));
            assert_eq!(v.stats().refused_for(Refusal::Expired), 1);

            // b's certificate is revoked: ends at once; an older list is refused.
            let list = ca.revoke(2, NOW, &[], &[fingerprint(&b_cert)]).unwrap();
            let (version, ended) = v.update_revocations(&tag, &list, NOW).unwrap();
            assert_eq!((version, ended), (2, vec![(b_id, tag)]));
            assert!(!v.is_member(&b_id, &tag));
            let old = ca.revoke(1, NOW, &[], &[]).unwrap();
            assert_eq!(
                v.update_revocations(&tag, &old, NOW).unwrap_err(),
                Refusal::Outdated
            );
            // Its proof is refused from now on (a new connection, proved again).
            v.handle_disconnected(&b_id);
            b.handle_disconnected(&v_id);
            exchange(&mut v, &mut b, v_id, b_id);
            assert!(!v.is_member(&b_id, &tag));
            assert_eq!(v.stats().refused_for(Refusal::Revoked), 2);
        }

        #[test]
        fn a_stranger_cannot_read_a_sealed_certificate() {
            let ca = AuthorityKey::from_seed([40; 32]);
            let ((a_id, a_key), (s_id, _)) = (member(1), member(2));
            let mut a = Proofs::new(a_id);
            let cert = sign(&ca, "lab", a_key, NOW + DAY);
            a.add_namespace(&keys("lab"), credential(&ca, cert.clone()), counter());
            let ProofResponse::Proof { certificates, .. } =
                a.handle_challenge(s_id, [5; 32], counter())
            else {
                panic!("a proof")
            };
            assert_eq!(certificates.len(), 1);
            let sealed = &certificates[0];
            // The certificate does not show.
            assert!(!sealed.windows(cert.len()).any(|w| w == cert.as_slice()));
            // Opened by a member for whom it was sealed; not under another namespace's key,
            // nor by a third peer that was handed it.
            let lab = keys("lab");
            assert_eq!(
                open_certificate(&lab.seal_key, &a_id, &s_id, sealed),
                Some(cert)
            );
            assert_eq!(
                open_certificate(&keys("prod").seal_key, &a_id, &s_id, sealed),
                None
            );
            assert_eq!(
                open_certificate(&lab.seal_key, &a_id, &member(3).0, sealed),
                None
            );
        }
    }
}
