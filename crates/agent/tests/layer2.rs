#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A layer-2 namespace end to end (issue 30): two router sites (r1, r2) extend one
//! Ethernet segment between their LANs, and an interface member `i` joins it with its own
//! TAP. Real parts only: plain LAN hosts a1 (LAN 1) and b1 (LAN 2) with no hyphae, the
//! kernel's ARP and ping, and raw AF_PACKET sockets (Python's standard library) for frames
//! no IP stack sends. Shown: ARP and ping cross between the sites and to `i`; a frame of
//! EtherType 0x88B5 and an 802.1Q-tagged frame arrive at b1 byte-identical; each router
//! learned its LAN's MACs and the others' announcements (status); a second ARP resolution
//! is answered at the site and crosses nothing; frames of the LANs'
//! full MTU cross a tunnel of a smaller one in pieces; a broadcast storm from a1 is held
//! to the flood rate at r1 while a1 and b1 keep reaching each other; arping crosses; a
//! dnsmasq DHCP server on site 1 leases an address to busybox udhcpc on site 2; b1 moves
//! to site 1 keeping its MAC and is reached there again. And a VLAN trunk: two
//! namespaces on one router's uplink, each its own VLAN, carry tagged frames between two
//! sites with their tags and never each other's.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyphae_agent::control::{Layer2Status, NamespaceStatus};
use hyphae_testbed::{agent_section, lab_namespace, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.202.0.0/16";
const I_ADDR: Ipv4Addr = Ipv4Addr::new(10, 202, 0, 31);
const A1: Ipv4Addr = Ipv4Addr::new(10, 202, 1, 10);
const B1: Ipv4Addr = Ipv4Addr::new(10, 202, 2, 10);
/// IPv6 addresses of the same hosts: a layer-2 namespace carries IPv6 as it is.
const I6: &str = "fd00:202::31";
const A16: &str = "fd00:202::1:10";
const B16: &str = "fd00:202::2:10";
/// Broadcast, multicast and unknown-unicast frames a second each way (and the burst).
const FLOOD_RATE: u32 = 100;

/// Prints every frame of the given EtherTypes (hex, comma-separated) that `eth0`
/// receives for `argv[1]` seconds, one hex line each, with an 802.1Q tag the kernel took
/// off put back from the packet's auxiliary data (as libpcap does). Writes `argv[3]` once
/// it listens.
const RECEIVE: &str = "\
import select, socket, struct, sys, time
want = {int(t, 16) for t in sys.argv[2].split(',')}
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.setsockopt(263, 8, 1)  # SOL_PACKET, PACKET_AUXDATA
s.bind(('eth0', 0))
open(sys.argv[3], 'w').close()
deadline = time.time() + float(sys.argv[1])
while time.time() < deadline:
    if not select.select([s], [], [], 0.1)[0]:
        continue
    data, anc, _, addr = s.recvmsg(65535, socket.CMSG_SPACE(20))
    if addr[2] == socket.PACKET_OUTGOING:
        continue
    for level, kind, c in anc:
        if level == 263 and kind == 8 and len(c) >= 20:
            status, _, _, _, _, tci, tpid = struct.unpack('IIIHHHH', c[:20])
            if status & 0x10:  # TP_STATUS_VLAN_VALID
                data = data[:12] + struct.pack('!HH', tpid or 0x8100, tci) + data[12:]
    if struct.unpack('!H', data[12:14])[0] in want:
        print(data.hex(), flush=True)
";

/// Sends each frame given in hex on `eth0`, `argv[1]` times over.
const SEND: &str = "\
import socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(('eth0', 0))
for _ in range(int(sys.argv[1])):
    for h in sys.argv[2:]:
        s.send(bytes.fromhex(h))
";

const MB: usize = 1000 * 1000;

fn ns_status(bed: &Testbed, host: &Host, agent: &AgentHandle) -> NamespaceStatus {
    bed.namespace_status(host, agent).expect("status")
}

fn layer2(bed: &Testbed, host: &Host, agent: &AgentHandle) -> Layer2Status {
    ns_status(bed, host, agent)
        .layer2
        .expect("a layer-2 namespace shows its MAC table")
}

/// Waits until `check` holds, or fails with what it last said.
fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + within;
    loop {
        match check() {
            Ok(()) => return,
            Err(e) if Instant::now() >= deadline => panic!("{what}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

fn mac_of(bed: &Testbed, host: &Host) -> String {
    let out = bed
        .ns_output(&host.ns, "cat", &["/sys/class/net/eth0/address"])
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `count` IPv6 pings from `from` to `to`, all answered.
fn pings6(bed: &Testbed, from: &Host, to: &str, count: u32) -> Result<(), String> {
    let n = count.to_string();
    let out = bed
        .ns_output(
            &from.ns,
            "ping",
            &["-6", "-c", &n, "-i", "0.2", "-W", "2", to],
        )
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains(&format!(" {count} received")) {
        Ok(())
    } else {
        Err(format!("{} -> {to}: {text}", from.name))
    }
}

fn pings(bed: &Testbed, from: &Host, to: Ipv4Addr, count: u32) -> Result<(), String> {
    let out = bed.ping(from, to, count).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains(&format!(" {count} received")) {
        Ok(())
    } else {
        Err(text.into_owned())
    }
}

/// The interface member at 10.200.0.1 (where the routers look for the overlay), its
/// device `hyl0` at [`I_ADDR`].
fn interface_member(bed: &mut Testbed, secret: &Path) -> (Host, AgentHandle) {
    let i = bed.add_host("i", Ipv4Addr::new(10, 200, 0, 1)).unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&i),
        lab_namespace(
            secret,
            SUBNET,
            None,
            &format!("layer = 2\nmode = \"interface\"\ndevice = \"hyl0\"\naddress = \"{I_ADDR}\"\nbroadcast_rate = {FLOOD_RATE}\n"),
        )
    );
    let agent = bed.start_agent(&i, &cfg).unwrap();
    (i, agent)
}

/// A router site: its LAN, its host and its agent in the layer-2 namespace (its section
/// ending with `extra`).
fn router(
    bed: &mut Testbed,
    secret: &Path,
    (name, underlay): (&str, u8),
    extra: &str,
) -> (String, Host, AgentHandle) {
    let lan = bed.add_lan(&format!("lan{name}")).unwrap();
    let host = bed
        .add_host(name, Ipv4Addr::new(10, 200, 0, underlay))
        .unwrap();
    bed.plug(&lan, &host.ns, "eth1", 1500).unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&host).replacen("[agent]\n", "[agent]\nmetrics = \"127.0.0.1:9464\"\n", 1),
        lab_namespace(
            secret,
            SUBNET,
            Some(Ipv4Addr::new(10, 200, 0, 1)),
            &format!(
                "layer = 2\nmode = \"router\"\ndevice = \"hyr0\"\nbridge = \"brlan\"\nuplink = \"eth1\"\nbroadcast_rate = {FLOOD_RATE}\n{extra}"
            ),
        )
    );
    let agent = bed.start_agent(&host, &cfg).unwrap();
    (lan, host, agent)
}

/// Starts [`RECEIVE`] on `host` for `secs` seconds; its output file once it listens.
fn receive(bed: &mut Testbed, host: &Host, ethertypes: &str, secs: u32) -> (u32, PathBuf) {
    let out = host.dir.join(format!("frames-{ethertypes}.txt"));
    let ready = host.dir.join(format!("ready-{ethertypes}"));
    let _ = std::fs::remove_file(&ready);
    let pid = bed
        .spawn(
            &host.ns,
            "/usr/bin/python3",
            &[
                "-c",
                RECEIVE,
                &secs.to_string(),
                ethertypes,
                &ready.display().to_string(),
            ],
            &out,
        )
        .unwrap();
    eventually("the receiver listens", Duration::from_secs(10), || {
        ready.exists().then_some(()).ok_or_else(|| "not yet".into())
    });
    (pid, out)
}

fn send(bed: &Testbed, host: &Host, times: u32, frames: &[String]) {
    let mut args = vec!["-c", SEND];
    let times = times.to_string();
    args.push(&times);
    args.extend(frames.iter().map(String::as_str));
    let out = bed.ns_output(&host.ns, "/usr/bin/python3", &args).unwrap();
    assert!(
        out.status.success(),
        "send: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn hex_mac(mac: &str) -> String {
    mac.replace(':', "")
}

#[test]
fn a_layer2_namespace_carries_any_frame_between_two_sites() {
    require_root();
    let mut bed = Testbed::new("l2", Path::new(BIN)).unwrap();
    let secret = bed.dir().join("secret");
    hyphae_testbed::write_secret(&secret, "layer-two-secret").unwrap();

    // The interface member, the overlay's first.
    let (i, ia) = interface_member(&mut bed, &secret);
    let (lan1, r1, r1a) = router(&mut bed, &secret, ("r1", 2), "");
    let (lan2, r2, r2a) = router(&mut bed, &secret, ("r2", 3), "");
    let a1 = bed
        .add_lan_host(&lan1, "a1", &format!("{A1}/16"), 1500)
        .unwrap();
    let b1 = bed
        .add_lan_host(&lan2, "b1", &format!("{B1}/16"), 1500)
        .unwrap();
    let (a1_mac, b1_mac) = (mac_of(&bed, &a1), mac_of(&bed, &b1));

    // ARP and ping across the sites: the request is flooded, the reply goes to the one
    // member holding a1's MAC.
    eventually(
        "a1 pings b1 across the sites",
        Duration::from_secs(30),
        || pings(&bed, &a1, B1, 1),
    );
    pings(&bed, &a1, B1, 5).expect("a1 -> b1 on first try once resolved");
    eventually("i pings a1", Duration::from_secs(20), || {
        pings(&bed, &i, A1, 1)
    });
    pings(&bed, &b1, I_ADDR, 3).expect("b1 -> i");

    // Each router learned its LAN's MACs and heard the others'.
    let s1 = layer2(&bed, &r1, &r1a);
    assert!(s1.macs.contains(&a1_mac), "r1 learned a1: {s1:?}");
    assert!(!s1.macs.contains(&b1_mac), "b1 is not on r1's side: {s1:?}");
    assert!(s1.remote_macs >= 2, "r1 holds b1's and i's MACs: {s1:?}");
    assert!(
        s1.to_peer > 0 && s1.to_tap > 0 && s1.floods_out > 0,
        "{s1:?}"
    );
    let s2 = layer2(&bed, &r2, &r2a);
    assert!(s2.macs.contains(&b1_mac), "r2 learned b1: {s2:?}");
    let si = layer2(&bed, &i, &ia);
    assert_eq!(
        si.local_macs, 1,
        "an interface member holds its device's MAC: {si:?}"
    );

    // ARP suppression: once b1's own ARP has crossed, a1 resolving b1 again is answered at
    // r1 (with b1's MAC) and no ARP broadcast crosses.
    let before = layer2(&bed, &r1, &r1a);
    bed.ns(&a1.ns, "ip", &["neigh", "flush", "dev", "eth0"])
        .unwrap();
    pings(&bed, &a1, B1, 1).expect("a1 -> b1 after its ARP cache was flushed");
    let after = layer2(&bed, &r1, &r1a);
    assert_eq!(
        (
            after.arp_suppressed - before.arp_suppressed,
            after.arp_flooded - before.arp_flooded
        ),
        (1, 0),
        "one resolution, answered at r1: {after:?}"
    );
    assert_eq!(
        bed.neighbour(&a1, B1).unwrap().as_deref(),
        Some(b1_mac.as_str()),
        "a1 learned b1's own MAC"
    );

    // IPv6 crosses as any frame does, and neighbour solicitations are suppressed as ARP
    // is: once b1's advertisement has crossed, a1 resolving b1 again is answered at r1
    // with b1's own advertisement. The interface member's device speaks IPv6 too.
    for (host, dev, addr) in [(&a1, "eth0", A16), (&b1, "eth0", B16), (&i, "hyl0", I6)] {
        bed.ns(
            &host.ns,
            "ip",
            &[
                "-6",
                "addr",
                "add",
                &format!("{addr}/64"),
                "dev",
                dev,
                "nodad",
            ],
        )
        .unwrap();
    }
    eventually("a1 pings b1 over IPv6", Duration::from_secs(20), || {
        pings6(&bed, &a1, B16, 1)
    });
    eventually("i pings b1 over IPv6", Duration::from_secs(20), || {
        pings6(&bed, &i, B16, 1)
    });
    let before = layer2(&bed, &r1, &r1a);
    bed.ns(&a1.ns, "ip", &["-6", "neigh", "flush", "dev", "eth0"])
        .unwrap();
    pings6(&bed, &a1, B16, 1).expect("a1 -> b1 over IPv6 after its cache was flushed");
    let after = layer2(&bed, &r1, &r1a);
    assert!(
        after.nd_suppressed > before.nd_suppressed && after.nd_flooded == before.nd_flooded,
        "resolved at r1, nothing flooded: before {before:?} after {after:?}"
    );
    let neighbour = bed
        .ns_output(&a1.ns, "ip", &["-6", "neigh", "show", B16])
        .unwrap();
    let neighbour = String::from_utf8_lossy(&neighbour.stdout);
    assert!(
        neighbour.contains(&b1_mac),
        "a1 learned b1's own MAC: {neighbour}"
    );

    // The topology page has the MAC table: a1's MAC here, b1's at r2's row.
    let out = bed
        .ns_output(
            &r1.ns,
            "curl",
            &[
                "-s",
                "--max-time",
                "10",
                "http://127.0.0.1:9464/topology.json",
            ],
        )
        .unwrap();
    let topology: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ns = &topology["namespaces"][0];
    let here = ns["layer2"]["macs"].as_array().cloned().unwrap_or_default();
    assert!(here.iter().any(|m| m == &a1_mac), "{ns}");
    let members = ns["members"].as_array().cloned().unwrap_or_default();
    assert_eq!(members.len(), 2, "r2 and i are live members: {ns}");
    assert!(
        members.iter().any(|m| m["macs"]
            .as_array()
            .is_some_and(|macs| macs.iter().any(|x| x == &b1_mac))),
        "r2's row shows b1's MAC: {ns}"
    );
    assert!(ns["layer2"]["arp_suppressed"].as_u64() >= Some(1), "{ns}");
    // And a real browser renders it: the MAC-table line and b1's MAC in r2's row (shown,
    // or in the cell's title when r2 has more MACs than the cell shows; again until it
    // does: on a loaded machine the page's first poll may miss the dump).
    let profile = bed.dir().join("chromium");
    eventually(
        "chromium renders the MAC table",
        Duration::from_secs(60),
        || {
            let dom = bed
                .rendered_page(&r1, "http://127.0.0.1:9464/", &profile)
                .map_err(|e| e.to_string())?;
            let main = dom.split("<main").nth(1).unwrap_or(&dom).to_string();
            (main.contains("layer 2 · ")
                && main.contains("ARP answered here")
                && main.contains(&b1_mac))
            .then_some(())
            .ok_or_else(|| format!("the page: <main{main}"))
        },
    );

    // Frames no IP stack sends: a raw EtherType and an 802.1Q-tagged one (VLAN 100, with
    // a priority), unicast to b1, arrive byte-identical.
    let payload: String = (0..80u8).map(|b| format!("{b:02x}")).collect();
    let raw = format!("{}{}88b5{payload}", hex_mac(&b1_mac), hex_mac(&a1_mac));
    let tagged = format!(
        "{}{}8100a06488b5{payload}",
        hex_mac(&b1_mac),
        hex_mac(&a1_mac)
    );
    let (pid, out) = receive(&mut bed, &b1, "88b5,8100", 4);
    send(&bed, &a1, 1, &[raw.clone(), tagged.clone()]);
    eventually("the receiver ends", Duration::from_secs(15), || {
        (!bed.is_running(pid))
            .then_some(())
            .ok_or_else(|| "running".into())
    });
    let got = std::fs::read_to_string(&out).unwrap();
    let lines: Vec<&str> = got.lines().collect();
    assert_eq!(lines, vec![raw.as_str(), tagged.as_str()], "frames at b1");
    let s1_after = layer2(&bed, &r1, &r1a);
    assert!(
        s1_after.to_peer >= s1.to_peer + 2,
        "both went to r2 alone, not flooded: {s1_after:?}"
    );

    // Frames of the LAN's full MTU (1514 bytes) do not fit a tunnel packet of 1420:
    // they cross in pieces and are put back together at the other site.
    let out = bed
        .ns_output(
            &a1.ns,
            "ping",
            &[
                "-c",
                "3",
                "-i",
                "0.2",
                "-W",
                "2",
                "-s",
                "1472",
                "-M",
                "do",
                &B1.to_string(),
            ],
        )
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(" 3 received"), "full-size pings: {text}");
    let (f1, f2) = (layer2(&bed, &r1, &r1a), layer2(&bed, &r2, &r2a));
    assert!(
        f1.fragmented >= 3 && f2.reassembled >= 3,
        "r1 {f1:?} r2 {f2:?}"
    );
    assert!(
        f2.fragmented >= 3 && f1.reassembled >= 3,
        "the replies: r1 {f1:?} r2 {f2:?}"
    );
    assert_eq!(f1.drops["reassembly"] + f2.drops["reassembly"], 0);

    // Bulk TCP with TAP offloads: a1's kernel hands r1's TAP super-frames of full-size
    // frames, cut there into frames that cross in pieces; r2 writes b1's TAP coalesced
    // ones. The interface member's TAP does the same at its own MTU.
    let (t1, t2) = (ns_status(&bed, &r1, &r1a), ns_status(&bed, &r2, &r2a));
    bed.tcp_transfer(&a1, (&b1, B1), 5101, 20 * MB, Duration::from_secs(120))
        .expect("a1 -> b1 over TCP");
    bed.tcp_transfer(&i, (&a1, A1), 5102, 10 * MB, Duration::from_secs(120))
        .expect("i -> a1 over TCP");
    let (u1, u2) = (ns_status(&bed, &r1, &r1a), ns_status(&bed, &r2, &r2a));
    let ui = ns_status(&bed, &i, &ia);
    assert!(u1.offload && u2.offload && ui.offload, "offloads on");
    assert!(
        u1.super_frames > t1.super_frames,
        "r1 cut super-frames: {u1:#?}"
    );
    assert!(ui.super_frames > 0, "i cut super-frames: {ui:#?}");
    assert!(
        u2.coalesced_writes > t2.coalesced_writes,
        "r2 coalesced: {u2:#?}"
    );
    for s in [&u1, &u2, &ui] {
        assert_eq!(s.drops.get("offload_malformed"), Some(&0), "{s:#?}");
    }

    // A broadcast storm from a1: r1 floods at most its rate, drops the rest (counted),
    // and the sites keep reaching each other.
    let before = layer2(&bed, &r1, &r1a);
    let storm = format!("ffffffffffff{}88b5{payload}", hex_mac(&a1_mac));
    let started = Instant::now();
    send(&bed, &a1, 5000, &[storm]);
    let elapsed = started.elapsed().as_secs_f64();
    let after = layer2(&bed, &r1, &r1a);
    let flooded = (after.floods_out - before.floods_out) as f64;
    let limited = after.drops["flood_rate_limited"] - before.drops["flood_rate_limited"];
    // The bucket holds FLOOD_RATE and refills at FLOOD_RATE a second; a ping's ARP may
    // share it.
    let allowed = f64::from(FLOOD_RATE) * (1.0 + elapsed + 1.0);
    assert!(
        flooded <= allowed,
        "{flooded} floods in {elapsed:.2} s (at most {allowed})"
    );
    // Far more than the rate allowed reached r1 (the kernel may drop some of the 5000 on
    // the way), and what was over the rate was held back.
    assert!(
        limited as f64 > 5.0 * allowed,
        "{limited} dropped: {after:?}"
    );
    eprintln!(
        "storm: {flooded} flooded, {limited} dropped in {elapsed:.2} s; r1 before: {s1:?}; r1 after: {after:?}"
    );
    pings(&bed, &a1, B1, 3).expect("a1 -> b1 after the storm");
    pings(&bed, &i, A1, 3).expect("i -> a1 after the storm");

    // arping (ARP itself, as a tool sends it) across the sites.
    let out = bed
        .ns_output(
            &a1.ns,
            "arping",
            &["-c", "3", "-w", "5", "-I", "eth0", &B1.to_string()],
        )
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Received 3 response"),
        "arping a1 -> b1: {text}"
    );

    // A DHCP server on site 1 (dnsmasq on a1) leases an address to a client on site 2
    // (busybox udhcpc on c1): its broadcasts cross, the server's answers come back.
    let leases = a1.dir.join("dnsmasq.leases");
    bed.spawn(
        &a1.ns,
        "dnsmasq",
        &[
            "--no-daemon",
            "--port=0",
            "--interface=eth0",
            "--bind-interfaces",
            "--dhcp-range=10.202.3.100,10.202.3.150,255.255.0.0,1h",
            &format!("--dhcp-leasefile={}", leases.display()),
            &format!("--pid-file={}", a1.dir.join("dnsmasq.pid").display()),
            "--log-dhcp",
        ],
        &a1.dir.join("dnsmasq.log"),
    )
    .unwrap();
    let c1 = bed.add_lan_host(&lan2, "c1", "", 1500).unwrap();
    let (script, env) = hyphae_testbed::udhcpc_script(&c1).unwrap();
    let out = bed.udhcpc(&c1, "c1", &script).unwrap();
    let lease = std::fs::read_to_string(&env).unwrap_or_default();
    assert!(
        lease.contains("ip=10.202.3.1") && lease.contains("serverid=10.202.1.10"),
        "udhcpc on site 2: {}\n{lease}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Ipv4Addr = lease
        .lines()
        .find_map(|l| l.strip_prefix("ip="))
        .and_then(|a| a.parse().ok())
        .unwrap();
    pings(&bed, &a1, got, 2).expect("the server reaches its client on the far site");

    // b1 moves to site 1 keeping its MAC and address (a live migration), and says so with
    // a gratuitous ARP: r1 learns it and announces it, r2 lets it go once it has not heard
    // it for a second (b1 may have spoken there just before: its kernel's IPv6 router
    // solicitations), and the interface member reaches it again.
    let moves_before = layer2(&bed, &r1, &r1a).moves;
    let port = bed.bridge_port(&b1, &lan2).unwrap();
    bed.move_port(&port, &lan2, &lan1).unwrap();
    // arping waits a second after its one announcement: it runs beside the pings.
    let moved = Instant::now();
    bed.spawn(
        &b1.ns,
        "arping",
        &["-U", "-c", "1", "-I", "eth0", &B1.to_string()],
        &b1.dir.join("arping-U.log"),
    )
    .unwrap();
    let out = bed
        .ns_output(
            &i.ns,
            "ping",
            &["-c", "200", "-i", "0.01", "-w", "10", "-n", &B1.to_string()],
        )
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // icmp_seq of the first reply, 10 ms apart from the GARP's start.
    let first = text
        .lines()
        .find_map(|l| {
            l.split("icmp_seq=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<u32>()
                .ok()
        })
        .unwrap_or_else(|| panic!("i never reached b1 at its new site: {text}"));
    let took = moved.elapsed();
    eventually(
        "r2 lets b1 go, r1 holds it",
        Duration::from_secs(10),
        || {
            let (m1, m2) = (layer2(&bed, &r1, &r1a), layer2(&bed, &r2, &r2a));
            (m1.macs.contains(&b1_mac) && !m2.macs.contains(&b1_mac) && m1.moves > moves_before)
                .then_some(())
                .ok_or_else(|| format!("r1 {m1:?} r2 {m2:?}"))
        },
    );
    let replies = text.matches("bytes from").count();
    eprintln!(
        "moved MAC: first reply to icmp_seq {first} of pings 10 ms apart started with the GARP; {replies} of 200 answered; r1 holds it and r2 let it go after {took:?}"
    );
    // Its lease in the DHT followed it: r1 holds every MAC on its side, and no member's
    // announcement was ever refused (the move stayed within the grace).
    eventually(
        "b1's MAC lease follows it to r1",
        Duration::from_secs(15),
        || {
            let m1 = layer2(&bed, &r1, &r1a);
            (m1.mac_leases_unheld == 0 && m1.mac_leases_held >= 2)
                .then_some(())
                .ok_or_else(|| format!("r1 {m1:?}"))
        },
    );
    for (host, agent) in [(&i, &ia), (&r1, &r1a), (&r2, &r2a)] {
        let s = layer2(&bed, host, agent);
        assert_eq!(s.member_mac_refusals, 0, "{}: {s:?}", host.name);
        assert!(s.member_macs_verified >= 2, "{}: {s:?}", host.name);
    }
}

#[test]
fn a_mac_another_member_holds_is_refused_to_a_second_site() {
    require_root();
    let mut bed = Testbed::new("l2spoof", Path::new(BIN)).unwrap();
    let secret = bed.dir().join("secret");
    hyphae_testbed::write_secret(&secret, "layer-two-secret").unwrap();
    let (i, ia) = interface_member(&mut bed, &secret);
    let (lan1, r1, r1a) = router(&mut bed, &secret, ("r1", 2), "");
    let a1 = bed
        .add_lan_host(&lan1, "a1", &format!("{A1}/16"), 1500)
        .unwrap();
    let a1_mac = mac_of(&bed, &a1);
    eventually("i pings a1", Duration::from_secs(30), || {
        pings(&bed, &i, A1, 1)
    });
    eventually("r1 holds a1's MAC", Duration::from_secs(10), || {
        let s = layer2(&bed, &r1, &r1a);
        (s.macs.contains(&a1_mac) && s.mac_leases_unheld == 0)
            .then_some(())
            .ok_or_else(|| format!("{s:?}"))
    });
    // a1 keeps talking, so its MAC stays r1's.
    bed.spawn(
        &a1.ns,
        "ping",
        &["-i", "0.2", "-n", &I_ADDR.to_string()],
        &a1.dir.join("ping.log"),
    )
    .unwrap();

    // A host on a second site takes a1's MAC (a spoof, or a cloned VM): r2 learns and
    // announces it, but cannot hold its lease, and once the grace is over the members
    // drop r2's frames from it and send frames for it to r1 alone.
    let (lan2, r2, r2a) = router(&mut bed, &secret, ("r2", 3), "");
    let c1 = bed
        .add_lan_host(&lan2, "c1", &format!("{B1}/16"), 1500)
        .unwrap();
    bed.ns(&c1.ns, "ip", &["link", "set", "eth0", "address", &a1_mac])
        .unwrap();
    bed.spawn(
        &c1.ns,
        "arping",
        &["-U", "-i", "0.5", "-I", "eth0", &B1.to_string()],
        &c1.dir.join("arping.log"),
    )
    .unwrap();
    eventually(
        "r2 hears c1 and cannot hold its MAC",
        Duration::from_secs(20),
        || {
            let s = layer2(&bed, &r2, &r2a);
            (s.macs.contains(&a1_mac) && s.mac_leases_unheld >= 1)
                .then_some(())
                .ok_or_else(|| format!("{s:?}"))
        },
    );
    eventually(
        "i refuses r2's claim to the MAC",
        Duration::from_secs(20),
        || {
            let s = layer2(&bed, &i, &ia);
            (s.member_macs_refused >= 1 && s.member_mac_refusals >= 1)
                .then_some(())
                .ok_or_else(|| format!("{s:?}"))
        },
    );
    let r1_status = layer2(&bed, &r1, &r1a);
    assert!(
        r1_status.mac_leases_unheld == 0,
        "r1 kept a1's MAC: {r1_status:?}"
    );
    // i's frames for the MAC go to r1: a1 answers every ping.
    pings(&bed, &i, A1, 10).expect("i reaches a1, not its double");
    // Its switch has the MAC at r1 alone: r2's set is reported without it.
    let peers = ns_status(&bed, &i, &ia).peers;
    let with_mac: Vec<&str> = peers
        .iter()
        .filter(|p| p.macs.contains(&a1_mac))
        .map(|p| p.identity.as_str())
        .collect();
    let r1_id = bed.status(&r1, &r1a).unwrap().identity;
    assert_eq!(
        with_mac,
        vec![r1_id.as_str()],
        "r1 alone holds the MAC at i: {peers:?}"
    );
    let _ = (lan2, r2a);
}

/// A router site on a VLAN trunk: one agent, namespaces "red" (VLAN 10) and "blue"
/// (VLAN 20) on the same bridge and uplink.
fn trunk_site(
    bed: &mut Testbed,
    secrets: &[PathBuf; 2],
    name: &str,
    underlay: u8,
    bootstrap: Option<Ipv4Addr>,
) -> (String, Host, AgentHandle) {
    let lan = bed.add_lan(&format!("lan{name}")).unwrap();
    let host = bed
        .add_host(name, Ipv4Addr::new(10, 200, 0, underlay))
        .unwrap();
    bed.plug(&lan, &host.ns, "eth1", 1500).unwrap();
    let mut cfg = agent_section(&host);
    for (k, (ns, vlan)) in [("red", 10), ("blue", 20)].into_iter().enumerate() {
        cfg += &format!(
            "\n[[namespace]]\nname = \"{ns}\"\nsecret_file = \"{}\"\nsubnet = \"10.20{k}.0.0/16\"\nlayer = 2\nvlan = {vlan}\nmode = \"router\"\ndevice = \"hy{ns}\"\nbridge = \"brtrunk\"\nuplink = \"eth1\"\n",
            secrets[k].display()
        );
        if let Some(b) = bootstrap {
            cfg += &format!("bootstrap = [\"{b}:7400\"]\n");
        }
    }
    let agent = bed.start_agent(&host, &cfg).unwrap();
    (lan, host, agent)
}

fn trunk_status(bed: &Testbed, host: &Host, agent: &AgentHandle, ns: &str) -> Layer2Status {
    bed.status(host, agent)
        .unwrap()
        .namespaces
        .into_iter()
        .find(|n| n.name == ns)
        .and_then(|n| n.layer2)
        .unwrap_or_else(|| panic!("namespace {ns} is layer 2"))
}

#[test]
fn two_vlans_on_one_trunk_are_two_namespaces_that_never_meet() {
    require_root();
    let mut bed = Testbed::new("l2v", Path::new(BIN)).unwrap();
    let secrets = [bed.dir().join("red.secret"), bed.dir().join("blue.secret")];
    hyphae_testbed::write_secret(&secrets[0], "the-red-tenant-secret").unwrap();
    hyphae_testbed::write_secret(&secrets[1], "the-blue-tenant-secret").unwrap();
    let (lan1, r1, r1a) = trunk_site(&mut bed, &secrets, "t1", 2, None);
    let (lan2, r2, r2a) = trunk_site(
        &mut bed,
        &secrets,
        "t2",
        3,
        Some(Ipv4Addr::new(10, 200, 0, 2)),
    );
    // Plain hosts on each site's trunk, sending and taking tagged frames themselves.
    let h1 = bed.add_lan_host(&lan1, "h1", "", 1500).unwrap();
    let h2 = bed.add_lan_host(&lan2, "h2", "", 1500).unwrap();
    let (h1_mac, h2_mac) = (hex_mac(&mac_of(&bed, &h1)), hex_mac(&mac_of(&bed, &h2)));
    let payload: String = (0..60u8).map(|b| format!("{b:02x}")).collect();
    let tagged = |dst: &str, src: &str, vlan: u16| format!("{dst}{src}8100{vlan:04x}88b5{payload}");

    // Broadcasts on each VLAN until the far site has them: each arrives once, with its own
    // tag, and nothing else does.
    let red = tagged("ffffffffffff", &h1_mac, 10);
    let blue = tagged("ffffffffffff", &h1_mac, 20);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(40);
    while Instant::now() < deadline {
        let (pid, out) = receive(&mut bed, &h2, "8100", 2);
        send(&bed, &h1, 1, &[red.clone(), blue.clone()]);
        eventually("the receiver ends", Duration::from_secs(10), || {
            (!bed.is_running(pid))
                .then_some(())
                .ok_or_else(|| "running".into())
        });
        got = std::fs::read_to_string(&out)
            .unwrap()
            .lines()
            .map(String::from)
            .collect();
        if got.len() >= 2 {
            break;
        }
    }
    assert_eq!(got, vec![red.clone(), blue.clone()], "at h2");

    // Unicast back on VLAN 10 only: to h1, tagged 10; VLAN 20 never sees it.
    let back = tagged(&h1_mac, &h2_mac, 10);
    let (pid, out) = receive(&mut bed, &h1, "8100", 3);
    send(&bed, &h2, 1, std::slice::from_ref(&back));
    eventually("the receiver ends", Duration::from_secs(10), || {
        (!bed.is_running(pid))
            .then_some(())
            .ok_or_else(|| "running".into())
    });
    let at_h1: Vec<String> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(at_h1, vec![back], "at h1");

    let red2 = trunk_status(&bed, &r2, &r2a, "red");
    let blue2 = trunk_status(&bed, &r2, &r2a, "blue");
    let red1 = trunk_status(&bed, &r1, &r1a, "red");
    assert_eq!((red2.vlan, blue2.vlan), (Some(10), Some(20)));
    assert!(
        red2.macs.contains(&mac_of(&bed, &h2)),
        "red at t2 learned h2: {red2:?}"
    );
    assert!(
        !blue2.macs.contains(&mac_of(&bed, &h2)),
        "blue never heard h2: {blue2:?}"
    );
    assert!(red2.to_peer >= 1, "h2's reply went to t1 alone: {red2:?}");
    assert!(
        red1.to_tap >= 1 && red1.macs.contains(&mac_of(&bed, &h1)),
        "{red1:?}"
    );
    assert!(red2.drops["other_vlan"] > 0 && blue2.drops["other_vlan"] > 0);
    let _ = lan2;
}

#[test]
fn a_policy_decides_frames_by_ethertype_at_both_ends() {
    require_root();
    let mut bed = Testbed::new("l2pol", Path::new(BIN)).unwrap();
    let secret = bed.dir().join("secret");
    hyphae_testbed::write_secret(&secret, "layer-two-secret").unwrap();
    // IPv4 and ARP only, between any members; everything else denied.
    let policy = bed.dir().join("frames.policy.toml");
    std::fs::write(
        &policy,
        "default = \"deny\"\n[[rule]]\nfrom = [\"any\"]\nto = [\"any\"]\nethertypes = [\"ipv4\", \"arp\"]\n",
    )
    .unwrap();
    let extra = format!("policy = \"{}\"\n", policy.display());
    // r1 is at 10.200.0.1, where both look for the overlay.
    let (lan1, r1, r1a) = router(&mut bed, &secret, ("r1", 1), &extra);
    let (lan2, r2, r2a) = router(&mut bed, &secret, ("r2", 2), &extra);
    let a1 = bed
        .add_lan_host(&lan1, "a1", &format!("{A1}/16"), 1500)
        .unwrap();
    let b1 = bed
        .add_lan_host(&lan2, "b1", &format!("{B1}/16"), 1500)
        .unwrap();
    let (a1_mac, b1_mac) = (mac_of(&bed, &a1), mac_of(&bed, &b1));
    eventually(
        "a1 pings b1 across the sites",
        Duration::from_secs(30),
        || pings(&bed, &a1, B1, 1),
    );
    let s1 = ns_status(&bed, &r1, &r1a);
    assert!(
        s1.policy.rule_hits.first() > Some(&0),
        "IPv4 and ARP by rule 1: {:?}",
        s1.policy
    );

    // EtherType 0x88b5: unicast to b1 is denied at r1 (the sender), a broadcast at r2
    // (each receiver decides a flood); b1 hears neither.
    let (before1, before2) = (
        ns_status(&bed, &r1, &r1a).policy,
        ns_status(&bed, &r2, &r2a).policy,
    );
    let (pid, out) = receive(&mut bed, &b1, "88b5", 3);
    let payload: String = (0..60u8).map(|b| format!("{b:02x}")).collect();
    let unicast = format!("{}{}88b5{payload}", hex_mac(&b1_mac), hex_mac(&a1_mac));
    let broadcast = format!("ffffffffffff{}88b5{payload}", hex_mac(&a1_mac));
    send(&bed, &a1, 1, &[unicast, broadcast]);
    eventually("the receiver ends", Duration::from_secs(15), || {
        (!bed.is_running(pid))
            .then_some(())
            .ok_or_else(|| "running".into())
    });
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "",
        "b1 heard a denied frame"
    );
    let (after1, after2) = (
        ns_status(&bed, &r1, &r1a).policy,
        ns_status(&bed, &r2, &r2a).policy,
    );
    assert_eq!(
        after1.denied_out - before1.denied_out,
        1,
        "the unicast, at r1: {after1:?}"
    );
    assert!(
        after2.denied_in > before2.denied_in,
        "the broadcast, at r2: {after2:?}"
    );

    // IPv6 is not in the list: it does not cross, while IPv4 still does.
    for (host, addr) in [(&a1, A16), (&b1, B16)] {
        bed.ns(
            &host.ns,
            "ip",
            &[
                "-6",
                "addr",
                "add",
                &format!("{addr}/64"),
                "dev",
                "eth0",
                "nodad",
            ],
        )
        .unwrap();
    }
    assert!(
        pings6(&bed, &a1, B16, 2).is_err(),
        "IPv6 crossed a policy that denies it"
    );
    pings(&bed, &a1, B1, 3).expect("IPv4 still crosses");
}
