//! A layer-2 namespace's part of the status.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A layer-2 namespace in [`NamespaceStatus`] (docs/MODES.md, "Layer 2").
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Layer2Status {
    /// The VLAN this namespace is on its router's trunk (`vlan`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// MACs learned on this side (the device's, or the LAN's), announced to the members.
    pub macs: Vec<String>,
    /// How many of them.
    pub local_macs: usize,
    /// MACs the members announced.
    pub remote_macs: usize,
    /// Frames sent to the one member holding their destination.
    pub to_peer: u64,
    /// Broadcast and multicast frames flooded to the members.
    pub floods_out: u64,
    /// Frames flooded to the members because no member announced their destination.
    pub unknown_unicast: u64,
    /// Frames from members written to the TAP.
    pub to_tap: u64,
    /// Of those, flooded ones.
    pub floods_in: u64,
    /// MACs learned on this side.
    pub learned: u64,
    /// MACs that moved between a member and this side.
    pub moves: u64,
    /// Frames and announcements that showed a MAC on both sides.
    pub mac_conflicts: u64,
    /// MACs not learned: the table was full.
    pub table_full: u64,
    /// Frames too large for one tunnel packet, sent in pieces.
    pub fragmented: u64,
    /// Frames from members put back together from pieces.
    pub reassembled: u64,
    /// ARP requests from this side answered here (a member's host holds the target, as
    /// its own ARP said), not flooded.
    pub arp_suppressed: u64,
    /// ARP requests from this side flooded to the members (no binding known).
    pub arp_flooded: u64,
    /// IPv6 neighbour solicitations from this side answered here (a member's host holds
    /// the target, as its own advertisement said), not flooded.
    pub nd_suppressed: u64,
    /// Neighbour solicitations from this side flooded to the members (no binding known).
    pub nd_flooded: u64,
    /// Addresses two members' hosts spoke for at once (ARP or advertisements): answered
    /// here for neither from then on.
    pub neighbour_conflicts: u64,
    /// MACs on this side whose lease (in the DHT) this member holds, and those it does
    /// not hold (being claimed, or another member's: a host that moved here, or the same
    /// MAC on two sites); gauges.
    pub mac_leases_held: usize,
    pub mac_leases_unheld: usize,
    /// Times a MAC lease this member held went to another member (partitions merged).
    pub mac_leases_lost: u64,
    /// MACs members announced that the DHT says are theirs (gauge).
    pub member_macs_verified: usize,
    /// MACs members announced that are another member's lease (or nobody's) past the
    /// grace: their frames from them are dropped (gauge).
    pub member_macs_refused: usize,
    /// Such refusals so far.
    pub member_mac_refusals: u64,
    /// Frames dropped, by reason.
    pub drops: BTreeMap<String, u64>,
}
