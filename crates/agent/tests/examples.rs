#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The configurations in the top-level `examples/` are what users copy: every one must load
//! with the agent's own loader and say what its name promises. No root needed.
//!
//! Each example names its secret files under /etc/hyphae; the test loads a copy whose
//! `secret_file` lines point at a secret of its own (and `authority` and `certificate` at
//! an authority and a certificate of its own, `policy` at examples/policy/web-db.toml as
//! that authority signs it), and nothing else changed.

use std::path::{Path, PathBuf};

use hyphae_agent::config::{Address, Config, Mode};

/// Every example and the mode of each of its namespaces, in order.
const EXPECTED: &[(&str, &[Mode])] = &[
    ("interface-host.toml", &[Mode::Interface]),
    ("router-site.toml", &[Mode::Router]),
    ("hybrid-host.toml", &[Mode::Hybrid]),
    ("two-namespaces.toml", &[Mode::Interface, Mode::Interface]),
    ("certified-host.toml", &[Mode::Interface]),
    ("three-subnets.toml", &[Mode::Interface]),
    ("vepa-site.toml", &[Mode::Router]),
    ("layer2-site.toml", &[Mode::Router]),
    ("vlan-trunk.toml", &[Mode::Router, Mode::Router]),
];

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// `text` with every `secret_file = "..."` (and its comment) replaced by `secret`, and
/// `authority`, `certificate` and `policy` by those of a test authority.
fn with_secret(
    text: &str,
    secret: &Path,
    (certificate, policy, authority): &(PathBuf, PathBuf, String),
) -> String {
    text.lines()
        .map(|line| {
            let key = line.trim_start();
            if key.starts_with("secret_file") {
                format!("secret_file = \"{}\"", secret.display())
            } else if key.starts_with("certificate") {
                format!("certificate = \"{}\"", certificate.display())
            } else if key.starts_with("authority") {
                format!("authority = \"{authority}\"")
            } else if key.starts_with("policy") {
                format!("policy = \"{}\"", policy.display())
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A certificate for namespace "lab" from a test authority and that authority's signature
/// of examples/policy/web-db.toml, in `dir`; the authority.
fn certificate(dir: &Path) -> (PathBuf, PathBuf, String) {
    use hyphae_overlay::cert::{armor, AuthorityKey, CertificateRequest};
    let ca = AuthorityKey::from_seed([7; 32]);
    let bytes = ca
        .sign(&CertificateRequest {
            namespace: "lab".into(),
            identity: hyphae_overlay::Identity::from_seed([1; 32]).peer_id(),
            name: "web".into(),
            groups: vec!["web".into()],
            addresses: Vec::new(),
            not_before: 0,
            not_after: u64::MAX / 2,
        })
        .unwrap();
    let path = dir.join("web.lab.crt");
    std::fs::write(&path, armor("CERTIFICATE", &bytes)).unwrap();
    let text = std::fs::read_to_string(examples_dir().join("policy/web-db.toml")).unwrap();
    let signed = ca.sign_policy("lab", 1, 0, &text).unwrap();
    let policy = dir.join("lab.policy");
    std::fs::write(&policy, armor("POLICY", &signed)).unwrap();
    (path, policy, ca.authority().to_string())
}

fn load(name: &str) -> Config {
    // One directory per test thread: tests run in parallel and load the same files.
    let dir = std::env::temp_dir().join(format!(
        "hyphae-examples-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("namespace.secret");
    hyphae_testbed::write_secret(&secret, "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n")
        .unwrap();
    let authority = certificate(&dir);
    let text = std::fs::read_to_string(examples_dir().join(name)).unwrap();
    let copy = dir.join(name);
    std::fs::write(&copy, with_secret(&text, &secret, &authority)).unwrap();
    let config = Config::load(&copy);
    let _ = std::fs::remove_dir_all(&dir);
    config.unwrap_or_else(|e| panic!("examples/{name} does not load: {e:#}"))
}

#[test]
fn every_example_is_listed_here() {
    let mut found: Vec<String> = std::fs::read_dir(examples_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".toml"))
        .collect();
    found.sort();
    let mut listed: Vec<String> = EXPECTED.iter().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    assert_eq!(found, listed, "examples/*.toml and EXPECTED must match");
}

#[test]
fn every_example_loads_with_its_modes() {
    for (name, modes) in EXPECTED {
        let config = load(name);
        let got: Vec<Mode> = config.namespaces.iter().map(|ns| ns.mode).collect();
        assert_eq!(&got, modes, "examples/{name}");
    }
}

#[test]
fn examples_say_what_their_comments_say() {
    let router = load("router-site.toml");
    let ns = &router.namespaces[0];
    assert_eq!(ns.address, Address::None);
    assert!(ns.bridge.is_some() && ns.uplink.is_some());

    let hybrid = load("hybrid-host.toml");
    assert!(hybrid.agent.mdns);
    assert!(hybrid.namespaces[0].bridge.is_some());

    let interface = load("interface-host.toml");
    let ns = &interface.namespaces[0];
    assert_eq!(ns.address, Address::Auto);
    // A joiner: the subnet comes from the namespace record.
    assert!(ns.subnet.is_none() && !ns.bootstrap.is_empty());

    let two = load("two-namespaces.toml");
    let [lab, home] = &two.namespaces[..] else {
        panic!("two namespaces");
    };
    assert_ne!(lab.device, home.device);
    // The first member of "home" starts it: a subnet and no bootstrap.
    assert!(home.subnet.is_some() && home.bootstrap.is_empty());
    assert!(matches!(home.address, Address::Static(_)));

    let three = load("three-subnets.toml");
    let ns = &three.namespaces[0];
    assert_eq!(ns.subnets.len(), 3);
    assert_eq!(ns.subnet, Some(ns.subnets[0]));

    let vepa = load("vepa-site.toml");
    let ns = &vepa.namespaces[0];
    assert_eq!(ns.lan_ports, hyphae_vswitch::LanPorts::Vepa);
    assert_eq!(ns.lan_table.len(), 2);

    let l2 = load("layer2-site.toml");
    assert!(l2.namespaces[0].layer2);
    assert!(!router.namespaces[0].layer2);
    let trunk = load("vlan-trunk.toml");
    let vlans: Vec<Option<u16>> = trunk.namespaces.iter().map(|n| n.vlan).collect();
    assert_eq!(vlans, vec![Some(10), Some(20)]);
    assert_eq!(trunk.namespaces[0].bridge, trunk.namespaces[1].bridge);

    let certified = load("certified-host.toml");
    assert!(certified.namespaces[0].credential.is_some());
    // Its policy is examples/policy/web-db.toml: four rules, default deny.
    let policy = &certified.namespaces[0].policy;
    assert_eq!((policy.version(), policy.rule_count()), (1, 4));
    assert_eq!(
        policy.default_action(),
        hyphae_vswitch::policy::DefaultAction::Deny
    );
}
