#!/usr/bin/env bash
# CPU cost of a UDP stream through hyphae: two interface-mode agents in two namespaces over
# one veth pair; iperf3 sends LEN-byte datagrams from A to B at a fixed RATE for SECS seconds
# (below where anything drops, so both builds do the same work), and each agent's CPU
# seconds (utime+stime from /proc/PID/stat) over the stream are printed, with the datagrams
# sent and lost. With HYPHAE_BASELINE_BIN, that build runs the same way, alternating with
# HYPHAE_BIN, ROUNDS times each. Needs root. Usage:
#   benches/udp-cpu.sh [rate] [len] [secs]     (default 40M 64 5)
# Environment: HYPHAE_BIN (default target/release/hyphae, built if missing),
# HYPHAE_BASELINE_BIN, ROUNDS (default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || exec sudo -E "$0" "$@"
rate=${1:-40M}
len=${2:-64}
secs=${3:-5}
rounds=${ROUNDS:-3}
scripts/deps iperf3 jq bc >/dev/null
HYPHAE_BIN=${HYPHAE_BIN:-target/release/hyphae}
[ -x "$HYPHAE_BIN" ] || cargo build --release --quiet --bin hyphae

. benches/lib/pair.sh
pair_setup hyudpcpu
hyphae_config A socket
hyphae_config B socket

cpu() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

measure() { # label binary
    pair_start "$1" "$2"
    local a=$agent_a b=$agent_b i
    ip netns exec "$B" iperf3 -s -1 -D -p 5401 -I "$dir/iperf.pid"
    sleep 0.3
    local a0 b0 a1 b1 result
    a0=$(cpu "$a"); b0=$(cpu "$b")
    result=$(ip netns exec "$A" iperf3 -c 10.212.0.12 -p 5401 -u -l "$len" -b "$rate" -t "$secs" -J |
        jq -r '.end.sum | "\(.packets) \(.lost_packets)"')
    a1=$(cpu "$a"); b1=$(cpu "$b")
    kill "$a" "$b" 2>/dev/null || true
    local p
    for p in "$a" "$b"; do
        for i in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null || true
    done
    read -r sent lost <<<"$result"
    printf '| %s | %s | %s | %.2f | %.2f |\n' "$1" "$sent" "$lost" \
        "$(echo "($a1 - $a0) / $hz" | bc -l)" "$(echo "($b1 - $b0) / $hz" | bc -l)"
}

echo "| build | datagrams sent | lost | sending agent CPU s | receiving agent CPU s |"
echo "|---|---|---|---|---|"
for _ in $(seq "$rounds"); do
    measure hyphae "$HYPHAE_BIN"
    [ -n "${HYPHAE_BASELINE_BIN:-}" ] && measure baseline "$HYPHAE_BASELINE_BIN"
done
echo
echo "$(date -u +%F), $(nproc) cores, kernel $(uname -r), $len-byte datagrams at $rate for ${secs}s, hyphae $("$HYPHAE_BIN" --version | awk '{print $2}')"
