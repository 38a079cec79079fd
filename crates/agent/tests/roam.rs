#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Roaming, end to end: a member whose own underlay address changes under traffic keeps
//! its tunnels. Real agents in network namespaces, the address changed with `ip addr`, and
//! `ping` across the overlay; the other member's status must show the new endpoint.
//!
//! They need root, iproute2 and ping (`scripts/test` installs them). They never skip.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use hyphae_agent::control::Status;
use hyphae_testbed::{agent_config, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.201.0.0/16";
const A_VIP: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 11);
const B_VIP: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 12);
const A_UNDERLAY: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
const B_UNDERLAY: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 2);

/// How `a` joins: interface mode, or hybrid mode on a LAN of its own.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Interface,
    Hybrid,
}

/// Two members, `a` and `b`, each listing the other; both listen on all addresses (an
/// agent bound to one address cannot roam off it).
struct Pair {
    bed: Testbed,
    a: Host,
    b: Host,
    agents: [AgentHandle; 2],
}

fn pair(label: &str, mode: Mode) -> Pair {
    require_root();
    let mut bed = Testbed::new(label, Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").expect("secret");
    let a = bed.add_host("a", A_UNDERLAY).expect("host a");
    let b = bed.add_host("b", B_UNDERLAY).expect("host b");
    if mode == Mode::Hybrid {
        let lan = bed.add_lan("lan").expect("lan");
        bed.plug(&lan, &a.ns, "eth1", 1500).expect("plug");
    }
    let config = |host: &Host, vip, peer| {
        agent_config(host, "lab", &secret, SUBNET, vip, &[peer]).replace(
            &format!("listen = \"{}:7400\"", host.underlay),
            "listen = \"0.0.0.0:7400\"",
        )
    };
    let mut config_a = config(&a, A_VIP, B_UNDERLAY);
    if mode == Mode::Hybrid {
        config_a = config_a.replace(
            "mode = \"interface\"\ndevice = \"hyphae0\"\n",
            "mode = \"hybrid\"\ndevice = \"hy0\"\nbridge = \"brlan\"\nuplink = \"eth1\"\n",
        );
        assert!(config_a.contains("hybrid"), "{config_a}");
    }
    let agent_a = bed.start_agent(&a, &config_a).expect("agent a");
    let agent_b = bed
        .start_agent(&b, &config(&b, B_VIP, A_UNDERLAY))
        .expect("agent b");
    bed.wait_for_ping(&b, A_VIP, Duration::from_secs(30))
        .expect("the tunnel comes up");
    Pair {
        bed,
        a,
        b,
        agents: [agent_a, agent_b],
    }
}

impl Pair {
    fn status(&self, i: usize) -> Status {
        let host = if i == 0 { &self.a } else { &self.b };
        self.bed.status(host, &self.agents[i]).expect("status")
    }

    /// `a` as `b` sees it: its endpoint and how often it moved.
    fn a_seen_from_b(&self) -> (String, u64) {
        let status = self.status(1);
        let peer = status.namespaces[0]
            .peers
            .iter()
            .find(|p| p.addresses.contains(&A_VIP.to_string()))
            .expect("b has a tunnel with a");
        (peer.endpoint.clone(), peer.endpoint_changes)
    }

    /// Pings `a` from `b` every 50 ms in the background, so the move happens under
    /// traffic; the ping runs until the testbed drops.
    fn ping_in_background(&mut self) {
        let log = self.bed.dir().join("ping.log");
        let target = A_VIP.to_string();
        self.bed
            .spawn(
                &self.b.ns,
                "ping",
                &["-i", "0.05", "-W", "1", &target],
                &log,
            )
            .expect("ping");
    }

    /// After the move: `b` reaches `a` again, `b` shows `a` at `endpoint` with one move
    /// counted, and `a` counted one change of its own.
    fn assert_followed_to(&self, endpoint: &str) {
        self.bed
            .wait_for_ping(&self.b, A_VIP, Duration::from_secs(10))
            .expect("b reaches a after the move");
        self.bed
            .wait_for_ping(&self.a, B_VIP, Duration::from_secs(10))
            .expect("a reaches b after the move");
        let (seen, moves) = self.a_seen_from_b();
        assert_eq!(seen, endpoint, "b's status shows a's new endpoint");
        assert!(moves >= 1, "b counted a's move");
        let ours = self.status(0).underlay_changes;
        assert!(ours >= 1, "a counted its own change: {ours}");
    }
}

/// DHCP renumbering, or a move within the subnet: the address on `eth0` changes.
#[test]
fn a_member_renumbered_on_its_link_keeps_its_tunnels() {
    renumber(pair("rn", Mode::Interface));
}

/// The same in hybrid mode: the agent's host is renumbered, its LAN stays.
#[test]
fn a_hybrid_member_renumbered_keeps_its_tunnels() {
    renumber(pair("rh", Mode::Hybrid));
}

fn renumber(mut net: Pair) -> Pair {
    assert_eq!(net.a_seen_from_b(), (format!("{A_UNDERLAY}:7400"), 0));
    net.ping_in_background();
    let ns = net.a.ns.clone();
    net.bed
        .ns(&ns, "ip", &["addr", "del", "10.200.0.1/24", "dev", "eth0"])
        .expect("del");
    net.bed
        .ns(&ns, "ip", &["addr", "add", "10.200.0.21/24", "dev", "eth0"])
        .expect("add");
    net.assert_followed_to("10.200.0.21:7400");
    net
}

/// A member that joins after the move finds `a` through the DHT at its new endpoint: the
/// records were renewed. Had it been given the old one, its tunnel would have started
/// there and moved (counted in `endpoint_changes`), through a relay at best.
#[test]
fn a_renumbered_member_is_found_at_its_new_endpoint() {
    let mut net = renumber(pair("rf", Mode::Interface));
    // a's address record is renewed with the new endpoint (its status says what the
    // replicas granted last).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while net.status(0).namespaces[0].endpoints != ["10.200.0.21:7400"] {
        assert!(
            std::time::Instant::now() < deadline,
            "a's record still says {:?}",
            net.status(0).namespaces[0].endpoints
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let c = net
        .bed
        .add_host("c", Ipv4Addr::new(10, 200, 0, 3))
        .expect("host c");
    let secret = net.bed.dir().join("lab.secret");
    let config = agent_config(
        &c,
        "lab",
        &secret,
        SUBNET,
        Ipv4Addr::new(10, 201, 0, 13),
        &[B_UNDERLAY],
    )
    .replace("listen = \"10.200.0.3:7400\"", "listen = \"0.0.0.0:7400\"");
    let agent_c = net.bed.start_agent(&c, &config).expect("agent c");
    net.bed
        .wait_for_ping(&c, A_VIP, Duration::from_secs(30))
        .expect("c reaches a");
    let status = net.bed.status(&c, &agent_c).expect("status");
    let a = status.namespaces[0]
        .peers
        .iter()
        .find(|p| p.addresses.contains(&A_VIP.to_string()))
        .expect("c has a tunnel with a");
    assert_eq!(a.endpoint, "10.200.0.21:7400");
    assert_eq!(a.path, "direct");
    assert_eq!(
        a.endpoint_changes, 0,
        "c found a at its new endpoint at once"
    );
}

/// A move to another subnet, reached through a router: `a` loses its address on the
/// shared link and comes back on a link of its own behind the router.
#[test]
fn a_member_moved_behind_a_router_keeps_its_tunnels() {
    let mut net = pair("rr", Mode::Interface);
    // The router: on the underlay at .254, and on a new link 10.77.0.0/24 to `a`.
    let router = net
        .bed
        .add_host("r", Ipv4Addr::new(10, 200, 0, 254))
        .expect("router");
    let (bed, a, b) = (&net.bed, net.a.ns.clone(), net.b.ns.clone());
    bed.ns(
        &router.ns,
        "ip",
        &[
            "link", "add", "site0", "type", "veth", "peer", "name", "eth1", "netns", &a,
        ],
    )
    .expect("veth");
    bed.ns(
        &router.ns,
        "ip",
        &["addr", "add", "10.77.0.1/24", "dev", "site0"],
    )
    .expect("router address");
    bed.ns(&router.ns, "ip", &["link", "set", "site0", "up"])
        .expect("up");
    bed.ns(&router.ns, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])
        .expect("forwarding");
    bed.ns(&a, "ip", &["link", "set", "eth1", "up"])
        .expect("up");
    bed.ns(
        &b,
        "ip",
        &["route", "add", "10.77.0.0/24", "via", "10.200.0.254"],
    )
    .expect("route to the new subnet");
    net.ping_in_background();
    let bed = &net.bed;
    bed.ns(&a, "ip", &["addr", "del", "10.200.0.1/24", "dev", "eth0"])
        .expect("del");
    bed.ns(&a, "ip", &["addr", "add", "10.77.0.5/24", "dev", "eth1"])
        .expect("add");
    bed.ns(&a, "ip", &["route", "add", "default", "via", "10.77.0.1"])
        .expect("default route");
    net.assert_followed_to("10.77.0.5:7400");
}
