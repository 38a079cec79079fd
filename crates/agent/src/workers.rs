//! Data-path workers: threads that carry frames and datagrams, one per core by default
//! (`[agent] workers`), while the control thread (`run.rs`) runs the overlay, the
//! memberships, the services, the timers and the control socket.
//!
//! Each worker owns one queue of every TAP (`IFF_MULTI_QUEUE`) and one underlay socket (the
//! sockets share the port with `SO_REUSEPORT`), and waits on them with its own runtime. The
//! kernel keeps a flow on one worker in both directions:
//! - the underlay hands each datagram to a socket by a hash of its addresses and ports, so
//!   everything from one member endpoint reaches one worker, in order;
//! - that worker writes the member's packets to its own TAP queue, and tun's automatic
//!   queue selection sends a flow's frames back out on the queue its packets were last
//!   written on: the reply leaves through the same worker.
//!
//! A flow is therefore never split between workers after its first round trip, and TCP
//! inside sees no reordering. Workers spread the load across members; one member's traffic
//! is one worker's.
//!
//! The switches and tunnels are shared state: a worker reads a batch (frames from its TAP
//! queues, or datagrams from its socket) without the agent, then holds the agent (one
//! mutex) while it switches, encrypts or decrypts the whole batch, and sends and writes
//! after letting go. While it holds the agent, its [`Io`] stands in the agent's place
//! ([`Agent::io`]), so the data path in `datapath.rs` writes to the worker's queues and
//! socket. The control thread has an `Io` too, without a socket: what it sends (handshakes,
//! hellos, frames that waited for a lookup) waits in the agent's outbox until worker 0
//! sends it.

use std::io::ErrorKind;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use anyhow::{Context, Result};
use hyphae_vswitch::offload::Coalescer;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc;
use tun_rs::SyncDevice;

use crate::config::UnderlayMode;
use crate::driver::{Agent, BUF_LEN};
use crate::underlay::Underlay;

/// The agent, shared by the control thread and the workers.
pub(crate) type Shared = Arc<Mutex<Agent>>;

/// Holds the agent. A thread that panicked while holding it left nothing half-done that a
/// later batch could not repair (counters, tables): go on with it.
pub(crate) fn lock(shared: &Shared) -> MutexGuard<'_, Agent> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Frames a worker reads from a TAP queue before it takes the agent, at most.
const TAP_BATCH_FRAMES: usize = 64;

/// Bytes of TAP frames a worker reads before it takes the agent, at most: room for four
/// 64 KiB super-frames.
const TAP_BATCH_BYTES: usize = 4 * BUF_LEN;

/// One queue of a TAP.
pub(crate) type Tap = Arc<SyncDevice>;

/// Where one thread's data path sends and writes, and its buffers.
pub(crate) struct Io {
    /// The worker's socket (and AF_XDP path); `None` on the control thread.
    pub(crate) underlay: Option<Underlay>,
    /// This thread's queue of each namespace's TAP (the control thread writes through the
    /// namespace's first queue instead).
    pub(crate) taps: Vec<Option<AsyncFd<Tap>>>,
    /// What this thread writes to each TAP, coalesced (offloads on).
    pub(crate) gro: Vec<Coalescer>,
    /// Frames read from the TAPs, for the next batch: namespace and range in `rx`.
    pub(crate) frames: Vec<(usize, Range<usize>)>,
    pub(crate) rx: Vec<u8>,
    pub(crate) tx: Vec<u8>,
    pub(crate) reply: Vec<u8>,
    /// Where a packet too large for the tunnel is cut into fragments, one at a time.
    pub(crate) fragment: Vec<u8>,
    /// Where a super-frame from a TAP is cut into segments, one at a time.
    pub(crate) segment: Vec<u8>,
    /// Counts to add to the namespaces' when this thread next holds the agent.
    pending: Vec<Pending>,
    /// Each coalescer's merged frames already added.
    merged_seen: Vec<u64>,
    pub(crate) counters: Arc<WorkerCounters>,
}

/// Per-namespace counts a worker gathered without the agent.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Pending {
    pub(crate) coalesced_writes: u64,
    pub(crate) coalesced_frames: u64,
    pub(crate) tap_errors: u64,
}

impl Io {
    /// A worker's, with its underlay; the control thread's, without.
    pub(crate) fn new(underlay: Option<Underlay>) -> Self {
        let rx_len = if underlay.is_some() {
            TAP_BATCH_BYTES
        } else {
            BUF_LEN
        };
        Self {
            underlay,
            taps: Vec::new(),
            gro: Vec::new(),
            frames: Vec::new(),
            rx: vec![0; rx_len],
            tx: vec![0; BUF_LEN],
            reply: vec![0; hyphae_vswitch::MIN_REPLY_BUF],
            fragment: vec![0; BUF_LEN],
            segment: vec![0; BUF_LEN],
            pending: Vec::new(),
            merged_seen: Vec::new(),
            counters: Arc::default(),
        }
    }

    /// Makes room for namespace `i`.
    fn grow(&mut self, i: usize) {
        if self.taps.len() <= i {
            self.taps.resize_with(i + 1, || None);
            self.gro.resize_with(i + 1, Coalescer::new);
            self.pending.resize_with(i + 1, Pending::default);
            self.merged_seen.resize(i + 1, 0);
        }
    }

    /// Namespace `i`'s counts since the last call.
    pub(crate) fn take_pending(&mut self, i: usize) -> Pending {
        let Some(pending) = self.pending.get_mut(i) else {
            return Pending::default();
        };
        let mut p = std::mem::take(pending);
        let merged = self.gro[i].merged();
        p.coalesced_frames = merged - self.merged_seen[i];
        self.merged_seen[i] = merged;
        p
    }

    /// Sets up namespace `i` on this worker: its queue and its coalescer.
    fn add_namespace(&mut self, i: usize, queue: AsyncFd<Tap>, udp: bool) {
        self.grow(i);
        self.taps[i] = Some(queue);
        self.gro[i] = Coalescer::new().with_udp(udp);
        self.merged_seen[i] = 0;
    }

    /// Writes the super-frames being coalesced, each with one write.
    pub(crate) fn flush_coalesced(&mut self) {
        for i in 0..self.gro.len() {
            self.flush_coalesced_one(i, None);
        }
    }

    /// Writes namespace `i`'s super-frame being coalesced, if any, to this thread's queue
    /// (or to `first`, the namespace's first queue, on the control thread).
    pub(crate) fn flush_coalesced_one(&mut self, i: usize, first: Option<&Tap>) {
        let Some(bytes) = self.gro.get_mut(i).and_then(Coalescer::poll_frame) else {
            return;
        };
        let tap = self
            .taps
            .get(i)
            .and_then(Option::as_ref)
            .map(AsyncFd::get_ref);
        let sent = tap.or(first).is_some_and(|t| t.send(bytes).is_ok());
        let pending = &mut self.pending[i];
        if sent {
            pending.coalesced_writes += 1;
            self.counters.frames_out.fetch_add(1, Ordering::Relaxed);
        } else {
            pending.tap_errors += 1;
        }
    }

    /// Sends what the underlay holds and writes what the coalescers hold; then tells
    /// `hyphae status` what the underlay did.
    async fn flush(&mut self) {
        if let Some(u) = &mut self.underlay {
            u.flush().await;
        }
        self.flush_coalesced();
        if let Some(u) = &self.underlay {
            let c = &self.counters;
            c.send_errors.store(u.send_errors(), Ordering::Relaxed);
            u.fill_status(
                &mut c
                    .underlay
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
        }
    }

    /// Reads frames from TAP `i` into the batch until it would wait or the batch is full;
    /// whether it read any.
    fn read_tap(&mut self, i: usize) -> bool {
        let start = self.frames.len();
        let mut at = self.frames.last().map_or(0, |(_, r)| r.end);
        while self.frames.len() < TAP_BATCH_FRAMES && self.rx.len() - at >= BUF_LEN {
            let Some(tap) = self.taps.get(i).and_then(Option::as_ref) else {
                break;
            };
            let buf = &mut self.rx[at..];
            // try_io clears the readiness only when the device reports WouldBlock.
            let n = match tap.try_io(Interest::READABLE, |t| t.recv(buf)) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::debug!(error = %e, "TAP read error");
                    break;
                }
            };
            self.frames.push((i, at..at + n));
            at += n;
        }
        let read = self.frames.len() - start;
        self.counters
            .frames_in
            .fetch_add(read as u64, Ordering::Relaxed);
        read > 0
    }
}

/// What one worker did (`hyphae status`, `workers`).
#[derive(Debug, Default)]
pub(crate) struct WorkerCounters {
    /// Reads from its TAP queues (a super-frame is one).
    pub(crate) frames_in: AtomicU64,
    /// Writes to its TAP queues (a coalesced super-frame is one).
    pub(crate) frames_out: AtomicU64,
    /// Datagrams it received from its socket.
    pub(crate) datagrams_in: AtomicU64,
    /// Times it held the agent for a batch.
    pub(crate) batches: AtomicU64,
    /// Sends that failed on its underlay.
    pub(crate) send_errors: AtomicU64,
    /// Its underlay's path and counters, as of its last send.
    pub(crate) underlay: Mutex<crate::control::UnderlayStatus>,
}

/// What the control thread asks of a worker.
pub(crate) enum Command {
    /// Namespace `ns` is up: the worker's queue of its TAP, and whether UDP is coalesced.
    Tap { ns: usize, queue: Tap, udp: bool },
    /// Namespace `ns` was left: close the queue.
    Leave(usize),
    /// The outbox holds datagrams (worker 0 sends them).
    Send,
}

/// The control thread's end of one worker.
pub(crate) struct WorkerLink {
    pub(crate) commands: mpsc::UnboundedSender<Command>,
    pub(crate) counters: Arc<WorkerCounters>,
}

/// A worker not started yet: its socket and its end of the command channel.
pub(crate) struct Unstarted {
    socket: std::net::UdpSocket,
    commands: mpsc::UnboundedReceiver<Command>,
    counters: Arc<WorkerCounters>,
}

/// The links to one worker per socket, and the workers to start (`spawn`).
pub(crate) fn links(sockets: Vec<std::net::UdpSocket>) -> (Vec<WorkerLink>, Vec<Unstarted>) {
    sockets
        .into_iter()
        .map(|socket| {
            let (tx, rx) = mpsc::unbounded_channel();
            let counters = Arc::<WorkerCounters>::default();
            (
                WorkerLink {
                    commands: tx,
                    counters: counters.clone(),
                },
                Unstarted {
                    socket,
                    commands: rx,
                    counters,
                },
            )
        })
        .unzip()
}

/// Starts the workers, each on a thread with its own runtime; returns once each has its
/// underlay (or the first error). A worker stops when its command channel closes.
pub(crate) fn spawn(
    shared: &Shared,
    workers: Vec<Unstarted>,
    mode: UnderlayMode,
) -> Result<Vec<std::thread::JoinHandle<()>>> {
    let mut threads = Vec::new();
    for (index, w) in workers.into_iter().enumerate() {
        let shared = shared.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
        let thread = std::thread::Builder::new()
            .name(format!("hyphae-worker-{index}"))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(anyhow::anyhow!("worker runtime: {e}")));
                        return;
                    }
                };
                runtime.block_on(async move {
                    // Registered with this thread's runtime, so it is made here.
                    let underlay = match Underlay::new(w.socket, mode) {
                        Ok(u) => u,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    underlay.fill_status(
                        &mut w
                            .counters
                            .underlay
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner),
                    );
                    let mut io = Io::new(Some(underlay));
                    io.counters = w.counters;
                    let _ = ready_tx.send(Ok(()));
                    let worker = Worker {
                        shared,
                        io,
                        commands: w.commands,
                    };
                    worker.run().await;
                });
            })
            .context("starting a worker thread")?;
        ready_rx
            .recv()
            .context("a worker thread ended while starting")??;
        threads.push(thread);
    }
    Ok(threads)
}

/// What woke a worker.
enum Wake {
    Command(Option<Command>),
    Underlay(std::io::Result<()>),
    Tap(usize),
    Timer,
}

struct Worker {
    shared: Shared,
    io: Io,
    commands: mpsc::UnboundedReceiver<Command>,
}

impl Worker {
    async fn run(mut self) {
        loop {
            let Some(underlay) = self.io.underlay.as_ref() else {
                return;
            };
            let timer = underlay.poll_timeout();
            let wake = tokio::select! {
                command = self.commands.recv() => Wake::Command(command),
                ready = underlay.readable() => Wake::Underlay(ready),
                i = crate::datapath::any_readable(&self.io.taps) => Wake::Tap(i),
                () = crate::run::sleep_until(timer) => Wake::Timer,
            };
            match wake {
                Wake::Command(None) => return,
                Wake::Command(Some(command)) => self.command(command).await,
                Wake::Underlay(Ok(())) => self.carry_datagrams().await,
                Wake::Underlay(Err(e)) => {
                    // The flows hashed to this worker would go nowhere: the agent stops.
                    let mut agent = lock(&self.shared);
                    agent.fatal = Some(format!("the underlay socket failed: {e}"));
                    agent.poke.notify_one();
                    return;
                }
                Wake::Tap(i) => self.carry_frames(i).await,
                Wake::Timer => {
                    if let Some(u) = self.io.underlay.as_mut() {
                        u.handle_timeout(Instant::now());
                    }
                }
            }
        }
    }

    async fn command(&mut self, command: Command) {
        match command {
            Command::Tap { ns, queue, udp } => {
                // Registered with this worker's runtime, where it is waited on.
                // SAFETY: the queue's fd stays open while the AsyncFd holds the queue.
                match unsafe { AsyncFd::register(queue) } {
                    Ok(fd) => self.io.add_namespace(ns, fd, udp),
                    Err(e) => tracing::error!(error = %e, "worker: cannot register a TAP queue"),
                }
            }
            Command::Leave(ns) => {
                if let Some(tap) = self.io.taps.get_mut(ns) {
                    *tap = None;
                }
            }
            Command::Send => {
                enter(&self.shared, &mut self.io).send_outbox().await;
                self.io.flush().await;
            }
        }
    }

    /// Datagrams from the socket: one batch read without the agent, handled with it.
    async fn carry_datagrams(&mut self) {
        let Some(underlay) = self.io.underlay.as_mut() else {
            return;
        };
        match underlay.try_recv() {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::debug!(error = %e, "underlay receive error");
                return;
            }
        }
        let count = underlay.datagrams().count();
        self.io
            .counters
            .datagrams_in
            .fetch_add(count as u64, Ordering::Relaxed);
        let now = Instant::now();
        let mut agent = enter(&self.shared, &mut self.io);
        agent.receive_datagrams(now).await;
        agent.after_batch(now, true).await;
        drop(agent);
        self.io.flush().await;
    }

    /// Frames from TAP `i`: one batch read without the agent, switched with it.
    async fn carry_frames(&mut self, i: usize) {
        self.io.frames.clear();
        if !self.io.read_tap(i) {
            return;
        }
        let now = Instant::now();
        let mut agent = enter(&self.shared, &mut self.io);
        agent.switch_frames(now).await;
        agent.after_batch(now, false).await;
        drop(agent);
        self.io.flush().await;
    }
}

/// The agent held by a worker, with the worker's [`Io`] in the agent's place until it is
/// let go.
///
/// A worker holds it across awaits: its socket's, when a full batch must wait for room to
/// send. Each thread waits on its own runtime, and room in a socket buffer depends on no
/// other thread, so the others only wait for the kernel to drain it.
struct Entered<'a> {
    agent: MutexGuard<'a, Agent>,
    io: &'a mut Io,
}

/// Holds the agent for one batch of worker `io`'s: swaps `io` in and adds up the counts it
/// gathered since the last batch.
fn enter<'a>(shared: &'a Shared, io: &'a mut Io) -> Entered<'a> {
    let mut agent = lock(shared);
    std::mem::swap(&mut agent.io, io);
    agent.fold_counts();
    agent.io.counters.batches.fetch_add(1, Ordering::Relaxed);
    Entered { agent, io }
}

impl std::ops::Deref for Entered<'_> {
    type Target = Agent;
    fn deref(&self) -> &Agent {
        &self.agent
    }
}

impl std::ops::DerefMut for Entered<'_> {
    fn deref_mut(&mut self) -> &mut Agent {
        &mut self.agent
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        std::mem::swap(&mut self.agent.io, self.io);
    }
}
