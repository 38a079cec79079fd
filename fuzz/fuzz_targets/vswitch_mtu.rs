//! Any bytes as an IPv4 packet for the MTU fitting (MSS clamping, ICMP "fragmentation
//! needed", fragmentation): never a panic, fragments always within the MTU, and their data
//! adds up to the packet's.
#![no_main]

use std::net::Ipv4Addr;

use hyphae_vswitch::mtu::{clamp_mss, emit_frag_needed, Fragments, FRAG_NEEDED_MAX_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mtu_byte, packet)) = data.split_first() else {
        return;
    };
    let mut packet = packet.to_vec();
    let _ = clamp_mss(&mut packet, 1380);
    let mut reply = [0u8; FRAG_NEEDED_MAX_LEN];
    let macs = ([2, 0, 0, 0, 0, 1], [0xfe, 0xfd, 1, 2, 3, 4]);
    let _ = emit_frag_needed(&mut reply, macs, Ipv4Addr::new(10, 201, 0, 1), 1420, &packet);
    // MTUs from 68 to 68 + 4 * 255.
    let mtu = 68 + 4 * u16::from(mtu_byte);
    if let Some(mut fragments) = Fragments::new(&packet, mtu) {
        let mut buf = vec![0u8; usize::from(mtu)];
        let mut count = 0;
        while let Some(len) = fragments.next_into(&mut buf) {
            assert!(len <= usize::from(mtu));
            count += 1;
            assert!(count <= 65536 / 8 + 1, "runaway fragmentation");
        }
    }
});
