#!/usr/bin/env bash
# Namespace throughput benchmark: two hosts (network namespaces) joined by one veth pair,
# measured in the same run through
#   (a) the raw underlay, (b) a kernel VXLAN device, (c) hyphae (UDP socket underlay, and
#   again with `underlay = "af_xdp"`: row hyphae-afxdp), (d) boringtun-cli (userspace
#   WireGuard, the reference).
# For each: iperf3 TCP, 1 stream and 4 streams, and ping RTT. Prints a Markdown table with
# ratios to (a) and (b). Needs root. Usage:
#   benches/netns-throughput.sh [seconds-per-iperf-run]      (default 5)
# Environment: HYPHAE_BIN (default target/release/hyphae, built if missing),
#              HYPHAE_BASELINE_BIN (optional: another hyphae build, measured as an extra row,
#                                   e.g. the previous commit, for before/after in one run),
#              BORINGTUN_BIN (default: boringtun-cli on PATH, installed with cargo if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || exec sudo -E "$0" "$@"
secs=${1:-5}
scripts/deps iperf3 wireguard-tools jq >/dev/null

HYPHAE_BIN=${HYPHAE_BIN:-target/release/hyphae}
[ -x "$HYPHAE_BIN" ] || cargo build --release --quiet --bin hyphae
if [ -z "${BORINGTUN_BIN:-}" ]; then
    if ! command -v boringtun-cli >/dev/null; then
        echo "installing boringtun-cli from crates.io (once)..." >&2
        cargo install --quiet --locked boringtun-cli
    fi
    BORINGTUN_BIN=$(command -v boringtun-cli)
fi

id=$$
A=hybenchA$id
B=hybenchB$id
dir=$(mktemp -d /tmp/hybench.XXXXXX)
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
inA() { ip netns exec "$A" "$@"; }
inB() { ip netns exec "$B" "$@"; }

ip netns add "$A"
ip netns add "$B"
inA ip link add eth0 type veth peer name eth0 netns "$B"
inA ip addr add 10.210.0.1/24 dev eth0
inB ip addr add 10.210.0.2/24 dev eth0
for ns in "$A" "$B"; do
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" ip link set eth0 up
done

# (b) kernel VXLAN
inA ip link add vx0 type vxlan id 42 remote 10.210.0.2 local 10.210.0.1 dstport 4789 dev eth0
inB ip link add vx0 type vxlan id 42 remote 10.210.0.1 local 10.210.0.2 dstport 4789 dev eth0
inA ip addr add 10.211.0.1/24 dev vx0
inB ip addr add 10.211.0.2/24 dev vx0
inA ip link set vx0 up
inB ip link set vx0 up

# (c) hyphae
(umask 077; "$HYPHAE_BIN" secret >"$dir/lab.secret")
for side in A B; do
    if [ $side = A ]; then me=1; peer=2; else me=2; peer=1; fi
    cat >"$dir/$side.toml" <<EOF
[agent]
state_dir = "$dir/$side-state"
control_socket = "$dir/$side.sock"
listen = "10.210.0.$me:7400"
underlay = "socket"
[[namespace]]
name = "bench"
secret_file = "$dir/lab.secret"
subnet = "10.212.0.0/24"
# .1 is the namespace service address (virtual DHCP/DNS): members take .11 and .12.
address = "10.212.0.1$me"
device = "hyphae0"
[[namespace.peer]]
endpoint = "10.210.0.$peer:7400"
EOF
done
# Started with `ip netns exec` directly (not through a shell function, which would fork a
# subshell) so that $! is the process itself and cleanup can kill it by PID.
hyphae_pids=()
start_hyphae() {
    HYPHAE_LOG=warn ip netns exec "$A" "$1" up -c "$dir/A.toml" >>"$dir/A.log" 2>&1 &
    pids+=($!); hyphae_pids=($!)
    HYPHAE_LOG=warn ip netns exec "$B" "$1" up -c "$dir/B.toml" >>"$dir/B.log" 2>&1 &
    pids+=($!); hyphae_pids+=($!)
}
stop_hyphae() {
    kill "${hyphae_pids[@]}" 2>/dev/null || true
    for p in "${hyphae_pids[@]}"; do
        for i in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    done
}
start_hyphae "$HYPHAE_BIN"
set_underlay() { sed -i "s/^underlay = .*/underlay = \"$1\"/" "$dir/A.toml" "$dir/B.toml"; }

# (d) boringtun-cli: userspace WireGuard on a TUN device, configured with wg(8)
ka=$(wg genkey); kb=$(wg genkey)
pa=$(echo "$ka" | wg pubkey); pb=$(echo "$kb" | wg pubkey)
WG_SUDO=1 ip netns exec "$A" "$BORINGTUN_BIN" wgA$id --foreground --disable-drop-privileges >"$dir/btA.log" 2>&1 &
pids+=($!)
WG_SUDO=1 ip netns exec "$B" "$BORINGTUN_BIN" wgB$id --foreground --disable-drop-privileges >"$dir/btB.log" 2>&1 &
pids+=($!)
for i in $(seq 50); do
    inA ip link show wgA$id >/dev/null 2>&1 && inB ip link show wgB$id >/dev/null 2>&1 && break
    sleep 0.1
done
inA wg set wgA$id private-key <(echo "$ka") listen-port 51820 \
    peer "$pb" allowed-ips 10.213.0.2/32 endpoint 10.210.0.2:51820
inB wg set wgB$id private-key <(echo "$kb") listen-port 51820 \
    peer "$pa" allowed-ips 10.213.0.1/32 endpoint 10.210.0.1:51820
inA ip addr add 10.213.0.1/24 dev wgA$id
inB ip addr add 10.213.0.2/24 dev wgB$id
inA ip link set wgA$id mtu 1420 up
inB ip link set wgB$id mtu 1420 up

wait_ping() {
    for i in $(seq 100); do inA ping -c 1 -W 1 "$1" >/dev/null 2>&1 && return 0; sleep 0.2; done
    echo "no connectivity to $1" >&2
    return 1
}

# iperf3 against a one-shot server in B; prints Gbit/s received.
iperf() {
    local dst=$1 streams=$2
    ip netns exec "$B" iperf3 -s -1 -B "$dst" >/dev/null 2>&1 &
    local srv=$!
    sleep 0.3
    local gbps
    gbps=$(inA iperf3 -c "$dst" -t "$secs" -P "$streams" -J | jq '.end.sum_received.bits_per_second / 1e9')
    wait "$srv" 2>/dev/null || true
    printf '%.2f' "$gbps"
}

rtt() {
    inA ping -c 50 -i 0.02 -q "$1" | awk -F/ '/^rtt/ {printf "%.3f", $5}'
}

declare -A one four ping
rows="raw vxlan hyphae hyphae-afxdp boringtun"
paths="raw:10.210.0.2 vxlan:10.211.0.2 hyphae:10.212.0.12 hyphae-afxdp:10.212.0.12 boringtun:10.213.0.2"
if [ -n "${HYPHAE_BASELINE_BIN:-}" ]; then
    rows="raw vxlan hyphae hyphae-baseline hyphae-afxdp boringtun"
    paths="raw:10.210.0.2 vxlan:10.211.0.2 hyphae:10.212.0.12 hyphae-baseline:10.212.0.12 hyphae-afxdp:10.212.0.12 boringtun:10.213.0.2"
fi
for path in $paths; do
    name=${path%%:*}
    dst=${path#*:}
    if [ "$name" = hyphae-baseline ]; then
        stop_hyphae
        start_hyphae "$HYPHAE_BASELINE_BIN"
    fi
    if [ "$name" = hyphae-afxdp ]; then
        stop_hyphae
        set_underlay af_xdp
        start_hyphae "$HYPHAE_BIN"
        wait_ping "$dst"
        for side in A B; do
            "$HYPHAE_BIN" status -c "$dir/$side.toml" | grep -q "^underlay af_xdp" \
                || { echo "hyphae-afxdp: AF_XDP did not attach on $side: $(cat "$dir/$side.log")" >&2; exit 1; }
        done
    fi
    wait_ping "$dst"
    one[$name]=$(iperf "$dst" 1)
    four[$name]=$(iperf "$dst" 4)
    ping[$name]=$(rtt "$dst")
    echo "$name: 1 stream ${one[$name]} Gb/s, 4 streams ${four[$name]} Gb/s, rtt ${ping[$name]} ms" >&2
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
echo
echo "| path | TCP 1 stream (Gb/s) | TCP 4 streams (Gb/s) | ping RTT avg (ms) | 1 stream / raw | 1 stream / VXLAN | 4 streams / raw | 4 streams / VXLAN |"
echo "|---|---|---|---|---|---|---|---|"
for name in $rows; do
    echo "| $name | ${one[$name]} | ${four[$name]} | ${ping[$name]} | $(ratio "${one[$name]}" "${one[raw]}") | $(ratio "${one[$name]}" "${one[vxlan]}") | $(ratio "${four[$name]}" "${four[raw]}") | $(ratio "${four[$name]}" "${four[vxlan]}") |"
done
echo
echo "$(date -u +%Y-%m-%d), $(nproc) cores, kernel $(uname -r), ${secs}s per iperf3 run, hyphae $("$HYPHAE_BIN" --version | awk '{print $2}'), $("$BORINGTUN_BIN" --version 2>/dev/null | head -1)"
