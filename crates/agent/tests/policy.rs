#![allow(clippy::disallowed_methods)] // a test waits on the real clock
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 28: a namespace's policy, end to end, with real clients. Three agents in network
//! namespaces share one policy file (a namespace without an authority names addresses):
//! default deny; alpha may open TCP to beta's port 5201; anyone may ping alpha. Then iperf3
//! from alpha to beta runs (its replies pass back), iperf3 from gamma to beta never
//! connects, beta's and gamma's pings reach alpha and their replies come back, and alpha's
//! ping to beta (a flow no rule allows) never leaves alpha.

use std::net::Ipv4Addr;
use std::path::Path;

use hyphae_testbed::{agent_section, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.204.0.0/24";
const SECRET: &str = "the policy test namespace secret\n";

const POLICY: &str = r#"
version = 1
default = "deny"

# alpha may open TCP to beta's iperf3
[[rule]]
from = ["10.204.0.11"]
to = ["10.204.0.12"]
proto = "tcp"
ports = ["5201"]

# anyone may ping alpha
[[rule]]
from = ["any"]
to = ["10.204.0.11"]
proto = "icmp"
"#;

fn start(bed: &mut Testbed, i: u8, name: &str, boot: Option<Ipv4Addr>) -> (Host, AgentHandle) {
    let policy = bed.dir().join("lab.policy.toml");
    start_with(bed, i, name, boot, Some(&policy))
}

/// An agent at 10.204.0.(10 + i) with `policy` (none: no policy at all).
fn start_with(
    bed: &mut Testbed,
    i: u8,
    name: &str,
    boot: Option<Ipv4Addr>,
    policy: Option<&Path>,
) -> (Host, AgentHandle) {
    let host = bed.add_host(name, Ipv4Addr::new(10, 200, 0, i)).unwrap();
    let secret = bed.dir().join("lab.secret");
    let policy = policy.map_or_else(String::new, |p| format!("policy = \"{}\"\n", p.display()));
    let lines = format!(
        "address = \"10.204.0.{}\"\nresolvers = []\n{policy}",
        10 + i
    );
    let cfg = format!(
        "{}{}",
        agent_section(&host),
        hyphae_testbed::lab_namespace(&secret, SUBNET, boot, &lines)
    );
    let agent = bed.start_agent(&host, &cfg).expect("agent");
    bed.claimed_address(&host, &agent).unwrap();
    (host, agent)
}

/// iperf3 for two seconds from `from` to 10.204.0.12:5201 (a server waits there); its
/// output, and whether it succeeded.
fn iperf(bed: &Testbed, from: &Host) -> (bool, String) {
    let out = bed
        .ns_output(
            &from.ns,
            "iperf3",
            &["-c", "10.204.0.12", "-t", "2", "--connect-timeout", "3000"],
        )
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn a_policy_allows_its_flows_and_their_replies_and_nothing_else() {
    require_root();
    let mut bed = Testbed::new("pol", Path::new(BIN)).expect("testbed");
    hyphae_testbed::write_secret(&bed.dir().join("lab.secret"), SECRET).unwrap();
    std::fs::write(bed.dir().join("lab.policy.toml"), POLICY).unwrap();
    let (alpha, a) = start(&mut bed, 1, "alpha", None);
    let boot = Some(alpha.underlay);
    let (beta, b) = start(&mut bed, 2, "beta", boot);
    let (gamma, g) = start(&mut bed, 3, "gamma", boot);
    let alpha_ip = Ipv4Addr::new(10, 204, 0, 11);

    // Pings to alpha are allowed, and their replies come back.
    for h in [&beta, &gamma] {
        bed.wait_for_ping(h, alpha_ip, std::time::Duration::from_secs(30))
            .unwrap();
    }
    // alpha's ping to beta: no rule allows it.
    let out = bed.ping(&alpha, Ipv4Addr::new(10, 204, 0, 12), 2).unwrap();
    assert!(!out.status.success(), "alpha pings beta");

    // beta serves iperf3 (two clients, one after the other).
    let log = beta.dir.join("iperf3-s.log");
    bed.spawn(&beta.ns, "iperf3", &["-s"], &log).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (ok, text) = iperf(&bed, &alpha);
    assert!(ok, "alpha to beta:5201 is allowed: {text}");
    let (ok, text) = iperf(&bed, &gamma);
    assert!(!ok, "gamma to beta:5201 is not: {text}");

    // Each end counted what it did: beta opened alpha's flow under rule 1 and refused
    // gamma's SYNs; alpha never sent its pings; gamma never sent its SYNs either.
    let policy = |h: &Host, agent: &AgentHandle| bed.namespace_status(h, agent).unwrap().policy;
    let at_beta = policy(&beta, &b);
    assert_eq!(at_beta.version, 1);
    assert_eq!(at_beta.default, "deny");
    assert!(at_beta.rule_hits[0] >= 1, "{at_beta:?}");
    let at_alpha = policy(&alpha, &a);
    assert!(at_alpha.rule_hits[0] >= 1, "{at_alpha:?}");
    assert!(
        at_alpha.rule_hits[1] >= 2,
        "pings of beta and gamma: {at_alpha:?}"
    );
    assert!(at_alpha.denied_out >= 2, "alpha's own pings: {at_alpha:?}");
    let at_gamma = policy(&gamma, &g);
    assert!(at_gamma.denied_out >= 1, "gamma's SYNs: {at_gamma:?}");
    assert!(at_gamma.flows <= at_gamma.flows_max);

    // `hyphae policy check` at beta explains both decisions; a mistake is an error.
    let check = |from: &str, traffic: &str| {
        std::process::Command::new(BIN)
            .args([
                "policy",
                "check",
                "lab",
                "--from",
                from,
                "--to",
                "10.204.0.12",
                traffic,
            ])
            .args(["-c", &b.config.display().to_string()])
            .output()
            .unwrap()
    };
    let out = check("10.204.0.11", "tcp/5201");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("allowed") && text.contains("by rule 1"),
        "{text}"
    );
    assert!(text.contains("(version 1)"), "{text}");
    let out = check("10.204.0.13", "tcp/5201");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("denied") && text.contains("default is deny"),
        "{text}"
    );
    let out = check("10.204.0.11", "tcp");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("tcp needs a port"));
}

/// Unix time in seconds, as a float.
fn epoch() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Issue 28, item 5: a new policy applies to running flows without dropping the ones it
/// still allows. alpha streams TCP to beta on two ports, both allowed by version 1;
/// version 2 allows only the first. Both agents read it on SIGHUP while the streams run:
/// the first goes on, the second stops carrying within 5 s.
#[test]
fn a_policy_update_mid_stream_keeps_what_it_allows_and_stops_the_rest() {
    require_root();
    let mut bed = Testbed::new("polu", Path::new(BIN)).expect("testbed");
    hyphae_testbed::write_secret(&bed.dir().join("lab.secret"), SECRET).unwrap();
    let version = |v: u32, ports: &str| {
        format!(
            "version = {v}\ndefault = \"deny\"\n[[rule]]\nfrom = [\"10.204.0.11\"]\nto = [\"10.204.0.12\"]\nproto = \"tcp\"\nports = [{ports}]\n"
        )
    };
    let policy = bed.dir().join("lab.policy.toml");
    std::fs::write(&policy, version(1, "\"5201\", \"5202\"")).unwrap();
    let (alpha, a) = start(&mut bed, 1, "alpha", None);
    let (beta, b) = start(&mut bed, 2, "beta", Some(alpha.underlay));
    for port in ["5201", "5202"] {
        let log = beta.dir.join(format!("iperf3-s-{port}.log"));
        bed.spawn(&beta.ns, "iperf3", &["-s", "-1", "-p", port], &log)
            .unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut logs = Vec::new();
    for port in ["5201", "5202"] {
        let log = alpha.dir.join(format!("iperf3-c-{port}.log"));
        bed.spawn(
            &alpha.ns,
            "iperf3",
            &[
                "-c",
                "10.204.0.12",
                "-p",
                port,
                "-t",
                "12",
                "-b",
                "50M",
                "-i",
                "0.1",
                "--forceflush",
                "--connect-timeout",
                "3000",
            ],
            &log,
        )
        .unwrap();
        logs.push(log);
    }
    let started = epoch();
    std::thread::sleep(std::time::Duration::from_secs(3));
    for log in &logs {
        assert!(
            hyphae_testbed::iperf_last_carrying(log).is_some_and(|t| t > 1.0),
            "the stream runs: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }

    // Version 2: only 5201. Both ends read it.
    std::fs::write(&policy, version(2, "\"5201\"")).unwrap();
    let changed = epoch() - started;
    for agent in [&a, &b] {
        let status = std::process::Command::new("kill")
            .args(["-HUP", &agent.pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while bed.namespace_status(&beta, &b).unwrap().policy.version != 2
        || bed.namespace_status(&alpha, &a).unwrap().policy.version != 2
    {
        assert!(
            std::time::Instant::now() < deadline,
            "version 2 not in place"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Let the streams run out (12 s from their start).
    std::thread::sleep(std::time::Duration::from_secs_f64(
        (started + 13.0 - epoch()).max(0.0),
    ));
    let kept = hyphae_testbed::iperf_last_carrying(&logs[0]).unwrap_or(0.0);
    let stopped = hyphae_testbed::iperf_last_carrying(&logs[1]).unwrap_or(0.0);
    assert!(
        kept > 11.0,
        "the allowed stream stopped at {kept:.1} s (policy changed at {changed:.1} s): {}",
        std::fs::read_to_string(&logs[0]).unwrap_or_default()
    );
    assert!(
        stopped < changed + 5.0,
        "the denied stream carried until {stopped:.1} s (policy changed at {changed:.1} s)"
    );
    let at_beta = bed.namespace_status(&beta, &b).unwrap().policy;
    let at_alpha = bed.namespace_status(&alpha, &a).unwrap().policy;
    assert!(
        at_beta.flows_revoked + at_alpha.flows_revoked >= 1,
        "{at_beta:?} {at_alpha:?}"
    );
}

/// `reject = true`: a denied connection is refused at once, by the sender's own agent
/// (alpha runs the policy) or by the receiver's (gamma runs none; beta answers through the
/// tunnel), where without it the client waits out its timeout.
#[test]
fn a_rejecting_policy_refuses_connections_at_once() {
    require_root();
    let mut bed = Testbed::new("polr", Path::new(BIN)).expect("testbed");
    hyphae_testbed::write_secret(&bed.dir().join("lab.secret"), SECRET).unwrap();
    let policy = bed.dir().join("lab.policy.toml");
    std::fs::write(
        &policy,
        "default = \"deny\"\nreject = true\n[[rule]]\nfrom = [\"any\"]\nto = [\"any\"]\nproto = \"icmp\"\n",
    )
    .unwrap();
    let (alpha, _) = start_with(&mut bed, 1, "alpha", None, Some(&policy));
    let boot = Some(alpha.underlay);
    let (beta, b) = start_with(&mut bed, 2, "beta", boot, Some(&policy));
    let (gamma, _) = start_with(&mut bed, 3, "gamma", boot, None);
    let beta_ip = Ipv4Addr::new(10, 204, 0, 12);
    for h in [&alpha, &gamma] {
        bed.wait_for_ping(h, beta_ip, std::time::Duration::from_secs(30))
            .unwrap();
    }
    bed.spawn(&beta.ns, "iperf3", &["-s"], &beta.dir.join("iperf3-s.log"))
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    for h in [&alpha, &gamma] {
        let (ok, text) = iperf(&bed, h);
        assert!(!ok, "{} reached beta: {text}", h.name);
        assert!(
            text.contains("Connection refused"),
            "{} is not refused at once: {text}",
            h.name
        );
    }
    let at_beta = bed.namespace_status(&beta, &b).unwrap().policy;
    assert!(
        at_beta.denied_in >= 1,
        "gamma's SYN, answered by beta: {at_beta:?}"
    );
}
