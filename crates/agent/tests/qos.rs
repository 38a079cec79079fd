#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::print_stdout)] // prints its figures (run with --nocapture)
//! Issue 32, item 1 (first part): a namespace's egress cap, end to end. alpha caps what it
//! sends to the namespace at 50 Mbit/s; beta has no cap. iperf3 over TCP and UDP from
//! alpha to beta is held to the cap (within a tolerance no uncapped run meets: the same
//! pair carries many times more the other way), and the UDP stream, offered at four times
//! the cap, is paced and dropped, both counted.

use std::net::Ipv4Addr;
use std::path::Path;

use hyphae_testbed::{agent_section, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.206.0.0/24";

fn start(
    bed: &mut Testbed,
    i: u8,
    name: &str,
    boot: Option<Ipv4Addr>,
    extra: &str,
) -> (Host, AgentHandle) {
    let host = bed.add_host(name, Ipv4Addr::new(10, 200, 0, i)).unwrap();
    let secret = bed.dir().join("lab.secret");
    let lines = format!("address = \"10.206.0.{}\"\nresolvers = []\n{extra}", 10 + i);
    let cfg = format!(
        "{}{}",
        agent_section(&host),
        hyphae_testbed::lab_namespace(&secret, SUBNET, boot, &lines)
    );
    let agent = bed.start_agent(&host, &cfg).expect("agent");
    bed.claimed_address(&host, &agent).unwrap();
    (host, agent)
}

/// iperf3 from `from` to `to` for 3 s (`args` more), as JSON: the receiver's rate in
/// Mbit/s.
fn iperf(bed: &Testbed, from: &Host, to: Ipv4Addr, args: &[&str]) -> f64 {
    let to = to.to_string();
    let mut all = vec!["-c", &to, "-t", "3", "-J", "--connect-timeout", "3000"];
    all.extend_from_slice(args);
    let out = bed.ns_output(&from.ns, "iperf3", &all).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "iperf3 {all:?}: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let end = &json["end"];
    let bps = end["sum_received"]["bits_per_second"]
        .as_f64()
        .or_else(|| end["sum"]["bits_per_second"].as_f64())
        .unwrap_or_else(|| panic!("no rate in {end}"));
    bps / 1e6
}

#[test]
fn an_egress_cap_holds_tcp_and_udp_to_its_rate() {
    require_root();
    let mut bed = Testbed::new("qos", Path::new(BIN)).expect("testbed");
    hyphae_testbed::write_secret(
        &bed.dir().join("lab.secret"),
        "the qos test namespace secret\n",
    )
    .unwrap();
    let (alpha, a) = start(&mut bed, 1, "alpha", None, "rate = \"50M\"\n");
    let (beta, _) = start(&mut bed, 2, "beta", Some(alpha.underlay), "");
    let (alpha_ip, beta_ip) = (Ipv4Addr::new(10, 206, 0, 11), Ipv4Addr::new(10, 206, 0, 12));
    bed.wait_for_ping(&alpha, beta_ip, std::time::Duration::from_secs(30))
        .unwrap();
    for (h, log) in [(&alpha, "a.log"), (&beta, "b.log")] {
        bed.spawn(&h.ns, "iperf3", &["-s"], &h.dir.join(log))
            .unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(300));

    let uncapped = iperf(&bed, &beta, alpha_ip, &[]);
    let tcp = iperf(&bed, &alpha, beta_ip, &[]);
    let udp = iperf(&bed, &alpha, beta_ip, &["-u", "-b", "200M", "-l", "1200"]);
    println!("beta to alpha (no cap) {uncapped:.1} Mbit/s; alpha to beta (50M cap): TCP {tcp:.1}, UDP offered at 200M {udp:.1}");
    assert!(
        uncapped > 150.0,
        "the pair carries more than the cap uncapped: {uncapped:.1}"
    );
    // At most the cap and its burst over 3 s (64 KiB: 0.2 Mbit/s), give or take iperf3's
    // own accounting; at least most of it.
    for (what, rate) in [("TCP", tcp), ("UDP", udp)] {
        assert!(
            (40.0..=51.0).contains(&rate),
            "{what} from alpha: {rate:.1} Mbit/s under a 50 Mbit/s cap"
        );
    }
    let egress = bed
        .namespace_status(&alpha, &a)
        .unwrap()
        .egress
        .expect("alpha's cap in its status");
    assert_eq!((egress.rate, egress.max_delay_ms), (50_000_000, 20));
    assert!(egress.delayed > 0 && egress.dropped > 0, "{egress:?}");
}
