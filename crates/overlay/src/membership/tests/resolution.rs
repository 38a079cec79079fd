//! Frames waiting for lookups, the group, leaving, reproducibility.

use super::*;

#[test]
fn frames_wait_for_a_lookup_and_are_released_or_dropped() {
    let mut net = Net::new();
    let a = net.add(config(Address::Static(ip(10))), 1);
    let b = net.add(config(Address::Static(ip(11))), 2);
    net.run_for(Duration::from_secs(1));
    net.take_events(a);
    let now = net.now;
    // a sends to b's address: frames wait, one lookup runs.
    assert!(net.members[a].hold(now, ip(11), b"one"));
    assert!(net.members[a].hold(now, ip(11), b"two"));
    assert_eq!(net.members[a].lookups(), 1);
    net.run_for(Duration::from_millis(100));
    let resolved = net.take_events(a).into_iter().find_map(|e| match e {
        Event::Resolved(r) => Some(r),
        _ => None,
    });
    let resolved = resolved.expect("resolved");
    assert_eq!(resolved.target, ip(11));
    assert_eq!(resolved.member, net.id(b));
    assert_eq!(
        resolved.endpoints,
        vec![SocketAddr::from(([192, 0, 2, 2], 7400))]
    );
    assert_eq!(
        net.members[a].take_pending(&[ip(11)]),
        vec![b"one".to_vec(), b"two".to_vec()]
    );

    // Nobody holds .99: its frames are handed back as unowned and dropped, and it is not
    // looked up again at once (it is unowned until the negative answer expires).
    let now = net.now;
    assert!(!net.members[a].unowned(now, ip(99)));
    assert!(net.members[a].hold(now, ip(99), b"x"));
    net.run_for(Duration::from_millis(100));
    assert_eq!(net.members[a].unresolved_drops(), 1);
    assert!(net.take_events(a).contains(&Event::Unowned {
        target: ip(99).into(),
        frames: vec![b"x".to_vec()]
    }));
    assert!(net.members[a].unowned(net.now, ip(99)));
    assert!(!net.members[a].hold(net.now, ip(99), b"y"));
    assert_eq!(net.members[a].unresolved_drops(), 2);
    assert!(!net.members[a].unowned(net.now + NEGATIVE_TTL, ip(99)));

    // A lookup that never ends: the frames are dropped at the 5 s limit, not before.
    net.mute.push(keys().address_key(ip(98)));
    let now = net.now;
    for i in 0..(MAX_PENDING_FRAMES + 2) {
        let kept = net.members[a].hold(now, ip(98), &[i as u8]);
        assert_eq!(kept, i < MAX_PENDING_FRAMES, "frame {i}");
    }
    let before = net.members[a].unresolved_drops();
    net.run_for(PENDING_TIMEOUT - Duration::from_millis(10));
    assert_eq!(net.members[a].unresolved_drops(), before);
    net.run_for(Duration::from_millis(20));
    assert_eq!(
        net.members[a].unresolved_drops(),
        before + MAX_PENDING_FRAMES as u64
    );
    assert!(net.members[a].take_pending(&[ip(98)]).is_empty());
}

#[test]
fn the_group_lists_the_other_members_and_forgets_those_that_lapsed() {
    let mut net = Net::new();
    // The agent's default lease (10 minutes): how soon a member that stopped drops out of
    // the group must not depend on it.
    let long = |address| Config {
        lease: Duration::from_secs(600),
        ..config(address)
    };
    let a = net.add(long(Address::Static(ip(10))), 1);
    let b = net.add(long(Address::Static(ip(11))), 2);
    let c = net.add(long(Address::Static(ip(12))), 3);
    net.run_for(Duration::from_secs(2));
    let last_group = |net: &Net, i: usize| {
        net.events[i].iter().rev().find_map(|e| match e {
            Event::Group(g) => {
                let mut ids = g.iter().map(|(p, _)| *p).collect::<Vec<_>>();
                ids.sort();
                Some(ids)
            }
            _ => None,
        })
    };
    let mut others = vec![net.id(b), net.id(c)];
    others.sort();
    assert_eq!(last_group(&net, a).unwrap(), others);
    // c stops without leaving: within 30 s every read leaves it out, while b, which keeps
    // announcing, is in every read on the way.
    net.down[c] = true;
    let stopped = net.now;
    net.take_events(a);
    let mut gone_after = None;
    while gone_after.is_none() && net.now < stopped + Duration::from_secs(60) {
        net.run_for(Duration::from_millis(500));
        for e in net.take_events(a) {
            if let Event::Group(g) = e {
                let ids: Vec<_> = g.iter().map(|(p, _)| *p).collect();
                assert!(
                    ids.contains(&net.id(b)),
                    "b left out at {:?}",
                    net.now - stopped
                );
                if !ids.contains(&net.id(c)) {
                    gone_after = Some(net.now - stopped);
                }
            }
        }
    }
    let gone_after = gone_after.expect("c never left the group");
    assert!(gone_after <= Duration::from_secs(30), "{gone_after:?}");
    // It stays out, and b stays in, for the rest of the lease.
    net.run_for(Duration::from_secs(120));
    assert_eq!(last_group(&net, a).unwrap(), vec![net.id(b)]);
}

#[test]
fn leaving_releases_everything_and_stops() {
    let mut net = Net::new();
    let a = net.add(config(Address::Static(ip(10))), 1);
    net.run_for(Duration::from_secs(1));
    // a created the namespace record and keeps it: leaving releases it too.
    assert!(net.holder(&keys().settings_key()).is_some());
    assert_eq!(net.members[a].leave(), 2);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.holder(&keys().settings_key()), None);
    assert_eq!(net.holder(&keys().address_key(ip(10))), None);
    assert!(net.members[a].has_left());
    assert_eq!(net.members[a].poll_timeout(), None);
    assert!(!net.members[a].hold(net.now, ip(11), b"x"));
}

#[test]
fn runs_are_reproducible_from_a_seed() {
    let run = || {
        let mut net = Net::new();
        let a = net.add(config(Address::Auto), 5);
        net.run_for(Duration::from_secs(1));
        net.members[a].owned()
    };
    assert_eq!(run(), run());
    assert!(run().is_some());
}

#[test]
fn a_member_whose_endpoint_changed_renews_its_records_at_once() {
    let mut net = Net::new();
    let a = net.add(config(Address::Static(ip(10))), 1);
    let b = net.add(config(Address::Static(ip(11))), 2);
    net.run_for(Duration::from_secs(1));
    net.take_events(a);
    let claims = net.replicas.claims;
    // The same endpoints again change nothing.
    let now = net.now;
    net.members[b].set_endpoints(now, vec![SocketAddr::from(([192, 0, 2, 2], 7400))]);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.replicas.claims, claims, "no renewal for nothing");
    // b was renumbered: its records carry the new endpoint within a fraction of a second,
    // not at the next renewal (half the 30 s lease).
    let moved = SocketAddr::from(([198, 51, 100, 2], 7400));
    let now = net.now;
    net.members[b].set_endpoints(now, vec![moved]);
    assert_eq!(
        net.members[b].published_endpoints(),
        [SocketAddr::from(([192, 0, 2, 2], 7400))],
        "the records still say where b was"
    );
    net.run_for(Duration::from_millis(500));
    assert!(net.replicas.claims > claims, "renewed");
    assert_eq!(net.members[b].published_endpoints(), [moved]);
    assert!(net.members[a].hold(net.now, ip(11), b"x"));
    net.run_for(Duration::from_millis(100));
    let resolved = net.take_events(a).into_iter().find_map(|e| match e {
        Event::Resolved(r) => Some(r),
        _ => None,
    });
    assert_eq!(resolved.map(|r| r.endpoints), Some(vec![moved]));
}
