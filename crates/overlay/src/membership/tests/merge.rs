//! Partitions that merge: each side of a split held one address for a different member;
//! once the DHTs meet, each owner's renewal meets the other's lease and the merge rule
//! (`crate::lease`, tested there on the replicas' answers) tells one to keep the address
//! and the other to yield. Here: what each member does with the verdict.

use super::*;

/// A member that holds `address` as `wanted` in a partition of its own (its own replicas).
fn owner_apart(wanted: Address, seed: u8) -> Net {
    let mut net = Net::new();
    let m = net.add(config(wanted), seed);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[m].owned(), Some(ip(10)));
    net.take_events(m);
    net
}

/// The partitions meet: a new peer brings the renewal of the own address close; its
/// answer is held back (the test gives the merge rule's verdict). Returns its token.
fn renewal_after_contact(net: &mut Net) -> Token {
    net.mute.push(keys().address_key(ip(10)));
    let now = net.now;
    net.members[0].renew_soon(now);
    net.run_for(Duration::from_secs(1));
    net.mute.clear();
    net.members[0]
        .ops
        .iter()
        .find(|(_, p)| matches!(p, Purpose::Own(a) if *a == ip(10)))
        .map(|(t, _)| *t)
        .expect("the renewal went out after the new contact")
}

fn owner_key(net: &Net) -> OwnerKey {
    *net.id(0).as_bytes()
}

/// Claims of the address carried out so far.
fn address_claims(net: &Net) -> usize {
    let key = keys().address_key(ip(10));
    net.claim_log.iter().filter(|(k, _)| *k == key).count()
}

/// Seeds 1 and 2, ordered by owner key: (keeper, yielder).
fn ranked(a: Net, b: Net) -> (Net, Net) {
    if owner_key(&a) < owner_key(&b) {
        (a, b)
    } else {
        (b, a)
    }
}

#[test]
fn the_static_owner_that_yields_reports_the_conflict_and_the_keeper_renews() {
    let a = owner_apart(Address::Static(ip(10)), 1);
    let b = owner_apart(Address::Static(ip(10)), 2);
    let (mut keeper, mut yielder) = ranked(a, b);
    let (keeper_key, yielder_key) = (owner_key(&keeper), owner_key(&yielder));

    let token = renewal_after_contact(&mut yielder);
    let now = yielder.now;
    yielder.members[0].handle_claimed(now, token, &ClaimResult::Lost(Some(keeper_key)));
    yielder.settle();
    let m = &yielder.members[0];
    assert_eq!(m.owned(), None);
    assert!(
        m.addresses().is_empty(),
        "a yielded address is not announced"
    );
    assert_eq!(m.address_conflicts(), 1);
    let error = m
        .address_error()
        .expect("the conflict is reported")
        .to_string();
    assert!(error.contains("10.201.0.10"), "{error}");
    assert!(error.contains(&keeper.id(0).to_string()), "{error}");
    let events = yielder.take_events(0);
    assert!(events.contains(&Event::AddressesChanged));
    assert!(
        !events.iter().any(|e| matches!(e, Event::Conflict(_))),
        "a confirmed static address that loses a merge is reported, not fatal"
    );

    let token = renewal_after_contact(&mut keeper);
    let now = keeper.now;
    keeper.members[0].handle_claimed(now, token, &ClaimResult::Kept(yielder_key));
    keeper.settle();
    assert_eq!(keeper.members[0].owned(), Some(ip(10)));
    assert_eq!(keeper.members[0].address_conflicts(), 0);
    let events = keeper.take_events(0);
    assert!(
        !events.iter().any(|e| matches!(
            e,
            Event::AddressWon(_) | Event::AddressesChanged | Event::Conflict(_)
        )),
        "nothing changes for the keeper: {events:?}"
    );
    // It claims again soon (the yielder gave its grants back by then), not a third of a
    // lease later.
    let claims = address_claims(&keeper);
    keeper.run_for(CLAIM_RETRY + Duration::from_millis(100));
    assert_eq!(address_claims(&keeper), claims + 1);
    assert_eq!(keeper.members[0].owned(), Some(ip(10)));

    // The yielder tries its address again only after the conflict pause.
    let claims = address_claims(&yielder);
    yielder.run_for(CONFLICT_RETRY - Duration::from_secs(2));
    assert_eq!(address_claims(&yielder), claims);
    yielder.run_for(Duration::from_secs(3));
    assert_eq!(address_claims(&yielder), claims + 1);
}

#[test]
fn the_auto_owner_that_yields_renumbers() {
    let mut a = Net::new();
    let m = a.add(
        Config {
            previous: Some(ip(10)),
            ..config(Address::Auto)
        },
        1,
    );
    a.run_for(Duration::from_secs(1));
    assert_eq!(a.members[m].owned(), Some(ip(10)));
    a.take_events(m);
    let rival: OwnerKey = *Identity::from_seed([2; 32]).peer_id().as_bytes();

    let token = renewal_after_contact(&mut a);
    let now = a.now;
    a.members[0].handle_claimed(now, token, &ClaimResult::Lost(Some(rival)));
    a.run_for(Duration::from_secs(1));
    let m = &a.members[0];
    let new = m.owned().expect("a new address");
    assert_ne!(new, ip(10));
    assert_eq!(m.address_conflicts(), 1);
    assert_eq!(m.address_error(), None);
    assert_eq!(a.won(0), Some(new));
}

#[test]
fn renewals_are_marked_and_first_claims_are_not() {
    let mut net = Net::new();
    let m = net.add(config(Address::Static(ip(10))), 1);
    net.run_for(LEASE / 3 + Duration::from_secs(1));
    assert_eq!(net.members[m].owned(), Some(ip(10)));
    let address = keys().address_key(ip(10));
    let settings = keys().settings_key();
    let marks = |key| -> Vec<bool> {
        net.claim_log
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, r)| *r)
            .collect()
    };
    // The first claim of each key is not a renewal; the ones a third of a lease later are.
    assert_eq!(marks(address), vec![false, true]);
    assert_eq!(marks(settings), vec![false, true]);
}

#[test]
fn the_namespace_record_keeper_that_yields_reads_the_other_record() {
    let mut net = owner_apart(Address::Static(ip(10)), 1);
    let key = keys().settings_key();
    net.mute.push(key);
    net.run_for(LEASE / 3 + Duration::from_secs(1));
    let token = net.members[0]
        .ops
        .iter()
        .find(|(_, p)| matches!(p, Purpose::SettingsClaim))
        .map(|(t, _)| *t)
        .expect("the keeper renews the namespace record");
    assert_eq!(
        net.claim_log.iter().rev().find(|(k, _)| *k == key),
        Some(&(key, true)),
        "marked a renewal"
    );
    net.mute.clear();
    let rival = Identity::from_seed([2; 32]).peer_id();
    let now = net.now;
    net.members[0].handle_claimed(now, token, &ClaimResult::Lost(Some(*rival.as_bytes())));
    net.settle();
    // It reads the record now (it is no longer the keeper), instead of claiming again.
    assert!(net.members[0]
        .ops
        .values()
        .any(|p| matches!(p, Purpose::SettingsGet)));
    assert_eq!(net.members[0].settings_keeper(), Some(rival));
    let claims = net.claim_log.iter().filter(|(k, _)| *k == key).count();
    net.run_for(Duration::from_secs(2));
    assert_eq!(
        net.claim_log.iter().filter(|(k, _)| *k == key).count(),
        claims,
        "no claim of the record while another member keeps it"
    );
}
