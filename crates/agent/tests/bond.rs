#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::print_stdout)] // prints its figures (run with --nocapture)
//! Issue 32, item 3: bonding over two underlay links, end to end (the KU paper's
//! V-channel). alpha and beta each have two links (eth0 on 10.200.0.0/24, eth1 on
//! 10.202.0.0/24) and list both as `[[agent.uplinks]]`: one member's flows spread over
//! both, each flow on one link, and a link cut under a 50 ms ping moves its flows to the
//! other within a second.
//!
//! They need root, iproute2, ping and iperf3 (tc for the benchmark) (`scripts/test` installs them). They
//! never skip.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use hyphae_agent::control::{LinkStatus, PeerStatus};
use hyphae_testbed::{agent_section, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.207.0.0/24";
const ALPHA: Ipv4Addr = Ipv4Addr::new(10, 207, 0, 11);
const BETA: Ipv4Addr = Ipv4Addr::new(10, 207, 0, 12);

/// The tests measure rates and losses: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// alpha (i = 1) and beta (i = 2), each on both links, with uplinks at `rates`.
struct Pair {
    bed: Testbed,
    /// The second link's switch.
    lan: String,
    hosts: [(Host, AgentHandle); 2],
}

/// The second underlay link's address of host `i`.
fn second(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 202, 0, i)
}

fn pair(label: &str, rates: [&str; 2]) -> (std::sync::MutexGuard<'static, ()>, Pair) {
    require_root();
    let one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut bed = Testbed::new(label, Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "the bonding test namespace secret\n").unwrap();
    let lan = bed.add_lan("u2").expect("second underlay");
    let mut hosts = Vec::new();
    for (i, name) in [(1u8, "alpha"), (2, "beta")] {
        let host = bed.add_host(name, Ipv4Addr::new(10, 200, 0, i)).unwrap();
        bed.plug(&lan, &host.ns, "eth1", 1500).unwrap();
        let cidr = format!("{}/24", second(i));
        bed.ns(&host.ns, "ip", &["addr", "add", &cidr, "dev", "eth1"])
            .unwrap();
        let uplinks = format!(
            "[[agent.uplinks]]\naddress = \"{}\"\nrate = \"{}\"\n\
             [[agent.uplinks]]\naddress = \"{}\"\nrate = \"{}\"\n",
            host.underlay,
            rates[0],
            second(i),
            rates[1]
        );
        let boot = (i == 2).then_some(Ipv4Addr::new(10, 200, 0, 1));
        let lines = format!("address = \"10.207.0.{}\"\nresolvers = []\n", 10 + i);
        let cfg = format!(
            "{}{uplinks}{}",
            agent_section(&host).replace(
                &format!("listen = \"{}:7400\"", host.underlay),
                "listen = \"0.0.0.0:7400\""
            ),
            hyphae_testbed::lab_namespace(&secret, SUBNET, boot, &lines)
        );
        assert!(cfg.contains("0.0.0.0:7400"), "{cfg}");
        let agent = bed.start_agent(&host, &cfg).expect("agent");
        bed.claimed_address(&host, &agent).unwrap();
        hosts.push((host, agent));
    }
    let hosts: [(Host, AgentHandle); 2] = hosts.try_into().ok().unwrap();
    bed.wait_for_ping(&hosts[0].0, BETA, Duration::from_secs(30))
        .unwrap();
    let pair = Pair { bed, lan, hosts };
    pair.wait_bonded();
    (one, pair)
}

impl Pair {
    /// Host `i`'s tunnel with the other.
    fn peer(&self, i: usize) -> PeerStatus {
        let (host, agent) = &self.hosts[i];
        let status = self.bed.status(host, agent).expect("status");
        let other = if i == 0 { BETA } else { ALPHA };
        status.namespaces[0]
            .peers
            .iter()
            .find(|p| p.addresses.contains(&other.to_string()))
            .cloned()
            .expect("a tunnel with the other member")
    }

    /// Until each end has both of the other's links alive (confirmed by probes).
    fn wait_bonded(&self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let links = [self.peer(0).links, self.peer(1).links];
            if links
                .iter()
                .all(|l| l.len() == 2 && l.iter().all(|x| x.alive))
            {
                return;
            }
            assert!(Instant::now() < deadline, "never bonded: {links:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The interface of host `i` a link to the other's `endpoint` leaves by.
    fn interface(link: &LinkStatus) -> &'static str {
        if link.endpoint.starts_with("10.200.") {
            "eth0"
        } else {
            "eth1"
        }
    }

    /// Bytes host `i` sent on `dev`, by the kernel's count.
    fn tx_bytes(&self, i: usize, dev: &str) -> u64 {
        let path = format!("/sys/class/net/{dev}/statistics/tx_bytes");
        let out = self.bed.ns(&self.hosts[i].0.ns, "cat", &[&path]).unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    fn iperf_server(&mut self) {
        let beta = &self.hosts[1].0;
        let log = beta.dir.join("iperf3-s.log");
        self.bed
            .spawn(&beta.ns.clone(), "iperf3", &["-s"], &log)
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }

    /// iperf3 from alpha to `to` with 8 flows for `secs`: the receiver's Mbit/s.
    fn iperf8(&self, to: Ipv4Addr, secs: u32) -> f64 {
        let (to, secs) = (to.to_string(), secs.to_string());
        let args = [
            "-c",
            &to,
            "-t",
            &secs,
            "-P",
            "8",
            "-J",
            "--connect-timeout",
            "3000",
        ];
        let out = self
            .bed
            .ns_output(&self.hosts[0].0.ns, "iperf3", &args)
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("iperf3: {e}: {}", String::from_utf8_lossy(&out.stdout)));
        json["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or_else(|| panic!("iperf3: no rate in {json}"))
            / 1e6
    }
}

#[test]
fn two_links_carry_one_members_flows_and_a_dead_one_moves_them_within_a_second() {
    let (_one, mut p) = pair("bond", ["200M", "100M"]);
    p.iperf_server();

    // Eight TCP flows alpha -> beta: both links carry them, by the kernel's counters.
    let before = [p.tx_bytes(0, "eth0"), p.tx_bytes(0, "eth1")];
    let mbit = p.iperf8(BETA, 3);
    let sent = [
        p.tx_bytes(0, "eth0") - before[0],
        p.tx_bytes(0, "eth1") - before[1],
    ];
    let total = (sent[0] + sent[1]) as f64;
    let links = p.peer(0).links;
    println!(
        "bond: 8 flows {mbit:.1} Mbit/s; eth0 {:.1}% eth1 {:.1}% of the bytes; flows per link {:?}",
        100.0 * sent[0] as f64 / total,
        100.0 * sent[1] as f64 / total,
        links.iter().map(|l| l.flows).collect::<Vec<_>>()
    );
    for (dev, bytes) in ["eth0", "eth1"].iter().zip(sent) {
        assert!(
            bytes as f64 > 0.05 * total,
            "{dev} carried {bytes} of {total} bytes: {links:?}"
        );
    }
    assert!(links.iter().all(|l| l.flows >= 1), "{links:?}");
    println!("bond: beta's drops {:?}", nonzero(&p.peer(1).drops));

    // Which link alpha's ping to beta takes: the one whose packets rise by the pings.
    let counts = |p: &Pair| -> Vec<u64> { p.peer(0).links.iter().map(|l| l.tx_packets).collect() };
    let c0 = counts(&p);
    let out = p.bed.ping(&p.hosts[0].0, BETA, 20).unwrap();
    assert!(out.status.success(), "ping before the cut");
    let c1 = counts(&p);
    let carrying = (0..2).max_by_key(|&i| c1[i] - c0[i]).expect("two links");
    let link = p.peer(0).links[carrying].clone();
    let dev = Pair::interface(&link);

    // 50 ms pings for 5 s; the ping's link is cut after 1.5 s.
    let ns = p.hosts[0].0.ns.clone();
    let target = BETA.to_string();
    // (`ping` exits 1 when it lost any: its summary line is read either way.)
    let pinger = std::thread::spawn(move || {
        std::process::Command::new("ip")
            .args([
                "netns", "exec", &ns, "ping", "-c", "100", "-i", "0.05", "-W", "1",
            ])
            .arg(&target)
            .stdin(std::process::Stdio::null())
            .output()
    });
    std::thread::sleep(Duration::from_millis(1500));
    // The link's switch stops forwarding: the path goes silent, the interfaces stay up.
    let switch = if dev == "eth0" {
        p.bed.switch_ns().to_string()
    } else {
        p.lan.clone()
    };
    p.bed
        .ns(&switch, "ip", &["link", "set", "br0", "down"])
        .unwrap();
    let out = pinger.join().unwrap();
    let text = String::from_utf8_lossy(&out.expect("ping runs").stdout).to_string();
    let line = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no ping summary: {text}"));
    let n: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let lost = n[0] - n[1];
    println!(
        "bond: link {} ({dev}) cut under 50 ms pings: {lost} of {} lost",
        link.endpoint, n[0]
    );
    assert!(lost >= 1, "the cut missed the ping's link: {line}");
    assert!(lost <= 20, "more than a second of pings lost: {line}");

    // Neither end roamed to the other link; alpha counts the link dead.
    let a = p.peer(0);
    let b = p.peer(1);
    assert_eq!((a.endpoint_changes, b.endpoint_changes), (0, 0));
    let dead = &a.links[carrying];
    assert!(!dead.alive && dead.deaths >= 1, "{dead:?}");
    println!("bond: alpha's links after the cut: {:?}", a.links);
}

/// The KU paper's Table 6, here: two links shaped to 200 and 100 Mbit/s (or `BOND_RATES`;
/// tbf on both ends' egress), eight TCP flows alpha -> beta over the bond, beside each link alone
/// without the overlay (iperf3 to the other's address on it) in the same run. Prints the
/// figures; run with `--ignored --nocapture`.
#[test]
#[ignore = "a benchmark: its figures are in docs/BENCHMARKS.md"]
fn bench_bonded_throughput_against_each_link_alone() {
    // BOND_RATES="200:100": the links' rates in Mbit/s, shaped and announced alike.
    let rates = std::env::var("BOND_RATES").unwrap_or_else(|_| "200:100".into());
    let (r0, r1) = rates.split_once(':').expect("BOND_RATES=A:B");
    let (r0, r1): (u32, u32) = (r0.parse().unwrap(), r1.parse().unwrap());
    let (_one, mut p) = pair("bondb", [&format!("{r0}M"), &format!("{r1}M")]);
    let expected = 100.0 * f64::from(r0) / f64::from(r0 + r1);
    for (host, _) in &p.hosts {
        for (dev, rate) in [("eth0", format!("{r0}mbit")), ("eth1", format!("{r1}mbit"))] {
            let rate = rate.as_str();
            p.bed
                .ns(
                    &host.ns,
                    "tc",
                    &[
                        "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "256kb",
                        "latency", "15ms",
                    ],
                )
                .unwrap();
        }
    }
    p.iperf_server();
    let runs: usize = std::env::var("BOND_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    for run in 1..=runs {
        let link0 = p.iperf8(Ipv4Addr::new(10, 200, 0, 2), 10);
        let link1 = p.iperf8(second(2), 10);
        let before = [p.tx_bytes(0, "eth0"), p.tx_bytes(0, "eth1")];
        let bonded = p.iperf8(BETA, 10);
        let sent = [
            p.tx_bytes(0, "eth0") - before[0],
            p.tx_bytes(0, "eth1") - before[1],
        ];
        let share = sent[0] as f64 / (sent[0] + sent[1]) as f64;
        println!(
            "bond bench run {run}: eth0 alone {link0:.1}, eth1 alone {link1:.1}, bonded {bonded:.1} Mbit/s \
             ({:.1}% of the two alone); eth0 carried {:.1}% of the bonded bytes ({r0}:{r1} is {expected:.1}%)",
            100.0 * bonded / (link0 + link1),
            100.0 * share
        );
    }
    println!("bond bench: links {:?}", p.peer(0).links);
    println!("bond bench: beta's drops {:?}", nonzero(&p.peer(1).drops));
}

fn nonzero(drops: &std::collections::BTreeMap<String, u64>) -> Vec<(&String, &u64)> {
    drops.iter().filter(|(_, n)| **n > 0).collect()
}
