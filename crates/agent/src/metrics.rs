//! `/metrics`: every number of `hyphae status --json` in the Prometheus text format.
//!
//! The metrics are derived from the status JSON itself, so a counter added to the status
//! is exported without touching this file. The naming rule (README, "Metrics"):
//!
//! - a field's path becomes the name: `overlay.connected` → `hyphae_overlay_connected`,
//!   `namespaces[].dns.udp_queries` → `hyphae_namespace_dns_udp_queries_total`, a member's
//!   `namespaces[].peers[].rx_bytes` → `hyphae_peer_rx_bytes_total`;
//! - counters end in `_total`; the few gauges ([`GAUGES`], and every boolean as 0 or 1)
//!   do not; `_ms` and `_secs` fields are converted to `_seconds`;
//! - a `drops` map is one counter `..._drops_total` with a `reason` label, and so is a
//!   `..._refused` map (`certificates.tunnels_refused` →
//!   `hyphae_certificates_tunnels_refused_total{reason="revoked"}`);
//! - labels: `namespace` (the namespace name), on members `member` (its identity), on a
//!   namespace's caps per member and host `cap` (its place in the config), on a bonded
//!   member's links `link` (its place in the member's list, at most 8), on a VEPA router's
//!   bridge ports `port` (the port's name).
//!   Both are bounded: namespaces by the config, members by the namespace subnet and the
//!   tunnel limit. Nothing is labelled by flow, client address or DNS name.

use std::collections::BTreeMap;

use prometheus::proto::{Bucket, Histogram, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{GaugeVec, IntCounterVec, Opts, Registry, TextEncoder};
use serde_json::{Map, Value};

use crate::control::Status;

/// Status fields that are levels, not counts (paths as in docs/CONTROL.md). A new gauge
/// in the status must be added here, or it is exported as a counter.
const GAUGES: &[&str] = &[
    "relay.sessions",
    "overlay.connected",
    "overlay.unreachable_waiting",
    "overlay.stored_records",
    "underlay.queues",
    "namespaces[].group_members",
    "namespaces[].layer2.local_macs",
    "namespaces[].layer2.vlan",
    "namespaces[].layer2.remote_macs",
    "namespaces[].layer2.mac_leases_held",
    "namespaces[].layer2.mac_leases_unheld",
    "namespaces[].layer2.member_macs_verified",
    "namespaces[].layer2.member_macs_refused",
    "namespaces[].last_handoff_ms",
    "namespaces[].peers[].rtt_ms",
    "namespaces[].peers[].handshake_age_secs",
    "namespaces[].peers[].shards",
    "namespaces[].certificate.not_after",
    "namespaces[].certificate.expires_in_secs",
    "namespaces[].certificate.revocations_version",
    "namespaces[].policy.version",
    "namespaces[].policy.flows",
    "namespaces[].policy.flows_max",
    "namespaces[].egress.rate",
    "namespaces[].egress.burst",
    "namespaces[].egress.max_delay_ms",
    "namespaces[].egress.queued",
    "namespaces[].share.weight",
    "namespaces[].share.uplink_rate",
    "namespaces[].share.queued",
    "namespaces[].caps[].egress.rate",
    "namespaces[].caps[].egress.burst",
    "namespaces[].caps[].egress.queued",
    "namespaces[].caps[].ingress.rate",
    "namespaces[].caps[].ingress.burst",
    "namespaces[].caps[].ingress.queued",
    "namespaces[].caps[].weight",
    "namespaces[].peers[].links[].rate",
    "namespaces[].peers[].links[].flows",
];

/// Status fields that are not measurements: the schema version.
const SKIPPED: &[&str] = &["version", "namespaces[].caps[].cap"];

/// Encodes `status` in the Prometheus text format (version 0.0.4).
pub(crate) fn encode(status: &Status) -> prometheus::Result<String> {
    let value = serde_json::to_value(status).map_err(|e| prometheus::Error::Msg(e.to_string()))?;
    let mut families = Families::default();
    if let Value::Object(top) = &value {
        families.walk(
            &Scope {
                path: String::new(),
                name: "hyphae".into(),
                labels: Vec::new(),
            },
            top,
        )?;
    }
    let mut gathered = families.registry.gather();
    gathered.push(lock_wait(&status.workers));
    let mut text = String::new();
    TextEncoder::new().encode_utf8(&gathered, &mut text)?;
    Ok(text)
}

/// `workers[].lock_wait` as one Prometheus histogram, `hyphae_worker_lock_wait_seconds`,
/// labelled by worker index (bounded by `[agent] workers`, at most 64).
fn lock_wait(workers: &[crate::control::WorkerStatus]) -> MetricFamily {
    let metrics = workers
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let mut cumulative = 0;
            let buckets = w
                .lock_wait
                .bounds_us
                .iter()
                .zip(&w.lock_wait.counts)
                .map(|(&bound, &count)| {
                    cumulative += count;
                    let mut b = Bucket::default();
                    b.set_upper_bound(bound as f64 / 1e6);
                    b.set_cumulative_count(cumulative);
                    b
                })
                .collect();
            let mut h = Histogram::default();
            h.set_bucket(buckets);
            h.set_sample_count(w.lock_wait.counts.iter().sum());
            h.set_sample_sum(w.lock_wait.sum_secs);
            let mut label = LabelPair::default();
            label.set_name("worker".into());
            label.set_value(i.to_string());
            let mut m = Metric::default();
            m.set_label(vec![label]);
            m.set_histogram(h);
            m
        })
        .collect();
    let mut family = MetricFamily::default();
    family.set_name("hyphae_worker_lock_wait_seconds".into());
    family.set_help(help("workers[].lock_wait"));
    family.set_field_type(MetricType::HISTOGRAM);
    family.set_metric(metrics);
    family
}

/// Where in the status a walk is: the JSON path, the metric name so far, the labels.
struct Scope {
    path: String,
    name: String,
    labels: Vec<(&'static str, String)>,
}

impl Scope {
    fn field(&self, key: &str) -> (String, String) {
        let path = if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        };
        (path, format!("{}_{key}", self.name))
    }

    fn enter(&self, path: String, name: &str, label: Option<(&'static str, String)>) -> Scope {
        let mut labels = self.labels.clone();
        labels.extend(label);
        Scope {
            path,
            name: name.to_string(),
            labels,
        }
    }
}

#[derive(Default)]
struct Families {
    registry: Registry,
    counters: BTreeMap<String, IntCounterVec>,
    gauges: BTreeMap<String, GaugeVec>,
}

impl Families {
    fn walk(&mut self, scope: &Scope, object: &Map<String, Value>) -> prometheus::Result<()> {
        for (key, value) in object {
            let (path, name) = scope.field(key);
            if SKIPPED.contains(&path.as_str()) {
                continue;
            }
            match value {
                Value::Number(n) => {
                    if GAUGES.contains(&path.as_str()) {
                        let (name, factor) = seconds(&name);
                        let v = n.as_f64().unwrap_or(0.0) * factor;
                        self.gauge(&name, &path, &scope.labels, v)?;
                    } else {
                        self.counter(&name, &path, &scope.labels, n.as_u64().unwrap_or(0))?;
                    }
                }
                Value::Bool(b) => {
                    self.gauge(&name, &path, &scope.labels, if *b { 1.0 } else { 0.0 })?;
                }
                Value::Object(drops) if key == "drops" || key.ends_with("_refused") => {
                    for (reason, count) in drops {
                        let mut labels = scope.labels.clone();
                        labels.push(("reason", reason.clone()));
                        let count = count.as_u64().unwrap_or(0);
                        self.counter(&name, &path, &labels, count)?;
                    }
                }
                Value::Object(inner) => self.walk(&scope.enter(path, &name, None), inner)?,
                // Flows each policy rule opened, labelled by the rule's place in the file.
                Value::Array(hits) if key == "rule_hits" => {
                    for (i, count) in hits.iter().enumerate() {
                        let mut labels = scope.labels.clone();
                        labels.push(("rule", (i + 1).to_string()));
                        self.counter(&name, &path, &labels, count.as_u64().unwrap_or(0))?;
                    }
                }
                Value::Array(items) if key == "namespaces" || key == "peers" => {
                    let (label, id_field, prefix) = if key == "namespaces" {
                        ("namespace", "name", "hyphae_namespace")
                    } else {
                        ("member", "identity", "hyphae_peer")
                    };
                    for item in items {
                        let Value::Object(item) = item else { continue };
                        let id = item.get(id_field).and_then(Value::as_str).unwrap_or("");
                        let inner =
                            scope.enter(format!("{path}[]"), prefix, Some((label, id.into())));
                        self.walk(&inner, item)?;
                    }
                }
                // Each cap per member, group or host, labelled by its place in the config
                // (its buckets, by member or host address, are in the status only).
                Value::Array(caps) if key == "caps" => {
                    for item in caps {
                        let Value::Object(item) = item else { continue };
                        let cap = item.get("cap").and_then(Value::as_u64).unwrap_or(0);
                        let inner =
                            scope.enter(format!("{path}[]"), &name, Some(("cap", cap.to_string())));
                        self.walk(&inner, item)?;
                    }
                }
                // VEPA: each port of a router's LAN bridge, labelled by its name (bounded
                // by the bridge's ports).
                Value::Array(ports) if key == "lan_ports" => {
                    for item in ports {
                        let Value::Object(item) = item else { continue };
                        let port = item.get("port").and_then(Value::as_str).unwrap_or("");
                        let inner =
                            scope.enter(format!("{path}[]"), &name, Some(("port", port.into())));
                        self.walk(&inner, item)?;
                    }
                }
                // Each link of a bonded tunnel, labelled by its place in the member's list.
                Value::Array(links) if key == "links" => {
                    for (i, item) in links.iter().enumerate() {
                        let Value::Object(item) = item else { continue };
                        let inner = scope.enter(
                            format!("{path}[]"),
                            &name,
                            Some(("link", (i + 1).to_string())),
                        );
                        self.walk(&inner, item)?;
                    }
                }
                // Names, addresses, identities: text, not measurements.
                _ => {}
            }
        }
        Ok(())
    }

    fn counter(
        &mut self,
        name: &str,
        path: &str,
        labels: &[(&'static str, String)],
        value: u64,
    ) -> prometheus::Result<()> {
        let name = format!("{name}_total");
        let family = match self.counters.get(&name) {
            Some(family) => family,
            None => {
                let names: Vec<&str> = labels.iter().map(|(k, _)| *k).collect();
                let family = IntCounterVec::new(Opts::new(name.as_str(), help(path)), &names)?;
                self.registry.register(Box::new(family.clone()))?;
                self.counters.entry(name).or_insert(family)
            }
        };
        let values: Vec<&str> = labels.iter().map(|(_, v)| v.as_str()).collect();
        family.get_metric_with_label_values(&values)?.inc_by(value);
        Ok(())
    }

    fn gauge(
        &mut self,
        name: &str,
        path: &str,
        labels: &[(&'static str, String)],
        value: f64,
    ) -> prometheus::Result<()> {
        let family = match self.gauges.get(name) {
            Some(family) => family,
            None => {
                let names: Vec<&str> = labels.iter().map(|(k, _)| *k).collect();
                let family = GaugeVec::new(Opts::new(name, help(path)), &names)?;
                self.registry.register(Box::new(family.clone()))?;
                self.gauges.entry(name.to_string()).or_insert(family)
            }
        };
        let values: Vec<&str> = labels.iter().map(|(_, v)| v.as_str()).collect();
        family.get_metric_with_label_values(&values)?.set(value);
        Ok(())
    }
}

/// The help line: where the number comes from, whose meaning docs/CONTROL.md gives.
fn help(path: &str) -> String {
    format!("`{path}` of hyphae status --json (docs/CONTROL.md)")
}

/// Prometheus measures time in seconds: `rtt_ms` becomes `rtt_seconds`, times 1/1000.
fn seconds(name: &str) -> (String, f64) {
    if let Some(base) = name.strip_suffix("_ms") {
        (format!("{base}_seconds"), 0.001)
    } else if let Some(base) = name.strip_suffix("_secs") {
        (format!("{base}_seconds"), 1.0)
    } else {
        (name.to_string(), 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of docs/CONTROL.md, with two namespaces.
    fn status() -> Status {
        let doc = include_str!("../../../docs/CONTROL.md");
        let start = doc.find("```json\n{\n  \"version\"").unwrap() + "```json\n".len();
        let end = start + doc[start..].find("```").unwrap();
        let mut status: Status = serde_json::from_str(&doc[start..end]).unwrap();
        let mut second = status.namespaces[0].clone();
        second.name = "lab2".into();
        status.namespaces.push(second);
        status
    }

    #[test]
    fn a_bonded_members_links_are_labelled_by_their_place() {
        let mut status = status();
        let link = |endpoint: &str, alive| crate::control::LinkStatus {
            endpoint: endpoint.into(),
            rate: 200_000_000,
            alive,
            flows: 3,
            tx_packets: 10,
            tx_bytes: 14_000,
            deaths: u64::from(!alive),
        };
        status.namespaces[0].peers[0].links = vec![
            link("10.200.0.2:7400", true),
            link("10.202.0.2:7400", false),
        ];
        let text = encode(&status).unwrap();
        let member = "member=\"NcM6nb8sQfGVs4T1h1m6Vt0xGmX0x2BvdSx1kbYa1Q4=\"";
        for line in [
            "# TYPE hyphae_peer_links_rate gauge".to_string(),
            "# TYPE hyphae_peer_links_flows gauge".to_string(),
            "# TYPE hyphae_peer_links_tx_bytes_total counter".to_string(),
            format!("hyphae_peer_links_alive{{link=\"1\",{member},namespace=\"lab\"}} 1"),
            format!("hyphae_peer_links_alive{{link=\"2\",{member},namespace=\"lab\"}} 0"),
            format!("hyphae_peer_links_deaths_total{{link=\"2\",{member},namespace=\"lab\"}} 1"),
            format!("hyphae_peer_links_rate{{link=\"1\",{member},namespace=\"lab\"}} 200000000"),
        ] {
            assert!(text.contains(&line), "no `{line}` in\n{text}");
        }
        assert!(!text.contains("10.202.0.2"), "an endpoint is no label");
    }

    #[test]
    fn a_vepa_routers_ports_are_labelled_by_their_name() {
        let mut status = status();
        status.namespaces[0].lan_ports = vec![crate::control::LanPortStatus {
            port: "vnet3".into(),
            macs: vec!["52:54:00:12:34:10".into()],
            hairpinned: 40,
            spoofed: 2,
        }];
        let text = encode(&status).unwrap();
        for line in [
            "hyphae_namespace_lan_ports_hairpinned_total{namespace=\"lab\",port=\"vnet3\"} 40",
            "hyphae_namespace_lan_ports_spoofed_total{namespace=\"lab\",port=\"vnet3\"} 2",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
        assert!(!text.contains("52:54:00"), "a MAC is no label");
    }

    #[test]
    fn names_units_and_labels() {
        let text = encode(&status()).unwrap();
        for line in [
            "# TYPE hyphae_overlay_connected gauge",
            "hyphae_overlay_connected 2",
            "# TYPE hyphae_relay_bytes_total counter",
            "hyphae_drops_total{reason=\"bad_mac\"} 0",
            "hyphae_namespace_dns_udp_queries_total{namespace=\"lab\"} 12",
            "hyphae_namespace_dns_udp_queries_total{namespace=\"lab2\"} 12",
            "hyphae_namespace_address_claimed{namespace=\"lab\"} 1",
            "hyphae_underlay_changes_total 1",
            "hyphae_peer_endpoint_changes_total{member=\"NcM6nb8sQfGVs4T1h1m6Vt0xGmX0x2BvdSx1kbYa1Q4=\",namespace=\"lab\"} 0",
            "hyphae_namespace_drops_total{namespace=\"lab\",reason=\"no_route\"} 0",
            "hyphae_peer_rx_bytes_total{member=\"NcM6nb8sQfGVs4T1h1m6Vt0xGmX0x2BvdSx1kbYa1Q4=\",namespace=\"lab\"} 672",
            "hyphae_peer_rtt_seconds{member=\"NcM6nb8sQfGVs4T1h1m6Vt0xGmX0x2BvdSx1kbYa1Q4=\",namespace=\"lab\"} 0.00041",
            "hyphae_peer_handshake_age_seconds{member=\"NcM6nb8sQfGVs4T1h1m6Vt0xGmX0x2BvdSx1kbYa1Q4=\",namespace=\"lab2\"} 3.2",
            "# TYPE hyphae_worker_lock_wait_seconds histogram",
            "hyphae_worker_lock_wait_seconds_bucket{worker=\"0\",le=\"0.000001\"} 60012",
            "hyphae_worker_lock_wait_seconds_bucket{worker=\"0\",le=\"0.00005\"} 61877",
            "hyphae_worker_lock_wait_seconds_bucket{worker=\"0\",le=\"+Inf\"} 61877",
            "hyphae_worker_lock_wait_seconds_count{worker=\"1\"} 29",
            "hyphae_drops_total{reason=\"control_queue\"} 0",
            "# TYPE hyphae_namespace_policy_flows gauge",
            "hyphae_namespace_policy_flows_max{namespace=\"lab\"} 65536",
            "hyphae_namespace_policy_denied_in_total{namespace=\"lab\"} 0",
            "hyphae_namespace_caps_egress_rate{cap=\"1\",namespace=\"lab\"} 20000000",
            "hyphae_namespace_caps_egress_sent_bytes_total{cap=\"1\",namespace=\"lab2\"} 5120",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert!(samples.iter().all(|l| !l.starts_with("hyphae_version")));
        // A cap's place is its label, not a metric; its buckets are not exported.
        assert!(samples
            .iter()
            .all(|l| !l.starts_with("hyphae_namespace_caps_cap") && !l.contains("buckets")));
        // Times are in seconds: no metric is named in milliseconds or `secs` (a name like
        // `mss_clamped` is not a time).
        let name = |l: &&str| l.split(['{', ' ']).next().unwrap_or_default().to_string();
        assert!(samples.iter().map(name).all(|n| {
            let n = n.strip_suffix("_total").unwrap_or(&n);
            !n.ends_with("_ms") && !n.ends_with("_secs")
        }));
    }
}
