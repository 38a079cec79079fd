//! Membership on a virtual clock against a model of the replicas: one store that grants a
//! lease to the first claimer until it lapses (what a majority of honest replicas does),
//! answers reads and keeps the group. No libp2p, no sleeping.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use super::*;
use crate::records::{MemberInfo, NameInfo, OwnerKey, GROUP_ENTRY_TTL};

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
        subnets: Vec::new(),
        reserved: Vec::new(),
        address,
        lease: LEASE,
        hostname: None,
        previous: None,
        prefix6: None,
        address6: crate::membership::Address6::None,
    }
}

/// The replicas, as one honest store: leases, reads and the group.
#[derive(Default)]
struct Replicas {
    leases: HashMap<RecordKey, Envelope>,
    /// Group entries, each with when the replicas drop it ([`GROUP_ENTRY_TTL`] after the
    /// last announcement, or when its envelope expires).
    groups: HashMap<RecordKey, Vec<(Envelope, Instant)>>,
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

    /// Moves `from`'s live lease on `key` to `envelope`'s owner; refused (naming the
    /// holder) unless `from` holds it.
    fn transfer(
        &mut self,
        key: RecordKey,
        from: &[u8],
        envelope: Envelope,
        unix: u64,
    ) -> ClaimResult {
        match self.leases.get(&key) {
            Some(held) if Self::live(held, unix) && held.owner == from => {
                self.leases.insert(key, envelope);
                ClaimResult::Won
            }
            Some(held) if Self::live(held, unix) => {
                ClaimResult::Lost(Some(held.owner.clone().try_into().unwrap()))
            }
            _ => ClaimResult::Lost(None),
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
    /// Every claim carried out: its key and whether it was marked a renewal.
    claim_log: Vec<(RecordKey, bool)>,
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
            claim_log: Vec::new(),
        }
    }

    fn unix(&self) -> u64 {
        UNIX0 + self.now.duration_since(self.start).as_secs()
    }

    fn add(&mut self, config: Config, seed: u8) -> usize {
        let identity = Identity::from_seed([seed; 32]);
        let mut m = Membership::new(config, identity, [seed; 32], self.now, self.unix());
        m.set_endpoints(self.now, vec![SocketAddr::from(([192, 0, 2, seed], 7400))]);
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
            Request::Claim { key, .. }
            | Request::Transfer { key, .. }
            | Request::Get { key }
            | Request::GetNear { key }
            | Request::Members { key } => self.mute.contains(key),
            Request::Release { .. } | Request::Announce { .. } => false,
        };
        let answer = match request {
            Request::Claim {
                key,
                envelope,
                renewal,
            } => {
                self.claim_log.push((key, renewal));
                Answer::Claimed(self.replicas.claim(key, envelope, unix))
            }
            Request::Transfer { key, envelope } => {
                let from = self.members[i].identity.peer_id();
                Answer::Claimed(self.replicas.transfer(key, from.as_bytes(), envelope, unix))
            }
            Request::Get { key } | Request::GetNear { key } => Answer::Got(
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
                group.retain(|(e, _)| e.owner != envelope.owner);
                group.push((envelope, self.now + GROUP_ENTRY_TTL));
                return;
            }
            Request::Members { key } => Answer::Members(
                self.replicas
                    .groups
                    .get(&key)
                    .map(|g| {
                        g.iter()
                            .filter(|(e, until)| Replicas::live(e, unix) && *until > self.now)
                            .map(|(e, _)| e.clone())
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

mod address6;
mod addresses;
mod macs;
mod merge;
mod names;
mod resolution;
