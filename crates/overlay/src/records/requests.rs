//! What members ask a replica and what it answers: the record protocol's messages
//! (`/hyphae/records/1`, JSON over libp2p request-response).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Envelope, OwnerKey};
use crate::lease;
use crate::quota::Refusal;

/// A request to a replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecordRequest {
    /// Grant (or renew) the lease on `key` to the envelope's owner and keep the envelope.
    Claim {
        /// The key (32 bytes).
        key: Vec<u8>,
        /// The value, signed by its owner.
        envelope: Envelope,
    },
    /// Give up `key` (only its owner, over its own connection, can).
    Release {
        /// The key (32 bytes).
        key: Vec<u8>,
    },
    /// Read `key`.
    Get {
        /// The key (32 bytes).
        key: Vec<u8>,
    },
    /// Add (or renew) the envelope's owner in the group at `key`: a set of members, one
    /// entry per owner, each kept until its envelope expires.
    Join {
        /// The group key (32 bytes).
        key: Vec<u8>,
        /// The member's entry, signed by it.
        envelope: Envelope,
    },
    /// Read every entry of the group at `key`.
    Members {
        /// The group key (32 bytes).
        key: Vec<u8>,
    },
    /// Move the requester's lease on `key` to the envelope's owner, keeping the envelope
    /// (migration handoff: only the holder, over its own connection, can; see
    /// [`super::transfer`]).
    Transfer {
        /// The key (32 bytes).
        key: Vec<u8>,
        /// The new holder's record, signed by it.
        envelope: Envelope,
    },
    /// A [`RecordRequest::Claim`] sent without a lookup to the replica set the claimer
    /// computed from the members it knows: the replica answers it as a claim only if it
    /// computes the same set from the members it knows, and otherwise answers
    /// [`RecordResponse::Replicas`] (docs/DECISIONS.md, "Claims without a lookup").
    ClaimAmong {
        /// The key (32 bytes).
        key: Vec<u8>,
        /// The value, signed by its owner.
        envelope: Envelope,
        /// The replica set as the claimer sees it: peer ids, at most
        /// [`crate::quorum::REPLICAS`].
        replicas: Vec<Vec<u8>>,
    },
}

/// A request to a replica for one namespace's records. A replica answers it only if it is
/// a member of that namespace itself and the asker proved it is one too ([`crate::proof`]);
/// otherwise it answers [`RecordResponse::NotMember`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopedRequest {
    /// The namespace's tag ([`crate::NamespaceKeys::tag`]).
    pub ns: crate::proof::NamespaceTag,
    /// The request.
    pub request: RecordRequest,
}

/// A replica's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecordResponse {
    /// The lease is the claimer's.
    Granted,
    /// Someone else holds the key.
    Held {
        /// The holder's key (32 bytes).
        owner: Vec<u8>,
        /// Time left on its lease, milliseconds.
        remaining_ms: u64,
    },
    /// Released (or was not held by the releaser).
    Released,
    /// The replica holds too many records to take a new key (what replicas before
    /// [`RecordResponse::Refused`] answered).
    Full,
    /// The replica would accept the request but a quota or rate limit stops it.
    Refused {
        /// Which limit.
        reason: Refusal,
    },
    /// The current value of a key, if held.
    Value {
        /// The holder's envelope.
        envelope: Option<Envelope>,
    },
    /// The request was refused as malformed or unauthentic.
    Rejected,
    /// Added to the group.
    Joined,
    /// A group's entries (at most [`super::MAX_GROUP_MEMBERS`]).
    Members {
        /// One envelope per member.
        envelopes: Vec<Envelope>,
    },
    /// Not answered: the replica is not a member of the request's namespace, or the asker
    /// has not proved it is. Counts as no answer.
    NotMember,
    /// A [`RecordRequest::ClaimAmong`] not answered: the replica set this replica computes
    /// differs from the claimer's. Its own set, as peer ids.
    Replicas {
        /// The replica set as this replica sees it.
        peers: Vec<Vec<u8>>,
        /// Those of `peers` outside the claimer's set that this replica knows are members
        /// of the namespace serving the DHT (itself, or proven and in its routing table):
        /// a member closer to the key than the claimer's set, which a claim must not go
        /// around. Absent from agents before it (read as none).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        members: Vec<Vec<u8>>,
    },
}

impl RecordResponse {
    /// The lease protocol's view of a claim answer (`Rejected` counts as a refusal that
    /// names no holder).
    pub fn to_lease(&self) -> Option<lease::Response<OwnerKey>> {
        Some(match self {
            Self::Granted => lease::Response::Granted,
            Self::Held {
                owner,
                remaining_ms,
            } => lease::Response::Held {
                owner: owner.as_slice().try_into().ok()?,
                remaining: Duration::from_millis(*remaining_ms),
            },
            Self::Released => lease::Response::Released,
            Self::Full
            | Self::NotMember
            | Self::Refused { .. }
            | Self::Rejected
            | Self::Value { .. }
            | Self::Joined
            | Self::Members { .. }
            | Self::Replicas { .. } => lease::Response::Full,
        })
    }
}
