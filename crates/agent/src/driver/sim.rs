//! The driver, deterministic: whole agents (the control plane as the control thread runs
//! it, the data plane as a worker runs its batches) on one virtual clock, with sockets,
//! TAPs and the DHT in memory. Firezone's connlib tests are the model: real state
//! machines, a simulated world, time that moves only when nothing is left to do.
//!
//! - **Control thread**: each turn is the loop's own (`run.rs`): the overlay's answer if one
//!   is due, then [`Control::end_turn`], with the clock the simulation gives it.
//! - **Workers**: frames from a host and datagrams from members go through the data plane's
//!   batch as a worker's do (data messages opened before the lock), and what the batch sends
//!   and writes is carried out after it.
//! - **Overlay**: the DHT operations and member messages the control plane would have given
//!   the swarm are kept (`Intercepted`) and answered by [`Dht`], one store every member
//!   reads, with the lease rule of a single replica: the first owner holds a key until it
//!   releases or transfers it. What this leaves out (replica majorities, lookups, proofs of
//!   membership) has its own tests in the overlay crate.
//! - **Wall clock**: records and certificates carry Unix times; the agents and the DHT read
//!   them from the virtual clock too (`Host::wall`), so leases lapse as virtual time goes.
//! - **Not virtual**: boringtun reads its own clock for its rekey timers, so a session's age
//!   never reaches 120 s here. A rekey is what a member's restart forces: a fresh handshake
//!   on a tunnel the other side keeps.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyphae_overlay::membership::Request;
use hyphae_overlay::records::{Envelope, OwnerKey, RecordKey};
use hyphae_overlay::swarm::{ClaimResult, NetworkId, OpId, OverlayEvent};
use hyphae_overlay::{Identity, TAG_LEN};
use tokio::sync::mpsc;

use super::data::Batch;
use super::host::{Device, Host, Memory};
use super::workers::{lock, Outgoing};
use super::Control;
use crate::config::Config;
use crate::underlay::Datagram;

/// A namespace's tag: what names it in the control plane.
type Tag = [u8; TAG_LEN];

/// What the control plane asked of the overlay, kept for the test to answer.
#[derive(Default)]
pub(crate) struct Intercepted {
    next_op: u64,
    /// DHT operations: the id the membership waits on (none for those nothing answers).
    pub(crate) requests: Vec<(Option<OpId>, Tag, Request)>,
    /// Messages to members: namespace, member, body.
    pub(crate) messages: Vec<(Tag, NetworkId, Vec<u8>)>,
}

impl Intercepted {
    /// Keeps `request`; the id its answer must carry, if one is awaited.
    pub(crate) fn request(&mut self, tag: Tag, request: Request) -> Option<OpId> {
        let answered = !matches!(request, Request::Release { .. } | Request::Announce { .. });
        let op = answered.then(|| {
            self.next_op += 1;
            OpId::from_raw(self.next_op)
        });
        self.requests.push((op, tag, request));
        op
    }
}

/// The DHT every simulated member reads and writes: one replica per key.
#[derive(Default)]
pub(crate) struct Dht {
    records: HashMap<RecordKey, Envelope>,
    groups: HashMap<RecordKey, Vec<Envelope>>,
    /// Transfers answered.
    pub(crate) transfers: usize,
    /// While set, operations wait here unanswered (a slow DHT).
    pub(crate) hold: bool,
    held: Vec<(usize, OwnerKey, Option<OpId>, Request)>,
}

impl Dht {
    /// The keys of the reads waiting while the DHT holds them.
    pub(crate) fn held_reads(&self) -> Vec<RecordKey> {
        self.held
            .iter()
            .filter_map(|(_, _, _, r)| match r {
                Request::Get { key } | Request::GetNear { key } => Some(*key),
                _ => None,
            })
            .collect()
    }
}

impl Dht {
    /// The holder of `key`, if it is held.
    pub(crate) fn holder(&self, key: &RecordKey, unix: u64) -> Option<OwnerKey> {
        self.records
            .get(key)
            .filter(|e| e.expires > unix)
            .and_then(Envelope::owner)
    }

    /// Carries out `request` from `requester`; the answer its op waits for.
    fn answer(
        &mut self,
        unix: u64,
        requester: OwnerKey,
        op: Option<OpId>,
        request: Request,
    ) -> Option<OverlayEvent> {
        let answer = match request {
            Request::Claim { key, envelope, .. } => {
                let result = match self.holder(&key, unix) {
                    Some(h) if Some(h) != envelope.owner() => ClaimResult::Lost(Some(h)),
                    _ => {
                        self.records.insert(key, envelope);
                        ClaimResult::Won
                    }
                };
                claimed(key, result)
            }
            Request::Transfer { key, envelope } => {
                // Only the holder moves a lease, as the replicas rule.
                self.transfers += 1;
                let result = match self.holder(&key, unix) {
                    Some(h) if h == requester => {
                        self.records.insert(key, envelope);
                        ClaimResult::Won
                    }
                    holder => ClaimResult::Lost(holder),
                };
                claimed(key, result)
            }
            Request::Get { key } | Request::GetNear { key } => {
                let envelopes = self
                    .records
                    .get(&key)
                    .filter(|e| e.expires > unix)
                    .cloned()
                    .into_iter()
                    .collect();
                Box::new(move |op| OverlayEvent::Got {
                    op,
                    key,
                    envelopes,
                    queried: 0,
                })
            }
            Request::Members { key } => {
                let envelopes = self
                    .groups
                    .get(&key)
                    .map(|g| g.iter().filter(|e| e.expires > unix).cloned().collect())
                    .unwrap_or_default();
                Box::new(move |op| OverlayEvent::Members { op, key, envelopes })
            }
            Request::Announce { key, envelope } => {
                let group = self.groups.entry(key).or_default();
                group.retain(|e| e.owner() != envelope.owner());
                group.push(envelope);
                return None;
            }
            Request::Release { key } => {
                if self.holder(&key, unix) == Some(requester) {
                    self.records.remove(&key);
                }
                if let Some(group) = self.groups.get_mut(&key) {
                    group.retain(|e| e.owner() != Some(requester));
                }
                return None;
            }
        };
        op.map(answer)
    }
}

type Answer = Box<dyn FnOnce(OpId) -> OverlayEvent>;

fn claimed(key: RecordKey, result: ClaimResult) -> Answer {
    Box::new(move |op| OverlayEvent::Claimed {
        op,
        key,
        result,
        replicas: 1,
        queried: 0,
    })
}

/// One simulated agent: its control plane, and its worker's state.
pub(crate) struct Agent {
    pub(crate) control: Control,
    pub(crate) addr: SocketAddr,
    pub(crate) id: NetworkId,
    seed: u8,
    /// How many times it was started.
    starts: u8,
    owner: OwnerKey,
    pub(crate) config: PathBuf,
    outbox: mpsc::Receiver<Outgoing>,
    worker: Batch,
    /// Overlay events waiting for the control thread, oldest first.
    events: VecDeque<OverlayEvent>,
    /// Frames the host sent into the TAP, not read yet.
    from_host: Vec<Vec<u8>>,
    /// Datagrams that reached its socket, not read yet.
    from_network: Vec<(SocketAddr, Vec<u8>)>,
    /// Frames written to the TAP (by a worker or the control thread), oldest first.
    pub(crate) to_host: Vec<Vec<u8>>,
    /// Data messages the worker opened outside the data plane.
    pub(crate) opened_outside: usize,
    /// A worker batch asked to wake the control thread.
    wake: bool,
}

/// Agents on one virtual clock, one underlay and one DHT.
pub(crate) struct Sim {
    pub(crate) now: Instant,
    pub(crate) agents: Vec<Agent>,
    pub(crate) dht: Dht,
    /// Where the virtual clock started, and the Unix time that stands for.
    epoch: (Instant, u64),
    dir: PathBuf,
    runtime: tokio::runtime::Runtime,
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Sim {
    /// An empty world, its files under a directory of its own named after `test`.
    pub(crate) fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("hyphae-sim-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a directory for the simulation");
        let secret = dir.join("secret");
        std::fs::write(&secret, "a secret of the simulation\n").expect("a secret file");
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("the secret file's mode");
        // The overlay's swarm is built inside a runtime (it is never polled here).
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        #[allow(clippy::disallowed_methods)] // where the virtual clock starts
        let now = Instant::now();
        Self {
            now,
            agents: Vec::new(),
            dht: Dht::default(),
            epoch: (now, super::unix_now()),
            dir,
            runtime,
        }
    }

    /// The Unix time of the virtual clock: what the agents' records carry.
    pub(crate) fn wall(&self) -> u64 {
        self.epoch.1 + self.now.saturating_duration_since(self.epoch.0).as_secs()
    }

    /// The secret file every agent's namespace names.
    pub(crate) fn secret(&self) -> PathBuf {
        self.dir.join("secret")
    }

    /// Starts agent `seed` (underlay 10.200.0.`seed`:7400) with the `[[namespace]]` text
    /// `namespace`; returns its index.
    pub(crate) fn add_agent(&mut self, seed: u8, namespace: &str) -> usize {
        let home = self.dir.join(format!("agent-{seed}"));
        // The state directory, as the agent's start creates it with its identity.
        std::fs::create_dir_all(home.join("state")).expect("an agent directory");
        let config = home.join("hyphae.toml");
        std::fs::write(
            &config,
            format!(
                "[agent]\nstate_dir = \"{dir}/state\"\ncontrol_socket = \"{dir}/hyphae.sock\"\nlisten = \"10.200.0.{seed}:7400\"\n\n{namespace}",
                dir = home.display(),
            ),
        )
        .expect("a config file");
        let agent = self.start(seed, 1, &config);
        self.agents.push(agent);
        self.agents.len() - 1
    }

    fn start(&mut self, seed: u8, starts: u8, path: &Path) -> Agent {
        let config = Config::load(path).expect("the simulation's config is valid");
        let addr = config.agent.listen;
        let _guard = self.runtime.enter();
        let identity = Identity::from_seed([seed; 32]);
        let owner = *identity.peer_id().as_bytes();
        let mut control = Control::start_on(
            config,
            identity,
            Vec::new(),
            Host::Memory(Memory::new(seed, starts, self.epoch)),
            "/memory/0".parse().expect("a memory address"),
            self.now,
        )
        .expect("the control plane starts");
        control.intercepted = Some(Intercepted::default());
        let (tx, outbox) = mpsc::channel(4096);
        control.outbox = tx;
        let id = control.overlay.local_id();
        let mut events = VecDeque::new();
        // No bootstrap: the overlay has joined at once (its event, as the swarm gives it).
        events.push_back(OverlayEvent::Joined);
        Agent {
            control,
            addr,
            id,
            seed,
            starts,
            owner,
            config: path.to_path_buf(),
            outbox,
            worker: Batch::default(),
            events,
            from_host: Vec::new(),
            from_network: Vec::new(),
            to_host: Vec::new(),
            opened_outside: 0,
            wake: false,
        }
    }

    /// Agent `k` stops without a word (kill -9) and starts again from its config and state
    /// directory, with the same identity and underlay address.
    pub(crate) fn restart(&mut self, k: usize) {
        let a = &self.agents[k];
        let (seed, starts, path) = (a.seed, a.starts.wrapping_add(1), a.config.clone());
        // What the old process asked of the DHT dies with it.
        self.dht.held.retain(|h| h.0 != k);
        let fresh = self.start(seed, starts, &path);
        self.agents[k] = fresh;
    }

    /// The host behind agent `k`'s TAP sends `frame`.
    pub(crate) fn host_sends(&mut self, k: usize, frame: Vec<u8>) {
        self.agents[k].from_host.push(frame);
    }

    /// Frames written to agent `k`'s TAP since the last call.
    pub(crate) fn host_receives(&mut self, k: usize) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.agents[k].to_host)
    }

    /// Agent `k`'s answer to a control request (`hyphae status` and the like), asked in a
    /// turn of its own as the control socket's calls are.
    pub(crate) fn call(&mut self, k: usize, request: crate::control::Request) -> serde_json::Value {
        let (call, mut reply) = crate::control_server::Call::new(request);
        let control = &mut self.agents[k].control;
        control.handle_call(self.now, call);
        if let Err(e) = control.end_turn(self.now) {
            panic!("agent {k} stopped: {e}");
        }
        reply.try_recv().expect("the call was answered in its turn")
    }

    /// Runs until nothing is left to do and no timer is due before `now + span`; the clock
    /// then reads `now + span`.
    pub(crate) fn run_for(&mut self, span: Duration) {
        let end = self.now + span;
        self.run_until(end, |_| false);
    }

    /// Runs until `done` holds (true) or the clock passes `end` (false).
    pub(crate) fn run_until(
        &mut self,
        end: Instant,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> bool {
        let mut busy_rounds = 0;
        loop {
            let mut busy = false;
            for k in 0..self.agents.len() {
                busy |= self.worker(k);
                busy |= self.control_turn(k);
            }
            if done(self) {
                return true;
            }
            if busy {
                busy_rounds += 1;
                assert!(
                    busy_rounds < 10_000,
                    "the agents never fall quiet at one instant"
                );
                continue;
            }
            busy_rounds = 0;
            // Quiet: time moves to the next deadline of any core.
            let next = self
                .agents
                .iter()
                .flat_map(|a| [a.control.poll_timeout(), lock(&a.control.dp).poll_timeout()])
                .flatten()
                .min();
            match next {
                Some(t) if t <= end => {
                    self.now = self.now.max(t).max(self.now + Duration::from_micros(1))
                }
                _ => {
                    self.now = self.now.max(end);
                    return done(self);
                }
            }
        }
    }

    /// Agent `k`'s worker: a batch of its host's frames, then one of its datagrams, as a
    /// worker carries them. Whether there was anything.
    fn worker(&mut self, k: usize) -> bool {
        let now = self.now;
        let a = &mut self.agents[k];
        let frames = std::mem::take(&mut a.from_host);
        let datagrams = std::mem::take(&mut a.from_network);
        if frames.is_empty() && datagrams.is_empty() {
            return false;
        }
        if !frames.is_empty() {
            let mut rx = Vec::new();
            let mut ranges = Vec::new();
            for f in &frames {
                ranges.push((0, rx.len()..rx.len() + f.len()));
                rx.extend_from_slice(f);
            }
            {
                let mut dp = lock(&a.control.dp);
                dp.handle_frames(now, &ranges, &mut rx, &mut a.worker);
                a.wake |= dp.after_batch(now, false, &mut a.worker);
            }
            self.worker_carry_out(k);
        }
        if !datagrams.is_empty() {
            let a = &mut self.agents[k];
            let list = datagrams
                .iter()
                .map(|(from, bytes)| Datagram { from: *from, bytes });
            let tunnels = lock(&a.control.dp).node.tunnels();
            a.worker.open(&tunnels, list.clone());
            a.opened_outside += a
                .worker
                .opened
                .iter()
                .filter(|(o, _)| matches!(o, hyphae_overlay::Opened::Packet { .. }))
                .count();
            {
                let mut dp = lock(&a.control.dp);
                dp.handle_datagrams(now, list, &mut a.worker);
                a.wake |= dp.after_batch(now, true, &mut a.worker);
            }
            self.worker_carry_out(k);
        }
        true
    }

    /// What agent `k`'s worker batch sends and writes, after the data plane is let go.
    fn worker_carry_out(&mut self, k: usize) {
        let a = &mut self.agents[k];
        a.worker.seal_pending(None);
        let from = a.addr;
        let mut sent = Vec::new();
        for (to, range) in &a.worker.sends {
            sent.push((*to, a.worker.datagram(range).to_vec()));
        }
        for w in &a.worker.writes {
            a.to_host.push(a.worker.frame(&w.range).to_vec());
        }
        a.worker.clear();
        for (to, bytes) in sent {
            self.deliver(from, to, bytes);
        }
    }

    /// A datagram on the underlay: to the agent at `to`, if any.
    fn deliver(&mut self, from: SocketAddr, to: SocketAddr, bytes: Vec<u8>) {
        if let Some(b) = self.agents.iter_mut().find(|b| b.addr == to) {
            b.from_network.push((from, bytes));
        }
    }

    /// One turn of agent `k`'s control thread. Whether it had or left anything to do.
    fn control_turn(&mut self, k: usize) -> bool {
        let now = self.now;
        let a = &mut self.agents[k];
        let event = a.events.pop_front();
        // Woken by the overlay, or by a worker (as `poke` does).
        let mut busy = event.is_some() || std::mem::take(&mut a.wake);
        if let Some(event) = event {
            a.control.handle_overlay(now, event);
        }
        if let Err(e) = a.control.end_turn(now) {
            panic!("agent {k} stopped: {e}");
        }
        // The overlay's part: operations answered by the DHT, messages to their member.
        let intercepted = a
            .control
            .intercepted
            .as_mut()
            .map(|i| {
                (
                    std::mem::take(&mut i.requests),
                    std::mem::take(&mut i.messages),
                )
            })
            .unwrap_or_default();
        let (from_id, owner) = (a.id, a.owner);
        busy |= !intercepted.0.is_empty() || !intercepted.1.is_empty();
        for (op, _tag, request) in intercepted.0 {
            self.dht.held.push((k, owner, op, request));
        }
        if !self.dht.hold {
            let wall = self.wall();
            for (k, owner, op, request) in std::mem::take(&mut self.dht.held) {
                if let Some(event) = self.dht.answer(wall, owner, op, request) {
                    if let Some(a) = self.agents.get_mut(k) {
                        a.events.push_back(event);
                    }
                }
            }
        }
        for (tag, to, body) in intercepted.1 {
            if let Some(b) = self.agents.iter_mut().find(|b| b.id == to) {
                b.events.push_back(OverlayEvent::MemberMessage {
                    ns: tag,
                    from: from_id,
                    body,
                });
            }
        }
        // Worker 0's outbox, and the control thread's writes to the TAP.
        let a = &mut self.agents[k];
        let mut sent = Vec::new();
        while let Ok(out) = a.outbox.try_recv() {
            sent.push(out);
        }
        for n in &mut a.control.namespaces {
            if let Some(Device::Memory(frames)) = n.tap.as_mut() {
                busy |= !frames.is_empty();
                a.to_host.append(frames);
            }
        }
        let from = a.addr;
        busy |= !sent.is_empty();
        for (to, bytes) in sent {
            self.deliver(from, to, bytes);
        }
        busy || !self.agents[k].events.is_empty()
    }
}
