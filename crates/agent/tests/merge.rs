#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::print_stdout)] // prints its figures (run with --nocapture)
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Partitions that merge, end to end: two groups of agents in network namespaces start
//! apart (neither knows the other) and each gives the same static address and the same
//! `auto` address to one of its members. Then an agent that knows one member of each group
//! joins: the two DHTs meet through it, and within a bounded time each address has one
//! owner: the `auto` owner that yields renumbers, the static one that yields reports the
//! conflict in `hyphae status` and `hyphae peers`, and members of both groups ping each
//! other.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyphae_agent::control::NamespaceStatus;
use hyphae_testbed::{join_config, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.204.0.0/24";
const LEASE_SECS: u64 = 8;
/// How long the merged groups get to converge: a correctness deadline, not a timing.
const CONVERGE: Duration = Duration::from_secs(60);

fn underlay(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, 0, i)
}

fn vip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 204, 0, last)
}

struct Member {
    host: Host,
    agent: AgentHandle,
}

/// Host `h{i}` with an agent claiming `address`, bootstrapping from the hosts `boot`; `previous` is
/// written to its state directory first as the address it held last (an `auto` agent
/// claims it first).
fn start(
    bed: &mut Testbed,
    secret: &Path,
    i: u8,
    address: &str,
    boot: &[u8],
    previous: Option<Ipv4Addr>,
) -> Member {
    let host = bed.add_host(&format!("h{i}"), underlay(i)).unwrap();
    if let Some(previous) = previous {
        let state = host.dir.join("state");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(state.join("lab.address"), format!("{previous}\n")).unwrap();
    }
    let mut config = join_config(&host, "lab", secret, SUBNET, address, None, LEASE_SECS);
    if !boot.is_empty() {
        let contacts: Vec<String> = boot
            .iter()
            .map(|&b| format!("\"{}:7400\"", underlay(b)))
            .collect();
        config += &format!("bootstrap = [{}]\n", contacts.join(", "));
    }
    let agent = bed.start_agent(&host, &config).unwrap();
    Member { host, agent }
}

fn ns_status(bed: &Testbed, m: &Member) -> NamespaceStatus {
    bed.namespace_status(&m.host, &m.agent).expect("status")
}

/// The member's owner key (its Ed25519 public key), as the merge rule compares it.
fn owner_key(bed: &Testbed, m: &Member) -> Vec<u8> {
    use base64::Engine as _;
    let id = bed.status(&m.host, &m.agent).unwrap().identity;
    base64::engine::general_purpose::STANDARD
        .decode(id)
        .expect("identity in base64")
}

fn secret(dir: &Path) -> PathBuf {
    let path = dir.join("lab.secret");
    hyphae_testbed::write_secret(&path, "the merge test namespace secret\n").unwrap();
    path
}

/// Waits until `ok` holds for the statuses of `members`; panics with them after `within`.
fn wait_until(
    bed: &Testbed,
    members: &[&Member],
    within: Duration,
    what: &str,
    ok: impl Fn(&[NamespaceStatus]) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let statuses: Vec<NamespaceStatus> = members.iter().map(|m| ns_status(bed, m)).collect();
        if ok(&statuses) {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "{what}: {statuses:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn partitions_that_merge_keep_one_owner_per_address() {
    require_root();
    let mut bed = Testbed::new("merge", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());

    // Two overlays that do not know each other: in each, a static .10 starts it and an
    // `auto` member that held .20 last takes .20 again.
    let h1 = start(&mut bed, &secret, 1, &vip(10).to_string(), &[], None);
    let h2 = start(&mut bed, &secret, 2, "auto", &[1], Some(vip(20)));
    let h3 = start(&mut bed, &secret, 3, &vip(10).to_string(), &[], None);
    let h4 = start(&mut bed, &secret, 4, "auto", &[3], Some(vip(20)));
    for (m, want) in [(&h1, 10), (&h2, 20), (&h3, 10), (&h4, 20)] {
        assert_eq!(bed.claimed_address(&m.host, &m.agent).unwrap(), vip(want));
    }
    for m in [&h1, &h2] {
        assert_eq!(bed.status(&m.host, &m.agent).unwrap().overlay.connected, 1);
    }

    // h5, an agent of another namespace, knows h1 and h3: the two DHTs meet through it
    // (every agent routes Kademlia for anyone), but it is no replica of `lab`'s records.
    // So each key of `lab` has four replicas, two per group, and neither owner of .10 or
    // .20 holds a majority: only the merge rule leaves one owner (without it both yield).
    let joined_at = Instant::now();
    let h5 = {
        let host = bed.add_host("h5", underlay(5)).unwrap();
        let other = bed.dir().join("other.secret");
        hyphae_testbed::write_secret(&other, "another namespace's secret\n").unwrap();
        let mut config = join_config(&host, "other", &other, "10.205.0.0/24", "auto", None, 8);
        config += &format!(
            "bootstrap = [\"{}:7400\", \"{}:7400\"]\n",
            underlay(1),
            underlay(3)
        );
        Member {
            agent: bed.start_agent(&host, &config).unwrap(),
            host,
        }
    };
    let all = [&h1, &h2, &h3, &h4];
    // One owner per address: exactly one of h1, h3 holds .10, exactly one of h2, h4 holds
    // .20 and the other holds another address, and no two members hold one.
    let took = wait_until(&bed, &all, CONVERGE, "one owner per address", |s| {
        let claimed: Vec<&str> = s
            .iter()
            .filter(|n| n.address_claimed)
            .map(|n| n.address.as_str())
            .collect();
        let mut distinct = claimed.clone();
        distinct.sort_unstable();
        distinct.dedup();
        s[0].address_claimed != s[2].address_claimed
            && s[1].address_claimed
            && s[3].address_claimed
            && [&s[1], &s[3]]
                .iter()
                .any(|n| n.address == vip(20).to_string())
            && claimed.len() == 3
            && distinct.len() == 3
    });
    println!(
        "merged to one owner per address {took:.1?} after the first check ({:.1?} after h5 started)",
        joined_at.elapsed()
    );

    // The static member that yielded says so in status, peers and its log; the `auto`
    // one that yielded renumbered and counts it.
    let (keeper, yielder) = if ns_status(&bed, &h1).address_claimed {
        (&h1, &h3)
    } else {
        (&h3, &h1)
    };
    let keeper_id = bed.status(&keeper.host, &keeper.agent).unwrap().identity;
    let s = ns_status(&bed, yielder);
    let error = s.address_error.clone().unwrap_or_default();
    assert!(
        error.contains(&vip(10).to_string()) && error.contains(&keeper_id),
        "the yielder names the keeper {keeper_id}: {s:?}"
    );
    assert!(s.address_conflicts >= 1, "{s:?}");
    let peers = bed
        .ns(
            &yielder.host.ns,
            BIN,
            &["peers", "-c", &yielder.agent.config.display().to_string()],
        )
        .unwrap();
    let peers = String::from_utf8_lossy(&peers.stdout);
    assert!(
        peers.contains("is owned by member") && peers.contains(&keeper_id),
        "{peers}"
    );
    let log = std::fs::read_to_string(&yielder.agent.log).unwrap();
    assert!(
        log.contains("WARN") && log.contains("address conflict"),
        "{log}"
    );
    let (stayed, renumbered) = if ns_status(&bed, &h2).address == vip(20).to_string() {
        (&h2, &h4)
    } else {
        (&h4, &h2)
    };
    assert!(ns_status(&bed, renumbered).address_conflicts >= 1);
    assert_eq!(ns_status(&bed, stayed).address_conflicts, 0);
    // The rule, not the timing, chose: the lower owner key kept each address (without
    // the rule, whichever renewal came second would win).
    assert!(
        owner_key(&bed, keeper) < owner_key(&bed, yielder),
        "the lower key keeps .10"
    );
    assert!(
        owner_key(&bed, stayed) < owner_key(&bed, renumbered),
        "the lower key keeps .20"
    );

    // Members of both groups reach each other: the keeper of .10 from the member that
    // stayed on .20, and .20 and the renumbered member from each other (they were in
    // different groups). The static member that yielded holds no address: its packets
    // (from .10) are someone else's source and are dropped, as spoofed ones are.
    let moved = bed
        .claimed_address(&renumbered.host, &renumbered.agent)
        .unwrap();
    let within = Duration::from_secs(20);
    for (from, to) in [(stayed, moved), (renumbered, vip(20)), (stayed, vip(10))] {
        bed.wait_for_ping(&from.host, to, within)
            .unwrap_or_else(|e| panic!("{} -> {to}: {e}", from.host.name));
    }
    // The agent of the other namespace was a router for `lab`'s DHT, nothing more.
    assert!(bed.is_running(h5.agent.pid));
    assert!(ns_status(&bed, &h5).address_claimed);
}
