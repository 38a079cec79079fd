#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `hyphae cloud-init`: the user-data of every provider passes cloud-init's own schema check
//! (Debian's `cloud-init` package) and carries the secret and a config the agent loads; and
//! a network-namespace "VM" that runs it (cloud-init's own write_files code, then its
//! runcmd script under /bin/sh, on a copy-on-write view of the filesystem) downloads
//! hyphae over HTTP, checks its SHA-256, starts it and joins a running namespace.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use base64::Engine as _;
use hyphae_agent::config::Config;
use hyphae_agent::control::Status;
use hyphae_testbed::{join_config, require_root, write_secret, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.203.0.0/24";
const SECRET: &str = "the cloud-init test namespace secret\n";
const PROVIDERS: &[(&str, u16)] = &[
    ("aws", 1420),
    ("gcp", 1380),
    ("azure", 1420),
    ("digitalocean", 1420),
    ("hetzner", 1370),
    ("generic", 1420),
];

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hyphae-ci-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn hyphae(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn schema_check(path: &Path) -> Output {
    Command::new("cloud-init")
        .args(["schema", "--config-file"])
        .arg(path)
        .output()
        .expect("cloud-init is not installed (scripts/deps installs it)")
}

/// The user-data as data, read by PyYAML (what cloud-init parses it with).
fn parse_yaml(path: &Path) -> serde_json::Value {
    let out = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import sys, json, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)",
        ])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn file<'a>(doc: &'a serde_json::Value, path: &str) -> &'a serde_json::Value {
    doc["write_files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path)
        .unwrap_or_else(|| panic!("no {path} in write_files"))
}

#[test]
fn every_providers_user_data_passes_the_schema_and_carries_a_loadable_config() {
    let dir = scratch("schema");
    let secret = dir.join("lab.secret");
    write_secret(&secret, SECRET).unwrap();
    let sum = "0123456789abcdef".repeat(4);
    let installs: [&[&str]; 3] = [
        &[
            "--install",
            "https://example.org/hyphae_0.1.0_amd64.deb",
            "--sha256",
            &sum,
        ],
        &[
            "--install",
            "https://example.org/hyphae-x86_64",
            "--sha256",
            &sum,
        ],
        &["--install", "/opt/hyphae/bin/hyphae"],
    ];
    for &(provider, mtu) in PROVIDERS {
        for install in installs {
            let mut args = vec![
                "cloud-init",
                "--namespace",
                "lab",
                "--secret-file",
                secret.to_str().unwrap(),
                "--bootstrap",
                "203.0.113.7:7400",
                "--provider",
                provider,
            ];
            args.extend_from_slice(install);
            let out = hyphae(&args);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let path = dir.join(format!("{provider}.yaml"));
            std::fs::write(&path, &out.stdout).unwrap();
            let check = schema_check(&path);
            assert!(
                check.status.success(),
                "{provider} {install:?}: {}{}",
                String::from_utf8_lossy(&check.stdout),
                String::from_utf8_lossy(&check.stderr)
            );

            let doc = parse_yaml(&path);
            let s = file(&doc, "/etc/hyphae/lab.secret");
            assert_eq!(
                (&s["permissions"], &s["owner"], &s["encoding"]),
                (&"0600".into(), &"root:root".into(), &"b64".into())
            );
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(s["content"].as_str().unwrap())
                .unwrap();
            assert_eq!(bytes, SECRET.as_bytes());
            // The config, pointed at a local secret, loads with the agent's own loader.
            let c = file(&doc, "/etc/hyphae/hyphae.toml");
            assert_eq!(c["permissions"], "0600");
            let text = c["content"]
                .as_str()
                .unwrap()
                .replace("/etc/hyphae/lab.secret", secret.to_str().unwrap());
            let config_path = dir.join("hyphae.toml");
            std::fs::write(&config_path, text).unwrap();
            let config = Config::load(&config_path).unwrap();
            assert_eq!(config.namespaces[0].mtu, mtu, "{provider}");
            assert_eq!(config.agent.state_dir, Path::new("/var/lib/hyphae"));
            assert_eq!(
                config.agent.control_socket,
                Path::new("/run/hyphae/hyphae.sock")
            );
            // A package brings its own unit; anything else gets dist/hyphae.service with
            // its binary's path.
            let has_unit = doc["write_files"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["path"] == "/etc/systemd/system/hyphae.service");
            assert_eq!(has_unit, !install[1].ends_with(".deb"), "{install:?}");
            let runcmd: Vec<&str> = doc["runcmd"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l.as_str().unwrap())
                .collect();
            assert_eq!(runcmd[0], "set -eu");
            if install.len() == 4 {
                assert!(runcmd
                    .iter()
                    .any(|l| l.contains(&sum) && l.contains("sha256sum -c")));
            }
        }
    }

    // The check can fail: the same document with runcmd made a mapping is refused.
    let path = dir.join("generic.yaml");
    let broken = std::fs::read_to_string(&path)
        .unwrap()
        .replace("runcmd:\n  - \"set -eu\"", "runcmd:\n  set: -eu");
    std::fs::write(&path, broken).unwrap();
    assert!(!schema_check(&path).status.success());

    // Hostile flags never reach the YAML: the config the user-data would carry is checked
    // first, and a bootstrap that is no address is refused with the agent's message.
    let out = hyphae(&[
        "cloud-init",
        "--namespace",
        "lab",
        "--secret-file",
        secret.to_str().unwrap(),
        "--bootstrap",
        "x\"\nruncmd: [reboot]",
        "--install",
        "/usr/bin/hyphae",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bootstrap"), "{err}");

    // A multi-subnet namespace's first member: its subnets go into the config, checked
    // (overlapping ones are refused with the agent's message).
    let multi = |subnets: &str| {
        hyphae(&[
            "cloud-init",
            "--namespace",
            "lab",
            "--secret-file",
            secret.to_str().unwrap(),
            "--subnets",
            subnets,
            "--install",
            "/usr/bin/hyphae",
        ])
    };
    let out = multi("10.1.0.0/24,10.2.0.0/24");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(r#"subnets = ["10.1.0.0/24", "10.2.0.0/24"]"#),
        "{text}"
    );
    let out = multi("10.1.0.0/16,10.1.2.0/24");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("overlap"), "{err}");

    // IPv6: a prefix and an address of it go into the config; one outside it, or an
    // address for a router, is refused with the agent's message.
    let dual = |extra: &[&str]| {
        let mut args = vec![
            "cloud-init",
            "--namespace",
            "lab",
            "--secret-file",
            secret.to_str().unwrap(),
            "--subnet",
            "10.1.0.0/24",
            "--install",
            "/usr/bin/hyphae",
        ];
        args.extend_from_slice(extra);
        hyphae(&args)
    };
    let out = dual(&["--subnet6", "fd00:5::/64", "--address6", "fd00:5::20"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(r#"subnet6 = "fd00:5::/64""#), "{text}");
    assert!(text.contains(r#"address6 = "fd00:5::20""#), "{text}");
    let out = dual(&["--subnet6", "fd00:5::/64", "--address6", "fd00:6::20"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("subnet6"));
    let out = dual(&["--mode", "router", "--bridge", "br0", "--address6", "auto"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("address6"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A namespace with an authority: `--ca` gives the VM a fresh identity and a certificate
/// for it, which the config names; the user-data passes the schema, and the identity, the
/// certificate and the config agree.
#[test]
fn user_data_for_a_namespace_with_an_authority_carries_an_identity_and_its_certificate() {
    let dir = scratch("certified");
    let secret = dir.join("lab.secret");
    write_secret(&secret, SECRET).unwrap();
    let key = dir.join("lab.ca.key");
    let out = hyphae(&["ca", "init", "lab", "--out", key.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let authority = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            l.strip_prefix("authority = \"")?
                .strip_suffix('"')
                .map(str::to_string)
        })
        .expect("the authority line");
    let out = hyphae(&[
        "cloud-init",
        "--namespace",
        "lab",
        "--secret-file",
        secret.to_str().unwrap(),
        "--bootstrap",
        "203.0.113.7:7400",
        "--install",
        "/usr/bin/hyphae",
        "--ca",
        key.to_str().unwrap(),
        "--hostname",
        "web",
        "--groups",
        "web,prod",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join("certified.yaml");
    std::fs::write(&path, &out.stdout).unwrap();
    let check = schema_check(&path);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let doc = parse_yaml(&path);

    let id = file(&doc, "/var/lib/hyphae/identity.key");
    assert_eq!(
        (&id["permissions"], &id["encoding"]),
        (&"0600".into(), &"b64".into())
    );
    let identity_text = base64::engine::general_purpose::STANDARD
        .decode(id["content"].as_str().unwrap())
        .unwrap();
    let identity =
        hyphae_overlay::Identity::from_text(&String::from_utf8(identity_text).unwrap()).unwrap();
    let cert_text = file(&doc, "/etc/hyphae/lab.crt")["content"]
        .as_str()
        .unwrap()
        .to_string();
    let cert_path = dir.join("lab.crt");
    std::fs::write(&cert_path, &cert_text).unwrap();
    let shown =
        String::from_utf8_lossy(&hyphae(&["cert", "show", cert_path.to_str().unwrap()]).stdout)
            .into_owned();
    assert!(
        shown.contains(&format!("identity:    {}", identity.peer_id())),
        "{shown}"
    );
    assert!(
        shown.contains("name:        web") && shown.contains("groups:      web, prod"),
        "{shown}"
    );
    assert!(shown.contains("signature:   good"), "{shown}");

    let text = file(&doc, "/etc/hyphae/hyphae.toml")["content"]
        .as_str()
        .unwrap()
        .replace("/etc/hyphae/lab.secret", secret.to_str().unwrap())
        .replace("/etc/hyphae/lab.crt", cert_path.to_str().unwrap());
    assert!(
        text.contains(&format!("authority = \"{authority}\"")),
        "{text}"
    );
    let config_path = dir.join("hyphae.toml");
    std::fs::write(&config_path, text).unwrap();
    let config = Config::load(&config_path).unwrap();
    let credential = config.namespaces[0].credential.as_ref().unwrap();
    assert!(credential
        .trust
        .check(&credential.certificate, &identity.peer_id(), 1_800_000_000)
        .is_ok());

    // A key of another namespace's authority is refused.
    let other = dir.join("prod.ca.key");
    assert!(
        hyphae(&["ca", "init", "prod", "--out", other.to_str().unwrap()])
            .status
            .success()
    );
    let out = hyphae(&[
        "cloud-init",
        "--namespace",
        "lab",
        "--secret-file",
        secret.to_str().unwrap(),
        "--bootstrap",
        "203.0.113.7:7400",
        "--install",
        "/usr/bin/hyphae",
        "--ca",
        other.to_str().unwrap(),
        "--hostname",
        "web",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("authority of 'prod'"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// examples/cloud-init/ holds the user-data of every provider, as `hyphae cloud-init`
/// prints it today for these flags (and an example secret).
#[test]
fn a_router_with_vepa_ports_is_written_and_a_wrong_word_refused() {
    let dir = scratch("vepa");
    let secret = dir.join("lab.secret");
    write_secret(&secret, SECRET).unwrap();
    let run = |ports: &str| {
        hyphae(&[
            "cloud-init",
            "--namespace",
            "lab",
            "--secret-file",
            secret.to_str().unwrap(),
            "--bootstrap",
            "203.0.113.7:7400",
            "--provider",
            "generic",
            "--install",
            "/opt/hyphae/bin/hyphae",
            "--mode",
            "router",
            "--bridge",
            "br-vms",
            "--lan-ports",
            ports,
        ])
    };
    let out = run("vepa");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join("vepa.yaml");
    std::fs::write(&path, &out.stdout).unwrap();
    let doc = parse_yaml(&path);
    let text = file(&doc, "/etc/hyphae/hyphae.toml")["content"]
        .as_str()
        .unwrap()
        .replace("/etc/hyphae/lab.secret", secret.to_str().unwrap());
    let config_path = dir.join("hyphae.toml");
    std::fs::write(&config_path, text).unwrap();
    let config = Config::load(&config_path).unwrap();
    assert_eq!(
        config.namespaces[0].lan_ports,
        hyphae_vswitch::LanPorts::Vepa
    );
    let out = run("vpea");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success() && err.contains("lan_ports 'vpea' is not"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_examples_are_what_the_command_prints() {
    let dir = scratch("examples");
    let secret = dir.join("lab.secret");
    write_secret(
        &secret,
        "example secret: make your own with hyphae secret\n",
    )
    .unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cloud-init");
    let zeros = "0".repeat(64);
    for &(provider, _) in PROVIDERS {
        let out = hyphae(&[
            "cloud-init",
            "--namespace",
            "lab",
            "--secret-file",
            secret.to_str().unwrap(),
            "--bootstrap",
            "203.0.113.7:7400",
            "--provider",
            provider,
            "--install",
            "https://example.com/hyphae_0.1.0_amd64.deb",
            "--sha256",
            &zeros,
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = examples.join(format!("{provider}.yaml"));
        let example = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            example,
            String::from_utf8_lossy(&out.stdout),
            "{} is stale: regenerate it (examples/cloud-init/README.md)",
            path.display()
        );
        assert!(schema_check(&path).status.success(), "{}", path.display());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `nsenter` into the VM's mount, UTS and network namespaces (those of its agent).
fn in_vm(pid: u32, program: &str, args: &[&str]) -> Output {
    let target = pid.to_string();
    Command::new("nsenter")
        .args(["--target", &target, "--mount", "--uts", "--net", program])
        .args(args)
        .output()
        .unwrap()
}

/// What a first boot does with the user-data, in the VM's own mount and UTS namespaces:
/// /etc, /var and /usr/local become copy-on-write (tmpfs over the real ones), /run empty, the host
/// name is the instance's, cloud-init's own `write_files` writes the files, and its runcmd
/// script (built by cloud-init's `shellify`, as `cc_runcmd` does) runs under /bin/sh.
const FIRST_BOOT: &str = r#"set -eu
scratch=$1 userdata=$2
for d in /etc /var /usr/local; do
  t=$(mktemp -d -p "$scratch")
  mount -t tmpfs tmpfs "$t"
  mkdir "$t/u" "$t/w"
  mount -t overlay overlay -o "lowerdir=$d,upperdir=$t/u,workdir=$t/w" "$d"
done
# A booting VM's /run is empty: no /run/systemd/system, so the runcmd starts the agent
# itself and never reaches the host's systemd.
mount -t tmpfs tmpfs /run
hostname cloud-vm
mkdir -p /var/lib/cloud/instance/scripts
/usr/bin/python3 - "$userdata" <<'EOF'
import sys, yaml
from cloudinit import util
from cloudinit.config import cc_write_files
cfg = yaml.safe_load(open(sys.argv[1]))
cc_write_files.write_files("write_files", cfg["write_files"], "root:root")
with open("/var/lib/cloud/instance/scripts/runcmd", "w") as f:
    f.write(util.shellify(cfg["runcmd"]))
EOF
sh /var/lib/cloud/instance/scripts/runcmd
cat /run/hyphae/hyphae.pid
"#;

fn vm_status(pid: u32) -> Option<Status> {
    let out = in_vm(pid, "/usr/local/bin/hyphae", &["status", "--json"]);
    serde_json::from_slice(&out.stdout).ok()
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

fn serve(bed: &mut Testbed, host: &Host) -> String {
    let www = bed.dir().join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::copy(BIN, www.join("hyphae")).unwrap();
    let log = host.dir.join("http.log");
    let ip = host.underlay.to_string();
    let www_arg = www.display().to_string();
    bed.spawn(
        &host.ns,
        "/usr/bin/python3",
        &[
            "-m",
            "http.server",
            "8080",
            "--bind",
            &ip,
            "--directory",
            &www_arg,
        ],
        &log,
    )
    .unwrap();
    format!("http://{ip}:8080/hyphae")
}

#[test]
fn a_vm_booted_with_the_user_data_joins_a_running_namespace() {
    require_root();
    let mut bed = Testbed::new("ci", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    write_secret(&secret, SECRET).unwrap();
    let h1 = bed.add_host("h1", Ipv4Addr::new(10, 200, 0, 1)).unwrap();
    let a1 = bed
        .start_agent(
            &h1,
            &join_config(&h1, "lab", &secret, SUBNET, "auto", None, 600),
        )
        .unwrap();
    let first = bed.claimed_address(&h1, &a1).unwrap();
    let url = serve(&mut bed, &h1);
    let vm = bed.add_host("vm", Ipv4Addr::new(10, 200, 0, 2)).unwrap();
    // The package server answers before the VM boots.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !bed
        .ns_output(&vm.ns, "curl", &["-fsI", &url])
        .unwrap()
        .status
        .success()
    {
        assert!(
            Instant::now() < deadline,
            "the HTTP server in h1 did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let bootstrap = format!("{}:7400", h1.underlay);
    let out = hyphae(&[
        "cloud-init",
        "--namespace",
        "lab",
        "--secret-file",
        secret.to_str().unwrap(),
        "--bootstrap",
        &bootstrap,
        "--provider",
        "generic",
        "--install",
        &url,
        "--sha256",
        &sha256(Path::new(BIN)),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let user_data = vm.dir.join("user-data");
    std::fs::write(&user_data, &out.stdout).unwrap();
    let boot = vm.dir.join("first-boot.sh");
    std::fs::write(&boot, FIRST_BOOT).unwrap();
    let scratch = vm.dir.join("root");
    std::fs::create_dir_all(&scratch).unwrap();
    let host_secret_before = Path::new("/etc/hyphae/lab.secret").exists();

    let booted = bed
        .ns_output(
            &vm.ns,
            "unshare",
            &[
                "--mount",
                "--uts",
                "--propagation",
                "private",
                "sh",
                boot.to_str().unwrap(),
                scratch.to_str().unwrap(),
                user_data.to_str().unwrap(),
            ],
        )
        .unwrap();
    let stdout = String::from_utf8_lossy(&booted.stdout);
    assert!(
        booted.status.success(),
        "first boot failed: {stdout}{}",
        String::from_utf8_lossy(&booted.stderr)
    );
    let pid: u32 = stdout.lines().last().unwrap().trim().parse().unwrap();
    bed.adopt(pid);

    // The agent the runcmd started (no systemd here: its fallback) holds an address.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = vm_status(pid) {
            if s.namespaces.first().is_some_and(|n| n.address_claimed) {
                break s;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the VM holds no address: {:?}\n{}",
            vm_status(pid),
            String::from_utf8_lossy(&in_vm(pid, "cat", &["/var/log/hyphae.log"]).stdout)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let ns = &status.namespaces[0];
    let address: Ipv4Addr = ns.address.parse().unwrap();
    assert_ne!(address, first);
    // The instance's name (generic: its host name) named the member.
    assert_eq!(ns.hostname.as_deref(), Some("cloud-vm"), "{ns:?}");
    bed.wait_for_ping(&vm, first, Duration::from_secs(20))
        .unwrap();
    bed.wait_for_ping(&h1, address, Duration::from_secs(20))
        .unwrap();

    // The secret is root's only inside the VM, and nothing landed on the real host.
    let stat = in_vm(pid, "stat", &["-c", "%a %U", "/etc/hyphae/lab.secret"]);
    assert_eq!(String::from_utf8_lossy(&stat.stdout).trim(), "600 root");
    let log = in_vm(pid, "stat", &["-c", "%a", "/var/log/hyphae.log"]);
    assert_eq!(String::from_utf8_lossy(&log.stdout).trim(), "600");
    let cmp = in_vm(pid, "cmp", &["/usr/local/bin/hyphae", BIN]);
    assert!(
        cmp.status.success(),
        "the installed binary is not the served one"
    );
    assert_eq!(
        Path::new("/etc/hyphae/lab.secret").exists(),
        host_secret_before
    );
}
