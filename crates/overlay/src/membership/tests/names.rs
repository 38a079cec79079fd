//! Names in the zone: held, clashing, released with their address.

use super::*;

fn name_results(events: &[Event]) -> Vec<(String, Result<(), String>)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Name { name, result } => Some((name.clone(), result.clone())),
            _ => None,
        })
        .collect()
}

/// The name a member's address record carries (its PTR), as the replicas hold it.
fn ptr(net: &Net, address: Ipv4Addr) -> Option<String> {
    let key = keys().address_key(address);
    let e = net.replicas.leases.get(&key)?;
    let (_, info) = e.read::<MemberInfo>(&keys(), &key, net.unix()).ok()?;
    info.name
}

#[test]
fn names_are_held_clash_and_go_with_their_address() {
    let mut net = Net::new();
    let mut c = config(Address::Static(ip(10)));
    c.hostname = Some("web".into());
    let a = net.add(c, 1);
    net.run_for(Duration::from_secs(1));
    assert_eq!(
        name_results(&net.take_events(a)),
        vec![("web".into(), Ok(()))]
    );
    assert_eq!(net.members[a].address_for("web"), Some(ip(10)));
    assert_eq!(net.members[a].name_for(ip(10)), Some("web"));
    // The address record is sealed again with the name: its PTR.
    assert_eq!(ptr(&net, ip(10)), Some("web".into()));
    let key = keys().name_key("web");
    let e = net.replicas.leases.get(&key).unwrap();
    let (_, info) = e.read::<NameInfo>(&keys(), &key, net.unix()).unwrap();
    assert_eq!(info.address, ip(10));

    // Another member wanting the same name is told who holds it, and keeps its address.
    let mut c = config(Address::Static(ip(11)));
    c.hostname = Some("web".into());
    let b = net.add(c, 2);
    net.run_for(Duration::from_secs(1));
    let results = name_results(&net.take_events(b));
    let err = results[0].1.clone().unwrap_err();
    assert!(err.contains(&net.id(a).to_string()), "{err}");
    assert_eq!(net.members[b].name_error(), Some(err.as_str()));
    assert_eq!(net.members[b].name_conflicts(), 1);
    assert_eq!(net.members[b].owned(), Some(ip(11)));

    // A new hostname replaces the old only once won.
    let now = net.now;
    net.members[a].set_hostname(now, Some("www".into()));
    net.run_for(Duration::from_secs(1));
    assert_eq!(
        net.members[a].held_names(),
        vec![("www".to_string(), ip(10))]
    );
    assert_eq!(net.holder(&keys().name_key("web")), None);

    // Leaving gives the address and the name back.
    net.members[a].leave();
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.holder(&keys().name_key("www")), None);
    assert_eq!(net.holder(&keys().address_key(ip(10))), None);
    // ... and b's retry wins "web" now.
    net.run_for(CONFLICT_RETRY);
    assert_eq!(net.members[b].address_for("web"), Some(ip(11)));
    assert_eq!(net.members[b].name_error(), None);
}

#[test]
fn a_dhcp_clients_name_is_held_for_its_address_and_released_with_it() {
    let mut net = Net::new();
    let r = net.add(config(Address::None), 1);
    net.run_for(Duration::from_secs(1));
    let now = net.now;
    net.members[r].claim_for_dhcp(now, b"c".to_vec(), Some(ip(60)), false);
    net.run_for(Duration::from_secs(1));
    let now = net.now;
    // A name for an address this member does not hold is ignored.
    net.members[r].name_client(now, ip(61), "ghost".into());
    net.members[r].name_client(now, ip(60), "bravo".into());
    net.run_for(Duration::from_secs(1));
    assert_eq!(
        net.members[r].held_names(),
        vec![("bravo".to_string(), ip(60))]
    );
    assert_eq!(ptr(&net, ip(60)), Some("bravo".into()));
    // Renaming itself gives the old name back.
    let now = net.now;
    net.members[r].name_client(now, ip(60), "charlie".into());
    net.run_for(Duration::from_secs(1));
    assert_eq!(
        net.members[r].held_names(),
        vec![("charlie".to_string(), ip(60))]
    );
    assert_eq!(net.holder(&keys().name_key("bravo")), None);
    // The lease ends: the name goes with the address.
    net.members[r].release_dhcp(ip(60));
    net.run_for(Duration::from_secs(1));
    assert!(net.members[r].held_names().is_empty());
    assert_eq!(net.holder(&keys().name_key("charlie")), None);
}

/// How many reads of `address`'s holder member `m` finished since the last call.
fn holder_reads(net: &mut Net, m: usize, address: Ipv4Addr) -> usize {
    net.take_events(m)
        .iter()
        .filter(|e| matches!(e, Event::HolderRead { address: a, .. } if *a == address))
        .count()
}

#[test]
fn member_names_are_read_once_a_minute_and_forgotten_with_the_tunnel() {
    let mut net = Net::new();
    let mut c = config(Address::Static(ip(10)));
    c.hostname = Some("web".into());
    let a = net.add(c, 1);
    let b = net.add(config(Address::Static(ip(11))), 2);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[a].address_for("web"), Some(ip(10)));
    let reads = |net: &mut Net| holder_reads(net, b, ip(10));
    let _ = reads(&mut net);

    // The first refresh reads the name; the answer shows from then on.
    let now = net.now;
    net.members[b].refresh_member_names(now, &[ip(10)]);
    assert_eq!(net.members[b].member_name(ip(10)), None);
    net.run_for(Duration::from_millis(100));
    assert_eq!(reads(&mut net), 1);
    assert_eq!(net.members[b].member_name(ip(10)), Some("web"));

    // Asked again within the minute (status scraped often): no read, the name stays.
    for _ in 0..50 {
        let now = net.now;
        net.members[b].refresh_member_names(now, &[ip(10)]);
        net.run_for(Duration::from_millis(100));
    }
    assert_eq!(reads(&mut net), 0);
    assert_eq!(net.members[b].member_name(ip(10)), Some("web"));

    // A minute after the first read: read again; a renamed member shows its new name.
    let now = net.now;
    net.members[a].set_hostname(now, Some("www".into()));
    net.run_until(now + MEMBER_NAME_REFRESH);
    let _ = reads(&mut net);
    let now = net.now;
    net.members[b].refresh_member_names(now, &[ip(10)]);
    net.run_for(Duration::from_millis(100));
    assert_eq!(reads(&mut net), 1);
    assert_eq!(net.members[b].member_name(ip(10)), Some("www"));

    // No tunnel to the address any more: its name is forgotten, and nothing is read.
    let now = net.now;
    net.members[b].refresh_member_names(now, &[]);
    net.run_for(Duration::from_millis(100));
    assert_eq!(reads(&mut net), 0);
    assert_eq!(net.members[b].member_name(ip(10)), None);
}

#[test]
fn a_member_without_a_name_yet_is_read_again_within_seconds() {
    let mut net = Net::new();
    let a = net.add(config(Address::Static(ip(10))), 1);
    let b = net.add(config(Address::Static(ip(11))), 2);
    net.run_for(Duration::from_secs(1));
    let reads = |net: &mut Net| holder_reads(net, b, ip(10));
    let _ = reads(&mut net);

    // a has not named itself: the read finds no name.
    let now = net.now;
    net.members[b].refresh_member_names(now, &[ip(10)]);
    net.run_for(Duration::from_millis(100));
    assert_eq!(reads(&mut net), 1);
    assert_eq!(net.members[b].member_name(ip(10)), None);

    // a names itself. Status asked often before the retry is due: no read.
    let now = net.now;
    net.members[a].set_hostname(now, Some("late".into()));
    net.run_for(Duration::from_millis(500));
    let _ = net.take_events(b);
    for _ in 0..20 {
        let now = net.now;
        net.members[b].refresh_member_names(now, &[ip(10)]);
        net.run_for(Duration::from_millis(100));
    }
    assert_eq!(reads(&mut net), 0);
    assert_eq!(net.members[b].member_name(ip(10)), None);

    // Once the retry is due the name is read and shown, and from then on it is read only
    // once a minute.
    net.run_until(now + MEMBER_NAME_RETRY);
    let now = net.now;
    net.members[b].refresh_member_names(now, &[ip(10)]);
    net.run_for(Duration::from_millis(100));
    assert_eq!(reads(&mut net), 1);
    assert_eq!(net.members[b].member_name(ip(10)), Some("late"));
    net.run_until(now + MEMBER_NAME_RETRY * 2);
    let now = net.now;
    net.members[b].refresh_member_names(now, &[ip(10)]);
    net.run_for(Duration::from_millis(100));
    assert_eq!(reads(&mut net), 0);
}

#[test]
fn a_member_that_never_names_itself_is_read_less_and_less_often_down_to_once_a_minute() {
    let mut net = Net::new();
    let _a = net.add(config(Address::Static(ip(10))), 1);
    let b = net.add(config(Address::Static(ip(11))), 2);
    net.run_for(Duration::from_secs(1));
    let _ = holder_reads(&mut net, b, ip(10));

    // Status asked every second for five minutes; a never names itself. Reads come 5, 10,
    // 20, 40 s apart, then once a minute: at 0, 5, 15, 35, 75, 135, 195 and 255 s.
    let mut reads = 0;
    for _ in 0..300 {
        let now = net.now;
        net.members[b].refresh_member_names(now, &[ip(10)]);
        net.run_for(Duration::from_secs(1));
        reads += holder_reads(&mut net, b, ip(10));
    }
    assert_eq!(reads, 8);
    assert_eq!(net.members[b].member_name(ip(10)), None);
}
