//! The rate caps and uplink shares in a namespace's status (docs/QOS.md).

use serde::{Deserialize, Serialize};

/// A rate cap in [`NamespaceStatus`](super::NamespaceStatus) (docs/QOS.md).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct RateStatus {
    /// The cap, bits a second; the burst, bytes; the most queueing it adds.
    pub rate: u64,
    pub burst: u64,
    pub max_delay_ms: u64,
    /// Bytes sent under it (at once or after waiting), packets that waited, packets and
    /// bytes dropped because they would have waited longer than `max_delay_ms`.
    pub sent_bytes: u64,
    pub delayed: u64,
    pub dropped: u64,
    pub dropped_bytes: u64,
    /// Packets waiting now.
    pub queued: usize,
}

/// A cap per member, group or host in [`NamespaceStatus`](super::NamespaceStatus) (docs/QOS.md).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct CapStatus {
    /// Its place among the namespace's `[[namespace.cap]]`, from 1.
    pub cap: usize,
    /// What it picks, as written (`members group:guests, hosts 10.0.0.7`).
    pub picks: String,
    /// Whose bucket a packet takes: `member`, `host` or `all`.
    pub per: String,
    /// What this side sends under it, and what it takes.
    pub egress: Option<CapDirection>,
    pub ingress: Option<CapDirection>,
    /// The weight of each member (host, or all, by `per`) it picks inside the namespace's
    /// share of the uplink.
    pub weight: Option<u64>,
}

/// One direction of a [`CapStatus`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct CapDirection {
    /// The rate of each bucket, bits a second; its burst, bytes.
    pub rate: u64,
    pub burst: u64,
    /// Over every bucket the cap had (forgotten idle ones included): bytes sent (at once
    /// or after waiting), packets that waited, packets and bytes dropped (they would have
    /// waited longer than 20 ms).
    pub sent_bytes: u64,
    pub delayed: u64,
    pub dropped: u64,
    pub dropped_bytes: u64,
    /// Packets waiting now.
    pub queued: usize,
    /// The buckets in use now: one per member or host that sent within its burst time.
    pub buckets: Vec<BucketStatus>,
}

/// One member's or host's bucket under a cap.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct BucketStatus {
    /// The member's identity, the host's address, or `all`.
    pub who: String,
    pub sent_bytes: u64,
    pub delayed: u64,
    pub dropped: u64,
    pub queued: usize,
}

/// A namespace's share of the uplink in [`NamespaceStatus`](super::NamespaceStatus) (docs/QOS.md).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ShareStatus {
    /// Its weight, and the uplink's rate in bits a second.
    pub weight: u64,
    pub uplink_rate: u64,
    /// Bytes it sent through the uplink; packets dropped (its queue held 20 ms of the
    /// uplink); packets waiting for its turn now.
    pub sent_bytes: u64,
    pub dropped: u64,
    pub queued: usize,
}
