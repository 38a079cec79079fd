//! Caps per member and per host (docs/QOS.md, "Caps per member, group and host"): rules
//! that pick packets by the member at the other end of the tunnel (its certificate's groups
//! and name, or the addresses it uses) and by the host on this side (this member or one of
//! its LAN hosts, by address), and cap what they send (egress) and receive (ingress). Each
//! member, or each host, has a bucket of its own, or all that a rule picks share one.
//!
//! [`Caps`] is the compiled list (first rule with a rate for the direction wins, as the
//! policy's rules do); [`Keyed`] holds the pacers, one per key, made when a key first sends
//! and forgotten once idle (a forgotten pacer's bucket was full: nothing changes when it
//! comes back). Pure: time comes in as [`Instant`]s.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;

use super::{parse_rate, Paced, Pacer, PacerStats};

#[cfg(test)]
mod tests;

/// Most caps one namespace lists (each is a bit of a member's mask).
pub const MAX_CAPS: usize = 64;

/// How often a full [`Keyed`] may be swept for room.
const FORCED_SWEEP: std::time::Duration = std::time::Duration::from_millis(100);

/// Most keys (members, hosts) one [`Keyed`] paces at once; idle ones are forgotten first,
/// and a new key past this many with none idle has its packets dropped (counted).
pub const MAX_KEYS: usize = 4096;

/// One `[[namespace.cap]]` as written in a config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapFile {
    /// Members at the other end: `any`, `group:NAME`, `name:NAME`, addresses or CIDRs
    /// (what the member sends from or to: a remote router's LAN hosts by their
    /// addresses). None: any member.
    #[serde(default)]
    pub members: Vec<String>,
    /// Hosts on this side, by address or CIDR (this member's address, or its LAN hosts in
    /// router mode). None: any.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// What this side sends them, bits a second (`"20M"`).
    pub egress: Option<String>,
    /// What this side takes from them, bits a second.
    pub ingress: Option<String>,
    /// Bytes at once after a quiet spell (default: 10 ms at the rate, at least 64 KiB).
    pub burst: Option<u64>,
    /// The weight of each member (or host, or all together, by `per`) inside the
    /// namespace's share of `[agent] uplink_rate` (1 to 1000; members no cap weighs: 1).
    pub weight: Option<u64>,
    /// `member` (a bucket per member; the default without `hosts`), `host` (a bucket per
    /// address on this side; the default with `hosts`) or `all` (one bucket for everything
    /// the rule picks: a group's cap).
    pub per: Option<String>,
}

/// Whose bucket a packet takes under a cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Per {
    /// The member at the other end's.
    Member,
    /// The host on this side's (by address).
    Host,
    /// The cap's one bucket.
    All,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Who {
    Any,
    Group(String),
    Name(String),
    Net(IpNet),
}

/// One compiled cap.
#[derive(Debug, Clone)]
pub struct Cap {
    members: Vec<Who>,
    hosts: Vec<IpNet>,
    /// Egress and ingress rates, bits a second.
    pub egress: Option<u64>,
    pub ingress: Option<u64>,
    /// Burst, bytes (for the rate of each direction).
    burst: Option<u64>,
    /// Weight inside the namespace's share of the uplink.
    pub weight: Option<u64>,
    pub per: Per,
    /// What it picks, as written, for status: `members group:guests, hosts 10.0.0.0/24`.
    pub picks: String,
}

impl Cap {
    /// The burst for a rate of `bits` a second: as set, or 10 ms at the rate; at least
    /// [`super::MIN_BURST`].
    pub fn burst(&self, bits: u64) -> u64 {
        self.burst.unwrap_or(bits / 8 / 100).max(super::MIN_BURST)
    }

    /// Whether it names an IPv6 address or prefix (among members or hosts).
    fn names_ipv6(&self) -> bool {
        let member_nets = self.members.iter().filter_map(|w| match w {
            Who::Net(n) => Some(n),
            _ => None,
        });
        member_nets
            .chain(&self.hosts)
            .any(|n| matches!(n, IpNet::V6(_)))
    }

    /// Whether the member set names members by certificate (`any`, groups, names), so a
    /// member's mask depends on it.
    fn by_certificate(&self, groups: &[&str], name: Option<&str>) -> bool {
        self.members.is_empty()
            || self.members.iter().any(|w| match w {
                Who::Any => true,
                Who::Group(g) => groups.contains(&g.as_str()),
                Who::Name(n) => name == Some(n.as_str()),
                Who::Net(_) => false,
            })
    }
}

/// A namespace's caps, in order.
#[derive(Debug, Clone, Default)]
pub struct Caps {
    caps: Vec<Cap>,
}

impl Caps {
    /// Compiles `files`; `certified`: the namespace has an authority, so groups and names
    /// mean something (without one, rules may name addresses only).
    pub fn compile(files: &[CapFile], certified: bool) -> Result<Self, String> {
        if files.len() > MAX_CAPS {
            return Err(format!("{} caps, at most {MAX_CAPS}", files.len()));
        }
        let caps = files
            .iter()
            .enumerate()
            .map(|(i, f)| compile_one(f, certified).map_err(|e| format!("cap {}: {e}", i + 1)))
            .collect::<Result<_, _>>()?;
        Ok(Self { caps })
    }

    pub fn is_empty(&self) -> bool {
        self.caps.is_empty()
    }

    pub fn caps(&self) -> &[Cap] {
        &self.caps
    }

    /// The caps (numbered from 1, with what they pick) that name an IPv6 address or prefix:
    /// a namespace that carries no IPv6 warns of them.
    pub fn naming_ipv6(&self) -> Vec<(usize, &str)> {
        let named = self.caps.iter().enumerate().filter(|(_, c)| c.names_ipv6());
        named.map(|(i, c)| (i + 1, c.picks.as_str())).collect()
    }

    /// Whether any cap names members by group or name (their masks then wait for their
    /// certificates).
    pub fn names_certificates(&self) -> bool {
        self.caps.iter().any(|c| {
            c.members
                .iter()
                .any(|w| matches!(w, Who::Group(_) | Who::Name(_)))
        })
    }

    /// The caps whose member set picks a member with these certificate `groups` and
    /// `name` by certificate (bit `r` for cap `r`); caps that name addresses are checked
    /// per packet by [`Caps::find`].
    pub fn member_mask(&self, groups: &[&str], name: Option<&str>) -> u64 {
        self.caps
            .iter()
            .enumerate()
            .filter(|(_, c)| c.by_certificate(groups, name))
            .fold(0, |m, (r, _)| m | 1 << r)
    }

    /// Whether any cap gives a weight.
    pub fn weighs(&self) -> bool {
        self.caps.iter().any(|c| c.weight.is_some())
    }

    /// The first cap with a rate for this direction (`ingress`, else egress) over a
    /// packet between a member of mask `mask` using address `remote` and the host on this
    /// side at `local` (both IPv4 or both IPv6: a CIDR of one family never picks the
    /// other's addresses).
    pub fn find(&self, mask: u64, remote: IpAddr, local: IpAddr, ingress: bool) -> Option<usize> {
        self.first(mask, remote, local, |c| {
            if ingress {
                c.ingress.is_some()
            } else {
                c.egress.is_some()
            }
        })
    }

    /// The first cap with a weight over a packet sent to a member (as [`Caps::find`]).
    pub fn find_weight(&self, mask: u64, remote: IpAddr, local: IpAddr) -> Option<usize> {
        self.first(mask, remote, local, |c| c.weight.is_some())
    }

    fn first(
        &self,
        mask: u64,
        remote: IpAddr,
        local: IpAddr,
        has: impl Fn(&Cap) -> bool,
    ) -> Option<usize> {
        self.caps.iter().enumerate().position(|(r, c)| {
            has(c)
                && (mask & (1 << r) != 0
                    || c.members
                        .iter()
                        .any(|w| matches!(w, Who::Net(n) if n.contains(&remote))))
                && (c.hosts.is_empty() || c.hosts.iter().any(|n| n.contains(&local)))
        })
    }
}

fn compile_one(f: &CapFile, certified: bool) -> Result<Cap, String> {
    let rate = |r: &Option<String>| r.as_deref().map(parse_rate).transpose();
    let (egress, ingress) = (rate(&f.egress)?, rate(&f.ingress)?);
    if egress.is_none() && ingress.is_none() && f.weight.is_none() {
        return Err("needs an egress or an ingress rate, or a weight".into());
    }
    if let Some(w) = f.weight.filter(|w| !(1..=1000).contains(w)) {
        return Err(format!("weight {w}: 1 to 1000"));
    }
    if f.burst.is_some() && egress.is_none() && ingress.is_none() {
        return Err("burst needs a rate".into());
    }
    let mut members = Vec::with_capacity(f.members.len());
    for word in &f.members {
        let who = if word == "any" {
            Who::Any
        } else if let Some(g) = word.strip_prefix("group:") {
            Who::Group(g.to_owned())
        } else if let Some(n) = word.strip_prefix("name:") {
            Who::Name(n.to_owned())
        } else {
            Who::Net(net(word).ok_or_else(|| {
                format!("member '{word}': any, group:NAME, name:NAME, an address or a CIDR")
            })?)
        };
        if !certified && matches!(who, Who::Group(_) | Who::Name(_)) {
            return Err(format!("'{word}' needs a namespace with an authority (without one, members' groups and names are not checked): name addresses"));
        }
        members.push(who);
    }
    let hosts = f
        .hosts
        .iter()
        .map(|w| net(w).ok_or_else(|| format!("host '{w}': an address or a CIDR")))
        .collect::<Result<Vec<_>, _>>()?;
    let per = match f.per.as_deref() {
        None if hosts.is_empty() => Per::Member,
        None | Some("host") => Per::Host,
        Some("member") => Per::Member,
        Some("all") => Per::All,
        Some(other) => return Err(format!("per '{other}': member, host or all")),
    };
    let mut picks = Vec::new();
    if !f.members.is_empty() {
        picks.push(format!("members {}", f.members.join(" ")));
    }
    if !f.hosts.is_empty() {
        picks.push(format!("hosts {}", f.hosts.join(" ")));
    }
    if picks.is_empty() {
        picks.push("any".into());
    }
    Ok(Cap {
        members,
        hosts,
        egress,
        ingress,
        burst: f.burst,
        weight: f.weight,
        per,
        picks: picks.join(", "),
    })
}

fn net(word: &str) -> Option<IpNet> {
    word.parse::<IpNet>()
        .ok()
        .or_else(|| word.parse::<IpAddr>().ok().map(IpNet::from))
}

/// Pacers by key: a member's, a host's, a cap's. What one key sends beyond its rate waits
/// in its own queue (at most its pacer's delay), in order; keys do not wait on each other.
#[derive(Debug)]
pub struct Keyed<K, T> {
    pacers: HashMap<K, Pacer<T>>,
    /// Keys with something queued.
    waiting: Vec<K>,
    max_keys: usize,
    /// Which class (a cap) a key counts under, for totals.
    class_of: fn(&K) -> usize,
    /// What forgotten pacers had counted, by class; and the packets of keys that found no
    /// room for a pacer, counted as dropped.
    forgotten: Vec<PacerStats>,
    /// When a full table was last swept for a new key.
    last_forced: Option<std::time::Instant>,
}

impl<K: Clone + Eq + Hash, T> Keyed<K, T> {
    /// At most `max_keys` pacers at once; `class_of` says which of `classes` classes a
    /// key's counts add to ([`Keyed::totals`]).
    pub fn new(max_keys: usize, classes: usize, class_of: fn(&K) -> usize) -> Self {
        Self {
            pacers: HashMap::new(),
            waiting: Vec::new(),
            max_keys,
            class_of,
            forgotten: vec![PacerStats::default(); classes],
            last_forced: None,
        }
    }

    /// Whether `len` bytes of `key` may go at `now` without waiting; counted as sent if
    /// so. Else [`Keyed::push`] them. `make` builds the key's pacer if it has none.
    pub fn send_now(
        &mut self,
        now: std::time::Instant,
        key: &K,
        len: usize,
        make: impl FnOnce() -> Pacer<T>,
    ) -> bool {
        if !self.pacers.contains_key(key) {
            // A full table is swept at most every [`FORCED_SWEEP`]: a stream of new keys
            // with none idle costs a lookup each, not a walk of the table each.
            if self.pacers.len() >= self.max_keys
                && self
                    .last_forced
                    .is_none_or(|t| now.saturating_duration_since(t) >= FORCED_SWEEP)
            {
                self.last_forced = Some(now);
                self.sweep(now);
            }
            if self.pacers.len() >= self.max_keys {
                return false;
            }
            self.pacers.insert(key.clone(), make());
        }
        self.pacers
            .get_mut(key)
            .is_some_and(|p| p.send_now(now, len))
    }

    /// An item of `len` bytes of `key`, which [`Keyed::send_now`] did not let go: queued
    /// in its pacer, or dropped (its queue is full, or it found no room for a pacer: then
    /// counted as dropped in its class's totals).
    pub fn push(&mut self, now: std::time::Instant, key: K, item: T, len: usize) -> Paced<T> {
        let Some(pacer) = self.pacers.get_mut(&key) else {
            if let Some(f) = self.forgotten.get_mut((self.class_of)(&key)) {
                f.dropped += 1;
                f.dropped_bytes += len as u64;
            }
            return Paced::Dropped(item);
        };
        let was_waiting = pacer.queued().0 > 0;
        let paced = pacer.push(now, item, len);
        if matches!(paced, Paced::Queued) && !was_waiting {
            self.waiting.push(key);
        }
        paced
    }

    /// The next queued item whose tokens have come by `now` (each key's in order).
    pub fn poll(&mut self, now: std::time::Instant) -> Option<T> {
        let mut k = 0;
        while k < self.waiting.len() {
            let Some(pacer) = self.pacers.get_mut(&self.waiting[k]) else {
                self.waiting.swap_remove(k);
                continue;
            };
            if let Some(item) = pacer.poll(now) {
                if pacer.queued().0 == 0 {
                    self.waiting.swap_remove(k);
                }
                return Some(item);
            }
            k += 1;
        }
        None
    }

    /// When the first queued item may go, if any waits.
    pub fn poll_timeout(&self) -> Option<std::time::Instant> {
        self.waiting
            .iter()
            .filter_map(|k| self.pacers.get(k)?.poll_timeout())
            .min()
    }

    /// Forgets the pacers of the keys `gone` names, queue and all (their counts stay in
    /// the totals, the queued items as dropped), and drops the queued items of other keys
    /// that `keep` refuses: what was queued for something that no longer exists.
    pub fn forget(&mut self, mut gone: impl FnMut(&K) -> bool, mut keep: impl FnMut(&T) -> bool) {
        let (forgotten, class_of) = (&mut self.forgotten, self.class_of);
        self.pacers.retain(|k, p| {
            if gone(k) {
                p.retain(|_| false);
                if let Some(f) = forgotten.get_mut(class_of(k)) {
                    add(f, p.stats());
                }
                return false;
            }
            p.retain(&mut keep);
            true
        });
        let pacers = &self.pacers;
        self.waiting
            .retain(|k| pacers.get(k).is_some_and(|p| p.queued().0 > 0));
    }

    /// Forgets the pacers that are idle at `now` (nothing queued, bucket full).
    pub fn sweep(&mut self, now: std::time::Instant) {
        let (forgotten, class_of) = (&mut self.forgotten, self.class_of);
        self.pacers.retain(|k, p| {
            let idle = p.is_idle(now);
            if idle {
                if let Some(f) = forgotten.get_mut(class_of(k)) {
                    add(f, p.stats());
                }
            }
            !idle
        });
    }

    /// The pacers now, by key.
    pub fn pacers(&self) -> impl Iterator<Item = (&K, &Pacer<T>)> {
        self.pacers.iter()
    }

    /// Counters of every pacer of `class`, forgotten ones included.
    pub fn totals(&self, class: usize) -> PacerStats {
        let mut t = self.forgotten.get(class).copied().unwrap_or_default();
        for (_, p) in self
            .pacers
            .iter()
            .filter(|(k, _)| (self.class_of)(k) == class)
        {
            add(&mut t, p.stats());
        }
        t
    }
}

fn add(t: &mut PacerStats, s: PacerStats) {
    t.sent += s.sent;
    t.sent_bytes += s.sent_bytes;
    t.delayed += s.delayed;
    t.dropped += s.dropped;
    t.dropped_bytes += s.dropped_bytes;
}
