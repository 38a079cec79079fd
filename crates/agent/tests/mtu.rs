#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Plain hosts keep their default MTU (issue 17, item 7), end to end: a LAN host at MTU 1500
//! behind a router agent and a hybrid host whose LAN (and device) is at 1500 talk over a
//! 1420-byte tunnel with the kernel's own TCP, ping and socat. Both ends advertise an MSS
//! of 1460, so nothing fits unless the agents clamp it; they also answer DF packets that do
//! not fit with ICMP "fragmentation needed" (mtu 1420) and fragment the rest, and the
//! kernels at both ends do PMTU discovery and reassembly. An interface host starts the
//! overlay.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyphae_agent::control::NamespaceStatus;
use hyphae_testbed::{agent_section, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.201.0.0/16";
/// Ethernet's MTU: what an unmodified LAN host has.
const LAN_MTU: u16 = 1500;
/// A full-size ICMP echo on such a LAN: 1500 less 20 (IPv4) and 8 (ICMP).
const FULL_PING: &str = "1472";

fn vip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 201, 0, last)
}

fn namespace(secret: &Path, bootstrap: Option<Ipv4Addr>) -> String {
    let mut c = format!(
        "\n[[namespace]]\nname = \"lab\"\nsecret_file = \"{}\"\nsubnet = \"{SUBNET}\"\n",
        secret.display()
    );
    if let Some(b) = bootstrap {
        c += &format!("bootstrap = [\"{b}:7400\"]\n");
    }
    c
}

struct Site {
    bed: Testbed,
    router: (Host, AgentHandle),
    /// A plain host at MTU 1500 on the router's LAN (10.201.0.11).
    lan_host: Host,
    hybrid: (Host, AgentHandle),
    /// A plain host at MTU 1500 on the hybrid host's LAN (10.201.0.13).
    neighbour: Host,
}

fn build(label: &str) -> Site {
    require_root();
    let mut bed = Testbed::new(label, Path::new(BIN)).expect("testbed");
    let secret: PathBuf = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").unwrap();

    // The interface host (10.201.0.31) starts the overlay; the others bootstrap from it.
    let iface = bed.add_host("i", Ipv4Addr::new(10, 200, 0, 1)).unwrap();
    let cfg = format!(
        "{}{}mode = \"interface\"\ndevice = \"hyphae0\"\naddress = \"{}\"\n",
        agent_section(&iface),
        namespace(&secret, None),
        vip(31)
    );
    bed.start_agent(&iface, &cfg).unwrap();
    let boot = Some(iface.underlay);

    let lan1 = bed.add_lan("lan1").unwrap();
    let rh = bed.add_host("r", Ipv4Addr::new(10, 200, 0, 2)).unwrap();
    bed.plug(&lan1, &rh.ns, "eth1", LAN_MTU).unwrap();
    let lan_host = bed
        .add_lan_host(&lan1, "l1", "10.201.0.11/16", LAN_MTU)
        .unwrap();
    let cfg = format!(
        "{}{}mode = \"router\"\ndevice = \"hyr0\"\nbridge = \"brlan\"\nuplink = \"eth1\"\n",
        agent_section(&rh),
        namespace(&secret, boot),
    );
    let ra = bed.start_agent(&rh, &cfg).unwrap();

    let lan2 = bed.add_lan("lan2").unwrap();
    let hh = bed.add_host("h", Ipv4Addr::new(10, 200, 0, 3)).unwrap();
    bed.plug(&lan2, &hh.ns, "eth1", LAN_MTU).unwrap();
    let neighbour = bed
        .add_lan_host(&lan2, "l2", "10.201.0.13/16", LAN_MTU)
        .unwrap();
    let cfg = format!(
        "{}{}mode = \"hybrid\"\ndevice = \"hy0\"\nbridge = \"brlan\"\nuplink = \"eth1\"\naddress = \"{}\"\nprobe_timeout_ms = 400\n",
        agent_section(&hh),
        namespace(&secret, boot),
        vip(21)
    );
    let ha = bed.start_agent(&hh, &cfg).unwrap();
    Site {
        bed,
        router: (rh, ra),
        lan_host,
        hybrid: (hh, ha),
        neighbour,
    }
}

impl Site {
    fn ns_status(&self, (host, agent): &(Host, AgentHandle)) -> NamespaceStatus {
        self.bed
            .status(host, agent)
            .expect("status")
            .namespaces
            .remove(0)
    }

    /// `ping` from `from` with `args` before the target; stdout and stderr together.
    fn ping(&self, from: &Host, args: &[&str], to: Ipv4Addr) -> String {
        let to = to.to_string();
        let mut all = vec!["-c", "3", "-i", "0.2", "-W", "2"];
        all.extend_from_slice(args);
        all.push(&to);
        let out = self.bed.ns_output(&from.ns, "ping", &all).expect("ping");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// The MTU of `link` in namespace `ns`.
    fn mtu(&self, ns: &str, link: &str) -> u16 {
        let out = self
            .bed
            .ns(ns, "cat", &[&format!("/sys/class/net/{link}/mtu")])
            .expect("mtu");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }
}

/// What a host at MTU 1500 sees of a 1420-byte tunnel: TCP with a clamped MSS,
/// fragmentation of non-DF packets, a "fragmentation needed" answer to a DF one, and PMTU
/// discovery after it, from `host` to `to` at `addr`. `agent` is the agent whose switch
/// carries the host's frames; the transfer uses TCP `port`.
fn full_size_traffic_works(
    site: &mut Site,
    host: &Host,
    agent: &(Host, AgentHandle),
    (to, addr): (&Host, Ipv4Addr),
    port: u16,
) {
    // Strict reverse-path filtering (RFC 3704), as many distributions ship it: the ICMP
    // error below must pass it.
    site.bed
        .ns(
            &host.ns,
            "sysctl",
            &["-qw", "net.ipv4.conf.all.rp_filter=1"],
        )
        .expect("rp_filter");
    site.bed
        .wait_for_ping(host, addr, Duration::from_secs(60))
        .expect("the overlay carries small packets");

    // Bulk TCP first, while the host knows no smaller path MTU (afterwards its SYNs would
    // advertise the learned one): its SYN's MSS 1460 is clamped to 1380, every segment fits.
    let before = site.ns_status(agent);
    site.bed
        .tcp_transfer(
            host,
            (to, addr),
            port,
            20 * 1000 * 1000,
            Duration::from_secs(60),
        )
        .expect("bulk TCP");
    let s = site.ns_status(agent);
    assert!(s.mss_clamped > before.mss_clamped, "no SYN clamped");
    // The TAP is a bridge port with offloads: the LAN host's TSO super-frames cross the
    // bridge whole and the agent cuts them (docs/MODES.md).
    assert!(s.offload);
    assert!(s.super_frames > before.super_frames, "{s:#?}");
    assert_eq!(s.drops.get("offload_malformed"), Some(&0));
    assert_eq!(s.drops.get("too_big"), Some(&0));

    // No DF: the agent fragments, the far kernel reassembles (and fragments its reply).
    let out = site.ping(host, &["-M", "dont", "-s", FULL_PING], addr);
    assert!(out.contains("3 received"), "{}: {out}", host.name);
    let s = site.ns_status(agent);
    assert!(s.fragmented >= 3, "fragmented {}", s.fragmented);

    // DF, full size: the agent answers "fragmentation needed" with the tunnel's MTU (from
    // the service address, which the host's reverse-path filter accepts)...
    let out = site.ping(host, &["-M", "do", "-s", FULL_PING], addr);
    assert!(out.contains("mtu = 1420"), "{}: {out}", host.name);
    assert!(out.contains("From 10.201.0.1 "), "{}: {out}", host.name);
    assert!(site.ns_status(agent).frag_needed >= 1);
    // ... the host's PMTU cache has learned it ...
    let route = site
        .bed
        .ns(&host.ns, "ip", &["route", "get", &addr.to_string()])
        .expect("ip route get");
    let route = String::from_utf8_lossy(&route.stdout);
    assert!(route.contains("mtu 1420"), "{}: {route}", host.name);
    // ... and a full-size ping as Linux sends it by default (PMTU discovery on) gets through.
    let out = site.ping(host, &["-M", "want", "-s", FULL_PING], addr);
    assert!(out.contains("3 received"), "{}: {out}", host.name);
}

#[test]
fn plain_hosts_at_mtu_1500_talk_across_the_overlay_through_a_router_and_a_hybrid_host() {
    let mut site = build("mt");
    let (rh, hh, l1) = (
        site.router.0.clone(),
        site.hybrid.0.clone(),
        site.lan_host.clone(),
    );

    // The TAPs join their bridges at the LAN's MTU, so the bridges stay at 1500; the hybrid
    // host's own device takes it too.
    for (ns, link) in [
        (&rh.ns, "hyr0"),
        (&rh.ns, "brlan"),
        (&rh.ns, "eth1"),
        (&hh.ns, "hy0t"),
        (&hh.ns, "hy0"),
        (&hh.ns, "brlan"),
    ] {
        assert_eq!(site.mtu(ns, link), LAN_MTU, "{link}");
    }
    // A plain neighbour at 1500 reaches the hybrid host's address at full size with DF (the
    // bridge and the veth carry it; no agent is involved).
    let neighbour = site.neighbour.clone();
    site.bed
        .wait_for_ping(&neighbour, vip(21), Duration::from_secs(30))
        .expect("neighbour");
    let out = site.ping(&neighbour, &["-M", "do", "-s", FULL_PING], vip(21));
    assert!(out.contains("3 received"), "neighbour: {out}");

    // The router's LAN host to the hybrid host, through the router's agent ...
    let router = site.router.clone();
    full_size_traffic_works(&mut site, &l1, &router, (&hh, vip(21)), 5001);
    // ... and back, through the hybrid host's agent.
    let hybrid = site.hybrid.clone();
    full_size_traffic_works(&mut site, &hh, &hybrid, (&l1, vip(11)), 5002);
    // Each agent wrote the other's segments to its bridge coalesced, as GSO super-frames
    // the bridge forwarded to a plain host (which got them whole: the sha256 above).
    for agent in [&router, &hybrid] {
        let s = site.ns_status(agent);
        assert!(s.coalesced_writes > 0 && s.coalesced_frames > 0, "{s:#?}");
        assert_eq!(s.drops.get("device_write"), Some(&0));
    }
}
