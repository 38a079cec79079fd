//! `hyphae status`: the agent's state as the control protocol's [`Status`]
//! (docs/CONTROL.md).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hyphae_overlay::{DropReason as NodeDrop, PeerDropReason, PeerId, PeerStats, RelayStats};
use hyphae_vswitch::{Counters, DropReason as SwitchDrop};

use super::data::{DataPlane, OffloadCounters};
use super::workers::{lock, LOCK_WAIT_BOUNDS_US};
use super::{unix_now, Control};
use crate::config::Mode;
use crate::control::{
    self, CertificateCounters, LockWaitStatus, NamespaceStatus, OverlayStatus, OwnCertificate,
    PeerStatus, PolicyStatus, RelayStatus, Status, WorkerStatus, STATUS_VERSION,
};
use hyphae_overlay::cert::Refusal;
use hyphae_overlay::quota::Refusal as StoreRefusal;

/// What status shows of the data plane, copied out while it is held (plain values: the
/// formatting happens after it is let go).
struct DataStatus {
    lanes: Vec<LaneStatus>,
    peers: Vec<PeerSnapshot>,
    drops: Vec<(NodeDrop, u64)>,
    underlay_changes: u64,
    relay: RelayStats,
    inbox_drops: u64,
    certificates: hyphae_overlay::node::CertificateStats,
    /// What each namespace with an authority trusts now (its revocation list).
    trusts: Vec<Option<hyphae_overlay::cert::Trust>>,
}

struct LaneStatus {
    counters: Counters,
    address: Ipv4Addr,
    lan_hosts: Vec<std::net::IpAddr>,
    lan_ports: hyphae_vswitch::LanPorts,
    port_counts: Vec<(hyphae_vswitch::Mac, hyphae_vswitch::PortCounts)>,
    tap_errors: u64,
    offload: bool,
    offload_counters: OffloadCounters,
    policy: PolicyStatus,
    egress: Option<crate::control::RateStatus>,
    share: Option<crate::control::ShareStatus>,
    caps: Vec<crate::control::CapStatus>,
    layer2: Option<crate::control::Layer2Status>,
}

struct PeerSnapshot {
    ns: usize,
    id: PeerId,
    endpoint: SocketAddr,
    relayed_via: Option<PeerId>,
    rtt: Option<Duration>,
    addresses: Vec<Ipv4Addr>,
    addresses6: Vec<std::net::Ipv6Addr>,
    macs: Vec<hyphae_vswitch::Mac>,
    handshake_age: Option<Duration>,
    shards: usize,
    stats: PeerStats,
    links: Vec<hyphae_overlay::node::BondLink>,
}

impl DataStatus {
    fn of(dp: &DataPlane) -> Self {
        Self {
            lanes: dp
                .lanes
                .iter()
                .enumerate()
                .map(|(i, l)| LaneStatus {
                    counters: l.switch.counters().clone(),
                    layer2: l.l2.as_ref().map(layer2_status),
                    address: l.switch.config().address,
                    lan_hosts: (l.switch.lan_hosts().into_iter().map(Into::into))
                        .chain(l.switch.lan_hosts6().into_iter().map(Into::into))
                        .collect(),
                    lan_ports: l.switch.config().lan_ports,
                    port_counts: l.switch.lan_ports(),
                    tap_errors: l.tap_errors,
                    offload: l.offload,
                    offload_counters: l.offload_counters,
                    policy: l.policy.status(),
                    egress: l.egress.as_ref().map(|p| {
                        let s = p.stats();
                        crate::control::RateStatus {
                            rate: p.rate_bits(),
                            burst: p.burst(),
                            max_delay_ms: p.max_delay().as_millis() as u64,
                            sent_bytes: s.sent_bytes,
                            delayed: s.delayed,
                            dropped: s.dropped,
                            dropped_bytes: s.dropped_bytes,
                            queued: p.queued().0,
                        }
                    }),
                    caps: l
                        .caps
                        .as_ref()
                        .map(|c| c.status(&dp.node))
                        .unwrap_or_default(),
                    share: dp.shares.as_ref().and_then(|s| {
                        let c = s.stats(i)?;
                        Some(crate::control::ShareStatus {
                            weight: c.weight,
                            uplink_rate: s.rate_bits(),
                            sent_bytes: c.sent_bytes,
                            dropped: c.dropped,
                            queued: c.queued,
                        })
                    }),
                })
                .collect(),
            peers: dp
                .node
                .peers()
                .map(|p| PeerSnapshot {
                    ns: p.ns.0,
                    id: p.id,
                    endpoint: p.endpoint,
                    relayed_via: p.relayed_via,
                    rtt: p.rtt,
                    addresses: p.addresses.to_vec(),
                    addresses6: p.addresses6.to_vec(),
                    macs: dp
                        .lanes
                        .get(p.ns.0)
                        .and_then(|l| l.l2.as_ref())
                        .map(|l2| l2.peer_macs(p.handle).to_vec())
                        .unwrap_or_default(),
                    handshake_age: p.handshake_age,
                    shards: p.shards,
                    stats: p.stats.clone(),
                    links: p.links,
                })
                .collect(),
            drops: NodeDrop::ALL
                .iter()
                .map(|r| (*r, dp.node.drops(*r)))
                .collect(),
            underlay_changes: dp.node.underlay_changes(),
            relay: dp.node.relay_stats(),
            inbox_drops: dp.inbox_drops,
            certificates: dp.node.certificate_stats(),
            trusts: (0..dp.lanes.len())
                .map(|i| dp.node.trust(hyphae_overlay::NamespaceId(i)).cloned())
                .collect(),
        }
    }
}

impl Control {
    /// Has each membership read the host names of its members' first addresses (at most
    /// once a minute each: `membership::MEMBER_NAME_REFRESH`); the answers show from the
    /// next status on.
    pub(crate) fn refresh_member_names(&mut self, now: Instant) {
        let mut firsts: Vec<Vec<Ipv4Addr>> = vec![Vec::new(); self.namespaces.len()];
        for p in lock(&self.dp).node.peers() {
            if let (Some(list), Some(&address)) = (firsts.get_mut(p.ns.0), p.addresses.first()) {
                list.push(address);
            }
        }
        for (n, addresses) in self.namespaces.iter_mut().zip(&firsts) {
            if n.active() {
                n.membership.refresh_member_names(now, addresses);
            }
        }
    }

    pub(crate) fn status(&self) -> Status {
        let data = DataStatus::of(&lock(&self.dp));
        let mut namespaces: Vec<NamespaceStatus> = self
            .namespaces
            .iter()
            .zip(&data.lanes)
            .enumerate()
            .map(|(i, (p, lane))| {
                let m = &p.membership;
                let c = &lane.counters;
                let dhcp6 = p.dhcp6.as_ref().map(|d| d.stats()).unwrap_or_default();
                NamespaceStatus {
                    name: p.name.clone(),
                    certificate: p.certificate.as_ref().map(|c| OwnCertificate {
                        authority: c.authority().to_string(),
                        name: c.name().to_string(),
                        groups: c.groups().to_vec(),
                        addresses: c.addresses().iter().map(ToString::to_string).collect(),
                        not_after: c.not_after(),
                        expires_in_secs: i64::try_from(c.not_after())
                            .unwrap_or(i64::MAX)
                            .saturating_sub(i64::try_from(unix_now()).unwrap_or(i64::MAX)),
                        revocations_version: data
                            .trusts
                            .get(i)
                            .and_then(Option::as_ref)
                            .map_or(0, |t| t.revocations_version()),
                        problem: data
                            .trusts
                            .get(i)
                            .and_then(Option::as_ref)
                            .and_then(|t| t.check_current(c, unix_now()).err())
                            .map(|e| e.to_string()),
                    }),
                    mode: match p.mode {
                        Mode::Interface => "interface".into(),
                        Mode::Router => "router".into(),
                        Mode::Hybrid => "hybrid".into(),
                    },
                    bridge: p.bridge.clone(),
                    lan_hosts: lane.lan_hosts.iter().map(|a| a.to_string()).collect(),
                    lan_port_mode: match (p.mode, lane.lan_ports) {
                        (Mode::Router, hyphae_vswitch::LanPorts::Veb) => "veb".into(),
                        (Mode::Router, hyphae_vswitch::LanPorts::Vepa) => "vepa".into(),
                        _ => String::new(),
                    },
                    hairpinned: c.hairpinned,
                    lan_copies: c.lan_copies,
                    ports_isolated_late: p.lan.as_ref().map_or(0, crate::lan::Lan::isolated_late),
                    lan_ports: lan_port_status(p.lan.as_ref(), &lane.port_counts),
                    addresses: m.addresses().iter().map(|a| a.to_string()).collect(),
                    addresses6: m.addresses6().iter().map(|a| a.to_string()).collect(),
                    hosted_conflicts: m.hosted_conflicts(),
                    group_members: p.group.len(),
                    broadcasts_out: c.broadcasts_out,
                    broadcasts_in: c.broadcasts_in,
                    arp_probes: c.arp_probes,
                    lan_announcements: c.announcements,
                    handoffs_in: p.handoffs.core.stats().handoffs_in,
                    handoffs_out: p.handoffs.core.stats().handoffs_out,
                    handoffs_kept: p.handoffs.core.stats().kept,
                    last_handoff_ms: p.handoffs.core.stats().last.map(|d| d.as_millis() as u64),
                    dhcp_requests: c.dhcp_requests,
                    dhcp_replies: p.dhcp.as_ref().map_or(0, |d| d.stats().replies),
                    dhcp_naks: p.dhcp.as_ref().map_or(0, |d| d.stats().naks),
                    dhcp_malformed: p.dhcp.as_ref().map_or(0, |d| d.stats().malformed),
                    dhcp_relayed: p.dhcp.as_ref().map_or(0, |d| d.stats().relayed),
                    dhcp_relay_outside_subnet: p
                        .dhcp
                        .as_ref()
                        .map_or(0, |d| d.stats().relay_outside_subnet),
                    dhcp_offers_lapsed: p.dhcp.as_ref().map_or(0, |d| d.stats().offers_lapsed),
                    dhcp6_replies: dhcp6.replies,
                    dhcp6_malformed: dhcp6.malformed,
                    dhcp6_relayed: dhcp6.relayed,
                    dhcp6_relay_outside_prefix: dhcp6.relay_outside_prefix,
                    hostname: m.hostname().map(str::to_string),
                    name_error: m.name_error().map(str::to_string),
                    names: m
                        .held_names()
                        .into_iter()
                        .map(|(n, a)| (n, a.to_string()))
                        .collect(),
                    layer2: lane.layer2.clone().map(|mut l2| {
                        let held = m.mac_leases();
                        let checks = p.mac_checks.counts();
                        l2.mac_leases_held = held.held;
                        l2.mac_leases_unheld = held.unheld;
                        l2.mac_leases_lost = held.lost;
                        l2.member_macs_verified = checks.verified;
                        l2.member_macs_refused = checks.refused;
                        l2.member_mac_refusals = checks.refusals;
                        l2
                    }),
                    dns: {
                        let (agent, zone, tcp) = p.dns.stats();
                        control::DnsStatus {
                            address: m
                                .subnet()
                                .map(|s| hyphae_vswitch::service_address(s).to_string())
                                .unwrap_or_default(),
                            resolvers: p.dns.resolvers().iter().map(|r| r.to_string()).collect(),
                            udp_queries: agent.udp_queries,
                            tcp_queries: agent.tcp_queries,
                            tcp_connections: tcp.connections,
                            answered: zone.answered,
                            nxdomain: zone.nxdomain,
                            forwarded: zone.forwarded,
                            forwarded_truncated: agent.forwarded_truncated,
                            resolver_rejected: agent.resolver_rejected,
                            refused: zone.refused,
                            servfail: agent.servfail,
                            errors: zone.errors,
                            dropped: zone.dropped,
                            rate_limited_delayed: zone.rate_limited_delayed,
                            rate_limited: zone.rate_limited_truncated + zone.rate_limited_dropped,
                            rate_limited_truncated: zone.rate_limited_truncated,
                            rate_limited_dropped: zone.rate_limited_dropped,
                            lookups: agent.lookups,
                            not_ready: agent.not_ready,
                            name_conflicts: m.name_conflicts(),
                        }
                    },
                    device: p.device.clone(),
                    address: if lane.address.is_unspecified() {
                        String::new()
                    } else {
                        lane.address.to_string()
                    },
                    address_claimed: m.owned().is_some(),
                    subnet6: m.prefix6().map(|p| p.to_string()).unwrap_or_default(),
                    address6: m.owned6().map(|a| a.to_string()).unwrap_or_default(),
                    address6_error: m.address6_error().map(str::to_string),
                    endpoints: m
                        .published_endpoints()
                        .iter()
                        .map(|e| e.to_string())
                        .collect(),
                    address_error: m.address_error().map(|e| e.to_string()),
                    address_conflicts: m.address_conflicts(),
                    subnet: m.subnet().map(|s| s.to_string()).unwrap_or_default(),
                    routed_subnets: m.routed().iter().map(ToString::to_string).collect(),
                    routed: c.routed,
                    ttl_exceeded: c.ttl_exceeded,
                    unreachable: c.unreachable,
                    error: p.error.clone(),
                    lookups: m.lookups(),
                    unresolved_drops: m.unresolved_drops(),
                    to_peers: c.to_peer,
                    to_device: c.to_tap,
                    arp_replies: c.arp_replies,
                    nd_replies: c.nd_replies,
                    packet_too_big: c.packet_too_big,
                    nd_probes: c.nd_probes,
                    dad_defended: c.dad_defended,
                    router_advertisements: c.router_advertisements,
                    mss_clamped: c.mss_clamped,
                    fragmented: c.fragmented,
                    frag_needed: c.frag_needed,
                    drops: SwitchDrop::ALL
                        .iter()
                        .map(|r| (r.as_str().to_string(), c.drops(*r)))
                        .chain([
                            ("device_write".to_string(), lane.tap_errors),
                            (
                                "offload_malformed".to_string(),
                                lane.offload_counters.malformed,
                            ),
                        ])
                        .collect(),
                    offload: lane.offload,
                    super_frames: lane.offload_counters.super_frames,
                    segments: lane.offload_counters.segments,
                    coalesced_writes: lane.offload_counters.coalesced_writes,
                    coalesced_frames: lane.offload_counters.coalesced_frames,
                    policy: lane.policy.clone(),
                    egress: lane.egress.clone(),
                    share: lane.share.clone(),
                    caps: lane.caps.clone(),
                    peers: Vec::new(),
                }
            })
            .collect();
        for p in &data.peers {
            let Some(ns) = namespaces.get_mut(p.ns) else {
                continue;
            };
            let relay_addresses = p
                .relayed_via
                .and_then(|via| data.peers.iter().find(|r| r.ns == p.ns && r.id == via))
                .map(|r| r.addresses.iter().map(|a| a.to_string()).collect())
                .unwrap_or_default();
            ns.peers.push(PeerStatus {
                identity: p.id.to_string(),
                endpoint: p.endpoint.to_string(),
                path: if p.relayed_via.is_some() {
                    "relayed".into()
                } else {
                    "direct".into()
                },
                relay: p.relayed_via.map(|id| id.to_string()),
                relay_addresses,
                rtt_ms: p.rtt.map(|d| d.as_secs_f64() * 1000.0),
                addresses: p
                    .addresses
                    .iter()
                    .map(ToString::to_string)
                    .chain(p.addresses6.iter().map(ToString::to_string))
                    .collect(),
                macs: p.macs.iter().map(mac_text).collect(),
                // Only a name a member may hold is shown, as the DNS answers it.
                name: p.addresses.first().and_then(|a| {
                    let name = self.namespaces[p.ns].membership.member_name(*a)?;
                    hyphae_dhcp_dns::dns::host_name(name).ok()
                }),
                handshake_age_secs: p.handshake_age.map(|d| d.as_secs_f64()),
                shards: p.shards,
                rx_packets: p.stats.rx_packets,
                rx_bytes: p.stats.rx_bytes,
                rx_forwarded: p.stats.rx_forwarded,
                tx_packets: p.stats.tx_packets,
                tx_bytes: p.stats.tx_bytes,
                endpoint_changes: p.stats.endpoint_changes,
                drops: PeerDropReason::ALL
                    .iter()
                    .map(|r| (r.as_str().to_string(), p.stats.drops(*r)))
                    .collect(),
                links: p
                    .links
                    .iter()
                    .map(|l| crate::control::LinkStatus {
                        endpoint: l.endpoint.to_string(),
                        rate: l.stats.rate,
                        alive: l.stats.alive,
                        flows: l.stats.flows,
                        tx_packets: l.stats.packets,
                        tx_bytes: l.stats.bytes,
                        deaths: l.stats.deaths,
                    })
                    .collect(),
            });
        }
        // Left namespaces are not shown, unless the last one of a name failed.
        let mut i = 0;
        namespaces.retain(|_| {
            let n = &self.namespaces[i];
            let keep = n.active()
                || (n.error.is_some()
                    && !self.namespaces[i + 1..].iter().any(|q| q.name == n.name));
            i += 1;
            keep
        });
        Status {
            version: STATUS_VERSION,
            identity: self.identity.peer_id().to_string(),
            listen: self.listen.to_string(),
            underlay_changes: data.underlay_changes,
            drops: data
                .drops
                .iter()
                .map(|(r, n)| (r.as_str().to_string(), *n))
                .chain([
                    ("send_error".to_string(), self.send_errors()),
                    ("control_queue".to_string(), data.inbox_drops),
                    ("outbox".to_string(), self.outbox_drops),
                ])
                .collect(),
            certificates: {
                let members = self.overlay.stats().certificates_refused;
                let tunnels = &data.certificates;
                let store = self.overlay.store_stats();
                CertificateCounters {
                    tunnels_refused: Refusal::ALL
                        .iter()
                        .map(|r| (r.as_str().to_string(), tunnels.refused_for(*r)))
                        .collect(),
                    members_refused: Refusal::ALL
                        .iter()
                        .zip(members)
                        .map(|(r, n)| (r.as_str().to_string(), n))
                        .collect(),
                    addresses_not_allowed: tunnels.address_not_allowed,
                    claims_not_allowed: store.refusals.get(StoreRefusal::NotAllowed),
                    claims_preempted: store.preempted,
                    records_dropped: store.revoked_dropped,
                }
            },
            underlay: self.underlay_status(),
            workers: self.worker_status(),
            overlay: OverlayStatus {
                peer_id: self.overlay.local_id().to_string(),
                listen: self
                    .overlay
                    .listen_addrs()
                    .iter()
                    .map(|a| a.to_string())
                    .collect(),
                joined: self.overlay_ready(),
                connected: self.overlay.connected(),
                stored_records: self.overlay.stored_records(),
                rejected_requests: self.overlay.store_stats().rejected,
                bad_envelopes: self.overlay.stats().bad_envelopes,
                late_grants_released: self.overlay.stats().late_grants_released,
                group_lookups_saved: self.overlay.stats().group_lookups_saved,
                claims_without_lookup: self.overlay.stats().claims_without_lookup,
                claims_looked_up_again: self.overlay.stats().claims_looked_up_again,
                claims_unchecked_after_dispute: self.overlay.stats().claims_unchecked_after_dispute,
                claims_lost_to_closer_members: self.overlay.stats().claims_lost_to_closer_members,
                claims_disputed: self.overlay.stats().claims_disputed,
                claims_short_given_up: self.overlay.stats().claims_short_given_up,
                reads_without_lookup: self.overlay.stats().reads_without_lookup,
                kad_lookups: self.overlay.stats().kad_lookups,
                kad_requests_answered: self.overlay.stats().kad_requests_answered,
                relays: self
                    .overlay
                    .relays()
                    .iter()
                    .map(|p| p.to_string())
                    .collect(),
                relayed_peers: self
                    .overlay
                    .relayed_peers()
                    .iter()
                    .map(|p| p.to_string())
                    .collect(),
                relayed_connections: self.overlay.stats().relayed_connections,
                silent_connections_closed: self.overlay.stats().silent_connections_closed,
                dials_held_off: self.overlay.stats().dials_held_off,
                unreachable_dropped: self.overlay.stats().unreachable_dropped,
                unreachable_waiting: self.overlay.stats().unreachable_waiting,
                hole_punches: self.overlay.stats().hole_punches,
                hole_punch_failures: self.overlay.stats().hole_punch_failures,
                circuits_relayed: self.overlay.stats().circuits_relayed,
                mdns_discovered: self.overlay.stats().mdns_discovered,
                proofs_accepted: self.overlay.stats().proofs_accepted,
                proofs_unproven: self.overlay.stats().proofs_unproven,
                proofs_refused: self.overlay.stats().proofs_refused,
                requests_not_member: self.overlay.stats().requests_not_member,
                unproven_replicas_skipped: self.overlay.stats().unproven_replicas_skipped,
                refused: self
                    .overlay
                    .refusals()
                    .into_iter()
                    .map(|(reason, n)| (reason.to_string(), n))
                    .collect(),
            },
            relay: {
                let r = &data.relay;
                RelayStatus {
                    sessions: r.sessions,
                    packets: r.packets,
                    bytes: r.bytes,
                    refused: r.refused,
                }
            },
            namespaces,
        }
    }
}

impl Control {
    /// Sends that failed on any worker's underlay.
    fn send_errors(&self) -> u64 {
        self.workers
            .iter()
            .map(|w| w.counters.send_errors.load(Ordering::Relaxed))
            .sum()
    }

    /// Worker 0's underlay: with AF_XDP there is one worker; with sockets each has the same.
    fn underlay_status(&self) -> crate::control::UnderlayStatus {
        self.workers.first().map_or_else(Default::default, |w| {
            w.counters
                .underlay
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        })
    }

    fn worker_status(&self) -> Vec<WorkerStatus> {
        self.workers
            .iter()
            .map(|w| {
                let c = &w.counters;
                WorkerStatus {
                    frames_in: c.frames_in.load(Ordering::Relaxed),
                    frames_out: c.frames_out.load(Ordering::Relaxed),
                    datagrams_in: c.datagrams_in.load(Ordering::Relaxed),
                    batches: c.batches.load(Ordering::Relaxed),
                    send_errors: c.send_errors.load(Ordering::Relaxed),
                    sealed_elsewhere: c.sealed_elsewhere.load(Ordering::Relaxed),
                    lock_wait: LockWaitStatus {
                        bounds_us: LOCK_WAIT_BOUNDS_US.to_vec(),
                        counts: c
                            .lock_wait
                            .buckets
                            .iter()
                            .map(|n| n.load(Ordering::Relaxed))
                            .collect(),
                        sum_secs: c.lock_wait.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
                    },
                    realtime: c.realtime.load(Ordering::Relaxed),
                }
            })
            .collect()
    }
}

/// A MAC as `02:48:..`.
fn mac_text(m: &hyphae_vswitch::Mac) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// What status shows of a layer-2 switch.
fn layer2_status(
    l2: &hyphae_vswitch::layer2::Layer2<hyphae_overlay::PeerHandle>,
) -> crate::control::Layer2Status {
    use hyphae_vswitch::layer2::L2Drop;
    let c = l2.counters();
    let macs = l2.local_macs();
    crate::control::Layer2Status {
        vlan: l2.config().vlan,
        local_macs: macs.len(),
        macs: macs.iter().map(mac_text).collect(),
        remote_macs: l2.remote_count(),
        to_peer: c.to_peer,
        floods_out: c.floods_out,
        unknown_unicast: c.unknown_unicast,
        to_tap: c.to_tap,
        floods_in: c.floods_in,
        learned: c.learned,
        moves: c.moves,
        mac_conflicts: c.mac_conflicts,
        table_full: c.table_full,
        fragmented: c.fragmented,
        reassembled: c.reassembled,
        arp_suppressed: c.arp_suppressed,
        arp_flooded: c.arp_flooded,
        nd_suppressed: c.nd_suppressed,
        nd_flooded: c.nd_flooded,
        neighbour_conflicts: c.neighbour_conflicts,
        drops: L2Drop::ALL
            .iter()
            .map(|r| (r.as_str().to_string(), c.dropped(*r)))
            .collect(),
        // The leases and checks are the control plane's: filled in there.
        ..Default::default()
    }
}

/// VEPA: each port of the LAN bridge with the MACs behind it and what the switch counted
/// for them; MACs counted that the bridge no longer places come last, under no port.
fn lan_port_status(
    lan: Option<&crate::lan::Lan>,
    counts: &[(hyphae_vswitch::Mac, hyphae_vswitch::PortCounts)],
) -> Vec<crate::control::LanPortStatus> {
    let Some(ports) = lan.and_then(crate::lan::Lan::ports) else {
        return Vec::new();
    };
    let mut placed = Vec::new();
    let mut rows: Vec<crate::control::LanPortStatus> = ports
        .into_iter()
        .map(|(port, macs)| {
            let mut row = crate::control::LanPortStatus {
                port,
                macs: macs.iter().map(mac_text).collect(),
                ..Default::default()
            };
            for (mac, c) in counts.iter().filter(|(m, _)| macs.contains(m)) {
                row.hairpinned += c.hairpinned;
                row.spoofed += c.spoofed;
                placed.push(*mac);
            }
            row
        })
        .collect();
    let unplaced: Vec<_> = counts.iter().filter(|(m, _)| !placed.contains(m)).collect();
    if !unplaced.is_empty() {
        rows.push(crate::control::LanPortStatus {
            port: String::new(),
            macs: unplaced.iter().map(|(m, _)| mac_text(m)).collect(),
            hairpinned: unplaced.iter().map(|(_, c)| c.hairpinned).sum(),
            spoofed: unplaced.iter().map(|(_, c)| c.spoofed).sum(),
        });
    }
    rows
}
