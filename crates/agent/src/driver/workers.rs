//! Data-path workers: threads that carry frames and datagrams, one per core by default
//! (`[agent] workers`), while the control thread (`run.rs`) runs the overlay, the
//! memberships, the services and the control socket.
//!
//! Each worker owns one queue of every TAP (`IFF_MULTI_QUEUE`) and one underlay socket (the
//! sockets share the port with `SO_REUSEPORT`), and waits on them with its own runtime. A
//! flow stays on one worker in both directions:
//! - each tunnel has a WireGuard session per worker (its shards, `hyphae_overlay`'s
//!   `node/shared.rs`); a flow is sealed on the shard a hash of its addresses and ports
//!   picks (the same both ways), and a program on the socket group
//!   (`setup::steer_by_shard`) hands shard `k`'s datagrams to worker `k`; everything else
//!   goes by the kernel's hash of addresses and ports;
//! - that worker writes the member's packets to its own TAP queue, and a steering program
//!   on the TAP (`setup::steer_tap`) hands the kernel's frames of a flow to queue `k` of
//!   its shard `k`: the flow leaves through the same worker, sealed on the same shard, from
//!   its first frame, in either direction, one-way flows included.
//!
//! Different flows of one member thus use every worker at both ends.
//!
//! One turn of a worker:
//! 1. it reads a batch without any lock (frames from one TAP queue, or one `recvmmsg`/GRO
//!    batch from its socket), and opens the batch's data messages holding only each one's
//!    tunnel shard (the AEAD);
//! 2. it holds the [`DataPlane`] while the batch is checked and switched: no system call,
//!    no await, no AEAD, no allocation once its buffers have grown; what to send and write
//!    goes into its [`Batch`], what the control thread must hear into the data plane's
//!    inbox;
//! 3. it lets go, seals what it sends (holding only each one's shard), then sends, writes
//!    (coalescing a member's frames per flow) and wakes the control thread if the batch
//!    left it work.
//!
//! Worker 0 also sends what the control thread sends (handshakes, hellos, frames that
//! waited for a lookup): the control thread has no socket, only the bounded outbox.
//!
//! A worker that stops for any reason but the agent's stop (a failed socket, a panic) stops
//! the agent: the flows the kernel hashes to it would go nowhere.

use std::io::ErrorKind;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use anyhow::{Context, Result};
use hyphae_overlay::Tunnels;
use hyphae_vswitch::offload::{Coalescer, Offer, VirtioHeader, VIRTIO_HEADER_LEN};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{mpsc, Notify};
use tun_rs::SyncDevice;

use super::data::{Batch, DataPlane, BUF_LEN};
use super::datapath::Pending;
use crate::config::{UnderlayMode, WorkerPriority, REALTIME_PRIORITY};
use crate::underlay::Underlay;

/// The data plane, shared by the workers and the control thread.
pub(crate) type Shared = Arc<Mutex<DataPlane>>;

/// Holds the data plane. A thread that panicked while holding it left nothing half-done
/// that a later batch could not repair (counters, tables); the panic itself stops the agent.
pub(crate) fn lock(shared: &Shared) -> MutexGuard<'_, DataPlane> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Frames a worker reads from a TAP queue before it takes the data plane, at most.
const TAP_BATCH_FRAMES: usize = 64;

/// Bytes of TAP frames a worker reads before it takes the data plane, at most: room for
/// four 64 KiB super-frames.
const TAP_BATCH_BYTES: usize = 4 * BUF_LEN;

/// Datagrams the control thread may have waiting for worker 0 to send: a burst of a hello
/// and a handshake to every tunnel the node may hold (`MAX_PEERS`, 4096), and the frames
/// that waited for a lookup. Past that they are dropped and counted (`drops.outbox`):
/// handshakes are retried, held frames were retransmitted by their senders anyway.
pub(crate) const OUTBOX_LEN: usize = 2 * hyphae_overlay::node::MAX_PEERS;

/// Commands a worker may have waiting beyond the namespaces configured at start (each sends
/// one before the workers run): namespaces joined and left while running.
const COMMANDS_LEN: usize = 64;

/// One queue of a TAP.
pub(crate) type Tap = Arc<SyncDevice>;

/// A datagram the control thread sends through worker 0.
pub(crate) type Outgoing = (std::net::SocketAddr, Vec<u8>);

/// Upper bounds of the lock-wait histogram's buckets, in microseconds; one more bucket
/// counts the waits above the last. Fine below 50 µs, where the goal is.
pub(crate) const LOCK_WAIT_BOUNDS_US: [u64; 11] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000];

/// How long one worker waited to take the data plane, per batch: a histogram.
#[derive(Debug, Default)]
pub(crate) struct LockWait {
    pub(crate) buckets: [AtomicU64; LOCK_WAIT_BOUNDS_US.len() + 1],
    pub(crate) sum_ns: AtomicU64,
}

impl LockWait {
    fn record(&self, waited: std::time::Duration) {
        let ns = waited.as_nanos();
        let bucket = LOCK_WAIT_BOUNDS_US
            .iter()
            .position(|&b| ns < u128::from(b) * 1000)
            .unwrap_or(LOCK_WAIT_BOUNDS_US.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
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
    /// Times it held the data plane for a batch.
    pub(crate) batches: AtomicU64,
    /// Sends that failed on its underlay.
    pub(crate) send_errors: AtomicU64,
    /// Packets it sealed on another worker's shard of their tunnel (a flow the kernel
    /// handed to the wrong worker, or a tunnel with fewer shards than workers).
    pub(crate) sealed_elsewhere: AtomicU64,
    /// How long it waited for the data plane.
    pub(crate) lock_wait: LockWait,
    /// Its underlay's path and counters, as of its last send.
    pub(crate) underlay: Mutex<crate::control::UnderlayStatus>,
    /// It runs as a realtime thread.
    pub(crate) realtime: AtomicBool,
}

/// What the control thread asks of a worker.
pub(crate) enum Command {
    /// Namespace `ns` is up: the worker's queue of its TAP, whether the TAP has offloads
    /// and whether UDP is coalesced too.
    Tap {
        ns: usize,
        queue: Tap,
        offload: bool,
        udp: bool,
    },
    /// Namespace `ns` was left: close the queue.
    Leave(usize),
}

/// The control thread's end of one worker.
pub(crate) struct WorkerLink {
    pub(crate) commands: mpsc::Sender<Command>,
    pub(crate) counters: Arc<WorkerCounters>,
}

/// A worker not started yet.
pub(crate) struct Unstarted {
    socket: std::net::UdpSocket,
    commands: mpsc::Receiver<Command>,
    counters: Arc<WorkerCounters>,
    /// Worker 0's: what the control thread sends.
    outbox: Option<mpsc::Receiver<Outgoing>>,
}

/// The links to one worker per socket, the workers to start (`spawn`), and the sending end
/// of worker 0's outbox.
pub(crate) fn links(
    sockets: Vec<std::net::UdpSocket>,
    namespaces: usize,
) -> (Vec<WorkerLink>, Vec<Unstarted>, mpsc::Sender<Outgoing>) {
    let (outbox_tx, outbox_rx) = mpsc::channel(OUTBOX_LEN);
    let mut outbox_rx = Some(outbox_rx);
    let (links, unstarted) = sockets
        .into_iter()
        .map(|socket| {
            let (tx, rx) = mpsc::channel(namespaces + COMMANDS_LEN);
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
                    outbox: outbox_rx.take(),
                },
            )
        })
        .unzip();
    (links, unstarted, outbox_tx)
}

/// Reports a worker's end to the control thread unless it was asked to stop: a worker that
/// returns or unwinds with this armed stops the agent.
struct ExitGuard {
    index: usize,
    fatal: mpsc::Sender<String>,
    poke: Arc<Notify>,
    /// Why it stopped, if it knows.
    reason: Option<String>,
    /// It was asked to stop.
    clean: bool,
}

impl ExitGuard {
    /// The worker was asked to stop, or never started: nothing to report.
    fn disarm(&mut self) {
        self.clean = true;
    }

    /// The worker stops for `reason`.
    fn fail(&mut self, reason: String) {
        self.reason = Some(reason);
    }
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        if self.clean {
            return;
        }
        let reason = match self.reason.take() {
            Some(r) => r,
            None if std::thread::panicking() => "it panicked".to_string(),
            None => "it ended".to_string(),
        };
        let _ = self
            .fatal
            .try_send(format!("data-path worker {} stopped: {reason}", self.index));
        self.poke.notify_one();
    }
}

/// Starts the workers, each on a thread with its own runtime; returns once each has its
/// underlay (or the first error). A worker stops when its command channel closes; one that
/// stops otherwise sends why on `fatal`.
pub(crate) fn spawn(
    shared: &Shared,
    workers: Vec<Unstarted>,
    mode: UnderlayMode,
    priority: WorkerPriority,
    poke: &Arc<Notify>,
    fatal: &mpsc::Sender<String>,
) -> Result<Vec<std::thread::JoinHandle<()>>> {
    let mut threads = Vec::new();
    let mut refused = None;
    let tunnels = lock(shared).node.tunnels();
    for (index, w) in workers.into_iter().enumerate() {
        let shared = shared.clone();
        let tunnels = tunnels.clone();
        let mut guard = ExitGuard {
            index,
            fatal: fatal.clone(),
            poke: poke.clone(),
            reason: None,
            clean: false,
        };
        let poke = poke.clone();
        // Ready, or why not; with why it is not realtime if it was to be.
        let (ready_tx, ready_rx) =
            std::sync::mpsc::sync_channel::<Result<Option<std::io::Error>>>(1);
        let thread = std::thread::Builder::new()
            .name(format!("hyphae-worker-{index}"))
            .spawn(move || {
                let not_realtime = match priority {
                    WorkerPriority::Normal => None,
                    WorkerPriority::Realtime => match make_realtime() {
                        Ok(()) => {
                            w.counters.realtime.store(true, Ordering::Relaxed);
                            None
                        }
                        Err(e) => Some(e),
                    },
                };
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        guard.disarm();
                        let _ = ready_tx.send(Err(anyhow::anyhow!("worker runtime: {e}")));
                        return;
                    }
                };
                runtime.block_on(async move {
                    // Registered with this thread's runtime, so it is made here.
                    let underlay = match Underlay::new(w.socket, mode) {
                        Ok(u) => u,
                        Err(e) => {
                            guard.disarm();
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
                    let _ = ready_tx.send(Ok(not_realtime));
                    let mut worker = Worker {
                        index: u8::try_from(index).unwrap_or(u8::MAX),
                        shared,
                        tunnels,
                        underlay,
                        taps: Vec::new(),
                        rx: vec![0; TAP_BATCH_BYTES],
                        frames: Vec::new(),
                        batch: Batch::default(),
                        counters: w.counters,
                        commands: w.commands,
                        outbox: w.outbox,
                        poke,
                    };
                    match worker.run().await {
                        Ok(()) => guard.disarm(),
                        Err(reason) => guard.fail(reason),
                    }
                });
            })
            .context("starting a worker thread")?;
        let not_realtime = ready_rx
            .recv()
            .context("a worker thread ended while starting")??;
        refused = refused.or(not_realtime);
        threads.push(thread);
    }
    if let Some(e) = refused {
        tracing::warn!(error = %e, "worker_priority = \"realtime\" was refused (it needs CAP_SYS_NICE or LimitRTPRIO={REALTIME_PRIORITY}, and no RestrictRealtime under systemd): the workers run at normal priority");
    } else if priority == WorkerPriority::Realtime {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        if threads.len() >= cores {
            tracing::warn!(workers = threads.len(), cores, "realtime workers on every core: under a flood they leave the control plane only the kernel's share for ordinary threads (kernel.sched_rt_runtime_us); fewer workers than cores keep a core for it");
        }
    }
    Ok(threads)
}

/// Makes the calling thread a `SCHED_FIFO` thread at [`REALTIME_PRIORITY`].
fn make_realtime() -> std::io::Result<()> {
    let param = libc::sched_param {
        sched_priority: REALTIME_PRIORITY,
    };
    // SAFETY: `param` outlives the call; pid 0 is the calling thread on Linux.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// One namespace on one worker: its TAP queue and what is written to it.
struct Queue {
    fd: AsyncFd<Tap>,
    offload: bool,
    /// Members' frames, coalesced per flow (offloads on).
    gro: Coalescer,
    /// The coalescer's merged frames already counted.
    merged_seen: u64,
    /// Counts to add to the data plane's at the next batch.
    pending: Pending,
}

/// What woke a worker.
enum Wake {
    Command(Option<Command>),
    Outbox(Option<Outgoing>),
    Underlay(std::io::Result<()>),
    Tap(usize),
    Timer,
}

struct Worker {
    /// Its index: the shard of every tunnel it owns.
    index: u8,
    shared: Shared,
    /// The tunnels, to seal and open with outside the data plane.
    tunnels: Arc<Tunnels>,
    underlay: Underlay,
    /// Its queue of each namespace's TAP, by namespace index.
    taps: Vec<Option<Queue>>,
    /// Frames read from the TAP, for the next batch: namespace and range in `rx`.
    rx: Vec<u8>,
    frames: Vec<(usize, Range<usize>)>,
    batch: Batch,
    counters: Arc<WorkerCounters>,
    commands: mpsc::Receiver<Command>,
    outbox: Option<mpsc::Receiver<Outgoing>>,
    poke: Arc<Notify>,
}

impl Worker {
    /// Carries traffic until the command channel closes (`Ok`), or the socket fails.
    #[allow(clippy::disallowed_methods)] // the underlay's timer (the neighbour table)
    async fn run(&mut self) -> Result<(), String> {
        loop {
            let timer = self.underlay.poll_timeout();
            let wake = tokio::select! {
                command = self.commands.recv() => Wake::Command(command),
                Some(out) = recv_outbox(&mut self.outbox) => Wake::Outbox(Some(out)),
                ready = self.underlay.readable() => Wake::Underlay(ready),
                i = any_readable(&self.taps) => Wake::Tap(i),
                () = super::run::sleep_until(timer) => Wake::Timer,
            };
            match wake {
                Wake::Command(None) => {
                    // What the control thread queued before it stopped goes out first (a
                    // leave's announcements: members drop us at once, not after a timeout).
                    self.send_outbox(None).await;
                    return Ok(());
                }
                Wake::Command(Some(command)) => self.command(command),
                Wake::Outbox(first) => self.send_outbox(first).await,
                Wake::Underlay(Ok(())) => self.carry_datagrams().await,
                Wake::Underlay(Err(e)) => return Err(format!("its underlay socket failed: {e}")),
                Wake::Tap(i) => self.carry_frames(i).await,
                Wake::Timer => self.underlay.handle_timeout(Instant::now()),
            }
        }
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Tap {
                ns,
                queue,
                offload,
                udp,
            } => {
                // Registered with this worker's runtime, where it is waited on.
                // SAFETY: the queue's fd stays open while the AsyncFd holds the queue.
                match unsafe { AsyncFd::register(queue) } {
                    Ok(fd) => {
                        if self.taps.len() <= ns {
                            self.taps.resize_with(ns + 1, || None);
                        }
                        self.taps[ns] = Some(Queue {
                            fd,
                            offload,
                            gro: Coalescer::new().with_udp(udp),
                            merged_seen: 0,
                            pending: Pending::default(),
                        });
                    }
                    Err(e) => tracing::error!(error = %e, "worker: cannot register a TAP queue"),
                }
            }
            Command::Leave(ns) => {
                if let Some(tap) = self.taps.get_mut(ns) {
                    *tap = None;
                }
            }
        }
    }

    /// Worker 0: sends what the control thread left in the outbox (`first`, then the rest).
    async fn send_outbox(&mut self, first: Option<Outgoing>) {
        let mut next = first.or_else(|| self.outbox.as_mut().and_then(|o| o.try_recv().ok()));
        while let Some((to, datagram)) = next {
            self.underlay.push(to, &datagram).await;
            next = self.outbox.as_mut().and_then(|o| o.try_recv().ok());
        }
        self.underlay.flush().await;
        self.report_underlay();
    }

    /// Datagrams from the socket: one batch read and its data messages opened without the
    /// data plane, then checked and switched with it.
    async fn carry_datagrams(&mut self) {
        match self.underlay.try_recv() {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::debug!(error = %e, "underlay receive error");
                return;
            }
        }
        let count = self.underlay.datagrams().count();
        self.counters
            .datagrams_in
            .fetch_add(count as u64, Ordering::Relaxed);
        self.batch.open(&self.tunnels, self.underlay.datagrams());
        let wake = {
            let (mut dp, now) = enter(&self.shared, &mut self.taps, &self.counters);
            dp.handle_datagrams(now, self.underlay.datagrams(), &mut self.batch);
            dp.after_batch(now, true, &mut self.batch)
        };
        self.carry_out(wake).await;
    }

    /// Frames from TAP `i`: one batch read without the data plane, switched with it.
    async fn carry_frames(&mut self, i: usize) {
        self.frames.clear();
        if !self.read_tap(i) {
            return;
        }
        let wake = {
            let (mut dp, now) = enter(&self.shared, &mut self.taps, &self.counters);
            dp.handle_frames(now, &self.frames, &mut self.rx, &mut self.batch);
            dp.after_batch(now, false, &mut self.batch)
        };
        self.carry_out(wake).await;
    }

    /// After the data plane is let go: wakes the control thread if asked, seals, sends and
    /// writes what the batch holds, then tells `hyphae status` what the underlay did.
    async fn carry_out(&mut self, wake_control: bool) {
        if wake_control {
            self.poke.notify_one();
        }
        let elsewhere = self.batch.seal_pending(Some(self.index));
        if elsewhere > 0 {
            self.counters
                .sealed_elsewhere
                .fetch_add(elsewhere, Ordering::Relaxed);
        }
        for (to, range) in &self.batch.sends {
            self.underlay.push(*to, self.batch.datagram(range)).await;
        }
        for w in &self.batch.writes {
            let frame = self.batch.frame(&w.range);
            let Some(Some(q)) = self.taps.get_mut(w.ns) else {
                continue;
            };
            if w.deliver {
                deliver(q, frame, &self.counters);
            } else {
                write(q, frame, &self.counters);
            }
        }
        self.batch.clear();
        self.underlay.flush().await;
        for q in self.taps.iter_mut().flatten() {
            flush_coalesced(q, &self.counters);
        }
        self.report_underlay();
    }

    fn report_underlay(&self) {
        let c = &self.counters;
        c.send_errors
            .store(self.underlay.send_errors(), Ordering::Relaxed);
        self.underlay.fill_status(
            &mut c
                .underlay
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
    }

    /// Reads frames from TAP `i` into the batch until it would wait or the batch is full;
    /// whether it read any.
    fn read_tap(&mut self, i: usize) -> bool {
        let Some(Some(q)) = self.taps.get(i) else {
            return false;
        };
        let mut at = 0;
        while self.frames.len() < TAP_BATCH_FRAMES && self.rx.len() - at >= BUF_LEN {
            let buf = &mut self.rx[at..];
            // try_io clears the readiness only when the device reports WouldBlock.
            let n = match q.fd.try_io(Interest::READABLE, |t| t.recv(buf)) {
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
        let read = self.frames.len();
        self.counters
            .frames_in
            .fetch_add(read as u64, Ordering::Relaxed);
        read > 0
    }
}

/// Takes the data plane for one batch (counting how long that took), adds what this
/// worker counted since the last one, and reads the clock once for the batch.
#[allow(clippy::disallowed_methods)] // a worker's clock reading, once per batch
fn enter<'a>(
    shared: &'a Shared,
    taps: &mut [Option<Queue>],
    counters: &WorkerCounters,
) -> (MutexGuard<'a, DataPlane>, Instant) {
    let asked = Instant::now();
    let mut dp = lock(shared);
    let now = Instant::now();
    counters.lock_wait.record(now - asked);
    counters.batches.fetch_add(1, Ordering::Relaxed);
    for (i, q) in taps.iter_mut().enumerate() {
        let Some(q) = q else {
            continue;
        };
        let merged = q.gro.merged();
        let mut p = std::mem::take(&mut q.pending);
        p.coalesced_frames = merged - q.merged_seen;
        q.merged_seen = merged;
        dp.fold_counts(i, p);
    }
    (dp, now)
}

/// The next datagram of worker 0's outbox; never on the other workers.
async fn recv_outbox(outbox: &mut Option<mpsc::Receiver<Outgoing>>) -> Option<Outgoing> {
    match outbox {
        Some(o) => o.recv().await,
        None => std::future::pending().await,
    }
}

/// Resolves with the index of the first TAP queue that is readable.
async fn any_readable(taps: &[Option<Queue>]) -> usize {
    std::future::poll_fn(|cx| {
        for (i, q) in taps.iter().enumerate() {
            let Some(q) = q else {
                continue;
            };
            // The guard is dropped with its readiness retained: the worker reads until
            // WouldBlock, which clears it.
            if let std::task::Poll::Ready(Ok(_guard)) = q.fd.poll_read_ready(cx) {
                return std::task::Poll::Ready(i);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Writes `frame` to a TAP queue (behind a plain virtio-net header when offloads are on).
/// A failure is counted.
fn write(q: &mut Queue, frame: &[u8], counters: &WorkerCounters) {
    let sent = write_to(q.fd.get_ref(), q.offload, frame);
    if sent {
        counters.frames_out.fetch_add(1, Ordering::Relaxed);
    } else {
        q.pending.tap_errors += 1;
    }
}

/// Writes `frame` to `tap`, behind a plain virtio-net header when `offload` is on; whether
/// the write went through.
pub(crate) fn write_to(tap: &SyncDevice, offload: bool, frame: &[u8]) -> bool {
    if offload {
        let mut header = [0u8; VIRTIO_HEADER_LEN];
        let _ = VirtioHeader::PLAIN.emit(&mut header);
        let parts = [std::io::IoSlice::new(&header), std::io::IoSlice::new(frame)];
        tap.send_vectored(&parts).is_ok()
    } else {
        tap.send(frame).is_ok()
    }
}

/// Writes a member's frame; with offloads on, consecutive frames of one TCP flow (or UDP
/// flow, where the TAP takes UDP segmentation offload) are held to leave as one
/// super-frame ([`flush_coalesced`]).
fn deliver(q: &mut Queue, frame: &[u8], counters: &WorkerCounters) {
    if !q.offload {
        return write(q, frame, counters);
    }
    loop {
        match q.gro.handle_frame(frame) {
            Offer::Held => return,
            Offer::Busy => flush_coalesced(q, counters),
            Offer::Refused => return write(q, frame, counters),
        }
    }
}

/// Writes the super-frame being coalesced, if any, with one write.
fn flush_coalesced(q: &mut Queue, counters: &WorkerCounters) {
    let Some(bytes) = q.gro.poll_frame() else {
        return;
    };
    if q.fd.get_ref().send(bytes).is_ok() {
        q.pending.coalesced_writes += 1;
        counters.frames_out.fetch_add(1, Ordering::Relaxed);
    } else {
        q.pending.tap_errors += 1;
    }
}
