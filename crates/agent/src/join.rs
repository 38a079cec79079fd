//! `hyphae join`, `hyphae leave` and `hyphae name set`: add a namespace to (or remove it
//! from) the config file, or name this member in it, and tell the running agent (or start
//! one).
//!
//! The config file stays the single source of truth: the agent re-reads it for the namespace
//! it is asked to join. Edits keep the file's comments and layout (toml_edit), and a join that
//! the agent refuses is taken back out of the file.
#![allow(clippy::print_stdout)] // the CLI prints its results

use std::io::ErrorKind;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use toml_edit::{value, Array, ArrayOfTables, DocumentMut, Item, Table};

use crate::config::Config;
use crate::control::{self, Request, Status};
use crate::progress::{join_step, Progress};

/// How long `hyphae join` waits for the new member's address.
pub const JOIN_WAIT: Duration = Duration::from_secs(30);

/// What `hyphae join` was asked (its command-line arguments).
#[derive(Debug, Clone, clap::Args)]
pub struct JoinArgs {
    /// Namespace name.
    pub namespace: String,
    /// File holding the namespace secret (`hyphae secret > FILE` makes one).
    #[arg(long)]
    pub secret_file: PathBuf,
    /// A member to join through: host:port, host, or a libp2p multiaddr (repeatable).
    #[arg(long)]
    pub bootstrap: Vec<String>,
    /// `auto` (a free address of the subnet) or a static address.
    #[arg(long)]
    pub address: Option<String>,
    /// The namespace subnet; without it, the namespace record in the DHT says. In a
    /// multi-subnet namespace, this member's own.
    #[arg(long)]
    pub subnet: Option<String>,
    /// A multi-subnet namespace's subnets, comma-separated (a namespace's first member; the
    /// others learn them from the namespace record).
    #[arg(long, value_delimiter = ',')]
    pub subnets: Vec<String>,
    /// TAP device (default: the first free hyphaeN).
    #[arg(long)]
    pub device: Option<String>,
    /// Config file (created if missing).
    #[arg(short, long, default_value_os_t = crate::setup::default_config_path())]
    pub config: PathBuf,
}

/// Adds the namespace to the config file and brings it up in the running agent (or starts
/// the agent); waits for the member's address.
pub fn join(args: &JoinArgs) -> Result<()> {
    let old = read_config_text(&args.config)?;
    let mut doc = parse(&args.config, &old)?;
    let names = namespace_names(&doc);
    if names.iter().any(|n| n == &args.namespace) {
        bail!(
            "namespace '{}' is already in {}; `hyphae leave {}` first",
            args.namespace,
            args.config.display(),
            args.namespace
        );
    }
    let secret = std::fs::canonicalize(&args.secret_file).with_context(|| {
        format!(
            "cannot read secret file {} (create one with `hyphae secret > {}`)",
            args.secret_file.display(),
            args.secret_file.display()
        )
    })?;
    let device = match &args.device {
        Some(d) => d.clone(),
        None => free_device(&doc),
    };
    let mut t = Table::new();
    t["name"] = value(args.namespace.as_str());
    t["secret_file"] = value(secret.display().to_string());
    if let Some(subnet) = &args.subnet {
        t["subnet"] = value(subnet.as_str());
    }
    if !args.subnets.is_empty() {
        t["subnets"] = value(Array::from_iter(args.subnets.iter().map(String::as_str)));
    }
    t["address"] = value(args.address.as_deref().unwrap_or("auto"));
    t["device"] = value(device.as_str());
    if !args.bootstrap.is_empty() {
        t["bootstrap"] = value(Array::from_iter(args.bootstrap.iter().map(String::as_str)));
    }
    let namespaces = doc
        .entry("namespace")
        .or_insert(Item::ArrayOfTables(ArrayOfTables::new()));
    let Some(namespaces) = namespaces.as_array_of_tables_mut() else {
        bail!(
            "config {}: `namespace` must be [[namespace]] sections",
            args.config.display()
        );
    };
    namespaces.push(t);
    let config = write_checked(&args.config, &doc.to_string())?;

    let socket = config.agent.control_socket.clone();
    let mut progress = Progress::new(format!("join {}", args.namespace));
    let mut started: Option<Child> = None;
    let service = how_to_start(
        agent_running(&socket),
        systemd_running(),
        unit_installed(),
        args.config == crate::setup::default_config_path(),
    );
    match service {
        Start::AskAgent => {
            progress.step("asking the running agent");
            let reply = control::request(
                &socket,
                &Request::Join {
                    namespace: args.namespace.clone(),
                },
            )?;
            if let Err(e) = check_reply(&reply) {
                progress.finish();
                restore(&args.config, &old);
                bail!("the agent refused: {e}");
            }
        }
        Start::Systemd => {
            progress.step("starting the hyphae service");
            if let Err(e) = start_service() {
                progress.finish();
                restore(&args.config, &old);
                return Err(e);
            }
        }
        Start::Spawn => {
            progress.step("starting the agent");
            match start_agent(&config) {
                Ok(child) => started = Some(child),
                Err(e) => {
                    progress.finish();
                    restore(&args.config, &old);
                    return Err(e);
                }
            }
        }
    }
    let joined = wait_joined(
        &socket,
        &args.namespace,
        started.as_mut(),
        &config,
        &mut progress,
    );
    progress.finish();
    match joined {
        Ok(Some((address, device))) => {
            println!("joined '{}': address {address} on {device}", args.namespace);
        }
        Ok(None) => println!(
            "joined '{}'; no address yet (`hyphae status` shows progress)",
            args.namespace
        ),
        Err(e) => {
            restore(&args.config, &old);
            return Err(e);
        }
    }
    if let Some(child) = started {
        println!(
            "started the agent (pid {}); its log is {}",
            child.id(),
            log_path(&config).display()
        );
    } else if service == Start::Systemd {
        println!("started the hyphae service (enabled at boot); its log: journalctl -u hyphae");
    }
    Ok(())
}

/// Leaves the namespace in the running agent (releasing its addresses and removing its
/// device) and removes it from the config file.
pub fn leave(namespace: &str, config_path: &Path) -> Result<()> {
    let old = read_config_text(config_path)?;
    let mut doc = parse(config_path, &old)?;
    let index = namespace_index(&doc, namespace, config_path)?;
    let socket = crate::config::control_socket(config_path)?;
    let mut released = None;
    if agent_running(&socket) {
        let reply = control::request(
            &socket,
            &Request::Leave {
                namespace: namespace.to_string(),
            },
        )?;
        match check_reply(&reply) {
            Ok(v) => released = v["released"].as_u64(),
            // Not up in the agent (it failed, or the file was edited by hand): the file
            // is all there is to change.
            Err(e) if e.starts_with("not a member") => {}
            Err(e) => bail!("the agent refused: {e}"),
        }
    }
    if let Some(namespaces) = doc
        .get_mut("namespace")
        .and_then(Item::as_array_of_tables_mut)
    {
        namespaces.remove(index);
        if namespaces.is_empty() {
            doc.remove("namespace");
        }
    }
    std::fs::write(config_path, doc.to_string())
        .with_context(|| format!("cannot write {}", config_path.display()))?;
    match released {
        Some(n) => println!("left '{namespace}' ({n} records released)"),
        None => println!("removed '{namespace}' from {}", config_path.display()),
    }
    Ok(())
}

/// `hyphae name set`: names this member's own address in `namespace` (`NAME.NAMESPACE` in
/// the virtual DNS). The running agent claims the name first (a name another member holds
/// is refused); then `hostname` is written to the config file, so a restart keeps it.
pub fn set_name(namespace: &str, name: &str, config_path: &Path) -> Result<()> {
    let name = hyphae_dhcp_dns::dns::host_name(name).map_err(|e| anyhow::anyhow!("{e}"))?;
    let old = read_config_text(config_path)?;
    let mut doc = parse(config_path, &old)?;
    let index = namespace_index(&doc, namespace, config_path)?;
    let socket = crate::config::control_socket(config_path)?;
    let mut message = None;
    if agent_running(&socket) {
        let reply = control::request(
            &socket,
            &Request::SetName {
                namespace: namespace.to_string(),
                name: Some(name.clone()),
            },
        )?;
        match check_reply(&reply) {
            Ok(v) => message = v["message"].as_str().map(str::to_string),
            Err(e) => bail!("{e}"),
        }
    }
    if let Some(table) = doc
        .get_mut("namespace")
        .and_then(Item::as_array_of_tables_mut)
        .and_then(|a| a.get_mut(index))
    {
        table.insert("hostname", value(name.as_str()));
    }
    write_checked(config_path, &doc.to_string())?;
    match message {
        Some(m) => println!("{m}"),
        None => println!(
            "hostname '{name}' written to {}; the agent claims it when it starts",
            config_path.display()
        ),
    }
    Ok(())
}

fn read_config_text(path: &Path) -> Result<String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(t),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(e).with_context(|| format!("cannot read config {}", path.display())),
    }
}

fn parse(path: &Path, text: &str) -> Result<DocumentMut> {
    text.parse::<DocumentMut>()
        .map_err(|e| anyhow::anyhow!("config {}: {}", path.display(), e.message()))
}

/// Where `namespace` is among the file's namespaces.
fn namespace_index(doc: &DocumentMut, namespace: &str, config_path: &Path) -> Result<usize> {
    namespace_names(doc)
        .iter()
        .position(|n| n == namespace)
        .with_context(|| {
            format!(
                "namespace '{namespace}' is not in {}",
                config_path.display()
            )
        })
}

fn namespace_names(doc: &DocumentMut) -> Vec<String> {
    doc.get("namespace")
        .and_then(Item::as_array_of_tables)
        .map(|a| {
            a.iter()
                .map(|t| {
                    t.get("name")
                        .and_then(Item::as_str)
                        .unwrap_or("")
                        .to_string()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The first `hyphaeN` no namespace of the file uses (a namespace without `device` uses
/// `hyphae0`).
fn free_device(doc: &DocumentMut) -> String {
    let used: Vec<String> = doc
        .get("namespace")
        .and_then(Item::as_array_of_tables)
        .map(|a| {
            a.iter()
                .map(|t| {
                    t.get("device")
                        .and_then(Item::as_str)
                        .unwrap_or("hyphae0")
                        .to_string()
                })
                .collect()
        })
        .unwrap_or_default();
    (0..)
        .map(|n| format!("hyphae{n}"))
        .find(|d| !used.contains(d))
        .unwrap_or_else(|| "hyphae0".into())
}

/// Validates the new text as a whole config (secrets, addresses, devices) before it
/// replaces the file; errors name the real file.
fn write_checked(path: &Path, text: &str) -> Result<Config> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let tmp = path.with_extension("toml.new");
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    if let Err(e) = Config::load(&tmp) {
        let _ = std::fs::remove_file(&tmp);
        let msg = format!("{e:#}").replace(&tmp.display().to_string(), &path.display().to_string());
        bail!("{msg}");
    }
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Config::load(path)
}

fn restore(path: &Path, old: &str) {
    let _ = if old.is_empty() {
        std::fs::remove_file(path)
    } else {
        std::fs::write(path, old)
    };
}

fn agent_running(socket: &Path) -> bool {
    UnixStream::connect(socket).is_ok()
}

/// The reply's JSON, or its `error`.
fn check_reply(reply: &str) -> Result<serde_json::Value, String> {
    let v: serde_json::Value =
        serde_json::from_str(reply).map_err(|e| format!("bad reply from the agent: {e}"))?;
    match v.get("error").and_then(|e| e.as_str()) {
        Some(e) => Err(e.to_string()),
        None => Ok(v),
    }
}

fn log_path(config: &Config) -> PathBuf {
    config.agent.state_dir.join("hyphae.log")
}

/// Starts `hyphae up` in the background (its own process group, output to the state
/// directory's log) and waits for its control socket.
#[allow(clippy::disallowed_methods)] // the CLI waits on the clock for the agent it started
fn start_agent(config: &Config) -> Result<Child> {
    let exe = std::env::current_exe().context("cannot find the hyphae binary")?;
    let log_file = log_path(config);
    let log = create_log(&config.agent.state_dir, &log_file)?;
    let mut child = Command::new(exe)
        .arg("up")
        .arg("-c")
        .arg(&config.path)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("cannot start the agent")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !agent_running(&config.agent.control_socket) {
        if let Some(status) = child.try_wait()? {
            bail!("the agent exited ({status}): {}", last_line(&log_file));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("the agent did not start: {}", last_line(&log_file));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(child)
}

/// Creates the state directory (0700) and the agent's log in it (0600, emptied): the
/// directory holds the identity key, and the log names members and addresses. Modes left
/// by an older start are corrected.
fn create_log(state_dir: &Path, log_file: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_dir)
        .and_then(|()| std::fs::set_permissions(state_dir, std::fs::Permissions::from_mode(0o700)))
        .with_context(|| format!("cannot create {}", state_dir.display()))?;
    let log = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(log_file)
        .with_context(|| format!("cannot write {}", log_file.display()))?;
    log.set_permissions(std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot write {}", log_file.display()))?;
    Ok(log)
}

fn last_line(log: &Path) -> String {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .last()
        .unwrap_or("")
        .to_string()
}

/// Polls the agent until the namespace has an address (`Some((address, device))`), the
/// wait is over (`None`), or it failed; reports each step on the way.
#[allow(clippy::disallowed_methods)] // the CLI waits on the clock for the join
fn wait_joined(
    socket: &Path,
    namespace: &str,
    mut started: Option<&mut Child>,
    config: &Config,
    progress: &mut Progress,
) -> Result<Option<(String, String)>> {
    let deadline = Instant::now() + JOIN_WAIT;
    let mut reached = false;
    while Instant::now() < deadline {
        if let Some(child) = started.as_deref_mut() {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "the agent exited ({status}): {}",
                    last_line(&log_path(config))
                );
            }
        }
        if let Ok(reply) = control::request(socket, &Request::Status) {
            if let Ok(status) = serde_json::from_str::<Status>(&reply) {
                if !reached && status.overlay.connected > 0 {
                    reached = true;
                    progress.step(&format!(
                        "first member reached ({} connected)",
                        status.overlay.connected
                    ));
                }
                progress.step(&join_step(&status, namespace));
                if let Some(ns) = status.namespaces.iter().find(|n| n.name == namespace) {
                    if let Some(e) = &ns.error {
                        bail!("{e}");
                    }
                    if ns.address_claimed && !ns.address.is_empty() {
                        return Ok(Some((ns.address.clone(), ns.device.clone())));
                    }
                }
            }
        } else {
            progress.step("waiting for the agent's control socket");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(None)
}

/// How `hyphae join` brings the namespace up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// An agent runs (as a service or not): hand it the namespace.
    AskAgent,
    /// None runs, and the installed systemd unit runs this config: start the service.
    Systemd,
    /// None runs and no service would: start `hyphae up` in the background.
    Spawn,
}

/// The service is used only for the config its unit runs (the default path): a join with
/// another `--config` would otherwise start a service that never reads it.
fn how_to_start(running: bool, systemd: bool, unit: bool, units_config: bool) -> Start {
    match (running, systemd && unit && units_config) {
        (true, _) => Start::AskAgent,
        (false, true) => Start::Systemd,
        (false, false) => Start::Spawn,
    }
}

/// Whether systemd is the init system (what `sd_booted(3)` checks).
fn systemd_running() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// Whether a `hyphae.service` unit is installed (by the package or the cloud-init user-data).
fn unit_installed() -> bool {
    [
        "/etc/systemd/system/hyphae.service",
        "/usr/lib/systemd/system/hyphae.service",
        "/lib/systemd/system/hyphae.service",
    ]
    .iter()
    .any(|p| Path::new(p).is_file())
}

/// `systemctl enable --now --no-block hyphae.service`: started at once and at every boot;
/// `--no-block` because readiness waits for every namespace, which the join reports itself.
fn start_service() -> Result<()> {
    let out = Command::new("systemctl")
        .args(["enable", "--now", "--no-block", "hyphae.service"])
        .stdin(Stdio::null())
        .output()
        .context("cannot run systemctl")?;
    if !out.status.success() {
        bail!(
            "systemctl enable --now hyphae.service failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_running_agent_comes_first_then_the_service_for_its_own_config() {
        // Whatever else holds: a running agent takes the namespace over its socket.
        for systemd in [false, true] {
            assert_eq!(how_to_start(true, systemd, true, true), Start::AskAgent);
        }
        assert_eq!(how_to_start(false, true, true, true), Start::Systemd);
        // No systemd, no unit, or a config the unit does not run: a background agent.
        assert_eq!(how_to_start(false, false, true, true), Start::Spawn);
        assert_eq!(how_to_start(false, true, false, true), Start::Spawn);
        assert_eq!(how_to_start(false, true, true, false), Start::Spawn);
    }

    #[test]
    fn the_state_dir_and_the_log_are_the_agents_only() {
        let dir = std::env::temp_dir().join(format!("hyphae-join-{}", std::process::id()));
        let state = dir.join("state");
        let log = state.join("hyphae.log");
        create_log(&state, &log).unwrap();
        assert_eq!((mode(&state), mode(&log)), (0o700, 0o600));
        // Left open by an older start: corrected.
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o644)).unwrap();
        create_log(&state, &log).unwrap();
        assert_eq!((mode(&state), mode(&log)), (0o700, 0o600));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
