//! Revocation lists of namespaces with an authority: taken from `hyphae ca publish` or
//! from another member (pushed through the overlay), applied to the control plane's
//! memberships and to the tunnels at once, and kept in the state directory so a restart
//! starts from the newest one seen.

use std::time::Instant;

use hyphae_overlay::cert::{armor, unarmor, Refusal};
use hyphae_overlay::NamespaceId;

use super::workers::lock;
use super::Control;
use crate::ca::REVOCATIONS;

impl Control {
    /// `hyphae ca publish`: the list in `text` (armored) for namespace `name`, if newer
    /// than the one held. Returns its version.
    pub(crate) fn publish_revocations(
        &mut self,
        now: Instant,
        name: &str,
        text: &str,
    ) -> Result<u64, String> {
        let i = self
            .active(name)
            .ok_or_else(|| format!("not a member of '{name}'"))?;
        if self.namespaces[i].certificate.is_none() {
            return Err(format!("namespace '{name}' has no authority"));
        }
        let list = unarmor(text).map_err(|_| "not a hyphae revocation list".to_string())?;
        let tag = self.namespaces[i].tag;
        let version = self
            .overlay
            .update_revocations(&tag, &list)
            .map_err(|e| match e {
                Refusal::Outdated => "not newer than the list this member holds".to_string(),
                e => format!("refused: {e}"),
            })?;
        self.take_revocations(now, i, &list);
        tracing::info!(namespace = %name, version, "revocation list published");
        Ok(version)
    }

    /// A member passed on a list the overlay has taken (newer, the authority's).
    pub(crate) fn revocations_from_member(
        &mut self,
        now: Instant,
        tag: [u8; hyphae_overlay::TAG_LEN],
        list: &[u8],
    ) {
        if let Some(i) = self
            .namespaces
            .iter()
            .position(|n| n.tag == tag && n.active())
        {
            self.take_revocations(now, i, list);
        }
    }

    /// The tunnels take the list (cutting off whom it revokes), and it is kept.
    fn take_revocations(&mut self, now: Instant, i: usize, list: &[u8]) {
        let taken = lock(&self.dp)
            .node
            .update_revocations(now, NamespaceId(i), list);
        match taken {
            Ok(version) => {
                tracing::info!(namespace = %self.namespaces[i].name, version, "revocation list taken")
            }
            Err(e) => {
                tracing::debug!(namespace = %self.namespaces[i].name, error = %e, "tunnels did not take the revocation list")
            }
        }
        let path = crate::setup::revocations_file(&self.state_dir, &self.namespaces[i].name);
        if let Err(e) = std::fs::write(&path, armor(REVOCATIONS, list)) {
            tracing::warn!(path = %path.display(), error = %e, "cannot keep the revocation list");
        }
    }
}

impl Control {
    /// SIGHUP or `hyphae cert install`: each namespace with an authority reads its
    /// certificate file again; a new one that checks out (this identity, this namespace,
    /// the authority, valid now) replaces the old without dropping a tunnel: members hear
    /// it in announcements and proofs at once. Returns one line per namespace.
    pub(crate) fn reload_certificates(&mut self, now: Instant) -> Vec<String> {
        let me = self.identity.peer_id();
        let mut lines = Vec::new();
        for i in 0..self.namespaces.len() {
            let n = &self.namespaces[i];
            let (Some(path), Some(old), true) = (
                n.certificate_path.clone(),
                n.certificate.as_ref(),
                n.active(),
            ) else {
                continue;
            };
            let name = n.name.clone();
            let trust = lock(&self.dp).node.trust(NamespaceId(i)).cloned();
            let read = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))
                .and_then(|text| {
                    unarmor(&text).map_err(|_| format!("{} is not a certificate", path.display()))
                })
                .and_then(|bytes| {
                    let trust = trust.ok_or_else(|| "no authority".to_string())?;
                    let cert = trust
                        .check(&bytes, &me, super::unix_now())
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                    Ok((bytes, cert))
                });
            match read {
                Err(e) => {
                    tracing::warn!(namespace = %name, "certificate not renewed: {e}");
                    lines.push(format!("{name}: not renewed: {e}"));
                }
                Ok((_, cert)) if cert.fingerprint() == old.fingerprint() => {
                    lines.push(format!("{name}: unchanged"));
                }
                Ok((bytes, cert)) => {
                    lock(&self.dp)
                        .node
                        .renew_certificate(now, NamespaceId(i), bytes.clone());
                    let tag = self.namespaces[i].tag;
                    self.overlay.renew_certificate(&tag, bytes);
                    tracing::info!(namespace = %name, name = cert.name(), groups = ?cert.groups(), not_after = cert.not_after(), "certificate renewed");
                    lines.push(format!(
                        "{name}: renewed ('{}', valid until Unix {})",
                        cert.name(),
                        cert.not_after()
                    ));
                    self.namespaces[i].certificate = Some(cert);
                }
            }
        }
        lines
    }
}

/// The newest list kept in the state directory for namespace `name`, if any.
pub(crate) fn kept(state_dir: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    let text = std::fs::read_to_string(crate::setup::revocations_file(state_dir, name)).ok()?;
    unarmor(&text).ok()
}
