#![allow(clippy::disallowed_methods)] // a test waits on the real clock
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! IPv6 inside the overlay, end to end (issue 29): interface members of a namespace with no
//! IPv6 configuration at all hold distinct IPv6 addresses of one derived ULA prefix, won as
//! majority leases in the DHT; the kernel resolves them through the agent's neighbour
//! discovery proxy; ping -6 and TCP cross; a static IPv6 address another member holds is
//! refused; and an IPv6 source a member does not hold is dropped and counted at the
//! receiver.
//!
//! Needs root, iproute2, ping, socat (`scripts/deps` installs them). Never skips: without
//! root it fails and says why.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyphae_agent::control::{NamespaceStatus, Status};
use hyphae_testbed::{
    agent_section, join_config, lab_namespace, require_root, AgentHandle, Host, Testbed,
};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.203.0.0/24";
const LEASE_SECS: u64 = 20;

fn underlay(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, 0, i)
}

struct Member {
    host: Host,
    agent: AgentHandle,
}

fn secret(dir: &Path) -> PathBuf {
    let path = dir.join("lab.secret");
    hyphae_testbed::write_secret(&path, "the ipv6 test namespace secret\n").unwrap();
    path
}

/// Host `h{i}` with an interface member: `auto` IPv4, then `lines` (IPv6 keys, if any).
fn start_member(bed: &mut Testbed, secret: &Path, i: u8, lines: &str) -> Member {
    let host = bed.add_host(&format!("h{i}"), underlay(i)).unwrap();
    let boot = (i > 1).then(|| underlay(1));
    let cfg = join_config(&host, "lab", secret, SUBNET, "auto", boot, LEASE_SECS) + lines;
    let agent = bed.start_agent(&host, &cfg).unwrap();
    Member { host, agent }
}

fn status(bed: &Testbed, m: &Member) -> Status {
    bed.status(&m.host, &m.agent).expect("status")
}

fn namespace(bed: &Testbed, m: &Member) -> NamespaceStatus {
    status(bed, m).namespaces.remove(0)
}

/// The IPv6 address `m` holds, once it holds one (20 s at most).
fn address6(bed: &Testbed, m: &Member) -> Ipv6Addr {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ns = namespace(bed, m);
        if !ns.address6.is_empty() {
            return ns.address6.parse().expect("an IPv6 address");
        }
        assert!(
            Instant::now() < deadline,
            "{} holds no IPv6 address: {ns:?}",
            m.host.name
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `ping -6` from `from` to `to` until one answers (15 s at most), then three more that
/// must all answer.
fn ping6(bed: &Testbed, from: &Host, to: Ipv6Addr) {
    let to = to.to_string();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let out = bed
            .ns_output(&from.ns, "ping", &["-6", "-c", "1", "-W", "1", &to])
            .unwrap();
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} never reached {to}: {}",
            from.name,
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let out = bed
        .ns_output(&from.ns, "ping", &["-6", "-c", "3", "-W", "2", &to])
        .unwrap();
    assert!(
        out.status.success(),
        "{} -> {to}: {}",
        from.name,
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `dig +short` at the namespace's service address from `m`: the answer once there is one
/// (10 s at most: names are read from the DHT).
fn dig(bed: &Testbed, m: &Member, args: &[&str]) -> String {
    dig_at(bed, &m.host, "10.203.0.1", args)
}

/// [`dig`] from `host` at `server`.
fn dig_at(bed: &Testbed, host: &Host, server: &str, args: &[&str]) -> String {
    let server = format!("@{server}");
    let mut all = vec![server.as_str(), "+short", "+time=1", "+tries=1"];
    all.extend_from_slice(args);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = bed.ns_output(&host.ns, "dig", &all).unwrap();
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !text.is_empty() && !text.starts_with(';') {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "dig {args:?} from {}: {text}",
            host.name
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The count of drops of `reason` at `m` summed over its tunnels.
fn peer_drops(bed: &Testbed, m: &Member, reason: &str) -> u64 {
    namespace(bed, m)
        .peers
        .iter()
        .map(|p| p.drops.get(reason).copied().unwrap_or(0))
        .sum()
}

#[test]
fn interface_members_hold_ipv6_addresses_and_reach_each_other() {
    require_root();
    let mut bed = Testbed::new("v6", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());
    let members: Vec<Member> = (1..=3)
        .map(|i| start_member(&mut bed, &secret, i, &format!("hostname = \"host{i}\"\n")))
        .collect();
    let addresses: Vec<Ipv6Addr> = members.iter().map(|m| address6(&bed, m)).collect();

    // One prefix at every member, derived from the namespace (a ULA /64), no configuration.
    let prefixes: Vec<String> = members.iter().map(|m| namespace(&bed, m).subnet6).collect();
    let prefix: ipnet::Ipv6Net = prefixes[0].parse().expect("a prefix");
    assert!(prefixes.iter().all(|p| *p == prefixes[0]), "{prefixes:?}");
    assert_eq!(prefix.prefix_len(), 64);
    assert_eq!(prefix.network().octets()[0], 0xfd, "not a ULA: {prefix}");
    for a in &addresses {
        assert!(prefix.contains(a), "{a} outside {prefix}");
    }
    let mut distinct = addresses.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "{addresses:?}");

    // The device carries it.
    let shown = bed
        .ns(
            &members[0].host.ns,
            "ip",
            &["-6", "-o", "addr", "show", "dev", "hyphae0"],
        )
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains(&format!("{}/64", addresses[0])), "{shown}");

    // Every pair, both ways; the first packet to each waits for the neighbour proxy.
    for (i, from) in members.iter().enumerate() {
        for (j, to) in addresses.iter().enumerate() {
            if i != j {
                ping6(&bed, &from.host, *to);
            }
        }
    }
    let h1 = namespace(&bed, &members[0]);
    assert!(h1.nd_replies >= 2, "{h1:?}");
    for a in &addresses[1..] {
        assert!(
            h1.peers
                .iter()
                .any(|p| p.addresses.contains(&a.to_string())),
            "h1's peers do not show {a}: {:?}",
            h1.peers
        );
    }
    // The kernel's link-local chatter (router solicitations, MLD) stayed here.
    assert!(
        h1.drops.get("link_local").copied().unwrap_or(0) > 0,
        "{:?}",
        h1.drops
    );

    // Names: AAAA for a member's name, PTR for its IPv6 address, asked of the virtual DNS
    // at the service address from another member (read from the DHT there).
    assert_eq!(
        dig(&bed, &members[1], &["host1.lab", "AAAA"]),
        addresses[0].to_string()
    );
    assert_eq!(
        dig(&bed, &members[2], &["-x", &addresses[0].to_string()]),
        "host1.lab."
    );
    assert_eq!(
        dig(&bed, &members[0], &["host3.lab", "AAAA"]),
        addresses[2].to_string()
    );

    // TCP over IPv6, checked end to end by hash.
    bed.tcp_transfer(
        &members[0].host,
        (&members[1].host, addresses[1]),
        5601,
        4 << 20,
        Duration::from_secs(60),
    )
    .expect("TCP over IPv6");
}

#[test]
fn a_static_ipv6_address_another_member_holds_is_refused() {
    require_root();
    let mut bed = Testbed::new("v6dup", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());
    let first = start_member(&mut bed, &secret, 1, "");
    let taken = address6(&bed, &first);
    let owner = status(&bed, &first).identity;
    // Until the second member has joined, h1 is the only replica: wait for it as a
    // member of the overlay before asking for h1's address.
    let h2 = bed.add_host("h2", underlay(2)).unwrap();
    let cfg = join_config(
        &h2,
        "lab",
        &secret,
        SUBNET,
        "auto",
        Some(underlay(1)),
        LEASE_SECS,
    ) + &format!("address6 = \"{taken}\"\n");
    let log = match bed.start_agent(&h2, &cfg) {
        Ok(agent) => {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let refused = bed.status(&h2, &agent).ok().is_none_or(|s| {
                    s.namespaces
                        .iter()
                        .any(|n| n.error.as_deref().is_some_and(|e| e.contains("IPv6")))
                });
                if refused || Instant::now() > deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let held = bed
                .status(&h2, &agent)
                .ok()
                .and_then(|s| s.namespaces.first().map(|n| n.address6.clone()));
            assert_ne!(
                held.as_deref(),
                Some(taken.to_string().as_str()),
                "h2 took h1's IPv6 address"
            );
            std::fs::read_to_string(&agent.log).unwrap()
        }
        Err(e) => e.to_string(),
    };
    assert!(
        log.contains(&format!("IPv6 address {taken} is owned by member")) && log.contains(&owner),
        "the refusal should name the address and its holder {owner}: {log}"
    );
}

#[test]
fn an_ipv6_source_a_member_does_not_hold_is_dropped_and_counted() {
    require_root();
    let mut bed = Testbed::new("v6spoof", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());
    let h1 = start_member(&mut bed, &secret, 1, "");
    let h2 = start_member(&mut bed, &secret, 2, "");
    let (a1, a2) = (address6(&bed, &h1), address6(&bed, &h2));
    ping6(&bed, &h2.host, a1);
    let before = peer_drops(&bed, &h1, "spoofed_source");

    // h2's host takes a second address of the prefix that no member holds, and sends
    // from it: its agent carries it, and h1's refuses it as not h2's.
    let spoofed = Ipv6Addr::from(u128::from(a2) ^ 0xbeef);
    bed.ns(
        &h2.host.ns,
        "ip",
        &[
            "-6",
            "addr",
            "add",
            &format!("{spoofed}/64"),
            "dev",
            "hyphae0",
            "nodad",
        ],
    )
    .unwrap();
    let out = bed
        .ns_output(
            &h2.host.ns,
            "ping",
            &[
                "-6",
                "-c",
                "3",
                "-W",
                "1",
                "-I",
                &spoofed.to_string(),
                &a1.to_string(),
            ],
        )
        .unwrap();
    assert!(
        !out.status.success(),
        "a spoofed source got answers: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let after = peer_drops(&bed, &h1, "spoofed_source");
    assert!(after >= before + 3, "spoofed_source {before} -> {after}");
    // The member's own address still works (without the other, which the kernel would
    // pick as the source now).
    bed.ns(
        &h2.host.ns,
        "ip",
        &[
            "-6",
            "addr",
            "del",
            &format!("{spoofed}/64"),
            "dev",
            "hyphae0",
        ],
    )
    .unwrap();
    ping6(&bed, &h2.host, a1);
}

/// A LAN, a router-mode member `r` on it (bootstrapping from `h1`) and a LAN host `l1`
/// at 10.203.0.11.
fn router_site(bed: &mut Testbed, secret: &Path) -> (String, Member, Host) {
    let (lan, router) = router_at(bed, secret, "", 2);
    let l1 = bed
        .add_lan_host(&lan, "l1", "10.203.0.11/24", 1500)
        .unwrap();
    (lan, router, l1)
}

/// LAN `lan{tag}` and router-mode member `r{tag}` on it (underlay address `underlay(u)`,
/// bootstrapping from `h1`).
fn router_at(bed: &mut Testbed, secret: &Path, tag: &str, u: u8) -> (String, Member) {
    let lan = bed.add_lan(&format!("lan{tag}")).unwrap();
    let rh = bed.add_host(&format!("r{tag}"), underlay(u)).unwrap();
    bed.plug(&lan, &rh.ns, "eth1", 1500).unwrap();
    let lines = format!(
        "lease_secs = {LEASE_SECS}\nmode = \"router\"\ndevice = \"hyr0\"\nbridge = \"brlan\"\nuplink = \"eth1\"\n"
    );
    let cfg = agent_section(&rh) + &lab_namespace(secret, SUBNET, Some(underlay(1)), &lines);
    let agent = bed.start_agent(&rh, &cfg).unwrap();
    (lan, Member { host: rh, agent })
}

/// The global address in `prefix` on `host`'s `eth0` once its kernel formed one from a
/// router advertisement and it passed duplicate address detection (20 s at most).
fn slaac_address(bed: &Testbed, host: &Host, prefix: ipnet::Ipv6Net) -> Ipv6Addr {
    let address = bed
        .slaac_address(host, Duration::from_secs(20))
        .expect("a SLAAC address");
    assert!(prefix.contains(&address), "{address} is not in {prefix}");
    address
}

/// Runs ISC `dhclient -6` on `host`'s `eth0` once its link-local address is ready; the
/// address it was leased, once its lease file names one (30 s at most).
fn dhclient6(bed: &mut Testbed, host: &Host) -> Ipv6Addr {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = bed
            .ns_output(
                &host.ns,
                "ip",
                &["-6", "-o", "addr", "show", "dev", "eth0", "scope", "link"],
            )
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if text.contains("fe80") && !text.contains("tentative") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no link-local address on {}: {text}",
            host.name
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let leases = host.dir.join("dhclient6.leases");
    let pid = host.dir.join("dhclient6.pid").display().to_string();
    let leases_arg = leases.display().to_string();
    let log = host.dir.join("dhclient6.log");
    bed.spawn(
        &host.ns,
        "dhclient",
        &["-6", "-d", "-v", "-pf", &pid, "-lf", &leases_arg, "eth0"],
        &log,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&leases).unwrap_or_default();
        let found = text.lines().find_map(|l| {
            let rest = l.trim().strip_prefix("iaaddr ")?;
            rest.split_whitespace().next()?.parse().ok()
        });
        if let Some(a) = found {
            return a;
        }
        assert!(
            Instant::now() < deadline,
            "dhclient -6 on {} got no lease: {}",
            host.name,
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// DHCPv6 through a real relay agent: ISC `dhcrelay -6` routes between a client LAN and a
/// router member's LAN in a /48 namespace, forwarding to all DHCPv6 servers of the site;
/// the router's agent answers it with RELAY-REPL, ISC `dhclient -6` behind the relay is
/// leased an address on the relay's link (the /64 of its link-address), the router holds
/// it, and the client and an interface member ping each other through the relay.
#[test]
fn a_dhcpv6_client_behind_a_relay_agent_is_leased_an_address_on_its_link() {
    require_root();
    let mut bed = Testbed::new("v6relay", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());
    let prefix = "fd42:7:7::/48";
    let h1 = start_member(&mut bed, &secret, 1, &format!("subnet6 = \"{prefix}\"\n"));
    let a1 = address6(&bed, &h1);
    let lan = bed.add_lan("lan").unwrap();
    let rh = bed.add_host("r", underlay(2)).unwrap();
    bed.plug(&lan, &rh.ns, "eth1", 1500).unwrap();
    let lines = format!(
        "lease_secs = {LEASE_SECS}\nmode = \"router\"\ndevice = \"hyr0\"\nbridge = \"brlan\"\nuplink = \"eth1\"\nsubnet6 = \"{prefix}\"\n"
    );
    let cfg = agent_section(&rh) + &lab_namespace(&secret, SUBNET, Some(underlay(1)), &lines);
    let agent = bed.start_agent(&rh, &cfg).unwrap();
    let router = Member { host: rh, agent };

    // The relay: a router between the member's LAN (fd42:7:7::e) and the client's
    // (fd42:7:7:5::1/64), reaching the rest of the namespace on its LAN side.
    let relay = bed
        .add_lan_host(&lan, "relay", "10.203.0.2/24", 1500)
        .unwrap();
    let clients = bed.add_lan("clan").unwrap();
    bed.plug(&clients, &relay.ns, "eth1", 1500).unwrap();
    for args in [
        &[
            "-6",
            "addr",
            "add",
            "fd42:7:7::e/64",
            "dev",
            "eth0",
            "nodad",
        ][..],
        &[
            "-6",
            "addr",
            "add",
            "fd42:7:7:5::1/64",
            "dev",
            "eth1",
            "nodad",
        ],
        &["-6", "route", "add", "fd42:7:7::/48", "dev", "eth0"],
    ] {
        bed.ns(&relay.ns, "ip", args).unwrap();
    }
    bed.ns(
        &relay.ns,
        "sysctl",
        &["-qw", "net.ipv6.conf.all.forwarding=1"],
    )
    .unwrap();
    let relay_log = relay.dir.join("dhcrelay.log");
    let pid_file = relay.dir.join("dhcrelay.pid").display().to_string();
    let relay_pid = bed
        .spawn(
            &relay.ns,
            "dhcrelay",
            &["-6", "-d", "-pf", &pid_file, "-l", "eth1", "-u", "eth0"],
            &relay_log,
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        bed.is_running(relay_pid),
        "dhcrelay exited: {}",
        std::fs::read_to_string(&relay_log).unwrap_or_default()
    );

    let c = bed.add_lan_host(&clients, "c", "", 1500).unwrap();
    let leased = dhclient6(&mut bed, &c);
    let link: ipnet::Ipv6Net = "fd42:7:7:5::/64".parse().unwrap();
    assert!(
        link.contains(&leased),
        "{leased} is not on the client's link {link}"
    );
    let r = namespace(&bed, &router);
    assert!(
        r.dhcp6_relayed >= 2 && r.dhcp6_relay_outside_prefix == 0,
        "SOLICIT and REQUEST came through the relay: {r:?}"
    );
    assert!(r.addresses6.contains(&leased.to_string()), "{r:?}");
    // Through the relay to the member and back: the client routes the namespace by it.
    bed.ns(
        &c.ns,
        "ip",
        &["-6", "route", "add", "fd42:7:7:5::1", "dev", "eth0"],
    )
    .unwrap();
    bed.ns(
        &c.ns,
        "ip",
        &[
            "-6",
            "route",
            "add",
            "fd42:7:7::/48",
            "via",
            "fd42:7:7:5::1",
        ],
    )
    .unwrap();
    ping6(&bed, &c, a1);
    ping6(&bed, &h1.host, leased);
    eprintln!(
        "leased {leased} through the relay; router: {} DHCPv6 replies",
        r.dhcp6_replies
    );
}

/// Router mode: a plain LAN host behind a router member configures its IPv6 address by
/// itself, from the router advertisement of the agent (the kernel's SLAAC, nothing else
/// running on it); the router learns the address from the host's duplicate address probe
/// and claims it; the host and an interface member reach each other both ways. A second
/// LAN host that tries the interface member's address by hand has its probe defended: its
/// kernel marks the address failed and never uses it.
#[test]
fn a_lan_host_configures_itself_from_the_routers_advertisement_and_reaches_members() {
    require_root();
    let mut bed = Testbed::new("v6r", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());
    let h1 = start_member(&mut bed, &secret, 1, "hostname = \"v6host\"\n");
    let a1 = address6(&bed, &h1);
    let prefix: ipnet::Ipv6Net = namespace(&bed, &h1).subnet6.parse().expect("a prefix");
    let service = Ipv6Addr::from(u128::from(prefix.network()) | 1).to_string();

    let (lan, router, l1) = router_site(&mut bed, &secret);

    let l1_address = slaac_address(&bed, &l1, prefix);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !namespace(&bed, &router)
        .lan_hosts
        .contains(&l1_address.to_string())
    {
        assert!(
            Instant::now() < deadline,
            "the router never learned {l1_address}: {:?}",
            namespace(&bed, &router)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let r = namespace(&bed, &router);
    assert!(r.router_advertisements >= 1, "{r:?}");
    assert_eq!(r.address6, "", "a router holds no IPv6 address of its own");

    ping6(&bed, &l1, a1);
    ping6(&bed, &h1.host, l1_address);
    // DNS over IPv6 at the prefix's service address (what the advertisement names), from
    // the LAN host (its router answers) and from the interface member (its own agent).
    assert_eq!(
        dig_at(&bed, &l1, &service, &["v6host.lab", "AAAA"]),
        a1.to_string()
    );
    assert_eq!(
        dig_at(&bed, &h1.host, &service, &["-x", &a1.to_string()]),
        "v6host.lab."
    );
    // The LAN host's address carries no name: its automatic name answers both ways.
    assert_eq!(prefix.prefix_len(), 64);
    let auto = format!("v6--{:016x}.lab", u128::from(l1_address) as u64);
    assert_eq!(
        dig_at(&bed, &h1.host, &service, &["-x", &l1_address.to_string()]),
        format!("{auto}.")
    );
    assert_eq!(
        dig_at(&bed, &l1, &service, &[&auto, "AAAA"]),
        l1_address.to_string()
    );
    bed.tcp_transfer(
        &h1.host,
        (&l1, l1_address),
        5601,
        1 << 20,
        Duration::from_secs(20),
    )
    .expect("TCP over IPv6 from the interface member to the LAN host");
    // The interface member sees the LAN host's address as the router's.
    let h1_status = namespace(&bed, &h1);
    assert!(
        h1_status
            .peers
            .iter()
            .any(|p| p.addresses.contains(&l1_address.to_string())),
        "{:?}",
        h1_status.peers
    );

    // A LAN host asking DHCPv6 (ISC dhclient -6) is leased an address of the prefix, which
    // the router claims for it and the interface member reaches.
    let l3 = bed.add_lan_host(&lan, "l3", "", 1500).unwrap();
    let leased = dhclient6(&mut bed, &l3);
    assert!(prefix.contains(&leased), "{leased} outside {prefix}");
    let shown = bed
        .ns_output(&l3.ns, "ip", &["-6", "-o", "addr", "show", "dev", "eth0"])
        .unwrap();
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains(&leased.to_string()),
        "dhclient did not configure {leased}"
    );
    ping6(&bed, &h1.host, leased);
    let r = namespace(&bed, &router);
    assert!(r.dhcp_requests >= 2, "{r:?}");

    // The interface member's address, tried on the LAN by hand: defended at DAD time.
    let l2 = bed.add_lan_host(&lan, "l2", "", 1500).unwrap();
    bed.ns(
        &l2.ns,
        "ip",
        &["-6", "addr", "add", &format!("{a1}/64"), "dev", "eth0"],
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = bed
            .ns_output(&l2.ns, "ip", &["-6", "-o", "addr", "show", "dev", "eth0"])
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let line = text.lines().find(|l| l.contains(&a1.to_string()));
        if line.is_some_and(|l| l.contains("dadfailed")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{a1} on l2 was not refused: {text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let r = namespace(&bed, &router);
    assert!(r.dad_defended >= 1, "{r:?}");
    assert!(!r.lan_hosts.contains(&a1.to_string()), "{:?}", r.lan_hosts);
    // The member keeps it, and still reaches the first LAN host.
    ping6(&bed, &h1.host, l1_address);
}

/// An unsolicited neighbour advertisement for the address in `sys.argv[1]` from `eth0`
/// (override set, the link-layer address in it), twice: what a Linux guest sends for each
/// of its addresses when its hypervisor asks it to announce itself after a live
/// migration. The kernel fills in the ICMPv6 checksum of a raw ICMPv6 socket.
const SEND_UNSOLICITED_NA: &str = "\
import socket, sys, time
address = socket.inet_pton(socket.AF_INET6, sys.argv[1])
mac = bytes.fromhex(open('/sys/class/net/eth0/address').read().strip().replace(':', ''))
index = socket.if_nametoindex('eth0')
s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, index)
na = bytes([136, 0, 0, 0, 0x20, 0, 0, 0]) + address + bytes([2, 1]) + mac
for i in range(2):
    s.sendto(na, ('ff02::1', 0, 0, index))
    time.sleep(0.05)
";

/// Router mode, migration: a plain LAN host with only an IPv6 address (formed by SLAAC
/// from router r1's advertisement) moves to router r2's LAN and back, keeping its MAC and
/// address (its veth's bridge end changes bridges, as a live migration moves a guest),
/// and is handed off by that address alone, three ways: (1) the duplicate address probe
/// its kernel sends when the address is configured again, which r2 must not defend (the
/// host left r1's LAN: r1's probes go unanswered), (2) an unsolicited neighbour
/// advertisement (what a guest sends after a live migration), (3) its first packet.
/// After each move the new router holds the address, the old one handed it off, the
/// host's address is not failed, and an interface member reaches it with ping -6.
#[test]
fn a_moved_ipv6_lan_host_is_handed_off_between_routers() {
    require_root();
    let mut bed = Testbed::new("v6mv", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());
    let h1 = start_member(&mut bed, &secret, 1, "");
    let a1 = address6(&bed, &h1);
    let prefix: ipnet::Ipv6Net = namespace(&bed, &h1).subnet6.parse().expect("a prefix");
    let (lan1, r1) = router_at(&mut bed, &secret, "1", 2);
    let (lan2, r2) = router_at(&mut bed, &secret, "2", 3);
    let vm = bed.add_lan_host(&lan1, "vm", "", 1500).unwrap();
    let address = slaac_address(&bed, &vm, prefix);
    let a = address.to_string();
    wait_for(
        "r1 holds the host's address",
        Duration::from_secs(20),
        || namespace(&bed, &r1).addresses6.contains(&a),
    );
    ping6(&bed, &h1.host, address);

    let port = bed.bridge_port(&vm, &lan1).unwrap();
    let sites = [(&lan1, &r1), (&lan2, &r2)];
    for (k, how) in ["duplicate probe", "advertisement", "first packet"]
        .into_iter()
        .enumerate()
    {
        let ((from_lan, from), (to_lan, to)) = (sites[k % 2], sites[(k + 1) % 2]);
        let (before_in, before_out) = (
            namespace(&bed, to).handoffs_in,
            namespace(&bed, from).handoffs_out,
        );
        bed.move_port(&port, from_lan, to_lan).unwrap();
        match how {
            "duplicate probe" => {
                let with_len = format!("{a}/64");
                for verb in ["del", "add"] {
                    bed.ns(
                        &vm.ns,
                        "ip",
                        &["-6", "addr", verb, &with_len, "dev", "eth0"],
                    )
                    .unwrap();
                }
            }
            "advertisement" => {
                let out = bed
                    .ns_output(&vm.ns, "python3", &["-c", SEND_UNSOLICITED_NA, &a])
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            "first packet" => {
                let _ = bed
                    .ns_output(
                        &vm.ns,
                        "ping",
                        &["-6", "-c", "1", "-W", "1", &a1.to_string()],
                    )
                    .unwrap();
            }
            _ => {}
        }
        let took = wait_for(
            &format!("move {k} ({how}): handed over"),
            Duration::from_secs(20),
            || {
                let (f, t) = (namespace(&bed, from), namespace(&bed, to));
                t.handoffs_in > before_in
                    && f.handoffs_out > before_out
                    && t.addresses6.contains(&a)
                    && !f.addresses6.contains(&a)
            },
        );
        eprintln!("move {k} ({how}): handed over after {took:?}");
        let out = bed
            .ns_output(&vm.ns, "ip", &["-6", "-o", "addr", "show", "dev", "eth0"])
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&a) && !text.contains("dadfailed"),
            "move {k} ({how}): {text}"
        );
        ping6(&bed, &h1.host, address);
        ping6(&bed, &vm, a1);
        let t = namespace(&bed, to);
        assert_eq!(t.hosted_conflicts, 0, "move {k} ({how}): {t:?}");
    }
}

/// A DHCPv6 host moved to another router's LAN (its veth's bridge end moved, as a live
/// migration moves a VM) keeps its leased address without sending from it: its renewal
/// reaches the new router, which has no binding for it and asks the old router to hand
/// the address over before it claims it; the renewal is answered with the same address,
/// the old router gives it up without a conflict, and the member reaches the host there.
#[test]
fn a_moved_dhcpv6_host_keeps_its_lease_at_the_new_router() {
    require_root();
    let mut bed = Testbed::new("v6dmv", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());
    let h1 = start_member(&mut bed, &secret, 1, "");
    let prefix: ipnet::Ipv6Net = namespace(&bed, &h1).subnet6.parse().expect("a prefix");
    let (lan1, r1) = router_at(&mut bed, &secret, "1", 2);
    let (lan2, r2) = router_at(&mut bed, &secret, "2", 3);
    let vm = bed.add_lan_host(&lan1, "vm", "", 1500).unwrap();
    let leased = dhclient6(&mut bed, &vm);
    assert!(prefix.contains(&leased), "{leased}");
    let l = leased.to_string();
    wait_for("r1 holds the lease", Duration::from_secs(20), || {
        namespace(&bed, &r1).addresses6.contains(&l)
    });
    ping6(&bed, &h1.host, leased);

    let port = bed.bridge_port(&vm, &lan1).unwrap();
    let (replies, handoffs) = {
        let r = namespace(&bed, &r2);
        (r.dhcp6_replies, r.handoffs_in)
    };
    bed.move_port(&port, &lan1, &lan2).unwrap();
    // Nothing is sent from the address: the renewal (at half the 20 s lease) says it.
    let took = wait_for(
        "r2 answers the renewal and holds the address",
        Duration::from_secs(40),
        || {
            let (a, b) = (namespace(&bed, &r1), namespace(&bed, &r2));
            b.dhcp6_replies > replies && b.addresses6.contains(&l) && !a.addresses6.contains(&l)
        },
    );
    eprintln!("renewed at the new router {took:?} after the move");
    let b = namespace(&bed, &r2);
    assert!(b.handoffs_in > handoffs, "{b:?}");
    assert_eq!(b.hosted_conflicts, 0, "{b:?}");
    let shown = bed
        .ns_output(&vm.ns, "ip", &["-6", "-o", "addr", "show", "dev", "eth0"])
        .unwrap();
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains(&l),
        "the host lost {l}"
    );
    ping6(&bed, &h1.host, leased);
    // A lease's time later the address is still the new router's (the old one gave back
    // nothing when its binding would have ended).
    std::thread::sleep(Duration::from_secs(LEASE_SECS));
    let (a, b) = (namespace(&bed, &r1), namespace(&bed, &r2));
    assert!(
        b.addresses6.contains(&l) && !a.addresses6.contains(&l),
        "{a:?} {b:?}"
    );
    ping6(&bed, &h1.host, leased);
}

/// Waits until `f` holds (`within` at most), then says how long it took.
fn wait_for(what: &str, within: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    start.elapsed()
}

/// A router whose LAN holds more addresses than one announcement carries (64 of each
/// family): one LAN host with 80 IPv4 and 80 IPv6 addresses, as a rack of hosts or
/// dual-stack hosts with several addresses each would be. The router learns and claims
/// them all, the interface member takes all of them as the router's (the lists travel in
/// parts), and a ping from every one of them is answered, none dropped as spoofed.
#[test]
fn a_router_with_more_addresses_than_an_announcement_carries_is_heard_from_all() {
    require_root();
    let mut bed = Testbed::new("v6many", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());
    let h1 = start_member(&mut bed, &secret, 1, "");
    let a1 = address6(&bed, &h1);
    let v1: Ipv4Addr = namespace(&bed, &h1).addresses[0].parse().expect("IPv4");
    let prefix: ipnet::Ipv6Net = namespace(&bed, &h1).subnet6.parse().expect("a prefix");

    let (_, router, l1) = router_site(&mut bed, &secret);

    // 80 free addresses of the subnet: not the member's (auto, anywhere in it), nor the
    // router's own, if it holds one.
    let taken: Vec<String> = namespace(&bed, &h1)
        .addresses
        .into_iter()
        .chain(namespace(&bed, &router).addresses)
        .collect();
    let v4: Vec<String> = (100..250)
        .map(|i| format!("10.203.0.{i}"))
        .filter(|a| !taken.contains(a))
        .take(80)
        .collect();
    let v6: Vec<String> = (0..80u128)
        .map(|i| Ipv6Addr::from(u128::from(prefix.network()) | 0x5000 | i).to_string())
        .collect();
    for a in &v4 {
        bed.ns(
            &l1.ns,
            "ip",
            &["addr", "add", &format!("{a}/24"), "dev", "eth0"],
        )
        .unwrap();
    }
    for a in &v6 {
        let a = format!("{a}/{}", prefix.prefix_len());
        bed.ns(
            &l1.ns,
            "ip",
            &["-6", "addr", "add", &a, "dev", "eth0", "nodad"],
        )
        .unwrap();
    }
    // The router carries the LAN host's traffic to the member both ways (before that,
    // the host's kernel cannot resolve the member's addresses and sends nothing).
    bed.wait_for_ping(&l1, v1, Duration::from_secs(30)).unwrap();
    ping6(&bed, &l1, a1);
    // A ping from each address at once (again from those not learned yet, as a host
    // sends again): the router learns them from the packets.
    let pings = |sources: &[&String]| {
        let mut script: String = sources
            .iter()
            .map(|a| {
                let to = if a.contains(':') {
                    a1.to_string()
                } else {
                    v1.to_string()
                };
                format!("ping -c 1 -W 2 -I {a} {to} >/dev/null 2>&1 &\n")
            })
            .collect();
        script.push_str("wait\n");
        bed.ns_output(&l1.ns, "sh", &["-c", &script]).unwrap();
    };
    let all: Vec<&String> = v4.iter().chain(&v6).collect();
    pings(&all);
    let learned = wait_for("the router learns all 160", Duration::from_secs(60), || {
        let hosts = namespace(&bed, &router).lan_hosts;
        let missing: Vec<&String> = all.iter().copied().filter(|a| !hosts.contains(a)).collect();
        if !missing.is_empty() {
            eprintln!("not yet learned: {missing:?}");
            pings(&missing);
        }
        missing.is_empty()
    });
    let taken = wait_for(
        "the interface member takes all 160 as the router's",
        Duration::from_secs(30),
        || {
            namespace(&bed, &h1)
                .peers
                .iter()
                .any(|p| v4.iter().chain(&v6).all(|a| p.addresses.contains(a)))
        },
    );
    eprintln!("learned in {learned:?}, taken by the member {taken:?} later");
    let spoofed = peer_drops(&bed, &h1, "spoofed_source");
    for a in v4.iter().chain(&v6) {
        let to = if a.contains(':') {
            a1.to_string()
        } else {
            v1.to_string()
        };
        let out = bed
            .ns_output(&l1.ns, "ping", &["-c", "1", "-W", "2", "-I", a, &to])
            .unwrap();
        assert!(
            out.status.success(),
            "{a} -> {to}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    assert_eq!(peer_drops(&bed, &h1, "spoofed_source"), spoofed);
}
