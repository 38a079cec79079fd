#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The virtual DNS server under load and as a forwarder, end to end with clients and
//! servers no one here wrote: `dnsperf` sends a fixed burst of queries for held names,
//! names and automatic names read from the DHT, and PTRs, and every one is answered while
//! the DHT is read at most once per key (the status counter shows the cache at work); a
//! namespace with no `resolvers` forwards to the resolver in its host's resolv.conf
//! (dnsmasq on loopback) from a new source port and id each time (tcpdump sees them), and
//! an answer that resolver truncates over UDP reaches `dig` in full because the agent asked
//! again over TCP.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use hyphae_agent::control::NamespaceStatus;
use hyphae_testbed::{agent_section, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.201.0.0/16";
const SERVICE: &str = "10.201.0.1";

fn namespace(secret: &Path, bootstrap: Option<Ipv4Addr>, lines: &str) -> String {
    hyphae_testbed::lab_namespace(secret, SUBNET, bootstrap, lines)
}

fn ns_status(bed: &Testbed, host: &Host, agent: &AgentHandle) -> NamespaceStatus {
    bed.namespace_status(host, agent).expect("status")
}

/// `dig @server ARGS` inside `host`: its output.
fn dig_at(bed: &Testbed, host: &Host, server: &str, args: &[&str]) -> String {
    let server = format!("@{server}");
    let mut all = vec![server.as_str(), "+time=2", "+tries=2"];
    all.extend_from_slice(args);
    let out = bed.ns_output(&host.ns, "dig", &all).unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The answer lines of `dig +short` at the service address.
fn short(bed: &Testbed, host: &Host, args: &[&str]) -> Vec<String> {
    let mut all = vec!["+short"];
    all.extend_from_slice(args);
    dig_at(bed, host, SERVICE, &all)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty() && !l.starts_with(';'))
        .collect()
}

/// Asks until `name` (with `args`) answers `expected` (names are claimed and read
/// asynchronously).
fn eventually_answers(bed: &Testbed, host: &Host, args: &[&str], expected: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = short(bed, host, args);
        if got == [expected] {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "dig {args:?} gave {got:?}, expected {expected}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The number after `label` in dnsperf's report (`Queries sent:         500`).
fn figure(report: &str, label: &str) -> u64 {
    report
        .lines()
        .find_map(|l| l.trim().strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no '{label}' in dnsperf's report:\n{report}"))
}

#[test]
fn a_burst_of_queries_is_answered_in_full_reading_the_dht_once_per_key() {
    require_root();
    let mut bed = Testbed::new("dp", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").unwrap();
    let a = bed.add_host("a", Ipv4Addr::new(10, 200, 0, 1)).unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&a),
        namespace(
            &secret,
            None,
            "address = \"10.201.0.10\"\nhostname = \"alpha\"\nresolvers = []\n"
        )
    );
    let aa = bed.start_agent(&a, &cfg).unwrap();
    let b = bed.add_host("b", Ipv4Addr::new(10, 200, 0, 2)).unwrap();
    let cfg = format!(
        "{}{}",
        agent_section(&b),
        namespace(
            &secret,
            Some(a.underlay),
            "address = \"10.201.0.20\"\nhostname = \"bravo\"\nresolvers = []\n"
        )
    );
    bed.start_agent(&b, &cfg).unwrap();
    // Every name answers once (bravo's are read from the DHT by alpha's agent).
    eventually_answers(&bed, &a, &["alpha.lab"], "10.201.0.10");
    eventually_answers(&bed, &a, &["bravo.lab"], "10.201.0.20");
    eventually_answers(&bed, &a, &["C201000020.lab"], "10.201.0.20");
    eventually_answers(&bed, &a, &["-x", "10.201.0.20"], "bravo.lab.");

    // Held by the asking agent: alpha and its automatic name; read from the DHT: bravo's
    // name (one key), bravo's address for its automatic name and PTR (one key).
    let queries = a.dir.join("queries");
    std::fs::write(
        &queries,
        "alpha.lab A\nC201000010.lab A\nbravo.lab A\nC201000020.lab A\n20.0.201.10.in-addr.arpa PTR\n",
    )
    .unwrap();
    let before = ns_status(&bed, &a, &aa).dns;
    // 100 passes over the 5 names: 500 queries, under the default 5000-query burst of one
    // source (`dns_rate`), 20 at a time.
    let out = bed
        .ns_output(
            &a.ns,
            "dnsperf",
            &[
                "-s",
                SERVICE,
                "-d",
                &queries.display().to_string(),
                "-n",
                "100",
                "-q",
                "20",
                "-t",
                "5",
            ],
        )
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(figure(&report, "Queries sent:"), 500, "{report}");
    assert_eq!(figure(&report, "Queries completed:"), 500, "{report}");
    assert_eq!(figure(&report, "Queries lost:"), 0, "{report}");
    let rcodes = report
        .lines()
        .find_map(|l| l.trim().strip_prefix("Response codes:"))
        .map(|r| r.split_whitespace().collect::<Vec<_>>().join(" "));
    assert_eq!(
        rcodes.as_deref(),
        Some("NOERROR 500 (100.00%)"),
        "every answer found: {report}"
    );
    let after = ns_status(&bed, &a, &aa).dns;
    assert_eq!(after.udp_queries - before.udp_queries, 500, "{after:?}");
    assert_eq!(after.answered - before.answered, 500, "{after:?}");
    assert_eq!(after.rate_limited, before.rate_limited, "{after:?}");
    // The cache answered: at most one DHT read per key (two keys), and one only if the
    // cached read expired during the burst.
    assert!(
        after.lookups - before.lookups <= 2,
        "DHT reads during the burst: {} ({before:?} -> {after:?})",
        after.lookups - before.lookups
    );
}

#[test]
fn host_resolvers_by_default_and_truncated_answers_fetched_over_tcp() {
    require_root();
    let mut bed = Testbed::new("fw", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").unwrap();
    let a = bed.add_host("a", Ipv4Addr::new(10, 200, 0, 1)).unwrap();
    // The host's resolver: dnsmasq on loopback, named in the host's own resolv.conf (which
    // `ip netns exec` mounts over /etc/resolv.conf for the agent). It answers
    // big.outside.test with 60 addresses (about 1 kB), and truncates UDP answers at 512
    // bytes whatever the client's EDNS buffer.
    let resolv = bed.private_resolv_conf(&a).unwrap();
    std::fs::write(&resolv, "nameserver 127.0.0.1\n").unwrap();
    let hosts = a.dir.join("big.hosts");
    let lines: String = (1..=60)
        .map(|i| format!("192.0.2.{i} big.outside.test\n"))
        .collect();
    std::fs::write(&hosts, lines).unwrap();
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
            "--edns-packet-max=512",
            &format!("--addn-hosts={}", hosts.display()),
            "--address=/small.test/192.0.2.77",
            "--pid-file=",
            "--log-facility=-",
        ],
        &a.dir.join("dnsmasq.log"),
    )
    .unwrap();
    // No `resolvers`: the host's.
    let cfg = format!(
        "{}{}",
        agent_section(&a),
        namespace(
            &secret,
            None,
            "address = \"10.201.0.10\"\nhostname = \"alpha\"\n"
        )
    );
    let aa = bed.start_agent(&a, &cfg).unwrap();
    let st = ns_status(&bed, &a, &aa);
    assert_eq!(st.dns.resolvers, ["127.0.0.1:53"], "{:?}", st.dns);
    eventually_answers(&bed, &a, &["alpha.lab"], "10.201.0.10");
    eventually_answers(&bed, &a, &["small.test"], "192.0.2.77");

    // RFC 5452: each forwarded query leaves from a port of its own with an id of its own,
    // as tcpdump on the host's loopback sees them.
    let capture = a.dir.join("tcpdump.log");
    bed.spawn(
        &a.ns,
        "tcpdump",
        &[
            "-i",
            "lo",
            "-n",
            "-l",
            "udp and dst host 127.0.0.1 and dst port 53",
        ],
        &capture,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&capture)
        .unwrap_or_default()
        .contains("listening on")
    {
        assert!(Instant::now() < deadline, "tcpdump did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    for i in 0..8 {
        let name = format!("q{i}.small.test");
        assert_eq!(short(&bed, &a, &[&name]), ["192.0.2.77"], "{name}");
    }
    // "IP 127.0.0.1.PORT > 127.0.0.1.53: ID+ A? qN.small.test. (..)"
    let mut sources = std::collections::HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while sources.len() < 8 {
        assert!(
            Instant::now() < deadline,
            "tcpdump saw {} of the 8 forwarded queries: {}",
            sources.len(),
            std::fs::read_to_string(&capture).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
        let text = std::fs::read_to_string(&capture).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains(".small.test.")) {
            let words: Vec<&str> = line.split_whitespace().collect();
            let Some(at) = words.iter().position(|w| *w == "IP") else {
                continue;
            };
            let port = words.get(at + 1).and_then(|s| s.rsplit('.').next());
            let id = words.get(at + 4).map(|w| w.trim_end_matches(['+', '%']));
            let name = words.iter().find(|w| w.ends_with(".small.test."));
            if let (Some(port), Some(id), Some(name)) = (port, id, name) {
                sources.insert(name.to_string(), (port.to_string(), id.to_string()));
            }
        }
    }
    let ports: std::collections::HashSet<_> = sources.values().map(|(p, _)| p).collect();
    let ids: std::collections::HashSet<_> = sources.values().map(|(_, i)| i).collect();
    assert_eq!(ports.len(), 8, "a source port per query: {sources:?}");
    assert_eq!(ids.len(), 8, "an id per query: {sources:?}");

    // Asked directly over UDP, the resolver truncates the big answer.
    let direct = dig_at(&bed, &a, "127.0.0.1", &["+ignore", "big.outside.test"]);
    assert!(
        direct.contains(" tc"),
        "dnsmasq truncates over UDP: {direct}"
    );
    // Through the agent over UDP (dig's 1232-byte EDNS buffer, `+ignore`: no retry over
    // TCP of its own), the client gets all 60 addresses, untruncated.
    let before = ns_status(&bed, &a, &aa).dns;
    let full = dig_at(&bed, &a, SERVICE, &["+ignore", "big.outside.test"]);
    let flags = full
        .lines()
        .find(|l| l.contains("flags:"))
        .unwrap_or_else(|| panic!("no flags in {full}"));
    assert!(!flags.contains(" tc"), "{full}");
    let addresses = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("big.outside.test.") && l.contains("\tA\t"))
            .count()
    };
    assert_eq!(addresses(&full), 60, "{full}");
    let after = ns_status(&bed, &a, &aa).dns;
    assert_eq!(
        after.forwarded_truncated - before.forwarded_truncated,
        1,
        "the truncated UDP answer was asked again over TCP: {after:?}"
    );
    assert_eq!(after.resolver_rejected, 0, "{after:?}");
    // A client over TCP: its query goes over TCP, and it gets them all.
    let tcp = dig_at(&bed, &a, SERVICE, &["+tcp", "big.outside.test"]);
    assert_eq!(addresses(&tcp), 60, "{tcp}");
    // A client without EDNS takes 512 bytes over UDP: it is told to use TCP (TC, no
    // records) and gets them all there (dig retries over TCP by itself).
    let plain = dig_at(
        &bed,
        &a,
        SERVICE,
        &["+noedns", "+ignore", "big.outside.test"],
    );
    assert!(plain.contains(" tc"), "{plain}");
    assert_eq!(addresses(&plain), 0, "{plain}");
    let retried = dig_at(&bed, &a, SERVICE, &["+noedns", "big.outside.test"]);
    assert_eq!(addresses(&retried), 60, "{retried}");
}
