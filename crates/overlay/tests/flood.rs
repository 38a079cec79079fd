//! Floods of a replica over real libp2p on loopback TCP. A stranger (no secret) gets no
//! record stored at all. A compromised member (it holds the secret and proves it) sends
//! valid self-signed claims from one key as fast as the replica answers, then connection
//! after connection: the replica's store stays bounded, every refusal is counted, and an
//! honest member still claims afterwards.
#![allow(clippy::print_stdout)] // prints its figures (run with --nocapture)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use hyphae_overlay::proof::{ProofRequest, ProofResponse, Proofs, PROOF_PROTOCOL};
use hyphae_overlay::quota::{Refusal, MAX_RECORDS_PER_OWNER};
use hyphae_overlay::records::{Envelope, RecordRequest, RecordResponse, ScopedRequest};
use hyphae_overlay::swarm::{
    ClaimResult, Overlay, OverlayEvent, OverlayOptions, MAX_CONNECTIONS_PER_PEER, RECORDS_PROTOCOL,
};
use hyphae_overlay::{Identity, NamespaceKeys};
use libp2p::request_response::{self, ProtocolSupport};
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::SwarmEvent;
use libp2p::{noise, tcp, yamux, Multiaddr, PeerId, StreamProtocol, Swarm};
use tokio::sync::{mpsc, oneshot};

/// What the victim's task reports when asked.
#[derive(Debug, Clone)]
struct Report {
    stored: usize,
    refused: HashMap<&'static str, u64>,
}

enum Cmd {
    Report(oneshot::Sender<Report>),
    Claim(Vec<u8>, Envelope),
}

/// One overlay in its own task: its address, peer id, commands in, events out.
struct Node {
    addr: Multiaddr,
    id: PeerId,
    cmd: mpsc::Sender<Cmd>,
    events: mpsc::Receiver<OverlayEvent>,
}

impl Node {
    async fn report(&self) -> Report {
        let (tx, rx) = oneshot::channel();
        self.cmd.send(Cmd::Report(tx)).await.unwrap();
        rx.await.unwrap()
    }
}

/// The namespace the victim, the honest member and the compromised member are in.
fn keys() -> NamespaceKeys {
    NamespaceKeys::derive("flood", b"the namespace's own secret")
}

async fn spawn(identity: &Identity, bootstrap: Option<&Multiaddr>) -> Node {
    let mut overlay = Overlay::new(
        identity,
        "/ip4/127.0.0.1/tcp/0".parse().unwrap(),
        bootstrap.into_iter().cloned().collect(),
        OverlayOptions::default(),
        [3; 32],
    )
    .unwrap();
    overlay.add_namespace(&keys(), None);
    let ns = keys().tag();
    let id = overlay.local_id();
    let (cmd_tx, mut cmd_rx) = mpsc::channel(16);
    let (ev_tx, mut ev_rx) = mpsc::channel(1024);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                cmd = cmd_rx.recv() => match cmd {
                    Some(Cmd::Report(reply)) => {
                        let _ = reply.send(Report {
                            stored: overlay.stored_records(),
                            refused: overlay.refusals().into_iter().collect(),
                        });
                    }
                    Some(Cmd::Claim(key, envelope)) => {
                        overlay.claim(ns, key.try_into().unwrap(), envelope);
                    }
                    None => return,
                },
                ev = overlay.next_event() => {
                    if ev_tx.send(ev).await.is_err() { return; }
                }
                _ = tick.tick() => overlay.handle_timeout(Instant::now()),
            }
        }
    });
    let (mut addr, mut joined) = (None, false);
    while addr.is_none() || !joined {
        match tokio::time::timeout(Duration::from_secs(30), ev_rx.recv())
            .await
            .expect("overlay start")
            .unwrap()
        {
            OverlayEvent::Listening { addr: a } => addr = Some(a),
            OverlayEvent::Joined => joined = true,
            _ => {}
        }
    }
    Node {
        addr: addr.unwrap(),
        id,
        cmd: cmd_tx,
        events: ev_rx,
    }
}

/// The flooder's protocols: records, and the membership proof (answered with the secret
/// only by the compromised member).
#[derive(libp2p::swarm::NetworkBehaviour)]
struct Flooder {
    records: request_response::json::Behaviour<ScopedRequest, RecordResponse>,
    proofs: request_response::json::Behaviour<ProofRequest, ProofResponse>,
}

/// A peer that speaks only the records and proof protocols (no Kademlia, no identify), and
/// what it proves: nothing for a stranger, the namespace for a compromised member.
struct Stranger {
    swarm: Swarm<Flooder>,
    proofs: Proofs,
}

fn stranger_swarm(identity: &Identity, member: bool) -> Stranger {
    let key = libp2p::identity::Keypair::ed25519_from_bytes(identity.seed()).unwrap();
    let mut proofs = Proofs::new(key.public().to_peer_id());
    if member {
        proofs.add_namespace(&keys(), None, || [9; 32]);
    }
    let swarm = libp2p::SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_tcp(
            tcp::Config::default(),
            noise::Config::new,
            yamux::Config::default,
        )
        .unwrap()
        .with_behaviour(|_| Flooder {
            records: request_response::json::Behaviour::new(
                [(StreamProtocol::new(RECORDS_PROTOCOL), ProtocolSupport::Full)],
                request_response::Config::default(),
            ),
            proofs: request_response::json::Behaviour::new(
                [(StreamProtocol::new(PROOF_PROTOCOL), ProtocolSupport::Full)],
                request_response::Config::default(),
            ),
        })
        .unwrap()
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(120)))
        .build();
    Stranger { swarm, proofs }
}

impl Stranger {
    /// Drives the swarm for one event, answering the victim's membership challenges
    /// itself (`None`).
    async fn step(&mut self) -> Option<SwarmEvent<FlooderEvent>> {
        match self.swarm.select_next_some().await {
            SwarmEvent::Behaviour(FlooderEvent::Proofs(request_response::Event::Message {
                peer,
                message:
                    request_response::Message::Request {
                        request: ProofRequest::Challenge { nonce },
                        channel,
                        ..
                    },
                ..
            })) => {
                let answer = self.proofs.handle_challenge(peer, nonce, || [9; 32]);
                let _ = self
                    .swarm
                    .behaviour_mut()
                    .proofs
                    .send_response(channel, answer);
                None
            }
            other => Some(other),
        }
    }
}

/// Sends `requests` to `to` at once and waits for every answer (a failed request counts
/// as `None`).
async fn send_all(
    stranger: &mut Stranger,
    to: PeerId,
    requests: Vec<RecordRequest>,
) -> Vec<Option<RecordResponse>> {
    let mut waiting: HashMap<_, usize> = HashMap::new();
    let ns = keys().tag();
    for (i, request) in requests.into_iter().enumerate() {
        let scoped = ScopedRequest { ns, request };
        let id = stranger
            .swarm
            .behaviour_mut()
            .records
            .send_request(&to, scoped);
        waiting.insert(id, i);
    }
    let mut answers = vec![None; waiting.len()];
    let deadline = tokio::time::sleep(Duration::from_secs(60));
    tokio::pin!(deadline);
    while !waiting.is_empty() {
        let event = tokio::select! {
            e = stranger.step() => e,
            _ = &mut deadline => panic!("{} requests unanswered", waiting.len()),
        };
        match event {
            Some(SwarmEvent::Behaviour(FlooderEvent::Records(
                request_response::Event::Message {
                    message:
                        request_response::Message::Response {
                            request_id,
                            response,
                        },
                    ..
                },
            ))) => {
                if let Some(i) = waiting.remove(&request_id) {
                    answers[i] = Some(response);
                }
            }
            Some(SwarmEvent::Behaviour(FlooderEvent::Records(
                request_response::Event::OutboundFailure { request_id, .. },
            ))) => {
                waiting.remove(&request_id);
            }
            _ => {}
        }
    }
    answers
}

/// Dials the victim and waits for the connection.
async fn connect(stranger: &mut Stranger, victim: &Node) {
    stranger.swarm.dial(victim.addr.clone()).unwrap();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(30), stranger.step())
            .await
            .expect("the stranger connects");
        if let Some(SwarmEvent::ConnectionEstablished { .. }) = event {
            return;
        }
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_strangers_flood_leaves_the_store_bounded_and_honest_claims_working() {
    rt().block_on(async {
        let victim = spawn(&Identity::from_seed([1; 32]), None).await;
        let keys = keys();
        let mut rng: rand::rngs::StdRng = rand::SeedableRng::from_seed([7; 32]);
        let expires = hyphae_overlay::swarm::unix_now() + 3600;

        // A stranger without the secret: valid self-signed claims under the namespace's
        // (public) tag, all refused, nothing stored.
        let outsider_id = Identity::from_seed([65; 32]);
        let mut outsider = stranger_swarm(&outsider_id, false);
        connect(&mut outsider, &victim).await;
        let batch: Vec<RecordRequest> = (0..64u32)
            .map(|i| {
                let mut key = [0u8; 32];
                key[..4].copy_from_slice(&i.to_be_bytes());
                let envelope =
                    Envelope::seal(&keys, &outsider_id, &key, expires, b"{}", &mut rng).unwrap();
                RecordRequest::Claim {
                    key: key.to_vec(),
                    envelope,
                }
            })
            .collect();
        for answer in send_all(&mut outsider, victim.id, batch).await {
            assert_eq!(answer, Some(RecordResponse::NotMember));
        }
        assert_eq!(victim.report().await.stored, 0, "a stranger stored records");

        // A compromised member: it holds the secret, so it proves membership; only the
        // quotas stand between it and the store.
        let stranger_id = Identity::from_seed([66; 32]);
        let mut stranger = stranger_swarm(&stranger_id, true);
        connect(&mut stranger, &victim).await;
        let mut claim = |i: u32| {
            let mut key = [0u8; 32];
            key[..4].copy_from_slice(&i.to_be_bytes());
            let envelope =
                Envelope::seal(&keys, &stranger_id, &key, expires, b"{}", &mut rng).unwrap();
            RecordRequest::Claim {
                key: key.to_vec(),
                envelope,
            }
        };

        let mut tally: HashMap<String, u64> = HashMap::new();
        let mut next = 0u32;
        let mut sent = 0u64;
        // Batches of 64 (the records protocol's concurrent streams allow 100) until the
        // owner quota answers; a rate-limited batch waits a second for the bucket.
        while !tally.contains_key("owner_quota") {
            assert!(
                next < 4 * MAX_RECORDS_PER_OWNER as u32,
                "no quota in sight: {tally:?}"
            );
            let batch: Vec<RecordRequest> = (next..next + 64).map(&mut claim).collect();
            next += 64;
            sent += 64;
            let mut limited = false;
            for answer in send_all(&mut stranger, victim.id, batch).await {
                let name = match answer {
                    Some(RecordResponse::Granted) => "granted".to_string(),
                    Some(RecordResponse::Refused { reason }) => {
                        limited |= reason == Refusal::RateLimited;
                        reason.as_str().to_string()
                    }
                    other => format!("{other:?}"),
                };
                *tally.entry(name).or_default() += 1;
            }
            if limited {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        println!("flood: {sent} claims sent, answers {tally:?}");
        let report = victim.report().await;
        println!(
            "victim: {} records, refused {:?}",
            report.stored, report.refused
        );
        // Every claim got an answer, the store holds exactly the owner's quota, and each
        // refusal was counted by the victim under its reason.
        assert_eq!(tally.values().sum::<u64>(), sent);
        assert_eq!(tally["granted"], MAX_RECORDS_PER_OWNER as u64);
        assert_eq!(report.stored, MAX_RECORDS_PER_OWNER);
        assert_eq!(report.refused["owner_quota"], tally["owner_quota"]);
        assert_eq!(
            report.refused["rate_limited"],
            tally.get("rate_limited").copied().unwrap_or(0)
        );

        // Connection after connection from the same peer: all but the per-peer limit
        // are refused by the victim (the flood's own connection is still open).
        let dials = 3 * MAX_CONNECTIONS_PER_PEER;
        for _ in 0..dials {
            let opts = DialOpts::peer_id(victim.id)
                .addresses(vec![victim.addr.clone()])
                .condition(PeerCondition::Always)
                .build();
            stranger.swarm.dial(opts).unwrap();
        }
        let refused_expected = u64::from(dials - (MAX_CONNECTIONS_PER_PEER - 1));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            // Drive the stranger's dials while the victim counts.
            let _ = tokio::time::timeout(Duration::from_millis(200), async {
                loop {
                    stranger.step().await;
                }
            })
            .await;
            let refused = victim.report().await.refused["connections"];
            if refused >= refused_expected {
                assert_eq!(refused, refused_expected);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "victim refused {refused} connections"
            );
        }
        let open = stranger
            .swarm
            .network_info()
            .connection_counters()
            .num_established();
        println!("connections: {dials} dialled, {open} open, {refused_expected} refused");
        assert!(open <= MAX_CONNECTIONS_PER_PEER);

        // An honest member joins through the victim and claims its address: the victim,
        // full of the stranger's records, still grants it.
        let honest_id = Identity::from_seed([2; 32]);
        let mut honest = spawn(&honest_id, Some(&victim.addr)).await;
        let lab = NamespaceKeys::derive("lab", b"0123456789abcdef");
        let key = lab.address_key([10, 201, 0, 5].into());
        let envelope = Envelope::seal(&lab, &honest_id, &key, expires, b"{}", &mut rng).unwrap();
        honest
            .cmd
            .send(Cmd::Claim(key.to_vec(), envelope))
            .await
            .unwrap();
        let result = loop {
            let event = tokio::time::timeout(Duration::from_secs(30), honest.events.recv())
                .await
                .expect("the honest claim is decided")
                .unwrap();
            if let OverlayEvent::Claimed {
                result, replicas, ..
            } = event
            {
                assert_eq!(replicas, 2, "the victim and the honest member");
                break result;
            }
        };
        assert_eq!(result, ClaimResult::Won);
        assert_eq!(victim.report().await.stored, MAX_RECORDS_PER_OWNER + 1);
    });
}
