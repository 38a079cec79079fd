//! The AEAD under every tunnel data message: ChaCha20-Poly1305 (RFC 8439) sealing and opening
//! one 1400-byte packet in place, the calls boringtun's `noise::session` makes (nonce = four
//! zero bytes and the little-endian counter, empty associated data, detached tag).
//!
//! Implementations side by side: `ring` (what boringtun 0.7 uses for data messages), RustCrypto
//! `chacha20poly1305` (what it uses for cookie replies, and hyphae for records), and, with
//! `--features aws-lc`, `aws-lc-rs`. Each group first checks that every implementation opens
//! what the others sealed, so the figures compare the same function.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use chacha20poly1305::{aead::AeadInPlace, ChaCha20Poly1305, KeyInit, Tag};
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};

const PAYLOAD: usize = 1400;
const KEY: [u8; 32] = [7; 32];

fn nonce(counter: u64) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    n
}

fn ring_key() -> ring::aead::LessSafeKey {
    let key = ring::aead::UnboundKey::new(&ring::aead::CHACHA20_POLY1305, &KEY).unwrap();
    ring::aead::LessSafeKey::new(key)
}

fn ring_seal(key: &ring::aead::LessSafeKey, counter: u64, data: &mut [u8]) -> [u8; 16] {
    let n = ring::aead::Nonce::assume_unique_for_key(nonce(counter));
    let tag = key
        .seal_in_place_separate_tag(n, ring::aead::Aad::empty(), data)
        .unwrap();
    tag.as_ref().try_into().unwrap()
}

fn ring_open(key: &ring::aead::LessSafeKey, counter: u64, sealed: &mut [u8]) -> usize {
    let n = ring::aead::Nonce::assume_unique_for_key(nonce(counter));
    key.open_in_place(n, ring::aead::Aad::empty(), sealed)
        .unwrap()
        .len()
}

fn rustcrypto_seal(key: &ChaCha20Poly1305, counter: u64, data: &mut [u8]) -> [u8; 16] {
    key.encrypt_in_place_detached(&nonce(counter).into(), &[], data)
        .unwrap()
        .into()
}

fn rustcrypto_open(key: &ChaCha20Poly1305, counter: u64, sealed: &mut [u8]) -> usize {
    let (data, tag) = sealed.split_at_mut(PAYLOAD);
    let tag = Tag::clone_from_slice(tag);
    key.decrypt_in_place_detached(&nonce(counter).into(), &[], data, &tag)
        .unwrap();
    data.len()
}

#[cfg(feature = "aws-lc")]
mod aws {
    use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};

    pub(crate) fn key() -> LessSafeKey {
        LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &super::KEY).unwrap())
    }

    pub(crate) fn seal(key: &LessSafeKey, counter: u64, data: &mut [u8]) -> [u8; 16] {
        let n = Nonce::assume_unique_for_key(super::nonce(counter));
        let tag = key
            .seal_in_place_separate_tag(n, Aad::empty(), data)
            .unwrap();
        tag.as_ref().try_into().unwrap()
    }

    pub(crate) fn open(key: &LessSafeKey, counter: u64, sealed: &mut [u8]) -> usize {
        let n = Nonce::assume_unique_for_key(super::nonce(counter));
        key.open_in_place(n, Aad::empty(), sealed).unwrap().len()
    }
}

/// A sealed packet: the payload followed by its tag.
fn sealed(seal: impl Fn(&mut [u8]) -> [u8; 16]) -> Vec<u8> {
    let mut data = vec![0xab; PAYLOAD];
    let tag = seal(&mut data);
    data.extend_from_slice(&tag);
    data
}

fn aead(c: &mut Criterion) {
    let ring = ring_key();
    let rc = ChaCha20Poly1305::new(&KEY.into());
    let reference = sealed(|d| ring_seal(&ring, 1, d));
    assert_eq!(reference, sealed(|d| rustcrypto_seal(&rc, 1, d)));
    #[cfg(feature = "aws-lc")]
    let aws = aws::key();
    #[cfg(feature = "aws-lc")]
    assert_eq!(reference, sealed(|d| aws::seal(&aws, 1, d)));

    let mut g = c.benchmark_group("chacha20poly1305_1400B");
    g.throughput(Throughput::Bytes(PAYLOAD as u64));
    let mut buf = vec![0xab; PAYLOAD];
    g.bench_function("seal_ring", |b| {
        b.iter(|| ring_seal(&ring, 1, black_box(&mut buf)))
    });
    g.bench_function("seal_rustcrypto", |b| {
        b.iter(|| rustcrypto_seal(&rc, 1, black_box(&mut buf)))
    });
    #[cfg(feature = "aws-lc")]
    g.bench_function("seal_aws_lc", |b| {
        b.iter(|| aws::seal(&aws, 1, black_box(&mut buf)))
    });

    // Opening decrypts in place: each iteration starts from a fresh copy of the sealed packet
    // (the copy, about 1% of an open, is in every row alike).
    let mut work = reference.clone();
    g.bench_function("open_ring", |b| {
        b.iter(|| {
            work.copy_from_slice(&reference);
            ring_open(&ring, 1, black_box(&mut work))
        })
    });
    g.bench_function("open_rustcrypto", |b| {
        b.iter(|| {
            work.copy_from_slice(&reference);
            rustcrypto_open(&rc, 1, black_box(&mut work))
        })
    });
    #[cfg(feature = "aws-lc")]
    g.bench_function("open_aws_lc", |b| {
        b.iter(|| {
            work.copy_from_slice(&reference);
            aws::open(&aws, 1, black_box(&mut work))
        })
    });
    g.finish();
}

criterion_group!(benches, aead);
criterion_main!(benches);
