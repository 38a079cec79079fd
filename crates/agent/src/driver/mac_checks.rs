//! A layer-2 namespace's check of what members announce against the DHT: each MAC a
//! member announces must be its lease ([`hyphae_overlay::membership::Membership::set_macs`]
//! claims them on the holder's side). A MAC whose lease another member holds (or nobody)
//! is given [`GRACE`] to change hands, as it does when a host moves between sites (the
//! old site lets it go about a second after the host went quiet there, and releases its
//! lease); after that the member's frames from it are dropped and frames to it go to the
//! member that holds it ([`hyphae_overlay::Node::refuse_mac`]).
//!
//! Pure: the driver feeds announcements and DHT answers in, and carries out the reads and
//! refusals it returns.

use std::collections::HashMap;
use std::time::{Duration, Instant};

type Mac = [u8; 6];

/// How long a member may announce a MAC that is not its lease before it is refused.
pub(crate) const GRACE: Duration = Duration::from_secs(5);

/// How often a MAC not (yet) held by its announcer is read again.
const RECHECK: Duration = Duration::from_secs(1);

/// How often a refused MAC is read again (its lease may have come to the member).
const REFUSED_RECHECK: Duration = Duration::from_secs(5);

/// How often a MAC held by its announcer is read again.
const HELD_RECHECK: Duration = Duration::from_secs(300);

/// How long a refusal is remembered after the member stopped announcing the MAC: one
/// that announces it again gets no new grace.
const REFUSAL_MEMORY: Duration = Duration::from_secs(600);

/// Most DHT reads out at once, per namespace.
const MAX_READS: usize = 64;

/// A read unanswered this long is taken as lost (the MAC is read again).
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What the driver must tell the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Change<H> {
    pub(crate) peer: H,
    pub(crate) mac: Mac,
    pub(crate) refused: bool,
}

#[derive(Debug)]
struct Entry<H> {
    handle: H,
    announced: bool,
    refused: bool,
    /// The DHT named the member as the holder at the last read.
    held: bool,
    /// Since when the DHT has not named the member as the holder.
    unheld_since: Option<Instant>,
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

/// The checks of one namespace: members named by `I` (their identity), reached by
/// tunnels named by `H`.
#[derive(Debug)]
pub(crate) struct MacChecks<I, H> {
    entries: HashMap<(I, Mac), Entry<H>>,
    /// MACs whose holder is being read, since when.
    reading: HashMap<Mac, Instant>,
    refusals: u64,
}

impl<I, H> Default for MacChecks<I, H> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            reading: HashMap::new(),
            refusals: 0,
        }
    }
}

impl<I: Copy + Eq + std::hash::Hash, H: Copy> MacChecks<I, H> {
    /// Member `peer` (tunnel `handle`) announced exactly `macs`: the changes to make now
    /// (a MAC refused before and announced again is refused at once).
    pub(crate) fn announced(
        &mut self,
        now: Instant,
        (peer, handle): (I, H),
        macs: &[Mac],
    ) -> Vec<Change<H>> {
        let mut changes = Vec::new();
        for (&(_, mac), e) in self.entries.iter_mut().filter(|((id, _), _)| *id == peer) {
            let listed = macs.contains(&mac);
            e.handle = handle;
            if listed && !e.announced && e.refused {
                changes.push(Change {
                    peer: handle,
                    mac,
                    refused: true,
                });
            }
            if listed && !e.announced && e.next.is_none() {
                // Announced again with no read out for it: read it.
                e.next = Some(now);
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
                handle,
                announced: true,
                refused: false,
                held: false,
                unheld_since: None,
                next: Some(now),
                dropped_at: None,
            });
        }
        // Forgotten: what is no longer announced and allowed, and old refusals.
        self.entries.retain(|_, e| {
            e.announced
                || (e.refused
                    && e.dropped_at
                        .is_some_and(|t| now.saturating_duration_since(t) < REFUSAL_MEMORY))
        });
        changes
    }

    /// The tunnel of member `peer` is gone: its allowed MACs are forgotten (a refusal is
    /// remembered, as for a MAC it stopped announcing).
    pub(crate) fn forget(&mut self, now: Instant, peer: I) {
        for ((id, _), e) in &mut self.entries {
            if *id == peer {
                e.announced = false;
                e.dropped_at = e.dropped_at.or(Some(now));
            }
        }
        self.entries.retain(|_, e| e.announced || e.refused);
    }

    /// The tunnel `handle` is gone: as [`MacChecks::forget`] for its member.
    pub(crate) fn forget_handle(&mut self, now: Instant, handle: H)
    where
        H: Eq,
    {
        let ids: Vec<I> = self
            .entries
            .iter()
            .filter(|(_, e)| e.handle == handle && e.announced)
            .map(|((id, _), _)| *id)
            .collect();
        for id in ids {
            self.forget(now, id);
        }
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

    /// When [`MacChecks::due`] has something next.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let reads = self.reading.values().map(|t| *t + READ_TIMEOUT);
        self.entries
            .values()
            .filter(|e| e.announced)
            .filter_map(|e| e.next)
            .chain(reads)
            .min()
    }

    /// The DHT says `holder` holds `mac` (`None`: nobody): the changes to make.
    pub(crate) fn holder(&mut self, now: Instant, mac: Mac, holder: Option<I>) -> Vec<Change<H>> {
        self.reading.remove(&mac);
        let mut changes = Vec::new();
        for (&(id, m), e) in self.entries.iter_mut().filter(|((_, m), _)| *m == mac) {
            if !e.announced {
                continue;
            }
            e.held = holder == Some(id);
            let refused = if e.held {
                e.unheld_since = None;
                e.next = Some(now + HELD_RECHECK);
                false
            } else {
                let since = *e.unheld_since.get_or_insert(now);
                let refused = now.saturating_duration_since(since) >= GRACE;
                e.next = Some(now + if refused { REFUSED_RECHECK } else { RECHECK });
                refused
            };
            if refused != e.refused {
                e.refused = refused;
                if refused {
                    self.refusals += 1;
                }
                changes.push(Change {
                    peer: e.handle,
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
