//! Any bytes sent to the virtual DHCP server: a reply or a counted drop, never a panic,
//! and every claim it asks for can be answered either way.
#![no_main]

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use hyphae_dhcp_dns::dhcp::{Output, Server, Settings};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let now = Instant::now();
    let mut s = Server::new(Settings {
        subnet: "10.201.0.0/16".parse().expect("subnet"),
        server: Ipv4Addr::new(10, 201, 0, 1),
        dns: vec![Ipv4Addr::new(10, 201, 0, 1)],
        domain: "lab".into(),
        router: None,
        routes: Vec::new(),
        lease: Duration::from_secs(600),
    });
    s.handle_request(now, data, [2, 0, 0, 0, 0, 1]);
    let mut granted = false;
    while let Some(o) = s.poll_output() {
        if let Output::Claim { client, hint, .. } = o {
            granted = !granted;
            if granted {
                s.allocated(&client, hint.unwrap_or(Ipv4Addr::new(10, 201, 1, 1)), now);
            } else {
                s.refused(&client);
            }
        }
    }
    s.handle_request(now + Duration::from_secs(1), data, [2, 0, 0, 0, 0, 1]);
    s.handle_timeout(now + Duration::from_secs(3600));
    while s.poll_output().is_some() {}
});
