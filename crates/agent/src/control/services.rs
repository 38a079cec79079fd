//! The namespace's policy and virtual DNS server in its status (docs/CONTROL.md).

use serde::{Deserialize, Serialize};

/// A namespace's policy in [`NamespaceStatus`](super::NamespaceStatus).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct PolicyStatus {
    /// Where the policy comes from: its file, or "the authority's policy" (signed,
    /// published to the namespace); none: no policy, every member reaches every port.
    pub file: Option<String>,
    /// Its version.
    pub version: u64,
    /// Whether it is the authority's, signed (a namespace with an authority).
    pub signed: bool,
    /// Signed policies the overlay took (newer, the authority's) that this agent could not
    /// compile: the one before stays in force.
    pub refused: u64,
    /// The namespaces its links name (consent to traffic through a gateway).
    pub links: Vec<String>,
    /// As a gateway: packets from this namespace forwarded to a linked one, and packets
    /// for this namespace dropped for no member holding their destination.
    pub crossed: u64,
    pub crossing_dropped: u64,
    /// `allow` or `deny`: what happens to traffic no rule allows.
    pub default: String,
    /// Flows each rule opened, in the file's order.
    pub rule_hits: Vec<u64>,
    /// Flows the default opened (`default = "allow"`).
    pub default_hits: u64,
    /// Packets denied as sender (never sent) and as receiver (from a member).
    pub denied_out: u64,
    pub denied_in: u64,
    /// ICMP errors dropped for no flow in the table.
    pub stray_icmp_errors: u64,
    /// Flows in the connection table, and its size.
    pub flows: usize,
    pub flows_max: usize,
    /// Flows evicted from a full table (least recently used first), timed out, and ended
    /// by a new policy.
    pub flows_evicted: u64,
    pub flows_expired: u64,
    pub flows_revoked: u64,
}

/// The virtual DNS server in [`NamespaceStatus`](super::NamespaceStatus).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct DnsStatus {
    /// Where it answers (the service address); empty until the subnet is known.
    pub address: String,
    /// Where names outside the zone are forwarded; none: they are REFUSED.
    pub resolvers: Vec<String>,
    /// Queries over UDP.
    pub udp_queries: u64,
    /// Queries over TCP.
    pub tcp_queries: u64,
    /// TCP connections accepted.
    pub tcp_connections: u64,
    /// Answered from the zone (with or without records).
    pub answered: u64,
    /// NXDOMAIN answers.
    pub nxdomain: u64,
    /// Queries sent to the resolvers.
    pub forwarded: u64,
    /// Truncated UDP answers from the resolvers, asked again over TCP.
    pub forwarded_truncated: u64,
    /// Messages back from the resolvers not taken (another resolver or port, id, question).
    pub resolver_rejected: u64,
    /// REFUSED answers (outside the zone, no resolvers).
    pub refused: u64,
    /// SERVFAIL answers (a lookup or the resolvers timed out, too many waiting).
    pub servfail: u64,
    /// FORMERR and NOTIMP answers.
    pub errors: u64,
    /// Queries dropped unread.
    pub dropped: u64,
    /// UDP queries over their source's rate (`dns_rate`) that waited their turn (at most
    /// half a second) and were answered then.
    #[serde(default)]
    pub rate_limited_delayed: u64,
    /// UDP queries over their source's rate and that wait: truncated plus dropped.
    pub rate_limited: u64,
    /// Of those, answered empty and truncated (TC), so the client retries over TCP.
    pub rate_limited_truncated: u64,
    /// Of those, dropped.
    pub rate_limited_dropped: u64,
    /// DHT reads started for queries.
    pub lookups: u64,
    /// Queries and service packets that came before the namespace's subnet was known.
    pub not_ready: u64,
    /// Name claims lost to another member.
    pub name_conflicts: u64,
}
