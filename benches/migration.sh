#!/usr/bin/env bash
# Migration of a plain LAN host between two router sites (issue 14, IPOP Sec. 6.4, Fig. 12):
#   - interface host I (10.201.0.31) on the underlay, pinging the VM every 10 ms,
#   - router sites R1 and R2 (uplinks to LAN 1 and LAN 2),
#   - the VM (10.201.0.50, no hyphae), a veth whose bridge end moves between LAN 1's and
#     LAN 2's bridge, keeping its IP and MAC, and then announces itself: with RARP frames
#     laid out as QEMU's announce-self sends them (5 frames, 50 ms then 100 ms apart more each
#     time, as QEMU's defaults) in one series, with gratuitous ARP (`arping -U -c 3`) in the
#     other. The VM's ARP entry for I survives each move, as a live-migrated guest's does.
# MOVES moves per series, back and forth. Per move: downtime (last echo reply before the move
# to the first reply to a request sent after it, from ping -D), and the handoff time from the target router's own log
# (the move to its "LAN host moved here" line, or "address claimed" for a plain claim). A move not back within TIMEOUT seconds counts as
# TIMEOUT (printed as ">TIMEOUT"). A TCP stream (iperf3, 1 Mb/s, I -> VM) runs through all
# moves; the last line says whether it is still alive. Needs root. Usage:
#   benches/migration.sh [MOVES] [TIMEOUT]            (defaults 20, 90)
# Environment: HYPHAE_BIN (default target/release/hyphae, built if missing), LAN_TIMEOUT
# (routers' lan_timeout_secs, default the agent's default).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || exec sudo -E "$0" "$@"
moves=${1:-20}
timeout=${2:-90}
scripts/deps iperf3 iputils-arping python3 >/dev/null
HYPHAE_BIN=${HYPHAE_BIN:-target/release/hyphae}
[ -x "$HYPHAE_BIN" ] || cargo build --release --quiet --bin hyphae
lan_timeout_line=""
[ -n "${LAN_TIMEOUT:-}" ] && lan_timeout_line="lan_timeout_secs = $LAN_TIMEOUT"

p=hymg$$
dir=$(mktemp -d /tmp/hymigrate.XXXXXX)
namespaces=()
pids=()
cleanup() {
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

boot='bootstrap = ["10.200.0.1:7400"]'
router=$'mode = "router"\ndevice = "hyr0"\nbridge = "brlan"\nuplink = "eth1"\n'"$lan_timeout_line"$'\n'"$boot"
host i 10.200.0.1
agent i 10.200.0.1 $'mode = "interface"\naddress = "10.201.0.31"'
host r1 10.200.0.2
plug lan1 r1 eth1 1500
agent r1 10.200.0.2 "$router"
host r2 10.200.0.3
plug lan2 r2 eth1 1500
agent r2 10.200.0.3 "$router"
# The VM: its bridge end is v$n, in LAN 1's namespace to begin with.
newns vm
plug lan1 vm eth0 1420
vmport=v$n
at vm ip addr add 10.201.0.50/16 brd + dev eth0
vm_at=lan1

wait_ping() { # FROM TO
    for _ in $(seq 60); do at "$1" ping -c1 -W1 "$2" >/dev/null 2>&1 && return 0; done
    echo "$1 cannot reach $2" >&2
    exit 1
}
wait_ping vm 10.201.0.31
wait_ping i 10.201.0.50

# QEMU's announce-self (net/announce.c): RARP, EtherType 0x8035, operation 3, the MAC as
# sender and target, no addresses; 5 rounds, 50 ms then 100 ms more each time.
cat >"$dir/rarp.py" <<'EOF'
import socket, time
mac = bytes.fromhex(open('/sys/class/net/eth0/address').read().strip().replace(':', ''))
frame = b'\xff' * 6 + mac + b'\x80\x35' + b'\x00\x01\x08\x00\x06\x04\x00\x03'
frame += mac + bytes(4) + mac + bytes(4)
frame += bytes(60 - len(frame))
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(('eth0', 0))
for i in range(5):
    s.send(frame)
    time.sleep(0.05 + 0.1 * i)
EOF

# The TCP stream and the pinger run through every move.
at vm iperf3 -s -D -I "$dir/iperf-s.pid" >/dev/null 2>&1
sleep 0.3
pids+=("$(cat "$dir/iperf-s.pid")")
at i iperf3 -c 10.201.0.50 -t 86400 -b 1M >"$dir/iperf-c.log" 2>&1 &
iperf_pid=$!
pids+=("$iperf_pid")
at i ping -D -i 0.01 -W 1 10.201.0.50 >"$dir/ping.log" 2>&1 &
pids+=($!)
sleep 2

now() { date +%s.%N; }
# Timestamps (Unix seconds) of echo replies to requests sent after T (received at the
# printed time, sent one round trip earlier): a reply in flight during the move is not one.
replies_after() {
    awk -v t="$1" -F'[][]' '/bytes from/ {
        rtt = 0
        if (match($3, /time=[0-9.]+/)) rtt = substr($3, RSTART + 5, RLENGTH - 5) / 1000
        if ($2 - rtt > t) print $2
    }' "$dir/ping.log"
}
last_reply_before() { awk -v t="$1" -F'[][]' '/bytes from/ && $2 <= t { last = $2 } END { print last }' "$dir/ping.log"; }
# Unix time of the first "address claimed" line in router R's log after T.
claimed_after() {
    { grep -hE "LAN host moved here|LAN host's address claimed" "$dir/$1/agent.log" || true; } | sed 's/\x1b\[[0-9;]*m//g' |
        awk '{ print $1 }' | while read -r ts; do
            u=$(date -d "$ts" +%s.%N)
            if awk -v a="$u" -v b="$2" 'BEGIN { exit !(a > b) }'; then echo "$u"; break; fi
        done
}

move() { # HOW: rarp or garp
    local to router
    if [ "$vm_at" = lan1 ]; then to=lan2; router=r2; else to=lan1; router=r1; fi
    local t0 mac
    # A live-migrated guest keeps its ARP cache; moving the veth flushes it (carrier loss),
    # so the entry for the pinging host is put back as it was.
    mac=$(at vm ip neigh show 10.201.0.31 dev eth0 | awk '{ for (i = 1; i < NF; i++) if ($i == "lladdr") print $(i + 1) }')
    t0=$(now)
    at "$vm_at" ip link set "$vmport" netns "$p-$to"
    at "$to" ip link set "$vmport" master br0 up
    [ -n "$mac" ] && at vm ip neigh replace 10.201.0.31 lladdr "$mac" dev eth0 nud reachable
    vm_at=$to
    # The VM is on the new LAN from here: only requests sent after this count as back.
    local t1
    t1=$(now)
    case $1 in
        rarp) at vm python3 "$dir/rarp.py" ;;
        garp) at vm arping -q -U -c 3 -I eth0 10.201.0.50 || true ;;
    esac
    local back=""
    for _ in $(seq $((timeout * 10))); do
        back=$(replies_after "$t1" | head -1 || true)
        [ -n "$back" ] && break
        sleep 0.1
    done
    local before down handoff
    before=$(last_reply_before "$t0")
    # Still down from the move before (no reply in the last second): count from the move.
    before=$(awk -v b="${before:-0}" -v t="$t0" 'BEGIN { print (t - b > 1) ? t : b }')
    if [ -n "$back" ]; then
        down=$(awk -v a="$back" -v b="$before" 'BEGIN { printf "%.2f", a - b }')
    else
        down=">$timeout"
    fi
    handoff=$(claimed_after "$router" "$t0" || true)
    if [ -n "$handoff" ]; then
        handoff=$(awk -v a="$handoff" -v b="$t0" 'BEGIN { printf "%.2f", a - b }')
    else
        handoff="-"
    fi
    echo "$1 $down $handoff"
    sleep 2
}

stats() { # label, then values on stdin (">T": not back within T s, printed as ">T")
    sed 's/^>\(.*\)/\1 >/' | sort -n | awk -v label="$1" '
        { v[NR] = $1; c[NR] = ($2 == ">") ? ">" : "" }
        function at(i) { return c[i] sprintf("%.2f", v[i]) }
        END {
            if (NR == 0) { print "| " label " | - | - | 0 |"; exit }
            if (NR % 2) m = at((NR + 1) / 2)
            else m = c[NR / 2 + 1] sprintf("%.2f", (v[NR / 2] + v[NR / 2 + 1]) / 2)
            printf "| %s | %s | %s | %d |\n", label, m, at(NR), NR
        }'
}

for how in rarp garp; do
    for _ in $(seq "$moves"); do move "$how"; done
done >"$dir/moves.txt"

echo "| series | median downtime (s) | worst downtime (s) | moves |"
echo "|---|---|---|---|"
awk '$1 == "rarp" { print $2 }' "$dir/moves.txt" | stats "RARP (QEMU announce-self)"
awk '$1 == "garp" { print $2 }' "$dir/moves.txt" | stats "gratuitous ARP (arping -U)"
awk '$1 == "rarp" && $3 != "-" { print $3 }' "$dir/moves.txt" | stats "RARP: handoff time, target's log"
awk '$1 == "garp" && $3 != "-" { print $3 }' "$dir/moves.txt" | stats "gratuitous ARP: handoff time, target's log"
echo
echo "moves (series, downtime s, handoff s):"
cat "$dir/moves.txt"
if kill -0 "$iperf_pid" 2>/dev/null; then
    echo "TCP stream (iperf3 I -> VM): alive after all moves"
else
    echo "TCP stream (iperf3 I -> VM): ended: $(tail -3 "$dir/iperf-c.log" | tr '\n' ' ')"
fi
