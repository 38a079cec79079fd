//! Claims without a lookup: the replica set computed from the members this agent knows,
//! checked by each replica ([`check_replicas`], [`Table::handle_known_replicas`]).

use super::*;

/// Members 0 to `n`, closest to `key` first.
fn by_distance(key: &RecordKey, n: u16) -> Vec<NetworkId> {
    let target = KBucketKey::new(key.to_vec());
    let mut all: Vec<NetworkId> = (0..=n).map(peer).collect();
    all.sort_by_key(|p| KBucketKey::from(*p).distance(&target));
    all
}

/// A claim of `key()` by member 0 that knows members 1 to 4: the claim and its requests.
fn started_known(
    t: &mut Table,
    t0: Instant,
    envelope: &Envelope,
) -> (OpId, Vec<(NetworkId, RecordRequest)>) {
    let op = t.start(key(), Kind::Claim(envelope.clone()));
    let requests = t.handle_known_replicas(t0, op, (1..=4).map(peer).collect(), peer(0), 0);
    (op, requests)
}

#[test]
fn a_replica_agrees_only_with_the_set_it_computes_itself() {
    let key = key();
    let all = by_distance(&key, 12);
    let set = all[..REPLICAS].to_vec();
    let me = set[2];
    let others = |except: &[NetworkId]| -> Vec<NetworkId> {
        all.iter()
            .filter(|p| **p != me && !except.contains(p))
            .copied()
            .collect()
    };
    // Knowing every member, it computes the same five.
    assert_eq!(check_replicas(&key, &set, &others(&[]), &[], me), Ok(()));
    // Knowing fewer members than the claimer changes nothing: the claimer's are added.
    assert_eq!(check_replicas(&key, &set, &[], &[], me), Ok(()));
    // A claimer that missed the closest member proposes the next one instead: the
    // replica, which knows the closest, answers with the true set.
    let mut missing_closest = all[1..=REPLICAS].to_vec();
    missing_closest.reverse();
    let disputed = check_replicas(&key, &missing_closest, &others(&[]), &[], me);
    assert_eq!(disputed, Err(set.clone()));
    // A replica not connected to the closest, but with it in its routing table without
    // knowing whether it is a member, disputes as well.
    let disputed = check_replicas(&key, &missing_closest, &others(&[all[0]]), &[all[0]], me);
    assert_eq!(disputed, Err(set.clone()));
    // ...but a replica that knows nothing of the closest agrees: only a blind spot the
    // claimer and a majority of its replicas share lets such a claim through.
    assert_eq!(
        check_replicas(&key, &missing_closest, &others(&[all[0]]), &[], me),
        Ok(())
    );
    // Duplicates, or a sixth replica, are not the set.
    let mut doubled = set.clone();
    doubled[4] = doubled[3];
    assert!(check_replicas(&key, &doubled, &others(&[]), &[], me).is_err());
    let mut six = set.clone();
    six.push(all[5]);
    assert!(check_replicas(&key, &six, &others(&[]), &[], me).is_err());
}

#[test]
fn a_claim_without_a_lookup_carries_its_set_and_ends_when_a_replica_disputes_it() {
    let (t0, mut t, envelope) = (Instant::now(), Table::default(), seal(0, &key(), WALL + 60));
    let (op, requests) = started_known(&mut t, t0, &envelope);
    assert_eq!(requests.len(), REPLICAS);
    let r: Vec<NetworkId> = requests.iter().map(|(p, _)| *p).collect();
    let set: Vec<Vec<u8>> = r.iter().map(|p| p.to_bytes()).collect();
    let expected = RecordRequest::ClaimAmong {
        key: key().to_vec(),
        envelope,
        replicas: set,
    };
    assert!(requests.iter().all(|(_, q)| *q == expected));
    t.handle_answer(t0, WALL, op, r[0], GRANTED);
    t.handle_answer(t0, WALL, op, r[1], GRANTED);
    assert!(claimed(&mut t).is_none());
    let theirs = Some(RecordResponse::Replicas {
        peers: vec![peer(9).to_bytes()],
        members: Vec::new(),
    });
    t.handle_answer(t0, WALL, op, r[2], theirs);
    // Lost at once, naming no holder (the caller claims again after a lookup), and
    // what it was granted goes back.
    assert_eq!(claimed(&mut t), Some((op, ClaimResult::Lost(None), 5, 0)));
    let mut back = releases(&mut t);
    back.sort();
    let mut expected_back = vec![(r[0], key()), (r[1], key())];
    expected_back.sort();
    assert_eq!(back, expected_back);
    assert_eq!(t.stats().replica_sets_disputed, 1);
    // A grant that comes after goes straight back too.
    t.handle_answer(t0, WALL, op, r[3], GRANTED);
    assert_eq!(releases(&mut t), vec![(r[3], key())]);
    assert!(claimed(&mut t).is_none());
}

#[test]
fn a_claim_without_a_lookup_that_every_replica_accepts_is_won_as_any_claim() {
    let (t0, mut t, envelope) = (Instant::now(), Table::default(), seal(0, &key(), WALL + 60));
    let (op, requests) = started_known(&mut t, t0, &envelope);
    for (p, _) in requests {
        t.handle_answer(t0, WALL, op, p, GRANTED);
    }
    assert_eq!(claimed(&mut t), Some((op, ClaimResult::Won, 5, 0)));
    assert!(releases(&mut t).is_empty());
    assert_eq!(t.stats().replica_sets_disputed, 0);
}

#[test]
fn a_malformed_set_is_rejected_not_disputed() {
    let key = key();
    let all = by_distance(&key, 8);
    let set: Vec<Vec<u8>> = all[..REPLICAS].iter().map(|p| p.to_bytes()).collect();
    let me = all[0];
    assert_eq!(check_claim_among(&key, &set, &[], &[], &[], me), Ok(()));
    let mut six = set.clone();
    six.push(all[6].to_bytes());
    assert_eq!(
        check_claim_among(&key, &six, &[], &[], &[], me),
        Err(RecordResponse::Rejected)
    );
    let mut garbage = set.clone();
    garbage[1] = vec![0xff; 7];
    assert_eq!(
        check_claim_among(&key, &garbage, &[], &[], &[], me),
        Err(RecordResponse::Rejected)
    );
    assert_eq!(
        check_claim_among(&key[..31], &set, &[], &[], &[], me),
        Err(RecordResponse::Rejected)
    );
    // A well-formed set this replica would not pick: its own set comes back, naming
    // what it holds outside the proposed set that is a member for sure (itself).
    let wrong: Vec<Vec<u8>> = all[1..=REPLICAS].iter().map(|p| p.to_bytes()).collect();
    let theirs = check_claim_among(&key, &wrong, &all[1..], &[], &all[1..], me);
    let mine: Vec<Vec<u8>> = all[..REPLICAS].iter().map(|p| p.to_bytes()).collect();
    assert_eq!(
        theirs,
        Err(RecordResponse::Replicas {
            peers: mine,
            members: vec![me.to_bytes()],
        })
    );
}

#[test]
fn a_dispute_names_the_closer_members_apart_from_peers_of_unknown_membership() {
    let key = key();
    let all = by_distance(&key, 9);
    // This replica is the 8th closest; the claimer proposed the 3rd to 7th.
    let me = all[8];
    let proposed: Vec<Vec<u8>> = all[2..7].iter().map(|p| p.to_bytes()).collect();
    // It has proven the closest (all[0]) a member; the 2nd is in its routing table, unproven.
    let known: Vec<NetworkId> = [&all[..1], &all[2..7]].concat();
    let unproven = vec![all[1]];
    let Err(RecordResponse::Replicas { peers, members }) =
        check_claim_among(&key, &proposed, &known, &unproven, &known, me)
    else {
        panic!("a set without the two closest is disputed");
    };
    let view: Vec<Vec<u8>> = all[..REPLICAS].iter().map(|p| p.to_bytes()).collect();
    assert_eq!(peers, view);
    assert_eq!(members, vec![all[0].to_bytes()], "the proven member only");
    // The same member, proven but absent from the routing table (it speaks no Kademlia, a
    // compromised member): disputed, not named.
    let Err(RecordResponse::Replicas { members, .. }) =
        check_claim_among(&key, &proposed, &known, &unproven, &all[2..7], me)
    else {
        panic!("a set without the two closest is disputed");
    };
    assert!(members.is_empty());
    // Knowing no member outside the set, a dispute names none.
    let Err(RecordResponse::Replicas { members, .. }) =
        check_claim_among(&key, &proposed, &all[2..7], &unproven, &all[2..7], me)
    else {
        panic!("a set without a closer peer of unknown membership is disputed");
    };
    assert!(members.is_empty());
}

#[test]
fn a_claimer_looks_up_when_its_routing_table_knows_a_closer_peer_it_has_not_proven() {
    let key = key();
    let all = by_distance(&key, 10);
    let me = all[9];
    // It knows members 1 to 8 (by distance), not the closest.
    let known: Vec<NetworkId> = all[1..9].to_vec();
    assert_eq!(
        known_replicas(&key, &known, &[], me),
        Some(all[1..=REPLICAS].to_vec())
    );
    // Its routing table holds the closest, whose membership it does not know: lookup.
    assert_eq!(known_replicas(&key, &known, &[all[0]], me), None);
    // A peer of unknown membership farther than the set changes nothing.
    assert_eq!(
        known_replicas(&key, &known, &[all[10]], me),
        Some(all[1..=REPLICAS].to_vec())
    );
}
