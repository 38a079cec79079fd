//! Any bytes as a layer-2 namespace sees them, in both modes: a frame from the TAP, a
//! tunnel packet from a member (an envelope, whole or a piece), and the same bytes cut
//! into a member's pieces in order; the switch forwards, floods, holds or drops, never
//! panics, and holds no more than its bounds.
#![no_main]

use std::time::{Duration, Instant};

use hyphae_vswitch::layer2::{parse_envelope, Envelope, Piece, L2Config, L2Mode, Layer2, MAX_FRAME};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let now = Instant::now();
    for mode in [L2Mode::Interface, L2Mode::Router] {
        let config = L2Config {
            mode,
            device_mac: [2, 0, 0, 0, 0, 1],
            flood_rate: 10,
            tunnel_mtu: 1420,
            vlan: (mode == L2Mode::Router).then_some(100),
            ethertypes: if mode == L2Mode::Router { vec![0x0800, 0x0806] } else { Vec::new() },
            max_local: 200,
        };
        let mut sw: Layer2<u8> = Layer2::new(config, now);
        sw.set_peer_macs(now, 1, &[[2, 0, 0, 0, 0, 2], [0xff; 6]]);
        let mut frame = data.to_vec();
        if let Some(untagged) = sw.untag(&mut frame) {
            let _ = sw.handle_tap_frame(now, untagged);
        }
        let _ = sw.handle_tap_frame(now, data);
        let mut room = vec![0u8; 40 + data.len()];
        room[40..].copy_from_slice(data);
        let _ = hyphae_vswitch::layer2::tag_in_place(&mut room, 40, data.len(), 100);
        if let Some(pieces) = sw.pieces(data.len()) {
            for (start, end) in pieces.clone() {
                let mut packet = vec![0u8; 20 + end - start];
                let _ = pieces.header(&mut packet, start, end);
                let _ = hyphae_vswitch::layer2::Pieces::copy(&mut packet[20..], data, start, end);
                let _ = parse_envelope(&packet);
            }
        }
        let mut at = now;
        for chunk in data.chunks(64) {
            at += Duration::from_millis(u64::from(chunk[0] & 0x3f));
            match parse_envelope(chunk) {
                Some(Envelope::Whole(frame)) => {
                    let _ = sw.handle_peer_frame(at, chunk[0] & 3, frame);
                }
                Some(Envelope::Fragment(piece)) => {
                    let _ = sw.handle_peer_piece(at, chunk[0] & 3, piece, |_| chunk[0] & 8 == 0);
                    assert!(sw.assembled().len() <= MAX_FRAME);
                }
                None => {
                    let id = u16::from(chunk[0]);
                    let offset = usize::from(chunk.len() as u8 & 0xf8);
                    let piece = Piece {
                        id,
                        offset,
                        more: chunk[0] & 1 == 1,
                        payload: chunk,
                    };
                    let _ = sw.handle_peer_piece(at, chunk[0] & 7, piece, |f| f.len() % 3 != 0);
                }
            }
        }
        assert!(sw.remote_count() <= 2 && sw.local_macs().len() <= 2);
        // Ten minutes on, nothing waits: MACs aged out, pieces expired.
        sw.handle_timeout(at + Duration::from_secs(600));
        assert_eq!(sw.poll_timeout(), None);
    }
});
