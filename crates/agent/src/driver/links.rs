//! Consent between namespaces in the agent (docs/POLICY.md, "Between namespaces"): a
//! namespace's policy may link it to another namespace through a gateway member of both
//! (`hyphae_vswitch::policy::links`).
//!
//! - Every member of a linked namespace routes the other namespace's addresses to the
//!   gateway (its switch, and in interface mode a route on its TAP), and takes packets from
//!   them only from the gateway's tunnel (the node's anti-spoofing check).
//! - The gateway forwards a packet from one namespace to the other only while both
//!   policies link to each other through it and the addresses match both links, after
//!   checking the packet against both policies: the first as it enters, the second as it
//!   leaves (each end of the flow checks it again under its own).
//!
//! No address translation: the two namespaces' subnets must not overlap.

use std::net::Ipv4Addr;
use std::time::Instant;

use hyphae_overlay::NamespaceId;
use hyphae_vswitch::policy::flows::Verdict;
use ipnet::Ipv4Net;

use super::data::{Batch, DataPlane};
use super::workers::lock;
use crate::config::Mode;

/// The source and destination addresses of IPv4 packet `ip`.
fn addresses(ip: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr)> {
    if ip.first()? >> 4 != 4 {
        return None;
    }
    let src: [u8; 4] = ip.get(12..16)?.try_into().ok()?;
    let dst: [u8; 4] = ip.get(16..20)?.try_into().ok()?;
    Some((src.into(), dst.into()))
}

impl DataPlane {
    /// At a gateway: the lane a packet from a member of namespace `i` crosses into, if it
    /// is for another namespace this member is the gateway to and both namespaces consent
    /// (each links to the other through this member, the destination is one the first
    /// link reaches, the source one the second reaches).
    pub(crate) fn crossing(&self, i: usize, packet: &[u8]) -> Option<usize> {
        let lane = self.lanes.get(i)?;
        let links = lane.policy.current().links();
        if links.is_empty() {
            return None;
        }
        let (src, dst) = addresses(packet)?;
        let here = lane.switch.config();
        if here.in_namespace(dst) {
            return None;
        }
        let link = links
            .iter()
            .find(|l| l.gateway == here.address && l.reaches(dst))?;
        let (j, there) = self
            .lanes
            .iter()
            .enumerate()
            .find(|(_, l)| l.active && l.name == link.namespace)?;
        let back = there.policy.current().link_to(&lane.name)?;
        (back.gateway == there.switch.config().address && back.reaches(src)).then_some(j)
    }

    /// At a gateway: `packet`, which entered from namespace `i` and crosses into namespace
    /// `j` ([`DataPlane::crossing`]), goes to the member of `j` holding its destination,
    /// if `j`'s policy lets it leave.
    pub(crate) fn cross(
        &mut self,
        now: Instant,
        i: usize,
        j: usize,
        packet: &[u8],
        out: &mut Batch,
    ) {
        let Some((_, dst)) = addresses(packet) else {
            return;
        };
        let Some(lane) = self.lanes.get_mut(j) else {
            return;
        };
        let Some(peer) = lane.switch.route(dst) else {
            lane.policy.crossing_dropped += 1;
            return;
        };
        match lane
            .policy
            .outbound(now, &self.node, peer, packet, lane.switch.config())
        {
            Verdict::Pass => {
                out.seal(&mut self.node, peer, packet);
                if let Some(from) = self.lanes.get_mut(i) {
                    from.policy.crossed += 1;
                }
            }
            Verdict::Reject | Verdict::Deny | Verdict::StrayIcmpError => {}
        }
    }
}

impl super::Control {
    /// Puts namespace `i`'s links in place: its switch routes the other namespaces'
    /// addresses to their gateways, its tunnels take packets from them only from the
    /// gateways, the host's device carries a route for each (interface and hybrid modes),
    /// and the DHCP server gives them to LAN hosts as classless static routes (router
    /// mode; they take them at their next renewal). Links through this member itself (it
    /// is the gateway) route nothing: it forwards. A multi-subnet namespace's other
    /// subnets get the same device and DHCP routes, through the subnet's gateway address.
    pub(crate) fn apply_links(&mut self, i: usize) {
        let (routes, mode) = {
            let mut dp = lock(&self.dp);
            let dp = &mut *dp;
            let Some(lane) = dp.lanes.get_mut(i) else {
                return;
            };
            let config = lane.switch.config();
            let own = config.address;
            let subnets: Vec<Ipv4Net> = std::iter::once(config.subnet)
                .chain(config.routed.iter().copied())
                .collect();
            let links: Vec<(Ipv4Net, Ipv4Addr)> = lane
                .policy
                .current()
                .links()
                .iter()
                .filter(|l| l.gateway != own)
                .flat_map(|l| l.remote.iter().map(|n| (*n, l.gateway)))
                // Another namespace's addresses only: never a route over this one's.
                .filter(|(n, _)| {
                    let overlap = subnets
                        .iter()
                        .find(|s| n.contains(&s.network()) || s.contains(&n.network()));
                    if let Some(subnet) = overlap {
                        tracing::warn!(remote = %n, %subnet, "a link's remote overlaps this namespace's subnet: not routed");
                    }
                    overlap.is_none()
                })
                .collect();
            // A multi-subnet namespace's other subnets, through this subnet's gateway (the
            // service address: the switch routes them in one hop).
            let gateway = (config.subnet.prefix_len() <= 30)
                .then(|| hyphae_vswitch::service_address(config.subnet));
            let routed: Vec<(Ipv4Net, Ipv4Addr)> = gateway
                .map(|g| config.routed.iter().map(|n| (*n, g)).collect())
                .unwrap_or_default();
            lane.switch.set_links(links.clone());
            dp.node.set_links(NamespaceId(i), links.clone());
            (
                routed.into_iter().chain(links).collect::<Vec<_>>(),
                lane.mode,
            )
        };
        let n = &mut self.namespaces[i];
        if let Some(dhcp) = n.dhcp.as_mut() {
            dhcp.set_routes(routes.clone());
        }
        if mode == Mode::Router || !n.active() {
            n.link_routes = routes;
            return;
        }
        for (net, _) in n.link_routes.iter().filter(|r| !routes.contains(r)) {
            if let Err(e) = self.host.del_route(&n.device, *net) {
                tracing::debug!(device = %n.device, %net, error = %e, "cannot remove a link's route");
            }
        }
        for (net, gateway) in &routes {
            match self.host.set_route(&n.device, *net, *gateway) {
                Ok(()) => tracing::info!(namespace = %n.name, %net, %gateway, "routed"),
                Err(e) => {
                    tracing::warn!(device = %n.device, %net, error = %e, "cannot route a linked namespace or another subnet")
                }
            }
        }
        n.link_routes = routes;
    }
}
