//! A transfer is decided by a majority like a claim, and gives nothing back when lost.

use super::*;

fn transfer_request(to: u16) -> (Kind, RecordRequest) {
    let envelope = seal(to, &key(), WALL + 60);
    let request = RecordRequest::Transfer {
        key: key().to_vec(),
        envelope: envelope.clone(),
    };
    (Kind::Transfer(envelope), request)
}

#[test]
fn transfer_is_done_by_a_majority_of_grants() {
    let t0 = Instant::now();
    let mut t = Table::default();
    let (kind, request) = transfer_request(2);
    let op = t.start(key(), kind);
    let requests = t.handle_replicas(t0, op, (1..=4).map(peer).collect(), peer(0), 7);
    assert_eq!(requests.len(), REPLICAS);
    assert!(requests.iter().all(|(_, r)| *r == request));
    let r: Vec<NetworkId> = requests.into_iter().map(|(r, _)| r).collect();
    t.handle_answer(t0, WALL, op, r[0], GRANTED);
    t.handle_answer(t0, WALL, op, r[1], held_by(0));
    t.handle_answer(t0, WALL, op, r[2], GRANTED);
    assert!(claimed(&mut t).is_none());
    t.handle_answer(t0, WALL, op, r[3], GRANTED);
    assert_eq!(claimed(&mut t), Some((op, ClaimResult::Won, 5, 7)));
    assert!(releases(&mut t).is_empty());
}

#[test]
fn a_lost_transfer_names_the_holder_and_releases_nothing() {
    let t0 = Instant::now();
    let mut t = Table::default();
    let (kind, _) = transfer_request(2);
    let (op, r) = started(&mut t, t0, key(), kind);
    // Two replicas moved the lease; three say a third member holds it.
    t.handle_answer(t0, WALL, op, r[0], GRANTED);
    t.handle_answer(t0, WALL, op, r[1], GRANTED);
    t.handle_answer(t0, WALL, op, r[2], held_by(9));
    t.handle_answer(t0, WALL, op, r[3], held_by(9));
    t.handle_answer(t0, WALL, op, r[4], held_by(9));
    assert_eq!(
        claimed(&mut t),
        Some((op, ClaimResult::Lost(Some(owner(9))), 5, 7))
    );
    // Those grants are the new holder's to renew, not this agent's to release.
    assert!(releases(&mut t).is_empty());
    // Unanswered replicas: lost at the deadline, still nothing to release, nothing kept.
    let (kind, _) = transfer_request(2);
    let (op, r) = started(&mut t, t0, key(), kind);
    t.handle_answer(t0, WALL, op, r[0], GRANTED);
    t.handle_timeout(t0 + REQUEST_TIMEOUT);
    assert_eq!(claimed(&mut t), Some((op, ClaimResult::Lost(None), 5, 7)));
    t.handle_answer(t0, WALL, op, r[1], GRANTED);
    assert!(releases(&mut t).is_empty());
    assert_eq!(t.stats().late_grants_released, 0);
}
