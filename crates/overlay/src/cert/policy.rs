//! A namespace's policy as its authority signs it (docs/POLICY.md, "With an authority"):
//! the policy file's text, its version and the namespace, under the authority's key, so
//! any member can hand it on and none can change it or bring back an older one.
//!
//! ```text
//! policy = 0x01 || postcard(PolicyBody) || ed25519(authority, POLICY_LABEL || 0x01 || body)
//! ```
//!
//! The text is not read here (the vswitch compiles it): this is the envelope.

use serde::{Deserialize, Serialize};

use super::{decode_body, is_valid_label, Authority, AuthorityKey, Refusal, Trust};

/// Largest encoded signed policy accepted.
pub const MAX_POLICY_LEN: usize = 64 * 1024;

const POLICY_LABEL: &[u8] = b"hyphae policy";

/// What a signed policy says, as the authority signs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct PolicyBody {
    authority: [u8; 32],
    namespace: String,
    version: u64,
    issued: u64,
    text: String,
}

/// A decoded signed policy (its signature checked only if it came from
/// [`Authority::open_policy`] or [`Trust::update_policy`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedPolicy {
    body: PolicyBody,
}

impl SignedPolicy {
    /// Decodes a signed policy without checking its signature.
    pub fn decode(bytes: &[u8]) -> Result<Self, Refusal> {
        let body: PolicyBody = decode_body(bytes, MAX_POLICY_LEN)?;
        if !is_valid_label(&body.namespace) {
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

    /// The namespace it is the policy of.
    pub fn namespace(&self) -> &str {
        &self.body.namespace
    }

    /// Its version: a member keeps the highest it has seen.
    pub fn version(&self) -> u64 {
        self.body.version
    }

    /// When it was signed, Unix seconds.
    pub fn issued(&self) -> u64 {
        self.body.issued
    }

    /// The policy file's text (TOML, docs/POLICY.md).
    pub fn text(&self) -> &str {
        &self.body.text
    }
}

impl Authority {
    /// Checks `bytes` is a policy this authority signed, and decodes it (its namespace is
    /// checked by [`Trust::update_policy`]).
    pub fn open_policy(&self, bytes: &[u8]) -> Result<SignedPolicy, Refusal> {
        let policy = SignedPolicy::decode(bytes)?;
        if policy.body.authority != *self.as_bytes() {
            return Err(Refusal::WrongAuthority);
        }
        self.verify(POLICY_LABEL, bytes)?;
        Ok(policy)
    }
}

impl AuthorityKey {
    /// Signs policy `text` (checked by the caller: this does not read it) as version
    /// `version` of `namespace`'s, issued at `issued`.
    pub fn sign_policy(
        &self,
        namespace: &str,
        version: u64,
        issued: u64,
        text: &str,
    ) -> Result<Vec<u8>, String> {
        if !is_valid_label(namespace) {
            return Err(format!("'{namespace}' is not a namespace name"));
        }
        let body = PolicyBody {
            authority: *self.authority().as_bytes(),
            namespace: namespace.to_owned(),
            version,
            issued,
            text: text.to_owned(),
        };
        let bytes = self.seal(POLICY_LABEL, &body)?;
        if bytes.len() > MAX_POLICY_LEN {
            return Err(format!(
                "the signed policy is {} bytes, over {MAX_POLICY_LEN}",
                bytes.len()
            ));
        }
        Ok(bytes)
    }
}

impl Trust {
    /// The version of the signed policy held (0: none).
    pub fn policy_version(&self) -> u64 {
        self.policy.as_ref().map_or(0, |(v, _)| *v)
    }

    /// The signed policy held, as signed (to hand on to other members).
    pub fn policy(&self) -> Option<&[u8]> {
        self.policy.as_ref().map(|(_, b)| &b[..])
    }

    /// Takes a signed policy if the authority signed it for this namespace and it is newer
    /// than the one held (an older or equal version is refused: no rollback). Returns it
    /// decoded.
    pub fn update_policy(&mut self, bytes: &[u8]) -> Result<SignedPolicy, Refusal> {
        // The version first: a member that pushes old policies again costs no signature
        // check.
        if SignedPolicy::decode(bytes)?.version() <= self.policy_version() {
            return Err(Refusal::Outdated);
        }
        let policy = self.authority.open_policy(bytes)?;
        if policy.namespace() != self.namespace {
            return Err(Refusal::OtherNamespace);
        }
        self.policy = Some((policy.version(), bytes.to_vec()));
        Ok(policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;
    const TEXT: &str = "version = 2\ndefault = \"deny\"\n";

    #[test]
    fn a_signed_policy_opens_under_its_authority_only_and_never_rolls_back() {
        let key = AuthorityKey::from_seed([7; 32]);
        let other = AuthorityKey::from_seed([8; 32]);
        let mut trust = Trust::new("lab", key.authority());
        assert_eq!((trust.policy_version(), trust.policy()), (0, None));

        let v2 = key.sign_policy("lab", 2, NOW, TEXT).unwrap();
        let p = trust.update_policy(&v2).unwrap();
        assert_eq!((p.version(), p.namespace(), p.text()), (2, "lab", TEXT));
        assert_eq!(p.issued(), NOW);
        assert_eq!((trust.policy_version(), trust.policy()), (2, Some(&v2[..])));

        // Rollback and replay: refused, the newer one kept.
        let v1 = key.sign_policy("lab", 1, NOW, TEXT).unwrap();
        assert_eq!(trust.update_policy(&v1), Err(Refusal::Outdated));
        assert_eq!(trust.update_policy(&v2), Err(Refusal::Outdated));
        // Another authority, another namespace, a changed byte: refused.
        let forged = other.sign_policy("lab", 3, NOW, TEXT).unwrap();
        assert_eq!(trust.update_policy(&forged), Err(Refusal::WrongAuthority));
        let elsewhere = key.sign_policy("prod", 3, NOW, TEXT).unwrap();
        assert_eq!(
            trust.update_policy(&elsewhere),
            Err(Refusal::OtherNamespace)
        );
        let mut changed = key.sign_policy("lab", 3, NOW, TEXT).unwrap();
        let at = changed.len() - 70;
        changed[at] ^= 1;
        assert!(trust.update_policy(&changed).is_err());
        assert_eq!(trust.policy_version(), 2);
        // A certificate or revocation list is never a policy, even from the authority.
        let list = key.revoke(3, NOW, &[], &[]).unwrap();
        assert!(trust.update_policy(&list).is_err());

        let v3 = key.sign_policy("lab", 3, NOW, TEXT).unwrap();
        assert_eq!(trust.update_policy(&v3).map(|p| p.version()), Ok(3));
    }

    #[test]
    fn a_policy_too_large_is_not_signed_and_truncations_never_panic() {
        let key = AuthorityKey::from_seed([7; 32]);
        let big = "#".repeat(MAX_POLICY_LEN);
        assert!(key.sign_policy("lab", 1, NOW, &big).is_err());
        assert!(key.sign_policy("Not A Label", 1, NOW, TEXT).is_err());
        let good = key.sign_policy("lab", 1, NOW, TEXT).unwrap();
        for n in 0..good.len() {
            let _ = SignedPolicy::decode(&good[..n]);
        }
    }
}
