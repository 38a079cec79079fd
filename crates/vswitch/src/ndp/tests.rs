use super::*;

/// What Linux 6.x sent on a veth when fd00::a (02:00:00:00:00:0a) pinged fd00::b
/// (02:00:00:00:00:0b), captured with tcpdump: the solicitation and its answer.
const LINUX_SOLICITATION: &str = "3333ff00000b02000000000a86dd6000000000203afffd00000000000000000000000000000aff0200000000000000000001ff00000b87007d7300000000fd00000000000000000000000000000b010102000000000a";
const LINUX_ADVERTISEMENT: &str = "02000000000a02000000000b86dd6000000000203afffd00000000000000000000000000000bfd00000000000000000000000000000a88001c7660000000fd00000000000000000000000000000b020102000000000b";

const A: Mac = [2, 0, 0, 0, 0, 0x0a];
/// What a host's own advertisement carries: not a router, overrides.
const HOST: NaFlags = NaFlags {
    router: false,
    override_cache: true,
};
const B: Mac = [2, 0, 0, 0, 0, 0x0b];

fn bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

fn ip(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

#[test]
fn a_kernel_solicitation_and_advertisement_are_read() {
    let ns = parse(&bytes(LINUX_SOLICITATION)).unwrap();
    assert_eq!(ns.source, ip("fd00::a"));
    assert_eq!(ns.destination, ip("ff02::1:ff00:b"));
    assert_eq!(
        ns.message,
        Message::Solicitation {
            target: ip("fd00::b"),
            link: Some(A)
        }
    );
    let na = parse(&bytes(LINUX_ADVERTISEMENT)).unwrap();
    assert_eq!(
        na.message,
        Message::Advertisement {
            target: ip("fd00::b"),
            link: Some(B),
            flags: HOST,
            solicited: true
        }
    );
}

#[test]
fn the_advertisement_built_is_the_kernels_byte_for_byte() {
    let mut buf = [0u8; ADVERTISEMENT_FRAME_LEN];
    let len = emit_advertisement(&mut buf, (ip("fd00::b"), B), (ip("fd00::a"), A), HOST);
    assert_eq!(len, Some(ADVERTISEMENT_FRAME_LEN));
    assert_eq!(buf.to_vec(), bytes(LINUX_ADVERTISEMENT));
    // A router's carries R, a proxy's no O, and still checks.
    let proxy_router = NaFlags {
        router: true,
        override_cache: false,
    };
    emit_advertisement(
        &mut buf,
        (ip("fd00::b"), B),
        (ip("fd00::a"), A),
        proxy_router,
    )
    .unwrap();
    assert!(matches!(
        parse(&buf).unwrap().message,
        Message::Advertisement { flags, .. } if flags == proxy_router
    ));
    assert_eq!(
        emit_advertisement(&mut buf[..85], (ip("fd00::b"), B), (ip("fd00::a"), A), HOST),
        None
    );
}

#[test]
fn the_solicitation_built_is_the_kernels_byte_for_byte() {
    let mut buf = [0u8; ADVERTISEMENT_FRAME_LEN];
    let len = emit_solicitation(&mut buf, (ip("fd00::a"), A), ip("fd00::b"));
    assert_eq!(len, Some(ADVERTISEMENT_FRAME_LEN));
    assert_eq!(buf.to_vec(), bytes(LINUX_SOLICITATION));
    assert_eq!(
        solicited_node(ip("2001:db8::12:3456")),
        (
            ip("ff02::1:ff12:3456"),
            [0x33, 0x33, 0xff, 0x12, 0x34, 0x56]
        )
    );
}

#[test]
fn what_a_host_would_discard_is_not_read() {
    let good = bytes(LINUX_SOLICITATION);
    let mutate = |at: usize, value: u8| {
        let mut f = good.clone();
        f[at] = value;
        parse(&f)
    };
    assert!(mutate(21, 64).is_none(), "hop limit below 255: routed here");
    assert!(mutate(55, 1).is_none(), "ICMP code not 0");
    assert!(mutate(56, 0).is_none(), "bad checksum");
    assert!(mutate(20, 17).is_none(), "not ICMPv6");
    assert!(mutate(12, 0x08).is_none(), "not IPv6");
    assert!(mutate(54, 128).is_none(), "an echo request");
    for len in 0..good.len() {
        assert!(parse(&good[..len]).is_none(), "cut at {len}");
    }
    // An option of length 0 would loop a naive reader forever.
    let mut zero = good.clone();
    zero[79] = 0;
    assert!(parse(&zero).is_none());
}

#[test]
fn a_duplicate_address_probe_has_no_source_and_no_link() {
    // Built from the kernel's solicitation: source ::, no option, checksum redone.
    let mut f = bytes(LINUX_SOLICITATION);
    f[22..38].fill(0);
    f.truncate(f.len() - 8);
    f[18..20].copy_from_slice(&24u16.to_be_bytes());
    f[56..58].fill(0);
    let sum = !pseudo_sum(&f[22..54], &f[54..]);
    f[56..58].copy_from_slice(&sum.to_be_bytes());
    let probe = parse(&f).unwrap();
    assert!(probe.source.is_unspecified());
    assert_eq!(
        probe.message,
        Message::Solicitation {
            target: ip("fd00::b"),
            link: None
        }
    );
}
