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
use hyphae_testbed::{join_config, require_root, AgentHandle, Host, Testbed};

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
fn ping6(bed: &Testbed, from: &Member, to: Ipv6Addr) {
    let to = to.to_string();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let out = bed
            .ns_output(&from.host.ns, "ping", &["-6", "-c", "1", "-W", "1", &to])
            .unwrap();
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} never reached {to}: {}",
            from.host.name,
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let out = bed
        .ns_output(&from.host.ns, "ping", &["-6", "-c", "3", "-W", "2", &to])
        .unwrap();
    assert!(
        out.status.success(),
        "{} -> {to}: {}",
        from.host.name,
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `dig +short` at the namespace's service address from `m`: the answer once there is one
/// (10 s at most: names are read from the DHT).
fn dig(bed: &Testbed, m: &Member, args: &[&str]) -> String {
    let server = "@10.203.0.1";
    let mut all = vec![server, "+short", "+time=1", "+tries=1"];
    all.extend_from_slice(args);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = bed.ns_output(&m.host.ns, "dig", &all).unwrap();
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !text.is_empty() && !text.starts_with(';') {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "dig {args:?} from {}: {text}",
            m.host.name
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
                ping6(&bed, from, *to);
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
    ping6(&bed, &h2, a1);
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
    ping6(&bed, &h2, a1);
}
