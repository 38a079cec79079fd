//! The source router's side: a member asks for a host this router holds.

use std::net::IpAddr;
use std::time::Instant;

use crate::{
    Answer, DhtOp, Event, HostState, Mac, Message, Migrate, Output, Presence, TransferOutcome,
};

/// One address this router is asked to give up.
#[derive(Debug)]
pub(crate) struct Handoff<P> {
    /// The first request (the handoff's duration runs from here).
    started: Instant,
    /// The member the address goes to if the host is gone (the first to ask).
    asker: P,
    id: u64,
    /// The asker's signed record, left on the replicas by the transfer.
    record: Vec<u8>,
    /// Others that asked meanwhile, answered when this ends.
    others: Vec<(P, u64)>,
    step: Step,
    /// The host was seen here while the transfer was out: it came back.
    back: Option<Presence>,
}

#[derive(Debug)]
enum Step {
    /// `sent` probes out, unanswered; the next (or the verdict) at `next`.
    Probing { sent: u32, next: Instant },
    /// The transfer is out on the replicas; given up at `deadline`.
    Transferring { deadline: Instant },
}

/// A host handed off: where it went, until when packets for it are forwarded there, and
/// what went with it (sent again if the reply was lost).
#[derive(Debug)]
pub(crate) struct Moved<P> {
    pub(crate) to: P,
    pub(crate) until: Instant,
    state: HostState,
}

impl<P> Handoff<P> {
    pub(crate) fn deadline(&self) -> Option<Instant> {
        Some(match self.step {
            Step::Probing { next, .. } => next,
            Step::Transferring { deadline } => deadline,
        })
    }
}

impl<P: Copy + Eq + std::fmt::Debug> Migrate<P> {
    pub(crate) fn source_request(
        &mut self,
        now: Instant,
        from: P,
        id: u64,
        address: IpAddr,
        record: Vec<u8>,
        held: bool,
    ) {
        if let Some(h) = self.sources.get_mut(&address) {
            if h.asker == from {
                // A duplicate, or a retry while the probes run: one answer, to the latest id.
                h.id = id;
                h.record = record;
            } else if let Some(other) = h.others.iter_mut().find(|(p, _)| *p == from) {
                other.1 = id;
            } else {
                h.others.push((from, id));
            }
            return;
        }
        if let Some(moved) = self.moved.get(&address).filter(|m| now < m.until) {
            // Done already: the asker's reply was lost (same answer), or it is late.
            let answer = if moved.to == from {
                Answer::Transferred(moved.state.clone())
            } else {
                Answer::NotHolder(Some(moved.to))
            };
            self.reply(from, id, address, answer);
            return;
        }
        if !held {
            self.reply(from, id, address, Answer::NotHolder(None));
            return;
        }
        // IPOP 5: confirm the host is gone from this LAN before letting go.
        self.sources.insert(
            address,
            Handoff {
                started: now,
                asker: from,
                id,
                record,
                others: Vec::new(),
                step: Step::Probing {
                    sent: 1,
                    next: now + self.config.probe_interval,
                },
                back: None,
            },
        );
        self.emit(Output::Probe(address));
    }

    /// A member's [`Message::WhoHas`]: which address has the LAN host with `mac`? `found`
    /// is the address the driver's LAN table has for that MAC, only if this member holds
    /// it on the replicas (`None` otherwise: another member may, and answers). Found, the
    /// asker is told ([`Message::IsAt`]); a duplicate is answered again, which the asker
    /// ignores.
    pub fn handle_who_has(&mut self, from: P, mac: Mac, found: Option<IpAddr>) {
        let Some(address) = found else {
            return;
        };
        self.emit(Output::Send {
            to: from,
            message: Message::IsAt { mac, address },
        });
    }

    fn reply(&mut self, to: P, id: u64, address: IpAddr, answer: Answer<P>) {
        self.emit(Output::Send {
            to,
            message: Message::Reply {
                id,
                address,
                answer,
            },
        });
    }

    /// The host at `address` was seen on this LAN (a probe answered, or any frame). If a
    /// handoff of it is under way here, it stays: returns true.
    pub(crate) fn source_sees_host(&mut self, address: IpAddr, presence: Presence) -> bool {
        let Some(h) = self.sources.get_mut(&address) else {
            return false;
        };
        if let Step::Transferring { .. } = h.step {
            // Too late to stop: once transferred, it is taken back from the new holder.
            h.back = Some(presence);
            return true;
        }
        let Some(h) = self.sources.remove(&address) else {
            return false;
        };
        self.stats.kept += 1;
        for (to, id) in std::iter::once((h.asker, h.id)).chain(h.others) {
            self.reply(to, id, address, Answer::Present);
        }
        self.event(Event::Kept {
            address,
            asker: h.asker,
        });
        true
    }

    /// The answer to [`DhtOp::Transfer`]; `state` is the host's DHCP lease and names as the
    /// agent holds them, sent to the new holder.
    pub fn handle_transfer(
        &mut self,
        now: Instant,
        address: IpAddr,
        outcome: TransferOutcome,
        state: HostState,
    ) {
        let Some(h) = self.sources.get(&address) else {
            return;
        };
        if !matches!(h.step, Step::Transferring { .. }) {
            return;
        }
        let Some(h) = self.sources.remove(&address) else {
            return;
        };
        let (asker_answer, others_answer) = match outcome {
            TransferOutcome::Done => (
                Answer::Transferred(state.clone()),
                Answer::NotHolder(Some(h.asker)),
            ),
            TransferOutcome::NotHolder => (Answer::NotHolder(None), Answer::NotHolder(None)),
            TransferOutcome::Unanswered => (Answer::Failed, Answer::Failed),
        };
        self.reply(h.asker, h.id, address, asker_answer);
        for (to, id) in h.others {
            self.reply(to, id, address, others_answer.clone());
        }
        if outcome != TransferOutcome::Done {
            return;
        }
        let took = now.saturating_duration_since(h.started);
        self.stats.handoffs_out += 1;
        self.stats.last = Some(took);
        self.emit(Output::Push(Message::Moved {
            address,
            to: h.asker,
        }));
        self.moved.insert(
            address,
            Moved {
                to: h.asker,
                until: now + self.config.grace,
                state,
            },
        );
        self.event(Event::HandedOff {
            address,
            to: h.asker,
            took,
        });
        if let Some(presence) = h.back {
            // It came back while the lease moved: ask for it back.
            self.target_start(now, now, presence);
        }
    }

    pub(crate) fn sources_timeout(&mut self, now: Instant) {
        let due: Vec<IpAddr> = self
            .sources
            .iter()
            .filter(|(_, h)| h.deadline().is_some_and(|t| t <= now))
            .map(|(a, _)| *a)
            .collect();
        for address in due {
            let probes = self.config.probes;
            let interval = self.config.probe_interval;
            let transfer_timeout = self.config.request_retry * self.config.request_tries;
            let Some(h) = self.sources.get_mut(&address) else {
                continue;
            };
            match &mut h.step {
                Step::Probing { sent, next } if *sent < probes => {
                    *sent += 1;
                    *next = now + interval;
                    self.emit(Output::Probe(address));
                }
                Step::Probing { .. } => {
                    // Silent on this LAN: the host left. The lease goes to the first asker.
                    let to = h.asker;
                    let record = std::mem::take(&mut h.record);
                    h.step = Step::Transferring {
                        deadline: now + transfer_timeout,
                    };
                    self.emit(Output::Dht(DhtOp::Transfer {
                        address,
                        to,
                        record,
                    }));
                }
                Step::Transferring { .. } => {
                    // The agent never answered: the askers try again.
                    self.handle_transfer(
                        now,
                        address,
                        TransferOutcome::Unanswered,
                        HostState::default(),
                    );
                }
            }
        }
    }
}
