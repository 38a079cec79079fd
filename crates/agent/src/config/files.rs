//! The files a namespace's section names besides its secret: its authority, certificate
//! and revocation list (docs/SECURITY.md, "Certificates"), and its policy
//! (docs/POLICY.md). Each is read and checked at load; a mistake is one line naming the
//! file.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The armor word of a signed policy file.
pub(crate) const SIGNED_POLICY: &str = "POLICY";

/// Policy `text` (TOML) compiled (`certified`: the namespace has an authority, so rules may
/// name groups and members; `layer2`: the namespace is a layer-2 one, or an IP one, if
/// known, and its rules must fit it). One line says what is wrong, after `what` (which
/// names it).
pub(crate) fn compile_policy(
    text: &str,
    certified: bool,
    layer2: Option<bool>,
    what: &str,
) -> Result<hyphae_vswitch::policy::Policy> {
    use hyphae_vswitch::policy::{Policy, PolicyFile};
    let file: PolicyFile = toml::from_str(text).map_err(|e| {
        anyhow::anyhow!(
            "{what}: {}",
            e.to_string().lines().collect::<Vec<_>>().join(" ")
        )
    })?;
    let policy = Policy::compile(&file, certified).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
    match layer2 {
        Some(layer2) => policy.check_layer(layer2),
        // Not known (signing): it must fit one kind of namespace or the other.
        None => policy
            .check_layer(false)
            .or_else(|_| policy.check_layer(true)),
    }
    .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
    Ok(policy)
}

/// Whether `text` is a signed policy file (`hyphae policy sign`) rather than TOML.
pub(crate) fn is_signed_policy(text: &str) -> bool {
    text.trim_start()
        .starts_with(&format!("-----BEGIN HYPHAE {SIGNED_POLICY}-----"))
}

/// The policy in file `path`, checked. Without an authority it is the TOML file itself;
/// with one (`trust`), it must be signed by the authority (`hyphae policy sign`), and it
/// is taken into the trust, whose newest policy is the one in force.
pub(crate) fn read_policy(
    path: &Path,
    trust: Option<&mut hyphae_overlay::cert::Trust>,
    layer2: bool,
) -> Result<hyphae_vswitch::policy::Policy> {
    use hyphae_overlay::cert::unarmor;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read policy {}", path.display()))?;
    let shown = path.display().to_string();
    let Some(trust) = trust else {
        if is_signed_policy(&text) {
            bail!("policy {shown} is signed, which only a namespace with an authority reads: name the TOML file");
        }
        return compile_policy(&text, false, Some(layer2), &format!("policy {shown}"));
    };
    if !is_signed_policy(&text) {
        bail!("policy {shown} is not signed: with an authority the namespace's policy is the one it signs (`hyphae policy sign --ca KEY {shown}`; name the signed file, or publish it with `hyphae policy publish`)");
    }
    let bytes = unarmor(&text)
        .map_err(|_| anyhow::anyhow!("policy {shown} is not a hyphae signed policy"))?;
    // Checked and compiled before the trust takes it: one that does not compile is never
    // held (nor handed on).
    let signed = trust
        .authority()
        .open_policy(&bytes)
        .map_err(|e| anyhow::anyhow!("policy {shown}: {e}"))?;
    let policy = compile_policy(
        signed.text(),
        true,
        Some(layer2),
        &format!("policy {shown}"),
    )?;
    trust
        .update_policy(&bytes)
        .map_err(|e| anyhow::anyhow!("policy {shown}: {e}"))?;
    Ok(policy)
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

#[cfg(test)]
mod tests {
    use hyphae_overlay::cert::{armor, AuthorityKey, Trust};

    use super::*;

    #[test]
    fn with_an_authority_the_policy_is_the_one_it_signed() {
        let dir = std::env::temp_dir().join(format!("hyphae-signed-policy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = AuthorityKey::from_seed([3; 32]);
        let text = "version = 2\ndefault = \"deny\"\ngroups = [\"web\"]\n[[rule]]\nfrom = [\"group:web\"]\nto = [\"any\"]\n";
        let write = |name: &str, body: &str| {
            let p = dir.join(name);
            std::fs::write(&p, body).unwrap();
            p
        };
        let toml = write("plain.toml", text);
        let signed = write(
            "good.policy",
            &armor(SIGNED_POLICY, &key.sign_policy("lab", 2, 0, text).unwrap()),
        );
        let forged = write(
            "forged.policy",
            &armor(
                SIGNED_POLICY,
                &AuthorityKey::from_seed([4; 32])
                    .sign_policy("lab", 2, 0, text)
                    .unwrap(),
            ),
        );
        let broken = write(
            "broken.policy",
            &armor(
                SIGNED_POLICY,
                &key.sign_policy(
                    "lab",
                    3,
                    0,
                    "version = 3\n[[rule]]\nfrom = [\"group:nope\"]\nto = [\"any\"]\n",
                )
                .unwrap(),
            ),
        );
        let error = |path: &Path, trust: Option<&mut Trust>| {
            format!("{:#}", read_policy(path, trust, false).unwrap_err())
        };

        let mut trust = Trust::new("lab", key.authority());
        let policy = read_policy(&signed, Some(&mut trust), false).unwrap();
        assert_eq!((policy.version(), policy.rule_count()), (2, 1));
        assert_eq!(trust.policy_version(), 2);

        let mut trust = Trust::new("lab", key.authority());
        assert!(error(&toml, Some(&mut trust)).contains("is not signed"));
        assert!(error(&forged, Some(&mut trust)).contains("issued by another authority"));
        assert!(error(&broken, Some(&mut trust)).contains("unknown group 'nope'"));
        assert_eq!(trust.policy_version(), 0);
        assert!(error(&signed, None).contains("only a namespace with an authority"));
        // Without an authority, the TOML file itself (and groups are refused).
        assert!(error(&toml, None).contains("needs a namespace with an authority"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
