//! Per-packet cost of a namespace's policy (issue 28): the check each end of a tunnel runs
//! on every packet, with no policy (the agent's default), and with 10 and 100 rules, for a
//! packet of a flow already in the connection table (most packets) and for the first
//! packet of a new flow that only the last rule allows (the longest walk).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::Ipv4Addr;
use std::time::Instant;

use criterion::{black_box, criterion_group, Criterion};
use hyphae_vswitch::policy::flows::{Firewall, Verdict};
use hyphae_vswitch::policy::{Policy, PolicyFile, RuleFile};

/// A TCP packet from 10.201.0.1:`sport` to 10.201.0.2:5432.
fn packet(sport: u16) -> Vec<u8> {
    let mut p = vec![0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0];
    p.extend_from_slice(&[10, 201, 0, 1, 10, 201, 0, 2]);
    p.extend_from_slice(&sport.to_be_bytes());
    p.extend_from_slice(&5432u16.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x10, 0xff, 0xff, 0, 0, 0, 0]);
    p
}

/// `n` rules by group, port and CIDR, only the last of which allows web to db on 5432.
fn policy(n: usize) -> Policy {
    let mut groups: Vec<String> = (0..20).map(|i| format!("g{i}")).collect();
    groups.extend(["web".to_string(), "db".to_string()]);
    let mut rules: Vec<RuleFile> = (0..n.saturating_sub(1))
        .map(|i| RuleFile {
            from: vec![
                format!("group:g{}", i % 20),
                format!("10.99.{}.0/24", i % 250),
            ],
            to: vec![format!("group:g{}", (i + 1) % 20)],
            proto: "tcp".into(),
            ports: vec![format!("{}", 1000 + i), "8000-8100".into()],
            ethertypes: Vec::new(),
        })
        .collect();
    if n > 0 {
        rules.push(RuleFile {
            from: vec!["group:web".into()],
            to: vec!["group:db".into()],
            proto: "tcp".into(),
            ports: vec!["5432".into()],
            ethertypes: Vec::new(),
        });
    }
    let file = PolicyFile {
        version: 1,
        default: hyphae_vswitch::policy::DefaultAction::Deny,
        reject: false,
        groups,
        rules,
        links: Vec::new(),
    };
    Policy::compile(&file, true).unwrap()
}

/// Each case: its name, and one step (one packet through the check) to run again and again.
fn cases() -> Vec<(String, Box<dyn FnMut()>)> {
    let now = Instant::now();
    let mut cases: Vec<(String, Box<dyn FnMut()>)> = Vec::new();
    let open = Policy::allow_all();
    let (web, db) = (open.tags(["web"], None), open.tags(["db"], None));
    let mut fw = Firewall::new(open, 65536);
    let p = packet(40000);
    cases.push((
        "policy/none".into(),
        Box::new(move || {
            black_box(fw.check(now, black_box(&p), web, db));
        }),
    ));
    for n in [10, 100] {
        let policy = policy(n);
        let (web, db) = (policy.tags(["web"], None), policy.tags(["db"], None));
        let mut fw = Firewall::new(policy.clone(), 65536);
        let p = packet(40000);
        assert_eq!(fw.check(now, &p, web, db), Verdict::Pass);
        cases.push((
            format!("policy/{n}_rules_flow_in_table"),
            Box::new(move || {
                black_box(fw.check(now, black_box(&p), web, db));
            }),
        ));
        // New flows: each packet from another address and port (2^24 of them), in a table
        // of 65,536 flows filled first, so each is decided by the rules, inserted, and
        // evicts the least recently used flow: the most a first packet costs.
        let mut fw = Firewall::new(policy.clone(), 65536);
        let mut next = 0u32;
        let mut p = packet(1);
        let mut step = move || {
            next = next.wrapping_add(1) & 0x00ff_ffff;
            p[14] = (next >> 16) as u8;
            p[20..22].copy_from_slice(&(next as u16).to_be_bytes());
            black_box(fw.check(now, black_box(&p), web, db));
        };
        for _ in 0..65536 {
            step();
        }
        cases.push((format!("policy/{n}_rules_new_flow"), Box::new(step)));
        // The rule walk alone, without the table: what `decide` costs a first packet.
        let packet = hyphae_vswitch::policy::Packet {
            src: Ipv4Addr::new(10, 201, 0, 1).into(),
            dst: Ipv4Addr::new(10, 201, 0, 2).into(),
            proto: 6,
            dport: 5432,
        };
        cases.push((
            format!("policy_decide/{n}_rules"),
            Box::new(move || {
                black_box(policy.decide(web, db, black_box(&packet)));
            }),
        ));
    }
    cases
}

fn bench(c: &mut Criterion) {
    for (name, mut step) in cases() {
        c.bench_function(&name, |b| b.iter(&mut step));
    }
}

criterion_group!(benches, bench);

/// `HYPHAE_POLICY_STEPS=CASE:N` runs case CASE N times and nothing else, for an instruction
/// count under callgrind (`benches/policy-instructions.sh` runs it with N and with 0, and
/// divides the difference by N); otherwise criterion runs every case.
fn main() {
    if let Ok(spec) = std::env::var("HYPHAE_POLICY_STEPS") {
        let (name, n) = spec.rsplit_once(':').expect("CASE:N");
        let n: u64 = n.parse().expect("N, a count");
        let mut cases = cases();
        let (_, step) = cases
            .iter_mut()
            .find(|(c, _)| c == name)
            .unwrap_or_else(|| panic!("no case {name}"));
        for _ in 0..n {
            step();
        }
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
