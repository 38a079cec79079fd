//! The control thread's loop: it starts the workers, then waits for what the control plane
//! answers to (signals, address changes, the overlay, resolvers, timers, control calls, a
//! worker's poke or its end) with no lock held, and runs the cores with one reading of the
//! clock per turn. It holds the data plane only for the short, I/O-free steps that touch the
//! tunnels or switches; what those send and write is carried out after each turn.

use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use tokio::net::UnixListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use super::workers::{self, lock};
use super::Control;
use crate::config::Config;
use crate::control_server::Call;
use crate::setup;

/// What woke the loop.
enum Wake {
    Stop,
    Reload,
    NetChange,
    Overlay(hyphae_overlay::swarm::OverlayEvent),
    Resolver(super::services::ResolverReply),
    Timer,
    Call(Call),
    WorkerStopped(String),
}

/// Control requests waiting for the loop (from the control socket and the web server).
const CALLS_LEN: usize = 16;

impl Control {
    /// Runs until SIGTERM or SIGINT, answering the control socket on `listener` and, if
    /// given, HTTP (`/metrics`, the topology page) on `web`.
    #[allow(clippy::disallowed_methods)] // one clock reading per turn
    pub(crate) async fn run(
        mut self,
        listener: UnixListener,
        web: Option<tokio::net::TcpListener>,
    ) -> Result<()> {
        let (ctl_tx, mut ctl_rx) = mpsc::channel::<Call>(CALLS_LEN);
        if let Some(web) = web {
            tokio::spawn(crate::web::serve(web, ctl_tx.clone()));
        }
        tokio::spawn(crate::control_server::serve(listener, ctl_tx));
        let mut sigterm = signal(SignalKind::terminate())?;
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sighup = signal(SignalKind::hangup())?;
        let mut resolver_rx = self
            .resolver_rx
            .take()
            .ok_or_else(|| anyhow::anyhow!("internal: the agent runs once"))?;
        let poke = self.poke.clone();
        let unstarted = std::mem::take(&mut self.unstarted);
        let (fatal_tx, mut fatal_rx) = mpsc::channel(unstarted.len().max(1));
        let threads = workers::spawn(
            &self.dp,
            unstarted,
            self.underlay_mode,
            self.worker_priority,
            &poke,
            &fatal_tx,
        )?;
        tracing::info!(workers = threads.len(), "data path running");
        let result = loop {
            let deadline = {
                let mut dp = lock(&self.dp);
                let deadline = [self.poll_timeout(), dp.poll_timeout()]
                    .into_iter()
                    .flatten()
                    .min();
                dp.control_deadline = deadline;
                deadline
            };
            let netwatch = self.netwatch.as_ref();
            let wake = tokio::select! {
                _ = sigterm.recv() => Wake::Stop,
                _ = sigint.recv() => Wake::Stop,
                _ = sighup.recv() => Wake::Reload,
                () = std::future::poll_fn(|cx| match netwatch {
                    Some(w) => w.poll_readable(cx),
                    None => std::task::Poll::Pending,
                }) => Wake::NetChange,
                event = std::future::poll_fn(|cx| self.overlay.poll_event(cx)) => Wake::Overlay(event),
                Some(reply) = resolver_rx.recv() => Wake::Resolver(reply),
                () = sleep_until(deadline) => Wake::Timer,
                () = poke.notified() => Wake::Timer,
                Some(call) = ctl_rx.recv() => Wake::Call(call),
                Some(reason) = fatal_rx.recv() => Wake::WorkerStopped(reason),
            };
            // The one clock reading of this turn: every core sees the same `now`.
            let now = Instant::now();
            match wake {
                Wake::Stop => break Ok(()),
                Wake::Reload => {
                    for line in self.reload_certificates(now) {
                        tracing::info!("SIGHUP: {line}");
                    }
                    for line in self.reload_policies() {
                        tracing::info!("SIGHUP: {line}");
                    }
                }
                Wake::WorkerStopped(reason) => {
                    tracing::error!("{reason}; the agent stops");
                    break Err(anyhow::anyhow!(reason));
                }
                Wake::NetChange => self.handle_net_change(now),
                Wake::Overlay(event) => self.handle_overlay(now, event),
                Wake::Resolver(reply) => self.resolver_answer(now, reply),
                Wake::Timer => {}
                Wake::Call(call) => self.handle_call(now, call),
            }
            if let Err(e) = self.end_turn(now) {
                break Err(e);
            }
        };
        // Closing the command channels stops the workers.
        self.workers.clear();
        for thread in threads {
            let _ = thread.join();
        }
        if std::sync::Arc::strong_count(&self.dp) > 1 {
            bail!("internal: a worker still holds the data plane");
        }
        self.notifier.stopping();
        // A fatal error stops at once; a stop gives back what this member held first.
        result?;
        self.release_held().await;
        tracing::info!("stopping: removing devices");
        Ok(())
    }
}

impl Control {
    /// The end of every turn, after what woke the loop was handled: the cores' timers that
    /// are due, what they asked for, then what the turn sends and writes, carried out with
    /// the data plane let go. An error is why the agent must stop.
    pub(crate) fn end_turn(&mut self, now: Instant) -> Result<()> {
        self.handle_timeout(now);
        self.flush(now);
        self.carry_out();
        if let Some(reason) = self.fatal.take() {
            bail!(reason);
        }
        self.notify_progress(now);
        Ok(())
    }
}

/// Runs the agent in the foreground until SIGTERM or SIGINT.
pub fn up(config: Config) -> Result<()> {
    setup::require_net_admin()?;
    // Bind first: a failed start should leave nothing behind, not even a new identity.
    setup::check_uplinks_local(&config.agent.uplinks)?;
    let sockets = setup::bind_underlay(config.agent.listen, config.agent.workers)?;
    let identity = setup::load_or_create_identity(&config.agent.state_dir)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async move {
        // The control socket first: "another agent is running" is the error that says most.
        let listener = setup::bind_control(&config.agent.control_socket)?;
        let result = async {
            let web = match config.agent.metrics {
                Some(address) => Some(setup::bind_web(address).await?),
                None => None,
            };
            Control::start(config.clone(), identity, sockets)?
                .run(listener, web)
                .await
        }
        .await;
        let _ = std::fs::remove_file(&config.agent.control_socket);
        result
    })
}

/// Sleeps until `deadline`, or forever without one.
pub(crate) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
        None => std::future::pending().await,
    }
}
