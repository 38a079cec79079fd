//! Any bytes as a certificate, a revocation list or a signed policy (decoded alone, opened
//! under an authority, checked for an identity, taken as newer): a clear refusal or a
//! document, never a panic; and the announcement that carries a certificate.
#![no_main]

use hyphae_overlay::cert::{AuthorityKey, Certificate, RevocationList, SignedPolicy, Trust};
use hyphae_overlay::wire::Announce;
use hyphae_overlay::Identity;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let ca = AuthorityKey::from_seed([1; 32]);
    let member = Identity::from_seed([2; 32]).peer_id();
    if let Ok(cert) = Certificate::decode(data) {
        let _ = (cert.name(), cert.groups(), cert.identity(), cert.authority());
    }
    if let Ok(list) = RevocationList::decode(data) {
        let _ = (list.version(), list.identities().count(), list.authority());
    }
    if let Ok(policy) = SignedPolicy::decode(data) {
        let _ = (policy.version(), policy.namespace(), policy.text().len());
    }
    let mut trust = Trust::new("lab", ca.authority());
    let _ = trust.update_policy(data);
    let _ = trust.check(data, &member, 1_800_000_000);
    let _ = trust.update(data);
    let _ = Announce::parse(data);
});
