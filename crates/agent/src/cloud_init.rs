//! `hyphae cloud-init`: `#cloud-config` user-data that makes a new VM a member of a
//! namespace on first boot: it installs hyphae (a package or binary URL checked against its
//! SHA-256, or a binary already in the image), writes the config and the namespace secret
//! (root's only, 0600, under /etc/hyphae), and starts the agent: the systemd unit where
//! systemd runs, else `hyphae up` in the background.
//!
//! The YAML is written by hand: every scalar that carries user input is a JSON string
//! (a JSON string is a valid YAML double-quoted scalar, escapes included), the config and
//! unit are literal blocks of text we generated, and the secret is base64
//! (`encoding: b64`), so nothing a user passes can change the document's structure.
//! `cloud-init schema --config-file` checks the output of every provider in the tests.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use base64::Engine as _;
use toml_edit::{value, Array, ArrayOfTables, DocumentMut, Table};

use crate::config::{Config, DEFAULT_PORT};
use hyphae_overlay::TUNNEL_OVERHEAD;

/// Where the generated user-data puts things on the VM.
pub const CONFIG_PATH: &str = "/etc/hyphae/hyphae.toml";
/// The unit the user-data writes when it installs a bare binary.
const UNIT_PATH: &str = "/etc/systemd/system/hyphae.service";
/// Where a downloaded binary goes (outside the package manager's /usr/bin).
const LOCAL_BINARY: &str = "/usr/local/bin/hyphae";
/// The binary a package installs; `dist/hyphae.service` names it.
const PACKAGE_BINARY: &str = "/usr/bin/hyphae";
/// The unit file shipped in the repository (and in the Debian package).
pub const UNIT: &str = include_str!("../../../dist/hyphae.service");

/// What differs between clouds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Provider {
    /// Amazon EC2.
    Aws,
    /// Google Compute Engine.
    Gcp,
    /// Microsoft Azure.
    Azure,
    /// DigitalOcean droplets.
    Digitalocean,
    /// Hetzner Cloud.
    Hetzner,
    /// Anything else (and bare metal).
    Generic,
}

impl Provider {
    /// The underlay MTU the namespace's tunnels must fit.
    ///
    /// GCP's default VPC MTU is 1460. AWS allows 9001 inside a VPC, but 1500 through an
    /// internet gateway, peering across regions or a VPN: a namespace reaches past the VPC,
    /// so 1500 unless `--underlay-mtu 9001` says every member is inside it. Hetzner's
    /// private networks have 1450 (its public interface 1500): 1450 fits both.
    pub fn underlay_mtu(self) -> u16 {
        match self {
            Provider::Gcp => 1460,
            Provider::Hetzner => 1450,
            Provider::Aws | Provider::Azure | Provider::Digitalocean | Provider::Generic => 1500,
        }
    }

    /// The primary interface of the provider's stock images (predictable names: ENA is
    /// `ens5` on Nitro, virtio-net `ens4` on GCE); the boot script asks the default route
    /// first and falls back to this.
    pub fn interface(self) -> &'static str {
        match self {
            Provider::Aws => "ens5",
            Provider::Gcp => "ens4",
            Provider::Azure | Provider::Digitalocean | Provider::Hetzner | Provider::Generic => {
                "eth0"
            }
        }
    }

    /// A shell command printing the instance's name as the provider knows it (its
    /// metadata service), tried before `hostname -s`.
    pub fn instance_name(self) -> Option<&'static str> {
        match self {
            // The Name tag; only there with "instance metadata tags" enabled (IMDSv2).
            Provider::Aws => Some(
                "t=$(curl -sf -m 2 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' \
                 http://169.254.169.254/latest/api/token) && curl -sf -m 2 -H \
                 \"X-aws-ec2-metadata-token: $t\" \
                 http://169.254.169.254/latest/meta-data/tags/instance/Name",
            ),
            Provider::Gcp => Some(
                "curl -sf -m 2 -H 'Metadata-Flavor: Google' \
                 http://metadata.google.internal/computeMetadata/v1/instance/name",
            ),
            Provider::Azure => Some(
                "curl -sf -m 2 -H 'Metadata: true' \
                 'http://169.254.169.254/metadata/instance/compute/name?api-version=2021-02-01&format=text'",
            ),
            Provider::Digitalocean => {
                Some("curl -sf -m 2 http://169.254.169.254/metadata/v1/hostname")
            }
            Provider::Hetzner => {
                Some("curl -sf -m 2 http://169.254.169.254/hetzner/v1/metadata/hostname")
            }
            Provider::Generic => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Provider::Aws => "aws",
            Provider::Gcp => "gcp",
            Provider::Azure => "azure",
            Provider::Digitalocean => "digitalocean",
            Provider::Hetzner => "hetzner",
            Provider::Generic => "generic",
        }
    }
}

/// `hyphae cloud-init`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct CloudInitArgs {
    /// Namespace name.
    #[arg(long)]
    pub namespace: String,
    /// The namespace secret to embed (read here; written 0600 on the VM).
    #[arg(long)]
    pub secret_file: PathBuf,
    /// A member to join through: host:port, host, or a libp2p multiaddr (repeatable).
    #[arg(long)]
    pub bootstrap: Vec<String>,
    /// The namespace subnet: only for a namespace's first member (no --bootstrap). In a
    /// multi-subnet namespace, this member's own.
    #[arg(long)]
    pub subnet: Option<String>,
    /// A multi-subnet namespace's subnets, comma-separated (a namespace's first member).
    #[arg(long, value_delimiter = ',')]
    pub subnets: Vec<String>,
    /// interface, router or hybrid.
    #[arg(long, default_value = "interface")]
    pub mode: String,
    /// Router and hybrid modes: the LAN bridge.
    #[arg(long)]
    pub bridge: Option<String>,
    /// Router and hybrid modes: the LAN interface to put on the bridge.
    #[arg(long)]
    pub uplink: Option<String>,
    /// Router mode: `veb` (LAN hosts reach each other through the bridge) or `vepa` (only
    /// through the agent, checked and counted).
    #[arg(long)]
    pub lan_ports: Option<String>,
    /// `auto`, `dhcp` or a static address (router mode: none).
    #[arg(long)]
    pub address: Option<String>,
    /// The namespace's IPv6 prefix, or `off` (IPv4 only); default: the unique local /64
    /// derived from the namespace, the same at every member.
    #[arg(long)]
    pub subnet6: Option<String>,
    /// `auto`, a static IPv6 address of the prefix, or `none` (router mode: none; it claims
    /// its LAN hosts').
    #[arg(long)]
    pub address6: Option<String>,
    /// This member's name in the namespace DNS; default: the instance's name from the
    /// provider's metadata, else its host name, at boot.
    #[arg(long)]
    pub hostname: Option<String>,
    /// How the binary arrives: an https URL of a .deb or a binary (with --sha256), or the
    /// absolute path of a hyphae binary already in the image.
    #[arg(long)]
    pub install: String,
    /// SHA-256 (hex) of what --install downloads.
    #[arg(long)]
    pub sha256: Option<String>,
    /// The cloud: sets the underlay MTU, the primary interface and the instance name's
    /// source.
    #[arg(long, value_enum, default_value = "generic")]
    pub provider: Provider,
    /// The underlay MTU, if not the provider's (the TAP MTU is this less the tunnel
    /// overhead).
    #[arg(long)]
    pub underlay_mtu: Option<u16>,
    /// Underlay UDP/TCP port.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// A namespace with an authority: its key file (`hyphae ca init`). The user-data then
    /// carries a fresh identity for the VM and a certificate signed for it, named
    /// --hostname (or --cert-name), with --groups.
    #[arg(long, conflicts_with_all = ["certificate", "identity_key"])]
    pub ca: Option<PathBuf>,
    /// With --ca: the name the certificate gives the VM (default: --hostname).
    #[arg(long)]
    pub cert_name: Option<String>,
    /// With --ca: groups, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub groups: Vec<String>,
    /// With --ca: days the certificate is valid for.
    #[arg(long, default_value_t = 365)]
    pub cert_days: u64,
    /// A namespace with an authority, certificate made already (`hyphae cert sign`): its
    /// file; needs --identity-key (the identity it was signed for) and --authority.
    #[arg(long, requires_all = ["identity_key", "authority"])]
    pub certificate: Option<PathBuf>,
    /// With --certificate: the identity key file it names (`identity.key` of a state
    /// directory).
    #[arg(long, requires = "certificate")]
    pub identity_key: Option<PathBuf>,
    /// With --certificate: the namespace authority's public key.
    #[arg(long)]
    pub authority: Option<String>,
}

/// What a VM of a namespace with an authority gets: its identity key (stored form), its
/// certificate (armored) and the authority.
struct Credential {
    identity: String,
    certificate: String,
    authority: String,
}

/// Where the VM's certificate goes.
fn certificate_path(namespace: &str) -> String {
    format!("/etc/hyphae/{namespace}.crt")
}

/// The identity and certificate the flags ask for, if any.
fn credential(args: &CloudInitArgs) -> Result<Option<Credential>> {
    if let Some(ca) = &args.ca {
        let name = args
            .cert_name
            .clone()
            .or_else(|| args.hostname.clone())
            .context("--ca needs --hostname or --cert-name: the certificate names the VM")?;
        let identity = hyphae_overlay::Identity::from_seed(crate::setup::os_seed()?);
        let (certificate, authority) = crate::ca::sign_for(
            ca,
            &args.namespace,
            identity.peer_id(),
            &name,
            &args.groups,
            args.cert_days,
        )?;
        return Ok(Some(Credential {
            identity: identity.to_text(),
            certificate,
            authority,
        }));
    }
    let (Some(cert), Some(key), Some(authority)) =
        (&args.certificate, &args.identity_key, &args.authority)
    else {
        return Ok(None);
    };
    let certificate =
        std::fs::read_to_string(cert).with_context(|| format!("cannot read {}", cert.display()))?;
    let identity =
        std::fs::read_to_string(key).with_context(|| format!("cannot read {}", key.display()))?;
    let id = hyphae_overlay::Identity::from_text(&identity)
        .map_err(|_| anyhow::anyhow!("{} is not an identity key", key.display()))?;
    let bytes = hyphae_overlay::cert::unarmor(&certificate)
        .map_err(|_| anyhow::anyhow!("{} is not a certificate", cert.display()))?;
    let decoded = hyphae_overlay::cert::Certificate::decode(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: {e}", cert.display()))?;
    if decoded.identity() != id.peer_id() {
        bail!(
            "{} is for identity {}, not the one in {} ({})",
            cert.display(),
            decoded.identity(),
            key.display(),
            id.peer_id()
        );
    }
    Ok(Some(Credential {
        identity,
        certificate,
        authority: authority.clone(),
    }))
}

/// How the binary gets onto the VM.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Install {
    Download {
        url: String,
        sha256: String,
        deb: bool,
    },
    InImage(String),
}

impl Install {
    fn parse(install: &str, sha256: Option<&str>) -> Result<Self> {
        if install.starts_with("https://") || install.starts_with("http://") {
            let Some(sha256) = sha256 else {
                bail!("--install {install} needs --sha256 (`sha256sum FILE` prints it)");
            };
            if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                bail!("--sha256 must be 64 hex digits");
            }
            if install.chars().any(|c| c.is_whitespace() || c.is_control()) {
                bail!("--install URL must not contain whitespace");
            }
            let path = install.split(['?', '#']).next().unwrap_or(install);
            Ok(Self::Download {
                url: install.to_string(),
                sha256: sha256.to_ascii_lowercase(),
                deb: path.ends_with(".deb"),
            })
        } else if install.starts_with('/') {
            if sha256.is_some() {
                bail!("--sha256 is for a downloaded --install URL, not a path in the image");
            }
            Ok(Self::InImage(install.to_string()))
        } else {
            bail!("--install must be an http(s) URL of a .deb or binary, or an absolute path");
        }
    }

    /// The binary the VM runs.
    fn binary(&self) -> &str {
        match self {
            Self::Download { deb: true, .. } => PACKAGE_BINARY,
            Self::Download { deb: false, .. } => LOCAL_BINARY,
            Self::InImage(path) => path,
        }
    }
}

/// The `#cloud-config` user-data for `args`.
pub fn user_data(args: &CloudInitArgs) -> Result<String> {
    let install = Install::parse(&args.install, args.sha256.as_deref())?;
    let secret = std::fs::read(&args.secret_file).with_context(|| {
        format!(
            "cannot read secret file {} (create one with `hyphae secret > {}`)",
            args.secret_file.display(),
            args.secret_file.display()
        )
    })?;
    let underlay_mtu = args.underlay_mtu.unwrap_or(args.provider.underlay_mtu());
    let mtu = tap_mtu(underlay_mtu)?;
    let secret_path = format!("/etc/hyphae/{}.secret", args.namespace);
    let credential = credential(args)?;
    let config = config_text(args, &secret_path, mtu, credential.as_ref())?;
    check_config(&config, &secret, credential.as_ref())?;

    let mut out = String::from("#cloud-config\n");
    let _ = writeln!(
        out,
        "# hyphae: join namespace {} on first boot (provider {}: underlay MTU {underlay_mtu}, \
         TAP MTU {mtu}, primary interface {}).",
        args.namespace,
        args.provider.name(),
        args.provider.interface(),
    );
    out += "# Holds the namespace secret: pass it as user-data only, never publish it.\n";
    out += "write_files:\n";
    file_entry(&mut out, &secret_path, "0600", Content::Base64(&secret));
    file_entry(&mut out, CONFIG_PATH, "0600", Content::Text(&config));
    if let Some(c) = &credential {
        // The identity the certificate names: the agent finds it in its state directory.
        let identity = format!("/var/lib/hyphae/{}", crate::setup::IDENTITY_FILE);
        file_entry(
            &mut out,
            &identity,
            "0600",
            Content::Base64(c.identity.as_bytes()),
        );
        let path = certificate_path(&args.namespace);
        file_entry(&mut out, &path, "0644", Content::Text(&c.certificate));
    }
    if !matches!(install, Install::Download { deb: true, .. }) {
        let unit = UNIT.replace(PACKAGE_BINARY, install.binary());
        file_entry(&mut out, UNIT_PATH, "0644", Content::Text(&unit));
    }
    out += "runcmd:\n";
    for line in boot_script(args, &install, underlay_mtu) {
        let _ = writeln!(out, "  - {}", quote(&line));
    }
    Ok(out)
}

/// The TAP MTU that fits tunnel datagrams into `underlay_mtu`.
fn tap_mtu(underlay_mtu: u16) -> Result<u16> {
    let overhead = u16::try_from(TUNNEL_OVERHEAD).unwrap_or(u16::MAX);
    match underlay_mtu.checked_sub(overhead) {
        Some(mtu) if mtu >= 576 => Ok(mtu),
        _ => bail!(
            "underlay MTU {underlay_mtu} is too small (at least {})",
            576 + overhead
        ),
    }
}

/// The VM's hyphae.toml: the defaults the unit relies on (/var/lib/hyphae, /run/hyphae),
/// spelled out.
fn config_text(
    args: &CloudInitArgs,
    secret_path: &str,
    mtu: u16,
    credential: Option<&Credential>,
) -> Result<String> {
    let mut doc = DocumentMut::new();
    doc.decor_mut().set_prefix(
        "# Written by `hyphae cloud-init`. Every key is in the README's configuration table.\n",
    );
    let mut agent = Table::new();
    agent["state_dir"] = value("/var/lib/hyphae");
    agent["control_socket"] = value("/run/hyphae/hyphae.sock");
    agent["listen"] = value(format!("0.0.0.0:{}", args.port));
    doc["agent"] = toml_edit::Item::Table(agent);
    let mut ns = Table::new();
    ns["name"] = value(args.namespace.as_str());
    ns["secret_file"] = value(secret_path);
    ns["mode"] = value(args.mode.as_str());
    ns["device"] = value("hyphae0");
    if let Some(subnet) = &args.subnet {
        ns["subnet"] = value(subnet.as_str());
    }
    if !args.subnets.is_empty() {
        ns["subnets"] = value(Array::from_iter(args.subnets.iter().map(String::as_str)));
    }
    match (args.mode.as_str(), &args.address) {
        ("router", None) => {}
        (_, address) => ns["address"] = value(address.as_deref().unwrap_or("auto")),
    }
    if let Some(subnet6) = &args.subnet6 {
        ns["subnet6"] = value(subnet6.as_str());
    }
    if let Some(address6) = &args.address6 {
        ns["address6"] = value(address6.as_str());
    }
    if let Some(bridge) = &args.bridge {
        ns["bridge"] = value(bridge.as_str());
    }
    if let Some(uplink) = &args.uplink {
        ns["uplink"] = value(uplink.as_str());
    }
    if let Some(ports) = &args.lan_ports {
        ns["lan_ports"] = value(ports.as_str());
    }
    if !args.bootstrap.is_empty() {
        ns["bootstrap"] = value(Array::from_iter(args.bootstrap.iter().map(String::as_str)));
    } else if args.subnet.is_none() && args.subnets.is_empty() {
        bail!("give --bootstrap (a member to join through), or --subnet (--subnets) for a namespace's first member");
    }
    if let Some(hostname) = &args.hostname {
        ns["hostname"] = value(hostname.as_str());
    }
    ns["mtu"] = value(i64::from(mtu));
    if let Some(c) = credential {
        ns["authority"] = value(c.authority.as_str());
        ns["certificate"] = value(certificate_path(&args.namespace));
    }
    let mut namespaces = ArrayOfTables::new();
    namespaces.push(ns);
    doc["namespace"] = toml_edit::Item::ArrayOfTables(namespaces);
    Ok(doc.to_string())
}

/// Validates the generated config with the agent's own loader (its secret in a private
/// temporary file), so a bad flag is an error here, not on the VM.
fn check_config(config: &str, secret: &[u8], credential: Option<&Credential>) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let seed = crate::setup::os_seed()?;
    let dir = std::env::temp_dir().join(format!(
        "hyphae-cloud-init-{}-{:x}",
        std::process::id(),
        u64::from_le_bytes([
            seed[0], seed[1], seed[2], seed[3], seed[4], seed[5], seed[6], seed[7]
        ])
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let result = (|| -> Result<()> {
        let secret_file = dir.join("secret");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&secret_file)?;
        std::io::Write::write_all(&mut f, secret)?;
        let mut doc: DocumentMut = config.parse()?;
        let certificate = dir.join("certificate");
        if let Some(c) = credential {
            std::fs::write(&certificate, &c.certificate)?;
        }
        if let Some(ns) = doc["namespace"]
            .as_array_of_tables_mut()
            .and_then(|a| a.get_mut(0))
        {
            ns["secret_file"] = value(secret_file.display().to_string());
            if credential.is_some() {
                ns["certificate"] = value(certificate.display().to_string());
            }
        }
        let path = dir.join("hyphae.toml");
        std::fs::write(&path, doc.to_string())?;
        Config::load(&path).map(|_| ()).map_err(|e| {
            // The errors name the temporary file: say which flags made it.
            anyhow::anyhow!(
                "{}",
                format!("{e:#}").replace(&path.display().to_string(), "the generated config")
            )
        })
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

enum Content<'a> {
    Text(&'a str),
    Base64(&'a [u8]),
}

fn file_entry(out: &mut String, path: &str, permissions: &str, content: Content<'_>) {
    let _ = writeln!(out, "  - path: {}", quote(path));
    out.push_str("    owner: \"root:root\"\n");
    let _ = writeln!(out, "    permissions: \"{permissions}\"");
    match content {
        Content::Base64(bytes) => {
            out.push_str("    encoding: b64\n");
            let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
            let _ = writeln!(out, "    content: {}", quote(&b64));
        }
        Content::Text(text) if literal_block_safe(text) => {
            out.push_str("    content: |\n");
            for line in text.lines() {
                if line.is_empty() {
                    out.push('\n');
                } else {
                    let _ = writeln!(out, "      {line}");
                }
            }
        }
        Content::Text(text) => {
            let _ = writeln!(out, "    content: {}", quote(text));
        }
    }
}

/// Whether `text` reads back unchanged from a `|` block: one trailing newline, no leading
/// space on the first line (it would set the indentation), printable characters only.
fn literal_block_safe(text: &str) -> bool {
    text.ends_with('\n')
        && !text.ends_with("\n\n")
        && !text.starts_with([' ', '\n'])
        && text
            .chars()
            .all(|c| c == '\n' || (!c.is_control() && c != '\u{feff}'))
        && !text.lines().any(|l| l.ends_with(' '))
}

/// A YAML double-quoted scalar: JSON's string syntax is a subset of it.
fn quote(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// A single-quoted shell word.
fn sh(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The first-boot script, one runcmd item a line: cloud-init runs them as one `sh` script.
fn boot_script(args: &CloudInitArgs, install: &Install, underlay_mtu: u16) -> Vec<String> {
    let bin = sh(install.binary());
    let config = sh(CONFIG_PATH);
    let mut lines = vec!["set -eu".to_string()];
    match install {
        Install::Download { url, sha256, deb } => {
            lines.push(
                if *deb {
                    "f=$(mktemp --suffix=.deb)"
                } else {
                    "f=$(mktemp)"
                }
                .into(),
            );
            lines.push(format!(
                "curl -fsSL --retry 5 -o \"$f\" {u} || wget -q -O \"$f\" {u}",
                u = sh(url)
            ));
            lines.push(format!("echo \"{sha256}  $f\" | sha256sum -c --quiet -"));
            if *deb {
                lines.push("dpkg -i \"$f\"".into());
            } else {
                lines.push(format!("install -m 0755 \"$f\" {bin}"));
            }
            lines.push("rm -f \"$f\"".into());
        }
        Install::InImage(path) => {
            lines.push(format!(
                "test -x {p} || {{ echo \"hyphae: {p} is not in the image\" >&2; exit 1; }}",
                p = sh(path)
            ));
        }
    }
    // The real underlay may be smaller than the provider's default (a custom VPC MTU):
    // the TAP MTU follows the primary interface down, never up.
    lines.push(format!(
        "dev=$(ip -o -4 route show default 2>/dev/null | awk '{{print $5; exit}}'); dev=${{dev:-{}}}",
        args.provider.interface()
    ));
    lines.push(format!(
        "m=$(cat \"/sys/class/net/$dev/mtu\" 2>/dev/null || echo {underlay_mtu}); \
         if [ \"$m\" -lt {underlay_mtu} ]; then sed -i \"s/^mtu = .*/mtu = $((m - {}))/\" {config}; fi",
        TUNNEL_OVERHEAD
    ));
    if args.hostname.is_none() && args.mode != "router" {
        let source = match args.provider.instance_name() {
            Some(cmd) => format!("n=$({cmd}) || n=$(hostname -s)"),
            None => "n=$(hostname -s)".to_string(),
        };
        lines.push(source);
        // One DNS label: lowercase letters, digits and inner '-'.
        lines.push(
            "n=$(printf %s \"$n\" | tr 'A-Z' 'a-z' | tr -c 'a-z0-9-' '-' | sed 's/^-*//; s/-*$//' | cut -c1-63)"
                .into(),
        );
        lines.push(format!(
            "[ -z \"$n\" ] || {bin} name set {ns} \"$n\" --config {config} \
             || echo \"hyphae: $n cannot name this member; set one with hyphae name set\" >&2",
            ns = sh(&args.namespace)
        ));
    }
    lines.push(format!(
        "if [ -d /run/systemd/system ]; then systemctl daemon-reload; systemctl enable --now hyphae.service; \
         else mkdir -p -m 0700 /var/lib/hyphae; mkdir -p /run/hyphae; \
         (umask 077; nohup {bin} up --config {config} >>/var/log/hyphae.log 2>&1 & echo $! > /run/hyphae/hyphae.pid); fi"
    ));
    lines
}

/// Writes `hyphae cloud-init` output for `args` to stdout.
pub fn print(args: &CloudInitArgs) -> Result<()> {
    let text = user_data(args)?;
    std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes())
        .context("cannot write the user-data")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_needs_its_checksum_and_a_path_must_be_absolute() {
        assert!(Install::parse("https://example.org/hyphae.deb", None).is_err());
        assert!(Install::parse("https://example.org/hyphae.deb", Some("ab")).is_err());
        let sum = "a".repeat(64);
        assert_eq!(
            Install::parse("https://example.org/hyphae_0.1_amd64.deb", Some(&sum)).unwrap(),
            Install::Download {
                url: "https://example.org/hyphae_0.1_amd64.deb".into(),
                sha256: sum.clone(),
                deb: true
            }
        );
        assert_eq!(
            Install::parse("https://example.org/hyphae", Some(&sum))
                .unwrap()
                .binary(),
            LOCAL_BINARY
        );
        assert!(Install::parse("hyphae", None).is_err());
        assert!(Install::parse("/opt/hyphae", Some(&sum)).is_err());
        assert_eq!(
            Install::parse("/opt/hyphae", None).unwrap().binary(),
            "/opt/hyphae"
        );
    }

    #[test]
    fn the_tap_mtu_leaves_room_for_the_tunnel() {
        assert_eq!(tap_mtu(1500).unwrap(), hyphae_overlay::DEFAULT_MTU);
        assert_eq!(
            tap_mtu(1460).unwrap(),
            1460 - hyphae_overlay::DEFAULT_MTU.abs_diff(1500)
        );
        assert!(tap_mtu(600).is_err());
    }

    #[test]
    fn quoting_keeps_hostile_text_inside_its_scalar() {
        assert_eq!(quote("a\"b\n: c"), r#""a\"b\n: c""#);
        assert_eq!(sh("it's"), r"'it'\''s'");
        assert!(!literal_block_safe(" leading"));
        assert!(!literal_block_safe("no newline"));
        assert!(literal_block_safe("[agent]\nlisten = \"x\"\n"));
    }
}
