#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::print_stdout)] // prints its figures (run with --nocapture)
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End-to-end tests of the overlay: agents that know only a bootstrap address join the
//! namespace, win unique `auto` addresses in the DHT, find each other by virtual address,
//! survive the loss of the bootstrap host, and give a crashed member's address to someone
//! else only after its lease.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyphae_agent::control::Status;
use hyphae_testbed::{join_config, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.202.0.0/24";
const LEASE_SECS: u64 = 8;

fn underlay(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, 0, i)
}

/// IPv4 only: these tests count the records a replica stores (an IPv6 lease per member
/// would count too); IPv6 leases are tested in `ipv6.rs`.
fn config(host: &Host, secret: &Path, address: &str, bootstrap: Option<Ipv4Addr>) -> String {
    join_config(host, "lab", secret, SUBNET, address, bootstrap, LEASE_SECS) + "subnet6 = \"off\"\n"
}

struct Member {
    host: Host,
    agent: AgentHandle,
}

fn status(bed: &Testbed, m: &Member) -> Status {
    bed.status(&m.host, &m.agent).expect("status")
}

fn claimed_address(bed: &Testbed, m: &Member) -> Ipv4Addr {
    bed.claimed_address(&m.host, &m.agent)
        .unwrap_or_else(|e| panic!("{e}: {:?}", bed.status(&m.host, &m.agent)))
}

fn secret(dir: &Path) -> PathBuf {
    let path = dir.join("lab.secret");
    hyphae_testbed::write_secret(&path, "the overlay test namespace secret\n").unwrap();
    path
}

/// Hosts h1..hN with `auto` addresses: h1 starts the overlay, the others bootstrap from it.
/// Host `h{i}` on the underlay, with an agent claiming `address` (bootstrapping from `boot`).
fn start_member(
    bed: &mut Testbed,
    secret: &Path,
    i: u8,
    address: &str,
    boot: Option<Ipv4Addr>,
) -> Member {
    let host = bed.add_host(&format!("h{i}"), underlay(i)).unwrap();
    let agent = bed
        .start_agent(&host, &config(&host, secret, address, boot))
        .unwrap();
    Member { host, agent }
}

fn start_members(bed: &mut Testbed, secret: &Path, n: u8) -> Vec<Member> {
    (1..=n)
        .map(|i| start_member(bed, secret, i, "auto", (i > 1).then(|| underlay(1))))
        .collect()
}

#[test]
fn six_members_join_through_one_bootstrap_and_survive_its_loss() {
    require_root();
    let mut bed = Testbed::new("dht", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());
    let mut members = start_members(&mut bed, &secret, 6);
    let addresses: Vec<Ipv4Addr> = members.iter().map(|m| claimed_address(&bed, m)).collect();
    let unique: HashSet<_> = addresses.iter().collect();
    assert_eq!(unique.len(), 6, "addresses not unique: {addresses:?}");

    // Full mesh: every first packet goes through a DHT lookup and a new tunnel.
    for (i, from) in members.iter().enumerate() {
        for (j, &to) in addresses.iter().enumerate() {
            if i != j {
                bed.wait_for_ping(&from.host, to, Duration::from_secs(10))
                    .unwrap_or_else(|e| panic!("{e}; status: {:?}", status(&bed, from)));
            }
        }
    }
    // Members meet through DHT lookups of the addresses they send to, or earlier through
    // the broadcast group (each member opens a tunnel to every member it reads there):
    // which comes first is a race, but the mesh is whole either way. A packet to an address
    // no tunnel announced always goes through a lookup (here nobody holds it).
    let s = status(&bed, &members[1]);
    assert_eq!(s.namespaces[0].peers.len(), 5, "{s:?}");
    assert!(s.overlay.connected >= 2, "{s:?}");
    let lookups = s.namespaces[0].lookups;
    // .1 is the service address, answered by the agent itself.
    let nobody = (2..=254)
        .map(|h| Ipv4Addr::new(10, 202, 0, h))
        .find(|a| !addresses.contains(a))
        .unwrap();
    let _ = bed.ping(&members[1].host, nobody, 1);
    let s = status(&bed, &members[1]);
    assert!(s.namespaces[0].lookups > lookups, "{s:?}");

    // The bootstrap host dies; the others keep talking, and a newcomer joins through any
    // remaining member and reaches everyone.
    let boot = members.remove(0);
    bed.signal(boot.agent.pid, libc::SIGKILL).unwrap();
    for (i, from) in members.iter().enumerate() {
        let to = addresses[1 + (i + 1) % members.len()];
        bed.wait_for_ping(&from.host, to, Duration::from_secs(10))
            .unwrap();
    }
    let host = bed.add_host("h7", underlay(7)).unwrap();
    let agent = bed
        .start_agent(&host, &config(&host, &secret, "auto", Some(underlay(4))))
        .unwrap();
    let newcomer = Member { host, agent };
    let new_address = claimed_address(&bed, &newcomer);
    assert!(!addresses.contains(&new_address), "{new_address} reused");
    for (i, m) in members.iter().enumerate() {
        bed.wait_for_ping(&newcomer.host, addresses[i + 1], Duration::from_secs(10))
            .unwrap();
        bed.wait_for_ping(&m.host, new_address, Duration::from_secs(10))
            .unwrap();
    }
}

#[test]
fn a_crashed_members_address_is_free_only_after_its_lease() {
    require_root();
    let mut bed = Testbed::new("lease", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());
    let first = start_member(&mut bed, &secret, 1, "10.202.0.10", None);
    let second = start_member(&mut bed, &secret, 2, "auto", Some(underlay(1)));
    let taken = Ipv4Addr::new(10, 202, 0, 10);
    assert_eq!(claimed_address(&bed, &first), taken);
    claimed_address(&bed, &second);
    bed.wait_for_ping(&second.host, taken, Duration::from_secs(10))
        .unwrap();
    // h1 renews as soon as h2 appears, so h2 is a replica of h1's lease too.
    let deadline = Instant::now() + Duration::from_secs(10);
    while status(&bed, &second).overlay.stored_records < 2 {
        assert!(Instant::now() < deadline, "h2 never became a replica");
        std::thread::sleep(Duration::from_millis(100));
    }

    // h1 crashes (no release). A third member asking for its address is refused with the
    // owner's name while the lease runs...
    bed.signal(first.agent.pid, libc::SIGKILL).unwrap();
    let crashed_at = Instant::now();
    let owner = status(&bed, &second).namespaces[0].peers[0]
        .identity
        .clone();
    let h3 = bed.add_host("h3", underlay(3)).unwrap();
    let cfg = config(&h3, &secret, "10.202.0.10", Some(underlay(2)));
    let refused = bed.start_agent(&h3, &cfg);
    let log = match refused {
        Ok(agent) => {
            let deadline = Instant::now() + Duration::from_secs(20);
            while bed.is_running(agent.pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            assert!(
                !bed.is_running(agent.pid),
                "h3 took a leased address: {:?}\n{}",
                bed.status(&h3, &agent),
                std::fs::read_to_string(&agent.log).unwrap_or_default()
            );
            std::fs::read_to_string(&agent.log).unwrap()
        }
        Err(e) => e.to_string(),
    };
    assert!(
        log.contains("is owned by member") && log.contains(&owner),
        "refusal should name the owner {owner}: {log}"
    );
    assert!(
        crashed_at.elapsed() < Duration::from_secs(LEASE_SECS),
        "the refusal came too late to prove anything"
    );

    // ... and granted once it has lapsed; the survivor then reaches the new owner.
    std::thread::sleep(Duration::from_secs(LEASE_SECS).saturating_sub(crashed_at.elapsed()));
    let deadline = Instant::now() + Duration::from_secs(30);
    let third = loop {
        if let Ok(agent) = bed.start_agent(&h3, &cfg) {
            let m = Member {
                host: h3.clone(),
                agent,
            };
            std::thread::sleep(Duration::from_secs(2));
            if bed.is_running(m.agent.pid) {
                break m;
            }
        }
        assert!(Instant::now() < deadline, "address never freed");
        std::thread::sleep(Duration::from_secs(1));
    };
    assert_eq!(claimed_address(&bed, &third), taken);
    bed.wait_for_ping(&second.host, taken, Duration::from_secs(40))
        .unwrap();
}

/// `hyphae peers --json` of an agent: the peers of its only namespace.
fn peers(bed: &Testbed, m: &Member) -> Vec<serde_json::Value> {
    let out = bed
        .ns(
            &m.host.ns,
            BIN,
            &[
                "peers",
                "--json",
                "-c",
                &m.agent.config.display().to_string(),
            ],
        )
        .expect("hyphae peers");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("peers JSON");
    v["namespaces"][0]["peers"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The path `m` reports to the member owning `vip`, and the relay's identity if relayed.
fn path_to(bed: &Testbed, m: &Member, vip: Ipv4Addr) -> Option<(String, Option<String>)> {
    peers(bed, m).iter().find_map(|p| {
        let owns = p["addresses"]
            .as_array()?
            .iter()
            .any(|a| a.as_str() == Some(&vip.to_string()));
        owns.then(|| {
            (
                p["path"].as_str().unwrap_or_default().to_string(),
                p["relay"].as_str().map(str::to_string),
            )
        })
    })
}

/// Waits up to `secs` until member `a` (at virtual address `a.1`) and member `b` report a
/// direct path to each other; panics with `what` and both paths otherwise.
fn wait_direct(
    bed: &Testbed,
    a: (&Member, Ipv4Addr),
    b: (&Member, Ipv4Addr),
    secs: u64,
    what: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let direct =
        |p: &Option<(String, Option<String>)>| p.as_ref().map(|p| p.0.as_str()) == Some("direct");
    loop {
        let (pa, pb) = (path_to(bed, a.0, b.1), path_to(bed, b.0, a.1));
        if direct(&pa) && direct(&pb) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {pa:?}, {pb:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Drops every UDP datagram between this host and `other` (both ways), with nftables
/// inside the host's namespace.
fn block_udp(bed: &Testbed, host: &Host, other: Ipv4Addr) {
    let o = other.to_string();
    let rules = format!(
        "table inet hyphae_test {{\n chain in {{ type filter hook input priority 0; ip saddr {o} udp dport 0-65535 drop; }}\n chain out {{ type filter hook output priority 0; ip daddr {o} udp dport 0-65535 drop; }}\n}}\n"
    );
    let file = host.dir.join("block.nft");
    std::fs::write(&file, rules).unwrap();
    bed.ns(&host.ns, "nft", &["-f", &file.display().to_string()])
        .expect("nft");
}

fn unblock_udp(bed: &Testbed, host: &Host) {
    bed.ns(&host.ns, "nft", &["delete", "table", "inet", "hyphae_test"])
        .expect("nft delete");
}

/// Two members whose direct UDP is dropped by nftables in both their namespaces reach each
/// other through the bootstrap member, and `hyphae peers` names the relay; once the rules
/// are gone the path turns direct again.
#[test]
fn blocked_members_are_relayed_then_go_direct() {
    require_root();
    let mut bed = Testbed::new("relay", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());
    let members = start_members(&mut bed, &secret, 3);
    block_udp(&bed, &members[1].host, underlay(3));
    block_udp(&bed, &members[2].host, underlay(2));
    let relay_id = status(&bed, &members[0]).identity;
    let a2 = claimed_address(&bed, &members[1]);
    let a3 = claimed_address(&bed, &members[2]);

    bed.wait_for_ping(&members[1].host, a3, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}; h2: {:?}", status(&bed, &members[1])));
    bed.wait_for_ping(&members[2].host, a2, Duration::from_secs(10))
        .unwrap();
    assert_eq!(
        path_to(&bed, &members[1], a3),
        Some(("relayed".to_string(), Some(relay_id.clone()))),
        "h2's peers: {:?}",
        peers(&bed, &members[1])
    );
    assert_eq!(
        path_to(&bed, &members[2], a2),
        Some(("relayed".to_string(), Some(relay_id))),
    );
    let relayed = status(&bed, &members[0]).relay;
    assert!(relayed.sessions >= 1 && relayed.packets > 0, "{relayed:?}");
    let text = bed
        .ns(
            &members[1].host.ns,
            BIN,
            &[
                "peers",
                "-c",
                &members[1].agent.config.display().to_string(),
            ],
        )
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    assert!(text.contains("relayed via"), "{text}");

    unblock_udp(&bed, &members[1].host);
    unblock_udp(&bed, &members[2].host);
    wait_direct(
        &bed,
        (&members[1], a2),
        (&members[2], a3),
        10,
        "never went direct",
    );
    // Traffic now bypasses the relay.
    let before = status(&bed, &members[0]).relay.packets;
    bed.ns(
        &members[1].host.ns,
        "ping",
        &["-c", "5", "-i", "0.2", "-W", "2", &a3.to_string()],
    )
    .unwrap();
    let after = status(&bed, &members[0]).relay.packets;
    assert!(
        after - before < 5,
        "pings still relayed: {before} -> {after}"
    );
}

/// The endpoint `m` sends to for the member owning `vip`.
fn endpoint_of(bed: &Testbed, m: &Member, vip: Ipv4Addr) -> Option<String> {
    peers(bed, m).iter().find_map(|p| {
        p["addresses"]
            .as_array()?
            .iter()
            .any(|a| a.as_str() == Some(&vip.to_string()))
            .then(|| p["endpoint"].as_str().unwrap_or_default().to_string())
    })
}

/// Two members each behind their own NAT router (masquerade; unsolicited inbound dropped,
/// as a home router does) join through a public member. Neither can reach the other's
/// private address, and neither NAT lets the other in unasked. Their control planes still
/// connect, through the public member's libp2p relay (where each holds a reservation);
/// their tunnels start relayed through it, then go direct through both NATs, because both
/// ends probe the public mapping the relay observed for the other.
#[test]
fn members_behind_two_nats_connect_and_punch_through() {
    require_root();
    let mut bed = Testbed::new("nat", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());
    let h1 = bed.add_host("h1", underlay(1)).unwrap();
    let agent = bed
        .start_agent(&h1, &config(&h1, &secret, "auto", None))
        .unwrap();
    let public = Member { host: h1, agent };
    let natted: Vec<Member> = [2u8, 3]
        .into_iter()
        .map(|i| {
            let host = bed
                .add_host_behind_nat(&format!("h{i}"), underlay(i), i)
                .unwrap();
            let agent = bed
                .start_agent(&host, &config(&host, &secret, "auto", Some(underlay(1))))
                .unwrap();
            Member { host, agent }
        })
        .collect();
    let relay = status(&bed, &public);
    let a2 = claimed_address(&bed, &natted[0]);
    let a3 = claimed_address(&bed, &natted[1]);

    // Control plane: each holds a reservation at the public member, and the two are
    // connected to each other, which only a relayed circuit can have started; dcutr then
    // punches a direct TCP connection through both NATs.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (s2, s3) = (status(&bed, &natted[0]), status(&bed, &natted[1]));
        let reserved = [&s2, &s3]
            .iter()
            .all(|s| s.overlay.relays.contains(&relay.overlay.peer_id));
        let punched = s2.overlay.hole_punches + s3.overlay.hole_punches >= 1;
        if reserved && punched && s2.overlay.connected == 2 && s3.overlay.connected == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "control planes not connected: h2 {:?}, h3 {:?}",
            s2.overlay,
            s3.overlay
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let circuits = status(&bed, &public).overlay.circuits_relayed;
    assert!(circuits >= 1, "the public member relayed no circuit");

    // Data plane: the first packets go through the relay, then both ends punch through.
    bed.wait_for_ping(&natted[0].host, a3, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}; h2: {:?}", status(&bed, &natted[0])));
    bed.wait_for_ping(&natted[1].host, a2, Duration::from_secs(10))
        .unwrap();
    wait_direct(
        &bed,
        (&natted[0], a2),
        (&natted[1], a3),
        15,
        "never punched through",
    );
    // Direct means to the other NAT's public address, not the private one.
    assert_eq!(
        endpoint_of(&bed, &natted[0], a3).as_deref(),
        Some(format!("{}:7400", underlay(3)).as_str())
    );
    assert_eq!(
        endpoint_of(&bed, &natted[1], a2).as_deref(),
        Some(format!("{}:7400", underlay(2)).as_str())
    );
    let before = status(&bed, &public).relay.packets;
    bed.ns(
        &natted[0].host.ns,
        "ping",
        &["-c", "5", "-i", "0.2", "-W", "2", &a3.to_string()],
    )
    .unwrap();
    let after = status(&bed, &public).relay.packets;
    assert!(
        after - before < 5,
        "pings still relayed: {before} -> {after}"
    );
    let (s2, s3) = (status(&bed, &natted[0]), status(&bed, &natted[1]));
    println!(
        "nat: {circuits} circuits relayed; dcutr: h2 {} punched / {} failed, h3 {} / {}",
        s2.overlay.hole_punches,
        s2.overlay.hole_punch_failures,
        s3.overlay.hole_punches,
        s3.overlay.hole_punch_failures
    );
}

/// With `mdns = true`, members on one LAN need no bootstrap address: the second agent
/// finds the first by mDNS, joins its overlay rather than starting one, takes the subnet
/// from the namespace record (its config names none) and reaches the first member.
#[test]
fn members_on_a_lan_find_each_other_by_mdns() {
    require_root();
    let mut bed = Testbed::new("mdns", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());
    let mut members = Vec::new();
    for i in 1..=2u8 {
        let host = bed.add_host(&format!("h{i}"), underlay(i)).unwrap();
        let mut c =
            config(&host, &secret, "auto", None).replace("[agent]\n", "[agent]\nmdns = true\n");
        if i == 2 {
            c = c.replace(&format!("subnet = \"{SUBNET}\"\n"), "");
            assert!(!c.contains("subnet =") && !c.contains("bootstrap"), "{c}");
        }
        let agent = bed.start_agent(&host, &c).unwrap();
        members.push(Member { host, agent });
    }
    let a1 = claimed_address(&bed, &members[0]);
    let a2 = claimed_address(&bed, &members[1]);
    let subnet: ipnet::Ipv4Net = SUBNET.parse().unwrap();
    assert!(subnet.contains(&a2) && a1 != a2, "{a1} {a2}");
    bed.wait_for_ping(&members[1].host, a1, Duration::from_secs(15))
        .unwrap();
    let found: u64 = members
        .iter()
        .map(|m| status(&bed, m).overlay.mdns_discovered)
        .sum();
    assert!(found >= 1, "nobody was found by mDNS");
}

/// Runs `hyphae ARGS -c CONFIG` inside a host: (success, stdout + stderr). An agent the
/// command started is killed with the testbed.
fn cli(bed: &mut Testbed, host: &Host, args: &[&str], config: &Path) -> (bool, String) {
    let mut full: Vec<&str> = args.to_vec();
    let c = config.display().to_string();
    full.extend_from_slice(&["-c", &c]);
    let out = bed.ns_output(&host.ns, BIN, &full).unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if let Some(pid) = text
        .split("(pid ")
        .nth(1)
        .and_then(|t| t.split(')').next())
        .and_then(|p| p.parse().ok())
    {
        bed.adopt(pid);
    }
    (out.status.success(), text)
}

/// The address in "joined 'lab': address A on DEV".
fn joined_address(text: &str) -> Ipv4Addr {
    let after = text
        .split("address ")
        .nth(1)
        .unwrap_or_else(|| panic!("no address in: {text}"));
    after.split_whitespace().next().unwrap().parse().unwrap()
}

/// `hyphae join` with no subnet takes the namespace's from its signed record, in a running
/// agent or by starting one; a join whose subnet contradicts the record is refused naming
/// the record's keeper and leaves the config as it was; `hyphae leave` releases the address
/// (another member can take it at once) and removes the device and the config section.
#[test]
fn join_and_leave_with_the_cli() {
    require_root();
    let mut bed = Testbed::new("join", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());
    let secret_arg = secret.display().to_string();
    let h1 = bed.add_host("h1", underlay(1)).unwrap();
    let a1 = bed
        .start_agent(&h1, &config(&h1, &secret, "auto", None))
        .unwrap();
    let first = Member {
        host: h1,
        agent: a1,
    };
    let first_address = claimed_address(&bed, &first);
    let keeper = status(&bed, &first).identity;
    let boot = underlay(1).to_string();

    // h2 runs an agent with no namespace; `join` adds one to it.
    let h2 = bed.add_host("h2", underlay(2)).unwrap();
    let a2 = bed
        .start_agent(&h2, &hyphae_testbed::agent_section(&h2))
        .unwrap();
    let join_args = [
        "join",
        "lab",
        "--secret-file",
        &secret_arg,
        "--bootstrap",
        &boot,
    ];
    let (ok, text) = cli(&mut bed, &h2, &join_args, &a2.config);
    assert!(ok, "{text}");
    let second_address = joined_address(&text);
    assert!(
        "10.202.0.0/24"
            .parse::<ipnet::Ipv4Net>()
            .unwrap()
            .contains(&second_address),
        "subnet not taken from the namespace record: {text}"
    );
    let second = Member {
        host: h2.clone(),
        agent: a2,
    };
    assert_eq!(status(&bed, &second).namespaces[0].subnet, SUBNET);
    bed.wait_for_ping(&second.host, first_address, Duration::from_secs(10))
        .unwrap();
    let (ok, text) = cli(&mut bed, &h2, &["peers"], &second.agent.config);
    assert!(ok && text.contains(&first_address.to_string()), "{text}");
    let (ok, text) = cli(&mut bed, &h2, &join_args, &second.agent.config);
    assert!(!ok && text.contains("already in"), "{text}");

    // h3 has no agent: a join with the wrong subnet starts one, which is refused.
    let h3 = bed.add_host("h3", underlay(3)).unwrap();
    let c3 = h3.dir.join("hyphae.toml");
    std::fs::write(&c3, hyphae_testbed::agent_section(&h3)).unwrap();
    let mut wrong = join_args.to_vec();
    wrong.extend_from_slice(&["--subnet", "10.99.0.0/24"]);
    let (ok, text) = cli(&mut bed, &h3, &wrong, &c3);
    assert!(!ok, "{text}");
    assert!(
        text.contains("its subnet is 10.202.0.0/24") && text.contains(&keeper),
        "refusal should give the namespace's subnet and keeper: {text}"
    );
    let kept = std::fs::read_to_string(&c3).unwrap();
    assert!(
        !kept.contains("[[namespace]]"),
        "config not restored: {kept}"
    );

    // h2 leaves: its device goes and its address is free at once, for h3 to take.
    let (ok, text) = cli(&mut bed, &h2, &["leave", "lab"], &second.agent.config);
    assert!(ok && text.contains("left 'lab'"), "{text}");
    assert!(
        bed.ns(&h2.ns, "ip", &["link", "show", "hyphae0"]).is_err(),
        "device still there"
    );
    let left = std::fs::read_to_string(&second.agent.config).unwrap();
    assert!(!left.contains("[[namespace]]"), "{left}");
    assert!(status(&bed, &second).namespaces.is_empty());

    let taken = second_address.to_string();
    let mut static_join = join_args.to_vec();
    static_join.extend_from_slice(&["--address", &taken]);
    let (ok, text) = cli(&mut bed, &h3, &static_join, &c3);
    assert!(ok, "{text}");
    assert_eq!(joined_address(&text), second_address, "{text}");
    bed.wait_for_ping(&first.host, second_address, Duration::from_secs(20))
        .unwrap();
}

/// Waits (up to `within`) for an agent to exit; returns its log. Panics if it still runs.
fn exit_log(bed: &mut Testbed, host: &Host, agent: &AgentHandle, within: Duration) -> String {
    let deadline = Instant::now() + within;
    while bed.is_running(agent.pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !bed.is_running(agent.pid),
        "{} still runs: {:?}\n{}",
        host.name,
        bed.status(host, agent),
        std::fs::read_to_string(&agent.log).unwrap_or_default()
    );
    std::fs::read_to_string(&agent.log).unwrap()
}

/// Agents that list only each other as `[[namespace.peer]]` (no `bootstrap`) join one DHT:
/// with different static addresses they reach each other, and of two with the same static
/// address the second is refused, naming the first.
#[test]
fn static_peers_share_one_dht() {
    require_root();
    let mut bed = Testbed::new("static", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());
    let vip = |i: u8| Ipv4Addr::new(10, 202, 0, 10 + i);
    let hosts: Vec<Host> = (1..=4)
        .map(|i| bed.add_host(&format!("h{i}"), underlay(i)).unwrap())
        .collect();
    let static_config = |me: usize, address: Ipv4Addr, peer: usize| {
        hyphae_testbed::agent_config(
            &hosts[me],
            "lab",
            &secret,
            SUBNET,
            address,
            &[hosts[peer].underlay],
        )
    };

    // h1 and h2, different addresses: one DHT (each connected to the other), pings pass.
    let a1 = bed
        .start_agent(&hosts[0], &static_config(0, vip(1), 1))
        .unwrap();
    let a2 = bed
        .start_agent(&hosts[1], &static_config(1, vip(2), 0))
        .unwrap();
    let first = Member {
        host: hosts[0].clone(),
        agent: a1,
    };
    let second = Member {
        host: hosts[1].clone(),
        agent: a2,
    };
    assert_eq!(claimed_address(&bed, &first), vip(1));
    assert_eq!(claimed_address(&bed, &second), vip(2));
    bed.wait_for_ping(&first.host, vip(2), Duration::from_secs(10))
        .unwrap();
    bed.wait_for_ping(&second.host, vip(1), Duration::from_secs(10))
        .unwrap();
    for m in [&first, &second] {
        let s = status(&bed, m);
        assert!(s.overlay.joined && s.overlay.connected >= 1, "{s:?}");
    }

    // h3 and h4 list each other with the same address: h3 (first) holds it, h4 is refused
    // with h3's name.
    let a3 = bed
        .start_agent(&hosts[2], &static_config(2, vip(30), 3))
        .unwrap();
    let third = Member {
        host: hosts[2].clone(),
        agent: a3,
    };
    assert_eq!(claimed_address(&bed, &third), vip(30));
    let owner = status(&bed, &third).identity;
    let log = match bed.start_agent(&hosts[3], &static_config(3, vip(30), 2)) {
        Ok(agent) => exit_log(&mut bed, &hosts[3], &agent, Duration::from_secs(20)),
        Err(e) => e.to_string(),
    };
    assert!(
        log.contains("is owned by member") && log.contains(&owner),
        "refusal should name the owner {owner}: {log}"
    );
    assert!(bed.is_running(third.agent.pid), "the owner h3 stopped");
    assert_eq!(claimed_address(&bed, &third), vip(30));
}

/// The first member (no bootstrap) is killed (no goodbye) and restarted: it contacts the
/// members it remembers, they start fresh tunnels with it at once, and pings pass again
/// within seconds rather than after their old tunnels time out.
#[test]
fn a_restarted_first_member_is_reachable_again_quickly() {
    require_root();
    let mut bed = Testbed::new("restart", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());
    let first = start_member(&mut bed, &secret, 1, "10.202.0.10", None);
    let (h1, cfg1) = (
        first.host.clone(),
        config(&first.host, &secret, "10.202.0.10", None),
    );
    let second = start_member(&mut bed, &secret, 2, "auto", Some(underlay(1)));
    // h3 joins through h2: h1 is nothing it was configured with, only a tunnel.
    let third = start_member(&mut bed, &secret, 3, "auto", Some(underlay(2)));
    let taken = claimed_address(&bed, &first);
    let other = claimed_address(&bed, &second);
    claimed_address(&bed, &third);
    for from in [&second, &third] {
        bed.wait_for_ping(&from.host, taken, Duration::from_secs(10))
            .unwrap();
    }
    bed.wait_for_ping(&first.host, other, Duration::from_secs(10))
        .unwrap();
    let members = h1.dir.join("state").join("lab.members");
    let deadline = Instant::now() + Duration::from_secs(10);
    let knows_all = |t: String| [2, 3].iter().all(|&i| t.contains(&underlay(i).to_string()));
    while !std::fs::read_to_string(&members).is_ok_and(knows_all) {
        assert!(Instant::now() < deadline, "h1 never wrote down its members");
        std::thread::sleep(Duration::from_millis(100));
    }

    bed.signal(first.agent.pid, libc::SIGKILL).unwrap();
    let restarted_at = Instant::now();
    let again = bed.start_agent(&h1, &cfg1).unwrap();
    let first = Member {
        host: h1,
        agent: again,
    };
    bed.wait_for_ping(&second.host, taken, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}; status: {:?}", status(&bed, &second)));
    let to_first = restarted_at.elapsed();
    bed.wait_for_ping(&first.host, other, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}; status: {:?}", status(&bed, &first)));
    let from_first = restarted_at.elapsed();
    bed.wait_for_ping(&third.host, taken, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}; status: {:?}", status(&bed, &third)));
    let from_third = restarted_at.elapsed();
    println!(
        "restart of the first member: h2 -> h1 pings again after {to_first:?}, h1 -> h2 after \
         {from_first:?}, h3 (no configured link to h1) -> h1 after {from_third:?}"
    );
}
