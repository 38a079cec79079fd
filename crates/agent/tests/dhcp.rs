#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The agent's virtual DHCP and DNS servers, end to end, with clients no one here wrote:
//! ISC `dhclient` on an interface-mode host (`address = "dhcp"`) and busybox `udhcpc` on a
//! router-mode LAN host each get an address from the DHT, the DNS server and the domain,
//! and are reachable at it; `dig` resolves members' names, IPOP's automatic names and
//! PTRs at the service address (UDP and TCP), names outside the zone are forwarded to a
//! real resolver (dnsmasq) or refused; `getent` resolves through the resolver DHCP set up;
//! `hyphae name set` claims a name or reports the clash. A client behind ISC `dhcrelay`
//! gets its address from a router agent through the relay; `dig` over its `dns_rate` is
//! sent to TCP by truncated answers and still gets every answer.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use hyphae_agent::control::NamespaceStatus;
use hyphae_testbed::{agent_section, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.201.0.0/16";

/// The namespace's service address: its DHCP server identifier and DNS server.
const SERVICE: &str = "10.201.0.1";

/// Short leases, so DHCP renewals (every half lease) happen during the test.
const LEASE_SECS: u64 = 10;

fn namespace(secret: &Path, bootstrap: Option<Ipv4Addr>, lines: &str) -> String {
    let lines = format!("lease_secs = {LEASE_SECS}\n{lines}");
    hyphae_testbed::lab_namespace(secret, SUBNET, bootstrap, &lines)
}

fn ns_status(bed: &Testbed, host: &Host, agent: &AgentHandle) -> NamespaceStatus {
    bed.namespace_status(host, agent).expect("status")
}

/// `dig @SERVICE ARGS` inside `host`: its output.
fn dig(bed: &Testbed, host: &Host, args: &[&str]) -> String {
    let server = format!("@{SERVICE}");
    let mut all = vec![server.as_str(), "+time=2", "+tries=3"];
    all.extend_from_slice(args);
    let out = bed.ns_output(&host.ns, "dig", &all).unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `dig +short` for one name and type: the answer lines.
fn short(bed: &Testbed, host: &Host, args: &[&str]) -> Vec<String> {
    let mut all = vec!["+short"];
    all.extend_from_slice(args);
    dig(bed, host, &all)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty() && !l.starts_with(';'))
        .collect()
}

/// The status dig printed (NOERROR, NXDOMAIN, REFUSED, ...).
fn rcode(bed: &Testbed, host: &Host, args: &[&str]) -> String {
    let text = dig(bed, host, args);
    text.split("status: ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("no status in dig output: {text}"))
        .to_string()
}

/// Asks until `check` holds for the answer (names are claimed and read asynchronously).
fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + within;
    loop {
        match check() {
            Ok(()) => return,
            Err(e) if Instant::now() >= deadline => panic!("{what}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(300)),
        }
    }
}

fn answers(bed: &Testbed, host: &Host, args: &[&str], expected: &str) -> Result<(), String> {
    let got = short(bed, host, args);
    if got == [expected] {
        Ok(())
    } else {
        Err(format!("dig {args:?} gave {got:?}, expected {expected}"))
    }
}

/// The IPv4 address on `dev` inside `host`, once one is there.
fn address_on(bed: &Testbed, host: &Host, dev: &str, within: Duration) -> Ipv4Addr {
    bed.address_on(host, dev, within).unwrap()
}

#[test]
fn dhcp_and_dns_with_real_clients() {
    require_root();
    let mut bed = Testbed::new("dh", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").unwrap();

    // A static member named "alpha" starts the overlay. It forwards names outside the
    // zone to a real resolver, dnsmasq, on its host's loopback.
    let a = bed.add_host("a", Ipv4Addr::new(10, 200, 0, 1)).unwrap();
    bed.spawn(
        &a.ns,
        "dnsmasq",
        &[
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
            "--port=5353",
            "--address=/outside.test/192.0.2.77",
            "--pid-file=",
            "--log-facility=-",
        ],
        &a.dir.join("dnsmasq.log"),
    )
    .unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&a),
        namespace(
            &secret,
            None,
            "address = \"10.201.0.10\"\nhostname = \"alpha\"\nresolvers = [\"127.0.0.1:5353\"]\n"
        )
    );
    let aa = bed.start_agent(&a, &cfg).unwrap();

    // An interface host whose address comes from its own DHCP client.
    let d = bed.add_host("d", Ipv4Addr::new(10, 200, 0, 2)).unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&d),
        // No resolvers (not the host's either): names outside the zone are REFUSED.
        namespace(
            &secret,
            Some(a.underlay),
            "address = \"dhcp\"\nresolvers = []\n"
        )
    );
    let da = bed.start_agent(&d, &cfg).unwrap();
    let resolv = bed.private_resolv_conf(&d).unwrap();
    let pid = d.dir.join("dhclient.pid").display().to_string();
    let leases = d.dir.join("dhclient.leases").display().to_string();
    // The client calls itself "bravo" (option 12) and asks for the usual options.
    let conf = d.dir.join("dhclient.conf");
    std::fs::write(
        &conf,
        "send host-name \"bravo\";\nrequest subnet-mask, broadcast-address, routers, domain-name, domain-name-servers, domain-search, host-name;\n",
    )
    .unwrap();
    let conf = conf.display().to_string();
    bed.spawn(
        &d.ns,
        "dhclient",
        &[
            "-d", "-v", "-4", "-cf", &conf, "-pf", &pid, "-lf", &leases, "hyphae0",
        ],
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
    assert!(
        lease_text.contains(&format!("option domain-name-servers {SERVICE}")),
        "{lease_text}"
    );
    let bound_at = Instant::now();
    let replies_at_bind = st.dhcp_replies;
    // Reachable from another member, both ways.
    bed.wait_for_ping(&a, got, Duration::from_secs(20))
        .expect("a -> dhcp host");
    bed.wait_for_ping(&d, Ipv4Addr::new(10, 201, 0, 10), Duration::from_secs(20))
        .expect("dhcp host -> a");
    assert!(resolv.exists());

    // A router with a LAN host that runs busybox udhcpc.
    let (lan, r, ra) = start_router(&mut bed, &secret, "lan", 3, Some(a.underlay));
    let l = bed
        .add_lan_host(&lan, "l", "", hyphae_agent::config::DEFAULT_MTU)
        .unwrap();
    let (script, env_file) = hyphae_testbed::udhcpc_script(&l).unwrap();
    let out = bed.udhcpc(&l, "charlie", &script).unwrap();
    assert!(
        out.status.success(),
        "udhcpc: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let env = std::fs::read_to_string(&env_file).unwrap();
    assert!(env.contains("domain=lab"), "{env}");
    assert!(env.contains(&format!("dns={SERVICE}")), "{env}");
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

    // DNS at the service address, answered by each host's own agent from the DHT.
    let alpha = "10.201.0.10";
    let (bravo, charlie) = (got.to_string(), lan_ip.to_string());
    eventually("names resolve from a", Duration::from_secs(20), || {
        answers(&bed, &a, &["alpha.lab"], alpha)?;
        answers(&bed, &a, &["bravo.lab"], &bravo)?;
        answers(&bed, &a, &["charlie.lab"], &charlie)
    });
    // IPOP's automatic names, and PTRs (the held name, else the automatic name).
    let auto = |ip: Ipv4Addr| {
        let o = ip.octets();
        format!("c{:03}{:03}{:03}.lab", o[1], o[2], o[3])
    };
    answers(&bed, &a, &[&auto(got)], &bravo).unwrap();
    answers(&bed, &d, &["C201000010.LAB"], alpha).unwrap();
    answers(&bed, &d, &["-x", alpha], "alpha.lab.").unwrap();
    eventually("PTRs carry the names", Duration::from_secs(20), || {
        answers(&bed, &a, &["-x", &bravo], "bravo.lab.")?;
        answers(&bed, &d, &["-x", &charlie], "charlie.lab.")
    });
    // The same over TCP, and from the router's LAN host (the router's agent answers).
    answers(&bed, &a, &["+tcp", "bravo.lab"], &bravo).unwrap();
    answers(&bed, &d, &["+tcp", "-x", alpha], "alpha.lab.").unwrap();
    answers(&bed, &l, &["alpha.lab"], alpha).unwrap();
    // Unknown names are NXDOMAIN; outside the zone, forwarded (a) or refused (d).
    assert_eq!(rcode(&bed, &a, &["nobody.lab"]), "NXDOMAIN");
    assert_eq!(
        rcode(&bed, &a, &[&auto(Ipv4Addr::new(10, 201, 9, 9))]),
        "NXDOMAIN"
    );
    answers(&bed, &a, &["outside.test"], "192.0.2.77").unwrap();
    assert_eq!(rcode(&bed, &d, &["outside.test"]), "REFUSED");
    // The service address answers ping too (the agent's service stack).
    assert!(bed
        .ping(&d, SERVICE.parse().unwrap(), 1)
        .unwrap()
        .status
        .success());
    // The resolver dhclient configured (nameserver and search domain from DHCP).
    let conf_text = std::fs::read_to_string(&resolv).unwrap_or_default();
    assert!(
        conf_text.contains(&format!("nameserver {SERVICE}")),
        "{conf_text}"
    );
    // (IPv4: alpha, an interface member, has an IPv6 address too, which `hosts` prefers.)
    for name in ["alpha.lab", "alpha", "charlie"] {
        let out = bed.ns_output(&d.ns, "getent", &["ahostsv4", name]).unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let expected = if name == "charlie" { &charlie } else { alpha };
        assert!(
            text.starts_with(&format!("{expected} ")),
            "getent hosts {name}: {text:?}"
        );
    }

    // `hyphae name set`: a name another member holds is refused with the reason; a free
    // one is claimed (replacing the DHCP client's own) and kept in the config file.
    let d_config = da.config.display().to_string();
    let out = bed
        .ns_output(
            &d.ns,
            BIN,
            &["name", "set", "lab", "alpha", "-c", &d_config],
        )
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("is held by member"),
        "{err}"
    );
    // ... and d keeps the name it had.
    answers(&bed, &d, &["bravo.lab"], &bravo).unwrap();
    assert_eq!(ns_status(&bed, &d, &da).names.get("bravo"), Some(&bravo));
    let out = bed
        .ns_output(
            &d.ns,
            BIN,
            &["name", "set", "lab", "delta", "-c", &d_config],
        )
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains(&format!("delta.lab is {bravo}")), "{said}");
    let text = std::fs::read_to_string(&da.config).unwrap();
    assert!(text.contains("hostname = \"delta\""), "{text}");
    let st = ns_status(&bed, &d, &da);
    assert_eq!(st.names.get("delta"), Some(&bravo), "{st:?}");
    assert!(
        !st.names.contains_key("bravo"),
        "one name per address: {st:?}"
    );
    answers(&bed, &a, &["delta.lab"], &bravo).unwrap();

    // Renewal: past two leases since binding, the client has renewed and the DHT still
    // says who holds the address (a fresh read: a's cache is shorter than that).
    let two_leases = Duration::from_secs(2 * LEASE_SECS + 1);
    std::thread::sleep(two_leases.saturating_sub(bound_at.elapsed()));
    let st = ns_status(&bed, &d, &da);
    assert!(
        st.dhcp_replies >= replies_at_bind + 2,
        "renewals answered: {st:?}"
    );
    assert!(st.address_claimed, "{st:?}");
    eventually(
        "the renewed record names delta",
        Duration::from_secs(15),
        || answers(&bed, &a, &["-x", &bravo], "delta.lab."),
    );
    let dns = ns_status(&bed, &a, &aa).dns;
    assert!(
        dns.udp_queries > 0 && dns.tcp_queries > 0 && dns.forwarded > 0,
        "{dns:?}"
    );
    assert!(dns.lookups > 0 && dns.nxdomain >= 2, "{dns:?}");

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
    // ... and the name with it: a fresh read finds nobody.
    eventually(
        "the released name is gone",
        Duration::from_secs(30),
        || match rcode(&bed, &a, &["delta.lab"]).as_str() {
            "NXDOMAIN" => Ok(()),
            other => Err(other.to_string()),
        },
    );
    // The static member was never disturbed.
    assert!(ns_status(&bed, &a, &aa).address_claimed);
}

/// A router-mode member on underlay host `10.200.0.{underlay}`, bridging a new LAN
/// `lan_name` (its `eth1`), bootstrapping from `boot`: the LAN, the host and the agent.
fn start_router(
    bed: &mut Testbed,
    secret: &Path,
    lan_name: &str,
    underlay: u8,
    boot: Option<Ipv4Addr>,
) -> (String, Host, AgentHandle) {
    let lan = bed.add_lan(lan_name).unwrap();
    let r = bed
        .add_host("r", Ipv4Addr::new(10, 200, 0, underlay))
        .unwrap();
    bed.plug(&lan, &r.ns, "eth1", 1500).unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&r),
        namespace(
            secret,
            boot,
            "mode = \"router\"\ndevice = \"hyr0\"\nbridge = \"brlan\"\nuplink = \"eth1\"\n"
        )
    );
    let agent = bed.start_agent(&r, &cfg).unwrap();
    (lan, r, agent)
}

/// RFC 2131 4.1 through a real relay agent: ISC `dhcrelay` sits between a client LAN and
/// the router's bridge LAN, adds option 82 (`-a`) and forwards to the service address; the
/// router's agent answers the relay at `giaddr`:67 with option 82 echoed (dhcrelay finds the
/// client's interface by it; tcpdump sees it on the wire), and busybox `udhcpc` behind the
/// relay gets an address.
#[test]
fn dhcp_through_a_relay_agent() {
    require_root();
    let found = std::process::Command::new("sh")
        .args(["-c", "command -v dhcrelay"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "dhcrelay is not installed: it comes with Debian's isc-dhcp-relay (scripts/deps installs it)"
    );
    let mut bed = Testbed::new("dr", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").unwrap();

    // The router, first member of the namespace, bridging its LAN.
    let (lan, r, ra) = start_router(&mut bed, &secret, "rlan", 1, None);

    // The relay: its server side on the router's LAN, its client side (giaddr) on a LAN
    // of its own, both inside the namespace subnet.
    let relay = bed
        .add_lan_host(
            &lan,
            "relay",
            "10.201.0.2/24",
            hyphae_agent::config::DEFAULT_MTU,
        )
        .unwrap();
    let clients = bed.add_lan("clan").unwrap();
    bed.plug(&clients, &relay.ns, "eth1", 1500).unwrap();
    bed.ns(
        &relay.ns,
        "ip",
        &["addr", "add", "10.201.50.1/24", "brd", "+", "dev", "eth1"],
    )
    .unwrap();
    // What the relay and the router's agent say to each other, decoded by tcpdump.
    let wire = relay.dir.join("tcpdump.log");
    bed.spawn(
        &relay.ns,
        "tcpdump",
        &["-i", "eth0", "-n", "-l", "-vv", "udp", "port", "67"],
        &wire,
    )
    .unwrap();
    // Capturing before the first DISCOVER (tcpdump is slow to start on a busy machine).
    eventually("tcpdump listening", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(&wire).unwrap_or_default();
        text.contains("listening on").then_some(()).ok_or(text)
    });
    let pid_file = relay.dir.join("dhcrelay.pid").display().to_string();
    let relay_log = relay.dir.join("dhcrelay.log");
    let relay_pid = bed
        .spawn(
            &relay.ns,
            "dhcrelay",
            &[
                "-4", "-d", "-a", "-iu", "eth0", "-id", "eth1", "-pf", &pid_file, SERVICE,
            ],
            &relay_log,
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        bed.is_running(relay_pid),
        "dhcrelay exited: {}",
        std::fs::read_to_string(&relay_log).unwrap_or_default()
    );

    // A client behind the relay.
    let c = bed.add_lan_host(&clients, "c", "", 1500).unwrap();
    let (script, env_file) = hyphae_testbed::udhcpc_script(&c).unwrap();
    let out = bed.udhcpc(&c, "echo", &script).unwrap();
    let relay_said = std::fs::read_to_string(&relay_log).unwrap_or_default();
    assert!(
        out.status.success(),
        "udhcpc through the relay: {}{}\ndhcrelay: {relay_said}\nrouter: {:?}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        ns_status(&bed, &r, &ra)
    );
    let env = std::fs::read_to_string(&env_file).unwrap();
    assert!(env.contains("domain=lab"), "{env}");
    assert!(env.contains(&format!("serverid={SERVICE}")), "{env}");
    let got = address_on(&bed, &c, "eth0", Duration::from_secs(5));
    assert!(
        SUBNET.parse::<ipnet::Ipv4Net>().unwrap().contains(&got),
        "{got}"
    );
    assert_ne!(got, Ipv4Addr::new(10, 201, 0, 2), "the relay's own address");
    let st = ns_status(&bed, &r, &ra);
    assert!(
        st.dhcp_relayed >= 2 && st.dhcp_relay_outside_subnet == 0,
        "DISCOVER and REQUEST came through the relay: {st:?}"
    );
    // The router holds the client's address in the DHT, as for a LAN host of its own.
    assert!(st.addresses.contains(&got.to_string()), "{st:?}");
    // On the wire: the agent's replies to the relay carry the option 82 the relay added
    // (its circuit id names the relay's client-side interface, eth1).
    let replies_in = |text: &str| {
        text.split("\n    ")
            .filter(|p| p.starts_with(&format!("{SERVICE}.67 > ")))
            .count()
    };
    // tcpdump may still be decoding the last reply.
    eventually(
        "OFFER and ACK to the relay on the wire",
        Duration::from_secs(5),
        || {
            let text = std::fs::read_to_string(&wire).unwrap_or_default();
            (replies_in(&text) >= 2).then_some(()).ok_or(text)
        },
    );
    let text = std::fs::read_to_string(&wire).unwrap_or_default();
    let replies: Vec<&str> = text
        .split("\n    ")
        .filter(|p| p.starts_with(&format!("{SERVICE}.67 > ")))
        .collect();
    for r in replies {
        assert!(
            r.contains("Agent-Information") && r.contains("Circuit-ID") && r.contains("eth1"),
            "a reply to the relay without its option 82:\n{r}"
        );
    }
}

/// Per-source DNS limits as a real client meets them: `dig` asking 100 times in a row,
/// far over `dns_rate`, gets truncated answers it retries over TCP and drops it retries
/// after its timeout, and in the end every answer; the agent counts both.
#[test]
fn over_its_dns_rate_a_real_client_is_slowed_then_sent_to_tcp() {
    require_root();
    let mut bed = Testbed::new("rl", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").unwrap();
    let a = bed.add_host("a", Ipv4Addr::new(10, 200, 0, 1)).unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&a),
        namespace(
            &secret,
            None,
            "address = \"10.201.0.10\"\nhostname = \"alpha\"\ndns_rate = 20\n"
        )
    );
    let aa = bed.start_agent(&a, &cfg).unwrap();
    eventually("alpha resolves", Duration::from_secs(20), || {
        answers(&bed, &a, &["alpha.lab"], "10.201.0.10")
    });
    // Past the burst the answer above took, the bucket is full again.
    std::thread::sleep(Duration::from_secs(2));
    let batch = |name: &str, n: usize| {
        let path = a.dir.join(name);
        std::fs::write(&path, "alpha.lab A\n".repeat(n)).unwrap();
        path.display().to_string()
    };
    let dig = |batch: &str| -> Vec<String> {
        vec![
            format!("@{SERVICE}"),
            "+short".into(),
            "+time=1".into(),
            "+tries=4".into(),
            "-f".into(),
            batch.into(),
        ]
    };
    let count = |text: &str| text.lines().filter(|l| l.trim() == "10.201.0.10").count();

    // One client asking 60 in a row, three times its rate: slowed, every answer over UDP.
    let one = batch("one", 60);
    let args = dig(&one);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = bed.ns_output(&a.ns, "dig", &args).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(count(&text), 60, "every query answered: {text}");
    let dns = ns_status(&bed, &a, &aa).dns;
    assert!(dns.rate_limited_delayed >= 30, "{dns:?}");
    assert_eq!(dns.rate_limited, 0, "nothing truncated or dropped: {dns:?}");
    assert_eq!(dns.tcp_queries, 0, "{dns:?}");
    std::thread::sleep(Duration::from_secs(2));

    // Twenty clients at once from the same host: more outstanding than half a second of
    // its rate holds, so some are answered truncated, and dig asks those again over TCP.
    let many = batch("many", 8);
    let args = dig(&many);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let logs: Vec<(u32, std::path::PathBuf)> = (0..20)
        .map(|i| {
            let log = a.dir.join(format!("dig-{i}.log"));
            (bed.spawn(&a.ns, "dig", &args, &log).unwrap(), log)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while logs.iter().any(|(pid, _)| bed.is_running(*pid)) {
        assert!(Instant::now() < deadline, "the digs did not finish");
        std::thread::sleep(Duration::from_millis(100));
    }
    let answered: usize = logs
        .iter()
        .map(|(_, log)| count(&std::fs::read_to_string(log).unwrap()))
        .sum();
    assert_eq!(answered, 160, "every query answered in the end");
    let dns = ns_status(&bed, &a, &aa).dns;
    assert!(dns.rate_limited_truncated > 0, "{dns:?}");
    assert_eq!(
        dns.rate_limited,
        dns.rate_limited_truncated + dns.rate_limited_dropped
    );
    assert!(
        dns.tcp_queries >= dns.rate_limited_truncated,
        "each truncated answer was asked again over TCP: {dns:?}"
    );
}
