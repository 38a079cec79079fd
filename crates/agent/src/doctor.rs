//! `hyphae doctor`: checks this host against what the agent needs, one line per check, with
//! a fix for each failure. Everything is checked for real: the device opened, the sockets
//! bound, the members dialled. `warn` lines are optional speed-ups the agent does without;
//! the exit status is 0 only when no check failed.
#![allow(clippy::print_stdout)] // the CLI prints its results

use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Result};

use crate::config::{Config, Mode};
use hyphae_overlay::swarm::Multiaddr;

/// How long a bootstrap member gets to answer.
const DIAL_TIMEOUT: Duration = Duration::from_secs(3);

/// A clock before this (2025-01-01T00:00:00Z) is wrong: leases and records carry Unix
/// times that members compare.
const CLOCK_FLOOR_UNIX: u64 = 1_735_689_600;

const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_RAW: u32 = 13;
const CAP_BPF: u32 = 39;

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Fine; what was seen.
    Pass(String),
    /// An optional feature is missing: what, and how to get it.
    Warn(String, String),
    /// The agent will not work (or not fully): what, and the fix.
    Fail(String, String),
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// How it went.
    pub outcome: Outcome,
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.outcome {
            Outcome::Pass(what) => write!(f, "ok    {}: {what}", self.name),
            Outcome::Warn(what, fix) => write!(f, "warn  {}: {what}; fix: {fix}", self.name),
            Outcome::Fail(what, fix) => write!(f, "FAIL  {}: {what}; fix: {fix}", self.name),
        }
    }
}

fn check(name: impl Into<String>, outcome: Outcome) -> Check {
    Check {
        name: name.into(),
        outcome,
    }
}

/// Runs every check, printing each line as it completes; an error when any failed.
pub fn run(config_path: &Path) -> Result<()> {
    let mut failed = 0;
    let mut report = |c: Check| {
        if matches!(c.outcome, Outcome::Fail(..)) {
            failed += 1;
        }
        println!("{c}");
    };
    for c in secret_files(config_path) {
        report(c);
    }
    let config = match Config::load(config_path) {
        Ok(config) => {
            report(check(
                "config",
                Outcome::Pass(format!(
                    "{} is valid ({} namespaces)",
                    config_path.display(),
                    config.namespaces.len()
                )),
            ));
            Some(config)
        }
        Err(e) => {
            report(check(
                "config",
                Outcome::Fail(
                    format!("{e:#}").replace('\n', " "),
                    format!(
                        "edit {} (keys: the README's configuration table; examples/ has one per mode)",
                        config_path.display()
                    ),
                ),
            ));
            None
        }
    };
    report(tun_device());
    let caps = effective_caps();
    report(capabilities(caps));
    if let Some(config) = &config {
        report(forwarding(config));
        let identity = crate::setup::load_identity(&config.agent.state_dir);
        let now = crate::driver::unix_now();
        for ns in &config.namespaces {
            if let Some(c) = certificate(ns, identity.as_ref(), now) {
                report(c);
            }
        }
    }
    report(udp_offload());
    report(af_xdp(caps));
    // The network checks need only these few keys: they run even when the config as a
    // whole does not load (a wrong secret says nothing about the port).
    if let Some(net) = config
        .as_ref()
        .map(Network::of)
        .or_else(|| Network::read(config_path))
    {
        report(listen_port(&net));
        for c in bootstrap_members(&net) {
            report(c);
        }
    }
    report(clock());
    match failed {
        0 => Ok(()),
        1 => bail!("1 check failed"),
        n => bail!("{n} checks failed"),
    }
}

/// Each namespace's secret file: there, and root's only. Read from the raw file, so this
/// says what is wrong even when the config as a whole does not load.
fn secret_files(config_path: &Path) -> Vec<Check> {
    let Ok(text) = std::fs::read_to_string(config_path) else {
        return Vec::new();
    };
    let Ok(doc) = text.parse::<toml::Table>() else {
        return Vec::new();
    };
    let secrets: Vec<PathBuf> = doc
        .get("namespace")
        .and_then(toml::Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|n| n.get("secret_file")?.as_str().map(PathBuf::from))
                .collect()
        })
        .unwrap_or_default();
    secrets.iter().map(|p| secret_file(p)).collect()
}

fn secret_file(path: &Path) -> Check {
    let name = format!("secret {}", path.display());
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => {
            return check(
                name,
                Outcome::Fail(
                    format!("cannot read it: {e}"),
                    format!(
                        "copy the namespace's secret there, or make a new namespace's with `(umask 077; hyphae secret > {})`",
                        path.display()
                    ),
                ),
            )
        }
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return check(
            name,
            Outcome::Fail(
                format!("mode {mode:04o}: others can read the namespace secret"),
                format!("chmod 600 {}", path.display()),
            ),
        );
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != euid {
        return check(
            name,
            Outcome::Fail(
                format!("owned by uid {}, not this user ({euid})", meta.uid()),
                format!("chown {euid} {}", path.display()),
            ),
        );
    }
    check(
        name,
        Outcome::Pass(format!("mode {mode:04o}, owner {euid}")),
    )
}

fn tun_device() -> Check {
    let path = "/dev/net/tun";
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(_) => check("tun", Outcome::Pass(format!("{path} opens"))),
        Err(e) => check(
            "tun",
            Outcome::Fail(
                format!("cannot open {path}: {e}"),
                "modprobe tun (in a container: give it the device, e.g. --device /dev/net/tun)"
                    .into(),
            ),
        ),
    }
}

/// The process's effective capabilities (`CapEff` of /proc/self/status).
fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}

fn capabilities(caps: u64) -> Check {
    let missing: Vec<&str> = [
        (CAP_NET_ADMIN, "CAP_NET_ADMIN"),
        (CAP_NET_RAW, "CAP_NET_RAW"),
    ]
    .into_iter()
    .filter(|(bit, _)| caps & (1 << bit) == 0)
    .map(|(_, name)| name)
    .collect();
    if missing.is_empty() {
        check(
            "capabilities",
            Outcome::Pass("CAP_NET_ADMIN and CAP_NET_RAW".into()),
        )
    } else {
        check(
            "capabilities",
            Outcome::Fail(
                format!("missing {}", missing.join(", ")),
                "run as root (sudo), or as the systemd service (dist/hyphae.service grants them)"
                    .into(),
            ),
        )
    }
}

/// The kernel forwards IPv4 only for a router-mode namespace whose LAN hosts use this host
/// as their gateway (`gateway` is one of its addresses); the agent itself switches in
/// userspace and needs none.
fn forwarding(config: &Config) -> Check {
    let local = local_ipv4();
    let needing: Vec<&str> = config
        .namespaces
        .iter()
        .filter(|n| n.mode == Mode::Router && n.gateway.is_some_and(|g| local.contains(&g)))
        .map(|n| n.name.as_str())
        .collect();
    if needing.is_empty() {
        return check(
            "ip forwarding",
            Outcome::Pass("not needed: no namespace routes through this host".into()),
        );
    }
    let on =
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").is_ok_and(|v| v.trim() == "1");
    if on {
        check(
            "ip forwarding",
            Outcome::Pass("net.ipv4.ip_forward = 1".into()),
        )
    } else {
        check(
            "ip forwarding",
            Outcome::Fail(
                format!(
                    "off, and namespace '{}' hands out this host as the gateway",
                    needing.join("', '")
                ),
                "sysctl -w net.ipv4.ip_forward=1 (and net.ipv4.ip_forward = 1 in /etc/sysctl.d/)"
                    .into(),
            ),
        )
    }
}

/// This host's IPv4 addresses (`ip -o -4 addr show`).
fn local_ipv4() -> Vec<std::net::Ipv4Addr> {
    let Ok(out) = std::process::Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next()?.split('/').next()?.parse().ok()
        })
        .collect()
}

/// UDP GSO and GRO, as the agent's underlay socket (quinn-udp) finds them.
fn udp_offload() -> Check {
    let state = UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| quinn_udp::UdpSocketState::new((&s).into()).map(|st| (s, st)));
    match state {
        Ok((_, st)) if st.max_gso_segments() > 1 && st.gro_segments() > 1 => check(
            "udp gso/gro",
            Outcome::Pass(format!(
                "GSO up to {} segments, GRO up to {}",
                st.max_gso_segments(),
                st.gro_segments()
            )),
        ),
        Ok((_, st)) => check(
            "udp gso/gro",
            Outcome::Warn(
                format!(
                    "GSO {} / GRO {} segments: one system call per datagram",
                    st.max_gso_segments(),
                    st.gro_segments()
                ),
                "a Linux kernel of 5.0 or later (GSO 4.18, GRO 5.0)".into(),
            ),
        ),
        Err(e) => check(
            "udp gso/gro",
            Outcome::Fail(
                format!("cannot open a UDP socket: {e}"),
                "check the host's network stack".into(),
            ),
        ),
    }
}

/// AF_XDP sockets and CAP_BPF: what `underlay = "af_xdp"` needs. Without them the agent
/// falls back to its UDP socket, so a missing one is a warning.
fn af_xdp(caps: u64) -> Check {
    // SAFETY: socket(2) with constant arguments; the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return check(
            "af_xdp",
            Outcome::Warn(
                format!("no AF_XDP sockets ({e}); the underlay uses UDP sockets"),
                "a kernel built with CONFIG_XDP_SOCKETS (4.18 or later)".into(),
            ),
        );
    }
    // SAFETY: fd is ours and open.
    unsafe { libc::close(fd) };
    if caps & (1 << CAP_BPF) == 0 {
        return check(
            "af_xdp",
            Outcome::Warn(
                "AF_XDP sockets, but no CAP_BPF to load an XDP program".into(),
                "run as root, or as the systemd service (it grants CAP_BPF)".into(),
            ),
        );
    }
    check("af_xdp", Outcome::Pass("AF_XDP sockets and CAP_BPF".into()))
}

/// What the network checks need from the config.
struct Network {
    listen: SocketAddr,
    control_socket: PathBuf,
    bootstrap: Vec<Multiaddr>,
}

impl Network {
    fn of(config: &Config) -> Self {
        Self {
            listen: config.agent.listen,
            control_socket: config.agent.control_socket.clone(),
            bootstrap: config
                .namespaces
                .iter()
                .flat_map(|n| n.bootstrap.iter().cloned())
                .collect(),
        }
    }

    /// The keys read one by one, with the loader's defaults; `None` if the file is not
    /// TOML or its listen address is bad (the config check said so).
    fn read(path: &Path) -> Option<Self> {
        let doc = std::fs::read_to_string(path)
            .ok()?
            .parse::<toml::Table>()
            .ok()?;
        let agent = doc.get("agent").and_then(toml::Value::as_table);
        let key = |k: &str| agent.and_then(|a| a.get(k)).and_then(toml::Value::as_str);
        let default_listen = format!("0.0.0.0:{}", crate::config::DEFAULT_PORT);
        let listen = crate::config::resolve(key("listen").unwrap_or(&default_listen)).ok()?;
        let control_socket =
            PathBuf::from(key("control_socket").unwrap_or("/run/hyphae/hyphae.sock"));
        let bootstrap = doc
            .get("namespace")
            .and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|n| n.get("bootstrap")?.as_array())
            .flatten()
            .filter_map(|b| crate::config::parse_bootstrap(b.as_str()?).ok())
            .collect();
        Some(Self {
            listen,
            control_socket,
            bootstrap,
        })
    }
}

/// The listen port is free (or held by this config's running agent) on UDP and TCP.
fn listen_port(net: &Network) -> Check {
    let listen = net.listen;
    let name = format!("listen {listen}");
    if std::os::unix::net::UnixStream::connect(&net.control_socket).is_ok() {
        return check(
            name,
            Outcome::Pass(format!(
                "held by the running agent (control socket {})",
                net.control_socket.display()
            )),
        );
    }
    let udp = UdpSocket::bind(listen).err().map(|e| format!("UDP: {e}"));
    let tcp = TcpListener::bind(listen).err().map(|e| format!("TCP: {e}"));
    match (udp, tcp) {
        (None, None) => check(name, Outcome::Pass("free on UDP and TCP".into())),
        (udp, tcp) => check(
            name,
            Outcome::Fail(
                [udp, tcp].into_iter().flatten().collect::<Vec<_>>().join(", "),
                format!(
                    "stop what holds it (`ss -lunpt 'sport = :{}'`), or set [agent] listen to another port",
                    listen.port()
                ),
            ),
        ),
    }
}

/// Every bootstrap member answers on its overlay (TCP) port from here.
fn bootstrap_members(net: &Network) -> Vec<Check> {
    net.bootstrap
        .iter()
        .map(|addr| {
            let name = format!("bootstrap {addr}");
            let Some(endpoint) = hyphae_overlay::swarm::tunnel_endpoint(addr) else {
                return check(
                    name,
                    Outcome::Pass("not a direct address (relayed or DNS): not dialled".into()),
                );
            };
            match dial(endpoint) {
                Ok(()) => check(name, Outcome::Pass(format!("{endpoint} answers on TCP"))),
                Err(e) => check(
                    name,
                    Outcome::Fail(
                        format!("{endpoint} does not answer on TCP: {e}"),
                        format!(
                            "check the member runs `hyphae up` and its firewall lets TCP and UDP {} in from here",
                            endpoint.port()
                        ),
                    ),
                ),
            }
        })
        .collect()
}

fn dial(endpoint: SocketAddr) -> std::io::Result<()> {
    TcpStream::connect_timeout(&endpoint, DIAL_TIMEOUT).map(|_| ())
}

/// A namespace's certificate: for this host's identity (if it has one yet), valid now, not
/// revoked by the list the config names, and not expiring within 7 days.
fn certificate(
    ns: &crate::config::Namespace,
    identity: Option<&hyphae_overlay::PeerId>,
    now: u64,
) -> Option<Check> {
    const WEEK: u64 = 7 * 86_400;
    let credential = ns.credential.as_ref()?;
    let name = format!("certificate of '{}'", ns.name);
    let file = ns
        .certificate_path
        .as_ref()
        .map_or_else(String::new, |p| p.display().to_string());
    let renew = format!(
        "sign a new one (`hyphae cert sign --ca KEY --identity ID --name ...`) and replace {file}"
    );
    let cert = match hyphae_overlay::cert::Certificate::decode(&credential.certificate) {
        Ok(cert) => cert,
        Err(e) => return Some(check(name, Outcome::Fail(format!("{file}: {e}"), renew))),
    };
    if let Some(id) = identity {
        if cert.identity() != *id {
            return Some(check(
                name,
                Outcome::Fail(
                    format!(
                        "{file} is for identity {}, this host is {id}",
                        cert.identity()
                    ),
                    format!("sign one for this host's identity (`hyphae id`) and replace {file}"),
                ),
            ));
        }
    }
    if let Err(e) = credential.trust.check_current(&cert, now) {
        return Some(check(name, Outcome::Fail(format!("{file} is {e}"), renew)));
    }
    let left = cert.not_after().saturating_sub(now);
    if left < WEEK {
        return Some(check(
            name,
            Outcome::Warn(format!("{file} expires in {} hours", left / 3600), renew),
        ));
    }
    Some(check(
        name,
        Outcome::Pass(format!(
            "'{}' in groups [{}], {} days left",
            cert.name(),
            cert.groups().join(", "),
            left / 86_400
        )),
    ))
}

#[allow(clippy::disallowed_methods)] // this check is of the wall clock itself
fn clock() -> Check {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    if now < CLOCK_FLOOR_UNIX {
        return check(
            "clock",
            Outcome::Fail(
                format!("Unix time {now} is before 2025"),
                "set the clock: timedatectl set-ntp true (or chrony/ntpd)".into(),
            ),
        );
    }
    // SAFETY: adjtimex with modes 0 only reads the kernel's clock state into `tx`.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    let state = unsafe { libc::adjtimex(&mut tx) };
    if state == libc::TIME_ERROR {
        return check(
            "clock",
            Outcome::Warn(
                "not synchronized (no NTP): lease times drift from other members'".into(),
                "timedatectl set-ntp true (or run chrony/ntpd)".into(),
            ),
        );
    }
    check("clock", Outcome::Pass("set, and synchronized".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_is_checked_for_this_host_its_window_and_the_week_ahead() {
        use hyphae_overlay::cert::{AuthorityKey, CertificateRequest, Trust};
        use hyphae_overlay::proof::Credential;
        let ca = AuthorityKey::from_seed([7; 32]);
        let me = hyphae_overlay::Identity::from_seed([1; 32]).peer_id();
        let other = hyphae_overlay::Identity::from_seed([2; 32]).peer_id();
        let now = 1_800_000_000;
        let cfg = |end: u64| {
            let certificate = ca
                .sign(&CertificateRequest {
                    namespace: "lab".into(),
                    identity: me,
                    name: "web".into(),
                    groups: vec!["web".into()],
                    addresses: Vec::new(),
                    not_before: now - 10 * 86_400,
                    not_after: end,
                })
                .unwrap();
            Credential {
                trust: Trust::new("lab", ca.authority()),
                certificate,
            }
        };
        let outcome = |credential: Credential, id: Option<&hyphae_overlay::PeerId>| {
            let mut ns = crate::config::tests_namespace("lab");
            ns.credential = Some(credential);
            certificate(&ns, id, now).unwrap().outcome
        };
        assert!(
            matches!(outcome(cfg(now + 90 * 86_400), Some(&me)), Outcome::Pass(s) if s.contains("89 days left") || s.contains("90 days left"))
        );
        assert!(
            matches!(outcome(cfg(now + 3 * 86_400), Some(&me)), Outcome::Warn(s, _) if s.contains("expires in 72 hours"))
        );
        assert!(
            matches!(outcome(cfg(now - 3 * 86_400), Some(&me)), Outcome::Fail(s, _) if s.contains("expired"))
        );
        assert!(
            matches!(outcome(cfg(now + 90 * 86_400), Some(&other)), Outcome::Fail(s, _) if s.contains("this host is"))
        );
        // No identity yet (never started): the rest is still checked.
        assert!(matches!(
            outcome(cfg(now + 90 * 86_400), None),
            Outcome::Pass(_)
        ));
        let mut ns = crate::config::tests_namespace("lab");
        ns.credential = None;
        assert!(certificate(&ns, Some(&me), now).is_none());
    }

    #[test]
    fn a_secret_others_can_read_fails_with_its_fix() {
        let dir = std::env::temp_dir().join(format!("hyphae-doctor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lab.secret");
        std::fs::write(&path, "0123456789abcdef0123").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let line = secret_file(&path).to_string();
        assert!(line.starts_with("FAIL  secret"), "{line}");
        assert!(
            line.contains(&format!("fix: chmod 600 {}", path.display())),
            "{line}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(secret_file(&path).outcome, Outcome::Pass(_)));
        let missing = secret_file(&dir.join("none")).to_string();
        assert!(missing.contains("hyphae secret >"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
