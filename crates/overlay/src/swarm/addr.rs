//! Addresses and identities as libp2p spells them: which multiaddrs to trust or announce,
//! and how a member's Ed25519 key maps to its peer id.

use std::net::{IpAddr, SocketAddr};

use libp2p::multiaddr::Protocol;

use super::{Multiaddr, NetworkId};
use crate::records::OwnerKey;

/// `addr` without a trailing `/p2p/<id>`.
pub(super) fn without_p2p(mut addr: Multiaddr) -> Multiaddr {
    if matches!(addr.iter().last(), Some(Protocol::P2p(_))) {
        addr.pop();
    }
    addr
}

/// The IP address of `addr`, if it has one.
pub(super) fn ip_of(addr: &Multiaddr) -> Option<IpAddr> {
    addr.iter().find_map(|p| match p {
        Protocol::Ip4(ip) => Some(IpAddr::V4(ip)),
        Protocol::Ip6(ip) => Some(IpAddr::V6(ip)),
        _ => None,
    })
}

/// Whether `addr` is on a loopback IP.
pub(super) fn is_loopback(addr: &Multiaddr) -> bool {
    ip_of(addr).is_some_and(|ip| ip.is_loopback())
}

/// Whether `addr` is an in-process memory address.
pub(super) fn is_memory(addr: &Multiaddr) -> bool {
    matches!(addr.iter().next(), Some(Protocol::Memory(_)))
}

/// Whether `addr` is on the unspecified IP (`0.0.0.0`, `::`).
pub(super) fn is_unspecified(addr: &Multiaddr) -> bool {
    ip_of(addr).is_some_and(|ip| ip.is_unspecified())
}

/// Whether `addr` goes through a relay (`.../p2p-circuit/...`).
pub fn is_relayed(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| p == Protocol::P2pCircuit)
}

/// The TCP multiaddr of a socket address.
pub fn tcp_multiaddr(addr: SocketAddr) -> Multiaddr {
    Multiaddr::empty()
        .with(match addr.ip() {
            IpAddr::V4(ip) => Protocol::Ip4(ip),
            IpAddr::V6(ip) => Protocol::Ip6(ip),
        })
        .with(Protocol::Tcp(addr.port()))
}

/// The tunnel endpoint of an agent listening at a TCP multiaddr (`/ip4/A/tcp/P...`): hyphae
/// agents carry tunnels on the same port number over UDP. `None` for other addresses,
/// relayed ones included (their IP is the relay's).
pub fn tunnel_endpoint(addr: &Multiaddr) -> Option<SocketAddr> {
    if is_relayed(addr) {
        return None;
    }
    let mut it = addr.iter();
    let ip = match it.next()? {
        Protocol::Ip4(ip) => IpAddr::V4(ip),
        Protocol::Ip6(ip) => IpAddr::V6(ip),
        _ => return None,
    };
    match it.next()? {
        Protocol::Tcp(port) => Some(SocketAddr::new(ip, port)),
        _ => None,
    }
}

/// The Ed25519 key behind a libp2p peer id (hyphae agents use Ed25519 identities, whose
/// peer ids embed the key).
pub fn owner_key(id: &NetworkId) -> Option<OwnerKey> {
    let hash: &libp2p::multihash::Multihash<64> = id.as_ref();
    if hash.code() != 0 {
        return None;
    }
    let key = libp2p::identity::PublicKey::try_decode_protobuf(hash.digest()).ok()?;
    Some(key.try_into_ed25519().ok()?.to_bytes())
}

/// The libp2p peer id of an Ed25519 key.
pub fn network_id(owner: &OwnerKey) -> Option<NetworkId> {
    let key = libp2p::identity::ed25519::PublicKey::try_from_bytes(owner).ok()?;
    Some(libp2p::identity::PublicKey::from(key).to_peer_id())
}
