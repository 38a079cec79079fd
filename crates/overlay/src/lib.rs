//! The overlay: member identities, namespace keys, and the encrypted tunnels between
//! members (WireGuard's Noise_IKpsk2 through boringtun, one tunnel per member and namespace,
//! keyed by the namespace secret). The libp2p control plane (DHT, allocation, relaying)
//! joins this crate next; the tunnel layer is what it will drive.

mod identity;
mod keys;
pub mod lease;
pub mod node;
pub mod wire;

pub use identity::{Identity, PeerId};
pub use keys::{NamespaceKeys, MIN_SECRET_LEN, TAG_LEN};
pub use node::{
    DropReason, Event, NamespaceId, Node, PeerDropReason, PeerHandle, PeerInfo, PeerStats,
    Received, Transmit,
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
