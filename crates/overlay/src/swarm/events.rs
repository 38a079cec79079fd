//! What the swarm reports: listen addresses, connections, dials, identify, mDNS, relays,
//! hole punches, records, router messages and proofs (`handle_swarm_event`), and the Kademlia
//! queries' progress (`handle_kad`).

use std::time::Instant;

use libp2p::core::ConnectedPoint;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::{DialError, ListenError, SwarmEvent};
use libp2p::{dcutr, identify, kad, mdns, ping, relay};

use super::addr::{is_loopback, is_relayed, is_unspecified, without_p2p};
use super::behaviour::BehaviourEvent;
use super::liveness::HeldOff;
use super::members::{fresh_nonce, Awaiting};
use super::{NetworkId, Overlay, OverlayEvent, PROOF_WAIT};

impl Overlay {
    pub(super) fn handle_swarm_event(
        &mut self,
        now: Instant,
        wall: u64,
        event: SwarmEvent<BehaviourEvent>,
    ) {
        match event {
            SwarmEvent::NewListenAddr { address, .. } => {
                tracing::debug!(%address, "overlay listening");
                if is_relayed(&address) {
                    // Our address through a relay: announced (identify tells only external
                    // addresses) so members that cannot dial us reach us through it. One
                    // circuit only: a relay hands its clients its own external addresses,
                    // relayed ones included, and a circuit through a circuit goes nowhere.
                    let circuits = address
                        .iter()
                        .filter(|p| *p == Protocol::P2pCircuit)
                        .count();
                    if circuits == 1 && self.hygiene.allows(&address, self.listens_on_loopback) {
                        self.swarm.add_external_address(address);
                    }
                    return;
                }
                if !is_unspecified(&address)
                    && self.hygiene.allows(&address, self.listens_on_loopback)
                {
                    // Agents listen where members can reach them (they announce the same
                    // addresses as tunnel endpoints): confirmed, so identify announces it
                    // and the relay server gives it to the members it serves. Loopback
                    // only when the agent listens on loopback alone; never a TAP address.
                    self.swarm.add_external_address(address.clone());
                }
                if !self.listen_addrs.contains(&address) {
                    self.listen_addrs.push(address.clone());
                    self.events
                        .push_back(OverlayEvent::Listening { addr: address });
                }
            }
            SwarmEvent::ExpiredListenAddr { address, .. } => {
                tracing::debug!(%address, "overlay no longer listening");
                self.swarm.remove_external_address(&address);
                if self.listen_addrs.contains(&address) {
                    self.listen_addrs.retain(|a| a != &address);
                    self.events
                        .push_back(OverlayEvent::NotListening { addr: address });
                }
            }
            SwarmEvent::ListenerClosed {
                listener_id,
                reason,
                addresses,
            } => {
                for address in &addresses {
                    self.swarm.remove_external_address(address);
                }
                if let Some(relay) = self.relays.handle_listener_closed(now, listener_id) {
                    tracing::debug!(%relay, ?reason, "relay reservation ended");
                }
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                endpoint,
                connection_id,
                ..
            } => {
                self.connected.insert(peer_id);
                self.unreachable.handle_connected(&peer_id);
                self.connections
                    .insert(connection_id, (peer_id, endpoint.is_relayed()));
                self.liveness.handle_established(connection_id, now);
                self.swarm
                    .behaviour_mut()
                    .backoff
                    .handle_connected(&peer_id, connection_id);
                let nonce = fresh_nonce(&mut self.rng);
                if let Some(challenge) = self.proofs.handle_connected(peer_id, nonce) {
                    self.send_proof_request(peer_id, challenge);
                }
                if is_loopback(endpoint.get_remote_address()) {
                    self.over_loopback.insert(peer_id);
                }
                if endpoint.is_relayed() {
                    self.stats.relayed_connections += 1;
                    tracing::debug!(peer = %peer_id, "relayed connection");
                } else if let ConnectedPoint::Dialer { address, .. } = endpoint {
                    let address = without_p2p(address);
                    // Kademlia keeps the address it dialled by itself: an address another
                    // peer handed out that leads into a namespace is dropped again.
                    if self.hygiene.allows(&address, true) {
                        self.relays.handle_dialled(now, peer_id, address.clone());
                        self.swarm
                            .behaviour_mut()
                            .kad
                            .add_address(&peer_id, address);
                    } else {
                        self.stats.addresses_filtered += 1;
                        self.swarm
                            .behaviour_mut()
                            .kad
                            .remove_address(&peer_id, &address);
                    }
                }
                if !self.joined && !self.bootstrapping {
                    self.bootstrapping = self.swarm.behaviour_mut().kad.bootstrap().is_ok();
                }
            }
            SwarmEvent::IncomingConnectionError {
                error: ListenError::Denied { cause },
                send_back_addr,
                ..
            } => self.handle_refused_connection(&send_back_addr, &cause),
            // Dials the backoff refuses are counted there (most are Kademlia's, which the
            // swarm does not report here).
            SwarmEvent::OutgoingConnectionError {
                error: DialError::Denied { cause },
                ..
            } if cause.downcast_ref::<HeldOff>().is_none() => {
                self.stats.dials_refused += 1;
                tracing::debug!(%cause, "dial refused");
            }
            SwarmEvent::Dialing {
                peer_id: Some(_),
                connection_id,
            } => self
                .swarm
                .behaviour_mut()
                .backoff
                .handle_dialing(connection_id, now),
            SwarmEvent::OutgoingConnectionError {
                peer_id: Some(peer),
                connection_id,
                error: DialError::Transport(errors),
            } => {
                // No address of it answered: if that took long (timed out), it is not
                // dialled again for a while, so lookups that meet it do not wait again.
                // Not when a connection with it is open anyway (a hole punch or another
                // address failed), nor when only relayed addresses were tried (a relay at
                // capacity says nothing of the peer).
                let reachable = self.swarm.is_connected(&peer);
                let relayed_only = errors.iter().all(|(addr, _)| is_relayed(addr));
                self.swarm.behaviour_mut().backoff.handle_failed(
                    peer,
                    connection_id,
                    now,
                    !reachable && !relayed_only,
                );
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                connection_id,
                num_established,
                ..
            } => {
                self.connections.remove(&connection_id);
                self.closing_silent.remove(&connection_id);
                self.liveness.handle_closed(connection_id);
                if num_established == 0 {
                    self.connected.remove(&peer_id);
                    self.over_loopback.remove(&peer_id);
                    self.relays.handle_disconnected(&peer_id);
                    self.relay_admission.forget(&peer_id);
                    self.proofs.handle_disconnected(&peer_id);
                    self.deferred.remove(&peer_id);
                    self.check_awaiting(now, wall);
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::RelayClient(event)) => match event {
                relay::client::Event::ReservationReqAccepted {
                    relay_peer_id,
                    renewal,
                    ..
                } => {
                    if !renewal {
                        tracing::info!(relay = %relay_peer_id, "relay reservation accepted");
                    }
                    self.relays.handle_accepted(relay_peer_id);
                }
                other => tracing::debug!(?other, "relay client"),
            },
            SwarmEvent::Behaviour(BehaviourEvent::Relay(relay::Event::CircuitReqAccepted {
                src_peer_id,
                dst_peer_id,
            })) => {
                self.stats.circuits_relayed += 1;
                tracing::debug!(src = %src_peer_id, dst = %dst_peer_id, "relaying a circuit");
            }
            SwarmEvent::Behaviour(BehaviourEvent::Relay(relay::Event::ReservationReqDenied {
                src_peer_id,
                ..
            })) => {
                self.stats.relay_reservations_refused += 1;
                tracing::debug!(peer = %src_peer_id, "relay reservation refused");
            }
            SwarmEvent::Behaviour(BehaviourEvent::Relay(relay::Event::CircuitReqDenied {
                src_peer_id,
                ..
            })) => {
                self.stats.relay_circuits_refused += 1;
                tracing::debug!(peer = %src_peer_id, "relay circuit refused");
            }
            SwarmEvent::Behaviour(BehaviourEvent::Dcutr(dcutr::Event {
                remote_peer_id,
                result,
            })) => match result {
                Ok(_) => {
                    self.stats.hole_punches += 1;
                    tracing::info!(peer = %remote_peer_id, "hole punched: direct connection");
                }
                Err(e) => {
                    self.stats.hole_punch_failures += 1;
                    tracing::debug!(peer = %remote_peer_id, error = %e, "hole punching failed");
                }
            },
            SwarmEvent::Behaviour(BehaviourEvent::Mdns(mdns::Event::Discovered(found))) => {
                for (peer, addr) in found {
                    if peer == self.local || is_relayed(&addr) {
                        continue;
                    }
                    if !self.hygiene.allows(&addr, false) {
                        self.stats.addresses_filtered += 1;
                        continue;
                    }
                    self.swarm
                        .behaviour_mut()
                        .kad
                        .add_address(&peer, addr.clone());
                    if !self.connected.contains(&peer) {
                        self.stats.mdns_discovered += 1;
                        tracing::info!(%peer, %addr, "member found by mDNS");
                        self.dial(addr.with(Protocol::P2p(peer)));
                    }
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received {
                peer_id,
                info,
                ..
            })) => {
                let via_loopback = self.over_loopback.contains(&peer_id);
                for addr in info.listen_addrs {
                    // Another host's loopback address is ours, not its; a namespace
                    // address is nobody's underlay.
                    if !self.hygiene.allows(&addr, via_loopback) {
                        self.stats.addresses_filtered += 1;
                        continue;
                    }
                    self.swarm.behaviour_mut().kad.add_address(&peer_id, addr);
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Ping(ping::Event {
                connection, result, ..
            })) => match result {
                Ok(_) => self.liveness.handle_pong(connection, now),
                Err(ping::Failure::Unsupported) => self.liveness.handle_unsupported(connection),
                // A lost ping closes nothing by itself: silence for `SILENT_AFTER` does.
                Err(_) => {}
            },
            SwarmEvent::Behaviour(BehaviourEvent::Kad(event)) => self.handle_kad(now, wall, event),
            SwarmEvent::Behaviour(BehaviourEvent::Records(event)) => {
                self.handle_records(now, wall, event)
            }
            SwarmEvent::Behaviour(BehaviourEvent::Routers(event)) => {
                self.handle_routers(now, event)
            }
            SwarmEvent::Behaviour(BehaviourEvent::Proofs(event)) => {
                self.handle_proofs(now, wall, event)
            }
            SwarmEvent::Behaviour(BehaviourEvent::Authority(event)) => {
                self.handle_authority(now, wall, event)
            }
            _ => {}
        }
    }

    fn handle_kad(&mut self, now: Instant, wall: u64, event: kad::Event) {
        match event {
            kad::Event::OutboundQueryProgressed {
                id,
                result,
                step,
                stats,
            } => match result {
                kad::QueryResult::GetClosestPeers(result) => {
                    if !step.last {
                        return;
                    }
                    self.stats.kad_lookups += 1;
                    let peers = match result {
                        Ok(ok) => ok.peers,
                        Err(kad::GetClosestPeersError::Timeout { peers, .. }) => peers,
                    };
                    if let Some(op) = self.lookups.remove(&id) {
                        let found: Vec<NetworkId> = peers.into_iter().map(|p| p.peer_id).collect();
                        tracing::debug!(?op, found = found.len(), "lookup finished");
                        let Some(&ns) = self.op_ns.get(&op) else {
                            return;
                        };
                        let deadline = now + PROOF_WAIT;
                        let queried = stats.num_successes();
                        if let Some(key) = self.group_lookups.remove(&op) {
                            self.group_replicas
                                .insert(key, (found.clone(), queried, now));
                        }
                        let mut found = found;
                        found.extend(self.meet.remove(&op).unwrap_or_default());
                        let waiting = Awaiting {
                            ns,
                            found,
                            queried,
                            deadline,
                            known: false,
                        };
                        self.awaiting.insert(op, waiting);
                        self.check_awaiting(now, wall);
                    }
                }
                // Joined once the lookup of our own id (the bootstrap's first step) ends:
                // the routing table then holds our neighbourhood. The later steps refresh
                // farther buckets; each waits out unreachable peers (10 s in libp2p-kad),
                // so waiting for the last one kept a newcomer of a cut-off group from
                // claiming anything for most of a minute.
                kad::QueryResult::Bootstrap(_) => {
                    self.stats.kad_lookups += 1;
                    if !self.joined {
                        self.joined = true;
                        self.bootstrapping = false;
                        tracing::info!(
                            peers = self.connected.len(),
                            step = step.count,
                            "joined the overlay (own id looked up)"
                        );
                        self.events.push_back(OverlayEvent::Joined);
                    }
                }
                _ => {}
            },
            kad::Event::InboundRequest {
                request: kad::InboundRequest::PutRecord { .. },
            } => self.stats.refused_puts += 1,
            kad::Event::InboundRequest {
                request:
                    kad::InboundRequest::FindNode { .. } | kad::InboundRequest::GetRecord { .. },
            } => self.stats.kad_requests_answered += 1,
            kad::Event::RoutingUpdated {
                is_new_peer: true, ..
            } => self.events.push_back(OverlayEvent::NewPeer),
            _ => {}
        }
    }
}
