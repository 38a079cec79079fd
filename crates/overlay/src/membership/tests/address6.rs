//! The own IPv6 address of a dual-stack member: the stable one first, a random one when
//! that is taken, a static one refused when another member holds it, renewed, resolved by
//! others, and given back on leave.

use std::net::{IpAddr, Ipv6Addr};

use super::*;
use crate::membership::{usable6, Address6};

fn prefix() -> ipnet::Ipv6Net {
    "fd12:3456:789a::/64".parse().unwrap()
}

fn dual(address6: Address6) -> Config {
    Config {
        prefix6: Some(prefix()),
        address6,
        ..config(Address::Auto)
    }
}

fn won6(events: &[Event]) -> Vec<Ipv6Addr> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::AddressWon6(a) => Some(*a),
            _ => None,
        })
        .collect()
}

#[test]
fn an_auto_member_holds_its_stable_ipv6_address_and_others_resolve_it() {
    let mut net = Net::new();
    let a = net.add(dual(Address6::Auto), 1);
    let b = net.add(dual(Address6::Auto), 2);
    net.run_for(Duration::from_secs(1));
    let (x, y) = (
        net.members[a].owned6().unwrap(),
        net.members[b].owned6().unwrap(),
    );
    assert_ne!(x, y);
    assert!(usable6(prefix(), x) && usable6(prefix(), y));
    assert_eq!(won6(&net.take_events(a)), vec![x]);
    // Stable: the same member (same identity) asks for the same address after a restart.
    let stable = Ipv6Addr::from(
        u128::from(prefix().network()) | u128::from(keys().interface_id(net.id(a).as_bytes())),
    );
    assert_eq!(x, stable);
    // The record names the address (resolution and certified replicas check it).
    let key = keys().address6_key(x);
    let e = net.replicas.leases.get(&key).unwrap();
    let (_, info) = e.read::<MemberInfo>(&keys(), &key, net.unix()).unwrap();
    assert_eq!(info.subject, Some(crate::records::Subject::Address6(x)));
    // B resolves A's IPv6 address to A.
    assert!(net.members[b].hold(net.now, x, b"frame"));
    net.run_for(Duration::from_millis(200));
    let resolved: Vec<_> = net
        .take_events(b)
        .into_iter()
        .filter_map(|e| match e {
            Event::Resolved(r) => Some((r.target, r.member)),
            _ => None,
        })
        .collect();
    assert_eq!(resolved, vec![(IpAddr::V6(x), net.id(a))]);
    assert_eq!(net.members[b].take_pending(&[x]), vec![b"frame".to_vec()]);
    // Renewed while held; given back when A leaves, and then nobody holds it.
    net.run_for(LEASE * 2);
    assert_eq!(net.members[a].owned6(), Some(x));
    net.members[a].leave();
    net.run_for(Duration::from_millis(200));
    assert!(!net.replicas.leases.contains_key(&key));
}

#[test]
fn an_auto_member_whose_stable_address_is_taken_picks_another() {
    let mut net = Net::new();
    let a = net.add(dual(Address6::Auto), 1);
    net.run_for(Duration::from_secs(1));
    let taken = net.members[a].owned6().unwrap();
    // B is told to want A's address as its own "stable" one: it cannot have it, and
    // ends up with another of the prefix.
    let b = net.add(dual(Address6::Static(taken)), 2);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[b].owned6(), None);
    let conflicts: Vec<String> = net
        .take_events(b)
        .into_iter()
        .filter_map(|e| match e {
            Event::Conflict(c) => Some(c),
            _ => None,
        })
        .collect();
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    assert!(
        conflicts[0].contains(&format!("IPv6 address {taken} is owned by member")),
        "{conflicts:?}"
    );
    assert!(net.members[b].address6_error().is_some());
    // An auto member whose stable address another member holds takes a random one.
    let stable3 = Ipv6Addr::from(
        u128::from(prefix().network())
            | u128::from(keys().interface_id(Identity::from_seed([3; 32]).peer_id().as_bytes())),
    );
    let z = net.add(dual(Address6::Static(stable3)), 4);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[z].owned6(), Some(stable3));
    let c = net.add(dual(Address6::Auto), 3);
    net.run_for(Duration::from_secs(1));
    let mine = net.members[c].owned6().unwrap();
    assert!(mine != stable3 && mine != taken && usable6(prefix(), mine));
}

#[test]
fn an_ipv4_only_member_claims_no_ipv6_address() {
    let mut net = Net::new();
    let a = net.add(config(Address::Auto), 1);
    let b = net.add(dual(Address6::None), 2);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[a].owned6(), None);
    assert_eq!(net.members[b].owned6(), None);
    assert!(net.members[a].owned().is_some() && net.members[b].owned().is_some());
    let unix = net.unix();
    let mut members = 0;
    for (key, e) in &net.replicas.leases {
        // (The namespace record is not a member's.)
        let Ok((_, info)) = e.read::<MemberInfo>(&keys(), key, unix) else {
            continue;
        };
        members += 1;
        assert!(
            !matches!(info.subject, Some(crate::records::Subject::Address6(_))),
            "{info:?}"
        );
    }
    assert_eq!(members, 2, "the two IPv4 addresses");
}

#[test]
fn the_own_name_stands_for_the_ipv6_address_and_the_ipv6_record_carries_the_name() {
    let mut net = Net::new();
    let a = net.add(
        Config {
            hostname: Some("web".into()),
            ..dual(Address6::Auto)
        },
        1,
    );
    net.run_for(Duration::from_secs(2));
    let six = net.members[a].owned6().unwrap();
    let unix = net.unix();
    // The name's record: both addresses.
    let key = keys().name_key("web");
    let (_, name) = net.replicas.leases[&key]
        .read::<crate::records::NameInfo>(&keys(), &key, unix)
        .unwrap();
    assert_eq!(name.address6, Some(six));
    // The IPv6 lease: the name (its PTR), though the claims raced at start.
    let key6 = keys().address6_key(six);
    let read_name = |net: &Net| {
        let (_, info) = net.replicas.leases[&key6]
            .read::<MemberInfo>(&keys(), &key6, net.unix())
            .unwrap();
        info.name
    };
    assert_eq!(read_name(&net), Some("web".to_string()));
    // Another member reads it back for ip6.arpa.
    let b = net.add(dual(Address6::Auto), 2);
    net.run_for(Duration::from_secs(1));
    net.members[b].read_holder6(six);
    net.run_for(Duration::from_millis(200));
    assert!(net.take_events(b).contains(&Event::HolderRead6 {
        address: six,
        holder: Some(Some("web".into()))
    }));
    // The name given up: the IPv6 record is sealed again without it.
    net.members[a].set_hostname(net.now, None);
    net.run_for(Duration::from_millis(500));
    assert!(
        LEASE / 3 > Duration::from_millis(500),
        "not the renewal's doing"
    );
    assert_eq!(read_name(&net), None);
}

/// A router-mode member (no IPv6 address of its own).
fn router6() -> Config {
    Config {
        prefix6: Some(prefix()),
        address6: Address6::None,
        ..config(Address::None)
    }
}

#[test]
fn a_routers_lan_hosts_ipv6_addresses_are_claimed_renewed_and_given_back() {
    let mut net = Net::new();
    let a = net.add(dual(Address6::Auto), 1);
    let r = net.add(router6(), 2);
    net.run_for(Duration::from_secs(1));
    let held = net.members[a].owned6().unwrap();
    let host = Ipv6Addr::from(u128::from(prefix().network()) | 0x50);
    net.members[r].add_hosted6(host, net.now);
    // Neither the service address, one outside the prefix, nor an address taken: claimed.
    net.members[r].add_hosted6(Ipv6Addr::from(u128::from(prefix().network()) | 1), net.now);
    net.members[r].add_hosted6("2001:db8::5".parse().unwrap(), net.now);
    net.members[r].add_hosted6(held, net.now);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[r].addresses6(), vec![host]);
    assert_eq!(net.members[r].owned6(), None);
    let events = net.take_events(r);
    assert!(events.iter().any(|e| matches!(e, Event::AddressesChanged)));
    // The refused one is reported with its holder (the agent's handoff asks it, and
    // counts the conflict if the host stays the holder's), each time it is retried.
    let refusal = Event::HostedClaimed {
        address: held.into(),
        outcome: HostedClaim::Held(net.id(a)),
    };
    let refused = |events: &[Event]| events.iter().filter(|e| **e == refusal).count();
    assert_eq!(refused(&events), 1);
    net.run_for(CONFLICT_RETRY * 3);
    assert_eq!(refused(&net.take_events(r)), 3);
    assert_eq!(net.members[r].hosted_conflicts(), 0);
    assert_eq!(net.members[a].owned6(), Some(held), "A keeps its own");
    // Renewed while the host is there.
    let key = keys().address6_key(host);
    net.run_for(LEASE * 2);
    let e = net.replicas.leases.get(&key).expect("still held");
    let (owner, info) = e.read::<MemberInfo>(&keys(), &key, net.unix()).unwrap();
    assert_eq!(owner, *net.id(r).as_bytes());
    assert_eq!(info.subject, Some(crate::records::Subject::Address6(host)));
    // The host went away: given back at once.
    assert!(net.members[r].remove_hosted6(host));
    net.run_for(Duration::from_millis(200));
    assert!(!net.replicas.leases.contains_key(&key));
    assert!(net.members[r].addresses6().is_empty());
    // On leave, every one held goes back.
    net.members[r].add_hosted6(host, net.now);
    net.run_for(Duration::from_secs(1));
    assert!(net.replicas.leases.contains_key(&key));
    net.members[r].leave();
    net.run_for(Duration::from_millis(200));
    assert!(!net.replicas.leases.contains_key(&key));
}

#[test]
fn a_dhcpv6_lease_outlives_a_quiet_host_and_a_refused_candidate_spares_a_seen_host() {
    let mut net = Net::new();
    let a = net.add(dual(Address6::Auto), 1);
    let r = net.add(router6(), 2);
    net.run_for(Duration::from_secs(1));
    let dhcp6 = |events: &[Event]| -> Vec<(Ipv6Addr, bool)> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Dhcp6 { address, won } => Some((*address, *won)),
                _ => None,
            })
            .collect()
    };
    let leased = Ipv6Addr::from(u128::from(prefix().network()) | 0x77);
    net.members[r].claim_for_dhcp6(leased, net.now);
    net.run_for(Duration::from_secs(1));
    assert_eq!(dhcp6(&net.take_events(r)), vec![(leased, true)]);
    // Asked again while held: answered at once.
    net.members[r].claim_for_dhcp6(leased, net.now);
    net.run_for(Duration::from_millis(10));
    assert_eq!(dhcp6(&net.take_events(r)), vec![(leased, true)]);
    // The host fell quiet on the LAN: the lease still holds the address.
    net.members[r].add_hosted6(leased, net.now);
    assert!(!net.members[r].remove_hosted6(leased));
    assert_eq!(net.members[r].addresses6(), vec![leased]);
    // The lease ends while another host uses the address: kept for that host.
    assert!(!net.members[r].release_dhcp6(leased, true));
    assert_eq!(net.members[r].addresses6(), vec![leased]);
    // That host goes too: given back.
    assert!(net.members[r].remove_hosted6(leased));
    net.run_for(Duration::from_millis(200));
    assert!(!net
        .replicas
        .leases
        .contains_key(&keys().address6_key(leased)));
    // A candidate A holds: refused, and nothing stays to retry.
    let held = net.members[a].owned6().unwrap();
    net.members[r].claim_for_dhcp6(held, net.now);
    net.run_for(Duration::from_secs(1));
    assert_eq!(dhcp6(&net.take_events(r)), vec![(held, false)]);
    assert!(net.members[r].addresses6().is_empty());
    net.run_for(CONFLICT_RETRY * 2);
    assert_eq!(
        net.members[r].hosted_conflicts(),
        0,
        "a candidate is no conflict"
    );
    // One the switch saw a host use stays claimed for that host (its refusal goes to the
    // handoff).
    net.members[r].add_hosted6(held, net.now);
    net.run_for(Duration::from_secs(1));
    net.members[r].claim_for_dhcp6(held, net.now);
    net.run_for(CONFLICT_RETRY * 2);
    let events = net.take_events(r);
    assert_eq!(dhcp6(&events), vec![(held, false)]);
    assert!(events.contains(&Event::HostedClaimed {
        address: held.into(),
        outcome: HostedClaim::Held(net.id(a)),
    }));
}

#[test]
fn a_moved_lan_hosts_ipv6_address_is_handed_off_and_the_old_router_cannot_renew_it() {
    let mut net = Net::new();
    let r1 = net.add(router6(), 1);
    let r2 = net.add(router6(), 2);
    net.run_for(Duration::from_secs(1));
    let host = Ipv6Addr::from(u128::from(prefix().network()) | 0x50);
    let key = keys().address6_key(host);
    net.members[r1].add_hosted6(host, net.now);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.holder(&key), Some(net.id(r1).as_bytes().to_vec()));
    assert!(net.members[r1].holds_ip(host.into()));
    assert!(!net.members[r1].is_own(host.into()));
    // The host shows up at r2: its claim is refused, naming r1 (the handoff starts).
    net.members[r2].add_hosted6(host, net.now);
    net.run_for(Duration::from_secs(1));
    assert!(net.take_events(r2).contains(&Event::HostedClaimed {
        address: host.into(),
        outcome: HostedClaim::Held(net.id(r1)),
    }));
    assert!(!net.members[r2].holds_ip(host.into()));
    // The handoff's lookup names r1 with most of a lease left.
    net.members[r2].look_up_holder(host.into());
    net.run_for(Duration::from_millis(100));
    let holder = net.take_events(r2).into_iter().find_map(|e| match e {
        Event::Holder { address, holder } if address == IpAddr::V6(host) => holder,
        _ => None,
    });
    assert!(
        holder.is_some_and(|(id, left)| id == net.id(r1) && left > LEASE / 2),
        "{holder:?}"
    );
    // Only the router hosting it can hand it off, one transfer at a time.
    let record = net.members[r2].hosted_record(host, net.now).unwrap();
    assert!(!net.members[r2].hand_off_hosted(host, record.clone()));
    assert!(net.members[r1].hand_off_hosted(host, record.clone()));
    assert!(!net.members[r1].hand_off_hosted(host, record));
    net.run_for(Duration::from_secs(1));
    let events = net.take_events(r1);
    assert!(events.contains(&Event::HandOff {
        address: host.into(),
        done: true
    }));
    assert!(events.contains(&Event::AddressesChanged));
    assert!(net.members[r1].addresses6().is_empty());
    assert_eq!(net.holder(&key), Some(net.id(r2).as_bytes().to_vec()));
    net.members[r2].adopt_hosted(host, net.now);
    net.settle();
    assert!(net.take_events(r2).contains(&Event::AddressesChanged));
    assert_eq!(net.members[r2].addresses6(), vec![host]);
    // The new router renews it; the old one neither renews nor releases it.
    net.run_for(LEASE * 3);
    assert_eq!(net.holder(&key), Some(net.id(r2).as_bytes().to_vec()));
    assert!(!net.members[r1].remove_hosted6(host));
    assert_eq!(net.holder(&key), Some(net.id(r2).as_bytes().to_vec()));
    assert_eq!(net.members[r2].hosted_conflicts(), 0);
}

#[test]
fn a_quiet_hosts_dhcpv6_address_stays_and_a_release_of_no_lease_here_gives_nothing_back() {
    let mut net = Net::new();
    let r = net.add(router6(), 1);
    net.run_for(Duration::from_secs(1));
    let leased = Ipv6Addr::from(u128::from(prefix().network()) | 0x77);
    net.members[r].claim_for_dhcp6(leased, net.now);
    net.run_for(Duration::from_secs(1));
    // Leased and not seen on the LAN (yet, or any more: it may be suspended): it stays
    // here, whatever another router's LAN shows.
    assert!(net.members[r].stays(leased.into()));
    net.members[r].add_hosted6(leased, net.now);
    assert!(!net.members[r].stays(leased.into()), "seen: it may move");
    assert!(!net.members[r].remove_hosted6(leased));
    assert!(net.members[r].stays(leased.into()));
    assert!(!net.members[r].stays(Ipv6Addr::from(u128::from(prefix().network()) | 0x78).into()));
    // A host that moved here holds its address with no lease here: the end of a lease it
    // had here before gives nothing back.
    let moved = Ipv6Addr::from(u128::from(prefix().network()) | 0x50);
    net.members[r].adopt_hosted(moved, net.now);
    assert!(!net.members[r].release_dhcp6(moved, false));
    assert_eq!(net.members[r].addresses6(), vec![moved, leased]);
}
