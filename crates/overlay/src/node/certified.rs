//! Tunnels in namespaces with an authority ([`crate::cert`]): a member's address
//! announcement carries its certificate, and a tunnel carries nothing until the
//! certificate checks out for the identity the tunnel's handshake proved.
//!
//! - The WireGuard handshake proves the member's static key, which is its identity; the
//!   certificate must be for that identity, for this namespace, from its authority, valid
//!   now and not revoked ([`Trust::check`]).
//! - Until then the member has no addresses: every packet it sends fails the anti-spoofing
//!   check, and the switch sends it nothing.
//! - A refused certificate closes the tunnel (a stranger that holds the secret can open
//!   one again and be refused again: it never carries a packet).
//! - A member whose certificate expires, or that a newer revocation list revokes, is cut
//!   off at the next tick: its tunnel closes and the switch forgets its addresses.
//! - Addresses a certificate does not allow (it pins others) are left out of the
//!   member's announcement, counted.

use std::time::Instant;

use super::{Event, NamespaceId, Node, PeerHandle};
use crate::cert::{Refusal, Trust};
use crate::proof::Credential;
use crate::wire::Announce;

/// Certificate checks of tunnels, counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CertificateStats {
    /// Tunnels refused or closed for their certificate, by reason (in
    /// [`Refusal::ALL`]'s order).
    pub refused: [u64; Refusal::ALL.len()],
    /// Announced addresses left out because the member's certificate pins others.
    pub address_not_allowed: u64,
}

impl CertificateStats {
    /// Tunnels refused or closed for `reason`.
    pub fn refused_for(&self, reason: Refusal) -> u64 {
        Refusal::ALL
            .iter()
            .position(|r| *r == reason)
            .map_or(0, |i| self.refused[i])
    }

    fn count(&mut self, reason: Refusal) {
        if let Some(i) = Refusal::ALL.iter().position(|r| *r == reason) {
            self.refused[i] += 1;
        }
    }
}

impl Node {
    /// The time of day, Unix seconds, that certificates are checked against (the caller
    /// sets it each turn: the node reads no clock).
    pub fn set_wall(&mut self, unix: u64) {
        self.wall = unix;
    }

    /// Gives namespace `ns` an authority: from now on its members must show a certificate
    /// (this member shows `credential.certificate`), and tunnels without one carry nothing.
    pub fn set_credential(&mut self, ns: NamespaceId, credential: Option<Credential>) {
        if let Some(n) = self.namespaces.get_mut(ns.0) {
            n.credential = credential;
        }
    }

    /// The trust of namespace `ns`, if it has an authority.
    pub fn trust(&self, ns: NamespaceId) -> Option<&Trust> {
        self.namespaces
            .get(ns.0)?
            .credential
            .as_ref()
            .map(|c| &c.trust)
    }

    /// Takes a newer revocation list for namespace `ns` and cuts off the members it
    /// revokes at once. Returns the list's version.
    pub fn update_revocations(
        &mut self,
        now: Instant,
        ns: NamespaceId,
        list: &[u8],
    ) -> Result<u64, Refusal> {
        let credential = self
            .namespaces
            .get_mut(ns.0)
            .and_then(|n| n.credential.as_mut())
            .ok_or(Refusal::WrongAuthority)?;
        let version = credential.trust.update(list)?.version();
        self.recheck_certificates(now);
        Ok(version)
    }

    /// This member's new certificate in namespace `ns` (a renewal): every member with a
    /// session hears it in an announcement at once; no tunnel is dropped.
    pub fn renew_certificate(&mut self, now: Instant, ns: NamespaceId, certificate: Vec<u8>) {
        let Some(credential) = self
            .namespaces
            .get_mut(ns.0)
            .and_then(|n| n.credential.as_mut())
        else {
            return;
        };
        credential.certificate = certificate;
        for handle in self.handles_in(ns) {
            if self.peer(handle).is_some_and(|p| p.has_session()) {
                self.announce(now, handle);
            }
        }
    }

    /// The certificate the member of tunnel `handle` showed, once it checked out
    /// (namespaces with an authority).
    pub fn peer_certificate(&self, handle: PeerHandle) -> Option<&crate::cert::Certificate> {
        self.peer(handle)?.certificate.as_ref()
    }

    /// Certificate checks, counted.
    pub fn certificate_stats(&self) -> CertificateStats {
        self.certificate_stats
    }

    /// The certificate this member shows in namespace `ns` (empty without an authority).
    pub(super) fn own_certificate(&self, ns: NamespaceId) -> Vec<u8> {
        self.namespaces
            .get(ns.0)
            .and_then(|n| n.credential.as_ref())
            .map(|c| c.certificate.clone())
            .unwrap_or_default()
    }

    /// What an announcement of `handle` may change, in a namespace with an authority: its
    /// addresses, if its certificate checks out (those it allows). `None` when it is
    /// refused: the tunnel is closed.
    pub(super) fn certified_addresses(
        &mut self,
        handle: PeerHandle,
        announce: &Announce,
    ) -> Option<Vec<std::net::Ipv4Addr>> {
        let peer = self.peer(handle)?;
        let Some(credential) = self
            .namespaces
            .get(peer.ns.0)
            .and_then(|n| n.credential.as_ref())
        else {
            return Some(announce.addresses.clone());
        };
        let checked = if announce.certificate.is_empty() {
            // No certificate at all: the secret alone admits no one here.
            Err(Refusal::Missing)
        } else {
            credential
                .trust
                .check(&announce.certificate, &peer.id, self.wall)
        };
        match checked {
            Ok(cert) => {
                let allowed: Vec<_> = announce
                    .addresses
                    .iter()
                    .copied()
                    .filter(|a| cert.allows_address((*a).into()))
                    .collect();
                let refused = announce.addresses.len() - allowed.len();
                if refused > 0 {
                    tracing::warn!(peer = ?peer.id, addresses = ?announce.addresses, "member announced addresses its certificate does not allow");
                    self.certificate_stats.address_not_allowed += refused as u64;
                }
                if let Some(peer) = self.peer_mut(handle) {
                    peer.certificate = Some(cert);
                }
                Some(allowed)
            }
            Err(reason) => {
                tracing::info!(peer = ?peer.id, %reason, "member certificate refused: tunnel closed");
                self.certificate_stats.count(reason);
                self.cut_off(handle);
                None
            }
        }
    }

    /// Closes the tunnels of members whose certificates expired or were revoked.
    pub(super) fn recheck_certificates(&mut self, _now: Instant) {
        let mut refused = Vec::new();
        for handle in self.handles().collect::<Vec<_>>() {
            let Some(peer) = self.peer(handle) else {
                continue;
            };
            let Some(credential) = self
                .namespaces
                .get(peer.ns.0)
                .and_then(|n| n.credential.as_ref())
            else {
                continue;
            };
            let result = match &peer.certificate {
                Some(cert) => credential.trust.check_current(cert, self.wall),
                // Not shown yet: only a revoked identity is cut off before it shows one.
                None if credential.trust.is_revoked(&peer.id) => Err(Refusal::Revoked),
                None => Ok(()),
            };
            if let Err(reason) = result {
                refused.push((handle, reason));
            }
        }
        for (handle, reason) in refused {
            if let Some(peer) = self.peer(handle) {
                tracing::info!(peer = ?peer.id, %reason, "member certificate no longer valid: tunnel closed");
            }
            self.certificate_stats.count(reason);
            self.cut_off(handle);
        }
    }

    /// Removes a tunnel whose member is not (or no longer) admitted; the switch hears it
    /// as unreachable and forgets its addresses.
    fn cut_off(&mut self, handle: PeerHandle) {
        if let Some(peer) = self.remove_peer(handle) {
            self.events.push_back(Event::PeerUnreachable {
                ns: peer.ns,
                peer: handle,
                id: peer.id,
                addresses: peer.addresses,
                addresses6: peer.addresses6,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::Duration;

    use super::*;
    use crate::cert::{AuthorityKey, CertificateRequest};
    use crate::node::{test_epoch, Received};
    use crate::Identity;

    const WALL: u64 = 1_800_000_000;
    const DAY: u64 = 86_400;

    fn ca() -> AuthorityKey {
        AuthorityKey::from_seed([40; 32])
    }

    fn certificate(ca: &AuthorityKey, seed: u8, end: u64, pinned: Option<Ipv4Addr>) -> Vec<u8> {
        ca.sign(&CertificateRequest {
            namespace: "lab".into(),
            identity: Identity::from_seed([seed; 32]).peer_id(),
            name: format!("m{seed}"),
            groups: Vec::new(),
            addresses: pinned.into_iter().map(Into::into).collect(),
            not_before: WALL - DAY,
            not_after: end,
        })
        .unwrap()
    }

    /// A member at 10.201.0.SEED of "lab" under `ca()`, showing `certificate` (none: it
    /// holds the secret only).
    fn node(seed: u8, certificate: Option<Vec<u8>>) -> (Node, NamespaceId) {
        let mut node = crate::node::testing::member(seed);
        let ns = NamespaceId(0);
        node.set_credential(
            ns,
            certificate.map(|certificate| Credential {
                trust: Trust::new("lab", ca().authority()),
                certificate,
            }),
        );
        node.set_wall(WALL);
        (node, ns)
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// Moves datagrams between `a` (port 1) and `b` (port 2) until both are quiet.
    fn pump(a: &mut Node, b: &mut Node, now: Instant) {
        crate::node::testing::pump(a, addr(1), b, addr(2), now);
    }

    /// `a` (10.201.0.1) contacts `b` (10.201.0.2); returns `a`'s handle of `b` and `b`'s
    /// of `a`, if each has a tunnel.
    fn connect(
        a: &mut Node,
        b: &mut Node,
        now: Instant,
    ) -> (Option<PeerHandle>, Option<PeerHandle>) {
        a.add_static_peer(NamespaceId(0), addr(2), now);
        a.handle_timeout(now);
        pump(a, b, now);
        (
            a.peers().next().map(|p| p.handle),
            b.peers().next().map(|p| p.handle),
        )
    }

    /// A UDP packet from 10.201.0.`src` to 10.201.0.`dst`.
    fn packet(src: u8, dst: u8) -> [u8; 28] {
        let mut p = [0u8; 28];
        p[..12].copy_from_slice(&[0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0]);
        p[12..16].copy_from_slice(&[10, 201, 0, src]);
        p[16..20].copy_from_slice(&[10, 201, 0, dst]);
        p
    }

    /// `from` sends a packet to its first tunnel; whether `to` delivered it.
    fn carries(from: &mut Node, src: u8, to: &mut Node, dst: u8, now: Instant) -> bool {
        let Some(handle) = from.peers().next().map(|p| p.handle) else {
            return false;
        };
        let mut buf = vec![0u8; 2048];
        let Some(t) = from.send(handle, &packet(src, dst), &mut buf) else {
            return false;
        };
        let mut out = vec![0u8; 2048];
        matches!(
            to.handle_datagram(now, addr(1), &buf[t.range], &mut out),
            Received::Deliver { .. }
        )
    }

    #[test]
    fn certified_members_learn_each_others_addresses_and_carry_packets() {
        let now = test_epoch();
        let ca = ca();
        let (mut a, _) = node(1, Some(certificate(&ca, 1, WALL + DAY, None)));
        let (mut b, _) = node(2, Some(certificate(&ca, 2, WALL + DAY, None)));
        connect(&mut a, &mut b, now);
        assert_eq!(
            a.peers().next().unwrap().addresses,
            [Ipv4Addr::new(10, 201, 0, 2)]
        );
        assert_eq!(
            b.peers().next().unwrap().addresses,
            [Ipv4Addr::new(10, 201, 0, 1)]
        );
        assert!(carries(&mut a, 1, &mut b, 2, now));
        assert_eq!(b.certificate_stats(), CertificateStats::default());
    }

    #[test]
    fn without_a_good_certificate_the_secret_opens_no_usable_tunnel() {
        let now = test_epoch();
        let ca = ca();
        let other = AuthorityKey::from_seed([41; 32]);
        let cases: [(&str, Option<Vec<u8>>, Refusal); 4] = [
            ("the secret only", None, Refusal::Missing),
            (
                "expired",
                Some(certificate(&ca, 1, WALL - DAY, None)),
                Refusal::Expired,
            ),
            (
                "another authority",
                Some(certificate(&other, 1, WALL + DAY, None)),
                Refusal::WrongAuthority,
            ),
            (
                "another member's",
                Some(certificate(&ca, 3, WALL + DAY, None)),
                Refusal::OtherIdentity,
            ),
        ];
        for (what, cert, reason) in cases {
            let (mut stranger, _) = node(1, cert);
            let (mut b, _) = node(2, Some(certificate(&ca, 2, WALL + DAY, None)));
            let (_, at_b) = connect(&mut stranger, &mut b, now);
            assert!(at_b.is_none(), "{what}: b closed the tunnel");
            assert_eq!(b.certificate_stats().refused_for(reason), 1, "{what}");
            // The switch never heard of an address of it.
            assert!(
                !std::iter::from_fn(|| b.poll_event())
                    .any(|e| matches!(e, Event::PeerAddresses { ref addresses, .. } if !addresses.is_empty())),
                "{what}"
            );
            assert!(!carries(&mut stranger, 1, &mut b, 2, now), "{what}");
        }
    }

    #[test]
    fn a_member_may_announce_only_the_addresses_its_certificate_pins() {
        let now = test_epoch();
        let ca = ca();
        // a holds 10.201.0.1 but its certificate pins 10.201.0.9.
        let (mut a, _) = node(
            1,
            Some(certificate(
                &ca,
                1,
                WALL + DAY,
                Some(Ipv4Addr::new(10, 201, 0, 9)),
            )),
        );
        let (mut b, _) = node(
            2,
            Some(certificate(
                &ca,
                2,
                WALL + DAY,
                Some(Ipv4Addr::new(10, 201, 0, 2)),
            )),
        );
        connect(&mut a, &mut b, now);
        assert!(b.peers().next().unwrap().addresses.is_empty());
        // Refused each time a announced it (once, twice when announcements cross, or a
        // third time with its IPv6 list once it knows b reads one).
        let refused = b.certificate_stats().address_not_allowed;
        assert!((1..=3).contains(&refused), "{refused}");
        assert!(
            !carries(&mut a, 1, &mut b, 2, now),
            "spoofed by its certificate"
        );
        // b's own pinned address is a's to learn.
        assert_eq!(
            a.peers().next().unwrap().addresses,
            [Ipv4Addr::new(10, 201, 0, 2)]
        );
    }

    #[test]
    fn revocation_and_expiry_cut_a_member_off_at_once() {
        let now = test_epoch();
        let ca = ca();
        let (mut a, _) = node(1, Some(certificate(&ca, 1, WALL + DAY, None)));
        let (mut b, ns) = node(2, Some(certificate(&ca, 2, WALL + 9 * DAY, None)));
        let (mut c, _) = node(3, Some(certificate(&ca, 3, WALL + 9 * DAY, None)));
        connect(&mut a, &mut b, now);
        assert!(carries(&mut a, 1, &mut b, 2, now));
        while b.poll_event().is_some() {}

        // Revoked: b closes the tunnel as it takes the list, and tells its switch.
        let list = ca
            .revoke(1, WALL, &[Identity::from_seed([1; 32]).peer_id()], &[])
            .unwrap();
        assert_eq!(b.update_revocations(now, ns, &list), Ok(1));
        assert!(b.peers().next().is_none());
        assert!(std::iter::from_fn(|| b.poll_event())
            .any(|e| matches!(e, Event::PeerUnreachable { .. })));
        assert!(!carries(&mut a, 1, &mut b, 2, now));
        assert_eq!(b.update_revocations(now, ns, &list), Err(Refusal::Outdated));
        // It tries again: refused before it carries anything.
        let (mut a2, _) = node(1, Some(certificate(&ca, 1, WALL + DAY, None)));
        let (_, at_b) = connect(&mut a2, &mut b, now);
        assert!(at_b.is_none());
        assert_eq!(b.certificate_stats().refused_for(Refusal::Revoked), 2);

        // Expired: c's certificate runs for nine days; a day after (past the skew), the
        // next tick closes its tunnel.
        let (mut b2, _) = node(2, Some(certificate(&ca, 2, WALL + 20 * DAY, None)));
        connect(&mut c, &mut b2, now);
        assert!(b2.peers().next().is_some());
        b2.set_wall(WALL + 9 * DAY + CLOCK_SKEW + 1);
        b2.handle_timeout(now + Duration::from_secs(1));
        assert!(b2.peers().next().is_none());
        assert_eq!(b2.certificate_stats().refused_for(Refusal::Expired), 1);
    }

    const CLOCK_SKEW: u64 = crate::cert::CLOCK_SKEW_SECS;
}
