//! The control protocol's replies for people: `hyphae status` and `hyphae peers` as text,
//! and the JSON `hyphae peers --json` prints.

use std::collections::BTreeMap;

use super::{Status, WorkerStatus};

/// Renders the members of every namespace as a table, for `hyphae peers`.
pub fn render_peers(status: &Status) -> String {
    let mut out = String::new();
    for ns in &status.namespaces {
        out += &format!(
            "namespace {}  (this member: {})\n",
            ns.name,
            if ns.address.is_empty() {
                "no address yet"
            } else {
                &ns.address
            }
        );
        if let Some(e) = &ns.address_error {
            out += &format!("  address: {e}\n");
        }
        if ns.peers.is_empty() {
            out += "  no members connected\n";
            continue;
        }
        out += &format!(
            "  {:<18} {:<14} {:<22} {:<28} {:>9}\n",
            "ADDRESS", "MEMBER", "ENDPOINT", "PATH", "RTT"
        );
        for p in &ns.peers {
            let path = match &p.relay {
                Some(via) if p.path == "relayed" => format!(
                    "relayed via {}",
                    p.relay_addresses
                        .first()
                        .cloned()
                        .unwrap_or_else(|| short(via).to_string())
                ),
                _ => p.path.clone(),
            };
            out += &format!(
                "  {:<18} {:<14} {:<22} {:<28} {:>9}\n",
                if p.addresses.is_empty() {
                    "-".to_string()
                } else {
                    p.addresses.join(",")
                },
                short(&p.identity),
                p.endpoint,
                path,
                p.rtt_ms.map_or("-".to_string(), |ms| format!("{ms:.2} ms")),
            );
        }
    }
    out
}

/// The members of every namespace as JSON, for `hyphae peers --json`.
pub fn peers_json(status: &Status) -> serde_json::Value {
    serde_json::json!({
        "namespaces": status.namespaces.iter().map(|ns| serde_json::json!({
            "name": ns.name,
            "address": ns.address,
            "peers": ns.peers,
        })).collect::<Vec<_>>()
    })
}

fn short(identity: &str) -> &str {
    &identity[..identity.len().min(12)]
}

/// Renders a status for people.
pub fn render(status: &Status) -> String {
    let mut out = String::new();
    out += &format!(
        "agent {}  listening on {}\n",
        status.identity, status.listen
    );
    let u = &status.underlay;
    if u.path == "af_xdp" {
        out +=
            &format!(
            "underlay af_xdp on {} ({} XDP, {}, {} queue{})  rx {} tx {} frames, {} via socket\n",
            u.interface.as_deref().unwrap_or("?"),
            u.xdp_mode.as_deref().unwrap_or("?"),
            if u.zero_copy { "zero-copy" } else { "copy mode" },
            u.queues,
            if u.queues == 1 { "" } else { "s" },
            u.rx_frames,
            u.tx_frames,
            u.tx_via_socket,
        );
    } else {
        out += "underlay socket\n";
    }
    if !status.workers.is_empty() {
        // Per worker, in order: how the traffic spreads (a flow stays on one worker).
        let each = |count: fn(&WorkerStatus) -> u64| {
            let counts: Vec<String> = status
                .workers
                .iter()
                .map(|w| count(w).to_string())
                .collect();
            counts.join("/")
        };
        let p99: Vec<String> = status
            .workers
            .iter()
            .map(|w| match w.lock_wait.quantile_us(0.99) {
                Some(us) => format!("<{us}"),
                None if w.lock_wait.counts.iter().sum::<u64>() == 0 => "-".into(),
                None => format!(">{}", w.lock_wait.bounds_us.last().copied().unwrap_or(0)),
            })
            .collect();
        out += &format!(
            "workers {}  frames from devices {}  datagrams in {}  lock wait p99 {} us\n",
            status.workers.len(),
            each(|w| w.frames_in),
            each(|w| w.datagrams_in),
            p99.join("/"),
        );
    }
    out += &format!(
        "overlay {}  {} peers connected{}\n",
        status.overlay.peer_id,
        status.overlay.connected,
        if status.overlay.joined {
            ""
        } else {
            "  (joining)"
        }
    );
    if !status.overlay.relays.is_empty() {
        out += &format!(
            "reachable through relay {}\n",
            status.overlay.relays.join(", ")
        );
    }
    if !status.overlay.relayed_peers.is_empty() {
        out += &format!(
            "control plane relayed to {}\n",
            status.overlay.relayed_peers.join(", ")
        );
    }
    if status.relay.sessions > 0 || status.relay.packets > 0 {
        out += &format!(
            "relaying {} sessions for other members: {} pkts / {} B\n",
            status.relay.sessions, status.relay.packets, status.relay.bytes
        );
    }
    let refused = nonzero(&status.overlay.refused);
    if !refused.is_empty() {
        out += &format!("  refused to peers: {refused}\n");
    }
    if status.underlay_changes > 0 {
        out += &format!(
            "underlay address changed {} times (members told at once)\n",
            status.underlay_changes
        );
    }
    let agent_drops = nonzero(&status.drops);
    if !agent_drops.is_empty() {
        out += &format!("  dropped before any tunnel: {agent_drops}\n");
    }
    let c = &status.certificates;
    let (tunnels, members) = (nonzero(&c.tunnels_refused), nonzero(&c.members_refused));
    if !tunnels.is_empty() || !members.is_empty() || c.addresses_not_allowed > 0 {
        out += &format!(
            "  certificates refused: tunnels {}  members {}  addresses not allowed {}\n",
            if tunnels.is_empty() { "0" } else { &tunnels },
            if members.is_empty() { "0" } else { &members },
            c.addresses_not_allowed
        );
    }
    if c.claims_not_allowed + c.claims_preempted + c.records_dropped > 0 {
        out += &format!(
            "  as a replica: claims not allowed {}  taken back for their holder {}  records of revoked members dropped {}\n",
            c.claims_not_allowed, c.claims_preempted, c.records_dropped
        );
    }
    for ns in &status.namespaces {
        out += &format!(
            "namespace {}  {} mode  device {}  address {}  subnet {}\n",
            ns.name, ns.mode, ns.device, ns.address, ns.subnet
        );
        if !ns.subnet6.is_empty() {
            let address6 = match (&ns.address6, &ns.address6_error) {
                (a, _) if !a.is_empty() => a.clone(),
                (_, Some(e)) => format!("none ({e})"),
                (_, None) => "none".into(),
            };
            out += &format!("  IPv6: address {}  prefix {}\n", address6, ns.subnet6);
        }
        if !ns.routed_subnets.is_empty() {
            out += &format!(
                "  routes to {} in one hop: {} packets routed, {} TTL exceeded, {} host unreachable\n",
                ns.routed_subnets.join(", "),
                ns.routed,
                ns.ttl_exceeded,
                ns.unreachable
            );
        }
        if ns.lan_port_mode == "vepa" {
            let spoofed = ns.drops.get("spoofed").copied().unwrap_or(0);
            out += &format!(
                "  VEPA LAN ports: {} frames hairpinned, {} broadcast copies, {spoofed} spoofed dropped\n",
                ns.hairpinned, ns.lan_copies
            );
            for p in &ns.lan_ports {
                let port = if p.port.is_empty() { "(gone)" } else { &p.port };
                out += &format!(
                    "    port {port}  {}  hairpinned {}  spoofed {}\n",
                    p.macs.join(" "),
                    p.hairpinned,
                    p.spoofed
                );
            }
        }
        if let Some(cert) = &ns.certificate {
            let days = cert.expires_in_secs.div_euclid(86_400);
            out += &format!(
                "  certificate {}  groups [{}]  expires in {days} days  revocation list v{}  authority {}\n",
                cert.name,
                cert.groups.join(", "),
                cert.revocations_version,
                short(&cert.authority),
            );
            if let Some(problem) = &cert.problem {
                out += &format!("  WARNING: this member's certificate is {problem}: the other members refuse it\n");
            } else if cert.expires_in_secs < 7 * 86_400 {
                out += "  WARNING: this member's certificate expires within 7 days: sign a new one (`hyphae cert sign`)\n";
            }
        }
        let p = &ns.policy;
        if let Some(file) = &p.file {
            let hits: Vec<String> = p.rule_hits.iter().map(u64::to_string).collect();
            out += &format!(
                "  policy {file} v{}  default {}  flows opened by rule [{}]  denied {} sent / {} received  flows {}/{}\n",
                p.version,
                p.default,
                hits.join(", "),
                p.denied_out,
                p.denied_in,
                p.flows,
                p.flows_max
            );
            if !p.links.is_empty() {
                out += &format!(
                    "  linked to {} (crossed as gateway: {} packets out, {} dropped in)
",
                    p.links.join(", "),
                    p.crossed,
                    p.crossing_dropped
                );
            }
        }
        out += &rates(ns);
        out += &format!(
            "  switch: {} to members, {} to device, {} ARP replies, {} neighbour advertisements\n",
            ns.to_peers, ns.to_device, ns.arp_replies, ns.nd_replies
        );
        if ns.mss_clamped + ns.fragmented + ns.frag_needed > 0 {
            out += &format!(
                "  larger than the tunnel: {} MSS clamped, {} fragmented, {} fragmentation needed\n",
                ns.mss_clamped, ns.fragmented, ns.frag_needed
            );
        }
        if ns.offload {
            out += &format!(
                "  offload on: {} super-frames in ({} segments), {} coalesced writes ({} frames merged)\n",
                ns.super_frames, ns.segments, ns.coalesced_writes, ns.coalesced_frames
            );
        } else {
            out += "  offload off\n";
        }
        let d = nonzero(&ns.drops);
        if !d.is_empty() {
            out += &format!("  switch drops: {d}\n");
        }
        if let Some(e) = &ns.address_error {
            out += &format!("  address: {e}\n");
        }
        if ns.address_conflicts > 0 {
            out += &format!(
                "  address conflicts (partitions merged): {} given up\n",
                ns.address_conflicts
            );
        }
        if let Some(e) = &ns.name_error {
            out += &format!("  name: {e}\n");
        }
        if !ns.names.is_empty() {
            let names: Vec<String> = ns
                .names
                .iter()
                .map(|(n, a)| format!("{n}.{} {a}", ns.name))
                .collect();
            out += &format!("  names: {}\n", names.join(", "));
        }
        if !ns.dns.address.is_empty() {
            out += &format!(
                "  dns {}: {} queries ({} tcp), {} answered, {} nxdomain, {} forwarded, {} refused, {} servfail\n",
                ns.dns.address,
                ns.dns.udp_queries + ns.dns.tcp_queries,
                ns.dns.tcp_queries,
                ns.dns.answered,
                ns.dns.nxdomain,
                ns.dns.forwarded,
                ns.dns.refused,
                ns.dns.servfail
            );
        }
        if ns.peers.is_empty() {
            out += "  no members connected\n";
        }
        for p in &ns.peers {
            let hs = p
                .handshake_age_secs
                .map_or("no handshake yet".to_string(), |s| {
                    format!("handshake {s:.0}s ago")
                });
            let mut path = match &p.relay {
                Some(via) if p.path == "relayed" => format!("  relayed via {}", short(via)),
                _ => String::new(),
            };
            if p.endpoint_changes > 0 {
                path += &format!("  endpoint moved {} times", p.endpoint_changes);
            }
            if p.shards > 1 {
                path += &format!("  {} shards", p.shards);
            }
            out += &format!(
                "  member {}  {}  endpoint {}  {}{path}\n",
                if p.addresses.is_empty() {
                    "(no address yet)".to_string()
                } else {
                    p.addresses.join(",")
                },
                short(&p.identity),
                p.endpoint,
                hs
            );
            out += &format!(
                "    in {} pkts / {} B   out {} pkts / {} B\n",
                p.rx_packets, p.rx_bytes, p.tx_packets, p.tx_bytes
            );
            let d = nonzero(&p.drops);
            if !d.is_empty() {
                out += &format!("    drops: {d}\n");
            }
            for l in &p.links {
                out += &format!(
                    "    link {}  {}  {}  {} flows  out {} pkts / {} B{}\n",
                    l.endpoint,
                    bits(l.rate),
                    if l.alive { "alive" } else { "dead" },
                    l.flows,
                    l.tx_packets,
                    l.tx_bytes,
                    if l.deaths > 0 {
                        format!("  died {} times", l.deaths)
                    } else {
                        String::new()
                    }
                );
            }
        }
    }
    out
}

/// A namespace's egress cap, share of the uplink and caps per member (docs/QOS.md), a
/// line each; nothing without them.
fn rates(ns: &super::NamespaceStatus) -> String {
    let mut out = String::new();
    if let Some(e) = &ns.egress {
        out += &format!(
            "  egress cap {}: {} bytes sent, {} delayed, {} dropped, {} queued\n",
            bits(e.rate),
            e.sent_bytes,
            e.delayed,
            e.dropped,
            e.queued
        );
    }
    if let Some(s) = &ns.share {
        out += &format!(
            "  share: weight {} of a {} uplink: {} bytes sent, {} dropped, {} queued\n",
            s.weight,
            bits(s.uplink_rate),
            s.sent_bytes,
            s.dropped,
            s.queued
        );
    }
    for c in &ns.caps {
        let mut parts = Vec::new();
        for (dir, d) in [("egress", &c.egress), ("ingress", &c.ingress)] {
            if let Some(d) = d {
                parts.push(format!(
                    "{dir} {}: {} bytes sent, {} delayed, {} dropped, {} bucket{}",
                    bits(d.rate),
                    d.sent_bytes,
                    d.delayed,
                    d.dropped,
                    d.buckets.len(),
                    if d.buckets.len() == 1 { "" } else { "s" }
                ));
            }
        }
        if let Some(w) = c.weight {
            parts.push(format!("weight {w}"));
        }
        out += &format!(
            "  cap {} ({}, per {}): {}\n",
            c.cap,
            c.picks,
            c.per,
            parts.join("; ")
        );
    }
    out
}

/// Bits a second, as a config writes them: `50M`, `1.5G`, `800k`.
fn bits(rate: u64) -> String {
    let (value, unit) = match rate {
        r if r >= 1_000_000_000 => (r as f64 / 1e9, "G"),
        r if r >= 1_000_000 => (r as f64 / 1e6, "M"),
        r if r >= 1_000 => (r as f64 / 1e3, "k"),
        r => (r as f64, ""),
    };
    let text = format!("{value:.1}");
    format!("{}{unit}", text.strip_suffix(".0").unwrap_or(&text))
}

fn nonzero(m: &BTreeMap<String, u64>) -> String {
    m.iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_and_shares_show_in_the_text_status() {
        let doc = include_str!("../../../../docs/CONTROL.md");
        let start = doc.find("```json\n{\n  \"version\"").unwrap() + "```json\n".len();
        let end = start + doc[start..].find("```").unwrap();
        let mut status: Status = serde_json::from_str(&doc[start..end]).unwrap();
        let text = render(&status);
        assert!(
            text.contains("  cap 1 (members 10.201.0.2, per member): egress 20M: 5120 bytes sent, 0 delayed, 0 dropped, 1 bucket\n"),
            "{text}"
        );
        assert!(
            !text.contains("egress cap"),
            "no namespace cap in the example: {text}"
        );
        status.namespaces[0].share = Some(super::super::ShareStatus {
            weight: 3,
            uplink_rate: 1_500_000_000,
            ..Default::default()
        });
        assert!(render(&status).contains("  share: weight 3 of a 1.5G uplink: 0 bytes sent"));
        assert_eq!(
            (bits(800_000), bits(50_000_000), bits(8_000)),
            ("800k".into(), "50M".into(), "8k".into())
        );
    }
}
