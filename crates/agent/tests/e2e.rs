#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End-to-end tests: real `hyphae up` agents in network namespaces on a bridged underlay,
//! real TAP devices, and clients no one here wrote (ping, socat, tcpdump, sha256sum).
//!
//! They need root, iproute2, ping, socat and tcpdump (`scripts/test` installs them). They
//! never skip: without root they fail and say why.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyphae_agent::control::Status;
use hyphae_testbed::{agent_config, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.201.0.0/16";

fn underlay(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, 0, i)
}

fn vip(i: u8) -> Ipv4Addr {
    // 10.201.0.1 is the namespace's service address (virtual DHCP and DNS).
    Ipv4Addr::new(10, 201, 0, 10 + i)
}

/// `n` hosts, agents in full mesh with one secret.
struct Net {
    bed: Testbed,
    hosts: Vec<Host>,
    agents: Vec<AgentHandle>,
}

fn write_secret(dir: &Path, name: &str, value: &str) -> PathBuf {
    let path = dir.join(name);
    hyphae_testbed::write_secret(&path, value).expect("write secret");
    path
}

fn mesh(label: &str, n: u8) -> Net {
    require_root();
    let mut bed = Testbed::new(label, Path::new(BIN)).expect("testbed");
    let secret = write_secret(bed.dir(), "lab.secret", "a namespace secret for tests\n");
    let mut hosts = Vec::new();
    for i in 1..=n {
        hosts.push(bed.add_host(&format!("h{i}"), underlay(i)).expect("host"));
    }
    let mut agents = Vec::new();
    for (i, host) in hosts.iter().enumerate() {
        let me = i as u8 + 1;
        let peers: Vec<Ipv4Addr> = (1..=n).filter(|&j| j != me).map(underlay).collect();
        let cfg = agent_config(host, "lab", &secret, SUBNET, vip(me), &peers);
        agents.push(bed.start_agent(host, &cfg).expect("agent"));
    }
    Net { bed, hosts, agents }
}

impl Net {
    fn status(&self, i: usize) -> Status {
        self.bed
            .status(&self.hosts[i], &self.agents[i])
            .expect("status")
    }

    fn ping_ok(&self, from: usize, to: Ipv4Addr, count: u32) -> bool {
        let out = self.bed.ping(&self.hosts[from], to, count).expect("ping");
        out.status.success()
    }

    fn ping_mesh(&self) {
        for (i, from) in self.hosts.iter().enumerate() {
            for j in 0..self.hosts.len() {
                if i == j {
                    continue;
                }
                let to = vip(j as u8 + 1);
                self.bed
                    .wait_for_ping(from, to, Duration::from_secs(20))
                    .expect("first contact");
                let out = self
                    .bed
                    .ns(&from.ns, "ping", &["-c", "3", "-i", "0.2", &to.to_string()])
                    .expect("ping");
                let text = String::from_utf8_lossy(&out.stdout);
                assert!(text.contains("3 received"), "{} -> {to}: {text}", from.name);
            }
        }
    }
}

fn peer_for(status: &Status, address: Ipv4Addr) -> &hyphae_agent::control::PeerStatus {
    status.namespaces[0]
        .peers
        .iter()
        .find(|p| p.addresses.contains(&address.to_string()))
        .unwrap_or_else(|| panic!("no member with {address} in {status:#?}"))
}

fn agent_drops(status: &Status) -> u64 {
    status.drops.values().sum::<u64>()
        + status.namespaces[0]
            .peers
            .iter()
            .flat_map(|p| p.drops.values())
            .sum::<u64>()
}

fn wait_for_file_containing(path: &Path, needle: &[u8]) -> bool {
    for _ in 0..100 {
        if let Ok(bytes) = std::fs::read(path) {
            if bytes.windows(needle.len()).any(|w| w == needle) {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn three_hosts_ping_transfer_and_stay_encrypted() {
    let mut net = mesh("mesh", 3);

    // Capture the underlay while traffic with a marker payload crosses the overlay.
    let pcap = net.bed.dir().join("underlay.pcap");
    let tcpdump_log = net.bed.dir().join("tcpdump.log");
    let sw = net.bed.switch_ns().to_string();
    let tcpdump = net
        .bed
        .spawn(
            &sw,
            "tcpdump",
            &[
                "-i",
                "br0",
                "-U",
                "--immediate-mode",
                "-n",
                "-s",
                "512",
                "-w",
                &pcap.display().to_string(),
                "udp",
            ],
            &tcpdump_log,
        )
        .expect("tcpdump");
    assert!(
        wait_for_file_containing(&tcpdump_log, b"listening on"),
        "tcpdump did not start"
    );

    net.ping_mesh();

    let marker = format!("HYPHAE-PLAINTEXT-MARKER-{}", std::process::id());
    let control = format!("UNDERLAY-CONTROL-MARKER-{}", std::process::id());
    let received = net.hosts[1].dir.join("udp-received");
    let h2 = net.hosts[1].ns.clone();
    net.bed
        .spawn(
            &h2,
            "socat",
            &[
                "-u",
                "UDP-RECV:9999",
                &format!("OPEN:{},creat,append", received.display()),
            ],
            &net.bed.dir().join("socat-recv.log"),
        )
        .expect("socat");
    std::thread::sleep(Duration::from_millis(300));
    let h1 = net.hosts[0].ns.clone();
    for (payload, dst) in [(&marker, vip(2)), (&control, underlay(2))] {
        net.bed
            .ns(
                &h1,
                "sh",
                &[
                    "-c",
                    &format!("printf %s '{payload}' | socat -u - UDP-SENDTO:{dst}:9999"),
                ],
            )
            .expect("send marker");
    }
    assert!(
        wait_for_file_containing(&received, marker.as_bytes()),
        "the marker did not arrive through the overlay"
    );
    assert!(wait_for_file_containing(&received, control.as_bytes()));
    // tcpdump -U writes each packet as it takes it: wait until the control (sent after the
    // marker) is in the file, so a busy machine cannot stop the capture before it.
    wait_for_file_containing(&pcap, control.as_bytes());
    net.bed.signal(tcpdump, libc::SIGINT).expect("stop tcpdump");
    let capture = std::fs::read(&pcap).expect("pcap");
    assert!(
        contains(&capture, control.as_bytes()),
        "control: plaintext sent on the underlay must show in the capture"
    );
    assert!(
        !contains(&capture, marker.as_bytes()),
        "the overlay marker appeared in plaintext on the underlay"
    );
    assert!(
        contains(&capture, &7400u16.to_be_bytes()),
        "no tunnel traffic captured"
    );

    // 100 MB over TCP through the overlay arrives intact.
    let (from, to) = (net.hosts[0].clone(), net.hosts[1].clone());
    net.bed
        .tcp_transfer(
            &from,
            (&to, vip(2)),
            5001,
            100 * 1000 * 1000,
            Duration::from_secs(300),
        )
        .expect("100 MB over TCP");

    // Status reflects it: the receiver counted the bytes from host 1.
    let status = net.status(1);
    assert_eq!(status.version, 1);
    assert_eq!(status.namespaces[0].name, "lab");
    assert_eq!(status.namespaces[0].address, vip(2).to_string());
    assert_eq!(status.namespaces[0].peers.len(), 2);
    let from_h1 = peer_for(&status, vip(1));
    assert_eq!(from_h1.endpoint, format!("{}:7400", underlay(1)));
    assert!(from_h1.rx_bytes > 100_000_000, "{from_h1:#?}");
    assert!(from_h1.handshake_age_secs.is_some());
    assert!(status.namespaces[0].arp_replies > 0);
    let text = net
        .bed
        .ns(
            &net.hosts[1].ns,
            BIN,
            &["status", "-c", &net.agents[1].config.display().to_string()],
        )
        .expect("status text");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(&format!("member {}", vip(1))), "{text}");
}

#[test]
fn restart_restores_connectivity_and_exit_is_clean() {
    let mut net = mesh("rst", 3);
    net.ping_mesh();
    let ns = net.hosts[1].ns.clone();

    let code = net
        .bed
        .signal(net.agents[1].pid, libc::SIGTERM)
        .expect("stop");
    assert_eq!(code, Some(0), "SIGTERM is a clean exit");
    let link = net
        .bed
        .ns_output(&ns, "ip", &["link", "show", "hyphae0"])
        .expect("ip");
    assert!(
        !link.status.success(),
        "the TAP device must be gone after exit"
    );
    assert!(
        !net.hosts[1].dir.join("hyphae.sock").exists(),
        "the control socket must be removed"
    );
    assert!(!net.ping_ok(0, vip(2), 2), "host 2 is down");

    let cfg = std::fs::read_to_string(&net.agents[1].config).expect("config");
    let host = net.hosts[1].clone();
    net.agents[1] = net.bed.start_agent(&host, &cfg).expect("restart");
    for from in [0, 2] {
        net.bed
            .wait_for_ping(&net.hosts[from], vip(2), Duration::from_secs(20))
            .expect("reachable again");
    }
    net.bed
        .wait_for_ping(&net.hosts[1], vip(1), Duration::from_secs(20))
        .expect("and it reaches others");

    // SIGINT is a clean exit too.
    let code = net
        .bed
        .signal(net.agents[0].pid, libc::SIGINT)
        .expect("stop");
    assert_eq!(code, Some(0));
}

#[test]
fn hostile_hosts_are_dropped_and_counted() {
    let mut net = mesh("bad", 3);
    net.ping_mesh();

    // A fourth host with the wrong secret reaches no one.
    let wrong = write_secret(
        net.bed.dir(),
        "wrong.secret",
        "this is not the lab secret\n",
    );
    let d = net.bed.add_host("h4", underlay(4)).expect("host");
    let cfg = agent_config(
        &d,
        "lab",
        &wrong,
        SUBNET,
        vip(4),
        &[underlay(1), underlay(2), underlay(3)],
    );
    let d_agent = net.bed.start_agent(&d, &cfg).expect("agent");
    std::thread::sleep(Duration::from_secs(2));
    for to in [vip(1), vip(2), vip(3)] {
        let out = net
            .bed
            .ns_output(&d.ns, "ping", &["-c", "2", "-W", "1", &to.to_string()])
            .expect("ping");
        assert!(!out.status.success(), "wrong-secret host reached {to}");
    }
    for i in 0..3 {
        let s = net.status(i);
        assert!(
            s.drops["unknown_namespace"] > 0,
            "host {} did not count the stranger's datagrams: {:?}",
            i + 1,
            s.drops
        );
        assert_eq!(s.namespaces[0].peers.len(), 2, "the stranger got a tunnel");
    }
    let ds = net.bed.status(&d, &d_agent).expect("status");
    assert!(ds.namespaces[0].peers.is_empty());

    // A member that sends from an address it does not own is dropped at the receiver.
    let h3 = net.hosts[2].ns.clone();
    net.bed
        .ns(
            &h3,
            "ip",
            &["addr", "add", "10.201.0.99/32", "dev", "hyphae0"],
        )
        .expect("add address");
    let out = net
        .bed
        .ns_output(
            &h3,
            "ping",
            &[
                "-c",
                "3",
                "-W",
                "1",
                "-I",
                "10.201.0.99",
                &vip(2).to_string(),
            ],
        )
        .expect("ping");
    assert!(!out.status.success(), "spoofed ping got a reply");
    let s2 = net.status(1);
    let from_h3 = peer_for(&s2, vip(3));
    assert!(
        from_h3.drops["spoofed_source"] >= 3,
        "receiver did not drop the spoofed packets: {from_h3:#?}"
    );

    // Random and truncated datagrams at an agent's port are counted while pings flow.
    let junk = d.dir.join("junk");
    std::fs::create_dir_all(&junk).expect("junk dir");
    let kinds = [1u8, 2, 3, 4, b'H', b'I', 0, 0xff];
    let near_valid = [31usize, 59, 63, 91, 147, 159, 3];
    let mut x: u64 = 0x9e3779b97f4a7c15;
    let count = 400;
    for i in 0..count {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = if i % 2 == 0 {
            1 + (x % 1400) as usize
        } else {
            near_valid[i % near_valid.len()]
        };
        let mut bytes: Vec<u8> = (0..len)
            .map(|j| (x >> (j % 57)) as u8 ^ (j as u8))
            .collect();
        bytes[0] = kinds[i % kinds.len()];
        std::fs::write(junk.join(format!("{i:04}")), bytes).expect("junk");
    }
    let before = agent_drops(&net.status(1));
    let h1 = net.hosts[0].ns.clone();
    let ping_log = net.bed.dir().join("ping-during-junk.log");
    let pinger = net
        .bed
        .spawn(
            &h1,
            "ping",
            &["-c", "20", "-i", "0.1", &vip(2).to_string()],
            &ping_log,
        )
        .expect("ping");
    net.bed
        .ns(
            &d.ns,
            "bash",
            &[
                "-c",
                &format!(
                    "for f in {}/*; do cat \"$f\" > /dev/udp/{}/7400; done",
                    junk.display(),
                    underlay(2)
                ),
            ],
        )
        .expect("send junk");
    while net.bed.is_running(pinger) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let ping_text = std::fs::read_to_string(&ping_log).expect("ping log");
    let replies = ping_text.matches("bytes from").count();
    assert!(replies >= 15, "traffic stalled under junk: {ping_text}");
    let after = agent_drops(&net.status(1));
    assert!(
        after - before >= count as u64 - 10,
        "only {} of {count} junk datagrams were counted",
        after - before
    );
    assert!(net.ping_ok(0, vip(2), 3), "traffic flows after the junk");
    assert!(net.bed.is_running(net.agents[1].pid), "the agent survived");
}

/// Bad configuration is one clear line on stderr and a non-zero exit.
#[test]
fn bad_config_is_one_clear_line() {
    require_root();
    let dir = std::env::temp_dir().join(format!("hyphae-badcfg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let secret = write_secret(&dir, "ok.secret", "0123456789abcdef0123\n");
    let empty = write_secret(&dir, "empty.secret", "");
    let busy = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let busy_port = busy.local_addr().expect("addr").port();
    // A port whose sockets share it, as another agent's workers do: workers of ours could
    // join them, and must not.
    let shared =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).expect("socket");
    shared.set_reuse_port(true).expect("SO_REUSEPORT");
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().expect("addr");
    shared.bind(&any.into()).expect("bind");
    let shared_port = shared
        .local_addr()
        .expect("addr")
        .as_socket()
        .expect("inet")
        .port();
    let base = |listen: &str, secret: &Path, subnet: &str, address: &str, extra: &str| {
        format!(
            "[agent]\nstate_dir = \"{d}/state\"\ncontrol_socket = \"{d}/ctl.sock\"\nlisten = \"{listen}\"\n\
             [[namespace]]\nname = \"lab\"\nsecret_file = \"{s}\"\nsubnet = \"{subnet}\"\naddress = \"{address}\"\n\
             device = \"hybad0\"\n{extra}",
            d = dir.display(),
            s = secret.display()
        )
    };
    let missing = dir.join("missing.secret");
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "missing secret",
            base("127.0.0.1:0", &missing, SUBNET, "10.201.0.11", ""),
            "cannot read secret_file",
        ),
        (
            "empty secret",
            base("127.0.0.1:0", &empty, SUBNET, "10.201.0.11", ""),
            "is empty",
        ),
        (
            "bad CIDR",
            base("127.0.0.1:0", &secret, "10.201.0.0/40", "10.201.0.11", ""),
            "not an IPv4 CIDR",
        ),
        (
            "outside subnet",
            base("127.0.0.1:0", &secret, SUBNET, "10.9.9.9", ""),
            "outside the subnet",
        ),
        (
            "unknown key",
            base(
                "127.0.0.1:0",
                &secret,
                SUBNET,
                "10.201.0.11",
                "colour = \"blue\"\n",
            ),
            "unknown field `colour`",
        ),
        (
            "port in use",
            base(
                &format!("127.0.0.1:{busy_port}"),
                &secret,
                SUBNET,
                "10.201.0.11",
                "",
            ),
            "already in use",
        ),
        (
            "port shared by another agent's workers",
            base(
                &format!("127.0.0.1:{shared_port}"),
                &secret,
                SUBNET,
                "10.201.0.11",
                "",
            )
            .replacen("[agent]\n", "[agent]\nworkers = 2\n", 1),
            "already in use",
        ),
    ];
    for (what, config, expected) in &cases {
        let path = dir.join("c.toml");
        std::fs::write(&path, config).expect("config");
        // Bounded: an agent that starts when it should not would otherwise run on.
        let out = std::process::Command::new("timeout")
            .args(["20", BIN, "up", "-c", &path.display().to_string()])
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: hyphae up succeeded");
        assert_ne!(
            out.status.code(),
            Some(124),
            "{what}: hyphae up started and ran"
        );
        assert!(stderr.contains(expected), "{what}: stderr was {stderr:?}");
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{what}: not one line: {stderr:?}"
        );
    }

    // Not root: the same good config, run as nobody with no capabilities (the secret is
    // nobody's, as it would be the agent user's).
    std::os::unix::fs::chown(&secret, Some(65534), Some(65534)).expect("chown");
    let path = dir.join("c.toml");
    std::fs::write(
        &path,
        base("127.0.0.1:0", &secret, SUBNET, "10.201.0.11", ""),
    )
    .expect("config");
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            BIN,
        ])
        .args(["up", "-c", &path.display().to_string()])
        .output()
        .expect("setpriv");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("needs root (CAP_NET_ADMIN)"), "{stderr:?}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
    drop(busy);
    let _ = std::fs::remove_dir_all(&dir);
}
