//! Weighted fair shares of one uplink (issue 32, item 2; the KU paper's weight-based
//! bandwidth control): classes (a namespace each) share a rate by weight with deficit
//! round robin, and inside a class its flows share its turns the same way, so no single
//! flow starves the class's others (a ping does not wait behind a bulk transfer of its own
//! namespace). Work-conserving: a class or flow with nothing to send takes no turn, so its
//! share goes to the others at once; a class alone gets the whole rate.
//!
//! When a class's queue is full, the packet dropped is the tail of its fattest flow (as
//! fq_codel does), not the newcomer: a sparse flow keeps its place.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{Paced, TokenBucket};

/// Bytes a class of weight 1, and each flow inside a class, may send per round: about one
/// full packet.
const QUANTUM: u64 = 1500;

/// Flow queues per class: flows are hashed onto them.
const FLOWS: usize = 256;

/// The smallest queue a class gets, bytes.
const MIN_LIMIT: u64 = 16 * 1024;

#[derive(Debug, Clone)]
struct Flow<T> {
    queue: VecDeque<(T, usize)>,
    bytes: u64,
    deficit: u64,
}

#[derive(Debug, Clone)]
struct Class<T> {
    weight: u64,
    flows: Vec<Flow<T>>,
    /// Flows with packets waiting, in round-robin order.
    active: VecDeque<usize>,
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
            sent_bytes: 0,
            dropped: 0,
        }
    }

    /// Drops the last packet of the fattest flow but `keep`, if it is fatter than `keep`.
    /// Returns whether one went.
    fn drop_from_fattest(&mut self, keep: usize) -> bool {
        let Some((fattest, _)) = self
            .flows
            .iter()
            .enumerate()
            .max_by_key(|(_, f)| f.bytes)
            .filter(|(i, f)| *i != keep && f.bytes > self.flows[keep].bytes)
        else {
            return false;
        };
        let f = &mut self.flows[fattest];
        let Some((_, len)) = f.queue.pop_back() else {
            return false;
        };
        f.bytes -= len as u64;
        self.queued_bytes -= len as u64;
        self.queued -= 1;
        self.dropped += 1;
        if f.queue.is_empty() {
            f.deficit = 0;
            self.active.retain(|&i| i != fattest);
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
        if self.send_now(now, class, len) {
            return Paced::Now(item);
        }
        let c = &mut self.classes[class];
        let limit = (self.limit * c.weight / self.weights.max(1)).max(MIN_LIMIT);
        let fi = (flow % FLOWS as u64) as usize;
        while c.queued_bytes + len as u64 > limit {
            if !c.drop_from_fattest(fi) {
                c.dropped += 1;
                return Paced::Dropped(item);
            }
        }
        let f = &mut c.flows[fi];
        f.queue.push_back((item, len));
        f.bytes += len as u64;
        if f.queue.len() == 1 {
            f.deficit = 0;
            c.active.push_back(fi);
        }
        c.queued_bytes += len as u64;
        c.queued += 1;
        if c.queued == 1 {
            c.deficit = 0;
            self.active.push_back(class);
        } else if !self.active.contains(&class) {
            // Its last flow was emptied by drops only: take turns again.
            self.active.push_back(class);
        }
        Paced::Queued
    }

    /// The next item whose turn and tokens have come by `now`, with its class.
    pub fn poll(&mut self, now: Instant) -> Option<(usize, T)> {
        // Each turn either sends or gives a class or a flow a quantum more, so this ends.
        loop {
            let &ci = self.active.front()?;
            let c = &mut self.classes[ci];
            let Some(&fi) = c.active.front() else {
                // Nothing left (dropped): off the round.
                c.deficit = 0;
                self.active.pop_front();
                continue;
            };
            let &(_, len) = c.flows[fi].queue.front()?;
            if c.deficit < len as u64 {
                // The class's turn is over: a quantum for the next round, to the back.
                c.deficit += QUANTUM * c.weight;
                self.active.rotate_left(1);
                continue;
            }
            if c.flows[fi].deficit < len as u64 {
                // The flow's turn inside the class is over.
                c.flows[fi].deficit += QUANTUM;
                c.active.rotate_left(1);
                continue;
            }
            if !self.bucket.take(now, len) {
                return None;
            }
            let f = &mut c.flows[fi];
            let (item, len) = f.queue.pop_front()?;
            f.bytes -= len as u64;
            f.deficit -= len as u64;
            if f.queue.is_empty() {
                f.deficit = 0;
                c.active.pop_front();
            }
            c.deficit -= len as u64;
            c.queued_bytes -= len as u64;
            c.queued -= 1;
            c.sent_bytes += len as u64;
            if c.queued == 0 {
                c.deficit = 0;
                self.active.pop_front();
            }
            return Some((ci, item));
        }
    }

    /// When the next queued item may go, if any waits.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let c = &self.classes[*self.active.front()?];
        let fi = *c.active.front()?;
        let &(_, len) = c.flows[fi].queue.front()?;
        self.bucket.ready_at(len)
    }
}
