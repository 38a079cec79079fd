//! A namespace's records in the shared DHT: how they are named, sealed, signed and stored.
//!
//! Every hyphae agent is a replica for whatever keys fall close to it, whichever namespaces
//! it belongs to, so a replica must be able to keep and serve records it cannot read:
//!
//! - **Keys** are BLAKE2s-MACs under a key derived from the namespace secret
//!   ([`NamespaceKeys::address_key`], [`NamespaceKeys::settings_key`]): without the secret
//!   nobody can compute where a namespace's records live, nor tell whose a key is.
//! - **Values** are sealed (ChaCha20-Poly1305 under another secret-derived key, with the key,
//!   the owner and the expiry as associated data, so a sealed value cannot be moved to
//!   another key or owner) and then signed with the owner's Ed25519 key ([`Envelope`]).
//!   Replicas check the signature and the expiry; members also open the seal.
//! - **Storage** is a lease per key ([`RecordStore`], over [`crate::lease::Replica`]): the
//!   first owner keeps a key until its lease lapses or it releases it; only the owner can
//!   renew (sign) or release (over its authenticated connection). So neither a stranger nor a
//!   member of another namespace can read, forge, overwrite or delete a record; the worst a
//!   hostile replica can do is refuse to answer or lie about a key it holds, which the
//!   majority rule and the signatures contain.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use blake2::digest::{KeyInit, Mac};
use blake2::Blake2sMac256;
use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};
use ed25519_dalek::{Signature, Verifier, VerifyingKey};
use ipnet::Ipv6Net;
use serde::{Deserialize, Serialize};

use crate::lease::{self, Replica};
use crate::proof::NamespaceTag;
use crate::quota::{
    Holdings, RateLimiter, Refusal, Refusals, MAX_GROUPS_PER_OWNER,
    MAX_GROUP_ENTRIES_PER_NAMESPACE, MAX_RECORDS_PER_NAMESPACE, MAX_RECORDS_PER_OWNER,
    MAX_RECORDS_PER_REQUESTER,
};
use crate::{Identity, NamespaceKeys};

pub mod certified;
mod requests;
pub mod transfer;
mod values;

pub use requests::{RecordRequest, RecordResponse, ScopedRequest};
pub use values::{decode, encode, MemberInfo, NameInfo, Subject};

/// A record's key in the DHT.
pub type RecordKey = [u8; 32];

/// One line of the lease history (target `hyphae::lease`, debug level): what this replica
/// (`granted`, `refused` naming the holder, `released`) or this owner (`won`, `gave` to a
/// holder) did with a key, key and owner in base64, and a duration in milliseconds (the
/// lease granted or held, the lease won). `hyphae_testbed::history` checks a run's lines
/// from every agent (`HYPHAE_LOG=info,hyphae::lease=debug`).
pub fn lease_log(what: &str, key: &RecordKey, owner: &[u8], ms: u64) {
    use base64::Engine as _;
    let b64 = &base64::engine::general_purpose::STANDARD;
    tracing::debug!(target: "hyphae::lease", "{what} key={} owner={} ms={ms}",
        b64.encode(key), b64.encode(owner));
}

/// An Ed25519 public key: who owns a record.
pub type OwnerKey = [u8; 32];

/// Largest sealed value a replica keeps.
pub const MAX_SEALED_LEN: usize = 1024;

/// Most members one group (a namespace's broadcast group) keeps on one replica.
pub const MAX_GROUP_MEMBERS: usize = 1024;

/// Most group entries one replica keeps, over all groups.
pub const MAX_GROUP_ENTRIES: usize = 65536;

/// Longest lease a replica grants, whatever the envelope says.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// How long a replica keeps a group entry after the member last announced it (whatever
/// its envelope says): members announce every [`crate::membership::GROUP_HEARTBEAT`], so a
/// member that stops without leaving drops out of the group within this much, by the
/// replica's own clock (no writer's clock is trusted for it), while one lost announcement
/// costs nothing.
pub const GROUP_ENTRY_TTL: Duration = Duration::from_secs(20);

/// How far a writer's clock may run ahead of a replica's.
pub const CLOCK_SKEW_SECS: u64 = 120;

const NONCE_LEN: usize = 12;
const SIGN_DOMAIN: &[u8] = b"hyphae record v1";

impl NamespaceKeys {
    fn record_key(&self, kind: &[u8], body: &[u8]) -> RecordKey {
        // A 32-byte key is always a valid BLAKE2s key.
        let mut mac = <Blake2sMac256 as KeyInit>::new_from_slice(&self.record_salt)
            .unwrap_or_else(|_| unreachable!("32-byte key"));
        mac.update(&[kind.len() as u8]);
        mac.update(kind);
        mac.update(body);
        mac.finalize().into_bytes().into()
    }

    /// The key of the lease on virtual address `ip`.
    pub fn address_key(&self, ip: Ipv4Addr) -> RecordKey {
        self.record_key(b"address", &ip.octets())
    }

    /// The key of the lease on the IPv6 address `ip` (a dual-stack namespace's other
    /// half: held, renewed and released as an IPv4 address is).
    pub fn address6_key(&self, ip: Ipv6Addr) -> RecordKey {
        self.record_key(b"address6", &ip.octets())
    }

    /// The stable interface identifier (the low 64 bits of an `auto` IPv6 address) of the
    /// member whose peer id is `peer` in this namespace: the same across restarts, and
    /// unknown to anyone without the namespace's keys.
    pub fn interface_id(&self, peer: &[u8]) -> u64 {
        let h = self.record_key(b"interface-id", peer);
        u64::from_be_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]])
    }

    /// The namespace's IPv6 prefix when none is configured: a unique local /64 (RFC 4193)
    /// whose 40-bit global ID comes from the namespace's keys, so every member derives the
    /// same one with no configuration and two namespaces almost never share one.
    pub fn ula_prefix(&self) -> Ipv6Net {
        let id = self.record_key(b"ula", &[]);
        let mut octets = [0u8; 16];
        octets[0] = 0xfd;
        octets[1..6].copy_from_slice(&id[..5]);
        Ipv6Net::new(Ipv6Addr::from(octets), 64).unwrap_or_else(|_| unreachable!("/64"))
    }

    /// The key of the lease on MAC `mac` in a layer-2 namespace: the member that has it on
    /// its side holds it, so another cannot take its frames.
    pub fn mac_key(&self, mac: [u8; 6]) -> RecordKey {
        self.record_key(b"mac", &mac)
    }

    /// The key of the namespace record (its settings; not stored yet).
    pub fn settings_key(&self) -> RecordKey {
        self.record_key(b"settings", &[])
    }

    /// The key of the lease on host name `host` (a lowercase DNS label) in the namespace
    /// zone: the first member to claim it keeps it until its lease lapses.
    pub fn name_key(&self, host: &str) -> RecordKey {
        self.record_key(b"name", host.as_bytes())
    }

    /// The key every member announces itself under, so broadcasts reach them all (IPOP's
    /// `namespace:broadcast` group).
    pub fn group_key(&self) -> RecordKey {
        self.record_key(b"group", b"broadcast")
    }
}

/// Why a record was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Wrong field lengths, or too large.
    #[error("malformed record")]
    Malformed,
    /// The signature does not verify under the owner's key.
    #[error("bad signature")]
    BadSignature,
    /// Expired, or expiring further out than a replica allows.
    #[error("record expired or expiry out of range")]
    BadExpiry,
    /// The seal does not open with this namespace's key: a stranger's, or tampered.
    #[error("record does not open with the namespace key")]
    BadSeal,
    /// The plaintext is not what the reader expected.
    #[error("record content is malformed")]
    BadContent,
}

/// A sealed, signed record value as it travels and is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The owner's Ed25519 public key (32 bytes).
    pub owner: Vec<u8>,
    /// Unix seconds after which the value is void.
    pub expires: u64,
    /// Nonce and ChaCha20-Poly1305 ciphertext.
    pub sealed: Vec<u8>,
    /// Ed25519 signature by `owner` over the key, `expires` and `sealed` (64 bytes).
    pub signature: Vec<u8>,
}

impl Envelope {
    /// Packs the envelope as bytes, for a message that carries a record inside another
    /// encoding (a router's handoff request): owner, expiry, signature, then the sealed
    /// value. [`Envelope::unpack`] reads it back.
    pub fn pack(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(self.owner.len() + 8 + self.signature.len() + self.sealed.len());
        out.extend_from_slice(&self.owner);
        out.extend_from_slice(&self.expires.to_be_bytes());
        out.extend_from_slice(&self.signature);
        out.extend_from_slice(&self.sealed);
        out
    }

    /// Reads what [`Envelope::pack`] wrote; `None` when it is too short to hold an owner
    /// (32 bytes), an expiry and a signature (64 bytes). Nothing is verified here: the
    /// replicas verify the owner's signature as for any record.
    pub fn unpack(bytes: &[u8]) -> Option<Self> {
        let (owner, rest) = bytes.split_at_checked(32)?;
        let (expires, rest) = rest.split_at_checked(8)?;
        let (signature, sealed) = rest.split_at_checked(64)?;
        Some(Self {
            owner: owner.to_vec(),
            expires: u64::from_be_bytes(expires.try_into().ok()?),
            sealed: sealed.to_vec(),
            signature: signature.to_vec(),
        })
    }

    /// Seals `plaintext` for `key` and signs it as `signer`, valid until `expires`. The
    /// nonce comes from `rng`: a cryptographic RNG, since a repeated nonce under the
    /// namespace's seal key would expose both plaintexts.
    pub fn seal(
        keys: &NamespaceKeys,
        signer: &Identity,
        key: &RecordKey,
        expires: u64,
        plaintext: &[u8],
        rng: &mut impl rand::CryptoRng,
    ) -> Result<Self, crate::Error> {
        let owner = *signer.peer_id().as_bytes();
        let mut nonce = [0u8; NONCE_LEN];
        rng.fill_bytes(&mut nonce);
        let cipher = ChaCha20Poly1305::new(&keys.seal_key.into());
        let aad = associated_data(key, &owner, expires);
        let ciphertext = cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plaintext,
                    aad: &aad,
                },
            )
            .map_err(|_| crate::Error::Random)?;
        let mut sealed = nonce.to_vec();
        sealed.extend_from_slice(&ciphertext);
        let signature = signer.sign(&signed_message(key, &owner, expires, &sealed));
        Ok(Self {
            owner: owner.to_vec(),
            expires,
            sealed,
            signature: signature.to_vec(),
        })
    }

    /// The owner's key, if well formed.
    pub fn owner(&self) -> Option<OwnerKey> {
        self.owner.as_slice().try_into().ok()
    }

    /// What a replica checks: sizes, the owner's signature over this key, and that the
    /// expiry is in the future but not beyond [`MAX_TTL`] (plus clock skew).
    pub fn verify(&self, key: &RecordKey, now_unix: u64) -> Result<OwnerKey, RecordError> {
        let owner = self.owner().ok_or(RecordError::Malformed)?;
        let signature: [u8; 64] = self
            .signature
            .as_slice()
            .try_into()
            .map_err(|_| RecordError::Malformed)?;
        if self.sealed.len() > MAX_SEALED_LEN || self.sealed.len() < NONCE_LEN + 16 {
            return Err(RecordError::Malformed);
        }
        let verifying = VerifyingKey::from_bytes(&owner).map_err(|_| RecordError::Malformed)?;
        verifying
            .verify(
                &signed_message(key, &owner, self.expires, &self.sealed),
                &Signature::from_bytes(&signature),
            )
            .map_err(|_| RecordError::BadSignature)?;
        if self.expires <= now_unix || self.expires - now_unix > MAX_TTL.as_secs() + CLOCK_SKEW_SECS
        {
            return Err(RecordError::BadExpiry);
        }
        Ok(owner)
    }

    /// What a member checks: everything [`Envelope::verify`] does, then the seal.
    pub fn open(
        &self,
        keys: &NamespaceKeys,
        key: &RecordKey,
        now_unix: u64,
    ) -> Result<(OwnerKey, Vec<u8>), RecordError> {
        let owner = self.verify(key, now_unix)?;
        let (nonce, ciphertext) = self.sealed.split_at(NONCE_LEN);
        let cipher = ChaCha20Poly1305::new(&keys.seal_key.into());
        let aad = associated_data(key, &owner, self.expires);
        let plaintext = cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| RecordError::BadSeal)?;
        Ok((owner, plaintext))
    }

    /// What a member reads: the envelope opened ([`Envelope::open`]) and its plaintext
    /// decoded as `T`.
    pub fn read<T: for<'de> Deserialize<'de>>(
        &self,
        keys: &NamespaceKeys,
        key: &RecordKey,
        now_unix: u64,
    ) -> Result<(OwnerKey, T), RecordError> {
        let (owner, plain) = self.open(keys, key, now_unix)?;
        Ok((owner, decode(&plain)?))
    }
}

fn associated_data(key: &RecordKey, owner: &OwnerKey, expires: u64) -> Vec<u8> {
    let mut aad = Vec::with_capacity(SIGN_DOMAIN.len() + 72);
    aad.extend_from_slice(SIGN_DOMAIN);
    aad.extend_from_slice(key);
    aad.extend_from_slice(owner);
    aad.extend_from_slice(&expires.to_be_bytes());
    aad
}

fn signed_message(key: &RecordKey, owner: &OwnerKey, expires: u64, sealed: &[u8]) -> Vec<u8> {
    let mut m = associated_data(key, owner, expires);
    m.extend_from_slice(sealed);
    m
}

/// Counters of one replica.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StoreStats {
    /// Requests refused: malformed keys, bad signatures, bad expiry, oversized values.
    pub rejected: u64,
    /// Leases granted or renewed.
    pub granted: u64,
    /// Claims refused because another owner holds the key.
    pub held: u64,
    /// Requests refused by a quota or rate limit, by reason ([`crate::quota`]).
    pub refusals: Refusals,
    /// Leases taken from their holder for a claim with priority: a pinned address or a
    /// certificate's name claimed by its holder ([`certified`]).
    pub preempted: u64,
    /// Records and group entries dropped because their owner was revoked.
    pub revoked_dropped: u64,
}

/// A record kept: the owner's envelope, its (verified) owner, the peer that placed it and
/// the namespace it came in (for the quotas).
struct Stored {
    envelope: Envelope,
    owner: OwnerKey,
    via: OwnerKey,
    ns: Option<NamespaceTag>,
}

/// One member's entry in a group.
struct Entry {
    envelope: Envelope,
    until: Instant,
    via: OwnerKey,
    ns: Option<NamespaceTag>,
}

/// Who stands for a requester without an Ed25519 peer id in quotas and rates: all such
/// peers share one allowance.
const ANONYMOUS: OwnerKey = [0; 32];

/// The records this agent keeps as a replica, for every namespace (it reads none of them),
/// within the quotas of [`crate::quota`]: per owner, per requesting peer, per group and in
/// total, and a request rate per peer.
#[derive(Default)]
pub struct RecordStore {
    leases: Replica<RecordKey, OwnerKey>,
    values: HashMap<RecordKey, Stored>,
    groups: HashMap<RecordKey, HashMap<OwnerKey, Entry>>,
    /// Records held per owner and per placing peer (counted over `values`).
    records_held: Holdings,
    /// Group entries held per owner and per placing peer (counted over `groups`).
    entries_held: Holdings,
    rates: RateLimiter,
    /// Request rates per namespace, over all its members.
    ns_rates: RateLimiter<NamespaceTag>,
    /// This agent's own key: its own requests are not rate limited.
    local: Option<OwnerKey>,
    stats: StoreStats,
}

impl RecordStore {
    /// The store of the agent whose key is `local` (its own requests skip the rate limit).
    pub fn new(local: Option<OwnerKey>) -> Self {
        Self {
            local,
            ..Self::default()
        }
    }

    /// A store without request rates, for tests of the quotas behind them.
    #[cfg(test)]
    pub(crate) fn without_rates() -> Self {
        Self {
            rates: RateLimiter::new(u32::MAX, u32::MAX),
            ns_rates: RateLimiter::new(u32::MAX, u32::MAX),
            ..Self::default()
        }
    }

    /// Answers `request` from the peer whose Ed25519 key is `requester` (authenticated by
    /// its connection), outside any namespace's quota (simulations and tests of one
    /// namespace). `now_unix` is the wall clock, for envelope expiry.
    pub fn handle(
        &mut self,
        now: Instant,
        now_unix: u64,
        requester: Option<OwnerKey>,
        request: RecordRequest,
    ) -> RecordResponse {
        self.handle_in(now, now_unix, requester, None, request)
    }

    /// Answers `request` of namespace `ns` (the tag it came with, which the requester
    /// proved it is a member of) from `requester`: as [`RecordStore::handle`], and within
    /// the namespace's quotas and rate.
    pub fn handle_in(
        &mut self,
        now: Instant,
        now_unix: u64,
        requester: Option<OwnerKey>,
        ns: Option<NamespaceTag>,
        request: RecordRequest,
    ) -> RecordResponse {
        if let Some(refused) = self.limit(now, requester, ns) {
            return refused;
        }
        self.answer(now, now_unix, requester, ns, request)
    }

    /// The request rates: a refusal when `requester` (or namespace `ns`) is over its rate.
    fn limit(
        &mut self,
        now: Instant,
        requester: Option<OwnerKey>,
        ns: Option<NamespaceTag>,
    ) -> Option<RecordResponse> {
        let via = requester.unwrap_or(ANONYMOUS);
        let own = requester.is_some() && requester == self.local;
        if !own && !self.rates.allow(now, via) {
            return Some(self.refuse(Refusal::RateLimited));
        }
        if let Some(tag) = ns {
            if !own && !self.ns_rates.allow(now, tag) {
                return Some(self.refuse(Refusal::NamespaceRateLimited));
            }
        }
        None
    }

    /// Answers a request that is within the rates.
    fn answer(
        &mut self,
        now: Instant,
        now_unix: u64,
        requester: Option<OwnerKey>,
        ns: Option<NamespaceTag>,
        request: RecordRequest,
    ) -> RecordResponse {
        let via = requester.unwrap_or(ANONYMOUS);
        match request {
            // Its replica set is checked by the swarm, which knows the members
            // (`swarm::requests`); here it is a claim.
            RecordRequest::ClaimAmong { key, envelope, .. } => self.answer(
                now,
                now_unix,
                requester,
                ns,
                RecordRequest::Claim { key, envelope },
            ),
            RecordRequest::Claim { key, envelope } => {
                let Ok(key) = RecordKey::try_from(key.as_slice()) else {
                    self.stats.rejected += 1;
                    return RecordResponse::Rejected;
                };
                let owner = match envelope.verify(&key, now_unix) {
                    Ok(owner) => owner,
                    Err(_) => {
                        self.stats.rejected += 1;
                        return RecordResponse::Rejected;
                    }
                };
                let ttl = Duration::from_secs(envelope.expires - now_unix).min(MAX_TTL);
                // A renewal (or a new value for a key the owner already holds here) costs
                // no quota; a new record does.
                let renewal = self
                    .values
                    .get(&key)
                    .is_some_and(|s| s.owner == owner && self.leases.holder(now, &key).is_some());
                if !renewal {
                    if self.records_held.of_owner(&owner) >= MAX_RECORDS_PER_OWNER {
                        return self.refuse(Refusal::OwnerQuota);
                    }
                    if self.records_held.of_requester(&via) >= MAX_RECORDS_PER_REQUESTER {
                        return self.refuse(Refusal::RequesterQuota);
                    }
                    if ns.is_some_and(|t| {
                        self.records_held.of_namespace(&t) >= MAX_RECORDS_PER_NAMESPACE
                    }) {
                        return self.refuse(Refusal::NamespaceQuota);
                    }
                }
                match self
                    .leases
                    .handle(now, lease::Request::Claim { key, owner, ttl })
                {
                    lease::Response::Granted => {
                        self.stats.granted += 1;
                        lease_log("granted", &key, &owner, ttl.as_millis() as u64);
                        self.insert_value(
                            key,
                            Stored {
                                envelope,
                                owner,
                                via,
                                ns,
                            },
                        );
                        RecordResponse::Granted
                    }
                    lease::Response::Held { owner, remaining } => {
                        self.stats.held += 1;
                        lease_log("refused", &key, &owner, remaining.as_millis() as u64);
                        RecordResponse::Held {
                            owner: owner.to_vec(),
                            remaining_ms: remaining.as_millis() as u64,
                        }
                    }
                    lease::Response::Full => self.refuse(Refusal::StoreFull),
                    lease::Response::Released => RecordResponse::Rejected,
                }
            }
            RecordRequest::Release { key } => {
                let (Ok(key), Some(owner)) = (RecordKey::try_from(key.as_slice()), requester)
                else {
                    self.stats.rejected += 1;
                    return RecordResponse::Rejected;
                };
                self.leases
                    .handle(now, lease::Request::Release { key, owner });
                lease_log("released", &key, &owner, 0);
                if self.leases.holder(now, &key).is_none() {
                    self.remove_value(&key);
                }
                RecordResponse::Released
            }
            RecordRequest::Get { key } => {
                let Ok(key) = RecordKey::try_from(key.as_slice()) else {
                    self.stats.rejected += 1;
                    return RecordResponse::Rejected;
                };
                let envelope = self
                    .leases
                    .holder(now, &key)
                    .and_then(|_| self.values.get(&key))
                    .map(|s| s.envelope.clone());
                RecordResponse::Value { envelope }
            }
            RecordRequest::Join { key, envelope } => {
                let Ok(key) = RecordKey::try_from(key.as_slice()) else {
                    self.stats.rejected += 1;
                    return RecordResponse::Rejected;
                };
                let Ok(owner) = envelope.verify(&key, now_unix) else {
                    self.stats.rejected += 1;
                    return RecordResponse::Rejected;
                };
                let until = now
                    + Duration::from_secs(envelope.expires - now_unix)
                        .min(MAX_TTL)
                        .min(GROUP_ENTRY_TTL);
                self.expire_group(now, &key);
                let group = self.groups.get(&key);
                if !group.is_some_and(|g| g.contains_key(&owner)) {
                    if group.map_or(0, HashMap::len) >= MAX_GROUP_MEMBERS
                        || self.group_entries() >= MAX_GROUP_ENTRIES
                    {
                        return self.refuse(Refusal::GroupFull);
                    }
                    if self.entries_held.of_owner(&owner) >= MAX_GROUPS_PER_OWNER
                        || self.entries_held.of_requester(&via) >= MAX_GROUPS_PER_OWNER
                    {
                        return self.refuse(Refusal::GroupQuota);
                    }
                    if ns.is_some_and(|t| {
                        self.entries_held.of_namespace(&t) >= MAX_GROUP_ENTRIES_PER_NAMESPACE
                    }) {
                        return self.refuse(Refusal::NamespaceQuota);
                    }
                }
                let entry = Entry {
                    envelope,
                    until,
                    via,
                    ns,
                };
                if let Some(old) = self.groups.entry(key).or_default().insert(owner, entry) {
                    self.entries_held.remove(&owner, &old.via, old.ns.as_ref());
                }
                self.entries_held.add(owner, via, ns);
                RecordResponse::Joined
            }
            RecordRequest::Transfer { key, envelope } => {
                self.transfer(now, now_unix, requester, &key, envelope)
            }
            RecordRequest::Members { key } => {
                let Ok(key) = RecordKey::try_from(key.as_slice()) else {
                    self.stats.rejected += 1;
                    return RecordResponse::Rejected;
                };
                let envelopes = self
                    .groups
                    .get(&key)
                    .map(|g| {
                        g.values()
                            .filter(|e| e.until > now)
                            .map(|e| e.envelope.clone())
                            .collect()
                    })
                    .unwrap_or_default();
                RecordResponse::Members { envelopes }
            }
        }
    }

    /// Forgets expired records, and peers whose request rate is back to a full burst.
    pub fn expire(&mut self, now: Instant) {
        self.leases.expire(now);
        let leases = &self.leases;
        self.values.retain(|k, _| leases.holder(now, k).is_some());
        for group in self.groups.values_mut() {
            group.retain(|_, e| e.until > now);
        }
        self.groups.retain(|_, g| !g.is_empty());
        self.recount();
        self.rates.forget_idle(now);
        self.ns_rates.forget_idle(now);
    }

    /// Counts the records and group entries per owner and per placing peer afresh.
    fn recount(&mut self) {
        self.records_held.clear();
        for stored in self.values.values() {
            self.records_held.add(stored.owner, stored.via, stored.ns);
        }
        self.entries_held.clear();
        for (owner, entry) in self.groups.values().flatten() {
            self.entries_held.add(*owner, entry.via, entry.ns);
        }
    }

    /// Drops the lapsed entries of the group at `key`.
    fn expire_group(&mut self, now: Instant, key: &RecordKey) {
        let Some(group) = self.groups.get_mut(key) else {
            return;
        };
        let lapsed: Vec<OwnerKey> = group
            .iter()
            .filter(|(_, e)| e.until <= now)
            .map(|(o, _)| *o)
            .collect();
        for owner in lapsed {
            if let Some(old) = group.remove(&owner) {
                self.entries_held.remove(&owner, &old.via, old.ns.as_ref());
            }
        }
        if group.is_empty() {
            self.groups.remove(key);
        }
    }

    fn insert_value(&mut self, key: RecordKey, stored: Stored) {
        self.remove_value(&key);
        self.records_held.add(stored.owner, stored.via, stored.ns);
        self.values.insert(key, stored);
    }

    fn remove_value(&mut self, key: &RecordKey) {
        if let Some(old) = self.values.remove(key) {
            self.records_held
                .remove(&old.owner, &old.via, old.ns.as_ref());
        }
    }

    fn refuse(&mut self, reason: Refusal) -> RecordResponse {
        self.stats.refusals.count(reason);
        RecordResponse::Refused { reason }
    }

    /// Records held for `owner`.
    pub fn records_of(&self, owner: &OwnerKey) -> usize {
        self.records_held.of_owner(owner)
    }

    /// Group entries kept, over all groups.
    pub fn group_entries(&self) -> usize {
        self.groups.values().map(HashMap::len).sum()
    }

    /// Counters.
    pub fn stats(&self) -> StoreStats {
        self.stats
    }

    /// Keys held (not expired).
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// No records held.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests start the clock
mod tests {
    use super::*;

    #[test]
    fn a_packed_envelope_unpacks_and_a_short_one_does_not() {
        let e = Envelope {
            owner: vec![7; 32],
            expires: 1_900_000_000,
            sealed: vec![1, 2, 3, 4, 5],
            signature: vec![9; 64],
        };
        let packed = e.pack();
        assert_eq!(Envelope::unpack(&packed), Some(e));
        assert_eq!(Envelope::unpack(&packed[..100]), None);
        assert_eq!(Envelope::unpack(&[]), None);
    }

    const NOW: u64 = 1_800_000_000;

    fn keys(secret: &[u8]) -> NamespaceKeys {
        NamespaceKeys::derive("lab", secret)
    }

    fn rng() -> rand::rngs::StdRng {
        rand::SeedableRng::from_seed([9; 32])
    }

    fn member(seed: u8) -> Identity {
        Identity::from_seed([seed; 32])
    }

    fn info() -> Vec<u8> {
        encode(&MemberInfo {
            endpoints: vec!["10.0.0.1:7400".parse().unwrap()],
            name: None,
            subject: None,
        })
    }

    #[test]
    fn keys_are_secret_and_distinct() {
        let a = keys(b"0123456789abcdef");
        let b = keys(b"0123456789abcdeX");
        let ip = Ipv4Addr::new(10, 1, 0, 5);
        assert_ne!(a.address_key(ip), b.address_key(ip));
        assert_ne!(a.address_key(ip), a.address_key(Ipv4Addr::new(10, 1, 0, 6)));
        assert_ne!(a.address_key(ip), a.settings_key());
        assert_eq!(a.address_key(ip), keys(b"0123456789abcdef").address_key(ip));
    }

    #[test]
    fn seal_open_round_trip_and_tamper() {
        let k = keys(b"0123456789abcdef");
        let key = k.address_key(Ipv4Addr::new(10, 1, 0, 5));
        let e = Envelope::seal(&k, &member(1), &key, NOW + 60, &info(), &mut rng()).unwrap();
        let (owner, plain) = e.open(&k, &key, NOW).unwrap();
        assert_eq!(owner, *member(1).peer_id().as_bytes());
        assert_eq!(decode::<MemberInfo>(&plain).unwrap().endpoints.len(), 1);

        // Another namespace's secret: the signature is fine, the seal does not open.
        let other = keys(b"0123456789abcdeX");
        assert_eq!(e.open(&other, &key, NOW), Err(RecordError::BadSeal));
        // Moved to another key.
        let key2 = k.address_key(Ipv4Addr::new(10, 1, 0, 6));
        assert_eq!(e.verify(&key2, NOW), Err(RecordError::BadSignature));
        // Claimed by someone else.
        let mut stolen = e.clone();
        stolen.owner = member(2).peer_id().as_bytes().to_vec();
        assert_eq!(stolen.verify(&key, NOW), Err(RecordError::BadSignature));
        // Expiry changed.
        let mut longer = e.clone();
        longer.expires += 1000;
        assert_eq!(longer.verify(&key, NOW), Err(RecordError::BadSignature));
        // Every bit of the ciphertext matters.
        for i in 0..e.sealed.len() {
            let mut t = e.clone();
            t.sealed[i] ^= 1;
            assert!(t.open(&k, &key, NOW).is_err());
        }
        // Expired, too far out, malformed.
        assert_eq!(e.verify(&key, NOW + 60), Err(RecordError::BadExpiry));
        let far =
            Envelope::seal(&k, &member(1), &key, NOW + 10 * 24 * 3600, b"x", &mut rng()).unwrap();
        assert_eq!(far.verify(&key, NOW), Err(RecordError::BadExpiry));
        let mut short = e.clone();
        short.signature.pop();
        assert_eq!(short.verify(&key, NOW), Err(RecordError::Malformed));
        let mut big = e;
        big.sealed = vec![0; MAX_SEALED_LEN + 1];
        assert_eq!(big.verify(&key, NOW), Err(RecordError::Malformed));
    }

    #[test]
    fn name_keys_are_per_name_and_namespace_and_old_records_still_decode() {
        let k = keys(b"0123456789abcdef");
        assert_ne!(k.name_key("web"), k.name_key("db"));
        assert_ne!(k.name_key("web"), keys(b"0123456789abcdeX").name_key("web"));
        assert_ne!(k.name_key("web"), k.group_key());
        // A record written before names existed has no `name`; one with a name keeps it.
        let old: MemberInfo = decode(br#"{"endpoints":["192.0.2.1:7400"]}"#).unwrap();
        assert_eq!(old.name, None);
        let named = MemberInfo {
            endpoints: old.endpoints.clone(),
            name: Some("web".into()),
            subject: None,
        };
        assert_eq!(decode::<MemberInfo>(&encode(&named)).unwrap(), named);
    }

    #[test]
    fn group_keeps_one_entry_per_member_until_it_expires() {
        let k = keys(b"0123456789abcdef");
        let key = k.group_key();
        assert_ne!(key, k.settings_key());
        // Another namespace's group lives elsewhere: broadcasts never cross over.
        assert_ne!(key, keys(b"0123456789abcdeX").group_key());
        assert_ne!(
            key,
            NamespaceKeys::derive("lab2", b"0123456789abcdef").group_key()
        );
        let t = Instant::now();
        let mut store = RecordStore::default();
        let join = |e: Envelope| RecordRequest::Join {
            key: key.to_vec(),
            envelope: e,
        };
        let members = |store: &mut RecordStore, at: Instant| match store.handle(
            at,
            NOW,
            None,
            RecordRequest::Members { key: key.to_vec() },
        ) {
            RecordResponse::Members { envelopes } => envelopes,
            other => panic!("{other:?}"),
        };
        let ea = Envelope::seal(&k, &member(1), &key, NOW + 60, &info(), &mut rng()).unwrap();
        let eb = Envelope::seal(&k, &member(2), &key, NOW + 10, &info(), &mut rng()).unwrap();
        assert_eq!(
            store.handle(t, NOW, None, join(ea.clone())),
            RecordResponse::Joined
        );
        assert_eq!(store.handle(t, NOW, None, join(eb)), RecordResponse::Joined);
        // A renewal replaces the member's entry; it does not add one.
        let ea2 = Envelope::seal(&k, &member(1), &key, NOW + 90, &info(), &mut rng()).unwrap();
        assert_eq!(
            store.handle(t, NOW, None, join(ea2)),
            RecordResponse::Joined
        );
        assert_eq!(members(&mut store, t).len(), 2);
        // An entry signed for another key, or tampered, is refused.
        let wrong = Envelope::seal(
            &k,
            &member(3),
            &k.settings_key(),
            NOW + 60,
            &info(),
            &mut rng(),
        )
        .unwrap();
        assert_eq!(
            store.handle(t, NOW, None, join(wrong)),
            RecordResponse::Rejected
        );
        let mut forged = ea;
        forged.expires += 1;
        assert_eq!(
            store.handle(t, NOW, None, join(forged)),
            RecordResponse::Rejected
        );
        // Member 2's entry lapses when its envelope does, after 10 s.
        let later = t + Duration::from_secs(11);
        assert_eq!(members(&mut store, later).len(), 1);
        store.expire(later);
        assert_eq!(store.group_entries(), 1);
        // Member 1's envelope runs 90 s, but the replica keeps it only GROUP_ENTRY_TTL after
        // the last announcement: announced again, it stays; not announced, it goes.
        let renewed = t + GROUP_ENTRY_TTL - Duration::from_secs(1);
        let ea3 = Envelope::seal(&k, &member(1), &key, NOW + 90, &info(), &mut rng()).unwrap();
        assert_eq!(
            store.handle(renewed, NOW, None, join(ea3)),
            RecordResponse::Joined
        );
        assert_eq!(members(&mut store, t + GROUP_ENTRY_TTL).len(), 1);
        assert_eq!(members(&mut store, renewed + GROUP_ENTRY_TTL).len(), 0);
        store.expire(renewed + GROUP_ENTRY_TTL);
        assert_eq!(store.group_entries(), 0);
    }

    #[test]
    fn store_is_compare_and_set_and_owner_bound() {
        let k = keys(b"0123456789abcdef");
        let key = k.address_key(Ipv4Addr::new(10, 1, 0, 5));
        let t = Instant::now();
        let mut store = RecordStore::default();
        let (a, b) = (member(1), member(2));
        let ea = Envelope::seal(&k, &a, &key, NOW + 60, &info(), &mut rng()).unwrap();
        let eb = Envelope::seal(&k, &b, &key, NOW + 60, &info(), &mut rng()).unwrap();
        let claim = |e: &Envelope| RecordRequest::Claim {
            key: key.to_vec(),
            envelope: e.clone(),
        };
        let a_key = Some(*a.peer_id().as_bytes());
        let b_key = Some(*b.peer_id().as_bytes());

        assert_eq!(
            store.handle(t, NOW, a_key, claim(&ea)),
            RecordResponse::Granted
        );
        // b cannot take it, nor delete it, whoever relays the request.
        assert!(matches!(
            store.handle(t, NOW, b_key, claim(&eb)),
            RecordResponse::Held { owner, .. } if owner == a.peer_id().as_bytes().to_vec()
        ));
        store.handle(t, NOW, b_key, RecordRequest::Release { key: key.to_vec() });
        let get = RecordRequest::Get { key: key.to_vec() };
        assert_eq!(
            store.handle(t, NOW, b_key, get.clone()),
            RecordResponse::Value {
                envelope: Some(ea.clone())
            }
        );
        // A forged envelope is rejected and counted.
        let mut forged = eb.clone();
        forged.owner = a.peer_id().as_bytes().to_vec();
        assert_eq!(
            store.handle(t, NOW, b_key, claim(&forged)),
            RecordResponse::Rejected
        );
        assert_eq!(store.stats().rejected, 1);
        // The owner renews, then releases; then b can claim.
        assert_eq!(
            store.handle(t, NOW, a_key, claim(&ea)),
            RecordResponse::Granted
        );
        store.handle(t, NOW, a_key, RecordRequest::Release { key: key.to_vec() });
        assert_eq!(
            store.handle(t, NOW, b_key, get.clone()),
            RecordResponse::Value { envelope: None }
        );
        assert_eq!(
            store.handle(t, NOW, b_key, claim(&eb)),
            RecordResponse::Granted
        );
        // The lease lapses with the envelope's expiry.
        let later = t + Duration::from_secs(61);
        assert_eq!(
            store.handle(later, NOW + 61, b_key, get),
            RecordResponse::Value { envelope: None }
        );
        store.expire(later);
        assert!(store.is_empty());
    }

    #[test]
    fn malformed_requests_are_counted() {
        let mut store = RecordStore::default();
        let t = Instant::now();
        for req in [
            RecordRequest::Get { key: vec![1; 31] },
            RecordRequest::Release { key: vec![] },
            RecordRequest::Release { key: vec![0; 32] },
        ] {
            assert_eq!(store.handle(t, NOW, None, req), RecordResponse::Rejected);
        }
        assert_eq!(store.stats().rejected, 3);
    }
}
