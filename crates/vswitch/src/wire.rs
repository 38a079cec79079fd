//! Zero-copy views over the few wire formats the switch reads: Ethernet II, ARP for IPv4
//! over Ethernet, and the IPv4 header.
//!
//! No-panic contract: every view is built with `new_checked`, which validates the length
//! (and the fixed fields the switch relies on) once; after that no accessor can index out of
//! bounds, whatever bytes the frame holds.

use std::net::{Ipv4Addr, Ipv6Addr};

/// An Ethernet MAC address.
pub type Mac = [u8; 6];

/// The broadcast MAC address.
pub const BROADCAST_MAC: Mac = [0xff; 6];

/// Ethernet II header: destination, source, EtherType.
pub const ETH_HEADER_LEN: usize = 14;
/// ARP for IPv4 over Ethernet (RFC 826): 8 bytes of header, two (MAC, IPv4) pairs.
pub const ARP_LEN: usize = 28;
/// IPv4 header without options (RFC 791).
pub const IPV4_MIN_HEADER_LEN: usize = 20;

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// EtherType of RARP (RFC 903): QEMU/KVM's announce-self sends it after a migration, with
/// the guest's MAC as sender and target and no address (the ARP layout, operation 3).
pub const ETHERTYPE_RARP: u16 = 0x8035;

/// ARP operation: request.
pub const ARP_REQUEST: u16 = 1;
/// ARP operation: reply.
pub const ARP_REPLY: u16 = 2;

/// Why bytes could not be viewed as a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// Shorter than the header, or than the length the header declares.
    Truncated,
    /// A fixed field holds a value this view does not handle.
    Unsupported,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn ipv4_at(b: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3])
}

fn mac_at(b: &[u8], at: usize) -> Mac {
    [b[at], b[at + 1], b[at + 2], b[at + 3], b[at + 4], b[at + 5]]
}

/// A view of an Ethernet II frame.
#[derive(Clone, Copy)]
pub struct EthernetFrame<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Checks that the buffer holds at least an Ethernet header.
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        if buf.as_ref().len() < ETH_HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(Self(buf))
    }

    /// Destination MAC.
    pub fn dst(&self) -> Mac {
        mac_at(self.0.as_ref(), 0)
    }

    /// Source MAC.
    pub fn src(&self) -> Mac {
        mac_at(self.0.as_ref(), 6)
    }

    /// EtherType.
    pub fn ethertype(&self) -> u16 {
        be16(self.0.as_ref(), 12)
    }

    /// Everything after the header.
    pub fn payload(&self) -> &[u8] {
        &self.0.as_ref()[ETH_HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]>> std::fmt::Debug for EthernetFrame<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EthernetFrame")
            .field("ethertype", &format_args!("{:#06x}", self.ethertype()))
            .field("len", &self.0.as_ref().len())
            .finish()
    }
}

/// Writes an Ethernet II header into the first [`ETH_HEADER_LEN`] bytes of `buf`.
///
/// `buf` must be at least [`ETH_HEADER_LEN`] long; callers reserve that headroom.
pub fn emit_ethernet_header(buf: &mut [u8], dst: Mac, src: Mac, ethertype: u16) {
    buf[0..6].copy_from_slice(&dst);
    buf[6..12].copy_from_slice(&src);
    buf[12..14].copy_from_slice(&ethertype.to_be_bytes());
}

/// A view of an ARP packet for IPv4 over Ethernet.
#[derive(Clone, Copy)]
pub struct ArpPacket<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> ArpPacket<T> {
    /// Checks length and that the packet maps IPv4 addresses to Ethernet MACs.
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        let b = buf.as_ref();
        if b.len() < ARP_LEN {
            return Err(Error::Truncated);
        }
        // htype 1 (Ethernet), ptype IPv4, hlen 6, plen 4.
        if be16(b, 0) != 1 || be16(b, 2) != ETHERTYPE_IPV4 || b[4] != 6 || b[5] != 4 {
            return Err(Error::Unsupported);
        }
        Ok(Self(buf))
    }

    /// Operation: [`ARP_REQUEST`] or [`ARP_REPLY`] (others exist).
    pub fn operation(&self) -> u16 {
        be16(self.0.as_ref(), 6)
    }

    /// Sender hardware address.
    pub fn sender_mac(&self) -> Mac {
        mac_at(self.0.as_ref(), 8)
    }

    /// Sender protocol address.
    pub fn sender_ip(&self) -> Ipv4Addr {
        ipv4_at(self.0.as_ref(), 14)
    }

    /// Target protocol address.
    pub fn target_ip(&self) -> Ipv4Addr {
        ipv4_at(self.0.as_ref(), 24)
    }
}

/// Writes a complete Ethernet frame carrying an ARP reply into `buf` and returns its length.
///
/// `buf` must be at least `ETH_HEADER_LEN + ARP_LEN` (42) bytes long.
pub fn emit_arp_reply(
    buf: &mut [u8],
    sender_mac: Mac,
    sender_ip: Ipv4Addr,
    target_mac: Mac,
    target_ip: Ipv4Addr,
) -> usize {
    emit_ethernet_header(buf, target_mac, sender_mac, ETHERTYPE_ARP);
    emit_arp(buf, ARP_REPLY, sender_mac, sender_ip, target_mac, target_ip)
}

/// Writes a broadcast ARP probe (RFC 5227: sender address 0.0.0.0, so no host caches it)
/// asking who has `target`, into `buf`; returns its length. The owner answers to
/// `sender_mac`. `buf` must be at least 42 bytes long.
pub fn emit_arp_probe(buf: &mut [u8], sender_mac: Mac, target: Ipv4Addr) -> usize {
    emit_ethernet_header(buf, BROADCAST_MAC, sender_mac, ETHERTYPE_ARP);
    emit_arp(
        buf,
        ARP_REQUEST,
        sender_mac,
        Ipv4Addr::UNSPECIFIED,
        [0; 6],
        target,
    )
}

fn emit_arp(
    buf: &mut [u8],
    operation: u16,
    sender_mac: Mac,
    sender_ip: Ipv4Addr,
    target_mac: Mac,
    target_ip: Ipv4Addr,
) -> usize {
    let arp = &mut buf[ETH_HEADER_LEN..ETH_HEADER_LEN + ARP_LEN];
    arp[0..2].copy_from_slice(&1u16.to_be_bytes());
    arp[2..4].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    arp[4] = 6;
    arp[5] = 4;
    arp[6..8].copy_from_slice(&operation.to_be_bytes());
    arp[8..14].copy_from_slice(&sender_mac);
    arp[14..18].copy_from_slice(&sender_ip.octets());
    arp[18..24].copy_from_slice(&target_mac);
    arp[24..28].copy_from_slice(&target_ip.octets());
    ETH_HEADER_LEN + ARP_LEN
}

/// The Ethernet multicast MAC of an IPv4 multicast group (RFC 1112: 01:00:5e and the low
/// 23 bits of the group).
pub fn multicast_mac(group: Ipv4Addr) -> Mac {
    let o = group.octets();
    [0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]
}

/// A view of an IPv4 packet whose header and declared total length fit the buffer.
#[derive(Clone, Copy)]
pub struct Ipv4Packet<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Checks version, header length and that the total length fits the buffer.
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        let b = buf.as_ref();
        if b.len() < IPV4_MIN_HEADER_LEN {
            return Err(Error::Truncated);
        }
        if b[0] >> 4 != 4 {
            return Err(Error::Unsupported);
        }
        let header_len = usize::from(b[0] & 0x0f) * 4;
        let total_len = usize::from(be16(b, 2));
        if header_len < IPV4_MIN_HEADER_LEN || total_len < header_len {
            return Err(Error::Unsupported);
        }
        if total_len > b.len() {
            return Err(Error::Truncated);
        }
        Ok(Self(buf))
    }

    /// Total length from the header: the packet without any link-layer padding after it.
    pub fn total_len(&self) -> usize {
        usize::from(be16(self.0.as_ref(), 2))
    }

    /// IP protocol number.
    pub fn protocol(&self) -> u8 {
        self.0.as_ref()[9]
    }

    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.0.as_ref()[8]
    }

    /// Source address.
    pub fn src(&self) -> Ipv4Addr {
        ipv4_at(self.0.as_ref(), 12)
    }

    /// Destination address.
    pub fn dst(&self) -> Ipv4Addr {
        ipv4_at(self.0.as_ref(), 16)
    }

    /// The bytes after the header, up to the total length.
    pub fn payload(&self) -> &[u8] {
        let b = self.0.as_ref();
        &b[usize::from(b[0] & 0x0f) * 4..self.total_len()]
    }
}

/// Length of the fixed IPv6 header.
pub const IPV6_HEADER_LEN: usize = 40;

/// IPv6 extension headers walked before the upper-layer header gives up (a longer chain
/// is malformed here).
pub const MAX_EXTENSIONS: usize = 8;
const HOP_BY_HOP: u8 = 0;
const ROUTING: u8 = 43;
const FRAGMENT: u8 = 44;
const DESTINATION_OPTIONS: u8 = 60;

/// Where an IPv6 packet's upper-layer header is, past its extension headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upper6 {
    /// Protocol `proto` at byte `at` of the packet (which may end there).
    At { proto: u8, at: usize },
    /// A fragment after the first: no upper-layer header.
    LaterFragment,
    /// Cut short, or more than [`MAX_EXTENSIONS`] extension headers.
    Malformed,
}

/// Walks the extension headers (hop-by-hop, routing, fragment, destination options) of the
/// IPv6 packet `ip` to its upper-layer header.
pub fn upper_layer6(ip: &[u8]) -> Upper6 {
    let Some(&first) = ip.get(6).filter(|_| ip.len() >= IPV6_HEADER_LEN) else {
        return Upper6::Malformed;
    };
    let (mut next, mut at) = (first, IPV6_HEADER_LEN);
    for _ in 0..MAX_EXTENSIONS {
        match next {
            HOP_BY_HOP | ROUTING | DESTINATION_OPTIONS => {
                let Some(h) = ip.get(at..at + 2) else {
                    return Upper6::Malformed;
                };
                next = h[0];
                at += (usize::from(h[1]) + 1) * 8;
            }
            FRAGMENT => {
                let Some(h) = ip.get(at..at + 8) else {
                    return Upper6::Malformed;
                };
                if u16::from_be_bytes([h[2], h[3]]) & 0xfff8 != 0 {
                    return Upper6::LaterFragment;
                }
                next = h[0];
                at += 8;
            }
            proto if at <= ip.len() => return Upper6::At { proto, at },
            _ => return Upper6::Malformed,
        }
    }
    Upper6::Malformed
}

/// Whether the IPv6 packet `ip` may be a router or neighbour discovery message (ICMPv6
/// types 133 to 137, RFC 4861), behind extension headers or not: one the switch did not
/// handle itself never reaches a host from elsewhere. A packet whose headers cannot be
/// walked may be one; a later fragment is not (hosts ignore fragmented ones, RFC 6980).
pub fn may_be_nd(ip: &[u8]) -> bool {
    match upper_layer6(ip) {
        Upper6::At { proto: 58, at } => ip.get(at).is_none_or(|t| (133..=137).contains(t)),
        Upper6::At { .. } | Upper6::LaterFragment => false,
        Upper6::Malformed => true,
    }
}

/// A view of an IPv6 packet whose fixed header and declared payload fit the buffer.
#[derive(Clone, Copy)]
pub struct Ipv6Packet<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// Checks the version and that the payload length fits the buffer.
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        let b = buf.as_ref();
        if b.len() < IPV6_HEADER_LEN {
            return Err(Error::Truncated);
        }
        if b[0] >> 4 != 6 {
            return Err(Error::Unsupported);
        }
        if IPV6_HEADER_LEN + usize::from(be16(b, 4)) > b.len() {
            return Err(Error::Truncated);
        }
        Ok(Self(buf))
    }

    /// The packet's length from its header, without link-layer padding after it.
    pub fn total_len(&self) -> usize {
        IPV6_HEADER_LEN + usize::from(be16(self.0.as_ref(), 4))
    }

    /// The next header (the transport protocol, when no extension header comes first).
    pub fn next_header(&self) -> u8 {
        self.0.as_ref()[6]
    }

    /// Source address.
    pub fn src(&self) -> Ipv6Addr {
        ipv6_at(self.0.as_ref(), 8)
    }

    /// Destination address.
    pub fn dst(&self) -> Ipv6Addr {
        ipv6_at(self.0.as_ref(), 24)
    }

    /// The bytes after the fixed header, up to the payload length.
    pub fn payload(&self) -> &[u8] {
        &self.0.as_ref()[IPV6_HEADER_LEN..self.total_len()]
    }
}

fn ipv6_at(b: &[u8], at: usize) -> Ipv6Addr {
    let mut o = [0u8; 16];
    o.copy_from_slice(&b[at..at + 16]);
    Ipv6Addr::from(o)
}

/// The Ethernet multicast MAC of an IPv6 multicast group (RFC 2464 7).
pub fn multicast_mac6(group: Ipv6Addr) -> Mac {
    let o = group.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;

/// UDP header length.
pub const UDP_HEADER_LEN: usize = 8;

/// The ports and payload of a UDP datagram (`ip_payload`: the bytes after the IPv4 header),
/// if its header and declared length fit.
pub fn udp_parts(ip_payload: &[u8]) -> Option<(u16, u16, std::ops::Range<usize>)> {
    if ip_payload.len() < UDP_HEADER_LEN {
        return None;
    }
    let len = usize::from(be16(ip_payload, 4));
    if len < UDP_HEADER_LEN || len > ip_payload.len() {
        return None;
    }
    Some((
        be16(ip_payload, 0),
        be16(ip_payload, 2),
        UDP_HEADER_LEN..len,
    ))
}

/// Writes an Ethernet frame carrying an IPv4 UDP datagram with `payload` into `buf` and
/// returns its length, or `None` if `buf` is too small. The UDP checksum is left 0 (allowed
/// over IPv4); the IPv4 header checksum is computed.
pub fn emit_udp(
    buf: &mut [u8],
    (dst_mac, src_mac): (Mac, Mac),
    (src, dst): (Ipv4Addr, Ipv4Addr),
    (src_port, dst_port): (u16, u16),
    payload: &[u8],
) -> Option<usize> {
    let udp_len = UDP_HEADER_LEN + payload.len();
    let ip_len = IPV4_MIN_HEADER_LEN + udp_len;
    let total = ETH_HEADER_LEN + ip_len;
    if buf.len() < total || ip_len > usize::from(u16::MAX) {
        return None;
    }
    emit_ethernet_header(buf, dst_mac, src_mac, ETHERTYPE_IPV4);
    let ip = &mut buf[ETH_HEADER_LEN..ETH_HEADER_LEN + IPV4_MIN_HEADER_LEN];
    ip.copy_from_slice(&[
        0x45,
        0,
        0,
        0,
        0,
        0,
        0x40,
        0,
        64,
        IPPROTO_UDP,
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
    let checksum = ipv4_header_checksum(ip);
    ip[10..12].copy_from_slice(&checksum.to_be_bytes());
    let udp = &mut buf[ETH_HEADER_LEN + IPV4_MIN_HEADER_LEN..total];
    udp[0..2].copy_from_slice(&src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]);
    udp[UDP_HEADER_LEN..].copy_from_slice(payload);
    Some(total)
}

/// Writes an Ethernet frame carrying an IPv6 UDP datagram with `payload` into `buf` and
/// returns its length, or `None` if `buf` is too small. The UDP checksum (mandatory over
/// IPv6) is computed.
pub fn emit_udp6(
    buf: &mut [u8],
    (dst_mac, src_mac): (Mac, Mac),
    (src, dst): (Ipv6Addr, Ipv6Addr),
    (src_port, dst_port): (u16, u16),
    payload: &[u8],
) -> Option<usize> {
    let udp_len = UDP_HEADER_LEN + payload.len();
    let total = ETH_HEADER_LEN + IPV6_HEADER_LEN + udp_len;
    let length = u16::try_from(udp_len).ok()?;
    let frame = buf.get_mut(..total)?;
    emit_ethernet_header(frame, dst_mac, src_mac, crate::ndp::ETHERTYPE_IPV6);
    let (ip, udp) = frame[ETH_HEADER_LEN..].split_at_mut(IPV6_HEADER_LEN);
    ip[..4].copy_from_slice(&[0x60, 0, 0, 0]);
    ip[4..6].copy_from_slice(&length.to_be_bytes());
    ip[6] = IPPROTO_UDP;
    ip[7] = 64;
    ip[8..24].copy_from_slice(&src.octets());
    ip[24..40].copy_from_slice(&dst.octets());
    udp[0..2].copy_from_slice(&src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&length.to_be_bytes());
    udp[6..8].fill(0);
    udp[UDP_HEADER_LEN..].copy_from_slice(payload);
    let sum = !crate::ndp::upper_layer_sum(&ip[8..40], IPPROTO_UDP, udp);
    // A computed 0 is sent as all ones (RFC 768; 0 means "none", which IPv6 forbids).
    let sum = if sum == 0 { 0xffff } else { sum };
    udp[6..8].copy_from_slice(&sum.to_be_bytes());
    Some(total)
}

/// Lowers the TTL of the IPv4 packet `ip` by one and updates its header checksum; false
/// (and nothing changed) if the header is malformed or the TTL is already zero.
pub(crate) fn decrement_ttl(ip: &mut [u8]) -> bool {
    let header_len = ip.first().map_or(0, |b| usize::from(b & 0x0f) * 4);
    if header_len < IPV4_MIN_HEADER_LEN || ip.len() < header_len || ip[8] == 0 {
        return false;
    }
    ip[8] -= 1;
    ip[10..12].fill(0);
    let sum = ipv4_header_checksum(&ip[..header_len]);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    true
}

/// RFC 1071 checksum of `header` (an IPv4 header or ICMP message) whose checksum field is
/// zero.
pub(crate) fn ipv4_header_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl<T: AsRef<[u8]>> std::fmt::Debug for Ipv4Packet<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ipv4Packet")
            .field("src", &self.src())
            .field("dst", &self.dst())
            .field("len", &self.total_len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_round_trip_with_a_valid_header_checksum() {
        let mut buf = [0u8; 128];
        let len = emit_udp(
            &mut buf,
            ([0xff; 6], [0xfe, 0xfd, 1, 2, 3, 4]),
            (Ipv4Addr::new(10, 201, 0, 1), Ipv4Addr::BROADCAST),
            (67, 68),
            b"hello",
        )
        .unwrap();
        assert_eq!(len, 14 + 20 + 8 + 5);
        let ip = Ipv4Packet::new_checked(&buf[14..len]).unwrap();
        assert_eq!(
            (ip.src(), ip.dst(), ip.protocol()),
            (
                Ipv4Addr::new(10, 201, 0, 1),
                Ipv4Addr::BROADCAST,
                IPPROTO_UDP
            )
        );
        // A header with its checksum in place sums to 0xffff.
        assert_eq!(ipv4_header_checksum(&buf[14..34]), 0);
        let (sp, dp, range) = udp_parts(ip.payload()).unwrap();
        assert_eq!((sp, dp, &ip.payload()[range]), (67, 68, &b"hello"[..]));
        assert_eq!(
            emit_udp(
                &mut buf[..40],
                ([0; 6], [0; 6]),
                (Ipv4Addr::UNSPECIFIED, Ipv4Addr::UNSPECIFIED),
                (1, 2),
                b"x"
            ),
            None
        );
        assert_eq!(
            udp_parts(&[0, 67, 0, 68, 0, 200, 0, 0]),
            None,
            "length past the end"
        );
    }

    use crate::captured::ARP_REQUEST as ARP_REQUEST_FRAME;

    #[test]
    fn parse_arp_request() {
        let eth = EthernetFrame::new_checked(&ARP_REQUEST_FRAME[..]).unwrap();
        assert_eq!(eth.ethertype(), ETHERTYPE_ARP);
        assert_eq!(eth.dst(), BROADCAST_MAC);
        let arp = ArpPacket::new_checked(eth.payload()).unwrap();
        assert_eq!(arp.operation(), ARP_REQUEST);
        assert_eq!(arp.sender_ip(), Ipv4Addr::new(10, 201, 0, 1));
        assert_eq!(arp.target_ip(), Ipv4Addr::new(10, 201, 0, 2));
        assert_eq!(arp.sender_mac(), [0x02, 0x48, 0xae, 0x81, 0xab, 0x18]);
    }

    #[test]
    fn emit_arp_reply_round_trips() {
        let mut buf = [0u8; 64];
        let me = [0xfe, 0xfd, 1, 2, 3, 4];
        let them = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
        let len = emit_arp_reply(
            &mut buf,
            me,
            Ipv4Addr::new(10, 201, 0, 2),
            them,
            Ipv4Addr::new(10, 201, 0, 1),
        );
        assert_eq!(len, 42);
        let eth = EthernetFrame::new_checked(&buf[..len]).unwrap();
        assert_eq!((eth.dst(), eth.src()), (them, me));
        let arp = ArpPacket::new_checked(eth.payload()).unwrap();
        assert_eq!(arp.operation(), ARP_REPLY);
        assert_eq!(arp.sender_mac(), me);
        assert_eq!(arp.sender_ip(), Ipv4Addr::new(10, 201, 0, 2));
        assert_eq!(arp.target_ip(), Ipv4Addr::new(10, 201, 0, 1));
    }

    #[test]
    fn ipv4_checks() {
        // ICMP echo header 10.201.0.1 -> 10.201.0.2, total length 28.
        let pkt: [u8; 28] = [
            0x45, 0, 0, 28, 0, 1, 0x40, 0, 64, 1, 0, 0, 10, 201, 0, 1, 10, 201, 0, 2, //
            8, 0, 0, 0, 0, 1, 0, 1,
        ];
        let ip = Ipv4Packet::new_checked(&pkt[..]).unwrap();
        assert_eq!(ip.src(), Ipv4Addr::new(10, 201, 0, 1));
        assert_eq!(ip.dst(), Ipv4Addr::new(10, 201, 0, 2));
        assert_eq!(ip.protocol(), 1);
        assert_eq!(ip.payload().len(), 8);
        assert_eq!(
            Ipv4Packet::new_checked(&pkt[..27]).unwrap_err(),
            Error::Truncated
        );
        let mut bad = pkt;
        bad[0] = 0x44; // IHL 4 < 5
        assert_eq!(
            Ipv4Packet::new_checked(&bad[..]).unwrap_err(),
            Error::Unsupported
        );
        bad[0] = 0x65; // version 6
        assert_eq!(
            Ipv4Packet::new_checked(&bad[..]).unwrap_err(),
            Error::Unsupported
        );
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        for n in 0..ARP_REQUEST_FRAME.len() {
            let bytes = &ARP_REQUEST_FRAME[..n];
            if let Ok(eth) = EthernetFrame::new_checked(bytes) {
                assert!(ArpPacket::new_checked(eth.payload()).is_err());
                let _ = Ipv4Packet::new_checked(eth.payload());
            }
        }
    }
}
