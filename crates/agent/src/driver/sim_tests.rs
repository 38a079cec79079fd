//! The driver's deterministic tests (see `sim`): whole agents on a virtual clock, hosts
//! that speak DHCP, DNS, ARP and ICMP as frames on their TAP.

use std::net::Ipv4Addr;
use std::time::Duration;

use dhcproto::v4::{self, DhcpOption, MessageType};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};
use hickory_proto::op::{Message as Dns, Query};
use hickory_proto::rr::{rdata::A, Name, RData, RecordType};
use hyphae_overlay::NamespaceKeys;

use super::frames::{arp_request, ping, udp, Station, BROADCAST};
use super::sim::Sim;
use super::workers::lock;

const SUBNET: &str = "10.201.0.0/24";
/// The service address of `SUBNET`: DHCP and DNS.
const SERVICE: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 1);
const BRAVO: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 12);

const STATION: Station = Station {
    mac: [0x02, 0xaa, 0, 0, 0, 0x31],
    ip: Ipv4Addr::UNSPECIFIED,
};

fn router(sim: &mut Sim, seed: u8) -> usize {
    let text = format!(
        "[[namespace]]\nname = \"lab\"\nsecret_file = \"{}\"\nsubnet = \"{SUBNET}\"\nmode = \"router\"\ndevice = \"hyr0\"\nbridge = \"brlan\"\nuplink = \"eth1\"\n",
        sim.secret().display()
    );
    sim.add_agent(seed, &text)
}

fn member(sim: &mut Sim, seed: u8, address: Ipv4Addr, hostname: &str) -> usize {
    let text = format!(
        "[[namespace]]\nname = \"lab\"\nsecret_file = \"{}\"\nsubnet = \"{SUBNET}\"\naddress = \"{address}\"\nhostname = \"{hostname}\"\n",
        sim.secret().display()
    );
    sim.add_agent(seed, &text)
}

/// The namespace's keys, as every agent derives them from the secret file.
fn keys(sim: &Sim) -> NamespaceKeys {
    let secret = std::fs::read_to_string(sim.secret()).expect("the secret file");
    NamespaceKeys::derive("lab", secret.trim().as_bytes())
}

/// A gratuitous ARP: the host announces its own address.
fn gratuitous_arp(host: Station) -> Vec<u8> {
    arp_request(host, host.ip)
}

/// An IPv4 frame's parts.
struct Packet<'a> {
    src_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    protocol: u8,
    payload: &'a [u8],
}

fn parse_ipv4(frame: &[u8]) -> Option<Packet<'_>> {
    if frame.len() < 34 || frame[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &frame[14..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let src_mac = frame[6..12].try_into().ok()?;
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    Some(Packet {
        src_mac,
        src,
        dst,
        protocol: ip[9],
        payload: ip.get(ihl..total)?,
    })
}

/// The payload of a UDP frame to `port`, with the sender's MAC.
fn udp_to(frame: &[u8], port: u16) -> Option<([u8; 6], &[u8])> {
    let p = parse_ipv4(frame)?;
    let l4 = p.payload;
    (p.protocol == 17 && l4.len() >= 8 && u16::from_be_bytes([l4[2], l4[3]]) == port)
        .then(|| (p.src_mac, &l4[8..]))
}

fn dhcp_request(host: Station, kind: MessageType, opts: Vec<DhcpOption>) -> Vec<u8> {
    let mut m = v4::Message::new_with_id(
        0x5eed,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        &host.mac,
    );
    m.opts_mut().insert(DhcpOption::MessageType(kind));
    for o in opts {
        m.opts_mut().insert(o);
    }
    let mut buf = Vec::new();
    m.encode(&mut Encoder::new(&mut buf))
        .expect("a DHCP message encodes");
    udp(host, BROADCAST, Ipv4Addr::BROADCAST, (68, 67), &buf)
}

/// The DHCP replies among `frames`: their type and the address they give.
fn dhcp_replies(frames: &[Vec<u8>]) -> Vec<(MessageType, Ipv4Addr, [u8; 6])> {
    frames
        .iter()
        .filter_map(|f| udp_to(f, 68))
        .filter_map(|(mac, payload)| {
            let m = v4::Message::decode(&mut Decoder::new(payload)).ok()?;
            Some((m.opts().msg_type()?, m.yiaddr(), mac))
        })
        .collect()
}

/// The addresses of the DNS answers among `frames`.
fn dns_answers(frames: &[Vec<u8>], port: u16) -> Vec<Vec<Ipv4Addr>> {
    frames
        .iter()
        .filter_map(|f| udp_to(f, port))
        .filter_map(|(_, payload)| Dns::from_vec(payload).ok())
        .map(|m| {
            m.answers
                .iter()
                .filter_map(|r| match &r.data {
                    RData::A(A(a)) => Some(*a),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

/// A LAN host behind a router gets a lease from the router's DHCP server (its claim made in
/// the DHT), asks the router's DNS for a member's name, which waits until the DHT answers
/// the read, then pings that member through both data planes.
#[test]
fn a_lan_host_gets_a_lease_resolves_a_name_through_the_dht_and_reaches_a_member() {
    let mut sim = Sim::new("lease-name-ping");
    let r = router(&mut sim, 1);
    let b = member(&mut sim, 2, BRAVO, "bravo");
    sim.run_for(Duration::from_secs(3));

    // DHCP: discover, offer, request, acknowledge. No offer while the claim waits on the
    // DHT.
    sim.dht.hold = true;
    sim.host_sends(r, dhcp_request(STATION, MessageType::Discover, Vec::new()));
    sim.run_for(Duration::from_millis(500));
    assert!(
        dhcp_replies(&sim.host_receives(r)).is_empty(),
        "an offer before the router's claim was decided"
    );
    sim.dht.hold = false;
    let (offered, server_mac) =
        dhcp_reply(&mut sim, r, MessageType::Offer).expect("a DHCP offer once the DHT answers");
    let subnet: ipnet::Ipv4Net = SUBNET.parse().expect("a subnet");
    assert!(subnet.contains(&offered) && offered != SERVICE && offered != BRAVO);
    let keys = keys(&sim);
    let router_owner = *hyphae_overlay::Identity::from_seed([1; 32])
        .peer_id()
        .as_bytes();
    assert_eq!(
        sim.dht.holder(&keys.address_key(offered), sim.wall()),
        Some(router_owner),
        "the router holds the offered address in the DHT"
    );
    sim.host_sends(r, dhcp_select(STATION, offered));
    let ack = dhcp_reply(&mut sim, r, MessageType::Ack).map(|(a, _)| a);
    assert_eq!(ack, Some(offered), "a DHCP acknowledgement");
    let host = Station {
        ip: offered,
        ..STATION
    };

    // DNS: the name is read from the DHT; no answer while the DHT is slow.
    let mut query = Dns::query();
    query.metadata.recursion_desired = true;
    query.add_query(Query::query(
        Name::from_ascii("bravo.lab.").expect("a name"),
        RecordType::A,
    ));
    let query = query.to_vec().expect("a DNS query encodes");
    sim.dht.hold = true;
    sim.host_sends(r, udp(host, server_mac, SERVICE, (40000, 53), &query));
    sim.run_for(Duration::from_millis(500));
    assert!(
        dns_answers(&sim.host_receives(r), 40000).is_empty(),
        "the name was answered before the DHT was read"
    );
    assert!(
        sim.dht.held_reads().contains(&keys.name_key("bravo")),
        "the query waits on a read of the name"
    );
    sim.dht.hold = false;
    let mut answers = Vec::new();
    assert!(
        sim.run_until(sim.now + Duration::from_secs(3), |sim| {
            answers.extend(dns_answers(&sim.host_receives(r), 40000));
            !answers.is_empty()
        }),
        "no DNS answer once the DHT answered"
    );
    assert_eq!(answers, vec![vec![BRAVO]]);

    // A ping to the member: through the router's worker, the tunnel, the member's worker.
    let opened = sim.agents[b].opened_outside;
    sim.host_sends(r, ping(host, server_mac, BRAVO, 1));
    let mut arrived = false;
    assert!(
        sim.run_until(sim.now + Duration::from_secs(5), |sim| {
            arrived |= sim.host_receives(b).iter().any(|f| {
                parse_ipv4(f).is_some_and(|p| p.src == offered && p.dst == BRAVO && p.protocol == 1)
            });
            arrived
        }),
        "the ping never reached the member's TAP"
    );
    assert!(
        sim.agents[b].opened_outside > opened,
        "the member's worker opened it outside the lock"
    );
}

/// Leases an address to `host` from router `r`'s DHCP server: the address and the MAC the
/// router answers from.
fn lease(sim: &mut Sim, r: usize, host: Station) -> (Ipv4Addr, [u8; 6]) {
    sim.host_sends(r, dhcp_request(host, MessageType::Discover, Vec::new()));
    let (offered, mac) = dhcp_reply(sim, r, MessageType::Offer).expect("a DHCP offer");
    sim.host_sends(r, dhcp_select(host, offered));
    let ack = dhcp_reply(sim, r, MessageType::Ack).map(|(a, _)| a);
    assert_eq!(ack, Some(offered), "a DHCP acknowledgement");
    (offered, mac)
}

/// The first DHCP reply of type `kind` router `r` writes within 5 s: the address it gives
/// and the MAC it comes from.
fn dhcp_reply(sim: &mut Sim, r: usize, kind: MessageType) -> Option<(Ipv4Addr, [u8; 6])> {
    let mut reply = None;
    let end = sim.now + Duration::from_secs(5);
    sim.run_until(end, |sim| {
        reply = reply.or(dhcp_replies(&sim.host_receives(r))
            .into_iter()
            .find(|(t, _, _)| *t == kind)
            .map(|(_, a, mac)| (a, mac)));
        reply.is_some()
    });
    reply
}

/// The DHCPREQUEST that takes the address `offered` by the service address.
fn dhcp_select(host: Station, offered: Ipv4Addr) -> Vec<u8> {
    dhcp_request(
        host,
        MessageType::Request,
        vec![
            DhcpOption::RequestedIpAddress(offered),
            DhcpOption::ServerIdentifier(SERVICE),
        ],
    )
}

/// Whether `frame` is an ARP request for `target`.
fn arp_request_for(frame: &[u8], target: Ipv4Addr) -> bool {
    frame.len() >= 42
        && frame[12..14] == [0x08, 0x06]
        && frame[20..22] == [0, 1]
        && frame[38..42] == target.octets()
}

fn owner(seed: u8) -> hyphae_overlay::records::OwnerKey {
    *hyphae_overlay::Identity::from_seed([seed; 32])
        .peer_id()
        .as_bytes()
}

/// A LAN host leased by one router shows up behind another (a migrated VM's gratuitous
/// ARP): the new router's claim is refused, it asks the holder, the holder probes its LAN,
/// hears nothing and transfers the lease; its switch then routes the address to the new
/// router.
#[test]
fn a_lan_host_that_moves_to_another_router_is_handed_off() {
    let mut sim = Sim::new("handoff");
    let old = router(&mut sim, 1);
    let new = router(&mut sim, 3);
    sim.run_for(Duration::from_secs(3));
    let (address, _) = lease(&mut sim, old, STATION);
    let key = keys(&sim).address_key(address);
    assert_eq!(sim.dht.holder(&key, sim.wall()), Some(owner(1)));
    sim.host_receives(old);

    let moved = sim.now;
    let host = Station {
        ip: address,
        ..STATION
    };
    sim.host_sends(new, gratuitous_arp(host));
    let transfers = sim.dht.transfers;
    assert!(
        sim.run_until(moved + Duration::from_secs(5), |sim| {
            sim.dht.holder(&key, sim.wall()) == Some(owner(3))
        }),
        "the lease never moved to the new router"
    );
    let took = sim.now - moved;
    assert!(
        sim.dht.transfers > transfers,
        "the old router transferred the lease"
    );
    assert!(
        sim.host_receives(old)
            .iter()
            .any(|f| arp_request_for(f, address)),
        "the old router probed its LAN for the host before letting it go"
    );
    // The old router's switch sends the address to the new router's tunnel now.
    sim.run_for(Duration::from_millis(200));
    let dp = lock(&sim.agents[old].control.dp);
    let new_router = dp
        .node
        .member_handle(
            hyphae_overlay::NamespaceId(0),
            hyphae_overlay::Identity::from_seed([3; 32]).peer_id(),
        )
        .expect("a tunnel to the new router");
    assert_eq!(dp.lanes[0].switch.route(address), Some(new_router));
    drop(dp);
    // What `hyphae status` says on each side (asked through the control loop).
    let status =
        |sim: &mut Sim, k| sim.call(k, crate::control::Request::Status)["namespaces"][0].clone();
    let (was, is) = (status(&mut sim, old), status(&mut sim, new));
    let listed = serde_json::json!([address.to_string()]);
    assert_eq!(
        (&was["handoffs_out"], &is["handoffs_in"]),
        (&1.into(), &1.into())
    );
    assert_eq!(is["lan_hosts"], listed);
    assert_eq!(was["lan_hosts"], serde_json::json!([]));
    assert_eq!(
        was["peers"][0]["addresses"], listed,
        "the new router announced it"
    );
    eprintln!("handed off in {took:?} of virtual time");
}

/// A member restarts (kill -9: a new process with no session keys): the tunnel the other
/// member kept gets a new session from a fresh handshake, and a ping crosses again.
#[test]
fn after_a_members_restart_the_tunnel_rekeys_and_carries_traffic_again() {
    let alpha_ip = Ipv4Addr::new(10, 201, 0, 11);
    let mut sim = Sim::new("rekey");
    let a = member(&mut sim, 1, alpha_ip, "alpha");
    let b = member(&mut sim, 2, BRAVO, "bravo");
    sim.run_for(Duration::from_secs(3));
    let (device_mac, remote_mac) = {
        let dp = lock(&sim.agents[a].control.dp);
        let c = dp.lanes[0].switch.config();
        (c.device_mac, c.remote_mac)
    };
    let alpha = Station {
        mac: device_mac,
        ip: alpha_ip,
    };
    let bravo_id = hyphae_overlay::Identity::from_seed([2; 32]).peer_id();
    // A ping a second, as ping(8) sends them, until one arrives: how many were sent.
    let pings_until_one_crosses = |sim: &mut Sim| {
        for seq in 1..=5 {
            sim.host_sends(a, ping(alpha, remote_mac, BRAVO, seq));
            let mut arrived = false;
            let end = sim.now + Duration::from_secs(1);
            sim.run_until(end, |sim| {
                arrived |= sim.host_receives(b).iter().any(|f| {
                    parse_ipv4(f)
                        .is_some_and(|p| p.src == alpha_ip && p.dst == BRAVO && p.protocol == 1)
                });
                arrived
            });
            if arrived {
                return Some(seq);
            }
        }
        None
    };
    assert_eq!(
        pings_until_one_crosses(&mut sim),
        Some(1),
        "the first ping crosses"
    );
    let handle = lock(&sim.agents[a].control.dp)
        .node
        .member_handle(hyphae_overlay::NamespaceId(0), bravo_id);
    assert!(handle.is_some());

    sim.restart(b);
    let restarted = sim.now;
    let sent = pings_until_one_crosses(&mut sim);
    eprintln!(
        "after the restart, ping {sent:?} crossed, {:?} of virtual time later",
        sim.now - restarted
    );
    // The first may go out on the old session, before the restarted member's hello.
    assert!(
        sent.is_some_and(|n| n <= 2),
        "no ping crossed after the restart: {sent:?}"
    );
    // Alpha kept its tunnel; the restarted member has no keys but the new session's.
    assert_eq!(
        lock(&sim.agents[a].control.dp)
            .node
            .member_handle(hyphae_overlay::NamespaceId(0), bravo_id),
        handle
    );
}
