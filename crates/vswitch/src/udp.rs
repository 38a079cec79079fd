//! Whole UDP frames of the underlay (Ethernet II, IPv4 or IPv6, UDP), for a data path that
//! bypasses the kernel's UDP stack (AF_XDP): [`emit`] writes the headers around a tunnel
//! datagram, [`parse`] finds the sender and the datagram in a received frame.
//!
//! No-panic contract: [`parse`] validates every length it uses before indexing, so any
//! bytes at all give a [`Datagram`] or a [`ParseError`]; [`emit`] checks the buffer's room
//! first and returns an [`EmitError`] otherwise.
//!
//! What [`parse`] accepts is what the project's XDP program redirects (agent
//! `underlay/bpf.rs`): IPv4 without options and not fragmented, IPv6 whose next header is
//! UDP. Anything else stays with the kernel, which hands it to the UDP socket.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::Range;

use crate::wire::{
    emit_ethernet_header, ipv4_header_checksum, Mac, ETHERTYPE_IPV4, ETH_HEADER_LEN, IPPROTO_UDP,
    IPV4_MIN_HEADER_LEN, UDP_HEADER_LEN,
};

/// The IPv6 EtherType.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;

/// The fixed IPv6 header length (no extension headers).
pub const IPV6_HEADER_LEN: usize = 40;

/// Headers around a datagram over IPv4: Ethernet 14 + IPv4 20 (no options) + UDP 8.
pub const IPV4_OVERHEAD: usize = ETH_HEADER_LEN + IPV4_MIN_HEADER_LEN + UDP_HEADER_LEN;

/// Headers around a datagram over IPv6: Ethernet 14 + IPv6 40 + UDP 8.
pub const IPV6_OVERHEAD: usize = ETH_HEADER_LEN + IPV6_HEADER_LEN + UDP_HEADER_LEN;

/// Hop limit of the frames we emit, as the kernel's default (`net.ipv4.ip_default_ttl`).
const HOP_LIMIT: u8 = 64;

/// A UDP datagram found in a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// The sender's address and port.
    pub from: SocketAddr,
    /// The destination address and port.
    pub to: SocketAddr,
    /// Where the UDP payload lies in the frame.
    pub payload: Range<usize>,
}

/// Why a frame holds no datagram we take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// Shorter than its headers, or than the lengths they declare.
    Truncated,
    /// Neither IPv4 nor IPv6.
    NotIp,
    /// IP, but not UDP (or IPv6 with extension headers first).
    NotUdp,
    /// IPv4 with options, or a fragment: the kernel's to reassemble.
    Unsupported,
    /// The IPv4 header checksum does not match.
    BadChecksum,
}

/// Why a frame could not be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmitError {
    /// The buffer cannot hold the headers and the payload.
    TooSmall,
    /// The payload does not fit one IP packet.
    TooLong,
    /// The two addresses are of different families.
    Family,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Finds the UDP datagram in `frame`. The UDP checksum is not verified: a kernel sender
/// over veth leaves it partial (checksum offload), and every tunnel datagram is
/// authenticated by its AEAD tag or signature, which catches what a checksum would.
pub fn parse(frame: &[u8]) -> Result<Datagram, ParseError> {
    if frame.len() < ETH_HEADER_LEN {
        return Err(ParseError::Truncated);
    }
    let ip = &frame[ETH_HEADER_LEN..];
    let (from, to, udp_at) = match be16(frame, 12) {
        ETHERTYPE_IPV4 => {
            if ip.len() < IPV4_MIN_HEADER_LEN {
                return Err(ParseError::Truncated);
            }
            if ip[0] != 0x45 {
                return Err(ParseError::Unsupported);
            }
            if ip[9] != IPPROTO_UDP {
                return Err(ParseError::NotUdp);
            }
            // More fragments, or a fragment offset: not a whole datagram.
            if be16(ip, 6) & 0x3fff != 0 {
                return Err(ParseError::Unsupported);
            }
            let total = usize::from(be16(ip, 2));
            if total < IPV4_MIN_HEADER_LEN || total > ip.len() {
                return Err(ParseError::Truncated);
            }
            if checksum(0, &ip[..IPV4_MIN_HEADER_LEN]) != 0xffff {
                return Err(ParseError::BadChecksum);
            }
            let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
            let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
            (IpAddr::V4(src), IpAddr::V4(dst), IPV4_MIN_HEADER_LEN)
        }
        ETHERTYPE_IPV6 => {
            if ip.len() < IPV6_HEADER_LEN {
                return Err(ParseError::Truncated);
            }
            if ip[0] >> 4 != 6 {
                return Err(ParseError::NotIp);
            }
            if ip[6] != IPPROTO_UDP {
                return Err(ParseError::NotUdp);
            }
            if IPV6_HEADER_LEN + usize::from(be16(ip, 4)) > ip.len() {
                return Err(ParseError::Truncated);
            }
            let mut src = [0u8; 16];
            src.copy_from_slice(&ip[8..24]);
            let mut dst = [0u8; 16];
            dst.copy_from_slice(&ip[24..40]);
            (
                IpAddr::V6(Ipv6Addr::from(src)),
                IpAddr::V6(Ipv6Addr::from(dst)),
                IPV6_HEADER_LEN,
            )
        }
        _ => return Err(ParseError::NotIp),
    };
    let udp = &ip[udp_at..];
    if udp.len() < UDP_HEADER_LEN {
        return Err(ParseError::Truncated);
    }
    let len = usize::from(be16(udp, 4));
    if len < UDP_HEADER_LEN || len > udp.len() {
        return Err(ParseError::Truncated);
    }
    let start = ETH_HEADER_LEN + udp_at + UDP_HEADER_LEN;
    Ok(Datagram {
        from: SocketAddr::new(from, be16(udp, 0)),
        to: SocketAddr::new(to, be16(udp, 2)),
        payload: start..start + len - UDP_HEADER_LEN,
    })
}

/// Writes a frame from `src` to `dst` carrying `payload` into `buf`, with both checksums
/// (IPv4 header, UDP) computed; returns its length. `ip_id` is the IPv4 identification
/// (unused over IPv6); the packet is sent "don't fragment", as the UDP socket does.
pub fn emit(
    buf: &mut [u8],
    (dst_mac, src_mac): (Mac, Mac),
    src: SocketAddr,
    dst: SocketAddr,
    ip_id: u16,
    payload: &[u8],
) -> Result<usize, EmitError> {
    let udp_len = UDP_HEADER_LEN + payload.len();
    let (ip_header, ethertype) = match (src.ip(), dst.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => (IPV4_MIN_HEADER_LEN, ETHERTYPE_IPV4),
        (IpAddr::V6(_), IpAddr::V6(_)) => (IPV6_HEADER_LEN, ETHERTYPE_IPV6),
        _ => return Err(EmitError::Family),
    };
    let ip_len = ip_header + udp_len;
    let total = ETH_HEADER_LEN + ip_len;
    // The IPv4 total length and the IPv6/UDP lengths are 16-bit fields.
    if ip_len > usize::from(u16::MAX) {
        return Err(EmitError::TooLong);
    }
    if buf.len() < total {
        return Err(EmitError::TooSmall);
    }
    emit_ethernet_header(buf, dst_mac, src_mac, ethertype);
    let (ip, udp) = buf[ETH_HEADER_LEN..total].split_at_mut(ip_header);
    // The UDP checksum covers a pseudo header of the addresses, protocol and length.
    let pseudo = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            ip[..12].copy_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, HOP_LIMIT, IPPROTO_UDP, 0, 0]);
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&ip_id.to_be_bytes());
            let sum = ipv4_header_checksum(ip);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            let s = checksum(0, &s.octets());
            checksum(s, &d.octets()) as u32
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            ip[..8].copy_from_slice(&[0x60, 0, 0, 0, 0, 0, IPPROTO_UDP, HOP_LIMIT]);
            ip[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            ip[8..24].copy_from_slice(&s.octets());
            ip[24..40].copy_from_slice(&d.octets());
            let s = checksum(0, &s.octets());
            checksum(s, &d.octets()) as u32
        }
        _ => return Err(EmitError::Family),
    };
    udp[0..2].copy_from_slice(&src.port().to_be_bytes());
    udp[2..4].copy_from_slice(&dst.port().to_be_bytes());
    udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]);
    udp[UDP_HEADER_LEN..].copy_from_slice(payload);
    let pseudo = fold(pseudo + u32::from(IPPROTO_UDP) + udp_len as u32);
    let sum = !checksum(pseudo, udp);
    // RFC 768: a computed 0 is sent as all ones (0 means "no checksum" over IPv4).
    let sum = if sum == 0 { 0xffff } else { sum };
    udp[6..8].copy_from_slice(&sum.to_be_bytes());
    Ok(total)
}

/// RFC 1071 ones'-complement sum of `bytes` added to `initial` (not inverted): a header
/// whose checksum field is right sums to 0xffff.
pub fn checksum(initial: u16, bytes: &[u8]) -> u16 {
    let mut sum = u32::from(initial);
    let mut chunks = bytes.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
        // Folding as we go keeps the sum within u32 for any length.
        if sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(u16::from_be_bytes([*last, 0]));
    }
    fold(sum)
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Mac = [0x02, 0, 0, 0, 0, 0xa];
    const B: Mac = [0x02, 0, 0, 0, 0, 0xb];

    /// 10.200.0.1:7400 -> 10.200.0.2:7400, payload "hyphae\n", ID 0x1234, DF, TTL 64,
    /// written out field by field from RFC 791 and RFC 768 with both checksums zero.
    const CAPTURED_V4: [u8; 49] = [
        0x02, 0, 0, 0, 0, 0xb, 0x02, 0, 0, 0, 0, 0xa, 0x08, 0x00, // Ethernet
        0x45, 0x00, 0x00, 0x23, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, // IPv4 ..
        10, 200, 0, 1, 10, 200, 0, 2, // .. addresses
        0x1c, 0xe8, 0x1c, 0xe8, 0x00, 0x0f, 0x00, 0x00, // UDP
        b'h', b'y', b'p', b'h', b'a', b'e', b'\n',
    ];

    fn v4(a: [u8; 4], port: u16) -> SocketAddr {
        SocketAddr::from((a, port))
    }

    #[test]
    fn ipv4_header_checksum_matches_rfc1071_example() {
        // The classic example header: its checksum is 0xb861.
        let header = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(0, &header), 0xffff);
    }

    #[test]
    fn emit_ipv4_has_the_fields_and_checksums() {
        let mut buf = [0u8; 128];
        let from = v4([10, 200, 0, 1], 7400);
        let to = v4([10, 200, 0, 2], 7400);
        let len = emit(&mut buf, (B, A), from, to, 0x1234, b"hyphae\n").unwrap();
        assert_eq!(len, IPV4_OVERHEAD + 7);
        let frame = &buf[..len];
        // Everything but the two checksums is the captured frame.
        let mut expected = CAPTURED_V4;
        expected[24..26].copy_from_slice(&frame[24..26]);
        expected[40..42].copy_from_slice(&frame[40..42]);
        assert_eq!(frame, &expected[..]);
        assert_eq!(checksum(0, &frame[14..34]), 0xffff, "IPv4 header checksum");
        // UDP: pseudo header (addresses, protocol, length) plus the datagram.
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&frame[26..34]);
        pseudo.extend_from_slice(&[0, 17, 0, 15]);
        pseudo.extend_from_slice(&frame[34..]);
        assert_eq!(checksum(0, &pseudo), 0xffff, "UDP checksum");
        assert_eq!(
            u16::from_be_bytes([frame[24], frame[25]]),
            0x1304,
            "python: RFC 1071 of the header"
        );
        assert_eq!(
            u16::from_be_bytes([frame[40], frame[41]]),
            0x6c26,
            "python: RFC 1071 of pseudo header and datagram"
        );
    }

    #[test]
    fn emit_ipv6_checksum_is_mandatory_and_right() {
        let mut buf = [0u8; 128];
        let from: SocketAddr = "[fd00::1]:7400".parse().unwrap();
        let to: SocketAddr = "[fd00::2]:7401".parse().unwrap();
        let len = emit(&mut buf, (B, A), from, to, 0, &[1, 2, 3]).unwrap();
        assert_eq!(len, IPV6_OVERHEAD + 3);
        let frame = &buf[..len];
        assert_eq!(&frame[12..14], &[0x86, 0xdd]);
        assert_eq!(frame[14] >> 4, 6);
        assert_eq!(&frame[18..20], &11u16.to_be_bytes(), "payload length");
        assert_eq!(frame[20], 17);
        assert_eq!(frame[21], 64);
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&frame[22..54]);
        pseudo.extend_from_slice(&[0, 0, 0, 11, 0, 0, 0, 17]);
        pseudo.extend_from_slice(&frame[54..]);
        assert_eq!(checksum(0, &pseudo), 0xffff);
        let d = parse(frame).unwrap();
        assert_eq!((d.from, d.to), (from, to));
        assert_eq!(&frame[d.payload], &[1, 2, 3]);
    }

    #[test]
    fn parse_round_trips_and_finds_the_payload() {
        let mut frame = CAPTURED_V4;
        let sum = !checksum(0, &frame[14..34]);
        frame[24..26].copy_from_slice(&sum.to_be_bytes());
        let d = parse(&frame).unwrap();
        assert_eq!(d.from, v4([10, 200, 0, 1], 7400));
        assert_eq!(d.to, v4([10, 200, 0, 2], 7400));
        assert_eq!(&frame[d.payload], b"hyphae\n");
        // Ethernet padding after the IP packet is not payload.
        let mut padded = frame.to_vec();
        padded.extend_from_slice(&[0; 11]);
        assert_eq!(&padded[parse(&padded).unwrap().payload], b"hyphae\n");
    }

    #[test]
    fn parse_refuses_what_the_kernel_must_handle() {
        let mut frame = CAPTURED_V4;
        let sum = !checksum(0, &frame[14..34]);
        frame[24..26].copy_from_slice(&sum.to_be_bytes());
        let with = |at: usize, b: u8| {
            let mut f = frame;
            f[at] = b;
            f
        };
        assert_eq!(parse(&with(23, 6)), Err(ParseError::NotUdp));
        // Changing a header byte breaks the header checksum first.
        assert_eq!(parse(&with(29, 0x09)), Err(ParseError::BadChecksum));
        assert_eq!(parse(&with(14, 0x46)), Err(ParseError::Unsupported));
        assert_eq!(parse(&with(13, 0x06)), Err(ParseError::NotIp));
        let mut fragment = frame;
        fragment[20] = 0x20; // more fragments
        let sum = {
            fragment[24..26].copy_from_slice(&[0, 0]);
            !checksum(0, &fragment[14..34])
        };
        fragment[24..26].copy_from_slice(&sum.to_be_bytes());
        assert_eq!(parse(&fragment), Err(ParseError::Unsupported));
        for cut in 0..frame.len() {
            assert!(parse(&frame[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn emit_refuses_what_does_not_fit() {
        let mut small = [0u8; 40];
        let from = v4([10, 0, 0, 1], 1);
        let to = v4([10, 0, 0, 2], 2);
        assert_eq!(
            emit(&mut small, (B, A), from, to, 0, b"x"),
            Err(EmitError::TooSmall)
        );
        let v6: SocketAddr = "[::1]:1".parse().unwrap();
        assert_eq!(
            emit(&mut [0u8; 128], (B, A), from, v6, 0, b"x"),
            Err(EmitError::Family)
        );
        let huge = vec![0u8; 70_000];
        assert_eq!(
            emit(&mut vec![0u8; 71_000], (B, A), from, to, 0, &huge),
            Err(EmitError::TooLong)
        );
    }
}
