#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::print_stdout)] // prints its figures (run with --nocapture)
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Departures: a member that stops without `hyphae leave` (kill -9) drops out of every
//! other member's group and peer list within 30 s, at the default 10-minute lease, while
//! members that stay are never dropped on an underlay that loses 1% of its packets.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use hyphae_testbed::{join_config, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.214.0.0/24";
/// The agent's default lease: how soon a member drops out must not depend on it.
const LEASE_SECS: u64 = 600;
const MEMBERS: u8 = 4;

struct Member {
    host: Host,
    agent: AgentHandle,
    identity: String,
}

fn underlay(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, 0, i)
}

/// What `m` knows of the others: the group as last read and the members it has tunnels
/// with (`None` while its status cannot be read).
fn view(bed: &Testbed, m: &Member) -> Option<(usize, BTreeSet<String>)> {
    let ns = bed.namespace_status(&m.host, &m.agent).ok()?;
    let peers = ns.peers.into_iter().map(|p| p.identity).collect();
    Some((ns.group_members, peers))
}

/// Whether every one of `members` sees exactly the others as group and tunnels.
fn all_see_each_other(bed: &Testbed, members: &[Member]) -> bool {
    members.iter().all(|m| {
        let others: BTreeSet<String> = members
            .iter()
            .filter(|o| o.identity != m.identity)
            .map(|o| o.identity.clone())
            .collect();
        view(bed, m).is_some_and(|(group, peers)| group == others.len() && peers == others)
    })
}

/// Polls `members` for `period`: none of them may lose another from its group or its
/// tunnels (a false removal).
fn watch_for_false_removals(bed: &Testbed, members: &[Member], period: Duration) {
    let until = Instant::now() + period;
    while Instant::now() < until {
        for m in members {
            let Some((group, peers)) = view(bed, m) else {
                continue;
            };
            for o in members.iter().filter(|o| o.identity != m.identity) {
                assert!(
                    peers.contains(&o.identity),
                    "{} lost its tunnel with live member {}: {peers:?}",
                    m.host.name,
                    o.host.name
                );
            }
            assert_eq!(
                group,
                members.len() - 1,
                "{} lost a live member from its group",
                m.host.name
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn a_member_that_stops_without_leaving_is_dropped_within_30_s_and_none_falsely_under_loss() {
    require_root();
    let mut bed = Testbed::new("dep", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "the departures test namespace secret\n").unwrap();
    let mut members = Vec::new();
    for i in 1..=MEMBERS {
        let host = bed.add_host(&format!("h{i}"), underlay(i)).unwrap();
        // Every packet a host sends has a 1% chance to be lost (a round trip about 2%).
        for rule in [
            &["add", "table", "inet", "loss"][..],
            &[
                "add",
                "chain",
                "inet",
                "loss",
                "out",
                "{ type filter hook output priority 0; }",
            ],
            &[
                "add", "rule", "inet", "loss", "out", "oifname", "eth0", "numgen", "random", "mod",
                "100", "<", "1", "drop",
            ],
        ] {
            bed.ns(&host.ns, "nft", rule).unwrap();
        }
        let boot = (i > 1).then(|| underlay(1));
        let config = join_config(&host, "lab", &secret, SUBNET, "auto", boot, LEASE_SECS);
        let agent = bed.start_agent(&host, &config).unwrap();
        let identity = bed.status(&host, &agent).unwrap().identity;
        members.push(Member {
            host,
            agent,
            identity,
        });
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !all_see_each_other(&bed, &members) {
        assert!(
            Instant::now() < deadline,
            "the members never all saw each other: {:?}",
            members.iter().map(|m| view(&bed, m)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    // Several heartbeats and group reads under loss: nobody live is dropped.
    watch_for_false_removals(&bed, &members, Duration::from_secs(40));

    // The last member is killed: no `leave`, no release.
    let gone = members.pop().unwrap();
    bed.signal(gone.agent.pid, libc::SIGKILL).unwrap();
    let killed = Instant::now();
    let mut dropped_after = vec![None; members.len()];
    while dropped_after.iter().any(Option::is_none) {
        assert!(
            killed.elapsed() < Duration::from_secs(35),
            "the killed member is still listed after {:?}: {:?}",
            killed.elapsed(),
            members.iter().map(|m| view(&bed, m)).collect::<Vec<_>>()
        );
        for (m, after) in members.iter().zip(&mut dropped_after) {
            if after.is_some() {
                continue;
            }
            if view(&bed, m).is_some_and(|(group, peers)| {
                group == members.len() - 1 && !peers.contains(&gone.identity)
            }) {
                *after = Some(killed.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    println!("killed member dropped from group and tunnels after: {dropped_after:?}");
    // It stays dropped, and the survivors keep each other.
    watch_for_false_removals(&bed, &members, Duration::from_secs(15));
    assert!(members
        .iter()
        .all(|m| view(&bed, m).is_some_and(|(_, peers)| !peers.contains(&gone.identity))));
    // The heartbeats went to the replicas a lookup had found, without a lookup each.
    for m in &members {
        let saved = bed
            .status(&m.host, &m.agent)
            .unwrap()
            .overlay
            .group_lookups_saved;
        assert!(
            saved > 0,
            "{}: every group operation looked up",
            m.host.name
        );
    }
}
