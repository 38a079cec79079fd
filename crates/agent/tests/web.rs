#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End-to-end tests of `[agent] metrics`: a real scrape of a running agent checked by
//! `promtool check metrics` and against every number of its `hyphae status --json`, and
//! the topology page rendered by a real headless browser (chromium) in the agent's network
//! namespace, which shows a namespace's members and drops one that leaves.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyphae_testbed::{join_config, require_root, AgentHandle, Host, Testbed};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.203.0.0/24";
const METRICS: &str = "127.0.0.1:9400";

struct Member {
    host: Host,
    agent: AgentHandle,
    address: Ipv4Addr,
}

fn underlay(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, 0, i)
}

/// Hosts h1..hN named `alpha`, `beta`, ... with `auto` addresses and the metrics listener
/// on loopback; h1 starts the overlay. Returns once every member holds its address.
fn start_members(bed: &mut Testbed, n: u8) -> Vec<Member> {
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "the metrics test namespace secret\n").unwrap();
    let names = ["alpha", "beta", "gamma"];
    let mut members = Vec::new();
    for i in 1..=n {
        let host = bed.add_host(&format!("h{i}"), underlay(i)).unwrap();
        let boot = (i > 1).then(|| underlay(1));
        let config = join_config(&host, "lab", &secret, SUBNET, "auto", boot, 30).replacen(
            "[agent]\n",
            &format!("[agent]\nmetrics = \"{METRICS}\"\n"),
            1,
        ) + &format!("hostname = \"{}\"\n", names[usize::from(i) - 1]);
        // alpha's namespace has a cap, a share of a rated uplink and a cap per member (the
        // page shows each).
        let config = if i == 1 {
            config.replacen("[agent]\n", "[agent]\nuplink_rate = \"100M\"\n", 1)
                + "rate = \"50M\"\nweight = 3\n\
                   [[namespace.cap]]\nmembers = [\"any\"]\ningress = \"40M\"\nweight = 2\n"
        } else {
            config
        };
        let agent = bed.start_agent(&host, &config).unwrap();
        members.push(Member {
            host,
            agent,
            address: Ipv4Addr::UNSPECIFIED,
        });
    }
    for m in &mut members {
        m.address = bed.claimed_address(&m.host, &m.agent).unwrap();
    }
    members
}

/// `curl` inside the host's namespace: (HTTP status, body).
fn http(bed: &Testbed, host: &Host, args: &[&str]) -> (u16, String) {
    let mut full = vec!["-s", "-S", "--max-time", "10", "-w", "\n%{http_code}"];
    full.extend_from_slice(args);
    let out = bed.ns_output(&host.ns, "curl", &full).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// The samples of a scrape: name → label set (sorted `k=v` pairs) → value.
fn samples(text: &str) -> BTreeMap<String, BTreeMap<Vec<String>, f64>> {
    let mut out: BTreeMap<String, BTreeMap<Vec<String>, f64>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line.rsplit_once(' ').expect(line);
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let inner = rest.strip_suffix('}').expect(line);
                let mut labels: Vec<String> = inner
                    .split("\",")
                    .filter(|p| !p.is_empty())
                    .map(|p| p.trim_end_matches('"').replacen("=\"", "=", 1))
                    .collect();
                labels.sort();
                (name, labels)
            }
            None => (series, Vec::new()),
        };
        out.entry(name.to_string())
            .or_default()
            .insert(labels, value.parse().expect(line));
    }
    out
}

/// Every number (and boolean) of a status, with the metric name and labels the naming
/// rule of the README gives it: the field's path joined by `_`, under `hyphae_namespace`
/// (label `namespace`) or `hyphae_peer` (labels `namespace`, `member`), a `drops` map as
/// one `..._drops` family with a `reason` label (and so a `..._refused` map).
fn expected(
    prefix: &str,
    labels: &[String],
    object: &serde_json::Map<String, Value>,
    out: &mut Vec<(String, Vec<String>, f64)>,
) {
    for (key, value) in object {
        let name = format!("{prefix}_{key}");
        match value {
            Value::Number(n) => out.push((name, labels.to_vec(), n.as_f64().unwrap())),
            Value::Bool(b) => out.push((name, labels.to_vec(), f64::from(u8::from(*b)))),
            Value::Object(drops) if key == "drops" || key.ends_with("_refused") => {
                for (reason, n) in drops {
                    let mut l = labels.to_vec();
                    l.push(format!("reason={reason}"));
                    out.push((name.clone(), l, n.as_f64().unwrap()));
                }
            }
            Value::Object(inner) => expected(&name, labels, inner, out),
            Value::Array(items) if key == "namespaces" || key == "peers" => {
                for item in items {
                    let item = item.as_object().unwrap();
                    let (prefix, label) = if key == "namespaces" {
                        (
                            "hyphae_namespace",
                            format!("namespace={}", item["name"].as_str().unwrap()),
                        )
                    } else {
                        (
                            "hyphae_peer",
                            format!("member={}", item["identity"].as_str().unwrap()),
                        )
                    };
                    let mut l = labels.to_vec();
                    l.push(label);
                    expected(prefix, &l, item, out);
                }
            }
            _ => {}
        }
    }
}

#[test]
fn metrics_cover_every_status_number_and_pass_promtool() {
    require_root();
    let mut bed = Testbed::new("met", Path::new(BIN)).expect("testbed");
    let members = start_members(&mut bed, 2);
    let (a, b) = (&members[0], &members[1]);
    bed.wait_for_ping(&a.host, b.address, Duration::from_secs(20))
        .unwrap();

    let status = bed
        .ns(
            &a.host.ns,
            BIN,
            &[
                "status",
                "--json",
                "-c",
                &a.agent.config.display().to_string(),
            ],
        )
        .unwrap();
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    let (code, scrape) = http(&bed, &a.host, &[&format!("http://{METRICS}/metrics")]);
    assert_eq!(code, 200, "{scrape}");

    // promtool lints the real scrape (names, units, _total suffixes, help texts).
    let file = bed.dir().join("scrape.txt");
    std::fs::write(&file, &scrape).unwrap();
    let lint = bed
        .ns_output(
            &a.host.ns,
            "sh",
            &[
                "-c",
                &format!("promtool check metrics < {}", file.display()),
            ],
        )
        .unwrap();
    assert!(
        lint.status.success() && lint.stdout.is_empty() && lint.stderr.is_empty(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );

    // Every number of the status is in the scrape, under the name the rule gives it.
    let scraped = samples(&scrape);
    let mut wanted = Vec::new();
    expected("hyphae", &[], status.as_object().unwrap(), &mut wanted);
    wanted.retain(|(name, _, _)| name != "hyphae_version");
    assert!(
        wanted.len() > 80,
        "too few numbers in the status: {}",
        wanted.len()
    );
    let mut missing = Vec::new();
    for (name, labels, value) in &wanted {
        let mut labels = labels.clone();
        labels.sort();
        let seconds = name
            .strip_suffix("_ms")
            .or_else(|| name.strip_suffix("_secs"))
            .map(|base| format!("{base}_seconds"));
        let found = [format!("{name}_total"), name.clone()]
            .into_iter()
            .chain(seconds)
            .find_map(|n| Some((n.clone(), *scraped.get(&n)?.get(&labels)?)));
        match found {
            // Counters only grow: the scrape came after the status.
            Some((n, v)) if n.ends_with("_total") => {
                assert!(v >= *value, "{n}{labels:?} = {v}, status had {value}")
            }
            Some(_) => {}
            None => missing.push(format!("{name} {labels:?}")),
        }
    }
    assert!(
        missing.is_empty(),
        "not in /metrics: {missing:#?}\n{scrape}"
    );

    // The member the ping went to is labelled by namespace and identity, with its traffic.
    let b_id = bed.status(&b.host, &b.agent).unwrap().identity;
    let rx = scraped["hyphae_peer_rx_bytes_total"]
        [&vec![format!("member={b_id}"), "namespace=lab".to_string()]];
    assert!(rx > 0.0, "no traffic counted from the member pinged");
    let label_names: BTreeSet<&str> = scraped
        .values()
        .flat_map(|series| series.keys().flatten())
        .map(|l| l.split('=').next().unwrap())
        .collect();
    // `worker` is bounded by `[agent] workers` (at most 64), `le` by the histogram's buckets,
    // `cap` by the namespace's caps (at most 64).
    assert_eq!(
        label_names,
        BTreeSet::from(["cap", "le", "member", "namespace", "reason", "worker"]),
        "only bounded labels"
    );
    // How long the workers waited for the data plane: a histogram with one series per
    // worker, counting the batches the ping made.
    let waits: f64 = scraped["hyphae_worker_lock_wait_seconds_count"]
        .values()
        .sum();
    assert!(waits > 0.0, "no lock waits counted:\n{scrape}");

    // Anything but GET/HEAD of a known path is refused; a huge request head is not read.
    let url = format!("http://{METRICS}/");
    assert_eq!(http(&bed, &a.host, &["-X", "POST", &url]).0, 405);
    let (code, head) = http(&bed, &a.host, &["-I", &format!("{url}metrics")]);
    assert_eq!(code, 200, "{head}");
    assert!(
        head.contains("version=0.0.4") && !head.contains("hyphae_"),
        "{head}"
    );
    assert_eq!(http(&bed, &a.host, &[&format!("{url}nothing")]).0, 404);
    let big = format!("X-Big: {}", "a".repeat(20_000));
    assert_eq!(
        http(&bed, &a.host, &["-H", &big, &url]).0,
        0,
        "oversized head answered"
    );
    let (code, json) = http(&bed, &a.host, &[&format!("{url}topology.json")]);
    assert_eq!(code, 200);
    let topology: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(topology["namespaces"][0]["members"][0]["identity"], b_id);
}

/// Renders the page until its member rows satisfy `done` (60 s at most: the agent on a
/// loaded machine may be slow to drop a tunnel); returns the page and its rows.
fn render_until(
    bed: &Testbed,
    host: &Host,
    profile: &Path,
    done: impl Fn(&BTreeMap<String, String>) -> bool,
) -> (String, BTreeMap<String, String>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let dom = bed
            .rendered_page(host, &format!("http://{METRICS}/"), profile)
            .expect("chromium");
        let rows = member_rows(&dom);
        if done(&rows) {
            return (dom, rows);
        }
        let main = dom.split("<main").nth(1).unwrap_or(&dom);
        assert!(
            Instant::now() < deadline,
            "page not as expected after 60 s: <main{main}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The member rows of a rendered page: identity → the row's text.
fn member_rows(dom: &str) -> BTreeMap<String, String> {
    dom.split("<tr ")
        .skip(1)
        .filter_map(|row| {
            let id = row.split("data-member=\"").nth(1)?.split('"').next()?;
            let end = row.find("</tr>").unwrap_or(row.len());
            Some((id.to_string(), row[..end].to_string()))
        })
        .collect()
}

#[test]
fn the_topology_page_shows_the_members_and_drops_one_that_leaves() {
    require_root();
    let mut bed = Testbed::new("page", Path::new(BIN)).expect("testbed");
    let members = start_members(&mut bed, 3);
    let a = &members[0];
    for m in &members[1..] {
        bed.wait_for_ping(&a.host, m.address, Duration::from_secs(20))
            .unwrap();
    }
    let ids: Vec<String> = members
        .iter()
        .map(|m| bed.status(&m.host, &m.agent).unwrap().identity)
        .collect();
    let profile: PathBuf = bed.dir().join("chromium");
    // Each member's IPv6 address (the namespace is dual-stack with no configuration).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let v6: Vec<String> = members
        .iter()
        .map(|m| loop {
            let a6 = bed.status(&m.host, &m.agent).unwrap().namespaces[0]
                .address6
                .clone();
            if !a6.is_empty() {
                break a6;
            }
            assert!(std::time::Instant::now() < deadline, "no IPv6 address");
            std::thread::sleep(Duration::from_millis(200));
        })
        .collect();

    // Every member with its addresses and name (the names come from the DHT, read when
    // the page first asks, so they may take a poll or two; IPv6 addresses come with the
    // members' announcements).
    let names = ["alpha.lab", "beta.lab", "gamma.lab"];
    let (dom, rows) = render_until(&bed, &a.host, &profile, |rows| {
        rows.len() == 3
            && ids.iter().zip(names).zip(&v6).all(|((id, n), a6)| {
                rows.get(id)
                    .is_some_and(|r| r.contains(n) && r.contains(a6.as_str()))
            })
    });
    for (m, id) in members.iter().zip(&ids) {
        assert!(rows[id].contains(&m.address.to_string()), "{}", rows[id]);
    }
    let prefix = bed.status(&a.host, &a.agent).unwrap().namespaces[0]
        .subnet6
        .clone();
    assert!(
        dom.contains(&prefix),
        "the IPv6 prefix in the heading: {dom}"
    );
    assert!(rows[&ids[0]].contains("this agent"), "{}", rows[&ids[0]]);
    assert!(rows[&ids[1]].contains("direct"), "{}", rows[&ids[1]]);
    assert!(dom.contains("live · updated"), "{dom}");
    // alpha's cap and share, with what they carried between two polls.
    assert!(dom.contains("egress cap 50 Mbit/s · "), "{dom}");
    assert!(
        dom.contains("share: weight 3 of a 100 Mbit/s uplink · "),
        "{dom}"
    );
    assert!(dom.contains("B/s · 0 queued"), "{dom}");
    assert!(
        dom.contains("cap 1, members any: ingress 40 Mbit/s per member · "),
        "{dom}"
    );
    assert!(
        dom.contains("cap 1, members any: weight 2 per member"),
        "{dom}"
    );
    // Screenshots at a phone's and a desktop's width, kept with HYPHAE_KEEP_TESTBED=1.
    for (name, size) in [("phone.png", "390,844"), ("desktop.png", "1100,600")] {
        let png = bed.dir().join(name);
        let out = bed
            .ns_output(
                &a.host.ns,
                "chromium",
                &[
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--hide-scrollbars",
                    &format!("--user-data-dir={}", profile.display()),
                    "--virtual-time-budget=3000",
                    &format!("--window-size={size}"),
                    &format!("--screenshot={}", png.display()),
                    &format!("http://{METRICS}/"),
                ],
            )
            .unwrap();
        let bytes = std::fs::read(&png).unwrap_or_default();
        assert!(
            bytes.starts_with(b"\x89PNG"),
            "no screenshot: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // gamma leaves the namespace (`hyphae leave`, which tells its members) and stops.
    let gamma = &members[2];
    let config = gamma.agent.config.display().to_string();
    let left = bed
        .ns(&gamma.host.ns, BIN, &["leave", "lab", "-c", &config])
        .unwrap();
    assert!(String::from_utf8_lossy(&left.stdout).contains("left 'lab'"));
    bed.signal(gamma.agent.pid, libc::SIGTERM).unwrap();
    let (dom, rows) = render_until(&bed, &a.host, &profile, |rows| !rows.contains_key(&ids[2]));
    assert!(!dom.contains(&gamma.address.to_string()), "{dom}");
    assert!(rows.contains_key(&ids[1]), "beta went too: {dom}");
}
