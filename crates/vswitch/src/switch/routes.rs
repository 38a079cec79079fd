//! Routes to members: the addresses each member announced, what the DHT resolved, and the
//! host's own address and subnet they are checked against.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::Ipv4Net;

use super::Switch;

impl<P: Copy + Eq> Switch<P> {
    /// Makes `peer` the owner of exactly `addresses`: routes it had to others are removed.
    /// Addresses outside the namespace's subnets, and the host's own address, are ignored.
    pub fn set_peer_addresses(&mut self, peer: P, addresses: &[Ipv4Addr]) {
        self.routes.retain(|_, p| *p != peer);
        for &addr in addresses {
            if self.config.in_namespace(addr) && addr != self.config.address {
                self.routes.insert(addr, peer);
            }
        }
    }

    /// Forgets every route to `peer`.
    pub fn remove_peer(&mut self, peer: P) {
        self.routes.retain(|_, p| *p != peer);
        self.resolved.retain(|_, p| *p != peer);
        self.routes6.retain(|_, p| *p != peer);
        self.resolved6.retain(|_, p| *p != peer);
    }

    /// The member that owns `addr`, if known: as it announced, or else as the DHT said.
    pub fn route(&self, addr: Ipv4Addr) -> Option<P> {
        self.routes
            .get(&addr)
            .or_else(|| self.resolved.get(&addr))
            .copied()
    }

    /// Changes the host's own address (an address won after start, or moved).
    pub fn set_address(&mut self, address: Ipv4Addr) {
        self.routes.remove(&address);
        self.resolved.remove(&address);
        self.config.address = address;
    }

    /// Changes the subnet of the device or LAN (learned after start); routes outside the
    /// namespace are dropped.
    pub fn set_subnet(&mut self, subnet: Ipv4Net) {
        self.config.subnet = subnet;
        self.forget_outside();
        self.lan.retain(|a, _| subnet.contains(a));
    }

    /// Changes the namespace's other subnets, routed in one hop (learned after start);
    /// routes outside the namespace are dropped.
    pub fn set_routed(&mut self, routed: Vec<Ipv4Net>) {
        self.config.routed = routed;
        self.forget_outside();
    }

    fn forget_outside(&mut self) {
        let config = &self.config;
        self.routes.retain(|a, _| config.in_namespace(*a));
        self.resolved.retain(|a, _| config.in_namespace(*a));
    }

    /// Reaches other namespaces' addresses through gateway members: each `(remote,
    /// gateway)` sends what is for `remote` to the member holding `gateway` (an address of
    /// this namespace). Replaces the links before.
    pub fn set_links(&mut self, links: Vec<(Ipv4Net, Ipv4Addr)>) {
        self.links = links;
    }

    /// The gateway through which `addr`, outside the subnet, is reached, if a link says.
    pub fn link_gateway(&self, addr: Ipv4Addr) -> Option<Ipv4Addr> {
        self.links
            .iter()
            .find(|(net, _)| net.contains(&addr))
            .map(|(_, gateway)| *gateway)
    }

    /// Routes `addr` to `peer` because the DHT says `peer` owns it; announcements take
    /// precedence. Replaced by the next resolution of `addr`, dropped with the peer.
    pub fn add_route(&mut self, addr: Ipv4Addr, peer: P) {
        if self.config.in_namespace(addr) && addr != self.config.address {
            self.resolved.insert(addr, peer);
        }
    }

    /// `addr` moved to `peer` (its old owner said so): routed there at once, whatever was
    /// announced or resolved; `None` forgets every route to it (the next packet resolves it).
    pub fn move_route(&mut self, addr: impl Into<IpAddr>, peer: Option<P>) {
        let addr = addr.into();
        match addr {
            IpAddr::V4(a) => {
                self.routes.remove(&a);
                self.resolved.remove(&a);
            }
            IpAddr::V6(a) => {
                self.routes6.remove(&a);
                self.resolved6.remove(&a);
            }
        }
        if let Some(peer) = peer {
            self.add_route_ip(addr, peer);
        }
    }
}
