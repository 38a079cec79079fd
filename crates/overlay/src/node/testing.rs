//! What the node's unit tests share: a member, and moving datagrams between two nodes.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Instant;

use super::Node;
use crate::{Identity, NamespaceKeys};

/// The secret of the tests' namespace "lab".
pub(super) const SECRET: &[u8] = b"correct horse battery staple";

/// A member of "lab" at 10.201.0.`seed` (namespace 0), its identity from `seed`.
pub(super) fn member(seed: u8) -> Node {
    let mut node = Node::new(Identity::from_seed([seed; 32]), [seed; 32]);
    node.add_namespace(
        NamespaceKeys::derive("lab", SECRET),
        vec![Ipv4Addr::new(10, 201, 0, seed)],
    );
    node
}

/// Moves datagrams between `a` (at `a_at`) and `b` (at `b_at`) until both are quiet, at
/// most 50 rounds.
pub(super) fn pump(a: &mut Node, a_at: SocketAddr, b: &mut Node, b_at: SocketAddr, now: Instant) {
    let mut out = vec![0u8; 65536];
    for _ in 0..50 {
        let mut moved = false;
        while let Some((_, d)) = a.poll_transmit() {
            moved = true;
            b.handle_datagram(now, a_at, &d, &mut out);
        }
        while let Some((_, d)) = b.poll_transmit() {
            moved = true;
            a.handle_datagram(now, b_at, &d, &mut out);
        }
        if !moved {
            return;
        }
    }
}
