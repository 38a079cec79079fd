//! Bounds on what peers can make the swarm hold: connections (libp2p's
//! `connection-limits` behaviour for totals, pending and per peer; [`PerIp`] for connections
//! from one address) and circuit relay reservations and circuits ([`relay_config`]), for
//! proven members only ([`RelayAdmission`]).
//!
//! Each connection is a file descriptor; at the common limit of 1024 an agent that accepts
//! every connection stops accepting anything else (its control socket included). The
//! figures leave room under that limit for the TAP devices, the tunnel socket, the control
//! socket and DNS.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use libp2p::core::transport::PortUse;
use libp2p::core::Endpoint;
use libp2p::swarm::{
    dummy, ConnectionClosed, ConnectionDenied, ConnectionId, FromSwarm, ListenFailure,
    NetworkBehaviour, THandler, THandlerInEvent, THandlerOutEvent, ToSwarm,
};
use libp2p::{connection_limits, relay};

use super::addr::{ip_of, is_relayed};
use super::{Multiaddr, NetworkId, Overlay};

/// Most established connections, over all peers.
pub const MAX_CONNECTIONS: u32 = 512;

/// Most inbound connections still in their handshake (noise, yamux) at once.
pub const MAX_PENDING_INCOMING: u32 = 64;

/// Most outbound dials in progress at once (Kademlia lookups dial three peers per query
/// step; a router claiming a whole LAN runs many queries).
pub const MAX_PENDING_OUTGOING: u32 = 128;

/// Most connections to one peer: a direct one, a relayed one, and the simultaneous dials
/// of a hole punch, with room to spare.
pub const MAX_CONNECTIONS_PER_PEER: u32 = 8;

/// Most inbound connections (pending or established) from one IPv4 address or IPv6 /64:
/// a site of agents behind one NAT fits; one host opening connection after connection
/// under fresh peer ids does not.
pub const MAX_CONNECTIONS_PER_IP: u32 = 32;

/// Most relay reservations this agent holds for others (each member keeps
/// [`super::RELAY_RESERVATIONS`], at the members it dialled first).
pub const MAX_RELAY_RESERVATIONS: usize = 512;

/// Most relay reservations one peer holds here.
pub const MAX_RELAY_RESERVATIONS_PER_PEER: usize = 2;

/// Most circuits this agent relays at once, and per peer.
pub const MAX_RELAY_CIRCUITS: usize = 64;

/// Most circuits one peer has relayed here at once.
pub const MAX_RELAY_CIRCUITS_PER_PEER: usize = 8;

/// libp2p's connection limits with the figures above.
pub(super) fn connection_limits() -> connection_limits::Behaviour {
    connection_limits::Behaviour::new(
        connection_limits::ConnectionLimits::default()
            .with_max_established(Some(MAX_CONNECTIONS))
            .with_max_pending_incoming(Some(MAX_PENDING_INCOMING))
            .with_max_pending_outgoing(Some(MAX_PENDING_OUTGOING))
            .with_max_established_per_peer(Some(MAX_CONNECTIONS_PER_PEER)),
    )
}

/// The peers that may hold a relay reservation here or open a circuit through this agent:
/// those that proved, on their connection, that they are members of one of our namespaces
/// ([`crate::proof`]). The swarm admits a peer when its proof arrives and forgets it when
/// its last connection closes; the relay server's limiters read it for each reservation
/// and circuit. A stranger, or a member whose proof is still in flight, is refused (its
/// client asks again after a short backoff, see [`super::relays`]).
#[derive(Debug, Clone, Default)]
pub(super) struct RelayAdmission(Arc<RwLock<HashSet<NetworkId>>>);

impl RelayAdmission {
    /// `peer` proved membership: it may be relayed.
    pub(super) fn admit(&self, peer: NetworkId) {
        if let Ok(mut set) = self.0.write() {
            set.insert(peer);
        }
    }

    /// `peer` has no connection left: its proof is gone with it.
    pub(super) fn forget(&self, peer: &NetworkId) {
        if let Ok(mut set) = self.0.write() {
            set.remove(peer);
        }
    }

    /// Whether `peer` may hold a reservation or open a circuit.
    pub(super) fn allows(&self, peer: &NetworkId) -> bool {
        self.0.read().is_ok_and(|set| set.contains(peer))
    }
}

/// The relay server's configuration: every figure bounded, libp2p's default rate limits
/// per peer and per IP, and `admission` asked for each reservation and circuit.
pub(super) fn relay_config(admission: &RelayAdmission) -> relay::Config {
    let mut config = relay::Config {
        max_reservations: MAX_RELAY_RESERVATIONS,
        max_reservations_per_peer: MAX_RELAY_RESERVATIONS_PER_PEER,
        max_circuits: MAX_RELAY_CIRCUITS,
        max_circuits_per_peer: MAX_RELAY_CIRCUITS_PER_PEER,
        // Defaults kept: reservations last an hour, circuits two minutes and 128 KiB (the
        // control plane's requests; dcutr moves lasting traffic to a direct connection).
        ..Default::default()
    };
    let reservations = admission.clone();
    config
        .reservation_rate_limiters
        .push(Box::new(move |peer, _: &Multiaddr, _| {
            reservations.allows(&peer)
        }));
    let circuits = admission.clone();
    config
        .circuit_src_rate_limiters
        .push(Box::new(move |peer, _: &Multiaddr, _| {
            circuits.allows(&peer)
        }));
    config
}

impl Overlay {
    /// Every refusal counted, by reason: the replica store's quotas and rates
    /// ([`crate::quota::Refusal`]), connections over the limits, relay reservations and
    /// circuits refused, peer addresses filtered out of the DHT.
    pub fn refusals(&self) -> Vec<(&'static str, u64)> {
        let s = &self.stats;
        let mut all: Vec<(&'static str, u64)> = self
            .store
            .stats()
            .refusals
            .iter()
            .map(|(reason, n)| (reason.as_str(), n))
            .collect();
        all.extend([
            ("connections", s.connections_refused),
            ("connections_per_ip", s.connections_refused_per_ip),
            ("dials", s.dials_refused),
            ("relay_reservations", s.relay_reservations_refused),
            ("relay_circuits", s.relay_circuits_refused),
            ("addresses_filtered", s.addresses_filtered),
        ]);
        all
    }

    /// Counts an inbound connection a limit refused.
    pub(super) fn handle_refused_connection(&mut self, from: &Multiaddr, cause: &ConnectionDenied) {
        if cause.downcast_ref::<PerIpExceeded>().is_some() {
            self.stats.connections_refused_per_ip += 1;
        } else if cause
            .downcast_ref::<connection_limits::Exceeded>()
            .is_some()
        {
            self.stats.connections_refused += 1;
        }
        tracing::debug!(%from, %cause, "connection refused");
    }
}

/// Refused: too many connections from one IP address.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("at most {limit} connections from {ip} are allowed")]
pub(super) struct PerIpExceeded {
    /// The address (an IPv6 address stands for its /64).
    pub(super) ip: IpAddr,
    /// The limit.
    pub(super) limit: u32,
}

/// The connections per source address: what [`PerIp`] decides by, without libp2p.
#[derive(Debug)]
pub(super) struct IpCounts {
    limit: u32,
    by_connection: HashMap<ConnectionId, IpAddr>,
    per_ip: HashMap<IpAddr, u32>,
}

impl IpCounts {
    pub(super) fn new(limit: u32) -> Self {
        Self {
            limit,
            by_connection: HashMap::new(),
            per_ip: HashMap::new(),
        }
    }

    /// A new inbound connection `id` from `remote`: counted, or refused if its address has
    /// [`MAX_CONNECTIONS_PER_IP`] already. Loopback (this host's own processes, which can
    /// exhaust it in other ways anyway; single-host test overlays) and relayed connections
    /// (bounded by the relay's circuits) are not counted.
    pub(super) fn handle_inbound(
        &mut self,
        id: ConnectionId,
        remote: &Multiaddr,
    ) -> Result<(), PerIpExceeded> {
        let Some(ip) = ip_of(remote).filter(|ip| !ip.is_loopback() && !is_relayed(remote)) else {
            return Ok(());
        };
        let ip = source(ip);
        let n = self.per_ip.entry(ip).or_default();
        if *n >= self.limit {
            return Err(PerIpExceeded {
                ip,
                limit: self.limit,
            });
        }
        *n += 1;
        self.by_connection.insert(id, ip);
        Ok(())
    }

    /// Connection `id` closed or failed.
    pub(super) fn handle_closed(&mut self, id: ConnectionId) {
        let Some(ip) = self.by_connection.remove(&id) else {
            return;
        };
        if let Some(n) = self.per_ip.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_ip.remove(&ip);
            }
        }
    }

    /// Connections counted from `ip`.
    #[cfg(test)]
    fn from(&self, ip: IpAddr) -> u32 {
        self.per_ip.get(&source(ip)).copied().unwrap_or(0)
    }
}

/// The source a connection is counted under: an IPv4 address, or an IPv6 /64 (one host
/// commonly has a whole /64).
fn source(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
    }
}

/// A behaviour that refuses inbound connections from an address that has
/// [`MAX_CONNECTIONS_PER_IP`] open or pending; denials surface as
/// `ListenError::Denied` carrying [`PerIpExceeded`].
pub(super) struct PerIp {
    counts: IpCounts,
}

impl Default for PerIp {
    fn default() -> Self {
        Self {
            counts: IpCounts::new(MAX_CONNECTIONS_PER_IP),
        }
    }
}

impl NetworkBehaviour for PerIp {
    type ConnectionHandler = dummy::ConnectionHandler;
    type ToSwarm = Infallible;

    fn handle_pending_inbound_connection(
        &mut self,
        connection_id: ConnectionId,
        _local_addr: &Multiaddr,
        remote_addr: &Multiaddr,
    ) -> Result<(), ConnectionDenied> {
        self.counts
            .handle_inbound(connection_id, remote_addr)
            .map_err(ConnectionDenied::new)
    }

    fn handle_established_inbound_connection(
        &mut self,
        _connection_id: ConnectionId,
        _peer: NetworkId,
        _local_addr: &Multiaddr,
        _remote_addr: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(dummy::ConnectionHandler)
    }

    fn handle_established_outbound_connection(
        &mut self,
        _connection_id: ConnectionId,
        _peer: NetworkId,
        _addr: &Multiaddr,
        _role_override: Endpoint,
        _port_use: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(dummy::ConnectionHandler)
    }

    fn on_swarm_event(&mut self, event: FromSwarm) {
        match event {
            FromSwarm::ConnectionClosed(ConnectionClosed { connection_id, .. })
            | FromSwarm::ListenFailure(ListenFailure { connection_id, .. }) => {
                self.counts.handle_closed(connection_id)
            }
            _ => {}
        }
    }

    fn on_connection_handler_event(
        &mut self,
        _peer_id: NetworkId,
        _connection_id: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        match event {}
    }

    fn poll(&mut self, _: &mut Context<'_>) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Multiaddr {
        s.parse().unwrap()
    }

    #[test]
    fn one_address_gets_a_bounded_share_of_inbound_connections() {
        let mut counts = IpCounts::new(3);
        let from = a("/ip4/192.0.2.9/tcp/40000");
        let id = ConnectionId::new_unchecked;
        for i in 0..3 {
            assert!(counts.handle_inbound(id(i), &from).is_ok());
        }
        let refused = counts.handle_inbound(id(3), &from).unwrap_err();
        assert_eq!(refused.limit, 3);
        assert_eq!(refused.ip, "192.0.2.9".parse::<IpAddr>().unwrap());
        // Another address is not affected; a closed (or failed) connection frees a slot.
        assert!(counts
            .handle_inbound(id(4), &a("/ip4/192.0.2.10/tcp/1"))
            .is_ok());
        counts.handle_closed(id(0));
        counts.handle_closed(id(0));
        assert_eq!(counts.from("192.0.2.9".parse().unwrap()), 2);
        assert!(counts.handle_inbound(id(5), &from).is_ok());
        assert!(counts.handle_inbound(id(6), &from).is_err());
    }

    #[test]
    fn ipv6_counts_per_64_and_loopback_and_relayed_are_not_counted() {
        let mut counts = IpCounts::new(2);
        let id = ConnectionId::new_unchecked;
        assert!(counts
            .handle_inbound(id(0), &a("/ip6/2001:db8::1/tcp/1"))
            .is_ok());
        assert!(counts
            .handle_inbound(id(1), &a("/ip6/2001:db8::2/tcp/1"))
            .is_ok());
        assert!(counts
            .handle_inbound(id(2), &a("/ip6/2001:db8::ffff:3/tcp/1"))
            .is_err());
        assert!(counts
            .handle_inbound(id(3), &a("/ip6/2001:db8:0:1::1/tcp/1"))
            .is_ok());
        for i in 10..20 {
            assert!(counts
                .handle_inbound(id(i), &a("/ip4/127.0.0.1/tcp/1"))
                .is_ok());
            let relayed = "/ip4/192.0.2.1/tcp/7400/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN/p2p-circuit";
            assert!(counts.handle_inbound(id(i + 100), &a(relayed)).is_ok());
        }
        assert_eq!(counts.from("127.0.0.1".parse().unwrap()), 0);
    }

    #[test]
    fn relay_server_is_bounded() {
        let c = relay_config(&RelayAdmission::default());
        assert_eq!(c.max_reservations, MAX_RELAY_RESERVATIONS);
        assert_eq!(c.max_reservations_per_peer, MAX_RELAY_RESERVATIONS_PER_PEER);
        assert_eq!(c.max_circuits, MAX_RELAY_CIRCUITS);
        assert_eq!(c.max_circuits_per_peer, MAX_RELAY_CIRCUITS_PER_PEER);
        assert!(c.max_circuit_bytes > 0 && c.max_circuit_bytes <= 1 << 20);
        // libp2p's per-peer and per-IP rate limits, and the membership gate.
        assert_eq!(c.reservation_rate_limiters.len(), 3);
        assert_eq!(c.circuit_src_rate_limiters.len(), 3);
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // the limiters take an instant; none is compared
    fn only_proven_members_are_relayed() {
        let admission = RelayAdmission::default();
        let mut c = relay_config(&admission);
        let peer = || {
            libp2p::identity::Keypair::generate_ed25519()
                .public()
                .to_peer_id()
        };
        let (member, stranger) = (peer(), peer());
        let addr = a("/ip4/192.0.2.1/tcp/7400");
        let now = std::time::Instant::now();
        let reserve = |c: &mut relay::Config, peer| {
            c.reservation_rate_limiters
                .iter_mut()
                .all(|l| l.try_next(peer, &addr, now))
        };
        // A member whose proof is still in flight is refused like a stranger.
        assert!(!reserve(&mut c, member));
        admission.admit(member);
        assert!(reserve(&mut c, member));
        assert!(!reserve(&mut c, stranger));
        assert!(c
            .circuit_src_rate_limiters
            .iter_mut()
            .all(|l| l.try_next(member, &addr, now)));
        assert!(!c
            .circuit_src_rate_limiters
            .iter_mut()
            .all(|l| l.try_next(stranger, &addr, now)));
        // Gone with its connection.
        admission.forget(&member);
        assert!(!reserve(&mut c, member));
    }
}
