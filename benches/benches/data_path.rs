//! Per-packet cost of the data path, beside the floor every data path pays (copying the
//! packet once): switching a frame, encrypting a packet, decrypting a datagram.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Instant;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use hyphae_overlay::{Event, Identity, NamespaceKeys, Node, Received};
use hyphae_vswitch::{Action, Config, Switch};

const PAYLOAD: usize = 1400;

fn frame() -> Vec<u8> {
    let total = (20 + 8 + PAYLOAD) as u16;
    let mut f = vec![0x02, 0, 0, 0, 0, 1, 0xfe, 0xfd, 1, 2, 3, 4, 0x08, 0x00];
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0, 1, 0x40, 0, 64, 17, 0, 0, 10, 201, 0, 1, 10, 201, 0, 2]);
    f.extend_from_slice(&[0x13, 0x88, 0x13, 0x89]);
    f.extend_from_slice(&(8 + PAYLOAD as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.resize(14 + total as usize, 0xab);
    f
}

/// Two nodes with an established tunnel, a -> b.
fn tunnel() -> (Node, Node, hyphae_overlay::PeerHandle) {
    let now = Instant::now();
    let keys = NamespaceKeys::derive("bench", b"a benchmark namespace secret");
    let mut a = Node::new(Identity::from_seed([1; 32]), [1; 32]);
    let mut b = Node::new(Identity::from_seed([2; 32]), [2; 32]);
    let ns = a.add_namespace(keys.clone(), vec![Ipv4Addr::new(10, 201, 0, 1)]);
    b.add_namespace(keys, vec![Ipv4Addr::new(10, 201, 0, 2)]);
    let (aa, ba) = (
        SocketAddr::from(([127, 0, 0, 1], 1)),
        SocketAddr::from(([127, 0, 0, 1], 2)),
    );
    a.add_static_peer(ns, ba, now);
    a.handle_timeout(now);
    let mut out = vec![0u8; 65536];
    for _ in 0..20 {
        while let Some((_, d)) = a.poll_transmit() {
            b.handle_datagram(now, aa, &d, &mut out);
        }
        while let Some((_, d)) = b.poll_transmit() {
            a.handle_datagram(now, ba, &d, &mut out);
        }
    }
    let peer = std::iter::from_fn(|| a.poll_event())
        .find_map(|e| match e {
            Event::PeerAddresses { peer, .. } => Some(peer),
            _ => None,
        })
        .expect("tunnel up");
    (a, b, peer)
}

fn data_path(c: &mut Criterion) {
    let frame = frame();
    let mut g = c.benchmark_group("per_packet_1400B");
    g.throughput(Throughput::Bytes(PAYLOAD as u64));

    let mut copy = vec![0u8; frame.len()];
    g.bench_function("baseline_copy", |bench| {
        bench.iter(|| copy.copy_from_slice(black_box(&frame)))
    });

    let mut config = Config::interface(
        Ipv4Addr::new(10, 201, 0, 1),
        "10.201.0.0/16".parse().unwrap(),
        [0x02, 0, 0, 0, 0, 1],
        [0xfe, 0xfd, 1, 2, 3, 4],
    );
    // A tunnel the frame fits (a 1428-byte packet): the common case, checked and passed on.
    config.tunnel_mtu = 1500;
    let mut sw: Switch<u32> = Switch::new(config);
    let now = std::time::Instant::now();
    sw.set_peer_addresses(7, &[Ipv4Addr::new(10, 201, 0, 2)]);
    let mut reply = [0u8; hyphae_vswitch::MIN_REPLY_BUF];
    let mut tap_frame = frame.clone();
    g.bench_function("vswitch_tap_frame", |bench| {
        bench.iter(|| {
            let a = sw.handle_tap_frame(now, black_box(&mut tap_frame), &mut reply);
            assert!(matches!(a, Action::ToPeer { .. }));
        })
    });

    let (mut a, mut b, peer) = tunnel();
    let packet = &frame[14..];
    let mut out = vec![0u8; 65536];
    g.bench_function("tunnel_encrypt", |bench| {
        bench.iter(|| a.send(peer, black_box(packet), &mut out).expect("session"))
    });

    // Decrypt needs fresh counters: pre-encrypt a batch per iteration batch.
    let from = SocketAddr::from(([127, 0, 0, 1], 1));
    let now = Instant::now();
    let mut plain = vec![0u8; 65536];
    g.bench_function("tunnel_decrypt", |bench| {
        bench.iter_batched(
            || {
                let t = a.send(peer, packet, &mut out).expect("session");
                out[t.range].to_vec()
            },
            |d| {
                let r = b.handle_datagram(now, from, &d, &mut plain);
                assert!(matches!(r, Received::Deliver { .. }));
            },
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, data_path);
criterion_main!(benches);
