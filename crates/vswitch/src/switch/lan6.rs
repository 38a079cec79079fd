//! IPv6 hosts of a router-mode LAN: IPOP's router rules carried over to neighbour
//! discovery. The switch learns a host's addresses in the prefix from its packets, its
//! neighbour advertisements and its duplicate address probes (the agent claims each, as an
//! IPv4 LAN host's); answers solicitations for addresses other members hold with the
//! remote MAC, never for a LAN host's; reports a duplicate address probe for an address
//! another member holds and an unsolicited advertisement as the host's presence (it may
//! have moved here: the agent's handoff asks the holder), and defends the address when
//! the holder's host still answers at its site (the prober's kernel then never uses it);
//! advertises the
//! prefix (on link, for stateless autoconfiguration) at start, now and then, and to a
//! soliciting host; and finds a host a member sends to with a solicitation of its own.

use std::net::{IpAddr, Ipv6Addr};
use std::time::{Duration, Instant};

use super::{Emit, LanHost, Switch};
use crate::ndp::{self, Message};
use crate::ra::{self, Advertised};
use crate::wire::{
    emit_udp6, may_be_nd, udp_parts, EthernetFrame, Ipv6Packet, ETH_HEADER_LEN, IPPROTO_UDP,
    IPV6_HEADER_LEN,
};
use crate::REMOTE_MAC_PREFIX;
use crate::{service_address6, Action, Client, DropReason, Event, Mac, Mode, MAX_LAN_HOSTS};

/// How often the prefix is advertised unasked (RFC 4861's MaxRtrAdvInterval is 600 s by
/// default; the lifetimes advertised are many times this).
pub(super) const ADVERTISE_EVERY: Duration = Duration::from_secs(200);
/// The first advertisements after start, and the time between them (RFC 4861 6.2.4 allows
/// 3, at most 16 s apart): a host whose solicitations went unanswered while the agent
/// started, or whose first advertisement was lost, need not wait for the next interval.
const INITIAL_ADVERTISEMENTS: u8 = 3;
const INITIAL_EVERY: Duration = Duration::from_secs(4);
/// Router advertisements a second answering solicitations (also the burst).
const SOLICITED_RATE: u32 = 10;
/// A solicitation from `::` is answered to all nodes, at most this often (RFC 4861 6.2.6's
/// MIN_DELAY_BETWEEN_RAS).
const MULTICAST_ANSWER_EVERY: Duration = Duration::from_secs(3);

/// How long a duplicate address probe may still be answered: RFC 4861's RetransTimer
/// (1 s), after which the prober takes the address (one probe, RFC 4862's default).
const DAD_WINDOW: Duration = Duration::from_secs(1);
/// A duplicate address probe the handoff has not decided by this time is defended: a
/// duplicate stays refused at DAD time when the holder is slow to answer or cannot (an
/// older agent, a slow DHT). A host that moved here while its old router is dead then
/// loses the address it configured again (one it did not probe for it keeps).
const DAD_DECIDE: Duration = Duration::from_millis(800);

/// All DHCPv6 relay agents and servers on a link (RFC 8415 7.1): where clients send.
const ALL_DHCP_SERVERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2);
/// All DHCPv6 servers of the site (RFC 8415 7.1): where a relay agent sends by default.
const ALL_DHCP_SERVERS_SITE: Ipv6Addr = Ipv6Addr::new(0xff05, 0, 0, 0, 0, 0, 1, 3);

/// Whether `mac` may be a LAN host's: not an agent's remote MAC (FE:FD), not a group
/// address, not zero.
fn host_mac(mac: Mac) -> bool {
    mac[..2] != REMOTE_MAC_PREFIX && mac[0] & 1 == 0 && mac != [0; 6]
}

impl<P: Copy + Eq> Switch<P> {
    /// Router mode: the IPv6 addresses of the namespace seen on the LAN, sorted.
    pub fn lan_hosts6(&self) -> Vec<Ipv6Addr> {
        let mut v: Vec<Ipv6Addr> = self.lan6.keys().copied().collect();
        v.sort();
        v
    }

    /// Starts the timers that need a clock from the start: a router-mode switch of a
    /// dual-stack namespace advertises the prefix at once (hosts already up learn it
    /// without soliciting).
    pub fn start(&mut self, now: Instant) {
        if self.config.mode == Mode::Router && self.carries_ipv6() {
            self.advertise_at = Some(now);
            self.initial_adverts = INITIAL_ADVERTISEMENTS;
        }
    }

    /// Whether this switch carries IPv6: a dual-stack namespace.
    pub(super) fn carries_ipv6(&self) -> bool {
        self.config.prefix6.is_some()
    }

    /// An address of the prefix a LAN host uses (from `mac`): learned, and claimed by the
    /// agent ([`Event::LanHost6Up`], router mode) when new. One another member holds is
    /// learned too, as an IPv4 LAN host's is: the host may have moved here, and the
    /// claim's refusal starts the handoff. Its route stays first meanwhile: solicitations
    /// for it are still answered with the remote MAC, its probes still defended, and
    /// packets to it still go to the holder, until the handoff moves it here.
    pub(super) fn learn6(&mut self, ip: Ipv6Addr, mac: Mac, now: Instant) {
        let usable = self
            .config
            .prefix6
            .is_some_and(|p| super::v6::member_address(p, ip));
        let router = self.config.mode == Mode::Router;
        let own = Some(ip) == self.config.address6;
        if !usable || own || !host_mac(mac) {
            return;
        }
        if self.watched.remove(&IpAddr::V6(ip)) {
            self.events.push_back(Event::LanHostHeard {
                address: ip.into(),
                mac,
            });
        }
        self.asked6.remove(&ip);
        self.probes6.remove(&ip);
        self.confirmed6.remove(&ip);
        if let Some(host) = self.lan6.get_mut(&ip) {
            host.mac = mac;
            host.seen = now;
            host.probes = 0;
            host.last_probe = None;
            return;
        }
        if self.lan6.len() >= MAX_LAN_HOSTS {
            self.counters.lan_table_full += 1;
            return;
        }
        let host = LanHost {
            mac,
            seen: now,
            probes: 0,
            last_probe: None,
        };
        self.lan6.insert(ip, host);
        if router {
            self.events.push_back(Event::LanHost6Up(ip));
        }
    }

    /// The MAC of the LAN host at the IPv6 `address`, if one is known here.
    pub fn lan_host6(&self, address: Ipv6Addr) -> Option<Mac> {
        self.lan6.get(&address).map(|h| h.mac)
    }

    /// Forgets the LAN host at the IPv6 `address` at once (the agent gave it up, or it is
    /// held elsewhere); its next frame here makes it [`Event::LanHost6Up`] again.
    pub fn forget_lan_host6(&mut self, address: Ipv6Addr) {
        self.lan6.remove(&address);
    }

    /// Router mode: an IPv6 frame from the LAN.
    pub(super) fn classify_ipv6_lan(
        &mut self,
        frame: &[u8],
        eth: &EthernetFrame<&[u8]>,
        ip: &Ipv6Packet<&[u8]>,
        now: Instant,
        reply: &mut [u8],
    ) -> Action<P> {
        let Some(prefix) = self.config.prefix6 else {
            return Action::Drop(DropReason::UnsupportedProtocol);
        };
        if let Some(rs) = ra::parse_solicitation(frame) {
            let to = match rs.link {
                Some(mac) if !rs.source.is_unspecified() => Some((rs.source, mac)),
                _ if !rs.source.is_unspecified() => Some((rs.source, eth.src())),
                _ => None,
            };
            return self.answer_router_solicitation(to, now, reply);
        }
        if ra::is_advertisement(frame) {
            // Another router's, for its LAN.
            return Action::Drop(DropReason::LanLocal);
        }
        if let Some(dhcp) = self.dhcp6_request(eth, ip) {
            return dhcp;
        }
        if let Some(nd) = ndp::parse(frame) {
            let vepa = self.vepa();
            return match nd.message {
                Message::Solicitation { target, .. } if nd.source.is_unspecified() => {
                    self.duplicate_probe(target, eth.src(), now, reply)
                }
                Message::Solicitation { target, link } => {
                    let mac = link.unwrap_or(eth.src());
                    if vepa && (mac != eth.src() || self.spoofed6(nd.source, mac)) {
                        return self.spoof_drop(eth.src());
                    }
                    self.learn6(nd.source, mac, now);
                    let own = ndp::link_local_of(self.config.remote_mac);
                    if target == own {
                        // The source of the switch's advertisements and probes.
                        return self.answer_for_link_local((nd.source, mac), reply);
                    }
                    if self.route6(target).is_none() && self.lan6.contains_key(&target) {
                        if vepa {
                            // The other host never hears it: reached through the switch.
                            return self.answer_for_lan_host(target, (nd.source, mac), reply);
                        }
                        // A LAN host's own: it answers for itself.
                        return Action::Drop(DropReason::LanLocal);
                    }
                    if vepa && self.route6(target).is_none() {
                        // Maybe a LAN host not heard yet: it answers the switch's own
                        // solicitation (once a second), and the host's next is answered.
                        self.ask_lan6(target, now);
                    }
                    self.answer_solicitation(target, (nd.source, mac), reply)
                }
                Message::Advertisement {
                    target,
                    link,
                    solicited,
                    ..
                } => {
                    let mac = link.unwrap_or(eth.src());
                    if vepa && (mac != eth.src() || self.spoofed6(target, mac)) {
                        return self.spoof_drop(eth.src());
                    }
                    self.learn6(target, mac, now);
                    if !solicited && self.lan6.get(&target).is_some_and(|h| h.mac == mac) {
                        // A host telling the link where it is (after a live migration).
                        self.counters.announcements += 1;
                        self.events.push_back(Event::Announced6 {
                            address: target,
                            mac,
                            dad: false,
                        });
                    }
                    Action::Drop(DropReason::LanLocal)
                }
            };
        }
        let (src, dst) = (ip.src(), ip.dst());
        if super::v6::stays_on_link(src) || super::v6::stays_on_link(dst) {
            return Action::Drop(DropReason::LinkLocal);
        }
        if !prefix.contains(&src) {
            return Action::Drop(DropReason::OutsideSubnet);
        }
        if self.spoofed6(src, eth.src()) {
            return self.spoof_drop(eth.src());
        }
        self.learn6(src, eth.src(), now);
        let packet = ETH_HEADER_LEN..ETH_HEADER_LEN + ip.total_len();
        if dst == service_address6(prefix) {
            return self.to_service6(eth, ip, packet);
        }
        let to_router = eth.dst() == self.config.remote_mac;
        if self.vepa() && to_router && self.route6(dst).is_none() && self.lan6.contains_key(&dst) {
            // Between two LAN hosts (the LAN's MTU, not the tunnel's): only from the one
            // the switch knows by this MAC, from no member's address, and never neighbour
            // discovery (behind extension headers) that the checks above did not see.
            let known = self.lan6.get(&src).is_some_and(|h| h.mac == eth.src());
            return match known && self.route6(src).is_none() && !may_be_nd(&frame[packet.clone()]) {
                true => Action::Hairpin { packet },
                false => self.spoof_drop(eth.src()),
            };
        }
        if packet.len() > usize::from(self.config.tunnel_mtu) {
            return self.packet_too_big(eth.src(), &frame[packet], reply);
        }
        if dst.is_multicast() {
            if !self.bucket_out.take(self.config.broadcast_rate, now) {
                return Action::Drop(DropReason::BroadcastRateLimited);
            }
            return Action::Broadcast { packet };
        }
        // LAN unicast the bridge flooded before it learned where to send it.
        if !to_router {
            return Action::Drop(DropReason::LanLocal);
        }
        if !prefix.contains(&dst) {
            return Action::Drop(DropReason::OutsideSubnet);
        }
        match self.route6(dst) {
            Some(peer) => Action::ToPeer { peer, packet },
            None if self.lan6.contains_key(&dst) => Action::Drop(DropReason::LanLocal),
            None if !super::v6::member_address(prefix, dst) => Action::Drop(DropReason::NoRoute),
            None => Action::Resolve { target: dst.into() },
        }
    }

    /// A DHCPv6 message from a LAN host (UDP from its port to all DHCPv6 servers' port
    /// 547: a client's, or a relay agent's to the site's servers), when the agent serves
    /// DHCP.
    fn dhcp6_request(
        &self,
        eth: &EthernetFrame<&[u8]>,
        ip: &Ipv6Packet<&[u8]>,
    ) -> Option<Action<P>> {
        let to_servers = matches!(ip.dst(), ALL_DHCP_SERVERS | ALL_DHCP_SERVERS_SITE);
        if !self.config.dhcp || ip.next_header() != IPPROTO_UDP || !to_servers {
            return None;
        }
        let (port, 547, udp) = udp_parts(ip.payload())? else {
            return None;
        };
        let at = ETH_HEADER_LEN + IPV6_HEADER_LEN;
        Some(Action::Dhcp6 {
            payload: at + udp.start..at + udp.end,
            client: Client {
                mac: eth.src(),
                ip: ip.src().into(),
                port,
            },
        })
    }

    /// Frames a reply of the virtual DHCPv6 server (UDP from port 547 to `port` at `to`:
    /// 546 of a client, 547 of a relay agent) into `buf`; returns its length, or `None` if
    /// it does not fit. From the switch's link-local address to a link-local one, else
    /// from the prefix's service address (where a relay agent sends unicast).
    pub fn emit_dhcp6_reply(
        &self,
        buf: &mut [u8],
        (to, to_mac): (Ipv6Addr, Mac),
        port: u16,
        payload: &[u8],
    ) -> Option<usize> {
        let mac = self.config.remote_mac;
        let from = match self.config.prefix6 {
            Some(prefix) if !super::v6::stays_on_link(to) => service_address6(prefix),
            _ => ndp::link_local_of(mac),
        };
        emit_udp6(buf, (to_mac, mac), (from, to), (547, port), payload)
    }

    /// A duplicate address probe from the LAN for `target`: the service address is
    /// defended at once (RFC 4862 5.4.3: the prober gives the address up). One another
    /// member holds may be a host that moved here from that member's LAN: reported
    /// ([`Event::Announced6`]), and defended only if the holder says its host is still
    /// there ([`Switch::defend6`], within the prober's wait). Else the host at `mac` is
    /// about to use it, and it is claimed for it now. A known LAN host's address is left
    /// to that host (it defends it itself): the prober's MAC does not replace its own.
    fn duplicate_probe(
        &mut self,
        target: Ipv6Addr,
        mac: Mac,
        now: Instant,
        reply: &mut [u8],
    ) -> Action<P> {
        let Some(prefix) = self.config.prefix6 else {
            return Action::Drop(DropReason::NdIgnored);
        };
        let service = target == service_address6(prefix);
        if !host_mac(mac) || !(service || super::v6::member_address(prefix, target)) {
            return Action::Drop(DropReason::NdIgnored);
        }
        if service {
            return match ndp::emit_defence(reply, (target, self.config.remote_mac)) {
                Some(len) => {
                    self.counters.dad_defended += 1;
                    Action::ToTap { len }
                }
                None => Action::Drop(DropReason::Malformed),
            };
        }
        let known = self.lan6.contains_key(&target);
        if self.vepa() {
            let table = &self.config.lan_table;
            if !table.is_empty() && !table.iter().any(|e| e.1 == mac) {
                return self.spoof_drop(mac);
            }
            if self.lan_mac6(target).is_some_and(|m| m != mac) {
                // Another LAN host's, which never hears the probe: refused for it, to the
                // prober only (the holder, probing again after its link flapped, would
                // take an answer for its own tentative address as a duplicate).
                return match ndp::emit_defence(reply, (target, self.config.remote_mac)) {
                    Some(len) => {
                        reply[..6].copy_from_slice(&mac);
                        self.counters.dad_defended += 1;
                        Action::ToTap { len }
                    }
                    None => Action::Drop(DropReason::Malformed),
                };
            }
        }
        if !known {
            self.learn6(target, mac, now);
        }
        let taken = self.route6(target).is_some();
        if taken && !known && self.dad_pending.len() < MAX_LAN_HOSTS {
            self.dad_pending.insert(target, (now, mac));
            self.counters.announcements += 1;
            self.events.push_back(Event::Announced6 {
                address: target,
                mac,
                dad: true,
            });
        }
        Action::Drop(DropReason::NdIgnored)
    }

    /// Router mode: the holder of the IPv6 `address` says its host is still at its site
    /// (or the handoff gave up): a duplicate address probe for it still waiting is
    /// answered, so the prober gives the address up, and the address is no longer the
    /// prober's here (its next frame from it makes it [`Event::LanHost6Up`] again).
    /// Returns whether a defence was sent.
    pub fn defend6(&mut self, address: Ipv6Addr, now: Instant) -> bool {
        match self.dad_pending.remove(&address) {
            Some((probed, mac)) if now < probed + DAD_WINDOW => {
                self.emit_defence6(address, mac);
                true
            }
            _ => false,
        }
    }

    /// Router mode: the IPv6 `address` moved here (the handoff took it over): a duplicate
    /// address probe for it is not answered.
    pub fn settle6(&mut self, address: Ipv6Addr) {
        self.dad_pending.remove(&address);
    }

    fn emit_defence6(&mut self, address: Ipv6Addr, prober: Mac) {
        self.emits.push_back(Emit::Defend6(address));
        if self.lan6.get(&address).is_some_and(|h| h.mac == prober) {
            self.lan6.remove(&address);
        }
    }

    /// VEPA: a solicitation for another LAN host's `target` answered with the router MAC
    /// (the host sends to the switch, which reflects it). It overrides what the asker
    /// cached: no other node on its port can answer.
    fn answer_for_lan_host(
        &mut self,
        target: Ipv6Addr,
        asker: (Ipv6Addr, Mac),
        reply: &mut [u8],
    ) -> Action<P> {
        if target == asker.0 {
            return Action::Drop(DropReason::NdIgnored);
        }
        let flags = ndp::NaFlags {
            router: false,
            override_cache: true,
        };
        match ndp::emit_advertisement(reply, (target, self.config.remote_mac), asker, flags) {
            Some(len) => {
                self.counters.nd_replies += 1;
                Action::ToTap { len }
            }
            None => Action::Drop(DropReason::Malformed),
        }
    }

    /// Solicits the IPv6 `target` on the LAN, at most once a second.
    fn ask_lan6(&mut self, target: Ipv6Addr, now: Instant) {
        let usable = self
            .config
            .prefix6
            .is_some_and(|p| super::v6::member_address(p, target));
        if usable && !self.asked6.contains_key(&target) && self.asked6.len() < MAX_LAN_HOSTS {
            self.asked6.insert(target, now);
            self.emits.push_back(Emit::Probe6(target));
        }
    }

    /// A solicitation for the switch's own link-local address (a host checking that the
    /// sender of its router advertisements is still there): answered as a router does.
    fn answer_for_link_local(&mut self, asker: (Ipv6Addr, Mac), reply: &mut [u8]) -> Action<P> {
        let mac = self.config.remote_mac;
        let own = (ndp::link_local_of(mac), mac);
        let flags = ndp::NaFlags {
            router: true,
            override_cache: true,
        };
        match ndp::emit_advertisement(reply, own, asker, flags) {
            Some(len) => {
                self.counters.nd_replies += 1;
                Action::ToTap { len }
            }
            None => Action::Drop(DropReason::Malformed),
        }
    }

    /// A router solicitation: the prefix advertised to the host at `to` (all nodes when it
    /// has no address yet), at most [`SOLICITED_RATE`] a second.
    fn answer_router_solicitation(
        &mut self,
        to: Option<(Ipv6Addr, Mac)>,
        now: Instant,
        reply: &mut [u8],
    ) -> Action<P> {
        if to.is_none() {
            if self
                .last_multicast_answer
                .is_some_and(|t| now.saturating_duration_since(t) < MULTICAST_ANSWER_EVERY)
            {
                return Action::Drop(DropReason::NdIgnored);
            }
            self.last_multicast_answer = Some(now);
        }
        if !self.bucket_ra.take(SOLICITED_RATE, now) {
            return Action::Drop(DropReason::NdIgnored);
        }
        match self.emit_router_advertisement(reply, to) {
            Some(len) => Action::ToTap { len },
            None => Action::Drop(DropReason::Malformed),
        }
    }

    fn emit_router_advertisement(
        &mut self,
        buf: &mut [u8],
        to: Option<(Ipv6Addr, Mac)>,
    ) -> Option<usize> {
        let prefix = self.config.prefix6?;
        let advertised = Advertised {
            prefix,
            dns: Some(service_address6(prefix)),
            managed: self.config.dhcp,
        };
        let len = ra::emit_advertisement(buf, self.config.remote_mac, to, &advertised)?;
        self.counters.router_advertisements += 1;
        Some(len)
    }

    /// Router mode: the MAC of the LAN host at the IPv6 `dst` a member sent to; unknown,
    /// it is solicited on the LAN (once a second) and `None` returned.
    pub(super) fn lan_host6_mac(&mut self, dst: Ipv6Addr, now: Instant) -> Option<Mac> {
        if self.route6(dst).is_some() {
            // Another member's: a host here sending from it is not its holder.
            return None;
        }
        if let Some(host) = self.lan6.get(&dst) {
            return Some(host.mac);
        }
        self.ask_lan6(dst, now);
        None
    }

    /// Whether `src` is one of this LAN's hosts (its multicast came back from a member).
    /// A router's LAN host never stands for an address another member holds (its
    /// multicast is that member's); a hybrid's LAN may hold another member itself.
    pub(super) fn is_lan_host6(&self, src: Ipv6Addr) -> bool {
        self.lan6.contains_key(&src)
            && (self.config.mode != Mode::Router || self.route6(src).is_none())
    }

    /// Writes the IPv6 frame `emit` stands for into `buf`.
    pub(super) fn emit6(&mut self, emit: Emit, buf: &mut [u8]) -> Option<usize> {
        let mac = self.config.remote_mac;
        match emit {
            Emit::Probe6(target) => {
                let len = ndp::emit_solicitation(buf, (ndp::link_local_of(mac), mac), target)?;
                self.counters.nd_probes += 1;
                Some(len)
            }
            Emit::Advertise => self.emit_router_advertisement(buf, None),
            Emit::Reply6 { target, to } => {
                // A proxy's answer on a LAN yields to the owner's (RFC 4861 7.2.8).
                let flags = ndp::NaFlags {
                    router: false,
                    override_cache: false,
                };
                let len = ndp::emit_advertisement(buf, (target, mac), to, flags)?;
                self.counters.nd_replies += 1;
                Some(len)
            }
            Emit::Defend6(target) => {
                let len = ndp::emit_defence(buf, (target, mac))?;
                self.counters.dad_defended += 1;
                Some(len)
            }
            Emit::Probe(_) | Emit::Reply { .. } => None,
        }
    }

    /// When the IPv6 LAN timers want to run next.
    pub(super) fn poll_timeout6(&self) -> Option<Instant> {
        if self.config.mode != Mode::Router {
            // Hybrid: probes, and LAN addresses that fall silent are forgotten.
            let silent = self.lan6.values().map(|h| h.seen + self.config.lan_timeout);
            return silent.chain(self.probes6_due()).min();
        }
        let hosts = self
            .lan6
            .values()
            .map(|h| match h.last_probe {
                Some(t) => t + Duration::from_secs(1),
                None => h.seen + self.config.lan_timeout,
            })
            .min();
        let undecided = self
            .dad_pending
            .values()
            .map(|(t, _)| *t + DAD_DECIDE)
            .min();
        [hosts, self.advertise_at, undecided]
            .into_iter()
            .flatten()
            .min()
    }

    /// Runs the IPv6 LAN timers: the prefix advertised when due; hosts that fell silent
    /// solicited, then forgotten ([`Event::LanHost6Down`]).
    pub(super) fn handle_timeout6(&mut self, now: Instant) {
        self.asked6
            .retain(|_, t| now.saturating_duration_since(*t) < Duration::from_secs(1));
        self.expire_probes6(now);
        if self.config.mode != Mode::Router {
            // Hybrid: an address silent for `lan_timeout` is no longer the LAN's (a host
            // that moved away, or one that only claimed it once): its next solicitation is
            // probed again.
            let timeout = self.config.lan_timeout;
            self.lan6
                .retain(|_, h| now.saturating_duration_since(h.seen) < timeout);
            return;
        }
        let undecided: Vec<(Ipv6Addr, Mac)> = self
            .dad_pending
            .iter()
            .filter(|(_, (t, _))| now >= *t + DAD_DECIDE)
            .map(|(a, (_, mac))| (*a, *mac))
            .collect();
        for (address, prober) in undecided {
            self.dad_pending.remove(&address);
            let learned = self.lan6.get(&address).is_some_and(|h| h.mac == prober);
            self.emit_defence6(address, prober);
            if learned {
                // The prober gives it up: not the LAN's (the agent stops claiming it).
                self.events.push_back(Event::LanHost6Down(address));
            }
        }
        if self.advertise_at.is_some_and(|t| t <= now) {
            self.emits.push_back(Emit::Advertise);
            self.initial_adverts = self.initial_adverts.saturating_sub(1);
            let next = if self.initial_adverts > 0 {
                INITIAL_EVERY
            } else {
                ADVERTISE_EVERY
            };
            self.advertise_at = Some(now + next);
        }
        let (probe, gone) = super::age(&mut self.lan6, now, self.config.lan_timeout);
        self.emits.extend(probe.into_iter().map(Emit::Probe6));
        self.events
            .extend(gone.into_iter().map(Event::LanHost6Down));
    }
}
