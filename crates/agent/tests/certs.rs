#![allow(clippy::disallowed_methods)] // a test waits on the real clock
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 27: a namespace with an authority, end to end. The operator's commands (`hyphae
//! ca init`, `hyphae id`, `hyphae cert sign`, `hyphae cert revoke`) make the keys, then
//! real agents run in network namespaces: two members with good certificates reach each
//! other; three agents that hold the namespace secret but no good certificate (one signed
//! by another authority, one with none, one revoked) get no tunnel that carries a packet,
//! no name in the members' DNS, and are counted under their reason.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use hyphae_testbed::{agent_section, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.203.0.0/24";
const SERVICE: &str = "10.203.0.1";
const SECRET: &str = "the certificate test namespace secret\n";

/// Runs the `hyphae` command line (outside any network namespace); its stdout.
fn hyphae(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().expect("hyphae runs");
    assert!(
        out.status.success(),
        "hyphae {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `hyphae ca init lab`: the key file and the `authority = "..."` line it prints.
fn authority(dir: &Path, file: &str) -> (String, String) {
    let key = dir.join(file).display().to_string();
    let out = hyphae(&["ca", "init", "lab", "--out", &key]);
    let line = out
        .lines()
        .find(|l| l.starts_with("authority = "))
        .expect("an authority line")
        .to_string();
    (key, line)
}

/// A host and its identity (`hyphae id` with the host's state directory).
fn host(bed: &mut Testbed, name: &str, i: u8) -> (Host, String) {
    let host = bed.add_host(name, Ipv4Addr::new(10, 200, 0, i)).unwrap();
    let cfg = host.dir.join("id.toml");
    std::fs::write(&cfg, agent_section(&host)).unwrap();
    let id = hyphae(&["id", "-c", &cfg.display().to_string()])
        .trim()
        .to_string();
    (host, id)
}

/// `hyphae cert sign` for `id` as `name`, into the host's directory.
fn sign(key: &str, host: &Host, id: &str, name: &str) -> String {
    let out = host.dir.join("lab.crt").display().to_string();
    hyphae(&[
        "cert",
        "sign",
        "--ca",
        key,
        "--identity",
        id,
        "--name",
        name,
        "--groups",
        "web",
        "--days",
        "30",
        "--out",
        &out,
    ]);
    out
}

/// Starts the agent of `host` in "lab" at `address`, named `name`, with `extra` keys
/// (the authority, its certificate, a revocation list).
fn start(
    bed: &mut Testbed,
    host: &Host,
    address: &str,
    name: &str,
    boot: Option<Ipv4Addr>,
    extra: &str,
) -> AgentHandle {
    let secret = bed.dir().join("lab.secret");
    let lines = format!("address = \"{address}\"\nhostname = \"{name}\"\nresolvers = []\n{extra}");
    let cfg = format!(
        "{}{}",
        agent_section(host),
        hyphae_testbed::lab_namespace(&secret, SUBNET, boot, &lines)
    );
    bed.start_agent(host, &cfg).expect("agent")
}

/// `dig +short NAME` at the agent's DNS service inside `host`.
fn dig(bed: &Testbed, host: &Host, name: &str) -> Vec<String> {
    let server = format!("@{SERVICE}");
    let out = bed
        .ns_output(
            &host.ns,
            "dig",
            &[&server, "+time=2", "+tries=2", "+short", name],
        )
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty() && !l.starts_with(';'))
        .collect()
}

#[test]
fn certified_members_connect_and_strangers_with_the_secret_get_nothing() {
    require_root();
    let mut bed = Testbed::new("crt", Path::new(BIN)).expect("testbed");
    hyphae_testbed::write_secret(&bed.dir().join("lab.secret"), SECRET).unwrap();
    let dir = bed.dir().to_path_buf();
    let (key, line) = authority(&dir, "lab.ca.key");
    let (other_key, other_line) = authority(&dir, "other.ca.key");

    let (alpha, alpha_id) = host(&mut bed, "alpha", 1);
    let (beta, beta_id) = host(&mut bed, "beta", 2);
    let (gamma, gamma_id) = host(&mut bed, "gamma", 3);
    let (delta, delta_id) = host(&mut bed, "delta", 4);
    let (eps, eps_id) = host(&mut bed, "eps", 5);

    // The members' certificates; gamma's from another authority (which gamma trusts);
    // eps's good, but revoked in the list alpha and beta start with.
    let alpha_cert = sign(&key, &alpha, &alpha_id, "alpha");
    let beta_cert = sign(&key, &beta, &beta_id, "beta");
    let gamma_cert = sign(&other_key, &gamma, &gamma_id, "gamma");
    let eps_cert = sign(&key, &eps, &eps_id, "eps");
    let list = dir.join("lab.revocations").display().to_string();
    let out = hyphae(&[
        "cert",
        "revoke",
        "--ca",
        &key,
        "--identity",
        &eps_id,
        "--out",
        &list,
    ]);
    assert!(out.contains("version 1"), "{out}");
    let shown = hyphae(&["cert", "show", &alpha_cert]);
    assert!(
        shown.contains("name:        alpha") && shown.contains("signature:   good"),
        "{shown}"
    );

    let member =
        |cert: &str| format!("{line}\ncertificate = \"{cert}\"\nrevocations = \"{list}\"\n");
    let a = start(
        &mut bed,
        &alpha,
        "10.203.0.11",
        "alpha",
        None,
        &member(&alpha_cert),
    );
    let boot = Some(alpha.underlay);
    let b = start(
        &mut bed,
        &beta,
        "10.203.0.12",
        "beta",
        boot,
        &member(&beta_cert),
    );
    assert_eq!(
        bed.claimed_address(&alpha, &a).unwrap(),
        Ipv4Addr::new(10, 203, 0, 11)
    );
    assert_eq!(
        bed.claimed_address(&beta, &b).unwrap(),
        Ipv4Addr::new(10, 203, 0, 12)
    );
    bed.wait_for_ping(
        &alpha,
        Ipv4Addr::new(10, 203, 0, 12),
        Duration::from_secs(20),
    )
    .unwrap();
    let st = bed.namespace_status(&alpha, &a).unwrap();
    let own = st.certificate.expect("alpha shows its certificate");
    assert_eq!(
        (own.name.as_str(), own.groups.clone()),
        ("alpha", vec!["web".to_string()])
    );
    assert_eq!(own.revocations_version, 1);
    assert!(own.expires_in_secs > 29 * 86_400, "{own:?}");
    // beta's name resolves at alpha: its records were stored.
    let deadline = Instant::now() + Duration::from_secs(15);
    while dig(&bed, &alpha, "beta.lab") != ["10.203.0.12"] {
        assert!(
            Instant::now() < deadline,
            "beta.lab does not resolve at alpha"
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // The three strangers that hold the secret.
    let strangers = [
        (&gamma, &gamma_id, "10.203.0.13", "gamma", "wrong_authority"),
        (&delta, &delta_id, "10.203.0.14", "delta", "missing"),
        (&eps, &eps_id, "10.203.0.15", "eps", "revoked"),
    ];
    start(
        &mut bed,
        &gamma,
        "10.203.0.13",
        "gamma",
        boot,
        &format!("{other_line}\ncertificate = \"{gamma_cert}\"\n"),
    );
    start(&mut bed, &delta, "10.203.0.14", "delta", boot, "");
    start(
        &mut bed,
        &eps,
        "10.203.0.15",
        "eps",
        boot,
        &format!("{line}\ncertificate = \"{eps_cert}\"\n"),
    );

    // Each is refused under its reason: its membership proof, and (delta, eps) the
    // certificate its tunnel announced. gamma refuses alpha's certificate too (it trusts
    // the other authority), closing its end before it announces anything: alpha's end of
    // that tunnel never learns an address, which is checked below.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = bed.status(&alpha, &a).unwrap();
        let c = &status.certificates;
        let missing: Vec<&str> = strangers
            .iter()
            .filter(|s| {
                (s.3 != "gamma" && c.tunnels_refused.get(s.4).copied().unwrap_or(0) == 0)
                    || c.members_refused.get(s.4).copied().unwrap_or(0) == 0
            })
            .map(|s| s.3)
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not refused at alpha after 30 s: {missing:?}; counters {c:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // Give them time to try everything (hellos, claims, names), then look.
    std::thread::sleep(Duration::from_secs(5));
    for (m, member) in [(&alpha, &a), (&beta, &b)] {
        let st = bed.namespace_status(m, member).unwrap();
        for (_, id, address, name, _) in &strangers {
            assert!(
                !st.peers
                    .iter()
                    .any(|p| &&p.identity == id && !p.addresses.is_empty()),
                "{} took {name}'s addresses: {:?}",
                m.name,
                st.peers
            );
            assert!(
                !st.peers
                    .iter()
                    .any(|p| p.addresses.iter().any(|x| x == address)),
                "{} routes {address} to someone",
                m.name
            );
            assert!(
                dig(&bed, m, &format!("{name}.lab")).is_empty(),
                "{name}.lab resolves at {}",
                m.name
            );
        }
        // Only the one member is a member.
        let members: Vec<&str> = st
            .peers
            .iter()
            .filter(|p| !p.addresses.is_empty())
            .map(|p| p.identity.as_str())
            .collect();
        let other = if m.name == "alpha" {
            &beta_id
        } else {
            &alpha_id
        };
        assert_eq!(members, [other.as_str()], "{}", m.name);
    }
    for (h, _, _, name, _) in &strangers {
        let out = bed.ping(h, Ipv4Addr::new(10, 203, 0, 11), 2).unwrap();
        assert!(!out.status.success(), "{name} pings alpha");
    }
    for (_, _, address, name, _) in &strangers {
        let out = bed.ping(&alpha, address.parse().unwrap(), 2).unwrap();
        assert!(!out.status.success(), "alpha pings {name}");
    }
    // The members still reach each other.
    let out = bed.ping(&beta, Ipv4Addr::new(10, 203, 0, 11), 3).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
