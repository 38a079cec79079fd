//! First claims whose lookup found fewer than [`REPLICAS`] members ([`Table::short_claim`],
//! [`Table::give_up_short`]).

use super::*;

#[test]
fn only_a_first_claim_short_of_replicas_is_short() {
    let t0 = Instant::now();
    let mut t = Table::default();
    let e = seal(0, &key(), WALL + 60);
    let claim = t.start(key(), Kind::Claim(e.clone()));
    // Two members found and this agent: three replicas, short of five.
    let two: Vec<NetworkId> = (1..=2).map(peer).collect();
    assert_eq!(t.short_claim(claim, &two, peer(0)), Some(key()));
    // Four found, or this agent listed among them too: five, or still three.
    let four: Vec<NetworkId> = (1..=4).map(peer).collect();
    assert_eq!(t.short_claim(claim, &four, peer(0)), None);
    let with_self = vec![peer(0), peer(1), peer(2)];
    assert_eq!(t.short_claim(claim, &with_self, peer(0)), Some(key()));
    // A renewal, a transfer, a read are never given up for that.
    for kind in [Kind::Renew(e.clone()), Kind::Transfer(e.clone()), Kind::Get] {
        let op = t.start(key(), kind);
        assert_eq!(t.short_claim(op, &two, peer(0)), None);
    }
    // Nor is a claim already asking its replicas, or an unknown operation.
    let asking = t.start(key(), Kind::Claim(e));
    let requests = t.handle_replicas(t0, asking, two.clone(), peer(0), 3);
    assert_eq!(
        requests.len(),
        3,
        "a set of three is asked when it is not given up"
    );
    assert_eq!(t.short_claim(asking, &two, peer(0)), None);
    t.give_up_short(asking, 3, 3);
    assert_eq!(t.stats().short_claims_given_up, 0);
    // ...and it goes on: a majority of its three wins it.
    for replica in &requests[..2] {
        t.handle_answer(t0, WALL, asking, replica.0, GRANTED);
    }
    t.handle_timeout(t0 + REQUEST_TIMEOUT);
    assert_eq!(claimed(&mut t), Some((asking, ClaimResult::Won, 3, 3)));
}

#[test]
fn a_claim_given_up_ends_lost_without_a_holder_and_asks_no_one() {
    let t0 = Instant::now();
    let mut t = Table::default();
    let op = t.start(key(), Kind::Claim(seal(0, &key(), WALL + 60)));
    t.give_up_short(op, 1, 0);
    assert_eq!(claimed(&mut t), Some((op, ClaimResult::Lost(None), 1, 0)));
    assert_eq!(t.poll_event().map(|_| ()), None, "one event");
    assert_eq!(t.poll_request().map(|_| ()), None, "no request");
    assert!(
        releases(&mut t).is_empty(),
        "nothing was granted, nothing to give back"
    );
    assert_eq!(t.stats().short_claims_given_up, 1);
    // The operation is gone: its lookup's late result and a second give-up do nothing.
    assert!(t
        .handle_replicas(t0, op, vec![peer(1)], peer(0), 1)
        .is_empty());
    t.give_up_short(op, 1, 0);
    assert_eq!(t.stats().short_claims_given_up, 1);
    assert_eq!(t.poll_event().map(|_| ()), None);
}
