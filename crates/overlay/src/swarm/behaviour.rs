//! The libp2p behaviours of one agent's swarm, and the swarm built from them.

use libp2p::request_response::{self, ProtocolSupport};
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::NetworkBehaviour;
use libp2p::{
    connection_limits, dcutr, identify, kad, mdns, noise, ping, relay, tcp, yamux, StreamProtocol,
    Swarm,
};

use super::addr::is_memory;
use super::authority::{AuthorityAck, AuthorityPush, AUTHORITY_PROTOCOL};
use super::guard::{self, PerIp};
use super::liveness::{Backoff, PING_INTERVAL, PING_TIMEOUT};
use super::routers::{RouterAck, RouterMessage, ROUTERS_PROTOCOL};
use super::{
    Multiaddr, OverlayError, OverlayOptions, DIAL_TIMEOUT, KAD_PROTOCOL, LOOKUP_TIMEOUT,
    RECORDS_PROTOCOL, REQUEST_TIMEOUT,
};
use crate::proof::{ProofRequest, ProofResponse, PROOF_PROTOCOL};
use crate::records::{RecordResponse, ScopedRequest};
use crate::Identity;

/// Everything one agent's swarm speaks (see the parent module's doc).
#[derive(NetworkBehaviour)]
pub(super) struct Behaviour {
    // First, so a connection over the limits is refused before any other behaviour
    // keeps state for it.
    pub(super) limits: connection_limits::Behaviour,
    pub(super) per_ip: PerIp,
    /// Peers whose last dial failed are not dialled again for a while.
    pub(super) backoff: Backoff,
    pub(super) kad: kad::Behaviour<kad::store::MemoryStore>,
    pub(super) identify: identify::Behaviour,
    pub(super) records: request_response::json::Behaviour<ScopedRequest, RecordResponse>,
    pub(super) proofs: request_response::json::Behaviour<ProofRequest, ProofResponse>,
    pub(super) routers: request_response::json::Behaviour<RouterMessage, RouterAck>,
    pub(super) authority: request_response::json::Behaviour<AuthorityPush, AuthorityAck>,
    pub(super) relay: relay::Behaviour,
    pub(super) relay_client: relay::client::Behaviour,
    pub(super) dcutr: dcutr::Behaviour,
    pub(super) mdns: Toggle<mdns::tokio::Behaviour>,
    /// Off in memory: those connections cannot go silent ([`super::liveness`]).
    pub(super) ping: Toggle<ping::Behaviour>,
}

/// The swarm of the agent with `identity`, on TCP, or in memory for a `/memory/...` `listen`
/// address; not listening yet.
pub(super) fn build(
    identity: &Identity,
    listen: &Multiaddr,
    options: OverlayOptions,
    admission: &guard::RelayAdmission,
) -> Result<Swarm<Behaviour>, OverlayError> {
    let keypair = libp2p::identity::Keypair::ed25519_from_bytes(identity.seed())
        .map_err(|e| OverlayError::Identity(e.to_string()))?;
    let pings = !is_memory(listen);
    let make = move |key: &libp2p::identity::Keypair, relay_client| {
        make_behaviour(key, relay_client, options, admission, pings)
    };
    let build = |e: &dyn std::fmt::Display| OverlayError::Build(e.to_string());
    let builder = libp2p::SwarmBuilder::with_existing_identity(keypair).with_tokio();
    let swarm_config =
        |c: libp2p::swarm::Config| c.with_idle_connection_timeout(options.idle_timeout);
    let swarm = if is_memory(listen) {
        // In-process simulations: no sockets, so hundreds of members fit in one process.
        builder
            .with_other_transport(|key| {
                use libp2p::core::Transport as _;
                Ok(libp2p::core::transport::MemoryTransport::default()
                    .upgrade(libp2p::core::upgrade::Version::V1)
                    .authenticate(noise::Config::new(key)?)
                    .multiplex(yamux::Config::default()))
            })
            .map_err(|e| build(&e))?
            .with_relay_client(noise::Config::new, yamux::Config::default)
            .map_err(|e| build(&e))?
            .with_behaviour(make)
            .map_err(|e| build(&e))?
            .with_swarm_config(swarm_config)
            .build()
    } else {
        // libp2p's TCP transport as `with_tcp` builds it, with a deadline on each
        // connection's setup: a dial to a member behind a partition (its SYNs dropped)
        // fails after DIAL_TIMEOUT instead of the kernel's two minutes of retries, so a
        // Kademlia lookup stops waiting for it and goes on with the members it can reach.
        builder
            .with_other_transport(|key| {
                use libp2p::core::Transport as _;
                Ok(
                    tcp::tokio::Transport::new(tcp::Config::default().nodelay(true))
                        .upgrade(libp2p::core::upgrade::Version::V1Lazy)
                        .authenticate(noise::Config::new(key)?)
                        .multiplex(yamux::Config::default())
                        .timeout(DIAL_TIMEOUT),
                )
            })
            .map_err(|e| build(&e))?
            .with_relay_client(noise::Config::new, yamux::Config::default)
            .map_err(|e| build(&e))?
            .with_behaviour(make)
            .map_err(|e| build(&e))?
            .with_swarm_config(swarm_config)
            .build()
    };
    Ok(swarm)
}

/// The behaviours of one agent's swarm.
fn make_behaviour(
    key: &libp2p::identity::Keypair,
    relay_client: relay::client::Behaviour,
    options: OverlayOptions,
    admission: &guard::RelayAdmission,
    pings: bool,
) -> Result<Behaviour, Box<dyn std::error::Error + Send + Sync>> {
    let mut cfg = kad::Config::new(StreamProtocol::new(KAD_PROTOCOL));
    cfg.set_query_timeout(LOOKUP_TIMEOUT);
    cfg.set_record_filtering(kad::StoreInserts::FilterBoth);
    let peer = key.public().to_peer_id();
    let mut kad = kad::Behaviour::with_config(peer, kad::store::MemoryStore::new(peer), cfg);
    // Every agent serves the DHT: there is no AutoNAT here to confirm that.
    kad.set_mode(Some(kad::Mode::Server));
    let identify = identify::Behaviour::new(
        identify::Config::new("/hyphae/1".into(), key.public())
            .with_push_listen_addr_updates(true)
            // Only the external addresses the glue confirmed (see `hygiene`): a listen
            // address on 0.0.0.0 expands to loopback and TAP addresses too.
            .with_hide_listen_addrs(true)
            // No cache of others' listen addresses for dials: the glue filters them into
            // Kademlia, which is where dials look.
            .with_cache_size(0),
    );
    let records = request_response::json::Behaviour::new(
        [(StreamProtocol::new(RECORDS_PROTOCOL), ProtocolSupport::Full)],
        request_response::Config::default().with_request_timeout(REQUEST_TIMEOUT),
    );
    let proofs = request_response::json::Behaviour::new(
        [(StreamProtocol::new(PROOF_PROTOCOL), ProtocolSupport::Full)],
        request_response::Config::default().with_request_timeout(REQUEST_TIMEOUT),
    );
    let routers = request_response::json::Behaviour::new(
        [(StreamProtocol::new(ROUTERS_PROTOCOL), ProtocolSupport::Full)],
        request_response::Config::default().with_request_timeout(REQUEST_TIMEOUT),
    );
    let authority = request_response::json::Behaviour::new(
        [(
            StreamProtocol::new(AUTHORITY_PROTOCOL),
            ProtocolSupport::Full,
        )],
        request_response::Config::default().with_request_timeout(REQUEST_TIMEOUT),
    );
    let relay = relay::Behaviour::new(peer, guard::relay_config(admission));
    let mdns = match options.mdns {
        true => Some(mdns::tokio::Behaviour::new(mdns::Config::default(), peer)?),
        false => None,
    };
    Ok(Behaviour {
        limits: guard::connection_limits(),
        per_ip: PerIp::default(),
        backoff: Backoff::default(),
        kad,
        identify,
        records,
        proofs,
        routers,
        authority,
        relay,
        relay_client,
        dcutr: dcutr::Behaviour::new(peer),
        mdns: mdns.into(),
        ping: pings
            .then(|| {
                ping::Behaviour::new(
                    ping::Config::new()
                        .with_interval(PING_INTERVAL)
                        .with_timeout(PING_TIMEOUT),
                )
            })
            .into(),
    })
}
