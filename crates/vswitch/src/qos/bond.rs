//! Bonding over several underlay links (issue 32, item 3; the KU paper's V-channel): which
//! link each flow of a tunnel takes, and which links are alive.
//!
//! - **A flow stays on its link.** The first packet of a flow places it; every later one
//!   takes the same link while that link lives, so nothing inside a session is reordered.
//! - **Flows are spread by the links' rates.** A new flow goes to the live link with the
//!   fewest flows for its rate (flows ÷ rate, compared by cross-multiplying), so flows of
//!   like demand split as the rates do.
//! - **A dead link moves its flows.** Each link is probed every [`PROBE_INTERVAL`] it has
//!   not been heard on; one heard from nothing for [`DEAD_AFTER`] is dead, and its flows
//!   are placed again, on live links, at their next packet. A dead link heard from again
//!   is alive for new flows; flows already elsewhere stay where they are.
//!
//! Pure: links are indices (the caller keeps their endpoints), time comes in as
//! [`Instant`]s, and the caller sends the probes [`Bond::poll_probe`] asks for.

use std::time::{Duration, Instant};

use hashlink::LruCache;

/// How often a link no packet was heard on is probed.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(200);

/// A link heard from nothing (data or probe answers) for this long is dead: three probes
/// unanswered, so a link that dies moves its flows within a second of its last packet.
pub const DEAD_AFTER: Duration = Duration::from_millis(700);

/// A flow idle this long is forgotten (placed afresh if it sends again).
pub const FLOW_IDLE: Duration = Duration::from_secs(30);

/// Most flows a bond remembers; past it the placement of the least recently seen goes.
pub const MAX_FLOWS: usize = 65_536;

/// One link of a bond, for status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkStats {
    /// Its rate (configured or measured), bits a second.
    pub rate: u64,
    pub alive: bool,
    /// Flows placed on it now.
    pub flows: usize,
    /// Packets and bytes sent on it.
    pub packets: u64,
    pub bytes: u64,
    /// Times it was declared dead.
    pub deaths: u64,
}

#[derive(Debug, Clone)]
struct Link {
    stats: LinkStats,
    /// When something was last heard on it (None: never).
    heard: Option<Instant>,
    /// When it was made or last probed.
    probed: Instant,
    /// Since when it is counted dead-or-alive from (its creation).
    since: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Placed {
    link: usize,
    seen: Instant,
}

/// The links of one tunnel and the flows placed on them.
#[derive(Debug, Clone)]
pub struct Bond {
    links: Vec<Link>,
    /// Flows by hash, least recently seen first.
    flows: LruCache<u64, Placed>,
    /// Flows moved off a dead link.
    pub moved: u64,
    next_sweep: Instant,
}

impl Bond {
    /// A bond over links of `rates` (bits a second, each at least 1), made at `now`: every
    /// link is alive until [`DEAD_AFTER`] passes without hearing from it.
    pub fn new(now: Instant, rates: &[u64]) -> Self {
        Self {
            links: rates
                .iter()
                .map(|&rate| Link {
                    stats: LinkStats {
                        rate: rate.max(1),
                        alive: true,
                        flows: 0,
                        packets: 0,
                        bytes: 0,
                        deaths: 0,
                    },
                    heard: None,
                    probed: now,
                    since: now,
                })
                .collect(),
            flows: LruCache::new(MAX_FLOWS),
            moved: 0,
            next_sweep: now + FLOW_IDLE,
        }
    }

    /// A bond over links a member announced, not yet heard on: each is dead until
    /// something authenticated comes in on it (see [`Bond::heard`]), and is probed at once.
    /// Until then flows go nowhere new: a member cannot point our data at an address that
    /// does not answer with its keys.
    pub fn unconfirmed(now: Instant, rates: &[u64]) -> Self {
        let mut bond = Self::new(now, rates);
        for l in &mut bond.links {
            l.stats.alive = false;
            l.probed = now.checked_sub(PROBE_INTERVAL).unwrap_or(now);
        }
        bond
    }

    /// Whether link `link` is alive.
    pub fn is_alive(&self, link: usize) -> bool {
        self.links.get(link).is_some_and(|l| l.stats.alive)
    }

    /// Whether any link is alive.
    pub fn any_alive(&self) -> bool {
        self.links.iter().any(|l| l.stats.alive)
    }

    /// Each link's counters, in order.
    pub fn links(&self) -> impl Iterator<Item = LinkStats> + '_ {
        self.links.iter().map(|l| l.stats)
    }

    /// Something authenticated came in on link `link` at `now`: it is alive.
    pub fn heard(&mut self, link: usize, now: Instant) {
        if let Some(l) = self.links.get_mut(link) {
            l.heard = Some(now);
            l.stats.alive = true;
        }
    }

    /// The link for a packet of `len` bytes of flow `flow` (a hash of its addresses and
    /// ports) at `now`: its flow's link if that lives, else the live link with the fewest
    /// flows for its rate. With no live link, the one heard from last (a path may come
    /// back; sending nowhere helps no one). None only for a bond without links.
    pub fn pick(&mut self, now: Instant, flow: u64, len: usize) -> Option<usize> {
        self.expire(now);
        if now >= self.next_sweep {
            self.sweep(now);
        }
        let link = match self.flows.get(&flow).copied() {
            // (`get` marks it seen: the least recently seen flow is the one to go.)
            Some(p) if self.links[p.link].stats.alive => p.link,
            placed => {
                let link = self.place()?;
                if let Some(p) = placed {
                    if p.link != link {
                        self.moved += 1;
                    }
                    self.links[p.link].stats.flows -= 1;
                } else if self.flows.len() >= MAX_FLOWS {
                    if let Some((_, old)) = self.flows.remove_lru() {
                        self.links[old.link].stats.flows -= 1;
                    }
                }
                self.links[link].stats.flows += 1;
                link
            }
        };
        self.flows.insert(flow, Placed { link, seen: now });
        let s = &mut self.links[link].stats;
        s.packets += 1;
        s.bytes += len as u64;
        Some(link)
    }

    fn place(&self) -> Option<usize> {
        let live = self
            .links
            .iter()
            .enumerate()
            .filter(|(_, l)| l.stats.alive)
            .min_by(|(_, a), (_, b)| {
                // (a.flows + 1) / a.rate against (b.flows + 1) / b.rate; ties to the faster.
                let ka = (a.stats.flows as u128 + 1) * u128::from(b.stats.rate);
                let kb = (b.stats.flows as u128 + 1) * u128::from(a.stats.rate);
                ka.cmp(&kb).then(b.stats.rate.cmp(&a.stats.rate))
            })
            .map(|(i, _)| i);
        live.or_else(|| {
            self.links
                .iter()
                .enumerate()
                .max_by_key(|(_, l)| l.heard)
                .map(|(i, _)| i)
        })
    }

    /// Declares dead the links heard from nothing for [`DEAD_AFTER`] by `now`.
    fn expire(&mut self, now: Instant) {
        for l in &mut self.links {
            let last = l.heard.unwrap_or(l.since);
            if l.stats.alive && now.saturating_duration_since(last) >= DEAD_AFTER {
                l.stats.alive = false;
                l.stats.deaths += 1;
            }
        }
    }

    /// A link to probe at `now`, if one is due: not heard from, nor probed, for
    /// [`PROBE_INTERVAL`]. Call until None.
    pub fn poll_probe(&mut self, now: Instant) -> Option<usize> {
        self.expire(now);
        let (i, l) = self.links.iter_mut().enumerate().find(|(_, l)| {
            let quiet = l
                .heard
                .is_none_or(|h| now.saturating_duration_since(h) >= PROBE_INTERVAL);
            quiet && now.saturating_duration_since(l.probed) >= PROBE_INTERVAL
        })?;
        l.probed = now;
        Some(i)
    }

    /// When the next probe is due or a link may die.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.links
            .iter()
            .flat_map(|l| {
                let heard = l.heard.unwrap_or(l.since);
                let probe = (heard + PROBE_INTERVAL).max(l.probed + PROBE_INTERVAL);
                let death = l.stats.alive.then_some(heard + DEAD_AFTER);
                [Some(probe), death]
            })
            .flatten()
            .min()
    }

    fn sweep(&mut self, now: Instant) {
        let links = &mut self.links;
        self.flows.retain(|_, p| {
            let keep = now.saturating_duration_since(p.seen) < FLOW_IDLE;
            if !keep {
                links[p.link].stats.flows -= 1;
            }
            keep
        });
        self.next_sweep = now + FLOW_IDLE;
    }
}

#[cfg(test)]
mod tests;
