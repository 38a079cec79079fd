//! MAC leases of a layer-2 namespace: held, refused to a second member, given back, and
//! read by others.

use super::*;

const M: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
const N: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

fn holders(events: &[Event]) -> Vec<([u8; 6], Option<PeerId>)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::MacHolder { mac, holder } => Some((*mac, *holder)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_mac_is_one_members_lease_until_it_lets_it_go() {
    let mut net = Net::new();
    let a = net.add(config(Address::Auto), 1);
    let b = net.add(config(Address::Auto), 2);
    net.members[a].set_macs(net.now, &[M, N]);
    net.run_for(Duration::from_secs(1));
    assert_eq!(
        net.members[a].mac_leases(),
        MacLeases {
            held: 2,
            unheld: 0,
            lost: 0
        }
    );
    // The record names the MAC: a replica with an authority checks it against its key.
    let key = keys().mac_key(M);
    let e = net.replicas.leases.get(&key).unwrap();
    let (_, info) = e.read::<MemberInfo>(&keys(), &key, net.unix()).unwrap();
    assert_eq!(info.subject, Some(crate::records::Subject::Mac(M)));
    // B hears M on its side too (a host that moved, or a spoof): A keeps it; B tries
    // again every MAC_RECLAIM.
    net.members[b].set_macs(net.now, &[M]);
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.members[b].mac_leases().held, 0);
    assert_eq!(net.members[b].mac_leases().unheld, 1);
    // Anyone reads who holds it.
    net.members[b].read_mac_holder(M);
    net.run_for(Duration::from_millis(200));
    assert_eq!(holders(&net.take_events(b)), vec![(M, Some(net.id(a)))]);
    // A lets M go (its host went quiet there): released, and B's next try wins.
    net.members[a].set_macs(net.now, &[N]);
    net.run_for(MAC_RECLAIM * 2);
    assert_eq!(net.members[b].mac_leases().held, 1);
    net.members[a].read_mac_holder(M);
    net.run_for(Duration::from_millis(200));
    assert_eq!(holders(&net.take_events(a)), vec![(M, Some(net.id(b)))]);
    // Renewed while held; given back when the member leaves.
    net.run_for(LEASE * 2);
    assert_eq!(net.members[b].mac_leases().held, 1);
    net.members[a].leave();
    net.run_for(Duration::from_millis(200));
    net.members[b].read_mac_holder(N);
    net.run_for(Duration::from_millis(200));
    assert_eq!(holders(&net.take_events(b)), vec![(N, None)]);
}

#[test]
fn a_mac_gone_while_its_claim_is_out_leaves_no_lease_behind() {
    let mut net = Net::new();
    let a = net.add(config(Address::Auto), 1);
    net.run_for(Duration::from_secs(1));
    net.members[a].set_macs(net.now, &[M]);
    // The claim goes out; the MAC goes before its answer comes back.
    net.settle();
    net.members[a].set_macs(net.now, &[]);
    net.run_for(Duration::from_secs(1));
    assert!(
        !net.replicas.leases.contains_key(&keys().mac_key(M)),
        "the lease won for a MAC no longer here is given back"
    );
    assert_eq!(net.members[a].mac_leases(), MacLeases::default());
}
