//! What the overlay and the memberships report, and what the driver does about it: DHT
//! operations started for a membership and their results routed back to it, addresses
//! configured, tunnels opened to resolved members, DHCP and DNS answered, conflicts.

use std::time::Instant;

use hyphae_dhcp_dns::dns::Missing;
use hyphae_dhcp_dns::service::Found;
use hyphae_overlay::membership::{Event, Request};
use hyphae_overlay::swarm::OverlayEvent;
use hyphae_overlay::NamespaceId;

use crate::driver::Agent;
use crate::services::HeldBy;

impl Agent {
    pub(crate) fn handle_overlay(&mut self, now: Instant, event: OverlayEvent) {
        match event {
            OverlayEvent::Joined => {
                for n in &mut self.namespaces {
                    n.membership.start(now);
                }
            }
            OverlayEvent::Claimed { op, result, .. } => {
                if let Some((i, token)) = self.ops.remove(&op) {
                    self.namespaces[i]
                        .membership
                        .handle_claimed(now, token, &result);
                }
            }
            OverlayEvent::Got { op, envelopes, .. } => {
                if let Some((i, token)) = self.ops.remove(&op) {
                    self.namespaces[i]
                        .membership
                        .handle_got(now, token, &envelopes);
                }
            }
            OverlayEvent::Members { op, envelopes, .. } => {
                if let Some((i, token)) = self.ops.remove(&op) {
                    self.namespaces[i]
                        .membership
                        .handle_members(now, token, &envelopes);
                }
            }
            OverlayEvent::NewPeer => {
                for n in &mut self.namespaces {
                    n.membership.renew_soon(now);
                }
            }
            OverlayEvent::Listening { .. } | OverlayEvent::NotListening { .. } => {
                // Listening on all addresses: the records carry every one of them, and are
                // renewed when they change (the host was renumbered, or moved).
                let endpoints = self.endpoints();
                for n in &mut self.namespaces {
                    n.membership.set_endpoints(now, endpoints.clone());
                }
            }
            OverlayEvent::Released { .. } | OverlayEvent::Announced { .. } => {}
            OverlayEvent::MemberMessage { ns, from, body } => {
                self.member_message(now, ns, from, &body);
            }
        }
    }

    /// Carries out what namespace `i`'s membership and DNS service asked for. Returns
    /// whether there was anything.
    pub(crate) fn flush_namespace(&mut self, i: usize, now: Instant) -> bool {
        let mut any = self.flush_dns(i) | self.flush_handoffs(i, now);
        let ns = self.namespaces[i].tag;
        while let Some((token, request)) = self.namespaces[i].membership.poll_request() {
            any = true;
            let op = match request {
                Request::Claim {
                    key,
                    envelope,
                    renewal: false,
                } => self.overlay.claim(ns, key, envelope),
                Request::Claim {
                    key,
                    envelope,
                    renewal: true,
                } => self.overlay.renew(ns, key, envelope),
                Request::Get { key } => self.overlay.get(ns, key),
                Request::Members { key } => self.overlay.members(ns, key),
                Request::Transfer { key, envelope } => self.overlay.transfer(ns, key, envelope),
                // Nothing comes back that the membership waits for.
                Request::Release { key } => {
                    self.overlay.release(ns, key);
                    continue;
                }
                Request::Announce { key, envelope } => {
                    self.overlay.announce(ns, key, envelope);
                    continue;
                }
            };
            self.ops.insert(op, (i, token));
        }
        while let Some(event) = self.namespaces[i].membership.poll_event() {
            any = true;
            self.apply(i, event, now);
        }
        any
    }

    /// Acts on one event of namespace `i`'s membership.
    fn apply(&mut self, i: usize, event: Event, now: Instant) {
        let n = &mut self.namespaces[i];
        match event {
            Event::AddressWon(address) => self.set_address(i, address, now),
            Event::AddressesChanged => {
                let addresses = n.membership.addresses();
                self.node.set_addresses(now, NamespaceId(i), addresses);
            }
            Event::Persist(address) => {
                let path = crate::setup::state_file(&self.state_dir, &n.name);
                if let Err(e) = std::fs::write(&path, format!("{address}\n")) {
                    tracing::debug!(path = %path.display(), error = %e, "cannot remember the address");
                }
            }
            Event::Conflict(reason) => self.conflict(i, reason, now),
            Event::SubnetLearned(subnet) => {
                self.overlay.exclude_network(subnet.into());
                n.switch.set_subnet(subnet);
                n.dns.set_zone(&n.name, subnet);
                // Members announced before the subnet was known: route them now.
                self.node.repeat_addresses(NamespaceId(i), None);
            }
            Event::Dhcp { client, address } => {
                self.dhcp_claimed(i, hyphae_dhcp_dns::dhcp::ClientId(client), address, now);
            }
            Event::Name { name, result } => self.name_claimed(now, i, &name, result),
            Event::Resolved(r) => {
                let Some(&endpoint) = r.endpoints.first() else {
                    return;
                };
                tracing::debug!(namespace = %n.name, target = %r.target,
                    member = ?r.member, %endpoint, "resolved");
                match self
                    .node
                    .add_member(now, NamespaceId(i), r.member, endpoint)
                {
                    // The owner's signed lease is the route until its announcement
                    // arrives (a router that restarted has announced nothing yet); the
                    // frames that waited go out with either.
                    Ok(handle) => {
                        n.switch.add_route(r.target, handle);
                        let frames = n.membership.take_pending(&[r.target]);
                        if !frames.is_empty() {
                            self.replays.push((i, frames));
                        }
                        self.node.repeat_addresses(NamespaceId(i), Some(handle));
                    }
                    Err(reason) => {
                        tracing::debug!(reason = reason.as_str(), "cannot open a tunnel");
                    }
                }
            }
            Event::Group(found) => {
                // A tunnel with every member, so a broadcast reaches them all.
                for &(member, endpoint) in &found {
                    if self.node.member_handle(NamespaceId(i), member).is_none() {
                        let _ = self.node.add_member(now, NamespaceId(i), member, endpoint);
                    }
                }
                n.group = found.into_iter().map(|(m, _)| m).collect();
            }
            Event::NameRead { host, address } => {
                let held = HeldBy(&n.membership);
                n.dns
                    .handle_lookup(now, &Missing::Name(host), Found::Name(address), &held);
            }
            Event::HandOff { address, done } => self.handed_off(i, now, address, done),
            Event::HostedClaimed { address, outcome } => {
                self.hosted_claimed(i, now, address, outcome);
            }
            Event::Holder { address, holder } => self.holder_found(i, now, address, holder),
            Event::HolderRead { address, holder } => {
                if let Some((name, _)) = n.member_names.get_mut(&address) {
                    // Only a name a member may hold is shown, as the DNS answers it.
                    *name = holder
                        .clone()
                        .flatten()
                        .and_then(|h| hyphae_dhcp_dns::dns::host_name(&h).ok());
                }
                let held = HeldBy(&n.membership);
                n.dns.handle_lookup(
                    now,
                    &Missing::Address(address),
                    Found::Holder(holder),
                    &held,
                );
            }
        }
    }
}
