//! What a [`Node`](super::Node) hands back: what became of a datagram ([`Received`]), what
//! the driver must act on ([`Event`]), where an encrypted packet lies ([`Transmit`]), and a
//! view of one tunnel for status ([`PeerInfo`]).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::Range;
use std::time::Duration;

use super::{BondLink, DropReason, NamespaceId, PeerDropReason, PeerHandle, PeerStats};
use crate::PeerId;

/// What became of a datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// An IPv4 packet of `len` bytes from `peer` lies at the start of the output buffer; its
    /// source address is one the member owns.
    Deliver {
        /// The namespace it belongs to.
        ns: NamespaceId,
        /// The member it came from.
        peer: PeerHandle,
        /// Its length.
        len: usize,
    },
    /// Handled inside the node (handshake, hello, keepalive, control).
    Consumed,
    /// Dropped before it reached a tunnel.
    Dropped(DropReason),
    /// Dropped by a tunnel.
    PeerDropped(PeerHandle, PeerDropReason),
}

/// Something the driver must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `peer` now owns exactly `addresses` in `ns`.
    PeerAddresses {
        /// The namespace.
        ns: NamespaceId,
        /// The member.
        peer: PeerHandle,
        /// Its addresses.
        addresses: Vec<Ipv4Addr>,
    },
    /// `peer` announced that it holds exactly `macs` in `ns`, a layer-2 namespace (sorted;
    /// reported at every announcement, changed or not).
    PeerMacs {
        /// The namespace.
        ns: NamespaceId,
        /// The member.
        peer: PeerHandle,
        /// Its MACs.
        macs: Vec<[u8; 6]>,
    },
    /// We kept sending to `peer` and heard nothing back for [`UNREACHABLE_AFTER`](super::UNREACHABLE_AFTER): it is
    /// gone (crashed, or moved), and its tunnel has been removed. Its addresses should be
    /// resolved again.
    PeerUnreachable {
        /// The namespace.
        ns: NamespaceId,
        /// The member (its handle is free for reuse after this event).
        peer: PeerHandle,
        /// Its identity.
        id: PeerId,
        /// The addresses it had announced.
        addresses: Vec<Ipv4Addr>,
        /// The IPv6 addresses it had announced.
        addresses6: Vec<Ipv6Addr>,
    },
    /// `peer` now holds exactly `addresses` (IPv6, sorted) in the dual-stack `ns`.
    PeerAddresses6 {
        /// The namespace.
        ns: NamespaceId,
        /// The member.
        peer: PeerHandle,
        /// Its IPv6 addresses.
        addresses: Vec<Ipv6Addr>,
    },
}

/// A datagram encrypted in place by [`Node::send`](super::Node::send).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Where to send it.
    pub to: SocketAddr,
    /// Where it lies in the output buffer.
    pub range: Range<usize>,
}

/// A read-only view of one tunnel, for status.
#[derive(Debug)]
pub struct PeerInfo<'a> {
    /// The member relaying this tunnel's traffic, when the direct path does not work.
    pub relayed_via: Option<PeerId>,
    /// Round trip of the current path, from the last answered probe.
    pub rtt: Option<Duration>,
    /// The handle.
    pub handle: PeerHandle,
    /// The namespace.
    pub ns: NamespaceId,
    /// The member's identity.
    pub id: PeerId,
    /// Its current underlay endpoint.
    pub endpoint: SocketAddr,
    /// The addresses it announced.
    pub addresses: &'a [Ipv4Addr],
    /// The IPv6 addresses it announced.
    pub addresses6: &'a [Ipv6Addr],
    /// Time since the last completed handshake (of shard 0).
    pub handshake_age: Option<Duration>,
    /// WireGuard sessions sets the tunnel's traffic is spread over (see `shared.rs`).
    pub shards: usize,
    /// Counters.
    pub stats: &'a PeerStats,
    /// The member's links this tunnel is bonded over (none: not bonded).
    pub links: Vec<BondLink>,
}
