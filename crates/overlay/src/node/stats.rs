//! Counters: why datagrams were dropped (before and after they reached a tunnel), traffic
//! per tunnel, and traffic relayed for other members.

use crate::wire::ParseError;

/// Why the node dropped a datagram before it could be tied to a tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Too short, unknown kind, or a bare WireGuard initiation.
    Malformed,
    /// A namespace tag this node is not a member of (e.g. a wrong secret).
    UnknownNamespace,
    /// A hello whose MAC does not verify.
    BadMac,
    /// An identity key that is not a valid public key, or our own.
    BadIdentity,
    /// A handshake initiation from a key that never sent a valid hello.
    UnknownPeer,
    /// A WireGuard message for a tunnel or session this node does not have.
    UnknownSession,
    /// A handshake message that failed to verify.
    Handshake,
    /// No room for another tunnel.
    PeerLimit,
    /// A relayed datagram from an address that is not an end of its session.
    RelaySource,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 9] = [
        DropReason::Malformed,
        DropReason::UnknownNamespace,
        DropReason::BadMac,
        DropReason::BadIdentity,
        DropReason::UnknownPeer,
        DropReason::UnknownSession,
        DropReason::Handshake,
        DropReason::PeerLimit,
        DropReason::RelaySource,
    ];

    /// Stable snake_case name, used in status output.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::UnknownNamespace => "unknown_namespace",
            DropReason::BadMac => "bad_mac",
            DropReason::BadIdentity => "bad_identity",
            DropReason::UnknownPeer => "unknown_peer",
            DropReason::UnknownSession => "unknown_session",
            DropReason::Handshake => "handshake",
            DropReason::PeerLimit => "peer_limit",
            DropReason::RelaySource => "relay_source",
        }
    }
}

/// Every way a datagram can fail to parse is one counter: the status output tells an
/// operator that strangers send garbage, not which kind of garbage.
impl From<ParseError> for DropReason {
    fn from(_: ParseError) -> Self {
        DropReason::Malformed
    }
}

/// Why a datagram of an established tunnel was dropped; counted per peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerDropReason {
    /// Authentication tag did not verify.
    Decrypt,
    /// Replayed or too old counter.
    Replay,
    /// Source address the member does not own.
    SpoofedSource,
    /// Decrypted payload is not an IPv4 packet, or a malformed control packet.
    BadPayload,
    /// Too large to encrypt into one datagram.
    TooLarge,
}

impl PeerDropReason {
    /// Every reason, in counter order.
    pub const ALL: [PeerDropReason; 5] = [
        PeerDropReason::Decrypt,
        PeerDropReason::Replay,
        PeerDropReason::SpoofedSource,
        PeerDropReason::BadPayload,
        PeerDropReason::TooLarge,
    ];

    /// Stable snake_case name, used in status output.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerDropReason::Decrypt => "decrypt",
            PeerDropReason::Replay => "replay",
            PeerDropReason::SpoofedSource => "spoofed_source",
            PeerDropReason::BadPayload => "bad_payload",
            PeerDropReason::TooLarge => "too_large",
        }
    }
}

/// Traffic counters of one tunnel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Packets delivered from the member.
    pub rx_packets: u64,
    /// Bytes of packets delivered from the member.
    pub rx_bytes: u64,
    /// Of those, packets it forwarded to a LAN host that moved here from its LAN (during
    /// the grace period after the handoff).
    pub rx_forwarded: u64,
    /// Packets sent to the member.
    pub tx_packets: u64,
    /// Bytes of packets sent to the member.
    pub tx_bytes: u64,
    /// Times the member's direct endpoint moved (it roamed: an authenticated packet came
    /// from another underlay address).
    pub endpoint_changes: u64,
    drops: [u64; PeerDropReason::ALL.len()],
}

impl PeerStats {
    /// How many packets were dropped for `reason`.
    pub fn drops(&self, reason: PeerDropReason) -> u64 {
        self.drops[reason as usize]
    }

    /// Counts a packet dropped for `reason`.
    pub(super) fn count_drop(&mut self, reason: PeerDropReason) {
        self.drops[reason as usize] += 1;
    }
}

/// Traffic this node relayed for other members.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Sessions carried now.
    pub sessions: usize,
    /// Datagrams forwarded.
    pub packets: u64,
    /// Bytes forwarded.
    pub bytes: u64,
    /// Relay requests refused (session limits).
    pub refused: u64,
}

/// Datagrams dropped before they reached a tunnel, one counter per [`DropReason`].
#[derive(Debug, Clone, Default)]
pub(super) struct DropCounters([u64; DropReason::ALL.len()]);

impl DropCounters {
    pub(super) fn count(&mut self, reason: DropReason) {
        self.0[reason as usize] += 1;
    }

    pub(super) fn get(&self, reason: DropReason) -> u64 {
        self.0[reason as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_counters_line_up() {
        let mut names: Vec<_> = DropReason::ALL.iter().map(|r| r.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DropReason::ALL.len());
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?} out of counter order");
        }
        for (i, r) in PeerDropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?} out of counter order");
        }
        let mut c = DropCounters::default();
        c.count(DropReason::RelaySource);
        c.count(DropReason::RelaySource);
        assert_eq!(c.get(DropReason::RelaySource), 2);
        assert_eq!(c.get(DropReason::Malformed), 0);
    }
}
