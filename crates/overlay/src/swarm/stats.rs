//! The control plane's counters, and what `hyphae status` reads of the overlay.

use super::{NetworkId, Overlay, ProofStats, StoreStats};

/// Counters for status.
#[derive(Debug, Default, Clone, Copy)]
pub struct OverlayStats {
    /// Envelopes from replicas that failed verification (bad signature, expired, malformed).
    pub bad_envelopes: u64,
    /// Requests to replicas that failed (unreachable, timed out).
    pub request_failures: u64,
    /// Grants that reached a claim already lost, given straight back.
    pub late_grants_released: u64,
    /// Group announcements and reads sent to the replicas a recent lookup found, with no
    /// lookup of their own ([`super::GROUP_REPLICAS_REUSE`]).
    pub group_lookups_saved: u64,
    /// Claims sent without a lookup to the replica set known members make
    /// ([`super::KNOWN_MEMBERS_FOR_CLAIMS`]).
    pub claims_without_lookup: u64,
    /// Of those, claims made again after a lookup: a replica computed another set, or
    /// none granted nor named a holder.
    pub claims_looked_up_again: u64,
    /// First claims made again on the set a lookup found, unchecked, after replicas
    /// disputed the set a lookup found and the members they named were dialled.
    pub claims_unchecked_after_dispute: u64,
    /// First claims after a lookup lost because a replica named a member closer to the key
    /// than their set, which this agent did not reach: made again later, never unchecked.
    pub claims_lost_to_closer_members: u64,
    /// Claims without a lookup this agent, as a replica, answered with another replica set.
    pub claims_disputed: u64,
    /// First claims given up without asking anyone: their lookup found fewer than five
    /// members while peers of unknown membership were near (claimed again later).
    pub claims_short_given_up: u64,
    /// Inbound Kademlia record puts refused (hyphae stores nothing through them).
    pub refused_puts: u64,
    /// Reads sent to the replicas among known members with no lookup ([`super::Overlay::get_near`]).
    pub reads_without_lookup: u64,
    /// Kademlia lookups this agent finished: its own (replica sets, the group key) and each
    /// step of a bootstrap (its own id, then one random key per farther bucket).
    pub kad_lookups: u64,
    /// Kademlia requests (`FIND_NODE`, `GET_VALUE`) this agent answered for others' lookups.
    pub kad_requests_answered: u64,
    /// Connections opened through a relay (either direction).
    pub relayed_connections: u64,
    /// Connections closed because they stopped answering pings ([`super::liveness`]).
    pub silent_connections_closed: u64,
    /// Dials not made because the peer's last dial failed ([`super::liveness::Backoff`]).
    pub dials_held_off: u64,
    /// Peers taken out of the routing table when their connections fell silent
    /// ([`super::liveness::Unreachable`]), since start.
    pub unreachable_dropped: u64,
    /// Of those, the ones not connected again yet, dialled every few seconds.
    pub unreachable_waiting: u64,
    /// Relayed connections that dcutr upgraded to direct ones.
    pub hole_punches: u64,
    /// dcutr attempts that failed (the connection stays relayed).
    pub hole_punch_failures: u64,
    /// Circuits this agent relays for others, opened since start.
    pub circuits_relayed: u64,
    /// Members found by mDNS.
    pub mdns_discovered: u64,
    /// Membership proofs that showed one of our namespaces.
    pub proofs_accepted: u64,
    /// Proofs that showed none of our namespaces (strangers, members of others only).
    pub proofs_unproven: u64,
    /// Proofs refused as malformed or unasked for.
    pub proofs_refused: u64,
    /// Memberships refused or ended for their certificate, by reason (in
    /// [`crate::cert::Refusal::ALL`]'s order).
    pub certificates_refused: [u64; crate::cert::Refusal::ALL.len()],

    /// Record requests refused because the asker had not proved membership of the
    /// request's namespace, or this agent is not a member of it.
    pub requests_not_member: u64,
    /// Peers in lookup results left out of replica sets because they proved no membership.
    pub unproven_replicas_skipped: u64,
    /// Inbound connections refused by libp2p's connection limits (total, pending, per
    /// peer).
    pub connections_refused: u64,
    /// Inbound connections refused because their address had [`MAX_CONNECTIONS_PER_IP`].
    pub connections_refused_per_ip: u64,
    /// Dials of our own refused by the connection limits.
    pub dials_refused: u64,
    /// Relay reservations refused (limits, rates, [`guard`]'s membership gate).
    pub relay_reservations_refused: u64,
    /// Relay circuits refused.
    pub relay_circuits_refused: u64,
    /// Peer addresses not kept (loopback from another host, link-local, namespace
    /// subnets; see [`hygiene`]).
    pub addresses_filtered: u64,
    /// Messages from peers not proven members of the message's namespace (or too large)
    /// refused.
    pub router_messages_refused: u64,
    /// Messages to members that failed or were refused.
    pub router_messages_failed: u64,
}

impl Overlay {
    /// Counters.
    pub fn stats(&self) -> OverlayStats {
        let quorum = self.quorum.stats();
        let ProofStats {
            accepted,
            unproven,
            refused,
            certificates_refused,
        } = self.proofs.stats();
        OverlayStats {
            bad_envelopes: quorum.bad_envelopes,
            dials_held_off: self.swarm.behaviour().backoff.held_off(),
            unreachable_dropped: self.unreachable.dropped(),
            unreachable_waiting: self.unreachable.waiting() as u64,
            late_grants_released: quorum.late_grants_released,
            claims_short_given_up: quorum.short_claims_given_up,
            proofs_accepted: accepted,
            proofs_unproven: unproven,
            proofs_refused: refused,
            certificates_refused,
            ..self.stats
        }
    }

    /// The relays holding a reservation for this agent.
    pub fn relays(&self) -> Vec<NetworkId> {
        self.relays.reserved()
    }

    /// Peers connected only through relays.
    pub fn relayed_peers(&self) -> Vec<NetworkId> {
        let mut relayed: Vec<NetworkId> = self
            .connected
            .iter()
            .filter(|p| {
                self.connections
                    .values()
                    .filter(|(q, _)| q == *p)
                    .all(|(_, relayed)| *relayed)
            })
            .copied()
            .collect();
        relayed.sort();
        relayed
    }

    /// The replica store's counters.
    pub fn store_stats(&self) -> StoreStats {
        self.store.stats()
    }

    /// Records this agent keeps as a replica.
    pub fn stored_records(&self) -> usize {
        self.store.len()
    }
}
