//! Any bytes from the TAP or from a member, in every mode, in a dual-stack namespace with a
//! second subnet the switch routes to, and a router with VEPA ports and two LAN hosts: the
//! switch drops, forwards, routes or reflects, answers neighbour discovery or "packet too
//! big", never panics.
#![no_main]

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use hyphae_vswitch::{Config, LanPorts, Mode, Switch, HEADROOM};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let now = Instant::now();
    let modes = [
        (Mode::Interface, LanPorts::Veb),
        (Mode::Router, LanPorts::Veb),
        (Mode::Router, LanPorts::Vepa),
        (Mode::Hybrid, LanPorts::Veb),
    ];
    for (mode, ports) in modes {
        let mut config = Config::interface(
            Ipv4Addr::new(10, 201, 0, 1),
            "10.201.0.0/16".parse().expect("subnet"),
            [2, 0, 0, 0, 0, 1],
            [0xfe, 0xfd, 1, 2, 3, 4],
        );
        config.mode = mode;
        config.lan_ports = ports;
        config.dhcp = true;
        config.routed = vec!["10.202.0.0/16".parse().expect("subnet")];
        config.prefix6 = Some("fd00:1::/64".parse().expect("prefix"));
        let mut sw: Switch<u8> = Switch::new(config);
        sw.start(now);
        sw.set_peer_addresses(
            1,
            &[Ipv4Addr::new(10, 201, 0, 2), Ipv4Addr::new(10, 202, 0, 2)],
        );
        sw.set_address6(Some("fd00:1::10".parse().expect("address")));
        sw.set_peer_addresses6(1, &["fd00:1::20".parse().expect("address")]);
        if ports == LanPorts::Vepa {
            sw.learn_lan_host(Ipv4Addr::new(10, 201, 0, 10), [2, 0, 0, 0, 0, 0xa], now);
            sw.learn_lan_host(Ipv4Addr::new(10, 201, 0, 11), [2, 0, 0, 0, 0, 0xb], now);
            sw.bind_lease(Ipv4Addr::new(10, 201, 0, 12), [2, 0, 0, 0, 0, 0xc]);
        }
        let mut reply = [0u8; hyphae_vswitch::MIN_REPLY_BUF];
        let mut frame = data.to_vec();
        let _ = sw.handle_tap_frame(now, &mut frame, &mut reply);
        let mut macs = Vec::new();
        sw.lan_copies(data, &mut macs);
        for mac in macs {
            let mut copy = data.to_vec();
            sw.address_copy(&mut copy, mac);
        }
        let _ = sw.emit_unreachable(now, &mut reply, data);
        let to = ("fe80::1".parse().expect("address"), [2, 0, 0, 0, 0, 9]);
        let _ = sw.emit_dhcp6_reply(&mut reply, to, 546, data);
        let relay = ("fd00::e".parse().expect("address"), [2, 0, 0, 0, 0, 9]);
        let _ = sw.emit_dhcp6_reply(&mut reply, relay, 547, data);
        let mut buf = vec![0u8; HEADROOM + data.len()];
        buf[HEADROOM..].copy_from_slice(data);
        let _ = sw.handle_peer_packet(now, &mut buf, data.len());
        sw.handle_timeout(now + Duration::from_secs(60));
        while sw.poll_transmit(&mut reply).is_some() {}
        while sw.poll_event().is_some() {}
    }
});
