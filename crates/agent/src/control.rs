//! The control socket: a Unix stream socket on which the running agent answers one JSON
//! request per connection with one JSON reply (see docs/CONTROL.md for the schema).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

mod layer2;
mod qos;
mod services;
mod text;

pub use layer2::Layer2Status;
pub use qos::{BucketStatus, CapDirection, CapStatus, RateStatus, ShareStatus};
pub use services::{DnsStatus, PolicyStatus};
pub use text::{peers_json, render, render_peers};

/// Version of the status schema; bumped only on incompatible changes.
pub const STATUS_VERSION: u32 = 1;

/// Longest request line the agent reads (a revocation list of 4096 entries, armored, fits).
pub const MAX_REQUEST: usize = 512 * 1024;

/// A request to the agent.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Request {
    /// The agent's state.
    Status,
    /// Bring up a namespace just added to the agent's config file.
    Join {
        /// Its name.
        namespace: String,
    },
    /// Leave a namespace: release its addresses, remove its device.
    Leave {
        /// Its name.
        namespace: String,
    },
    /// Name this member's own address in a namespace (`HOST.NAMESPACE`); `None` clears it.
    /// The reply waits (a few seconds at most) for the name's claim.
    SetName {
        /// The namespace.
        namespace: String,
        /// The host name (a DNS label).
        name: Option<String>,
    },
    /// Read every namespace's certificate file again and switch to a renewed one
    /// (what SIGHUP does).
    ReloadCertificates,
    /// Take a revocation list of a namespace's authority (armored, as `hyphae cert
    /// revoke` writes it) and pass it to every member.
    Revocations {
        /// The namespace.
        namespace: String,
        /// The list.
        list: String,
    },
    /// Take a policy signed by the namespace's authority (armored, as `hyphae policy sign`
    /// writes it), put it in force here and pass it to every member.
    PolicyPublish {
        /// The namespace.
        namespace: String,
        /// The signed policy.
        policy: String,
    },
    /// What the namespace's policy here says of `traffic` (`tcp/5432`, `udp/53`, `icmp`)
    /// from `from` to `to` (addresses, or members' certificate names), and why.
    PolicyCheck {
        /// The namespace.
        namespace: String,
        /// Who opens the flow.
        from: String,
        /// To whom.
        to: String,
        /// Protocol and destination port.
        traffic: String,
    },
}

/// The agent's reply to [`Request::Status`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Status {
    /// Schema version ([`STATUS_VERSION`]).
    pub version: u32,
    /// This agent's identity (base64 Ed25519 public key).
    pub identity: String,
    /// Underlay UDP address.
    pub listen: String,
    /// Datagrams dropped before reaching any tunnel, by reason.
    pub drops: BTreeMap<String, u64>,
    /// Which path tunnel datagrams take (the UDP socket or AF_XDP).
    #[serde(default)]
    pub underlay: UnderlayStatus,
    /// The data-path workers (`[agent] workers`), each with its own TAP queues and socket.
    #[serde(default)]
    pub workers: Vec<WorkerStatus>,
    /// The libp2p overlay.
    pub overlay: OverlayStatus,
    /// Traffic this agent relays for members that cannot reach each other directly.
    pub relay: RelayStatus,
    /// Times this agent's own underlay source address toward its members changed under
    /// open tunnels (each time the members were told at once).
    #[serde(default)]
    pub underlay_changes: u64,
    /// One entry per namespace.
    pub namespaces: Vec<NamespaceStatus>,
    /// Certificates refused (namespaces with an authority; docs/SECURITY.md).
    #[serde(default)]
    pub certificates: CertificateCounters,
}

/// Certificates of other members refused, by reason (`missing`, `malformed`,
/// `unknown_version`, `wrong_authority`, `bad_signature`, `other_namespace`,
/// `other_identity`, `not_yet_valid`, `expired`, `revoked`, `outdated`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CertificateCounters {
    /// Tunnels refused or closed for the certificate their member announced.
    pub tunnels_refused: BTreeMap<String, u64>,
    /// Control-plane memberships (replicas, records, relays) refused or ended for the
    /// certificate in the peer's membership proof.
    pub members_refused: BTreeMap<String, u64>,
    /// Announced addresses a member's certificate does not allow, left out.
    pub addresses_not_allowed: u64,
    /// As a replica: claims refused because the owner's certificate does not allow them
    /// (an address it does not pin, a name not its own).
    #[serde(default)]
    pub claims_not_allowed: u64,
    /// As a replica: leases taken from their holder for the member whose certificate
    /// pins the address or carries the name.
    #[serde(default)]
    pub claims_preempted: u64,
    /// As a replica: records and group entries of revoked or expired members dropped.
    #[serde(default)]
    pub records_dropped: u64,
}

/// This member's certificate in a namespace with an authority.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OwnCertificate {
    /// The namespace authority (base64 Ed25519 public key).
    pub authority: String,
    /// The name it gives this member.
    pub name: String,
    /// The groups it names.
    pub groups: Vec<String>,
    /// Addresses it allows (empty: any).
    pub addresses: Vec<String>,
    /// End of its validity, Unix seconds.
    pub not_after: u64,
    /// Seconds until it expires (negative: expired).
    pub expires_in_secs: i64,
    /// Version of the revocation list held (0: none).
    pub revocations_version: u64,
    /// Why the other members refuse it now (`expired`, `revoked`), if they do.
    #[serde(default)]
    pub problem: Option<String>,
}

/// The underlay in [`Status`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct UnderlayStatus {
    /// `socket` or `af_xdp`.
    pub path: String,
    /// The interface the XDP program is attached to.
    pub interface: Option<String>,
    /// `native` (in the driver) or `generic` XDP.
    pub xdp_mode: Option<String>,
    /// Whether the AF_XDP sockets are zero-copy (else copy mode).
    pub zero_copy: bool,
    /// AF_XDP sockets, one per receive queue.
    pub queues: usize,
    /// Frames received on the AF_XDP sockets.
    pub rx_frames: u64,
    /// Frames sent on the AF_XDP sockets.
    pub tx_frames: u64,
    /// Datagrams the socket sent instead (next hop not resolved yet, IPv6, too long).
    pub tx_via_socket: u64,
    /// Redirected frames that held no tunnel datagram.
    pub malformed: u64,
}

/// One data-path worker in [`Status`]: a flow stays on one worker, so these show how the
/// traffic spreads.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WorkerStatus {
    /// Reads from its TAP queues (a super-frame counts once).
    pub frames_in: u64,
    /// Writes to its TAP queues (a coalesced super-frame counts once).
    pub frames_out: u64,
    /// Datagrams its socket received.
    pub datagrams_in: u64,
    /// Batches it carried (times it held the data plane).
    pub batches: u64,
    /// Sends that failed on its socket.
    pub send_errors: u64,
    /// Packets it sealed on another worker's shard of their tunnel: flows the kernel
    /// handed to it that another worker owns (about 0 while the TAP queues are steered by
    /// flow; more when a peer's tunnel has fewer shards than we have workers, for the
    /// agent's own fragments, and for ICMP errors answering a flow).
    #[serde(default)]
    pub sealed_elsewhere: u64,
    /// How long it waited to take the data plane, per batch.
    #[serde(default)]
    pub lock_wait: LockWaitStatus,
    /// It runs as a realtime thread (`[agent] worker_priority = "realtime"`, granted).
    #[serde(default)]
    pub realtime: bool,
}

/// A histogram of waits for the data plane: `counts[k]` batches waited less than
/// `bounds_us[k]` microseconds (and at least the bound before); the last count is the rest.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LockWaitStatus {
    pub bounds_us: Vec<u64>,
    pub counts: Vec<u64>,
    /// All waits added up.
    pub sum_secs: f64,
}

impl LockWaitStatus {
    /// The bound below which at least `q` (0 to 1) of the waits fell: `None` with no waits
    /// or when they fell above the last bound.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        let total: u64 = self.counts.iter().sum();
        if total == 0 {
            return None;
        }
        let mut seen = 0;
        for (k, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen as f64 >= q * total as f64 {
                return self.bounds_us.get(k).copied();
            }
        }
        None
    }
}

/// The libp2p overlay in [`Status`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OverlayStatus {
    /// libp2p peer id (the same key as `identity`).
    pub peer_id: String,
    /// libp2p listen addresses.
    pub listen: Vec<String>,
    /// Whether the first bootstrap finished (or no contact answered and the agent started
    /// the overlay alone).
    pub joined: bool,
    /// Overlay peers connected.
    pub connected: usize,
    /// Records kept for the DHT as a replica (sealed: unreadable here).
    pub stored_records: usize,
    /// Record requests refused as malformed or unauthentic.
    pub rejected_requests: u64,
    /// Envelopes from replicas that failed verification.
    pub bad_envelopes: u64,
    /// Grants that arrived after a claim was lost, released at once.
    #[serde(default)]
    pub late_grants_released: u64,
    /// Group heartbeats and reads sent to the replicas a recent lookup found, without a
    /// lookup of their own.
    #[serde(default)]
    pub group_lookups_saved: u64,
    /// Address claims sent without a lookup to the replicas among the members this agent
    /// knows.
    #[serde(default)]
    pub claims_without_lookup: u64,
    /// Of those, claims made again after a lookup (a replica computed another set).
    #[serde(default)]
    pub claims_looked_up_again: u64,
    /// First claims made again after a lookup without the replicas' check, once replicas
    /// disputed the set the lookup found and the members they named were dialled.
    #[serde(default)]
    pub claims_unchecked_after_dispute: u64,
    /// First claims after a lookup lost because a replica named a member closer to the key
    /// than their set that this agent did not reach: made again later, never unchecked.
    #[serde(default)]
    pub claims_lost_to_closer_members: u64,
    /// Claims without a lookup this agent, as a replica, answered with another set.
    #[serde(default)]
    pub claims_disputed: u64,
    /// First claims given up without asking anyone: the lookup found fewer than five
    /// members while peers of unknown membership were near; claimed again later.
    #[serde(default)]
    pub claims_short_given_up: u64,
    /// Reads (the names of members beside their tunnels) sent to the replicas among the
    /// members this agent is connected to, with no lookup.
    #[serde(default)]
    pub reads_without_lookup: u64,
    /// Kademlia lookups this agent finished (its own, and each step of a bootstrap).
    #[serde(default)]
    pub kad_lookups: u64,
    /// Kademlia requests (`FIND_NODE`, `GET_VALUE`) this agent answered for others.
    #[serde(default)]
    pub kad_requests_answered: u64,
    /// Members holding a relay reservation for this agent (libp2p peer ids): others reach
    /// this agent's control plane through them when they cannot dial it.
    #[serde(default)]
    pub relays: Vec<String>,
    /// Peers connected only through a relay now.
    #[serde(default)]
    pub relayed_peers: Vec<String>,
    /// Connections opened through a relay since start.
    #[serde(default)]
    pub relayed_connections: u64,
    /// Connections closed because they stopped answering pings for 5 s (a partition, a
    /// host gone without closing them).
    #[serde(default)]
    pub silent_connections_closed: u64,
    /// Dials not made because the peer's last dial failed slowly (timed out) under 10 s
    /// before.
    #[serde(default)]
    pub dials_held_off: u64,
    /// Peers taken out of the routing table since start because all their connections
    /// fell silent (no longer handed out to others' lookups).
    #[serde(default)]
    pub unreachable_dropped: u64,
    /// Of those, the ones not connected again yet: dialled every 5 s (about every 15 s
    /// while their dials time out) for 10 minutes.
    #[serde(default)]
    pub unreachable_waiting: u64,
    /// Relayed connections upgraded to direct by hole punching (dcutr).
    #[serde(default)]
    pub hole_punches: u64,
    /// Failed hole punching attempts.
    #[serde(default)]
    pub hole_punch_failures: u64,
    /// Circuits this agent relayed for other members since start.
    #[serde(default)]
    pub circuits_relayed: u64,
    /// Members found by mDNS.
    #[serde(default)]
    pub mdns_discovered: u64,
    /// Membership proofs (docs/SECURITY.md): peers' proofs that showed one of our
    /// namespaces, that showed none (strangers, members of other namespaces only), and that
    /// were refused as malformed.
    #[serde(default)]
    pub proofs_accepted: u64,
    /// See `proofs_accepted`.
    #[serde(default)]
    pub proofs_unproven: u64,
    /// See `proofs_accepted`.
    #[serde(default)]
    pub proofs_refused: u64,
    /// Record requests refused because the asker had not proved it is a member of the
    /// request's namespace (or this agent is not one).
    #[serde(default)]
    pub requests_not_member: u64,
    /// Peers a lookup found that were left out of replica sets: they proved no membership.
    #[serde(default)]
    pub unproven_replicas_skipped: u64,
    /// What peers were refused, by reason: replica quotas and request rates, connections
    /// and relay slots over their limits, peer addresses kept out of the DHT.
    #[serde(default)]
    pub refused: BTreeMap<String, u64>,
}

/// Relaying in [`Status`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RelayStatus {
    /// Relay sessions carried now.
    pub sessions: usize,
    /// Datagrams forwarded.
    pub packets: u64,
    /// Bytes forwarded.
    pub bytes: u64,
    /// Relay requests refused (session limits).
    pub refused: u64,
}

/// One namespace in [`Status`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NamespaceStatus {
    /// Namespace name.
    pub name: String,
    /// Deployment mode.
    pub mode: String,
    /// With an authority: this member's certificate and the revocation list held.
    #[serde(default)]
    pub certificate: Option<OwnCertificate>,
    /// Router and hybrid modes: the LAN bridge.
    #[serde(default)]
    pub bridge: Option<String>,
    /// Router and hybrid modes: namespace addresses seen on the LAN (IPv4, then IPv6).
    #[serde(default)]
    pub lan_hosts: Vec<String>,
    /// Router mode: how LAN hosts reach each other, "veb" (through the bridge) or "vepa"
    /// (only through the agent); empty in the other modes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lan_port_mode: String,
    /// VEPA: frames between two LAN hosts reflected through the agent.
    #[serde(default)]
    pub hairpinned: u64,
    /// VEPA: copies of LAN hosts' broadcasts written for the other LAN hosts.
    #[serde(default)]
    pub lan_copies: u64,
    /// VEPA: bridge ports isolated after start (plugged in later).
    #[serde(default)]
    pub ports_isolated_late: u64,
    /// VEPA: each port of the LAN bridge (the TAP's excluded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lan_ports: Vec<LanPortStatus>,
    /// The underlay endpoints this member's address record carries, as last granted by
    /// the replicas: where members that look its address up find it.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// Every address this member holds a lease on (router mode: its LAN hosts').
    #[serde(default)]
    pub addresses: Vec<String>,
    /// Every IPv6 address this member holds a lease on: its own, then (router mode) its
    /// LAN hosts'.
    #[serde(default)]
    pub addresses6: Vec<String>,
    /// Router mode: LAN hosts whose address another member owns.
    #[serde(default)]
    pub hosted_conflicts: u64,
    /// Members in the namespace's broadcast group, as last read.
    #[serde(default)]
    pub group_members: usize,
    /// Broadcast and multicast packets sent to the members.
    #[serde(default)]
    pub broadcasts_out: u64,
    /// Broadcast and multicast packets from members written to the device.
    #[serde(default)]
    pub broadcasts_in: u64,
    /// ARP probes sent on the LAN (router and hybrid modes).
    #[serde(default)]
    pub arp_probes: u64,
    /// Router mode: RARP and gratuitous ARP announcements seen on the LAN (what a migrated
    /// VM sends on arrival).
    #[serde(default)]
    pub lan_announcements: u64,
    /// Router mode: LAN hosts that moved here from another router's LAN and whose address
    /// (with its DHCP lease and names) this member took over.
    #[serde(default)]
    pub handoffs_in: u64,
    /// Router mode: LAN hosts that moved to another router's LAN and were handed to it.
    #[serde(default)]
    pub handoffs_out: u64,
    /// Router mode: requests to hand over a host that still answered on this LAN (kept).
    #[serde(default)]
    pub handoffs_kept: u64,
    /// Router mode: the last handoff's duration either way, in milliseconds (target: from
    /// the host's first sighting; source: from the request to the transfer).
    #[serde(default)]
    pub last_handoff_ms: Option<u64>,
    /// DHCP requests the switch handed to the virtual DHCP server.
    #[serde(default)]
    pub dhcp_requests: u64,
    /// DHCP replies sent (OFFER, ACK, NAK).
    #[serde(default)]
    pub dhcp_replies: u64,
    /// DHCP NAKs sent.
    #[serde(default)]
    pub dhcp_naks: u64,
    /// DHCP requests that did not parse.
    #[serde(default)]
    pub dhcp_malformed: u64,
    /// DHCP requests that came through a relay agent (non-zero `giaddr`).
    #[serde(default)]
    pub dhcp_relayed: u64,
    /// Relayed DHCP requests dropped: the relay's link (`giaddr`, or the link-selection
    /// sub-option) is outside the namespace subnet.
    #[serde(default)]
    pub dhcp_relay_outside_subnet: u64,
    /// DHCP offers not taken up in time: their addresses were released.
    #[serde(default)]
    pub dhcp_offers_lapsed: u64,
    /// DHCPv6 (router mode): replies sent (ADVERTISE, REPLY; through relays RELAY-REPL),
    /// messages that did not parse, messages that came through relay agents, and relayed
    /// ones dropped because the client's link (the first relay's link-address) is outside
    /// the prefix.
    #[serde(default)]
    pub dhcp6_replies: u64,
    #[serde(default)]
    pub dhcp6_malformed: u64,
    #[serde(default)]
    pub dhcp6_relayed: u64,
    #[serde(default)]
    pub dhcp6_relay_outside_prefix: u64,
    /// This member's own name (`hostname`), held or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Why the own name is not held (another member holds it), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_error: Option<String>,
    /// Names this member holds in the namespace zone (its own and its DHCP clients'),
    /// with their addresses.
    #[serde(default)]
    pub names: BTreeMap<String, String>,
    /// The virtual DNS server.
    #[serde(default)]
    pub dns: DnsStatus,
    /// A layer-2 namespace's MAC table and frames (`layer = 2`); absent in an IP one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer2: Option<Layer2Status>,
    /// TAP device.
    pub device: String,
    /// This member's virtual address; empty while an `auto` address is being claimed.
    pub address: String,
    /// Whether the address is held in the DHT (lease won and renewed).
    pub address_claimed: bool,
    /// A dual-stack namespace's IPv6 prefix; empty when the namespace is IPv4 only.
    #[serde(default)]
    pub subnet6: String,
    /// This member's IPv6 address, held in the DHT; empty while it is claimed (or wants
    /// none).
    #[serde(default)]
    pub address6: String,
    /// Why no IPv6 address is held yet, while none is and one is wanted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address6_error: Option<String>,
    /// Why no address is held yet (no namespace record, no free address, claim
    /// unanswered, owned by another member), while none is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_error: Option<String>,
    /// Times this member gave up its own address because another member held it too
    /// (partitions that merged: an `auto` member renumbered, a static one reports the
    /// conflict in `address_error`).
    #[serde(default)]
    pub address_conflicts: u64,
    /// This member's subnet; empty until the namespace record is read.
    pub subnet: String,
    /// A multi-subnet namespace's other subnets, which this member routes to in one hop.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routed_subnets: Vec<String>,
    /// Packets routed to another subnet of the namespace (TTL lowered, sent to the holder).
    #[serde(default)]
    pub routed: u64,
    /// ICMP "time exceeded" sent back for packets routed with no TTL left.
    #[serde(default)]
    pub ttl_exceeded: u64,
    /// ICMP "host unreachable" sent back for packets to another subnet's address nobody
    /// holds.
    #[serde(default)]
    pub unreachable: u64,
    /// Why the namespace was left (a conflict with the namespace's records); only a
    /// namespace joined with `hyphae join` is left this way, and it is listed only then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Address lookups started (first packets to unknown addresses).
    pub lookups: u64,
    /// Frames dropped because their destination did not resolve in time.
    pub unresolved_drops: u64,
    /// Frames from the TAP sent to members.
    pub to_peers: u64,
    /// Packets from members written to the TAP.
    pub to_device: u64,
    /// Proxy ARP replies.
    pub arp_replies: u64,
    /// Proxy neighbour advertisements (IPv6).
    #[serde(default)]
    pub nd_replies: u64,
    /// ICMPv6 "packet too big" answers for IPv6 packets larger than the tunnel.
    #[serde(default)]
    pub packet_too_big: u64,
    /// Router mode: neighbour solicitations sent on the LAN.
    #[serde(default)]
    pub nd_probes: u64,
    /// Router mode: duplicate address probes for IPv6 addresses other members hold,
    /// defended.
    #[serde(default)]
    pub dad_defended: u64,
    /// Router mode: router advertisements of the prefix sent on the LAN.
    #[serde(default)]
    pub router_advertisements: u64,
    /// TCP SYNs whose MSS the switch lowered to fit the tunnel.
    #[serde(default)]
    pub mss_clamped: u64,
    /// Packets larger than the tunnel MTU sent to members in fragments.
    #[serde(default)]
    pub fragmented: u64,
    /// ICMP "fragmentation needed" sent for packets larger than the tunnel MTU with DF set.
    #[serde(default)]
    pub frag_needed: u64,
    /// Whether the TAP has segmentation and checksum offloads on (`[agent] offload`).
    #[serde(default)]
    pub offload: bool,
    /// Offloads: super-frames read from the TAP and the segments they were cut into,
    /// super-frames of coalesced member frames written, frames merged into them.
    #[serde(default)]
    pub super_frames: u64,
    #[serde(default)]
    pub segments: u64,
    #[serde(default)]
    pub coalesced_writes: u64,
    #[serde(default)]
    pub coalesced_frames: u64,
    /// Frames the switch dropped, by reason.
    pub drops: BTreeMap<String, u64>,
    /// The namespace's policy and what it did (docs/POLICY.md).
    #[serde(default)]
    pub policy: PolicyStatus,
    /// The cap on what this member sends to the namespace, if it has one (docs/QOS.md).
    #[serde(default)]
    pub egress: Option<RateStatus>,
    /// Its share of `[agent] uplink_rate`, if set (docs/QOS.md).
    #[serde(default)]
    pub share: Option<ShareStatus>,
    /// Its caps per member, group and host, in config order (docs/QOS.md).
    #[serde(default)]
    pub caps: Vec<CapStatus>,
    /// The members this agent has a tunnel with.
    pub peers: Vec<PeerStatus>,
}

/// VEPA: one port of a router's LAN bridge in [`NamespaceStatus`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct LanPortStatus {
    /// The port's interface name; empty for MACs the bridge no longer knows a port of.
    pub port: String,
    /// The MACs the bridge learned behind it.
    pub macs: Vec<String>,
    /// Frames from them reflected to another LAN host.
    pub hairpinned: u64,
    /// Frames from them dropped as spoofed (a MAC or address not theirs).
    pub spoofed: u64,
}

/// One member in [`NamespaceStatus`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PeerStatus {
    /// Member identity.
    pub identity: String,
    /// Current underlay endpoint (of the direct path).
    pub endpoint: String,
    /// `direct`, or `relayed` when the direct path does not answer.
    pub path: String,
    /// Identity of the member relaying the traffic (with `path` = `relayed`).
    pub relay: Option<String>,
    /// Addresses of that member, when this agent has a tunnel with it.
    pub relay_addresses: Vec<String>,
    /// Round trip of the current path in milliseconds, from the last answered probe.
    pub rtt_ms: Option<f64>,
    /// Virtual addresses it announced (IPv4, then IPv6).
    pub addresses: Vec<String>,
    /// A layer-2 namespace: the MACs it announced (its device's, or its LAN's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub macs: Vec<String>,
    /// The host name its first address carries in the namespace zone (`NAME.NAMESPACE`),
    /// as last read from the DHT (at most a minute ago); none if it has none or it is
    /// being read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Seconds since the last completed handshake; null before the first.
    pub handshake_age_secs: Option<f64>,
    /// WireGuard sessions the tunnel's flows are spread over (shards: as many as both
    /// agents have workers, at most 8; 1 with an agent that has none).
    #[serde(default = "one")]
    pub shards: usize,
    /// Packets received and delivered.
    pub rx_packets: u64,
    /// Bytes received and delivered.
    pub rx_bytes: u64,
    /// Of the packets received, those the member forwarded to a LAN host that moved here
    /// from its LAN (router mode, during the grace period after a handoff).
    #[serde(default)]
    pub rx_forwarded: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Times the member's endpoint moved (it roamed).
    #[serde(default)]
    pub endpoint_changes: u64,
    /// Packets of this tunnel dropped, by reason.
    pub drops: BTreeMap<String, u64>,
    /// The member's uplinks this tunnel is bonded over (docs/QOS.md); empty when it is not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<LinkStatus>,
}

/// One link of a bonded tunnel.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LinkStatus {
    /// The member's address on it.
    pub endpoint: String,
    /// The rate it announced for it, bits a second: flows are spread by it.
    pub rate: u64,
    /// Heard from within the last 700 ms (data or probe answers); a dead link takes no flow.
    pub alive: bool,
    /// Flows placed on it now.
    pub flows: usize,
    /// Packets and bytes sent on it.
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Times it was declared dead.
    pub deaths: u64,
}

/// Sends one request to the agent at `socket` and returns the raw JSON reply.
pub fn request(socket: &Path, req: &Request) -> Result<String> {
    let mut stream = UnixStream::connect(socket).with_context(|| {
        format!(
            "no agent answers on {} (is `hyphae up` running with this config?)",
            socket.display()
        )
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    stream.write_all(line.as_bytes())?;
    let mut reply = String::new();
    BufReader::new(stream)
        .read_line(&mut reply)
        .context("reading the agent's reply")?;
    if reply.is_empty() {
        anyhow::bail!("the agent closed the control connection without replying");
    }
    Ok(reply)
}

/// One shard: what a status from an agent before shards means.
fn one() -> usize {
    1
}
