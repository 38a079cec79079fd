//! Tests of the switch, by concern; this module holds the fixtures they share.

mod announce;
mod arp;
mod broadcast;
mod frames;
mod lan;
mod lan6;
mod router;
mod routes;
mod service;
mod v6;
mod vepa;
mod vepa6;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use super::Switch;
use crate::wire::{
    emit_udp, udp_parts, ArpPacket, EthernetFrame, Ipv4Packet, ARP_REPLY, ARP_REQUEST,
    BROADCAST_MAC, ETHERTYPE_IPV4, ETH_HEADER_LEN,
};
use crate::{Action, Client, Config, DropReason, Event, Mac, Mode, HEADROOM, LAN_PROBES};

const DEVICE_MAC: Mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];

/// The virtual clock's origin (the switch only compares instants it is given).
fn t0() -> Instant {
    static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    #[allow(clippy::disallowed_methods)]
    *T0.get_or_init(Instant::now)
}

const REMOTE_MAC: Mac = [0xfe, 0xfd, 0xa1, 0xb2, 0xc3, 0xd4];

fn switch() -> Switch<u32> {
    let mut sw = Switch::new(Config::interface(
        Ipv4Addr::new(10, 201, 0, 1),
        "10.201.0.0/16".parse().unwrap(),
        DEVICE_MAC,
        REMOTE_MAC,
    ));
    sw.set_peer_addresses(7, &[Ipv4Addr::new(10, 201, 0, 2)]);
    sw
}

fn arp_request(target: [u8; 4]) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&DEVICE_MAC);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&DEVICE_MAC);
    f.extend_from_slice(&[10, 201, 0, 1]);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target);
    f
}

// An ICMP echo request 10.201.0.1 -> dst as the kernel writes it to the TAP, with the
// Ethernet minimum-size padding after the 28-byte IP packet.
fn icmp_frame(dst: [u8; 4]) -> Vec<u8> {
    let mut f = REMOTE_MAC.to_vec();
    f.extend_from_slice(&DEVICE_MAC);
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend_from_slice(&[0x45, 0, 0, 28, 0x12, 0x34, 0x40, 0, 64, 1, 0, 0]);
    f.extend_from_slice(&[10, 201, 0, 1]);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&[8, 0, 0xf7, 0xfe, 0, 1, 0, 0]);
    f.extend_from_slice(&[0; 18]); // padding to 60 bytes
    f
}

// --- router and hybrid modes, broadcast -------------------------------------------

const LAN_A: Mac = [0x02, 0, 0, 0, 0, 0xa];

const LAN_B: Mac = [0x02, 0, 0, 0, 0, 0xb];

fn with_mode(mode: Mode) -> Switch<u32> {
    let mut config = Config::interface(
        Ipv4Addr::new(10, 201, 0, 1),
        "10.201.0.0/16".parse().unwrap(),
        DEVICE_MAC,
        REMOTE_MAC,
    );
    config.mode = mode;
    config.broadcast_rate = 10;
    if mode == Mode::Router {
        config.address = Ipv4Addr::UNSPECIFIED;
    }
    let mut sw = Switch::new(config);
    sw.set_peer_addresses(7, &[Ipv4Addr::new(10, 201, 0, 2)]);
    sw
}

fn arp_from(mac: Mac, ip: [u8; 4], op: u16, target: [u8; 4]) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&mac);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, op as u8]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&ip);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target);
    f
}

fn ipv4_from(src_mac: Mac, dst_mac: Mac, src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    let mut f = icmp_frame(dst);
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[26..30].copy_from_slice(&src);
    f
}

fn peer_packet(
    sw: &mut Switch<u32>,
    src: [u8; 4],
    dst: [u8; 4],
    at: Instant,
) -> (Action<u32>, Vec<u8>) {
    let frame = ipv4_from(REMOTE_MAC, DEVICE_MAC, src, dst);
    let ip = &frame[14..42];
    let mut buf = [0u8; 128];
    buf[HEADROOM..HEADROOM + ip.len()].copy_from_slice(ip);
    let action = sw.handle_peer_packet(at, &mut buf, ip.len());
    (action, buf[..42].to_vec())
}
