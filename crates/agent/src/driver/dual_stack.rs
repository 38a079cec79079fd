//! A dual-stack namespace's IPv6 side in the control thread: the own IPv6 address won (or
//! lost) goes to the device, the switch and the tunnels.

use std::net::Ipv6Addr;
use std::time::Instant;

use hyphae_overlay::NamespaceId;

use super::workers::lock;
use super::Control;

impl Control {
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
        let mut dp = lock(&self.dp);
        dp.lanes[i].switch.set_address6(address);
        dp.node
            .set_addresses6(now, NamespaceId(i), address.into_iter().collect());
    }
}
