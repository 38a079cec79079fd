#!/usr/bin/env bash
# The switch's per-frame cost at two commits in one process: builds both versions of
# crates/vswitch side by side (as crates `vswitch_before` and `vswitch_after`) into a small
# driver that switches the same frames through each in alternating rounds, so machine load
# hits both alike. With valgrind installed it also counts instructions per frame (callgrind),
# which load does not change. The driver is written for the base's `handle_tap_frame(&[u8])`
# and the work tree's `handle_tap_frame(&mut [u8])` (issue 17, item 7). Usage:
#   benches/vswitch-ab.sh [BASE_COMMIT] [frames]     (default: 5775d40, 20000000)
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-5775d40}
frames=${2:-20000000}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/before" "$dir/after/crates" "$dir/drv/src"
git archive "$base" crates/vswitch | tar -x -C "$dir/before"
cp -r crates/vswitch "$dir/after/crates/"
for v in before after; do
    cat >"$dir/$v/crates/vswitch/Cargo.toml" <<EOF
[package]
name = "vswitch-$v"
version = "0.1.0"
edition = "2021"
[lib]
name = "vswitch_$v"
path = "src/lib.rs"
[dependencies]
ipnet = { version = "2", default-features = false, features = ["std"] }
EOF
done
cat >"$dir/drv/Cargo.toml" <<'EOF'
[package]
name = "ab"
version = "0.1.0"
edition = "2021"
[dependencies]
vswitch-before = { path = "../before/crates/vswitch" }
vswitch-after = { path = "../after/crates/vswitch" }
[profile.release]
debug = true
EOF
cat >"$dir/drv/src/main.rs" <<'EOF'
//! The switch's per-frame cost before and after the MTU fitting, in one process: the same
//! 1434-byte frame (UDP, 1392-byte payload: fits the 1420-byte tunnel) and a 1434-byte TCP ACK,
//! alternating rounds. `ab before N` / `ab after N` run one version only (for perf stat).
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Instant;

fn frame(tcp: bool) -> Vec<u8> {
    let total: u16 = 1420;
    let mut f = vec![0x02, 0, 0, 0, 0, 1, 0xfe, 0xfd, 1, 2, 3, 4, 0x08, 0x00, 0x45, 0];
    f.extend_from_slice(&total.to_be_bytes());
    let proto = if tcp { 6 } else { 17 };
    f.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0, 10, 201, 0, 1, 10, 201, 0, 2]);
    if tcp {
        f.extend_from_slice(&[0x13, 0x88, 0x13, 0x89, 0, 0, 0, 1, 0, 0, 0, 1, 0x50, 0x10, 0xff, 0xff, 0, 0, 0, 0]);
    } else {
        f.extend_from_slice(&[0x13, 0x88, 0x13, 0x89, 0x05, 0x78, 0, 0]);
    }
    f.resize(14 + total as usize, 0xab);
    f
}

macro_rules! switch {
    ($krate:ident) => {{
        let mut sw: $krate::Switch<u32> = $krate::Switch::new($krate::Config::interface(
            Ipv4Addr::new(10, 201, 0, 1),
            "10.201.0.0/16".parse().unwrap(),
            [0x02, 0, 0, 0, 0, 1],
            [0xfe, 0xfd, 1, 2, 3, 4],
        ));
        sw.set_peer_addresses(7, &[Ipv4Addr::new(10, 201, 0, 2)]);
        sw
    }};
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20_000_000);
    let now = Instant::now();
    let mut before = switch!(vswitch_before);
    let mut after = switch!(vswitch_after);
    let mut reply = [0u8; 128];
    for tcp in [false, true] {
        let f = frame(tcp);
        let mut g = f.clone();
        let run_before = |sw: &mut vswitch_before::Switch<u32>, reply: &mut [u8], n: u64| {
            let t = Instant::now();
            for _ in 0..n {
                let a = sw.handle_tap_frame(black_box(&f), now, reply);
                assert!(matches!(a, vswitch_before::Action::ToPeer { .. }));
            }
            t.elapsed().as_nanos() as f64 / n as f64
        };
        let mut run_after = |sw: &mut vswitch_after::Switch<u32>, reply: &mut [u8], n: u64| {
            let t = Instant::now();
            for _ in 0..n {
                let a = sw.handle_tap_frame(black_box(&mut g), now, reply);
                assert!(matches!(a, vswitch_after::Action::ToPeer { .. }));
            }
            t.elapsed().as_nanos() as f64 / n as f64
        };
        let kind = if tcp { "tcp_ack_1434B" } else { "udp_1434B" };
        match args.get(1).map(String::as_str) {
            Some("before") => println!("{kind} before {:.2} ns", run_before(&mut before, &mut reply, n)),
            Some("after") => println!("{kind} after {:.2} ns", run_after(&mut after, &mut reply, n)),
            _ => {
                let (mut b, mut a) = (Vec::new(), Vec::new());
                for _ in 0..10 {
                    b.push(run_before(&mut before, &mut reply, n / 10));
                    a.push(run_after(&mut after, &mut reply, n / 10));
                }
                b.sort_by(f64::total_cmp);
                a.sort_by(f64::total_cmp);
                println!("{kind}: before median {:.2} ns (min {:.2}), after median {:.2} ns (min {:.2})", b[5], b[0], a[5], a[0]);
            }
        }
    }
}
EOF
(cd "$dir/drv" && CARGO_TARGET_DIR="$dir/target" cargo build --release --quiet)
bin="$dir/target/release/ab"
echo "interleaved, $frames frames per kind (10 rounds each, median and best round):"
"$bin" ab "$frames"
if command -v valgrind >/dev/null; then
    for v in before after; do
        ir=$(valgrind --tool=callgrind --callgrind-out-file="$dir/cg.$v" "$bin" "$v" 200000 2>&1 |
            sed -n 's/.*Collected : //p')
        echo "$v: $((ir / 400000)) instructions per frame (callgrind, 400000 frames, loop included)"
    done
fi
