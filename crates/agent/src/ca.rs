//! `hyphae ca`, `hyphae cert` and `hyphae policy sign`: a namespace authority's key,
//! member certificates, revocation lists and signed policies, as files
//! (docs/SECURITY.md, "Certificates"; docs/POLICY.md, "With an authority").
//!
//! The authority key is a small TOML file (the namespace and the key's seed), written
//! 0600 and never read by the agent: keep it offline. Certificates and revocation lists
//! are armored text (`-----BEGIN HYPHAE CERTIFICATE-----`, base64).

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use hyphae_overlay::cert::{
    armor, fingerprint, is_valid_label, unarmor, AuthorityKey, Certificate, CertificateRequest,
    RevocationList, SignedPolicy,
};
use hyphae_overlay::PeerId;
use serde::Deserialize;

/// The armor word of a certificate file.
pub const CERTIFICATE: &str = "CERTIFICATE";
/// The armor word of a revocation list file.
pub const REVOCATIONS: &str = "REVOCATION LIST";

const DAY: u64 = 86_400;

/// An authority key file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    namespace: String,
    key: String,
}

/// `hyphae cert sign`.
#[derive(clap::Args, Debug)]
pub struct SignArgs {
    /// The authority key file (`hyphae ca init`).
    #[arg(long)]
    pub ca: PathBuf,
    /// The member's identity, as `hyphae id` prints it on that host.
    #[arg(long)]
    pub identity: String,
    /// The member's name in the namespace (lowercase letters, digits, '-', '_', '.').
    #[arg(long)]
    pub name: String,
    /// Groups policy can name it by, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub groups: Vec<String>,
    /// An address it may claim (repeat for more); none: any address.
    #[arg(long = "address")]
    pub addresses: Vec<IpAddr>,
    /// Days it is valid for, from now.
    #[arg(long, default_value_t = 365)]
    pub days: u64,
    /// Where to write it (default NAME.NAMESPACE.crt).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `hyphae cert revoke`.
#[derive(clap::Args, Debug)]
pub struct RevokeArgs {
    /// The authority key file.
    #[arg(long)]
    pub ca: PathBuf,
    /// The revocation list to extend: its version is raised by one and its entries kept
    /// (written back to it unless --out says otherwise).
    #[arg(long)]
    pub list: Option<PathBuf>,
    /// An identity to revoke with every certificate it has (repeat for more).
    #[arg(long = "identity")]
    pub identities: Vec<String>,
    /// A certificate file to revoke (repeat for more): the member may get another.
    #[arg(long = "certificate")]
    pub certificates: Vec<PathBuf>,
    /// Where to write the list (default: --list, or NAMESPACE.revocations).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Writes `text` to a new file `path` with mode `mode`; refuses to overwrite one.
fn write_new(path: &Path, text: &str, mode: u32) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// `hyphae ca init NAMESPACE`: writes a new authority key (0600) and returns the line
/// every member's config needs.
pub fn init(namespace: &str, out: Option<PathBuf>) -> Result<String> {
    if !is_valid_label(namespace) {
        bail!("'{namespace}' cannot name a namespace with an authority: use lowercase letters, digits, '-', '_' and '.'");
    }
    let path = out.unwrap_or_else(|| PathBuf::from(format!("{namespace}.ca.key")));
    let seed = crate::setup::os_seed()?;
    let key = AuthorityKey::from_seed(seed);
    let text = format!(
        "# The authority of hyphae namespace \"{namespace}\". Secret: keep it offline.\nnamespace = \"{namespace}\"\nkey = \"{}\"\n",
        B64.encode(key.seed())
    );
    write_new(&path, &text, 0o600)?;
    Ok(format!(
        "# authority key written to {} (keep it offline); put this line in the [[namespace]] of \"{namespace}\" on every member:\nauthority = \"{}\"",
        path.display(),
        key.authority()
    ))
}

/// Reads an authority key file: the namespace and the key.
fn read_key(path: &Path) -> Result<(String, AuthorityKey)> {
    use std::os::unix::fs::PermissionsExt as _;
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        bail!(
            "{} is accessible by group or others; run `chmod 600 {}`",
            path.display(),
            path.display()
        );
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let file: KeyFile = toml::from_str(&text).map_err(|e| {
        anyhow::anyhow!(
            "{} is not an authority key file: {}",
            path.display(),
            e.message()
        )
    })?;
    let seed: [u8; 32] = B64
        .decode(file.key.trim())
        .ok()
        .and_then(|b| b.try_into().ok())
        .with_context(|| format!("{}: key is not base64 of 32 bytes", path.display()))?;
    Ok((file.namespace, AuthorityKey::from_seed(seed)))
}

fn parse_identity(text: &str) -> Result<PeerId> {
    PeerId::from_text(text).map_err(|_| {
        anyhow::anyhow!(
            "'{text}' is not a member identity (base64 of 32 bytes, as `hyphae id` prints)"
        )
    })
}

/// Signs a certificate with the authority key at `ca` for `identity`, valid from now for
/// `days`: the key's namespace, the key, the certificate's bytes.
fn sign_request(
    ca: &Path,
    identity: PeerId,
    name: &str,
    groups: &[String],
    addresses: &[IpAddr],
    days: u64,
) -> Result<(String, AuthorityKey, Vec<u8>)> {
    let (namespace, key) = read_key(ca)?;
    if !is_valid_label(name) {
        bail!("name '{name}': use 1 to 63 lowercase letters, digits, '-', '_' and '.'");
    }
    if let Some(g) = groups.iter().find(|g| !is_valid_label(g)) {
        bail!("group '{g}': use 1 to 63 lowercase letters, digits, '-', '_' and '.'");
    }
    if days == 0 {
        bail!("--days must be at least 1");
    }
    let now = crate::driver::unix_now();
    let request = CertificateRequest {
        namespace: namespace.clone(),
        identity,
        name: name.to_string(),
        groups: groups.to_vec(),
        addresses: addresses.to_vec(),
        not_before: now,
        not_after: now.saturating_add(days.saturating_mul(DAY)),
    };
    let bytes = key.sign(&request).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((namespace, key, bytes))
}

/// For `hyphae cloud-init --ca`: a certificate for `identity` in `namespace` (which must be
/// the key's), armored, and the authority's public key.
pub(crate) fn sign_for(
    ca: &Path,
    namespace: &str,
    identity: PeerId,
    name: &str,
    groups: &[String],
    days: u64,
) -> Result<(String, String)> {
    let (ns, key, bytes) = sign_request(ca, identity, name, groups, &[], days)?;
    if ns != namespace {
        bail!(
            "{} is the authority of '{ns}', not of '{namespace}'",
            ca.display()
        );
    }
    Ok((armor(CERTIFICATE, &bytes), key.authority().to_string()))
}

/// `hyphae cert sign`: writes the certificate; returns what to tell the operator.
pub fn sign(args: &SignArgs) -> Result<String> {
    let identity = parse_identity(&args.identity)?;
    let (namespace, _, bytes) = sign_request(
        &args.ca,
        identity,
        &args.name,
        &args.groups,
        &args.addresses,
        args.days,
    )?;
    let path = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{}.{namespace}.crt", args.name)));
    write_new(&path, &armor(CERTIFICATE, &bytes), 0o644)?;
    let cert = Certificate::decode(&bytes).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(format!(
        "certificate written to {}\n{}",
        path.display(),
        describe(&cert)
    ))
}

/// `hyphae policy sign`: signs the policy in TOML file `file` with the authority key at
/// `ca`, as the version the file gives, and writes it (armored) to `out` (default: the
/// file with extension `.policy`). The policy is compiled first: a mistake is refused
/// here rather than at every member. Returns what to tell the operator.
pub fn sign_policy(ca: &Path, file: &Path, out: Option<PathBuf>) -> Result<String> {
    let (namespace, key) = read_key(ca)?;
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let policy =
        crate::config::compile_policy(&text, true, None, &format!("policy {}", file.display()))?;
    if policy.version() == 0 {
        bail!(
            "policy {}: give it `version = 1` or higher: members take a signed policy only if its version is newer than the one they hold",
            file.display()
        );
    }
    let bytes = key
        .sign_policy(
            &namespace,
            policy.version(),
            crate::driver::unix_now(),
            &text,
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let path = out.unwrap_or_else(|| file.with_extension("policy"));
    if path == file {
        bail!(
            "{} is the policy itself: name another --out",
            path.display()
        );
    }
    std::fs::write(&path, armor(crate::config::SIGNED_POLICY, &bytes))
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(format!(
        "policy version {} of '{namespace}' signed, written to {}
publish it from any member: hyphae policy publish {namespace} {}
",
        policy.version(),
        path.display(),
        path.display()
    ))
}

/// `hyphae cert show FILE`: what a certificate, revocation list or signed policy says,
/// and whether its signature verifies under the authority it names.
pub fn show(path: &Path) -> Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    if crate::config::is_signed_policy(&text) {
        let bytes = unarmor(&text)
            .map_err(|_| anyhow::anyhow!("{} is not a signed policy", path.display()))?;
        let policy =
            SignedPolicy::decode(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let signature = match policy.authority().open_policy(&bytes) {
            Ok(_) => "good".to_string(),
            Err(e) => format!("BAD ({e})"),
        };
        return Ok(format!(
            "policy of '{}' version {}
issued:      {}
authority:   {}
signature:   {signature}

{}",
            policy.namespace(),
            policy.version(),
            when(policy.issued()),
            policy.authority(),
            policy.text()
        ));
    }
    let bytes = unarmor(&text).map_err(|_| {
        anyhow::anyhow!(
            "{} is not a hyphae certificate or revocation list",
            path.display()
        )
    })?;
    if text.contains(REVOCATIONS) {
        let list = RevocationList::decode(&bytes)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        return Ok(describe_list(&list, &bytes));
    }
    let cert =
        Certificate::decode(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let signature = match cert.authority().open_certificate(&bytes) {
        Ok(_) => "good".to_string(),
        Err(e) => format!("BAD ({e})"),
    };
    Ok(format!("{}signature:   {signature}\n", describe(&cert)))
}

fn when(unix: u64) -> String {
    // Days since the epoch to a calendar date (Howard Hinnant's civil_from_days).
    let days = (unix / DAY) as i64;
    let secs = unix % DAY;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// A certificate, one field per line.
pub fn describe(cert: &Certificate) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "namespace:   {}", cert.namespace());
    let _ = writeln!(out, "name:        {}", cert.name());
    let _ = writeln!(out, "identity:    {}", cert.identity());
    let groups = if cert.groups().is_empty() {
        "(none)".to_string()
    } else {
        cert.groups().join(", ")
    };
    let _ = writeln!(out, "groups:      {groups}");
    let addresses = if cert.addresses().is_empty() {
        "any".to_string()
    } else {
        cert.addresses()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(out, "addresses:   {addresses}");
    let _ = writeln!(out, "valid from:  {}", when(cert.not_before()));
    let _ = writeln!(out, "valid until: {}", when(cert.not_after()));
    let _ = writeln!(out, "authority:   {}", cert.authority());
    let _ = writeln!(out, "fingerprint: {}", hex(&cert.fingerprint()));
    out
}

fn describe_list(list: &RevocationList, bytes: &[u8]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "revocation list version {}", list.version());
    let _ = writeln!(out, "issued:      {}", when(list.issued()));
    for id in list.identities() {
        let _ = writeln!(out, "identity:    {}", B64.encode(id));
    }
    for c in list.certificates() {
        let _ = writeln!(out, "certificate: {}", hex(c));
    }
    let _ = writeln!(out, "authority:   {}", list.authority());
    let signature = match list.authority().open_revocations(bytes) {
        Ok(_) => "good".to_string(),
        Err(e) => format!("BAD ({e})"),
    };
    let _ = writeln!(out, "signature:   {signature}");
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `hyphae cert revoke`: writes the next revocation list; returns what to tell the
/// operator.
pub fn revoke(args: &RevokeArgs) -> Result<String> {
    let (namespace, key) = read_key(&args.ca)?;
    let authority = key.authority();
    let mut identities = Vec::new();
    let mut certificates = Vec::new();
    let mut version = 1;
    if let Some(path) = &args.list {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let bytes = unarmor(&text)
            .map_err(|_| anyhow::anyhow!("{} is not a revocation list", path.display()))?;
        let list = authority
            .open_revocations(&bytes)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        version = list.version() + 1;
        for id in list.identities() {
            identities.push(PeerId::from_bytes(*id).map_err(|e| anyhow::anyhow!("{e}"))?);
        }
        certificates.extend(list.certificates().copied());
    }
    for text in &args.identities {
        identities.push(parse_identity(text)?);
    }
    for path in &args.certificates {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let bytes = unarmor(&text)
            .map_err(|_| anyhow::anyhow!("{} is not a certificate", path.display()))?;
        let cert = authority
            .open_certificate(&bytes)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        if cert.namespace() != namespace {
            bail!(
                "{} is for namespace '{}', not '{namespace}'",
                path.display(),
                cert.namespace()
            );
        }
        certificates.push(fingerprint(&bytes));
    }
    if args.identities.is_empty() && args.certificates.is_empty() && args.list.is_none() {
        bail!("nothing to revoke: give --identity or --certificate");
    }
    let bytes = key
        .revoke(
            version,
            crate::driver::unix_now(),
            &identities,
            &certificates,
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let path = args
        .out
        .clone()
        .or_else(|| args.list.clone())
        .unwrap_or_else(|| PathBuf::from(format!("{namespace}.revocations")));
    std::fs::write(&path, armor(REVOCATIONS, &bytes))
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(format!(
        "revocation list version {version} ({} identities, {} certificates) written to {}",
        identities.len(),
        certificates.len(),
        path.display()
    ))
}

/// `hyphae cert install`: checks `file` against namespace `namespace` of the config at
/// `config_path` (its authority, this host's identity, valid now), puts it in place of the
/// configured certificate, and asks a running agent to switch to it.
pub fn install(namespace: &str, file: &Path, config_path: &Path) -> Result<String> {
    let config = crate::config::Config::load(config_path)?;
    let ns = config
        .namespaces
        .iter()
        .find(|n| n.name == namespace)
        .with_context(|| format!("no namespace '{namespace}' in {}", config_path.display()))?;
    let (Some(credential), Some(target)) = (&ns.credential, &ns.certificate_path) else {
        bail!(
            "namespace '{namespace}' has no authority in {}",
            config_path.display()
        );
    };
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let bytes = unarmor(&text)
        .map_err(|_| anyhow::anyhow!("{} is not a hyphae certificate", file.display()))?;
    let identity = crate::setup::load_or_create_identity(&config.agent.state_dir)?.peer_id();
    let cert = credential
        .trust
        .check(&bytes, &identity, crate::driver::unix_now())
        .map_err(|e| anyhow::anyhow!("{}: {e} (for this host: `hyphae id`)", file.display()))?;
    let staged = target.with_extension("crt.new");
    std::fs::write(&staged, armor(CERTIFICATE, &bytes))
        .with_context(|| format!("cannot write {}", staged.display()))?;
    std::fs::rename(&staged, target)
        .with_context(|| format!("cannot replace {}", target.display()))?;
    let mut out = format!("installed as {}\n{}", target.display(), describe(&cert));
    match crate::control::request(
        &config.agent.control_socket,
        &crate::control::Request::ReloadCertificates,
    ) {
        Ok(reply) => {
            let v: serde_json::Value = serde_json::from_str(&reply)?;
            for line in v["lines"].as_array().into_iter().flatten() {
                out += &format!("agent: {}\n", line.as_str().unwrap_or_default());
            }
        }
        Err(_) => out += "no agent running: it starts with this certificate\n",
    }
    Ok(out.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_read_as_calendar_dates() {
        assert_eq!(when(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(when(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(when(1_798_761_599), "2026-12-31 23:59:59 UTC");
    }
}
