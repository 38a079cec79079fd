//! VEPA ports (router mode, [`LanPorts::Vepa`]): the LAN bridge isolates its hosts' ports,
//! so what one LAN host sends another comes to the switch, which checks its sender and
//! reflects it back to the LAN (the VEPA paper's adjacent bridge in "hairpin" mode), and
//! copies a LAN host's broadcast to the other LAN hosts but never back to it (source
//! suppression).
//!
//! The switch writes every reflected frame from the router MAC, never from the sender's:
//! the bridge learns the router MAC on the TAP's port, and each host's MAC stays on its
//! own port.
//!
//! IPv6 follows the same rules with neighbour discovery for ARP: the switch answers a
//! solicitation for another LAN host with the router MAC, defends a duplicate address
//! probe for an address another LAN host holds (the holder never hears it), and reflects
//! unicast between LAN hosts' prefix addresses. Link-local traffic between LAN hosts does
//! not pass: it has no address table to be checked against.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::Switch;
use crate::ndp::ETHERTYPE_IPV6;
use crate::wire::{EthernetFrame, Ipv4Packet, Ipv6Packet, ETHERTYPE_IPV4};
use crate::{service_address6, Action, DropReason, LanPorts, Mac, Mode, PortCounts, MAX_LAN_HOSTS};

impl<P: Copy + Eq> Switch<P> {
    /// Whether the LAN's ports are VEPA ports.
    pub(super) fn vepa(&self) -> bool {
        self.config.mode == Mode::Router && self.config.lan_ports == LanPorts::Vepa
    }

    /// VEPA: whether a LAN frame from `mac` with source address `ip` is spoofed. Only
    /// addresses of the subnet are checked (the unspecified source of a DHCP client is
    /// not, and others are never routed): the gateway's, the network's and the
    /// broadcast address are no host's; with a static table the pair must be in it;
    /// without, an address learned (or leased) with another MAC is not this host's.
    pub(super) fn spoofed(&self, ip: Ipv4Addr, mac: Mac) -> bool {
        if !self.vepa() || ip.is_unspecified() || !self.config.subnet.contains(&ip) {
            return false;
        }
        let subnet = self.config.subnet;
        if ip == self.service() || ip == subnet.network() || ip == subnet.broadcast() {
            true
        } else if !self.config.lan_table.is_empty() {
            !self.config.lan_table.contains(&(ip, mac))
        } else {
            let holder = self.lan.get(&ip).map(|h| h.mac);
            holder
                .or_else(|| self.leases.get(&IpAddr::V4(ip)).copied())
                .is_some_and(|m| m != mac)
        }
    }

    /// VEPA: whether a LAN frame from `mac` with the IPv6 source `ip` is spoofed, by the
    /// IPv4 rules ([`Switch::spoofed`]) for addresses of the prefix: its `::` and the
    /// service address `::1` are no host's; an address learned (or leased) with another
    /// MAC is not this host's. The static table (`lan_table`) names IPv4 addresses: with
    /// one, only the MACs it lists may send IPv6 at all. Link-local and unspecified
    /// sources are not checked (they never leave the switch).
    pub(super) fn spoofed6(&self, ip: Ipv6Addr, mac: Mac) -> bool {
        let Some(prefix) = self.config.prefix6.filter(|p| p.contains(&ip)) else {
            return false;
        };
        if !self.vepa() {
            return false;
        }
        if ip == prefix.network() || ip == service_address6(prefix) {
            return true;
        }
        if !self.config.lan_table.is_empty() && !self.config.lan_table.iter().any(|e| e.1 == mac) {
            return true;
        }
        self.lan_mac6(ip).is_some_and(|m| m != mac)
    }

    /// VEPA: the MAC that holds the IPv6 `ip` on the LAN: the first heard from it, or the
    /// one it was leased to.
    pub(super) fn lan_mac6(&self, ip: Ipv6Addr) -> Option<Mac> {
        let heard = self.lan6.get(&ip).map(|h| h.mac);
        heard.or_else(|| self.leases.get(&IpAddr::V6(ip)).copied())
    }

    /// VEPA: drops a frame of `mac` as spoofed (counted for its MAC).
    pub(super) fn spoof_drop<Q>(&mut self, mac: Mac) -> Action<Q> {
        if let Some(c) = self.port(mac) {
            c.spoofed += 1;
        }
        Action::Drop(DropReason::Spoofed)
    }

    /// VEPA: `frame`, an IPv4 or IPv6 frame from a LAN host for `dst` (another LAN
    /// host), leaves the switch for `dst`: its MACs are rewritten in place. Returns
    /// whether it may.
    pub(super) fn reflect(&mut self, frame: &mut [u8]) -> bool {
        let Ok(eth) = EthernetFrame::new_checked(&frame[..]) else {
            return false;
        };
        let src_mac = eth.src();
        let to = match eth.ethertype() {
            ETHERTYPE_IPV4 => Ipv4Packet::new_checked(eth.payload())
                .ok()
                .and_then(|ip| self.lan.get(&ip.dst()))
                .map(|h| h.mac),
            ETHERTYPE_IPV6 => Ipv6Packet::new_checked(eth.payload())
                .ok()
                .and_then(|ip| self.lan6.get(&ip.dst()))
                .map(|h| h.mac),
            _ => None,
        };
        let Some(to) = to else {
            return false;
        };
        self.address_copy(frame, to);
        self.counters.hairpinned += 1;
        if let Some(c) = self.port(src_mac) {
            c.hairpinned += 1;
        }
        true
    }

    /// VEPA: `frame` is a broadcast or multicast from a LAN host that went to the members
    /// ([`Action::Broadcast`] or [`Action::Fragment`] to every member): fills `macs` with
    /// the other LAN hosts' MACs, one each, not the sender's. The agent writes a copy of
    /// the frame to each, from the router MAC ([`Switch::address_copy`]). Empty for any
    /// other frame or switch.
    ///
    /// [`Action::Broadcast`]: crate::Action::Broadcast
    /// [`Action::Fragment`]: crate::Action::Fragment
    pub fn lan_copies(&mut self, frame: &[u8], macs: &mut Vec<Mac>) {
        macs.clear();
        if !self.vepa() {
            return;
        }
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            return;
        };
        let group = match eth.ethertype() {
            ETHERTYPE_IPV4 => {
                Ipv4Packet::new_checked(eth.payload()).is_ok_and(|ip| self.is_broadcast(ip.dst()))
            }
            // Link-scoped multicast never got this far (it stays at the switch).
            ETHERTYPE_IPV6 => {
                Ipv6Packet::new_checked(eth.payload()).is_ok_and(|ip| ip.dst().is_multicast())
            }
            _ => false,
        };
        if !group {
            return;
        }
        let sender = eth.src();
        // A host is in both tables (dual stack), some under several addresses.
        let hosts = self.lan.values().chain(self.lan6.values());
        macs.extend(hosts.map(|h| h.mac).filter(|m| *m != sender));
        macs.sort_unstable();
        macs.dedup();
        self.counters.lan_copies += macs.len() as u64;
    }

    /// Addresses a copy of a LAN broadcast ([`Switch::lan_copies`]), or a reflected frame,
    /// in place: to `to`, from the router MAC.
    pub fn address_copy(&self, frame: &mut [u8], to: Mac) {
        if frame.len() >= 12 {
            frame[..6].copy_from_slice(&to);
            frame[6..12].copy_from_slice(&self.config.remote_mac);
        }
    }

    /// The agent's DHCP (or DHCPv6) server acknowledged `address` to the host at `mac` on
    /// the LAN: under VEPA, no other MAC may send from it until it is released (at most
    /// [`MAX_LAN_HOSTS`] kept).
    pub fn bind_lease(&mut self, address: impl Into<IpAddr>, mac: Mac) {
        let address = address.into();
        // Each family has its own room: DHCPv6 offers cannot crowd out DHCPv4 leases.
        let same = |a: &&IpAddr| a.is_ipv4() == address.is_ipv4();
        let kept = self.leases.keys().filter(same).count();
        if kept < MAX_LAN_HOSTS || self.leases.contains_key(&address) {
            self.leases.insert(address, mac);
        }
    }

    /// The DHCP lease on `address` ended (released, declined or expired).
    pub fn unbind_lease(&mut self, address: impl Into<IpAddr>) {
        self.leases.remove(&address.into());
    }

    /// VEPA: what the switch did with each LAN host's frames, by MAC, sorted (at most
    /// [`MAX_LAN_HOSTS`] MACs are kept apart).
    pub fn lan_ports(&self) -> Vec<(Mac, PortCounts)> {
        let mut v: Vec<(Mac, PortCounts)> = self.ports.iter().map(|(m, c)| (*m, *c)).collect();
        v.sort_unstable_by_key(|(m, _)| *m);
        v
    }

    fn port(&mut self, mac: Mac) -> Option<&mut PortCounts> {
        if self.ports.len() >= MAX_LAN_HOSTS && !self.ports.contains_key(&mac) {
            return None;
        }
        Some(self.ports.entry(mac).or_default())
    }
}
