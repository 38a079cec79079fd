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

A=hyucA$$
B=hyucB$$
dir=$(mktemp -d /tmp/hyudpcpu.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 0.3
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$A" 2>/dev/null || true
    ip netns del "$B" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
ip netns add "$A"
ip netns add "$B"
ip netns exec "$A" ip link add eth0 type veth peer name eth0 netns "$B"
ip netns exec "$A" ip addr add 10.210.0.1/24 dev eth0
ip netns exec "$B" ip addr add 10.210.0.2/24 dev eth0
for ns in "$A" "$B"; do
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" ip link set eth0 up
done
(umask 077; "$HYPHAE_BIN" secret >"$dir/lab.secret")
for side in A B; do
    if [ "$side" = A ]; then me=1; peer=2; else me=2; peer=1; fi
    cat >"$dir/$side.toml" <<EOF
[agent]
state_dir = "$dir/$side-state"
control_socket = "$dir/$side.sock"
listen = "10.210.0.$me:7400"
[[namespace]]
name = "bench"
secret_file = "$dir/lab.secret"
subnet = "10.212.0.0/24"
address = "10.212.0.1$me"
device = "hyphae0"
[[namespace.peer]]
endpoint = "10.210.0.$peer:7400"
EOF
done

cpu() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

measure() { # label binary
    rm -rf "$dir/A-state" "$dir/B-state"
    HYPHAE_LOG=warn ip netns exec "$A" "$2" up -c "$dir/A.toml" >>"$dir/$1-A.log" 2>&1 &
    local a=$!
    HYPHAE_LOG=warn ip netns exec "$B" "$2" up -c "$dir/B.toml" >>"$dir/$1-B.log" 2>&1 &
    local b=$!
    pids+=("$a" "$b")
    local i
    for i in $(seq 150); do
        ip netns exec "$A" ping -c 1 -W 1 10.212.0.12 >/dev/null 2>&1 && break
        sleep 0.2
    done
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
