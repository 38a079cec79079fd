//! Any sequence of packets to the service stack (DNS over TCP, ping): answered, reset or
//! counted, never a panic; every query it hands out is answered without trouble.
#![no_main]

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use hyphae_dhcp_dns::tcp::Endpoint;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let start = Instant::now();
    let mut e = Endpoint::with_seed(Ipv4Addr::new(10, 201, 0, 1), 16, 7, start);
    // The input is a run of packets, each prefixed by one length byte; every packet
    // moves the clock a little, so the timers run too.
    let mut rest = data;
    let mut now = start;
    while let Some((&len, tail)) = rest.split_first() {
        let (packet, tail) = tail.split_at(usize::from(len).min(tail.len()));
        rest = tail;
        now += Duration::from_millis(u64::from(len) * 10);
        e.handle_packet(now, packet);
        while let Some((conn, query)) = e.poll_query() {
            e.respond(conn, &query, now);
        }
        e.handle_timeout(now);
        while e.poll_packet().is_some() {}
    }
});
