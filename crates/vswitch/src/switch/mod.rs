//! The switch of one namespace: its state, and the entry points every frame and packet goes
//! through (a frame from the TAP, a packet from a member, the timers, and the queues of
//! frames and events it produces). The `impl` blocks of each concern live in the child
//! modules: proxy ARP (`arp`), LAN hosts (`lan`), routes to members (`routes`), broadcast
//! (`broadcast`) and the service address (`service`).

mod arp;
pub(crate) mod broadcast;
mod hybrid6;
mod lan;
mod lan6;
mod router;
mod routes;
mod service;
mod v6;
mod vepa;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::Range;
use std::time::{Duration, Instant};

use broadcast::Bucket;
use ipnet::Ipv4Net;

use crate::ndp::ETHERTYPE_IPV6;
use crate::wire::{
    emit_arp_probe, emit_arp_reply, emit_ethernet_header, multicast_mac, udp_parts, ArpPacket,
    EthernetFrame, Ipv4Packet, ARP_LEN, BROADCAST_MAC, ETHERTYPE_ARP, ETHERTYPE_IPV4,
    ETHERTYPE_RARP, ETH_HEADER_LEN, IPPROTO_UDP,
};
use crate::{
    mtu, Action, Config, Counters, DropReason, Event, Mac, Mode, PortCounts, HEADROOM, LAN_PROBES,
    REMOTE_CONFIRMED,
};

/// A namespace address seen on the LAN.
#[derive(Debug, Clone, Copy)]
struct LanHost {
    mac: Mac,
    seen: Instant,
    /// Router mode: probes sent since it was last seen.
    probes: u8,
    last_probe: Option<Instant>,
}

/// Router mode: the LAN hosts of `hosts` (IPv4 or IPv6) silent for `timeout` at `now`,
/// probed at most once a second: those to probe now (counted as probed), and those that
/// went unanswered [`LAN_PROBES`] times (removed).
fn age<K: Copy + Eq + std::hash::Hash>(
    hosts: &mut HashMap<K, LanHost>,
    now: Instant,
    timeout: Duration,
) -> (Vec<K>, Vec<K>) {
    let (mut probe, mut gone) = (Vec::new(), Vec::new());
    for (addr, host) in hosts.iter_mut() {
        let probed_lately = host
            .last_probe
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(1));
        if now.saturating_duration_since(host.seen) < timeout || probed_lately {
            continue;
        }
        if host.probes >= LAN_PROBES {
            gone.push(*addr);
            continue;
        }
        host.probes += 1;
        host.last_probe = Some(now);
        probe.push(*addr);
    }
    for addr in &gone {
        hosts.remove(addr);
    }
    (probe, gone)
}

/// Hybrid mode: an ARP request of the host waiting for the LAN probe to time out.
#[derive(Debug, Clone, Copy)]
struct Probe {
    deadline: Instant,
    requester: (Mac, Ipv4Addr),
}

/// A frame the switch writes on its own.
#[derive(Debug, Clone, Copy)]
enum Emit {
    /// Who has `target`? (ARP probe from the remote MAC.)
    Probe(Ipv4Addr),
    /// `target` is at the remote MAC, told to the requester.
    Reply {
        target: Ipv4Addr,
        to: (Mac, Ipv4Addr),
    },
    /// Who has the IPv6 `target`? (A neighbour solicitation from the remote MAC.)
    Probe6(Ipv6Addr),
    /// The prefix, to all nodes (a router advertisement).
    Advertise,
    /// The IPv6 `target` is at the remote MAC, told to the requester (hybrid mode, after
    /// the LAN probe went unanswered).
    Reply6 {
        target: Ipv6Addr,
        to: (Ipv6Addr, Mac),
    },
    /// The IPv6 `target` is taken: a defence of it to all nodes, for a duplicate address
    /// probe (router mode, once the holder's host still answered at its site).
    Defend6(Ipv6Addr),
}

/// The switch of one namespace. `P` names a member (the overlay's peer handle).
#[derive(Debug)]
pub struct Switch<P> {
    config: Config,
    /// What members announced over their tunnels.
    routes: HashMap<Ipv4Addr, P>,
    /// What the DHT said (the owner's signed lease), for addresses its owner has not
    /// announced yet: a router that restarted learns its LAN hosts from this traffic.
    resolved: HashMap<Ipv4Addr, P>,
    /// A dual-stack namespace: the IPv6 addresses members announced, and what the DHT said.
    routes6: HashMap<Ipv6Addr, P>,
    resolved6: HashMap<Ipv6Addr, P>,
    lan: HashMap<Ipv4Addr, LanHost>,
    /// Router mode: the IPv6 addresses of the namespace seen on the LAN.
    lan6: HashMap<Ipv6Addr, LanHost>,
    /// Router mode: LAN IPv6 addresses solicited recently (a member sent to an unknown one).
    asked6: HashMap<Ipv6Addr, Instant>,
    /// Hybrid mode: the host's solicitations waiting for the LAN probe, and the members'
    /// addresses whose probe went unanswered, until when.
    probes6: HashMap<Ipv6Addr, hybrid6::Probe6>,
    confirmed6: HashMap<Ipv6Addr, Instant>,
    /// Router mode, dual stack: when the prefix is advertised next.
    advertise_at: Option<Instant>,
    /// How many of the first, closer spaced, advertisements are still to go.
    initial_adverts: u8,
    /// When a solicitation from `::` was last answered (to all nodes).
    last_multicast_answer: Option<Instant>,
    probes: HashMap<Ipv4Addr, Probe>,
    /// Hybrid mode: remote addresses whose LAN probe went unanswered, until when.
    confirmed: HashMap<Ipv4Addr, Instant>,
    /// Router mode: LAN addresses asked for recently (a member sent to an unknown host).
    asked: HashMap<Ipv4Addr, Instant>,
    /// Router mode: LAN addresses whose next frame is reported ([`Event::LanHostHeard`]).
    watched: HashSet<IpAddr>,
    /// Router mode: duplicate address probes for addresses other members hold, by when
    /// the prober decides: the host may have moved here ([`Event::Announced6`]); the
    /// agent's handoff says whether to defend the address ([`Switch::defend6`]).
    /// With the prober's MAC.
    dad_pending: HashMap<Ipv6Addr, (Instant, Mac)>,
    /// Other namespaces' addresses this one reaches through a gateway member (its address
    /// here): the policy's links (`crate::policy::links`).
    links: Vec<(Ipv4Net, Ipv4Addr)>,
    emits: VecDeque<Emit>,
    events: VecDeque<Event>,
    bucket_out: Bucket,
    bucket_in: Bucket,
    /// ICMP "host unreachable" for routed destinations nobody holds.
    bucket_unreachable: Bucket,
    /// Router advertisements answering solicitations.
    bucket_ra: Bucket,
    counters: Counters,
    /// VEPA: counts by LAN host MAC.
    ports: HashMap<Mac, PortCounts>,
    /// Addresses the agent's DHCP and DHCPv6 servers leased, and to which MAC.
    leases: HashMap<IpAddr, Mac>,
}

impl<P: Copy + Eq> Switch<P> {
    /// A switch with no routes.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            routes: HashMap::new(),
            resolved: HashMap::new(),
            routes6: HashMap::new(),
            resolved6: HashMap::new(),
            lan: HashMap::new(),
            lan6: HashMap::new(),
            asked6: HashMap::new(),
            advertise_at: None,
            probes6: HashMap::new(),
            confirmed6: HashMap::new(),
            initial_adverts: 0,
            last_multicast_answer: None,
            probes: HashMap::new(),
            confirmed: HashMap::new(),
            asked: HashMap::new(),
            watched: HashSet::new(),
            dad_pending: HashMap::new(),
            links: Vec::new(),
            emits: VecDeque::new(),
            events: VecDeque::new(),
            bucket_out: Bucket {
                tokens: 0.0,
                last: None,
            },
            bucket_in: Bucket {
                tokens: 0.0,
                last: None,
            },
            bucket_unreachable: Bucket {
                tokens: 0.0,
                last: None,
            },
            bucket_ra: Bucket {
                tokens: 0.0,
                last: None,
            },
            counters: Counters::default(),
            ports: HashMap::new(),
            leases: HashMap::new(),
        }
    }

    /// The switch's settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What the switch has done so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Handles a frame the kernel wrote to the TAP at `now`. A reply, if any, is built in
    /// `reply`, which must be at least [`MIN_REPLY_BUF`] long. A TCP SYN's MSS is clamped
    /// to the tunnel in `frame` itself.
    ///
    /// [`MIN_REPLY_BUF`]: crate::MIN_REPLY_BUF
    pub fn handle_tap_frame(
        &mut self,
        now: Instant,
        frame: &mut [u8],
        reply: &mut [u8],
    ) -> Action<P> {
        let mut action = self.classify_tap_frame(frame, now, reply);
        if let Action::Hairpin { .. } = action {
            if !self.reflect(frame) {
                action = Action::Drop(DropReason::Malformed);
            }
        }
        if !self.config.routed.is_empty() {
            if let Action::ToPeer { packet, .. } = &action {
                self.lower_ttl_if_routed(frame, &packet.clone());
            }
        }
        if let Action::ToPeer { packet, .. } | Action::Broadcast { packet } = &action {
            let mtu = self.config.tunnel_mtu;
            // (IPv6 was fitted where it was classified.)
            if frame
                .get(packet.clone())
                .is_none_or(|p| p[0] >> 4 == 4 && mtu::needs_fitting(p, mtu))
            {
                action = match action {
                    Action::ToPeer { peer, packet } => self.fit(frame, Some(peer), packet, reply),
                    Action::Broadcast { packet } => self.fit(frame, None, packet, reply),
                    other => other,
                };
            }
        }
        match &action {
            Action::ToPeer { .. } => self.counters.to_peer += 1,
            Action::Broadcast { .. } => self.counters.broadcasts_out += 1,
            Action::Fragment { peer, .. } => {
                self.counters.fragmented += 1;
                match peer {
                    Some(_) => self.counters.to_peer += 1,
                    None => self.counters.broadcasts_out += 1,
                }
            }
            Action::Dhcp { .. } | Action::Dhcp6 { .. } => self.counters.dhcp_requests += 1,
            Action::Dns { .. } => self.counters.dns_queries += 1,
            Action::Service { .. } => self.counters.service_packets += 1,
            // Counted where they are built: ARP replies, ICMP errors, reflected frames.
            Action::ToTap { .. } | Action::Hairpin { .. } => {}
            Action::Resolve { .. } => self.counters.resolves += 1,
            Action::Drop(reason) => self.counters.drops[reason.index()] += 1,
        }
        action
    }

    /// Fits the IPv4 packet at `packet` of `frame`, bound for `peer` (or every member), into
    /// the tunnel: clamps a SYN's MSS, and if it is still too large asks for fragments, or
    /// with DF set answers with ICMP "fragmentation needed" from the service address (an
    /// on-link address of the LAN, so the host's reverse-path filter takes it).
    #[inline(never)]
    fn fit(
        &mut self,
        frame: &mut [u8],
        peer: Option<P>,
        packet: Range<usize>,
        reply: &mut [u8],
    ) -> Action<P> {
        let mtu = self.config.tunnel_mtu;
        let Some(ip) = frame.get_mut(packet.clone()) else {
            return Action::Drop(DropReason::Malformed);
        };
        if mtu::clamp_mss(ip, mtu.saturating_sub(mtu::TCP_IPV4_HEADERS)) {
            self.counters.mss_clamped += 1;
        }
        if ip.len() <= usize::from(mtu) {
            return match peer {
                Some(peer) => Action::ToPeer { peer, packet },
                None => Action::Broadcast { packet },
            };
        }
        if mtu::ipv4_flags(ip) & mtu::IPV4_DF == 0 {
            if mtu::Fragments::new(ip, mtu).is_none() {
                return Action::Drop(DropReason::Malformed);
            }
            return Action::Fragment { peer, packet, mtu };
        }
        // No ICMP error for a broadcast, nor from an address the host cannot have on link.
        if peer.is_none() || self.service().is_unspecified() {
            return Action::Drop(DropReason::TooBig);
        }
        let src_mac = match EthernetFrame::new_checked(&frame[..]) {
            Ok(eth) => eth.src(),
            Err(_) => return Action::Drop(DropReason::Malformed),
        };
        let ip = &frame[packet];
        let macs = (src_mac, self.config.remote_mac);
        match mtu::emit_frag_needed(reply, macs, self.service(), mtu, ip) {
            Some(len) => {
                self.counters.frag_needed += 1;
                Action::ToTap { len }
            }
            None => Action::Drop(DropReason::TooBig),
        }
    }

    /// The next thing learned about the LAN.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Builds the next frame the switch wants on the TAP into `buf` (at least
    /// [`MIN_REPLY_BUF`] long) and returns its length.
    ///
    /// [`MIN_REPLY_BUF`]: crate::MIN_REPLY_BUF
    pub fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<usize> {
        // (Taken only once it fits: a short buffer loses nothing.)
        let emit = *self.emits.front()?;
        if let Emit::Probe6(_) | Emit::Advertise | Emit::Reply6 { .. } | Emit::Defend6(_) = emit {
            if buf.len() < crate::ra::ADVERTISEMENT_MAX_LEN {
                return None;
            }
            self.emits.pop_front();
            return self.emit6(emit, buf);
        }
        if buf.len() < ETH_HEADER_LEN + ARP_LEN {
            return None;
        }
        self.emits.pop_front();
        Some(match emit {
            Emit::Probe(target) => {
                self.counters.arp_probes += 1;
                emit_arp_probe(buf, self.config.remote_mac, target)
            }
            Emit::Reply { target, to } => {
                self.counters.arp_replies += 1;
                emit_arp_reply(buf, self.config.remote_mac, target, to.0, to.1)
            }
            Emit::Probe6(_) | Emit::Advertise | Emit::Reply6 { .. } | Emit::Defend6(_) => {
                return None
            }
        })
    }

    /// When [`Switch::handle_timeout`] wants to run next, if anything waits.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let probe = self.probes.values().map(|p| p.deadline).min();
        let lan = (self.config.mode == Mode::Router)
            .then(|| {
                self.lan
                    .values()
                    .map(|h| match h.last_probe {
                        Some(t) => t + Duration::from_secs(1),
                        None => h.seen + self.config.lan_timeout,
                    })
                    .min()
            })
            .flatten();
        [probe, lan, self.poll_timeout6()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Runs the timers due at `now`: hybrid probes that went unanswered become ARP replies;
    /// router-mode LAN hosts that fell silent are probed, then forgotten.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<Ipv4Addr> = self
            .probes
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(a, _)| *a)
            .collect();
        for target in due {
            let Some(probe) = self.probes.remove(&target) else {
                continue;
            };
            if self.lan.contains_key(&target) {
                continue;
            }
            self.confirmed.insert(target, now + REMOTE_CONFIRMED);
            if self.route(target).is_some() {
                // The host's ARP request is still pending: complete it.
                self.emits.push_back(Emit::Reply {
                    target,
                    to: probe.requester,
                });
            }
        }
        self.confirmed.retain(|_, until| *until > now);
        self.asked
            .retain(|_, t| now.saturating_duration_since(*t) < Duration::from_secs(1));
        self.handle_timeout6(now);
        if self.config.mode != Mode::Router {
            return;
        }
        let (probe, gone) = age(&mut self.lan, now, self.config.lan_timeout);
        self.emits.extend(probe.into_iter().map(Emit::Probe));
        self.events.extend(gone.into_iter().map(Event::LanHostDown));
    }

    fn classify_tap_frame(&mut self, frame: &[u8], now: Instant, reply: &mut [u8]) -> Action<P> {
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            return Action::Drop(DropReason::Malformed);
        };
        let mode = self.config.mode;
        // Hybrid: only the host's own device is this switch's business (IPOP Fig. 5).
        let ours = mode != Mode::Hybrid || eth.src() == self.config.device_mac;
        match eth.ethertype() {
            ETHERTYPE_ARP => {
                let Ok(arp) = ArpPacket::new_checked(eth.payload()) else {
                    return Action::Drop(DropReason::Malformed);
                };
                if mode != Mode::Interface {
                    if self.vepa()
                        && (arp.sender_mac() != eth.src()
                            || self.spoofed(arp.sender_ip(), eth.src()))
                    {
                        return self.spoof_drop(eth.src());
                    }
                    self.learn(arp.sender_ip(), arp.sender_mac(), now);
                }
                if mode == Mode::Router && arp.sender_ip() == arp.target_ip() {
                    self.announced(Some(arp.sender_ip()), arp.sender_mac());
                }
                if !ours {
                    return Action::Drop(DropReason::OtherHost);
                }
                self.answer_arp(&arp, now, reply)
            }
            ETHERTYPE_IPV4 => {
                let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
                    return Action::Drop(DropReason::Malformed);
                };
                if mode != Mode::Interface {
                    if self.spoofed(ip.src(), eth.src()) {
                        return self.spoof_drop(eth.src());
                    }
                    self.learn(ip.src(), eth.src(), now);
                }
                if !ours {
                    return Action::Drop(DropReason::OtherHost);
                }
                let packet = ETH_HEADER_LEN..ETH_HEADER_LEN + ip.total_len();
                if self.config.dhcp && ip.protocol() == IPPROTO_UDP {
                    if let Some((_, 67, udp)) = udp_parts(ip.payload()) {
                        let at = packet.end - ip.payload().len();
                        return Action::Dhcp {
                            payload: at + udp.start..at + udp.end,
                            mac: eth.src(),
                        };
                    }
                }
                let dst = ip.dst();
                if dst == self.service() {
                    return self.to_service(&eth, &ip, packet);
                }
                if self.is_broadcast(dst) {
                    if !self.config.subnet.contains(&ip.src()) {
                        return Action::Drop(DropReason::OutsideSubnet);
                    }
                    if !self.bucket_out.take(self.config.broadcast_rate, now) {
                        return Action::Drop(DropReason::BroadcastRateLimited);
                    }
                    return Action::Broadcast { packet };
                }
                // Router and hybrid: LAN unicast the bridge flooded before it learned where
                // to send it (a hybrid host's to a neighbour would otherwise arrive twice).
                if mode != Mode::Interface && eth.dst() != self.config.remote_mac {
                    return Action::Drop(DropReason::LanLocal);
                }
                if !self.config.subnet.contains(&dst) {
                    if let Some(net) = self.config.routed_subnet(dst) {
                        return self.route_to_subnet(&eth, &ip, net, packet, reply);
                    }
                    // Another namespace's address, through the gateway a link names.
                    return match self.link_gateway(dst) {
                        Some(gateway) => match self.route(gateway) {
                            Some(peer) => Action::ToPeer { peer, packet },
                            None => Action::Resolve {
                                target: gateway.into(),
                            },
                        },
                        None => Action::Drop(DropReason::OutsideSubnet),
                    };
                }
                if self.vepa() && self.route(dst).is_none() && self.lan.contains_key(&dst) {
                    // Between two LAN hosts (a member's address is the member's, whoever
                    // sent from it here): only from one the switch knows by this MAC,
                    // and not from a member's address (a host that moved here sends to
                    // its neighbours once the handoff made the address this router's).
                    let src = ip.src();
                    return match self.lan.get(&src) {
                        Some(h) if h.mac == eth.src() && self.route(src).is_none() => {
                            Action::Hairpin { packet }
                        }
                        _ => self.spoof_drop(eth.src()),
                    };
                }
                match self.route(dst) {
                    Some(peer) => Action::ToPeer { peer, packet },
                    None if mode != Mode::Interface && self.lan.contains_key(&dst) => {
                        Action::Drop(DropReason::LanLocal)
                    }
                    None if dst == self.config.address || dst == self.config.subnet.network() => {
                        Action::Drop(DropReason::NoRoute)
                    }
                    None => Action::Resolve { target: dst.into() },
                }
            }
            ETHERTYPE_IPV6 => self.classify_ipv6(frame, &eth, now, reply),
            ETHERTYPE_RARP if mode == Mode::Router => {
                let Ok(rarp) = ArpPacket::new_checked(eth.payload()) else {
                    return Action::Drop(DropReason::Malformed);
                };
                self.announced(None, rarp.sender_mac());
                // Nothing for the overlay: the bridge floods it on the LAN.
                Action::Drop(DropReason::LanLocal)
            }
            _ => Action::Drop(DropReason::UnsupportedProtocol),
        }
    }

    /// Handles an IPv4 packet of `len` bytes from a member, lying at `buf[HEADROOM..]`; the
    /// source address has already been checked against what the member owns. On
    /// [`Action::ToTap`] the Ethernet header has been written in front of it, in place.
    pub fn handle_peer_packet(&mut self, now: Instant, buf: &mut [u8], len: usize) -> Action<P> {
        let action = self.frame_peer_packet(buf, len, now);
        match &action {
            Action::ToTap { .. } => self.counters.to_tap += 1,
            Action::Drop(reason) => self.counters.drops[reason.index()] += 1,
            Action::ToPeer { .. }
            | Action::Hairpin { .. }
            | Action::Resolve { .. }
            | Action::Broadcast { .. }
            | Action::Fragment { .. }
            | Action::Dhcp { .. }
            | Action::Dhcp6 { .. }
            | Action::Dns { .. }
            | Action::Service { .. } => {}
        }
        action
    }

    fn frame_peer_packet(&mut self, buf: &mut [u8], len: usize, now: Instant) -> Action<P> {
        let Some(packet) = buf.get(HEADROOM..HEADROOM + len) else {
            return Action::Drop(DropReason::Malformed);
        };
        if packet.first().is_some_and(|b| b >> 4 == 6) {
            return self.frame_peer_packet6(buf, len, now);
        }
        let Ok(ip) = Ipv4Packet::new_checked(packet) else {
            return Action::Drop(DropReason::Malformed);
        };
        let (dst, src, frame_len) = (ip.dst(), ip.src(), HEADROOM + ip.total_len());
        let mode = self.config.mode;
        if self
            .config
            .routed_subnet(dst)
            .is_some_and(|n| n.broadcast() == dst)
        {
            // Another subnet's broadcast (its members hear it): not this subnet's.
            return Action::Drop(DropReason::OtherSubnet);
        }
        let dst_mac = if self.is_broadcast(dst) {
            if mode != Mode::Interface && self.lan.contains_key(&src) {
                return Action::Drop(DropReason::BroadcastFromLan);
            }
            // Broadcast and multicast stay in their subnet.
            if self.config.routed_subnet(src).is_some() {
                return Action::Drop(DropReason::OtherSubnet);
            }
            if !self.bucket_in.take(self.config.broadcast_rate, now) {
                return Action::Drop(DropReason::BroadcastRateLimited);
            }
            self.counters.broadcasts_in += 1;
            match mode {
                // The whole LAN hears it.
                Mode::Router if dst.is_multicast() => multicast_mac(dst),
                Mode::Router => BROADCAST_MAC,
                // Only this host: other hosts of a hybrid LAN hear it from their own agent.
                Mode::Interface | Mode::Hybrid => self.config.device_mac,
            }
        } else if mode == Mode::Router {
            match self.lan.get(&dst) {
                Some(host) => host.mac,
                None => {
                    // Not seen since start (the agent restarted?): ask, once a second.
                    if self.config.subnet.contains(&dst) && !self.asked.contains_key(&dst) {
                        self.asked.insert(dst, now);
                        self.emits.push_back(Emit::Probe(dst));
                    }
                    return Action::Drop(DropReason::NotForUs);
                }
            }
        } else if dst == self.config.address {
            self.config.device_mac
        } else {
            return Action::Drop(DropReason::NotForUs);
        };
        // A member's SYN may come from an agent that does not clamp (or a larger tunnel MTU):
        // clamping here too keeps the LAN host's segments back to it within the tunnel.
        let mss = self.config.tunnel_mtu.saturating_sub(mtu::TCP_IPV4_HEADERS);
        if mtu::clamp_mss(&mut buf[HEADROOM..frame_len], mss) {
            self.counters.mss_clamped += 1;
        }
        emit_ethernet_header(buf, dst_mac, self.config.remote_mac, ETHERTYPE_IPV4);
        Action::ToTap { len: frame_len }
    }
}
