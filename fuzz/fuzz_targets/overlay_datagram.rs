//! Any datagram at the agent's port, and any decrypted control packet: counted drops, never
//! a panic.
#![no_main]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Instant;

use hyphae_overlay::wire::{parse_relay, Announce, Control, Datagram, Hello};
use hyphae_overlay::{Identity, NamespaceKeys, Node};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let keys = NamespaceKeys::derive("lab", b"a fuzzing namespace secret");
    let mut node = Node::new(Identity::from_seed([9; 32]), [9; 32]);
    node.add_namespace(keys.clone(), vec![Ipv4Addr::new(10, 201, 0, 1)]);
    let from = SocketAddr::from(([10, 200, 0, 2], 7400));
    let mut out = vec![0u8; data.len().max(64)];
    let _ = node.handle_datagram(Instant::now(), from, data, &mut out);
    while node.poll_transmit().is_some() {}
    let _ = Hello::parse(data);
    let _ = Hello::verify(data, &keys);
    let _ = Announce::parse(data);
    // What parses as uplinks is emitted as it came (the list a member bonds over).
    if let Some(Control::Uplinks(links)) = Control::parse(data) {
        let again = Control::Uplinks(links.clone()).emit();
        assert_eq!(Control::parse(&again), Some(Control::Uplinks(links)));
    }
    if let Some(Control::Macs(part)) = Control::parse(data) {
        let again = Control::Macs(part.clone()).emit();
        assert_eq!(Control::parse(&again), Some(Control::Macs(part.clone())));
        let _ = hyphae_overlay::wire::MacParts::default().take(part);
    }
    if let Some(Control::Addresses(part)) = Control::parse(data) {
        let again = Control::Addresses(part.clone()).emit();
        assert_eq!(Control::parse(&again), Some(Control::Addresses(part.clone())));
        let _ = hyphae_overlay::wire::AddressParts::default().take(part);
    }
    // What parses as an announcement is emitted as it came (IPv6 lists included).
    if let Some(a) = Announce::parse(data) {
        assert_eq!(Announce::parse(&a.emit()), Some(a));
    }
    let _ = parse_relay(data);
    let _ = Datagram::parse(data);
});
