//! `/topology.json`: what the live topology page shows, taken from the agent's status.
//! The page (topology.html) polls it every second.

use serde::Serialize;

use crate::control::{
    CapStatus, LanPortStatus, Layer2Status, NamespaceStatus, PeerStatus, RateStatus, ShareStatus,
    Status,
};

/// Every namespace with this member and the members it has a tunnel with.
#[derive(Debug, Serialize)]
pub(crate) struct Topology {
    /// This agent's identity.
    identity: String,
    namespaces: Vec<Namespace>,
}

#[derive(Debug, Serialize)]
struct Namespace {
    name: String,
    mode: String,
    subnet: String,
    /// A dual-stack namespace's IPv6 prefix (empty: IPv4 only).
    #[serde(skip_serializing_if = "String::is_empty")]
    subnet6: String,
    /// This member: its address (empty while claiming), its IPv6 address, and name.
    address: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    address6: String,
    hostname: Option<String>,
    /// Members with a live tunnel: a session younger than [`SESSION_LIFETIME_SECS`] and
    /// at least one address (a layer-2 namespace: MAC) announced.
    members: Vec<Member>,
    /// The other tunnels: a member just found (no handshake yet), one that left (it
    /// announced no address), or one silent since its session expired.
    connecting: usize,
    /// Its egress cap and its share of the uplink, where configured (docs/QOS.md): the
    /// page shows the rate each carries from the bytes sent between two polls.
    egress: Option<RateStatus>,
    share: Option<ShareStatus>,
    /// Its caps per member, group and host.
    caps: Vec<CapStatus>,
    /// A multi-subnet namespace: the other subnets routed in one hop, packets routed, and
    /// those that ran out of TTL here.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    routed_subnets: Vec<String>,
    routed: u64,
    ttl_exceeded: u64,
    /// A router: "veb" or "vepa"; with VEPA, frames hairpinned and each bridge port.
    #[serde(skip_serializing_if = "String::is_empty")]
    lan_port_mode: String,
    hairpinned: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    lan_ports: Vec<LanPortStatus>,
    /// A layer-2 namespace: its MAC table (the MACs on this side, how many members
    /// announced, moves, floods, suppressed ARP, drops).
    #[serde(skip_serializing_if = "Option::is_none")]
    layer2: Option<Layer2Status>,
}

#[derive(Debug, Serialize)]
struct Member {
    identity: String,
    addresses: Vec<String>,
    /// A layer-2 namespace: the MACs it announced.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    macs: Vec<String>,
    /// Its host name in the namespace zone, if it has one.
    name: Option<String>,
    /// `direct` or `relayed`.
    path: String,
    /// With `relayed`: the relaying member's address, or its identity if unknown.
    via: Option<String>,
    endpoint: String,
    rtt_ms: Option<f64>,
    rx_bytes: u64,
    tx_bytes: u64,
    handshake_age_secs: Option<f64>,
    /// The member's links the tunnel is bonded over (docs/QOS.md, "Bonding").
    #[serde(skip_serializing_if = "Vec::is_empty")]
    links: Vec<crate::control::LinkStatus>,
}

impl From<&Status> for Topology {
    fn from(status: &Status) -> Self {
        Self {
            identity: status.identity.clone(),
            namespaces: status.namespaces.iter().map(Namespace::from).collect(),
        }
    }
}

impl From<&NamespaceStatus> for Namespace {
    fn from(ns: &NamespaceStatus) -> Self {
        Self {
            name: ns.name.clone(),
            mode: ns.mode.clone(),
            subnet: ns.subnet.clone(),
            subnet6: ns.subnet6.clone(),
            address: ns.address.clone(),
            address6: ns.address6.clone(),
            hostname: ns.hostname.clone().filter(|_| ns.name_error.is_none()),
            members: ns
                .peers
                .iter()
                .filter(|p| is_live(p))
                .map(Member::from)
                .collect(),
            connecting: ns.peers.iter().filter(|p| !is_live(p)).count(),
            egress: ns.egress.clone(),
            share: ns.share.clone(),
            caps: ns.caps.clone(),
            routed_subnets: ns.routed_subnets.clone(),
            routed: ns.routed,
            ttl_exceeded: ns.ttl_exceeded,
            lan_port_mode: ns.lan_port_mode.clone(),
            hairpinned: ns.hairpinned,
            lan_ports: ns.lan_ports.clone(),
            layer2: ns.layer2.clone(),
        }
    }
}

/// WireGuard's Reject-After-Time (boringtun `REJECT_AFTER_TIME`): a session this old carries
/// nothing, and a live member (keepalives every 25 s) has rekeyed well before.
const SESSION_LIFETIME_SECS: f64 = 180.0;

/// Whether a tunnel stands for a member that is there now (see [`Namespace::members`]):
/// in a layer-2 namespace, one that announced a MAC.
fn is_live(p: &PeerStatus) -> bool {
    p.handshake_age_secs
        .is_some_and(|age| age < SESSION_LIFETIME_SECS)
        && !(p.addresses.is_empty() && p.macs.is_empty())
}

impl From<&PeerStatus> for Member {
    fn from(p: &PeerStatus) -> Self {
        let via = p.relay.as_ref().filter(|_| p.path == "relayed").map(|id| {
            p.relay_addresses
                .first()
                .cloned()
                .unwrap_or_else(|| id.clone())
        });
        Self {
            identity: p.identity.clone(),
            addresses: p.addresses.clone(),
            macs: p.macs.clone(),
            name: p.name.clone(),
            path: p.path.clone(),
            via,
            endpoint: p.endpoint.clone(),
            rtt_ms: p.rtt_ms,
            rx_bytes: p.rx_bytes,
            tx_bytes: p.tx_bytes,
            handshake_age_secs: p.handshake_age_secs,
            links: p.links.clone(),
        }
    }
}

impl Topology {
    /// The JSON the page reads.
    pub(crate) fn to_json(&self) -> String {
        // Plain strings, numbers and options: serializing cannot fail.
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}
