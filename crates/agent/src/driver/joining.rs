//! Joining and leaving namespaces while the agent runs (`hyphae join`, `hyphae leave`), and
//! leaving one that cannot be joined as configured.

use std::time::Instant;

use hyphae_overlay::swarm::tcp_multiaddr;
use hyphae_overlay::NamespaceId;

use super::workers::{lock, Command};
use super::Control;
use crate::config::Config;

impl Control {
    /// `hyphae join`: the namespace `name` was added to the config file; bring it up.
    pub(crate) fn join(&mut self, name: &str, now: Instant) -> Result<(), String> {
        let config = Config::load(&self.config_path).map_err(|e| format!("{e:#}"))?;
        let Some(cfg) = config.namespaces.iter().find(|n| n.name == name) else {
            return Err(format!(
                "namespace '{name}' is not in {}",
                self.config_path.display()
            ));
        };
        if let Some(i) = self.active(name) {
            return Err(format!(
                "already a member of '{name}' (device {})",
                self.namespaces[i].device
            ));
        }
        if let Some(other) = self
            .namespaces
            .iter()
            .find(|n| n.active() && n.device == cfg.device)
        {
            return Err(format!(
                "device {} is already used by namespace '{}'",
                cfg.device, other.name
            ));
        }
        self.add_namespace(cfg, now).map_err(|e| format!("{e:#}"))?;
        let ready = self.overlay_ready();
        if let Some(n) = self.namespaces.last_mut() {
            n.live = true;
            if ready {
                n.membership.start(now);
            }
        }
        for addr in &cfg.bootstrap {
            self.overlay.dial(addr.clone());
        }
        for &peer in cfg.peers.iter().filter(|&&p| p != self.listen) {
            self.overlay.dial(tcp_multiaddr(peer));
        }
        Ok(())
    }

    /// `hyphae leave`: release the namespace's addresses, drop its tunnels and its TAP.
    pub(crate) fn leave(&mut self, name: &str, now: Instant) -> Result<usize, String> {
        let Some(i) = self.active(name) else {
            return Err(format!("not a member of '{name}'"));
        };
        Ok(self.drop_namespace(i, now))
    }

    pub(crate) fn drop_namespace(&mut self, i: usize, now: Instant) -> usize {
        let n = &mut self.namespaces[i];
        let released = n.membership.leave();
        {
            let mut dp = lock(&self.dp);
            dp.node.remove_namespace(now, NamespaceId(i));
            if let Some(lane) = dp.lanes.get_mut(i) {
                lane.active = false;
                lane.group.clear();
                lane.grace.clear();
            }
        }
        // Dropping the TAP's queues removes the device (and the hybrid veth goes with its
        // links).
        n.tap = None;
        for link in &self.workers {
            if link.commands.try_send(Command::Leave(i)).is_err() {
                tracing::warn!(namespace = %n.name, "a data-path worker did not take the leave; its TAP queue stays open until it stops");
            }
        }
        n.lan = None;
        n.group.clear();
        tracing::info!(namespace = %n.name, "namespace left");
        released
    }

    /// Namespace `i` cannot be joined as configured: one joined with `hyphae join` is left
    /// (the error shows in its status); one from the config at start stops the agent.
    pub(crate) fn conflict(&mut self, i: usize, reason: String, now: Instant) {
        if self.namespaces[i].live {
            tracing::error!(namespace = %self.namespaces[i].name, "{reason}");
            self.drop_namespace(i, now);
            self.namespaces[i].error = Some(reason);
        } else {
            self.fatal = Some(reason);
        }
    }
}
