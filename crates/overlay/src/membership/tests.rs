//! Membership on a virtual clock against a model of the replicas: one store that grants a
//! lease to the first claimer until it lapses (what a majority of honest replicas does),
//! answers reads and keeps the group. No libp2p, no sleeping.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use super::*;
use crate::records::{MemberInfo, NameInfo, OwnerKey};

const LEASE: Duration = Duration::from_secs(30);
const UNIX0: u64 = 1_700_000_000;

fn keys() -> NamespaceKeys {
    NamespaceKeys::derive("lab", b"0123456789abcdef")
}

fn subnet() -> Ipv4Net {
    "10.201.0.0/24".parse().unwrap()
}

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 201, 0, last)
}

fn config(address: Address) -> Config {
    Config {
        name: "lab".into(),
        keys: keys(),
        subnet: Some(subnet()),
        reserved: Vec::new(),
        address,
        lease: LEASE,
        hostname: None,
        previous: None,
    }
}

/// The replicas, as one honest store: leases, reads and the group.
#[derive(Default)]
struct Replicas {
    leases: HashMap<RecordKey, Envelope>,
    groups: HashMap<RecordKey, Vec<Envelope>>,
    claims: usize,
}

impl Replicas {
    fn live(e: &Envelope, unix: u64) -> bool {
        e.expires > unix
    }

    fn claim(&mut self, key: RecordKey, envelope: Envelope, unix: u64) -> ClaimResult {
        self.claims += 1;
        match self.leases.get(&key) {
            Some(held) if Self::live(held, unix) && held.owner != envelope.owner => {
                let holder: OwnerKey = held.owner.clone().try_into().unwrap();
                ClaimResult::Lost(Some(holder))
            }
            _ => {
                self.leases.insert(key, envelope);
                ClaimResult::Won
            }
        }
    }
}

/// Members driven on one virtual clock; each DHT answer arrives after `latency`.
struct Net {
    now: Instant,
    start: Instant,
    replicas: Replicas,
    members: Vec<Membership>,
    /// Members that stopped (crashed): nothing of theirs runs any more.
    down: Vec<bool>,
    events: Vec<Vec<Event>>,
    /// Results on their way: when, to whom, what.
    in_flight: Vec<(Instant, usize, Token, Answer)>,
    /// Keys whose operations are carried out but never answered (the answer is lost).
    mute: Vec<RecordKey>,
    latency: Duration,
}

enum Answer {
    Claimed(ClaimResult),
    Got(Vec<Envelope>),
    Members(Vec<Envelope>),
}

impl Net {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            now,
            start: now,
            replicas: Replicas::default(),
            members: Vec::new(),
            down: Vec::new(),
            events: Vec::new(),
            in_flight: Vec::new(),
            mute: Vec::new(),
            latency: Duration::from_millis(50),
        }
    }

    fn unix(&self) -> u64 {
        UNIX0 + self.now.duration_since(self.start).as_secs()
    }

    fn add(&mut self, config: Config, seed: u8) -> usize {
        let identity = Identity::from_seed([seed; 32]);
        let mut m = Membership::new(config, identity, [seed; 32], self.now, self.unix());
        m.set_endpoints(vec![SocketAddr::from(([192, 0, 2, seed], 7400))]);
        m.start(self.now);
        self.members.push(m);
        self.down.push(false);
        self.events.push(Vec::new());
        self.members.len() - 1
    }

    fn id(&self, i: usize) -> PeerId {
        self.members[i].identity.peer_id()
    }

    /// Carries out what members asked for; delivers what is due.
    fn settle(&mut self) {
        loop {
            let mut progressed = false;
            for i in 0..self.members.len() {
                if self.down[i] {
                    continue;
                }
                if self.members[i]
                    .poll_timeout()
                    .is_some_and(|t| t <= self.now)
                {
                    let unix = self.unix();
                    self.members[i].handle_timeout(self.now, unix);
                }
                while let Some((token, request)) = self.members[i].poll_request() {
                    progressed = true;
                    self.carry_out(i, token, request);
                }
                while let Some(e) = self.members[i].poll_event() {
                    progressed = true;
                    self.events[i].push(e);
                }
            }
            let now = self.now;
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.in_flight)
                .into_iter()
                .partition(|(t, ..)| *t <= now);
            self.in_flight = later;
            for (_, i, token, answer) in due {
                if self.down[i] {
                    continue;
                }
                progressed = true;
                let m = &mut self.members[i];
                match answer {
                    Answer::Claimed(r) => m.handle_claimed(now, token, &r),
                    Answer::Got(e) => m.handle_got(now, token, &e),
                    Answer::Members(e) => m.handle_members(now, token, &e),
                }
            }
            if !progressed {
                return;
            }
        }
    }

    fn carry_out(&mut self, i: usize, token: Token, request: Request) {
        let unix = self.unix();
        let muted = match &request {
            Request::Claim { key, .. } | Request::Get { key } | Request::Members { key } => {
                self.mute.contains(key)
            }
            Request::Release { .. } | Request::Announce { .. } => false,
        };
        let answer = match request {
            Request::Claim { key, envelope } => {
                Answer::Claimed(self.replicas.claim(key, envelope, unix))
            }
            Request::Get { key } => Answer::Got(
                self.replicas
                    .leases
                    .get(&key)
                    .filter(|e| Replicas::live(e, unix))
                    .cloned()
                    .into_iter()
                    .collect(),
            ),
            Request::Release { key } => {
                let owner = self.members[i].identity.peer_id();
                if self
                    .replicas
                    .leases
                    .get(&key)
                    .is_some_and(|e| e.owner == owner.as_bytes())
                {
                    self.replicas.leases.remove(&key);
                }
                return;
            }
            Request::Announce { key, envelope } => {
                let group = self.replicas.groups.entry(key).or_default();
                group.retain(|e| e.owner != envelope.owner);
                group.push(envelope);
                return;
            }
            Request::Members { key } => Answer::Members(
                self.replicas
                    .groups
                    .get(&key)
                    .map(|g| {
                        g.iter()
                            .filter(|e| Replicas::live(e, unix))
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default(),
            ),
        };
        if !muted {
            self.in_flight
                .push((self.now + self.latency, i, token, answer));
        }
    }

    /// Advances the clock to `until`, stopping at every deadline on the way.
    fn run_until(&mut self, until: Instant) {
        self.settle();
        loop {
            let next = self
                .members
                .iter()
                .zip(&self.down)
                .filter(|(_, down)| !**down)
                .filter_map(|(m, _)| m.poll_timeout())
                .chain(self.in_flight.iter().map(|(t, ..)| *t))
                .filter(|t| *t <= until)
                .min();
            match next {
                Some(t) => {
                    self.now = self.now.max(t);
                    self.settle();
                }
                None => break,
            }
        }
        self.now = until;
        self.settle();
    }

    fn run_for(&mut self, d: Duration) {
        let until = self.now + d;
        self.run_until(until);
    }

    fn take_events(&mut self, i: usize) -> Vec<Event> {
        std::mem::take(&mut self.events[i])
    }

    fn won(&self, i: usize) -> Option<Ipv4Addr> {
        self.events[i].iter().rev().find_map(|e| match e {
            Event::AddressWon(a) => Some(*a),
            _ => None,
        })
    }

    /// The member a lease's record names, if it is live.
    fn holder(&self, key: &RecordKey) -> Option<Vec<u8>> {
        let unix = self.unix();
        self.replicas
            .leases
            .get(key)
            .filter(|e| Replicas::live(e, unix))
            .map(|e| e.owner.clone())
    }
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
    let due = net.members[a].poll_timeout().unwrap();
    // The group announcement and the record's renewal come at a third of the lease.
    assert!(
        due > net.now + LEASE / 3 - Duration::from_secs(2),
        "{due:?}"
    );
    assert!(due <= net.now + LEASE / 3, "{due:?}");
    net.run_for(LEASE / 3);
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
    net.mute.push(keys().address_key(ip(10)));
    let a = net.add(config(Address::Static(ip(10))), 1);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[a].owned(), None);
    net.mute.clear();
    // The lost answer never comes: a claim in flight blocks its retry, so the driver's
    // overlay answers every operation (a timeout is a `Lost(None)`).
    let token = net.members[a]
        .ops
        .iter()
        .find(|(_, p)| matches!(p, Purpose::Own(_)))
        .map(|(t, _)| *t)
        .unwrap();
    net.members[a].handle_claimed(net.now, token, &ClaimResult::Lost(None));
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
fn a_lan_host_whose_address_another_member_owns_is_counted_and_retried() {
    let mut net = Net::new();
    let a = net.add(config(Address::Static(ip(20))), 1);
    let r = net.add(config(Address::None), 2);
    net.run_for(Duration::from_secs(1));
    let now = net.now;
    net.members[r].add_hosted(ip(20), now);
    net.run_for(Duration::from_secs(1));
    assert!(net.members[r].addresses().is_empty());
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
    assert!(conflict.unwrap().contains("10.201.0.0/24"));
}

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

    // Nobody holds .99: its frames are dropped, and it is not looked up again at once.
    let now = net.now;
    assert!(net.members[a].hold(now, ip(99), b"x"));
    net.run_for(Duration::from_millis(100));
    assert_eq!(net.members[a].unresolved_drops(), 1);
    assert!(!net.members[a].hold(net.now, ip(99), b"y"));
    assert_eq!(net.members[a].unresolved_drops(), 2);

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
    let a = net.add(config(Address::Static(ip(10))), 1);
    let b = net.add(config(Address::Static(ip(11))), 2);
    let c = net.add(config(Address::Static(ip(12))), 3);
    net.run_for(Duration::from_secs(2));
    let last_group = |net: &Net, i: usize| {
        net.events[i].iter().rev().find_map(|e| match e {
            Event::Group(g) => Some(g.iter().map(|(p, _)| *p).collect::<Vec<_>>()),
            _ => None,
        })
    };
    let mut seen = last_group(&net, a).unwrap();
    seen.sort();
    let mut others = vec![net.id(b), net.id(c)];
    others.sort();
    assert_eq!(seen, others);
    // c crashes: once its entry lapses, the next read leaves it out.
    net.down[c] = true;
    net.run_for(LEASE + GROUP_REFRESH);
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
    net.mute.push(keys().address_key(ip(10)));
    let a = net.add(config(Address::Static(ip(10))), 1);
    net.run_for(Duration::from_secs(1));
    net.mute.clear();
    let token = net.members[a]
        .ops
        .iter()
        .find(|(_, p)| matches!(p, Purpose::Own(_)))
        .map(|(t, _)| *t)
        .unwrap();
    net.members[a].handle_claimed(net.now, token, &ClaimResult::Lost(None));
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
