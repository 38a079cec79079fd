//! Resolving other members' addresses: frames for an address nobody is known to hold wait
//! while the address record is read, then go to the member it names.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use super::{Event, Membership, Purpose, Request};
use crate::records::{Envelope, MemberInfo, NameInfo, RecordKey, Subject};
use crate::PeerId;

/// Frames held per unresolved address; beyond, new ones are dropped.
pub const MAX_PENDING_FRAMES: usize = 16;

/// Unresolved addresses tracked at once per namespace.
pub const MAX_PENDING_TARGETS: usize = 256;

/// How long frames wait for a resolution (and for the member's tunnel) before being dropped.
pub const PENDING_TIMEOUT: Duration = Duration::from_secs(5);

/// After a lookup finds no owner, the address is not looked up again for this long.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(2);

/// A resolved address is looked up again after this long if still in use.
pub const RESOLVED_TTL: Duration = Duration::from_secs(60);

/// Frames waiting for an address to resolve.
#[derive(Debug)]
pub struct Pending {
    /// The frames, oldest first.
    pub frames: Vec<Vec<u8>>,
    /// When the first one arrived.
    pub since: Instant,
}

/// A member that owns an address, as read from the DHT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The address (IPv4, or IPv6 in a dual-stack namespace).
    pub target: IpAddr,
    /// Its owner.
    pub member: PeerId,
    /// Where to reach it.
    pub endpoints: Vec<SocketAddr>,
}

/// The resolve cache and the frames waiting on it.
#[derive(Debug, Default)]
pub(super) struct Resolver {
    pending: HashMap<IpAddr, Pending>,
    /// Addresses being read.
    resolving: HashSet<IpAddr>,
    /// When each address was last found owned.
    looked_up: HashMap<IpAddr, Instant>,
    /// Addresses found unowned, until when.
    negative: HashMap<IpAddr, Instant>,
    pub(super) unresolved_drops: u64,
    pub(super) lookups: u64,
}

impl Resolver {
    /// Frames whose wait is over are dropped; old cache entries go.
    pub(super) fn expire(&mut self, now: Instant) {
        let mut dropped = 0;
        self.pending.retain(|_, p| {
            let keep = now.saturating_duration_since(p.since) < PENDING_TIMEOUT;
            if !keep {
                dropped += p.frames.len() as u64;
            }
            keep
        });
        self.unresolved_drops += dropped;
        self.negative.retain(|_, t| now < *t);
        self.looked_up
            .retain(|_, t| now.saturating_duration_since(*t) < RESOLVED_TTL);
    }

    /// When the oldest wait ends.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.pending
            .values()
            .map(|p| p.since + PENDING_TIMEOUT)
            .min()
    }

    pub(super) fn clear(&mut self) {
        self.pending.clear();
        self.resolving.clear();
    }
}

impl Membership {
    /// Holds `frame` until `target` resolves; starts the lookup if none is running.
    /// Returns false (and counts a drop) when it cannot wait.
    pub fn hold(&mut self, now: Instant, target: impl Into<IpAddr>, frame: &[u8]) -> bool {
        let target = target.into();
        let r = &mut self.resolver;
        if self.left || r.negative.get(&target).is_some_and(|&t| now < t) {
            r.unresolved_drops += 1;
            return false;
        }
        if !r.pending.contains_key(&target) && r.pending.len() >= MAX_PENDING_TARGETS {
            r.unresolved_drops += 1;
            return false;
        }
        let pending = r.pending.entry(target).or_insert_with(|| Pending {
            frames: Vec::new(),
            since: now,
        });
        if pending.frames.len() >= MAX_PENDING_FRAMES {
            r.unresolved_drops += 1;
            return false;
        }
        pending.frames.push(frame.to_vec());
        let recent = r
            .looked_up
            .get(&target)
            .is_some_and(|&t| now.saturating_duration_since(t) < RESOLVED_TTL);
        if !r.resolving.contains(&target) && !recent {
            r.lookups += 1;
            r.resolving.insert(target);
            let key = self.address_key_of(target);
            self.start_op(Request::Get { key }, Purpose::Resolve(target));
        }
        true
    }

    /// The address record of `target` was read.
    pub(super) fn resolved(&mut self, now: Instant, target: IpAddr, envelopes: &[Envelope]) {
        self.resolver.resolving.remove(&target);
        let key = self.address_key_of(target);
        let me = self.identity.peer_id();
        let found = self
            .read_first::<MemberInfo>(&key, now, envelopes)
            .filter(|(member, info)| *member != me && !info.endpoints.is_empty())
            .filter(|(_, info)| match (target, &info.subject) {
                // An IPv6 lease names its address (records before dual stack did not).
                (IpAddr::V6(a), subject) => *subject == Some(Subject::Address6(a)),
                (IpAddr::V4(_), _) => true,
            });
        let r = &mut self.resolver;
        match found {
            Some((member, info)) => {
                r.looked_up.insert(target, now);
                self.events.push_back(Event::Resolved(Resolved {
                    target,
                    member,
                    endpoints: info.endpoints,
                }));
            }
            None => {
                tracing::debug!(namespace = %self.name, %target, "no member owns this address");
                r.negative.insert(target, now + NEGATIVE_TTL);
                if let Some(p) = r.pending.remove(&target) {
                    r.unresolved_drops += p.frames.len() as u64;
                    self.events.push_back(Event::Unowned {
                        target,
                        frames: p.frames,
                    });
                }
            }
        }
    }

    /// Whether the last lookup of `target` found no member holding it, and is still recent
    /// ([`NEGATIVE_TTL`]): frames for it are dropped at once.
    pub fn unowned(&self, now: Instant, target: impl Into<IpAddr>) -> bool {
        self.resolver
            .negative
            .get(&target.into())
            .is_some_and(|&t| now < t)
    }

    /// `addresses` lost their member: look them up afresh on the next packet.
    pub fn forget<A: Copy + Into<IpAddr>>(&mut self, addresses: &[A]) {
        for a in addresses {
            self.resolver.looked_up.remove(&(*a).into());
        }
    }

    /// Hands back the frames that waited for `addresses` (a member announced them, or
    /// its lease was read: its tunnel is the route now).
    pub fn take_pending<A: Copy + Into<IpAddr>>(&mut self, addresses: &[A]) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        for a in addresses {
            if let Some(p) = self.resolver.pending.remove(&(*a).into()) {
                frames.extend(p.frames);
            }
        }
        frames
    }
}

impl Membership {
    /// The key of the lease on `address`, IPv4 or IPv6.
    fn address_key_of(&self, address: IpAddr) -> RecordKey {
        match address {
            IpAddr::V4(a) => self.keys.address_key(a),
            IpAddr::V6(a) => self.keys.address6_key(a),
        }
    }

    /// Reads who holds the name `host` (for the DNS service): answered as
    /// [`Event::NameRead`].
    pub fn read_name(&mut self, host: &str) {
        let key = self.keys.name_key(host);
        self.start_op(Request::Get { key }, Purpose::ReadName(host.to_string()));
    }

    /// Reads who holds `address` and the name it carries (for the DNS service): answered
    /// as [`Event::HolderRead`].
    pub fn read_holder(&mut self, address: Ipv4Addr) {
        let key = self.keys.address_key(address);
        self.start_op(Request::Get { key }, Purpose::ReadHolder(address));
    }

    pub(super) fn name_read(&mut self, now: Instant, host: String, envelopes: &[Envelope]) {
        let key = self.keys.name_key(&host);
        let info = self
            .read_first::<NameInfo>(&key, now, envelopes)
            .map(|(_, info)| info);
        self.events.push_back(Event::NameRead {
            host,
            address: info.as_ref().map(|i| i.address),
            address6: info.and_then(|i| i.address6),
        });
    }

    pub(super) fn holder_read(&mut self, now: Instant, address: Ipv4Addr, envelopes: &[Envelope]) {
        let key = self.keys.address_key(address);
        let holder = self
            .read_first::<MemberInfo>(&key, now, envelopes)
            .map(|(_, info)| info.name);
        self.member_name_read(address, &holder);
        self.events.push_back(Event::HolderRead { address, holder });
    }
}
