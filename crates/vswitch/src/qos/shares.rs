//! Weighted fair shares of one uplink (issue 32, item 2; the KU paper's weight-based
//! bandwidth control): classes (a namespace each) share a rate by weight with deficit
//! round robin, and inside a class its flows share its turns the same way, so no single
//! flow starves the class's others (a ping does not wait behind a bulk transfer of its own
//! namespace). Work-conserving: a class or flow with nothing to send takes no turn, so its
//! share goes to the others at once; a class alone gets the whole rate.
//!
//! When a class's queue is full, the packet dropped is the tail of its fattest flow (as
//! fq_codel does), not the newcomer: a sparse flow keeps its place.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::{Paced, TokenBucket};

/// Bytes a class of weight 1, and each flow inside a class, may send per round: about one
/// full packet.
const QUANTUM: u64 = 1500;

/// Flow queues per class: flows are hashed onto them.
const FLOWS: usize = 256;

/// Emptied members' parts a class keeps for reuse.
const SPARE_MEMBERS: usize = 16;

/// The smallest queue a class gets, bytes.
const MIN_LIMIT: u64 = 16 * 1024;

#[derive(Debug, Clone)]
struct Flow<T> {
    queue: VecDeque<(T, usize)>,
    bytes: u64,
    deficit: u64,
}

/// A member's part of a class (one per member with a weight of its own, or one for the
/// whole class): its flows take turns inside its turn.
#[derive(Debug, Clone)]
struct Member<T> {
    weight: u64,
    flows: Vec<Flow<T>>,
    /// Flows with packets waiting, in round-robin order.
    active: VecDeque<usize>,
    queued_bytes: u64,
    queued: usize,
    deficit: u64,
}

impl<T> Member<T> {
    fn new(weight: u64) -> Self {
        Self {
            weight: weight.max(1),
            flows: (0..FLOWS)
                .map(|_| Flow {
                    queue: VecDeque::new(),
                    bytes: 0,
                    deficit: 0,
                })
                .collect(),
            active: VecDeque::new(),
            queued_bytes: 0,
            queued: 0,
            deficit: 0,
        }
    }

    /// Drops the last packet of its fattest flow but `keep` (if `keep` is its own flow, only
    /// a fatter one). Returns the bytes dropped.
    fn drop_from_fattest(&mut self, keep: Option<usize>) -> Option<usize> {
        let floor = keep.map_or(0, |k| self.flows[k].bytes);
        let (fattest, _) = self
            .flows
            .iter()
            .enumerate()
            .max_by_key(|(_, f)| f.bytes)
            .filter(|(i, f)| Some(*i) != keep && f.bytes > floor)?;
        let f = &mut self.flows[fattest];
        let (_, len) = f.queue.pop_back()?;
        f.bytes -= len as u64;
        self.queued_bytes -= len as u64;
        self.queued -= 1;
        if f.queue.is_empty() {
            f.deficit = 0;
            self.active.retain(|&i| i != fattest);
        }
        Some(len)
    }
}

#[derive(Debug, Clone)]
struct Class<T> {
    weight: u64,
    /// Its members' parts, by key ([`Shares::push_member`]); made when one first waits,
    /// gone when it has nothing waiting.
    members: HashMap<u64, Member<T>>,
    /// Members with packets waiting, in round-robin order.
    active: VecDeque<u64>,
    /// Emptied members' parts kept for reuse, so a backlog that comes and goes does not
    /// allocate a part's flows each time (at most [`SPARE_MEMBERS`]).
    spare: Vec<Member<T>>,
    queued_bytes: u64,
    queued: usize,
    deficit: u64,
    /// Bytes sent and packets dropped, for status.
    sent_bytes: u64,
    dropped: u64,
}

impl<T> Class<T> {
    fn new() -> Self {
        Self {
            weight: 1,
            members: HashMap::new(),
            active: VecDeque::new(),
            spare: Vec::new(),
            queued_bytes: 0,
            queued: 0,
            deficit: 0,
            sent_bytes: 0,
            dropped: 0,
        }
    }

    /// Member `key`'s part, made (or taken from the spares) if it has none.
    fn member(&mut self, key: u64, weight: u64) -> &mut Member<T> {
        let spare = &mut self.spare;
        let m = self
            .members
            .entry(key)
            .or_insert_with(|| spare.pop().unwrap_or_else(|| Member::new(weight)));
        m.weight = weight.max(1);
        m
    }

    /// Member `key` has nothing waiting: its part leaves the round and is kept for reuse.
    fn retire(&mut self, key: u64) {
        if let Some(m) = self.members.remove(&key) {
            if self.spare.len() < SPARE_MEMBERS {
                self.spare.push(m);
            }
        }
        self.active.retain(|&k| k != key);
    }

    /// Makes room by dropping the tail of the fattest flow of the member furthest over its
    /// weight's part of the queue (fq_codel's rule, one level up), unless that is
    /// `(member, flow)` itself with no fatter flow of its own. Returns whether one went.
    fn drop_for(&mut self, member: u64, flow: usize, weight: u64) -> bool {
        let own = self.members.get(&member).map_or(0, |m| m.queued_bytes);
        // Bytes over weight, compared across members as bytes / weight (cross-multiplied).
        let (&victim, _) =
            match self
                .members
                .iter()
                .filter(|(_, m)| m.queued > 0)
                .max_by(|(_, a), (_, b)| {
                    (u128::from(a.queued_bytes) * u128::from(b.weight))
                        .cmp(&(u128::from(b.queued_bytes) * u128::from(a.weight)))
                }) {
                Some(v) => v,
                None => return false,
            };
        let heavier = victim != member
            && self.members.get(&victim).is_some_and(|v| {
                u128::from(v.queued_bytes) * u128::from(weight.max(1))
                    > u128::from(own) * u128::from(v.weight)
            });
        let keep = (!heavier).then_some(flow);
        let target = if heavier { victim } else { member };
        let Some(m) = self.members.get_mut(&target) else {
            return false;
        };
        let Some(len) = m.drop_from_fattest(keep) else {
            return false;
        };
        self.queued_bytes -= len as u64;
        self.queued -= 1;
        self.dropped += 1;
        if m.queued == 0 {
            self.retire(target);
        }
        true
    }
}

/// What one class did, for status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Its weight.
    pub weight: u64,
    /// Bytes it sent.
    pub sent_bytes: u64,
    /// Packets it dropped: its queue held `max_delay` of the whole rate.
    pub dropped: u64,
    /// Packets waiting now.
    pub queued: usize,
}

/// An uplink of `rate` shared by weight between classes.
#[derive(Debug, Clone)]
pub struct Shares<T> {
    bucket: TokenBucket,
    classes: Vec<Class<T>>,
    /// Classes with packets waiting, in round-robin order; the front has the turn.
    active: VecDeque<usize>,
    /// Most bytes the classes' queues hold together: `max_delay` at the rate. Each class
    /// holds its weight's part of it, so that draining at its share it too waits at most
    /// `max_delay`.
    limit: u64,
    weights: u64,
}

impl<T> Shares<T> {
    /// An uplink of `rate_bits` a second (a burst of `burst` bytes), each class's queue
    /// holding at most `max_delay` at its weight's share of that rate (at least 16 KiB).
    pub fn new(rate_bits: u64, burst: u64, max_delay: Duration) -> Self {
        let bucket = TokenBucket::new(rate_bits, burst);
        let limit = u64::try_from(u128::from(bucket.rate()) * max_delay.as_nanos() / super::NANO)
            .unwrap_or(u64::MAX);
        Self {
            bucket,
            classes: Vec::new(),
            active: VecDeque::new(),
            limit,
            weights: 0,
        }
    }

    /// Sets class `class`'s weight (1 or more); classes are numbered from 0 and made as
    /// needed, weight 1 by default.
    pub fn set_weight(&mut self, class: usize, weight: u64) {
        self.ensure(class);
        self.classes[class].weight = weight.max(1);
        self.weights = self.classes.iter().map(|c| c.weight).sum();
    }

    fn ensure(&mut self, class: usize) {
        while self.classes.len() <= class {
            self.classes.push(Class::new());
            self.weights += 1;
        }
    }

    /// What class `class` did.
    pub fn stats(&self, class: usize) -> Option<ClassStats> {
        self.classes.get(class).map(|c| ClassStats {
            weight: c.weight,
            sent_bytes: c.sent_bytes,
            dropped: c.dropped,
            queued: c.queued,
        })
    }

    /// The uplink's rate, bits a second.
    pub fn rate_bits(&self) -> u64 {
        self.bucket.rate() * 8
    }

    /// Whether `len` bytes of class `class` may go at `now` without waiting: nothing
    /// waits in any class and the rate allows them. Counted as sent if so; else
    /// [`Shares::push`] them.
    pub fn send_now(&mut self, now: Instant, class: usize, len: usize) -> bool {
        self.ensure(class);
        if self.active.is_empty() && self.bucket.take(now, len) {
            self.classes[class].sent_bytes += len as u64;
            return true;
        }
        false
    }

    /// An item of class `class`, flow `flow` (a hash of its addresses and ports) and `len`
    /// bytes at `now`: now if nothing waits and the rate allows it, else queued behind its
    /// flow. A full class queue drops the tail of its fattest flow to make room, or this
    /// item if its own flow is the fattest.
    pub fn push(&mut self, now: Instant, class: usize, flow: u64, item: T, len: usize) -> Paced<T> {
        self.push_member(now, class, (0, 1), flow, item, len)
    }

    /// [`Shares::push`] for an item of member `member` (a key and its weight) of the class:
    /// inside the class's turn, members with packets waiting take turns by weight, and
    /// inside a member's turn its flows share it. A full class queue drops from the member
    /// furthest over its weight's part.
    pub fn push_member(
        &mut self,
        now: Instant,
        class: usize,
        member: (u64, u64),
        flow: u64,
        item: T,
        len: usize,
    ) -> Paced<T> {
        if self.send_now(now, class, len) {
            return Paced::Now(item);
        }
        let (key, weight) = member;
        let c = &mut self.classes[class];
        let limit = (self.limit * c.weight / self.weights.max(1)).max(MIN_LIMIT);
        let fi = (flow % FLOWS as u64) as usize;
        if len as u64 > limit {
            // Larger than the whole queue: it would empty the class and still not fit.
            c.dropped += 1;
            return Paced::Dropped(item);
        }
        while c.queued_bytes + len as u64 > limit {
            if !c.drop_for(key, fi, weight) {
                c.dropped += 1;
                return Paced::Dropped(item);
            }
        }
        let m = c.member(key, weight);
        let f = &mut m.flows[fi];
        f.queue.push_back((item, len));
        f.bytes += len as u64;
        if f.queue.len() == 1 {
            f.deficit = 0;
            m.active.push_back(fi);
        }
        m.queued_bytes += len as u64;
        m.queued += 1;
        if m.queued == 1 {
            m.deficit = 0;
            c.active.push_back(key);
        }
        c.queued_bytes += len as u64;
        c.queued += 1;
        if c.queued == 1 {
            c.deficit = 0;
        }
        // (A class emptied by drops alone may still be in the round: never twice.)
        if !self.active.contains(&class) {
            self.active.push_back(class);
        }
        Paced::Queued
    }

    /// The next item whose turn and tokens have come by `now`, with its class.
    pub fn poll(&mut self, now: Instant) -> Option<(usize, T)> {
        // Each turn either sends or gives a class, a member or a flow a quantum more, so
        // this ends.
        loop {
            let &ci = self.active.front()?;
            let c = &mut self.classes[ci];
            let Some(&mk) = c.active.front() else {
                // Nothing left (dropped): off the round.
                c.deficit = 0;
                self.active.pop_front();
                continue;
            };
            let Some(m) = c.members.get_mut(&mk) else {
                c.active.pop_front();
                continue;
            };
            let Some(&fi) = m.active.front() else {
                c.retire(mk);
                continue;
            };
            let &(_, len) = m.flows[fi].queue.front()?;
            let len64 = len as u64;
            if c.deficit < len64 {
                // The class's turn is over: a quantum for the next round, to the back.
                c.deficit += QUANTUM * c.weight;
                self.active.rotate_left(1);
                continue;
            }
            if m.deficit < len64 {
                // The member's turn inside the class is over.
                m.deficit += QUANTUM * m.weight;
                c.active.rotate_left(1);
                continue;
            }
            if m.flows[fi].deficit < len64 {
                // The flow's turn inside the member is over.
                m.flows[fi].deficit += QUANTUM;
                m.active.rotate_left(1);
                continue;
            }
            if !self.bucket.take(now, len) {
                return None;
            }
            let f = &mut m.flows[fi];
            let (item, len) = f.queue.pop_front()?;
            let len64 = len as u64;
            f.bytes -= len64;
            f.deficit -= len64;
            if f.queue.is_empty() {
                f.deficit = 0;
                m.active.pop_front();
            }
            m.deficit -= len64;
            m.queued_bytes -= len64;
            m.queued -= 1;
            if m.queued == 0 {
                c.retire(mk);
            }
            c.deficit -= len64;
            c.queued_bytes -= len64;
            c.queued -= 1;
            c.sent_bytes += len64;
            if c.queued == 0 {
                c.deficit = 0;
                self.active.pop_front();
            }
            return Some((ci, item));
        }
    }

    /// Drops the queued items `keep` refuses (counted as their class's drops): what was
    /// queued for something that no longer exists.
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        for c in &mut self.classes {
            let mut emptied = Vec::new();
            for (&key, m) in c.members.iter_mut() {
                for (fi, f) in m.flows.iter_mut().enumerate() {
                    let before = f.queue.len();
                    let mut bytes = 0;
                    f.queue.retain(|(item, len)| {
                        let k = keep(item);
                        if !k {
                            bytes += *len as u64;
                        }
                        k
                    });
                    let gone = before - f.queue.len();
                    if gone == 0 {
                        continue;
                    }
                    f.bytes -= bytes;
                    m.queued_bytes -= bytes;
                    m.queued -= gone;
                    c.queued_bytes -= bytes;
                    c.queued -= gone;
                    c.dropped += gone as u64;
                    if f.queue.is_empty() {
                        f.deficit = 0;
                        m.active.retain(|&i| i != fi);
                    }
                }
                if m.queued == 0 {
                    emptied.push(key);
                }
            }
            for key in emptied {
                c.retire(key);
            }
        }
    }

    /// When the next queued item may go, if any waits.
    pub fn poll_timeout(&self) -> Option<Instant> {
        // The first class in the round with a packet waiting (one emptied by drops may
        // still be in it).
        let len = self.active.iter().find_map(|&ci| {
            let c = &self.classes[ci];
            let m = c.active.iter().find_map(|k| c.members.get(k))?;
            let fi = *m.active.front()?;
            m.flows[fi].queue.front().map(|&(_, len)| len)
        })?;
        self.bucket.ready_at(len)
    }
}
