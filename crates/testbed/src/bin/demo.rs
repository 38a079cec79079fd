//! `hyphae-demo`: three hosts in network namespaces on one underlay bridge, each running
//! `hyphae up` in interface mode. The first starts the overlay; the others know only its
//! `host:port` and get `auto` addresses from the DHT. Every pair pings over the virtual
//! addresses (each first packet is a DHT lookup), then by name through the virtual DNS
//! (each host's resolver points at the namespace's service address), one agent's status is
//! shown, and everything is removed again.
//!
//! Usage: `hyphae-demo [PATH_TO_HYPHAE]` as root. Without the argument the `hyphae` binary is
//! `$HYPHAE_BIN`, else the `hyphae` beside this program (both land in one cargo target
//! directory). `scripts/demo` builds both and runs it.

#![allow(clippy::print_stdout)] // the demo prints what it shows

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use base64::Engine as _;

use hyphae_testbed::{join_config, Testbed};

fn main() -> ExitCode {
    match demo() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "hyphae-demo: error: {}",
                format!("{e:#}").replace('\n', " ")
            );
            ExitCode::FAILURE
        }
    }
}

/// The `hyphae` binary the agents run: the first argument, `$HYPHAE_BIN`, or the `hyphae`
/// next to this executable.
fn hyphae_binary() -> Result<PathBuf> {
    let bin = match std::env::args_os()
        .nth(1)
        .or_else(|| std::env::var_os("HYPHAE_BIN"))
    {
        Some(path) => PathBuf::from(path),
        None => std::env::current_exe()
            .context("locating hyphae-demo")?
            .with_file_name("hyphae"),
    };
    if !bin.is_file() {
        bail!(
            "no hyphae binary at {}: build it (cargo build --bin hyphae) and pass its path",
            bin.display()
        );
    }
    // Absolute, so nothing the testbed starts depends on the working directory.
    std::path::absolute(&bin).with_context(|| format!("resolving {}", bin.display()))
}

/// Runs the demo, printing what it does.
fn demo() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("hyphae-demo creates network namespaces and TAP devices: run it as root (sudo)");
    }
    let bin = hyphae_binary()?;
    let mut bed = Testbed::new("demo", &bin)?;
    let mut secret = [0u8; 32];
    getrandom::getrandom(&mut secret).map_err(|e| anyhow::anyhow!("random secret: {e}"))?;
    let secret_file = bed.dir().join("demo.secret");
    hyphae_testbed::write_secret(
        &secret_file,
        &base64::engine::general_purpose::STANDARD.encode(secret),
    )?;

    let names = ["alpha", "beta", "gamma"];
    let underlay: Vec<Ipv4Addr> = (1..=3).map(|i| Ipv4Addr::new(10, 200, 0, i)).collect();
    println!(
        "== building 3 hosts on an underlay bridge (network namespaces {}*)",
        bed.switch_ns().trim_end_matches("-sw")
    );
    let mut hosts = Vec::new();
    for (i, name) in names.iter().enumerate() {
        hosts.push(bed.add_host(name, underlay[i])?);
    }
    let mut agents = Vec::new();
    let mut vips = Vec::new();
    for (i, host) in hosts.iter().enumerate() {
        // alpha starts the overlay; the others join through alpha's host:port.
        let bootstrap = (i > 0).then_some(underlay[0]);
        let mut config = join_config(
            host,
            "demo",
            &secret_file,
            "10.201.0.0/16",
            "auto",
            bootstrap,
            60,
        );
        // Its name in the virtual DNS: alpha.demo, ...
        config += &format!("hostname = \"{}\"\n", host.name);
        let agent = bed.start_agent(host, &config)?;
        let vip = bed.claimed_address(host, &agent)?;
        println!(
            "   {:<6} underlay {}  ->  hyphae up (pid {}){}, address auto -> {}/16",
            host.name,
            host.underlay,
            agent.pid,
            match bootstrap {
                Some(b) => format!(", bootstrap {b}:7400"),
                None => ", starts the overlay".into(),
            },
            vip
        );
        agents.push(agent);
        vips.push(vip);
    }

    println!("== every host pings every other over the overlay");
    for (i, from) in hosts.iter().enumerate() {
        for (j, to) in vips.iter().enumerate() {
            if i == j {
                continue;
            }
            bed.wait_for_ping(from, *to, Duration::from_secs(15))?;
            let out = bed.ns(
                &from.ns,
                "ping",
                &["-c", "3", "-i", "0.2", "-q", &to.to_string()],
            )?;
            let text = String::from_utf8_lossy(&out.stdout);
            let summary: Vec<&str> = text
                .lines()
                .filter(|l| l.contains("packets transmitted") || l.starts_with("rtt"))
                .collect();
            println!("   {:<6} -> {:<11} {}", from.name, to, summary.join("  "));
        }
    }

    println!(
        "== every host pings every other by name: its resolver is the virtual DNS at 10.201.0.1,\n   which answers AAAA too (each member's IPv6 address of the namespace's prefix: glibc picks it)"
    );
    for host in &hosts {
        let resolv = bed.private_resolv_conf(host)?;
        std::fs::write(&resolv, "nameserver 10.201.0.1\nsearch demo\n")?;
    }
    for from in &hosts {
        for to in hosts.iter().filter(|h| h.name != from.name) {
            let address = resolve(&bed, &from.ns, &to.name)?;
            let out = bed.ns(&from.ns, "ping", &["-c", "2", "-i", "0.2", "-q", &to.name])?;
            let text = String::from_utf8_lossy(&out.stdout);
            let sent = text
                .lines()
                .find(|l| l.contains("packets transmitted"))
                .unwrap_or_default();
            println!(
                "   {:<6} -> {:<6} ({}.demo is {address})  {sent}",
                from.name, to.name, to.name
            );
        }
    }

    println!("== `hyphae status` on {}", hosts[0].name);
    let out = bed.ns(
        &hosts[0].ns,
        &bin.display().to_string(),
        &["status", "-c", &agents[0].config.display().to_string()],
    )?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    println!("== stopping agents and removing the namespaces");
    drop(bed);
    println!("done: hyphae carried traffic between 3 hosts, encrypted, with no central server.");
    Ok(())
}

/// What `name` resolves to inside `ns` (glibc, through the namespace's resolv.conf); names
/// are claimed right after addresses, so this waits a little for them.
fn resolve(bed: &Testbed, ns: &str, name: &str) -> Result<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let out = bed.ns_output(ns, "getent", &["hosts", name])?;
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(address) = text.split_whitespace().next() {
            return Ok(address.to_string());
        }
        if std::time::Instant::now() >= deadline {
            bail!("{name} did not resolve through the virtual DNS within 15 s");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}
