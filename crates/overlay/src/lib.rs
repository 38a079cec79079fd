//! The overlay: member identities, namespace keys, and the encrypted tunnels between
//! members (WireGuard's Noise_IKpsk2 through boringtun, one tunnel per member and namespace,
//! keyed by the namespace secret), and the libp2p control plane that finds members: a
//! Kademlia DHT whose replicas keep each namespace's sealed, signed records as leases won by
//! a majority ([`records`], [`lease`], [`quorum`], [`swarm`]).

mod identity;
mod keys;
pub mod lease;
pub mod node;
pub mod quorum;
pub mod records;
pub mod swarm;
pub mod wire;

pub use identity::{Identity, PeerId};
pub use keys::{NamespaceKeys, MIN_SECRET_LEN, TAG_LEN};
pub use node::{
    DropReason, Event, NamespaceId, Node, PeerDropReason, PeerHandle, PeerInfo, PeerStats,
    Received, RelayStats, Transmit,
};

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
