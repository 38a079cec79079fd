#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::print_stdout)] // prints its figures (run with --nocapture)
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A partition cut while running, end to end: five agents of one namespace in network
//! namespaces are cut into a group of three and a group of two with nftables rules (every
//! packet between the groups' underlay addresses dropped, in both directions). While cut, a
//! newcomer on each side joins and must get an address from the members it can reach: one
//! at the moment of the cut, the other once its side has noticed the cut (closed its
//! silent connections and taken the peers across out of its routing table, so that it no
//! longer hands them out). Once the cut is healed, the groups converge to one owner per
//! address (the merge rule), the members connect across again (the peers they took out are
//! dialled every few seconds) and everyone pings everyone. Meanwhile the newcomers hold off
//! the peers they failed to dial (`overlay::swarm::liveness`).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyphae_agent::control::{NamespaceStatus, OverlayStatus};
use hyphae_testbed::{join_config, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.206.0.0/24";
const LEASE_SECS: u64 = 60;
/// Correctness deadlines, not timings.
const CLAIM: Duration = Duration::from_secs(90);
const CONVERGE: Duration = Duration::from_secs(60);

fn underlay(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, 0, i)
}

struct Member {
    i: u8,
    host: Host,
    agent: AgentHandle,
    /// When its agent was started.
    started: Instant,
}

/// Host `h{i}` with an `auto` agent bootstrapping from the hosts `boot`, cut from the hosts
/// `cut_from` before it starts.
fn start(bed: &mut Testbed, secret: &Path, i: u8, boot: &[u8], cut_from: &[u8]) -> Member {
    let host = bed.add_host(&format!("h{i}"), underlay(i)).unwrap();
    if !cut_from.is_empty() {
        cut(bed, &host, cut_from);
    }
    let mut config = join_config(&host, "lab", secret, SUBNET, "auto", None, LEASE_SECS);
    if !boot.is_empty() {
        let contacts: Vec<String> = boot
            .iter()
            .map(|&b| format!("\"{}:7400\"", underlay(b)))
            .collect();
        config += &format!("bootstrap = [{}]\n", contacts.join(", "));
    }
    let started = Instant::now();
    let agent = bed.start_agent(&host, &config).unwrap();
    Member {
        i,
        host,
        agent,
        started,
    }
}

fn ns_status(bed: &Testbed, m: &Member) -> NamespaceStatus {
    bed.namespace_status(&m.host, &m.agent).expect("status")
}

/// Waits until `m` holds an address; returns it and how long after its start that was.
fn claimed_within(bed: &Testbed, m: &Member, within: Duration) -> (Ipv4Addr, Duration) {
    loop {
        let s = ns_status(bed, m);
        if s.address_claimed {
            return (s.address.parse().unwrap(), m.started.elapsed());
        }
        assert!(
            m.started.elapsed() < within,
            "h{} holds no address after {within:?}: {s:?}",
            m.i
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Drops every packet between `host` and the hosts `others`, both ways.
fn cut(bed: &Testbed, host: &Host, others: &[u8]) {
    let others: Vec<Ipv4Addr> = others.iter().map(|&o| underlay(o)).collect();
    bed.cut(host, &others).unwrap();
}

fn heal(bed: &Testbed, host: &Host) {
    bed.heal(host).unwrap();
}

/// Waits until the counter `of` `m`'s overlay status is above zero; returns it.
fn wait_for_count(bed: &Testbed, m: &Member, of: impl Fn(&OverlayStatus) -> u64) -> u64 {
    let start = Instant::now();
    loop {
        let count = of(&bed.status(&m.host, &m.agent).expect("status").overlay);
        if count > 0 {
            return count;
        }
        assert!(start.elapsed() < CONVERGE, "h{}: the counter stayed 0", m.i);
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn secret(dir: &Path) -> PathBuf {
    let path = dir.join("lab.secret");
    hyphae_testbed::write_secret(&path, "the cut test namespace secret\n").unwrap();
    path
}

#[test]
fn newcomers_get_addresses_while_cut_and_the_groups_converge_after() {
    require_root();
    let mut bed = Testbed::new("cut", Path::new(BIN)).expect("testbed");
    let secret = secret(bed.dir());

    let mut members = vec![start(&mut bed, &secret, 1, &[], &[])];
    for i in 2..=5 {
        members.push(start(&mut bed, &secret, i, &[1, 4], &[]));
    }
    for m in &members {
        claimed_within(&bed, m, CLAIM);
    }

    // Cut {h1, h2, h3} from {h4, h5}; the newcomers h6 and h7 join one side each.
    // (Network namespaces are deleted with the testbed, their rules with them, also when
    // the test fails.)
    let (big, small) = ([1, 2, 3, 6], [4, 5, 7]);
    for m in &members {
        let others: &[u8] = if big.contains(&m.i) { &small } else { &big };
        cut(&bed, &m.host, others);
    }
    let cut_at = Instant::now();

    // A newcomer on each side, knowing only members of its own side: on the side of three
    // at once, on the side of two once h4 and h5 have taken the peers across the cut out
    // of their routing tables.
    let h6 = start(&mut bed, &secret, 6, &[1, 2], &small);
    let (a6, t6) = claimed_within(&bed, &h6, CLAIM);
    println!("while cut: the newcomer on the side of three, started with the cut, holds {a6} {t6:.1?} after its start");
    let noticed: Vec<u64> = members[3..]
        .iter()
        .map(|m| wait_for_count(&bed, m, |o| o.unreachable_dropped))
        .collect();
    println!(
        "h4 and h5 took {noticed:?} peers out of their routing tables, {:.1?} after the cut",
        cut_at.elapsed()
    );
    let h7 = start(&mut bed, &secret, 7, &[4, 5], &big);
    let (a7, t7) = claimed_within(&bed, &h7, CLAIM);
    println!("while cut: the newcomer on the side of two, started after that, holds {a7} {t7:.1?} after its start");
    // The members closed their connections across the cut once they fell silent, and the
    // newcomer at the cut held off the peers it could not dial (so later lookups did not
    // wait).
    let h1 = &members[0];
    let silent = wait_for_count(&bed, h1, |o| o.silent_connections_closed);
    let held_off = wait_for_count(&bed, &h6, |o| o.dials_held_off);
    println!("h1 closed {silent} silent connections; h6 held off {held_off} dials");

    // Heal: one owner per address among all seven, then pings across.
    for m in members.iter().chain([&h6, &h7]) {
        heal(&bed, &m.host);
    }
    let healed = Instant::now();
    let all: Vec<&Member> = members.iter().chain([&h6, &h7]).collect();
    loop {
        let statuses: Vec<NamespaceStatus> = all.iter().map(|m| ns_status(&bed, m)).collect();
        let mut held: Vec<&str> = statuses
            .iter()
            .filter(|s| s.address_claimed)
            .map(|s| s.address.as_str())
            .collect();
        let claimed = held.len();
        held.sort_unstable();
        held.dedup();
        if claimed == all.len() && held.len() == all.len() {
            break;
        }
        assert!(
            healed.elapsed() < CONVERGE,
            "no single owner per address after healing: {statuses:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    println!(
        "healed: one owner per address after {:.1?}",
        healed.elapsed()
    );
    // The peers taken out of the routing tables are dialled again: h1 (whose only contacts
    // across were those) is connected to all six others again.
    loop {
        let overlay = bed.status(&h1.host, &h1.agent).expect("status").overlay;
        if overlay.connected >= all.len() - 1 && overlay.unreachable_waiting == 0 {
            println!(
                "healed: h1 connected to all {} others again after {:.1?}",
                overlay.connected,
                healed.elapsed()
            );
            break;
        }
        assert!(
            healed.elapsed() < CONVERGE,
            "h1 did not connect across the healed cut again: {overlay:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    for m in [&members[3], &h6, &h7] {
        let to: Ipv4Addr = ns_status(&bed, m).address.parse().unwrap();
        bed.wait_for_ping(&h1.host, to, CONVERGE)
            .unwrap_or_else(|e| panic!("h1 cannot reach h{} at {to}: {e}", m.i));
    }
}
