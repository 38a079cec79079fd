//! TAP offloads: cutting a 64 KiB TCP super-frame into tunnel-sized segments, and coalescing
//! the segments back into one super-frame, beside the floor (copying the super-frame once).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use hyphae_vswitch::offload::{Coalescer, Offer, Segments, VirtioHeader};

/// A TSO super-frame as the kernel hands it over: 48 segments of MSS 1368 (tunnel MTU 1420
/// with TCP timestamps), the last shorter.
const PAYLOAD: usize = 65535 - 20 - 32;
const MSS: u16 = 1368;

fn super_frame() -> (VirtioHeader, Vec<u8>) {
    let mut f = vec![0xfe, 0xfd, 1, 2, 3, 4, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00];
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&((20 + 32 + PAYLOAD) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 1, 0x40, 0, 64, 6, 0, 0, 10, 201, 0, 1, 10, 201, 0, 2]);
    f.extend_from_slice(&[0xc3, 0x50, 0x14, 0x51, 0, 0, 0, 1, 0, 0, 0, 2, 0x80, 0x10]);
    f.extend_from_slice(&[0x01, 0xf5, 0, 0, 0, 0, 1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
    f.resize(14 + 20 + 32 + PAYLOAD, 0xab);
    let header = VirtioHeader {
        flags: 1,
        gso_type: 1,
        hdr_len: 66,
        gso_size: MSS,
        csum_start: 34,
        csum_offset: 16,
    };
    (header, f)
}

fn offload(c: &mut Criterion) {
    let (header, frame) = super_frame();
    let mut g = c.benchmark_group("offload");
    g.throughput(Throughput::Bytes(frame.len() as u64));
    let mut buf = vec![0u8; 2048];
    let mut copy = vec![0u8; frame.len()];
    g.bench_function("copy 64 KiB (floor)", |b| {
        b.iter(|| copy.copy_from_slice(black_box(&frame)))
    });
    g.bench_function("segment 64 KiB into 1368-byte segments", |b| {
        b.iter(|| {
            let mut s = Segments::new(&header, black_box(&frame)).unwrap();
            while let Some(len) = s.next_into(&mut buf) {
                black_box(&buf[..len]);
            }
        })
    });
    let mut segments = Vec::new();
    let mut s = Segments::new(&header, &frame).unwrap();
    while let Some(len) = s.next_into(&mut buf) {
        segments.push(buf[..len].to_vec());
    }
    let mut gro = Coalescer::new();
    g.bench_function("coalesce 48 segments into one super-frame", |b| {
        b.iter(|| {
            for s in &segments {
                assert_eq!(gro.handle_frame(black_box(s)), Offer::Held);
            }
            black_box(gro.poll_frame().unwrap().len());
        })
    });
    g.finish();
}

criterion_group!(benches, offload);
criterion_main!(benches);
