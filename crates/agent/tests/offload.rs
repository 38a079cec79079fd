#![allow(clippy::unwrap_used, clippy::expect_used)]
//! TAP offloads end to end: real agents in network namespaces whose kernels hand their TAPs
//! TCP super-frames (TSO) and take coalesced ones back (GRO), between agents with offloads
//! on and one with `offload = false`. Transfers are checked with sha256sum; the agents'
//! status says whether offloads are on and what they did.
//!
//! Needs root, iproute2, ping, socat, iperf3 and sha256sum (`scripts/test` installs them). Never
//! skips: without root it fails and says why.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use hyphae_testbed::{agent_config, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.201.0.0/16";
const MB: usize = 1000 * 1000;

fn underlay(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, 0, i)
}

fn vip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 201, 0, 10 + i)
}

/// `len` bytes from `from` to `to` over TCP, arriving whole.
fn transfer(bed: &mut Testbed, from: &Host, to: (&Host, Ipv4Addr), port: u16, len: usize) {
    bed.tcp_transfer(from, to, port, len, Duration::from_secs(120))
        .expect("TCP transfer");
}

fn status_text(bed: &Testbed, host: &Host, agent: &AgentHandle) -> String {
    let out = bed
        .ns(
            &host.ns,
            BIN,
            &["status", "-c", &agent.config.display().to_string()],
        )
        .expect("status");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn super_frames_are_segmented_and_coalesced_and_offload_off_interoperates() {
    require_root();
    let mut bed = Testbed::new("offload", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").expect("secret");
    let hosts: Vec<Host> = (1..=3)
        .map(|i| bed.add_host(&format!("h{i}"), underlay(i)).expect("host"))
        .collect();
    let mut agents = Vec::new();
    for (i, host) in hosts.iter().enumerate() {
        let me = i as u8 + 1;
        let peers: Vec<Ipv4Addr> = (1..=3).filter(|&j| j != me).map(underlay).collect();
        let mut cfg = agent_config(host, "lab", &secret, SUBNET, vip(me), &peers);
        if me == 3 {
            cfg = cfg.replacen("[agent]\n", "[agent]\noffload = false\n", 1);
        }
        agents.push(bed.start_agent(host, &cfg).expect("agent"));
    }
    for (from, to) in [(0, 2), (1, 3), (2, 1)] {
        bed.wait_for_ping(&hosts[from], vip(to), Duration::from_secs(20))
            .expect("first contact");
    }

    // Offloads on at both ends: h1's kernel hands its TAP super-frames, h2's takes
    // coalesced ones.
    transfer(&mut bed, &hosts[0], (&hosts[1], vip(2)), 5001, 40 * MB);
    let h1 = bed
        .namespace_status(&hosts[0], &agents[0])
        .expect("status h1");
    let h2 = bed
        .namespace_status(&hosts[1], &agents[1])
        .expect("status h2");
    eprintln!(
        "h1: {} super-frames in, {} segments; h2: {} coalesced writes, {} frames merged",
        h1.super_frames, h1.segments, h2.coalesced_writes, h2.coalesced_frames
    );
    assert!(h1.offload && h2.offload, "offload should be on by default");
    assert!(
        h1.super_frames > 0,
        "no super-frame read from h1's TAP: {h1:#?}"
    );
    assert!(h1.segments > h1.super_frames, "{h1:#?}");
    assert!(
        h2.coalesced_writes > 0 && h2.coalesced_frames > 0,
        "{h2:#?}"
    );
    for s in [&h1, &h2] {
        assert_eq!(s.drops.get("offload_malformed"), Some(&0), "{s:#?}");
        assert_eq!(s.drops.get("device_write"), Some(&0), "{s:#?}");
    }
    assert!(status_text(&bed, &hosts[0], &agents[0]).contains("offload on:"));

    // UDP: h1 sends 1200-byte datagrams to h2 with iperf3; h2's agent writes each batch of
    // one flow as one UDP super-frame (its TAP takes UDP segmentation offload, Linux 6.2
    // and later), which h2's kernel cuts back into datagrams whose checksums all verify.
    let csum_errors_before = bed.udp_checksum_errors(&hosts[1].ns).expect("snmp");
    let (packets, lost) = bed
        .udp_stream(&hosts[0], &hosts[1], vip(2), 5301, ("100M", 1200, 2))
        .expect("UDP stream");
    let h2_after = bed
        .namespace_status(&hosts[1], &agents[1])
        .expect("status h2");
    let merged = h2_after.coalesced_frames - h2.coalesced_frames;
    eprintln!("UDP: {packets} datagrams sent, {lost} lost; h2 merged {merged} into super-frames");
    // Loss is not what this checks (the suite runs tests side by side on two cores, where
    // a burst of datagrams can outrun a receiver): most must arrive, coalesced and intact.
    assert!(
        packets > 1000 && lost * 4 < packets,
        "{packets} sent, {lost} lost"
    );
    assert!(
        merged > 1000,
        "UDP datagrams were not coalesced: {h2_after:#?}"
    );
    assert_eq!(
        bed.udp_checksum_errors(&hosts[1].ns).expect("snmp"),
        csum_errors_before
    );
    assert_eq!(
        h2_after.drops.get("device_write"),
        Some(&0),
        "{h2_after:#?}"
    );

    // `offload = false` on h3: plain frames both ways, to and from an agent with offloads.
    transfer(&mut bed, &hosts[0], (&hosts[2], vip(3)), 5002, 20 * MB);
    transfer(&mut bed, &hosts[2], (&hosts[0], vip(1)), 5003, 20 * MB);
    let h3 = bed
        .namespace_status(&hosts[2], &agents[2])
        .expect("status h3");
    assert!(!h3.offload);
    assert_eq!(h3.super_frames + h3.coalesced_writes, 0, "{h3:#?}");
    assert!(h3.to_peers > 10_000 && h3.to_device > 10_000, "{h3:#?}");
    assert!(status_text(&bed, &hosts[2], &agents[2]).contains("offload off"));
    let h1 = bed
        .namespace_status(&hosts[0], &agents[0])
        .expect("status h1");
    assert_eq!(h1.drops.get("offload_malformed"), Some(&0), "{h1:#?}");
}
