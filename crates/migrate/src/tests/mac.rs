//! The RARP MAC question: a frame that names only a MAC is asked of every member
//! (`WhoHas`), and the router whose LAN has it answers (`IsAt`).

use super::*;

#[test]
fn rarp_names_only_the_mac_and_still_moves_the_host() {
    let mut net = Net::new(3);
    net.host_moves(2, Announce::Rarp);
    net.run(Duration::from_secs(5));
    assert!(net.holds(2, HOST));
    // Every member is asked which address has the MAC.
    assert_eq!(net.pushes[0], (2, Message::WhoHas { mac: MAC }));
    let asked: Vec<Id> = net
        .messages
        .iter()
        .filter(|(_, _, m)| *m == Message::WhoHas { mac: MAC })
        .map(|(_, to, _)| *to)
        .collect();
    assert_eq!(asked, vec![1, 3]);
    // Only the holder, router 1, answers; router 3 does not know the MAC.
    let answers: Vec<(Id, Id)> = net
        .messages
        .iter()
        .filter(|(_, _, m)| matches!(m, Message::IsAt { .. }))
        .map(|(from, to, _)| (*from, *to))
        .collect();
    assert_eq!(answers, vec![(1, 2)]);
    assert_eq!(
        net.lookups,
        vec![(2, HOST)],
        "the answer's address is looked up"
    );
    let took = net.took_over(2);
    assert_eq!(took.len(), 1, "{:?}", net.events);
    let (from, got, duration) = &took[0];
    assert_eq!(*from, Some(1));
    assert_eq!(*got, state());
    // Counted from the RARP frame: WhoHas 20 ms, IsAt 20 ms, then as for a gratuitous ARP
    // (lookup 30, request 20, 3 probes 300, transfer 30, reply 20).
    assert_eq!(*duration, Duration::from_millis(440));
    assert_eq!(net.holders, vec![1, 2]);
    assert_eq!(net.count(2, |e| matches!(e, Event::GaveUp { .. })), 0);
    assert_eq!(net.routers[&2].poll_timeout(), None, "the question is over");
}

#[test]
fn a_rarp_then_the_hosts_own_frame_is_one_handoff() {
    // Whether the IsAt comes (late: the frame answered the question) or is lost.
    for lose_is_at in [false, true] {
        let mut net = Net::new(2);
        if lose_is_at {
            net.lose = Box::new(|_, m| matches!(m, Message::IsAt { .. }));
        }
        net.host_moves(2, Announce::Rarp);
        // The host's gratuitous ARP follows 10 ms later, before any member answers.
        let garp = Presence {
            address: Some(HOST),
            mac: MAC,
            announce: Announce::GratuitousArp,
        };
        net.push(
            net.now + Duration::from_millis(10),
            2,
            Input::Presence(garp),
        );
        net.run(Duration::from_secs(5));
        assert!(net.holds(2, HOST));
        let took = net.took_over(2);
        assert_eq!(took.len(), 1, "{:?}", net.events);
        // Counted from the RARP frame: 10 ms, then lookup 30, request 20, probes 300,
        // transfer 30, reply 20.
        assert_eq!(took[0].2, Duration::from_millis(410));
        // The frame answered the question: no second lookup, no GaveUp.
        assert_eq!(net.lookups, vec![(2, HOST)]);
        assert_eq!(
            net.count(2, |e| matches!(e, Event::GaveUp { .. })),
            0,
            "{:?}",
            net.events
        );
        assert_eq!(net.holders, vec![1, 2]);
        assert_eq!(net.routers[&2].poll_timeout(), None);
    }
}

const UNKNOWN: Mac = [2, 0, 0, 0, 0, 1];

fn rarp(mac: Mac) -> Presence {
    Presence {
        address: None,
        mac,
        announce: Announce::Rarp,
    }
}

fn gave_up_on_mac(e: &Event<Id>) -> bool {
    matches!(
        e,
        Event::GaveUp {
            address: None,
            reason: "no member knows the announced MAC"
        }
    )
}

#[test]
fn a_mac_nobody_answers_for_is_given_up_after_exactly_the_wait() {
    let mut net = Net::new(3);
    let start = net.now;
    net.push(start, 2, Input::Presence(rarp(UNKNOWN)));
    net.run(Duration::ZERO);
    assert_eq!(
        net.routers[&2].poll_timeout(),
        Some(start + MAC_QUERY_WAIT),
        "the wait is a timer of the core"
    );
    // QEMU repeats the frame: the question is not asked again, the wait not restarted.
    net.push(
        net.now + Duration::from_millis(50),
        2,
        Input::Presence(rarp(UNKNOWN)),
    );
    net.run(MAC_QUERY_WAIT - Duration::from_millis(1));
    assert_eq!(net.count(2, gave_up_on_mac), 0, "not before the wait");
    net.run(Duration::from_millis(1));
    assert_eq!(net.count(2, gave_up_on_mac), 1, "{:?}", net.events);
    assert_eq!(net.pushes, vec![(2, Message::WhoHas { mac: UNKNOWN })]);
    assert!(
        !net.messages
            .iter()
            .any(|(_, _, m)| matches!(m, Message::IsAt { .. })),
        "no member knows it"
    );
    assert!(net.lookups.is_empty());
    assert_eq!(net.routers[&2].poll_timeout(), None, "nothing left to do");
    assert!(net.holds(1, HOST));
}

#[test]
fn a_late_is_at_changes_nothing() {
    let start = Net::new(1).now;
    let wait = Config::default().mac_query_wait;
    let mut r = Migrate::new(Config::default(), 2u8);
    r.handle_presence(start, rarp(MAC), false);
    assert_eq!(
        r.poll_output(),
        Some(Output::Push(Message::WhoHas { mac: MAC }))
    );
    assert_eq!(r.poll_output(), None);
    let is_at = Message::IsAt {
        mac: MAC,
        address: HOST,
    };
    // At the deadline the answer is late, even before the timer ran.
    r.handle_message(start + wait, 1, is_at.clone(), false);
    assert_eq!(r.poll_output(), None);
    assert_eq!(r.poll_timeout(), Some(start + wait));
    r.handle_timeout(start + wait);
    let gave_up = r.poll_output();
    assert!(
        matches!(&gave_up, Some(Output::Event(e)) if gave_up_on_mac(e)),
        "{gave_up:?}"
    );
    assert_eq!(r.poll_output(), None);
    // After giving up too.
    r.handle_message(start + wait * 2, 1, is_at, false);
    assert_eq!(r.poll_output(), None);
    assert_eq!(r.poll_timeout(), None);
    assert!(!r.in_progress(HOST));

    // On the network: the answer is held up past the wait.
    let mut net = Net::new(2);
    net.lose = Box::new(|_, m| matches!(m, Message::IsAt { .. }));
    net.host_moves(2, Announce::Rarp);
    net.run(MAC_QUERY_WAIT);
    assert_eq!(net.count(2, gave_up_on_mac), 1);
    let late = Input::Message {
        from: 1,
        message: Message::IsAt {
            mac: MAC,
            address: HOST,
        },
    };
    net.push(net.now, 2, late);
    net.run(Duration::from_secs(5));
    assert!(net.took_over(2).is_empty());
    assert!(net.lookups.is_empty());
    assert_eq!(net.events.len(), 1, "{:?}", net.events);
    assert!(net.holds(1, HOST));
}

#[test]
fn an_is_at_for_a_mac_never_asked_changes_nothing() {
    let mut net = Net::new(2);
    let unasked = Input::Message {
        from: 1,
        message: Message::IsAt {
            mac: MAC,
            address: HOST,
        },
    };
    net.push(net.now, 2, unasked);
    net.run(Duration::from_secs(5));
    assert!(net.events.is_empty(), "{:?}", net.events);
    assert!(net.lookups.is_empty());
    assert!(net.messages.is_empty());
    assert_eq!(net.routers[&2].poll_timeout(), None);

    // Nor does it answer a question about another MAC.
    net.push(net.now, 2, Input::Presence(rarp(UNKNOWN)));
    let other = Input::Message {
        from: 1,
        message: Message::IsAt {
            mac: MAC,
            address: HOST,
        },
    };
    net.push(net.now + Duration::from_millis(5), 2, other);
    net.run(Duration::from_secs(5));
    assert!(net.lookups.is_empty());
    assert_eq!(net.count(2, gave_up_on_mac), 1);
    assert!(net.took_over(2).is_empty());
    assert!(net.holds(1, HOST));
}

#[test]
fn duplicated_who_has_and_is_at_change_nothing() {
    let mut net = Net::new(3);
    net.duplicate = Box::new(|_, _| true);
    net.host_moves(2, Announce::Rarp);
    net.run(Duration::from_secs(10));
    assert!(net.holds(2, HOST));
    // Router 1 got WhoHas twice and answered both; router 2 got each IsAt twice.
    let answers = net
        .messages
        .iter()
        .filter(|(_, _, m)| matches!(m, Message::IsAt { .. }))
        .count();
    assert_eq!(answers, 2);
    assert_eq!(net.lookups, vec![(2, HOST)], "one lookup for four answers");
    assert_eq!(net.took_over(2).len(), 1);
    assert_eq!(net.holders, vec![1, 2]);
    assert_eq!(net.probes.len(), 3);
    assert_eq!(net.count(2, |e| matches!(e, Event::GaveUp { .. })), 0);
}

#[test]
fn who_has_and_is_at_survive_their_wire_form_and_garbage_does_not_parse() {
    let who_has: Message<u8> = Message::WhoHas { mac: MAC };
    let is_at: Message<u8> = Message::IsAt {
        mac: MAC,
        address: HOST,
    };
    for m in [who_has, is_at] {
        let bytes = serde_json::to_vec(&m).expect("serializes");
        let back: Message<u8> = serde_json::from_slice(&bytes).expect("parses");
        assert_eq!(back, m);
        // No member names in them: any mapping keeps them whole.
        let expected = match &m {
            Message::WhoHas { mac } => Message::WhoHas { mac: *mac },
            Message::IsAt { mac, address } => Message::IsAt {
                mac: *mac,
                address: *address,
            },
            _ => unreachable!(),
        };
        assert_eq!(m.map_members(|_| None::<String>), Some(expected));
    }
    for garbage in [
        "{\"WhoHas\":{\"mac\":[1,2]}}",
        "{\"WhoHas\":{\"mac\":[1,2,3,4,5,6,7]}}",
        "{\"WhoHas\":{\"mac\":[1,2,3,4,5,256]}}",
        "{\"WhoHas\":[1,2,3,4,5,6]}",
        "{\"IsAt\":{\"mac\":[1,2,3,4,5,6]}}",
        "{\"IsAt\":{\"mac\":[1,2,3,4,5,6],\"address\":\"10.9.0.256\"}}",
        "{\"IsAt\":{\"address\":\"10.9.0.50\"}}",
        "{\"IsItAt\":{\"mac\":[1,2,3,4,5,6],\"address\":\"10.9.0.50\"}}",
        "",
    ] {
        let parsed: Result<Message<u8>, _> = serde_json::from_str(garbage);
        assert!(parsed.is_err(), "{garbage} parsed: {parsed:?}");
    }
    assert!(serde_json::from_slice::<Message<u8>>(&[0xff; 40]).is_err());
}
