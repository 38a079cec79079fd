//! The migration handoff of router-mode LAN hosts (`hyphae_migrate`, IPOP Sec. 5 and
//! Fig. 11), driven like the other cores: what the switch sees on the LAN, the claims and
//! reads of the membership and the messages of other routers go in; messages, DHT
//! operations, ARP probes and events come out and are carried out here.
//!
//! - **Target.** A LAN host whose address another member holds (its first packet, a
//!   gratuitous ARP: both make the switch learn it, and the claim is refused), or a RARP
//!   frame naming a MAC this router does not know (the MAC is asked of every member), starts
//!   a handoff: the holder is asked, and on its answer the address, the host's DHCP lease
//!   and its names are this router's.
//! - **IPv6.** Each IPv6 address of a LAN host moves by the same handoff, on its own: its
//!   first packet, an unsolicited neighbour advertisement (what a guest sends for each
//!   address when it announces itself) or a duplicate address probe starts it, and the
//!   source probes with a neighbour solicitation. A duplicate address probe is answered
//!   (the prober gives the address up) only if the holder refuses: its host still answers
//!   at its site, or the address is the holder's own.
//! - **Source.** Asked for a host it holds, the router probes its LAN; silence means the
//!   host left: the lease moves on the replicas to the asker, the host's state goes with the
//!   answer, and every member is told ([`Message::Moved`]) so its route moves at once.
//!
//! Messages travel on the overlay's members-only channel (`/hyphae/routers/1`) as JSON;
//! member names as libp2p peer ids.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use hyphae_dhcp_dns::dhcp::ClientId;
use hyphae_migrate::{
    ClaimOutcome, Config, DhcpLease, DhtOp, Event, Holder, HostState, Lookup, Mac, Message,
    Migrate, Output, Presence, TransferOutcome,
};
use hyphae_overlay::membership::HostedClaim;
use hyphae_overlay::records::Envelope;
use hyphae_overlay::swarm::{network_id, owner_key, NetworkId};
use hyphae_overlay::{NamespaceId, PeerId};

use super::data::Grace;
use super::workers::lock;
use super::Control;

/// One namespace's handoffs and what the agent keeps beside them.
pub(crate) struct Handoffs {
    pub(crate) core: Migrate<NetworkId>,
    /// Names of hosts whose lease is being transferred (the membership unbinds them when
    /// the transfer ends, before the answer is built).
    leaving: HashMap<IpAddr, (Option<Mac>, Vec<String>)>,
}

impl Handoffs {
    pub(crate) fn new(local: &PeerId) -> Option<Self> {
        Some(Self {
            core: Migrate::new(Config::default(), network_id(local.as_bytes())?),
            leaving: HashMap::new(),
        })
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.core.poll_timeout()
    }
}

fn member(id: &NetworkId) -> Option<PeerId> {
    PeerId::from_bytes(owner_key(id)?).ok()
}

impl Control {
    /// A LAN host showed itself on namespace `i`'s LAN: a RARP frame (no address), a
    /// gratuitous ARP, or (after a probe) any frame.
    pub(crate) fn lan_presence(&mut self, i: usize, now: Instant, presence: Presence) {
        let n = &mut self.namespaces[i];
        let known = match presence.address {
            None => lock(&self.dp).lanes[i]
                .switch
                .lan_host_with_mac(presence.mac)
                .map(IpAddr::V4),
            Some(_) => None,
        };
        let presence = match presence.address {
            // A RARP frame from a host this router knows already: its address is known.
            None => match known {
                Some(address) => Presence {
                    address: Some(address),
                    ..presence
                },
                None => presence,
            },
            Some(_) => presence,
        };
        let held = presence.address.is_some_and(|a| n.membership.holds_ip(a));
        n.handoffs.core.handle_presence(now, presence, held);
    }

    /// A claim of namespace `i`'s membership for a LAN host ended: a refusal naming a
    /// holder starts a handoff (the host may have moved here from its LAN); a handoff that
    /// claimed a free or lapsed address learns the outcome.
    pub(crate) fn hosted_claimed(
        &mut self,
        i: usize,
        now: Instant,
        address: IpAddr,
        outcome: HostedClaim,
    ) {
        let n = &mut self.namespaces[i];
        let h = &mut n.handoffs.core;
        if h.in_progress(address) {
            let outcome = match outcome {
                HostedClaim::Won => ClaimOutcome::Won,
                HostedClaim::Held(holder) => match network_id(holder.as_bytes()) {
                    Some(member) => ClaimOutcome::Held(Holder {
                        member,
                        remaining: n.membership.lease(),
                    }),
                    None => ClaimOutcome::Unanswered,
                },
                HostedClaim::Unanswered => ClaimOutcome::Unanswered,
            };
            h.handle_claim(now, address, outcome);
        } else if let HostedClaim::Held(_) = outcome {
            let mac = lock(&self.dp).lanes[i]
                .switch
                .lan_host_mac(address)
                .unwrap_or_default();
            let presence = Presence {
                address: Some(address),
                mac,
                announce: hyphae_migrate::Announce::Packet,
            };
            h.handle_presence(now, presence, false);
        }
    }

    /// The holder of `address` was read for namespace `i`'s handoff.
    pub(crate) fn holder_found(
        &mut self,
        i: usize,
        now: Instant,
        address: IpAddr,
        holder: Option<(PeerId, Duration)>,
    ) {
        let n = &mut self.namespaces[i];
        let lookup = match holder {
            None => Lookup::Free,
            Some((peer, remaining)) => match network_id(peer.as_bytes()) {
                Some(member) => Lookup::Held(Holder { member, remaining }),
                None => Lookup::Unanswered,
            },
        };
        let record = n
            .membership
            .hosted_record(address, now)
            .map(|e| e.pack())
            .unwrap_or_default();
        n.handoffs.core.handle_lookup(now, address, lookup, record);
    }

    /// A lease transfer of namespace `i`'s membership ended (this router is the source).
    pub(crate) fn handed_off(&mut self, i: usize, now: Instant, address: IpAddr, done: bool) {
        let n = &mut self.namespaces[i];
        let (mac, names) = n.handoffs.leaving.remove(&address).unwrap_or_default();
        let mut state = HostState {
            mac,
            dhcp: None,
            names,
        };
        let outcome = if done {
            // VEPA: the address is another router's host's now, whatever MAC it leased.
            lock(&self.dp).lanes[i].switch.unbind_lease(address);
            let v4 = match address {
                IpAddr::V4(a) => Some(a),
                IpAddr::V6(a) => {
                    // Its DHCPv6 binding does not move (docs/MODES.md): dropped here, with
                    // no release of an address that is the new router's now.
                    if let Some(d) = n.dhcp6.as_mut() {
                        d.hand_over(a);
                    }
                    None
                }
            };
            state.dhcp = n
                .dhcp
                .as_mut()
                .zip(v4)
                .and_then(|(d, a)| d.hand_over(a, now))
                .map(|(client, remaining)| DhcpLease {
                    client: client.0,
                    remaining,
                });
            TransferOutcome::Done
        } else {
            TransferOutcome::Unanswered
        };
        n.handoffs
            .core
            .handle_transfer(now, address, outcome, state);
    }

    /// A message from the member `from` in namespace `tag` (proven by the overlay).
    pub(crate) fn member_message(
        &mut self,
        now: Instant,
        tag: [u8; hyphae_overlay::TAG_LEN],
        from: NetworkId,
        body: &[u8],
    ) {
        let Some(i) = self
            .namespaces
            .iter()
            .position(|n| n.tag == tag && n.active())
        else {
            return;
        };
        let message = serde_json::from_slice::<Message<String>>(body)
            .map_err(|e| e.to_string())
            .and_then(|m| {
                m.map_members(|p| p.parse::<NetworkId>().ok())
                    .ok_or_else(|| "it names no member".to_string())
            });
        let message = match message {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(%from, error = %e, "a member's message does not parse; dropped");
                return;
            }
        };
        let n = &mut self.namespaces[i];
        match message {
            Message::Moved { address, to } => self.moved(i, from, address, to),
            Message::WhoHas { mac } => {
                let address = lock(&self.dp).lanes[i].switch.lan_host_with_mac(mac);
                let found = address.filter(|a| n.membership.holds(*a));
                n.handoffs
                    .core
                    .handle_who_has(from, mac, found.map(IpAddr::V4));
            }
            Message::Request { address, .. } => {
                let held = n.membership.holds_ip(address);
                let stays = n.membership.stays(address);
                n.handoffs.core.handle_message(now, from, message, held);
                if stays {
                    // This member's own address, never a LAN host's to hand over, or a
                    // DHCPv6 lease of a quiet host (it may be suspended): its host is
                    // here (the asker's LAN host is a duplicate).
                    let presence = Presence {
                        address: Some(address),
                        mac: [0; 6],
                        announce: hyphae_migrate::Announce::Packet,
                    };
                    n.handoffs.core.handle_presence(now, presence, true);
                }
            }
            Message::Reply { address, .. } => {
                let held = n.membership.holds_ip(address);
                n.handoffs.core.handle_message(now, from, message, held);
            }
            Message::IsAt { .. } => n.handoffs.core.handle_message(now, from, message, false),
        }
    }

    /// The old holder of `address` says it is at `to` now: the route moves at once, if
    /// the old holder is where it points (no third member redirects traffic this way).
    fn moved(&mut self, i: usize, from: NetworkId, address: IpAddr, to: NetworkId) {
        let id = NamespaceId(i);
        let (Some(from), Some(to)) = (member(&from), member(&to)) else {
            return;
        };
        let mut dp = lock(&self.dp);
        let Some(old) = dp.node.member_handle(id, from) else {
            return;
        };
        let n = &mut self.namespaces[i];
        if !hyphae_migrate::accept_moved(&old, dp.lanes[i].switch.route_ip(address).as_ref()) {
            return;
        }
        let new = dp.node.member_handle(id, to);
        dp.lanes[i].switch.move_route(address, new);
        drop(dp);
        tracing::info!(namespace = %n.name, %address, "a LAN host moved to another router; its route moves");
        if new.is_none() {
            // No tunnel to the new holder yet: the next packet looks it up.
            n.membership.forget(&[address]);
        }
    }

    fn send_wire(&mut self, i: usize, to: NetworkId, wire: &Message<String>) {
        let body = match serde_json::to_vec(wire) {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(error = %e, "cannot encode a message to a member");
                return;
            }
        };
        #[cfg(test)]
        if let Some(intercepted) = self.intercepted.as_mut() {
            intercepted
                .messages
                .push((self.namespaces[i].tag, to, body));
            return;
        }
        if !self
            .overlay
            .send_to_member(self.namespaces[i].tag, to, body)
        {
            tracing::warn!(%to, "a handoff message is too large to send");
        }
    }

    /// Timers of namespace `i`'s handoffs.
    pub(crate) fn handoffs_timeout(&mut self, i: usize, now: Instant) {
        self.namespaces[i].handoffs.core.handle_timeout(now);
    }

    /// Carries out what namespace `i`'s handoffs asked for. Returns whether there was
    /// anything.
    pub(crate) fn flush_handoffs(&mut self, i: usize, now: Instant) -> bool {
        let mut any = false;
        while let Some(output) = self.namespaces[i].handoffs.core.poll_output() {
            any = true;
            match output {
                Output::Send { to, message } => {
                    if let Some(m) = message.map_members(|p| Some(p.to_base58())) {
                        self.send_wire(i, to, &m);
                    }
                }
                Output::Push(message) => self.push(i, message),
                Output::Dht(op) => self.handoff_dht(i, now, op),
                // Answered at once (`member_message`).
                Output::Probe(address) if self.namespaces[i].membership.stays(address) => {}
                Output::Probe(address) => {
                    let mut dp = lock(&self.dp);
                    dp.lanes[i].switch.probe_lan_host(address);
                    dp.flush_switch(i, &mut self.batch);
                }
                Output::Event(event) => self.handoff_event(i, now, event),
            }
        }
        any
    }

    /// Sends `message` to every member of namespace `i`'s group.
    fn push(&mut self, i: usize, message: Message<NetworkId>) {
        let Some(message) = message.map_members(|p| Some(p.to_base58())) else {
            return;
        };
        let to = match &message {
            Message::Moved { to, .. } => to.parse::<NetworkId>().ok().as_ref().and_then(member),
            _ => None,
        };
        let wire = message;
        let me = self.identity.peer_id();
        for id in self.namespaces[i].group.clone() {
            // The new holder knows.
            if id == me || Some(id) == to {
                continue;
            }
            if let Some(to) = network_id(id.as_bytes()) {
                self.send_wire(i, to, &wire);
            }
        }
    }

    fn handoff_dht(&mut self, i: usize, now: Instant, op: DhtOp<NetworkId>) {
        let n = &mut self.namespaces[i];
        match op {
            DhtOp::Lookup(address) => n.membership.look_up_holder(address),
            DhtOp::Claim(address) => n.membership.claim_hosted_now(address, now),
            DhtOp::Transfer {
                address,
                to,
                record,
            } => {
                // Only the asker's own record: the lease moves to whoever signed it.
                let envelope = Envelope::unpack(&record)
                    .filter(|e| e.owner().and_then(|o| network_id(&o)) == Some(to));
                let names = match address {
                    IpAddr::V4(a) => n.membership.name_for(a).map(str::to_string),
                    // An IPv6 address's names follow its IPv4 one's (`own_names`).
                    IpAddr::V6(_) => None,
                };
                let mac = lock(&self.dp).lanes[i].switch.lan_host_mac(address);
                let started = envelope.is_some_and(|e| n.membership.hand_off_hosted(address, e));
                if started {
                    n.handoffs
                        .leaving
                        .insert(address, (mac, names.into_iter().collect()));
                } else {
                    n.handoffs.core.handle_transfer(
                        now,
                        address,
                        TransferOutcome::NotHolder,
                        HostState::default(),
                    );
                }
            }
        }
    }

    /// A duplicate address probe for the IPv6 `address` waiting on namespace `i`'s LAN is
    /// answered (the prober gives the address up): the handoff did not bring it here. The
    /// address is then no LAN host's here, and not claimed again.
    fn defend(&mut self, i: usize, now: Instant, address: IpAddr) {
        let IpAddr::V6(a) = address else {
            return;
        };
        let mut dp = lock(&self.dp);
        if dp.lanes[i].switch.defend6(a, now) {
            dp.flush_switch(i, &mut self.batch);
            drop(dp);
            self.namespaces[i].membership.remove_hosted6(a);
        }
    }

    fn handoff_event(&mut self, i: usize, now: Instant, event: Event<NetworkId>) {
        // A DHCPv6 renewal may wait for this handoff's end.
        let ended = match &event {
            Event::TookOver { address, .. }
            | Event::Refused { address, .. }
            | Event::SourceSilent { address, .. } => Some(*address),
            Event::GaveUp { address, .. } => *address,
            Event::HandedOff { .. } | Event::Kept { .. } => None,
        };
        self.handoff_event_inner(i, now, event);
        if let Some(IpAddr::V6(a)) = ended {
            self.dhcp6_after_handoff(i, now, a);
        }
    }

    fn handoff_event_inner(&mut self, i: usize, now: Instant, event: Event<NetworkId>) {
        let n = &mut self.namespaces[i];
        match event {
            Event::TookOver {
                address,
                from,
                state,
                took,
            } => {
                tracing::info!(namespace = %n.name, %address, from = ?from,
                    took_ms = took.as_millis() as u64, dhcp_lease = state.dhcp.is_some(),
                    names = ?state.names, "LAN host moved here; its address taken over");
                n.membership.adopt_hosted(address, now);
                let mut dp = lock(&self.dp);
                let lane = &mut dp.lanes[i];
                // On this LAN now: no route to a member (ours pointed at the old holder),
                // and nothing forwarded away from here any more.
                lane.switch.move_route(address, None);
                lane.grace.retain(|g| g.address != address);
                if let IpAddr::V6(a) = address {
                    // Its duplicate address probe, if it sent one, is not answered.
                    lane.switch.settle6(a);
                }
                if let Some(mac) = state.mac {
                    // Routed to the LAN at once, before the host speaks (a RARP names no
                    // address).
                    lane.switch.learn_lan_host(address, mac, now);
                }
                // What still reaches the old holder it sends on here for a while.
                if let Some(old) = from.as_ref().and_then(member) {
                    let until = now + hyphae_migrate::GRACE;
                    dp.node
                        .accept_forwarded(NamespaceId(i), old, address, until);
                }
                dp.flush_switch(i, &mut self.batch);
                drop(dp);
                let IpAddr::V4(address) = address else {
                    return;
                };
                if let Some(lease) = state.dhcp {
                    if let Some(d) = n.dhcp.as_mut() {
                        d.take_over(
                            ClientId(lease.client.clone()),
                            address,
                            lease.remaining,
                            now,
                        );
                    }
                    n.membership.adopt_dhcp_client(address, lease.client);
                }
                for name in state.names {
                    n.membership.name_client(now, address, name);
                }
            }
            Event::HandedOff { address, to, took } => {
                tracing::info!(namespace = %n.name, %address, %to,
                    took_ms = took.as_millis() as u64, "LAN host moved away; its address handed off");
                let mut dp = lock(&self.dp);
                let handle = member(&to).and_then(|m| dp.node.member_handle(NamespaceId(i), m));
                let lane = &mut dp.lanes[i];
                lane.switch.forget_lan_host(address);
                lane.switch.move_route(address, handle);
                // Packets still arriving for the host go on to its new router for the
                // grace period (`Migrate::forward_to`, mirrored where the packets are).
                lane.grace.retain(|g| g.address != address);
                if let Some(to) = handle {
                    lane.grace.push(Grace {
                        address,
                        to,
                        until: now + hyphae_migrate::GRACE,
                    });
                }
            }
            Event::Kept { address, asker } => {
                lock(&self.dp).lanes[i].switch.unwatch_lan_host(address);
                tracing::info!(namespace = %n.name, %address, %asker,
                    "asked to hand over a LAN host that still answers here; kept");
            }
            Event::Refused { address, holder } => {
                n.membership.hosted_conflict();
                self.defend(i, now, address);
                let n = &mut self.namespaces[i];
                tracing::error!(namespace = %n.name, %address, %holder,
                    "a LAN host uses an address another member owns, and that member's host still answers: an address conflict; it is not reachable through the overlay");
            }
            Event::SourceSilent {
                address,
                holder,
                claim_at,
            } => {
                let wait_s = claim_at.saturating_duration_since(now).as_secs();
                tracing::warn!(namespace = %n.name, %address, %holder, wait_s,
                    "the LAN host's old router does not answer; its address is claimed when its lease lapses");
            }
            Event::GaveUp { address, reason } => {
                if let Some(a) = address {
                    n.membership.hosted_conflict();
                    self.defend(i, now, a);
                }
                let n = &mut self.namespaces[i];
                tracing::warn!(namespace = %n.name, address = ?address, reason, "LAN host handoff given up");
            }
        }
    }
}
