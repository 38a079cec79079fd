#!/usr/bin/env bash
# Throughput per deployment mode (IPOP Table 2 for hyphae): one namespace with
#   - two interface-mode hosts (I1, I2),
#   - a router-mode site: agent R with uplink to LAN 1, where plain hosts L1 and L2 live,
#   - a hybrid-mode host H with uplink to LAN 2, where plain host P lives,
# all agents on one underlay bridge. For each mode it measures, in the same run, iperf3 TCP
# (1 stream) between two hosts of the same LAN (the bridge carries it, not the agent) and
# from a host of that mode to an interface host through the overlay. Prints a Markdown
# table. Needs root. Usage:
#   benches/modes-throughput.sh [seconds-per-iperf-run]      (default 5)
# Environment: HYPHAE_BIN (default target/release/hyphae, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || exec sudo -E "$0" "$@"
secs=${1:-5}
scripts/deps iperf3 jq >/dev/null
HYPHAE_BIN=${HYPHAE_BIN:-target/release/hyphae}
[ -x "$HYPHAE_BIN" ] || cargo build --release --quiet --bin hyphae

p=hym$$
dir=$(mktemp -d /tmp/hymodes.XXXXXX)
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
# plug SWITCH HOST IFNAME MTU: a veth from bridge br0 of SWITCH into HOST.
plug() {
    n=$((n + 1))
    at "$1" ip link add "v$n" type veth peer name "$3" netns "$p-$2"
    at "$1" ip link set "v$n" master br0 up
    at "$2" ip link set "$3" mtu "$4" up
}
newswitch() { newns "$1"; at "$1" ip link add br0 type bridge; at "$1" ip link set br0 up; }

newswitch u
newswitch lan1
newswitch lan2
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
subnet = "10.201.0.0/16"
$3
EOF
    ip netns exec "$p-$1" "$HYPHAE_BIN" up -c "$dir/$1/hyphae.toml" >"$dir/$1/agent.log" 2>&1 &
    pids+=($!)
    sleep 0.5
}
host() { newns "$1"; plug u "$1" eth0 1500; at "$1" ip addr add "$2/24" dev eth0; }
lanhost() { newns "$2"; plug "$1" "$2" eth0 1420; at "$2" ip addr add "$3/16" brd + dev eth0; }

boot='bootstrap = ["10.200.0.1:7400"]'
host i1 10.200.0.1
agent i1 10.200.0.1 $'mode = "interface"\naddress = "10.201.0.31"'
host i2 10.200.0.2
agent i2 10.200.0.2 $'mode = "interface"\naddress = "10.201.0.32"\n'"$boot"
host r 10.200.0.3
plug lan1 r eth1 1500
lanhost lan1 l1 10.201.0.11
lanhost lan1 l2 10.201.0.12
agent r 10.200.0.3 $'mode = "router"\ndevice = "hyr0"\nbridge = "brlan"\nuplink = "eth1"\n'"$boot"
host h 10.200.0.4
plug lan2 h eth1 1500
lanhost lan2 pl 10.201.0.42
agent h 10.200.0.4 $'mode = "hybrid"\ndevice = "hy0"\nbridge = "brlan"\nuplink = "eth1"\naddress = "10.201.0.21"\n'"$boot"

wait_ping() { # FROM TO
    for _ in $(seq 60); do at "$1" ping -c1 -W1 "$2" >/dev/null 2>&1 && return 0; done
    echo "$1 cannot reach $2" >&2
    exit 1
}
gbps() { # FROM SERVER-NS SERVER-IP
    # One-off server (exits after this client); its PID file lets cleanup kill it.
    at "$2" iperf3 -s -1 -D -I "$dir/iperf-$2.pid" >/dev/null 2>&1
    sleep 0.3
    at "$1" iperf3 -c "$3" -t "$secs" -J | jq -r '.end.sum_received.bits_per_second / 1e9 | . * 100 | round / 100'
}
# Routes are learned from traffic: make every pair speak first.
wait_ping l1 10.201.0.31
wait_ping l1 10.201.0.12
wait_ping h 10.201.0.31
wait_ping h 10.201.0.42
wait_ping i2 10.201.0.31

echo "| mode | LAN (bridge, no agent) Gb/s | overlay to an interface host Gb/s |"
echo "|---|---|---|"
echo "| interface (I2 -> I1) | — | $(gbps i2 i1 10.201.0.31) |"
echo "| router (L1 -> L2 / L1 -> I1) | $(gbps l1 l2 10.201.0.12) | $(gbps l1 i1 10.201.0.31) |"
echo "| hybrid (H -> P / H -> I1) | $(gbps h pl 10.201.0.42) | $(gbps h i1 10.201.0.31) |"
