//! Any bytes as a record request from a proven member, as a replica reads it off the wire
//! (JSON, as libp2p request-response carries it): the claim-set check of a claim without a
//! lookup, then the replica store. A clear answer, never a panic.
#![no_main]

use std::time::{Duration, Instant};

use hyphae_overlay::quorum::check_claim_among;
use hyphae_overlay::records::{RecordRequest, RecordStore, ScopedRequest};
use hyphae_overlay::swarm::network_id;
use hyphae_overlay::Identity;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(scoped) = serde_json::from_slice::<ScopedRequest>(data) else {
        return;
    };
    let id = |i: u8| network_id(Identity::from_seed([i; 32]).peer_id().as_bytes());
    let (Some(me), Some(known)) = (id(1), (2..9).map(id).collect::<Option<Vec<_>>>()) else {
        return;
    };
    if let RecordRequest::ClaimAmong { key, replicas, .. } = &scoped.request {
        let _ = check_claim_among(key, replicas, &known, &known[..2], &known[2..5], me);
    }
    let local = Identity::from_seed([1; 32]);
    let mut store = RecordStore::new(Some(*local.peer_id().as_bytes()));
    let requester = *Identity::from_seed([2; 32]).peer_id().as_bytes();
    let t0 = Instant::now();
    let _ = store.handle_in(t0, 1_800_000_000, Some(requester), Some(scoped.ns), scoped.request);
    store.expire(t0 + Duration::from_secs(3600));
});
