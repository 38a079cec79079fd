//! The handoff among routers on a virtual clock: messages with latency, loss and
//! duplication, a DHT of leases with the transfer operation, LANs that answer probes.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use super::*;

const HOST: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 9, 0, 50));
const MAC: Mac = [0x52, 0x54, 0, 0x12, 0x34, 0x56];
const LEASE: Duration = Duration::from_secs(60);
const LATENCY: Duration = Duration::from_millis(20);
const DHT_LATENCY: Duration = Duration::from_millis(30);

type Id = u8;

/// Decides, from its number and content, what happens to a router message.
type Decide = Box<dyn FnMut(u64, &Message<Id>) -> bool>;

#[derive(Debug)]
enum Input {
    Message { from: Id, message: Message<Id> },
    Presence(Presence),
    Lookup(IpAddr, Lookup<Id>),
    Claim(IpAddr, ClaimOutcome<Id>),
    Transfer(IpAddr, TransferOutcome),
}

/// The replicas' view of one lease, as `records` keeps it: a holder until a time.
#[derive(Debug, Clone, Copy)]
struct Lease {
    holder: Id,
    until: Instant,
}

struct Net {
    now: Instant,
    routers: BTreeMap<Id, Migrate<Id>>,
    dead: Vec<Id>,
    /// Which router's LAN the host is on (`None`: in flight between hypervisors).
    host_at: Option<Id>,
    dht: HashMap<IpAddr, Lease>,
    /// (deliver at, sequence, to, input); the sequence keeps delivery order stable.
    queue: Vec<(Instant, u64, Id, Input)>,
    seq: u64,
    /// Decides whether the n-th router message is lost.
    lose: Decide,
    /// Decides whether the n-th router message is delivered twice.
    duplicate: Decide,
    sent: u64,
    events: Vec<(Id, Event<Id>)>,
    pushes: Vec<(Id, Message<Id>)>,
    /// Every router message sent (pushes one per member): from, to, message.
    messages: Vec<(Id, Id, Message<Id>)>,
    /// Every DHT lookup asked: by whom, of which address.
    lookups: Vec<(Id, IpAddr)>,
    probes: Vec<(Id, IpAddr)>,
    /// The DHT's claim and transfer history, to check no third member held the lease.
    holders: Vec<Id>,
}

/// Router `id`'s signed record for the host's address (opaque to the state machines).
fn record(id: Id) -> Vec<u8> {
    vec![0xec, id]
}

fn state() -> HostState {
    HostState {
        mac: Some(MAC),
        dhcp: Some(DhcpLease {
            client: MAC.to_vec(),
            remaining: Duration::from_secs(3000),
        }),
        names: vec!["vm1".into(), "host-10-9-0-50".into()],
    }
}

impl Net {
    /// Routers 1..=n; router 1 holds the host, which is on its LAN.
    fn new(n: Id) -> Self {
        // The virtual clock's origin; from here on time only moves by `run`.
        #[allow(clippy::disallowed_methods)]
        let now = Instant::now();
        let routers = (1..=n)
            .map(|id| (id, Migrate::new(Config::default(), id)))
            .collect();
        let mut dht = HashMap::new();
        dht.insert(
            HOST,
            Lease {
                holder: 1,
                until: now + LEASE,
            },
        );
        Self {
            now,
            routers,
            dead: Vec::new(),
            host_at: Some(1),
            dht,
            queue: Vec::new(),
            seq: 0,
            lose: Box::new(|_, _| false),
            duplicate: Box::new(|_, _| false),
            sent: 0,
            events: Vec::new(),
            pushes: Vec::new(),
            messages: Vec::new(),
            lookups: Vec::new(),
            probes: Vec::new(),
            holders: vec![1],
        }
    }

    fn holder(&self, address: IpAddr) -> Option<Lease> {
        self.dht
            .get(&address)
            .copied()
            .filter(|l| l.until > self.now)
    }

    fn holds(&self, id: Id, address: IpAddr) -> bool {
        self.holder(address).is_some_and(|l| l.holder == id)
    }

    fn push(&mut self, at: Instant, to: Id, input: Input) {
        self.seq += 1;
        self.queue.push((at, self.seq, to, input));
    }

    /// The host moves to `to`'s LAN and announces itself there.
    fn host_moves(&mut self, to: Id, announce: Announce) {
        self.host_at = Some(to);
        let address = (announce != Announce::Rarp).then_some(HOST);
        let presence = Presence {
            address,
            mac: MAC,
            announce,
        };
        self.push(self.now, to, Input::Presence(presence));
    }

    fn kill(&mut self, id: Id) {
        self.dead.push(id);
    }

    /// Live holders renew their leases (the agent's claims do, a third of a lease apart).
    fn renew(&mut self) {
        let now = self.now;
        for lease in self.dht.values_mut() {
            if lease.until > now && !self.dead.contains(&lease.holder) {
                lease.until = now + LEASE;
            }
        }
    }

    fn deliver(&mut self, to: Id, input: Input) {
        if self.dead.contains(&to) {
            return;
        }
        let now = self.now;
        let held = |net: &Net, a: IpAddr| net.holds(to, a);
        match input {
            Input::Message {
                from,
                message: Message::WhoHas { mac },
            } => {
                // The agent's LAN table: the holder of the host's address knows its MAC.
                let found = (mac == MAC && held(self, HOST)).then_some(HOST);
                if let Some(r) = self.routers.get_mut(&to) {
                    r.handle_who_has(from, mac, found);
                }
            }
            Input::Message { from, message } => {
                let address = match &message {
                    Message::Request { address, .. }
                    | Message::Reply { address, .. }
                    | Message::Moved { address, .. }
                    | Message::IsAt { address, .. } => Some(*address),
                    Message::WhoHas { .. } => None,
                };
                let held = address.is_some_and(|a| held(self, a));
                if let Some(r) = self.routers.get_mut(&to) {
                    r.handle_message(now, from, message, held);
                }
            }
            Input::Presence(p) => {
                let held = p.address.is_some_and(|a| held(self, a));
                if let Some(r) = self.routers.get_mut(&to) {
                    r.handle_presence(now, p, held);
                }
            }
            Input::Lookup(a, l) => {
                if let Some(r) = self.routers.get_mut(&to) {
                    r.handle_lookup(now, a, l, record(to));
                }
            }
            Input::Claim(a, c) => {
                if let Some(r) = self.routers.get_mut(&to) {
                    r.handle_claim(now, a, c);
                }
            }
            Input::Transfer(a, t) => {
                if let Some(r) = self.routers.get_mut(&to) {
                    r.handle_transfer(now, a, t, state());
                }
            }
        }
    }

    /// The replicas' answer to `op` from `id`, as `records` gives it.
    fn dht_op(&mut self, id: Id, op: DhtOp<Id>) -> Input {
        let lookup = |net: &Net, a: IpAddr| match net.holder(a) {
            Some(l) => Lookup::Held(Holder {
                member: l.holder,
                remaining: l.until - net.now,
            }),
            None => Lookup::Free,
        };
        match op {
            DhtOp::Lookup(a) => {
                self.lookups.push((id, a));
                Input::Lookup(a, lookup(self, a))
            }
            DhtOp::Claim(a) => match self.holder(a) {
                Some(l) if l.holder != id => Input::Claim(
                    a,
                    ClaimOutcome::Held(Holder {
                        member: l.holder,
                        remaining: l.until - self.now,
                    }),
                ),
                _ => {
                    self.dht.insert(
                        a,
                        Lease {
                            holder: id,
                            until: self.now + LEASE,
                        },
                    );
                    self.holders.push(id);
                    Input::Claim(a, ClaimOutcome::Won)
                }
            },
            DhtOp::Transfer {
                address,
                to,
                record: signed,
            } => {
                // Only the holder can transfer; the record kept is the new holder's own.
                assert_eq!(signed, record(to), "the asker's record, passed on");
                if !self.holds(id, address) {
                    return Input::Transfer(address, TransferOutcome::NotHolder);
                }
                self.dht.insert(
                    address,
                    Lease {
                        holder: to,
                        until: self.now + LEASE,
                    },
                );
                self.holders.push(to);
                Input::Transfer(address, TransferOutcome::Done)
            }
        }
    }

    /// One router message on its way, lost or duplicated as `lose` and `duplicate` say.
    fn send(&mut self, from: Id, to: Id, message: Message<Id>) {
        self.messages.push((from, to, message.clone()));
        self.sent += 1;
        let n = self.sent;
        if (self.lose)(n, &message) {
            return;
        }
        if (self.duplicate)(n, &message) {
            let input = Input::Message {
                from,
                message: message.clone(),
            };
            self.push(self.now + LATENCY * 2, to, input);
        }
        self.push(self.now + LATENCY, to, Input::Message { from, message });
    }

    fn drain(&mut self) {
        let ids: Vec<Id> = self.routers.keys().copied().collect();
        for id in ids {
            while let Some(out) = self.routers.get_mut(&id).and_then(Migrate::poll_output) {
                if self.dead.contains(&id) {
                    continue;
                }
                match out {
                    Output::Send { to, message } => self.send(id, to, message),
                    Output::Push(message) => {
                        self.pushes.push((id, message.clone()));
                        let others: Vec<Id> =
                            self.routers.keys().copied().filter(|o| *o != id).collect();
                        for to in others {
                            self.send(id, to, message.clone());
                        }
                    }
                    Output::Dht(op) => {
                        let input = self.dht_op(id, op);
                        self.push(self.now + DHT_LATENCY, id, input);
                    }
                    Output::Probe(a) => {
                        self.probes.push((id, a));
                        if self.host_at == Some(id) {
                            // ARP reply from the host: a frame from it on this LAN.
                            let p = Presence {
                                address: Some(a),
                                mac: MAC,
                                announce: Announce::Packet,
                            };
                            self.push(self.now + Duration::from_millis(1), id, Input::Presence(p));
                        }
                    }
                    Output::Event(e) => self.events.push((id, e)),
                }
            }
        }
    }

    /// Runs the network for `span` of virtual time.
    fn run(&mut self, span: Duration) {
        let end = self.now + span;
        loop {
            self.drain();
            let timers = self
                .routers
                .iter()
                .filter(|(id, _)| !self.dead.contains(id))
                .filter_map(|(_, r)| r.poll_timeout());
            let queued = self.queue.iter().map(|q| q.0);
            let Some(next) = timers.chain(queued).min() else {
                break;
            };
            if next > end {
                break;
            }
            self.now = self.now.max(next);
            self.renew();
            self.queue.sort_by_key(|q| (q.0, q.1));
            let due: Vec<_> = {
                let split = self.queue.partition_point(|q| q.0 <= self.now);
                self.queue.drain(..split).collect()
            };
            for (_, _, to, input) in due {
                self.deliver(to, input);
            }
            let now = self.now;
            for (id, r) in &mut self.routers {
                if !self.dead.contains(id) && r.poll_timeout().is_some_and(|t| t <= now) {
                    r.handle_timeout(now);
                }
            }
        }
        self.now = end;
        self.renew();
    }

    fn took_over(&self, id: Id) -> Vec<(Option<Id>, HostState, Duration)> {
        self.events
            .iter()
            .filter(|(i, _)| *i == id)
            .filter_map(|(_, e)| match e {
                Event::TookOver {
                    from, state, took, ..
                } => Some((*from, state.clone(), *took)),
                _ => None,
            })
            .collect()
    }

    fn count(&self, id: Id, pred: impl Fn(&Event<Id>) -> bool) -> usize {
        self.events
            .iter()
            .filter(|(i, e)| *i == id && pred(e))
            .count()
    }
}

#[test]
fn garp_moves_the_lease_and_state_in_under_half_a_second() {
    let mut net = Net::new(3);
    net.host_moves(2, Announce::GratuitousArp);
    net.run(Duration::from_secs(1));
    // Forwarding to the new holder for the grace period, then not.
    assert_eq!(net.routers[&1].forward_to(HOST, net.now), Some(2));
    net.run(GRACE);
    assert_eq!(net.routers[&1].forward_to(HOST, net.now), None);
    assert!(net.holds(2, HOST), "router 2 holds the host's address");
    let took = net.took_over(2);
    assert_eq!(took.len(), 1, "{:?}", net.events);
    let (from, got, duration) = &took[0];
    assert_eq!(*from, Some(1));
    assert_eq!(*got, state(), "DHCP lease and names came along");
    // Lookup 30 ms, request 20 ms, 3 probes 300 ms, transfer 30 ms, reply 20 ms.
    assert!(*duration <= Duration::from_millis(500), "{duration:?}");
    assert_eq!(net.holders, vec![1, 2], "no one else held it in between");
    assert_eq!(net.probes.iter().filter(|p| p.0 == 1).count(), 3);
    let moved = Message::Moved {
        address: HOST,
        to: 2,
    };
    assert_eq!(net.pushes, vec![(1, moved)], "members told at once");
    let r1 = &net.routers[&1];
    assert_eq!(r1.stats().handoffs_out, 1);
    assert_eq!(net.routers[&2].stats().handoffs_in, 1);
    assert_eq!(r1.poll_timeout(), None, "nothing left to do");
}

#[test]
fn an_ipv6_address_moves_by_the_same_handoff_on_its_own() {
    let mut net = Net::new(2);
    let host6: IpAddr = "fd00::50".parse::<Ipv6Addr>().expect("an address").into();
    let until = net.now + LEASE;
    net.dht.insert(host6, Lease { holder: 1, until });
    // The host is on router 2's LAN and sends an unsolicited neighbour advertisement.
    net.host_at = Some(2);
    let presence = Presence {
        address: Some(host6),
        mac: MAC,
        announce: Announce::NeighbourAdvertisement,
    };
    net.push(net.now, 2, Input::Presence(presence));
    net.run(Duration::from_secs(1));
    assert!(net.holds(2, host6), "{:?}", net.events);
    assert!(
        net.holds(1, HOST),
        "the IPv4 address moves by its own handoff"
    );
    assert_eq!(net.probes, vec![(1, host6); 3], "solicited on the old LAN");
    let took = net.took_over(2);
    assert_eq!(took.len(), 1, "{:?}", net.events);
    assert!(took[0].2 <= Duration::from_millis(500), "{:?}", took[0].2);
    assert_eq!(net.routers[&1].forward_to(host6, net.now), Some(2));
    assert_eq!(net.routers[&1].forward_to(HOST, net.now), None);
}

#[test]
fn a_host_that_never_left_is_kept() {
    let mut net = Net::new(2);
    // Router 2 sees a frame with the host's address (a duplicate address, a stray frame),
    // but the host still answers on router 1's LAN.
    let presence = Presence {
        address: Some(HOST),
        mac: MAC,
        announce: Announce::GratuitousArp,
    };
    net.push(net.now, 2, Input::Presence(presence));
    net.run(Duration::from_secs(5));
    assert!(net.holds(1, HOST));
    assert!(net.took_over(2).is_empty());
    assert_eq!(
        net.count(2, |e| matches!(e, Event::Refused { holder: 1, .. })),
        1
    );
    assert_eq!(
        net.count(1, |e| matches!(e, Event::Kept { asker: 2, .. })),
        1
    );
    assert_eq!(net.routers[&1].stats().kept, 1);
    assert!(net.pushes.is_empty());
    // One probe was enough: it was answered.
    assert_eq!(net.probes.len(), 1);
}

#[test]
fn lost_requests_and_replies_are_retried() {
    let mut net = Net::new(2);
    // Lose the first request and the first reply.
    net.lose = Box::new(|n, m| {
        (n == 1 && matches!(m, Message::Request { .. }))
            || matches!(m, Message::Reply { .. }) && n <= 3
    });
    net.host_moves(2, Announce::GratuitousArp);
    net.run(Duration::from_secs(10));
    assert!(net.holds(2, HOST));
    let took = net.took_over(2);
    assert_eq!(took.len(), 1, "{:?}", net.events);
    assert_eq!(
        took[0].1,
        state(),
        "the repeated reply carries the state too"
    );
    assert_eq!(net.holders, vec![1, 2], "one transfer, not two");
    assert!(
        took[0].2 <= Config::default().request_retry * 3,
        "{:?}",
        took[0].2
    );
}

#[test]
fn duplicated_messages_change_nothing() {
    let mut net = Net::new(2);
    net.duplicate = Box::new(|_, _| true);
    net.host_moves(2, Announce::GratuitousArp);
    net.run(Duration::from_secs(10));
    assert!(net.holds(2, HOST));
    assert_eq!(net.took_over(2).len(), 1);
    assert_eq!(net.routers[&1].stats().handoffs_out, 1);
    assert_eq!(net.holders, vec![1, 2]);
    assert_eq!(
        net.probes.len(),
        3,
        "one probe series for the duplicated request"
    );
}

#[test]
fn a_dead_source_is_taken_over_when_its_lease_lapses() {
    let mut net = Net::new(2);
    net.kill(1);
    let start = net.now;
    net.host_moves(2, Announce::GratuitousArp);
    net.run(Duration::from_secs(5));
    assert!(!net.holds(2, HOST), "not before the lease lapses");
    let silent = net.count(2, |e| matches!(e, Event::SourceSilent { holder: 1, .. }));
    assert_eq!(silent, 1, "{:?}", net.events);
    net.run(LEASE);
    assert!(net.holds(2, HOST));
    let took = net.took_over(2);
    assert_eq!(took.len(), 1);
    assert_eq!(took[0].0, Some(1));
    // The bound: the requests (2 s) plus what was left of the lease (one lease).
    let c = Config::default();
    assert!(took[0].2 <= LEASE + c.request_retry * c.request_tries + DHT_LATENCY * 2);
    assert!(net.now - start >= took[0].2);
}

#[test]
fn a_target_dead_mid_handoff_leaves_no_state_behind() {
    let mut net = Net::new(2);
    net.host_moves(2, Announce::GratuitousArp);
    // The request is out and the probes run; then the target dies.
    net.run(Duration::from_millis(100));
    net.kill(2);
    net.run(Duration::from_secs(10));
    // The host left router 1's LAN: the lease went to the asker, which will lapse on the
    // replicas as it does not renew; the source keeps nothing.
    assert!(net.holder(HOST).is_none_or(|l| l.holder == 2));
    let r1 = &net.routers[&1];
    assert!(!r1.in_progress(HOST));
    assert_eq!(r1.poll_timeout(), None, "no timer left");
    net.run(LEASE);
    assert!(
        net.holder(HOST).is_none(),
        "lapsed: free for whoever sees the host next"
    );
}

#[test]
fn a_host_that_moves_back_during_the_probes_stays() {
    let mut net = Net::new(2);
    net.host_moves(2, Announce::GratuitousArp);
    // The request arrives after lookup (30 ms) and the message (20 ms); the first probe
    // goes unanswered, then the host is back on router 1's LAN.
    net.run(Duration::from_millis(60));
    net.host_moves(1, Announce::GratuitousArp);
    net.run(Duration::from_secs(5));
    assert!(net.holds(1, HOST));
    assert!(net.took_over(2).is_empty());
    assert_eq!(net.count(2, |e| matches!(e, Event::Refused { .. })), 1);
}

#[test]
fn a_host_that_moves_back_during_the_transfer_comes_back() {
    let mut net = Net::new(2);
    net.host_moves(2, Announce::GratuitousArp);
    // Lookup 30 + request 20 + three probes 300 ms: the transfer is out at ~350 ms.
    net.run(Duration::from_millis(360));
    net.host_moves(1, Announce::GratuitousArp);
    net.run(Duration::from_secs(10));
    assert!(net.holds(1, HOST), "{:?}", net.events);
    assert_eq!(net.took_over(2).len(), 1);
    assert_eq!(net.took_over(1).len(), 1, "taken back from router 2");
    assert_eq!(net.holders, vec![1, 2, 1]);
}

#[test]
fn two_targets_racing_are_served_in_turn() {
    let mut net = Net::new(3);
    // Routers 2 and 3 both see the host (a stale frame on 3's LAN); it is on 2's.
    net.host_moves(2, Announce::GratuitousArp);
    let stale = Presence {
        address: Some(HOST),
        mac: MAC,
        announce: Announce::Packet,
    };
    net.push(net.now, 3, Input::Presence(stale));
    net.run(Duration::from_secs(10));
    // Only one transfer: to one of them, never to a third party; if 3 won, 2 got it back.
    assert!(net.holds(2, HOST), "{:?}", net.events);
    let holders = net.holders.clone();
    assert_eq!(holders.first(), Some(&1));
    assert_eq!(holders.last(), Some(&2));
    assert!(holders.iter().all(|h| [1, 2, 3].contains(h)));
    assert!(net.count(3, |e| matches!(e, Event::GaveUp { .. })) == 0);
}

#[test]
fn a_free_address_is_claimed_at_once() {
    let mut net = Net::new(2);
    net.dht.clear();
    net.holders.clear();
    net.host_moves(2, Announce::Packet);
    net.run(Duration::from_secs(1));
    assert!(net.holds(2, HOST));
    assert_eq!(net.took_over(2)[0].0, None);
    assert!(net.probes.is_empty());
}

#[test]
fn moved_is_taken_only_from_the_current_route() {
    assert!(accept_moved(&1, Some(&1)));
    assert!(
        !accept_moved(&3, Some(&1)),
        "a third member cannot redirect"
    );
    assert!(!accept_moved(&1, None));
}

#[test]
fn twenty_moves_back_and_forth() {
    let mut net = Net::new(3);
    for i in 0..20 {
        let to = if i % 2 == 0 { 2 } else { 1 };
        let how = if i % 4 < 2 {
            Announce::Rarp
        } else {
            Announce::GratuitousArp
        };
        net.host_moves(to, how);
        net.run(Duration::from_secs(2));
        assert!(net.holds(to, HOST), "move {i}: {:?}", net.events);
    }
    let a = net.routers[&1].stats();
    let b = net.routers[&2].stats();
    assert_eq!((a.handoffs_out, b.handoffs_in), (10, 10));
    assert_eq!((b.handoffs_out, a.handoffs_in), (10, 10));
}

#[test]
fn messages_survive_their_wire_form_and_member_mapping() {
    let reply: Message<u8> = Message::Reply {
        id: 7,
        address: Ipv4Addr::new(10, 1, 0, 9).into(),
        answer: Answer::Transferred(HostState {
            mac: Some([2, 0, 0, 0, 0, 9]),
            dhcp: Some(DhcpLease {
                client: vec![1, 2, 0, 0, 0, 0, 9],
                remaining: Duration::from_secs(3000),
            }),
            names: vec!["vm9".into()],
        }),
    };
    let json = serde_json::to_string(&reply).expect("serializes");
    let back: Message<u8> = serde_json::from_str(&json).expect("parses");
    assert_eq!(back, reply);
    // An IPv4 address reads as it did when the messages named IPv4 only (older agents).
    assert!(json.contains(r#""address":"10.1.0.9""#), "{json}");
    let moved = Message::Moved {
        address: "fd00::9".parse::<Ipv6Addr>().expect("an address").into(),
        to: 3u8,
    };
    let json = serde_json::to_string(&moved).expect("serializes");
    assert!(json.contains(r#""address":"fd00::9""#), "{json}");
    assert_eq!(
        serde_json::from_str::<Message<u8>>(&json).ok(),
        Some(moved.clone())
    );
    assert_eq!(
        moved.clone().map_members(|p| Some(u16::from(p) * 100)),
        Some(Message::Moved {
            address: "fd00::9".parse::<Ipv6Addr>().expect("an address").into(),
            to: 300u16
        })
    );
    assert_eq!(
        moved.map_members(|_| None::<u16>),
        None,
        "a refused name drops it"
    );
    let garbage: Result<Message<u8>, _> = serde_json::from_str("{\"Moved\":{\"address\":1}}");
    assert!(garbage.is_err());
}

mod mac;
