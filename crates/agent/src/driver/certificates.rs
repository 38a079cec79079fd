//! Namespaces with an authority: what this host's certificate makes of its config
//! ([`certified_config`]: its name, its pinned addresses), renewal, and revocation lists
//! taken from `hyphae ca publish` or from another member (pushed through the overlay),
//! applied to the control plane's memberships and to the tunnels at once, and kept in the
//! state directory so a restart starts from the newest one seen.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use anyhow::{bail, Result};
use hyphae_overlay::cert::{armor, unarmor, Certificate, Refusal};
use hyphae_overlay::membership::Address;
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
            let wall = self.host.wall(now);
            let read = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))
                .and_then(|text| {
                    unarmor(&text).map_err(|_| format!("{} is not a certificate", path.display()))
                })
                .and_then(|bytes| {
                    let trust = trust.ok_or_else(|| "no authority".to_string())?;
                    let cert = trust
                        .check(&bytes, &me, wall)
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
                    // A new name takes effect now; new pins at the next start.
                    let own = hyphae_dhcp_dns::dns::host_name(cert.name()).ok();
                    let membership = &mut self.namespaces[i].membership;
                    if membership.certified_name() != Some(own.as_deref()) {
                        membership.set_certified_name(now, own);
                    }
                    self.namespaces[i].certificate = Some(cert);
                }
            }
        }
        lines
    }
}

/// The armored document kept in file `path` of the state directory, if any.
fn kept(path: std::path::PathBuf) -> Option<Vec<u8>> {
    unarmor(&std::fs::read_to_string(path).ok()?).ok()
}

/// Namespace `cfg`'s credential (if it has an authority) with the newest revocation list
/// and signed policy seen before a restart, where newer than the config's.
pub(crate) fn with_kept(
    state_dir: &std::path::Path,
    cfg: &crate::config::Namespace,
) -> Option<hyphae_overlay::proof::Credential> {
    let mut credential = cfg.credential.clone()?;
    let trust = &mut credential.trust;
    if let Some(list) = kept(crate::setup::revocations_file(state_dir, &cfg.name)) {
        if let Ok(l) = trust.update(&list) {
            tracing::info!(namespace = %cfg.name, version = l.version(), "revocation list kept from before");
        }
    }
    if let Some(policy) = kept(crate::setup::policy_file(state_dir, &cfg.name)) {
        if let Ok(p) = trust.update_policy(&policy) {
            tracing::info!(namespace = %cfg.name, version = p.version(), "signed policy kept from before");
        }
    }
    Some(credential)
}

/// Namespace `cfg` as this host's certificate `cert` makes it: the certificate's name is
/// the hostname (a different `hostname` in the config is an error; the replicas would
/// refuse it), and where the certificate pins addresses, `address = "auto"` is the first
/// pinned IPv4 address and a static address must be one of them (the replicas refuse
/// any other claim, see `hyphae_overlay::records::certified`); the same for `address6`
/// where it pins IPv6 addresses.
pub(crate) fn certified_config(
    cfg: &crate::config::Namespace,
    cert: &Certificate,
) -> Result<crate::config::Namespace> {
    let mut out = cfg.clone();
    let own = hyphae_dhcp_dns::dns::host_name(cert.name()).ok();
    match (&cfg.hostname, &own) {
        (Some(h), Some(name)) if h == name => {}
        (Some(h), _) => bail!(
            "namespace {}: hostname '{h}' is not the certificate's name '{}': with an authority the certificate names this host (leave `hostname` out)",
            cfg.name,
            cert.name()
        ),
        (None, _) => {}
    }
    out.hostname = own;
    let pinned: Vec<Ipv4Addr> = cert
        .addresses()
        .iter()
        .filter_map(|a| match a {
            IpAddr::V4(v4) => Some(*v4),
            IpAddr::V6(_) => None,
        })
        .collect();
    if let Some(first) = pinned.first() {
        let list = pinned
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        out.address = match cfg.address {
            Address::Auto => Address::Static(*first),
            Address::Static(a) if pinned.contains(&a) => cfg.address,
            Address::None => cfg.address,
            Address::Static(a) => bail!(
                "namespace {}: address {a} is not one the certificate allows ({list})",
                cfg.name
            ),
            Address::Dhcp => bail!(
                "namespace {}: the certificate pins this host's addresses ({list}): set `address` to \"auto\" or one of them, not \"dhcp\"",
                cfg.name
            ),
        };
    }
    let pinned6: Vec<std::net::Ipv6Addr> = cert
        .addresses()
        .iter()
        .filter_map(|a| match a {
            IpAddr::V6(v6) => Some(*v6),
            IpAddr::V4(_) => None,
        })
        .collect();
    if let Some(first) = pinned6.first() {
        use crate::config::Address6;
        out.address6 = match cfg.address6 {
            Address6::Auto => Address6::Static(*first),
            Address6::Static(a) if !pinned6.contains(&a) => bail!(
                "namespace {}: address6 {a} is not one the certificate allows ({})",
                cfg.name,
                pinned6
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            other => other,
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use hyphae_overlay::cert::{AuthorityKey, CertificateRequest, Trust};

    fn cert(name: &str, pins: &[Ipv4Addr]) -> Certificate {
        let pins: Vec<IpAddr> = pins.iter().map(|a| IpAddr::V4(*a)).collect();
        cert_with(name, &pins)
    }

    fn cert_with(name: &str, pins: &[IpAddr]) -> Certificate {
        let ca = AuthorityKey::from_seed([7; 32]);
        let me = hyphae_overlay::Identity::from_seed([1; 32]).peer_id();
        let bytes = ca
            .sign(&CertificateRequest {
                namespace: "lab".into(),
                identity: me,
                name: name.into(),
                groups: Vec::new(),
                addresses: pins.to_vec(),
                not_before: 0,
                not_after: u64::MAX / 2,
            })
            .unwrap();
        Trust::new("lab", ca.authority())
            .check(&bytes, &me, 1_800_000_000)
            .unwrap()
    }

    fn error(cfg: &crate::config::Namespace, cert: &Certificate) -> String {
        format!("{:#}", certified_config(cfg, cert).unwrap_err())
    }

    #[test]
    fn ipv6_pins_make_address6_as_ipv4_pins_make_address() {
        use crate::config::Address6;
        let base = crate::config::tests_namespace("lab");
        let v4 = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5));
        let six: std::net::Ipv6Addr = "fd00::5".parse().unwrap();
        // IPv4 pins alone leave the IPv6 address free.
        let out = certified_config(&base, &cert_with("web", &[v4])).unwrap();
        assert_eq!(out.address6, Address6::Auto);
        // An IPv6 pin makes `auto` the pinned address, and refuses another static one.
        let pinned = cert_with("web", &[v4, IpAddr::V6(six)]);
        assert_eq!(
            certified_config(&base, &pinned).unwrap().address6,
            Address6::Static(six)
        );
        let mut other = base.clone();
        other.address6 = Address6::Static("fd00::6".parse().unwrap());
        assert!(error(&other, &pinned)
            .contains("address6 fd00::6 is not one the certificate allows (fd00::5)"));
        let mut none = base.clone();
        none.address6 = Address6::None;
        assert_eq!(
            certified_config(&none, &pinned).unwrap().address6,
            Address6::None
        );
    }

    #[test]
    fn the_certificate_names_the_host_and_pins_its_address() {
        let base = crate::config::tests_namespace("lab");
        let (a, b) = (Ipv4Addr::new(10, 0, 0, 5), Ipv4Addr::new(10, 0, 0, 6));

        // No pins: the address stays as configured; the name is the certificate's.
        let free = cert("web", &[]);
        let out = certified_config(&base, &free).unwrap();
        assert_eq!(
            (out.address, out.hostname.as_deref()),
            (Address::Auto, Some("web"))
        );
        let mut named = base.clone();
        named.hostname = Some("web".into());
        assert_eq!(
            certified_config(&named, &free).unwrap().hostname.as_deref(),
            Some("web")
        );
        named.hostname = Some("db".into());
        assert!(
            error(&named, &free).contains("hostname 'db' is not the certificate's name 'web'"),
            "{}",
            error(&named, &free)
        );
        // A certificate name that is no host name: no name at all.
        let dotted = cert("web.eu", &[]);
        assert_eq!(certified_config(&base, &dotted).unwrap().hostname, None);

        // Pins: `auto` is the first, a static address must be one of them.
        let pinned = cert("web", &[b, a]);
        assert_eq!(
            certified_config(&base, &pinned).unwrap().address,
            Address::Static(b)
        );
        let mut fixed = base.clone();
        fixed.address = Address::Static(a);
        assert_eq!(
            certified_config(&fixed, &pinned).unwrap().address,
            Address::Static(a)
        );
        fixed.address = Address::Static(Ipv4Addr::new(10, 0, 0, 7));
        assert!(error(&fixed, &pinned)
            .contains("address 10.0.0.7 is not one the certificate allows (10.0.0.6, 10.0.0.5)"));
        fixed.address = Address::Dhcp;
        assert!(error(&fixed, &pinned).contains("not \"dhcp\""));
        fixed.address = Address::None;
        assert_eq!(
            certified_config(&fixed, &pinned).unwrap().address,
            Address::None
        );
    }
}
