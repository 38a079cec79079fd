#!/usr/bin/env bash
# The distributed router's and VEPA's price (issue 31, item 8), in one run: iperf3 TCP, one
# stream, in rounds that alternate the order, between
#   - two interface members of one subnet (A -> B, 10.61.0.0/24): switched;
#   - interface members of two subnets (A -> C, 10.62.0.0/24): routed in one hop at A's
#     agent (TTL lowered, sent straight to C);
#   - two plain LAN hosts of a router with VEB ports (the bridge carries it, no agent);
#   - two plain LAN hosts of a router with VEPA ports (every frame through the agent and
#     back: proxy ARP, anti-spoofing, the policy's check, a TAP read and write).
# All agents on one underlay bridge, each LAN host on its router's own bridge. Prints each
# round and the medians as a Markdown table. Needs root. Usage:
#   benches/subnets-throughput.sh [seconds-per-iperf-run]      (default 5)
# Environment: HYPHAE_BIN (default target/release/hyphae, built if missing), ROUNDS (3).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || exec sudo -E "$0" "$@"
secs=${1:-5}
rounds=${ROUNDS:-3}
scripts/deps iperf3 jq >/dev/null
HYPHAE_BIN=${HYPHAE_BIN:-target/release/hyphae}
[ -x "$HYPHAE_BIN" ] || cargo build --release --quiet --bin hyphae

p=hysn$$
dir=$(mktemp -d /tmp/hysubnets.XXXXXX)
namespaces=()
pids=()
cleanup() {
    for f in "$dir"/iperf-*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    sleep 0.5
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT
at() { local ns=$1; shift; ip netns exec "$p-$ns" "$@"; }
newns() { ip netns add "$p-$1"; namespaces+=("$p-$1"); at "$1" ip link set lo up; }
n=0
# plug SWITCH BRIDGE HOST IFNAME MTU: a veth from BRIDGE of SWITCH into HOST.
plug() {
    n=$((n + 1))
    at "$1" ip link add "v$n" type veth peer name "$4" netns "$p-$3"
    at "$1" ip link set "v$n" master "$2" up
    at "$3" ip link set "$4" mtu "$5" up
}
newns u
at u ip link add br0 type bridge
at u ip link set br0 up
secret=$dir/lab.secret
(umask 077; echo "a namespace secret for the benchmark" >"$secret")
agent() { # NAME UNDERLAY-IP NAMESPACE-LINES
    mkdir -p "$dir/$1"
    cat >"$dir/$1/hyphae.toml" <<EOF
[agent]
state_dir = "$dir/$1/state"
control_socket = "$dir/$1/hyphae.sock"
listen = "$2:7400"

[[namespace]]
name = "lab"
secret_file = "$secret"
subnets = ["10.61.0.0/24", "10.62.0.0/24"]
$3
EOF
    ip netns exec "$p-$1" "$HYPHAE_BIN" up -c "$dir/$1/hyphae.toml" >"$dir/$1/agent.log" 2>&1 &
    pids+=($!)
    sleep 0.5
}
host() { newns "$1"; plug u br0 "$1" eth0 1500; at "$1" ip addr add "$2/24" dev eth0; }
# router NAME UNDERLAY-IP PORTS HOST1 IP1 HOST2 IP2: a router whose own bridge holds two hosts.
router() {
    host "$1" "$2"
    at "$1" ip link add brlan type bridge
    at "$1" ip link set brlan up
    for h in "$4:$5" "$6:$7"; do
        newns "${h%%:*}"
        plug "$1" brlan "${h%%:*}" eth0 1420
        at "${h%%:*}" ip addr add "${h##*:}/24" brd + dev eth0
    done
    agent "$1" "$2" $'subnet = "10.61.0.0/24"\nmode = "router"\ndevice = "hyr0"\nbridge = "brlan"\n'"lan_ports = \"$3\""$'\n'"$boot"
}

boot='bootstrap = ["10.200.0.1:7400"]'
host a 10.200.0.1
agent a 10.200.0.1 $'address = "10.61.0.10"'
host b 10.200.0.2
agent b 10.200.0.2 $'address = "10.61.0.11"\n'"$boot"
host c 10.200.0.3
agent c 10.200.0.3 $'address = "10.62.0.10"\n'"$boot"
router rb 10.200.0.4 veb lb1 10.61.0.101 lb2 10.61.0.102
router rp 10.200.0.5 vepa lp1 10.61.0.111 lp2 10.61.0.112

wait_ping() { # FROM TO
    for _ in $(seq 60); do at "$1" ping -c1 -W1 "$2" >/dev/null 2>&1 && return 0; done
    echo "$1 cannot reach $2" >&2
    exit 1
}
gbps() { # FROM SERVER-NS SERVER-IP
    at "$2" iperf3 -s -1 -D -I "$dir/iperf-$2.pid" >/dev/null 2>&1
    sleep 0.3
    at "$1" iperf3 -c "$3" -t "$secs" -J | jq -r '.end.sum_received.bits_per_second / 1e9 | . * 100 | round / 100'
}
wait_ping a 10.61.0.11
wait_ping a 10.62.0.10
wait_ping lb1 10.61.0.102
wait_ping lp1 10.61.0.112
wait_ping lp2 10.61.0.111

if [ -n "${SHOW_PEERS:-}" ]; then
    ip netns exec "$p-a" "$HYPHAE_BIN" status -c "$dir/a/hyphae.toml" --json |
        jq -c '.namespaces[0].peers[] | {addresses, path, endpoint, shards}' >&2
fi
declare -A results
kinds=(same routed veb vepa)
run() {
    case $1 in
        same) gbps a b 10.61.0.11 ;;
        routed) gbps a c 10.62.0.10 ;;
        veb) gbps lb1 lb2 10.61.0.102 ;;
        vepa) gbps lp1 lp2 10.61.0.112 ;;
    esac
}
for r in $(seq "$rounds"); do
    order=("${kinds[@]}")
    if [ $((r % 2)) = 0 ]; then order=(vepa veb routed same); fi
    line="round $r:"
    for k in "${order[@]}"; do
        v=$(run "$k")
        results[$k]="${results[$k]:-} $v"
        line="$line $k $v"
    done
    echo "$line" >&2
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
hairpinned=$(ip netns exec "$p-rp" "$HYPHAE_BIN" status -c "$dir/rp/hyphae.toml" --json | jq '.namespaces[0].hairpinned')
echo "| path | Gb/s (median of $rounds) | each round |"
echo "|---|---|---|"
echo "| one subnet, A -> B (switched) | $(echo "${results[same]}" | median) |${results[same]} |"
echo "| two subnets, A -> C (routed in one hop) | $(echo "${results[routed]}" | median) |${results[routed]} |"
echo "| LAN hosts, VEB ports (the bridge) | $(echo "${results[veb]}" | median) |${results[veb]} |"
echo "| LAN hosts, VEPA ports (hairpin through the agent) | $(echo "${results[vepa]}" | median) |${results[vepa]} |"
echo "VEPA router: $hairpinned frames hairpinned" >&2
