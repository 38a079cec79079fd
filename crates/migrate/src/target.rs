//! The target router's side: a host it does not hold showed up on its LAN.

use std::collections::hash_map::Entry;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::{
    Answer, ClaimOutcome, DhtOp, Event, Holder, HostState, Lookup, Mac, Message, Migrate, Output,
    Presence,
};

/// One address this router is taking over.
#[derive(Debug)]
pub(crate) struct Handoff<P> {
    /// The host's first sighting (the handoff's duration runs from here).
    started: Instant,
    step: Step<P>,
    /// Holders asked and lookups repeated so far (bounded by `max_hops` and
    /// `request_tries`).
    hops: u32,
    /// The holder this handoff last dealt with (reported in [`Event::TookOver`]).
    from: Option<P>,
    /// This member's signed record for the address (from the lookup's caller), sent with
    /// every request.
    record: Vec<u8>,
}

#[derive(Debug)]
enum Step<P> {
    /// A lookup of the holder is out; given up at `deadline`.
    Looking { deadline: Instant },
    /// Asked `holder` (`tries` requests so far); the next at `next`.
    Asking {
        holder: Holder<P>,
        /// When the lookup that named the holder answered (its lease counts from there).
        looked: Instant,
        id: u64,
        tries: u32,
        next: Instant,
    },
    /// The holder is silent: its lease is claimed when it lapses.
    Waiting { claim_at: Instant },
    /// A claim is out; given up at `deadline`.
    Claiming { deadline: Instant },
    /// Looked up again at `at` (after a refusal without a holder, or no quorum).
    Retry { at: Instant },
}

impl<P> Handoff<P> {
    pub(crate) fn deadline(&self) -> Option<Instant> {
        Some(match &self.step {
            Step::Looking { deadline } | Step::Claiming { deadline } => *deadline,
            Step::Asking { next, .. } => *next,
            Step::Waiting { claim_at } => *claim_at,
            Step::Retry { at } => *at,
        })
    }
}

impl<P: Copy + Eq + std::fmt::Debug> Migrate<P> {
    /// How long a DHT operation may take before the handoff is given up (the agent
    /// answers every operation, with `Unanswered` at worst; this only keeps a lost answer
    /// from pinning the state).
    fn dht_timeout(&self) -> Duration {
        self.config.request_retry * self.config.request_tries * 2
    }

    /// A host this member does not hold showed itself here, first at `started`.
    pub(crate) fn target_start(&mut self, now: Instant, started: Instant, presence: Presence) {
        let Some(address) = presence.address else {
            // A RARP frame with a MAC the driver does not know: ask the members (once; the
            // frames QEMU repeats meanwhile join the question out).
            if let Entry::Vacant(e) = self.mac_queries.entry(presence.mac) {
                e.insert(started);
                self.emit(Output::Push(Message::WhoHas { mac: presence.mac }));
            }
            return;
        };
        if self.targets.contains_key(&address) {
            return;
        }
        // Handed off, and back already: no more forwarding to where it is not.
        self.moved.remove(&address);
        self.look_up(now, started, address, 0, None);
    }

    fn look_up(
        &mut self,
        now: Instant,
        started: Instant,
        address: IpAddr,
        hops: u32,
        from: Option<P>,
    ) {
        let deadline = now + self.dht_timeout();
        self.targets.insert(
            address,
            Handoff {
                started,
                step: Step::Looking { deadline },
                hops,
                from,
                record: Vec::new(),
            },
        );
        self.emit(Output::Dht(DhtOp::Lookup(address)));
    }

    /// A member's [`Message::IsAt`]: the RARP frame's MAC is at `address` on its LAN. Only
    /// the first answer to a question still out counts; its address's holder is looked up
    /// as after a gratuitous ARP, the handoff's duration counting from the RARP frame.
    pub(crate) fn target_is_at(&mut self, now: Instant, mac: Mac, address: IpAddr) {
        let Some(&started) = self.mac_queries.get(&mac) else {
            // Never asked, answered already, or given up.
            return;
        };
        if self
            .mac_query_deadline(started)
            .is_some_and(|end| end <= now)
        {
            // Late: the timeout gives up on it.
            return;
        }
        self.mac_queries.remove(&mac);
        if self.targets.contains_key(&address) {
            return;
        }
        self.moved.remove(&address);
        self.look_up(now, started, address, 0, None);
    }

    /// When the question about a MAC first seen at `started` is given up (`None`: a wait
    /// too long for the clock, never).
    pub(crate) fn mac_query_deadline(&self, started: Instant) -> Option<Instant> {
        started.checked_add(self.config.mac_query_wait)
    }

    /// RARP MACs no member answered for within [`crate::Config::mac_query_wait`].
    pub(crate) fn mac_queries_timeout(&mut self, now: Instant) {
        let wait = self.config.mac_query_wait;
        let before = self.mac_queries.len();
        self.mac_queries
            .retain(|_, started| started.checked_add(wait).is_none_or(|end| now < end));
        for _ in self.mac_queries.len()..before {
            self.event(Event::GaveUp {
                address: None,
                reason: "no member knows the announced MAC",
            });
        }
    }

    /// The answer to [`DhtOp::Lookup`]. `record` is this member's own record for the
    /// address, sealed and signed by it: the holder hands it to the replicas in the
    /// transfer, so the value they keep is the new holder's own.
    pub fn handle_lookup(
        &mut self,
        now: Instant,
        address: IpAddr,
        lookup: Lookup<P>,
        record: Vec<u8>,
    ) {
        let Some(h) = self.targets.get_mut(&address) else {
            return;
        };
        if !matches!(h.step, Step::Looking { .. }) {
            return;
        }
        h.record = record;
        match lookup {
            Lookup::Free => {
                h.step = Step::Claiming {
                    deadline: now + self.config.request_retry * self.config.request_tries * 2,
                };
                self.emit(Output::Dht(DhtOp::Claim(address)));
            }
            Lookup::Held(holder) if holder.member == self.local => {
                // Ours already (a renewal raced the sighting): nothing to hand over.
                self.targets.remove(&address);
            }
            Lookup::Held(holder) => self.ask(now, address, holder),
            Lookup::Unanswered => self.retry(now, address, "the replicas did not answer"),
        }
    }

    fn ask(&mut self, now: Instant, address: IpAddr, holder: Holder<P>) {
        let id = self.next_id;
        self.next_id += 1;
        let next = now + self.config.request_retry;
        let Some(h) = self.targets.get_mut(&address) else {
            return;
        };
        h.from = Some(holder.member);
        h.step = Step::Asking {
            holder,
            looked: now,
            id,
            tries: 1,
            next,
        };
        let record = h.record.clone();
        self.emit(Output::Send {
            to: holder.member,
            message: Message::Request {
                id,
                address,
                record,
            },
        });
    }

    /// Looks the holder up again after `request_retry`, unless this handoff took too many
    /// turns already.
    fn retry(&mut self, now: Instant, address: IpAddr, reason: &'static str) {
        let limit = self.config.max_hops + self.config.request_tries;
        let Some(h) = self.targets.get_mut(&address) else {
            return;
        };
        h.hops += 1;
        if h.hops > limit {
            self.targets.remove(&address);
            self.event(Event::GaveUp {
                address: Some(address),
                reason,
            });
            return;
        }
        h.step = Step::Retry {
            at: now + self.config.request_retry,
        };
    }

    /// The answer to [`DhtOp::Claim`].
    pub fn handle_claim(&mut self, now: Instant, address: IpAddr, outcome: ClaimOutcome<P>) {
        let Some(h) = self.targets.get(&address) else {
            return;
        };
        if !matches!(h.step, Step::Claiming { .. }) {
            return;
        }
        match outcome {
            ClaimOutcome::Won => self.took_over(now, address, None, HostState::default()),
            ClaimOutcome::Held(holder) if holder.member == self.local => {
                self.took_over(now, address, None, HostState::default());
            }
            ClaimOutcome::Held(holder) => {
                // Someone else came first (another target, or the source renewed).
                let hops = h.hops + 1;
                if hops > self.config.max_hops {
                    self.targets.remove(&address);
                    self.event(Event::GaveUp {
                        address: Some(address),
                        reason: "the address kept changing hands",
                    });
                    return;
                }
                if let Some(h) = self.targets.get_mut(&address) {
                    h.hops = hops;
                }
                self.ask(now, address, holder);
            }
            ClaimOutcome::Unanswered => self.retry(now, address, "the replicas did not answer"),
        }
    }

    fn took_over(&mut self, now: Instant, address: IpAddr, from: Option<P>, state: HostState) {
        let Some(h) = self.targets.remove(&address) else {
            return;
        };
        let took = now.saturating_duration_since(h.started);
        self.stats.handoffs_in += 1;
        self.stats.last = Some(took);
        self.event(Event::TookOver {
            address,
            from: from.or(h.from),
            state,
            took,
        });
    }

    pub(crate) fn target_reply(
        &mut self,
        now: Instant,
        from: P,
        id: u64,
        address: IpAddr,
        answer: Answer<P>,
    ) {
        let Some(h) = self.targets.get(&address) else {
            return;
        };
        // Only the answer to the request out now counts (a late or duplicated one is not).
        let Step::Asking {
            holder, id: asked, ..
        } = &h.step
        else {
            return;
        };
        if *asked != id || holder.member != from {
            return;
        }
        match answer {
            Answer::Transferred(state) => self.took_over(now, address, Some(from), state),
            Answer::Present => {
                self.targets.remove(&address);
                self.event(Event::Refused {
                    address,
                    holder: from,
                });
            }
            Answer::NotHolder(_) | Answer::Failed => {
                // The DHT, not the old holder's word, says who holds it now.
                self.retry(now, address, "the holders kept refusing");
            }
        }
    }

    pub(crate) fn targets_timeout(&mut self, now: Instant) {
        let due: Vec<IpAddr> = self
            .targets
            .iter()
            .filter(|(_, h)| h.deadline().is_some_and(|t| t <= now))
            .map(|(a, _)| *a)
            .collect();
        for address in due {
            let Some(h) = self.targets.get_mut(&address) else {
                continue;
            };
            match &mut h.step {
                Step::Looking { .. } | Step::Claiming { .. } => {
                    self.targets.remove(&address);
                    self.event(Event::GaveUp {
                        address: Some(address),
                        reason: "a DHT operation never came back",
                    });
                }
                Step::Asking {
                    holder,
                    looked,
                    id,
                    tries,
                    next,
                } => {
                    let holder = *holder;
                    if *tries < self.config.request_tries {
                        *tries += 1;
                        *next = now + self.config.request_retry;
                        // The same id: the source answers a duplicate the same way.
                        let message = Message::Request {
                            id: *id,
                            address,
                            record: h.record.clone(),
                        };
                        self.emit(Output::Send {
                            to: holder.member,
                            message,
                        });
                        continue;
                    }
                    // Dead, or cut off: its lease lapses on the replicas unless renewed.
                    let claim_at = (*looked + holder.remaining).max(now);
                    h.step = Step::Waiting { claim_at };
                    self.event(Event::SourceSilent {
                        address,
                        holder: holder.member,
                        claim_at,
                    });
                }
                Step::Waiting { .. } => {
                    h.step = Step::Claiming {
                        deadline: now + self.config.request_retry * self.config.request_tries * 2,
                    };
                    self.emit(Output::Dht(DhtOp::Claim(address)));
                }
                Step::Retry { .. } => {
                    h.step = Step::Looking {
                        deadline: now + self.config.request_retry * self.config.request_tries * 2,
                    };
                    self.emit(Output::Dht(DhtOp::Lookup(address)));
                }
            }
        }
    }
}
