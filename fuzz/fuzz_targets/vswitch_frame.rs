//! Any bytes from the TAP or from a member: the switch drops or forwards, never panics.
#![no_main]

use std::net::Ipv4Addr;

use hyphae_vswitch::{Config, Switch, HEADROOM};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut sw: Switch<u8> = Switch::new(Config {
        address: Ipv4Addr::new(10, 201, 0, 1),
        subnet: "10.201.0.0/16".parse().expect("subnet"),
        device_mac: [2, 0, 0, 0, 0, 1],
        remote_mac: [0xfe, 0xfd, 1, 2, 3, 4],
    });
    sw.set_peer_addresses(1, &[Ipv4Addr::new(10, 201, 0, 2)]);
    let mut reply = [0u8; 64];
    let _ = sw.handle_tap_frame(data, &mut reply);
    let mut buf = vec![0u8; HEADROOM + data.len()];
    buf[HEADROOM..].copy_from_slice(data);
    let _ = sw.handle_peer_packet(&mut buf, data.len());
});
