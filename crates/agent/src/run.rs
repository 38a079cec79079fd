//! The control thread's loop: it starts the workers, then waits for what the control plane
//! answers to (signals, address changes, the overlay, resolvers, timers, control calls, a
//! worker's poke) and runs the cores with one reading of the clock per turn, holding the
//! agent only while it does.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use tokio::net::UnixListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::control_server::Call;
use crate::driver::Agent;
use crate::workers::Command;

/// What woke the loop.
enum Wake {
    Stop,
    NetChange,
    Overlay(hyphae_overlay::swarm::OverlayEvent),
    Resolver(crate::services::ResolverReply),
    Timer,
    Call(Call),
}

impl Agent {
    /// Runs until SIGTERM or SIGINT, answering the control socket on `listener` and, if
    /// given, HTTP (`/metrics`, the topology page) on `web`.
    // The agent is held across `flush`, which never waits on this thread: the control
    // thread has no socket, what it sends goes to the outbox.
    #[allow(clippy::await_holding_lock)]
    pub(crate) async fn run(
        mut self,
        listener: UnixListener,
        web: Option<tokio::net::TcpListener>,
    ) -> Result<()> {
        let (ctl_tx, mut ctl_rx) = mpsc::channel::<Call>(16);
        if let Some(web) = web {
            tokio::spawn(crate::web::serve(web, ctl_tx.clone()));
        }
        tokio::spawn(crate::control_server::serve(listener, ctl_tx));
        let mut sigterm = signal(SignalKind::terminate())?;
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut resolver_rx = self
            .resolver_rx
            .take()
            .ok_or_else(|| anyhow::anyhow!("internal: the agent runs once"))?;
        let poke = self.poke.clone();
        let unstarted = std::mem::take(&mut self.unstarted);
        let mode = self.underlay_mode;
        let shared: crate::workers::Shared = Arc::new(std::sync::Mutex::new(self));
        let threads = crate::workers::spawn(&shared, unstarted, mode)?;
        tracing::info!(workers = threads.len(), "data path running");
        let result = loop {
            let deadline = {
                let mut agent = crate::workers::lock(&shared);
                let deadline = agent.poll_timeout();
                agent.main_deadline = deadline;
                deadline
            };
            let wake = tokio::select! {
                _ = sigterm.recv() => Wake::Stop,
                _ = sigint.recv() => Wake::Stop,
                () = std::future::poll_fn(|cx| crate::workers::lock(&shared).poll_net_change(cx)) => Wake::NetChange,
                event = std::future::poll_fn(|cx| crate::workers::lock(&shared).overlay.poll_event(cx)) => Wake::Overlay(event),
                Some(reply) = resolver_rx.recv() => Wake::Resolver(reply),
                () = sleep_until(deadline) => Wake::Timer,
                () = poke.notified() => Wake::Timer,
                Some(call) = ctl_rx.recv() => Wake::Call(call),
            };
            // The one clock reading of this turn: every core sees the same `now`.
            let now = Instant::now();
            let mut agent = crate::workers::lock(&shared);
            match wake {
                Wake::Stop => break Ok(()),
                Wake::NetChange => agent.handle_net_change(now),
                Wake::Overlay(event) => agent.handle_overlay(now, event),
                Wake::Resolver(reply) => agent.resolver_answer(now, reply),
                Wake::Timer => {}
                Wake::Call(call) => agent.handle_call(now, call),
            }
            agent.handle_timeout(now);
            agent.flush(now).await;
            agent.wake_sender();
            if let Some(reason) = agent.fatal.take() {
                break Err(anyhow::anyhow!(reason));
            }
            agent.notify_progress(now);
        };
        // Closing the command channels stops the workers.
        crate::workers::lock(&shared).workers.clear();
        for thread in threads {
            let _ = thread.join();
        }
        let Ok(agent) = Arc::try_unwrap(shared) else {
            bail!("internal: a worker still holds the agent");
        };
        let mut agent = agent
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        agent.notifier.stopping();
        // A fatal error stops at once; a stop gives back what this member held first.
        result?;
        agent.release_held().await;
        tracing::info!("stopping: removing devices");
        Ok(())
    }

    /// Asks worker 0 to send what the control thread left in the outbox.
    pub(crate) fn wake_sender(&mut self) {
        if !self.outbox.is_empty() {
            if let Some(w) = self.workers.first() {
                let _ = w.commands.send(Command::Send);
            }
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
pub(crate) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
        None => std::future::pending().await,
    }
}
