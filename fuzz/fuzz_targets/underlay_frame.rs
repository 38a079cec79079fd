//! Any frame an XDP program redirects to the agent's AF_XDP sockets: a datagram whose
//! payload lies inside the frame, or an error, never a panic; and what `emit` writes parses
//! back to the same addresses and payload.
#![no_main]

use std::net::SocketAddr;

use hyphae_vswitch::udp::{emit, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = parse(data) {
        assert!(d.payload.start <= d.payload.end && d.payload.end <= data.len());
        // Re-emitting what was found gives a frame that parses to the same datagram.
        let mut buf = vec![0u8; data.len() + 64];
        if let Ok(len) = emit(
            &mut buf,
            ([2; 6], [4; 6]),
            d.from,
            d.to,
            7,
            &data[d.payload.clone()],
        ) {
            let again = parse(&buf[..len]).expect("emitted frame parses");
            assert_eq!((again.from, again.to), (d.from, d.to));
            assert_eq!(&buf[again.payload], &data[d.payload]);
        }
    }
    let from = SocketAddr::from(([10, 200, 0, 1], 7400));
    let to = SocketAddr::from(([10, 200, 0, 2], 7400));
    let mut buf = vec![0u8; data.len() + 42];
    let len = emit(&mut buf, ([2; 6], [4; 6]), from, to, 1, data).expect("room for the headers");
    let d = parse(&buf[..len]).expect("emitted frame parses");
    assert_eq!(&buf[d.payload], data);
});
