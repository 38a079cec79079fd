//! Member certificates and revocation lists of a namespace authority.
//!
//! A namespace may have an authority: an Ed25519 key kept offline, whose public part every
//! member's config names. The authority signs one certificate per member, binding the
//! member's identity (its Ed25519 public key, which is both its libp2p peer id and, in its
//! X25519 form, its tunnels' static key) to a name, groups, optional pinned addresses and a
//! validity window, for one namespace. It revokes identities and certificates with a
//! signed, versioned list.
//!
//! Encodings (docs/DECISIONS.md says why postcard):
//!
//! ```text
//! certificate      = 0x01 || postcard(CertificateBody) || ed25519(authority, CERT_LABEL || 0x01 || body)
//! revocation list  = 0x01 || postcard(RevocationBody)  || ed25519(authority, LIST_LABEL || 0x01 || body)
//! ```
//!
//! The authority also signs the namespace's policy ([`policy`]).
//!
//! The signature covers the exact bytes received (never a re-encoding), the leading byte is
//! the format version, and each kind of document has its own signing label, so a list can
//! never pass as a certificate or the other way round. Decoding is bounded: at most
//! [`MAX_CERT_LEN`] / [`MAX_LIST_LEN`] bytes, short strings of a restricted alphabet, no
//! trailing bytes.
//!
//! Everything here is pure: time comes in as Unix seconds from the caller.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use blake2::{Blake2s256, Digest};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::PeerId;

mod policy;
pub use policy::{SignedPolicy, MAX_POLICY_LEN};

/// The format version this code writes and reads.
pub const VERSION: u8 = 1;
/// Largest encoded certificate accepted.
pub const MAX_CERT_LEN: usize = 1024;
/// Largest encoded revocation list accepted.
pub const MAX_LIST_LEN: usize = 256 * 1024;
/// Most groups one certificate names.
pub const MAX_GROUPS: usize = 32;
/// Most addresses one certificate pins.
pub const MAX_ADDRESSES: usize = 16;
/// Most entries (identities and certificates) one revocation list holds.
pub const MAX_REVOKED: usize = 4096;
/// Longest namespace, member or group name, in bytes (a DNS label).
pub const MAX_NAME_LEN: usize = 63;
/// How far apart two members' clocks may be and still agree on a certificate: one is
/// accepted from this long before its start to this long after its end.
pub const CLOCK_SKEW_SECS: u64 = 60;

const CERT_LABEL: &[u8] = b"hyphae certificate";
const LIST_LABEL: &[u8] = b"hyphae revocation list";
const SIGNATURE_LEN: usize = 64;

/// Why a certificate or revocation list is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Refusal {
    /// None shown, where the namespace has an authority.
    #[error("no certificate")]
    Missing,
    /// Not a document of a format this agent reads (truncated, oversized, a field out of
    /// bounds, trailing bytes).
    #[error("malformed")]
    Malformed,
    /// A format version this agent does not know.
    #[error("unknown format version")]
    UnknownVersion,
    /// Issued by another authority than the namespace's.
    #[error("issued by another authority")]
    WrongAuthority,
    /// The signature does not verify.
    #[error("bad signature")]
    BadSignature,
    /// A certificate for another namespace.
    #[error("for another namespace")]
    OtherNamespace,
    /// A certificate for another identity than the one presenting it.
    #[error("for another identity")]
    OtherIdentity,
    /// Its validity starts in the future.
    #[error("not yet valid")]
    NotYetValid,
    /// Its validity ended.
    #[error("expired")]
    Expired,
    /// Its identity or the certificate itself is on the revocation list.
    #[error("revoked")]
    Revoked,
    /// A revocation list or policy older than (or as old as) the one held.
    #[error("not newer than the one held")]
    Outdated,
}

impl Refusal {
    /// Every reason, for counters.
    pub const ALL: [Refusal; 11] = [
        Refusal::Missing,
        Refusal::Malformed,
        Refusal::UnknownVersion,
        Refusal::WrongAuthority,
        Refusal::BadSignature,
        Refusal::OtherNamespace,
        Refusal::OtherIdentity,
        Refusal::NotYetValid,
        Refusal::Expired,
        Refusal::Revoked,
        Refusal::Outdated,
    ];

    /// A short stable name (metrics labels, status JSON).
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Malformed => "malformed",
            Refusal::UnknownVersion => "unknown_version",
            Refusal::WrongAuthority => "wrong_authority",
            Refusal::BadSignature => "bad_signature",
            Refusal::OtherNamespace => "other_namespace",
            Refusal::OtherIdentity => "other_identity",
            Refusal::NotYetValid => "not_yet_valid",
            Refusal::Expired => "expired",
            Refusal::Revoked => "revoked",
            Refusal::Outdated => "outdated",
        }
    }
}

/// What a certificate says, as the authority signs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct CertificateBody {
    authority: [u8; 32],
    namespace: String,
    identity: [u8; 32],
    name: String,
    groups: Vec<String>,
    addresses: Vec<IpAddr>,
    not_before: u64,
    not_after: u64,
}

/// What a revocation list says, as the authority signs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct RevocationBody {
    authority: [u8; 32],
    version: u64,
    issued: u64,
    identities: Vec<[u8; 32]>,
    certificates: Vec<[u8; 32]>,
}

/// The fields of a certificate to sign ([`AuthorityKey::sign`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateRequest {
    /// The namespace it admits to.
    pub namespace: String,
    /// The member's identity.
    pub identity: PeerId,
    /// The member's name in the namespace (a DNS label).
    pub name: String,
    /// Groups policy can name it by.
    pub groups: Vec<String>,
    /// Addresses it may claim; empty: any.
    pub addresses: Vec<IpAddr>,
    /// Start of its validity, Unix seconds.
    pub not_before: u64,
    /// End of its validity, Unix seconds.
    pub not_after: u64,
}

/// A namespace authority's public key: what every member's config names.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Authority(VerifyingKey);

impl Authority {
    /// Parses the config form: the public key in base64.
    pub fn from_text(text: &str) -> Result<Self, Refusal> {
        let bytes = B64.decode(text.trim()).map_err(|_| Refusal::Malformed)?;
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| Refusal::Malformed)?;
        Self::from_bytes(&bytes)
    }

    fn from_bytes(bytes: &[u8; 32]) -> Result<Self, Refusal> {
        VerifyingKey::from_bytes(bytes)
            .map(Self)
            .map_err(|_| Refusal::Malformed)
    }

    /// The raw public key.
    pub fn as_bytes(&self) -> &[u8; 32] {
        self.0.as_bytes()
    }

    /// Checks `bytes` is a certificate this authority signed, and decodes it. Nothing about
    /// its namespace, holder or time is checked here: see [`Trust::check`].
    pub fn open_certificate(&self, bytes: &[u8]) -> Result<Certificate, Refusal> {
        let cert = Certificate::decode(bytes)?;
        if cert.body.authority != *self.as_bytes() {
            return Err(Refusal::WrongAuthority);
        }
        self.verify(CERT_LABEL, bytes)?;
        Ok(cert)
    }

    /// Checks `bytes` is a revocation list this authority signed, and decodes it.
    pub fn open_revocations(&self, bytes: &[u8]) -> Result<RevocationList, Refusal> {
        let list = RevocationList::decode(bytes)?;
        if list.body.authority != *self.as_bytes() {
            return Err(Refusal::WrongAuthority);
        }
        self.verify(LIST_LABEL, bytes)?;
        Ok(list)
    }

    /// Verifies the signature at the end of `bytes` over the label and the rest.
    fn verify(&self, label: &[u8], bytes: &[u8]) -> Result<(), Refusal> {
        let split = bytes
            .len()
            .checked_sub(SIGNATURE_LEN)
            .ok_or(Refusal::Malformed)?;
        let (signed, signature) = bytes.split_at(split);
        let signature = Signature::from_slice(signature).map_err(|_| Refusal::BadSignature)?;
        let mut message = Vec::with_capacity(label.len() + signed.len());
        message.extend_from_slice(label);
        message.extend_from_slice(signed);
        // Strict: no malleable signatures, no small-order keys.
        self.0
            .verify_strict(&message, &signature)
            .map_err(|_| Refusal::BadSignature)
    }
}

impl fmt::Display for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&B64.encode(self.as_bytes()))
    }
}

impl fmt::Debug for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Authority({})", &self.to_string()[..8])
    }
}

/// A namespace authority's secret key (kept offline: only `hyphae ca` and `hyphae cert`
/// read it).
pub struct AuthorityKey(SigningKey);

impl AuthorityKey {
    /// A fresh key from `rng` (a cryptographic one: the seed is the key).
    pub fn generate(rng: &mut impl rand::CryptoRng) -> Self {
        let mut seed = [0u8; 32];
        rng.fill_bytes(&mut seed);
        Self(SigningKey::from_bytes(&seed))
    }

    /// The key with this seed.
    pub fn from_seed(seed: [u8; 32]) -> Self {
        Self(SigningKey::from_bytes(&seed))
    }

    /// The seed, for storing the key.
    pub fn seed(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// The public part.
    pub fn authority(&self) -> Authority {
        Authority(self.0.verifying_key())
    }

    /// Signs a certificate. Refuses fields a member could not use (a name or group that
    /// is not a DNS-label-like string, too many groups or addresses, an empty window).
    pub fn sign(&self, request: &CertificateRequest) -> Result<Vec<u8>, String> {
        let body = CertificateBody {
            authority: *self.authority().as_bytes(),
            namespace: request.namespace.clone(),
            identity: *request.identity.as_bytes(),
            name: request.name.clone(),
            groups: request.groups.clone(),
            addresses: request.addresses.clone(),
            not_before: request.not_before,
            not_after: request.not_after,
        };
        check_body(&body).map_err(|e| e.to_string())?;
        let bytes = self.seal(CERT_LABEL, &body)?;
        if bytes.len() > MAX_CERT_LEN {
            return Err(format!(
                "the certificate is {} bytes, over {MAX_CERT_LEN}",
                bytes.len()
            ));
        }
        Ok(bytes)
    }

    /// Signs revocation list `version`, issued at `issued`, revoking `identities` and the
    /// certificates with these fingerprints.
    pub fn revoke(
        &self,
        version: u64,
        issued: u64,
        identities: &[PeerId],
        certificates: &[[u8; 32]],
    ) -> Result<Vec<u8>, String> {
        let mut identities: Vec<[u8; 32]> = identities.iter().map(|p| *p.as_bytes()).collect();
        let mut certificates = certificates.to_vec();
        identities.sort_unstable();
        identities.dedup();
        certificates.sort_unstable();
        certificates.dedup();
        if identities.len() + certificates.len() > MAX_REVOKED {
            return Err(format!("more than {MAX_REVOKED} entries"));
        }
        let body = RevocationBody {
            authority: *self.authority().as_bytes(),
            version,
            issued,
            identities,
            certificates,
        };
        self.seal(LIST_LABEL, &body)
    }

    fn seal<T: Serialize>(&self, label: &[u8], body: &T) -> Result<Vec<u8>, String> {
        let mut bytes = vec![VERSION];
        bytes.extend(postcard::to_allocvec(body).map_err(|e| e.to_string())?);
        let mut message = label.to_vec();
        message.extend_from_slice(&bytes);
        bytes.extend_from_slice(&self.0.sign(&message).to_bytes());
        Ok(bytes)
    }
}

/// A decoded certificate (its signature checked only if it came from
/// [`Authority::open_certificate`] or [`Trust::check`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Certificate {
    body: CertificateBody,
    fingerprint: [u8; 32],
}

impl Certificate {
    /// Decodes a certificate without checking its signature (`hyphae cert show`).
    pub fn decode(bytes: &[u8]) -> Result<Self, Refusal> {
        let body: CertificateBody = decode_body(bytes, MAX_CERT_LEN)?;
        check_body(&body)?;
        Ok(Self {
            body,
            fingerprint: fingerprint(bytes),
        })
    }

    /// The authority that signed it (as it claims, until checked).
    pub fn authority(&self) -> Authority {
        // Decoding checked the key is valid.
        Authority::from_bytes(&self.body.authority)
            .unwrap_or_else(|_| unreachable!("checked when decoded"))
    }

    /// The namespace it admits to.
    pub fn namespace(&self) -> &str {
        &self.body.namespace
    }

    /// The identity it is for.
    pub fn identity(&self) -> PeerId {
        PeerId::from_bytes(self.body.identity)
            .unwrap_or_else(|_| unreachable!("checked when decoded"))
    }

    /// The member's name.
    pub fn name(&self) -> &str {
        &self.body.name
    }

    /// The member's groups.
    pub fn groups(&self) -> &[String] {
        &self.body.groups
    }

    /// The addresses it may claim; empty: any.
    pub fn addresses(&self) -> &[IpAddr] {
        &self.body.addresses
    }

    /// Whether it allows claiming `address` (it pins none, or this one).
    pub fn allows_address(&self, address: IpAddr) -> bool {
        self.body.addresses.is_empty() || self.body.addresses.contains(&address)
    }

    /// Start of its validity, Unix seconds.
    pub fn not_before(&self) -> u64 {
        self.body.not_before
    }

    /// End of its validity, Unix seconds.
    pub fn not_after(&self) -> u64 {
        self.body.not_after
    }

    /// BLAKE2s-256 of its encoding: what a revocation list names it by.
    pub fn fingerprint(&self) -> [u8; 32] {
        self.fingerprint
    }
}

/// A decoded revocation list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevocationList {
    body: RevocationBody,
}

impl RevocationList {
    /// Decodes a list without checking its signature.
    pub fn decode(bytes: &[u8]) -> Result<Self, Refusal> {
        let body: RevocationBody = decode_body(bytes, MAX_LIST_LEN)?;
        if body.identities.len() + body.certificates.len() > MAX_REVOKED {
            return Err(Refusal::Malformed);
        }
        Authority::from_bytes(&body.authority)?;
        Ok(Self { body })
    }

    /// The authority that signed it (as it claims, until checked).
    pub fn authority(&self) -> Authority {
        Authority::from_bytes(&self.body.authority)
            .unwrap_or_else(|_| unreachable!("checked when decoded"))
    }

    /// Its version: a member keeps the highest it has seen.
    pub fn version(&self) -> u64 {
        self.body.version
    }

    /// When it was issued, Unix seconds.
    pub fn issued(&self) -> u64 {
        self.body.issued
    }

    /// The identities it revokes.
    pub fn identities(&self) -> impl Iterator<Item = &[u8; 32]> {
        self.body.identities.iter()
    }

    /// The certificate fingerprints it revokes.
    pub fn certificates(&self) -> impl Iterator<Item = &[u8; 32]> {
        self.body.certificates.iter()
    }
}

/// What one namespace with an authority trusts: the authority, its revocation list (the
/// newest seen), and the namespace's name.
#[derive(Debug, Clone)]
pub struct Trust {
    namespace: String,
    authority: Authority,
    version: u64,
    revoked_identities: HashSet<[u8; 32]>,
    revoked_certificates: HashSet<[u8; 32]>,
    list: Option<Vec<u8>>,
    /// The newest signed policy seen: its version and bytes.
    policy: Option<(u64, Vec<u8>)>,
}

impl Trust {
    /// Namespace `namespace` under `authority`, nothing revoked yet.
    pub fn new(namespace: &str, authority: Authority) -> Self {
        Self {
            namespace: namespace.to_owned(),
            authority,
            version: 0,
            revoked_identities: HashSet::new(),
            revoked_certificates: HashSet::new(),
            list: None,
            policy: None,
        }
    }

    /// The authority.
    pub fn authority(&self) -> Authority {
        self.authority
    }

    /// The version of the revocation list held (0: none).
    pub fn revocations_version(&self) -> u64 {
        self.version
    }

    /// The revocation list held, as signed (to hand on to other members).
    pub fn revocations(&self) -> Option<&[u8]> {
        self.list.as_deref()
    }

    /// The identities the list held revokes outright.
    pub fn revoked_identities(&self) -> impl Iterator<Item = &[u8; 32]> {
        self.revoked_identities.iter()
    }

    /// Whether the list held revokes `identity` outright.
    pub fn is_revoked(&self, identity: &PeerId) -> bool {
        self.revoked_identities.contains(identity.as_bytes())
    }

    /// Takes a revocation list if the authority signed it and it is newer than the one
    /// held. Returns it decoded: the caller cuts off who it revokes.
    pub fn update(&mut self, bytes: &[u8]) -> Result<RevocationList, Refusal> {
        // The version first: a member that pushes old lists again costs no signature check.
        if RevocationList::decode(bytes)?.version() <= self.version {
            return Err(Refusal::Outdated);
        }
        let list = self.authority.open_revocations(bytes)?;
        self.version = list.version();
        self.revoked_identities = list.body.identities.iter().copied().collect();
        self.revoked_certificates = list.body.certificates.iter().copied().collect();
        self.list = Some(bytes.to_vec());
        Ok(list)
    }

    /// Checks that `bytes` is a certificate admitting `identity` to this namespace at
    /// `now` (Unix seconds): signed by the authority, for this namespace and identity,
    /// within its window (give or take [`CLOCK_SKEW_SECS`]), not revoked.
    pub fn check(&self, bytes: &[u8], identity: &PeerId, now: u64) -> Result<Certificate, Refusal> {
        let cert = self.authority.open_certificate(bytes)?;
        if cert.namespace() != self.namespace {
            return Err(Refusal::OtherNamespace);
        }
        if cert.body.identity != *identity.as_bytes() {
            return Err(Refusal::OtherIdentity);
        }
        self.check_current(&cert, now)?;
        Ok(cert)
    }

    /// Checks that a certificate accepted before is still valid at `now` and not revoked
    /// by the list held now.
    pub fn check_current(&self, cert: &Certificate, now: u64) -> Result<(), Refusal> {
        if now.saturating_add(CLOCK_SKEW_SECS) < cert.not_before() {
            return Err(Refusal::NotYetValid);
        }
        if now > cert.not_after().saturating_add(CLOCK_SKEW_SECS) {
            return Err(Refusal::Expired);
        }
        if self.revoked_identities.contains(&cert.body.identity)
            || self.revoked_certificates.contains(&cert.fingerprint)
        {
            return Err(Refusal::Revoked);
        }
        Ok(())
    }
}

/// BLAKE2s-256 of a document's bytes.
pub fn fingerprint(bytes: &[u8]) -> [u8; 32] {
    Blake2s256::digest(bytes).into()
}

/// The body of a signed document: version byte, postcard body, signature; bounded.
fn decode_body<T: for<'de> Deserialize<'de>>(bytes: &[u8], max: usize) -> Result<T, Refusal> {
    if bytes.len() > max || bytes.len() < 1 + SIGNATURE_LEN {
        return Err(Refusal::Malformed);
    }
    if bytes[0] != VERSION {
        return Err(Refusal::UnknownVersion);
    }
    let body = &bytes[1..bytes.len() - SIGNATURE_LEN];
    match postcard::take_from_bytes::<T>(body) {
        Ok((value, [])) => Ok(value),
        _ => Err(Refusal::Malformed),
    }
}

/// A name, member name or group: 1 to [`MAX_NAME_LEN`] bytes of lowercase ASCII letters,
/// digits, `-`, `_` and `.` (printable anywhere, a DNS label for member names).
pub fn is_valid_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

fn check_body(body: &CertificateBody) -> Result<(), Refusal> {
    let labels_ok = is_valid_label(&body.namespace)
        && is_valid_label(&body.name)
        && body.groups.len() <= MAX_GROUPS
        && body.groups.iter().all(|g| is_valid_label(g));
    if !labels_ok
        || body.addresses.len() > MAX_ADDRESSES
        || body.not_before > body.not_after
        || PeerId::from_bytes(body.identity).is_err()
    {
        return Err(Refusal::Malformed);
    }
    Authority::from_bytes(&body.authority)?;
    Ok(())
}

/// The text form of a signed document: a header line, the base64 bytes in lines of 64,
/// a footer line.
pub fn armor(kind: &str, bytes: &[u8]) -> String {
    let b64 = B64.encode(bytes);
    let mut out = format!("-----BEGIN HYPHAE {kind}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END HYPHAE {kind}-----\n"));
    out
}

/// The bytes of a document in [`armor`]ed text (or bare base64).
pub fn unarmor(text: &str) -> Result<Vec<u8>, Refusal> {
    let b64: String = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("-----"))
        .collect();
    B64.decode(b64).map_err(|_| Refusal::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Identity;

    const NOW: u64 = 1_800_000_000;
    const DAY: u64 = 86_400;

    fn authority(seed: u8) -> AuthorityKey {
        AuthorityKey::from_seed([seed; 32])
    }

    fn member(seed: u8) -> PeerId {
        Identity::from_seed([seed; 32]).peer_id()
    }

    fn request(identity: PeerId) -> CertificateRequest {
        CertificateRequest {
            namespace: "lab".into(),
            identity,
            name: "alpha".into(),
            groups: vec!["web".into(), "ops".into()],
            addresses: vec!["10.203.0.5".parse().unwrap()],
            not_before: NOW - DAY,
            not_after: NOW + 30 * DAY,
        }
    }

    fn trust(ca: &AuthorityKey) -> Trust {
        Trust::new("lab", ca.authority())
    }

    #[test]
    fn a_signed_certificate_admits_its_member_and_reads_back() {
        let ca = authority(1);
        let id = member(2);
        let bytes = ca.sign(&request(id)).unwrap();
        let cert = trust(&ca).check(&bytes, &id, NOW).unwrap();
        assert_eq!(cert.name(), "alpha");
        assert_eq!(cert.groups(), ["web", "ops"]);
        assert_eq!(cert.identity(), id);
        assert_eq!(cert.namespace(), "lab");
        assert_eq!(cert.authority(), ca.authority());
        assert!(cert.allows_address("10.203.0.5".parse().unwrap()));
        assert!(!cert.allows_address("10.203.0.6".parse().unwrap()));
        assert_eq!(cert.fingerprint(), fingerprint(&bytes));
        // Compact: well under one datagram.
        assert!(bytes.len() < 250, "{} bytes", bytes.len());
        // Text form round trip.
        let text = armor("CERTIFICATE", &bytes);
        assert_eq!(unarmor(&text).unwrap(), bytes);
        assert_eq!(
            Authority::from_text(&ca.authority().to_string()).unwrap(),
            ca.authority()
        );
    }

    #[test]
    fn every_refusal_reason() {
        let ca = authority(1);
        let id = member(2);
        let good = ca.sign(&request(id)).unwrap();
        let t = trust(&ca);

        // Another authority signed it.
        let foreign = authority(9).sign(&request(id)).unwrap();
        assert_eq!(t.check(&foreign, &id, NOW), Err(Refusal::WrongAuthority));
        // The right authority named, another key signed: a forged issuer field.
        let mut forged = foreign.clone();
        forged[1..33].copy_from_slice(ca.authority().as_bytes());
        assert_eq!(t.check(&forged, &id, NOW), Err(Refusal::BadSignature));
        // Any flipped bit in the body or the signature.
        for i in [5, good.len() / 2, good.len() - 70, good.len() - 1] {
            let mut bad = good.clone();
            bad[i] ^= 0x01;
            assert!(t.check(&bad, &id, NOW).is_err(), "bit at {i}");
        }
        // Another namespace of the same authority.
        let prod = ca
            .sign(&CertificateRequest {
                namespace: "prod".into(),
                ..request(id)
            })
            .unwrap();
        assert_eq!(t.check(&prod, &id, NOW), Err(Refusal::OtherNamespace));
        // Someone else's certificate.
        assert_eq!(t.check(&good, &member(3), NOW), Err(Refusal::OtherIdentity));
        // Time, with the skew tolerance at both ends.
        let start = NOW - DAY;
        let end = NOW + 30 * DAY;
        assert!(t.check(&good, &id, start - CLOCK_SKEW_SECS).is_ok());
        assert_eq!(
            t.check(&good, &id, start - CLOCK_SKEW_SECS - 1),
            Err(Refusal::NotYetValid)
        );
        assert!(t.check(&good, &id, end + CLOCK_SKEW_SECS).is_ok());
        assert_eq!(
            t.check(&good, &id, end + CLOCK_SKEW_SECS + 1),
            Err(Refusal::Expired)
        );
        // Unknown version, truncated, trailing bytes, empty.
        let mut v2 = good.clone();
        v2[0] = 2;
        assert_eq!(t.check(&v2, &id, NOW), Err(Refusal::UnknownVersion));
        assert_eq!(t.check(&good[..40], &id, NOW), Err(Refusal::Malformed));
        assert_eq!(t.check(&[], &id, NOW), Err(Refusal::Malformed));
        let mut long = good.clone();
        long.insert(good.len() - SIGNATURE_LEN, 0);
        assert_eq!(t.check(&long, &id, NOW), Err(Refusal::Malformed));
        // A revocation list is not a certificate, even from the right authority.
        let list = ca.revoke(1, NOW, &[], &[]).unwrap();
        assert!(t.check(&list, &id, NOW).is_err());
        assert!(t.check(&good, &id, NOW).is_ok());
    }

    #[test]
    fn revocation_by_identity_or_certificate_and_no_rollback() {
        let ca = authority(1);
        let (a, b) = (member(2), member(3));
        let cert_a = ca.sign(&request(a)).unwrap();
        let cert_b = ca.sign(&request(b)).unwrap();
        let mut t = trust(&ca);
        assert_eq!(t.revocations_version(), 0);

        let v1 = ca.revoke(1, NOW, &[a], &[]).unwrap();
        let list = t.update(&v1).unwrap();
        assert_eq!(list.identities().count(), 1);
        assert_eq!(t.check(&cert_a, &a, NOW), Err(Refusal::Revoked));
        assert!(t.is_revoked(&a));
        assert!(t.check(&cert_b, &b, NOW).is_ok());

        // Version 2 revokes b's certificate (b may get another one) and no longer a.
        let v2 = ca.revoke(2, NOW + 1, &[], &[fingerprint(&cert_b)]).unwrap();
        t.update(&v2).unwrap();
        assert_eq!(t.check(&cert_b, &b, NOW), Err(Refusal::Revoked));
        assert!(t.check(&cert_a, &a, NOW).is_ok());
        let renewed_b = ca
            .sign(&CertificateRequest {
                not_after: NOW + 60 * DAY,
                ..request(b)
            })
            .unwrap();
        assert!(t.check(&renewed_b, &b, NOW).is_ok());
        assert_eq!(t.revocations(), Some(&v2[..]));

        // Rolling back to version 1, or replaying version 2: refused, v2 still held.
        assert_eq!(t.update(&v1).unwrap_err(), Refusal::Outdated);
        assert_eq!(t.update(&v2).unwrap_err(), Refusal::Outdated);
        assert_eq!(t.revocations_version(), 2);
        // Another authority's list, a tampered one: refused.
        let foreign = authority(9).revoke(3, NOW, &[b], &[]).unwrap();
        assert_eq!(t.update(&foreign).unwrap_err(), Refusal::WrongAuthority);
        let mut tampered = ca.revoke(3, NOW, &[b], &[]).unwrap();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert_eq!(t.update(&tampered).unwrap_err(), Refusal::BadSignature);
        // A certificate is not a list.
        assert!(t.update(&cert_a).is_err());
        assert_eq!(t.revocations_version(), 2);
    }

    #[test]
    fn signing_refuses_what_no_member_could_use() {
        let ca = authority(1);
        let id = member(2);
        for bad in [
            CertificateRequest {
                name: "Alpha!".into(),
                ..request(id)
            },
            CertificateRequest {
                name: String::new(),
                ..request(id)
            },
            CertificateRequest {
                groups: vec!["a b".into()],
                ..request(id)
            },
            CertificateRequest {
                groups: vec!["g".into(); MAX_GROUPS + 1],
                ..request(id)
            },
            CertificateRequest {
                addresses: vec!["10.0.0.1".parse().unwrap(); MAX_ADDRESSES + 1],
                ..request(id)
            },
            CertificateRequest {
                not_before: NOW,
                not_after: NOW - 1,
                ..request(id)
            },
            CertificateRequest {
                namespace: "x".repeat(MAX_NAME_LEN + 1),
                ..request(id)
            },
        ] {
            assert!(ca.sign(&bad).is_err(), "{bad:?}");
        }
        let many: Vec<[u8; 32]> = (0..=MAX_REVOKED as u32)
            .map(|i| fingerprint(&i.to_le_bytes()))
            .collect();
        assert!(ca.revoke(1, NOW, &[], &many).is_err());
        assert!(ca.revoke(1, NOW, &[], &many[1..]).is_ok());
    }

    #[test]
    fn arbitrary_bytes_are_refused_without_panic() {
        let ca = authority(1);
        let t = trust(&ca);
        let good = ca.sign(&request(member(2))).unwrap();
        // Every prefix, and a seeded spray of mutations.
        for n in 0..good.len() {
            assert!(t.check(&good[..n], &member(2), NOW).is_err());
            let _ = Certificate::decode(&good[..n]);
            let _ = RevocationList::decode(&good[..n]);
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..2000 {
            let mut bad = good.clone();
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x as usize) % bad.len();
                bad[i] = (x >> 32) as u8;
            }
            let _ = Certificate::decode(&bad);
            let _ = RevocationList::decode(&bad);
            if bad != good {
                // A changed byte anywhere fails the signature, or the decoding first.
                assert!(t.check(&bad, &member(2), NOW).is_err());
            }
        }
    }
}
