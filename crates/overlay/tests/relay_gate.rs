//! The circuit relay serves proven members only, over real libp2p on loopback TCP. A member
//! that dials a relay member gets a reservation there (its first request may race its own
//! membership proof; it asks again), while a stranger (rust-libp2p's relay client, no
//! secret) is refused a reservation and refused a circuit to that member, and both
//! refusals are counted.
#![allow(clippy::print_stdout)] // prints what was refused (run with --nocapture)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use hyphae_overlay::swarm::{NetworkId, Overlay, OverlayEvent, OverlayOptions};
use hyphae_overlay::{Identity, NamespaceKeys};
use libp2p::multiaddr::Protocol;
use libp2p::swarm::SwarmEvent;
use libp2p::{noise, relay, tcp, yamux, Multiaddr, Swarm};
use tokio::sync::{mpsc, oneshot};

/// What a member's task reports when asked.
#[derive(Debug, Clone)]
struct Report {
    refused: HashMap<&'static str, u64>,
    relays: Vec<NetworkId>,
}

/// One overlay in its own task: its address, peer id, and a way to ask for a report.
struct Member {
    addr: Multiaddr,
    id: NetworkId,
    ask: mpsc::Sender<oneshot::Sender<Report>>,
}

impl Member {
    async fn report(&self) -> Report {
        let (tx, rx) = oneshot::channel();
        self.ask.send(tx).await.unwrap();
        rx.await.unwrap()
    }
}

async fn spawn(seed: u8, bootstrap: Option<&Multiaddr>) -> Member {
    let keys = NamespaceKeys::derive("gate", b"the namespace's own secret");
    let mut overlay = Overlay::new(
        &Identity::from_seed([seed; 32]),
        "/ip4/127.0.0.1/tcp/0".parse().unwrap(),
        bootstrap.into_iter().cloned().collect(),
        OverlayOptions::default(),
        [seed; 32],
    )
    .unwrap();
    overlay.add_namespace(&keys, None);
    let id = overlay.local_id();
    let (ask_tx, mut ask_rx) = mpsc::channel::<oneshot::Sender<Report>>(4);
    let (addr_tx, addr_rx) = oneshot::channel();
    tokio::spawn(async move {
        let mut addr_tx = Some(addr_tx);
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                ask = ask_rx.recv() => match ask {
                    Some(reply) => {
                        let _ = reply.send(Report {
                            refused: overlay.refusals().into_iter().collect(),
                            relays: overlay.relays(),
                        });
                    }
                    None => return,
                },
                ev = overlay.next_event() => {
                    if let OverlayEvent::Listening { addr } = ev {
                        if let Some(tx) = addr_tx.take() {
                            let _ = tx.send(addr);
                        }
                    }
                }
                _ = tick.tick() => overlay.handle_timeout(Instant::now()),
            }
        }
    });
    let addr = tokio::time::timeout(Duration::from_secs(30), addr_rx)
        .await
        .expect("overlay listening")
        .unwrap();
    Member {
        addr,
        id,
        ask: ask_tx,
    }
}

/// The stranger: rust-libp2p's relay client and nothing else.
#[derive(libp2p::swarm::NetworkBehaviour)]
struct Stranger {
    relay: relay::client::Behaviour,
}

fn stranger() -> Swarm<Stranger> {
    libp2p::SwarmBuilder::with_new_identity()
        .with_tokio()
        .with_tcp(
            tcp::Config::default(),
            noise::Config::new,
            yamux::Config::default,
        )
        .unwrap()
        .with_relay_client(noise::Config::new, yamux::Config::default)
        .unwrap()
        .with_behaviour(|_, relay| Stranger { relay })
        .unwrap()
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(60)))
        .build()
}

#[test]
fn strangers_get_no_relay_reservation_and_no_circuit_while_members_do() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let relay_member = spawn(41, None).await;
        let member = spawn(42, Some(&relay_member.addr)).await;

        // The member dialled the relay member: it gets a reservation there once proven.
        let deadline = Instant::now() + Duration::from_secs(30);
        let started = Instant::now();
        while !member.report().await.relays.contains(&relay_member.id) {
            assert!(
                Instant::now() < deadline,
                "the member got no reservation at the relay member"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!("member reserved after {:?}", started.elapsed());
        let before = relay_member.report().await.refused;

        // The stranger asks the same relay for a reservation: refused.
        let mut swarm = stranger();
        let circuit = relay_member
            .addr
            .clone()
            .with(Protocol::P2p(relay_member.id))
            .with(Protocol::P2pCircuit);
        let listener = swarm.listen_on(circuit.clone()).unwrap();
        let refused = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match swarm.select_next_some().await {
                    SwarmEvent::Behaviour(StrangerEvent::Relay(
                        relay::client::Event::ReservationReqAccepted { .. },
                    )) => return false,
                    SwarmEvent::ListenerClosed { listener_id, .. }
                    | SwarmEvent::ListenerError { listener_id, .. }
                        if listener_id == listener =>
                    {
                        return true
                    }
                    _ => {}
                }
            }
        })
        .await
        .expect("the relay neither granted nor refused the stranger's reservation");
        assert!(refused, "a stranger got a relay reservation");

        // And a circuit through it to the member: refused too.
        let to_member = circuit.with(Protocol::P2p(member.id));
        swarm.dial(to_member).unwrap();
        let reached = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match swarm.select_next_some().await {
                    SwarmEvent::ConnectionEstablished { peer_id, .. } if peer_id == member.id => {
                        return true
                    }
                    SwarmEvent::OutgoingConnectionError {
                        peer_id: Some(p), ..
                    } if p == member.id => return false,
                    _ => {}
                }
            }
        })
        .await
        .expect("the circuit neither opened nor failed");
        assert!(!reached, "a stranger reached a member through its relay");

        let after = relay_member.report().await.refused;
        println!("relay refusals before the stranger {before:?}, after {after:?}");
        assert!(after["relay_reservations"] > before["relay_reservations"]);
        assert!(after["relay_circuits"] > before["relay_circuits"]);
        // The member keeps its reservation.
        assert!(member.report().await.relays.contains(&relay_member.id));
    });
}
