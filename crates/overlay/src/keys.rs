//! Keys a namespace derives from its secret.
//!
//! `root = BLAKE2s-256(label || len(name) || name || secret)`, then each key is
//! `BLAKE2s-256-MAC(root, purpose)`: BLAKE2s used as a hash and as a PRF (RFC 7693), the
//! same primitive WireGuard builds its KDF from. Different names or secrets give unrelated
//! keys; none reveals the secret.

use blake2::digest::{KeyInit, Mac};
use blake2::{Blake2s256, Blake2sMac256, Digest};

/// Minimum length of a namespace secret, in bytes.
pub const MIN_SECRET_LEN: usize = 16;

/// Length of a namespace tag on the wire.
pub const TAG_LEN: usize = 8;

/// The keys of one namespace.
#[derive(Clone)]
pub struct NamespaceKeys {
    /// WireGuard pre-shared key: mixed into every tunnel handshake of the namespace.
    pub(crate) psk: [u8; 32],
    /// Names the namespace in handshake and hello messages (not secret, not guessable).
    pub(crate) tag: [u8; TAG_LEN],
    /// Authenticates hello messages.
    pub(crate) hello_key: [u8; 32],
    /// Keys the hash that names the namespace's DHT records.
    pub(crate) record_salt: [u8; 32],
    /// Encrypts the values of the namespace's DHT records (ChaCha20-Poly1305).
    pub(crate) seal_key: [u8; 32],
    /// Keys the MAC a member proves its membership with on a libp2p connection
    /// ([`crate::proof`]).
    pub(crate) proof_key: [u8; 32],
}

impl std::fmt::Debug for NamespaceKeys {
    /// The tag only: the keys are secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceKeys")
            .field("tag", &self.tag)
            .finish_non_exhaustive()
    }
}

impl NamespaceKeys {
    /// Derives the keys of namespace `name` from its secret.
    pub fn derive(name: &str, secret: &[u8]) -> Self {
        let mut h = Blake2s256::new();
        h.update(b"hyphae namespace root v1");
        h.update((name.len() as u32).to_le_bytes());
        h.update(name.as_bytes());
        h.update(secret);
        let root: [u8; 32] = h.finalize().into();
        let prf = |purpose: &[u8]| -> [u8; 32] {
            // A 32-byte key is always a valid BLAKE2s key.
            let mut mac = <Blake2sMac256 as KeyInit>::new_from_slice(&root)
                .unwrap_or_else(|_| unreachable!("32-byte key"));
            mac.update(purpose);
            mac.finalize().into_bytes().into()
        };
        let tag_full = prf(b"tag");
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&tag_full[..TAG_LEN]);
        Self {
            psk: prf(b"wireguard psk"),
            tag,
            hello_key: prf(b"hello mac"),
            record_salt: prf(b"dht record key"),
            seal_key: prf(b"dht record seal"),
            proof_key: prf(b"member proof"),
        }
    }

    /// The namespace's tag (public: it appears on the wire).
    pub fn tag(&self) -> [u8; TAG_LEN] {
        self.tag
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_depend_on_name_and_secret() {
        let a = NamespaceKeys::derive("lab", b"0123456789abcdef");
        let b = NamespaceKeys::derive("lab", b"0123456789abcdeX");
        let c = NamespaceKeys::derive("lab2", b"0123456789abcdef");
        assert_ne!(a.psk, b.psk);
        assert_ne!(a.tag, b.tag);
        assert_ne!(a.psk, c.psk);
        assert_ne!(a.psk, a.hello_key);
        assert_ne!(a.proof_key, b.proof_key);
        assert_ne!(a.proof_key, a.hello_key);
        let again = NamespaceKeys::derive("lab", b"0123456789abcdef");
        assert_eq!(a.psk, again.psk);
        assert_eq!(a.tag, again.tag);
    }
}
