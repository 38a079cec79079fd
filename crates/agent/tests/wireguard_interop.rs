#![allow(clippy::disallowed_methods)] // a test measures and waits on the real clock
//! The tunnel against an independent WireGuard: boringtun's `Tunn`, the per-peer tunnel every
//! hyphae data message goes through (its AEAD is `ring`'s ChaCha20-Poly1305,
//! docs/DECISIONS.md "Data-path AEAD"), handshakes with wireguard-go (Go, its own Noise and
//! ChaCha20-Poly1305) running in a namespace on a TUN device configured with `wg`, and pings
//! the kernel behind it. The echo request is sealed here and opened by wireguard-go; the reply
//! is sealed by wireguard-go and opened here, so both directions of the data-message AEAD and
//! the handshake are checked against another implementation of the protocol.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd as _;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine as _;
use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use hyphae_testbed::{require_root, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const WG_PORT: u16 = 51820;
/// Inside the tunnel: wireguard-go's TUN address and ours.
const THEIRS: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const OURS: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const PAYLOAD: &[u8] = b"hyphae data-path AEAD against wireguard-go";

fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4 ICMP echo request OURS -> THEIRS carrying PAYLOAD.
fn echo_request(id: u16, seq: u16) -> Vec<u8> {
    let total = (20 + 8 + PAYLOAD.len()) as u16;
    let mut p = vec![0x45, 0];
    p.extend_from_slice(&total.to_be_bytes());
    p.extend_from_slice(&[0, 1, 0x40, 0, 64, 1, 0, 0]);
    p.extend_from_slice(&OURS.octets());
    p.extend_from_slice(&THEIRS.octets());
    let ip_sum = checksum(&p);
    p[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    let mut icmp = vec![8, 0, 0, 0];
    icmp.extend_from_slice(&id.to_be_bytes());
    icmp.extend_from_slice(&seq.to_be_bytes());
    icmp.extend_from_slice(PAYLOAD);
    let icmp_sum = checksum(&icmp);
    icmp[2..4].copy_from_slice(&icmp_sum.to_be_bytes());
    p.extend_from_slice(&icmp);
    p
}

/// A UDP socket bound inside network namespace `ns` (setns on a thread of its own; the
/// socket stays in that namespace wherever it is used from).
fn socket_in(ns: &str, addr: SocketAddr) -> UdpSocket {
    let path = Path::new("/run/netns").join(ns);
    std::thread::scope(|s| {
        s.spawn(|| {
            let f = File::open(&path).expect("namespace file");
            // SAFETY: setns(2) on a namespace fd we own, for this thread only (it ends here).
            let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
            UdpSocket::bind(addr).expect("bind in namespace")
        })
        .join()
        .expect("setns thread")
    })
}

/// Sends what `Tunn` asks to send, then repeats the empty call until it is done (boringtun's
/// contract for queued packets).
fn flush(tunn: &mut Tunn, sock: &UdpSocket, to: SocketAddr, first: TunnResult<'_>) {
    let mut buf = vec![0u8; 2048];
    let mut next = first;
    loop {
        match next {
            TunnResult::WriteToNetwork(d) => {
                sock.send_to(d, to).expect("send");
            }
            _ => return,
        }
        next = tunn.decapsulate(None, &[], &mut buf);
    }
}

#[test]
fn boringtun_tunnel_handshakes_and_exchanges_data_with_wireguard_go() {
    require_root();
    let mut bed = Testbed::new("wgi", Path::new(BIN)).unwrap();
    let wg_host = bed.add_host("wg", Ipv4Addr::new(10, 76, 0, 1)).unwrap();
    let me = bed.add_host("me", Ipv4Addr::new(10, 76, 0, 2)).unwrap();

    let ours = StaticSecret::from([0x11; 32]);
    let theirs = StaticSecret::from([0x22; 32]);
    let b64 = base64::engine::general_purpose::STANDARD;
    let key_file = wg_host.dir.join("wg.key");
    std::fs::write(&key_file, b64.encode(theirs.to_bytes())).unwrap();

    let dev = "wgi0";
    let log = wg_host.dir.join("wireguard-go.log");
    let pid = bed
        .spawn(&wg_host.ns, "wireguard-go", &["-f", dev], &log)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while bed.ns(&wg_host.ns, "ip", &["link", "show", dev]).is_err() {
        assert!(
            bed.is_running(pid) && Instant::now() < deadline,
            "wireguard-go made no {dev}: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let peer_pub = b64.encode(PublicKey::from(&ours).as_bytes());
    let port = WG_PORT.to_string();
    let ours_cidr = format!("{OURS}/32");
    bed.ns(
        &wg_host.ns,
        "wg",
        &[
            "set",
            dev,
            "private-key",
            key_file.to_str().unwrap(),
            "listen-port",
            &port,
            "peer",
            &peer_pub,
            "allowed-ips",
            &ours_cidr,
        ],
    )
    .unwrap();
    let theirs_cidr = format!("{THEIRS}/24");
    bed.ns(
        &wg_host.ns,
        "ip",
        &["addr", "add", &theirs_cidr, "dev", dev],
    )
    .unwrap();
    bed.ns(&wg_host.ns, "ip", &["link", "set", dev, "up"])
        .unwrap();

    let sock = socket_in(&me.ns, SocketAddr::from((me.underlay, 0)));
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let to = SocketAddr::from((wg_host.underlay, WG_PORT));
    let mut tunn = Tunn::new(ours, PublicKey::from(&theirs), None, None, 7, None);

    let (id, seq) = (0x4879, 1);
    let request = echo_request(id, seq);
    let mut out = vec![0u8; 2048];
    let mut buf = vec![0u8; 2048];
    // Without a session this queues the request and yields a handshake initiation; the
    // request goes out sealed once wireguard-go's response makes a session.
    let r = tunn.encapsulate(&request, &mut out);
    flush(&mut tunn, &sock, to, r);
    let mut reply = None;
    let deadline = Instant::now() + Duration::from_secs(20);
    while reply.is_none() && Instant::now() < deadline {
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            // Silence (wireguard-go may not have been listening yet): handshake again and
            // send the request again.
            let r = tunn.format_handshake_initiation(&mut out, true);
            flush(&mut tunn, &sock, to, r);
            let r = tunn.encapsulate(&request, &mut out);
            flush(&mut tunn, &sock, to, r);
            continue;
        };
        match tunn.decapsulate(Some(from.ip()), &buf[..n], &mut out) {
            TunnResult::WriteToTunnelV4(packet, src) => {
                assert_eq!(src, THEIRS, "inner source");
                if packet.get(20) == Some(&0) {
                    reply = Some(packet.to_vec());
                }
            }
            r @ TunnResult::WriteToNetwork(_) => flush(&mut tunn, &sock, to, r),
            TunnResult::Err(e) => panic!("wireguard-go sent what the tunnel refused: {e:?}"),
            _ => {}
        }
    }

    let reply = reply.unwrap_or_else(|| {
        panic!(
            "no echo reply through wireguard-go within 20 s: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    assert_eq!(&reply[12..16], &THEIRS.octets(), "reply source");
    assert_eq!(&reply[16..20], &OURS.octets(), "reply destination");
    assert_eq!(reply[20], 0, "ICMP echo reply");
    assert_eq!(&reply[24..26], &id.to_be_bytes(), "echo id");
    assert_eq!(&reply[26..28], &seq.to_be_bytes(), "echo sequence");
    assert_eq!(&reply[28..], PAYLOAD, "echo payload");
    assert_eq!(
        checksum(&reply[20..]),
        0,
        "ICMP checksum of what we decrypted"
    );
}
