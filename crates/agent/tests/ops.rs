#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Operations: the systemd unit passes `systemd-analyze verify`; the agent tells a service
//! manager it is ready (`READY=1` on `$NOTIFY_SOCKET`) only once it holds its address; and
//! `hyphae doctor` names each failing check with its fix, and passes once they are fixed.

use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use hyphae_agent::cloud_init::UNIT;
use hyphae_testbed::{agent_section, join_config, require_root, write_secret, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.204.0.0/24";

fn verify(dir: &Path, name: &str, text: &str) -> Output {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian's systemd package)")
}

#[test]
fn the_unit_passes_systemd_analyze_verify() {
    let dir = std::env::temp_dir().join(format!("hyphae-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // As the user-data writes it for a binary outside the package: its path in ExecStart
    // (verify checks that the binary exists).
    let unit = UNIT.replace("/usr/bin/hyphae", BIN);
    let out = verify(&dir, "hyphae.service", &unit);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
    for line in [
        "Type=notify",
        "ExecStart=/usr/bin/hyphae up --config /etc/hyphae/hyphae.toml",
        "StateDirectory=hyphae",
        "RuntimeDirectory=hyphae",
        "CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW CAP_BPF",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
    ] {
        assert!(UNIT.lines().any(|l| l == line), "no {line}");
    }
    // The check can fail: a misspelt directive and a bad value are both reported.
    let bad = unit
        .replace("ProtectSystem=strict", "ProtectSystem=stric")
        .replace("NoNewPrivileges=yes", "NoNewPrivilege=yes");
    let out = verify(&dir, "bad.service", &bad);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("protect system value") && said.contains("NoNewPrivilege"),
        "{said}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Datagrams on `socket` until `until` says stop or 30 s pass.
fn receive(socket: &UnixDatagram, mut until: impl FnMut(&str) -> bool) -> Vec<String> {
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        if let Ok(len) = socket.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..len]).into_owned();
            let stop = until(&text);
            got.push(text);
            if stop {
                break;
            }
        }
    }
    got
}

#[test]
fn ready_is_notified_once_the_address_is_held() {
    require_root();
    let mut bed = Testbed::new("rdy", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    write_secret(&secret, "the readiness test namespace secret").unwrap();
    let h1 = bed.add_host("h1", Ipv4Addr::new(10, 200, 0, 1)).unwrap();
    let a1 = bed
        .start_agent(
            &h1,
            &join_config(&h1, "lab", &secret, SUBNET, "auto", None, 600),
        )
        .unwrap();
    bed.claimed_address(&h1, &a1).unwrap();

    let h2 = bed.add_host("h2", Ipv4Addr::new(10, 200, 0, 2)).unwrap();
    let config = h2.dir.join("hyphae.toml");
    std::fs::write(
        &config,
        join_config(&h2, "lab", &secret, SUBNET, "auto", Some(h1.underlay), 600),
    )
    .unwrap();
    let notify = h2.dir.join("notify.sock");
    let socket = UnixDatagram::bind(&notify).unwrap();
    let env = format!("NOTIFY_SOCKET={}", notify.display());
    let c = config.display().to_string();
    let log = h2.dir.join("agent.log");
    let pid = bed
        .spawn(&h2.ns, "env", &[&env, BIN, "up", "-c", &c], &log)
        .unwrap();
    let agent = hyphae_testbed::AgentHandle {
        pid,
        config: config.clone(),
        log: log.clone(),
    };
    let mut held_at_ready = None;
    let got = receive(&socket, |m| {
        if m.starts_with("READY=1") {
            held_at_ready = Some(bed.status(&h2, &agent).unwrap().namespaces[0].address_claimed);
            true
        } else {
            false
        }
    });
    let ready = got.iter().position(|m| m.starts_with("READY=1"));
    assert!(
        ready.is_some(),
        "no READY=1: {got:?}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // Before it: what the agent waited for; at it, the address was held.
    assert!(ready.unwrap() >= 1, "{got:?}");
    assert!(
        got[0].starts_with("STATUS=") && !got[0].contains("ready"),
        "{got:?}"
    );
    assert_eq!(held_at_ready, Some(true));
    assert!(
        got[ready.unwrap()].contains("STATUS=ready: lab 10.204.0."),
        "{got:?}"
    );

    // Stopping is announced.
    bed.signal(pid, libc::SIGTERM).unwrap();
    let got = receive(&socket, |m| m.starts_with("STOPPING=1"));
    assert!(got.iter().any(|m| m.starts_with("STOPPING=1")), "{got:?}");
}

fn doctor(bed: &Testbed, host: &Host, config: &Path) -> (bool, String) {
    let out = bed
        .ns_output(&host.ns, BIN, &["doctor", "-c", config.to_str().unwrap()])
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn line<'a>(report: &'a str, prefix: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{report}"))
}

#[test]
fn doctor_names_each_failure_with_its_fix_and_passes_once_fixed() {
    require_root();
    let mut bed = Testbed::new("doc", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    write_secret(&secret, "the doctor test namespace secret").unwrap();
    let h1 = bed.add_host("h1", Ipv4Addr::new(10, 200, 0, 1)).unwrap();
    let a1 = bed
        .start_agent(
            &h1,
            &join_config(&h1, "lab", &secret, SUBNET, "auto", None, 600),
        )
        .unwrap();
    bed.claimed_address(&h1, &a1).unwrap();

    let h2 = bed.add_host("h2", Ipv4Addr::new(10, 200, 0, 2)).unwrap();
    let nobody = Ipv4Addr::new(10, 200, 0, 9);
    let config = h2.dir.join("hyphae.toml");
    let text = |bootstrap: &[Ipv4Addr]| {
        let list: Vec<String> = bootstrap.iter().map(|b| format!("\"{b}:7400\"")).collect();
        format!(
            "{}\n[[namespace]]\nname = \"lab\"\nsecret_file = \"{}\"\nbootstrap = [{}]\n",
            agent_section(&h2),
            secret.display(),
            list.join(", ")
        )
    };
    std::fs::write(&config, text(&[h1.underlay, nobody])).unwrap();
    // Three things wrong: the secret is readable by all, the port is taken, and one
    // bootstrap member does not exist.
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let taker_log = h2.dir.join("socat.log");
    let udp = format!("UDP4-LISTEN:7400,bind={}", h2.underlay);
    let taker = bed
        .spawn(&h2.ns, "socat", &["-u", &udp, "OPEN:/dev/null"], &taker_log)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (ok, report) = loop {
        let (ok, report) = doctor(&bed, &h2, &config);
        if report.contains("Address already in use") || Instant::now() > deadline {
            break (ok, report);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!ok, "{report}");
    let s = line(&report, "FAIL  secret");
    assert!(
        s.contains("mode 0644") && s.contains(&format!("fix: chmod 600 {}", secret.display())),
        "{s}"
    );
    assert!(
        line(&report, "FAIL  config").contains("fix: edit"),
        "{report}"
    );
    let l = line(&report, &format!("FAIL  listen {}:7400", h2.underlay));
    assert!(
        l.contains("UDP") && l.contains("fix: stop what holds it"),
        "{l}"
    );
    let b = line(&report, &format!("FAIL  bootstrap /ip4/{nobody}/tcp/7400"));
    assert!(b.contains("fix: check the member runs"), "{b}");
    for ok_line in ["ok    tun:", "ok    capabilities:"] {
        line(&report, ok_line);
    }
    assert!(report.contains("checks failed"), "{report}");

    // Fixed: the secret 0600, the port free, only the real member.
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    bed.signal(taker, libc::SIGTERM).unwrap();
    std::fs::write(&config, text(&[h1.underlay])).unwrap();
    let (ok, report) = doctor(&bed, &h2, &config);
    assert!(ok, "{report}");
    assert!(!report.contains("FAIL"), "{report}");
    line(&report, "ok    secret");
    line(&report, "ok    config");
    line(&report, &format!("ok    listen {}:7400: free", h2.underlay));
    line(
        &report,
        &format!("ok    bootstrap /ip4/{}/tcp/7400", h1.underlay),
    );
    // Every line is a check's: ok, warn (an optional speed-up) or FAIL.
    assert!(
        report
            .lines()
            .all(|l| l.starts_with("ok    ") || l.starts_with("warn  ")),
        "{report}"
    );
}

/// The steps a `hyphae join` reported: its stderr lines that start with "join lab: ".
fn steps(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("join lab: "))
        .collect()
}

#[test]
fn join_reports_its_progress_as_lines_or_on_a_terminal() {
    require_root();
    let mut bed = Testbed::new("prg", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    write_secret(&secret, "the progress test namespace secret").unwrap();
    let h1 = bed.add_host("h1", Ipv4Addr::new(10, 200, 0, 1)).unwrap();
    let a1 = bed
        .start_agent(
            &h1,
            &join_config(&h1, "lab", &secret, SUBNET, "auto", None, 600),
        )
        .unwrap();
    bed.claimed_address(&h1, &a1).unwrap();
    let bootstrap = h1.underlay.to_string();
    let join = |host: &Host| -> Vec<String> {
        let config = host.dir.join("hyphae.toml");
        std::fs::write(&config, agent_section(host)).unwrap();
        vec![
            "join".into(),
            "lab".into(),
            "--secret-file".into(),
            secret.display().to_string(),
            "--bootstrap".into(),
            bootstrap.clone(),
            "-c".into(),
            config.display().to_string(),
        ]
    };

    // Not a terminal: each step once, as a plain line, in order.
    let h2 = bed.add_host("h2", Ipv4Addr::new(10, 200, 0, 2)).unwrap();
    let args = join(&h2);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = bed.ns_output(&h2.ns, BIN, &args).unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    if let Some(pid) = stdout
        .split("(pid ")
        .nth(1)
        .and_then(|t| t.split(')').next())
    {
        bed.adopt(pid.parse().unwrap());
    }
    let got = steps(&stderr);
    assert_eq!(got.first(), Some(&"starting the agent"), "{stderr}");
    assert!(
        got.iter().any(|s| s.starts_with("first member reached")),
        "{stderr}"
    );
    let mut unique = got.clone();
    unique.dedup();
    assert_eq!(unique, got, "a step repeated: {stderr}");
    assert!(!stderr.contains('\r'), "{stderr:?}");
    assert!(
        stdout.starts_with("joined 'lab': address 10.204.0."),
        "{stdout}"
    );

    // On a terminal (util-linux `script` gives it one): one line, redrawn in place.
    let h3 = bed.add_host("h3", Ipv4Addr::new(10, 200, 0, 3)).unwrap();
    let args = join(&h3);
    let command = std::iter::once(BIN.to_string())
        .chain(args)
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let out = bed
        .ns_output(&h3.ns, "script", &["-qec", &command, "/dev/null"])
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    if let Some(pid) = text.split("(pid ").nth(1).and_then(|t| t.split(')').next()) {
        bed.adopt(pid.parse().unwrap());
    }
    assert!(text.contains("\r\x1b[2K"), "{text:?}");
    assert!(text.contains("join lab: starting the agent"), "{text:?}");
    assert!(text.contains("joined 'lab': address 10.204.0."), "{text:?}");
}
