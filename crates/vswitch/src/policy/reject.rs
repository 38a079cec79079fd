//! What a policy with `reject = true` answers a denied packet with, so the client fails at
//! once instead of waiting out its timeouts: a TCP reset (RFC 9293, 3.10.7.1) or, for UDP,
//! ICMP port unreachable (RFC 792) quoting the packet's header and 8 bytes. Written as an
//! IP packet of the denied packet's family from its destination back to its source; the
//! caller frames it for the TAP or seals it to the member that sent it.
//!
//! IPv6: the same reset, or ICMPv6 destination unreachable, port unreachable (RFC 4443
//! 3.1) quoting the packet's first [`QUOTE6`] bytes, for a packet whose transport header
//! follows the fixed header (one with extension headers is dropped unanswered).

use crate::udp::checksum;
use crate::wire::ipv4_header_checksum;

/// How much of a denied IPv6 datagram its port unreachable quotes (RFC 4443 asks for as
/// much as fits in the minimum MTU; the ports are in its first 48 bytes).
pub const QUOTE6: usize = 96;

/// The longest answer: an IPv6 ICMP error with its quote (an IPv4 one, with the quoted
/// header's options and 8 bytes, is at most 96).
pub const MAX_ANSWER_LEN: usize = 40 + 8 + QUOTE6;

const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Writes the answer to denied IPv4 packet `ip` into `out`; its length. `None` when there
/// is nothing to answer: not TCP or UDP, a reset, a fragment after the first, malformed,
/// from an address that cannot take an answer, or `out` shorter than [`MAX_ANSWER_LEN`].
pub fn answer(ip: &[u8], out: &mut [u8]) -> Option<usize> {
    if ip.first().is_some_and(|b| b >> 4 == 6) {
        return answer6(ip, out);
    }
    if ip.len() < 20 || ip[0] >> 4 != 4 || be16(ip, 6) & 0x1fff != 0 {
        return None;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(be16(ip, 2)).min(ip.len());
    if ihl < 20 || total < ihl + 8 {
        return None;
    }
    let (src, dst) = (&ip[12..16], &ip[16..20]);
    // Nothing answers for a group or a broadcast (its members would all answer), nor
    // goes to one.
    let group = |a: &[u8]| a == [0, 0, 0, 0] || a == [255, 255, 255, 255] || a[0] >= 224;
    if group(src) || group(dst) {
        return None;
    }
    let out = out.get_mut(..MAX_ANSWER_LEN)?;
    let len = match ip[9] {
        6 => {
            tcp_reset(&ip[ihl..total], &mut out[20..40])?;
            40
        }
        17 => port_unreachable(&ip[..total], ihl, out),
        _ => return None,
    };
    // The IPv4 header: from the denied packet's destination to its source.
    out[..20].fill(0);
    out[..12].copy_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 0, 0, 0]);
    out[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    out[9] = if ip[9] == 6 { 6 } else { 1 };
    out[12..16].copy_from_slice(dst);
    out[16..20].copy_from_slice(src);
    let sum = ipv4_header_checksum(&out[..20]);
    out[10..12].copy_from_slice(&sum.to_be_bytes());
    if ip[9] == 6 {
        // The TCP checksum covers a pseudo-header of the addresses, protocol and length.
        let tcp_len = len - 20;
        let mut pseudo = [0u8; 12];
        pseudo[..4].copy_from_slice(dst);
        pseudo[4..8].copy_from_slice(src);
        pseudo[9] = 6;
        pseudo[10..12].copy_from_slice(&(tcp_len as u16).to_be_bytes());
        let sum = !checksum(checksum(0, &pseudo), &out[20..len]);
        out[36..38].copy_from_slice(&sum.to_be_bytes());
    }
    Some(len)
}

/// Writes the answer to denied IPv6 packet `ip` into `out` (see [`answer`]).
fn answer6(ip: &[u8], out: &mut [u8]) -> Option<usize> {
    if ip.len() < 40 {
        return None;
    }
    let total = (40 + usize::from(be16(ip, 4))).min(ip.len());
    let (src, dst) = (&ip[8..24], &ip[24..40]);
    // Nothing goes to the unspecified address or to a group, nor answers for a group
    // (RFC 4443 2.4 (e)).
    if src.iter().all(|&b| b == 0) || src[0] == 0xff || dst[0] == 0xff {
        return None;
    }
    let out = out.get_mut(..MAX_ANSWER_LEN)?;
    let (next, len, sum_at) = match ip[6] {
        6 => {
            tcp_reset(&ip[40..total], &mut out[40..60])?;
            (6, 60, 40 + 16)
        }
        17 if total >= 48 => {
            let quote = &ip[..total.min(QUOTE6)];
            let len = 48 + quote.len();
            out[40..48].copy_from_slice(&[1, 4, 0, 0, 0, 0, 0, 0]);
            out[48..len].copy_from_slice(quote);
            (58, len, 40 + 2)
        }
        _ => return None,
    };
    out[..8].copy_from_slice(&[0x60, 0, 0, 0, 0, 0, next, 64]);
    out[4..6].copy_from_slice(&((len - 40) as u16).to_be_bytes());
    out[8..24].copy_from_slice(dst);
    out[24..40].copy_from_slice(src);
    // TCP's and ICMPv6's checksums cover a pseudo-header of the addresses, the length
    // and the next header (RFC 8200 8.1).
    let mut pseudo = [0u8; 40];
    pseudo[..32].copy_from_slice(&out[8..40]);
    pseudo[32..36].copy_from_slice(&((len - 40) as u32).to_be_bytes());
    pseudo[39] = next;
    let sum = !checksum(checksum(0, &pseudo), &out[40..len]);
    out[sum_at..sum_at + 2].copy_from_slice(&sum.to_be_bytes());
    Some(len)
}

/// The reset for TCP segment `tcp` (header and payload), written into the 20 bytes `t`.
fn tcp_reset(tcp: &[u8], t: &mut [u8]) -> Option<()> {
    if tcp.len() < 20 {
        return None;
    }
    let flags = tcp[13];
    if flags & TCP_RST != 0 {
        return None;
    }
    let data_offset = usize::from(tcp[12] >> 4) * 4;
    t.fill(0);
    t[0..2].copy_from_slice(&tcp[2..4]);
    t[2..4].copy_from_slice(&tcp[0..2]);
    t[12] = 0x50;
    if flags & TCP_ACK != 0 {
        // <SEQ=SEG.ACK><CTL=RST>
        t[4..8].copy_from_slice(&tcp[8..12]);
        t[13] = TCP_RST;
    } else {
        // <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>
        let payload = tcp.len().saturating_sub(data_offset) as u32;
        let len = payload + u32::from(flags & TCP_SYN != 0) + u32::from(flags & TCP_FIN != 0);
        t[8..12].copy_from_slice(&be32(tcp, 4).wrapping_add(len).to_be_bytes());
        t[13] = TCP_RST | TCP_ACK;
    }
    Some(())
}

/// ICMP port unreachable quoting `ip`'s header and 8 bytes, at `out[20..]`; the IPv4
/// length.
fn port_unreachable(ip: &[u8], ihl: usize, out: &mut [u8]) -> usize {
    let quote = &ip[..ihl + 8];
    let len = 20 + 8 + quote.len();
    let icmp = &mut out[20..len];
    icmp[..8].copy_from_slice(&[3, 3, 0, 0, 0, 0, 0, 0]);
    icmp[8..].copy_from_slice(quote);
    let sum = !checksum(0, icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    len
}
