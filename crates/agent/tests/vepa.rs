#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! VEPA ports end to end: plain LAN hosts on a router's own bridge, whose ports the agent
//! isolates (`lan_ports = "vepa"`), so they reach each other only through it. The hosts'
//! own tools (ping, tcpdump, bash's /dev/tcp) show it: the router MAC answers ARP for a
//! LAN neighbour, every frame between two LAN hosts is counted as hairpinned, a host
//! sending from another's address is dropped (and counted on its port), a port plugged in
//! later is isolated too, a broadcast reaches the other LAN hosts and a member but never
//! comes back to its sender, and the namespace policy applies between two LAN hosts (to
//! a TCP connection and to a broadcast's copies).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::{Duration, Instant};

use hyphae_agent::control::NamespaceStatus;
use hyphae_testbed::{agent_section, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.63.0.0/24";
const MTU: u16 = hyphae_agent::config::DEFAULT_MTU;

fn lan(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 63, 0, i)
}

fn ns_status(bed: &Testbed, host: &Host, agent: &AgentHandle) -> NamespaceStatus {
    bed.status(host, agent)
        .expect("status")
        .namespaces
        .remove(0)
}

fn wait_until(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn text(bed: &Testbed, ns: &str, program: &str, args: &[&str]) -> String {
    let out = bed.ns_output(ns, program, args).expect(program);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn pings(bed: &Testbed, from: &Host, to: Ipv4Addr, count: u32) -> bool {
    let out = bed.ping(from, to, count).expect("ping");
    String::from_utf8_lossy(&out.stdout).contains(&format!("{count} received"))
}

fn spoofed(s: &NamespaceStatus) -> u64 {
    s.drops.get("spoofed").copied().unwrap_or(0)
}

/// Starts tcpdump on `device` of `host`, capturing what arrives of `filter` (one word);
/// returns its log.
fn capture(bed: &mut Testbed, host: &Host, device: &str, filter: &str) -> std::path::PathBuf {
    let log = host.dir.join(format!("tcpdump-{device}-{filter}.log"));
    bed.spawn(
        &host.ns,
        "tcpdump",
        &["-i", device, "-n", "-l", "-Q", "in", filter],
        &log,
    )
    .unwrap();
    wait_until("tcpdump listening", Duration::from_secs(10), || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("listening on")
    });
    log
}

/// A namespace whose policy lets everyone ping and allows nothing else (between LAN hosts
/// as anywhere): interface member `i` (10.63.0.31), and router `r` whose own bridge
/// `brlan` holds LAN hosts l1..l3 (10.63.0.11-13) on VEPA ports; `agent_lines` go into the
/// router's `[agent]` section.
fn vepa_site(
    bed: &mut Testbed,
    agent_lines: &str,
) -> (Host, AgentHandle, Host, AgentHandle, Vec<Host>) {
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").unwrap();
    let policy = bed.dir().join("lab.policy.toml");
    std::fs::write(
        &policy,
        "version = 1\ndefault = \"deny\"\n[[rule]]\nfrom = [\"any\"]\nto = [\"any\"]\nproto = \"icmp\"\n",
    )
    .unwrap();
    let namespace = |lines: &str| {
        format!(
            "\n[[namespace]]\nname = \"lab\"\nsecret_file = \"{}\"\nsubnet = \"{SUBNET}\"\npolicy = \"{}\"\n{lines}",
            secret.display(),
            policy.display()
        )
    };
    let i = bed.add_host("i", Ipv4Addr::new(10, 200, 0, 1)).unwrap();
    let lines = format!("device = \"hyphae0\"\naddress = \"{}\"\n", lan(31));
    let cfg = format!("{}{}", agent_section(&i), namespace(&lines));
    let ia = bed.start_agent(&i, &cfg).unwrap();
    let r = bed.add_host("r", Ipv4Addr::new(10, 200, 0, 2)).unwrap();
    bed.ns(&r.ns, "ip", &["link", "add", "brlan", "type", "bridge"])
        .unwrap();
    bed.ns(&r.ns, "ip", &["link", "set", "brlan", "up"])
        .unwrap();
    let hosts = (1..=3u8)
        .map(|n| {
            let address = format!("{}/24", lan(10 + n));
            bed.add_lan_host_on(&r.ns, "brlan", &format!("l{n}"), &address, MTU)
                .unwrap()
        })
        .collect();
    let cfg = format!(
        "{}{}",
        agent_section(&r).replacen("[agent]\n", &format!("[agent]\n{agent_lines}"), 1),
        namespace(&format!(
            "mode = \"router\"\ndevice = \"hyr0\"\nbridge = \"brlan\"\nlan_ports = \"vepa\"\nbootstrap = [\"{}:7400\"]\n",
            i.underlay
        ))
    );
    let ra = bed.start_agent(&r, &cfg).unwrap();
    (i, ia, r, ra, hosts)
}

/// A TCP connection from `from` to a listener on `to` (at `address`) is refused, and the
/// router counts the policy's denial.
fn tcp_denied(
    bed: &mut Testbed,
    (r, ra): (&Host, &AgentHandle),
    (from, to): (&Host, &Host),
    address: &str,
) {
    bed.spawn(
        &to.ns,
        "iperf3",
        &["-s", "-p", "5201"],
        &to.dir.join("iperf3.log"),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let denied = ns_status(bed, r, ra).policy.denied_out;
    let connect = bed
        .ns_output(
            &from.ns,
            "timeout",
            &[
                "3",
                "bash",
                "-c",
                &format!("exec 3<>/dev/tcp/{address}/5201"),
            ],
        )
        .unwrap();
    assert!(
        !connect.status.success(),
        "{} opened TCP to {} against the policy",
        from.name,
        to.name
    );
    assert!(ns_status(bed, r, ra).policy.denied_out > denied);
}

#[test]
fn lan_hosts_on_vepa_ports_reach_each_other_only_through_the_agent() {
    require_root();
    let mut bed = Testbed::new("vepa", Path::new(BIN)).expect("testbed");
    let (i, ia, r, ra, hosts) = vepa_site(&mut bed, "metrics = \"127.0.0.1:9464\"\n");
    let (l1, l2, l3) = (&hosts[0], &hosts[1], &hosts[2]);

    // Every LAN port is isolated; the TAP's is not.
    let isolated = |port: &str| {
        text(
            &bed,
            &r.ns,
            "cat",
            &[&format!("/sys/class/net/brlan/brif/{port}/isolated")],
        )
    };
    let ports: Vec<String> = text(&bed, &r.ns, "ls", &["/sys/class/net/brlan/brif"])
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(ports.len(), 4, "{ports:?}");
    for port in &ports {
        let want = if port == "hyr0" { "0" } else { "1" };
        assert_eq!(isolated(port), want, "port {port}");
    }
    let s = ns_status(&bed, &r, &ra);
    assert_eq!(s.lan_port_mode, "vepa");

    bed.wait_for_ping(l1, lan(31), Duration::from_secs(30))
        .expect("a LAN host reaches the member");
    // Between two LAN hosts: through the agent, both ways, every frame.
    bed.wait_for_ping(l1, lan(12), Duration::from_secs(20))
        .expect("l1 reaches l2");
    let before = ns_status(&bed, &r, &ra).hairpinned;
    assert!(pings(&bed, l2, lan(11), 5));
    let after = ns_status(&bed, &r, &ra);
    assert!(
        after.hairpinned >= before + 10,
        "{} -> {}",
        before,
        after.hairpinned
    );
    // l2 knows l1 by the router MAC, not by l1's own.
    let l1_mac = text(&bed, &l1.ns, "cat", &["/sys/class/net/eth0/address"]);
    let neighbour = text(&bed, &l2.ns, "ip", &["neigh", "show", &lan(11).to_string()]);
    assert!(
        neighbour.contains("lladdr fe:fd:") && !neighbour.contains(&l1_mac),
        "{neighbour} (l1 is {l1_mac})"
    );
    let l2_mac = text(&bed, &l2.ns, "cat", &["/sys/class/net/eth0/address"]);
    let row = after
        .lan_ports
        .iter()
        .find(|p| p.macs.contains(&l2_mac))
        .unwrap_or_else(|| panic!("no port lists l2's MAC: {:?}", after.lan_ports));
    assert!(row.hairpinned >= 5 && ports.contains(&row.port), "{row:?}");

    // A port plugged in after start is isolated too, and its host reaches the others.
    let l4 = bed
        .add_lan_host_on(&r.ns, "brlan", "l4", &format!("{}/24", lan(14)), MTU)
        .unwrap();
    wait_until("the new port isolated", Duration::from_secs(10), || {
        ns_status(&bed, &r, &ra).ports_isolated_late >= 1
    });
    bed.wait_for_ping(&l4, lan(11), Duration::from_secs(20))
        .expect("l4 reaches l1");

    // l3 takes l1's address: dropped at the agent, counted on l3's port, and l1 keeps it.
    let spoofed_before = spoofed(&ns_status(&bed, &r, &ra));
    bed.ns(
        &l3.ns,
        "ip",
        &["addr", "add", &format!("{}/24", lan(11)), "dev", "eth0"],
    )
    .unwrap();
    let out = bed
        .ns_output(
            &l3.ns,
            "ping",
            &[
                "-c",
                "3",
                "-i",
                "0.3",
                "-W",
                "1",
                "-I",
                &lan(11).to_string(),
                &lan(12).to_string(),
            ],
        )
        .unwrap();
    let out = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.contains(" 0 received"), "{out}");
    let s = ns_status(&bed, &r, &ra);
    assert!(spoofed(&s) > spoofed_before, "{:?}", s.drops);
    let l3_mac = text(&bed, &l3.ns, "cat", &["/sys/class/net/eth0/address"]);
    let row = s.lan_ports.iter().find(|p| p.macs.contains(&l3_mac));
    assert!(row.is_some_and(|r| r.spoofed > 0), "{:?}", s.lan_ports);
    bed.ns(
        &l3.ns,
        "ip",
        &["addr", "del", &format!("{}/24", lan(11)), "dev", "eth0"],
    )
    .unwrap();
    assert!(pings(&bed, l2, lan(11), 2), "l1's address stayed l1's");

    // A broadcast from l1 reaches the other LAN hosts and the member, never l1 again.
    let logs: Vec<_> = [(l1, "eth0"), (l2, "eth0"), (l3, "eth0"), (&i, "hyphae0")]
        .into_iter()
        .map(|(h, d)| capture(&mut bed, h, d, "icmp"))
        .collect();
    let seen = |log: &Path| {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .matches(&format!("{} > 10.63.0.255: ICMP echo request", lan(11)))
            .count()
    };
    let copies_before = ns_status(&bed, &r, &ra).lan_copies;
    wait_until(
        "l1's broadcast heard by l2, l3 and the member",
        Duration::from_secs(20),
        || {
            let _ = bed.ns_output(&l1.ns, "ping", &["-b", "-c", "1", "-W", "1", "10.63.0.255"]);
            logs[1..].iter().all(|l| seen(l) > 0)
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(seen(&logs[0]), 0, "the broadcast came back to its sender");
    assert!(ns_status(&bed, &r, &ra).lan_copies > copies_before);

    // The policy applies between LAN hosts: TCP is no rule's, so l1 cannot reach l2's
    // listener, and the router counts the denial.
    tcp_denied(&mut bed, (&r, &ra), (l1, l2), "10.63.0.12");
    // A UDP broadcast is no rule's either: it is not copied to the other LAN hosts.
    let udp_log = capture(&mut bed, l2, "eth0", "udp");
    let denied = ns_status(&bed, &r, &ra).policy.denied_out;
    let send = "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
                s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)\n\
                for _ in range(3): s.sendto(b'hello', ('10.63.0.255', 9999))\n";
    let out = bed.ns_output(&l1.ns, "python3", &["-c", send]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(
        "the router denies the broadcast",
        Duration::from_secs(5),
        || ns_status(&bed, &r, &ra).policy.denied_out >= denied + 3,
    );
    std::thread::sleep(Duration::from_millis(500));
    let heard = std::fs::read_to_string(&udp_log).unwrap_or_default();
    assert!(
        !heard.contains("> 10.63.0.255.9999"),
        "l2 heard a broadcast the policy denies:\n{heard}"
    );
    // From l2 itself the listener is there (the denial was the policy's, not a closed port).
    let local = bed
        .ns_output(
            &l2.ns,
            "timeout",
            &["3", "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/5201"],
        )
        .unwrap();
    assert!(local.status.success());
    let s = ns_status(&bed, &r, &ra);
    eprintln!(
        "router: {} hairpinned, {} broadcast copies, {} spoofed, {} denied by the policy; ports {:?}",
        s.hairpinned,
        s.lan_copies,
        spoofed(&s),
        s.policy.denied_out,
        s.lan_ports
    );
    // /metrics labels the counters by port, and the topology page has them.
    let get = |path: &str| {
        let url = format!("http://127.0.0.1:9464/{path}");
        text(&bed, &r.ns, "curl", &["-s", "--max-time", "10", &url])
    };
    let metrics = get("metrics");
    let hairpin_port = format!(
        "hyphae_namespace_lan_ports_hairpinned_total{{namespace=\"lab\",port=\"{}\"}}",
        s.lan_ports
            .iter()
            .find(|p| p.macs.contains(&l2_mac))
            .map(|p| p.port.clone())
            .unwrap_or_default()
    );
    assert!(
        metrics.contains(&hairpin_port),
        "no {hairpin_port} in\n{metrics}"
    );
    let topology: serde_json::Value = serde_json::from_str(&get("topology.json")).unwrap();
    let ns = &topology["namespaces"][0];
    assert_eq!(ns["lan_port_mode"], "vepa");
    assert!(ns["hairpinned"].as_u64().unwrap_or(0) >= 10, "{ns}");
    let _ = ia;
}

/// `ping -6` from `from` to `to`: whether all `count` answered.
fn pings6(bed: &Testbed, from: &Host, to: Ipv6Addr, count: u32) -> bool {
    let out = bed
        .ns_output(
            &from.ns,
            "ping",
            &[
                "-6",
                "-c",
                &count.to_string(),
                "-i",
                "0.3",
                "-W",
                "1",
                &to.to_string(),
            ],
        )
        .expect("ping");
    String::from_utf8_lossy(&out.stdout).contains(&format!("{count} received"))
}

/// IPv6 on VEPA ports: the LAN hosts configure themselves from the router's advertisement
/// (the kernel's SLAAC), reach each other only through the agent (the router MAC is their
/// neighbour, every echo counted as hairpinned), reach a member; a host that configures
/// another's address has its duplicate address probe refused by the agent (the other host
/// never hears it), one that sends from it anyway is dropped and counted on its port; TCP
/// over IPv6 between two LAN hosts is refused by the policy as over IPv4.
#[test]
fn ipv6_lan_hosts_on_vepa_ports_reach_each_other_only_through_the_agent() {
    require_root();
    let mut bed = Testbed::new("vepa6", Path::new(BIN)).expect("testbed");
    let (i, ia, r, ra, hosts) = vepa_site(&mut bed, "");
    let (l1, l2, l3) = (&hosts[0], &hosts[1], &hosts[2]);

    let member = ns_status(&bed, &i, &ia);
    let prefix: ipnet::Ipv6Net = member.subnet6.parse().expect("a dual-stack namespace");
    let mut formed = Vec::new();
    for l in &hosts {
        let a = bed
            .slaac_address(l, Duration::from_secs(30))
            .expect("SLAAC");
        assert!(prefix.contains(&a), "{a} is not in {prefix}");
        formed.push(a);
    }
    let (a1, a2) = (formed[0], formed[1]);
    let mut member6 = String::new();
    wait_until(
        "the member holds an IPv6 address",
        Duration::from_secs(20),
        || {
            member6 = ns_status(&bed, &i, &ia).address6;
            !member6.is_empty()
        },
    );
    let member6: Ipv6Addr = member6.parse().unwrap();

    // Between two LAN hosts: through the agent, both ways, every echo.
    wait_until("l1 reaches l2 over IPv6", Duration::from_secs(20), || {
        pings6(&bed, l1, a2, 1)
    });
    let before = ns_status(&bed, &r, &ra).hairpinned;
    assert!(pings6(&bed, l2, a1, 5));
    let after = ns_status(&bed, &r, &ra).hairpinned;
    assert!(after >= before + 10, "{before} -> {after}");
    let l1_mac = text(&bed, &l1.ns, "cat", &["/sys/class/net/eth0/address"]);
    let neighbour = text(
        &bed,
        &l2.ns,
        "ip",
        &["-6", "neigh", "show", &a1.to_string()],
    );
    assert!(
        neighbour.contains("lladdr fe:fd:") && !neighbour.contains(&l1_mac),
        "{neighbour} (l1 is {l1_mac})"
    );
    // A LAN host and the member, both ways.
    wait_until(
        "l1 reaches the member over IPv6",
        Duration::from_secs(20),
        || pings6(&bed, l1, member6, 1),
    );
    assert!(pings6(&bed, &i, a1, 3));

    // l3 configures l1's address: its duplicate address probe reaches only the agent,
    // which refuses it for l1; l3's kernel never uses it.
    let defended = ns_status(&bed, &r, &ra).dad_defended;
    let a1_cidr = format!("{a1}/64");
    bed.ns(
        &l3.ns,
        "ip",
        &["-6", "addr", "add", &a1_cidr, "dev", "eth0"],
    )
    .unwrap();
    wait_until(
        "l3's copy of l1's address failed",
        Duration::from_secs(10),
        || text(&bed, &l3.ns, "ip", &["-6", "addr", "show", "dev", "eth0"]).contains("dadfailed"),
    );
    assert!(ns_status(&bed, &r, &ra).dad_defended > defended);
    bed.ns(
        &l3.ns,
        "ip",
        &["-6", "addr", "del", &a1_cidr, "dev", "eth0"],
    )
    .unwrap();
    // Sent from anyway (no probe): dropped at the agent, counted on l3's port.
    let spoofed_before = spoofed(&ns_status(&bed, &r, &ra));
    bed.ns(
        &l3.ns,
        "ip",
        &["-6", "addr", "add", &a1_cidr, "dev", "eth0", "nodad"],
    )
    .unwrap();
    let out = bed
        .ns_output(
            &l3.ns,
            "ping",
            &[
                "-6",
                "-c",
                "3",
                "-i",
                "0.3",
                "-W",
                "1",
                "-I",
                &a1.to_string(),
                &a2.to_string(),
            ],
        )
        .unwrap();
    let out = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.contains(" 0 received"), "{out}");
    let s = ns_status(&bed, &r, &ra);
    assert!(spoofed(&s) > spoofed_before, "{:?}", s.drops);
    let l3_mac = text(&bed, &l3.ns, "cat", &["/sys/class/net/eth0/address"]);
    let row = s.lan_ports.iter().find(|p| p.macs.contains(&l3_mac));
    assert!(row.is_some_and(|r| r.spoofed > 0), "{:?}", s.lan_ports);
    bed.ns(
        &l3.ns,
        "ip",
        &["-6", "addr", "del", &a1_cidr, "dev", "eth0"],
    )
    .unwrap();
    assert!(pings6(&bed, l2, a1, 2), "l1's address stayed l1's");

    // TCP is no rule's: l1 cannot reach l2's listener over IPv6 either.
    tcp_denied(&mut bed, (&r, &ra), (l1, l2), &a2.to_string());
    let s = ns_status(&bed, &r, &ra);
    eprintln!(
        "router: {} hairpinned, {} spoofed, {} probes defended, {} denied by the policy",
        s.hairpinned,
        spoofed(&s),
        s.dad_defended,
        s.policy.denied_out
    );
}
