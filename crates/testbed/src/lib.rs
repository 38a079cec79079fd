//! Throwaway hosts in Linux network namespaces, for the end-to-end tests of
//! `crates/agent/tests` and the demo (`hyphae-demo`, run by `scripts/demo`). Dev-only: the
//! shipped `hyphae` binary carries none of it.
//!
//! A [`Testbed`] is one underlay: a bridge inside its own "switch" namespace, and hosts, each
//! a namespace with an `eth0` veth plugged into that bridge. Names carry the process id and
//! a counter, so testbeds of parallel tests never collide; interfaces are created inside the
//! testbed's namespaces, so nothing is added to the caller's namespace. Dropping the testbed
//! kills every process it started (by PID) and deletes its namespaces.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub mod history;
pub mod hostile;
pub mod insider;
mod lan;
mod traffic;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The nftables table [`Testbed::cut`] adds.
const CUT_TABLE: &str = "hyphae_cut";

/// The kernel keeps one neighbour table per address family (ARP, NDP) for the whole
/// machine, shared by every network namespace, and only the initial namespace may size it.
/// Its default hard limit (`gc_thresh3`, 1024 entries) is far below what fifty hosts that
/// all talk to each other fill: each host's entry for each peer on the underlay, and again
/// on its overlay device. Past it the kernel refuses new entries ("neighbor table
/// overflow" in the kernel log, `table_fulls` in `ip -s ntable`), and connections between
/// hosts stand in SYN-SENT with no packet on the wire, which a test would read as a fault
/// of the agents. So the limits are raised once per process, and never lowered: the setting
/// belongs to the machine, and tests running in parallel share it. Where they cannot be
/// raised (a test run inside a container's namespace), a line says so and tests go on.
fn make_room_for_neighbours() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for family in ["ipv4", "ipv6"] {
            for (knob, at_least) in [("gc_thresh2", 16_384u64), ("gc_thresh3", 32_768)] {
                let path = format!("/proc/sys/net/{family}/neigh/default/{knob}");
                let now = fs::read_to_string(&path)
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok());
                if now.is_some_and(|v| v >= at_least) {
                    continue;
                }
                if let Err(e) = fs::write(&path, at_least.to_string()) {
                    eprintln!(
                        "testbed: cannot raise {path} to {at_least} ({e}); many hosts may fill the neighbour table"
                    );
                }
            }
        }
    });
}

/// Runs a command to completion; an error carries its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<Output> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {program} (is it installed?)"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// One underlay with hosts on it.
pub struct Testbed {
    prefix: String,
    switch_ns: String,
    namespaces: Vec<String>,
    dir: PathBuf,
    bin: PathBuf,
    processes: Vec<Child>,
    /// Processes started by a program this testbed ran (e.g. an agent `hyphae join`
    /// started): not our children, killed by PID when the testbed drops.
    adopted: Vec<u32>,
    /// LAN ports made so far (their names are numbered).
    ports: usize,
    /// `/etc/netns/<namespace>` directories made for hosts, removed on drop.
    etc_dirs: Vec<PathBuf>,
}

/// A host: a network namespace with `eth0` on the underlay.
#[derive(Debug, Clone)]
pub struct Host {
    /// The namespace name.
    pub ns: String,
    /// Short name given by the caller.
    pub name: String,
    /// The address of `eth0` (a /24 of the underlay).
    pub underlay: Ipv4Addr,
    /// A private directory for this host's files.
    pub dir: PathBuf,
}

/// A running `hyphae up`.
#[derive(Debug, Clone)]
pub struct AgentHandle {
    /// Its PID.
    pub pid: u32,
    /// Its config file.
    pub config: PathBuf,
    /// Its log (stderr).
    pub log: PathBuf,
}

impl Testbed {
    /// A new underlay. `label` (a few letters) makes the names readable; `bin` is the
    /// `hyphae` binary to run agents with.
    pub fn new(label: &str, bin: &Path) -> Result<Self> {
        make_room_for_neighbours();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("hy{label}{}x{n}", std::process::id());
        let switch_ns = format!("{prefix}-sw");
        let dir = std::env::temp_dir().join(&prefix);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let mut bed = Self {
            prefix,
            switch_ns: switch_ns.clone(),
            namespaces: Vec::new(),
            dir,
            bin: bin.to_path_buf(),
            processes: Vec::new(),
            adopted: Vec::new(),
            ports: 0,
            etc_dirs: Vec::new(),
        };
        run("ip", &["netns", "add", &switch_ns])?;
        bed.namespaces.push(switch_ns.clone());
        bed.ns(&switch_ns, "ip", &["link", "add", "br0", "type", "bridge"])?;
        bed.ns(&switch_ns, "ip", &["link", "set", "br0", "up"])?;
        bed.ns(&switch_ns, "ip", &["link", "set", "lo", "up"])?;
        Ok(bed)
    }

    /// The namespace holding the underlay bridge `br0`.
    pub fn switch_ns(&self) -> &str {
        &self.switch_ns
    }

    /// This testbed's scratch directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Adds a host with `eth0` = `underlay`/24 on the bridge.
    pub fn add_host(&mut self, name: &str, underlay: Ipv4Addr) -> Result<Host> {
        let ns = format!("{}-{name}", self.prefix);
        run("ip", &["netns", "add", &ns])?;
        self.namespaces.push(ns.clone());
        let port = format!("p{}", self.namespaces.len());
        // Created inside the switch namespace, its peer moved straight into the host: the
        // names never exist in the caller's namespace.
        self.ns(
            &self.switch_ns,
            "ip",
            &[
                "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ],
        )?;
        self.ns(
            &self.switch_ns,
            "ip",
            &["link", "set", &port, "master", "br0"],
        )?;
        self.ns(&self.switch_ns, "ip", &["link", "set", &port, "up"])?;
        self.ns(
            &ns,
            "ip",
            &["addr", "add", &format!("{underlay}/24"), "dev", "eth0"],
        )?;
        self.ns(&ns, "ip", &["link", "set", "eth0", "up"])?;
        self.ns(&ns, "ip", &["link", "set", "lo", "up"])?;
        let dir = self.dir.join(name);
        fs::create_dir_all(&dir)?;
        Ok(Host {
            ns,
            name: name.to_string(),
            underlay,
            dir,
        })
    }

    /// Adds a host behind its own NAT router, as at home or in a cloud VPC: the router is a
    /// namespace with `eth0` = `public`/24 on the bridge and `lan0` = `192.168.lan.1/24`; the
    /// host's `eth0` is `192.168.lan.2/24` with its default route through the router. The
    /// router masquerades (source ports kept where free) and, like a home router, drops
    /// anything unsolicited that arrives from outside. Returns the host; its `underlay` is
    /// the private address.
    pub fn add_host_behind_nat(&mut self, name: &str, public: Ipv4Addr, lan: u8) -> Result<Host> {
        let router = self.add_host(&format!("{name}nat"), public)?;
        let ns = format!("{}-{name}", self.prefix);
        run("ip", &["netns", "add", &ns])?;
        self.namespaces.push(ns.clone());
        let private = Ipv4Addr::new(192, 168, lan, 2);
        self.ns(
            &router.ns,
            "ip",
            &[
                "link", "add", "lan0", "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ],
        )?;
        let gateway = format!("192.168.{lan}.1");
        self.ns(
            &router.ns,
            "ip",
            &["addr", "add", &format!("{gateway}/24"), "dev", "lan0"],
        )?;
        self.ns(&router.ns, "ip", &["link", "set", "lan0", "up"])?;
        self.ns(&router.ns, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
        let rules = "table ip hyphae_nat {\n\
             chain input { type filter hook input priority 0; policy accept;\n\
               iifname \"eth0\" ct state established,related accept\n\
               iifname \"eth0\" drop\n}\n\
             chain forward { type filter hook forward priority 0; policy accept;\n\
               iifname \"eth0\" ct state established,related accept\n\
               iifname \"eth0\" drop\n}\n\
             chain postrouting { type nat hook postrouting priority 100;\n\
               oifname \"eth0\" masquerade\n}\n\
             }\n";
        let file = self.dir.join(format!("{name}-nat.nft"));
        fs::write(&file, rules)?;
        self.ns(&router.ns, "nft", &["-f", &file.display().to_string()])?;
        self.ns(
            &ns,
            "ip",
            &["addr", "add", &format!("{private}/24"), "dev", "eth0"],
        )?;
        self.ns(&ns, "ip", &["link", "set", "eth0", "up"])?;
        self.ns(&ns, "ip", &["link", "set", "lo", "up"])?;
        self.ns(&ns, "ip", &["route", "add", "default", "via", &gateway])?;
        let dir = self.dir.join(name);
        fs::create_dir_all(&dir)?;
        Ok(Host {
            ns,
            name: name.to_string(),
            underlay: private,
            dir,
        })
    }

    /// Runs a command inside namespace `ns` to completion.
    pub fn ns(&self, ns: &str, program: &str, args: &[&str]) -> Result<Output> {
        let mut full = vec!["netns", "exec", ns, program];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// Runs a command inside `ns` and returns its output whatever the exit status.
    pub fn ns_output(&self, ns: &str, program: &str, args: &[&str]) -> Result<Output> {
        Ok(Command::new("ip")
            .args(["netns", "exec", ns, program])
            .args(args)
            .stdin(Stdio::null())
            .output()?)
    }

    /// Starts a long-running command inside `ns`; it is killed when the testbed drops.
    /// Returns its PID (`ip netns exec` execs the program, so the PID is the program's).
    pub fn spawn(&mut self, ns: &str, program: &str, args: &[&str], log: &Path) -> Result<u32> {
        self.spawn_with_env(ns, program, args, log, &[])
    }

    /// [`Testbed::spawn`] with `env` set for the program.
    pub fn spawn_with_env(
        &mut self,
        ns: &str,
        program: &str,
        args: &[&str],
        log: &Path,
        env: &[(&str, &str)],
    ) -> Result<u32> {
        let log_file = fs::File::create(log)?;
        let child = Command::new("ip")
            .args(["netns", "exec", ns, program])
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("cannot start {program}"))?;
        let pid = child.id();
        self.processes.push(child);
        Ok(pid)
    }

    /// Writes `config` for `host` and starts `hyphae up` with it; returns once the agent's
    /// control socket answers.
    pub fn start_agent(&mut self, host: &Host, config: &str) -> Result<AgentHandle> {
        self.start_agent_with_env(host, config, &[])
    }

    /// [`Testbed::start_agent`] with `env` set for the agent (`HYPHAE_LOG`, say).
    pub fn start_agent_with_env(
        &mut self,
        host: &Host,
        config: &str,
        env: &[(&str, &str)],
    ) -> Result<AgentHandle> {
        let path = host.dir.join("hyphae.toml");
        fs::write(&path, config)?;
        let log = host.dir.join(format!("agent-{}.log", self.processes.len()));
        let bin = self.bin.display().to_string();
        let pid = self.spawn_with_env(
            &host.ns,
            &bin,
            &["up", "-c", &path.display().to_string()],
            &log,
            env,
        )?;
        let agent = AgentHandle {
            pid,
            config: path,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.status(host, &agent).is_ok() {
                return Ok(agent);
            }
            if !self.is_running(pid) || Instant::now() > deadline {
                bail!(
                    "agent on {} did not start: {}",
                    host.name,
                    fs::read_to_string(&agent.log).unwrap_or_default().trim()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The status of an agent's first (or only) namespace.
    pub fn namespace_status(
        &self,
        host: &Host,
        agent: &AgentHandle,
    ) -> Result<hyphae_agent::control::NamespaceStatus> {
        self.status(host, agent)?
            .namespaces
            .into_iter()
            .next()
            .context("the agent is in no namespace")
    }

    /// An agent's status, as `hyphae status --json` reads it: asked of its control socket
    /// (a file, reachable from any network namespace) by this process, with no `hyphae`
    /// process started for each call: tests poll status in loops, the scale test from one
    /// thread per agent (tests that check the command itself run it).
    pub fn status(
        &self,
        _host: &Host,
        agent: &AgentHandle,
    ) -> Result<hyphae_agent::control::Status> {
        let socket = hyphae_agent::config::control_socket(&agent.config)?;
        let reply =
            hyphae_agent::control::request(&socket, &hyphae_agent::control::Request::Status)?;
        serde_json::from_str(&reply).with_context(|| format!("not a status: {}", reply.trim()))
    }

    /// Whether a process this testbed started is still running.
    pub fn is_running(&mut self, pid: u32) -> bool {
        self.processes
            .iter_mut()
            .find(|c| c.id() == pid)
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Sends `signal` to a process this testbed started and, for SIGTERM/SIGINT/SIGKILL,
    /// waits (up to 10 s) for it to exit. Returns its exit status code, if it exited.
    pub fn signal(&mut self, pid: u32, signal: i32) -> Result<Option<i32>> {
        let Some(pos) = self.processes.iter().position(|c| c.id() == pid) else {
            bail!("process {pid} was not started by this testbed");
        };
        // SAFETY: kill(2) on a PID we spawned and have not reaped yet.
        unsafe { libc::kill(pid as i32, signal) };
        let deadline = Instant::now() + Duration::from_secs(10);
        let child = &mut self.processes[pos];
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait()? {
                // Already reaped by try_wait; wait() returns the cached status.
                let _ = self.processes.remove(pos).wait();
                return Ok(status.code());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(None)
    }

    /// `ping -c count -i 0.2 -W 1 to` from `from`, whatever its outcome.
    pub fn ping(&self, from: &Host, to: Ipv4Addr, count: u32) -> Result<Output> {
        let (count, to) = (count.to_string(), to.to_string());
        self.ns_output(
            &from.ns,
            "ping",
            &["-c", &count, "-i", "0.2", "-W", "1", &to],
        )
    }

    /// Drops every packet between `host` and the underlay addresses `others`, both ways, with
    /// an nftables table in `host`'s namespace (gone with the namespace, also when a test
    /// fails).
    pub fn cut(&self, host: &Host, others: &[Ipv4Addr]) -> Result<()> {
        let set: Vec<String> = others.iter().map(ToString::to_string).collect();
        let set = format!("{{ {} }}", set.join(", "));
        self.ns(&host.ns, "nft", &["add", "table", "inet", CUT_TABLE])?;
        for (chain, hook, dir) in [("in", "input", "saddr"), ("out", "output", "daddr")] {
            let spec = format!("{{ type filter hook {hook} priority 0 ; }}");
            self.ns(
                &host.ns,
                "nft",
                &["add", "chain", "inet", CUT_TABLE, chain, &spec],
            )?;
            let rule = [
                "add", "rule", "inet", CUT_TABLE, chain, "ip", dir, &set, "drop",
            ];
            self.ns(&host.ns, "nft", &rule)?;
        }
        Ok(())
    }

    /// Undoes [`Testbed::cut`] on `host`.
    pub fn heal(&self, host: &Host) -> Result<()> {
        self.ns(&host.ns, "nft", &["delete", "table", "inet", CUT_TABLE])?;
        Ok(())
    }

    /// Pings `to` from `from` until one reply arrives or `within` passes.
    pub fn wait_for_ping(&self, from: &Host, to: Ipv4Addr, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        let target = to.to_string();
        loop {
            let out = self.ns_output(&from.ns, "ping", &["-c", "1", "-W", "1", &target])?;
            if out.status.success() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{} cannot ping {to} after {within:?}", from.name);
            }
        }
    }
}

impl Testbed {
    /// Gives `host` its own `/etc/resolv.conf` (empty): `ip netns exec` mounts
    /// `/etc/netns/<namespace>/resolv.conf` over the machine's, so DHCP clients that write
    /// it (dhclient-script) never touch the machine's. Returns its path; removed on drop.
    pub fn private_resolv_conf(&mut self, host: &Host) -> Result<PathBuf> {
        let dir = PathBuf::from("/etc/netns").join(&host.ns);
        fs::create_dir_all(&dir)?;
        let path = dir.join("resolv.conf");
        fs::write(&path, "")?;
        self.etc_dirs.push(dir);
        Ok(path)
    }

    /// Kills `pid` (started inside this testbed by a program it ran) when the testbed drops.
    pub fn adopt(&mut self, pid: u32) {
        self.adopted.push(pid);
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for &pid in &self.adopted {
            // SAFETY: kill(2) on a PID a program of this testbed reported starting.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        for child in &mut self.processes {
            // SAFETY: kill(2) on a child we spawned and have not reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for child in &mut self.processes {
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        for ns in self.namespaces.iter().rev() {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
        for dir in &self.etc_dirs {
            let _ = fs::remove_dir_all(dir);
        }
        if std::env::var_os("HYPHAE_KEEP_TESTBED").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// End-to-end tests create network namespaces and TAP devices: they fail (never skip)
/// without root, and say why.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "end-to-end tests create network namespaces and TAP devices: run them as root \
         (scripts/test does; CI runs as root)"
    );
}

/// Writes a namespace secret file readable by its owner only (the agent refuses others).
pub fn write_secret(path: &Path, secret: &str) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = fs::remove_file(path);
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(secret.as_bytes()))
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The `[agent]` section of a testbed host's `hyphae.toml`.
pub fn agent_section(host: &Host) -> String {
    format!(
        "[agent]\nstate_dir = \"{dir}/state\"\ncontrol_socket = \"{dir}/hyphae.sock\"\nlisten = \"{ip}:7400\"\n",
        dir = host.dir.display(),
        ip = host.underlay,
    )
}

/// A `[[namespace]]` section named `lab` in `subnet`, with `bootstrap` (a member's underlay
/// address) if given, then `lines` (more keys of the section).
pub fn lab_namespace(
    secret_file: &Path,
    subnet: &str,
    bootstrap: Option<Ipv4Addr>,
    lines: &str,
) -> String {
    let mut c = format!(
        "\n[[namespace]]\nname = \"lab\"\nsecret_file = \"{}\"\nsubnet = \"{subnet}\"\n{lines}",
        secret_file.display()
    );
    if let Some(b) = bootstrap {
        c += &format!("bootstrap = [\"{b}:7400\"]\n");
    }
    c
}

/// The `[agent]` section of a testbed host and the start of its `[[namespace]]`.
fn agent_and_namespace(host: &Host, namespace: &str, secret_file: &Path, subnet: &str) -> String {
    format!(
        "{}\n[[namespace]]\nname = \"{namespace}\"\nsecret_file = \"{secret}\"\nsubnet = \"{subnet}\"\n",
        agent_section(host),
        secret = secret_file.display(),
    )
}

/// A `hyphae.toml` for a host of a testbed: interface mode in namespace `name`.
pub fn agent_config(
    host: &Host,
    namespace: &str,
    secret_file: &Path,
    subnet: &str,
    address: Ipv4Addr,
    peers: &[Ipv4Addr],
) -> String {
    let mut c = agent_and_namespace(host, namespace, secret_file, subnet);
    c += &format!("mode = \"interface\"\ndevice = \"hyphae0\"\naddress = \"{address}\"\n");
    for p in peers {
        c += &format!("\n[[namespace.peer]]\nendpoint = \"{p}:7400\"\n");
    }
    c
}

/// A `hyphae.toml` that joins namespace `name` through the overlay: `address` is `auto` or
/// a static address, `bootstrap` the underlay address of any member (none: this agent
/// starts the overlay), `lease_secs` the address lease time.
pub fn join_config(
    host: &Host,
    namespace: &str,
    secret_file: &Path,
    subnet: &str,
    address: &str,
    bootstrap: Option<Ipv4Addr>,
    lease_secs: u64,
) -> String {
    let mut c = agent_and_namespace(host, namespace, secret_file, subnet);
    c += &format!("address = \"{address}\"\nlease_secs = {lease_secs}\n");
    if let Some(b) = bootstrap {
        // A plain host:port: no peer id needed.
        c += &format!("bootstrap = [\"{b}:7400\"]\n");
    }
    c
}

impl Testbed {
    /// The IPv4 address on `dev` inside `host`, once one is there (a DHCP client's, say);
    /// an error after `within`.
    pub fn address_on(&self, host: &Host, dev: &str, within: Duration) -> Result<Ipv4Addr> {
        let deadline = Instant::now() + within;
        loop {
            let out = self.ns_output(&host.ns, "ip", &["-4", "-o", "addr", "show", "dev", dev])?;
            let text = String::from_utf8_lossy(&out.stdout);
            if let Some(a) = text
                .split_whitespace()
                .skip_while(|w| *w != "inet")
                .nth(1)
                .and_then(|cidr| cidr.split('/').next())
                .and_then(|a| a.parse().ok())
            {
                return Ok(a);
            }
            if Instant::now() > deadline {
                bail!("{}: no address on {dev} within {within:?}", host.name);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `dig +short NAME` at DNS server `server` (an address) from inside `host`: the answer
    /// lines (2 s per try, 2 tries).
    pub fn dig_short(&self, host: &Host, server: &str, name: &str) -> Result<Vec<String>> {
        let server = format!("@{server}");
        let out = self.ns_output(
            &host.ns,
            "dig",
            &[&server, "+time=2", "+tries=2", "+short", name],
        )?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty() && !l.starts_with(';'))
            .collect())
    }

    /// Waits (up to 30 s) until the agent holds its address in the DHT; returns it.
    pub fn claimed_address(&self, host: &Host, agent: &AgentHandle) -> Result<Ipv4Addr> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = self.status(host, agent)?;
            if let Some(ns) = status.namespaces.first() {
                if ns.address_claimed {
                    return Ok(ns.address.parse()?);
                }
            }
            if Instant::now() > deadline {
                bail!("{} holds no address after 30 s", host.name);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Testbed {
    /// Runs busybox udhcpc once on `host` (asking for the name `hostname`), its lease written
    /// by `script` (see [`udhcpc_script`]); up to 20 tries a second apart.
    pub fn udhcpc(&self, host: &Host, hostname: &str, script: &str) -> Result<Output> {
        let ask = format!("hostname:{hostname}");
        let args = [
            "udhcpc", "-x", &ask, "-i", "eth0", "-f", "-q", "-n", "-t", "20", "-T", "1", "-s",
            script,
        ];
        self.ns_output(&host.ns, "busybox", &args)
    }
}

/// A udhcpc script for `host` that puts the lease's address on the interface and writes the
/// lease's variables to a file: (the script's path, that file's path).
pub fn udhcpc_script(host: &Host) -> Result<(String, PathBuf)> {
    use std::os::unix::fs::PermissionsExt;
    let script = host.dir.join("udhcpc.sh");
    let env_file = host.dir.join("udhcpc.env");
    fs::write(
        &script,
        format!(
            "#!/bin/sh\ncase \"$1\" in\n  bound|renew)\n    ip addr flush dev \"$interface\"\n    ip addr add \"$ip/$mask\" dev \"$interface\"\n    env > {}\n    ;;\n  deconfig) ip addr flush dev \"$interface\" ;;\nesac\n",
            env_file.display()
        ),
    )?;
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755))?;
    Ok((script.display().to_string(), env_file))
}

/// The end of the last interval that carried bytes in an `iperf3 -i 0.1` client log, in
/// seconds from the start of the stream (`None` before any did).
pub fn iperf_last_carrying(log: &Path) -> Option<f64> {
    let text = fs::read_to_string(log).ok()?;
    text.lines()
        .rev()
        .filter(|l| l.contains(" sec ") && !l.contains("sender") && !l.contains("receiver"))
        .find_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let i = words.iter().position(|w| *w == "sec")?;
            let end: f64 = words
                .get(i.checked_sub(1)?)?
                .split('-')
                .nth(1)?
                .parse()
                .ok()?;
            let bytes: f64 = words.get(i + 1)?.parse().ok()?;
            (bytes > 0.0).then_some(end)
        })
}
