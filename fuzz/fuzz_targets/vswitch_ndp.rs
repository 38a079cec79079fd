//! Neighbour discovery as the layer-2 switch reads it: any bytes as a frame, and the same
//! bytes as the ICMPv6 message of a well-formed IPv6 frame (hop limit 255, checksum made
//! right) so the fuzzer reaches the message and its options; each taken as a member's
//! advertisement and as a solicitation from this side. Nothing panics.
#![no_main]

use std::time::Instant;

use hyphae_vswitch::layer2::{L2Config, L2Mode, Layer2};
use hyphae_vswitch::ndp;
use libfuzzer_sys::fuzz_target;

const FAR: [u8; 6] = [2, 0, 0, 0, 0, 2];

fuzz_target!(|data: &[u8]| {
    let _ = ndp::parse(data);
    let Ok(length) = u16::try_from(data.len()) else {
        return;
    };
    let mut frame = vec![0u8; 54];
    frame[..6].copy_from_slice(&[0x33, 0x33, 0xff, 0, 0, 1]);
    frame[6..12].copy_from_slice(&FAR);
    frame[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
    frame[14] = 0x60;
    frame[18..20].copy_from_slice(&length.to_be_bytes());
    frame[20] = 58;
    frame[21] = 255;
    frame[22..38].copy_from_slice(&"fd00::2".parse::<std::net::Ipv6Addr>().unwrap().octets());
    frame[38..54].copy_from_slice(&"ff02::1:ff00:1".parse::<std::net::Ipv6Addr>().unwrap().octets());
    frame.extend_from_slice(data);
    if data.len() >= 4 {
        frame[56..58].fill(0);
        let mut pseudo = frame[22..54].to_vec();
        pseudo.extend_from_slice(&u32::from(length).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, 58]);
        pseudo.extend_from_slice(&frame[54..]);
        let sum = !hyphae_vswitch::udp::checksum(0, &pseudo);
        frame[56..58].copy_from_slice(&sum.to_be_bytes());
    }
    let _ = ndp::parse(&frame);
    let now = Instant::now();
    let config = L2Config {
        mode: L2Mode::Router,
        device_mac: [2, 0, 0, 0, 0, 1],
        flood_rate: 10,
        tunnel_mtu: 1420,
        vlan: None,
        ethertypes: Vec::new(),
        max_local: 200,
    };
    let mut sw: Layer2<u8> = Layer2::new(config, now);
    sw.set_peer_macs(now, 1, &[FAR]);
    let _ = sw.handle_peer_frame(now, 1, &frame);
    // The same message from this side: a host there asking.
    frame[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0x0a]);
    let _ = sw.handle_tap_frame(now, &frame);
    let _ = sw.answer();
});
