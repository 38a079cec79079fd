//! Any text as a policy file (decoded, compiled with and without an authority, asked about
//! an IPv4 and an IPv6 packet), and any bytes as an IPv4 or IPv6 packet through a firewall
//! with rules (both ways, twice, then under a replaced policy) and as a denied packet to
//! answer: a clear error, a verdict or an answer, never a panic.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use hyphae_vswitch::policy::flows::Firewall;
use hyphae_vswitch::policy::reject;
use hyphae_vswitch::policy::{Packet, Policy, PolicyFile};
use libfuzzer_sys::fuzz_target;

const RULES: &str = r#"
default = "deny"
groups = ["web", "db"]
[[rule]]
from = ["group:web", "10.0.0.0/8"]
to = ["group:db"]
proto = "tcp"
ports = ["5432", "8000-8100"]
[[rule]]
from = ["any"]
to = ["name:db1"]
proto = "icmp"
[[rule]]
from = ["10.1.2.3", "fd00::/64"]
to = ["any"]
proto = "udp"
[[rule]]
from = ["fd00::1"]
to = ["fd00::2"]
proto = "icmp"
"#;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(file) = toml::from_str::<PolicyFile>(text) {
            for certified in [false, true] {
                if let Ok(p) = Policy::compile(&file, certified) {
                    let tags = p.tags(["web", "db"], Some("db1"));
                    let v4 = |d| IpAddr::V4(Ipv4Addr::new(10, 0, 0, d));
                    let v6 = |d| IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, d));
                    for (src, dst, proto) in [(v4(1), v4(2), 6), (v6(1), v6(2), 58)] {
                        let packet = Packet {
                            src,
                            dst,
                            proto,
                            dport: 5432,
                        };
                        let _ = p.decide(tags, tags, &packet);
                    }
                }
            }
        }
    }
    let file: PolicyFile = toml::from_str(RULES).expect("the fixed policy");
    let policy = Policy::compile(&file, true).expect("compiles");
    let (web, db) = (policy.tags(["web"], None), policy.tags(["db"], Some("db1")));
    let now = Instant::now();
    let mut fw = Firewall::new(policy.clone(), 4);
    for t in [now, now + Duration::from_secs(700)] {
        let _ = fw.check(t, data, web, db);
        let _ = fw.check(t, data, db, web);
    }
    fw.replace(policy, |_| web);
    let _ = fw.check(now, data, web, db);
    fw.expire(now + Duration::from_secs(3600));
    let mut answer = [0u8; reject::MAX_ANSWER_LEN];
    let _ = reject::answer(data, &mut answer);
});
