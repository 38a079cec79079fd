#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The AF_XDP underlay end to end: real agents in network namespaces whose `eth0` is a
//! veth on the testbed's bridge, the project's XDP program attached to it, and clients
//! no one here wrote (ping, socat, sha256sum).
//!
//! They need root, iproute2, ping, socat and setpriv (util-linux). They never skip.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyphae_agent::control::Status;
use hyphae_testbed::{agent_config, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.201.0.0/16";

fn underlay(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, 0, i)
}

fn vip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 201, 0, 10 + i)
}

/// Host `i`'s config: interface mode, static address, the other host as a peer, and
/// `[agent] underlay = "<underlay>"`.
fn config(host: &Host, secret: &Path, i: u8, underlay_mode: &str) -> String {
    let other = if i == 1 { 2 } else { 1 };
    agent_config(host, "lab", secret, SUBNET, vip(i), &[underlay(other)]).replacen(
        "[agent]\n",
        &format!("[agent]\nunderlay = \"{underlay_mode}\"\n"),
        1,
    )
}

fn two_hosts(label: &str) -> (Testbed, Vec<Host>, PathBuf) {
    require_root();
    let mut bed = Testbed::new(label, Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").expect("secret");
    let hosts = (1..=2)
        .map(|i| bed.add_host(&format!("h{i}"), underlay(i)).expect("host"))
        .collect();
    (bed, hosts, secret)
}

/// Waits (up to 10 s) for a status whose underlay is settled and returns it.
fn status(bed: &Testbed, host: &Host, agent: &AgentHandle) -> Status {
    bed.status(host, agent).expect("status")
}

#[test]
fn af_xdp_on_both_ends_carries_ping_and_100_mb_and_leaves_the_rest_to_the_kernel() {
    let (mut bed, hosts, secret) = two_hosts("xdp");
    let agents: Vec<AgentHandle> = (1..=2u8)
        .map(|i| {
            let host = &hosts[usize::from(i) - 1];
            bed.start_agent(host, &config(host, &secret, i, "af_xdp"))
                .expect("agent")
        })
        .collect();
    for (host, agent) in hosts.iter().zip(&agents) {
        let s = status(&bed, host, agent);
        assert_eq!(
            s.underlay.path,
            "af_xdp",
            "{}: {:?}\n{}",
            host.name,
            s.underlay,
            std::fs::read_to_string(&agent.log).unwrap_or_default()
        );
        assert_eq!(s.underlay.interface.as_deref(), Some("eth0"));
        assert!(s.underlay.queues >= 1);
    }

    // Ping through the tunnel, both ways.
    bed.wait_for_ping(&hosts[0], vip(2), Duration::from_secs(20))
        .expect("first contact");
    for (from, to) in [(0, vip(2)), (1, vip(1))] {
        let out = bed
            .ns(
                &hosts[from].ns,
                "ping",
                &["-c", "5", "-i", "0.2", &to.to_string()],
            )
            .expect("ping");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("5 received"), "{text}");
    }

    // A TCP service on the underlay address (not the tunnel port) is still the kernel's:
    // the XDP program passes everything but UDP to port 7400.
    let log = bed.dir().join("socat-underlay.log");
    bed.spawn(
        &hosts[1].ns,
        "socat",
        &[
            &format!("TCP-LISTEN:2222,bind={},reuseaddr", underlay(2)),
            "SYSTEM:echo kernel-answered",
        ],
        &log,
    )
    .expect("underlay listener");
    let answer = bed
        .ns(
            &hosts[0].ns,
            "socat",
            &[
                "-T",
                "5",
                "-",
                &format!("TCP:{}:2222,retry=20,interval=0.1", underlay(2)),
            ],
        )
        .expect("underlay TCP");
    assert_eq!(
        String::from_utf8_lossy(&answer.stdout).trim(),
        "kernel-answered"
    );

    // So is other UDP on the underlay address (a port beside the tunnel's).
    let log = bed.dir().join("socat-udp.log");
    bed.spawn(
        &hosts[1].ns,
        "socat",
        &[
            &format!("UDP-LISTEN:7401,bind={},fork", underlay(2)),
            "SYSTEM:echo udp-kernel-answered",
        ],
        &log,
    )
    .expect("underlay UDP listener");
    // Retried: the listener may not be up yet; each try is a new source port (a new
    // child of the forking listener).
    let mut answer = String::new();
    for _ in 0..20 {
        let out = bed
            .ns_output(
                &hosts[0].ns,
                "sh",
                &[
                    "-c",
                    &format!("echo hi | socat -t 3 -T 3 - UDP:{}:7401", underlay(2)),
                ],
            )
            .expect("underlay UDP");
        answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if answer == "udp-kernel-answered" {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(answer, "udp-kernel-answered");

    // 100 MB through the tunnel arrive intact.
    bed.tcp_transfer(
        &hosts[0],
        (&hosts[1], vip(2)),
        5001,
        100 * 1000 * 1000,
        Duration::from_secs(300),
    )
    .expect("100 MB over TCP");

    // The datagrams took the AF_XDP path: 100 MB is over 70,000 tunnel datagrams, in
    // frames the sender built and the receiver's XDP program redirected.
    let tx = status(&bed, &hosts[0], &agents[0]);
    let rx = status(&bed, &hosts[1], &agents[1]);
    eprintln!("sender {:?}\nreceiver {:?}", tx.underlay, rx.underlay);
    assert!(tx.underlay.tx_frames > 70_000, "{:?}", tx.underlay);
    assert!(rx.underlay.rx_frames > 70_000, "{:?}", rx.underlay);
    assert_eq!(rx.underlay.malformed, 0, "{:?}", rx.underlay);
    // The libp2p TCP connection on the tunnel port's number is the kernel's too.
    assert!(tx.overlay.connected > 0, "{:?}", tx.overlay);
    let text = bed
        .ns(
            &hosts[0].ns,
            BIN,
            &["status", "-c", &agents[0].config.display().to_string()],
        )
        .expect("status text");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("underlay af_xdp on eth0"), "{text}");
}

#[test]
fn af_xdp_without_the_privilege_falls_back_to_the_socket_and_says_so() {
    let (mut bed, hosts, secret) = two_hosts("xdpfb");
    let good = bed
        .start_agent(&hosts[0], &config(&hosts[0], &secret, 1, "af_xdp"))
        .expect("agent");
    // Host 2's agent runs without CAP_BPF and CAP_SYS_ADMIN: bpf(2) is refused.
    let path = hosts[1].dir.join("hyphae.toml");
    std::fs::write(&path, config(&hosts[1], &secret, 2, "af_xdp")).expect("config");
    let log = hosts[1].dir.join("agent-nobpf.log");
    let pid = bed
        .spawn(
            &hosts[1].ns,
            "setpriv",
            &[
                "--bounding-set",
                "-bpf,-sys_admin",
                BIN,
                "up",
                "-c",
                &path.display().to_string(),
            ],
            &log,
        )
        .expect("agent without CAP_BPF");
    let weak = AgentHandle {
        pid,
        config: path,
        log: log.clone(),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let s = loop {
        if let Ok(s) = bed.status(&hosts[1], &weak) {
            break s;
        }
        assert!(
            Instant::now() < deadline && bed.is_running(pid),
            "agent did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(s.underlay.path, "socket", "{:?}", s.underlay);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("AF_XDP unavailable"))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
    assert!(lines[0].contains("CAP_BPF"), "{}", lines[0]);
    assert_eq!(status(&bed, &hosts[0], &good).underlay.path, "af_xdp");

    // A socket agent and an AF_XDP agent talk to each other.
    bed.wait_for_ping(&hosts[1], vip(1), Duration::from_secs(20))
        .expect("first contact");
    let out = bed
        .ns(
            &hosts[0].ns,
            "ping",
            &["-c", "3", "-i", "0.2", &vip(2).to_string()],
        )
        .expect("ping");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("3 received"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let text = bed
        .ns(
            &hosts[1].ns,
            BIN,
            &["status", "-c", &weak.config.display().to_string()],
        )
        .expect("status text");
    assert!(String::from_utf8_lossy(&text.stdout).contains("underlay socket"));
}

#[test]
fn a_jumbo_underlay_gets_generic_xdp_and_large_datagrams_go_through_the_kernel() {
    let (mut bed, hosts, secret) = two_hosts("xdpj");
    // A 9000-byte underlay: veth refuses native XDP above about a page, so the program
    // attaches in generic mode; datagrams over a socket's frame pass to the kernel.
    // Twice: the bridge takes 9000 only once its ports have it.
    let all_links = "for pass in 1 2; do for l in $(ls /sys/class/net); do \
                     ip link set \"$l\" mtu 9000 2>/dev/null || true; done; done";
    bed.ns(bed.switch_ns(), "sh", &["-c", all_links])
        .expect("switch mtu");
    for host in &hosts {
        bed.ns(&host.ns, "ip", &["link", "set", "eth0", "mtu", "9000"])
            .expect("host mtu");
    }
    let agents: Vec<AgentHandle> = (1..=2u8)
        .map(|i| {
            let host = &hosts[usize::from(i) - 1];
            let cfg = config(host, &secret, i, "af_xdp").replacen(
                "\n[[namespace.peer]]",
                "mtu = 4000\n\n[[namespace.peer]]",
                1,
            );
            bed.start_agent(host, &cfg).expect("agent")
        })
        .collect();
    for (host, agent) in hosts.iter().zip(&agents) {
        let s = status(&bed, host, agent);
        assert_eq!(s.underlay.path, "af_xdp", "{:?}", s.underlay);
        assert_eq!(
            s.underlay.xdp_mode.as_deref(),
            Some("generic"),
            "{:?}",
            s.underlay
        );
    }
    bed.wait_for_ping(&hosts[0], vip(2), Duration::from_secs(20))
        .expect("first contact");
    let before = status(&bed, &hosts[1], &agents[1]).underlay.rx_frames;
    // 3500-byte pings, not fragmented: one tunnel datagram each way, over a frame.
    let out = bed
        .ns(
            &hosts[0].ns,
            "ping",
            &[
                "-c",
                "5",
                "-i",
                "0.2",
                "-s",
                "3500",
                "-M",
                "do",
                &vip(2).to_string(),
            ],
        )
        .expect("ping");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("5 received"), "{text}");
    // Small ones still take the AF_XDP path.
    let out = bed
        .ns(
            &hosts[0].ns,
            "ping",
            &["-c", "5", "-i", "0.2", &vip(2).to_string()],
        )
        .expect("ping");
    assert!(String::from_utf8_lossy(&out.stdout).contains("5 received"));
    let after = status(&bed, &hosts[1], &agents[1]).underlay;
    assert!(after.rx_frames >= before + 5, "{before} -> {after:?}");
    assert_eq!(after.malformed, 0, "{after:?}");
}
