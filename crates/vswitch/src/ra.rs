//! Router advertisements for the hosts of a router-mode LAN (RFC 4861 4.1-4.2, 6.2): the
//! namespace prefix, on link and for stateless autoconfiguration (RFC 4862), from a router
//! that is nobody's default router. A host's kernel forms its own address in the prefix
//! from it; the switch learns that address from the host's duplicate address probe and
//! the agent claims it.

use std::net::Ipv6Addr;

use ipnet::Ipv6Net;

use crate::ndp::{discovery_message, emit_message, link_local_of, link_option, ETHERTYPE_IPV6};
use crate::wire::{Mac, ETH_HEADER_LEN, IPV6_HEADER_LEN};

const NEXT_HEADER_ICMPV6: u8 = 58;
const TYPE_ROUTER_SOLICITATION: u8 = 133;
const TYPE_ROUTER_ADVERTISEMENT: u8 = 134;
const OPTION_SOURCE_LINK: u8 = 1;
const OPTION_PREFIX: u8 = 3;
const OPTION_RDNSS: u8 = 25;
/// Prefix information flags: on link, autonomous address configuration.
const PREFIX_ON_LINK: u8 = 0x80;
const PREFIX_AUTONOMOUS: u8 = 0x40;
/// Router advertisement flag: addresses are available from DHCPv6.
const FLAG_MANAGED: u8 = 0x80;
/// Header, source link-layer option, prefix information option.
const BASE_LEN: usize = 16 + 8 + 32;
const RDNSS_LEN: usize = 24;

/// The longest frame [`emit_advertisement`] writes.
pub const ADVERTISEMENT_MAX_LEN: usize = ETH_HEADER_LEN + IPV6_HEADER_LEN + BASE_LEN + RDNSS_LEN;

/// How long a host keeps the prefix on link, and an address formed in it, after the last
/// advertisement (seconds): well past the interval between two, short enough that a
/// router gone for good stops vouching for the prefix within the hour.
pub const VALID_LIFETIME: u32 = 3600;
/// How long a host prefers an address formed in the prefix for new connections (seconds).
pub const PREFERRED_LIFETIME: u32 = 1800;

/// What an advertisement says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advertised {
    /// The namespace prefix: on link; hosts form addresses in it if it is a /64.
    pub prefix: Ipv6Net,
    /// The recursive DNS server (RFC 8106), if one answers over IPv6.
    pub dns: Option<Ipv6Addr>,
    /// Addresses are available from DHCPv6 too (the M flag; SLAAC stays on).
    pub managed: bool,
}

/// Writes a router advertisement from `mac` (and its link-local address) to `to` (an
/// address and MAC; all nodes when `None`) into `buf`; returns its length. The router
/// lifetime is 0: the hosts keep their default router, only the prefix is on link
/// (reached through the switch's neighbour discovery proxy).
pub fn emit_advertisement(
    buf: &mut [u8],
    mac: Mac,
    to: Option<(Ipv6Addr, Mac)>,
    advertised: &Advertised,
) -> Option<usize> {
    let all_nodes = (
        Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
        [0x33, 0x33, 0, 0, 0, 1],
    );
    let (dst, dst_mac) = to.unwrap_or(all_nodes);
    let len = BASE_LEN
        + if advertised.dns.is_some() {
            RDNSS_LEN
        } else {
            0
        };
    let prefix = advertised.prefix;
    let src = (link_local_of(mac), dst);
    emit_message(buf, (mac, dst_mac), src, len, |icmp| {
        icmp[0] = TYPE_ROUTER_ADVERTISEMENT;
        // Current hop limit, router lifetime, reachable time and retransmission timer: all
        // 0, "unspecified" (the hosts keep theirs).
        if advertised.managed {
            icmp[5] = FLAG_MANAGED;
        }
        let options = &mut icmp[16..];
        options[0] = OPTION_SOURCE_LINK;
        options[1] = 1;
        options[2..8].copy_from_slice(&mac);
        let info = &mut options[8..40];
        info[0] = OPTION_PREFIX;
        info[1] = 4;
        info[2] = prefix.prefix_len();
        info[3] = PREFIX_ON_LINK
            | if prefix.prefix_len() == 64 {
                PREFIX_AUTONOMOUS
            } else {
                0
            };
        info[4..8].copy_from_slice(&VALID_LIFETIME.to_be_bytes());
        info[8..12].copy_from_slice(&PREFERRED_LIFETIME.to_be_bytes());
        info[16..32].copy_from_slice(&prefix.network().octets());
        if let Some(dns) = advertised.dns {
            let rdnss = &mut options[40..64];
            rdnss[0] = OPTION_RDNSS;
            rdnss[1] = 3;
            rdnss[4..8].copy_from_slice(&VALID_LIFETIME.to_be_bytes());
            rdnss[8..24].copy_from_slice(&dns.octets());
        }
    })
}

/// A router solicitation a host sent, checked as a router checks one (RFC 4861 6.1.1):
/// its source address (`::` before the host has one) and its link-layer address option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Solicitation {
    /// The IPv6 source.
    pub source: Ipv6Addr,
    /// The source link-layer address option, if any.
    pub link: Option<Mac>,
}

/// Reads `frame` as a router solicitation; `None` if it is not one, or not a valid one.
pub fn parse_solicitation(frame: &[u8]) -> Option<Solicitation> {
    let (ip, icmp) = discovery_message(frame, 8)?;
    if icmp[0] != TYPE_ROUTER_SOLICITATION {
        return None;
    }
    let source = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).ok()?);
    let link = link_option(&icmp[8..], OPTION_SOURCE_LINK)?;
    // An unspecified source carries no link-layer address (6.1.1).
    if source.is_unspecified() && link.is_some() {
        return None;
    }
    Some(Solicitation { source, link })
}

/// Whether `frame` is a router advertisement (another router's, on the LAN).
pub fn is_advertisement(frame: &[u8]) -> bool {
    frame.get(12..14) == Some(&ETHERTYPE_IPV6.to_be_bytes()[..])
        && frame.get(ETH_HEADER_LEN + 6) == Some(&NEXT_HEADER_ICMPV6)
        && frame.get(ETH_HEADER_LEN + IPV6_HEADER_LEN) == Some(&TYPE_ROUTER_ADVERTISEMENT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ndp::pseudo_sum;

    const MAC: Mac = [0xfe, 0xfd, 1, 2, 3, 4];
    const HOST: Mac = [0x02, 0, 0, 0, 0, 9];

    fn prefix() -> Ipv6Net {
        "fd12:3456:789a:1::/64".parse().unwrap()
    }

    #[test]
    fn an_advertisement_carries_the_prefix_on_link_and_autonomous_with_a_valid_checksum() {
        let mut buf = [0u8; ADVERTISEMENT_MAX_LEN];
        let dns = "fd12:3456:789a:1::1".parse().unwrap();
        let advertised = Advertised {
            prefix: prefix(),
            dns: Some(dns),
            managed: true,
        };
        let len = emit_advertisement(&mut buf, MAC, None, &advertised).unwrap();
        assert_eq!(len, ADVERTISEMENT_MAX_LEN);
        let frame = &buf[..len];
        assert_eq!(&frame[..6], &[0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(&frame[6..12], &MAC);
        let ip = &frame[ETH_HEADER_LEN..];
        assert_eq!(ip[7], 255, "hop limit");
        assert_eq!(&ip[8..24], &link_local_of(MAC).octets());
        assert_eq!(
            link_local_of(MAC),
            "fe80::fcfd:1ff:fe02:304".parse::<Ipv6Addr>().unwrap()
        );
        let icmp = &ip[IPV6_HEADER_LEN..];
        assert_eq!(pseudo_sum(&ip[8..40], icmp), 0xffff, "checksum");
        assert_eq!(icmp[0], TYPE_ROUTER_ADVERTISEMENT);
        assert_eq!(
            &icmp[6..8],
            &[0, 0],
            "router lifetime 0: nobody's default router"
        );
        let info = &icmp[24..56];
        assert_eq!((info[0], info[1], info[2]), (OPTION_PREFIX, 4, 64));
        assert_eq!(info[3], PREFIX_ON_LINK | PREFIX_AUTONOMOUS);
        assert_eq!(&info[16..32], &prefix().network().octets());
        let rdnss = &icmp[56..80];
        assert_eq!((rdnss[0], rdnss[1]), (OPTION_RDNSS, 3));
        assert_eq!(&rdnss[8..24], &dns.octets());
    }

    #[test]
    fn a_prefix_that_is_not_a_64_is_on_link_only_and_no_dns_means_no_option() {
        let mut buf = [0u8; ADVERTISEMENT_MAX_LEN];
        let advertised = Advertised {
            prefix: "fd00:1::/112".parse().unwrap(),
            dns: None,
            managed: false,
        };
        let to = ("fe80::9".parse().unwrap(), HOST);
        let len = emit_advertisement(&mut buf, MAC, Some(to), &advertised).unwrap();
        assert_eq!(len, ETH_HEADER_LEN + IPV6_HEADER_LEN + BASE_LEN);
        assert_eq!(&buf[..6], &HOST);
        let icmp = &buf[ETH_HEADER_LEN + IPV6_HEADER_LEN..len];
        assert_eq!(icmp[24 + 3], PREFIX_ON_LINK);
        assert_eq!(icmp[5], 0, "not managed");
        assert!(emit_advertisement(&mut buf[..len - 1], MAC, Some(to), &advertised).is_none());
        assert!(is_advertisement(&buf[..len]));
        assert!(parse_solicitation(&buf[..len]).is_none());
    }

    /// A router solicitation as Linux sends one: from its link-local address with its MAC
    /// (or from `::` with none), to all routers.
    fn solicitation(source: Ipv6Addr, link: Option<Mac>) -> Vec<u8> {
        let mut buf = [0u8; 128];
        let all_routers = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);
        let len = 8 + if link.is_some() { 8 } else { 0 };
        let n = emit_message(
            &mut buf,
            (HOST, [0x33, 0x33, 0, 0, 0, 2]),
            (source, all_routers),
            len,
            |icmp| {
                icmp[0] = TYPE_ROUTER_SOLICITATION;
                if let Some(mac) = link {
                    icmp[8] = OPTION_SOURCE_LINK;
                    icmp[9] = 1;
                    icmp[10..16].copy_from_slice(&mac);
                }
            },
        )
        .unwrap();
        buf[..n].to_vec()
    }

    #[test]
    fn router_solicitations_are_read_and_bad_ones_refused() {
        let ll = link_local_of(HOST);
        let rs = solicitation(ll, Some(HOST));
        assert_eq!(
            parse_solicitation(&rs),
            Some(Solicitation {
                source: ll,
                link: Some(HOST)
            })
        );
        let anonymous = solicitation(Ipv6Addr::UNSPECIFIED, None);
        assert_eq!(parse_solicitation(&anonymous).unwrap().link, None);
        // `::` with a link-layer option, a bad checksum, a hop limit a router forwarded,
        // a truncated frame: all refused.
        assert!(parse_solicitation(&solicitation(Ipv6Addr::UNSPECIFIED, Some(HOST))).is_none());
        let mut bad = rs.clone();
        bad[ETH_HEADER_LEN + IPV6_HEADER_LEN + 2] ^= 1;
        assert!(parse_solicitation(&bad).is_none());
        let mut hopped = rs.clone();
        hopped[ETH_HEADER_LEN + 7] = 254;
        assert!(parse_solicitation(&hopped).is_none());
        assert!(parse_solicitation(&rs[..rs.len() - 1]).is_none());
        assert!(!is_advertisement(&rs));
    }
}
