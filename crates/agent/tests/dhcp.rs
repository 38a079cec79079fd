#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The agent's virtual DHCP server, end to end, with DHCP clients no one here wrote: ISC
//! `dhclient` on an interface-mode host (`address = "dhcp"`) and busybox `udhcpc` on a
//! router-mode LAN host. Each gets an address from the DHT and is reachable at it.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use hyphae_agent::control::NamespaceStatus;
use hyphae_agent::testbed::{agent_section, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.201.0.0/16";

fn namespace(secret: &Path, bootstrap: Option<Ipv4Addr>, lines: &str) -> String {
    let mut c = format!(
        "\n[[namespace]]\nname = \"lab\"\nsecret_file = \"{}\"\nsubnet = \"{SUBNET}\"\nlease_secs = 30\n{lines}",
        secret.display()
    );
    if let Some(b) = bootstrap {
        c += &format!("bootstrap = [\"{b}:7400\"]\n");
    }
    c
}

fn ns_status(bed: &Testbed, host: &Host, agent: &AgentHandle) -> NamespaceStatus {
    bed.status(host, agent)
        .expect("status")
        .namespaces
        .remove(0)
}

/// The IPv4 address on `dev` inside `host`, once one is there.
fn address_on(bed: &Testbed, host: &Host, dev: &str, within: Duration) -> Ipv4Addr {
    let deadline = Instant::now() + within;
    loop {
        let out = bed
            .ns_output(&host.ns, "ip", &["-4", "-o", "addr", "show", "dev", dev])
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(a) = text
            .split_whitespace()
            .skip_while(|w| *w != "inet")
            .nth(1)
            .and_then(|cidr| cidr.split('/').next())
            .and_then(|a| a.parse().ok())
        {
            return a;
        }
        assert!(
            Instant::now() < deadline,
            "{}: no address on {dev} within {within:?}",
            host.name
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn dhclient_and_udhcpc_get_addresses_from_the_dht() {
    require_root();
    let mut bed = Testbed::new("dh", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    std::fs::write(&secret, "a namespace secret for tests\n").unwrap();

    // A static member starts the overlay.
    let a = bed.add_host("a", Ipv4Addr::new(10, 200, 0, 1)).unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&a),
        namespace(&secret, None, "address = \"10.201.0.10\"\n")
    );
    let aa = bed.start_agent(&a, &cfg).unwrap();

    // An interface host whose address comes from its own DHCP client.
    let d = bed.add_host("d", Ipv4Addr::new(10, 200, 0, 2)).unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&d),
        namespace(&secret, Some(a.underlay), "address = \"dhcp\"\n")
    );
    let da = bed.start_agent(&d, &cfg).unwrap();
    let resolv = bed.private_resolv_conf(&d).unwrap();
    let pid = d.dir.join("dhclient.pid").display().to_string();
    let leases = d.dir.join("dhclient.leases").display().to_string();
    bed.spawn(
        &d.ns,
        "dhclient",
        &["-d", "-v", "-4", "-pf", &pid, "-lf", &leases, "hyphae0"],
        &d.dir.join("dhclient.log"),
    )
    .unwrap();
    let got = address_on(&bed, &d, "hyphae0", Duration::from_secs(40));
    assert!(
        SUBNET.parse::<ipnet::Ipv4Net>().unwrap().contains(&got),
        "{got}"
    );
    let st = ns_status(&bed, &d, &da);
    assert!(st.address_claimed, "the DHT lease is held: {st:?}");
    assert!(st.dhcp_requests >= 2 && st.dhcp_replies >= 2, "{st:?}");
    assert_eq!(st.address, got.to_string());
    let lease_text = std::fs::read_to_string(&leases).unwrap_or_default();
    assert!(
        lease_text.contains("option domain-name \"lab\""),
        "{lease_text}"
    );
    assert!(
        lease_text.contains("option subnet-mask 255.255.0.0"),
        "{lease_text}"
    );
    // Reachable from another member, both ways.
    bed.wait_for_ping(&a, got, Duration::from_secs(20))
        .expect("a -> dhcp host");
    bed.wait_for_ping(&d, Ipv4Addr::new(10, 201, 0, 10), Duration::from_secs(20))
        .expect("dhcp host -> a");
    assert!(resolv.exists());

    // A router with a LAN host that runs busybox udhcpc.
    let lan = bed.add_lan("lan").unwrap();
    let r = bed.add_host("r", Ipv4Addr::new(10, 200, 0, 3)).unwrap();
    bed.plug(&lan, &r.ns, "eth1", 1500).unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&r),
        namespace(
            &secret,
            Some(a.underlay),
            "mode = \"router\"\ndevice = \"hyr0\"\nbridge = \"brlan\"\nuplink = \"eth1\"\n"
        )
    );
    let ra = bed.start_agent(&r, &cfg).unwrap();
    let l = bed.add_lan_host(&lan, "l", "", 1420).unwrap();
    let script = l.dir.join("udhcpc.sh");
    let env_file = l.dir.join("udhcpc.env");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncase \"$1\" in\n  bound|renew)\n    ip addr flush dev \"$interface\"\n    ip addr add \"$ip/$mask\" dev \"$interface\"\n    env > {}\n    ;;\n  deconfig) ip addr flush dev \"$interface\" ;;\nesac\n",
            env_file.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = bed
        .ns_output(
            &l.ns,
            "busybox",
            &[
                "udhcpc",
                "-i",
                "eth0",
                "-f",
                "-q",
                "-n",
                "-t",
                "20",
                "-T",
                "1",
                "-s",
                &script.display().to_string(),
            ],
        )
        .unwrap();
    assert!(
        out.status.success(),
        "udhcpc: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let env = std::fs::read_to_string(&env_file).unwrap();
    assert!(env.contains("domain=lab"), "{env}");
    let lan_ip = address_on(&bed, &l, "eth0", Duration::from_secs(5));
    assert_ne!(lan_ip, got, "two clients, one address");
    // The router holds the LAN host's address in the DHT, and it is reachable.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ns_status(&bed, &r, &ra)
        .addresses
        .contains(&lan_ip.to_string())
    {
        assert!(
            Instant::now() < deadline,
            "the router does not hold {lan_ip}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    bed.wait_for_ping(&a, lan_ip, Duration::from_secs(20))
        .expect("a -> LAN host");
    bed.wait_for_ping(&d, lan_ip, Duration::from_secs(20))
        .expect("dhcp host -> LAN host");

    // dhclient -r releases the lease: the DHT lease goes with it.
    let out = bed
        .ns_output(
            &d.ns,
            "dhclient",
            &["-r", "-v", "-pf", &pid, "-lf", &leases, "hyphae0"],
        )
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while ns_status(&bed, &d, &da).address_claimed {
        assert!(
            Instant::now() < deadline,
            "the DHT lease outlived the DHCP release"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The static member was never disturbed.
    assert!(ns_status(&bed, &a, &aa).address_claimed);
}
