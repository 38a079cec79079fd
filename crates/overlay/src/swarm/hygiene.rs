//! Which addresses may stand for an agent's underlay in the DHT.
//!
//! Kademlia hands every address it stores to anyone who asks for close peers, strangers
//! included, and dials whatever it is handed. So an address that only means something
//! inside one host or one namespace must never enter it: loopback (another host's
//! `127.0.0.1` is ours), link-local, multicast, broadcast, unspecified, and every address
//! of a namespace subnet (an agent listening on `0.0.0.0` also listens on its TAP, whose
//! address would tell strangers the namespace's addressing and has no meaning on the
//! underlay). The same filter decides what this agent announces (identify's external
//! addresses) and what it stores about others (identify, mDNS, dialled addresses).

use std::net::IpAddr;

use ipnet::IpNet;

use super::addr::ip_of;
use super::{Multiaddr, Overlay};

/// The networks excluded from the underlay beyond the fixed kinds: the namespace subnets.
#[derive(Debug, Default, Clone)]
pub(super) struct Hygiene {
    excluded: Vec<IpNet>,
}

impl Hygiene {
    /// Adds `net` (a namespace subnet) to the excluded networks; whether it was new.
    pub(super) fn exclude(&mut self, net: IpNet) -> bool {
        let net = net.trunc();
        if self.excluded.contains(&net) {
            return false;
        }
        self.excluded.push(net);
        true
    }

    /// Whether `addr` may be kept or announced as an underlay address. `loopback_ok`: the
    /// address concerns a peer on this very host (connected over loopback), or this
    /// agent listens on loopback alone; only then is a loopback address meaningful.
    /// Addresses without an IP (in-process memory addresses) pass: there is nothing to
    /// judge.
    pub(super) fn allows(&self, addr: &Multiaddr, loopback_ok: bool) -> bool {
        let Some(ip) = ip_of(addr) else {
            return true;
        };
        if ip.is_loopback() {
            return loopback_ok;
        }
        is_global_enough(ip) && !self.excluded.iter().any(|net| net.contains(&ip))
    }
}

impl Overlay {
    /// Keeps every address in `net` (a namespace subnet) out of the DHT: not announced
    /// as this agent's, not kept for any peer, not a tunnel endpoint. Addresses already
    /// announced or kept in it are withdrawn.
    pub fn exclude_network(&mut self, net: ipnet::IpNet) {
        if !self.hygiene.exclude(net) {
            return;
        }
        let loopback_ok = self.listens_on_loopback;
        let external: Vec<Multiaddr> = self.swarm.external_addresses().cloned().collect();
        for addr in external {
            if !self.hygiene.allows(&addr, loopback_ok) {
                self.swarm.remove_external_address(&addr);
            }
        }
        let mut stale = Vec::new();
        for bucket in self.swarm.behaviour_mut().kad.kbuckets() {
            for entry in bucket.iter() {
                for addr in entry.node.value.iter() {
                    if ip_of(addr).is_some_and(|ip| net.contains(&ip)) {
                        stale.push((*entry.node.key.preimage(), addr.clone()));
                    }
                }
            }
        }
        for (peer, addr) in stale {
            self.stats.addresses_filtered += 1;
            self.swarm.behaviour_mut().kad.remove_address(&peer, &addr);
        }
    }
}

/// Whether `ip` can be reached from another host at all: not unspecified, link-local,
/// multicast or broadcast. Private ranges (RFC 1918, ULA) pass: LAN underlays use them.
fn is_global_enough(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified() || v4.is_link_local() || v4.is_multicast() || v4.is_broadcast())
        }
        IpAddr::V6(v6) => {
            let link_local = (v6.segments()[0] & 0xffc0) == 0xfe80;
            !(v6.is_unspecified() || link_local || v6.is_multicast())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Multiaddr {
        s.parse().unwrap()
    }

    #[test]
    fn fixed_kinds_are_never_underlay() {
        let h = Hygiene::default();
        for bad in [
            "/ip4/0.0.0.0/tcp/7400",
            "/ip4/169.254.3.4/tcp/7400",
            "/ip4/224.0.0.251/tcp/7400",
            "/ip4/255.255.255.255/tcp/7400",
            "/ip6/::/tcp/7400",
            "/ip6/fe80::1/tcp/7400",
            "/ip6/ff02::1/tcp/7400",
        ] {
            assert!(!h.allows(&a(bad), true), "{bad}");
        }
        for good in [
            "/ip4/192.0.2.7/tcp/7400",
            "/ip4/10.0.0.1/tcp/7400",
            "/ip4/192.168.1.2/tcp/7400/p2p-circuit",
            "/ip6/2001:db8::1/tcp/7400",
            "/ip6/fd00::1/tcp/7400",
            "/memory/42",
        ] {
            assert!(h.allows(&a(good), false), "{good}");
        }
    }

    #[test]
    fn loopback_only_when_it_means_this_host() {
        let h = Hygiene::default();
        for lo in ["/ip4/127.0.0.1/tcp/7400", "/ip6/::1/tcp/7400"] {
            assert!(!h.allows(&a(lo), false), "{lo}");
            assert!(h.allows(&a(lo), true), "{lo}");
        }
    }

    #[test]
    fn namespace_subnets_are_excluded() {
        let mut h = Hygiene::default();
        let tap = a("/ip4/10.201.0.5/tcp/7400");
        assert!(h.allows(&tap, false));
        assert!(h.exclude("10.201.7.9/16".parse().unwrap()));
        assert!(!h.exclude("10.201.0.0/16".parse().unwrap()), "same net");
        assert!(!h.allows(&tap, false));
        assert!(!h.allows(&tap, true));
        assert!(!h.allows(&a("/ip4/10.201.255.255/tcp/1"), false));
        // Next door is still underlay.
        assert!(h.allows(&a("/ip4/10.202.0.5/tcp/7400"), false));
    }
}
