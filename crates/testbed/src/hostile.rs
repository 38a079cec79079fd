//! A hostile stranger on an agent's libp2p port, without the namespace secret (issue 13,
//! `crates/agent/tests/hostile.rs`). Inside a host's namespace it holds plain TCP
//! connections open on the port, runs Sybil identities that serve Kademlia honestly and
//! answer every record request with "held" (every challenge with a made-up proof), and
//! sends self-signed claims under the namespace's public tag, sealed without the secret.
//! It runs on its own thread until dropped.
//!
//! A [`Crowd`] is the milder stranger of `benches/isolation.sh`: many identities, one
//! connection each to one agent, each doing a Kademlia query now and then.

use std::collections::HashMap;
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use futures::{future, FutureExt, StreamExt};
use hyphae_overlay::proof::{ProofRequest, ProofResponse, PROOF_PROTOCOL};
use hyphae_overlay::records::{Envelope, RecordRequest, RecordResponse, ScopedRequest};
use hyphae_overlay::swarm::{unix_now, KAD_PROTOCOL, RECORDS_PROTOCOL};
use hyphae_overlay::{Identity, NamespaceKeys, TAG_LEN};
use libp2p::core::transport::{
    DialOpts as TransportDialOpts, ListenerId, TransportError, TransportEvent,
};
use libp2p::core::Transport;
use libp2p::multiaddr::Protocol;
use libp2p::request_response::{self, Message, ProtocolSupport};
use libp2p::swarm::dial_opts::DialOpts;
use libp2p::swarm::SwarmEvent;
use libp2p::{identify, kad, noise, tcp, yamux, Multiaddr, StreamProtocol, Swarm};

/// A stranger's protocols: Kademlia served honestly, records and proofs answered with lies.
#[derive(libp2p::swarm::NetworkBehaviour)]
pub(crate) struct Hostile {
    kad: kad::Behaviour<kad::store::MemoryStore>,
    identify: identify::Behaviour,
    pub(crate) records: request_response::json::Behaviour<ScopedRequest, RecordResponse>,
    pub(crate) proofs: request_response::json::Behaviour<ProofRequest, ProofResponse>,
}

/// A stranger's behaviour for `key`: Kademlia as a server, identify, records and proofs.
fn behaviour(key: &libp2p::identity::Keypair) -> Hostile {
    let rr = |name: &'static str| {
        (
            [(StreamProtocol::new(name), ProtocolSupport::Full)],
            request_response::Config::default().with_request_timeout(Duration::from_secs(60)),
        )
    };
    let peer = key.public().to_peer_id();
    let cfg = kad::Config::new(StreamProtocol::new(KAD_PROTOCOL));
    let mut kad = kad::Behaviour::with_config(peer, kad::store::MemoryStore::new(peer), cfg);
    kad.set_mode(Some(kad::Mode::Server));
    let (p, c) = rr(RECORDS_PROTOCOL);
    let records = request_response::json::Behaviour::new(p, c);
    let (p, c) = rr(PROOF_PROTOCOL);
    let proofs = request_response::json::Behaviour::new(p, c);
    Hostile {
        kad,
        identify: identify::Behaviour::new(identify::Config::new("/hyphae/1".into(), key.public())),
        records,
        proofs,
    }
}

pub(crate) fn swarm(seed: [u8; 32]) -> Result<Swarm<Hostile>> {
    let key = libp2p::identity::Keypair::ed25519_from_bytes(seed)?;
    Ok(libp2p::SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_tcp(
            tcp::Config::default(),
            noise::Config::new,
            yamux::Config::default,
        )?
        .with_behaviour(behaviour)?
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(3600)))
        .build())
}

/// The lie a Sybil tells to every record request.
fn lie(request: &RecordRequest) -> RecordResponse {
    match request {
        RecordRequest::Claim { .. }
        | RecordRequest::ClaimAmong { .. }
        | RecordRequest::Join { .. }
        | RecordRequest::Transfer { .. } => RecordResponse::Held {
            owner: vec![0x66; 32],
            remaining_ms: 3_600_000,
        },
        RecordRequest::Get { .. } => RecordResponse::Value { envelope: None },
        RecordRequest::Members { .. } => RecordResponse::Members { envelopes: vec![] },
        RecordRequest::Release { .. } => RecordResponse::Released,
    }
}

/// Handles one event of a Sybil: joins the DHT through whoever it connects to, lies.
fn sybil_event(
    swarm: &mut Swarm<Hostile>,
    event: SwarmEvent<HostileEvent>,
    bootstrapped: &mut bool,
) {
    match event {
        SwarmEvent::ConnectionEstablished {
            peer_id, endpoint, ..
        } if !*bootstrapped => {
            let addr = endpoint.get_remote_address().clone();
            swarm.behaviour_mut().kad.add_address(&peer_id, addr);
            let _ = swarm.behaviour_mut().kad.bootstrap();
            *bootstrapped = true;
        }
        SwarmEvent::Behaviour(HostileEvent::Records(request_response::Event::Message {
            message: Message::Request {
                request, channel, ..
            },
            ..
        })) => {
            let answer = lie(&request.request);
            let _ = swarm.behaviour_mut().records.send_response(channel, answer);
        }
        SwarmEvent::Behaviour(HostileEvent::Proofs(request_response::Event::Message {
            message: Message::Request {
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

/// A Sybil identity: listens on the same host, dials `target`, lies forever.
async fn run_sybil(seed: [u8; 32], target: Multiaddr) -> Result<()> {
    let mut swarm = swarm(seed)?;
    swarm.listen_on("/ip4/0.0.0.0/tcp/0".parse()?)?;
    let mut bootstrapped = false;
    let mut redial = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = redial.tick() => {
                if swarm.connected_peers().next().is_none() {
                    let _ = swarm.dial(target.clone());
                }
            }
            event = swarm.select_next_some() => sybil_event(&mut swarm, event, &mut bootstrapped),
        }
    }
}

/// Sends `total` claims self-signed by a fresh stranger key (sealed without the secret,
/// under the public `tag`), 64 in flight; prints the tally of answers. Keeps lying after.
async fn run_claims(
    tag: [u8; TAG_LEN],
    target: Multiaddr,
    total: u32,
    report: Arc<Mutex<Report>>,
) -> Result<()> {
    let identity = Identity::from_seed([0x99; 32]);
    let mut swarm = swarm(identity.seed())?;
    swarm.dial(target)?;
    let peer = loop {
        if let SwarmEvent::ConnectionEstablished { peer_id, .. } = swarm.select_next_some().await {
            break peer_id;
        }
    };
    let wrong = NamespaceKeys::derive("lab", b"not the namespace secret");
    let mut seed = [0u8; 32];
    getrandom::getrandom(&mut seed).map_err(|e| anyhow!("random number generator: {e}"))?;
    let mut rng: rand::rngs::StdRng = rand::SeedableRng::from_seed(seed);
    let (mut sent, mut answered) = (0u32, 0u32);
    let mut bootstrapped = true;
    while answered < total {
        while sent < total && sent - answered < 64 {
            let mut key = [0u8; 32];
            key[..4].copy_from_slice(&sent.to_be_bytes());
            let envelope =
                Envelope::seal(&wrong, &identity, &key, unix_now() + 3600, b"{}", &mut rng)
                    .map_err(|e| anyhow!("{e}"))?;
            let request = RecordRequest::Claim {
                key: key.to_vec(),
                envelope,
            };
            swarm
                .behaviour_mut()
                .records
                .send_request(&peer, ScopedRequest { ns: tag, request });
            sent += 1;
        }
        match swarm.select_next_some().await {
            SwarmEvent::Behaviour(HostileEvent::Records(request_response::Event::Message {
                message: Message::Response { response, .. },
                ..
            })) => {
                answered += 1;
                report
                    .lock()
                    .map_err(|_| anyhow!("report poisoned"))?
                    .count(format!("{response:?}"));
            }
            SwarmEvent::Behaviour(HostileEvent::Records(
                request_response::Event::OutboundFailure { error, .. },
            )) => {
                answered += 1;
                report
                    .lock()
                    .map_err(|_| anyhow!("report poisoned"))?
                    .count(format!("failed: {error}"));
            }
            other => sybil_event(&mut swarm, other, &mut bootstrapped),
        }
    }
    loop {
        let event = swarm.select_next_some().await;
        sybil_event(&mut swarm, event, &mut bootstrapped);
    }
}

/// The TCP address of a `/ip4/../tcp/..` multiaddr.
fn socket_addr(addr: &Multiaddr) -> Result<SocketAddr> {
    let (mut ip, mut port) = (None, None);
    for p in addr.iter() {
        match p {
            Protocol::Ip4(a) => ip = Some(a),
            Protocol::Tcp(p) => port = Some(p),
            _ => {}
        }
    }
    Ok(SocketAddr::from((
        ip.context("no ip4 in the address")?,
        port.context("no tcp port in the address")?,
    )))
}

/// What the stranger did so far.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Plain TCP connections it holds open on the target port.
    pub connections_held: u32,
    /// Sybil identities started.
    pub sybils: u8,
    /// The answers to its claims, by kind (`NotMember`, `failed: ...`).
    pub claim_answers: HashMap<String, u64>,
    /// Why it stopped early, if it did.
    pub error: Option<String>,
}

impl Report {
    fn count(&mut self, answer: String) {
        *self.claim_answers.entry(answer).or_default() += 1;
    }

    /// How many claims were answered (or failed) so far.
    pub fn claims_answered(&self) -> u64 {
        self.claim_answers.values().sum()
    }
}

/// What to do to whom.
#[derive(Debug, Clone)]
pub struct Attack {
    /// An agent's libp2p address, `/ip4/A/tcp/P`.
    pub target: Multiaddr,
    /// The namespace's tag (public: it appears on the wire).
    pub tag: [u8; TAG_LEN],
    /// Sybil identities that join the DHT and lie.
    pub sybils: u8,
    /// Self-signed claims sent to the target.
    pub claims: u32,
    /// Plain TCP connections held open on the target port.
    pub connections: u32,
}

/// A running stranger; dropping it stops it (and closes its connections).
pub struct Stranger {
    report: Arc<Mutex<Report>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Stranger {
    /// Starts `attack` from inside network namespace `ns` (a testbed host's).
    pub fn start(ns: &str, attack: Attack) -> Result<Self> {
        let netns = File::open(format!("/run/netns/{ns}"))
            .with_context(|| format!("no network namespace {ns}"))?;
        let report = Arc::new(Mutex::new(Report::default()));
        let (stop, stop_rx) = tokio::sync::oneshot::channel();
        let thread_report = report.clone();
        let thread = std::thread::spawn(move || {
            let result = run(&netns, attack, thread_report.clone(), stop_rx);
            if let (Err(e), Ok(mut r)) = (result, thread_report.lock()) {
                r.error = Some(format!("{e:#}"));
            }
        });
        Ok(Self {
            report,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// A copy of what it did so far.
    pub fn report(&self) -> Report {
        self.report.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for Stranger {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock(report: &Mutex<Report>) -> Result<std::sync::MutexGuard<'_, Report>> {
    report.lock().map_err(|_| anyhow!("report poisoned"))
}

/// The stranger's thread: enters `netns` (network namespaces are per thread), then attacks
/// until `stop`.
fn run(
    netns: &File,
    attack: Attack,
    report: Arc<Mutex<Report>>,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> Result<()> {
    // SAFETY: setns on a namespace file we opened, for this thread only.
    if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns: {}", std::io::Error::last_os_error());
    }
    let socket = socket_addr(&attack.target)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        for i in 0..attack.sybils {
            let target = attack.target.clone();
            tokio::spawn(run_sybil([0x50 + i; 32], target));
        }
        lock(&report)?.sybils = attack.sybils;
        let claims = tokio::spawn(run_claims(
            attack.tag,
            attack.target,
            attack.claims,
            report.clone(),
        ));
        // The libp2p peers dial first; then the plain connections pile up.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let mut held = Vec::new();
        for _ in 0..attack.connections {
            let connect = tokio::net::TcpStream::connect(socket);
            if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(2), connect).await {
                held.push(s);
            }
        }
        lock(&report)?.connections_held = u32::try_from(held.len()).unwrap_or(u32::MAX);
        tokio::select! {
            _ = stop => Ok(()),
            r = claims => r.map_err(|e| anyhow!("{e}"))?,
        }
    })
}

/// TCP that dials one address from one source address and listens nowhere: a crowd
/// member reaches its target and nobody else, whatever its Kademlia queries learn.
struct Leash {
    source: Ipv4Addr,
    target: SocketAddr,
}

impl Transport for Leash {
    type Output = libp2p::tcp::tokio::TcpStream;
    type Error = std::io::Error;
    type ListenerUpgrade = future::Pending<Result<Self::Output, Self::Error>>;
    type Dial = future::BoxFuture<'static, Result<Self::Output, Self::Error>>;

    fn listen_on(
        &mut self,
        _: ListenerId,
        addr: Multiaddr,
    ) -> Result<(), TransportError<Self::Error>> {
        Err(TransportError::MultiaddrNotSupported(addr))
    }

    fn remove_listener(&mut self, _: ListenerId) -> bool {
        false
    }

    fn dial(
        &mut self,
        addr: Multiaddr,
        _: TransportDialOpts,
    ) -> Result<Self::Dial, TransportError<Self::Error>> {
        if socket_addr(&addr).ok() != Some(self.target) {
            return Err(TransportError::MultiaddrNotSupported(addr));
        }
        let (source, target) = (self.source, self.target);
        Ok(async move {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(SocketAddr::from((source, 0)))?;
            let stream = socket.connect(target).await?;
            stream.set_nodelay(true)?;
            Ok(libp2p::tcp::tokio::TcpStream(stream))
        }
        .boxed())
    }

    fn poll(
        self: Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> Poll<TransportEvent<Self::ListenerUpgrade, Self::Error>> {
        Poll::Pending
    }
}

/// Many strangers connected at once, each doing a Kademlia query now and then: control-plane
/// load on an agent (`benches/isolation.sh`, through the `hyphae-stranger` binary).
#[derive(Debug, Clone)]
pub struct Crowd {
    /// The agent's libp2p address: the only address any member of the crowd dials.
    pub target: SocketAddr,
    /// Local addresses the connections come from, taken in turn (an agent admits few
    /// connections per source address).
    pub sources: Vec<Ipv4Addr>,
    /// Identities, one connection each.
    pub identities: u32,
    /// How often each identity starts a Kademlia query (a lookup of a random peer id) on
    /// its connection; the first comes at a random moment within the first period.
    pub query_every: Duration,
}

/// Runs `crowd` from the calling thread's network namespace until the future is dropped,
/// keeping `up` at the number of identities connected to the target (each redials when its
/// connection closes). Identities start 10 ms apart, under an agent's limit on handshakes
/// in progress.
pub async fn run_crowd(crowd: Crowd, up: Arc<AtomicU32>) -> Result<()> {
    if crowd.sources.is_empty() {
        bail!("no source address");
    }
    let mut members = tokio::task::JoinSet::new();
    for i in 0..crowd.identities {
        let mut seed = [0u8; 32];
        getrandom::getrandom(&mut seed).map_err(|e| anyhow!("random number generator: {e}"))?;
        let source = crowd.sources[usize::try_from(i)? % crowd.sources.len()];
        members.spawn(run_crowd_member(
            seed,
            source,
            crowd.target,
            crowd.query_every,
            up.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match members.join_next().await {
        Some(r) => r.map_err(|e| anyhow!("{e}"))?,
        None => Ok(()),
    }
}

/// A random duration under `period`.
fn jitter(period: Duration) -> Result<Duration> {
    let mut bytes = [0u8; 8];
    getrandom::getrandom(&mut bytes).map_err(|e| anyhow!("random number generator: {e}"))?;
    let millis = u64::try_from(period.as_millis()).unwrap_or(u64::MAX).max(1);
    Ok(Duration::from_millis(u64::from_le_bytes(bytes) % millis))
}

/// One identity of a crowd: one connection to `target` from `source`, kept up; a Kademlia
/// query every `every`; challenges and record requests answered as a Sybil does.
async fn run_crowd_member(
    seed: [u8; 32],
    source: Ipv4Addr,
    target: SocketAddr,
    every: Duration,
    up: Arc<AtomicU32>,
) -> Result<()> {
    let key = libp2p::identity::Keypair::ed25519_from_bytes(seed)?;
    let noise = noise::Config::new(&key)?;
    let mut swarm = libp2p::SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_other_transport(|_| {
            Leash { source, target }
                .upgrade(libp2p::core::upgrade::Version::V1)
                .authenticate(noise)
                .multiplex(yamux::Config::default())
        })?
        .with_behaviour(behaviour)?
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(3600)))
        .build();
    let addr = Multiaddr::empty()
        .with(Protocol::from(target.ip()))
        .with(Protocol::Tcp(target.port()));
    let mut bootstrapped = false;
    let (mut connected, mut dialing) = (false, None);
    let mut redial = tokio::time::interval(Duration::from_secs(2));
    let mut query = tokio::time::interval_at(tokio::time::Instant::now() + jitter(every)?, every);
    loop {
        tokio::select! {
            _ = redial.tick(), if !connected && dialing.is_none() => {
                let opts = DialOpts::unknown_peer_id().address(addr.clone()).build();
                let id = opts.connection_id();
                if swarm.dial(opts).is_ok() {
                    dialing = Some(id);
                }
            }
            _ = query.tick(), if connected => {
                swarm.behaviour_mut().kad.get_closest_peers(libp2p::PeerId::random());
            }
            event = swarm.select_next_some() => {
                match &event {
                    SwarmEvent::ConnectionEstablished { connection_id, .. }
                        if dialing == Some(*connection_id) =>
                    {
                        dialing = None;
                        if !connected {
                            connected = true;
                            up.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    SwarmEvent::OutgoingConnectionError { connection_id, .. }
                        if dialing == Some(*connection_id) =>
                    {
                        dialing = None;
                    }
                    SwarmEvent::ConnectionClosed { num_established: 0, .. } if connected => {
                        connected = false;
                        up.fetch_sub(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
                sybil_event(&mut swarm, event, &mut bootstrapped);
            }
        }
    }
}
