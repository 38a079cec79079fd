//! The files a namespace's section names besides its secret: its authority, certificate
//! and revocation list (docs/SECURITY.md, "Certificates"), and its policy
//! (docs/POLICY.md). Each is read and checked at load; a mistake is one line naming the
//! file.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The policy in TOML file `path`, checked (`certified`: the namespace has an authority,
/// so rules may name groups and members). One line says what is wrong and where.
pub(crate) fn read_policy(path: &Path, certified: bool) -> Result<hyphae_vswitch::policy::Policy> {
    use hyphae_vswitch::policy::{Policy, PolicyFile};
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read policy {}", path.display()))?;
    let file: PolicyFile = toml::from_str(&text).map_err(|e| {
        anyhow::anyhow!(
            "policy {}: {}",
            path.display(),
            e.to_string().lines().collect::<Vec<_>>().join(" ")
        )
    })?;
    Policy::compile(&file, certified).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// A namespace's authority, this member's certificate and the revocation list to start
/// from: all or none of `authority` and `certificate`. The certificate must be the
/// authority's, for this namespace, and not expired (its identity is checked against the
/// agent's at start).
pub(super) fn read_credential(
    namespace: &str,
    authority: &Option<String>,
    certificate: &Option<PathBuf>,
    revocations: &Option<PathBuf>,
) -> Result<Option<hyphae_overlay::proof::Credential>> {
    use hyphae_overlay::cert::{unarmor, Authority, Trust};
    let (authority, path) = match (authority, certificate) {
        (None, None) => {
            if revocations.is_some() {
                bail!("revocations needs an authority");
            }
            return Ok(None);
        }
        (Some(_), None) => bail!(
            "authority is set but certificate is not (sign one with `hyphae cert sign` and name its file)"
        ),
        (None, Some(_)) => bail!("certificate is set but authority is not"),
        (Some(a), Some(p)) => (a, p),
    };
    let authority = Authority::from_text(authority)
        .map_err(|_| anyhow::anyhow!("authority '{authority}' is not an authority public key (base64 of 32 bytes, as `hyphae ca init` prints)"))?;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read certificate {}", path.display()))?;
    let bytes = unarmor(&text).map_err(|_| {
        anyhow::anyhow!("certificate {} is not a hyphae certificate", path.display())
    })?;
    let cert = authority
        .open_certificate(&bytes)
        .map_err(|e| anyhow::anyhow!("certificate {}: {e}", path.display()))?;
    if cert.namespace() != namespace {
        bail!(
            "certificate {} is for namespace '{}', not '{namespace}'",
            path.display(),
            cert.namespace()
        );
    }
    let mut trust = Trust::new(namespace, authority);
    if let Some(list) = revocations {
        let text = std::fs::read_to_string(list)
            .with_context(|| format!("cannot read revocations {}", list.display()))?;
        let bytes = unarmor(&text).map_err(|_| {
            anyhow::anyhow!(
                "revocations {} is not a hyphae revocation list",
                list.display()
            )
        })?;
        trust
            .update(&bytes)
            .map_err(|e| anyhow::anyhow!("revocations {}: {e}", list.display()))?;
    }
    Ok(Some(hyphae_overlay::proof::Credential {
        trust,
        certificate: bytes,
    }))
}
