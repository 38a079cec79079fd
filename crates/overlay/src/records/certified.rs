//! What a replica checks on a claim in a namespace with an authority (issue 27): a member
//! may claim only what its certificate allows, and the address or name a certificate gives
//! its holder is the holder's.
//!
//! The replica is a member itself (it answers only for its own namespaces), so it opens the
//! claim's sealed value and reads what the lease is on ([`Subject`]); it derives the key
//! from it and compares, so a claim cannot say one thing and take another key. Then, with
//! the owner's certificate (the one it proved membership with on its connection):
//!
//! - an address: one the certificate pins, or any when it pins none;
//! - a name: the certificate's name, nothing else (a router's DHCP clients and LAN hosts
//!   act under the router's certificate and have their automatic names);
//! - the namespace record (no subject): any member, as without an authority;
//! - anything else, a claim that does not say what it is on, or an owner whose certificate
//!   this replica has not seen: refused ([`crate::quota::Refusal::NotAllowed`]).
//!
//! A pinned address and a certificate's name have priority ([`Verdict::Priority`]): the
//! replica takes the lease from a holder that has no such claim on it, so a member that
//! took it while its holder was away loses it once the holder claims it again. Without a
//! list of every certificate a replica cannot refuse the first such claim; it can make it
//! last only until the rightful holder shows up.

use std::time::Instant;

use serde::Deserialize;

use super::{
    lease, Envelope, OwnerKey, RecordKey, RecordRequest, RecordResponse, RecordStore, Refusal,
    Subject,
};
use crate::cert::Certificate;
use crate::proof::NamespaceTag;
use crate::NamespaceKeys;

/// A replica's verdict on a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The certificate allows it: decided by the lease, first come.
    Allowed,
    /// The certificate gives the owner this address or name: it takes the lease from a
    /// holder without such a claim.
    Priority,
    /// The certificate does not allow it.
    NotAllowed,
}

/// The part of any record value a replica reads.
#[derive(Deserialize)]
struct Leased {
    #[serde(default)]
    subject: Option<Subject>,
}

/// The verdict on `envelope` claiming `key` in the namespace of `keys`, for an owner
/// whose certificate is `cert` (`None`: not seen here). `now_unix` is the wall clock (the
/// envelope's expiry is checked again when it is opened).
pub fn check_claim(
    keys: &NamespaceKeys,
    cert: Option<&Certificate>,
    key: &RecordKey,
    envelope: &Envelope,
    now_unix: u64,
) -> Verdict {
    let Some(cert) = cert else {
        return Verdict::NotAllowed;
    };
    let Ok((_, leased)) = envelope.read::<Leased>(keys, key, now_unix) else {
        return Verdict::NotAllowed;
    };
    match leased.subject {
        Some(Subject::Address(address)) if keys.address_key(address) == *key => {
            if cert.addresses().is_empty() {
                Verdict::Allowed
            } else if cert.allows_address(address.into()) {
                Verdict::Priority
            } else {
                Verdict::NotAllowed
            }
        }
        Some(Subject::Address6(address)) if keys.address6_key(address) == *key => {
            if cert.addresses().iter().all(|a| a.is_ipv4()) {
                // A certificate that pins no IPv6 address leaves the prefix free.
                Verdict::Allowed
            } else if cert.allows_address(address.into()) {
                Verdict::Priority
            } else {
                Verdict::NotAllowed
            }
        }
        Some(Subject::Name(name)) if name == cert.name() && keys.name_key(&name) == *key => {
            Verdict::Priority
        }
        // Any member may hold a MAC (a certificate names addresses, not hardware).
        Some(Subject::Mac(mac)) if keys.mac_key(mac) == *key => Verdict::Allowed,
        None if keys.settings_key() == *key => Verdict::Allowed,
        _ => Verdict::NotAllowed,
    }
}

impl RecordStore {
    /// Answers `request` of namespace `ns`, which has an authority, from `requester`: as
    /// [`RecordStore::handle_in`], with each claim and transfer first checked by
    /// [`check_claim`] against the certificate its owner proved here (`certificate_of`),
    /// and a claim with priority taking the lease from a holder without.
    #[allow(clippy::too_many_arguments)]
    pub fn handle_certified<'c>(
        &mut self,
        now: Instant,
        now_unix: u64,
        requester: Option<OwnerKey>,
        ns: NamespaceTag,
        keys: &NamespaceKeys,
        certificate_of: impl Fn(&OwnerKey) -> Option<&'c Certificate>,
        request: RecordRequest,
    ) -> RecordResponse {
        if let Some(refused) = self.limit(now, requester, Some(ns)) {
            return refused;
        }
        let (claim, key, envelope) = match &request {
            RecordRequest::Claim { key, envelope } => (true, key, envelope),
            RecordRequest::Transfer { key, envelope } => (false, key, envelope),
            _ => return self.answer(now, now_unix, requester, Some(ns), request),
        };
        let (Ok(key), Some(owner)) = (RecordKey::try_from(key.as_slice()), envelope.owner()) else {
            self.stats.rejected += 1;
            return RecordResponse::Rejected;
        };
        match check_claim(keys, certificate_of(&owner), &key, envelope, now_unix) {
            Verdict::NotAllowed => return self.refuse(Refusal::NotAllowed),
            Verdict::Priority if claim => {
                let holder = self
                    .leases
                    .holder(now, &key)
                    .copied()
                    .filter(|h| *h != owner);
                if let Some(holder) = holder {
                    let equal = self.values.get(&key).is_some_and(|s| {
                        check_claim(keys, certificate_of(&holder), &key, &s.envelope, now_unix)
                            == Verdict::Priority
                    });
                    if !equal {
                        self.leases
                            .handle(now, lease::Request::Release { key, owner: holder });
                        self.remove_value(&key);
                        self.stats.preempted += 1;
                    }
                }
            }
            Verdict::Priority | Verdict::Allowed => {}
        }
        self.answer(now, now_unix, requester, Some(ns), request)
    }

    /// Drops every lease and group entry `owner` holds in namespace `ns` (a revoked
    /// member's: its addresses and name are free at once, not at the end of their lease).
    /// Returns how many.
    pub fn drop_owner(&mut self, now: Instant, ns: &NamespaceTag, owner: &OwnerKey) -> usize {
        let keys: Vec<RecordKey> = self
            .values
            .iter()
            .filter(|(_, s)| s.owner == *owner && s.ns.as_ref() == Some(ns))
            .map(|(k, _)| *k)
            .collect();
        for key in &keys {
            self.leases.handle(
                now,
                lease::Request::Release {
                    key: *key,
                    owner: *owner,
                },
            );
            self.remove_value(key);
        }
        let mut entries = 0;
        for group in self.groups.values_mut() {
            if group.get(owner).is_some_and(|e| e.ns.as_ref() == Some(ns)) {
                if let Some(old) = group.remove(owner) {
                    self.entries_held.remove(owner, &old.via, old.ns.as_ref());
                    entries += 1;
                }
            }
        }
        self.groups.retain(|_, g| !g.is_empty());
        let dropped = keys.len() + entries;
        self.stats.revoked_dropped += dropped as u64;
        dropped
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    #![allow(clippy::disallowed_methods)] // tests start the clock

    use std::net::Ipv4Addr;

    use super::*;
    use crate::cert::{AuthorityKey, CertificateRequest, Trust};
    use crate::records::{encode, MemberInfo, NameInfo};
    use crate::Identity;

    const NOW: u64 = 1_800_000_000;

    fn keys() -> NamespaceKeys {
        NamespaceKeys::derive("lab", b"secret")
    }

    fn member(n: u8) -> Identity {
        Identity::from_seed([n; 32])
    }

    /// A certificate for `who` named `name`, pinning `addresses`.
    fn cert(who: &Identity, name: &str, addresses: &[Ipv4Addr]) -> Certificate {
        let ca = AuthorityKey::from_seed([9; 32]);
        let bytes = ca
            .sign(&CertificateRequest {
                namespace: "lab".into(),
                identity: who.peer_id(),
                name: name.into(),
                groups: vec![],
                addresses: addresses.iter().map(|a| (*a).into()).collect(),
                not_before: NOW - 10,
                not_after: NOW + 3600,
            })
            .unwrap();
        Trust::new("lab", ca.authority())
            .check(&bytes, &who.peer_id(), NOW)
            .unwrap()
    }

    fn seal(who: &Identity, key: &RecordKey, plaintext: &[u8]) -> Envelope {
        let mut rng: rand::rngs::StdRng = rand::SeedableRng::from_seed([3; 32]);
        Envelope::seal(&keys(), who, key, NOW + 60, plaintext, &mut rng).unwrap()
    }

    fn address_claim(who: &Identity, key: &RecordKey, subject: Option<Subject>) -> Envelope {
        let info = MemberInfo {
            endpoints: vec![],
            name: None,
            subject,
        };
        seal(who, key, &encode(&info))
    }

    fn ip(last: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 0, 0, last)
    }

    #[test]
    fn an_address_is_allowed_by_its_pin_or_by_no_pin_at_all() {
        let (k, a) = (keys(), member(1));
        let key = k.address_key(ip(5));
        let claim = address_claim(&a, &key, Some(Subject::Address(ip(5))));
        let free = cert(&a, "alpha", &[]);
        let pinned = cert(&a, "alpha", &[ip(5)]);
        let elsewhere = cert(&a, "alpha", &[ip(6)]);
        assert_eq!(
            check_claim(&k, Some(&free), &key, &claim, NOW),
            Verdict::Allowed
        );
        assert_eq!(
            check_claim(&k, Some(&pinned), &key, &claim, NOW),
            Verdict::Priority
        );
        assert_eq!(
            check_claim(&k, Some(&elsewhere), &key, &claim, NOW),
            Verdict::NotAllowed
        );
        // No certificate seen here: nothing is allowed.
        assert_eq!(
            check_claim(&k, None, &key, &claim, NOW),
            Verdict::NotAllowed
        );
    }

    #[test]
    fn a_claim_must_say_what_it_is_on_and_say_it_truly() {
        let (k, a) = (keys(), member(1));
        let pinned = cert(&a, "alpha", &[ip(5)]);
        let free = cert(&a, "alpha", &[]);
        // The subject names a pinned address, the key is another one's.
        let key = k.address_key(ip(7));
        let lying = address_claim(&a, &key, Some(Subject::Address(ip(5))));
        assert_eq!(
            check_claim(&k, Some(&pinned), &key, &lying, NOW),
            Verdict::NotAllowed
        );
        assert_eq!(
            check_claim(&k, Some(&free), &key, &lying, NOW),
            Verdict::NotAllowed
        );
        // No subject, or a value that is not a record at all.
        let silent = address_claim(&a, &key, None);
        assert_eq!(
            check_claim(&k, Some(&free), &key, &silent, NOW),
            Verdict::NotAllowed
        );
        let junk = seal(&a, &key, b"\xff not json");
        assert_eq!(
            check_claim(&k, Some(&free), &key, &junk, NOW),
            Verdict::NotAllowed
        );
        // Sealed under another namespace's keys: it does not open.
        let other = NamespaceKeys::derive("other", b"secret");
        let mut rng: rand::rngs::StdRng = rand::SeedableRng::from_seed([4; 32]);
        let info = MemberInfo {
            endpoints: vec![],
            name: None,
            subject: Some(Subject::Address(ip(7))),
        };
        let foreign = Envelope::seal(&other, &a, &key, NOW + 60, &encode(&info), &mut rng).unwrap();
        assert_eq!(
            check_claim(&k, Some(&free), &key, &foreign, NOW),
            Verdict::NotAllowed
        );
        // The namespace record needs no subject.
        let settings = k.settings_key();
        let record = seal(&a, &settings, b"{}");
        assert_eq!(
            check_claim(&k, Some(&free), &settings, &record, NOW),
            Verdict::Allowed
        );
    }

    #[test]
    fn a_member_holds_its_own_name_and_no_other() {
        let (k, a) = (keys(), member(1));
        let alpha = cert(&a, "alpha", &[]);
        let claim = |name: &str| {
            let key = k.name_key(name);
            let info = NameInfo {
                address: ip(5),
                address6: None,
                subject: Some(Subject::Name(name.into())),
            };
            (key, seal(&a, &key, &encode(&info)))
        };
        let (key, own) = claim("alpha");
        assert_eq!(
            check_claim(&k, Some(&alpha), &key, &own, NOW),
            Verdict::Priority
        );
        let (key, other) = claim("beta");
        assert_eq!(
            check_claim(&k, Some(&alpha), &key, &other, NOW),
            Verdict::NotAllowed
        );
    }

    /// One replica of namespace "lab" and the certificates its members proved.
    struct Replica {
        store: RecordStore,
        certs: std::collections::HashMap<OwnerKey, Certificate>,
        now: Instant,
    }

    impl Replica {
        fn new() -> Self {
            Self {
                store: RecordStore::new(None),
                certs: Default::default(),
                now: Instant::now(),
            }
        }

        fn admit(&mut self, who: &Identity, name: &str, pins: &[Ipv4Addr]) {
            self.certs
                .insert(*who.peer_id().as_bytes(), cert(who, name, pins));
        }

        fn ask(&mut self, who: &Identity, request: RecordRequest) -> RecordResponse {
            let certs = &self.certs;
            self.store.handle_certified(
                self.now,
                NOW,
                Some(*who.peer_id().as_bytes()),
                *b"labtag00",
                &keys(),
                |owner| certs.get(owner),
                request,
            )
        }

        fn claim_address(&mut self, who: &Identity, address: Ipv4Addr) -> RecordResponse {
            let key = keys().address_key(address);
            let envelope = address_claim(who, &key, Some(Subject::Address(address)));
            self.ask(
                who,
                RecordRequest::Claim {
                    key: key.to_vec(),
                    envelope,
                },
            )
        }
    }

    fn held_by(response: &RecordResponse, who: &Identity) -> bool {
        matches!(response, RecordResponse::Held { owner, .. } if owner == who.peer_id().as_bytes())
    }

    #[test]
    fn a_pinned_address_comes_back_to_its_holder_and_no_one_else_takes_it_then() {
        let (a, b, c) = (member(1), member(2), member(3));
        let mut r = Replica::new();
        r.admit(&a, "alpha", &[ip(5)]);
        r.admit(&b, "beta", &[]);
        r.admit(&c, "gamma", &[ip(6)]);
        // alpha is away: beta, whose certificate pins nothing, takes its address.
        assert_eq!(r.claim_address(&b, ip(5)), RecordResponse::Granted);
        // gamma's certificate pins another address: refused outright.
        assert_eq!(
            r.claim_address(&c, ip(5)),
            RecordResponse::Refused {
                reason: Refusal::NotAllowed
            }
        );
        assert_eq!(
            r.claim_address(&c, ip(7)),
            RecordResponse::Refused {
                reason: Refusal::NotAllowed
            }
        );
        // alpha comes back: the address is its own again, and beta's renewal is refused.
        assert_eq!(r.claim_address(&a, ip(5)), RecordResponse::Granted);
        assert_eq!(r.store.stats().preempted, 1);
        assert!(held_by(&r.claim_address(&b, ip(5)), &a));
        assert_eq!(r.claim_address(&a, ip(5)), RecordResponse::Granted);
        assert_eq!(r.store.stats().preempted, 1);
        let got = r.ask(
            &b,
            RecordRequest::Get {
                key: keys().address_key(ip(5)).to_vec(),
            },
        );
        let RecordResponse::Value {
            envelope: Some(envelope),
        } = got
        else {
            panic!("{got:?}");
        };
        assert_eq!(envelope.owner(), Some(*a.peer_id().as_bytes()));
    }

    #[test]
    fn two_certificates_pinning_one_address_keep_it_first_come() {
        let (a, a2) = (member(1), member(4));
        let mut r = Replica::new();
        r.admit(&a, "alpha", &[ip(5)]);
        r.admit(&a2, "alpha2", &[ip(5)]);
        assert_eq!(r.claim_address(&a, ip(5)), RecordResponse::Granted);
        assert!(held_by(&r.claim_address(&a2, ip(5)), &a));
        assert_eq!(r.store.stats().preempted, 0);
    }

    #[test]
    fn an_owner_without_a_certificate_seen_here_claims_nothing_but_reads() {
        let (a, d) = (member(1), member(5));
        let mut r = Replica::new();
        r.admit(&a, "alpha", &[]);
        assert_eq!(
            r.claim_address(&d, ip(8)),
            RecordResponse::Refused {
                reason: Refusal::NotAllowed
            }
        );
        assert_eq!(r.store.stats().refusals.get(Refusal::NotAllowed), 1);
        assert_eq!(r.claim_address(&a, ip(8)), RecordResponse::Granted);
        let got = r.ask(
            &d,
            RecordRequest::Get {
                key: keys().address_key(ip(8)).to_vec(),
            },
        );
        assert!(matches!(got, RecordResponse::Value { envelope: Some(_) }));
    }

    #[test]
    fn a_revoked_owner_holds_nothing_once_dropped() {
        let (a, b) = (member(1), member(2));
        let mut r = Replica::new();
        r.admit(&a, "alpha", &[]);
        r.admit(&b, "beta", &[]);
        assert_eq!(r.claim_address(&a, ip(5)), RecordResponse::Granted);
        let k = keys();
        let group = k.group_key();
        let entry = address_claim(&a, &group, None);
        assert_eq!(
            r.ask(
                &a,
                RecordRequest::Join {
                    key: group.to_vec(),
                    envelope: entry,
                }
            ),
            RecordResponse::Joined
        );
        // Another namespace's records of the same owner stay.
        assert_eq!(
            r.store
                .drop_owner(r.now, b"othertag", a.peer_id().as_bytes()),
            0
        );
        assert_eq!(
            r.store
                .drop_owner(r.now, b"labtag00", a.peer_id().as_bytes()),
            2
        );
        assert_eq!(r.store.stats().revoked_dropped, 2);
        assert_eq!(
            r.ask(
                &b,
                RecordRequest::Members {
                    key: group.to_vec()
                }
            ),
            RecordResponse::Members { envelopes: vec![] }
        );
        assert_eq!(r.store.records_of(a.peer_id().as_bytes()), 0);
        assert_eq!(r.claim_address(&b, ip(5)), RecordResponse::Granted);
    }
}
