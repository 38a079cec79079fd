use super::*;

/// An RFC 1071 sum written apart from the code under test: byte by byte, fold once.
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

const SRC_MAC: [u8; 6] = [0x02, 0x48, 0xae, 0x81, 0xab, 0x18];
const DST_MAC: [u8; 6] = [0xfe, 0xfd, 0x76, 0xa2, 0x83, 0xb0];

/// The pseudo-header of the transport segment `l4..` of `frame`.
fn pseudo(frame: &[u8], l4: usize, protocol: u8) -> Vec<u8> {
    let len = (frame.len() - l4) as u16;
    let addresses = if be16(frame, 12) == ETHERTYPE_IPV6 {
        &frame[22..54]
    } else {
        &frame[26..34]
    };
    [addresses, &[0, protocol], &len.to_be_bytes()].concat()
}

/// A super-frame as the kernel hands it to a TAP with TSO on: Ethernet, IPv4 or IPv6,
/// TCP with `options`, `len` payload bytes, the IP length of the whole, and in the TCP
/// checksum field the folded pseudo-header sum (`CHECKSUM_PARTIAL`).
fn tcp_super_frame(ipv6: bool, options: &[u8], len: usize, flags: u8) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&DST_MAC);
    f.extend_from_slice(&SRC_MAC);
    let tcp_len = 20 + options.len() + len;
    if ipv6 {
        f.extend_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        f.extend_from_slice(&[0x60, 0x01, 0x23, 0x45]);
        f.extend_from_slice(&(tcp_len as u16).to_be_bytes());
        f.extend_from_slice(&[IPPROTO_TCP, 64]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    } else {
        f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        let total = (20 + tcp_len) as u16;
        f.extend_from_slice(&[0x45, 0x00]);
        f.extend_from_slice(&total.to_be_bytes());
        // ID 0xfffe: the segments' IDs wrap past 0xffff.
        f.extend_from_slice(&[0xff, 0xfe, 0x40, 0x00, 64, IPPROTO_TCP, 0, 0]);
        f.extend_from_slice(&[10, 201, 0, 1, 10, 201, 0, 2]);
        let sum = !fold_sum(&[&f[14..34]]);
        f[24..26].copy_from_slice(&sum.to_be_bytes());
    }
    let l4 = f.len();
    f.extend_from_slice(&[0xc3, 0x50, 0x14, 0x51]); // ports 50000 -> 5201
    f.extend_from_slice(&0xffff_f000u32.to_be_bytes()); // seq: wraps within the frame
    f.extend_from_slice(&0x0102_0304u32.to_be_bytes()); // ack
    f.push((((20 + options.len()) / 4) << 4) as u8);
    f.push(flags);
    f.extend_from_slice(&[0x01, 0xf5, 0, 0, 0, 0]); // window, checksum, urgent
    f.extend_from_slice(options);
    f.extend((0..len).map(|i| (i * 7 + i / 251) as u8));
    let partial = fold_sum(&[&pseudo(&f, l4, IPPROTO_TCP)]);
    f[l4 + 16..l4 + 18].copy_from_slice(&partial.to_be_bytes());
    f
}

fn tso_header(ipv6: bool, frame: &[u8], mss: u16) -> VirtioHeader {
    let l4 = if ipv6 { 54 } else { 34 };
    VirtioHeader {
        flags: F_NEEDS_CSUM,
        gso_type: if ipv6 { GSO_TCPV6 } else { GSO_TCPV4 },
        hdr_len: (l4 + usize::from(frame[l4 + 12] >> 4) * 4) as u16,
        gso_size: mss,
        csum_start: l4 as u16,
        csum_offset: 16,
    }
}

fn segments_of(header: &VirtioHeader, frame: &[u8]) -> Vec<Vec<u8>> {
    let mut segments = Segments::new(header, frame).unwrap();
    let count = segments.count();
    let mut out = Vec::new();
    let mut buf = vec![0u8; 2000];
    while let Some(len) = segments.next_into(&mut buf) {
        out.push(buf[..len].to_vec());
    }
    assert_eq!(out.len(), count);
    out
}

/// Timestamps (kind 8) and two NOPs: what Linux puts on every data segment.
const TIMESTAMPS: [u8; 12] = [1, 1, 8, 10, 0, 0, 0x12, 0x34, 0, 0, 0x56, 0x78];

fn check_tcp_segments(ipv6: bool, options: &[u8], len: usize, mss: u16, flags: u8) {
    let frame = tcp_super_frame(ipv6, options, len, flags);
    let header = tso_header(ipv6, &frame, mss);
    let segments = segments_of(&header, &frame);
    let l4 = if ipv6 { 54 } else { 34 };
    let payload_at = l4 + 20 + options.len();
    assert_eq!(segments.len(), len.div_ceil(usize::from(mss)));
    let mut data = Vec::new();
    for (i, s) in segments.iter().enumerate() {
        let last = i == segments.len() - 1;
        let payload = &s[payload_at..];
        if !last {
            assert_eq!(payload.len(), usize::from(mss), "segment {i}");
        }
        assert_eq!(&s[..12], &frame[..12], "MACs");
        assert_eq!(&s[l4 + 20..payload_at], options, "options copied");
        if ipv6 {
            assert_eq!(usize::from(be16(s, 18)), s.len() - 54);
        } else {
            assert_eq!(usize::from(be16(s, 16)), s.len() - 14);
            assert_eq!(be16(s, 18), 0xfffeu16.wrapping_add(i as u16), "IPv4 ID");
            assert_eq!(fold_sum(&[&s[14..34]]), 0xffff, "IPv4 header checksum");
        }
        assert_eq!(
            fold_sum(&[&pseudo(s, l4, IPPROTO_TCP), &s[l4..]]),
            0xffff,
            "TCP checksum of segment {i}"
        );
        let seq = be32(s, l4 + 4);
        assert_eq!(seq, 0xffff_f000u32.wrapping_add(data.len() as u32));
        let f = s[l4 + 13];
        let expect_fin_psh = if last { flags & (TCP_FIN | TCP_PSH) } else { 0 };
        assert_eq!(f & (TCP_FIN | TCP_PSH), expect_fin_psh, "FIN/PSH on {i}");
        let expect_cwr = if i == 0 { flags & TCP_CWR } else { 0 };
        assert_eq!(f & TCP_CWR, expect_cwr, "CWR on {i}");
        assert_eq!(f & TCP_ACK, TCP_ACK);
        data.extend_from_slice(payload);
    }
    assert_eq!(data, frame[payload_at..], "payload in order");
}

#[test]
fn tcp4_super_frame_of_odd_size_is_cut_at_the_mss() {
    check_tcp_segments(false, &[], 65535 - 40, 1380, TCP_ACK | TCP_PSH);
    check_tcp_segments(false, &[], 4001, 1000, TCP_ACK);
}

#[test]
fn tcp_options_are_copied_and_fin_psh_stay_on_the_last_cwr_on_the_first() {
    check_tcp_segments(
        false,
        &TIMESTAMPS,
        3 * 1368 + 17,
        1368,
        TCP_ACK | TCP_PSH | TCP_FIN | TCP_CWR,
    );
}

#[test]
fn an_exact_multiple_of_the_mss_ends_with_a_full_segment() {
    check_tcp_segments(false, &TIMESTAMPS, 4 * 1368, 1368, TCP_ACK | TCP_PSH);
}

#[test]
fn tcp6_super_frame_is_cut_with_payload_lengths() {
    check_tcp_segments(true, &TIMESTAMPS, 10_000, 1348, TCP_ACK | TCP_PSH);
}

#[test]
fn a_super_frame_smaller_than_the_mss_is_one_segment() {
    check_tcp_segments(false, &[], 300, 1380, TCP_ACK | TCP_PSH);
}

#[test]
fn udp_super_frame_is_cut_into_datagrams_with_checksums() {
    let mut f = Vec::new();
    f.extend_from_slice(&DST_MAC);
    f.extend_from_slice(&SRC_MAC);
    f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    let len = 3000;
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&((20 + 8 + len) as u16).to_be_bytes());
    f.extend_from_slice(&[
        0,
        7,
        0,
        0,
        64,
        IPPROTO_UDP,
        0,
        0,
        10,
        201,
        0,
        1,
        10,
        201,
        0,
        2,
    ]);
    f.extend_from_slice(&[0x30, 0x39, 0x00, 0x35]);
    f.extend_from_slice(&((8 + len) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend((0..len).map(|i| i as u8));
    let header = VirtioHeader {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_UDP_L4,
        hdr_len: 42,
        gso_size: 1200,
        csum_start: 34,
        csum_offset: 6,
    };
    let segments = segments_of(&header, &f);
    assert_eq!(
        segments.iter().map(Vec::len).collect::<Vec<_>>(),
        [42 + 1200, 42 + 1200, 42 + 600]
    );
    for (i, s) in segments.iter().enumerate() {
        assert_eq!(usize::from(be16(s, 38)), s.len() - 34, "UDP length");
        assert_eq!(be16(s, 18), 7 + i as u16, "IPv4 ID");
        assert_eq!(fold_sum(&[&s[14..34]]), 0xffff);
        assert_eq!(fold_sum(&[&pseudo(s, 34, IPPROTO_UDP), &s[34..]]), 0xffff);
    }
}

#[test]
fn a_partial_checksum_is_completed_in_place() {
    // A pure ACK with timestamps as the kernel hands it over: partial checksum.
    let mut frame = tcp_super_frame(false, &TIMESTAMPS, 0, TCP_ACK);
    let header = VirtioHeader {
        flags: F_NEEDS_CSUM,
        csum_start: 34,
        csum_offset: 16,
        ..VirtioHeader::PLAIN
    };
    assert_ne!(
        fold_sum(&[&pseudo(&frame, 34, IPPROTO_TCP), &frame[34..]]),
        0xffff
    );
    complete_checksum(&header, &mut frame).unwrap();
    assert_eq!(
        fold_sum(&[&pseudo(&frame, 34, IPPROTO_TCP), &frame[34..]]),
        0xffff
    );
    // A checksum field past the end is an error, not a panic.
    let outside = VirtioHeader {
        csum_offset: 60,
        ..header
    };
    assert_eq!(
        complete_checksum(&outside, &mut frame),
        Err(Error::ChecksumOutside)
    );
}

#[test]
fn the_virtio_header_round_trips_and_bad_types_are_errors() {
    let header = VirtioHeader {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_TCPV4 | GSO_ECN,
        hdr_len: 66,
        gso_size: 1368,
        csum_start: 34,
        csum_offset: 16,
    };
    let mut buf = [0u8; VIRTIO_HEADER_LEN];
    header.emit(&mut buf).unwrap();
    assert_eq!(VirtioHeader::parse(&buf), Ok(header));
    assert_eq!(header.gso(), Ok(Gso::Tcp));
    assert_eq!(VirtioHeader::parse(&buf[..9]), Err(Error::Truncated));
    let udp = VirtioHeader {
        gso_type: GSO_UDP,
        ..header
    };
    assert_eq!(udp.gso(), Err(Error::UnknownGsoType(GSO_UDP)));
    let zero = VirtioHeader {
        gso_size: 0,
        ..header
    };
    let frame = tcp_super_frame(false, &[], 3000, TCP_ACK);
    assert_eq!(
        Segments::new(&zero, &frame).unwrap_err(),
        Error::ZeroGsoSize
    );
    // A TCP header claiming more than the packet holds.
    let mut short = frame.clone();
    short[34 + 12] = 0xf0;
    short[16..18].copy_from_slice(&50u16.to_be_bytes());
    assert_eq!(
        Segments::new(&header, &short).unwrap_err(),
        Error::Truncated
    );
}

/// Offers every frame, writing what comes out as the agent does.
fn coalesce(frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
    coalesce_with(Coalescer::new(), frames)
}

fn coalesce_with(mut gro: Coalescer, frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for f in frames {
        loop {
            match gro.handle_frame(f) {
                Offer::Held => break,
                Offer::Busy => out.push(gro.poll_frame().unwrap().to_vec()),
                Offer::Refused => {
                    let mut plain = vec![0u8; VIRTIO_HEADER_LEN];
                    plain.extend_from_slice(f);
                    out.push(plain);
                    break;
                }
            }
        }
    }
    out.extend(gro.poll_frame().map(<[u8]>::to_vec));
    out
}

#[test]
fn segments_coalesce_back_into_the_super_frame() {
    for ipv6 in [false, true] {
        let frame = tcp_super_frame(ipv6, &TIMESTAMPS, 20_000 + 3, TCP_ACK | TCP_PSH);
        let header = tso_header(ipv6, &frame, 1368);
        let segments = segments_of(&header, &frame);
        let out = coalesce(&segments);
        assert_eq!(out.len(), 1, "one write");
        let merged = VirtioHeader::parse(&out[0]).unwrap();
        assert_eq!(merged, header, "GSO header as the kernel's");
        assert_eq!(
            &out[0][VIRTIO_HEADER_LEN..],
            &frame[..],
            "super-frame as the kernel's"
        );
    }
}

#[test]
fn a_gap_another_flow_or_other_flags_start_a_new_write() {
    let frame = tcp_super_frame(false, &[], 5 * 1000, TCP_ACK);
    let header = tso_header(false, &frame, 1000);
    let s = segments_of(&header, &frame);
    // A lost segment: 0,1 then 3,4.
    let out = coalesce(&[s[0].clone(), s[1].clone(), s[3].clone(), s[4].clone()]);
    assert_eq!(out.len(), 2);
    // Another flow (other port) in between.
    let mut other = s[2].clone();
    other[34] ^= 1;
    let fixed = {
        let mut o = other.clone();
        o[50..52].copy_from_slice(&[0, 0]);
        let sum = !fold_sum(&[&pseudo(&o, 34, IPPROTO_TCP), &o[34..]]);
        o[50..52].copy_from_slice(&sum.to_be_bytes());
        o
    };
    let out = coalesce(&[s[0].clone(), s[1].clone(), fixed, s[2].clone()]);
    assert_eq!(out.len(), 3);
    // A frame with a bad checksum is written alone, as it came (the kernel drops it).
    let mut bad = s[2].clone();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    let out = coalesce(&[s[0].clone(), s[1].clone(), bad.clone()]);
    assert_eq!(out.len(), 2);
    assert_eq!(&out[1][VIRTIO_HEADER_LEN..], &bad[..]);
    assert_eq!(VirtioHeader::parse(&out[1]).unwrap(), VirtioHeader::PLAIN);
}

#[test]
fn ipv4_ids_must_count_up_and_a_short_segment_ends_the_super_frame() {
    let frame = tcp_super_frame(false, &[], 4 * 1000, TCP_ACK);
    let header = tso_header(false, &frame, 1000);
    let mut s = segments_of(&header, &frame);
    // The third segment's ID repeats the second's.
    let id = [s[1][18], s[1][19]];
    s[2][18..20].copy_from_slice(&id);
    s[2][24..26].copy_from_slice(&[0, 0]);
    let sum = !fold_sum(&[&s[2][14..34]]);
    s[2][24..26].copy_from_slice(&sum.to_be_bytes());
    // 0 and 1 together; 2 alone (its ID repeats); 3 alone (its ID is not 2's plus one).
    assert_eq!(coalesce(&s).len(), 3);

    // 1000, 400, then 1000 more: the short one closes the first write.
    let frame = tcp_super_frame(false, &[], 1400, TCP_ACK);
    let first = segments_of(&tso_header(false, &frame, 1000), &frame);
    let mut third = first[0].clone();
    third[38..42].copy_from_slice(&0xffff_f578u32.to_be_bytes()); // seq + 1400
    third[18..20].copy_from_slice(&0x0000u16.to_be_bytes()); // ID 0xfffe + 2
    third[24..26].copy_from_slice(&[0, 0]);
    let sum = !fold_sum(&[&third[14..34]]);
    third[24..26].copy_from_slice(&sum.to_be_bytes());
    third[50..52].copy_from_slice(&[0, 0]);
    let sum = !fold_sum(&[&pseudo(&third, 34, IPPROTO_TCP), &third[34..]]);
    third[50..52].copy_from_slice(&sum.to_be_bytes());
    let out = coalesce(&[first[0].clone(), first[1].clone(), third]);
    assert_eq!(out.len(), 2);
    assert_eq!(VirtioHeader::parse(&out[0]).unwrap().gso_size, 1000);
}

#[test]
fn non_tcp_and_control_frames_are_refused() {
    let syn = tcp_super_frame(false, &[], 0, TCP_SYN);
    let mut gro = Coalescer::new();
    assert_eq!(gro.handle_frame(&syn), Offer::Refused);
    assert_eq!(gro.handle_frame(&[0u8; 5]), Offer::Refused);
    let arp = crate::captured::ARP_REQUEST;
    assert_eq!(gro.handle_frame(&arp), Offer::Refused);
    assert!(gro.poll_frame().is_none());
}

#[test]
fn a_captured_tso_super_frame_segments_and_coalesces_back() {
    use crate::captured::{captured_payload, TSO4_HEADERS};
    let read = captured_payload(&TSO4_HEADERS, 5000, |i| (i * 13 + i / 251) as u8);
    let header = VirtioHeader::parse(&read).unwrap();
    assert_eq!((header.gso(), header.gso_size), (Ok(Gso::Tcp), 1000));
    let frame = &read[VIRTIO_HEADER_LEN..];
    let segments = segments_of(&header, frame);
    assert_eq!(segments.len(), 5);
    for (i, s) in segments.iter().enumerate() {
        assert_eq!(s.len(), 54 + 1000);
        assert_eq!(be16(s, 18), 0xc31b + i as u16, "IPv4 ID");
        assert_eq!(fold_sum(&[&s[14..34]]), 0xffff);
        assert_eq!(fold_sum(&[&pseudo(s, 34, IPPROTO_TCP), &s[34..]]), 0xffff);
        assert_eq!(be32(s, 38), 0x6c8b_1dfc + 1000 * i as u32);
        let psh = if i == 4 { TCP_PSH } else { 0 };
        assert_eq!(s[47], TCP_ACK | psh, "flags of {i}");
    }
    // The receiving agent writes them back as the kernel's own super-frame.
    let out = coalesce(&segments);
    assert_eq!(out.len(), 1);
    assert_eq!(VirtioHeader::parse(&out[0]).unwrap(), header);
    assert_eq!(&out[0][..], &read[..]);
}

#[test]
fn a_captured_uso_super_frame_is_cut_into_checked_datagrams() {
    use crate::captured::{captured_payload, USO4_HEADERS};
    let read = captured_payload(&USO4_HEADERS, 2500, |i| (i * 7) as u8);
    let header = VirtioHeader::parse(&read).unwrap();
    assert_eq!(header.gso(), Ok(Gso::Udp));
    let segments = segments_of(&header, &read[VIRTIO_HEADER_LEN..]);
    assert_eq!(
        segments.iter().map(Vec::len).collect::<Vec<_>>(),
        [42 + 1000, 42 + 1000, 42 + 500]
    );
    let mut data = Vec::new();
    for (i, s) in segments.iter().enumerate() {
        assert_eq!(be16(s, 18), 0xb96f + i as u16);
        assert_eq!(fold_sum(&[&s[14..34]]), 0xffff);
        assert_eq!(fold_sum(&[&pseudo(s, 34, IPPROTO_UDP), &s[34..]]), 0xffff);
        data.extend_from_slice(&s[42..]);
    }
    assert_eq!(data, read[52..]);
}

/// `count` UDP datagrams of `size` bytes (the last `last`), as the kernel cuts a USO
/// super-frame: the captured one's headers, IDs counting up.
fn udp_datagrams(count: usize, size: usize, last: usize) -> (Vec<u8>, Vec<Vec<u8>>) {
    use crate::captured::{captured_payload, USO4_HEADERS};
    let len = size * (count - 1) + last;
    let mut read = captured_payload(&USO4_HEADERS, len, |i| (i * 7 + i / 253) as u8);
    // The captured headers' IP and UDP lengths, for this payload.
    let ip = VIRTIO_HEADER_LEN + 14;
    read[ip + 2..ip + 4].copy_from_slice(&((20 + 8 + len) as u16).to_be_bytes());
    read[ip + 24..ip + 26].copy_from_slice(&((8 + len) as u16).to_be_bytes());
    let header = VirtioHeader::parse(&read).unwrap();
    let header = VirtioHeader {
        gso_size: size as u16,
        ..header
    };
    let segments = segments_of(&header, &read[VIRTIO_HEADER_LEN..]);
    assert_eq!(segments.len(), count);
    (read, segments)
}

#[test]
fn udp_datagrams_of_one_flow_coalesce_into_the_kernels_super_frame_where_the_tap_takes_uso() {
    use crate::captured::{captured_payload, USO4_HEADERS};
    let read = captured_payload(&USO4_HEADERS, 2500, |i| (i * 7) as u8);
    let header = VirtioHeader::parse(&read).unwrap();
    let segments = segments_of(&header, &read[VIRTIO_HEADER_LEN..]);
    let out = coalesce_with(Coalescer::new().with_udp(true), &segments);
    assert_eq!(out.len(), 1, "one write");
    let merged = VirtioHeader::parse(&out[0]).unwrap();
    assert_eq!(
        (
            merged.gso(),
            merged.gso_size,
            merged.csum_start,
            merged.csum_offset
        ),
        (Ok(Gso::Udp), header.gso_size, 34, 6)
    );
    assert_eq!(merged.hdr_len, 42);
    assert_eq!(
        &out[0][VIRTIO_HEADER_LEN..],
        &read[VIRTIO_HEADER_LEN..],
        "super-frame as the kernel's"
    );
    // Cut again, it gives the same datagrams.
    assert_eq!(segments_of(&merged, &out[0][VIRTIO_HEADER_LEN..]), segments);

    // Without USO on the TAP, each datagram is written as it came.
    let out = coalesce(&segments);
    assert_eq!(out.len(), segments.len());
    for (o, s) in out.iter().zip(&segments) {
        assert_eq!(VirtioHeader::parse(o).unwrap(), VirtioHeader::PLAIN);
        assert_eq!(&o[VIRTIO_HEADER_LEN..], &s[..]);
    }
}

#[test]
fn udp_super_frames_end_at_a_short_datagram_another_flow_or_64_datagrams() {
    let gro = || Coalescer::new().with_udp(true);
    // 70 datagrams of 64 bytes: 64 in the first write, 6 in the second.
    let (_, s) = udp_datagrams(70, 64, 64);
    let out = coalesce_with(gro(), &s);
    assert_eq!(out.len(), 2);
    let first = VirtioHeader::parse(&out[0]).unwrap();
    assert_eq!((first.gso(), first.gso_size), (Ok(Gso::Udp), 64));
    assert_eq!(out[0].len(), VIRTIO_HEADER_LEN + 42 + 64 * 64);
    let cut: Vec<_> = out
        .iter()
        .flat_map(|o| segments_of(&VirtioHeader::parse(o).unwrap(), &o[VIRTIO_HEADER_LEN..]))
        .collect();
    assert_eq!(cut, s, "the datagrams, in order");

    // 1000, 1000, 500 then more of the flow: the short one closes the write.
    let (_, mut s) = udp_datagrams(3, 1000, 500);
    let (_, more) = udp_datagrams(2, 1000, 1000);
    for (i, mut d) in more.into_iter().enumerate() {
        // IDs go on from the third's: only the short datagram ends the write.
        let id = be16(&s[2], 18).wrapping_add(1 + i as u16);
        d[18..20].copy_from_slice(&id.to_be_bytes());
        d[24..26].copy_from_slice(&[0, 0]);
        let sum = !fold_sum(&[&d[14..34]]);
        d[24..26].copy_from_slice(&sum.to_be_bytes());
        s.push(d);
    }
    let out = coalesce_with(gro(), &s);
    assert_eq!(out.len(), 2);
    let first = VirtioHeader::parse(&out[0]).unwrap();
    assert_eq!(segments_of(&first, &out[0][VIRTIO_HEADER_LEN..]), s[..3]);
    let second = VirtioHeader::parse(&out[1]).unwrap();
    assert_eq!(segments_of(&second, &out[1][VIRTIO_HEADER_LEN..]), s[3..]);

    // Another port in between starts a new write; a datagram without a checksum (IPv4
    // may send none) is written alone.
    let (_, s) = udp_datagrams(3, 1000, 1000);
    let mut other = s[1].clone();
    other[34] ^= 1;
    other[40..42].copy_from_slice(&[0, 0]);
    let sum = !fold_sum(&[&pseudo(&other, 34, IPPROTO_UDP), &other[34..]]);
    other[40..42].copy_from_slice(&sum.to_be_bytes());
    let out = coalesce_with(gro(), &[s[0].clone(), other, s[1].clone()]);
    assert_eq!(out.len(), 3);
    let mut unchecked = s[1].clone();
    unchecked[40..42].copy_from_slice(&[0, 0]);
    let out = coalesce_with(gro(), &[s[0].clone(), unchecked.clone(), s[2].clone()]);
    assert_eq!(out.len(), 3);
    assert_eq!(&out[1][VIRTIO_HEADER_LEN..], &unchecked[..]);
    assert_eq!(VirtioHeader::parse(&out[1]).unwrap(), VirtioHeader::PLAIN);
}

#[test]
fn a_vlan_tagged_super_frame_is_cut_into_tagged_segments() {
    // What a host's VLAN device hands a layer-2 namespace's TAP: the tag inline (802.1Q,
    // or 802.1ad outside it), the checksum offsets past it.
    for tags in [
        vec![0x81, 0x00, 0x00, 0x64],
        vec![0x88, 0xa8, 0x00, 0x0a, 0x81, 0x00, 0x00, 0x64],
    ] {
        for ipv6 in [false, true] {
            let plain = tcp_super_frame(ipv6, &TIMESTAMPS, 5000, TCP_ACK | TCP_PSH);
            let mut tagged = plain[..12].to_vec();
            tagged.extend_from_slice(&tags);
            tagged.extend_from_slice(&plain[12..]);
            let header = tso_header(ipv6, &plain, 1368);
            let shift = tags.len() as u16;
            let tagged_header = VirtioHeader {
                hdr_len: header.hdr_len + shift,
                csum_start: header.csum_start + shift,
                ..header
            };
            let expected = segments_of(&header, &plain);
            let got = segments_of(&tagged_header, &tagged);
            assert_eq!(got.len(), expected.len());
            for (g, e) in got.iter().zip(&expected) {
                assert_eq!(
                    &g[12..12 + tags.len()],
                    &tags[..],
                    "each segment keeps the tags"
                );
                let untagged = [&g[..12], &g[12 + tags.len()..]].concat();
                assert_eq!(&untagged, e, "the same segment, tagged");
            }
        }
    }
    // A tagged frame is never coalesced: it is written as it is.
    let plain = tcp_super_frame(false, &[], 1000, TCP_ACK);
    let mut tagged = plain[..12].to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x64]);
    tagged.extend_from_slice(&plain[12..]);
    assert_eq!(Coalescer::new().handle_frame(&tagged), Offer::Refused);
}
