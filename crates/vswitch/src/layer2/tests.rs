#![allow(clippy::disallowed_methods)] // tests start the clock from a real instant

use std::time::{Duration, Instant};

use super::*;
use crate::wire::ARP_LEN;

const DEVICE: Mac = [0x02, 0, 0, 0, 0, 1];
const LAN_A: Mac = [0x02, 0, 0, 0, 0, 0x0a];
const LAN_B: Mac = [0x02, 0, 0, 0, 0, 0x0b];
const FAR: Mac = [0x02, 0, 0, 0, 0, 0xf0];
const FAR2: Mac = [0x02, 0, 0, 0, 0, 0xf2];
const BROADCAST: Mac = [0xff; 6];
const MULTICAST: Mac = [0x01, 0x80, 0xc2, 0, 0, 0x0e];

fn config(mode: L2Mode) -> L2Config {
    L2Config {
        mode,
        device_mac: DEVICE,
        flood_rate: 10,
        tunnel_mtu: 1420,
        vlan: None,
        ethertypes: Vec::new(),
        max_local: MAX_MACS,
    }
}

fn frame(dst: Mac, src: Mac, ethertype: u16, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len.max(ETH_HEADER_LEN)];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&ethertype.to_be_bytes());
    f
}

#[test]
fn a_frame_of_any_ethertype_goes_to_the_member_that_announced_its_destination() {
    let t0 = Instant::now();
    let mut sw = Layer2::new(config(L2Mode::Router), t0);
    sw.set_peer_macs(t0, 7u32, &[FAR]);
    for ethertype in [0x88b5u16, 0x8100, 0x88cc, 0x0800, 0x86dd] {
        let f = frame(FAR, LAN_A, ethertype, 64);
        assert_eq!(sw.handle_tap_frame(t0, &f), L2Action::ToPeer(7));
    }
    assert_eq!(sw.counters().to_peer, 5);
    assert_eq!(sw.local_macs(), vec![LAN_A]);
    assert!(sw.take_local_changed());
    assert!(!sw.take_local_changed());
}

#[test]
fn broadcast_multicast_and_unknown_unicast_flood_within_the_rate() {
    let t0 = Instant::now();
    let mut sw = Layer2::<u32>::new(config(L2Mode::Router), t0);
    let mut flooded = 0;
    for i in 0..30 {
        let dst = match i % 3 {
            0 => BROADCAST,
            1 => MULTICAST,
            _ => FAR2,
        };
        if sw.handle_tap_frame(t0, &frame(dst, LAN_A, 0x88b5, 60)) == L2Action::Flood {
            flooded += 1;
        }
    }
    // The bucket holds 10 at first and refills at 10 a second.
    assert_eq!(flooded, 10);
    assert_eq!(sw.counters().dropped(L2Drop::FloodRateLimited), 20);
    assert_eq!(sw.counters().floods_out + sw.counters().unknown_unicast, 10);
    let later = t0 + Duration::from_millis(500);
    let more = (0..10)
        .filter(|_| {
            sw.handle_tap_frame(later, &frame(BROADCAST, LAN_A, 0x0806, 60)) == L2Action::Flood
        })
        .count();
    assert_eq!(more, 5);
}

#[test]
fn a_frame_between_two_hosts_on_this_side_stays_here() {
    let t0 = Instant::now();
    let mut sw = Layer2::<u32>::new(config(L2Mode::Router), t0);
    sw.handle_tap_frame(t0, &frame(BROADCAST, LAN_B, 0x0806, 60));
    assert_eq!(
        sw.handle_tap_frame(t0, &frame(LAN_B, LAN_A, 0x0800, 60)),
        L2Action::Drop(L2Drop::Local)
    );
}

#[test]
fn frames_from_members_go_to_the_tap_and_floods_are_limited_per_member() {
    let t0 = Instant::now();
    let mut sw = Layer2::new(config(L2Mode::Router), t0);
    sw.handle_tap_frame(t0, &frame(BROADCAST, LAN_A, 0x0806, 60));
    // Unicast to a MAC here: always.
    for _ in 0..50 {
        assert_eq!(
            sw.handle_peer_frame(t0, 1u32, &frame(LAN_A, FAR, 0x88b5, 60)),
            L2Action::ToTap
        );
    }
    // A storm from member 1 is held to its rate; member 2's broadcast still passes.
    let storm = (0..100)
        .filter(|_| {
            sw.handle_peer_frame(t0, 1, &frame(BROADCAST, FAR, 0x88b5, 60)) == L2Action::ToTap
        })
        .count();
    assert_eq!(storm, 10);
    assert_eq!(
        sw.handle_peer_frame(t0, 2, &frame(BROADCAST, FAR2, 0x0806, 60)),
        L2Action::ToTap
    );
    assert_eq!(sw.counters().floods_in, 11);
    assert_eq!(sw.counters().dropped(L2Drop::FloodRateLimited), 90);
}

#[test]
fn interface_mode_takes_only_frames_for_the_device_or_a_group() {
    let t0 = Instant::now();
    let mut sw = Layer2::new(config(L2Mode::Interface), t0);
    assert_eq!(sw.local_macs(), vec![DEVICE]);
    assert!(sw.take_local_changed());
    assert_eq!(
        sw.handle_peer_frame(t0, 1u32, &frame(DEVICE, FAR, 0x0800, 60)),
        L2Action::ToTap
    );
    assert_eq!(
        sw.handle_peer_frame(t0, 1, &frame(LAN_B, FAR, 0x0800, 60)),
        L2Action::Drop(L2Drop::NotForUs)
    );
    assert_eq!(
        sw.handle_peer_frame(t0, 1, &frame(MULTICAST, FAR, 0x88cc, 60)),
        L2Action::ToTap
    );
    // The device's MAC never ages out.
    sw.handle_timeout(t0 + MAC_AGE * 3);
    assert_eq!(sw.local_macs(), vec![DEVICE]);
    assert_eq!(sw.poll_timeout(), None);
}

#[test]
fn a_members_frame_from_a_mac_on_this_side_is_a_conflict() {
    let t0 = Instant::now();
    let mut sw = Layer2::new(config(L2Mode::Router), t0);
    sw.handle_tap_frame(t0, &frame(BROADCAST, LAN_A, 0x0806, 60));
    assert_eq!(
        sw.handle_peer_frame(t0, 1u32, &frame(BROADCAST, LAN_A, 0x0806, 60)),
        L2Action::Drop(L2Drop::Conflict)
    );
    // An announcement of it while it is heard here is not taken either.
    sw.set_peer_macs(t0, 1, &[LAN_A, FAR]);
    assert_eq!(sw.remote_count(), 1);
    assert_eq!(sw.local_macs(), vec![LAN_A]);
    assert_eq!(sw.counters().mac_conflicts, 2);
}

#[test]
fn a_mac_moves_each_way_at_most_once_a_second() {
    let t0 = Instant::now();
    let mut sw = Layer2::new(config(L2Mode::Router), t0);
    sw.set_peer_macs(t0, 1u32, &[FAR]);
    // A VM that moved here: learned, and no longer the member's.
    assert_eq!(
        sw.handle_tap_frame(t0, &frame(BROADCAST, FAR, 0x8035, 60)),
        L2Action::Flood
    );
    assert_eq!(sw.counters().moves, 1);
    assert!(sw.take_local_changed());
    assert_eq!(sw.local_macs(), vec![FAR]);
    assert_eq!(sw.remote_count(), 0);
    // The member still announces it (it has not heard our announcement yet): ours.
    let t1 = t0 + Duration::from_millis(300);
    sw.set_peer_macs(t1, 1, &[FAR]);
    assert_eq!(sw.local_macs(), vec![FAR]);
    // It moves back there: once this side has been silent for a second, the member's,
    // without waiting for its next announcement.
    let t2 = t0 + RELEARN_INTERVAL;
    assert_eq!(sw.poll_timeout(), Some(t2));
    sw.handle_timeout(t2);
    assert!(sw.local_macs().is_empty());
    assert!(sw.take_local_changed());
    assert_eq!(sw.counters().moves, 2);
    assert_eq!(
        sw.handle_tap_frame(t2, &frame(FAR, LAN_A, 0x0800, 60)),
        L2Action::ToPeer(1)
    );
    // A loop brings it back here within a second of the last move: counted, dropped,
    // still the member's.
    let t3 = t2 + Duration::from_millis(500);
    sw.handle_timeout(t3);
    assert_eq!(
        sw.handle_tap_frame(t3, &frame(BROADCAST, FAR, 0x8035, 60)),
        L2Action::Drop(L2Drop::Conflict)
    );
    assert_eq!(sw.remote_count(), 1);
    // A second later it may move again.
    let t4 = t3 + RELEARN_INTERVAL;
    assert_eq!(
        sw.handle_tap_frame(t4, &frame(BROADCAST, FAR, 0x8035, 60)),
        L2Action::Flood
    );
    assert_eq!(sw.counters().moves, 3);
}

#[test]
fn macs_on_this_side_age_out_and_are_announced_again() {
    let t0 = Instant::now();
    let mut sw = Layer2::<u32>::new(config(L2Mode::Router), t0);
    sw.handle_tap_frame(t0, &frame(BROADCAST, LAN_A, 0x0806, 60));
    sw.handle_tap_frame(
        t0 + Duration::from_secs(100),
        &frame(BROADCAST, LAN_B, 0x0806, 60),
    );
    sw.take_local_changed();
    assert_eq!(sw.poll_timeout(), Some(t0 + MAC_AGE));
    sw.handle_timeout(t0 + MAC_AGE);
    assert_eq!(sw.local_macs(), vec![LAN_B]);
    assert!(sw.take_local_changed());
}

#[test]
fn malformed_and_oversized_frames_are_counted() {
    let t0 = Instant::now();
    let mut sw = Layer2::<u32>::new(config(L2Mode::Router), t0);
    assert_eq!(
        sw.handle_tap_frame(t0, &[0u8; 13]),
        L2Action::Drop(L2Drop::Malformed)
    );
    assert_eq!(
        sw.handle_tap_frame(t0, &frame(FAR, MULTICAST, 0x0800, 60)),
        L2Action::Drop(L2Drop::Malformed)
    );
    assert_eq!(
        sw.handle_tap_frame(t0, &frame(FAR, LAN_A, 0x0800, MAX_FRAME + 1)),
        L2Action::Drop(L2Drop::TooBig)
    );
    assert_eq!(
        sw.handle_peer_frame(t0, 1, &[0u8; 5]),
        L2Action::Drop(L2Drop::Malformed)
    );
    assert_eq!(sw.counters().dropped(L2Drop::Malformed), 3);
}

#[test]
fn the_table_is_bounded() {
    let t0 = Instant::now();
    let mut sw = Layer2::<u32>::new(config(L2Mode::Router), t0);
    for i in 0..(MAX_MACS + 10) as u32 {
        let b = i.to_be_bytes();
        let src = [0x02, 0, b[0], b[1], b[2], b[3]];
        sw.handle_tap_frame(t0, &frame(LAN_A, src, 0x0800, 60));
    }
    assert_eq!(sw.local_macs().len(), MAX_MACS);
    assert!(sw.counters().table_full >= 10);
}

#[test]
fn the_envelope_round_trips_and_refuses_what_is_not_one() {
    let f = frame(FAR, LAN_A, 0x88b5, 100);
    let mut packet = vec![0u8; ENVELOPE_LEN + f.len()];
    emit_envelope(&mut packet, f.len()).unwrap();
    packet[ENVELOPE_LEN..].copy_from_slice(&f);
    assert_eq!(envelope_frame(&packet), Some(&f[..]));
    // A valid IPv4 header checksum.
    assert_eq!(crate::udp::checksum(0, &packet[..20]), 0xffff);
    // Link padding after the envelope is not part of the frame.
    let mut padded = packet.clone();
    padded.extend_from_slice(&[0; 8]);
    assert_eq!(envelope_frame(&padded), Some(&f[..]));
    for (at, value) in [(0, 0x46u8), (9, 17), (12, 10), (20, 0x40)] {
        let mut bad = packet.clone();
        bad[at] = value;
        assert_eq!(envelope_frame(&bad), None, "byte {at}");
    }
    assert_eq!(envelope_frame(&packet[..ENVELOPE_LEN + 13]), None);
    assert!(emit_envelope(&mut [0u8; 10], 100).is_none());
    assert!(emit_envelope(&mut packet, 70_000).is_none());
}

/// The tunnel packets `sw` sends a frame in: whole, or its pieces.
fn envelopes(sw: &mut Layer2<u32>, f: &[u8]) -> Vec<Vec<u8>> {
    match sw.pieces(f.len()) {
        None => {
            let mut p = vec![0u8; ENVELOPE_LEN + f.len()];
            emit_envelope(&mut p, f.len()).unwrap();
            p[ENVELOPE_LEN..].copy_from_slice(f);
            vec![p]
        }
        Some(pieces) => pieces
            .clone()
            .map(|(start, end)| {
                let mut p = vec![0u8; 20 + end - start];
                pieces.header(&mut p, start, end).unwrap();
                Pieces::copy(&mut p[20..], f, start, end).unwrap();
                p
            })
            .collect(),
    }
}

/// Feeds tunnel packets to `sw` as from member `from`; the last action.
fn deliver(sw: &mut Layer2<u32>, now: Instant, from: u32, packets: &[Vec<u8>]) -> L2Action<u32> {
    let mut last = L2Action::Drop(L2Drop::Malformed);
    for p in packets {
        last = match parse_envelope(p).expect("an envelope") {
            Envelope::Whole(f) => sw.handle_peer_frame(now, from, f),
            Envelope::Fragment(piece) => sw.handle_peer_piece(now, from, piece, |_| true),
        };
    }
    last
}

#[test]
fn a_frame_larger_than_the_tunnel_goes_in_pieces_and_comes_back_whole() {
    let t0 = Instant::now();
    let (mut a, mut b) = (
        Layer2::<u32>::new(config(L2Mode::Router), t0),
        Layer2::<u32>::new(config(L2Mode::Router), t0),
    );
    b.handle_tap_frame(t0, &frame(BROADCAST, LAN_B, 0x0806, 60));
    b.set_peer_macs(t0, 1, &[LAN_A]);
    for len in [1398, 1399, 1514, 1518, 4000, 9000, MAX_FRAME] {
        let mut f = frame(LAN_B, LAN_A, 0x8100, len);
        for (i, byte) in f.iter_mut().enumerate().skip(14) {
            *byte = i as u8;
        }
        let packets = envelopes(&mut a, &f);
        assert_eq!(packets.len() > 1, len > 1398, "{len} bytes");
        for p in &packets {
            assert!(p.len() <= 1420, "a piece of {} bytes", p.len());
            assert_eq!(crate::udp::checksum(0, &p[..20]), 0xffff);
        }
        assert_eq!(deliver(&mut b, t0, 1, &packets), L2Action::ToTap, "{len}");
        if packets.len() > 1 {
            assert_eq!(b.assembled(), &f[..], "{len} bytes");
        }
    }
    assert_eq!(a.counters().fragmented, 6);
    assert_eq!(b.counters().reassembled, 6);
    assert_eq!(b.counters().dropped(L2Drop::Reassembly), 0);
}

#[test]
fn pieces_out_of_order_late_or_from_an_unannounced_mac_are_dropped() {
    let t0 = Instant::now();
    let mut a = Layer2::<u32>::new(config(L2Mode::Router), t0);
    let mut b = Layer2::<u32>::new(config(L2Mode::Router), t0);
    b.set_peer_macs(t0, 1, &[LAN_A]);
    let f = frame(BROADCAST, LAN_A, 0x88b5, 4000);
    let packets = envelopes(&mut a, &f);
    assert_eq!(packets.len(), 3);
    // Reordered: the frame is lost, and nothing is held.
    let reordered = [packets[0].clone(), packets[2].clone(), packets[1].clone()];
    assert_ne!(deliver(&mut b, t0, 1, &reordered), L2Action::ToTap);
    assert!(b.partials.is_empty());
    // The last piece too late.
    assert_eq!(deliver(&mut b, t0, 1, &packets[..2]), L2Action::Held);
    assert_eq!(b.poll_timeout(), Some(t0 + REASSEMBLY_TIMEOUT));
    let late = t0 + REASSEMBLY_TIMEOUT;
    assert_eq!(
        deliver(&mut b, late, 1, &packets[2..]),
        L2Action::Drop(L2Drop::Reassembly)
    );
    // From a member that did not announce the frame's source.
    let packets = envelopes(&mut a, &f);
    assert_eq!(
        deliver(&mut b, late, 2, &packets),
        L2Action::Drop(L2Drop::Reassembly)
    );
    // Whole again once in order.
    let packets = envelopes(&mut a, &f);
    assert_eq!(deliver(&mut b, late, 1, &packets), L2Action::ToTap);
    assert!(b.counters().dropped(L2Drop::Reassembly) >= 4);
}

#[test]
fn reassembly_is_bounded() {
    let t0 = Instant::now();
    let mut a = Layer2::<u32>::new(config(L2Mode::Router), t0);
    let mut b = Layer2::<u32>::new(config(L2Mode::Router), t0);
    let f = frame(BROADCAST, LAN_A, 0x88b5, 3000);
    // Each member starts a frame and never ends it: at most MAX_REASSEMBLIES are held.
    for member in 0..(MAX_REASSEMBLIES as u32 + 10) {
        let packets = envelopes(&mut a, &f);
        deliver(&mut b, t0, member, &packets[..1]);
    }
    assert_eq!(b.partials.len(), MAX_REASSEMBLIES);
    assert_eq!(b.counters().dropped(L2Drop::Reassembly), 10);
    // Frames whose pieces did not all come in time are dropped, each counted.
    b.handle_timeout(t0 + REASSEMBLY_TIMEOUT);
    assert!(b.partials.is_empty());
    assert_eq!(
        b.counters().dropped(L2Drop::Reassembly),
        10 + MAX_REASSEMBLIES as u64
    );
    // One member has at most MAX_REASSEMBLIES_PER_MEMBER under way: more replace its oldest.
    for _ in 0..MAX_REASSEMBLIES_PER_MEMBER + 2 {
        let packets = envelopes(&mut a, &f);
        deliver(&mut b, t0, 0, &packets[..1]);
    }
    assert_eq!(b.partials.len(), MAX_REASSEMBLIES_PER_MEMBER);
    assert_eq!(
        b.counters().dropped(L2Drop::Reassembly),
        10 + MAX_REASSEMBLIES as u64 + 2
    );
    // A member gone takes its frames under way with it.
    b.remove_peer(0);
    assert!(b.partials.is_empty());
}

#[test]
fn two_frames_of_one_member_whose_pieces_interleave_both_come_back() {
    // Two workers of the sending agent may seal a member's frames at the same time.
    let t0 = Instant::now();
    let mut a = Layer2::<u32>::new(config(L2Mode::Router), t0);
    let mut b = Layer2::<u32>::new(config(L2Mode::Router), t0);
    b.set_peer_macs(t0, 1, &[LAN_A]);
    let x = frame(BROADCAST, LAN_A, 0x88b5, 3000);
    let mut y = frame(BROADCAST, LAN_A, 0x88b6, 3000);
    y[20] = 7;
    let (px, py) = (envelopes(&mut a, &x), envelopes(&mut a, &y));
    let mut whole = Vec::new();
    for p in [&px[0], &py[0], &px[1], &py[1], &px[2], &py[2]] {
        if deliver(&mut b, t0, 1, std::slice::from_ref(p)) == L2Action::ToTap {
            whole.push(b.assembled().to_vec());
        }
    }
    assert_eq!(whole, vec![x, y]);
    assert_eq!(b.counters().dropped(L2Drop::Reassembly), 0);
}

#[test]
fn a_piece_that_lies_is_refused() {
    let f = frame(BROADCAST, LAN_A, 0x88b5, 3000);
    let mut a = Layer2::<u32>::new(config(L2Mode::Router), Instant::now());
    let pieces = envelopes(&mut a, &f);
    // A middle piece that is not a whole number of 8-byte units.
    let mut odd = pieces[0].clone();
    odd.pop();
    let len = odd.len() as u16;
    odd[2..4].copy_from_slice(&len.to_be_bytes());
    assert_eq!(parse_envelope(&odd), None);
    // An empty last piece.
    let mut empty = pieces[2][..20].to_vec();
    empty[2..4].copy_from_slice(&20u16.to_be_bytes());
    assert_eq!(parse_envelope(&empty), None);
    assert!(Pieces::new(100, 27, 0).is_none());
}

#[test]
fn a_trunk_takes_only_its_vlan_untagged_and_tags_what_it_writes() {
    let t0 = Instant::now();
    let mut sw = Layer2::<u32>::new(
        L2Config {
            vlan: Some(100),
            ..config(L2Mode::Router)
        },
        t0,
    );
    sw.set_peer_macs(t0, 1, &[FAR]);
    let inner = frame(FAR, LAN_A, 0x88b5, 64);
    let mut tagged = vec![0u8; inner.len() + VLAN_TAG_LEN];
    assert_eq!(tag_into(&mut tagged, &inner, 100), Some(inner.len() + 4));
    assert_eq!(&tagged[12..16], &[0x81, 0x00, 0x00, 0x64]);
    // Ours: untagged in place, then switched as any frame.
    let mut ours = tagged.clone();
    let untagged = sw.untag(&mut ours).expect("VLAN 100");
    assert_eq!(untagged, &inner[..]);
    assert_eq!(sw.handle_tap_frame(t0, untagged), L2Action::ToPeer(1));
    // A priority in the tag does not change the VLAN.
    let mut prio = tagged.clone();
    prio[14] |= 0xa0;
    assert!(sw.untag(&mut prio).is_some());
    // Another VLAN's, an untagged one, a runt: not this namespace's.
    let mut other = vec![0u8; inner.len() + VLAN_TAG_LEN];
    tag_into(&mut other, &inner, 200).unwrap();
    assert!(sw.untag(&mut other).is_none());
    assert!(sw.untag(&mut inner.clone()).is_none());
    assert!(sw.untag(&mut tagged[..15].to_vec()).is_none());
    assert_eq!(sw.counters().dropped(L2Drop::OtherVlan), 3);
    // What a member sends is written tagged, whether moved in place or copied.
    let mut room = vec![0u8; 36 + inner.len()];
    room[36..].copy_from_slice(&inner);
    assert_eq!(
        tag_in_place(&mut room, 36, inner.len(), 100),
        Some(inner.len() + 4)
    );
    assert_eq!(&room[..inner.len() + 4], &tagged[..]);
    assert_eq!(tag_in_place(&mut room, 3, 20, 100), None);
    assert_eq!(tag_into(&mut [0u8; 10], &inner, 100), None);
    // Without a VLAN the frame is taken as it is.
    let mut plain = Layer2::<u32>::new(config(L2Mode::Router), t0);
    let mut f = tagged.clone();
    assert_eq!(plain.untag(&mut f).map(|f| f.to_vec()), Some(tagged));
}

#[test]
fn a_contested_mac_heard_here_again_stays_until_silent() {
    let t0 = Instant::now();
    let mut sw = Layer2::<u32>::new(config(L2Mode::Router), t0);
    sw.handle_tap_frame(t0, &frame(BROADCAST, LAN_A, 0x0806, 60));
    sw.set_peer_macs(t0, 1, &[LAN_A]);
    // Still talking here: it stays ours.
    let t1 = t0 + Duration::from_millis(900);
    sw.handle_tap_frame(t1, &frame(BROADCAST, LAN_A, 0x0806, 60));
    sw.handle_timeout(t0 + RELEARN_INTERVAL);
    assert_eq!(sw.local_macs(), vec![LAN_A]);
    assert_eq!(sw.poll_timeout(), Some(t1 + RELEARN_INTERVAL));
    // The member stops announcing it: no longer contested, ours for good.
    sw.set_peer_macs(t1, 1, &[]);
    sw.handle_timeout(t1 + RELEARN_INTERVAL);
    assert_eq!(sw.local_macs(), vec![LAN_A]);
    // A member gone takes its claims with it.
    sw.set_peer_macs(t1, 2, &[LAN_A]);
    sw.remove_peer(2);
    sw.handle_timeout(t1 + RELEARN_INTERVAL * 2);
    assert_eq!(sw.local_macs(), vec![LAN_A]);
}

/// An ARP frame (request or reply) from `mac`/`ip` about `target`.
fn arp(op: u16, mac: Mac, ip: [u8; 4], target_mac: Mac, target: [u8; 4]) -> Vec<u8> {
    let mut f = vec![0u8; ETH_HEADER_LEN + ARP_LEN];
    let dst = if op == 1 { BROADCAST } else { target_mac };
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    f[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, op as u8]);
    f[22..28].copy_from_slice(&mac);
    f[28..32].copy_from_slice(&ip);
    f[32..38].copy_from_slice(&target_mac);
    f[38..42].copy_from_slice(&target);
    f
}

#[test]
fn arp_for_a_members_host_is_answered_here_and_not_flooded() {
    let t0 = Instant::now();
    let mut sw = Layer2::<u32>::new(config(L2Mode::Router), t0);
    sw.set_peer_macs(t0, 1, &[FAR]);
    let (a, far) = ([10, 0, 0, 1], [10, 0, 0, 9]);
    let request = arp(1, LAN_A, a, [0; 6], far);
    // Nothing known: flooded, and the far host's reply teaches the binding.
    assert_eq!(sw.handle_tap_frame(t0, &request), L2Action::Flood);
    let reply = arp(2, FAR, far, LAN_A, a);
    assert_eq!(sw.handle_peer_frame(t0, 1, &reply), L2Action::ToTap);
    // The next resolution stays here: answered with the far host's MAC.
    assert_eq!(sw.handle_tap_frame(t0, &request), L2Action::Answer);
    let answer = sw.answer().to_vec();
    assert_eq!(answer, reply, "the answer is the far host's own reply");
    assert_eq!(
        (sw.counters().arp_suppressed, sw.counters().arp_flooded),
        (1, 1)
    );
    // A probe (sender 0.0.0.0) must reach the holder: flooded.
    let probe = arp(1, LAN_A, [0; 4], [0; 6], far);
    assert_eq!(sw.handle_tap_frame(t0, &probe), L2Action::Flood);
    // An ARP whose sender MAC is not the frame's source teaches nothing (both MACs are a
    // member's, so only that check refuses it).
    sw.set_peer_macs(t0, 1, &[FAR, FAR2]);
    let mut lying = arp(2, FAR2, [10, 0, 0, 7], LAN_A, a);
    lying[6..12].copy_from_slice(&FAR);
    sw.handle_peer_frame(t0, 1, &lying);
    assert_eq!(
        sw.handle_tap_frame(t0, &arp(1, LAN_A, a, [0; 6], [10, 0, 0, 7])),
        L2Action::Flood
    );
    // A host on this side speaking for the address (a failover): never answered for the
    // member's host again until it speaks.
    assert_eq!(sw.handle_tap_frame(t0, &request), L2Action::Answer);
    let takeover = arp(2, LAN_B, far, LAN_A, a);
    sw.handle_tap_frame(t0, &takeover);
    assert_eq!(sw.handle_tap_frame(t0, &request), L2Action::Flood);
    sw.handle_peer_frame(t0, 1, &reply);
    // One host binds at most MAX_BINDINGS_PER_MAC addresses.
    for i in 0..MAX_BINDINGS_PER_MAC as u8 + 4 {
        sw.handle_peer_frame(t0, 1, &arp(2, FAR2, [10, 1, 0, i], LAN_A, a));
    }
    let answered = (0..MAX_BINDINGS_PER_MAC as u8 + 4)
        .filter(|i| {
            sw.handle_tap_frame(t0, &arp(1, LAN_A, a, [0; 6], [10, 1, 0, *i])) == L2Action::Answer
        })
        .count();
    assert_eq!(answered, MAX_BINDINGS_PER_MAC);
    // Stale, or its MAC no longer a member's: flooded again.
    let later = t0 + MAC_AGE;
    assert_eq!(sw.handle_tap_frame(later, &request), L2Action::Flood);
    sw.handle_peer_frame(later, 1, &reply);
    sw.set_peer_macs(later, 1, &[]);
    assert_eq!(sw.handle_tap_frame(later, &request), L2Action::Flood);
}

#[test]
fn only_the_ethertypes_listed_cross_either_way() {
    let t0 = Instant::now();
    let mut sw = Layer2::<u32>::new(
        L2Config {
            ethertypes: vec![0x0800, 0x0806],
            ..config(L2Mode::Router)
        },
        t0,
    );
    sw.set_peer_macs(t0, 1, &[FAR]);
    assert_eq!(
        sw.handle_tap_frame(t0, &frame(FAR, LAN_A, 0x0800, 60)),
        L2Action::ToPeer(1)
    );
    assert_eq!(
        sw.handle_tap_frame(t0, &frame(FAR, LAN_A, 0x88b5, 60)),
        L2Action::Drop(L2Drop::EtherType)
    );
    assert_eq!(
        sw.handle_peer_frame(t0, 1, &frame(LAN_A, FAR, 0x86dd, 60)),
        L2Action::Drop(L2Drop::EtherType)
    );
    assert_eq!(
        sw.handle_peer_frame(t0, 1, &frame(LAN_A, FAR, 0x0806, 60)),
        L2Action::ToTap
    );
    // A tagged frame is judged by what it carries.
    let inner = frame(FAR, LAN_A, 0x0800, 60);
    let mut tagged = vec![0u8; 64];
    tag_into(&mut tagged, &inner, 7).unwrap();
    assert_eq!(sw.handle_tap_frame(t0, &tagged), L2Action::ToPeer(1));
    let mut other = vec![0u8; 64];
    tag_into(&mut other, &frame(FAR, LAN_A, 0x88cc, 60), 7).unwrap();
    assert_eq!(
        sw.handle_tap_frame(t0, &other),
        L2Action::Drop(L2Drop::EtherType)
    );
    assert_eq!(sw.counters().dropped(L2Drop::EtherType), 3);
    // 802.3 frames (a length, not a type) only when `llc` is listed.
    let bpdu = frame(MULTICAST, LAN_A, 0x0026, 60);
    assert_eq!(
        sw.handle_tap_frame(t0, &bpdu),
        L2Action::Drop(L2Drop::EtherType)
    );
    let mut llc = Layer2::<u32>::new(
        L2Config {
            ethertypes: vec![ETHERTYPE_LLC],
            ..config(L2Mode::Router)
        },
        t0,
    );
    assert_eq!(llc.handle_tap_frame(t0, &bpdu), L2Action::Flood);
}

fn v6(s: &str) -> std::net::Ipv6Addr {
    s.parse().unwrap()
}

#[test]
fn neighbour_solicitations_for_a_members_host_are_answered_here_and_not_flooded() {
    use crate::ndp::{self, emit_advertisement, emit_solicitation, ADVERTISEMENT_FRAME_LEN};
    let t0 = Instant::now();
    let mut sw = Layer2::<u32>::new(config(L2Mode::Router), t0);
    sw.set_peer_macs(t0, 1, &[FAR]);
    let (a, far) = (v6("fd00::a"), v6("fd00::f0"));
    let mut request = [0u8; ADVERTISEMENT_FRAME_LEN];
    emit_solicitation(&mut request, (a, LAN_A), far).unwrap();
    // Nothing known: flooded; the far host's advertisement teaches the binding.
    assert_eq!(sw.handle_tap_frame(t0, &request), L2Action::Flood);
    let mut reply = [0u8; ADVERTISEMENT_FRAME_LEN];
    let router = ndp::NaFlags {
        router: true,
        override_cache: true,
    };
    emit_advertisement(&mut reply, (far, FAR), (a, LAN_A), router).unwrap();
    assert_eq!(sw.handle_peer_frame(t0, 1, &reply), L2Action::ToTap);
    // The next resolution stays here, answered as the far host answered (R flag too).
    assert_eq!(sw.handle_tap_frame(t0, &request), L2Action::Answer);
    assert_eq!(sw.answer(), &reply[..], "the far host's own advertisement");
    assert_eq!(
        (sw.counters().nd_suppressed, sw.counters().nd_flooded),
        (1, 1)
    );
    assert_eq!(sw.counters().arp_suppressed + sw.counters().arp_flooded, 0);
    // A duplicate address probe (from ::) must reach the holder: flooded.
    let mut dad = [0u8; ADVERTISEMENT_FRAME_LEN];
    emit_solicitation(&mut dad, (std::net::Ipv6Addr::UNSPECIFIED, LAN_A), far).unwrap();
    let dad = strip_option(&dad);
    assert!(ndp::parse(&dad).is_some());
    assert_eq!(sw.handle_tap_frame(t0, &dad), L2Action::Flood);
    // An advertisement whose link-layer address is not the frame's source teaches nothing.
    sw.set_peer_macs(t0, 1, &[FAR, FAR2]);
    let other = v6("fd00::f2");
    let mut lying = [0u8; ADVERTISEMENT_FRAME_LEN];
    emit_advertisement(&mut lying, (other, FAR2), (a, LAN_A), HOST).unwrap();
    lying[6..12].copy_from_slice(&FAR);
    sw.handle_peer_frame(t0, 1, &lying);
    let mut ask_other = [0u8; ADVERTISEMENT_FRAME_LEN];
    emit_solicitation(&mut ask_other, (a, LAN_A), other).unwrap();
    assert_eq!(sw.handle_tap_frame(t0, &ask_other), L2Action::Flood);
    // A host on this side advertising the address (a failover): flooded from then on.
    let mut takeover = [0u8; ADVERTISEMENT_FRAME_LEN];
    emit_advertisement(&mut takeover, (far, LAN_B), (a, LAN_A), HOST).unwrap();
    sw.handle_tap_frame(t0, &takeover);
    assert_eq!(sw.handle_tap_frame(t0, &request), L2Action::Flood);
    // Stale, or its MAC no longer a member's: flooded.
    sw.handle_peer_frame(t0, 1, &reply);
    assert_eq!(sw.handle_tap_frame(t0, &request), L2Action::Answer);
    assert_eq!(sw.handle_tap_frame(t0 + MAC_AGE, &request), L2Action::Flood);
    sw.handle_peer_frame(t0, 1, &reply);
    sw.set_peer_macs(t0, 1, &[]);
    assert_eq!(sw.handle_tap_frame(t0, &request), L2Action::Flood);
}

/// A host's own advertisement: not a router, overriding.
const HOST: crate::ndp::NaFlags = crate::ndp::NaFlags {
    router: false,
    override_cache: true,
};

#[test]
fn two_members_hosts_speaking_for_one_address_are_answered_for_by_neither() {
    use crate::ndp::{emit_advertisement, emit_solicitation, ADVERTISEMENT_FRAME_LEN};
    let t0 = Instant::now();
    let mut sw = Layer2::<u32>::new(config(L2Mode::Router), t0);
    sw.set_peer_macs(t0, 1, &[FAR]);
    sw.set_peer_macs(t0, 2, &[FAR2]);
    let (a, far) = (v6("fd00::a"), v6("fd00::f0"));
    let mut request = [0u8; ADVERTISEMENT_FRAME_LEN];
    emit_solicitation(&mut request, (a, LAN_A), far).unwrap();
    let mut owner = [0u8; ADVERTISEMENT_FRAME_LEN];
    emit_advertisement(&mut owner, (far, FAR), (a, LAN_A), HOST).unwrap();
    sw.handle_peer_frame(t0, 1, &owner);
    assert_eq!(sw.handle_tap_frame(t0, &request), L2Action::Answer);
    // Member 2's host says the address is its own (unsolicited, to all nodes): the switch
    // no longer answers with either MAC, so the request reaches the real owner.
    let mut claim = [0u8; ADVERTISEMENT_FRAME_LEN];
    emit_advertisement(&mut claim, (far, FAR2), (a, LAN_A), HOST).unwrap();
    sw.handle_peer_frame(t0, 2, &claim);
    assert_eq!(sw.handle_tap_frame(t0, &request), L2Action::Flood);
    assert_eq!(sw.counters().neighbour_conflicts, 1);
    // However often either speaks again, for MAC_AGE.
    for (from, frame) in [(2, &claim), (2, &claim), (1, &owner)] {
        sw.handle_peer_frame(t0, from, frame);
        assert_eq!(sw.handle_tap_frame(t0, &request), L2Action::Flood);
    }
    let later = t0 + MAC_AGE;
    sw.handle_peer_frame(later, 1, &owner);
    assert_eq!(sw.handle_tap_frame(later, &request), L2Action::Answer);
    // The same for ARP.
    let (a4, far4) = ([10, 0, 0, 1], [10, 0, 0, 9]);
    sw.handle_peer_frame(t0, 1, &arp(2, FAR, far4, LAN_A, a4));
    sw.handle_peer_frame(t0, 2, &arp(2, FAR2, far4, LAN_A, a4));
    assert_eq!(
        sw.handle_tap_frame(t0, &arp(1, LAN_A, a4, [0; 6], far4)),
        L2Action::Flood
    );
    assert_eq!(sw.counters().neighbour_conflicts, 2);
}

/// A solicitation from `::` as a kernel sends it: no link-layer option, checksum redone.
fn strip_option(ns: &[u8]) -> Vec<u8> {
    let mut f = ns[..ns.len() - 8].to_vec();
    f[18..20].copy_from_slice(&24u16.to_be_bytes());
    f[56..58].fill(0);
    let mut pseudo = f[22..54].to_vec();
    pseudo.extend_from_slice(&[0, 0, 0, 24, 0, 0, 0, 58]);
    pseudo.extend_from_slice(&f[54..]);
    let sum = !crate::udp::checksum(0, &pseudo);
    f[56..58].copy_from_slice(&sum.to_be_bytes());
    f
}
