//! Real libp2p swarms on loopback TCP, many in one process: record claims, reads, isolation.
#![allow(clippy::print_stdout)] // prints its figures (run with --nocapture)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use hyphae_overlay::proof::{ProofRequest, ProofResponse};
use hyphae_overlay::records::{
    decode, encode, Envelope, MemberInfo, RecordKey, RecordRequest, RecordResponse, ScopedRequest,
};
use hyphae_overlay::swarm::{
    network_id, owner_key, ClaimResult, Overlay, OverlayEvent, OverlayOptions, MAX_ROUTER_MESSAGE,
};
use hyphae_overlay::{Identity, NamespaceKeys};
use libp2p::Multiaddr;
use tokio::sync::mpsc;

enum Cmd {
    Claim(RecordKey, Envelope),
    Transfer(RecordKey, Envelope),
    Get(RecordKey),
    /// A read from the replicas among known members, without a lookup when it can.
    GetNear(RecordKey),
    Release(RecordKey),
    /// A message to a member (scoped to a namespace tag); replies whether it was sent.
    Send(
        hyphae_overlay::proof::NamespaceTag,
        libp2p::PeerId,
        Vec<u8>,
        tokio::sync::oneshot::Sender<bool>,
    ),
    /// The overlay's counters.
    Stats(tokio::sync::oneshot::Sender<hyphae_overlay::swarm::OverlayStats>),
    /// The peers of the swarm's Kademlia routing table.
    Table(tokio::sync::oneshot::Sender<Vec<libp2p::PeerId>>),
    Stop,
}

struct Handle {
    identity: Identity,
    addr: Multiaddr,
    cmd: mpsc::Sender<Cmd>,
    events: mpsc::Receiver<OverlayEvent>,
}

impl Handle {
    async fn next(&mut self, what: &str) -> OverlayEvent {
        tokio::time::timeout(Duration::from_secs(30), self.events.recv())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .unwrap()
    }

    async fn claimed(&mut self) -> ClaimResult {
        self.claimed_by().await.0
    }

    /// A claim's result and how many replicas decided it.
    async fn claimed_by(&mut self) -> (ClaimResult, usize) {
        loop {
            if let OverlayEvent::Claimed {
                result, replicas, ..
            } = self.next("a claim").await
            {
                return (result, replicas);
            }
        }
    }

    async fn got(&mut self) -> Vec<Envelope> {
        self.got_counted().await.0
    }

    /// A read's envelopes and how many peers its lookup queried.
    async fn got_counted(&mut self) -> (Vec<Envelope>, u32) {
        loop {
            if let OverlayEvent::Got {
                envelopes, queried, ..
            } = self.next("a read").await
            {
                return (envelopes, queried);
            }
        }
    }

    async fn released(&mut self) {
        loop {
            if let OverlayEvent::Released { .. } = self.next("a release").await {
                return;
            }
        }
    }

    fn owner(&self) -> [u8; 32] {
        *self.identity.peer_id().as_bytes()
    }
}

/// Starts one swarm on loopback TCP in its own task; returns once it listens and (if it
/// has a bootstrap address) has joined.
async fn spawn(seed: u64, bootstrap: Option<&Multiaddr>) -> Handle {
    spawn_on("/ip4/127.0.0.1/tcp/0", seed, bootstrap).await
}

/// [`spawn`] on a given listen address (`/memory/0`: libp2p's in-memory transport).
async fn spawn_on(listen: &str, seed: u64, bootstrap: Option<&Multiaddr>) -> Handle {
    let mut s = [0u8; 32];
    s[..8].copy_from_slice(&seed.to_le_bytes());
    s[8] = 0x5a;
    let identity = Identity::from_seed(s);
    let mut overlay = Overlay::new(
        &identity,
        listen.parse().unwrap(),
        bootstrap.into_iter().cloned().collect(),
        OverlayOptions {
            // HYPHAE_SCALE_LOOKUP=1: every claim looks its replicas up (the baseline).
            claims_without_lookup: std::env::var_os("HYPHAE_SCALE_LOOKUP").is_none(),
            ..OverlayOptions::default()
        },
        s,
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e:?} fds {} {}",
            std::fs::read_dir("/proc/self/fd").unwrap().count(),
            std::fs::read_to_string("/proc/self/limits").unwrap()
        )
    });
    // Every swarm here is a member of one control-plane namespace (the records' keys may
    // come from other namespaces' keys: replicas cannot tell).
    let ns = member_keys().tag();
    overlay.add_namespace(&member_keys(), None);
    let (cmd_tx, mut cmd_rx) = mpsc::channel(16);
    let (ev_tx, mut ev_rx) = mpsc::channel(1024);
    tokio::spawn(async move {
        loop {
            // As the agent's driver does: the overlay's own next deadline (at most 100 ms).
            let ceiling = Instant::now() + Duration::from_millis(100);
            let wake = overlay.poll_timeout().map_or(ceiling, |t| t.min(ceiling));
            tokio::select! {
                cmd = cmd_rx.recv() => match cmd {
                    Some(Cmd::Claim(k, e)) => { overlay.claim(ns, k, e); }
                    Some(Cmd::Transfer(k, e)) => { overlay.transfer(ns, k, e); }
                    Some(Cmd::Get(k)) => { overlay.get(ns, k); }
                    Some(Cmd::GetNear(k)) => { overlay.get_near(ns, k); }
                    Some(Cmd::Release(k)) => { overlay.release(ns, k); }
                    Some(Cmd::Send(tag, to, body, sent)) => {
                        let _ = sent.send(overlay.send_to_member(tag, to, body));
                    }
                    Some(Cmd::Stats(reply)) => { let _ = reply.send(overlay.stats()); }
                    Some(Cmd::Table(reply)) => { let _ = reply.send(overlay.routing_table()); }
                    Some(Cmd::Stop) | None => return,
                },
                ev = overlay.next_event() => {
                    if ev_tx.send(ev).await.is_err() { return; }
                }
                _ = tokio::time::sleep_until(wake.into()) => {
                    overlay.handle_timeout(Instant::now());
                }
            }
        }
    });
    let mut addr = None;
    let mut joined = false;
    while addr.is_none() || !joined {
        match tokio::time::timeout(Duration::from_secs(30), ev_rx.recv())
            .await
            .expect("swarm start")
            .unwrap()
        {
            OverlayEvent::Listening { addr: a } => addr = Some(a),
            OverlayEvent::Joined => joined = true,
            _ => {}
        }
    }
    Handle {
        identity,
        addr: addr.unwrap(),
        cmd: cmd_tx,
        events: ev_rx,
    }
}

async fn network(n: usize, first_seed: u64) -> Vec<Handle> {
    let mut nodes = vec![spawn(first_seed, None).await];
    for i in 1..n {
        let boot = nodes[i % nodes.len().min(3)].addr.clone();
        nodes.push(spawn(first_seed + i as u64, Some(&boot)).await);
    }
    nodes
}

/// The namespace every test swarm proves it is a member of.
fn member_keys() -> NamespaceKeys {
    NamespaceKeys::derive("members", b"the members' secret")
}

fn unix_now() -> u64 {
    hyphae_overlay::swarm::unix_now()
}

fn envelope(keys: &NamespaceKeys, who: &Identity, key: &RecordKey, port: u16) -> Envelope {
    let info = MemberInfo {
        endpoints: vec![([10, 200, 0, 1], port).into()],
        name: None,
        subject: None,
    };
    let mut rng: rand::rngs::StdRng = rand::SeedableRng::from_seed([port as u8; 32]);
    // Valid for an hour: these tests claim once and never renew, so on a slow, busy machine
    // (the 200-member test can take minutes) no lease may lapse before it is checked.
    Envelope::seal(keys, who, key, unix_now() + 3600, &encode(&info), &mut rng).unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn racing_claims_have_one_winner_and_reads_agree_with_a_lookup_or_without() {
    rt().block_on(async {
        let mut nodes = network(8, 1000).await;
        let keys = NamespaceKeys::derive("lab", b"0123456789abcdef");
        for round in 0..5u8 {
            let key = keys.address_key(Ipv4Addr::new(10, 1, 0, round));
            // Three members race for the same address.
            let racers = [1usize, 4, 7];
            for &r in &racers {
                let e = envelope(&keys, &nodes[r].identity, &key, 7400 + r as u16);
                nodes[r].cmd.send(Cmd::Claim(key, e)).await.unwrap();
            }
            let mut winners = Vec::new();
            for &r in &racers {
                match nodes[r].claimed().await {
                    ClaimResult::Won => winners.push(r),
                    ClaimResult::Lost(holder) => {
                        if let Some(h) = holder {
                            assert!(racers.iter().any(|&x| nodes[x].owner() == h));
                        }
                    }
                    ClaimResult::Kept(rival) => panic!("a first claim is no renewal: {rival:?}"),
                }
            }
            assert!(winners.len() <= 1, "round {round}: two winners {winners:?}");
            // Every member reads the same holder, and the value opens to its endpoint: after
            // a lookup, and from the replicas among the members it knows.
            if let Some(&w) = winners.first() {
                for reader in [0usize, 2, 5] {
                    for near in [false, true] {
                        let cmd = if near {
                            Cmd::GetNear(key)
                        } else {
                            Cmd::Get(key)
                        };
                        nodes[reader].cmd.send(cmd).await.unwrap();
                        let got = nodes[reader].got().await;
                        let (owner, plain) = got[0].open(&keys, &key, unix_now()).unwrap();
                        assert_eq!(owner, nodes[w].owner(), "near read: {near}");
                        let info: MemberInfo = decode(&plain).unwrap();
                        assert_eq!(info.endpoints[0].port(), 7400 + w as u16);
                    }
                }
            }
        }
        // Eight members all connected: the reads near went without a lookup (in each
        // round with a winner; a member not yet sure of its neighbourhood looks up).
        let mut without_lookup = 0;
        for reader in [0usize, 2, 5] {
            let (tx, rx) = tokio::sync::oneshot::channel();
            nodes[reader].cmd.send(Cmd::Stats(tx)).await.unwrap();
            without_lookup += rx.await.unwrap().reads_without_lookup;
        }
        assert!(without_lookup > 0, "every near read looked its replicas up");
        for n in &nodes {
            let _ = n.cmd.send(Cmd::Stop).await;
        }
    });
}

#[test]
fn a_transfer_moves_the_lease_to_the_named_holder_and_the_old_holder_cannot_take_it_back() {
    rt().block_on(async {
        let mut nodes = network(6, 3000).await;
        let keys = NamespaceKeys::derive("lab", b"0123456789abcdef");
        let key = keys.address_key(Ipv4Addr::new(10, 1, 0, 42));
        let (old, new, third) = (1usize, 4usize, 2usize);
        let mine = envelope(&keys, &nodes[old].identity, &key, 7501);
        nodes[old]
            .cmd
            .send(Cmd::Claim(key, mine.clone()))
            .await
            .unwrap();
        assert_eq!(nodes[old].claimed().await, ClaimResult::Won);
        // Only the holder can transfer: the new holder asking for itself is refused.
        let theirs = envelope(&keys, &nodes[new].identity, &key, 7504);
        nodes[new]
            .cmd
            .send(Cmd::Transfer(key, theirs.clone()))
            .await
            .unwrap();
        assert!(matches!(nodes[new].claimed().await, ClaimResult::Lost(_)));
        nodes[old]
            .cmd
            .send(Cmd::Transfer(key, theirs))
            .await
            .unwrap();
        assert_eq!(nodes[old].claimed().await, ClaimResult::Won);
        // Every reader sees the new holder's own record.
        for reader in [0usize, 3, 5] {
            nodes[reader].cmd.send(Cmd::Get(key)).await.unwrap();
            let got = nodes[reader].got().await;
            let (owner, plain) = got[0].open(&keys, &key, unix_now()).unwrap();
            assert_eq!(owner, nodes[new].owner());
            let info: MemberInfo = decode(&plain).unwrap();
            assert_eq!(info.endpoints[0].port(), 7504);
        }
        // The old holder renewing, or a third member claiming, is refused in its favour.
        for (who, port) in [(old, 7501u16), (third, 7502)] {
            let e = envelope(&keys, &nodes[who].identity, &key, port);
            nodes[who].cmd.send(Cmd::Claim(key, e)).await.unwrap();
            assert_eq!(
                nodes[who].claimed().await,
                ClaimResult::Lost(Some(nodes[new].owner()))
            );
        }
        for n in &nodes {
            let _ = n.cmd.send(Cmd::Stop).await;
        }
    });
}

#[test]
fn members_messages_arrive_only_from_proven_members_of_their_namespace() {
    rt().block_on(async {
        let mut nodes = network(2, 3100).await;
        let to = network_id(&nodes[1].owner()).unwrap();
        let send = |tag, body: Vec<u8>| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            (Cmd::Send(tag, to, body, tx), rx)
        };
        let refused = |n: &Handle| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let cmd = n.cmd.clone();
            async move {
                cmd.send(Cmd::Stats(tx)).await.unwrap();
                rx.await.unwrap().router_messages_refused
            }
        };
        // Too large: not sent.
        let (cmd, sent) = send(member_keys().tag(), vec![0; MAX_ROUTER_MESSAGE + 1]);
        nodes[0].cmd.send(cmd).await.unwrap();
        assert!(!sent.await.unwrap());
        // A namespace neither proved: refused and counted by the receiver.
        let other = NamespaceKeys::derive("lab", b"another secret!!").tag();
        let (cmd, sent) = send(other, b"not yours".to_vec());
        nodes[0].cmd.send(cmd).await.unwrap();
        assert!(sent.await.unwrap());
        let deadline = Instant::now() + Duration::from_secs(30);
        while refused(&nodes[1]).await == 0 {
            assert!(Instant::now() < deadline, "the refusal was never counted");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The members' namespace: delivered, naming the sender; the refused one never is.
        let (cmd, sent) = send(member_keys().tag(), b"hand 10.1.0.9 over".to_vec());
        nodes[0].cmd.send(cmd).await.unwrap();
        assert!(sent.await.unwrap());
        loop {
            if let OverlayEvent::MemberMessage { ns, from, body } = nodes[1].next("a message").await
            {
                assert_eq!(
                    (ns, from, body),
                    (
                        member_keys().tag(),
                        network_id(&nodes[0].owner()).unwrap(),
                        b"hand 10.1.0.9 over".to_vec()
                    )
                );
                break;
            }
        }
        for n in &nodes {
            let _ = n.cmd.send(Cmd::Stop).await;
        }
    });
}

#[test]
fn records_are_isolated_between_namespaces_and_owners() {
    rt().block_on(async {
        let mut nodes = network(6, 2000).await;
        let a = NamespaceKeys::derive("lab", b"0123456789abcdef");
        let b = NamespaceKeys::derive("lab", b"another secret!!");
        let ip = Ipv4Addr::new(10, 1, 0, 9);
        let key_a = a.address_key(ip);
        // Namespace B's key for the same address is a different key: B cannot even find it.
        assert_ne!(key_a, b.address_key(ip));

        let e = envelope(&a, &nodes[1].identity, &key_a, 7401);
        nodes[1]
            .cmd
            .send(Cmd::Claim(key_a, e.clone()))
            .await
            .unwrap();
        assert_eq!(nodes[1].claimed().await, ClaimResult::Won);

        // A member of B (or anyone) who learns the key reads only a sealed value.
        nodes[2].cmd.send(Cmd::Get(key_a)).await.unwrap();
        let got = nodes[2].got().await;
        assert_eq!(got.len(), 1);
        assert!(got[0].open(&b, &key_a, unix_now()).is_err());

        // Overwrite: a claim by another owner (sealed with B's key, or forged as A's
        // member) loses.
        let theirs = envelope(&b, &nodes[2].identity, &key_a, 9999);
        nodes[2].cmd.send(Cmd::Claim(key_a, theirs)).await.unwrap();
        assert_eq!(
            nodes[2].claimed().await,
            ClaimResult::Lost(Some(nodes[1].owner()))
        );
        let mut forged = envelope(&b, &nodes[2].identity, &key_a, 9999);
        forged.owner = nodes[1].owner().to_vec();
        nodes[2].cmd.send(Cmd::Claim(key_a, forged)).await.unwrap();
        assert!(matches!(nodes[2].claimed().await, ClaimResult::Lost(_)));

        // Delete: a release by anyone but the owner changes nothing.
        nodes[3].cmd.send(Cmd::Release(key_a)).await.unwrap();
        nodes[3].released().await;
        nodes[4].cmd.send(Cmd::Get(key_a)).await.unwrap();
        let got = nodes[4].got().await;
        let (owner, _) = got[0].open(&a, &key_a, unix_now()).unwrap();
        assert_eq!(owner, nodes[1].owner());
        assert_eq!(owner_key(&network_id_of(&nodes[1])), Some(owner));

        // The owner's release frees it for someone else.
        nodes[1].cmd.send(Cmd::Release(key_a)).await.unwrap();
        nodes[1].released().await;
        let mine = envelope(&a, &nodes[5].identity, &key_a, 7405);
        nodes[5].cmd.send(Cmd::Claim(key_a, mine)).await.unwrap();
        assert_eq!(nodes[5].claimed().await, ClaimResult::Won);
        for n in &nodes {
            let _ = n.cmd.send(Cmd::Stop).await;
        }
    });
}

fn network_id_of(h: &Handle) -> libp2p::PeerId {
    hyphae_overlay::swarm::network_id(&h.owner()).unwrap()
}

/// A greedy Kademlia route over the swarms' real routing tables (alpha = 1): from `from`,
/// each hop moves to the live peer closest to `key` that the current one knows, until none
/// is closer. Returns the hop count and where the route ended.
fn greedy_route(
    tables: &std::collections::HashMap<libp2p::PeerId, Vec<libp2p::PeerId>>,
    from: libp2p::PeerId,
    key: &RecordKey,
) -> (usize, libp2p::PeerId) {
    let target = libp2p::kad::KBucketKey::new(key.to_vec());
    let distance = |p: &libp2p::PeerId| libp2p::kad::KBucketKey::from(*p).distance(&target);
    let (mut at, mut hops) = (from, 0);
    loop {
        let next = tables[&at]
            .iter()
            .filter(|p| tables.contains_key(*p))
            .min_by_key(|p| distance(p));
        match next {
            Some(&n) if distance(&n) < distance(&at) => {
                at = n;
                hops += 1;
            }
            _ => return (hops, at),
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Issue 3's scale test: 200 real swarms in one process. Every one allocates an address at
/// once from a pool only 10% larger than the membership; then 20% of the swarms stop and
/// every survivor's address must still resolve to it.
/// `cargo test -p hyphae-overlay --test overlay_net scale -- --nocapture` prints the figures.
#[test]
#[allow(non_snake_case)]
fn scale_200_members_allocate_concurrently_and_survive_losing_a_fifth() {
    // HYPHAE_SCALE_N=1000 runs the same test with 1000 members (pool +10%).
    let n: usize = std::env::var("HYPHAE_SCALE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let (N, POOL) = (n, (n + n / 10) as u32);
    // Every core of the machine, as the issue asks.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let started = Instant::now();
        // libp2p's memory transport: real swarms (noise, yamux, Kademlia, identify, relay,
        // request-response) without sockets, so hundreds of members fit in one process's
        // descriptor table.
        const MEM: &str = "/memory/0";
        let mut nodes = vec![spawn_on(MEM, 10_000, None).await];
        let mut join_times = Vec::new();
        for i in 1..N {
            // An earlier member picked by a multiplicative hash (`(i * k) % i` would always
            // be member 0: until 2026-11-27 every swarm joined through member 0).
            let boot = nodes[((i as u64 * 2_654_435_761) >> 8) as usize % i]
                .addr
                .clone();
            let t = Instant::now();
            nodes.push(spawn_on(MEM, 10_000 + i as u64, Some(&boot)).await);
            join_times.push(t.elapsed());
        }
        let build = started.elapsed();
        let keys = std::sync::Arc::new(NamespaceKeys::derive("scale", b"0123456789abcdef"));

        // Everyone claims at once; a claim lost to a holder moves to another random
        // address, one lost without a holder (unanswered, or given up short of replicas)
        // tries the same address again 2 s later, as an agent does (CLAIM_RETRY).
        let mut tasks = Vec::new();
        for (i, mut node) in nodes.into_iter().enumerate() {
            let keys = keys.clone();
            tasks.push(tokio::spawn(async move {
                let t = Instant::now();
                let mut tried = std::collections::HashSet::new();
                let mut attempts = 0;
                let mut seed = i as u64 * 2654435761 + 1;
                let mut claims = Vec::new();
                let mut again = None;
                let address = loop {
                    let host = match again.take() {
                        Some(host) => {
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            host
                        }
                        None => {
                            seed = seed
                                .wrapping_mul(6364136223846793005)
                                .wrapping_add(1442695040888963407);
                            let host = 1 + ((seed >> 33) as u32 % POOL);
                            if !tried.insert(host) {
                                continue;
                            }
                            host
                        }
                    };
                    attempts += 1;
                    let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 9, 0, 0)) + host);
                    let key = keys.address_key(ip);
                    let e = envelope(&keys, &node.identity, &key, 7400);
                    let one = Instant::now();
                    node.cmd.send(Cmd::Claim(key, e)).await.unwrap();
                    let (result, replicas) = node.claimed_by().await;
                    claims.push(one.elapsed());
                    match result {
                        ClaimResult::Won => break (ip, replicas),
                        ClaimResult::Lost(None) => {
                            again = Some(host);
                        }
                        _ => {}
                    }
                    assert!(tried.len() < POOL as usize, "node {i} found no address");
                };
                (node, address, t.elapsed(), attempts, claims)
            }));
        }
        let mut nodes = Vec::new();
        let mut latencies = Vec::new();
        let mut attempts = Vec::new();
        let mut addresses = Vec::new();
        let mut claims = Vec::new();
        let mut small_sets = 0;
        for t in tasks {
            let (node, (address, replicas), latency, n, c) = t.await.unwrap();
            small_sets += usize::from(replicas < hyphae_overlay::quorum::REPLICAS);
            claims.extend(c);
            nodes.push(node);
            addresses.push(address);
            latencies.push(latency);
            attempts.push(n);
        }
        let (mut without_lookup, mut again, mut disputed, mut short) = (0, 0, 0, 0);
        for n in &nodes {
            let (tx, rx) = tokio::sync::oneshot::channel();
            n.cmd.send(Cmd::Stats(tx)).await.unwrap();
            let s = rx.await.unwrap();
            without_lookup += s.claims_without_lookup;
            again += s.claims_looked_up_again;
            disputed += s.claims_disputed;
            short += s.claims_short_given_up;
        }
        claims.sort();
        println!(
            "scale: {} claims (one address each, won or lost) p50 {:.2?} p99 {:.2?}; \
             {without_lookup} without a lookup, {again} of them looked up again \
             ({disputed} disputes from replicas); {short} given up short of replicas; \
             {small_sets} won by fewer than 5 replicas",
            claims.len(),
            percentile(&claims, 0.5),
            percentile(&claims, 0.99),
        );

        let unique: std::collections::HashSet<_> = addresses.iter().collect();
        assert_eq!(
            unique.len(),
            N,
            "{} addresses were won twice; {small_sets} won by fewer than 5 replicas \
             (allocation p50 {:.2?}, max {:.2?})",
            N - unique.len(),
            {
                let mut l = latencies.clone();
                l.sort();
                percentile(&l, 0.5)
            },
            latencies.iter().max().copied().unwrap_or_default(),
        );

        // Then claims one at a time, the network quiet: what one claim costs by itself.
        let mut quiet = Vec::new();
        for (k, i) in (0..N).step_by((N / 40).max(1)).enumerate() {
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 10, 0, 1)) + k as u32);
            let key = keys.address_key(ip);
            let e = envelope(&keys, &nodes[i].identity, &key, 7400);
            let t = Instant::now();
            nodes[i].cmd.send(Cmd::Claim(key, e)).await.unwrap();
            assert_eq!(nodes[i].claimed().await, ClaimResult::Won, "{ip} is free");
            quiet.push(t.elapsed());
        }
        quiet.sort();
        println!(
            "scale: {} claims one at a time (free addresses): p50 {:.2?} p99 {:.2?}",
            quiet.len(),
            percentile(&quiet, 0.5),
            percentile(&quiet, 0.99),
        );

        // A fifth of the members stop; every survivor's address still resolves to it.
        let dead: Vec<usize> = (0..N).filter(|i| i % 5 == 2).collect();
        for &i in &dead {
            nodes[i].cmd.send(Cmd::Stop).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let survivors: Vec<usize> = (0..N).filter(|i| i % 5 != 2).collect();
        let mut tables = std::collections::HashMap::new();
        for &i in &survivors {
            let (tx, rx) = tokio::sync::oneshot::channel();
            nodes[i].cmd.send(Cmd::Table(tx)).await.unwrap();
            tables.insert(network_id_of(&nodes[i]), rx.await.unwrap());
        }
        let mut lookups = Vec::new();
        let mut queried = Vec::new();
        let mut hops = Vec::new();
        let mut converged = 0;
        for (k, &owner) in survivors.iter().enumerate() {
            let reader = survivors[(k * 31 + 7) % survivors.len()];
            let key = keys.address_key(addresses[owner]);
            let (h, end) = greedy_route(&tables, network_id_of(&nodes[reader]), &key);
            let target = libp2p::kad::KBucketKey::new(key.to_vec());
            let closest = tables
                .keys()
                .min_by_key(|p| libp2p::kad::KBucketKey::from(**p).distance(&target))
                .copied();
            converged += usize::from(Some(end) == closest);
            hops.push(h);
            let t = Instant::now();
            nodes[reader].cmd.send(Cmd::Get(key)).await.unwrap();
            let (got, q) = nodes[reader].got_counted().await;
            lookups.push(t.elapsed());
            queried.push(q);
            let opened = got
                .iter()
                .find_map(|e| e.open(&keys, &key, unix_now()).ok())
                .unwrap_or_else(|| panic!("address of member {owner} does not resolve"));
            assert_eq!(opened.0, nodes[owner].owner());
        }
        latencies.sort();
        lookups.sort();
        hops.sort();
        queried.sort();
        let table_sizes: Vec<usize> = tables.values().map(Vec::len).collect();
        let mean_table = table_sizes.iter().sum::<usize>() as f64 / table_sizes.len() as f64;
        let at = |v: &[usize], p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
        let qs: Vec<usize> = queried.iter().map(|&q| q as usize).collect();
        println!(
            "scale: lookup hops (greedy route over the real routing tables, alpha 1): \
             p50 {} p99 {} max {}, ending at the closest live member {converged} of {}; \
             peers queried per Kademlia lookup p50 {} p99 {}; routing table {mean_table:.1} \
             peers on average",
            at(&hops, 0.5),
            at(&hops, 0.99),
            hops[hops.len() - 1],
            hops.len(),
            at(&qs, 0.5),
            at(&qs, 0.99),
        );
        join_times.sort();
        attempts.sort();
        println!(
            "scale: {N} members, pool {POOL}: all unique; built in {build:.2?} \
             (join p50 {:.2?} p99 {:.2?}); allocation p50 {:.2?} p99 {:.2?} max {:.2?}, \
             attempts p50 {} max {}; after 20% stopped: {} of {} addresses resolve, \
             lookup p50 {:.2?} p99 {:.2?}",
            percentile(&join_times, 0.5),
            percentile(&join_times, 0.99),
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            latencies[N - 1],
            attempts[N / 2],
            attempts[N - 1],
            lookups.len(),
            survivors.len(),
            percentile(&lookups, 0.5),
            percentile(&lookups, 0.99),
        );
        for n in &nodes {
            let _ = n.cmd.send(Cmd::Stop).await;
        }
    });
}

/// What a hostile stranger saw of the members' record protocol.
#[derive(Default)]
struct Seen {
    /// Answers members gave to the stranger's own record requests.
    answers: Vec<RecordResponse>,
    /// Record requests members sent it (none should come: it is no replica).
    asked: usize,
}

/// A stranger without the namespace secret that speaks hyphae's protocols as an attacker
/// would: it serves Kademlia honestly (to get into routing tables), answers every claim with
/// "held by someone", every read with "nothing", every challenge with a made-up proof, and
/// asks members for the namespace's records under its real tag (the tag is public).
#[derive(libp2p::swarm::NetworkBehaviour)]
struct Hostile {
    kad: libp2p::kad::Behaviour<libp2p::kad::store::MemoryStore>,
    identify: libp2p::identify::Behaviour,
    records: libp2p::request_response::json::Behaviour<ScopedRequest, RecordResponse>,
    proofs: libp2p::request_response::json::Behaviour<ProofRequest, ProofResponse>,
}

/// Starts a [`Hostile`] stranger that joins the DHT through `member`; returns its peer id,
/// what it sees, and a sender that stops it when dropped.
async fn spawn_hostile(
    member: &Handle,
    members: std::collections::HashSet<libp2p::PeerId>,
    tag: [u8; hyphae_overlay::TAG_LEN],
) -> (
    libp2p::PeerId,
    std::sync::Arc<std::sync::Mutex<Seen>>,
    tokio::sync::oneshot::Sender<()>,
) {
    use futures::StreamExt;
    use libp2p::request_response::{self, Message, ProtocolSupport};
    use libp2p::swarm::SwarmEvent;
    use libp2p::{identify, kad, noise, tcp, yamux, StreamProtocol};

    let mut swarm = libp2p::SwarmBuilder::with_new_identity()
        .with_tokio()
        .with_tcp(
            tcp::Config::default(),
            noise::Config::new,
            yamux::Config::default,
        )
        .unwrap()
        .with_behaviour(|key| {
            let peer = key.public().to_peer_id();
            let cfg = kad::Config::new(StreamProtocol::new("/hyphae/kad/1"));
            let mut kad =
                kad::Behaviour::with_config(peer, kad::store::MemoryStore::new(peer), cfg);
            kad.set_mode(Some(kad::Mode::Server));
            let rr = |name: &'static str| {
                (
                    [(StreamProtocol::new(name), ProtocolSupport::Full)],
                    request_response::Config::default(),
                )
            };
            let (p, c) = rr("/hyphae/records/2");
            let records = request_response::json::Behaviour::new(p, c);
            let (p, c) = rr("/hyphae/member/1");
            let proofs = request_response::json::Behaviour::new(p, c);
            Hostile {
                kad,
                identify: identify::Behaviour::new(identify::Config::new(
                    "/hyphae/1".into(),
                    key.public(),
                )),
                records,
                proofs,
            }
        })
        .unwrap()
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(60)))
        .build();
    swarm
        .listen_on("/ip4/127.0.0.1/tcp/0".parse().unwrap())
        .unwrap();
    let id = *swarm.local_peer_id();
    let member_id = network_id_of(member);
    swarm
        .behaviour_mut()
        .kad
        .add_address(&member_id, member.addr.clone());
    let _ = swarm.behaviour_mut().kad.bootstrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Seen::default()));
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let seen_task = seen.clone();
    let key =
        NamespaceKeys::derive("lab", b"0123456789abcdef").address_key(Ipv4Addr::new(10, 1, 0, 1));
    tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                _ = &mut stop_rx => return,
                e = swarm.select_next_some() => e,
            };
            match event {
                SwarmEvent::ConnectionEstablished { peer_id, .. } if members.contains(&peer_id) => {
                    // Ask the member for the namespace's records, as a member would.
                    for request in [
                        RecordRequest::Get { key: key.to_vec() },
                        RecordRequest::Members { key: key.to_vec() },
                    ] {
                        swarm
                            .behaviour_mut()
                            .records
                            .send_request(&peer_id, ScopedRequest { ns: tag, request });
                    }
                }
                SwarmEvent::Behaviour(HostileEvent::Records(
                    request_response::Event::Message { message, peer, .. },
                )) => match message {
                    Message::Request {
                        request, channel, ..
                    } => {
                        if members.contains(&peer) {
                            seen_task.lock().unwrap().asked += 1;
                        }
                        let lie = match request.request {
                            RecordRequest::Claim { .. }
                            | RecordRequest::ClaimAmong { .. }
                            | RecordRequest::Join { .. }
                            | RecordRequest::Transfer { .. } => RecordResponse::Held {
                                owner: vec![0x66; 32],
                                remaining_ms: 3_600_000,
                            },
                            RecordRequest::Get { .. } => RecordResponse::Value { envelope: None },
                            RecordRequest::Members { .. } => {
                                RecordResponse::Members { envelopes: vec![] }
                            }
                            RecordRequest::Release { .. } => RecordResponse::Released,
                        };
                        let _ = swarm.behaviour_mut().records.send_response(channel, lie);
                    }
                    Message::Response { response, .. } => {
                        seen_task.lock().unwrap().answers.push(response);
                    }
                },
                SwarmEvent::Behaviour(HostileEvent::Proofs(request_response::Event::Message {
                    message:
                        Message::Request {
                            request, channel, ..
                        },
                    ..
                })) => {
                    let answer = match request {
                        ProofRequest::Challenge { .. } => ProofResponse::Proof {
                            macs: vec![[0x42; 32]],
                            certificates: Vec::new(),
                        },
                        ProofRequest::Proof { .. } => ProofResponse::Ack,
                    };
                    let _ = swarm.behaviour_mut().proofs.send_response(channel, answer);
                }
                _ => {}
            }
        }
    });
    (id, seen, stop_tx)
}

/// Issue 13: ten stranger identities in the DHT that lie in every answer are never asked,
/// so members still win and read their claims; the strangers' own requests for the
/// namespace's records are refused.
#[test]
fn hostile_strangers_in_the_dht_are_never_replicas() {
    rt().block_on(async {
        let mut nodes = network(3, 3000).await;
        let tag = member_keys().tag();
        let members: std::collections::HashSet<_> = nodes.iter().map(network_id_of).collect();
        let mut strangers = Vec::new();
        for _ in 0..10 {
            strangers.push(spawn_hostile(&nodes[0], members.clone(), tag).await);
        }
        let stranger_ids: std::collections::HashSet<_> =
            strangers.iter().map(|(id, _, _)| *id).collect();
        // Wait (bounded) until the strangers are in a member's routing table: a plain
        // Kademlia replica set would now be mostly strangers.
        let mut known = 0;
        for _ in 0..100 {
            let (tx, rx) = tokio::sync::oneshot::channel();
            nodes[1].cmd.send(Cmd::Table(tx)).await.unwrap();
            known = rx
                .await
                .unwrap()
                .iter()
                .filter(|p| stranger_ids.contains(p))
                .count();
            if known >= 8 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            known >= 8,
            "only {known} strangers reached the routing table"
        );

        let keys = NamespaceKeys::derive("lab", b"0123456789abcdef");
        for round in 0..6u8 {
            let key = keys.address_key(Ipv4Addr::new(10, 1, 0, 10 + round));
            let (claimer, reader) = (usize::from(round) % 3, usize::from(round + 1) % 3);
            let e = envelope(
                &keys,
                &nodes[claimer].identity,
                &key,
                7400 + u16::from(round),
            );
            nodes[claimer].cmd.send(Cmd::Claim(key, e)).await.unwrap();
            let (result, replicas) = loop {
                if let OverlayEvent::Claimed {
                    result, replicas, ..
                } = nodes[claimer].next("a claim").await
                {
                    break (result, replicas);
                }
            };
            assert_eq!(result, ClaimResult::Won, "round {round}");
            assert_eq!(
                replicas, 3,
                "round {round}: only the three members are replicas"
            );
            nodes[reader].cmd.send(Cmd::Get(key)).await.unwrap();
            let got = nodes[reader].got().await;
            let (owner, _) = got[0].open(&keys, &key, unix_now()).unwrap();
            assert_eq!(owner, nodes[claimer].owner());
        }
        let mut answers = 0;
        for (_, seen, _) in &strangers {
            let seen = seen.lock().unwrap();
            assert_eq!(seen.asked, 0, "a member asked a stranger for a record");
            for a in &seen.answers {
                assert_eq!(*a, RecordResponse::NotMember, "a stranger got an answer");
            }
            answers += seen.answers.len();
        }
        assert!(answers > 0, "the strangers' requests reached no member");
        for n in &nodes {
            let _ = n.cmd.send(Cmd::Stop).await;
        }
    });
}

/// A lease made while the namespace was small lives on the replicas of that time. A
/// newcomer whose replica set (the closest among everyone now) shares only one of them sees
/// that one refuse, naming the holder: it must lose, not win on the others' grants.
#[test]
fn a_lease_from_a_smaller_namespace_stops_a_newcomers_claim() {
    rt().block_on(async {
        let keys = NamespaceKeys::derive("lab", b"0123456789abcdef");
        let mut nodes = vec![spawn(7000, None).await];
        nodes.push(spawn(7001, Some(&nodes[0].addr.clone())).await);
        let ids: Vec<libp2p::PeerId> = (7000..7008u64)
            .map(|seed| {
                let mut s = [0u8; 32];
                s[..8].copy_from_slice(&seed.to_le_bytes());
                s[8] = 0x5a;
                network_id(Identity::from_seed(s).peer_id().as_bytes()).unwrap()
            })
            .collect();
        // A key whose replica set among all eight leaves the holder (1) out but keeps the
        // bootstrap (0), which the holder's set of two had: the newcomer is the farthest
        // member of the set that is not 0.
        let (key, newcomer) = (0..=255u8)
            .find_map(|h| {
                let key = keys.address_key(Ipv4Addr::new(10, 1, 0, h));
                let set = hyphae_overlay::quorum::replicas(&key, ids[1..].to_vec(), ids[0]);
                let newcomer = set.iter().rev().find(|p| **p != ids[0])?;
                (set.contains(&ids[0]) && !set.contains(&ids[1]))
                    .then(|| (key, ids.iter().position(|p| p == newcomer).unwrap()))
            })
            .expect("a key with such a replica set");
        let e = envelope(&keys, &nodes[1].identity, &key, 7401);
        nodes[1].cmd.send(Cmd::Claim(key, e)).await.unwrap();
        assert_eq!(nodes[1].claimed().await, ClaimResult::Won);
        for i in 2..8u64 {
            let boot = nodes[0].addr.clone();
            nodes.push(spawn(7000 + i, Some(&boot)).await);
        }
        let e = envelope(&keys, &nodes[newcomer].identity, &key, 7402);
        nodes[newcomer].cmd.send(Cmd::Claim(key, e)).await.unwrap();
        assert_eq!(
            nodes[newcomer].claimed().await,
            ClaimResult::Lost(Some(nodes[1].owner())),
            "the newcomer took an address another member holds"
        );
        for n in &nodes {
            let _ = n.cmd.send(Cmd::Stop).await;
        }
    });
}
