//! Revocation lists spread by push (`/hyphae/revocations/1`): a member that takes a newer
//! list of a namespace's authority (from `hyphae ca publish`, or from another member)
//! passes it to every proven member of that namespace it is connected to, and each of
//! them does the same; an older or equal version stops there. A peer newly proven a member
//! is given the list at once, so a member that was away, or joins later, learns it on its
//! first connection. Lists are taken only from proven members (the authority's signature
//! is checked before anything else changes), and only a newer version is passed on: a
//! flood ends after one round per member.

use std::time::Instant;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use libp2p::request_response;
use serde::{Deserialize, Serialize};

use super::{owner_key, NetworkId, Overlay, OverlayEvent};
use crate::cert::{Refusal, MAX_LIST_LEN};
use crate::proof::NamespaceTag;
use crate::records::OwnerKey;

/// The protocol name.
pub const REVOCATIONS_PROTOCOL: &str = "/hyphae/revocations/1";

/// A revocation list pushed to a member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevocationPush {
    /// The namespace's tag.
    pub ns: NamespaceTag,
    /// The list as its authority signed it, in base64.
    pub list: String,
}

/// Whether the receiver took the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RevocationAck {
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
        self.push_revocations(tag, list, &members, None);
        Ok(version)
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

    /// Gives the list of `tag` to `members` but `except`.
    fn push_revocations(
        &mut self,
        tag: &NamespaceTag,
        list: &[u8],
        members: &[NetworkId],
        except: Option<NetworkId>,
    ) {
        let push = RevocationPush {
            ns: *tag,
            list: B64.encode(list),
        };
        for &peer in members {
            if Some(peer) != except {
                self.swarm
                    .behaviour_mut()
                    .revocations
                    .send_request(&peer, push.clone());
            }
        }
    }

    /// `peer` was just proven a member of `tags`: it is given the lists held for them.
    pub(super) fn share_revocations(&mut self, peer: NetworkId, tags: &[NamespaceTag]) {
        for tag in tags {
            let Some(list) = self.proofs.trust(tag).and_then(|t| t.revocations()) else {
                continue;
            };
            let push = RevocationPush {
                ns: *tag,
                list: B64.encode(list),
            };
            self.swarm
                .behaviour_mut()
                .revocations
                .send_request(&peer, push);
        }
    }

    pub(super) fn handle_revocations(
        &mut self,
        now: Instant,
        wall: u64,
        event: request_response::Event<RevocationPush, RevocationAck>,
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
        let list = B64
            .decode(&request.list)
            .ok()
            .filter(|l| l.len() <= MAX_LIST_LEN);
        let taken = match list {
            Some(list) if self.proofs.is_member(&peer, &request.ns) => {
                let members = self.proofs.members(&request.ns);
                match self.proofs.update_revocations(&request.ns, &list, wall) {
                    Ok((version, ended)) => {
                        tracing::info!(%peer, version, revoked = ended.len(), "revocation list taken");
                        self.drop_revoked(now, &request.ns, &ended);
                        self.push_revocations(&request.ns, &list, &members, Some(peer));
                        self.events.push_back(OverlayEvent::Revocations {
                            ns: request.ns,
                            list,
                        });
                        true
                    }
                    Err(reason) => {
                        tracing::debug!(%peer, %reason, "revocation list not taken");
                        false
                    }
                }
            }
            _ => false,
        };
        let ack = if taken {
            RevocationAck::Taken
        } else {
            RevocationAck::Refused
        };
        let _ = self
            .swarm
            .behaviour_mut()
            .revocations
            .send_response(channel, ack);
    }
}
