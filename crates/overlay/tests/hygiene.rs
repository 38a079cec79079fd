//! An overlay listening on `0.0.0.0` announces no namespace address: in a network namespace
//! of its own with an underlay interface (veth) and a TAP device with a namespace-subnet
//! address, a real identify peer asks what the overlay listens on.
#![allow(clippy::print_stdout)] // prints what was announced (run with --nocapture)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use futures::StreamExt;
use hyphae_overlay::swarm::{Overlay, OverlayEvent, OverlayOptions};
use hyphae_overlay::Identity;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::SwarmEvent;
use libp2p::{identify, noise, tcp, yamux, Multiaddr, Swarm};

const UNDERLAY: &str = "192.0.2.10";
const TAP: &str = "10.201.0.5";
const SUBNET: &str = "10.201.0.0/16";

/// Fails (never skips) without root, like the end-to-end tests.
fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test creates a network namespace: run it as root (scripts/test does)"
    );
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(out.status.success(), "ip {args:?}: {out:?}");
}

/// A network namespace, deleted on drop (also when the test fails).
struct Netns(String);

impl Netns {
    fn new(label: &str) -> Self {
        let name = format!("hyhyg{label}{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        let ns = Self(name);
        let run = |args: &[&str]| {
            let mut all = vec!["-n", &ns.0];
            all.extend_from_slice(args);
            ip(&all);
        };
        run(&["link", "set", "lo", "up"]);
        // The underlay: one end of a veth pair; the namespace side: a real TAP device.
        run(&[
            "link", "add", "under0", "type", "veth", "peer", "name", "under1",
        ]);
        run(&["tuntap", "add", "dev", "tap0", "mode", "tap"]);
        for (dev, addr) in [("under0", "192.0.2.10/24"), ("tap0", "10.201.0.5/16")] {
            run(&["addr", "add", addr, "dev", dev]);
            run(&["link", "set", dev, "up"]);
        }
        run(&["link", "set", "under1", "up"]);
        ns
    }

    /// Moves the calling thread into the namespace: sockets it opens from now on are there.
    fn enter(&self) {
        let f = std::fs::File::open(format!("/run/netns/{}", self.0)).unwrap();
        // SAFETY: a valid namespace fd; only this thread changes namespace.
        let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

fn ip_of(a: &Multiaddr) -> Option<IpAddr> {
    a.iter().find_map(|p| match p {
        Protocol::Ip4(v4) => Some(IpAddr::V4(v4)),
        Protocol::Ip6(v6) => Some(IpAddr::V6(v6)),
        _ => None,
    })
}

/// What the overlay announces by identify to a fresh peer dialling `at`, while the overlay
/// keeps running.
async fn announced(overlay: &mut Overlay, at: Multiaddr) -> Vec<Multiaddr> {
    let key = libp2p::identity::Keypair::generate_ed25519();
    let mut probe: Swarm<identify::Behaviour> = libp2p::SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_tcp(
            tcp::Config::default(),
            noise::Config::new,
            yamux::Config::default,
        )
        .unwrap()
        .with_behaviour(|k| {
            identify::Behaviour::new(identify::Config::new("/probe/1".into(), k.public()))
        })
        .unwrap()
        .build();
    probe.dial(at).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "no identify answer");
        tokio::select! {
            e = probe.select_next_some() => {
                if let SwarmEvent::Behaviour(identify::Event::Received { info, .. }) = e {
                    return info.listen_addrs;
                }
            }
            _ = overlay.next_event() => {}
        }
    }
}

#[test]
fn an_overlay_on_all_addresses_announces_no_namespace_address() {
    require_root();
    let ns = Netns::new("a");
    let under: IpAddr = UNDERLAY.parse().unwrap();
    let tap: IpAddr = TAP.parse().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            ns.enter();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut overlay = Overlay::new(
                    &Identity::from_seed([5; 32]),
                    "/ip4/0.0.0.0/tcp/0".parse().unwrap(),
                    Vec::new(),
                    OverlayOptions::default(),
                    [4; 32],
                )
                .unwrap();
                overlay.exclude_network(SUBNET.parse().unwrap());
                // Listening on 0.0.0.0 expands to loopback, the underlay and the TAP.
                let mut seen = Vec::new();
                let deadline = Instant::now() + Duration::from_secs(30);
                while !(seen.contains(&under) && seen.contains(&tap)) {
                    assert!(Instant::now() < deadline, "listening on {seen:?} only");
                    let ev = tokio::time::timeout(Duration::from_secs(30), overlay.next_event())
                        .await
                        .unwrap();
                    if let OverlayEvent::Listening { addr } = ev {
                        seen.extend(ip_of(&addr));
                    }
                }
                let loopback = overlay
                    .listen_addrs()
                    .iter()
                    .find(|a| ip_of(a).is_some_and(|i| i.is_loopback()))
                    .cloned()
                    .expect("a loopback listen address");
                let addrs = announced(&mut overlay, loopback).await;
                println!("listening on {seen:?}; announced {addrs:?}");
                let ips: Vec<IpAddr> = addrs.iter().filter_map(ip_of).collect();
                assert!(ips.contains(&under), "the underlay address is announced");
                assert!(!ips.contains(&tap), "the TAP address is not announced");
                assert!(!ips.iter().any(IpAddr::is_loopback), "nor loopback");
                // Nor is it a tunnel endpoint.
                assert_eq!(overlay.listen_ips(), vec![under]);
            });
        });
    });
}

#[test]
fn a_subnet_learned_later_is_withdrawn() {
    require_root();
    let ns = Netns::new("l");
    let under: IpAddr = UNDERLAY.parse().unwrap();
    let tap: IpAddr = TAP.parse().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            ns.enter();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut overlay = Overlay::new(
                    &Identity::from_seed([6; 32]),
                    "/ip4/0.0.0.0/tcp/0".parse().unwrap(),
                    Vec::new(),
                    OverlayOptions::default(),
                    [4; 32],
                )
                .unwrap();
                let mut seen = Vec::new();
                while !(seen.contains(&under) && seen.contains(&tap)) {
                    let ev = tokio::time::timeout(Duration::from_secs(30), overlay.next_event())
                        .await
                        .unwrap();
                    if let OverlayEvent::Listening { addr } = ev {
                        seen.extend(ip_of(&addr));
                    }
                }
                let port_of = |a: &Multiaddr| {
                    a.iter().find_map(|p| match p {
                        Protocol::Tcp(port) => Some(port),
                        _ => None,
                    })
                };
                let port = overlay.listen_addrs().iter().find_map(port_of).unwrap();
                let at: Multiaddr = format!("/ip4/{UNDERLAY}/tcp/{port}").parse().unwrap();
                // Before the subnet is known the TAP address looks like any other.
                let before: Vec<IpAddr> = announced(&mut overlay, at.clone())
                    .await
                    .iter()
                    .filter_map(ip_of)
                    .collect();
                assert!(before.contains(&tap), "{before:?}");
                overlay.exclude_network(SUBNET.parse().unwrap());
                let after: Vec<IpAddr> = announced(&mut overlay, at)
                    .await
                    .iter()
                    .filter_map(ip_of)
                    .collect();
                println!("announced before {before:?}, after {after:?}");
                assert!(after.contains(&under));
                assert!(!after.contains(&tap));
            });
        });
    });
}
