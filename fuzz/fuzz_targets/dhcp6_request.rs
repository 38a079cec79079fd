//! Any bytes sent to the virtual DHCPv6 server: a reply or a counted drop, never a panic,
//! and every claim it asks for can be answered either way.
#![no_main]

use std::time::{Duration, Instant};

use hyphae_dhcp_dns::dhcp6::{duid_ll, Output, Server, Settings};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let now = Instant::now();
    let mut s = Server::new(Settings {
        prefix: "fd00:1::/64".parse().expect("prefix"),
        server_id: duid_ll([0xfe, 0xfd, 1, 2, 3, 4]),
        dns: vec!["fd00:1::1".parse().expect("address")],
        domain: "lab".into(),
        lease: Duration::from_secs(600),
    });
    let from = ("fe80::1".parse().expect("address"), [2, 0, 0, 0, 0, 1]);
    for round in 0..2u64 {
        s.handle_request(now + Duration::from_secs(round), data, from);
        let mut granted = round == 1;
        while let Some(o) = s.poll_output() {
            if let Output::Claim { address, .. } = o {
                granted = !granted;
                if granted {
                    s.allocated(address, now);
                } else {
                    s.refused(address);
                }
            }
        }
    }
    s.handle_timeout(now + Duration::from_secs(3600));
    while s.poll_output().is_some() {}
});
