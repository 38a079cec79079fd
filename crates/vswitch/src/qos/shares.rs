//! Weighted fair shares of one uplink (issue 32, item 2; the KU paper's weight-based
//! bandwidth control): classes (a namespace each) share a rate by weight with deficit
//! round robin over one queue per class. Work-conserving: a class with nothing to send
//! takes no turn, so its share goes to the others at once; a class alone gets the whole
//! rate.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{Paced, TokenBucket};

/// Bytes a class of weight 1 may send per round: about one full packet.
const QUANTUM: u64 = 1500;

#[derive(Debug, Clone)]
struct Class<T> {
    weight: u64,
    queue: VecDeque<(T, usize)>,
    queued_bytes: u64,
    deficit: u64,
    /// Bytes sent and dropped, for status.
    sent_bytes: u64,
    dropped: u64,
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
    /// Most bytes one class's queue holds.
    limit: u64,
}

impl<T> Shares<T> {
    /// An uplink of `rate_bits` a second (a burst of `burst` bytes), each class's queue
    /// holding at most `max_delay` at that rate.
    pub fn new(rate_bits: u64, burst: u64, max_delay: Duration) -> Self {
        let bucket = TokenBucket::new(rate_bits, burst);
        let limit = u64::try_from(u128::from(bucket.rate()) * max_delay.as_nanos() / super::NANO)
            .unwrap_or(u64::MAX);
        Self {
            bucket,
            classes: Vec::new(),
            active: VecDeque::new(),
            limit,
        }
    }

    /// Sets class `class`'s weight (1 or more); classes are numbered from 0 and made as
    /// needed, weight 1 by default.
    pub fn set_weight(&mut self, class: usize, weight: u64) {
        self.ensure(class);
        self.classes[class].weight = weight.max(1);
    }

    fn ensure(&mut self, class: usize) {
        while self.classes.len() <= class {
            self.classes.push(Class {
                weight: 1,
                queue: VecDeque::new(),
                queued_bytes: 0,
                deficit: 0,
                sent_bytes: 0,
                dropped: 0,
            });
        }
    }

    /// What class `class` did.
    pub fn stats(&self, class: usize) -> Option<ClassStats> {
        self.classes.get(class).map(|c| ClassStats {
            weight: c.weight,
            sent_bytes: c.sent_bytes,
            dropped: c.dropped,
            queued: c.queue.len(),
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

    /// An item of class `class` and `len` bytes at `now`: now if nothing waits and the
    /// rate allows it, else queued in its class if the queue has room, else dropped.
    pub fn push(&mut self, now: Instant, class: usize, item: T, len: usize) -> Paced<T> {
        if self.send_now(now, class, len) {
            return Paced::Now(item);
        }
        let c = &mut self.classes[class];
        if c.queued_bytes + len as u64 > self.limit {
            c.dropped += 1;
            return Paced::Dropped(item);
        }
        c.queued_bytes += len as u64;
        c.queue.push_back((item, len));
        if c.queue.len() == 1 {
            c.deficit = 0;
            self.active.push_back(class);
        }
        Paced::Queued
    }

    /// The next item whose turn and tokens have come by `now`, with its class.
    pub fn poll(&mut self, now: Instant) -> Option<(usize, T)> {
        // Each turn either sends or gives its class a quantum more, so this ends.
        loop {
            let &class = self.active.front()?;
            let c = &mut self.classes[class];
            let &(_, len) = c.queue.front()?;
            if c.deficit < len as u64 {
                // Its turn is over: a quantum for the next round, to the back.
                c.deficit += QUANTUM * c.weight;
                self.active.rotate_left(1);
                continue;
            }
            if !self.bucket.take(now, len) {
                return None;
            }
            let (item, len) = c.queue.pop_front()?;
            c.queued_bytes -= len as u64;
            c.deficit -= len as u64;
            c.sent_bytes += len as u64;
            if c.queue.is_empty() {
                c.deficit = 0;
                self.active.pop_front();
            }
            return Some((class, item));
        }
    }

    /// When the next queued item may go, if any waits.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let class = *self.active.front()?;
        let &(_, len) = self.classes[class].queue.front()?;
        self.bucket.ready_at(len)
    }
}
