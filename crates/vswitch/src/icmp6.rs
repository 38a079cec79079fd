//! ICMPv6 errors the switch writes to the host about its own IPv6 packets (RFC 4443):
//! "packet too big" for a packet larger than the tunnel (IPv6 routers never fragment).

use std::net::Ipv6Addr;

use crate::ndp::{pseudo_sum, ETHERTYPE_IPV6};
use crate::wire::{Mac, ETH_HEADER_LEN, IPV6_HEADER_LEN};

/// IPv6 next header of ICMPv6.
pub const NEXT_HEADER_ICMPV6: u8 = 58;
/// IPv6 next header of TCP.
pub const NEXT_HEADER_TCP: u8 = 6;
/// TCP and IPv6 fixed headers: what the MSS leaves of the MTU.
pub const TCP_IPV6_HEADERS: u16 = 60;
/// Every IPv6 link carries this much (RFC 8200 5); an ICMPv6 error never exceeds it.
pub const IPV6_MIN_MTU: u16 = 1280;

const TYPE_PACKET_TOO_BIG: u8 = 2;
const HOP_LIMIT: u8 = 64;

/// Writes an Ethernet frame carrying ICMPv6 "packet too big" with `mtu` about the IPv6
/// `packet`, from `src` to its source, into `buf`; returns its length. As much of the
/// packet is quoted as fits `buf` and the minimum MTU. `None` if the packet is not one to
/// answer (see [`answerable`]) or `buf` has no room for the headers.
pub fn emit_packet_too_big(
    buf: &mut [u8],
    macs: (Mac, Mac),
    src: Ipv6Addr,
    mtu: u16,
    packet: &[u8],
) -> Option<usize> {
    let rest = u32::from(mtu).to_be_bytes();
    emit_error(buf, macs, src, (TYPE_PACKET_TOO_BIG, 0, rest), packet)
}

/// Whether an error may answer `packet`: a whole IPv6 header from a unicast, non-link
/// source that is not `::`, and not an ICMPv6 error itself (RFC 4443 2.4 (e)).
fn answerable(packet: &[u8]) -> Option<Ipv6Addr> {
    let header = packet.get(..IPV6_HEADER_LEN).filter(|h| h[0] >> 4 == 6)?;
    let source = Ipv6Addr::from(<[u8; 16]>::try_from(&header[8..24]).ok()?);
    if source.is_unspecified() || source.is_multicast() || source.is_loopback() {
        return None;
    }
    let error =
        header[6] == NEXT_HEADER_ICMPV6 && packet.get(IPV6_HEADER_LEN).is_some_and(|t| *t < 128);
    (!error).then_some(source)
}

fn emit_error(
    buf: &mut [u8],
    (dst_mac, src_mac): (Mac, Mac),
    src: Ipv6Addr,
    (kind, code, rest): (u8, u8, [u8; 4]),
    packet: &[u8],
) -> Option<usize> {
    let dst = answerable(packet)?;
    let room = buf
        .len()
        .checked_sub(ETH_HEADER_LEN + IPV6_HEADER_LEN + 8)?;
    let limit = usize::from(IPV6_MIN_MTU) - IPV6_HEADER_LEN - 8;
    let quoted = packet.len().min(room).min(limit);
    let icmp_len = 8 + quoted;
    let frame = buf.get_mut(..ETH_HEADER_LEN + IPV6_HEADER_LEN + icmp_len)?;
    frame[..6].copy_from_slice(&dst_mac);
    frame[6..12].copy_from_slice(&src_mac);
    frame[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
    let (header, icmp) = frame[ETH_HEADER_LEN..].split_at_mut(IPV6_HEADER_LEN);
    header[..4].copy_from_slice(&[0x60, 0, 0, 0]);
    header[4..6].copy_from_slice(&(icmp_len as u16).to_be_bytes());
    header[6] = NEXT_HEADER_ICMPV6;
    header[7] = HOP_LIMIT;
    header[8..24].copy_from_slice(&src.octets());
    header[24..40].copy_from_slice(&dst.octets());
    icmp[0] = kind;
    icmp[1] = code;
    icmp[2..4].copy_from_slice(&[0, 0]);
    icmp[4..8].copy_from_slice(&rest);
    icmp[8..].copy_from_slice(&packet[..quoted]);
    let sum = !pseudo_sum(&header[8..40], icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    Some(ETH_HEADER_LEN + IPV6_HEADER_LEN + icmp_len)
}
