//! The data plane's batch, deterministic: two agents' data planes (real tunnel nodes and
//! switches) wired back to back in memory, fed frames as a TAP would and each other's
//! datagrams as a socket would, on a virtual clock. No thread, socket or device: what a
//! batch sends and writes is read from its `Batch`, what it leaves for the control thread
//! from the inbox.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use hyphae_overlay::{Event, Identity, NamespaceId, NamespaceKeys, Node, Opened};
use hyphae_vswitch::{Config as SwitchConfig, Switch};

use super::data::{Batch, DataPlane, Grace, Lane, ToControl, INBOX_LEN};
use super::frames::{self, Station};
use crate::config::Mode;
use crate::underlay::Datagram;

const SUBNET: &str = "10.201.0.0/24";
const VA: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 11);
const VB: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 12);
const REMOTE_MAC: [u8; 6] = [0xfe, 0xfd, 1, 2, 3, 4];

/// One agent's data plane, what its batches sent and what they wrote to its TAP.
struct Plane {
    dp: DataPlane,
    addr: SocketAddr,
    mac: [u8; 6],
    vip: Ipv4Addr,
    batch: Batch,
    /// Datagrams sent, not yet delivered: (to, bytes).
    sent: Vec<(SocketAddr, Vec<u8>)>,
    /// Frames written to the TAP: (bytes, a member's frame).
    tap: Vec<(Vec<u8>, bool)>,
    /// Packets the batches opened before taking the data plane.
    opened_outside: usize,
}

fn plane(seed: u8, vip: Ipv4Addr) -> Plane {
    let mut node = Node::new(Identity::from_seed([seed; 32]), [seed; 32]);
    node.add_namespace(
        NamespaceKeys::derive("lab", b"a secret of the test"),
        vec![vip],
    );
    let mac = [0x02, 0x48, 0, 0, 0, seed];
    let mut dp = DataPlane::new(node);
    let subnet = SUBNET.parse().expect("a subnet");
    dp.lanes.push(Lane {
        name: "lab".into(),
        mode: Mode::Interface,
        switch: Switch::new(SwitchConfig::interface(vip, subnet, mac, REMOTE_MAC)),
        l2: None,
        active: true,
        offload: false,
        group: Vec::new(),
        group_wanted: false,
        grace: Vec::new(),
        tap_errors: 0,
        offload_counters: Default::default(),
        policy: super::policy::LanePolicy::new(
            hyphae_vswitch::policy::Policy::allow_all(),
            None,
            None,
            16,
        ),
        egress: None,
        caps: None,
    });
    Plane {
        dp,
        addr: SocketAddr::from(([10, 200, 0, seed], 7400)),
        mac,
        vip,
        batch: Batch::default(),
        sent: Vec::new(),
        tap: Vec::new(),
        opened_outside: 0,
    }
}

impl Plane {
    /// What the last batch left: datagrams to `sent`, frames to `tap`.
    fn carry_out(&mut self) {
        self.batch.seal_pending(None);
        for (to, range) in &self.batch.sends {
            self.sent.push((*to, self.batch.datagram(range).to_vec()));
        }
        for w in &self.batch.writes {
            self.tap
                .push((self.batch.frame(&w.range).to_vec(), w.deliver));
        }
        self.batch.clear();
    }

    /// A worker's batch of frames from the TAP; whether it wakes the control thread.
    fn read_tap(&mut self, now: Instant, frames: &[Vec<u8>]) -> bool {
        let mut rx = Vec::new();
        let mut ranges = Vec::new();
        for f in frames {
            ranges.push((0, rx.len()..rx.len() + f.len()));
            rx.extend_from_slice(f);
        }
        self.dp
            .handle_frames(now, &ranges, &mut rx, &mut self.batch);
        let wake = self.dp.after_batch(now, false, &mut self.batch);
        self.carry_out();
        wake
    }

    /// A worker's batch of datagrams from the socket: its data messages opened first, as
    /// a worker does before it takes the data plane.
    fn read_socket(&mut self, now: Instant, datagrams: &[(SocketAddr, Vec<u8>)]) -> bool {
        let datagrams = datagrams
            .iter()
            .map(|(from, bytes)| Datagram { from: *from, bytes });
        self.batch.open(&self.dp.node.tunnels(), datagrams.clone());
        self.opened_outside += self
            .batch
            .opened
            .iter()
            .filter(|(o, _)| matches!(o, Opened::Packet { .. }))
            .count();
        self.dp.handle_datagrams(now, datagrams, &mut self.batch);
        let wake = self.dp.after_batch(now, true, &mut self.batch);
        self.carry_out();
        wake
    }

    /// The control thread's timers of the data plane.
    fn timers(&mut self, now: Instant) {
        self.dp.handle_timeout(now, &mut self.batch);
        self.carry_out();
    }

    fn take_inbox(&mut self) -> Vec<ToControl> {
        std::mem::take(&mut self.dp.inbox)
    }

    /// The member host on this plane's TAP.
    fn station(&self) -> Station {
        Station {
            mac: self.mac,
            ip: self.vip,
        }
    }

    fn ping(&self, dst: Ipv4Addr, seq: u16) -> Vec<u8> {
        frames::ping(self.station(), REMOTE_MAC, dst, seq)
    }

    fn arp_request(&self, target: Ipv4Addr) -> Vec<u8> {
        frames::arp_request(self.station(), target)
    }
}

/// Delivers what each plane sent to the other, batch by batch, until both are quiet.
fn exchange(a: &mut Plane, b: &mut Plane, now: Instant) {
    for _ in 0..50 {
        let to_b: Vec<_> = std::mem::take(&mut a.sent);
        let to_a: Vec<_> = std::mem::take(&mut b.sent);
        if to_a.is_empty() && to_b.is_empty() {
            return;
        }
        let (from_a, from_b) = (a.addr, b.addr);
        let to_b: Vec<_> = to_b
            .into_iter()
            .filter(|(to, _)| *to == from_b)
            .map(|(_, d)| (from_a, d))
            .collect();
        let to_a: Vec<_> = to_a
            .into_iter()
            .filter(|(to, _)| *to == from_a)
            .map(|(_, d)| (from_b, d))
            .collect();
        if !to_b.is_empty() {
            b.read_socket(now, &to_b);
        }
        if !to_a.is_empty() {
            a.read_socket(now, &to_a);
        }
    }
    panic!("the planes never went quiet");
}

/// Two planes whose tunnel is up and whose switches learned each other's address.
fn connected() -> (Plane, Plane, Instant) {
    #[allow(clippy::disallowed_methods)] // the virtual clock's origin
    let now = Instant::now();
    let mut a = plane(1, VA);
    let mut b = plane(2, VB);
    a.dp.node.add_static_peer(NamespaceId(0), b.addr, now);
    a.timers(now);
    exchange(&mut a, &mut b, now);
    (a, b, now)
}

fn learned(inbox: &[ToControl], vip: Ipv4Addr) -> bool {
    inbox.iter().any(|m| {
        matches!(m, ToControl::Node(Event::PeerAddresses { addresses, .. }) if addresses == &[vip])
    })
}

#[test]
fn a_ping_crosses_two_data_planes_and_only_control_work_reaches_the_inbox() {
    let (mut a, mut b, now) = connected();
    // The node's events went to the control thread, the switches applied them already.
    assert!(learned(&a.take_inbox(), VB));
    assert!(learned(&b.take_inbox(), VA));
    assert_eq!(a.dp.lanes[0].switch.route(VB), b_handle(&a));

    // ARP for the member is answered from the switch, into the TAP, nothing sent.
    a.read_tap(now, &[a.arp_request(VB)]);
    assert!(a.sent.is_empty());
    let (reply, member) = a.tap.pop().expect("an ARP reply");
    assert!(!member, "the switch's own frame is not coalesced");
    assert_eq!(&reply[12..14], &[0x08, 0x06]);
    assert_eq!(&reply[6..12], &REMOTE_MAC);

    // A batch of pings: sealed with the batch's data plane let go, one datagram each,
    // opened at the other end before its batch takes the data plane, and written to its TAP
    // as members' frames, in order. No control work and no earlier deadline than the one
    // the control thread sleeps until: no wake.
    a.dp.control_deadline = a.dp.poll_timeout();
    let pings: Vec<Vec<u8>> = (0..8).map(|seq| a.ping(VB, seq)).collect();
    let woke = a.read_tap(now, &pings);
    assert_eq!(a.sent.len(), 8);
    assert!(!woke, "nothing for the control thread");
    let opened_before = b.opened_outside;
    exchange(&mut a, &mut b, now);
    assert_eq!(
        b.opened_outside - opened_before,
        8,
        "every ping opened outside"
    );
    let got: Vec<&Vec<u8>> = b.tap.iter().filter(|(_, m)| *m).map(|(f, _)| f).collect();
    assert_eq!(got.len(), 8);
    for (seq, frame) in got.iter().enumerate() {
        assert_eq!(&frame[..6], &b.mac, "to the host's device");
        assert_eq!(
            &frame[14..],
            &pings[seq][14..],
            "the packet, unchanged and in order"
        );
    }
    assert!(a.take_inbox().is_empty() && b.take_inbox().is_empty());

    // A DNS query to the service address, and a frame for an address nobody is known to
    // hold: both for the control thread (copied out), which is woken; nothing sent.
    let service = Ipv4Addr::new(10, 201, 0, 1);
    let query = [0xab, 0xcd, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0];
    let dns = frames::udp(a.station(), REMOTE_MAC, service, (50000, 53), &query);
    let unknown = Ipv4Addr::new(10, 201, 0, 99);
    let woke = a.read_tap(now, &[dns, a.ping(unknown, 1)]);
    assert!(woke);
    assert!(a.sent.is_empty());
    let inbox = a.take_inbox();
    assert!(
        matches!(&inbox[0], ToControl::Dns { ns: 0, payload, .. } if payload[..2] == [0xab, 0xcd])
    );
    assert!(matches!(&inbox[1], ToControl::Hold { ns: 0, target, .. } if *target == unknown));
}

fn b_handle(a: &Plane) -> Option<hyphae_overlay::PeerHandle> {
    a.dp.node.peers().next().map(|p| p.handle)
}

#[test]
fn the_inbox_is_bounded_and_what_does_not_fit_is_counted() {
    let (mut a, _b, now) = connected();
    a.take_inbox();
    let frames: Vec<Vec<u8>> = (0..64u16)
        .map(|i| a.ping(Ipv4Addr::new(10, 201, 0, 100 + (i % 100) as u8), i))
        .collect();
    for _ in 0..(INBOX_LEN / frames.len() + 2) {
        a.read_tap(now, &frames);
    }
    assert_eq!(a.dp.inbox.len(), INBOX_LEN);
    assert_eq!(a.dp.inbox_drops, 128, "two batches over the bound, counted");
    // An event happens once: a flood of requests does not crowd it out.
    a.dp.tell_control(ToControl::GroupWanted { ns: 0 });
    assert_eq!(a.dp.inbox.len(), INBOX_LEN + 1);
    assert_eq!(a.dp.inbox_drops, 128);
    assert!(matches!(
        a.dp.inbox.last(),
        Some(ToControl::GroupWanted { ns: 0 })
    ));
}

#[test]
fn a_moved_hosts_packets_go_on_to_its_new_router_for_the_grace_period() {
    let (mut a, mut b, now) = connected();
    // A handed its LAN host 10.201.0.50 to B: what still reaches A for it goes to B.
    let moved = Ipv4Addr::new(10, 201, 0, 50);
    let to = b_handle(&a).expect("a tunnel");
    a.dp.lanes[0].grace.push(Grace {
        address: moved.into(),
        to,
        until: now + Duration::from_secs(5),
    });
    // Packets A receives for the moved host leave again instead of reaching A's TAP.
    let handle = b_handle(&b).expect("a tunnel");
    let ping = b.ping(moved, 2);
    b.batch.seal(&mut b.dp.node, handle, &ping[14..]);
    b.carry_out();
    let datagrams: Vec<_> = std::mem::take(&mut b.sent)
        .into_iter()
        .map(|(_, d)| (b.addr, d))
        .collect();
    a.read_socket(now, &datagrams);
    assert!(a
        .tap
        .iter()
        .all(|(f, _)| f.get(30..34) != Some(&moved.octets()[..])));
    assert_eq!(a.sent.len(), 1, "sent on to the new router");
    // After the grace period the table is emptied by the timers.
    a.timers(now + Duration::from_secs(6));
    assert!(a.dp.lanes[0].grace.is_empty());
}

#[test]
fn node_timers_run_from_the_control_threads_turn_and_what_they_send_is_in_its_batch() {
    let (mut a, mut b, now) = connected();
    a.take_inbox();
    // Keepalives and hellos come from the node's timers, which only the control thread
    // runs: after a while without traffic, its batch holds what they send.
    let later = now + Duration::from_secs(30);
    let mut sent = 0;
    let mut t = now;
    while t < later {
        t =
            a.dp.poll_timeout()
                .unwrap_or(later)
                .max(t + Duration::from_millis(1));
        a.timers(t);
        sent += a.sent.len();
        exchange(&mut a, &mut b, t);
    }
    assert!(sent > 0, "no keepalive or hello in 30 s");
    // The tunnel still carries traffic.
    a.read_tap(later, &[a.ping(VB, 9)]);
    exchange(&mut a, &mut b, later);
    assert!(b
        .tap
        .iter()
        .any(|(f, m)| *m && f.get(30..34) == Some(&VB.octets()[..])));
}
