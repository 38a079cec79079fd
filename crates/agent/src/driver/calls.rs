//! What the outside asks of the control thread: the control socket's requests (and the web
//! server's, which are status requests), address changes (roaming), and the service
//! manager's readiness.

use std::net::SocketAddr;
use std::time::Instant;

use hyphae_overlay::PeerHandle;
use serde_json::json;

use super::workers::lock;
use super::Control;
use crate::config::Mode;
use crate::control::Request;
use crate::control_server::Call;
use crate::notify::{readiness, Progress};

impl Control {
    /// Answers one control request (a `set_name` may answer later).
    pub(crate) fn handle_call(&mut self, now: Instant, call: Call) {
        let Call { request, reply } = call;
        let answer = match request {
            Request::Status => {
                self.refresh_member_names(now);
                serde_json::to_value(self.status())
                    .unwrap_or_else(|e| json!({ "error": format!("status: {e}") }))
            }
            Request::Join { namespace } => match self.join(&namespace, now) {
                Ok(()) => json!({ "ok": true }),
                Err(e) => json!({ "error": e }),
            },
            Request::Leave { namespace } => match self.leave(&namespace, now) {
                Ok(released) => json!({ "ok": true, "released": released }),
                Err(e) => json!({ "error": e }),
            },
            Request::ReloadCertificates => {
                let mut lines = self.reload_certificates(now);
                lines.extend(self.reload_policies());
                json!({ "ok": true, "lines": lines })
            }
            Request::Revocations { namespace, list } => {
                match self.publish_revocations(now, &namespace, &list) {
                    Ok(version) => json!({ "ok": true, "version": version }),
                    Err(e) => json!({ "error": e }),
                }
            }
            Request::PolicyPublish { namespace, policy } => {
                match self.publish_policy(&namespace, &policy) {
                    Ok(version) => json!({ "ok": true, "version": version }),
                    Err(e) => json!({ "error": e }),
                }
            }
            Request::PolicyCheck {
                namespace,
                from,
                to,
                traffic,
            } => match self.check_policy(&namespace, &from, &to, &traffic) {
                Ok((allowed, message)) => {
                    json!({ "ok": true, "allowed": allowed, "message": message })
                }
                Err(e) => json!({ "error": e }),
            },
            Request::SetName { namespace, name } => {
                return self.set_name(now, &namespace, name, reply);
            }
        };
        let _ = reply.send(answer);
    }

    /// Addresses or routes changed: members whose source address changed hear from the
    /// new one at once. The kernel is asked with the data plane let go.
    pub(crate) fn handle_net_change(&mut self, now: Instant) {
        let Some(watch) = self.netwatch.as_mut() else {
            return;
        };
        if !watch.drain() {
            return;
        }
        let members: Vec<(PeerHandle, SocketAddr)> = lock(&self.dp)
            .node
            .peers()
            .map(|p| (p.handle, p.endpoint))
            .collect();
        let moved = self.sources.changed(members.into_iter());
        if !moved.is_empty() {
            lock(&self.dp).node.handle_underlay_change(now, &moved);
            self.overlay.handle_underlay_change();
        }
    }

    /// Tells a service manager what the agent waits for, and when every namespace holds
    /// its address, that it is ready.
    pub(crate) fn notify_progress(&mut self, now: Instant) {
        if !self.notifier.due(now) {
            return;
        }
        let progress: Vec<_> = self
            .namespaces
            .iter()
            .filter(|n| n.active())
            .map(|n| Progress {
                name: &n.name,
                own_address: n.mode != Mode::Router && !n.membership.host_uses_dhcp(),
                subnet_known: n.membership.subnet().is_some(),
                held: n.membership.owned(),
            })
            .collect();
        let readiness = readiness(self.overlay_ready(), &progress);
        self.notifier.update(readiness);
    }
}
