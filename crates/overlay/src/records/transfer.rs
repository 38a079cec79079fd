//! The migration handoff's lease transfer on one replica (`hyphae_migrate`, IPOP Sec. 5).
//!
//! IPOP's source router deletes its mapping and the target puts its own, which leaves a
//! window where a third member can take the address, and lets a source that wakes up late
//! put its mapping back. Here the holder moves its lease to a named new holder in one step
//! on each replica ([`crate::lease::Replica::transfer`]):
//!
//! - only the current holder can transfer, over its own authenticated connection (the
//!   requester is the connection's peer, not a field anyone can fill in);
//! - the record kept is the new holder's own, signed by it (the target hands it to the
//!   source in its request), so a replica never keeps a value its owner did not sign;
//! - from then on the replica answers the old holder's renewals with `Held`, so a stale
//!   holder cannot take the address back, and nobody else can take it in between.
//!
//! The handoff counts a transfer done once a strict majority of the key's replicas granted
//! it, like a claim: two majorities share a replica, which names one holder at a time.

use std::time::{Duration, Instant};

use super::{
    lease, Envelope, OwnerKey, RecordKey, RecordResponse, RecordStore, Refusal, Stored,
    MAX_RECORDS_PER_OWNER, MAX_TTL,
};

impl RecordStore {
    /// Answers [`super::RecordRequest::Transfer`] from `requester`.
    pub(super) fn transfer(
        &mut self,
        now: Instant,
        now_unix: u64,
        requester: Option<OwnerKey>,
        key: &[u8],
        envelope: Envelope,
    ) -> RecordResponse {
        let (Ok(key), Some(from)) = (RecordKey::try_from(key), requester) else {
            self.stats.rejected += 1;
            return RecordResponse::Rejected;
        };
        let to = match envelope.verify(&key, now_unix) {
            Ok(to) if to != from => to,
            // A transfer to oneself is a claim; a bad signature or expiry is nothing.
            Ok(_) | Err(_) => {
                self.stats.rejected += 1;
                return RecordResponse::Rejected;
            }
        };
        let already = self.values.get(&key).is_some_and(|s| s.owner == to);
        // The record stays in the namespace it was claimed in.
        let ns = self.values.get(&key).and_then(|s| s.ns);
        if !already && self.records_held.of_owner(&to) >= MAX_RECORDS_PER_OWNER {
            return self.refuse(Refusal::OwnerQuota);
        }
        let ttl = Duration::from_secs(envelope.expires - now_unix).min(MAX_TTL);
        match self.leases.transfer(now, &key, &from, to, ttl) {
            lease::Response::Granted => {
                self.stats.granted += 1;
                self.insert_value(
                    key,
                    Stored {
                        envelope,
                        owner: to,
                        via: from,
                        ns,
                    },
                );
                RecordResponse::Granted
            }
            lease::Response::Held { owner, remaining } => {
                self.stats.held += 1;
                RecordResponse::Held {
                    owner: owner.to_vec(),
                    remaining_ms: remaining.as_millis() as u64,
                }
            }
            lease::Response::Released => RecordResponse::Released,
            lease::Response::Full => self.refuse(Refusal::StoreFull),
        }
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests start the clock
mod tests {
    use std::net::Ipv4Addr;

    use super::super::{encode, MemberInfo, RecordRequest};
    use super::*;
    use crate::{Identity, NamespaceKeys};

    const NOW: u64 = 1_800_000_000;

    fn member(seed: u8) -> Identity {
        Identity::from_seed([seed; 32])
    }

    fn owner(m: &Identity) -> Option<OwnerKey> {
        Some(*m.peer_id().as_bytes())
    }

    struct Lab {
        store: RecordStore,
        key: RecordKey,
        keys: NamespaceKeys,
        t: Instant,
    }

    impl Lab {
        /// A replica where member 1 holds the address key.
        fn new() -> Self {
            let keys = NamespaceKeys::derive("lab", b"0123456789abcdef");
            let key = keys.address_key(Ipv4Addr::new(10, 1, 0, 5));
            let mut lab = Self {
                store: RecordStore::default(),
                key,
                keys,
                t: Instant::now(),
            };
            let a = member(1);
            let claim = RecordRequest::Claim {
                key: key.to_vec(),
                envelope: lab.seal(&a),
            };
            assert_eq!(lab.ask(&a, claim), RecordResponse::Granted);
            lab
        }

        fn seal(&self, m: &Identity) -> Envelope {
            let info = encode(&MemberInfo {
                endpoints: vec![],
                name: None,
                subject: None,
            });
            let mut rng: rand::rngs::StdRng = rand::SeedableRng::from_seed([7; 32]);
            Envelope::seal(&self.keys, m, &self.key, NOW + 60, &info, &mut rng).unwrap()
        }

        fn ask(&mut self, by: &Identity, request: RecordRequest) -> RecordResponse {
            self.store.handle(self.t, NOW, owner(by), request)
        }

        fn transfer(&mut self, by: &Identity, to: &Identity) -> RecordResponse {
            let request = RecordRequest::Transfer {
                key: self.key.to_vec(),
                envelope: self.seal(to),
            };
            self.ask(by, request)
        }

        fn claim(&mut self, by: &Identity) -> RecordResponse {
            let request = RecordRequest::Claim {
                key: self.key.to_vec(),
                envelope: self.seal(by),
            };
            self.ask(by, request)
        }

        fn value(&mut self) -> Option<Envelope> {
            let get = RecordRequest::Get {
                key: self.key.to_vec(),
            };
            match self.ask(&member(9), get) {
                RecordResponse::Value { envelope } => envelope,
                other => panic!("{other:?}"),
            }
        }
    }

    fn held_by(response: &RecordResponse, m: &Identity) -> bool {
        matches!(response, RecordResponse::Held { owner, .. } if *owner == m.peer_id().as_bytes().to_vec())
    }

    #[test]
    fn the_holder_moves_its_lease_to_the_named_member() {
        let mut lab = Lab::new();
        let (a, b, c) = (member(1), member(2), member(3));
        assert_eq!(lab.transfer(&a, &b), RecordResponse::Granted);
        assert_eq!(
            lab.value(),
            Some(lab.seal(&b)),
            "the new holder's own record"
        );
        // The old holder cannot renew it back, nor a third member take it.
        assert!(held_by(&lab.claim(&a), &b));
        assert!(held_by(&lab.claim(&c), &b));
        // The new holder renews as any holder does.
        assert_eq!(lab.claim(&b), RecordResponse::Granted);
        // A repeated transfer (a lost answer) changes nothing.
        assert_eq!(lab.transfer(&a, &b), RecordResponse::Granted);
        assert_eq!(lab.value(), Some(lab.seal(&b)));
        assert_eq!(lab.store.records_of(owner(&a).as_ref().unwrap()), 0);
        assert_eq!(lab.store.records_of(owner(&b).as_ref().unwrap()), 1);
    }

    #[test]
    fn only_the_holder_can_transfer() {
        let mut lab = Lab::new();
        let (a, b, c) = (member(1), member(2), member(3));
        // A third member cannot give the address away, not even to itself.
        assert!(held_by(&lab.transfer(&c, &b), &a));
        assert!(held_by(&lab.transfer(&b, &c), &a));
        assert_eq!(lab.value(), Some(lab.seal(&a)));
        // Nor can the old holder after it gave it away.
        assert_eq!(lab.transfer(&a, &b), RecordResponse::Granted);
        assert!(held_by(&lab.transfer(&a, &c), &b));
    }

    #[test]
    fn bad_transfers_are_rejected() {
        let mut lab = Lab::new();
        let (a, b) = (member(1), member(2));
        // To oneself.
        assert_eq!(lab.transfer(&a, &a), RecordResponse::Rejected);
        // Without an authenticated requester.
        let request = RecordRequest::Transfer {
            key: lab.key.to_vec(),
            envelope: lab.seal(&b),
        };
        let t = lab.t;
        assert_eq!(
            lab.store.handle(t, NOW, None, request),
            RecordResponse::Rejected
        );
        // A record b did not sign (its owner field rewritten).
        let mut forged = lab.seal(&a);
        forged.owner = b.peer_id().as_bytes().to_vec();
        let request = RecordRequest::Transfer {
            key: lab.key.to_vec(),
            envelope: forged,
        };
        assert_eq!(lab.ask(&a, request), RecordResponse::Rejected);
        // A malformed key.
        let request = RecordRequest::Transfer {
            key: vec![1; 5],
            envelope: lab.seal(&b),
        };
        assert_eq!(lab.ask(&a, request), RecordResponse::Rejected);
        assert_eq!(lab.store.stats().rejected, 4);
        assert_eq!(lab.value(), Some(lab.seal(&a)));
    }

    #[test]
    fn nothing_to_transfer_once_the_lease_lapsed() {
        let mut lab = Lab::new();
        lab.t += Duration::from_secs(61);
        let (a, b) = (member(1), member(2));
        assert_eq!(lab.transfer(&a, &b), RecordResponse::Released);
    }
}
