#!/usr/bin/env bash
# A rack powering on (issue 17, item 2): CLIENTS DHCP clients with distinct client ids start
# behind one router agent, and ISC Kea's perfdhcp (a standard DHCP load generator) plays
# them; dnsmasq, a plain DHCP server on the same machine, is the baseline in the same run.
#
# Setup (network namespaces on this machine): member A (static 10.213.0.10) starts the
# overlay; router R bootstraps from A and bridges LAN L (R's eth1 to L's eth0). perfdhcp
# runs in L as the relay agent of its simulated clients (giaddr 10.213.0.2, in the
# namespace subnet), with CLIENTS distinct MACs and client ids (-R), full DORA. The
# baseline: dnsmasq in namespace D, reached from L's eth1 (giaddr 10.215.0.2).
# Two scenarios per server:
#   spread     CLIENTS exchanges at CLIENTS a second (-r, -n): all start within a second;
#              perfdhcp does not retransmit, so a late answer counts as lost
#   avalanche  a DISCOVER from every client at once, retransmitted with backoff until
#              answered (--scenario avalanche)
# DISCOVER-to-OFFER latency is read from a pcap taken in L (tcpdump): per client, its first
# DISCOVER to its first OFFER (retransmission waits included); p50 and p99 by nearest rank.
# "answered" counts clients whose OFFER reached L. Also checked: no address ACKed twice,
# and the router holds every client's address in the DHT. Prints a Markdown table.
# Needs root. Usage:
#   benches/dhcp-rack.sh [clients]          (default 200)
# Environment: HYPHAE_BIN (default target/release/hyphae, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || exec sudo -E "$0" "$@"
clients=${1:-200}
scripts/deps kea-admin jq >/dev/null
D=hyrackD$$

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
    for ns in "$D" "$L" "$R" "$A"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT
inA() { ip netns exec "$A" "$@"; }
inR() { ip netns exec "$R" "$@"; }
inL() { ip netns exec "$L" "$@"; }

for ns in "$A" "$R" "$L" "$D"; do
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
# The baseline's link: L's eth1 to D's eth0.
inL ip link add eth1 type veth peer name eth0 netns "$D"
inL ip addr add 10.215.0.2/16 dev eth1
inL ip link set eth1 up
ip netns exec "$D" ip addr add 10.215.0.1/16 dev eth0
ip netns exec "$D" ip link set eth0 up

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


# The baseline: dnsmasq serving 10.215.0.0/16 to relayed clients (no ping before an offer,
# no DNS, no per-lease logging: the DHCP path alone).
ip netns exec "$D" dnsmasq --keep-in-foreground --conf-file=/dev/null --port=0 \
    --interface=eth0 --bind-interfaces --dhcp-range=10.215.1.0,10.215.255.254,255.255.0.0,1h \
    --dhcp-lease-max=100000 --leasefile-ro --no-ping --quiet-dhcp \
    --pid-file= --log-facility=- 2>"$dir/dnsmasq.log" &
pids+=($!)
sleep 0.5

# Per client (its hardware address) in `tcpdump -n -tt -v` of DHCP: its first DISCOVER and
# first OFFER. Prints "answered clients p50 p99 max" (ms).
latency() {
    awk '
        /^[0-9]+\.[0-9]+ IP/ { ts = $1 }
        /Client-Ethernet-Address/ { mac = $2 }
        /DHCP-Message \(53\)/ {
            if ($NF == "Discover" && !(mac in d)) d[mac] = ts
            if ($NF == "Offer" && !(mac in o)) o[mac] = ts
        }
        END { for (m in d) if (m in o) printf "%.3f\n", (o[m] - d[m]) * 1000; else print "none" }
    ' | sort -n | awk '
        $1 == "none" { total++; next }
        { total++; v[++n] = $1 }
        function rank(p) { i = int(p * n); if (i < p * n) i++; if (i < 1) i = 1; return v[i] }
        END { printf "%d %d %.1f %.1f %.1f\n", n, total, rank(0.5), rank(0.99), v[n] }
    '
}

# run NAME SERVER-IFACE BASE-MAC SCENARIO: perfdhcp in L, captured; prints a table row.
run() {
    local name=$1 ifc=$2 mac=$3 scenario=$4 cap="$dir/$1-$4.pcap"
    ip netns exec "$L" tcpdump -i "$ifc" -n -U -w "$cap" udp port 67 2>/dev/null &
    local tcpdump=$!
    pids+=("$tcpdump")
    sleep 1
    local args=(-4 -l "$ifc" -R "$clients" -u -b "mac=$mac")
    if [ "$scenario" = spread ]; then
        args+=(-r "$clients" -n "$clients" -d 5)
    else
        args+=(--scenario avalanche)
    fi
    timeout 120 ip netns exec "$L" perfdhcp "${args[@]}" >"$dir/$name-$scenario.out" 2>&1 || true
    sleep 2 # late OFFERs still reach the capture
    kill "$tcpdump"
    wait "$tcpdump" 2>/dev/null || true
    local dup
    # Addresses ACKed twice (among OFFERs, perfdhcp counts a second OFFER of the same
    # address to a client that retransmitted its DISCOVER as non-unique).
    dup=$(awk '/Statistics for: REQUEST-ACK/ {ack = 1} ack && /non unique addresses:/ {print $4; exit}' \
        "$dir/$name-$scenario.out")
    local got
    got=$(awk '/^received packets:/ {print $3; exit}' "$dir/$name-$scenario.out")
    read -r answered total p50 p99 max < <(tcpdump -r "$cap" -n -tt -v 2>/dev/null | latency)
    echo "| $name | $scenario | $total | $answered | ${got:-0} | $p50 | $p99 | $max | ${dup:-?} |"
}

echo "| server | scenario | clients | answered (wire) | OFFERs perfdhcp counted | p50 ms | p99 ms | max ms | addresses ACKed twice |"
echo "|---|---|---|---|---|---|---|---|---|"
run hyphae eth0 02:17:01:00:00:00 spread
run dnsmasq eth1 02:17:02:00:00:00 spread
run hyphae eth0 02:17:03:00:00:00 avalanche
run dnsmasq eth1 02:17:04:00:00:00 avalanche
# Every client's address is claimed by the router in the DHT: 2 x CLIENTS leases, plus
# L's own address (the router claims the LAN hosts it sees).
held=$(status "$R" r | jq '.namespaces[0].addresses | length')
echo
echo "router: $held addresses held in the DHT (expected $((2 * clients)) + 1 for L's own)"
status "$R" r | jq -c '.namespaces[0] | {dhcp_requests, dhcp_replies, dhcp_naks, dhcp_relayed}'
