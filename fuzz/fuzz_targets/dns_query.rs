//! Any bytes sent to the virtual DNS server: an answer, an error code or a counted drop,
//! never a panic.
#![no_main]

use std::net::Ipv4Addr;

use hyphae_dhcp_dns::dns::{Names, Server, Settings};
use libfuzzer_sys::fuzz_target;

struct One;

impl Names for One {
    fn address_of(&self, host: &str) -> Option<Ipv4Addr> {
        (host == "web").then_some(Ipv4Addr::new(10, 201, 0, 7))
    }
    fn name_of(&self, address: Ipv4Addr) -> Option<String> {
        (address == Ipv4Addr::new(10, 201, 0, 7)).then(|| "web".to_string())
    }
    fn is_owned(&self, address: Ipv4Addr) -> bool {
        address.octets()[3] % 2 == 1
    }
}

fuzz_target!(|data: &[u8]| {
    for forward in [false, true] {
        let mut s = Server::new(Settings {
            zone: "lab.".parse().expect("zone"),
            subnet: "10.201.0.0/16".parse().expect("subnet"),
            forward,
        });
        let _ = s.handle(data, &One);
    }
});
