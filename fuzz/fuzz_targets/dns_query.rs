//! Any bytes sent to the virtual DNS server: an answer, an error code, a lookup or a
//! counted drop, never a panic; and a query handed back after its lookups ends.
#![no_main]

use std::net::{Ipv4Addr, Ipv6Addr};

use hyphae_dhcp_dns::dns::{Answer, Holder, Missing, Names, Server, Settings};
use libfuzzer_sys::fuzz_target;

/// Knows "web" at 10.201.0.7 and fd00::7, and odd addresses as owned, once looked up
/// (`known`).
struct One {
    known: bool,
}

impl Names for One {
    fn address_of(&self, host: &str) -> Result<Option<Ipv4Addr>, Missing> {
        if !self.known {
            return Err(Missing::Name(host.to_string()));
        }
        Ok((host == "web").then_some(Ipv4Addr::new(10, 201, 0, 7)))
    }
    fn holder_of(&self, address: Ipv4Addr) -> Result<Option<Holder>, Missing> {
        if !self.known {
            return Err(Missing::Address(address));
        }
        let name = (address == Ipv4Addr::new(10, 201, 0, 7)).then(|| "web".to_string());
        Ok((address.octets()[3] % 2 == 1).then_some(Holder { name }))
    }
    fn address6_of(&self, host: &str) -> Result<Option<Ipv6Addr>, Missing> {
        if !self.known {
            return Err(Missing::Name(host.to_string()));
        }
        Ok((host == "web").then_some(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 7)))
    }
    fn holder_of6(&self, address: Ipv6Addr) -> Result<Option<Holder>, Missing> {
        if !self.known {
            return Err(Missing::Address6(address));
        }
        let name = (address.segments()[7] == 7).then(|| "web".to_string());
        Ok((address.segments()[7] % 2 == 1).then_some(Holder { name }))
    }
}

fuzz_target!(|data: &[u8]| {
    for forward in [false, true] {
        let mut s = Server::new(Settings {
            zone: "lab.".parse().expect("zone"),
            subnet: "10.201.0.0/16".parse().expect("subnet"),
            // A second subnet of the namespace: its names and reverse names are the zone's.
            routed: vec!["10.202.0.0/16".parse().expect("subnet")],
            // A dual-stack namespace: AAAA answers and ip6.arpa names.
            prefix6: Some("fd00::/64".parse().expect("prefix")),
            forward,
            rate: 0,
        });
        if let Answer::Lookup(_) = s.handle(data, &One { known: false }) {
            assert!(!matches!(
                s.handle(data, &One { known: true }),
                Answer::Lookup(_)
            ));
        }
    }
});
