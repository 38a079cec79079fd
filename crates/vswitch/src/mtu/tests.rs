use super::*;
use crate::captured::TCP_SYN;

/// An RFC 1071 sum written apart from the code under test: 64-bit accumulate, fold once.
fn fold_sum(chunks: &[&[u8]]) -> u16 {
    let bytes: Vec<u8> = chunks.concat();
    let mut sum: u64 = 0;
    for (i, b) in bytes.iter().enumerate() {
        sum += if i % 2 == 0 {
            u64::from(*b) << 8
        } else {
            u64::from(*b)
        };
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Whether the TCP checksum of the IPv4 `packet` verifies (sums to 0xffff).
fn tcp_checksum_ok(packet: &[u8]) -> bool {
    let ihl = usize::from(packet[0] & 0x0f) * 4;
    let tcp = &packet[ihl..];
    let pseudo = [
        &packet[12..20],
        &[0, IPPROTO_TCP],
        &(tcp.len() as u16).to_be_bytes(),
    ]
    .concat();
    fold_sum(&[&pseudo, tcp]) == 0xffff
}

/// Fills in the full TCP checksum (the capture holds an offloaded, partial one).
fn with_tcp_checksum(mut packet: Vec<u8>) -> Vec<u8> {
    let ihl = usize::from(packet[0] & 0x0f) * 4;
    packet[ihl + 16..ihl + 18].copy_from_slice(&[0, 0]);
    let tcp_len = packet.len() - ihl;
    let pseudo = [
        &packet[12..20],
        &[0, IPPROTO_TCP],
        &(tcp_len as u16).to_be_bytes(),
    ]
    .concat();
    let sum = !fold_sum(&[&pseudo, &packet[ihl..]]);
    packet[ihl + 16..ihl + 18].copy_from_slice(&sum.to_be_bytes());
    packet
}

fn syn_packet() -> Vec<u8> {
    with_tcp_checksum(TCP_SYN[ETH_HEADER_LEN..].to_vec())
}

fn mss_of(packet: &[u8]) -> u16 {
    let ihl = usize::from(packet[0] & 0x0f) * 4;
    let tcp = &packet[ihl..];
    let mut at = 20;
    while at < usize::from(tcp[12] >> 4) * 4 {
        match tcp[at] {
            1 => at += 1,
            2 => return be16(tcp, at + 2),
            _ => at += usize::from(tcp[at + 1]),
        }
    }
    panic!("no MSS option")
}

#[test]
fn a_syn_mss_is_clamped_with_a_correct_checksum() {
    let mut p = syn_packet();
    assert!(tcp_checksum_ok(&p));
    assert_eq!(mss_of(&p), 1460);
    assert!(clamp_mss(&mut p, 1380));
    assert_eq!(mss_of(&p), 1380);
    assert!(
        tcp_checksum_ok(&p),
        "incremental update must match a full sum"
    );
    // Everything but the MSS value and the checksum is untouched.
    let orig = syn_packet();
    let diff: Vec<usize> = (0..p.len()).filter(|&i| p[i] != orig[i]).collect();
    assert!(
        diff.iter().all(|&i| [36, 37, 42, 43].contains(&i)),
        "{diff:?}"
    );
}

#[test]
fn an_mss_at_an_odd_offset_is_clamped_with_a_correct_checksum() {
    // NOP, MSS 1460, NOP, NOP, NOP: the MSS value starts at byte 23 of the TCP header.
    let mut p = syn_packet();
    let ihl = 20;
    let opts = [1, 2, 4, 0x05, 0xb4, 1, 1, 1];
    p.truncate(ihl + 20);
    p.extend_from_slice(&opts);
    p[ihl + 12] = (((20 + opts.len()) / 4) << 4) as u8;
    let len = p.len() as u16;
    p[2..4].copy_from_slice(&len.to_be_bytes());
    let mut p = with_tcp_checksum(p);
    assert!(clamp_mss(&mut p, 1380));
    assert_eq!(mss_of(&p), 1380);
    assert!(tcp_checksum_ok(&p));
}

#[test]
fn a_smaller_mss_and_non_syns_are_left_alone() {
    let mut p = syn_packet();
    assert!(!clamp_mss(&mut p, 1460), "equal");
    assert!(!clamp_mss(&mut p, 9000), "already smaller");
    assert_eq!(p, syn_packet());
    let mut ack = syn_packet();
    ack[20 + 13] = 0x10; // ACK only
    let before = ack.clone();
    assert!(!clamp_mss(&mut ack, 1000));
    assert_eq!(ack, before);
    let mut udp = syn_packet();
    udp[9] = 17;
    assert!(!clamp_mss(&mut udp, 1000));
    let mut later_fragment = syn_packet();
    later_fragment[6..8].copy_from_slice(&0x0001u16.to_be_bytes());
    assert!(!clamp_mss(&mut later_fragment, 1000));
}

#[test]
fn malformed_tcp_options_are_left_alone_without_panics() {
    // An option length running past the header, a zero length, a truncated MSS.
    for opts in [[2u8, 40, 5, 0xb4], [3, 0, 0, 0], [1, 1, 1, 2]] {
        let mut p = syn_packet();
        p.truncate(40);
        p.extend_from_slice(&opts);
        p[32] = 6 << 4;
        let len = p.len() as u16;
        p[2..4].copy_from_slice(&len.to_be_bytes());
        let before = p.clone();
        assert!(!clamp_mss(&mut p, 1000), "{opts:?}");
        assert_eq!(p, before);
    }
    let p = syn_packet();
    for n in 0..p.len() {
        let mut cut = p[..n].to_vec();
        let _ = clamp_mss(&mut cut, 1000);
        let _ = Fragments::new(&cut, 576);
        let _ = emit_frag_needed(
            &mut [0u8; FRAG_NEEDED_MAX_LEN],
            ([2; 6], [4; 6]),
            Ipv4Addr::LOCALHOST,
            1420,
            &cut,
        );
    }
}

/// An IPv4 UDP packet of `total` bytes with `options` (a multiple of 4 long), DF as given;
/// the payload counts up so every byte's place is checkable.
fn udp_packet(total: usize, options: &[u8], df: bool) -> Vec<u8> {
    let ihl = 20 + options.len();
    let mut p = vec![0u8; total];
    p[0] = 0x40 | (ihl / 4) as u8;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
    if df {
        p[6] = 0x40;
    }
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&[10, 201, 0, 11]);
    p[16..20].copy_from_slice(&[10, 201, 0, 31]);
    p[20..ihl].copy_from_slice(options);
    for (i, b) in p[ihl..].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let sum = !fold_sum(&[&p[..ihl]]);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    p
}

fn fragments(packet: &[u8], mtu: u16) -> Vec<Vec<u8>> {
    let mut f = Fragments::new(packet, mtu).expect("fragmentable");
    let mut buf = vec![0u8; usize::from(mtu)];
    let mut out = Vec::new();
    while let Some(len) = f.next_into(&mut buf) {
        out.push(buf[..len].to_vec());
        assert!(out.len() < 100, "runaway");
    }
    out
}

/// Reassembles fragments the way a receiver does: by offset, checking every header.
fn reassemble(frags: &[Vec<u8>]) -> (Vec<u8>, Vec<u8>) {
    let mut data = Vec::new();
    let mut first_header = Vec::new();
    for (i, f) in frags.iter().enumerate() {
        let ihl = usize::from(f[0] & 0x0f) * 4;
        assert_eq!(usize::from(be16(f, 2)), f.len(), "total length");
        assert_eq!(
            fold_sum(&[&f[..ihl]]),
            0xffff,
            "header checksum of fragment {i}"
        );
        assert_eq!(be16(f, 4), 0x1234, "identification kept");
        let word = be16(f, 6);
        let offset = usize::from(word & 0x1fff) * 8;
        let more = word & IPV4_MF != 0;
        assert_eq!(more, i + 1 < frags.len(), "MF on all but the last");
        if more {
            assert_eq!((f.len() - ihl) % 8, 0, "non-last data is a multiple of 8");
        }
        assert_eq!(offset, data.len(), "fragments are contiguous");
        if i == 0 {
            first_header = f[..ihl].to_vec();
        }
        data.extend_from_slice(&f[ihl..]);
    }
    (first_header, data)
}

#[test]
fn fragments_reassemble_to_the_original() {
    for (total, mtu) in [
        (1500, 1420),
        (1500, 576),
        (1421, 1420),
        (4001, 1000),
        (1029, 68),
    ] {
        let p = udp_packet(total, &[], false);
        let frags = fragments(&p, mtu);
        assert!(frags.len() >= 2, "{total}/{mtu}");
        assert!(frags.iter().all(|f| f.len() <= usize::from(mtu)));
        let (header, data) = reassemble(&frags);
        assert_eq!(data, p[20..], "{total}/{mtu}");
        assert_eq!(header[..2], p[..2]);
        assert_eq!(header[8..10], p[8..10], "TTL and protocol");
        assert_eq!(header[12..20], p[12..20], "addresses");
    }
}

#[test]
fn a_packet_that_fits_is_one_unchanged_fragment() {
    let p = udp_packet(1000, &[], false);
    let frags = fragments(&p, 1420);
    assert_eq!(frags, vec![p]);
}

#[test]
fn only_copied_options_reach_later_fragments() {
    // Record route (7, not copied, 7 bytes + NOP) and a copied option (0x82, 4 bytes).
    let options = [7, 7, 4, 0, 0, 0, 0, 1, 0x82, 4, 0xab, 0xcd];
    let p = udp_packet(1500, &options, false);
    let frags = fragments(&p, 600);
    assert_eq!(frags[0][20..32], p[20..32], "the first keeps every option");
    for f in &frags[1..] {
        assert_eq!(f[0] & 0x0f, 6, "20 + 4 bytes of copied options");
        assert_eq!(f[20..24], [0x82, 4, 0xab, 0xcd]);
    }
    let (_, data) = reassemble(&frags);
    assert_eq!(data, p[32..]);
}

#[test]
fn a_fragment_of_a_fragment_keeps_its_place_and_mf() {
    // A middle fragment of something larger: offset 1000 bytes (125 units), MF set.
    let mut p = udp_packet(1500, &[], false);
    p[6..8].copy_from_slice(&(IPV4_MF | 125).to_be_bytes());
    let frags = fragments(&p, 1000);
    assert_eq!(frags.len(), 2);
    assert_eq!(be16(&frags[0], 6), IPV4_MF | 125);
    assert_eq!(be16(&frags[1], 6), IPV4_MF | (125 + (1000 - 20) / 8) as u16);
}

#[test]
fn df_malformed_and_tiny_mtus_are_refused() {
    assert!(
        Fragments::new(&udp_packet(1500, &[], true), 1420).is_none(),
        "DF"
    );
    assert!(
        Fragments::new(&udp_packet(1500, &[], false), 27).is_none(),
        "MTU < 28"
    );
    let mut bad = udp_packet(1500, &[0x82, 9, 0, 0], false);
    assert!(
        Fragments::new(&bad, 1420).is_none(),
        "option past the header"
    );
    bad[2..4].copy_from_slice(&2000u16.to_be_bytes());
    assert!(
        Fragments::new(&bad, 1420).is_none(),
        "total length past the buffer"
    );
    let whole = udp_packet(1500, &[], false);
    let mut f = Fragments::new(&whole, 1420).unwrap();
    assert_eq!(
        f.next_into(&mut [0u8; 100]),
        None,
        "a short buffer is refused"
    );
}

#[test]
fn frag_needed_quotes_the_header_and_carries_the_mtu() {
    let p = udp_packet(1500, &[], true);
    let mut buf = [0u8; FRAG_NEEDED_MAX_LEN];
    let host = [2, 0, 0, 0, 0, 11];
    let agent = [0xfe, 0xfd, 1, 2, 3, 4];
    let service = Ipv4Addr::new(10, 201, 0, 1);
    let len = emit_frag_needed(&mut buf, (host, agent), service, 1420, &p).unwrap();
    assert_eq!(len, 14 + 20 + 8 + 20 + 8);
    let f = &buf[..len];
    assert_eq!(
        (&f[0..6], &f[6..12], be16(f, 12)),
        (&host[..], &agent[..], 0x0800)
    );
    let ip = &f[14..];
    assert_eq!(fold_sum(&[&ip[..20]]), 0xffff, "IPv4 header checksum");
    assert_eq!(usize::from(be16(ip, 2)), len - 14);
    assert_eq!(ip[9], IPPROTO_ICMP);
    assert_eq!(ip[12..16], [10, 201, 0, 1], "from the service address");
    assert_eq!(ip[16..20], [10, 201, 0, 11], "to the sender");
    let icmp = &ip[20..];
    assert_eq!(fold_sum(&[icmp]), 0xffff, "ICMP checksum");
    assert_eq!(
        (icmp[0], icmp[1]),
        (3, 4),
        "unreachable, fragmentation needed"
    );
    assert_eq!(be16(icmp, 6), 1420, "next-hop MTU (RFC 1191)");
    assert_eq!(icmp[8..], p[..28], "the header and 8 bytes of the original");
}

#[test]
fn frag_needed_is_never_sent_about_icmp_errors_or_to_broadcasts() {
    let mut buf = [0u8; FRAG_NEEDED_MAX_LEN];
    let macs = ([2, 0, 0, 0, 0, 11], [0xfe, 0xfd, 1, 2, 3, 4]);
    let mut icmp_error = udp_packet(1500, &[], true);
    icmp_error[9] = IPPROTO_ICMP;
    icmp_error[20] = 3;
    let src = Ipv4Addr::new(10, 201, 0, 1);
    assert_eq!(
        emit_frag_needed(&mut buf, macs, src, 1420, &icmp_error),
        None
    );
    icmp_error[20] = 8; // an echo request does get one
    assert!(emit_frag_needed(&mut buf, macs, src, 1420, &icmp_error).is_some());
    let from_nowhere = {
        let mut p = udp_packet(1500, &[], true);
        p[12..16].copy_from_slice(&[0, 0, 0, 0]);
        p
    };
    assert_eq!(
        emit_frag_needed(&mut buf, macs, src, 1420, &from_nowhere),
        None
    );
    let p = udp_packet(1500, &[], true);
    assert_eq!(
        emit_frag_needed(&mut buf[..60], macs, src, 1420, &p),
        None,
        "short buffer"
    );
}

mod switch {
    use super::*;
    use crate::{Action, Config, DropReason, Mode, Switch};
    use std::time::Instant;

    /// The virtual clock's origin (the switch only compares instants it is given).
    fn t0() -> Instant {
        #[allow(clippy::disallowed_methods)]
        Instant::now()
    }

    const HOST_MAC: Mac = [2, 0, 0, 0, 0, 11];
    const REMOTE_MAC: Mac = [0xfe, 0xfd, 1, 2, 3, 4];

    /// A router whose LAN host 10.201.0.11 sends to member 7's 10.201.0.31.
    fn router() -> Switch<u32> {
        let mut config = Config::interface(
            Ipv4Addr::UNSPECIFIED,
            "10.201.0.0/16".parse().unwrap(),
            [2, 0, 0, 0, 0, 1],
            REMOTE_MAC,
        );
        config.mode = Mode::Router;
        let mut sw = Switch::new(config);
        sw.set_peer_addresses(7, &[Ipv4Addr::new(10, 201, 0, 31)]);
        sw
    }

    fn frame(packet: &[u8]) -> Vec<u8> {
        [&REMOTE_MAC[..], &HOST_MAC, &[0x08, 0], packet].concat()
    }

    #[test]
    fn a_full_size_df_packet_gets_frag_needed_from_the_service_address() {
        let mut sw = router();
        let mut reply = [0u8; crate::MIN_REPLY_BUF];
        let mut f = frame(&udp_packet(1500, &[], true));
        let Action::ToTap { len } = sw.handle_tap_frame(t0(), &mut f, &mut reply) else {
            panic!("expected an ICMP error");
        };
        let ip = &reply[14..len];
        assert_eq!(reply[..6], HOST_MAC);
        assert_eq!(ip[12..16], [10, 201, 0, 1]);
        assert_eq!((ip[20], ip[21], be16(ip, 26)), (3, 4, 1420));
        assert_eq!(sw.counters().frag_needed, 1);
        assert_eq!(sw.counters().arp_replies, 0);
    }

    #[test]
    fn a_full_size_packet_without_df_is_fragmented() {
        let mut sw = router();
        let mut reply = [0u8; crate::MIN_REPLY_BUF];
        let mut f = frame(&udp_packet(1500, &[], false));
        assert_eq!(
            sw.handle_tap_frame(t0(), &mut f, &mut reply),
            Action::Fragment {
                peer: Some(7),
                packet: 14..1514,
                mtu: 1420
            }
        );
        assert_eq!((sw.counters().fragmented, sw.counters().to_peer), (1, 1));
        // A packet that fits goes whole.
        let mut f = frame(&udp_packet(1420, &[], true));
        assert_eq!(
            sw.handle_tap_frame(t0(), &mut f, &mut reply),
            Action::ToPeer {
                peer: 7,
                packet: 14..1434
            }
        );
    }

    #[test]
    fn a_syn_is_clamped_on_its_way_out_and_in() {
        let mut sw = router();
        let mut reply = [0u8; crate::MIN_REPLY_BUF];
        let mut f = frame(&syn_packet());
        let action = sw.handle_tap_frame(t0(), &mut f, &mut reply);
        assert!(
            matches!(action, Action::ToPeer { peer: 7, .. }),
            "{action:?}"
        );
        assert_eq!(mss_of(&f[14..]), 1380);
        assert!(tcp_checksum_ok(&f[14..]));
        // The member's SYN-ACK to the LAN host (known once it sent).
        let mut back = syn_packet();
        back[12..16].copy_from_slice(&[10, 201, 0, 31]);
        back[16..20].copy_from_slice(&[10, 201, 0, 11]);
        let back = with_tcp_checksum(back);
        let mut buf = vec![0u8; crate::HEADROOM + back.len()];
        buf[crate::HEADROOM..].copy_from_slice(&back);
        let action = sw.handle_peer_packet(t0(), &mut buf, back.len());
        assert!(matches!(action, Action::ToTap { .. }), "{action:?}");
        assert_eq!(mss_of(&buf[14..]), 1380);
        assert!(tcp_checksum_ok(&buf[14..]));
        assert_eq!(sw.counters().mss_clamped, 2);
    }

    #[test]
    fn an_oversized_df_broadcast_is_a_counted_drop() {
        let mut sw = router();
        let mut reply = [0u8; crate::MIN_REPLY_BUF];
        let mut p = udp_packet(1500, &[], true);
        p[16..20].copy_from_slice(&[10, 201, 255, 255]);
        let mut f = frame(&p);
        f[..6].copy_from_slice(&[0xff; 6]);
        let now = t0();
        assert_eq!(
            sw.handle_tap_frame(now, &mut f, &mut reply),
            Action::Drop(DropReason::TooBig)
        );
        assert_eq!(sw.counters().drops(DropReason::TooBig), 1);
    }
}
