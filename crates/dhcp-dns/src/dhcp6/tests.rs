#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::disallowed_methods)] // tests start the clock

use super::relay::RELAY_HEADER;
use super::*;

const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const AGENT_MAC: [u8; 6] = [0xfe, 0xfd, 1, 2, 3, 4];

fn host() -> (Ipv6Addr, [u8; 6]) {
    ("fe80::a".parse().unwrap(), HOST_MAC)
}

fn prefix() -> Ipv6Net {
    "fd12:3456:789a::/64".parse().unwrap()
}

fn server() -> Server {
    Server::new(Settings {
        prefix: prefix(),
        server_id: duid_ll(AGENT_MAC),
        dns: vec!["fd12:3456:789a::1".parse().unwrap()],
        domain: "lab".into(),
        lease: Duration::from_secs(600),
    })
}

fn t0() -> Instant {
    static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *T0.get_or_init(Instant::now)
}

const CLIENT_DUID: [u8; 10] = [0, 3, 0, 1, 2, 0, 0, 0, 0, 0x0a];

/// A client's message of `kind` for IAID 7, naming `address` if any, to `server_id`.
fn message(kind: MessageType, address: Option<Ipv6Addr>, server_id: Option<Vec<u8>>) -> Vec<u8> {
    let mut m = Message::new_with_id(kind, [1, 2, 3]);
    let opts = m.opts_mut();
    opts.insert(DhcpOption::ClientId(CLIENT_DUID.to_vec()));
    if let Some(id) = server_id {
        opts.insert(DhcpOption::ServerId(id));
    }
    let mut ia_opts = DhcpOptions::new();
    if let Some(addr) = address {
        ia_opts.insert(DhcpOption::IAAddr(IAAddr {
            addr,
            preferred_life: 0,
            valid_life: 0,
            opts: DhcpOptions::new(),
        }));
    }
    opts.insert(DhcpOption::IANA(IANA {
        id: 7,
        t1: 0,
        t2: 0,
        opts: ia_opts,
    }));
    let mut bytes = Vec::new();
    m.encode(&mut Encoder::new(&mut bytes)).unwrap();
    bytes
}

fn outputs(s: &mut Server) -> Vec<Output> {
    std::iter::from_fn(|| s.poll_output()).collect()
}

/// The only output: a reply, decoded.
fn reply(s: &mut Server) -> Message {
    match outputs(s).as_slice() {
        [Output::Reply(r)] => {
            assert_eq!(r.to, host());
            Message::decode(&mut Decoder::new(&r.bytes)).unwrap()
        }
        other => panic!("not one reply: {other:?}"),
    }
}

/// The only output: a claim.
fn claim(s: &mut Server) -> Ipv6Addr {
    match outputs(s).as_slice() {
        [Output::Claim { address, mac, .. }] => {
            assert_eq!(*mac, HOST_MAC);
            *address
        }
        other => panic!("not one claim: {other:?}"),
    }
}

fn ia(m: &Message) -> &IANA {
    first_ia_na(m).expect("an IA_NA")
}

fn ia_status(m: &Message) -> Option<Status> {
    ia(m).opts.iter().find_map(|o| match o {
        DhcpOption::StatusCode(s) => Some(s.status),
        _ => None,
    })
}

#[test]
fn a_client_is_advertised_a_claimed_address_then_leased_it_on_request() {
    let mut s = server();
    s.handle_request(t0(), &message(MessageType::Solicit, None, None), host());
    let address = claim(&mut s);
    assert!(prefix().contains(&address) && s.usable(address));
    s.allocated(address, t0());
    let adv = reply(&mut s);
    assert_eq!(adv.msg_type(), MessageType::Advertise);
    assert_eq!(adv.xid(), [1, 2, 3]);
    assert_eq!(named_address(ia(&adv)), Some(address));
    assert_eq!((ia(&adv).id, ia(&adv).t1, ia(&adv).t2), (7, 300, 480));
    assert_eq!(
        adv.opts().get(OptionCode::ServerId),
        Some(&DhcpOption::ServerId(duid_ll(AGENT_MAC)))
    );
    assert_eq!(
        adv.opts().get(OptionCode::ClientId),
        Some(&DhcpOption::ClientId(CLIENT_DUID.to_vec()))
    );
    assert!(matches!(
        adv.opts().get(OptionCode::DomainNameServers),
        Some(DhcpOption::DomainNameServers(d)) if d == &vec!["fd12:3456:789a::1".parse::<Ipv6Addr>().unwrap()]
    ));
    assert!(adv.opts().get(OptionCode::DomainSearchList).is_some());
    // The REQUEST is answered at once: the address is claimed already.
    let request = message(
        MessageType::Request,
        Some(address),
        Some(duid_ll(AGENT_MAC)),
    );
    s.handle_request(t0(), &request, host());
    let ack = reply(&mut s);
    assert_eq!(ack.msg_type(), MessageType::Reply);
    assert_eq!(named_address(ia(&ack)), Some(address));
    let client = Client {
        duid: CLIENT_DUID.to_vec(),
        iaid: 7,
    };
    assert_eq!(s.lease_of(&client), Some(address));
    // A lease lasts its lifetime, not the offer's.
    s.handle_timeout(t0() + OFFER_LIFETIME + Duration::from_secs(1));
    assert_eq!(outputs(&mut s), vec![]);
    s.handle_timeout(t0() + Duration::from_secs(601));
    assert_eq!(
        outputs(&mut s),
        vec![Output::Release {
            address,
            mac: Some(HOST_MAC)
        }]
    );
    // The same client gets the same address next time.
    let mut again = server();
    again.handle_request(t0(), &message(MessageType::Solicit, None, None), host());
    assert_eq!(claim(&mut again), address);
}

#[test]
fn a_refused_address_is_replaced_until_the_tries_run_out() {
    let mut s = server();
    s.handle_request(t0(), &message(MessageType::Solicit, None, None), host());
    let mut tried = vec![claim(&mut s)];
    for _ in 1..MAX_TRIES {
        s.refused(*tried.last().unwrap());
        let next = claim(&mut s);
        assert!(!tried.contains(&next), "{next} again");
        tried.push(next);
    }
    s.refused(*tried.last().unwrap());
    let adv = reply(&mut s);
    assert_eq!(ia_status(&adv), Some(Status::NoAddrsAvail));
    assert_eq!(named_address(ia(&adv)), None);
}

#[test]
fn messages_for_another_server_or_without_what_they_need_are_not_answered() {
    let mut s = server();
    let other = Some(duid_ll([2, 0, 0, 0, 0, 9]));
    s.handle_request(t0(), &message(MessageType::Request, None, other), host());
    s.handle_request(
        t0(),
        &message(MessageType::Solicit, None, Some(duid_ll(AGENT_MAC))),
        host(),
    );
    assert_eq!(s.stats().ignored, 2);
    s.handle_request(t0(), b"\x01\x02", host());
    s.handle_request(t0(), &[0xff; 40], host());
    // A SOLICIT with no IA_NA.
    let mut m = Message::new_with_id(MessageType::Solicit, [1, 1, 1]);
    m.opts_mut()
        .insert(DhcpOption::ClientId(CLIENT_DUID.to_vec()));
    let mut bytes = Vec::new();
    m.encode(&mut Encoder::new(&mut bytes)).unwrap();
    s.handle_request(t0(), &bytes, host());
    assert!(s.stats().malformed >= 2, "{:?}", s.stats());
    assert_eq!(outputs(&mut s), vec![]);
}

#[test]
fn a_renewal_after_a_restart_claims_that_address_only() {
    let mut s = server();
    let mine: Ipv6Addr = "fd12:3456:789a::77".parse().unwrap();
    let id = Some(duid_ll(AGENT_MAC));
    s.handle_request(
        t0(),
        &message(MessageType::Renew, Some(mine), id.clone()),
        host(),
    );
    // Said to be a renewal (the host may have moved here with it).
    assert_eq!(
        outputs(&mut s),
        vec![Output::Claim {
            address: mine,
            mac: HOST_MAC,
            renewing: true
        }]
    );
    s.allocated(mine, t0());
    let ack = reply(&mut s);
    assert_eq!(ack.msg_type(), MessageType::Reply);
    assert_eq!(named_address(ia(&ack)), Some(mine));
    // Another client's renewal of an address someone else holds: no binding.
    let mut s = server();
    s.handle_request(
        t0(),
        &message(MessageType::Rebind, Some(mine), None),
        host(),
    );
    assert_eq!(claim(&mut s), mine);
    s.refused(mine);
    assert_eq!(ia_status(&reply(&mut s)), Some(Status::NoBinding));
    // Outside the prefix: not on link.
    let far: Ipv6Addr = "2001:db8::1".parse().unwrap();
    s.handle_request(t0(), &message(MessageType::Rebind, Some(far), None), host());
    let r = reply(&mut s);
    let zero = ia(&r).opts.iter().any(|o| {
        matches!(o, DhcpOption::IAAddr(a) if a.addr == far && a.valid_life == 0 && a.preferred_life == 0)
    });
    assert!(zero, "returned with lifetimes 0: {r:?}");
}

#[test]
fn release_and_decline_free_the_address_and_a_declined_one_is_never_offered_again() {
    let mut s = server();
    let id = Some(duid_ll(AGENT_MAC));
    s.handle_request(
        t0(),
        &message(MessageType::Request, None, id.clone()),
        host(),
    );
    let first = match outputs(&mut s).as_slice() {
        [Output::Claim {
            address,
            renewing: false,
            ..
        }] => *address,
        other => panic!("not one fresh claim: {other:?}"),
    };
    s.allocated(first, t0());
    let _ = reply(&mut s);
    s.handle_request(
        t0(),
        &message(MessageType::Decline, Some(first), id.clone()),
        host(),
    );
    let out = outputs(&mut s);
    assert_eq!(
        out[0],
        Output::Release {
            address: first,
            mac: Some(HOST_MAC)
        }
    );
    assert!(matches!(&out[1], Output::Reply(_)));
    assert_eq!(s.stats().declines, 1);
    assert!(!s.usable(first));
    s.handle_request(
        t0(),
        &message(MessageType::Request, Some(first), id.clone()),
        host(),
    );
    let second = claim(&mut s);
    assert_ne!(second, first);
    s.allocated(second, t0());
    let _ = reply(&mut s);
    // Another host naming the client's DUID gives nothing back.
    let other = ("fe80::b".parse().unwrap(), [0x02, 0, 0, 0, 0, 0x0b]);
    let ignored = s.stats().ignored;
    s.handle_request(
        t0(),
        &message(MessageType::Release, Some(second), id.clone()),
        other,
    );
    assert_eq!(ia_status(&reply_to_other(&mut s)), Some(Status::NoBinding));
    assert_eq!(s.stats().ignored, ignored + 1);
    assert!(!s.usable(second), "still the client's");
    s.handle_request(
        t0(),
        &message(MessageType::Release, Some(second), id),
        host(),
    );
    let out = outputs(&mut s);
    assert_eq!(
        out[0],
        Output::Release {
            address: second,
            mac: Some(HOST_MAC)
        }
    );
    assert!(s.usable(second));
}

#[test]
fn rapid_commit_confirm_and_information_requests() {
    let mut s = server();
    let mut m = Message::decode(&mut Decoder::new(&message(
        MessageType::Solicit,
        None,
        None,
    )))
    .unwrap();
    m.opts_mut().insert(DhcpOption::RapidCommit);
    let mut bytes = Vec::new();
    m.encode(&mut Encoder::new(&mut bytes)).unwrap();
    s.handle_request(t0(), &bytes, host());
    let address = claim(&mut s);
    s.allocated(address, t0());
    let r = reply(&mut s);
    assert_eq!(r.msg_type(), MessageType::Reply);
    assert!(r.opts().get(OptionCode::RapidCommit).is_some());
    s.handle_timeout(t0() + OFFER_LIFETIME + Duration::from_secs(1));
    assert_eq!(outputs(&mut s), vec![], "a lease, not an offer");

    let far: Ipv6Addr = "2001:db8::1".parse().unwrap();
    s.handle_request(
        t0(),
        &message(MessageType::Confirm, Some(far), None),
        host(),
    );
    let r = reply(&mut s);
    assert!(matches!(
        r.opts().get(OptionCode::StatusCode),
        Some(DhcpOption::StatusCode(c)) if c.status == Status::NotOnLink
    ));
    s.handle_request(
        t0(),
        &message(MessageType::Confirm, Some(address), None),
        host(),
    );
    assert!(matches!(
        reply(&mut s).opts().get(OptionCode::StatusCode),
        Some(DhcpOption::StatusCode(c)) if c.status == Status::Success
    ));

    let info = Message::new_with_id(MessageType::InformationRequest, [9, 9, 9]);
    let mut bytes = Vec::new();
    info.encode(&mut Encoder::new(&mut bytes)).unwrap();
    s.handle_request(t0(), &bytes, host());
    let r = reply(&mut s);
    assert_eq!(r.xid(), [9, 9, 9]);
    assert!(r.opts().get(OptionCode::DomainNameServers).is_some());
    assert!(first_ia_na(&r).is_none());
}

#[test]
fn options_dhcproto_would_choke_on_are_refused_and_counted() {
    let mut s = server();
    // What the fuzzer found: a Status Code option one byte long (dhcproto subtracts 2).
    s.handle_request(t0(), &[0, 0, 0, 1, 0, 13, 0, 0, 0, 1, 123], host());
    // The same inside an IA_NA, a Vendor Class of 3 bytes, a relay message, a relay-forw.
    let mut inside = vec![1, 0, 0, 1, 0, 3, 0, 16];
    inside.extend_from_slice(&[0; 12]);
    inside.extend_from_slice(&[0, 13, 0, 0]);
    s.handle_request(t0(), &inside, host());
    s.handle_request(t0(), &[1, 0, 0, 1, 0, 16, 0, 3, 0, 0, 0], host());
    s.handle_request(t0(), &[1, 0, 0, 1, 0, 9, 0, 0], host());
    s.handle_request(t0(), &[12; 40], host());
    assert_eq!(s.stats().malformed, 5);
    assert_eq!(outputs(&mut s), vec![]);
    // A sound message still passes the check.
    let good = message(MessageType::Solicit, None, None);
    assert!(options_sound(&good[4..], 0));
}

#[test]
fn a_fixed_size_option_of_another_length_is_refused() {
    let mut s = server();
    // The fuzzer's second find: an Elapsed Time of length 0 (dhcproto reads 2 bytes
    // anyway), after which a Vendor Class of length 0 lay where this check did not look.
    let mut found = vec![
        172, 5, 14, 123, 40, 0, 0, 0, 0, 0, 0, 0, 0, 14, 0, 0, 0, 8, 0, 0,
    ];
    found.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 16]);
    found.extend_from_slice(&[0; 25]);
    found.push(63);
    found.extend_from_slice(&[0; 18]);
    assert_eq!(found.len(), 72);
    s.handle_request(t0(), &found, host());
    for (code, len) in [(7u8, 2u8), (8, 1), (12, 4), (14, 1), (19, 0), (20, 2)] {
        let mut m = vec![1, 0, 0, 1, 0, code, 0, len];
        m.extend(std::iter::repeat_n(0, usize::from(len)));
        s.handle_request(t0(), &m, host());
    }
    assert_eq!(s.stats().malformed, 7);
    assert_eq!(outputs(&mut s), vec![]);
}

#[test]
fn a_request_that_waits_too_long_is_dropped_and_its_late_claim_given_back() {
    let mut s = server();
    s.handle_request(t0(), &message(MessageType::Solicit, None, None), host());
    let address = claim(&mut s);
    assert_eq!(s.poll_timeout(), Some(t0() + CLAIM_WAIT));
    s.handle_timeout(t0() + CLAIM_WAIT);
    // The client asks again: a new claim goes out (the first no longer blocks it).
    s.handle_request(
        t0() + CLAIM_WAIT,
        &message(MessageType::Solicit, None, None),
        host(),
    );
    assert_eq!(claim(&mut s), address);
    s.handle_timeout(t0() + CLAIM_WAIT * 2);
    // The DHT answers late: nobody waits, so the address goes back.
    s.allocated(address, t0() + CLAIM_WAIT * 2);
    assert_eq!(
        outputs(&mut s),
        vec![Output::Release { address, mac: None }]
    );
    // A release while a claim is out drops the claim.
    let id = Some(duid_ll(AGENT_MAC));
    s.handle_request(
        t0(),
        &message(MessageType::Request, None, id.clone()),
        host(),
    );
    let pending = claim(&mut s);
    s.handle_request(
        t0(),
        &message(MessageType::Release, Some(pending), id),
        host(),
    );
    let _ = outputs(&mut s);
    s.allocated(pending, t0());
    assert_eq!(
        outputs(&mut s),
        vec![Output::Release {
            address: pending,
            mac: None
        }]
    );
}

#[test]
fn a_binding_handed_over_with_its_host_goes_without_a_release() {
    let mut s = server();
    s.handle_request(t0(), &message(MessageType::Solicit, None, None), host());
    let address = claim(&mut s);
    s.allocated(address, t0());
    let _ = reply(&mut s);
    let client = Client {
        duid: CLIENT_DUID.to_vec(),
        iaid: 7,
    };
    assert_eq!(s.lease_of(&client), Some(address));
    let other: Ipv6Addr = "fd12:3456:789a::99".parse().unwrap();
    assert!(!s.hand_over(other), "not bound here");
    assert!(s.hand_over(address));
    assert_eq!(s.lease_of(&client), None);
    // Its end later releases nothing: the address is the new router's.
    s.handle_timeout(t0() + Duration::from_secs(601));
    assert_eq!(outputs(&mut s), vec![]);
    assert_eq!(s.poll_timeout(), None);
}

/// The only output: a reply to someone other than [`host`], decoded.
fn reply_to_other(s: &mut Server) -> Message {
    match outputs(s).as_slice() {
        [Output::Reply(r)] => {
            assert_ne!(r.to, host());
            Message::decode(&mut Decoder::new(&r.bytes)).unwrap()
        }
        other => panic!("not one reply: {other:?}"),
    }
}

const RELAY_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0e];

fn relay() -> (Ipv6Addr, [u8; 6]) {
    ("fd12:3456:789a::e".parse().unwrap(), RELAY_MAC)
}

/// `inner` as a relay agent forwards it (RELAY-FORW, hop count `hops`) from `peer` on the
/// link of `link`, with Interface-ID `id` (if any) after the Relay Message.
fn relayed(
    inner: &[u8],
    (link, peer): (Ipv6Addr, Ipv6Addr),
    hops: u8,
    id: Option<&[u8]>,
) -> Vec<u8> {
    let mut m = vec![RELAY_FORW, hops];
    m.extend_from_slice(&link.octets());
    m.extend_from_slice(&peer.octets());
    m.extend_from_slice(&[0, 9]);
    m.extend_from_slice(&(inner.len() as u16).to_be_bytes());
    m.extend_from_slice(inner);
    if let Some(id) = id {
        m.extend_from_slice(&[0, 18]);
        m.extend_from_slice(&(id.len() as u16).to_be_bytes());
        m.extend_from_slice(id);
    }
    m
}

/// A RELAY-REPL's hop count, link- and peer-address, Interface-ID and message.
fn unwrap_reply(bytes: &[u8]) -> (u8, Ipv6Addr, Ipv6Addr, Option<Vec<u8>>, Vec<u8>) {
    assert_eq!(bytes[0], RELAY_REPL);
    let mut forw = bytes.to_vec();
    forw[0] = RELAY_FORW;
    let (inner, hops) = unwrap_relays(&forw).expect("a relay reply");
    let hop = hops[0].clone();
    (
        hop.hop_count,
        hop.link,
        hop.peer,
        hop.interface_id,
        inner.to_vec(),
    )
}

/// A /48 namespace's server: a relayed client's link is a /64 of it.
fn site_server() -> Server {
    Server::new(Settings {
        prefix: "fd12:3456:789a::/48".parse().unwrap(),
        ..server().settings.clone()
    })
}

/// The only output: a claim, its address.
fn claimed(s: &mut Server) -> Ipv6Addr {
    match outputs(s).as_slice() {
        [Output::Claim { address, .. }] => *address,
        other => panic!("not one claim: {other:?}"),
    }
}

fn net(text: &str) -> Ipv6Net {
    text.parse().unwrap()
}

#[test]
fn a_client_behind_a_relay_is_answered_through_it_on_its_links_part_of_the_prefix() {
    let mut s = site_server();
    let link: Ipv6Addr = "fd12:3456:789a:5::1".parse().unwrap();
    let peer: Ipv6Addr = "fe80::c".parse().unwrap();
    let solicit = message(MessageType::Solicit, None, None);
    s.handle_request(
        t0(),
        &relayed(&solicit, (link, peer), 0, Some(b"eth1")),
        relay(),
    );
    let address = match outputs(&mut s).as_slice() {
        [Output::Claim { address, mac, .. }] => {
            assert_eq!(*mac, RELAY_MAC, "the client is behind the relay's MAC");
            *address
        }
        other => panic!("not one claim: {other:?}"),
    };
    assert!(net("fd12:3456:789a:5::/64").contains(&address), "{address}");
    s.allocated(address, t0());
    let r = match outputs(&mut s).as_slice() {
        [Output::Reply(r)] => r.clone(),
        other => panic!("not one reply: {other:?}"),
    };
    assert_eq!((r.to, r.port), (relay(), SERVER_PORT));
    let (hops, l, p, id, inner) = unwrap_reply(&r.bytes);
    assert_eq!(
        (hops, l, p, id.as_deref()),
        (0, link, peer, Some(&b"eth1"[..]))
    );
    let m = Message::decode(&mut Decoder::new(&inner)).unwrap();
    assert_eq!(m.msg_type(), MessageType::Advertise);
    assert_eq!(named_address(ia(&m)), Some(address));
    assert_eq!((s.stats().relayed, s.stats().relay_outside_prefix), (1, 0));

    // The same client's REQUEST from another link (it moved): a new address there, the
    // old one given back; its CONFIRM of the old one is "not on link", and a RENEW of it
    // returns it with lifetimes 0.
    let other_link: Ipv6Addr = "fd12:3456:789a:6::1".parse().unwrap();
    let id = Some(duid_ll(AGENT_MAC));
    let request = message(MessageType::Request, Some(address), id.clone());
    s.handle_request(
        t0(),
        &relayed(&request, (other_link, peer), 0, None),
        relay(),
    );
    let out = outputs(&mut s);
    assert_eq!(
        out[0],
        Output::Release {
            address,
            mac: Some(RELAY_MAC)
        }
    );
    let Output::Claim { address: moved, .. } = out[1] else {
        panic!("{out:?}");
    };
    assert!(net("fd12:3456:789a:6::/64").contains(&moved), "{moved}");
    let confirm = message(MessageType::Confirm, Some(address), None);
    s.handle_request(
        t0(),
        &relayed(&confirm, (other_link, peer), 0, None),
        relay(),
    );
    let r = match outputs(&mut s).as_slice() {
        [Output::Reply(r)] => unwrap_reply(&r.bytes).4,
        other => panic!("not one reply: {other:?}"),
    };
    let m = Message::decode(&mut Decoder::new(&r)).unwrap();
    assert!(
        matches!(m.opts().get(OptionCode::StatusCode), Some(DhcpOption::StatusCode(c)) if c.status == Status::NotOnLink),
        "{m:?}"
    );
    let renew = message(MessageType::Renew, Some(address), id);
    s.handle_request(t0(), &relayed(&renew, (other_link, peer), 0, None), relay());
    let r = match outputs(&mut s).as_slice() {
        [Output::Reply(r)] => unwrap_reply(&r.bytes).4,
        other => panic!("not one reply: {other:?}"),
    };
    let m = Message::decode(&mut Decoder::new(&r)).unwrap();
    let zero = ia(&m)
        .opts
        .iter()
        .any(|o| matches!(o, DhcpOption::IAAddr(a) if a.addr == address && a.valid_life == 0));
    assert!(zero, "returned with lifetimes 0: {m:?}");
}

#[test]
fn through_two_relays_the_link_is_the_nearest_non_zero_one_and_the_reply_is_wrapped_twice() {
    let solicit = message(MessageType::Solicit, None, None);
    let peer: Ipv6Addr = "fe80::c".parse().unwrap();
    let (near, far): (Ipv6Addr, Ipv6Addr) = (
        "fd12:3456:789a:5::1".parse().unwrap(),
        "fd12:3456:789a:7::1".parse().unwrap(),
    );
    let twice = |near| {
        let inner = relayed(&solicit, (near, peer), 1, Some(b"port3"));
        relayed(&inner, (far, near), 2, None)
    };
    // The client's link is the relay nearest it.
    let mut s = site_server();
    s.handle_request(t0(), &twice(near), relay());
    let address = claimed(&mut s);
    assert!(net("fd12:3456:789a:5::/64").contains(&address), "{address}");
    s.allocated(address, t0());
    let r = match outputs(&mut s).as_slice() {
        [Output::Reply(r)] => r.clone(),
        other => panic!("not one reply: {other:?}"),
    };
    let (hops, l, p, id, inner) = unwrap_reply(&r.bytes);
    assert_eq!((hops, l, p, id), (2, far, near, None));
    let (hops, l, p, id, inner) = unwrap_reply(&inner);
    assert_eq!(
        (hops, l, p, id.as_deref()),
        (1, near, peer, Some(&b"port3"[..]))
    );
    let m = Message::decode(&mut Decoder::new(&inner)).unwrap();
    assert_eq!(named_address(ia(&m)), Some(address));
    // A lightweight relay (RFC 6221) says no link (`::`): the next one's is used.
    let mut s = site_server();
    s.handle_request(t0(), &twice(Ipv6Addr::UNSPECIFIED), relay());
    let address = claimed(&mut s);
    assert!(net("fd12:3456:789a:7::/64").contains(&address), "{address}");
    // None says one: the agent's own LAN, the prefix's first /64 (as a client on it gets).
    let mut s = site_server();
    let lightweight = relayed(&solicit, (Ipv6Addr::UNSPECIFIED, peer), 0, Some(b"p1"));
    s.handle_request(t0(), &lightweight, relay());
    assert!(net("fd12:3456:789a::/64").contains(&claimed(&mut s)));
    let mut s = site_server();
    s.handle_request(t0(), &solicit, host());
    assert!(net("fd12:3456:789a::/64").contains(&claimed(&mut s)));
    // A /64 namespace: the whole prefix (a relayed link cannot be a /64 of it).
    let mut s = server();
    let link64: Ipv6Addr = "fd12:3456:789a::5:1".parse().unwrap();
    s.handle_request(t0(), &relayed(&solicit, (link64, peer), 0, None), relay());
    assert!(prefix().contains(&claimed(&mut s)));
}

#[test]
fn relayed_requests_from_outside_the_prefix_or_badly_wrapped_are_dropped_and_counted() {
    let mut s = server();
    let solicit = message(MessageType::Solicit, None, None);
    let peer: Ipv6Addr = "fe80::c".parse().unwrap();
    // The client's link is another network's.
    let m = relayed(&solicit, ("fd99::1".parse().unwrap(), peer), 0, None);
    s.handle_request(t0(), &m, relay());
    assert_eq!(outputs(&mut s), vec![]);
    assert_eq!((s.stats().relayed, s.stats().relay_outside_prefix), (1, 1));
    // Cut short, no Relay Message, a RELAY-REPL inside, an option past the end, nine relays.
    let link: Ipv6Addr = "fd12:3456:789a::5:1".parse().unwrap();
    let good = relayed(&solicit, (link, peer), 0, None);
    let mut no_message = good[..RELAY_HEADER].to_vec();
    no_message.extend_from_slice(&[0, 18, 0, 1, 7]);
    let mut repl_inside = relayed(&good, (link, peer), 1, None);
    repl_inside[RELAY_HEADER + 4] = RELAY_REPL;
    let mut overlong = good.clone();
    overlong[RELAY_HEADER + 3] += 1;
    let mut nine = solicit.clone();
    for hop in 0..9 {
        nine = relayed(&nine, (link, peer), hop, None);
    }
    let malformed = s.stats().malformed;
    for bad in [&good[..20], &no_message[..], &repl_inside, &overlong, &nine] {
        s.handle_request(t0(), bad, relay());
    }
    assert_eq!(outputs(&mut s), vec![]);
    assert_eq!(s.stats().malformed, malformed + 5);
    // Eight relays are allowed.
    let mut eight = solicit.clone();
    for hop in 0..8 {
        eight = relayed(&eight, (link, peer), hop, None);
    }
    s.handle_request(t0(), &eight, relay());
    assert!(matches!(outputs(&mut s).as_slice(), [Output::Claim { .. }]));
}
