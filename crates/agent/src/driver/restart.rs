//! What an agent keeps for its next start (the members it had tunnels with) and gives
//! back when it stops (its addresses and names, released at once rather than left to
//! lapse).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hyphae_overlay::membership;
use hyphae_overlay::PeerId;

use super::{data, run, setup, Control};

impl Control {
    /// On the way out: give our addresses and names back so others can take them now, not
    /// after the lease (waits at most a few seconds for the replicas).
    #[allow(clippy::disallowed_methods)] // after the last turn, a loop of its own
    pub(crate) async fn release_held(&mut self) {
        let mut waiting = 0;
        for n in &mut self.namespaces {
            n.membership.release_held();
            while let Some((_, request)) = n.membership.poll_request() {
                if let membership::Request::Release { key } = request {
                    self.overlay.release(n.tag, key);
                    waiting += 1;
                }
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        while waiting > 0 {
            let timer = self
                .overlay
                .poll_timeout()
                .map(tokio::time::Instant::from_std);
            tokio::select! {
                event = self.overlay.next_event() => {
                    if let hyphae_overlay::swarm::OverlayEvent::Released { .. } = event {
                        waiting -= 1;
                    }
                }
                () = run::sleep_until(timer.map(|t| t.min(deadline)).map(tokio::time::Instant::into_std)) => {
                    self.overlay.handle_timeout(Instant::now());
                }
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
    }
}

impl Control {
    /// Writes down the members namespace `i` has tunnels with now, when they changed, so a
    /// restart contacts them at once (see [`setup::remembered_members`]).
    pub(super) fn remember_members(&mut self, i: usize, tunnels: &data::TunnelList) {
        let mut members: Vec<(PeerId, SocketAddr)> = tunnels
            .0
            .iter()
            .filter(|t| t.ns == i && t.up)
            .map(|t| (t.id, t.endpoint))
            .collect();
        members.sort();
        let n = &mut self.namespaces[i];
        // Nobody reachable now says nothing about who comes back: keep the last list.
        if members.is_empty() || members == n.remembered {
            return;
        }
        let text: String = members
            .iter()
            .map(|(id, endpoint)| format!("{id} {endpoint}\n"))
            .collect();
        let path = setup::members_file(&self.state_dir, &n.name);
        let tmp = path.with_extension("members.new");
        let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            tracing::debug!(path = %path.display(), error = %e, "cannot remember the members");
        }
        n.remembered = members;
    }
}
