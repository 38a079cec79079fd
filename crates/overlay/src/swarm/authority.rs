//! What a namespace's authority signs for every member, spread by push
//! (`/hyphae/authority/1`): revocation lists and the namespace's policy. A member that
//! takes a newer document (from `hyphae ca publish` or `hyphae policy publish`, or from
//! another member) passes it to every proven member of that namespace it is connected to,
//! and each of them does the same; an older or equal version stops there. A peer newly
//! proven a member is given both at once, so a member that was away, or joins later,
//! learns them on its first connection. Documents are taken only from proven members (the
//! version is checked first, then the authority's signature, before anything changes),
//! and only a newer version is passed on: a flood ends after one round per member.

use std::time::Instant;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use libp2p::request_response;
use serde::{Deserialize, Serialize};

use super::{owner_key, NetworkId, Overlay, OverlayEvent};
use crate::cert::{Refusal, MAX_LIST_LEN, MAX_POLICY_LEN};
use crate::proof::NamespaceTag;
use crate::records::OwnerKey;

/// The protocol name.
pub const AUTHORITY_PROTOCOL: &str = "/hyphae/authority/1";

/// Which document of the authority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Document {
    /// A revocation list ([`crate::cert::RevocationList`]).
    Revocations,
    /// The namespace's policy ([`crate::cert::SignedPolicy`]).
    Policy,
}

impl Document {
    fn max_len(self) -> usize {
        match self {
            Document::Revocations => MAX_LIST_LEN,
            Document::Policy => MAX_POLICY_LEN,
        }
    }
}

/// A document of a namespace's authority pushed to a member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthorityPush {
    /// The namespace's tag.
    pub ns: NamespaceTag,
    /// Which document.
    pub kind: Document,
    /// The document as its authority signed it, in base64.
    pub doc: String,
}

/// Whether the receiver took the document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthorityAck {
    /// Newer than the one it held: taken, and passed on.
    Taken,
    /// Not taken: not newer, not signed by the namespace's authority, or from a peer not
    /// proven a member.
    Refused,
}

impl Overlay {
    /// Takes a newer revocation list for namespace `tag` (see
    /// [`crate::proof::Proofs::update_revocations`]): the members it revokes are members no
    /// longer, and every proven member of the namespace connected to this agent is given
    /// it. Returns its version.
    pub fn update_revocations(&mut self, tag: &NamespaceTag, list: &[u8]) -> Result<u64, Refusal> {
        let (now, wall) = super::clocks();
        // The members it revokes hear it too (their status says so).
        let members = self.proofs.members(tag);
        let (version, ended) = self.proofs.update_revocations(tag, list, wall)?;
        for (peer, _) in &ended {
            tracing::info!(%peer, "member revoked");
        }
        self.drop_revoked(now, tag, &ended);
        self.push(tag, Document::Revocations, list, &members, None);
        Ok(version)
    }

    /// Takes a newer signed policy for namespace `tag` (see
    /// [`crate::cert::Trust::update_policy`]) and gives it to every proven member of the
    /// namespace connected to this agent. Returns its version.
    pub fn update_policy(&mut self, tag: &NamespaceTag, policy: &[u8]) -> Result<u64, Refusal> {
        let version = self.proofs.update_policy(tag, policy)?.version();
        let members = self.proofs.members(tag);
        self.push(tag, Document::Policy, policy, &members, None);
        Ok(version)
    }

    /// The version of the signed policy held for namespace `tag` (0: none).
    pub fn policy_version(&self, tag: &NamespaceTag) -> u64 {
        self.proofs
            .trust(tag)
            .map_or(0, crate::cert::Trust::policy_version)
    }

    /// A replica's part of a revocation or an expiry: the leases and group entries of
    /// every identity the list of `tag` revokes, and of the members in `ended` (revoked by
    /// certificate, or expired), go now, so their addresses and names are free at once.
    pub(super) fn drop_revoked(
        &mut self,
        now: Instant,
        tag: &NamespaceTag,
        ended: &[(NetworkId, NamespaceTag)],
    ) {
        let mut owners: Vec<OwnerKey> = self
            .proofs
            .trust(tag)
            .map(|t| t.revoked_identities().copied().collect())
            .unwrap_or_default();
        owners.extend(
            ended
                .iter()
                .filter(|(_, t)| t == tag)
                .filter_map(|(peer, _)| owner_key(peer)),
        );
        let dropped: usize = owners
            .iter()
            .map(|owner| self.store.drop_owner(now, tag, owner))
            .sum();
        if dropped > 0 {
            tracing::info!(dropped, "records of revoked or expired members dropped");
        }
    }

    /// Gives document `doc` of `tag` to `members` but `except`.
    fn push(
        &mut self,
        tag: &NamespaceTag,
        kind: Document,
        doc: &[u8],
        members: &[NetworkId],
        except: Option<NetworkId>,
    ) {
        let push = AuthorityPush {
            ns: *tag,
            kind,
            doc: B64.encode(doc),
        };
        for &peer in members {
            if Some(peer) != except {
                self.swarm
                    .behaviour_mut()
                    .authority
                    .send_request(&peer, push.clone());
            }
        }
    }

    /// `peer` was just proven a member of `tags`: it is given the documents held for them.
    pub(super) fn share_authority(&mut self, peer: NetworkId, tags: &[NamespaceTag]) {
        for tag in tags {
            let Some(trust) = self.proofs.trust(tag) else {
                continue;
            };
            let held = [
                (Document::Revocations, trust.revocations()),
                (Document::Policy, trust.policy()),
            ];
            let pushes: Vec<AuthorityPush> = held
                .into_iter()
                .filter_map(|(kind, doc)| {
                    doc.map(|d| AuthorityPush {
                        ns: *tag,
                        kind,
                        doc: B64.encode(d),
                    })
                })
                .collect();
            for push in pushes {
                self.swarm
                    .behaviour_mut()
                    .authority
                    .send_request(&peer, push);
            }
        }
    }

    /// Takes document `doc` of `kind` for `tag` from member `peer`. Returns whether it
    /// was newer and the authority's.
    fn take_pushed(
        &mut self,
        now: Instant,
        wall: u64,
        peer: NetworkId,
        tag: &NamespaceTag,
        kind: Document,
        doc: Vec<u8>,
    ) -> bool {
        let members = self.proofs.members(tag);
        let taken = match kind {
            Document::Revocations => match self.proofs.update_revocations(tag, &doc, wall) {
                Ok((version, ended)) => {
                    tracing::info!(%peer, version, revoked = ended.len(), "revocation list taken");
                    self.drop_revoked(now, tag, &ended);
                    Ok(())
                }
                Err(e) => Err(e),
            },
            Document::Policy => self.proofs.update_policy(tag, &doc).map(|p| {
                tracing::info!(%peer, version = p.version(), "policy taken");
            }),
        };
        if let Err(reason) = taken {
            tracing::debug!(%peer, ?kind, %reason, "authority document not taken");
            return false;
        }
        self.push(tag, kind, &doc, &members, Some(peer));
        self.events.push_back(match kind {
            Document::Revocations => OverlayEvent::Revocations {
                ns: *tag,
                list: doc,
            },
            Document::Policy => OverlayEvent::Policy {
                ns: *tag,
                policy: doc,
            },
        });
        true
    }

    pub(super) fn handle_authority(
        &mut self,
        now: Instant,
        wall: u64,
        event: request_response::Event<AuthorityPush, AuthorityAck>,
    ) {
        let request_response::Event::Message {
            peer,
            message:
                request_response::Message::Request {
                    request, channel, ..
                },
            ..
        } = event
        else {
            return;
        };
        let doc = B64
            .decode(&request.doc)
            .ok()
            .filter(|d| d.len() <= request.kind.max_len());
        let taken = match doc {
            Some(doc) if self.proofs.is_member(&peer, &request.ns) => {
                self.take_pushed(now, wall, peer, &request.ns, request.kind, doc)
            }
            _ => false,
        };
        let ack = if taken {
            AuthorityAck::Taken
        } else {
            AuthorityAck::Refused
        };
        let _ = self
            .swarm
            .behaviour_mut()
            .authority
            .send_response(channel, ack);
    }
}
