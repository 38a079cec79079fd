//! Frames that hosts on a TAP send, built by hand for the driver's tests (`tests`,
//! `sim_tests`): Ethernet with IPv4 (ICMP echo, UDP) or ARP.

use std::net::Ipv4Addr;

pub(super) const BROADCAST: [u8; 6] = [0xff; 6];

/// A machine on a TAP (a LAN host, or the member host itself): its MAC and, once it has
/// one, its address.
#[derive(Clone, Copy)]
pub(super) struct Station {
    pub(super) mac: [u8; 6],
    pub(super) ip: Ipv4Addr,
}

/// The Internet checksum of `bytes` (IPv4 headers, ICMP).
pub(super) fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for pair in bytes.chunks(2) {
        let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An Ethernet frame carrying an IPv4 packet.
pub(super) fn ipv4(
    src: Station,
    dst_mac: [u8; 6],
    dst: Ipv4Addr,
    protocol: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = dst_mac.to_vec();
    f.extend_from_slice(&src.mac);
    f.extend_from_slice(&[0x08, 0x00]);
    let total = u16::try_from(20 + payload.len()).expect("a small packet");
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&[0x12, 0x34, 0x40, 0, 64, protocol, 0, 0]);
    ip.extend_from_slice(&src.ip.octets());
    ip.extend_from_slice(&dst.octets());
    let sum = checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(payload);
    f
}

/// A UDP datagram in a frame (no UDP checksum, as IPv4 allows).
pub(super) fn udp(
    src: Station,
    dst_mac: [u8; 6],
    dst: Ipv4Addr,
    ports: (u16, u16),
    payload: &[u8],
) -> Vec<u8> {
    let mut u = ports.0.to_be_bytes().to_vec();
    u.extend_from_slice(&ports.1.to_be_bytes());
    let len = u16::try_from(8 + payload.len()).expect("a small datagram");
    u.extend_from_slice(&len.to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    ipv4(src, dst_mac, dst, 17, &u)
}

/// An ICMP echo request.
pub(super) fn ping(src: Station, dst_mac: [u8; 6], dst: Ipv4Addr, seq: u16) -> Vec<u8> {
    let mut icmp = vec![8, 0, 0, 0, 0, 1];
    icmp.extend_from_slice(&seq.to_be_bytes());
    icmp.extend_from_slice(b"hyphae!!");
    let sum = checksum(&icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    ipv4(src, dst_mac, dst, 1, &icmp)
}

/// A broadcast ARP request from `host` for `target`; for its own address, a gratuitous ARP.
pub(super) fn arp_request(host: Station, target: Ipv4Addr) -> Vec<u8> {
    let mut f = BROADCAST.to_vec();
    f.extend_from_slice(&host.mac);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&host.mac);
    f.extend_from_slice(&host.ip.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target.octets());
    f
}
