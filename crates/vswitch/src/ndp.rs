//! IPv6 neighbour discovery over Ethernet (RFC 4861): the solicitations and advertisements a
//! switch reads, checked as a host checks them (section 7.1), and the solicited
//! advertisement it answers with. Untagged frames only; no extension headers (a neighbour
//! discovery message carries none).

use std::net::Ipv6Addr;

use crate::udp::checksum;
use crate::wire::{Mac, ETH_HEADER_LEN};

/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;

const IPV6_HEADER_LEN: usize = 40;
const NEXT_HEADER_ICMPV6: u8 = 58;
/// Neighbour discovery messages travel one link only: sent with hop limit 255, and one
/// that arrives with less came from elsewhere (RFC 4861 7.1.1).
const HOP_LIMIT: u8 = 255;
const TYPE_SOLICITATION: u8 = 135;
const TYPE_ADVERTISEMENT: u8 = 136;
/// ICMPv6 type, code, checksum, 4 bytes of flags or reserved, the 16-byte target.
const MESSAGE_LEN: usize = 24;
const OPTION_SOURCE_LINK: u8 = 1;
const OPTION_TARGET_LINK: u8 = 2;
const FLAG_ROUTER: u8 = 0x80;
const FLAG_SOLICITED: u8 = 0x40;
const FLAG_OVERRIDE: u8 = 0x20;

/// Bytes of the advertisement [`emit_advertisement`] writes: Ethernet, IPv6, the message
/// and its target link-layer address option. A solicitation from [`emit_solicitation`] is
/// as long.
pub const ADVERTISEMENT_FRAME_LEN: usize = ETH_HEADER_LEN + IPV6_HEADER_LEN + MESSAGE_LEN + 8;

/// A neighbour discovery message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// Who has `target`? With the asker's link-layer address, unless it is a duplicate
    /// address probe (source `::`, which carries none).
    Solicitation { target: Ipv6Addr, link: Option<Mac> },
    /// `target` is at `link` (absent: at the frame's source), with the R and O flags in
    /// `flags`.
    Advertisement {
        target: Ipv6Addr,
        link: Option<Mac>,
        flags: NaFlags,
        solicited: bool,
    },
}

/// What an advertisement says of its sender besides where it is: R (a router) and O (it
/// overrides a cached address; clear for anycast and proxies, RFC 4861 7.2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NaFlags {
    pub router: bool,
    pub override_cache: bool,
}

/// A neighbour discovery message and the IPv6 addresses it travelled between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neighbour {
    pub source: Ipv6Addr,
    pub destination: Ipv6Addr,
    pub message: Message,
}

/// The neighbour discovery message `frame` carries, if it is a valid one.
pub fn parse(frame: &[u8]) -> Option<Neighbour> {
    let (ip, icmp) = discovery_message(frame, MESSAGE_LEN)?;
    let address = |at: usize| -> Ipv6Addr {
        let mut b = [0u8; 16];
        b.copy_from_slice(&ip[at..at + 16]);
        Ipv6Addr::from(b)
    };
    let (source, destination) = (address(8), address(24));
    let mut target = [0u8; 16];
    target.copy_from_slice(&icmp[8..24]);
    let target = Ipv6Addr::from(target);
    if target.is_multicast() {
        return None;
    }
    let wanted = match icmp[0] {
        TYPE_SOLICITATION => OPTION_SOURCE_LINK,
        TYPE_ADVERTISEMENT => OPTION_TARGET_LINK,
        _ => return None,
    };
    let link = link_option(&icmp[MESSAGE_LEN..], wanted)?;
    let message = match icmp[0] {
        TYPE_SOLICITATION => {
            // A probe's source is `::`: it is sent to a solicited-node group and carries
            // no link-layer address (7.1.1).
            if source.is_unspecified() && (link.is_some() || !destination.is_multicast()) {
                return None;
            }
            Message::Solicitation { target, link }
        }
        _ => {
            let solicited = icmp[4] & FLAG_SOLICITED != 0;
            if solicited && destination.is_multicast() {
                return None;
            }
            Message::Advertisement {
                target,
                link,
                flags: NaFlags {
                    router: icmp[4] & FLAG_ROUTER != 0,
                    override_cache: icmp[4] & FLAG_OVERRIDE != 0,
                },
                solicited,
            }
        }
    };
    Some(Neighbour {
        source,
        destination,
        message,
    })
}

/// The IPv6 header and the ICMPv6 message `frame` carries, if it is a neighbour discovery
/// message (RFC 4861: solicitations, advertisements, router ones) as a node checks one
/// (7.1.1, 6.1.1): not forwarded (hop limit 255), code 0, its checksum right, at least
/// `least` bytes long.
pub(crate) fn discovery_message(frame: &[u8], least: usize) -> Option<(&[u8], &[u8])> {
    if frame.get(12..14)? != ETHERTYPE_IPV6.to_be_bytes() {
        return None;
    }
    let ip = frame.get(ETH_HEADER_LEN..)?;
    if ip.len() < IPV6_HEADER_LEN || ip[0] >> 4 != 6 {
        return None;
    }
    let length = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    if ip[6] != NEXT_HEADER_ICMPV6 || ip[7] != HOP_LIMIT || length < least.max(4) {
        return None;
    }
    let icmp = ip.get(IPV6_HEADER_LEN..IPV6_HEADER_LEN + length)?;
    if icmp[1] != 0 || pseudo_sum(&ip[8..40], icmp) != 0xffff {
        return None;
    }
    Some((ip, icmp))
}

/// The link-layer address option of type `wanted` among `options` (`Some(None)` if there
/// is none), or `None` if the options are malformed (one of length 0 or past the end).
pub(crate) fn link_option(mut options: &[u8], wanted: u8) -> Option<Option<Mac>> {
    let mut found = None;
    while !options.is_empty() {
        let len = usize::from(*options.get(1)?) * 8;
        if len == 0 || len > options.len() {
            return None;
        }
        if options[0] == wanted && len == 8 {
            found = <Mac>::try_from(&options[2..8]).ok();
        }
        options = &options[len..];
    }
    Some(found)
}

/// The ones'-complement sum of an ICMPv6 message and its pseudo-header (`addresses`: the
/// source and destination, 32 bytes): 0xffff when its checksum is right.
pub(crate) fn pseudo_sum(addresses: &[u8], icmp: &[u8]) -> u16 {
    upper_layer_sum(addresses, NEXT_HEADER_ICMPV6, icmp)
}

/// The ones'-complement sum of an upper-layer message of `next` header over IPv6 and its
/// pseudo-header (RFC 8200 8.1).
pub(crate) fn upper_layer_sum(addresses: &[u8], next: u8, message: &[u8]) -> u16 {
    let mut pseudo = [0u8; 8];
    pseudo[..4].copy_from_slice(&(message.len() as u32).to_be_bytes());
    pseudo[7] = next;
    let sum = checksum(checksum(0, addresses), &pseudo);
    checksum(sum, message)
}

/// The solicited-node multicast group of `target` (RFC 4291 2.7.1) and its Ethernet
/// multicast MAC (RFC 2464 7).
pub fn solicited_node(target: Ipv6Addr) -> (Ipv6Addr, Mac) {
    let t = target.octets();
    let group = Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(t[13]),
        u16::from_be_bytes([t[14], t[15]]),
    );
    (group, [0x33, 0x33, 0xff, t[13], t[14], t[15]])
}

/// Writes a solicitation for `target` from `source` at `mac` to the target's
/// solicited-node group into `buf` (at least [`ADVERTISEMENT_FRAME_LEN`] bytes), as a host
/// resolving it sends one. Returns its length, or `None` if `buf` is shorter.
pub fn emit_solicitation(
    buf: &mut [u8],
    (source, mac): (Ipv6Addr, Mac),
    target: Ipv6Addr,
) -> Option<usize> {
    let (group, group_mac) = solicited_node(target);
    emit(buf, (mac, group_mac), (source, group), |icmp| {
        icmp[0] = TYPE_SOLICITATION;
        icmp[8..24].copy_from_slice(&target.octets());
        icmp[24] = OPTION_SOURCE_LINK;
        icmp[26..32].copy_from_slice(&mac);
    })
}

/// Writes a solicited advertisement into `buf` (at least [`ADVERTISEMENT_FRAME_LEN`]
/// bytes): `target` is at `target_mac`, told from `target` to `to` at `to_mac`, with the
/// R and O flags as the target's own advertisements set them. Returns its length, or
/// `None` if `buf` is shorter.
pub fn emit_advertisement(
    buf: &mut [u8],
    (target, target_mac): (Ipv6Addr, Mac),
    (to, to_mac): (Ipv6Addr, Mac),
    flags: NaFlags,
) -> Option<usize> {
    emit(buf, (target_mac, to_mac), (target, to), |icmp| {
        icmp[0] = TYPE_ADVERTISEMENT;
        icmp[4] = FLAG_SOLICITED
            | if flags.override_cache {
                FLAG_OVERRIDE
            } else {
                0
            }
            | if flags.router { FLAG_ROUTER } else { 0 };
        icmp[8..24].copy_from_slice(&target.octets());
        icmp[24] = OPTION_TARGET_LINK;
        icmp[26..32].copy_from_slice(&target_mac);
    })
}

/// Writes a neighbour discovery frame of [`ADVERTISEMENT_FRAME_LEN`] bytes: the headers,
/// the message `fill` writes into a zeroed ICMPv6 area (one 8-byte option), its checksum.
fn emit(
    buf: &mut [u8],
    macs: (Mac, Mac),
    addresses: (Ipv6Addr, Ipv6Addr),
    fill: impl FnOnce(&mut [u8]),
) -> Option<usize> {
    emit_message(buf, macs, addresses, MESSAGE_LEN + 8, |icmp| {
        fill(icmp);
        icmp[25] = 1;
    })
}

/// Writes a neighbour discovery message of `len` bytes (filled by `fill`, on zeros) in an
/// IPv6 header with hop limit 255 and an Ethernet header, and its checksum.
pub(crate) fn emit_message(
    buf: &mut [u8],
    (src_mac, dst_mac): (Mac, Mac),
    (src, dst): (Ipv6Addr, Ipv6Addr),
    len: usize,
    fill: impl FnOnce(&mut [u8]),
) -> Option<usize> {
    let total = ETH_HEADER_LEN + IPV6_HEADER_LEN + len;
    let frame = buf.get_mut(..total)?;
    frame[..6].copy_from_slice(&dst_mac);
    frame[6..12].copy_from_slice(&src_mac);
    frame[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
    let (header, icmp) = frame[ETH_HEADER_LEN..].split_at_mut(IPV6_HEADER_LEN);
    header[..4].copy_from_slice(&[0x60, 0, 0, 0]);
    header[4..6].copy_from_slice(&u16::try_from(len).ok()?.to_be_bytes());
    header[6] = NEXT_HEADER_ICMPV6;
    header[7] = HOP_LIMIT;
    header[8..24].copy_from_slice(&src.octets());
    header[24..40].copy_from_slice(&dst.octets());
    icmp.fill(0);
    fill(icmp);
    let sum = !pseudo_sum(&header[8..40], icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    Some(total)
}

/// Writes the advertisement that defends `target` at `mac` against a duplicate address
/// probe (RFC 4862 5.4.3): unsolicited, overriding, to all nodes (the prober has no
/// address to be answered at yet). [`ADVERTISEMENT_FRAME_LEN`] bytes.
pub fn emit_defence(buf: &mut [u8], (target, mac): (Ipv6Addr, Mac)) -> Option<usize> {
    let all_nodes = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    let group_mac = [0x33, 0x33, 0, 0, 0, 1];
    emit(buf, (mac, group_mac), (target, all_nodes), |icmp| {
        icmp[0] = TYPE_ADVERTISEMENT;
        icmp[4] = FLAG_OVERRIDE;
        icmp[8..24].copy_from_slice(&target.octets());
        icmp[24] = OPTION_TARGET_LINK;
        icmp[26..32].copy_from_slice(&mac);
    })
}

/// The link-local address a host with `mac` forms (modified EUI-64, RFC 4291 appendix A).
pub fn link_local_of(mac: Mac) -> Ipv6Addr {
    let id = [
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ];
    let mut octets = [0u8; 16];
    octets[0] = 0xfe;
    octets[1] = 0x80;
    octets[8..].copy_from_slice(&id);
    Ipv6Addr::from(octets)
}

#[cfg(test)]
mod tests;
