//! Address leases: own, LAN hosts, DHCP, the namespace record.

use super::*;

/// A member whose claim of static .10 no replica answered: the overlay reports it as
/// `Lost(None)` (a claim in flight blocks its retry, so every operation is answered).
fn unanswered_static_claim(net: &mut Net) -> usize {
    net.mute.push(keys().address_key(ip(10)));
    let a = net.add(config(Address::Static(ip(10))), 1);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[a].owned(), None);
    net.mute.clear();
    let token = net.members[a]
        .ops
        .iter()
        .find(|(_, p)| matches!(p, Purpose::Own(_)))
        .map(|(t, _)| *t)
        .unwrap();
    net.members[a].handle_claimed(net.now, token, &ClaimResult::Lost(None));
    a
}

#[test]
fn a_static_claim_is_won_and_remembered() {
    let mut net = Net::new();
    let a = net.add(config(Address::Static(ip(10))), 1);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[a].owned(), Some(ip(10)));
    assert_eq!(net.members[a].addresses(), vec![ip(10)]);
    let events = net.take_events(a);
    assert!(events.contains(&Event::AddressWon(ip(10))));
    assert!(events.contains(&Event::Persist(ip(10))));
    let key = keys().address_key(ip(10));
    assert_eq!(net.holder(&key), Some(net.id(a).as_bytes().to_vec()));
}

#[test]
fn a_static_address_owned_by_another_is_refused_with_the_owners_name() {
    let mut net = Net::new();
    let a = net.add(config(Address::Static(ip(10))), 1);
    net.run_for(Duration::from_secs(1));
    let b = net.add(config(Address::Static(ip(10))), 2);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[b].owned(), None);
    let owner = net.id(a).to_string();
    let conflict = net.take_events(b).into_iter().find_map(|e| match e {
        Event::Conflict(c) => Some(c),
        _ => None,
    });
    let conflict = conflict.expect("a conflict");
    assert!(conflict.contains("10.201.0.10"), "{conflict}");
    assert!(conflict.contains(&owner), "{conflict}");
    // The first claimer keeps it.
    assert_eq!(net.members[a].owned(), Some(ip(10)));
}

#[test]
fn an_auto_claim_that_loses_takes_another_address() {
    let mut net = Net::new();
    let a = net.add(config(Address::Static(ip(10))), 1);
    net.run_for(Duration::from_secs(1));
    // b remembers 10 from an earlier life, but a holds it now.
    let mut c = config(Address::Auto);
    c.previous = Some(ip(10));
    let b = net.add(c, 2);
    net.run_for(Duration::from_secs(1));
    let got = net.members[b].owned().expect("b holds an address");
    assert_ne!(got, ip(10));
    assert!(subnet().contains(&got));
    assert_ne!(got, hyphae_vswitch::service_address(subnet()));
    assert_eq!(net.won(b), Some(got));
    assert_eq!(net.members[a].owned(), Some(ip(10)));
}

#[test]
fn an_auto_member_takes_its_previous_address_when_free() {
    let mut net = Net::new();
    let mut c = config(Address::Auto);
    c.previous = Some(ip(77));
    let a = net.add(c, 1);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[a].owned(), Some(ip(77)));
}

#[test]
fn leases_are_renewed_every_third_of_the_lease() {
    let mut net = Net::new();
    let a = net.add(config(Address::Static(ip(10))), 1);
    net.run_for(Duration::from_secs(1));
    let claims = net.replicas.claims;
    // The record's renewal comes at a third of the lease, not before (the group's
    // heartbeat comes sooner, but claims nothing).
    net.run_for(LEASE / 3 - Duration::from_secs(2));
    assert_eq!(net.replicas.claims, claims);
    net.run_for(Duration::from_secs(2));
    assert!(
        net.replicas.claims >= claims + 2,
        "address and record renewed"
    );
    // Ten leases later it still holds the address, and nobody else could take it.
    net.run_for(LEASE * 10);
    assert_eq!(net.members[a].owned(), Some(ip(10)));
    let b = net.add(config(Address::Static(ip(10))), 2);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[b].owned(), None);
}

#[test]
fn a_crashed_members_lease_lapses_and_its_address_can_be_taken() {
    let mut net = Net::new();
    let a = net.add(config(Address::Static(ip(10))), 1);
    net.run_for(Duration::from_secs(1));
    net.down[a] = true;
    // Before the lease lapses, the address is still a's.
    net.run_for(LEASE / 2);
    let early = net.add(config(Address::Static(ip(10))), 2);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[early].owned(), None);
    assert!(net.events[early]
        .iter()
        .any(|e| matches!(e, Event::Conflict(_))));
    // After it, a newcomer wins it.
    net.run_for(LEASE);
    let late = net.add(config(Address::Static(ip(10))), 3);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[late].owned(), Some(ip(10)));
}

#[test]
fn two_claimers_racing_for_one_address_end_with_distinct_addresses() {
    let mut net = Net::new();
    let mut c = config(Address::Auto);
    c.previous = Some(ip(42));
    let a = net.add(c.clone(), 1);
    let b = net.add(c, 2);
    net.run_for(Duration::from_secs(2));
    let (x, y) = (
        net.members[a].owned().unwrap(),
        net.members[b].owned().unwrap(),
    );
    assert_ne!(x, y);
    assert!(
        x == ip(42) || y == ip(42),
        "one of them got the contested address"
    );
    for (i, addr) in [(a, x), (b, y)] {
        let key = keys().address_key(addr);
        assert_eq!(net.holder(&key), Some(net.id(i).as_bytes().to_vec()));
    }
}

#[test]
fn a_claim_nobody_answers_is_retried() {
    let mut net = Net::new();
    let a = unanswered_static_claim(&mut net);
    net.run_for(CLAIM_RETRY + Duration::from_secs(1));
    assert_eq!(net.members[a].owned(), Some(ip(10)));
}

#[test]
fn a_router_claims_and_releases_its_lan_hosts() {
    let mut net = Net::new();
    let r = net.add(config(Address::None), 1);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[r].owned(), None);
    let now = net.now;
    net.members[r].add_hosted(ip(20), now);
    // Not a usable address: ignored.
    net.members[r].add_hosted(hyphae_vswitch::service_address(subnet()), now);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[r].addresses(), vec![ip(20)]);
    assert!(net.take_events(r).contains(&Event::AddressesChanged));
    let key = keys().address_key(ip(20));
    assert_eq!(net.holder(&key), Some(net.id(r).as_bytes().to_vec()));
    // Renewed while the host is there.
    net.run_for(LEASE * 3);
    assert_eq!(net.holder(&key), Some(net.id(r).as_bytes().to_vec()));
    assert!(net.members[r].remove_hosted(ip(20)));
    net.run_for(Duration::from_secs(1));
    assert!(net.members[r].addresses().is_empty());
    assert_eq!(net.holder(&key), None, "released on the replicas");
    assert!(!net.members[r].remove_hosted(ip(20)));
}

#[test]
fn a_moved_lan_hosts_address_is_handed_off_and_the_old_router_cannot_renew_it() {
    let mut net = Net::new();
    let r1 = net.add(config(Address::None), 1);
    let r2 = net.add(config(Address::None), 2);
    net.run_for(Duration::from_secs(1));
    let now = net.now;
    net.members[r1].add_hosted(ip(20), now);
    net.run_for(Duration::from_secs(1));
    let key = keys().address_key(ip(20));
    assert_eq!(net.holder(&key), Some(net.id(r1).as_bytes().to_vec()));
    net.take_events(r1);
    // Only the router hosting it can hand it off.
    let record = net.members[r2].hosted_record(ip(20), now).unwrap();
    assert!(!net.members[r2].hand_off_hosted(ip(20), record.clone()));
    assert!(net.members[r1].hand_off_hosted(ip(20), record.clone()));
    assert!(
        !net.members[r1].hand_off_hosted(ip(20), record),
        "one transfer at a time"
    );
    net.run_for(Duration::from_secs(1));
    let events = net.take_events(r1);
    assert!(events.contains(&Event::HandOff {
        address: ip(20).into(),
        done: true
    }));
    assert!(events.contains(&Event::AddressesChanged));
    assert!(net.members[r1].addresses().is_empty());
    assert_eq!(net.holder(&key), Some(net.id(r2).as_bytes().to_vec()));
    let now = net.now;
    net.members[r2].adopt_hosted(ip(20), now);
    net.settle();
    assert!(net.take_events(r2).contains(&Event::AddressesChanged));
    assert_eq!(net.members[r2].addresses(), vec![ip(20)]);
    // The new router renews it; the old one neither renews nor releases it.
    net.run_for(LEASE * 3);
    assert_eq!(net.holder(&key), Some(net.id(r2).as_bytes().to_vec()));
    assert!(!net.members[r1].remove_hosted(ip(20)));
    assert_eq!(net.holder(&key), Some(net.id(r2).as_bytes().to_vec()));
}

#[test]
fn a_hand_off_the_replicas_refuse_is_reported_and_the_old_router_keeps_trying() {
    let mut net = Net::new();
    let r1 = net.add(config(Address::None), 1);
    let r2 = net.add(config(Address::None), 2);
    let r3 = net.add(config(Address::None), 3);
    net.run_for(Duration::from_secs(1));
    let now = net.now;
    net.members[r1].add_hosted(ip(20), now);
    net.run_for(Duration::from_secs(1));
    // The replicas name another holder by the time the transfer arrives.
    let key = keys().address_key(ip(20));
    let stale = net.members[r3].hosted_record(ip(20), now).unwrap();
    net.replicas.leases.insert(key, stale);
    let record = net.members[r2].hosted_record(ip(20), now).unwrap();
    net.take_events(r1);
    assert!(net.members[r1].hand_off_hosted(ip(20), record));
    net.run_for(Duration::from_millis(100));
    assert!(net.take_events(r1).contains(&Event::HandOff {
        address: ip(20).into(),
        done: false
    }));
    assert_eq!(net.holder(&key), Some(net.id(r3).as_bytes().to_vec()));
    // Still the old router's host: it renews at once, and finds (and counts) the holder.
    assert_eq!(net.members[r1].hosted_conflicts(), 1);
    assert!(net.members[r1].addresses().is_empty());
}

#[test]
fn a_lan_host_whose_address_another_member_owns_is_reported_and_retried() {
    let mut net = Net::new();
    let a = net.add(config(Address::Static(ip(20))), 1);
    let r = net.add(config(Address::None), 2);
    net.run_for(Duration::from_secs(1));
    let now = net.now;
    net.take_events(r);
    net.members[r].add_hosted(ip(20), now);
    net.run_for(Duration::from_secs(1));
    assert!(net.members[r].addresses().is_empty());
    // Reported with the holder (the agent's handoff asks it), counted once the handoff
    // does not bring the host here.
    let holder = net.id(a);
    assert!(net.take_events(r).contains(&Event::HostedClaimed {
        address: ip(20).into(),
        outcome: HostedClaim::Held(holder)
    }));
    assert_eq!(net.members[r].hosted_conflicts(), 0);
    net.members[r].hosted_conflict();
    assert_eq!(net.members[r].hosted_conflicts(), 1);
    // a leaves: the router's retry (30 s later) wins it.
    net.members[a].leave();
    net.run_for(CONFLICT_RETRY + Duration::from_secs(1));
    assert_eq!(net.members[r].addresses(), vec![ip(20)]);
}

fn dhcp_outcomes(events: &[Event]) -> Vec<(Vec<u8>, Option<Ipv4Addr>)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Dhcp { client, address } => Some((client.clone(), *address)),
            _ => None,
        })
        .collect()
}

#[test]
fn dhcp_claims_follow_the_dhcp_lease() {
    let mut net = Net::new();
    let a = net.add(config(Address::Static(ip(30))), 1);
    let r = net.add(config(Address::None), 2);
    net.run_for(Duration::from_secs(1));
    let now = net.now;
    // The hint is free: granted.
    net.members[r].claim_for_dhcp(now, b"client-1".to_vec(), Some(ip(40)), false);
    // The hint is a's: another address, since any will do.
    net.members[r].claim_for_dhcp(now, b"client-2".to_vec(), Some(ip(30)), false);
    // The hint is a's and only it will do (a REQUEST for it): refused.
    net.members[r].claim_for_dhcp(now, b"client-3".to_vec(), Some(ip(30)), true);
    net.run_for(Duration::from_secs(1));
    let outcomes = dhcp_outcomes(&net.take_events(r));
    assert!(outcomes.contains(&(b"client-1".to_vec(), Some(ip(40)))));
    assert!(outcomes.contains(&(b"client-3".to_vec(), None)));
    let other = outcomes
        .iter()
        .find(|(c, _)| c == b"client-2")
        .and_then(|(_, a)| *a)
        .unwrap();
    assert_ne!(other, ip(30));
    assert!(net.members[r].holds(ip(40)) && net.members[r].holds(other));
    // Renewed as long as the DHCP lease lives.
    net.run_for(LEASE * 2);
    assert!(net.holder(&keys().address_key(ip(40))).is_some());
    // The client released it: the DHT lease goes too.
    assert!(net.members[r].release_dhcp(ip(40)));
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.holder(&keys().address_key(ip(40))), None);
    assert!(!net.members[r].holds(ip(40)));
    assert_eq!(net.members[a].owned(), Some(ip(30)));
}

/// A member's claim on a key it holds wins in the DHT, so its own DHCP clients are kept
/// apart by the member: 200 clients claiming at once (a rack powering on, in a /24) get
/// 200 distinct addresses, and one client's address is never granted to another.
#[test]
fn dhcp_clients_of_one_member_never_share_an_address() {
    let mut net = Net::new();
    let _a = net.add(config(Address::Static(ip(30))), 1);
    let r = net.add(config(Address::None), 2);
    net.run_for(Duration::from_secs(1));
    let now = net.now;
    // All in flight at once, the first two asking for the same address.
    net.members[r].claim_for_dhcp(now, b"first".to_vec(), Some(ip(40)), false);
    net.members[r].claim_for_dhcp(now, b"second".to_vec(), Some(ip(40)), false);
    net.members[r].claim_for_dhcp(now, b"third".to_vec(), Some(ip(40)), true);
    for i in 0..197u32 {
        net.members[r].claim_for_dhcp(now, i.to_be_bytes().to_vec(), None, false);
    }
    net.run_for(Duration::from_secs(1));
    let outcomes = dhcp_outcomes(&net.take_events(r));
    assert_eq!(outcomes.len(), 200);
    assert!(outcomes.contains(&(b"first".to_vec(), Some(ip(40)))));
    assert!(outcomes.contains(&(b"third".to_vec(), None)));
    let granted: Vec<Ipv4Addr> = outcomes.iter().filter_map(|(_, a)| *a).collect();
    let distinct: HashSet<Ipv4Addr> = granted.iter().copied().collect();
    assert_eq!(granted.len(), 199);
    assert_eq!(distinct.len(), 199, "{granted:?}");
    assert!(!distinct.contains(&ip(30)));
    assert!(distinct.iter().all(|a| net.members[r].holds(*a)));
    // Held, it is still refused to another client, and granted to its own again (a
    // client confirming its address after the member restarted asks this way).
    let now = net.now;
    net.members[r].claim_for_dhcp(now, b"fourth".to_vec(), Some(ip(40)), true);
    net.members[r].claim_for_dhcp(now, b"first".to_vec(), Some(ip(40)), true);
    net.run_for(Duration::from_secs(1));
    let outcomes = dhcp_outcomes(&net.take_events(r));
    assert!(
        outcomes.contains(&(b"fourth".to_vec(), None)),
        "{outcomes:?}"
    );
    assert!(
        outcomes.contains(&(b"first".to_vec(), Some(ip(40)))),
        "{outcomes:?}"
    );
    // Released, it is anyone's again.
    assert!(net.members[r].release_dhcp(ip(40)));
    let now = net.now;
    net.members[r].claim_for_dhcp(now, b"fourth".to_vec(), Some(ip(40)), true);
    net.run_for(Duration::from_secs(1));
    let outcomes = dhcp_outcomes(&net.take_events(r));
    assert_eq!(outcomes, vec![(b"fourth".to_vec(), Some(ip(40)))]);
}

#[test]
fn a_dhcp_host_owns_the_address_its_client_obtained() {
    let mut net = Net::new();
    let d = net.add(config(Address::Dhcp), 1);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[d].owned(), None, "nothing until the host asks");
    let now = net.now;
    net.members[d].claim_for_dhcp(now, b"host".to_vec(), Some(ip(50)), false);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[d].owned(), Some(ip(50)));
    assert!(net.members[d].release_dhcp(ip(50)));
    assert_eq!(net.members[d].owned(), None);
}

#[test]
fn a_dhcp_release_during_the_renewal_leaves_no_lease_behind() {
    let mut net = Net::new();
    let d = net.add(config(Address::Dhcp), 1);
    net.run_for(Duration::from_secs(1));
    let now = net.now;
    net.members[d].claim_for_dhcp(now, b"host".to_vec(), Some(ip(50)), false);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[d].owned(), Some(ip(50)));
    // Up to the renewal: it is carried out, its answer still on the way.
    let key = keys().address_key(ip(50));
    let renewals = |net: &Net| {
        net.claim_log
            .iter()
            .filter(|(k, r)| *k == key && *r)
            .count()
    };
    while renewals(&net) == 0 {
        let next = net.members[d].poll_timeout().expect("a renewal is due");
        net.run_until(next);
    }
    assert_eq!(net.holder(&key), Some(net.id(d).as_bytes().to_vec()));
    assert!(
        !net.in_flight.is_empty(),
        "the renewal's answer is on its way"
    );
    assert!(net.members[d].release_dhcp(ip(50)));
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[d].owned(), None);
    assert_eq!(
        net.holder(&key),
        None,
        "the late renewal was released again"
    );
}

#[test]
fn before_the_namespace_record_is_known_dhcp_is_refused() {
    let mut net = Net::new();
    let mut c = config(Address::None);
    c.subnet = None;
    let r = net.add(c, 1);
    net.run_for(Duration::from_secs(1));
    let now = net.now;
    net.members[r].claim_for_dhcp(now, b"early".to_vec(), None, false);
    net.settle();
    assert_eq!(
        dhcp_outcomes(&net.take_events(r)),
        vec![(b"early".to_vec(), None)]
    );
}

#[test]
fn a_member_without_subnet_learns_it_from_the_namespace_record() {
    let mut net = Net::new();
    let _keeper = net.add(config(Address::Static(ip(10))), 1);
    net.run_for(Duration::from_secs(1));
    let mut c = config(Address::Auto);
    c.subnet = None;
    let b = net.add(c, 2);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[b].subnet(), Some(subnet()));
    assert!(net.events[b].contains(&Event::SubnetLearned(subnet())));
    assert!(net.members[b].owned().is_some());
    // A member configured with another subnet is refused, naming the keeper.
    let mut c = config(Address::Auto);
    c.subnet = Some("10.99.0.0/16".parse().unwrap());
    let x = net.add(c, 3);
    net.run_for(Duration::from_secs(1));
    let conflict = net.events[x].iter().find_map(|e| match e {
        Event::Conflict(c) => Some(c.clone()),
        _ => None,
    });
    assert!(conflict.unwrap().contains("its subnet is 10.201.0.0/24"));
}

#[test]
fn a_multi_subnet_namespace_gives_each_member_its_subnet_and_the_others_to_route() {
    let a: Ipv4Net = "10.1.0.0/24".parse().unwrap();
    let b: Ipv4Net = "10.2.0.0/24".parse().unwrap();
    let mut net = Net::new();
    // The first member names both, and sits in the second.
    let mut c = config(Address::Static(Ipv4Addr::new(10, 2, 0, 10)));
    (c.subnet, c.subnets) = (Some(b), vec![a, b]);
    let keeper = net.add(c, 1);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[keeper].subnet(), Some(b));
    assert_eq!(net.members[keeper].routed(), &[a]);
    assert_eq!(
        net.members[keeper].owned(),
        Some(Ipv4Addr::new(10, 2, 0, 10))
    );
    // A member with no subnet configured takes the first, and routes the other.
    let mut c = config(Address::Auto);
    c.subnet = None;
    let first = net.add(c, 2);
    // One configured with only the second subnet is in it, and learns the first.
    let mut c = config(Address::Auto);
    c.subnet = Some(b);
    let second = net.add(c, 3);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[first].subnet(), Some(a));
    assert!(net.events[first].contains(&Event::SubnetLearned(a)));
    assert!(net.events[first].contains(&Event::RoutedLearned(vec![b])));
    assert!(net.members[first].owned().is_some_and(|o| a.contains(&o)));
    assert_eq!(net.members[second].subnet(), Some(b));
    assert!(net.events[second].contains(&Event::RoutedLearned(vec![a])));
    assert!(net.members[second].owned().is_some_and(|o| b.contains(&o)));
    // A subnet that is not the namespace's, or a list that differs, is refused.
    for (subnet, subnets) in [
        (Some("10.3.0.0/24".parse().unwrap()), vec![]),
        (Some(a), vec![a, "10.3.0.0/24".parse().unwrap()]),
    ] {
        let mut c = config(Address::Auto);
        (c.subnet, c.subnets) = (subnet, subnets);
        let x = net.add(c, 4);
        net.run_for(Duration::from_secs(1));
        let conflict = net.events[x].iter().find_map(|e| match e {
            Event::Conflict(c) => Some(c.clone()),
            _ => None,
        });
        let conflict = conflict.expect("refused");
        assert!(
            conflict.contains("its subnets are 10.1.0.0/24, 10.2.0.0/24"),
            "{conflict}"
        );
    }
}

#[test]
fn subnets_that_overlap_are_not_a_namespace() {
    let n = |s: &str| s.parse::<Ipv4Net>().unwrap();
    assert!(check_subnets(&[n("10.1.0.0/24"), n("10.2.0.0/24")]).is_ok());
    let err = check_subnets(&[n("10.1.0.0/16"), n("10.1.5.0/24")]).unwrap_err();
    assert!(err.contains("overlap"), "{err}");
    let err = check_subnets(&[n("10.1.5.0/24"), n("10.1.0.0/16")]).unwrap_err();
    assert!(err.contains("overlap"), "{err}");
    assert!(check_subnets(&[n("10.1.0.0/31")]).is_err());
    let many: Vec<Ipv4Net> = (0..=MAX_SUBNETS as u32)
        .map(|i| Ipv4Net::new(Ipv4Addr::from(0x0a00_0000 + (i << 8)), 24).unwrap())
        .collect();
    assert!(check_subnets(&many).unwrap_err().contains("at most"));
}

#[test]
fn an_address_not_won_says_why() {
    let mut net = Net::new();
    // No member holds the namespace record yet: nothing to claim in.
    let mut c = config(Address::Auto);
    c.subnet = None;
    let lonely = net.add(c, 9);
    net.run_for(Duration::from_secs(1));
    assert_eq!(
        net.members[lonely].address_error(),
        Some(&AddressError::NoNamespaceRecord)
    );

    // Owned by another member: named.
    let mut net = Net::new();
    let a = net.add(config(Address::Static(ip(10))), 1);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[a].address_error(), None);
    let b = net.add(config(Address::Static(ip(10))), 2);
    net.run_for(Duration::from_secs(1));
    let owned_by = AddressError::OwnedBy {
        address: ip(10),
        holder: net.id(a).to_string(),
    };
    assert_eq!(net.members[b].address_error(), Some(&owned_by));
    assert!(owned_by.to_string().contains(&net.id(a).to_string()));

    // Unanswered: retried, and forgotten once won.
    let mut net = Net::new();
    let a = unanswered_static_claim(&mut net);
    assert_eq!(
        net.members[a].address_error(),
        Some(&AddressError::Unanswered(ip(10)))
    );
    net.run_for(CLAIM_RETRY + Duration::from_secs(1));
    assert_eq!(net.members[a].owned(), Some(ip(10)));
    assert_eq!(net.members[a].address_error(), None);

    // Every usable address is taken: no free address.
    let mut net = Net::new();
    let small: Ipv4Net = "10.201.0.0/28".parse().unwrap();
    let service = hyphae_vswitch::service_address(small);
    let all_but_10: Vec<Ipv4Addr> = (1..=14)
        .map(ip)
        .filter(|&a| a != ip(10) && a != service)
        .collect();
    let mut c = config(Address::Static(ip(10)));
    c.subnet = Some(small);
    c.reserved = all_but_10.clone();
    let a = net.add(c, 1);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[a].owned(), Some(ip(10)));
    let mut c = config(Address::Auto);
    c.subnet = Some(small);
    c.reserved = all_but_10;
    let b = net.add(c, 2);
    net.run_for(Duration::from_secs(2));
    assert_eq!(net.members[b].owned(), None);
    assert_eq!(
        net.members[b].address_error(),
        Some(&AddressError::NoFreeAddress)
    );
}

#[test]
fn nothing_is_claimed_before_the_overlay_has_joined() {
    let net = Net::new();
    let identity = Identity::from_seed([1; 32]);
    let mut m = Membership::new(
        config(Address::Auto),
        identity,
        [1; 32],
        net.now,
        net.unix(),
    );
    // A new DHT peer before the bootstrap finished: no claim, no deadline.
    m.renew_soon(net.now);
    m.handle_timeout(net.now, net.unix());
    assert!(m.poll_request().is_none());
    assert_eq!(m.poll_timeout(), None);
    // Once started, the namespace record is read at once.
    m.start(net.now);
    assert_eq!(m.poll_timeout(), Some(net.now));
    m.handle_timeout(net.now, net.unix());
    assert!(matches!(m.poll_request(), Some((_, Request::Get { .. }))));
}

#[test]
fn a_newcomer_reads_the_namespace_record_before_it_claims_one() {
    let mut net = Net::new();
    let a = net.add(config(Address::Static(ip(10))), 1);
    net.run_for(Duration::from_secs(1));
    // b proposes another subnet. Its lookup might find only some of the replicas (here it
    // is driven by hand): it reads first, so it never claims the record, and the read
    // names the keeper.
    let mut c = config(Address::Auto);
    c.subnet = Some("10.99.0.0/16".parse().unwrap());
    let mut b = Membership::new(
        c,
        Identity::from_seed([2; 32]),
        [2; 32],
        net.now,
        net.unix(),
    );
    b.start(net.now);
    b.handle_timeout(net.now, net.unix());
    let (token, request) = b.poll_request().unwrap();
    let Request::Get { key } = request else {
        panic!("first a read, not {request:?}");
    };
    assert_eq!(key, keys().settings_key());
    let record = net.replicas.leases.get(&key).cloned().unwrap();
    b.handle_got(net.now, token, &[record]);
    let conflict = std::iter::from_fn(|| b.poll_event()).find_map(|e| match e {
        Event::Conflict(c) => Some(c),
        _ => None,
    });
    assert!(conflict.unwrap().contains(&net.id(a).to_string()));
    b.handle_timeout(net.now, net.unix());
    assert!(std::iter::from_fn(|| b.poll_request())
        .all(|(_, r)| !matches!(r, Request::Claim { key: k, .. } if k == key)));
}
