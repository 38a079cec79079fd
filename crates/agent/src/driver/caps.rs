//! A namespace's caps per member, group and host in the data path (docs/QOS.md, "Caps per
//! member, group and host"): which cap and whose bucket a packet takes, from its tunnel's
//! certificate (worked out once per member, as the policy's tags are) and its addresses.
//! Egress caps hold packets before the namespace's own cap and the uplink's shares; ingress
//! caps hold frames before the TAP.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use hyphae_overlay::{Node, PeerHandle};
use hyphae_vswitch::qos::caps::{Per, MAX_KEYS};
use hyphae_vswitch::qos::{Caps, Keyed, Pacer, MAX_DELAY};

use super::policy::ends;
use crate::control::{BucketStatus, CapDirection, CapStatus};

/// How often idle buckets are forgotten.
const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// Whose bucket: a cap's index and the member, host or neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CapKey {
    pub(crate) cap: usize,
    pub(crate) who: Who,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Who {
    Member(PeerHandle),
    Host(IpAddr),
    All,
}

/// One namespace's caps and their pacers.
pub(crate) struct LaneCaps {
    caps: Caps,
    /// The caps each member's certificate puts it under ([`Caps::member_mask`]).
    masks: HashMap<PeerHandle, u64>,
    /// Packets to members: (tunnel, packet), before the namespace's cap.
    pub(crate) egress: Keyed<CapKey, (PeerHandle, Vec<u8>)>,
    /// Frames from members for the TAP.
    pub(crate) ingress: Keyed<CapKey, Vec<u8>>,
    next_sweep: Option<Instant>,
}

impl LaneCaps {
    /// None without caps: the data path then skips all of this.
    pub(crate) fn new(caps: Caps) -> Option<Self> {
        let n = caps.caps().len();
        (n > 0).then(|| Self {
            caps,
            masks: HashMap::new(),
            egress: Keyed::new(MAX_KEYS, n, |k: &CapKey| k.cap),
            ingress: Keyed::new(MAX_KEYS, n, |k: &CapKey| k.cap),
            next_sweep: None,
        })
    }

    /// Forgets idle buckets, every [`SWEEP_INTERVAL`].
    pub(crate) fn sweep(&mut self, now: Instant) {
        if self.next_sweep.is_some_and(|t| now < t) {
            return;
        }
        self.egress.sweep(now);
        self.ingress.sweep(now);
        self.next_sweep = Some(now + SWEEP_INTERVAL);
    }

    /// Each cap and its buckets, for status (members named by their identities).
    pub(crate) fn status(&self, node: &Node) -> Vec<CapStatus> {
        // Looked up once (each tunnel's entry takes its lock), not per bucket.
        let ids: HashMap<PeerHandle, String> =
            if self.egress.pacers().next().is_some() || self.ingress.pacers().next().is_some() {
                node.peers().map(|p| (p.handle, p.id.to_string())).collect()
            } else {
                HashMap::new()
            };
        let who = |w: Who| match w {
            Who::Member(h) => ids
                .get(&h)
                .cloned()
                .unwrap_or_else(|| "a member gone".into()),
            Who::Host(a) => a.to_string(),
            Who::All => "all".into(),
        };
        let direction = |rate: Option<u64>, burst: u64, r: usize, ingress: bool| {
            let rate = rate?;
            let totals = if ingress {
                self.ingress.totals(r)
            } else {
                self.egress.totals(r)
            };
            let mut buckets: Vec<BucketStatus> = Vec::new();
            let mut queued = 0;
            let mut add = |k: &CapKey, stats: hyphae_vswitch::qos::PacerStats, q: usize| {
                if k.cap == r {
                    queued += q;
                    buckets.push(BucketStatus {
                        who: who(k.who),
                        sent_bytes: stats.sent_bytes,
                        delayed: stats.delayed,
                        dropped: stats.dropped,
                        queued: q,
                    });
                }
            };
            if ingress {
                self.ingress
                    .pacers()
                    .for_each(|(k, p)| add(k, p.stats(), p.queued().0));
            } else {
                self.egress
                    .pacers()
                    .for_each(|(k, p)| add(k, p.stats(), p.queued().0));
            }
            buckets.sort_by(|a, b| a.who.cmp(&b.who));
            Some(CapDirection {
                rate,
                burst,
                sent_bytes: totals.sent_bytes,
                delayed: totals.delayed,
                dropped: totals.dropped,
                dropped_bytes: totals.dropped_bytes,
                queued,
                buckets,
            })
        };
        self.caps
            .caps()
            .iter()
            .enumerate()
            .map(|(r, c)| CapStatus {
                cap: r + 1,
                picks: c.picks.clone(),
                per: match c.per {
                    Per::Member => "member",
                    Per::Host => "host",
                    Per::All => "all",
                }
                .into(),
                egress: direction(c.egress, c.egress.map_or(0, |b| c.burst(b)), r, false),
                ingress: direction(c.ingress, c.ingress.map_or(0, |b| c.burst(b)), r, true),
                weight: c.weight,
            })
            .collect()
    }

    fn mask(&mut self, node: &Node, peer: PeerHandle) -> u64 {
        if let Some(m) = self.masks.get(&peer) {
            return *m;
        }
        let cert = node.peer_certificate(peer);
        let mask = match cert {
            Some(c) => {
                let groups: Vec<&str> = c.groups().iter().map(String::as_str).collect();
                self.caps.member_mask(&groups, Some(c.name()))
            }
            None => self.caps.member_mask(&[], None),
        };
        // Kept once the member showed its certificate, or when no cap asks for one.
        if cert.is_some() || !self.caps.names_certificates() {
            self.masks.insert(peer, mask);
        }
        mask
    }

    /// The cap and bucket IP packet `ip` takes between this side and the member of tunnel
    /// `peer` (`ingress`: from it), with the cap's rate and burst; None if no cap picks
    /// it.
    pub(crate) fn key(
        &mut self,
        node: &Node,
        peer: PeerHandle,
        ip: &[u8],
        ingress: bool,
    ) -> Option<(CapKey, u64, u64)> {
        let (src, dst) = ends(ip)?;
        let (remote, local) = if ingress { (src, dst) } else { (dst, src) };
        let mask = self.mask(node, peer);
        let r = self.caps.find(mask, remote, local, ingress)?;
        let cap = &self.caps.caps()[r];
        let rate = if ingress { cap.ingress } else { cap.egress }?;
        let who = match cap.per {
            Per::Member => Who::Member(peer),
            Per::Host => Who::Host(local),
            Per::All => Who::All,
        };
        Some((CapKey { cap: r, who }, rate, cap.burst(rate)))
    }

    /// The member part of the namespace's share of the uplink that IP packet `ip` to the
    /// member of tunnel `peer` takes, and its weight ([`Shares::push_member`]): the first
    /// cap with a weight that picks it decides (its `per` says whose part), else the member
    /// has a part of its own of weight 1. (0, 1), one part for all, when no cap weighs.
    ///
    /// [`Shares::push_member`]: hyphae_vswitch::qos::Shares::push_member
    pub(crate) fn share_member(&mut self, node: &Node, peer: PeerHandle, ip: &[u8]) -> (u64, u64) {
        if !self.caps.weighs() {
            return (0, 1);
        }
        let Some((local, remote)) = ends(ip) else {
            return (0, 1);
        };
        let mask = self.mask(node, peer);
        let (key, weight) = match self.caps.find_weight(mask, remote, local) {
            Some(r) => {
                let cap = &self.caps.caps()[r];
                let who = match cap.per {
                    Per::Member => Who::Member(peer),
                    Per::Host => Who::Host(local),
                    Per::All => Who::All,
                };
                (CapKey { cap: r, who }, cap.weight.unwrap_or(1))
            }
            None => (
                CapKey {
                    cap: usize::MAX,
                    who: Who::Member(peer),
                },
                1,
            ),
        };
        let mut h = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&key, &mut h);
        (std::hash::Hasher::finish(&h), weight)
    }

    /// The tunnel `peer` is gone (its handle may go to another): its buckets and what
    /// waits for it go too.
    pub(crate) fn forget_queued(&mut self, peer: PeerHandle) {
        let gone = |k: &CapKey| k.who == Who::Member(peer);
        self.egress.forget(gone, |(h, _)| *h != peer);
        self.ingress.forget(gone, |_| true);
    }

    /// The member of tunnel `peer` announced again (its certificate may have changed), or
    /// its tunnel is gone.
    pub(crate) fn forget(&mut self, peer: PeerHandle) {
        self.masks.remove(&peer);
    }
}

/// A pacer for a cap of `rate` bits a second and `burst` bytes.
pub(crate) fn pacer<T>(rate: u64, burst: u64) -> Pacer<T> {
    Pacer::new(rate, burst, MAX_DELAY)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use super::*;

    #[test]
    fn the_ends_of_ipv4_and_ipv6_packets_and_of_neither() {
        let mut v4 = vec![
            0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        assert_eq!(
            ends(&v4),
            Some(("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()))
        );
        let mut v6 = vec![0x60, 0, 0, 0, 0, 0, 17, 64];
        v6.extend_from_slice(&"fd00::1".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&"fd00::2".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(
            ends(&v6),
            Some(("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap()))
        );
        // Short headers and other versions: none.
        v4.pop();
        v6.pop();
        assert_eq!(ends(&v4), None);
        assert_eq!(ends(&v6), None);
        assert_eq!(ends(&[0x25; 40]), None);
        assert_eq!(ends(&[]), None);
    }
}
