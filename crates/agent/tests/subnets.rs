#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A multi-subnet namespace end to end (Diverter: every agent is every subnet's gateway, and
//! routes between subnets in one hop at the sender): real agents, a plain LAN host that
//! gets its address, router and routes from the agent's DHCP server (busybox udhcpc), and
//! traceroute, ping, dig as the hosts' own tools.
//!
//! Host `a` (interface mode) is in 10.61.0.0/24 and names all three subnets; host `b`
//! (interface mode) is configured with 10.62.0.0/24 only and learns the others from the
//! namespace record; router `r` serves a LAN in 10.62.0.0/24 with one plain host `l`; host
//! `h` runs hybrid mode in 10.63.0.0/24. iperf3 carries TCP across subnets both to a LAN
//! host and from a hybrid host.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use hyphae_agent::control::NamespaceStatus;
use hyphae_testbed::{agent_section, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const A: &str = "10.61.0.0/24";
const B: &str = "10.62.0.0/24";
const C: &str = "10.63.0.0/24";
const A_HOST: Ipv4Addr = Ipv4Addr::new(10, 61, 0, 10);
const B_HOST: Ipv4Addr = Ipv4Addr::new(10, 62, 0, 20);
const H_HOST: Ipv4Addr = Ipv4Addr::new(10, 63, 0, 30);
const A_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 61, 0, 1);
const B_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 62, 0, 1);
const C_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 63, 0, 1);

/// Bytes iperf3 carried over TCP in 2 s from `from` to `to` (at `address`).
fn tcp_bytes(bed: &mut Testbed, from: &Host, to: &Host, address: Ipv4Addr, port: u16) -> u64 {
    let port = port.to_string();
    let log = to.dir.join(format!("iperf3-{port}.log"));
    bed.spawn(&to.ns, "iperf3", &["-s", "-1", "-p", &port], &log)
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let address = address.to_string();
    let out = bed
        .ns_output(
            &from.ns,
            "iperf3",
            &["-c", &address, "-p", &port, "-t", "2", "-J"],
        )
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    report["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0)
}

fn namespace(secret: &Path, subnets: &str, bootstrap: Option<Ipv4Addr>, lines: &str) -> String {
    let mut c = format!(
        "\n[[namespace]]\nname = \"lab\"\nsecret_file = \"{}\"\n{subnets}\nlease_secs = 30\n{lines}",
        secret.display()
    );
    if let Some(b) = bootstrap {
        c += &format!("bootstrap = [\"{b}:7400\"]\n");
    }
    c
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

/// The hops `traceroute` from `from` to `to` shows: the first address that answered on
/// each line (`*` if none did). ICMP echo probes (`-I`): the destination answers them with
/// echo replies, where UDP probes get "port unreachable", which Linux rate-limits per
/// peer, so that under load all three of a line could go unanswered.
fn hops(bed: &Testbed, from: &Host, to: Ipv4Addr) -> Vec<String> {
    let to = to.to_string();
    let out = bed
        .ns_output(
            &from.ns,
            "traceroute",
            &["-I", "-n", "-w", "2", "-m", "5", &to],
        )
        .expect("traceroute");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("traceroute {to}:\n{text}");
    text.lines()
        .skip_while(|l| l.starts_with("traceroute"))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .find(|w| w.parse::<Ipv4Addr>().is_ok())
                .unwrap_or("*")
                .to_string()
        })
        .collect()
}

#[test]
fn hosts_of_three_subnets_reach_each_other_in_one_hop_through_their_own_agent() {
    require_root();
    let mut bed = Testbed::new("sn", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").unwrap();
    let all = format!("subnets = [\"{A}\", \"{B}\", \"{C}\"]");

    let a = bed.add_host("a", Ipv4Addr::new(10, 200, 0, 1)).unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&a),
        namespace(
            &secret,
            &all,
            None,
            &format!("device = \"hyphae0\"\naddress = \"{A_HOST}\"\nhostname = \"alpha\"\n")
        )
    );
    let aa = bed.start_agent(&a, &cfg).unwrap();
    let boot = Some(a.underlay);

    let b = bed.add_host("b", Ipv4Addr::new(10, 200, 0, 2)).unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&b),
        namespace(
            &secret,
            &format!("subnet = \"{B}\""),
            boot,
            &format!("device = \"hyphae0\"\naddress = \"{B_HOST}\"\n")
        )
    );
    let ba = bed.start_agent(&b, &cfg).unwrap();

    let lan = bed.add_lan("lan").unwrap();
    let r = bed.add_host("r", Ipv4Addr::new(10, 200, 0, 3)).unwrap();
    bed.plug(&lan, &r.ns, "eth1", 1500).unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&r),
        namespace(
            &secret,
            &format!("subnet = \"{B}\""),
            boot,
            "mode = \"router\"\ndevice = \"hyr0\"\nbridge = \"brlan\"\nuplink = \"eth1\"\n"
        )
    );
    let ra = bed.start_agent(&r, &cfg).unwrap();

    // A hybrid host in the third subnet (its own bridge and LAN).
    let lan2 = bed.add_lan("lan2").unwrap();
    let h = bed.add_host("h", Ipv4Addr::new(10, 200, 0, 4)).unwrap();
    bed.plug(&lan2, &h.ns, "eth1", 1500).unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&h),
        namespace(
            &secret,
            &format!("subnet = \"{C}\""),
            boot,
            &format!("mode = \"hybrid\"\ndevice = \"hy0\"\nbridge = \"brlan\"\nuplink = \"eth1\"\naddress = \"{H_HOST}\"\nprobe_timeout_ms = 400\n")
        )
    );
    let ha = bed.start_agent(&h, &cfg).unwrap();

    // b was told only its own subnet: it learns the others from the namespace record.
    wait_until(
        "b learns the other subnets",
        Duration::from_secs(20),
        || ns_status(&bed, &b, &ba).routed_subnets == vec![A.to_string(), C.to_string()],
    );
    assert_eq!(
        ns_status(&bed, &a, &aa).routed_subnets,
        vec![B.to_string(), C.to_string()]
    );
    assert_eq!(bed.claimed_address(&b, &ba).unwrap(), B_HOST);
    assert_eq!(bed.claimed_address(&a, &aa).unwrap(), A_HOST);
    // Each interface host routes the other subnet through its own subnet's gateway.
    let route = bed
        .ns_output(&a.ns, "ip", &["-4", "route", "show", B])
        .unwrap();
    let route = String::from_utf8_lossy(&route.stdout).to_string();
    assert!(route.contains(&format!("via {A_GATEWAY}")), "{route}");

    // Across subnets: ping both ways, and one hop (the gateway) on the way.
    bed.wait_for_ping(&a, B_HOST, Duration::from_secs(20))
        .expect("a -> b across subnets");
    bed.wait_for_ping(&b, A_HOST, Duration::from_secs(20))
        .expect("b -> a across subnets");
    assert_eq!(
        hops(&bed, &a, B_HOST),
        vec![A_GATEWAY.to_string(), B_HOST.to_string()]
    );
    assert_eq!(
        hops(&bed, &b, A_HOST),
        vec![B_GATEWAY.to_string(), A_HOST.to_string()]
    );
    // The hybrid host routes through its own agent too (its veth carries the route).
    assert_eq!(bed.claimed_address(&h, &ha).unwrap(), H_HOST);
    bed.wait_for_ping(&h, A_HOST, Duration::from_secs(20))
        .expect("hybrid host -> a across subnets");
    assert_eq!(
        hops(&bed, &h, A_HOST),
        vec![C_GATEWAY.to_string(), A_HOST.to_string()]
    );
    bed.wait_for_ping(&h, B_HOST, Duration::from_secs(20))
        .expect("hybrid host -> b across subnets");
    assert_eq!(
        hops(&bed, &b, H_HOST),
        vec![B_GATEWAY.to_string(), H_HOST.to_string()]
    );
    assert!(ns_status(&bed, &h, &ha).routed > 0);
    let carried = tcp_bytes(&mut bed, &h, &b, B_HOST, 5201);
    assert!(
        carried > 1_000_000,
        "TCP from the hybrid host to b: {carried} bytes"
    );

    // An address of the other subnet nobody holds: the gateway says so, as a router does.
    let out = bed
        .ns_output(
            &a.ns,
            "ping",
            &["-c", "2", "-i", "0.5", "-W", "6", "10.62.0.99"],
        )
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.contains(&format!("From {A_GATEWAY}"))
            && text.contains("Destination Host Unreachable"),
        "{text}"
    );
    let (sa, sb) = (ns_status(&bed, &a, &aa), ns_status(&bed, &b, &ba));
    assert!(sa.unreachable >= 1);
    assert!(
        sa.routed > 0 && sb.routed > 0,
        "{} {}",
        sa.routed,
        sb.routed
    );
    // Each traceroute's first probe ran out of TTL at the sender's own agent.
    assert!(sa.ttl_exceeded >= 1 && sb.ttl_exceeded >= 1);

    // A plain LAN host behind the router gets its subnet's gateway as its router, and the
    // other subnet as a classless static route through it.
    let l = bed
        .add_lan_host(&lan, "l", "", hyphae_agent::config::DEFAULT_MTU)
        .unwrap();
    let (script, env_file) = hyphae_testbed::udhcpc_script(&l).unwrap();
    let out = bed.udhcpc(&l, "lima", &script).unwrap();
    assert!(
        out.status.success(),
        "udhcpc: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let env = std::fs::read_to_string(&env_file).unwrap();
    assert!(env.contains(&format!("router={B_GATEWAY}")), "{env}");
    assert!(
        env.contains(&format!("staticroutes={A} {B_GATEWAY}")),
        "{env}"
    );
    let l_ip = bed.address_on(&l, "eth0", Duration::from_secs(5)).unwrap();
    assert!(B.parse::<ipnet::Ipv4Net>().unwrap().contains(&l_ip));
    bed.ns(
        &l.ns,
        "ip",
        &["route", "add", A, "via", &B_GATEWAY.to_string()],
    )
    .unwrap();
    bed.wait_for_ping(&l, A_HOST, Duration::from_secs(20))
        .expect("LAN host -> a across subnets");
    bed.wait_for_ping(&a, l_ip, Duration::from_secs(20))
        .expect("a -> LAN host across subnets");
    assert_eq!(
        hops(&bed, &l, A_HOST),
        vec![B_GATEWAY.to_string(), A_HOST.to_string()]
    );
    // Within b's subnet nothing is routed: b reaches the LAN host directly.
    assert_eq!(hops(&bed, &b, l_ip), vec![l_ip.to_string()]);
    let carried = tcp_bytes(&mut bed, &a, &l, l_ip, 5202);
    assert!(
        carried > 1_000_000,
        "TCP from a to the LAN host: {carried} bytes"
    );
    // Names of the other subnet answer at this subnet's service address.
    let dig = bed
        .dig_short(&l, &B_GATEWAY.to_string(), "alpha.lab")
        .unwrap();
    assert_eq!(dig, vec![A_HOST.to_string()]);
    assert!(ns_status(&bed, &r, &ra).routed > 0);

    // Broadcast stays in its subnet. A directed broadcast to b's subnet is not forwarded.
    let other_subnet = |s: &NamespaceStatus| s.drops.get("other_subnet").copied().unwrap_or(0);
    let ping_b = |to: &str, count: &str| {
        let args = ["-b", "-c", count, "-i", "0.2", "-W", "1", to];
        let _ = bed.ns_output(&a.ns, "ping", &args);
    };
    let a_before = other_subnet(&ns_status(&bed, &a, &aa));
    ping_b("10.62.0.255", "3");
    assert_eq!(other_subnet(&ns_status(&bed, &a, &aa)), a_before + 3);
    // a's subnet broadcast goes to every member (once a has read the group), and those of
    // the other subnet drop it: their device and LAN never hear it.
    let (b_before, r_before) = (ns_status(&bed, &b, &ba), ns_status(&bed, &r, &ra));
    wait_until(
        "b and r drop a's subnet broadcast",
        Duration::from_secs(20),
        || {
            ping_b("10.61.0.255", "1");
            other_subnet(&ns_status(&bed, &b, &ba)) > other_subnet(&b_before)
                && other_subnet(&ns_status(&bed, &r, &ra)) > other_subnet(&r_before)
        },
    );
    assert_eq!(
        ns_status(&bed, &b, &ba).broadcasts_in,
        b_before.broadcasts_in
    );
    assert_eq!(
        ns_status(&bed, &r, &ra).broadcasts_in,
        r_before.broadcasts_in
    );
    assert!(ns_status(&bed, &a, &aa).broadcasts_out > 0);
}

/// Issue 31, item 5: the namespace policy applies between subnets at the routing agent (the
/// sender's): here a may ping b's subnet, and b may not open anything toward a's.
#[test]
fn the_policy_between_subnets_is_applied_by_the_routing_agent() {
    require_root();
    let mut bed = Testbed::new("sp", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").unwrap();
    let policy = bed.dir().join("lab.policy.toml");
    std::fs::write(
        &policy,
        format!(
            "version = 1\ndefault = \"deny\"\n[[rule]]\nfrom = [\"{A}\"]\nto = [\"{B}\"]\nproto = \"icmp\"\n"
        ),
    )
    .unwrap();
    let both = format!("subnets = [\"{A}\", \"{B}\"]");
    let mut members = Vec::new();
    for (i, address) in [(1u8, A_HOST), (2, B_HOST)] {
        let host = bed
            .add_host(&format!("p{i}"), Ipv4Addr::new(10, 200, 0, i))
            .unwrap();
        let boot = (i > 1).then_some(Ipv4Addr::new(10, 200, 0, 1));
        let lines = format!(
            "address = \"{address}\"\nresolvers = []\npolicy = \"{}\"\n",
            policy.display()
        );
        let cfg = format!(
            "{}{}",
            agent_section(&host),
            namespace(&secret, &both, boot, &lines)
        );
        let agent = bed.start_agent(&host, &cfg).unwrap();
        members.push((host, agent));
    }
    let [(a, aa), (b, ba)] = &members[..] else {
        unreachable!()
    };
    assert_eq!(bed.claimed_address(b, ba).unwrap(), B_HOST);
    bed.wait_for_ping(a, B_HOST, Duration::from_secs(20))
        .expect("a's subnet may ping b's");
    // b's ping toward a's subnet is a flow no rule allows: its own agent, which routes it,
    // refuses it, and nothing reaches a.
    let denied_in_at_a = ns_status(&bed, a, aa).policy.denied_in;
    let out = bed.ping(b, A_HOST, 3).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains(" 0 received"), "{text}");
    assert!(ns_status(&bed, b, ba).policy.denied_out >= 3);
    assert_eq!(ns_status(&bed, a, aa).policy.denied_in, denied_in_at_a);
}

/// Issue 31, item 2: a LAN host live-migrated between two router sites of its subnet keeps
/// its gateway without noticing: every router answers the gateway with the namespace's one
/// router MAC, so the gateway entry in the guest's ARP cache (kept, as a live-migrated
/// guest keeps it) is still right at the new site, and its traffic to another subnet flows
/// after its announcement (a gratuitous ARP) with no new ARP for the gateway.
#[test]
fn a_host_moved_between_routers_keeps_its_gateway() {
    require_root();
    let mut bed = Testbed::new("sm", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").unwrap();
    let both = format!("subnets = [\"{A}\", \"{B}\"]");
    let a = bed.add_host("a", Ipv4Addr::new(10, 200, 0, 1)).unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&a),
        namespace(
            &secret,
            &both,
            None,
            &format!("device = \"hyphae0\"\naddress = \"{A_HOST}\"\n")
        )
    );
    let _aa = bed.start_agent(&a, &cfg).unwrap();
    let mut sites = Vec::new();
    for (k, underlay) in [(1u8, 2u8), (2, 3)] {
        let lan = bed.add_lan(&format!("lan{k}")).unwrap();
        let host = bed
            .add_host(&format!("r{k}"), Ipv4Addr::new(10, 200, 0, underlay))
            .unwrap();
        bed.plug(&lan, &host.ns, "eth1", 1500).unwrap();
        let cfg = format!(
            "{}{}",
            agent_section(&host),
            namespace(
                &secret,
                &format!("subnet = \"{B}\""),
                Some(a.underlay),
                "mode = \"router\"\ndevice = \"hyr0\"\nbridge = \"brlan\"\nuplink = \"eth1\"\n"
            )
        );
        let agent = bed.start_agent(&host, &cfg).unwrap();
        sites.push((lan, host, agent));
    }
    let vm_ip = Ipv4Addr::new(10, 62, 0, 50);
    let vm = bed
        .add_lan_host(
            &sites[0].0,
            "vm",
            &format!("{vm_ip}/24"),
            hyphae_agent::config::DEFAULT_MTU,
        )
        .unwrap();
    bed.ns(
        &vm.ns,
        "ip",
        &["route", "add", A, "via", &B_GATEWAY.to_string()],
    )
    .unwrap();
    bed.wait_for_ping(&vm, A_HOST, Duration::from_secs(30))
        .expect("the VM reaches the other subnet through its gateway");
    let gateway_mac = bed
        .neighbour(&vm, B_GATEWAY)
        .unwrap()
        .expect("the VM's ARP entry for its gateway");

    // The live migration: the VM's port moves to the other LAN; it keeps its ARP cache
    // (moving a veth flushes it, so the gateway's entry is put back as it was) and
    // announces itself.
    let port = bed.bridge_port(&vm, &sites[0].0).unwrap();
    bed.move_port(&port, &sites[0].0, &sites[1].0).unwrap();
    bed.ns(
        &vm.ns,
        "ip",
        &[
            "neigh",
            "replace",
            &B_GATEWAY.to_string(),
            "lladdr",
            &gateway_mac,
            "dev",
            "eth0",
            "nud",
            "reachable",
        ],
    )
    .unwrap();
    let ip = vm_ip.to_string();
    bed.ns_output(
        &vm.ns,
        "arping",
        &["-q", "-U", "-c", "2", "-I", "eth0", &ip],
    )
    .unwrap();
    let (_, r2, r2a) = &sites[1];
    wait_until(
        "the new router holds the VM",
        Duration::from_secs(20),
        || ns_status(&bed, r2, r2a).addresses.contains(&ip),
    );
    let routed_before = ns_status(&bed, r2, r2a).routed;
    bed.wait_for_ping(&vm, A_HOST, Duration::from_secs(10))
        .expect("the VM reaches the other subnet from the new site");
    assert_eq!(
        bed.neighbour(&vm, B_GATEWAY).unwrap().as_deref(),
        Some(gateway_mac.as_str()),
        "the gateway's MAC is the same at both sites"
    );
    assert!(
        ns_status(&bed, r2, r2a).routed > routed_before,
        "the new router routed the VM's packets"
    );
}

/// Issue 31, item 7: a DHCP client in each subnet (busybox `udhcpc` on the LAN of a router
/// in that subnet) gets its own subnet's gateway as router and the other two subnets as
/// classless static routes through it; then each reaches the others across subnets with
/// only what DHCP gave it (the script installs option 121's routes).
#[test]
fn a_dhcp_client_in_each_subnet_gets_its_own_gateway() {
    require_root();
    let mut bed = Testbed::new("sd", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").unwrap();
    let all = format!("subnets = [\"{A}\", \"{B}\", \"{C}\"]");
    let subnets = [A, B, C];
    let gateways = [A_GATEWAY, B_GATEWAY, C_GATEWAY];
    let mut sites = Vec::new();
    for k in 0..3u8 {
        let lan = bed.add_lan(&format!("lan{k}")).unwrap();
        let host = bed
            .add_host(&format!("r{k}"), Ipv4Addr::new(10, 200, 0, k + 1))
            .unwrap();
        bed.plug(&lan, &host.ns, "eth1", 1500).unwrap();
        // The first router starts the namespace with every subnet; the others name theirs.
        let (list, boot) = match k {
            0 => (format!("{all}\nsubnet = \"{A}\""), None),
            _ => (
                format!("subnet = \"{}\"", subnets[usize::from(k)]),
                Some(Ipv4Addr::new(10, 200, 0, 1)),
            ),
        };
        let cfg = format!(
            "{}{}",
            agent_section(&host),
            namespace(
                &secret,
                &list,
                boot,
                "mode = \"router\"\ndevice = \"hyr0\"\nbridge = \"brlan\"\nuplink = \"eth1\"\nresolvers = []\n"
            )
        );
        let agent = bed.start_agent(&host, &cfg).unwrap();
        sites.push((lan, host, agent));
    }
    let mut clients = Vec::new();
    for (k, (lan, host, agent)) in sites.iter().enumerate() {
        wait_until(
            "the router knows every subnet",
            Duration::from_secs(20),
            || ns_status(&bed, host, agent).routed_subnets.len() == 2,
        );
        let l = bed
            .add_lan_host(lan, &format!("l{k}"), "", hyphae_agent::config::DEFAULT_MTU)
            .unwrap();
        // The script also installs each classless static route it is given.
        let (script, env_file) = hyphae_testbed::udhcpc_script(&l).unwrap();
        let text = std::fs::read_to_string(&script).unwrap().replace(
            "    env > ",
            "    set -- $staticroutes\n    while [ $# -ge 2 ]; do ip route replace \"$1\" via \"$2\" dev \"$interface\" onlink; shift 2; done\n    env > ",
        );
        std::fs::write(&script, text).unwrap();
        let out = bed.udhcpc(&l, &format!("client{k}"), &script).unwrap();
        assert!(
            out.status.success(),
            "udhcpc in {}: {}{}",
            subnets[k],
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let env = std::fs::read_to_string(&env_file).unwrap();
        let gateway = gateways[k];
        assert!(env.contains(&format!("router={gateway}")), "{env}");
        for (j, other) in subnets.iter().enumerate() {
            if j != k {
                assert!(env.contains(&format!("{other} {gateway}")), "{env}");
            }
        }
        let ip = bed.address_on(&l, "eth0", Duration::from_secs(5)).unwrap();
        assert!(subnets[k].parse::<ipnet::Ipv4Net>().unwrap().contains(&ip));
        clients.push((l, ip));
    }
    for (k, (from, _)) in clients.iter().enumerate() {
        let (_, to) = &clients[(k + 1) % 3];
        bed.wait_for_ping(from, *to, Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("client {k} -> {to}: {e}"));
    }
}
