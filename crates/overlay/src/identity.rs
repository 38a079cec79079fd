//! A member's long-lived identity: an Ed25519 key pair.
//!
//! The same key will name the member in the libp2p overlay (libp2p identities are Ed25519).
//! Tunnels use its X25519 form (RFC 7748 birational map, as libsodium's
//! `crypto_sign_ed25519_sk_to_curve25519`), so one key, kept in the state directory,
//! identifies a member everywhere.

use std::fmt;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ed25519_dalek::{SigningKey, VerifyingKey};

use crate::Error;

/// A member's public identity: its Ed25519 public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId([u8; 32]);

impl PeerId {
    /// Checks that the bytes are a valid Ed25519 public key.
    pub fn from_bytes(bytes: [u8; 32]) -> Result<Self, Error> {
        VerifyingKey::from_bytes(&bytes).map_err(|_| Error::BadIdentity)?;
        Ok(Self(bytes))
    }

    /// Parses the text form ([`fmt::Display`]: the public key in base64).
    pub fn from_text(text: &str) -> Result<Self, Error> {
        let bytes = B64.decode(text.trim()).map_err(|_| Error::BadIdentity)?;
        Self::from_bytes(bytes.try_into().map_err(|_| Error::BadIdentity)?)
    }

    /// The raw public key.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The X25519 public key the member's tunnels use.
    pub(crate) fn x25519(&self) -> Result<x25519_dalek::PublicKey, Error> {
        let key = VerifyingKey::from_bytes(&self.0).map_err(|_| Error::BadIdentity)?;
        Ok(x25519_dalek::PublicKey::from(
            key.to_montgomery().to_bytes(),
        ))
    }
}

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&B64.encode(self.0))
    }
}

impl fmt::Debug for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Short form: enough to tell members apart in logs.
        write!(f, "PeerId({})", &B64.encode(self.0)[..8])
    }
}

/// A member's secret identity key.
pub struct Identity {
    signing: SigningKey,
}

impl Identity {
    /// A fresh random identity from `rng` (a cryptographic one: the seed is the key).
    pub fn generate(rng: &mut impl rand::CryptoRng) -> Self {
        let mut seed = [0u8; 32];
        rng.fill_bytes(&mut seed);
        Self::from_seed(seed)
    }

    /// The identity with this 32-byte Ed25519 seed.
    pub fn from_seed(seed: [u8; 32]) -> Self {
        Self {
            signing: SigningKey::from_bytes(&seed),
        }
    }

    /// Signs `message` (Ed25519, RFC 8032).
    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        use ed25519_dalek::Signer;
        self.signing.sign(message).to_bytes()
    }

    /// The seed, for storing the identity.
    pub fn seed(&self) -> [u8; 32] {
        self.signing.to_bytes()
    }

    /// Parses the stored form: the seed in base64 on one line.
    pub fn from_text(text: &str) -> Result<Self, Error> {
        let bytes = B64.decode(text.trim()).map_err(|_| Error::BadIdentity)?;
        let seed: [u8; 32] = bytes.try_into().map_err(|_| Error::BadIdentity)?;
        Ok(Self::from_seed(seed))
    }

    /// The stored form: the seed in base64 and a newline.
    pub fn to_text(&self) -> String {
        format!("{}\n", B64.encode(self.seed()))
    }

    /// The public identity.
    pub fn peer_id(&self) -> PeerId {
        PeerId(self.signing.verifying_key().to_bytes())
    }

    /// The X25519 secret the tunnels use (the clamped scalar of the Ed25519 key).
    pub(crate) fn x25519(&self) -> x25519_dalek::StaticSecret {
        x25519_dalek::StaticSecret::from(self.signing.to_scalar_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x25519_forms_agree() {
        let a = Identity::from_seed([1; 32]);
        let b = Identity::from_seed([2; 32]);
        let ab = a.x25519().diffie_hellman(&b.peer_id().x25519().unwrap());
        let ba = b.x25519().diffie_hellman(&a.peer_id().x25519().unwrap());
        assert_eq!(ab.as_bytes(), ba.as_bytes());
        assert_eq!(
            x25519_dalek::PublicKey::from(&a.x25519()).as_bytes(),
            a.peer_id().x25519().unwrap().as_bytes()
        );
    }

    #[test]
    fn text_round_trip_and_errors() {
        let a = Identity::generate(&mut <rand::rngs::StdRng as rand::SeedableRng>::from_seed(
            [7; 32],
        ));
        let b = Identity::from_text(&a.to_text()).unwrap();
        assert_eq!(a.peer_id(), b.peer_id());
        assert_eq!(
            PeerId::from_text(&a.peer_id().to_string()).unwrap(),
            a.peer_id()
        );
        assert!(PeerId::from_text("AAAA").is_err());
        assert!(Identity::from_text("not base64!").is_err());
        assert!(Identity::from_text("AAAA").is_err());
    }

    #[test]
    fn invalid_public_keys_are_rejected() {
        // Not a point on the curve: y = 2 has no matching x on edwards25519.
        let mut bytes = [0u8; 32];
        bytes[0] = 2;
        assert!(PeerId::from_bytes(bytes).is_err());
    }
}
