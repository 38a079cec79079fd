//! Fitting full-size LAN packets into the tunnel: TCP MSS clamping, ICMP "fragmentation
//! needed", and IPv4 fragmentation.
//!
//! A router's or hybrid host's bridge carries the LAN's MTU (1500 on Ethernet), the tunnel
//! less (the namespace MTU, 1420 by default). A packet from the LAN that does not fit is
//! handled as a router on the path would: a TCP SYN's MSS option is lowered so the
//! connection never sends a segment too large (RFC 879, RFC 6691); a larger packet with
//! "don't fragment" set is answered with ICMP destination unreachable, fragmentation needed,
//! carrying the next-hop MTU (RFC 1191); any other is split into fragments (RFC 791).
//!
//! No-panic contract: every function here takes raw bytes, checks every length it reads
//! against the buffer first, and reports bytes it cannot handle with `None` or `false`.

use std::net::Ipv4Addr;

use crate::wire::{
    emit_ethernet_header, ipv4_header_checksum, Mac, ETHERTYPE_IPV4, ETH_HEADER_LEN,
    IPV4_MIN_HEADER_LEN,
};

/// IP protocol number of ICMP.
pub const IPPROTO_ICMP: u8 = 1;
/// IP protocol number of TCP.
pub const IPPROTO_TCP: u8 = 6;

/// IPv4 flags: don't fragment.
pub const IPV4_DF: u16 = 0x4000;
/// IPv4 flags: more fragments.
pub const IPV4_MF: u16 = 0x2000;
/// IPv4 fragment offset mask (in 8-byte units).
const IPV4_OFFSET: u16 = 0x1fff;

/// IPv4 header plus TCP header, both without options: what an MTU holds beyond the MSS
/// (RFC 6691: the MSS counts neither header's options).
pub const TCP_IPV4_HEADERS: u16 = 40;

/// ICMP header of a destination unreachable message: type, code, checksum, unused, MTU.
const ICMP_HEADER_LEN: usize = 8;
/// ICMP type "destination unreachable".
const ICMP_UNREACHABLE: u8 = 3;
/// ICMP code "fragmentation needed and DF set".
const ICMP_FRAG_NEEDED: u8 = 4;
/// The largest IPv4 header (IHL 15).
const IPV4_MAX_HEADER_LEN: usize = 60;
/// How much of the offending packet an ICMP error quotes beyond its header (RFC 792).
const QUOTED_PAYLOAD: usize = 8;

/// ICMP code "host unreachable".
const ICMP_HOST_UNREACHABLE: u8 = 1;
/// ICMP "time exceeded" (code 0: TTL exceeded in transit).
const ICMP_TIME_EXCEEDED: u8 = 11;

/// The longest frame [`emit_frag_needed`] writes: Ethernet, IPv4, ICMP, and the quoted
/// header (options included) plus 8 bytes.
pub const FRAG_NEEDED_MAX_LEN: usize =
    ETH_HEADER_LEN + IPV4_MIN_HEADER_LEN + ICMP_HEADER_LEN + IPV4_MAX_HEADER_LEN + QUOTED_PAYLOAD;

/// The smallest MTU an IPv4 link may have (RFC 791: 68 octets).
pub const IPV4_MIN_MTU: u16 = 68;

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The IPv4 header length of `packet`, if it is IPv4 and the header fits.
fn header_len(packet: &[u8]) -> Option<usize> {
    let first = *packet.first()?;
    let len = usize::from(first & 0x0f) * 4;
    (first >> 4 == 4 && len >= IPV4_MIN_HEADER_LEN && len <= packet.len()).then_some(len)
}

/// The flags and fragment offset word of an IPv4 header.
pub fn ipv4_flags(packet: &[u8]) -> u16 {
    if packet.len() < IPV4_MIN_HEADER_LEN {
        return 0;
    }
    be16(packet, 6)
}

/// RFC 1624 eqn. 3: the checksum `sum` after a 16-bit word of the summed data changed from
/// `old` to `new`: HC' = ~(~HC + ~m + m').
fn checksum_update(sum: u16, old: u16, new: u16) -> u16 {
    let mut acc = u32::from(!sum) + u32::from(!old) + u32::from(new);
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// Whether the IPv4 `packet` needs fitting for `mtu`: larger than it, or possibly a TCP SYN
/// whose MSS to clamp. The common packet costs a few comparisons.
#[inline]
pub fn needs_fitting(packet: &[u8], mtu: u16) -> bool {
    const SYN: u8 = 0x02;
    if packet.len() > usize::from(mtu) {
        return true;
    }
    if packet.get(9) != Some(&IPPROTO_TCP) {
        return false;
    }
    let ihl = usize::from(packet[0] & 0x0f) * 4;
    packet.get(ihl + 13).is_some_and(|flags| flags & SYN != 0)
}

/// Lowers the MSS option of a TCP SYN in the IPv4 `packet` to `mss` if it is larger, fixing
/// the TCP checksum incrementally (RFC 1624). Returns whether the packet changed. Anything
/// else (not TCP, not a SYN, a later fragment, malformed options, no MSS option) is left
/// as it is.
pub fn clamp_mss(packet: &mut [u8], mss: u16) -> bool {
    let Some(ihl) = header_len(packet) else {
        return false;
    };
    if packet[9] != IPPROTO_TCP || be16(packet, 6) & IPV4_OFFSET != 0 {
        return false;
    }
    let end = usize::from(be16(packet, 2)).min(packet.len());
    let Some(tcp) = packet.get_mut(ihl..end) else {
        return false;
    };
    clamp_tcp_mss(tcp, mss)
}

/// [`clamp_mss`] for a TCP SYN in the IPv6 `packet`, TCP directly behind the fixed header
/// (a SYN carries no extension header in practice; one that does is left as it is).
pub fn clamp_mss6(packet: &mut [u8], mss: u16) -> bool {
    if packet.len() < 40 || packet[0] >> 4 != 6 || packet[6] != IPPROTO_TCP {
        return false;
    }
    let end = (40 + usize::from(be16(packet, 4))).min(packet.len());
    let Some(tcp) = packet.get_mut(40..end) else {
        return false;
    };
    clamp_tcp_mss(tcp, mss)
}

/// Lowers the MSS option of the TCP SYN segment `tcp` to `mss`; see [`clamp_mss`].
fn clamp_tcp_mss(tcp: &mut [u8], mss: u16) -> bool {
    const SYN: u8 = 0x02;
    if tcp.len() < 20 || tcp[13] & SYN == 0 {
        return false;
    }
    let data_offset = usize::from(tcp[12] >> 4) * 4;
    if data_offset < 20 || data_offset > tcp.len() {
        return false;
    }
    let mut at = 20;
    while at < data_offset {
        match tcp[at] {
            0 => return false,
            1 => at += 1,
            kind => {
                let Some(&len) = tcp.get(at + 1) else {
                    return false;
                };
                let len = usize::from(len);
                if len < 2 || at + len > data_offset {
                    return false;
                }
                if kind == 2 && len == 4 {
                    let old = be16(tcp, at + 2);
                    if old <= mss {
                        return false;
                    }
                    tcp[at + 2..at + 4].copy_from_slice(&mss.to_be_bytes());
                    // The checksum sums 16-bit words from the start of the TCP header (the
                    // pseudo-header is 12 bytes, so alignment is the header's). A value at
                    // an odd offset straddles two words: its bytes count swapped.
                    let (old, new) = if at % 2 == 0 {
                        (old, mss)
                    } else {
                        (old.swap_bytes(), mss.swap_bytes())
                    };
                    let sum = checksum_update(be16(tcp, 16), old, new);
                    tcp[16..18].copy_from_slice(&sum.to_be_bytes());
                    return true;
                }
                at += len;
            }
        }
    }
    false
}

/// Whether the IPv4 `packet` is an ICMP error message, which never gets an ICMP error in
/// answer (RFC 1122 3.2.2).
fn is_icmp_error(packet: &[u8], ihl: usize) -> bool {
    packet[9] == IPPROTO_ICMP
        && packet
            .get(ihl)
            .is_some_and(|t| matches!(t, 3 | 4 | 5 | 11 | 12))
}

/// Writes an Ethernet frame carrying ICMP "fragmentation needed and DF set" with next-hop
/// MTU `mtu` (RFC 1191) about the IPv4 `packet`, from `src` to the packet's source, into
/// `buf`; returns its length. `None` if the packet is malformed, is an ICMP error itself,
/// comes from an address that cannot take an answer, or `buf` is shorter than needed
/// ([`FRAG_NEEDED_MAX_LEN`] always suffices).
pub fn emit_frag_needed(
    buf: &mut [u8],
    macs: (Mac, Mac),
    src: Ipv4Addr,
    mtu: u16,
    packet: &[u8],
) -> Option<usize> {
    let [hi, lo] = mtu.to_be_bytes();
    let kind = (ICMP_UNREACHABLE, ICMP_FRAG_NEEDED, [0, 0, hi, lo]);
    emit_icmp_error(buf, macs, src, kind, packet)
}

/// Writes an Ethernet frame carrying ICMP "time exceeded in transit" (RFC 792) about the
/// IPv4 `packet`, from the router address `src` to the packet's source, into `buf`; returns
/// its length. `None` as for [`emit_frag_needed`].
pub fn emit_time_exceeded(
    buf: &mut [u8],
    macs: (Mac, Mac),
    src: Ipv4Addr,
    packet: &[u8],
) -> Option<usize> {
    emit_icmp_error(buf, macs, src, (ICMP_TIME_EXCEEDED, 0, [0; 4]), packet)
}

/// Writes an Ethernet frame carrying ICMP "host unreachable" (RFC 792) about the IPv4
/// `packet`, from the router address `src` to the packet's source, into `buf`; returns its
/// length. `None` as for [`emit_frag_needed`].
pub fn emit_host_unreachable(
    buf: &mut [u8],
    macs: (Mac, Mac),
    src: Ipv4Addr,
    packet: &[u8],
) -> Option<usize> {
    emit_icmp_error(
        buf,
        macs,
        src,
        (ICMP_UNREACHABLE, ICMP_HOST_UNREACHABLE, [0; 4]),
        packet,
    )
}

/// Writes an ICMP error of `(type, code, rest of header)` about `packet` (its header and
/// first 8 payload bytes quoted) from `src` to the packet's source: see
/// [`emit_frag_needed`].
fn emit_icmp_error(
    buf: &mut [u8],
    (dst_mac, src_mac): (Mac, Mac),
    src: Ipv4Addr,
    (icmp_type, code, rest): (u8, u8, [u8; 4]),
    packet: &[u8],
) -> Option<usize> {
    let ihl = header_len(packet)?;
    let dst = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
    if is_icmp_error(packet, ihl)
        || dst.is_unspecified()
        || dst.is_broadcast()
        || dst.is_multicast()
        || dst_mac[0] & 1 != 0
    {
        return None;
    }
    let total = usize::from(be16(packet, 2)).min(packet.len());
    let quote = &packet[..total.min(ihl + QUOTED_PAYLOAD).max(ihl)];
    let icmp_len = ICMP_HEADER_LEN + quote.len();
    let ip_len = IPV4_MIN_HEADER_LEN + icmp_len;
    let frame_len = ETH_HEADER_LEN + ip_len;
    let frame = buf.get_mut(..frame_len)?;
    emit_ethernet_header(frame, dst_mac, src_mac, ETHERTYPE_IPV4);
    let ip = &mut frame[ETH_HEADER_LEN..];
    ip[..IPV4_MIN_HEADER_LEN].copy_from_slice(&[
        0x45,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        64,
        IPPROTO_ICMP,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    ]);
    ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let sum = ipv4_header_checksum(&ip[..IPV4_MIN_HEADER_LEN]);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let icmp = &mut ip[IPV4_MIN_HEADER_LEN..];
    icmp[..4].copy_from_slice(&[icmp_type, code, 0, 0]);
    icmp[4..ICMP_HEADER_LEN].copy_from_slice(&rest);
    icmp[ICMP_HEADER_LEN..].copy_from_slice(quote);
    let sum = ipv4_header_checksum(icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    Some(frame_len)
}

/// The fragments of one IPv4 packet that does not fit `mtu`, written one at a time into a
/// caller's buffer (RFC 791 3.2): every fragment but the last carries a multiple of 8 data
/// bytes; the first keeps all options, later ones only those with the "copied" flag; a
/// fragment of a fragment keeps its place in the original and the original's MF on its
/// last piece.
#[derive(Debug)]
pub struct Fragments<'a> {
    packet: &'a [u8],
    header_len: usize,
    /// The header of every fragment after the first: the fixed part plus copied options.
    later_header: [u8; IPV4_MAX_HEADER_LEN],
    later_header_len: usize,
    /// Payload bytes already sent.
    done: usize,
    mtu: usize,
}

impl<'a> Fragments<'a> {
    /// Prepares to fragment the IPv4 `packet` (its bytes up to the header's total length)
    /// for `mtu`. `None` if it is malformed (header, length or options), has DF set, or the
    /// MTU cannot carry its header and 8 bytes of data.
    pub fn new(packet: &'a [u8], mtu: u16) -> Option<Self> {
        let header_len = header_len(packet)?;
        let total = usize::from(be16(packet, 2));
        if total < header_len || total > packet.len() || be16(packet, 6) & IPV4_DF != 0 {
            return None;
        }
        let mut later_header = [0u8; IPV4_MAX_HEADER_LEN];
        later_header[..IPV4_MIN_HEADER_LEN].copy_from_slice(&packet[..IPV4_MIN_HEADER_LEN]);
        let mut len = IPV4_MIN_HEADER_LEN;
        let options = &packet[IPV4_MIN_HEADER_LEN..header_len];
        let mut at = 0;
        while at < options.len() {
            match options[at] {
                0 => break,
                1 => at += 1,
                kind => {
                    let opt_len = usize::from(*options.get(at + 1)?);
                    if opt_len < 2 || at + opt_len > options.len() {
                        return None;
                    }
                    // The high bit of the type: copy the option into every fragment.
                    if kind & 0x80 != 0 {
                        later_header[len..len + opt_len]
                            .copy_from_slice(&options[at..at + opt_len]);
                        len += opt_len;
                    }
                    at += opt_len;
                }
            }
        }
        // Padded to a multiple of 4 with end-of-options (zero) bytes.
        let later_header_len = len.div_ceil(4) * 4;
        let mtu = usize::from(mtu);
        if mtu < header_len + 8 {
            return None;
        }
        Some(Self {
            packet: &packet[..total],
            header_len,
            later_header,
            later_header_len,
            done: 0,
            mtu,
        })
    }

    /// Writes the next fragment into `buf` and returns its length; `None` once all are
    /// written, or if `buf` is shorter than the fragment.
    pub fn next_into(&mut self, buf: &mut [u8]) -> Option<usize> {
        let payload = &self.packet[self.header_len..];
        if self.done >= payload.len() && !(self.done == 0 && payload.is_empty()) {
            return None;
        }
        let header: &[u8] = if self.done == 0 {
            &self.packet[..self.header_len]
        } else {
            &self.later_header[..self.later_header_len]
        };
        let room = self.mtu - header.len();
        let left = payload.len() - self.done;
        let (take, last) = if left <= room {
            (left, true)
        } else {
            (room & !7, false)
        };
        let len = header.len() + take;
        let out = buf.get_mut(..len)?;
        out[..header.len()].copy_from_slice(header);
        out[header.len()..].copy_from_slice(&payload[self.done..self.done + take]);
        let flags = be16(self.packet, 6);
        let offset = (flags & IPV4_OFFSET) + (self.done / 8) as u16;
        let more = if last { flags & IPV4_MF } else { IPV4_MF };
        let word = (flags & !(IPV4_OFFSET | IPV4_MF)) | more | (offset & IPV4_OFFSET);
        out[0] = 0x40 | (header.len() / 4) as u8;
        out[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        out[6..8].copy_from_slice(&word.to_be_bytes());
        out[10..12].copy_from_slice(&[0, 0]);
        let sum = ipv4_header_checksum(&out[..header.len()]);
        out[10..12].copy_from_slice(&sum.to_be_bytes());
        // An empty payload is one fragment; mark it done.
        self.done += take.max(1);
        Some(len)
    }
}

#[cfg(test)]
mod tests;
