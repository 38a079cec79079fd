//! The overlay: member identities, namespace keys, and the encrypted tunnels between
//! members (WireGuard's Noise_IKpsk2 through boringtun, one tunnel per member and namespace,
//! keyed by the namespace secret), and the libp2p control plane that finds members: a
//! Kademlia DHT whose replicas keep each namespace's sealed, signed records as leases won by
//! a majority ([`records`], [`lease`], [`quorum`], [`swarm`]).

#![forbid(unsafe_code)]

pub mod cert;
mod identity;
mod keys;
pub mod lease;
pub mod membership;
pub mod node;
pub mod proof;
pub mod quorum;
pub mod quota;
pub mod records;
pub mod swarm;
pub mod wire;

pub use identity::{Identity, PeerId};
pub use keys::{NamespaceKeys, MIN_SECRET_LEN, TAG_LEN};
pub use node::{
    flow_shard, DropReason, Event, NamespaceId, Node, Opened, PeerDropReason, PeerHandle, PeerInfo,
    PeerStats, Received, RelayStats, Sealer, Transmit, Tunnel, Tunnels, SHARD_BYTE, SHARD_SHIFT,
};

/// Underlay headers in front of a tunnel datagram, on an IPv6 underlay (the larger):
/// IPv6 (40) and UDP (8).
pub const UNDERLAY_HEADERS: usize = 40 + 8;

/// What a tunnel adds to a packet on the direct path: the underlay headers and
/// WireGuard's data framing.
pub const TUNNEL_OVERHEAD: usize = UNDERLAY_HEADERS + wire::WG_DATA_OVERHEAD;

/// What a tunnel adds on a relayed path: also the relay header.
pub const MAX_TUNNEL_OVERHEAD: usize = TUNNEL_OVERHEAD + wire::RELAY_HEADER_LEN;

/// The MTU underlays commonly have (Ethernet).
pub const UNDERLAY_MTU: usize = 1500;

/// The default MTU of a namespace device (1420): a full packet crosses a 1500-byte
/// underlay in one datagram on the direct path over IPv4 and IPv6, and relayed over IPv4.
/// Relayed over IPv6 it is `MAX_TUNNEL_OVERHEAD - TUNNEL_OVERHEAD` (8) bytes over and the
/// kernel fragments it: relaying is the exception, and a smaller MTU would cost every
/// direct packet.
pub const DEFAULT_MTU: u16 = (UNDERLAY_MTU - TUNNEL_OVERHEAD) as u16;

/// Errors of identity handling.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bytes that are not a valid identity key.
    #[error("not a valid identity key")]
    BadIdentity,
    /// The operating system's RNG failed.
    #[error("the operating system's random number generator failed")]
    Random,
}
