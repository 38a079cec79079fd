//! The virtual DHCPv6 server of a router-mode LAN in a dual-stack namespace, as the driver
//! runs it: its addresses are the membership's claims for LAN hosts (`claim_for_dhcp6`),
//! its replies leave through the switch from the router's link-local address.

use std::net::Ipv6Addr;
use std::time::Instant;

use hyphae_dhcp_dns::dhcp6;
use hyphae_migrate::{Announce, Presence};
use hyphae_overlay::NamespaceId;

use super::workers::lock;
use super::Control;
use crate::config::Mode;

impl Control {
    /// A DHCPv6 message from a LAN host at `client` (its link-local address and MAC).
    pub(crate) fn handle_dhcp6(
        &mut self,
        i: usize,
        payload: &[u8],
        client: hyphae_vswitch::Client,
        now: Instant,
    ) {
        let std::net::IpAddr::V6(from) = client.ip else {
            return;
        };
        let n = &mut self.namespaces[i];
        let Some(prefix) = n.membership.prefix6().filter(|_| n.mode == Mode::Router) else {
            return;
        };
        if n.dhcp6.is_none() {
            let mac = lock(&self.dp).lanes[i].switch.config().remote_mac;
            let service = hyphae_vswitch::service_address6(prefix);
            n.dhcp6 = Some(dhcp6::Server::new(dhcp6::Settings {
                prefix,
                server_id: dhcp6::duid_ll(mac),
                dns: vec![service],
                domain: n.membership.name().to_string(),
                lease: n.membership.lease(),
            }));
        }
        if let Some(server) = n.dhcp6.as_mut() {
            server.handle_request(now, payload, (from, client.mac));
        }
        self.drain_dhcp6(i, now);
    }

    /// Carries out what the DHCPv6 server of namespace `i` asks: replies to the LAN, claims
    /// and releases in the DHT.
    pub(crate) fn drain_dhcp6(&mut self, i: usize, now: Instant) {
        let n = &mut self.namespaces[i];
        let mut released = false;
        let mut renewed = Vec::new();
        while let Some(output) = n.dhcp6.as_mut().and_then(dhcp6::Server::poll_output) {
            match output {
                dhcp6::Output::Reply(r) => {
                    let emitted = lock(&self.dp).lanes[i].switch.emit_dhcp6_reply(
                        &mut self.batch.reply,
                        r.to,
                        r.port,
                        &r.bytes,
                    );
                    if let Some(len) = emitted {
                        self.batch.write_reply(i, len);
                    }
                }
                dhcp6::Output::Claim {
                    address,
                    mac,
                    renewing,
                } => {
                    // Another host of the LAN uses it (a SLAAC or static address): not
                    // this client's, whoever holds the lease.
                    let seen = lock(&self.dp).lanes[i].switch.lan_host6(address);
                    if seen.is_some_and(|m| m != mac) {
                        if let Some(server) = n.dhcp6.as_mut() {
                            server.refused(address);
                        }
                    } else {
                        // VEPA: the client's from now (its claim refused, no one's).
                        lock(&self.dp).lanes[i].switch.bind_lease(address, mac);
                        if renewing && !n.membership.holds_ip(address.into()) {
                            renewed.push((address, mac));
                        } else {
                            n.membership.claim_for_dhcp6(address, now);
                        }
                    }
                }
                dhcp6::Output::Release { address, mac } => {
                    let mut dp = lock(&self.dp);
                    let switch = &mut dp.lanes[i].switch;
                    let in_use = switch.lan_host6(address).is_some_and(|m| Some(m) != mac);
                    if !in_use {
                        switch.forget_lan_host6(address);
                    }
                    switch.unbind_lease(address);
                    drop(dp);
                    released |= n.membership.release_dhcp6(address, in_use);
                }
            }
        }
        for (address, mac) in renewed {
            self.renewed_elsewhere(i, now, address, mac);
        }
        if released {
            let addresses6 = self.namespaces[i].membership.addresses6();
            lock(&self.dp)
                .node
                .set_addresses6(now, NamespaceId(i), addresses6);
        }
    }

    /// A DHCPv6 client renews `address`, which this router does not hold: it may have
    /// moved here from another router's LAN with its lease (a live migration), so that
    /// router is asked to hand the address over first, as for a host heard here from an
    /// address another member holds; the claim follows when the handoff ends
    /// ([`Control::dhcp6_after_handoff`]). Without a handoff to wait for, it is claimed now.
    fn renewed_elsewhere(&mut self, i: usize, now: Instant, address: Ipv6Addr, mac: [u8; 6]) {
        let presence = Presence {
            address: Some(address.into()),
            mac,
            announce: Announce::Packet,
        };
        self.lan_presence(i, now, presence);
        let n = &mut self.namespaces[i];
        if n.handoffs.core.in_progress(address.into()) {
            let waiting = &mut n.dhcp6_after_handoff;
            waiting.retain(|_, until| *until > now);
            waiting.insert(address, now + dhcp6::CLAIM_WAIT);
        } else {
            n.membership.claim_for_dhcp6(address, now);
        }
    }

    /// The handoff of `address` ended (taken over, refused, given up, or its holder
    /// silent): a DHCPv6 renewal waiting on it is claimed now, while its request still
    /// waits (this router holds the address if it took it over: the claim is won at once).
    pub(crate) fn dhcp6_after_handoff(&mut self, i: usize, now: Instant, address: Ipv6Addr) {
        let n = &mut self.namespaces[i];
        if n.dhcp6_after_handoff
            .remove(&address)
            .is_some_and(|until| now < until)
        {
            n.membership.claim_for_dhcp6(address, now);
        }
    }

    /// The DHT decided a DHCPv6 client's claim: the reply that waited goes out.
    pub(crate) fn dhcp6_claimed(
        &mut self,
        i: usize,
        address: std::net::Ipv6Addr,
        won: bool,
        now: Instant,
    ) {
        let Some(server) = self.namespaces[i].dhcp6.as_mut() else {
            return;
        };
        if won {
            server.allocated(address, now);
        } else {
            server.refused(address);
            lock(&self.dp).lanes[i].switch.unbind_lease(address);
        }
        self.drain_dhcp6(i, now);
    }

    /// Runs the DHCPv6 server's timers of namespace `i` when due (expired bindings).
    pub(crate) fn dhcp6_timers(&mut self, i: usize, now: Instant) {
        let Some(server) = self.namespaces[i].dhcp6.as_mut() else {
            return;
        };
        if server.poll_timeout().is_some_and(|t| t <= now) {
            server.handle_timeout(now);
            self.drain_dhcp6(i, now);
        }
    }
}
