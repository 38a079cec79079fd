#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! IPOP's three deployment modes in one namespace (Sec. 3-4, Fig. 3-5), end to end: real
//! agents, real Linux LAN hosts with no hyphae software, real bridges, ping and socat.
//!
//! Site 1 is a LAN with a router-mode agent (uplink `eth1`) and two plain hosts; site 2 is
//! a LAN with two hybrid-mode hosts (each its own bridge, uplink and veth device); one more
//! host runs interface mode. All agents meet on the underlay through the interface host.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyphae_agent::control::{NamespaceStatus, Status};
use hyphae_testbed::{agent_section, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.201.0.0/16";
/// LAN hosts here use the namespace MTU; hosts that keep 1500 are `tests/mtu.rs`'s.
const MTU: u16 = hyphae_agent::config::DEFAULT_MTU;

fn vip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 201, 0, last)
}

fn namespace(secret: &Path, bootstrap: Option<Ipv4Addr>) -> String {
    let mut c = format!(
        "\n[[namespace]]\nname = \"lab\"\nsecret_file = \"{}\"\nsubnet = \"{SUBNET}\"\nlease_secs = 30\n",
        secret.display()
    );
    if let Some(b) = bootstrap {
        c += &format!("bootstrap = [\"{b}:7400\"]\n");
    }
    c
}

struct Site {
    bed: Testbed,
    /// Interface host, router host, hybrid hosts 1 and 2.
    iface: (Host, AgentHandle),
    router: (Host, AgentHandle),
    hybrids: Vec<(Host, AgentHandle)>,
    /// Site 1's plain LAN hosts.
    lan_hosts: Vec<Host>,
}

impl Site {
    fn status(&self, (host, agent): &(Host, AgentHandle)) -> Status {
        self.bed.status(host, agent).expect("status")
    }

    fn ns_status(&self, member: &(Host, AgentHandle)) -> NamespaceStatus {
        self.status(member).namespaces.remove(0)
    }

    /// Every host with a virtual address, and that address.
    fn endpoints(&self) -> Vec<(Host, Ipv4Addr)> {
        let mut v = vec![(self.iface.0.clone(), vip(31))];
        v.extend(self.lan_hosts.iter().cloned().zip([vip(11), vip(12)]));
        v.extend(
            self.hybrids
                .iter()
                .map(|h| h.0.clone())
                .zip([vip(21), vip(22)]),
        );
        v
    }
}

fn build(label: &str) -> Site {
    require_root();
    let mut bed = Testbed::new(label, Path::new(BIN)).expect("testbed");
    let secret: PathBuf = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").unwrap();

    // The interface host starts the overlay; everyone bootstraps from it.
    let ih = bed.add_host("i", Ipv4Addr::new(10, 200, 0, 1)).unwrap();
    let cfg = format!(
        "{}{}mode = \"interface\"\ndevice = \"hyphae0\"\naddress = \"{}\"\n",
        agent_section(&ih),
        namespace(&secret, None),
        vip(31)
    );
    let ia = bed.start_agent(&ih, &cfg).unwrap();
    let boot = Some(ih.underlay);

    // Site 1: a LAN switch, the router host (uplink eth1) and two plain hosts.
    let lan1 = bed.add_lan("lan1").unwrap();
    let rh = bed.add_host("r", Ipv4Addr::new(10, 200, 0, 2)).unwrap();
    bed.plug(&lan1, &rh.ns, "eth1", 1500).unwrap();
    let l1 = bed
        .add_lan_host(&lan1, "l1", "10.201.0.11/16", MTU)
        .unwrap();
    let l2 = bed
        .add_lan_host(&lan1, "l2", "10.201.0.12/16", MTU)
        .unwrap();
    let cfg = format!(
        "{}{}mode = \"router\"\ndevice = \"hyr0\"\nbridge = \"brlan\"\nuplink = \"eth1\"\nlan_timeout_secs = 3\n",
        agent_section(&rh),
        namespace(&secret, boot),
    );
    let ra = bed.start_agent(&rh, &cfg).unwrap();

    // Site 2: a LAN switch and two hybrid hosts, each with its own bridge and uplink.
    let lan2 = bed.add_lan("lan2").unwrap();
    let mut hybrids = Vec::new();
    for (i, last) in [(3u8, 21u8), (4, 22)] {
        let h = bed
            .add_host(&format!("h{i}"), Ipv4Addr::new(10, 200, 0, i))
            .unwrap();
        bed.plug(&lan2, &h.ns, "eth1", 1500).unwrap();
        let cfg = format!(
            "{}{}mode = \"hybrid\"\ndevice = \"hy0\"\nbridge = \"brlan\"\nuplink = \"eth1\"\naddress = \"{}\"\nprobe_timeout_ms = 400\n",
            agent_section(&h),
            namespace(&secret, boot),
            vip(last)
        );
        let a = bed.start_agent(&h, &cfg).unwrap();
        hybrids.push((h, a));
    }
    Site {
        bed,
        iface: (ih, ia),
        router: (rh, ra),
        hybrids,
        lan_hosts: vec![l1, l2],
    }
}

/// The IPv6 address `member` holds, once it holds one (20 s at most).
fn member6(site: &Site, member: &(Host, AgentHandle)) -> Ipv6Addr {
    let mut held = None;
    wait_until("an IPv6 address is held", Duration::from_secs(20), || {
        held = site.ns_status(member).address6.parse().ok();
        held.is_some()
    });
    held.expect("an IPv6 address")
}

/// `ping -6` from `from` to `to` until one answers (20 s at most), then three that must.
fn ping6(bed: &Testbed, from: &Host, to: Ipv6Addr) -> bool {
    let to = to.to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let out = bed
            .ns_output(&from.ns, "ping", &["-6", "-c", "1", "-W", "1", &to])
            .unwrap();
        if out.status.success() {
            let out = bed
                .ns_output(&from.ns, "ping", &["-6", "-c", "3", "-W", "2", &to])
                .unwrap();
            return out.status.success();
        }
    }
    false
}

fn ping(bed: &Testbed, from: &Host, to: Ipv4Addr, count: u32) -> bool {
    let out = bed.ping(from, to, count).expect("ping");
    String::from_utf8_lossy(&out.stdout).contains(&format!("{count} received"))
}

fn wait_until(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn router_hybrid_and_interface_hosts_share_one_namespace() {
    let mut site = build("md");
    let hosts = site.endpoints();

    // The router claims a LAN host once it has heard it: its ARP for a remote address is
    // the first broadcast it sends (a host that never speaks is never learned).
    for l in &site.lan_hosts {
        site.bed
            .wait_for_ping(l, vip(31), Duration::from_secs(20))
            .expect("a LAN host reaches the interface host");
    }
    wait_until(
        "the router claims both LAN hosts",
        Duration::from_secs(20),
        || {
            let ns = site.ns_status(&site.router);
            ns.addresses.contains(&vip(11).to_string())
                && ns.addresses.contains(&vip(12).to_string())
        },
    );

    // Every host pings every other.
    for (from, _) in &hosts {
        for (to_host, to) in &hosts {
            if from.ns == to_host.ns {
                continue;
            }
            site.bed
                .wait_for_ping(from, *to, Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(ping(&site.bed, from, *to, 3), "{} -> {to}", from.name);
        }
    }

    // LAN traffic at each site bypasses the agents: their counters do not move.
    let carried = |s: &NamespaceStatus| (s.to_peers, s.to_device);
    let before = carried(&site.ns_status(&site.router));
    assert!(ping(&site.bed, &site.lan_hosts[0], vip(12), 10));
    assert_eq!(
        carried(&site.ns_status(&site.router)),
        before,
        "site 1 LAN traffic reached the router agent"
    );
    let before: Vec<_> = site
        .hybrids
        .iter()
        .map(|h| carried(&site.ns_status(h)))
        .collect();
    assert!(ping(&site.bed, &site.hybrids[0].0, vip(22), 10));
    let after: Vec<_> = site
        .hybrids
        .iter()
        .map(|h| carried(&site.ns_status(h)))
        .collect();
    assert_eq!(after, before, "site 2 LAN traffic reached a hybrid agent");
    // Hybrid agents answered no ARP for each other: each probed the LAN and heard it.
    for h in &site.hybrids {
        let ns = site.ns_status(h);
        assert!(
            ns.lan_hosts.contains(&vip(21).to_string())
                || ns.lan_hosts.contains(&vip(22).to_string()),
            "{ns:?}"
        );
    }

    // Every host's own agent (or its LAN's router) answers DNS at the service address:
    // IPOP's automatic names and PTRs of addresses owned anywhere in the namespace.
    for host in site.hybrids.iter().map(|h| &h.0).chain(&site.lan_hosts) {
        let out = site
            .bed
            .ns_output(
                &host.ns,
                "dig",
                &[
                    "@10.201.0.1",
                    "+short",
                    "+time=2",
                    "+tries=3",
                    "c201000031.lab",
                ],
            )
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "10.201.0.31",
            "{}",
            host.name
        );
    }
    let out = site
        .bed
        .ns_output(
            &site.iface.0.ns,
            "dig",
            &[
                "@10.201.0.1",
                "+short",
                "+time=2",
                "+tries=3",
                "-x",
                "10.201.0.21",
            ],
        )
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "c201000021.lab."
    );

    // A UDP broadcast sent at site 1 reaches site 2 and the interface host.
    wait_until(
        "every agent knows the broadcast group",
        Duration::from_secs(40),
        || {
            [
                &site.router,
                &site.iface,
                &site.hybrids[0],
                &site.hybrids[1],
            ]
            .iter()
            .all(|m| site.ns_status(m).group_members >= 3)
        },
    );
    let receivers: Vec<Host> = vec![
        site.hybrids[0].0.clone(),
        site.hybrids[1].0.clone(),
        site.iface.0.clone(),
    ];
    let mut logs = Vec::new();
    for r in &receivers {
        let log = r.dir.join("broadcast.txt");
        site.bed
            .spawn(
                &r.ns,
                "socat",
                &["-u", "UDP-RECV:9999,reuseaddr", "STDOUT"],
                &log,
            )
            .unwrap();
        logs.push(log);
    }
    std::thread::sleep(Duration::from_millis(500));
    let sender = site.lan_hosts[0].clone();
    let heard = |logs: &[PathBuf]| {
        logs.iter().all(|l| {
            std::fs::read_to_string(l)
                .unwrap_or_default()
                .contains("hello from site 1")
        })
    };
    for _ in 0..10 {
        let out = site
            .bed
            .ns_output(
                &sender.ns,
                "sh",
                &["-c", "echo 'hello from site 1' | socat -u STDIN UDP-DATAGRAM:10.201.255.255:9999,broadcast"],
            )
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(300));
        if heard(&logs) {
            break;
        }
    }
    for (r, l) in receivers.iter().zip(&logs) {
        let text = std::fs::read_to_string(l).unwrap_or_default();
        assert!(
            text.contains("hello from site 1"),
            "{} heard nothing: {text:?}",
            r.name
        );
    }
    assert!(site.ns_status(&site.router).broadcasts_out >= 1);
    assert!(site.ns_status(&site.iface).broadcasts_in >= 1);

    // IPv6 with no IPv6 configuration anywhere: the interface and hybrid members hold
    // addresses of the derived prefix, the router's LAN hosts form theirs from its
    // advertisements (and the router claims them); every host reaches every other.
    let prefix: ipnet::Ipv6Net = site
        .ns_status(&site.iface)
        .subnet6
        .parse()
        .expect("a prefix");
    let mut hosts6 = vec![(site.iface.0.clone(), member6(&site, &site.iface))];
    for h in &site.hybrids {
        hosts6.push((h.0.clone(), member6(&site, h)));
    }
    for l in &site.lan_hosts {
        let formed = site.bed.slaac_address(l, Duration::from_secs(20)).unwrap();
        assert!(prefix.contains(&formed), "{formed} is not in {prefix}");
        hosts6.push((l.clone(), formed));
    }
    for (from, _) in &hosts6 {
        for (to_host, to) in &hosts6 {
            if from.ns != to_host.ns {
                assert!(ping6(&site.bed, from, *to), "{} -> {to}", from.name);
            }
        }
    }
    // Hybrid neighbours reach each other over their LAN: neither agent carries it, and
    // neither answered the other's address (each probed the LAN and heard it).
    let before: Vec<_> = site
        .hybrids
        .iter()
        .map(|h| carried(&site.ns_status(h)))
        .collect();
    assert!(ping6(&site.bed, &site.hybrids[0].0, hosts6[2].1));
    let after: Vec<_> = site
        .hybrids
        .iter()
        .map(|h| carried(&site.ns_status(h)))
        .collect();
    assert_eq!(
        after, before,
        "site 2 IPv6 LAN traffic reached a hybrid agent"
    );
    let h3 = site.ns_status(&site.hybrids[0]);
    assert!(h3.lan_hosts.contains(&hosts6[2].1.to_string()), "{h3:?}");
    // h3's kernel holds h4's own MAC for it, not an agent's FE:FD one.
    let neigh = site
        .bed
        .ns_output(
            &site.hybrids[0].0.ns,
            "ip",
            &[
                "-6",
                "neigh",
                "show",
                &hosts6[2].1.to_string(),
                "dev",
                "hy0",
            ],
        )
        .unwrap();
    let neigh = String::from_utf8_lossy(&neigh.stdout).to_string();
    assert!(
        neigh.contains("lladdr") && !neigh.contains("lladdr fe:fd"),
        "h3's neighbour entry for h4: {neigh}"
    );
    // iperf3 over IPv6 to the router's LAN host, from the interface and a hybrid host.
    let l1_v6 = hosts6[3].1;
    for (from, port) in [
        (site.iface.0.clone(), 5311),
        (site.hybrids[0].0.clone(), 5312),
    ] {
        let l1 = site.lan_hosts[0].clone();
        let (packets, lost) = site
            .bed
            .udp_stream(&from, &l1, l1_v6, port, ("50M", 1200, 2))
            .expect("UDP stream over IPv6");
        eprintln!("IPv6 UDP {} -> l1: {packets} sent, {lost} lost", from.name);
        assert!(
            packets > 500 && lost * 4 < packets,
            "{packets} sent, {lost} lost"
        );
    }

    // A UDP stream to a plain LAN host behind the router: the router's agent writes its
    // datagrams coalesced into its TAP, a bridge port, and the bridge hands the LAN host
    // datagrams whose checksums verify.
    let l1 = site.lan_hosts[0].clone();
    let merged_before = site.ns_status(&site.router).coalesced_frames;
    let errors_before = site.bed.udp_checksum_errors(&l1.ns).expect("snmp");
    let iface = site.iface.0.clone();
    let (packets, lost) = site
        .bed
        .udp_stream(&iface, &l1, vip(11), 5301, ("100M", 1200, 2))
        .expect("UDP stream");
    let merged = site.ns_status(&site.router).coalesced_frames - merged_before;
    eprintln!("UDP to l1: {packets} sent, {lost} lost; the router merged {merged}");
    // Loss is not what this checks (tests run side by side on two cores): most arrive.
    assert!(
        packets > 1000 && lost * 4 < packets,
        "{packets} sent, {lost} lost"
    );
    assert!(merged > 1000, "the router's agent coalesced no UDP");
    assert_eq!(
        site.bed.udp_checksum_errors(&l1.ns).expect("snmp"),
        errors_before
    );

    // Kill the router agent: the site 1 LAN still works; the rest returns with the agent.
    let (rh, ra) = site.router.clone();
    site.bed.signal(ra.pid, libc::SIGKILL).unwrap();
    assert!(
        ping(&site.bed, &site.lan_hosts[0], vip(12), 3),
        "site 1 LAN broke without its agent"
    );
    assert!(
        !ping(&site.bed, &site.iface.0, vip(11), 1),
        "site 1 reachable with its router agent dead"
    );
    let config = std::fs::read_to_string(&ra.config).unwrap();
    let ra = site.bed.start_agent(&rh, &config).unwrap();
    site.router = (rh, ra);
    site.bed
        .wait_for_ping(&site.iface.0, vip(11), Duration::from_secs(60))
        .expect("remote reachability returns with the router agent");
    site.bed
        .wait_for_ping(&site.lan_hosts[1], vip(21), Duration::from_secs(60))
        .expect("site 1 reaches site 2 again");

    // A LAN host that goes away stops being claimed.
    site.bed
        .ns(
            &site.lan_hosts[1].ns,
            "ip",
            &["link", "set", "eth0", "down"],
        )
        .unwrap();
    wait_until(
        "the router gives up the vanished host's address",
        Duration::from_secs(20),
        || {
            !site
                .ns_status(&site.router)
                .addresses
                .contains(&vip(12).to_string())
        },
    );
    assert!(site
        .ns_status(&site.router)
        .addresses
        .contains(&vip(11).to_string()));
}
