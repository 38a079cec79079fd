#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A router-mode agent sees what a migrated VM sends on arrival (issue 14, detection): a
//! gratuitous ARP from `arping -U` and a RARP frame laid out as QEMU's announce-self sends
//! it, from a real LAN host on the router's bridge. Both count in `hyphae status --json`
//! (`lan_announcements`), and the host is learned.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyphae_testbed::{agent_section, lab_namespace, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");

/// QEMU's announce-self frame (net/announce.c): broadcast, EtherType 0x8035, ARP layout
/// with operation 3, the guest's MAC as sender and target, no addresses, padded to 60
/// bytes; sent on `eth0` through an AF_PACKET socket.
const SEND_RARP: &str = "\
import socket
mac = bytes.fromhex(open('/sys/class/net/eth0/address').read().strip().replace(':', ''))
frame = b'\\xff' * 6 + mac + b'\\x80\\x35' + b'\\x00\\x01\\x08\\x00\\x06\\x04\\x00\\x03'
frame += mac + bytes(4) + mac + bytes(4)
frame += bytes(60 - len(frame))
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(('eth0', 0))
s.send(frame)
";

fn announcements(bed: &Testbed, host: &Host, agent: &AgentHandle) -> u64 {
    bed.namespace_status(host, agent)
        .expect("status")
        .lan_announcements
}

/// Waits until the router counted at least `n` announcements; returns the count.
fn wait_for(bed: &Testbed, host: &Host, agent: &AgentHandle, n: u64) -> u64 {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = announcements(bed, host, agent);
        if seen >= n {
            return seen;
        }
        assert!(
            Instant::now() < until,
            "{seen} announcements counted, expected {n}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn router_counts_gratuitous_arp_and_rarp_from_a_lan_host() {
    require_root();
    let mut bed = Testbed::new("lanann", Path::new(BIN)).expect("testbed");
    let secret: PathBuf = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").unwrap();
    let lan = bed.add_lan("lan").unwrap();
    let rh = bed.add_host("r", Ipv4Addr::new(10, 200, 0, 2)).unwrap();
    bed.plug(&lan, &rh.ns, "eth1", 1500).unwrap();
    let vm = bed
        .add_lan_host(&lan, "vm", "10.201.0.11/16", 1420)
        .unwrap();
    let cfg = format!(
        "{}{}mode = \"router\"\ndevice = \"hyr0\"\nbridge = \"brlan\"\nuplink = \"eth1\"\n",
        agent_section(&rh),
        lab_namespace(&secret, "10.201.0.0/16", None, "lease_secs = 30\n"),
    );
    let ra = bed.start_agent(&rh, &cfg).unwrap();
    assert_eq!(announcements(&bed, &rh, &ra), 0);

    // `arping -U` sends unsolicited ARP requests for its own address; it expects no
    // answer, so its exit status says nothing here.
    let out = bed
        .ns_output(
            &vm.ns,
            "arping",
            &["-U", "-c", "2", "-I", "eth0", "10.201.0.11"],
        )
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("not found"), "arping: {stderr}");
    let after_garp = wait_for(&bed, &rh, &ra, 2);
    let status = bed.namespace_status(&rh, &ra).unwrap();
    assert!(
        status.lan_hosts.contains(&"10.201.0.11".to_string()),
        "{:?}",
        status.lan_hosts
    );

    let out = bed
        .ns_output(&vm.ns, "python3", &["-c", SEND_RARP])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(&bed, &rh, &ra, after_garp + 1);
    let log = std::fs::read_to_string(&ra.log).unwrap_or_default();
    assert!(!log.contains("panicked"), "{log}");
}
