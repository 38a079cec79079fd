//! Next-hop MAC addresses for frames the agent builds itself (AF_XDP), from the kernel's
//! own resolution: its IPv4 routes (`/proc/net/route`) and ARP table (`/proc/net/arp`).
//! A destination the kernel has not resolved has no entry; its datagrams go through the
//! UDP socket, which makes the kernel resolve it, and the next refresh finds it.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use hyphae_vswitch::Mac;

/// `ATF_COM` in `/proc/net/arp`'s flags: the entry is resolved.
const ATF_COM: u32 = 0x2;
/// `RTF_UP` and `RTF_GATEWAY` in `/proc/net/route`'s flags.
const RTF_UP: u32 = 0x1;
const RTF_GATEWAY: u32 = 0x2;

/// One IPv4 route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Route {
    pub(crate) interface: String,
    pub(crate) network: Ipv4Addr,
    pub(crate) prefix: u32,
    pub(crate) gateway: Option<Ipv4Addr>,
}

/// The routes and resolved neighbours of the main table, as last read.
#[derive(Debug, Default)]
pub(crate) struct Neighbours {
    routes: Vec<Route>,
    arp: HashMap<Ipv4Addr, Mac>,
}

impl Neighbours {
    /// Reads the kernel's tables again; a table that cannot be read is left empty (every
    /// destination then goes through the socket).
    pub(crate) fn refresh(&mut self, interface: &str) {
        let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
        let arp = std::fs::read_to_string("/proc/net/arp").unwrap_or_default();
        self.routes = parse_routes(&routes);
        self.arp = parse_arp(&arp, interface);
    }

    /// The MAC to send a packet for `dst` to, if its route leaves through `interface` and
    /// the kernel resolved the next hop (the gateway, or `dst` on the link).
    pub(crate) fn next_hop(&self, interface: &str, dst: Ipv4Addr) -> Option<Mac> {
        let route = self
            .routes
            .iter()
            .filter(|r| {
                let mask = u32::MAX.checked_shl(32 - r.prefix).unwrap_or(0);
                u32::from(dst) & mask == u32::from(r.network) & mask
            })
            .max_by_key(|r| r.prefix)?;
        if route.interface != interface {
            return None;
        }
        self.arp.get(&route.gateway.unwrap_or(dst)).copied()
    }
}

/// An address as `/proc/net/route` prints it: the 32 bits in memory order, in hex.
fn proc_ipv4(hex: &str) -> Option<Ipv4Addr> {
    let v = u32::from_str_radix(hex, 16).ok()?;
    Some(Ipv4Addr::from(v.to_ne_bytes()))
}

/// The up routes of `/proc/net/route` (Iface Destination Gateway Flags RefCnt Use Metric
/// Mask ...); lines that do not parse are skipped.
pub(crate) fn parse_routes(text: &str) -> Vec<Route> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let flags = u32::from_str_radix(f.get(3)?, 16).ok()?;
            if flags & RTF_UP == 0 {
                return None;
            }
            let mask = proc_ipv4(f.get(7)?)?;
            Some(Route {
                interface: (*f.first()?).to_string(),
                network: proc_ipv4(f.get(1)?)?,
                prefix: u32::from(mask).count_ones(),
                gateway: (flags & RTF_GATEWAY != 0)
                    .then(|| proc_ipv4(f.get(2)?))
                    .flatten(),
            })
        })
        .collect()
}

/// The resolved entries of `/proc/net/arp` on `interface` (IP address, HW type, Flags, HW
/// address, Mask, Device).
pub(crate) fn parse_arp(text: &str, interface: &str) -> HashMap<Ipv4Addr, Mac> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(5) != Some(&interface) {
                return None;
            }
            let flags = u32::from_str_radix(f.get(2)?.trim_start_matches("0x"), 16).ok()?;
            if flags & ATF_COM == 0 {
                return None;
            }
            let mut mac = [0u8; 6];
            let mut parts = f.get(3)?.split(':');
            for b in &mut mac {
                *b = u8::from_str_radix(parts.next()?, 16).ok()?;
            }
            if parts.next().is_some() {
                return None;
            }
            Some((f.first()?.parse().ok()?, mac))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTE: &str = "\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t0100C80A\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth0\t0000C80A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
hyphae0\t0000C90A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
";

    const ARP: &str = "\
IP address       HW type     Flags       HW address            Mask     Device
10.200.0.1       0x1         0x2         02:00:00:00:00:01     *        eth0
10.200.0.2       0x1         0x2         02:00:00:00:00:02     *        eth0
10.200.0.3       0x1         0x0         00:00:00:00:00:00     *        eth0
10.201.0.9       0x1         0x2         02:00:00:00:00:09     *        hyphae0
";

    #[test]
    fn routes_parse_in_memory_order() {
        let routes = parse_routes(ROUTE);
        assert_eq!(routes.len(), 3);
        assert_eq!(routes[0].gateway, Some(Ipv4Addr::new(10, 200, 0, 1)));
        assert_eq!(routes[0].prefix, 0);
        assert_eq!(routes[1].network, Ipv4Addr::new(10, 200, 0, 0));
        assert_eq!(routes[1].prefix, 24);
        assert_eq!(routes[1].gateway, None);
    }

    #[test]
    fn next_hop_is_the_neighbour_or_the_gateway_on_our_interface_only() {
        let n = Neighbours {
            routes: parse_routes(ROUTE),
            arp: parse_arp(ARP, "eth0"),
        };
        // On the link: the destination's own MAC.
        assert_eq!(
            n.next_hop("eth0", Ipv4Addr::new(10, 200, 0, 2)),
            Some([2, 0, 0, 0, 0, 2])
        );
        // Incomplete entry: not resolved, so the socket sends it.
        assert_eq!(n.next_hop("eth0", Ipv4Addr::new(10, 200, 0, 3)), None);
        // Off the link: the gateway's MAC.
        assert_eq!(
            n.next_hop("eth0", Ipv4Addr::new(192, 0, 2, 7)),
            Some([2, 0, 0, 0, 0, 1])
        );
        // Routed through another interface: never through ours.
        assert_eq!(n.next_hop("eth0", Ipv4Addr::new(10, 201, 0, 9)), None);
        assert!(!parse_arp(ARP, "eth0").contains_key(&Ipv4Addr::new(10, 201, 0, 9)));
    }

    #[test]
    fn garbage_tables_give_nothing() {
        assert!(parse_routes("x\nnot a route\neth0 zz zz zz").is_empty());
        assert!(parse_arp("x\n1.2.3.4 0x1 0x2 02:00 * eth0\n", "eth0").is_empty());
        assert!(Neighbours::default()
            .next_hop("eth0", Ipv4Addr::LOCALHOST)
            .is_none());
    }
}
