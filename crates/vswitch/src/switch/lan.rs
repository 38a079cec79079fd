//! LAN hosts (router and hybrid modes): learning namespace addresses from LAN frames,
//! router-mode announcements (RARP, gratuitous ARP), and the probes and look-ups the agent
//! asks for when a host moves between sites.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use super::{Emit, LanHost, Switch};
use crate::{Event, Mac, Mode, MAX_LAN_HOSTS, REMOTE_MAC_PREFIX};

impl<P: Copy + Eq> Switch<P> {
    /// Namespace addresses seen on the LAN (router and hybrid modes), sorted.
    pub fn lan_hosts(&self) -> Vec<Ipv4Addr> {
        let mut v: Vec<Ipv4Addr> = self.lan.keys().copied().collect();
        v.sort();
        v
    }

    /// A namespace address seen as the source of a LAN frame (router and hybrid modes).
    pub(super) fn learn(&mut self, ip: Ipv4Addr, mac: Mac, now: Instant) {
        if ip.is_unspecified()
            || ip == self.config.address
            || !self.config.subnet.contains(&ip)
            || ip == self.config.subnet.network()
            || ip == self.subnet_broadcast()
            // FE:FD is every agent's remote MAC (ours or another hybrid agent's on this
            // LAN, writing for its own host): such a frame carries a remote member's
            // address, never a LAN host's.
            || mac[..2] == REMOTE_MAC_PREFIX
            || mac[0] & 1 != 0
        {
            return;
        }
        self.probes.remove(&ip);
        self.confirmed.remove(&ip);
        if self.watched.remove(&IpAddr::V4(ip)) {
            self.events.push_back(Event::LanHostHeard {
                address: ip.into(),
                mac,
            });
        }
        if let Some(host) = self.lan.get_mut(&ip) {
            host.mac = mac;
            host.seen = now;
            host.probes = 0;
            host.last_probe = None;
            return;
        }
        if self.lan.len() >= MAX_LAN_HOSTS {
            self.counters.lan_table_full += 1;
            return;
        }
        self.lan.insert(
            ip,
            LanHost {
                mac,
                seen: now,
                probes: 0,
                last_probe: None,
            },
        );
        if self.config.mode == Mode::Router {
            self.events.push_back(Event::LanHostUp(ip));
        }
    }

    /// Router mode: a host announced itself (RARP names only the MAC; a gratuitous ARP the
    /// address too). Not from a remote MAC or a group address, and within the namespace.
    pub(super) fn announced(&mut self, address: Option<Ipv4Addr>, mac: Mac) {
        if mac[..2] == REMOTE_MAC_PREFIX || mac[0] & 1 != 0 || mac == [0; 6] {
            return;
        }
        if let Some(a) = address {
            if !self.lan.contains_key(&a) {
                // `learn` refused it (not a host address of the namespace, or table full).
                return;
            }
        }
        self.counters.announcements += 1;
        self.events.push_back(match address {
            Some(address) => Event::GratuitousArp { address, mac },
            None => Event::Rarp(mac),
        });
    }

    /// Router mode: forgets a LAN host (IPv4 or IPv6 address) at once, without
    /// [`Event::LanHostDown`] (it was handed to another site); its next frame here makes
    /// it [`Event::LanHostUp`] again.
    pub fn forget_lan_host(&mut self, address: impl Into<IpAddr>) {
        let address = address.into();
        match address {
            IpAddr::V4(a) => self.lan.remove(&a).map(drop),
            IpAddr::V6(a) => self.lan6.remove(&a).map(drop),
        };
        self.watched.remove(&address);
    }

    /// Router mode: asks the LAN who has `address` (an ARP probe; for an IPv6 address a
    /// neighbour solicitation) and reports the host's next frame, the answer or any
    /// other, as [`Event::LanHostHeard`] (a migration source checks that the host left).
    /// At most [`MAX_LAN_HOSTS`] addresses are watched.
    pub fn probe_lan_host(&mut self, address: impl Into<IpAddr>) {
        let address = address.into();
        if self.watched.len() < MAX_LAN_HOSTS || self.watched.contains(&address) {
            self.watched.insert(address);
            self.emits.push_back(match address {
                IpAddr::V4(a) => Emit::Probe(a),
                IpAddr::V6(a) => Emit::Probe6(a),
            });
        }
    }

    /// Router mode: the LAN host at `address` has `mac` (it moved here and its old
    /// router said so): delivered to at once, as if it had spoken.
    pub fn learn_lan_host(&mut self, address: impl Into<IpAddr>, mac: Mac, now: Instant) {
        match address.into() {
            IpAddr::V4(a) => self.learn(a, mac, now),
            IpAddr::V6(a) => self.learn6(a, mac, now),
        }
    }

    /// Stops reporting `address`'s next frame.
    pub fn unwatch_lan_host(&mut self, address: impl Into<IpAddr>) {
        self.watched.remove(&address.into());
    }

    /// The MAC of the LAN host at `address` (IPv4 or IPv6), if it is known here.
    pub fn lan_host_mac(&self, address: impl Into<IpAddr>) -> Option<Mac> {
        match address.into() {
            IpAddr::V4(a) => self.lan.get(&a).map(|h| h.mac),
            IpAddr::V6(a) => self.lan6.get(&a).map(|h| h.mac),
        }
    }

    /// The address of the LAN host with `mac`, if it is known here.
    pub fn lan_host_with_mac(&self, mac: Mac) -> Option<Ipv4Addr> {
        self.lan.iter().find(|(_, h)| h.mac == mac).map(|(a, _)| *a)
    }
}
