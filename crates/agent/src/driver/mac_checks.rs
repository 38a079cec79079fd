//! A layer-2 namespace's check of what members announce against the DHT: each MAC a
//! member announces must be its lease ([`hyphae_overlay::membership::Membership::set_macs`]
//! claims them on the holder's side). A MAC whose lease another member holds is given
//! [`GRACE`] to change hands, as it does when a host moves between sites (the old site lets
//! it go about a second after the host went quiet there, and releases its lease); after
//! that the member's frames from it are dropped and frames to it go to the member that
//! holds it ([`hyphae_overlay::Node::refuse_mac`]). A MAC nobody holds is not refused: the
//! announcer's claim may still be out, or the replicas did not answer (a read that finds
//! no record cannot tell), and a MAC no one holds is no one's to take.
//!
//! Pure: the driver feeds announcements and DHT answers in, and carries out the reads and
//! refusals it returns. Members are named by identity (`I`), never by tunnel handle, which
//! another member may have by the time a refusal is carried out.

use std::collections::HashMap;
use std::time::{Duration, Instant};

type Mac = [u8; 6];

/// How long a member may announce a MAC another member holds before it is refused.
pub(crate) const GRACE: Duration = Duration::from_secs(5);

/// How often a MAC held by another member is read again within the grace.
const RECHECK: Duration = Duration::from_secs(1);

/// How often a refused MAC, or one nobody holds, is read again (its lease may have come to
/// the member).
const SLOW_RECHECK: Duration = Duration::from_secs(5);

/// How often a MAC held by its announcer is read again.
const HELD_RECHECK: Duration = Duration::from_secs(300);

/// How long a refusal is remembered after the member stopped announcing the MAC: one
/// that announces it again gets no new grace.
const REFUSAL_MEMORY: Duration = Duration::from_secs(600);

/// Most DHT reads out at once, per namespace.
const MAX_READS: usize = 64;

/// A read unanswered this long is taken as lost (the MAC is read again).
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What the driver must tell the node: `peer`'s claim to `mac` is refused, or no longer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Change<I> {
    pub(crate) peer: I,
    pub(crate) mac: Mac,
    pub(crate) refused: bool,
}

#[derive(Debug)]
struct Entry {
    announced: bool,
    refused: bool,
    /// The DHT named the member as the holder at the last read.
    held: bool,
    /// Since when the DHT has named another member as the holder.
    held_elsewhere_since: Option<Instant>,
    /// When the MAC is read again (`None`: a read is out).
    next: Option<Instant>,
    /// When it stopped being announced.
    dropped_at: Option<Instant>,
}

/// Counts for status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MacCheckCounts {
    /// Member MACs the DHT named the member as holder of.
    pub(crate) verified: usize,
    /// Member MACs refused now.
    pub(crate) refused: usize,
    /// Refusals so far.
    pub(crate) refusals: u64,
}

/// The checks of one namespace, members named by `I` (their identity).
#[derive(Debug)]
pub(crate) struct MacChecks<I> {
    entries: HashMap<(I, Mac), Entry>,
    /// MACs whose holder is being read, since when.
    reading: HashMap<Mac, Instant>,
    refusals: u64,
}

impl<I> Default for MacChecks<I> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            reading: HashMap::new(),
            refusals: 0,
        }
    }
}

impl<I: Copy + Eq + std::hash::Hash> MacChecks<I> {
    /// Member `peer` announced exactly `macs`: the changes to make now (a MAC refused
    /// before and announced again is refused at once).
    pub(crate) fn announced(&mut self, now: Instant, peer: I, macs: &[Mac]) -> Vec<Change<I>> {
        let mut changes = Vec::new();
        for (&(_, mac), e) in self.entries.iter_mut().filter(|((id, _), _)| *id == peer) {
            let listed = macs.contains(&mac);
            if listed && !e.announced {
                if e.refused {
                    changes.push(Change {
                        peer,
                        mac,
                        refused: true,
                    });
                }
                if e.next.is_none() && !self.reading.contains_key(&mac) {
                    // Announced again with no read out for it: read it.
                    e.next = Some(now);
                }
            }
            e.announced = listed;
            e.dropped_at = if listed {
                None
            } else {
                e.dropped_at.or(Some(now))
            };
        }
        for &mac in macs {
            self.entries.entry((peer, mac)).or_insert(Entry {
                announced: true,
                refused: false,
                held: false,
                held_elsewhere_since: None,
                next: Some(now),
                dropped_at: None,
            });
        }
        self.prune(now);
        changes
    }

    /// Member `peer`'s tunnel is gone: its MACs are forgotten, but a refusal is
    /// remembered, as for a MAC it stopped announcing.
    pub(crate) fn forget(&mut self, now: Instant, peer: I) {
        for ((id, _), e) in &mut self.entries {
            if *id == peer {
                e.announced = false;
                e.dropped_at = e.dropped_at.or(Some(now));
            }
        }
        self.prune(now);
    }

    /// Drops what is no longer announced and allowed, and old refusals.
    fn prune(&mut self, now: Instant) {
        self.entries.retain(|_, e| {
            e.announced
                || (e.refused
                    && e.dropped_at
                        .is_some_and(|t| now.saturating_duration_since(t) < REFUSAL_MEMORY))
        });
    }

    /// The MACs to read the holder of now (each read answers [`MacChecks::holder`]).
    pub(crate) fn due(&mut self, now: Instant) -> Vec<Mac> {
        // A read that never came back: its MAC's entries are due again.
        let lost: Vec<Mac> = self
            .reading
            .iter()
            .filter(|(_, t)| now.saturating_duration_since(**t) >= READ_TIMEOUT)
            .map(|(m, _)| *m)
            .collect();
        for mac in lost {
            self.reading.remove(&mac);
            for ((_, m), e) in &mut self.entries {
                if *m == mac && e.next.is_none() {
                    e.next = Some(now);
                }
            }
        }
        let mut due = Vec::new();
        for (&(_, mac), e) in &mut self.entries {
            if !e.announced || e.next.is_none_or(|t| now < t) {
                continue;
            }
            if !self.reading.contains_key(&mac) && !due.contains(&mac) {
                if self.reading.len() + due.len() >= MAX_READS {
                    continue;
                }
                due.push(mac);
            }
            e.next = None;
        }
        self.reading.extend(due.iter().map(|m| (*m, now)));
        due
    }

    /// Starts (`read`) the reads that are due, if any.
    pub(crate) fn read_due(&mut self, now: Instant, mut read: impl FnMut(Mac)) {
        if self.poll_timeout().is_some_and(|t| t <= now) {
            for mac in self.due(now) {
                read(mac);
            }
        }
    }

    /// When [`MacChecks::due`] has something next. While [`MAX_READS`] are out, only a
    /// read's timeout (each answer is a turn of its own).
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let reads = self.reading.values().map(|t| *t + READ_TIMEOUT);
        let entries = self
            .entries
            .values()
            .filter(|_| self.reading.len() < MAX_READS)
            .filter(|e| e.announced)
            .filter_map(|e| e.next);
        entries.chain(reads).min()
    }

    /// The DHT says `holder` holds `mac` (`None`: no record was found): the changes to
    /// make.
    pub(crate) fn holder(&mut self, now: Instant, mac: Mac, holder: Option<I>) -> Vec<Change<I>> {
        self.reading.remove(&mac);
        let mut changes = Vec::new();
        for (&(id, m), e) in self.entries.iter_mut().filter(|((_, m), _)| *m == mac) {
            if !e.announced {
                continue;
            }
            e.held = holder == Some(id);
            let refused = match holder {
                Some(h) if h == id => {
                    e.held_elsewhere_since = None;
                    e.next = Some(now + HELD_RECHECK);
                    false
                }
                Some(_) => {
                    let since = *e.held_elsewhere_since.get_or_insert(now);
                    let refused = now.saturating_duration_since(since) >= GRACE;
                    e.next = Some(now + if refused { SLOW_RECHECK } else { RECHECK });
                    refused
                }
                // Nobody's (or no answer): nothing to refuse it for; a refusal stands
                // until the lease is the member's.
                None => {
                    e.next = Some(now + SLOW_RECHECK);
                    e.refused
                }
            };
            if refused != e.refused {
                e.refused = refused;
                if refused {
                    self.refusals += 1;
                }
                changes.push(Change {
                    peer: id,
                    mac: m,
                    refused,
                });
            }
        }
        changes
    }

    /// Counts for status.
    pub(crate) fn counts(&self) -> MacCheckCounts {
        let announced = || self.entries.values().filter(|e| e.announced);
        MacCheckCounts {
            verified: announced().filter(|e| e.held).count(),
            refused: announced().filter(|e| e.refused).count(),
            refusals: self.refusals,
        }
    }
}

#[cfg(test)]
mod tests;
