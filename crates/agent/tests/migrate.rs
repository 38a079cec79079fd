#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Migration handoff between two router sites (issue 14; IPOP Sec. 5, Fig. 11), with real
//! parts only: router agents r1 and r2 bridge LAN 1 and LAN 2, an interface member `i` sits
//! on the underlay, and a plain LAN host (no hyphae; busybox `udhcpc` got its address and
//! the name `vm1` from r1's virtual DHCP server) moves: its veth's bridge end leaves LAN 1's
//! bridge for LAN 2's, keeping IP and MAC, and it announces itself; four moves, each way
//! with `arping -U` and each way with a RARP frame as QEMU's announce-self sends it. After each
//! move: the new router took the address over and the old one handed it off (status), `i`
//! reaches the host, `dig` still answers its DHCP-given name with its address, a DHCP
//! request for the same address is acknowledged by the new router, and a TCP stream
//! (iperf3, `i` to the host) runs through all moves and ends without a reset.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use hyphae_agent::control::NamespaceStatus;
use hyphae_testbed::{agent_section, lab_namespace, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.201.0.0/16";
/// The virtual DHCP and DNS server's address in every agent (the subnet's first).
const SERVICE: &str = "10.201.0.1";
/// The interface member's namespace address.
const I_ADDR: &str = "10.201.0.31";
/// The old router is killed outright: it releases nothing.
const SIGKILL: i32 = 9;

/// QEMU's announce-self frame (net/announce.c): broadcast, EtherType 0x8035, ARP layout
/// with operation 3, the guest's MAC as sender and target, no addresses, padded to 60
/// bytes; three rounds as QEMU sends several.
const SEND_RARP: &str = "\
import socket, time
mac = bytes.fromhex(open('/sys/class/net/eth0/address').read().strip().replace(':', ''))
frame = b'\\xff' * 6 + mac + b'\\x80\\x35' + b'\\x00\\x01\\x08\\x00\\x06\\x04\\x00\\x03'
frame += mac + bytes(4) + mac + bytes(4)
frame += bytes(60 - len(frame))
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(('eth0', 0))
for i in range(3):
    s.send(frame)
    time.sleep(0.05 + 0.1 * i)
";

fn ns_status(bed: &Testbed, host: &Host, agent: &AgentHandle) -> NamespaceStatus {
    bed.namespace_status(host, agent).expect("status")
}

/// Waits until `check` holds, or fails with what it last said.
fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + within;
    loop {
        match check() {
            Ok(()) => return,
            Err(e) if Instant::now() >= deadline => panic!("{what}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// A router site: its LAN (a bridge namespace), its host and its agent.
struct Site {
    lan: String,
    host: Host,
    agent: AgentHandle,
}

fn router(bed: &mut Testbed, secret: &Path, name: &str, underlay: u8, lease_secs: u64) -> Site {
    let lan = bed.add_lan(&format!("lan{name}")).unwrap();
    let host = bed
        .add_host(name, Ipv4Addr::new(10, 200, 0, underlay))
        .unwrap();
    bed.plug(&lan, &host.ns, "eth1", 1500).unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&host),
        lab_namespace(
            secret,
            SUBNET,
            Some(Ipv4Addr::new(10, 200, 0, 1)),
            &format!("mode = \"router\"\ndevice = \"hyr0\"\nbridge = \"brlan\"\nuplink = \"eth1\"\nlease_secs = {lease_secs}\n"),
        )
    );
    let agent = bed.start_agent(&host, &cfg).unwrap();
    Site { lan, host, agent }
}

/// The interface member `i` (10.201.0.31) on the underlay, the overlay's first member.
fn interface_member(bed: &mut Testbed, secret: &Path, lease_secs: u64) -> (Host, AgentHandle) {
    let i = bed.add_host("i", Ipv4Addr::new(10, 200, 0, 1)).unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&i),
        lab_namespace(
            secret,
            SUBNET,
            None,
            &format!("mode = \"interface\"\ndevice = \"hyi0\"\naddress = \"10.201.0.31\"\nlease_secs = {lease_secs}\n"),
        )
    );
    let agent = bed.start_agent(&i, &cfg).unwrap();
    (i, agent)
}

/// The MAC `vm`'s ARP cache has for the interface member.
fn remote_neighbour(bed: &Testbed, vm: &Host) -> String {
    let out = bed
        .ns_output(&vm.ns, "ip", &["neigh", "show", I_ADDR, "dev", "eth0"])
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)
        .unwrap_or_else(|| panic!("no ARP entry for {I_ADDR}: {text}"))
        .to_string()
}

/// `dig +short @SERVICE name` inside `host`.
fn resolve(bed: &Testbed, host: &Host, name: &str) -> Vec<String> {
    bed.dig_short(host, SERVICE, name).unwrap()
}

/// A `udhcpc` script that sets the address it is given.
fn udhcpc_script(host: &Host) -> String {
    let script = host.dir.join("udhcpc.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\ncase \"$1\" in\n  bound|renew)\n    ip addr flush dev \"$interface\"\n    ip addr add \"$ip/$mask\" dev \"$interface\"\n    ;;\nesac\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script.display().to_string()
}

/// busybox `udhcpc` once on the VM, naming itself `vm1`, asking for `requested` if given.
fn udhcpc(bed: &Testbed, vm: &Host, script: &str, requested: Option<Ipv4Addr>) -> String {
    let requested = requested.map(|a| a.to_string());
    let mut args = vec![
        "udhcpc",
        "-x",
        "hostname:vm1",
        "-i",
        "eth0",
        "-f",
        "-q",
        "-n",
        "-t",
        "10",
        "-T",
        "1",
        "-s",
        script,
    ];
    if let Some(r) = &requested {
        args.extend(["-r", r.as_str()]);
    }
    let out = bed.ns_output(&vm.ns, "busybox", &args).unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "udhcpc: {text}");
    text
}

/// Waits until `to` took the host over (`n` handoffs in) and `from` handed it off.
fn handed_over(bed: &Testbed, from: &Site, to: &Site, n: u64, vm_ip: Ipv4Addr) {
    eventually(
        "the handoff between the routers",
        Duration::from_secs(20),
        || {
            let (f, t) = (
                ns_status(bed, &from.host, &from.agent),
                ns_status(bed, &to.host, &to.agent),
            );
            let ip = vm_ip.to_string();
            if t.handoffs_in >= n
                && f.handoffs_out >= n
                && t.addresses.contains(&ip)
                && !f.addresses.contains(&ip)
            {
                Ok(())
            } else {
                Err(format!(
                    "target in {} holds {:?}, source out {} holds {:?}",
                    t.handoffs_in, t.addresses, f.handoffs_out, f.addresses
                ))
            }
        },
    );
}

#[test]
fn a_lan_host_keeps_its_address_name_lease_and_tcp_stream_across_router_sites() {
    require_root();
    let mut bed = Testbed::new("migr", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").unwrap();

    let (i, ia) = interface_member(&mut bed, &secret, 30);
    let r1 = router(&mut bed, &secret, "r1", 2, 30);
    let r2 = router(&mut bed, &secret, "r2", 3, 30);

    // The VM: a DHCP client of r1's LAN.
    let vm = bed.add_lan_host(&r1.lan, "vm", "", 1420).unwrap();
    let script = udhcpc_script(&vm);
    udhcpc(&bed, &vm, &script, None);
    let vm_ip = bed.address_on(&vm, "eth0", Duration::from_secs(5)).unwrap();
    bed.wait_for_ping(&i, vm_ip, Duration::from_secs(30))
        .expect("i -> VM before the moves");
    eventually("the VM's name", Duration::from_secs(20), || {
        let got = resolve(&bed, &i, "vm1.lab");
        (got == [vm_ip.to_string()])
            .then_some(())
            .ok_or(format!("vm1.lab is {got:?}"))
    });

    // A TCP stream through both moves: iperf3 ends with an error on a reset.
    let server_log = bed.dir().join("iperf-s.log");
    bed.spawn(&vm.ns, "iperf3", &["-s", "-1"], &server_log)
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let client_log = bed.dir().join("iperf-c.log");
    let ip = vm_ip.to_string();
    let client = bed
        .spawn(
            &i.ns,
            "iperf3",
            &["-c", &ip, "-t", "30", "-b", "1M"],
            &client_log,
        )
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));

    // Each way with each announcement: gratuitous ARP (arping -U) and RARP only (no
    // address in it).
    let port = bed.bridge_port(&vm, &r1.lan).unwrap();
    let sites = [&r1, &r2];
    let mut handoffs_in = [0u64; 2];
    for (k, how) in ["garp", "garp", "rarp", "rarp"].into_iter().enumerate() {
        let (from, to) = (sites[k % 2], sites[(k + 1) % 2]);
        // A live-migrated guest keeps its ARP cache; moving the veth flushes it (carrier
        // loss), so it is put back as it was: remote members at the old router's MAC.
        bed.wait_for_ping(&vm, I_ADDR.parse().unwrap(), Duration::from_secs(5))
            .expect("VM -> i before the move");
        let neighbour = remote_neighbour(&bed, &vm);
        bed.move_port(&port, &from.lan, &to.lan).unwrap();
        bed.ns(
            &vm.ns,
            "ip",
            &[
                "neigh",
                "replace",
                I_ADDR,
                "lladdr",
                &neighbour,
                "dev",
                "eth0",
                "nud",
                "reachable",
            ],
        )
        .unwrap();
        let moved = Instant::now();
        let out = match how {
            "garp" => bed
                .ns_output(
                    &vm.ns,
                    "arping",
                    &["-q", "-U", "-c", "2", "-I", "eth0", &ip],
                )
                .unwrap(),
            _ => bed
                .ns_output(&vm.ns, "python3", &["-c", SEND_RARP])
                .unwrap(),
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("not found"), "{how}: {stderr}");
        handoffs_in[(k + 1) % 2] += 1;
        handed_over(&bed, from, to, handoffs_in[(k + 1) % 2], vm_ip);
        bed.wait_for_ping(&i, vm_ip, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("i -> VM after move {k} ({how}): {e}"));
        eprintln!("move {k} ({how}): back after {:?}", moved.elapsed());
        // The guest's own traffic, through its surviving ARP entry.
        bed.wait_for_ping(&vm, I_ADDR.parse().unwrap(), Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("VM -> i after move {k} ({how}): {e}"));
        let st = ns_status(&bed, &to.host, &to.agent);
        assert!(st.last_handoff_ms.is_some_and(|ms| ms < 5000), "{st:?}");
        // The name and the DHCP lease came along: the new router acknowledges the address.
        eventually(
            "the VM's name after the move",
            Duration::from_secs(20),
            || {
                let got = resolve(&bed, &i, "vm1.lab");
                (got == [ip.clone()])
                    .then_some(())
                    .ok_or(format!("vm1.lab is {got:?}"))
            },
        );
        if k < 2 {
            let text = udhcpc(&bed, &vm, &script, Some(vm_ip));
            assert!(text.contains(&ip), "{text}");
            assert_eq!(
                bed.address_on(&vm, "eth0", Duration::from_secs(2)).unwrap(),
                vm_ip
            );
        }
    }

    // The stream ran through all moves and ended cleanly.
    let deadline = Instant::now() + Duration::from_secs(50);
    while bed.is_running(client) {
        assert!(Instant::now() < deadline, "iperf3 did not end");
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = std::fs::read_to_string(&client_log).unwrap_or_default();
    assert!(
        log.contains("iperf Done") && !log.contains("error"),
        "the TCP stream did not survive: {log}"
    );
    for (host, agent) in [(&i, &ia), (&r1.host, &r1.agent), (&r2.host, &r2.agent)] {
        let text = std::fs::read_to_string(&agent.log).unwrap_or_default();
        assert!(!text.contains("panicked"), "{}: {text}", host.name);
    }
}

/// The old router died before the host moved: the new router asks it 4 times (2 s), says
/// so, and claims the address when the old lease lapses (at most `lease_secs`, 10 s here);
/// the host is reachable again.
#[test]
fn a_dead_old_router_lets_the_new_one_take_the_host_when_its_lease_lapses() {
    require_root();
    let mut bed = Testbed::new("migd", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").unwrap();
    let (i, _ia) = interface_member(&mut bed, &secret, 10);
    let r1 = router(&mut bed, &secret, "r1", 2, 10);
    let r2 = router(&mut bed, &secret, "r2", 3, 10);
    let vm = bed
        .add_lan_host(&r1.lan, "vm", "10.201.0.50/16", 1420)
        .unwrap();
    let vm_ip = Ipv4Addr::new(10, 201, 0, 50);
    // The host speaks first (a static address is not known until it does).
    bed.wait_for_ping(&vm, Ipv4Addr::new(10, 201, 0, 31), Duration::from_secs(30))
        .expect("VM -> i");
    bed.wait_for_ping(&i, vm_ip, Duration::from_secs(10))
        .expect("i -> VM");

    bed.signal(r1.agent.pid, SIGKILL).unwrap();
    assert!(!bed.is_running(r1.agent.pid), "the old router still runs");
    let killed = Instant::now();
    let port = bed.bridge_port(&vm, &r1.lan).unwrap();
    bed.move_port(&port, &r1.lan, &r2.lan).unwrap();
    bed.ns_output(
        &vm.ns,
        "arping",
        &["-q", "-U", "-c", "2", "-I", "eth0", "10.201.0.50"],
    )
    .unwrap();
    eventually(
        "the new router takes the host once the old lease lapses",
        Duration::from_secs(30),
        || {
            let st = ns_status(&bed, &r2.host, &r2.agent);
            if st.addresses.contains(&vm_ip.to_string()) && st.handoffs_in == 1 {
                Ok(())
            } else {
                Err(format!(
                    "r2 holds {:?}, {} in",
                    st.addresses, st.handoffs_in
                ))
            }
        },
    );
    eprintln!(
        "taken over {:?} after the old router died",
        killed.elapsed()
    );
    bed.wait_for_ping(&i, vm_ip, Duration::from_secs(15))
        .expect("i -> VM through the new router");
    let log = std::fs::read_to_string(&r2.agent.log).unwrap_or_default();
    assert!(
        log.contains("old router does not answer"),
        "the new router does not say why it waited: {log}"
    );
}
