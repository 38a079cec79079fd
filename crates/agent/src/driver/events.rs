//! What the overlay and the memberships report, and what the driver does about it: DHT
//! operations started for a membership and their results routed back to it, addresses
//! configured, tunnels opened to resolved members, DHCP and DNS answered, conflicts.

use std::time::Instant;

use hyphae_dhcp_dns::dns::Missing;
use hyphae_dhcp_dns::service::Found;
use hyphae_migrate::{Announce, Presence};
use hyphae_overlay::membership::{Event, Request};
use hyphae_overlay::swarm::OverlayEvent;
use hyphae_overlay::NamespaceId;

use super::data::ToControl;
use super::services::HeldBy;
use super::workers::lock;
use super::Control;

impl Control {
    /// Takes what the workers left in the data plane's inbox and acts on it. Returns
    /// whether there was anything.
    pub(crate) fn take_inbox(&mut self, now: Instant) -> bool {
        {
            let mut dp = lock(&self.dp);
            std::mem::swap(&mut dp.inbox, &mut self.inbox);
            dp.wake_control = false;
        }
        if self.inbox.is_empty() {
            return false;
        }
        let mut inbox = std::mem::take(&mut self.inbox);
        for message in inbox.drain(..) {
            self.handle_inbox(now, message);
        }
        // The emptied vector goes back to be swapped in next time.
        self.inbox = inbox;
        true
    }

    fn handle_inbox(&mut self, now: Instant, message: ToControl) {
        match message {
            ToControl::Dhcp { ns, payload, mac } => self.handle_dhcp(ns, &payload, mac, now),
            ToControl::Dhcp6 {
                ns,
                payload,
                client,
            } => self.handle_dhcp6(ns, &payload, client, now),
            ToControl::Dns {
                ns,
                payload,
                client,
            } => {
                if let Some(n) = self.namespaces.get_mut(ns).filter(|n| n.active()) {
                    let held = HeldBy(&n.membership);
                    n.dns
                        .handle_udp_query(now, &payload, client.ip, client, &held);
                }
            }
            ToControl::Service { ns, packet, mac } => {
                if let Some(n) = self.namespaces.get_mut(ns).filter(|n| n.active()) {
                    n.dns
                        .handle_service_packet(now, &packet, mac, &HeldBy(&n.membership));
                }
            }
            ToControl::Hold { ns, target, frame } => {
                // Routed since the worker saw the frame (its resolution ended in between):
                // through the switch again rather than waiting for a lookup already done.
                if lock(&self.dp)
                    .lanes
                    .get(ns)
                    .is_some_and(|l| l.switch.route_ip(target).is_some())
                {
                    self.replays.push((ns, vec![frame]));
                } else if let Some(n) = self.namespaces.get_mut(ns).filter(|n| n.active()) {
                    if !n.membership.hold(now, target, &frame) && n.membership.unowned(now, target)
                    {
                        self.unreachable(ns, now, &[frame]);
                    }
                }
            }
            ToControl::GroupWanted { ns } => {
                if let Some(n) = self.namespaces.get_mut(ns).filter(|n| n.active()) {
                    n.membership.refresh_group_soon(now);
                }
            }
            ToControl::Lan { ns, event } => self.lan_event(ns, now, event),
            ToControl::Node(event) => self.node_event(now, event),
            ToControl::LocalMacs { ns, macs } => {
                if let Some(n) = self.namespaces.get_mut(ns).filter(|n| n.active()) {
                    n.membership.set_macs(now, &macs);
                }
            }
        }
    }

    /// What the tunnel node reported (the switches have applied their part).
    fn node_event(&mut self, now: Instant, event: hyphae_overlay::Event) {
        match event {
            hyphae_overlay::Event::PeerUnreachable {
                ns,
                addresses,
                addresses6,
                id,
                ..
            } => {
                if let Some(n) = self.namespaces.get_mut(ns.0) {
                    n.mac_checks.forget(now, id);
                    n.membership.forget(&addresses);
                    n.membership.forget(&addresses6);
                    // Gone, or only our path to it: the group says which, soon.
                    n.membership.refresh_group_soon(now);
                }
            }
            hyphae_overlay::Event::PeerAddresses { ns, addresses, .. } => {
                if let Some(n) = self.namespaces.get_mut(ns.0) {
                    let frames = n.membership.take_pending(&addresses);
                    if !frames.is_empty() {
                        self.replays.push((ns.0, frames));
                    }
                }
            }
            hyphae_overlay::Event::PeerAddresses6 { ns, addresses, .. } => {
                if let Some(n) = self.namespaces.get_mut(ns.0) {
                    let frames = n.membership.take_pending(&addresses);
                    if !frames.is_empty() {
                        self.replays.push((ns.0, frames));
                    }
                }
            }
            // The layer-2 switch took them in the data plane; each is checked against the
            // DHT here.
            hyphae_overlay::Event::PeerMacs { ns, peer, .. } => {
                let Some(n) = self.namespaces.get_mut(ns.0).filter(|n| n.active()) else {
                    return;
                };
                let mut dp = lock(&self.dp);
                // The member in that tunnel now, if it is still this namespace's.
                let Some((id, macs)) = dp.node.announced_macs(ns, peer) else {
                    return;
                };
                let changes = n.mac_checks.announced(now, id, macs);
                refuse_macs(&mut dp, now, ns, &mut self.batch, &changes);
            }
        }
    }

    /// What a router or hybrid switch learned about its LAN: hosts to claim or release,
    /// and hosts announcing themselves (a handoff may start).
    fn lan_event(&mut self, i: usize, now: Instant, event: hyphae_vswitch::Event) {
        let Some(n) = self.namespaces.get_mut(i).filter(|n| n.active()) else {
            return;
        };
        let (address, mac, announce) = match event {
            hyphae_vswitch::Event::LanHostUp(a) => {
                n.membership.add_hosted(a, now);
                return;
            }
            hyphae_vswitch::Event::LanHostDown(a) => {
                if n.membership.remove_hosted(a) {
                    self.announce_addresses(i, now);
                }
                return;
            }
            hyphae_vswitch::Event::LanHost6Up(a) => {
                n.membership.add_hosted6(a, now);
                return;
            }
            hyphae_vswitch::Event::LanHost6Down(a) => {
                if n.membership.remove_hosted6(a) {
                    self.announce_addresses(i, now);
                }
                return;
            }
            // A host announcing itself after a migration (counted in status as
            // `lan_announcements`); a new one is claimed (LanHostUp came first), and a
            // refused claim starts the handoff (migration.rs).
            hyphae_vswitch::Event::Rarp(mac) => (None, mac, Announce::Rarp),
            hyphae_vswitch::Event::GratuitousArp { address, mac } => {
                (Some(address.into()), mac, Announce::GratuitousArp)
            }
            // The same for an IPv6 address: an unsolicited neighbour advertisement, or a
            // duplicate address probe for an address another member holds (answered only
            // if the handoff is refused: `handoff_event`).
            hyphae_vswitch::Event::Announced6 { address, mac, dad } => {
                let announce = if dad {
                    Announce::DuplicateProbe
                } else {
                    Announce::NeighbourAdvertisement
                };
                (Some(address.into()), mac, announce)
            }
            // A host a handoff probes for answered: it never left.
            hyphae_vswitch::Event::LanHostHeard { address, mac } => {
                (Some(address), mac, Announce::Packet)
            }
        };
        tracing::debug!(namespace = %n.name, ?address, ?mac, ?announce, "LAN host seen");
        self.lan_presence(
            i,
            now,
            Presence {
                address,
                mac,
                announce,
            },
        );
    }

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
            OverlayEvent::MemberMessage {
                ns: tag,
                from,
                body,
            } => {
                self.member_message(now, tag, from, &body);
            }
            OverlayEvent::Revocations { ns, list } => {
                self.revocations_from_member(now, ns, &list);
            }
            OverlayEvent::Policy { ns, policy } => {
                self.policy_from_member(ns, &policy);
            }
        }
    }

    /// Carries out what namespace `i`'s membership and DNS service asked for. Returns
    /// whether there was anything.
    pub(crate) fn flush_namespace(&mut self, i: usize, now: Instant) -> bool {
        let mut any = self.flush_dns(i) | self.flush_handoffs(i, now);
        let tag = self.namespaces[i].tag;
        while let Some((token, request)) = self.namespaces[i].membership.poll_request() {
            any = true;
            #[cfg(test)]
            if let Some(intercepted) = self.intercepted.as_mut() {
                if let Some(op) = intercepted.request(tag, request) {
                    self.ops.insert(op, (i, token));
                }
                continue;
            }
            let op = match request {
                Request::Claim {
                    key,
                    envelope,
                    renewal: false,
                } => self.overlay.claim(tag, key, envelope),
                Request::Claim {
                    key,
                    envelope,
                    renewal: true,
                } => self.overlay.renew(tag, key, envelope),
                Request::Get { key } => self.overlay.get(tag, key),
                Request::GetNear { key } => self.overlay.get_near(tag, key),
                Request::Members { key } => self.overlay.members(tag, key),
                Request::Transfer { key, envelope } => self.overlay.transfer(tag, key, envelope),
                // Nothing comes back that the membership waits for.
                Request::Release { key } => {
                    self.overlay.release(tag, key);
                    continue;
                }
                Request::Announce { key, envelope } => {
                    self.overlay.announce(tag, key, envelope);
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

    /// `frames` of namespace `i`'s device or LAN waited for an address nobody holds: those
    /// routed to another subnet are answered with ICMP "host unreachable" from the gateway.
    fn unreachable(&mut self, i: usize, now: Instant, frames: &[Vec<u8>]) {
        let mut dp = lock(&self.dp);
        let Some(lane) = dp.lanes.get_mut(i) else {
            return;
        };
        for frame in frames {
            if let Some(len) = lane
                .switch
                .emit_unreachable(now, &mut self.batch.reply, frame)
            {
                self.batch.write_reply(i, len);
            }
        }
    }

    /// Acts on one event of namespace `i`'s membership.
    fn apply(&mut self, i: usize, event: Event, now: Instant) {
        let n = &mut self.namespaces[i];
        match event {
            Event::AddressWon(address) => self.set_address(i, address, now),
            Event::AddressWon6(address) => self.set_address6(i, Some(address), now),
            Event::AddressesChanged => {
                // An IPv6 address lost to another member goes from the device too.
                let owned6 = n.membership.owned6();
                self.announce_addresses(i, now);
                self.set_address6(i, owned6, now);
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
                n.dns.set_zone(&n.name, subnet);
                let mut dp = lock(&self.dp);
                dp.lanes[i].switch.set_subnet(subnet);
                // Members announced before the subnet was known: route them now.
                dp.node.repeat_addresses(NamespaceId(i), None);
            }
            Event::RoutedLearned(routed) => {
                tracing::info!(namespace = %n.name, ?routed, "routing the namespace's other subnets");
                for net in &routed {
                    self.overlay.exclude_network((*net).into());
                }
                n.dns.set_routed(routed.clone());
                {
                    let mut dp = lock(&self.dp);
                    dp.lanes[i].switch.set_routed(routed);
                    dp.node.repeat_addresses(NamespaceId(i), None);
                }
                self.apply_links(i);
            }
            Event::Dhcp6 { address, won } => self.dhcp6_claimed(i, address, won, now),
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
                let mut dp = lock(&self.dp);
                match dp.node.add_member(now, NamespaceId(i), r.member, endpoint) {
                    // The owner's signed lease is the route until its announcement
                    // arrives (a router that restarted has announced nothing yet); the
                    // frames that waited go out with either.
                    Ok(handle) => {
                        dp.lanes[i].switch.add_route_ip(r.target, handle);
                        dp.node.repeat_addresses(NamespaceId(i), Some(handle));
                        drop(dp);
                        let frames = n.membership.take_pending(&[r.target]);
                        if !frames.is_empty() {
                            self.replays.push((i, frames));
                        }
                    }
                    Err(reason) => {
                        tracing::debug!(reason = reason.as_str(), "cannot open a tunnel");
                    }
                }
            }
            Event::Group(found) => {
                // A tunnel with every member, so a broadcast reaches them all.
                let mut dp = lock(&self.dp);
                for &(member, endpoint) in &found {
                    if dp.node.member_handle(NamespaceId(i), member).is_none() {
                        let _ = dp.node.add_member(now, NamespaceId(i), member, endpoint);
                    }
                }
                // Members that stopped announcing themselves: their tunnels go unless they
                // still answer on them.
                let mut forgot = false;
                for gone in n
                    .group
                    .iter()
                    .filter(|m| !found.iter().any(|(f, _)| f == *m))
                {
                    forgot |= dp.node.forget_member(now, NamespaceId(i), *gone);
                }
                if forgot {
                    dp.drain_node(now, &mut self.batch);
                }
                n.group = found.into_iter().map(|(m, _)| m).collect();
                let lane = &mut dp.lanes[i];
                lane.group.clone_from(&n.group);
                lane.group_wanted = false;
            }
            Event::NameRead {
                host,
                address,
                address6,
            } => {
                let held = HeldBy(&n.membership);
                let found = Found::Name(address, address6);
                n.dns.handle_lookup(now, &Missing::Name(host), found, &held);
            }
            Event::HolderRead6 { address, holder } => {
                let held = HeldBy(&n.membership);
                let missing = Missing::Address6(address);
                n.dns
                    .handle_lookup(now, &missing, Found::Holder(holder), &held);
            }
            Event::HandOff { address, done } => self.handed_off(i, now, address, done),
            Event::Unowned { frames, .. } => self.unreachable(i, now, &frames),
            Event::HostedClaimed { address, outcome } => {
                self.hosted_claimed(i, now, address, outcome);
            }
            Event::Holder { address, holder } => self.holder_found(i, now, address, holder),
            Event::MacHolder { mac, holder } => {
                let changes = n.mac_checks.holder(now, mac, holder);
                let mut dp = lock(&self.dp);
                refuse_macs(&mut dp, now, NamespaceId(i), &mut self.batch, &changes);
            }
            Event::HolderRead { address, holder } => {
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

/// Tells the node what the DHT checks of namespace `ns` decided (a member's frames from a
/// refused MAC dropped, frames to that MAC sent to its holder), and the switch through the
/// node's events. Members are found by identity: the one in a tunnel now.
fn refuse_macs(
    dp: &mut super::data::DataPlane,
    now: Instant,
    ns: NamespaceId,
    out: &mut super::data::Batch,
    changes: &[super::mac_checks::Change<hyphae_overlay::PeerId>],
) {
    let mut changed = false;
    for c in changes {
        if let Some(handle) = dp.node.member_handle(ns, c.peer) {
            changed |= dp.node.refuse_mac(handle, c.mac, c.refused);
        }
    }
    if changed {
        dp.drain_node(now, out);
    }
}
