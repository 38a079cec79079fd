//! The member's own addresses in the control thread: an address won (or lost), IPv4 or
//! IPv6, goes to the device, the switch and the tunnels; a namespace's IPv6 prefix.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use anyhow::{bail, Result};
use hyphae_overlay::membership;
use hyphae_overlay::{NamespaceId, NamespaceKeys};
use ipnet::Ipv6Net;

use super::workers::lock;
use super::Control;
use crate::config::{Address6, Subnet6};

/// Namespace `cfg`'s IPv6 prefix (`None`: IPv4 only); an error if its static `address6`
/// is not a member's address of it.
pub(super) fn prefix6_of(cfg: &crate::config::Namespace) -> Result<Option<Ipv6Net>> {
    let prefix6 = match cfg.subnet6 {
        Subnet6::Derived => Some(NamespaceKeys::derive(&cfg.name, &cfg.secret).ula_prefix()),
        Subnet6::Prefix(net) => Some(net),
        Subnet6::Off => None,
    };
    if let (Some(p), Address6::Static(a)) = (prefix6, cfg.address6) {
        if !membership::usable6(p, a) {
            bail!(
                "namespace '{}': address6 {a} is not a member's address of the namespace's IPv6 prefix {p} (set `subnet6`, or use address6 = \"auto\")",
                cfg.name
            );
        }
    }
    Ok(prefix6)
}

impl Control {
    /// Gives this member's address to the device, the switch and the tunnels.
    pub(crate) fn set_address(&mut self, i: usize, address: Ipv4Addr, now: Instant) {
        let n = &self.namespaces[i];
        let (current, prefix) = {
            let dp = lock(&self.dp);
            let config = dp.lanes[i].switch.config();
            (config.address, config.subnet.prefix_len())
        };
        if current != address && n.active() {
            // The TAP (interface, router) or the host's veth (hybrid), with no lock held.
            if let Err(e) = self.host.set_address(&n.device, address, prefix) {
                tracing::error!(device = %n.device, error = %e, "cannot set the address");
            }
        }
        let addresses = n.membership.addresses();
        {
            let mut dp = lock(&self.dp);
            dp.lanes[i].switch.set_address(address);
            dp.node.set_addresses(now, NamespaceId(i), addresses);
        }
        // The device's routes went with its old address; it may be a gateway now.
        self.namespaces[i].link_routes.clear();
        self.apply_links(i);
    }

    /// Tells the tunnels which addresses this member holds in namespace `i` now.
    pub(crate) fn announce_addresses(&mut self, i: usize, now: Instant) {
        let membership = &self.namespaces[i].membership;
        let (addresses, addresses6) = (membership.addresses(), membership.addresses6());
        let mut dp = lock(&self.dp);
        dp.node.set_addresses(now, NamespaceId(i), addresses);
        dp.node.set_addresses6(now, NamespaceId(i), addresses6);
    }

    /// This member holds `address` (or, `None`, no IPv6 address) in namespace `i` now.
    pub(crate) fn set_address6(&mut self, i: usize, address: Option<Ipv6Addr>, now: Instant) {
        let n = &self.namespaces[i];
        let (current, prefix) = {
            let dp = lock(&self.dp);
            let config = dp.lanes[i].switch.config();
            (
                config.address6,
                config.prefix6.map_or(64, |p| p.prefix_len()),
            )
        };
        if current != address && n.active() {
            if let Err(e) = self.host.set_address6(&n.device, address, prefix) {
                tracing::error!(device = %n.device, error = %e, "cannot set the IPv6 address");
            }
        }
        // The own address, and (router mode) the LAN hosts'.
        let addresses6 = n.membership.addresses6();
        let mut dp = lock(&self.dp);
        dp.lanes[i].switch.set_address6(address);
        dp.node.set_addresses6(now, NamespaceId(i), addresses6);
    }
}
