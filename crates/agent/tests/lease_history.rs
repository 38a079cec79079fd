#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::print_stdout)] // prints its figures (run with --nocapture)
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 33, item 5, with real agents: six agents of one namespace in network namespaces
//! (`auto` addresses in a /28, so that their first picks collide, 15 s leases) log every lease decision they make as replicas and as
//! owners (`HYPHAE_LOG=info,hyphae::lease=debug`) while the test kills two of them with
//! SIGKILL and restarts them, and cuts the underlay in two with nftables for 10 s (a
//! declared partition). Then `hyphae_testbed::history` checks the merged record offline:
//! no key (address, name, namespace record) ever had two holders outside the partition,
//! no replica ignored a release it acknowledged or gave away a running lease, and no live
//! owner gave a key up outside the partition.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use hyphae_testbed::history::{self, History};
use hyphae_testbed::{join_config, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.208.0.0/28";
const LEASE_SECS: u64 = 15;
const MEMBERS: u8 = 6;
const ENV: &[(&str, &str)] = &[("HYPHAE_LOG", "info,hyphae::lease=debug")];

fn underlay(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, 0, i)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

struct Member {
    host: Host,
    config: String,
    agent: AgentHandle,
    /// Every log this member's agents wrote (one per start).
    logs: Vec<PathBuf>,
}

struct Run {
    bed: Testbed,
    members: Vec<Member>,
    deaths: Vec<(u32, u64)>,
}

impl Run {
    fn kill_and_restart(&mut self, i: usize, down: Duration) {
        let m = &self.members[i];
        self.bed.signal(m.agent.pid, libc::SIGKILL).unwrap();
        self.deaths.push((i as u32, unix_ms()));
        std::thread::sleep(down);
        let m = &mut self.members[i];
        m.agent = self
            .bed
            .start_agent_with_env(&m.host, &m.config, ENV)
            .unwrap();
        m.logs.push(m.agent.log.clone());
    }

    /// Until every member holds an address.
    fn all_claimed(&self, within: Duration) {
        let deadline = Instant::now() + within;
        for (i, m) in self.members.iter().enumerate() {
            loop {
                let s = self.bed.namespace_status(&m.host, &m.agent).unwrap();
                if s.address_claimed {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "h{} holds no address: {s:?}",
                    i + 1
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }

    fn cut(&self, a: &[u8], b: &[u8]) {
        for (side, other) in [(a, b), (b, a)] {
            let others: Vec<Ipv4Addr> = other.iter().map(|&o| underlay(o)).collect();
            for &i in side {
                self.bed
                    .cut(&self.members[usize::from(i - 1)].host, &others)
                    .unwrap();
            }
        }
    }

    fn heal(&self) {
        for m in &self.members {
            self.bed.heal(&m.host).unwrap();
        }
    }

    /// The record of the run, from every agent's log.
    fn history(&self) -> History {
        let mut ids = HashMap::new();
        let mut logs = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            let identity = self.bed.status(&m.host, &m.agent).unwrap().identity;
            ids.insert(identity, i as u32);
            let lines = m
                .logs
                .iter()
                .flat_map(|p| history::lease_lines(&std::fs::read_to_string(p).unwrap()))
                .collect();
            logs.push((i as u32, lines));
        }
        history::from_logs(&logs, &ids, &self.deaths)
    }
}

fn start(bed: &mut Testbed, secret: &Path) -> Vec<Member> {
    (1..=MEMBERS)
        .map(|i| {
            let host = bed.add_host(&format!("h{i}"), underlay(i)).unwrap();
            let mut config = join_config(&host, "lab", secret, SUBNET, "auto", None, LEASE_SECS);
            if i > 1 {
                config += &format!(
                    "bootstrap = [\"{}:7400\", \"{}:7400\"]\n",
                    underlay(1),
                    underlay(4)
                );
            }
            let agent = bed.start_agent_with_env(&host, &config, ENV).unwrap();
            let logs = vec![agent.log.clone()];
            Member {
                host,
                config,
                agent,
                logs,
            }
        })
        .collect()
}

#[test]
fn no_key_has_two_holders_through_kills_and_a_cut() {
    require_root();
    let mut bed = Testbed::new("lhist", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "the lease history namespace secret\n").unwrap();
    let members = start(&mut bed, &secret);
    let mut run = Run {
        bed,
        members,
        deaths: Vec::new(),
    };
    run.all_claimed(Duration::from_secs(90));

    // Faults: a kill, a cut of {h1, h2, h3} from {h4, h5, h6} for 10 s, another kill.
    std::thread::sleep(Duration::from_secs(3));
    run.kill_and_restart(2, Duration::from_secs(2));
    std::thread::sleep(Duration::from_secs(3));
    run.cut(&[1, 2, 3], &[4, 5, 6]);
    let cut_at = unix_ms();
    std::thread::sleep(Duration::from_secs(10));
    run.heal();
    let healed_at = unix_ms();
    std::thread::sleep(Duration::from_secs(3));
    run.kill_and_restart(4, Duration::from_secs(2));
    run.all_claimed(Duration::from_secs(60));
    // Two more renewals of every lease after the last fault.
    std::thread::sleep(Duration::from_secs(2 * LEASE_SECS / 3 + 1));

    let mut history = run.history();
    // Two holders are allowed while cut, and until the owners' renewals meet after the
    // heal (a renewal every third of a lease, plus its time to decide).
    history.declare_partition(cut_at, healed_at + LEASE_SECS * 1000);
    let events = history.events();
    let count = |f: fn(&history::Op) -> bool| events.iter().filter(|e| f(&e.op)).count();
    let won = count(|op| matches!(op, history::Op::Won { .. }));
    let granted = count(|op| matches!(op, history::Op::Granted { .. }));
    let refused = count(|op| matches!(op, history::Op::Refused { .. }));
    let violations = history.check();
    println!(
        "lease history: {} events ({won} won, {granted} granted, {refused} refused), {} deaths, \
         {} two-holder spans excused by the cut, violations: {violations:#?}",
        events.len(),
        run.deaths.len(),
        history.excused().len()
    );
    assert!(
        won >= usize::from(MEMBERS) * 3,
        "too few renewals recorded: {won}"
    );
    assert!(
        granted >= won,
        "replicas logged fewer grants ({granted}) than wins ({won})"
    );
    assert!(violations.is_empty(), "{violations:#?}");
}
