//! Per-packet cost of a namespace's policy (issue 28): the check each end of a tunnel runs
//! on every packet, with no policy (the agent's default), and with 10 and 100 rules, for a
//! packet of a flow already in the connection table (most packets) and for the first
//! packet of a new flow that only the last rule allows (the longest walk).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::Ipv4Addr;
use std::time::Instant;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
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
        })
        .collect();
    if n > 0 {
        rules.push(RuleFile {
            from: vec!["group:web".into()],
            to: vec!["group:db".into()],
            proto: "tcp".into(),
            ports: vec!["5432".into()],
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

fn bench(c: &mut Criterion) {
    let now = Instant::now();
    let mut group = c.benchmark_group("policy");
    let open = Policy::allow_all();
    let (web, db) = (open.tags(["web"], None), open.tags(["db"], None));
    let mut fw = Firewall::new(open, 65536);
    let p = packet(40000);
    group.bench_function("none", |b| {
        b.iter(|| black_box(fw.check(now, black_box(&p), web, db)))
    });
    for n in [10, 100] {
        let policy = policy(n);
        let (web, db) = (policy.tags(["web"], None), policy.tags(["db"], None));
        let mut fw = Firewall::new(policy.clone(), 65536);
        assert_eq!(fw.check(now, &p, web, db), Verdict::Pass);
        group.bench_function(format!("{n}_rules_flow_in_table"), |b| {
            b.iter(|| black_box(fw.check(now, black_box(&p), web, db)))
        });
        // New flows: each packet from another address and port (2^24 of them), in a full
        // table of 65,536 flows, so each is decided by the rules, inserted, and evicts the
        // least recently used flow: the most a first packet costs.
        let mut fw = Firewall::new(policy, 65536);
        let mut next = 0u32;
        let mut p = packet(1);
        group.bench_function(format!("{n}_rules_new_flow"), |b| {
            b.iter(|| {
                next = next.wrapping_add(1) & 0x00ff_ffff;
                p[14] = (next >> 16) as u8;
                p[20..22].copy_from_slice(&(next as u16).to_be_bytes());
                black_box(fw.check(now, black_box(&p), web, db))
            })
        });
    }
    group.finish();
}

fn rules_only(c: &mut Criterion) {
    // The rule walk alone, without the table: what `decide` costs a first packet.
    let mut group = c.benchmark_group("policy_decide");
    for n in [10, 100] {
        let policy = policy(n);
        let (web, db) = (policy.tags(["web"], None), policy.tags(["db"], None));
        let packet = hyphae_vswitch::policy::Packet {
            src: Ipv4Addr::new(10, 201, 0, 1),
            dst: Ipv4Addr::new(10, 201, 0, 2),
            proto: 6,
            dport: 5432,
        };
        group.bench_function(format!("{n}_rules"), |b| {
            b.iter(|| black_box(policy.decide(web, db, black_box(&packet))))
        });
    }
    group.finish();
}

criterion_group!(benches, bench, rules_only);
criterion_main!(benches);
