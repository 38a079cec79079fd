#!/usr/bin/env bash
# Endurance (issue 33, item 7): agents in network namespaces for DURATION seconds while
# everything that happens to a real namespace happens to them, and what it cost at the end.
#
# Topology: an underlay bridge with five interface-mode members h1..h5 (`auto` addresses, h1
# starts the overlay, the others bootstrap from h1 and h4) and a router-mode member r6 whose
# LAN holds two busybox udhcpc clients (l1, l2). `lease_secs = 60`: member leases renew every
# 20 s and the DHCP clients renew every 30 s, all through the DHT.
# Throughout: a TCP stream (iperf3, 50 Mbit/s, 1 s reports) from h3 to h2 over the overlay.
# Events: every 150 s h4 or h5 (in turn) is killed with SIGKILL and restarted 3 s later; at
# 30% of the run the first member h1 is killed and restarted; at 60% the underlay is cut
# (nftables: {h1,h2,h3} from {h4,h5,r6}) for 60 s, then healed.
# Every 10 s: each agent's RSS and open descriptors, each agent's leases (`hyphae status`)
# and each DHCP client's address.
# Reports: per agent, RSS and descriptors at its first sample (60 s after it last started)
# and at the end; stream seconds, seconds with nothing delivered (interruptions) and stream
# restarts; samples where one address had two holders (outside the cut, and during it);
# leases lost (a running agent's or a DHCP client's address changed or went away); restarts
# and how long each member took to hold its address again.
# Needs root. Usage:
#   benches/soak.sh [seconds]        (default 1800)
# Environment: HYPHAE_BIN (default target/release/hyphae, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || exec sudo -E "$0" "$@"
duration=${1:-1800}
[[ $duration =~ ^[0-9]+$ ]] && [ "$duration" -ge 120 ] || { echo "soak: at least 120 s" >&2; exit 2; }
scripts/deps iperf3 jq busybox nftables >/dev/null
HYPHAE_BIN=${HYPHAE_BIN:-target/release/hyphae}
[ -x "$HYPHAE_BIN" ] || cargo build --release --quiet --bin hyphae
HYPHAE_BIN=$(realpath "$HYPHAE_BIN")

p=hysk$$
dir=$(mktemp -d /tmp/hysoak.XXXXXX)
namespaces=()
declare -A pid
others=()
cleanup() {
    for x in "${pid[@]}" "${others[@]}"; do kill "$x" 2>/dev/null || true; done
    sleep 2
    for x in "${pid[@]}" "${others[@]}"; do { kill -9 "$x" && wait "$x"; } 2>/dev/null || true; done
    # Whatever still runs inside the namespaces this script made (a stream's client).
    for ns in "${namespaces[@]}"; do
        for x in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$x" 2>/dev/null || true; done
    done
    for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT
at() { local ns=$1; shift; ip netns exec "$p-$ns" "$@"; }
newns() { ip netns add "$p-$1"; namespaces+=("$p-$1"); at "$1" ip link set lo up; }
n=0
plug() { # SWITCH HOST IFNAME: a veth from SWITCH's br0 into HOST
    n=$((n + 1))
    at "$1" ip link add "v$n" type veth peer name "$3" netns "$p-$2"
    at "$1" ip link set "v$n" master br0 up
    at "$2" ip link set "$3" up
}
newswitch() { newns "$1"; at "$1" ip link add br0 type bridge; at "$1" ip link set br0 up; }
underlay() { echo "10.216.0.$1"; }

newswitch sw
newswitch lan
members=(h1 h2 h3 h4 h5 r6)
for i in 1 2 3 4 5 6; do
    h=${members[$((i - 1))]}
    newns "$h"
    plug sw "$h" eth0
    at "$h" ip addr add "$(underlay "$i")/24" dev eth0
done
plug lan r6 eth1
for l in l1 l2; do newns "$l"; plug lan "$l" eth0; done

(umask 077; "$HYPHAE_BIN" secret >"$dir/lab.secret")
config() { # NAME INDEX EXTRA-LINES
    cat <<EOF
[agent]
state_dir = "$dir/$1/state"
control_socket = "$dir/$1/hyphae.sock"
listen = "$(underlay "$2"):7400"

[[namespace]]
name = "lab"
secret_file = "$dir/lab.secret"
subnet = "10.217.0.0/24"
lease_secs = 60
$3
EOF
}
for i in 1 2 3 4 5; do
    mkdir -p "$dir/h$i"
    boot=""
    [ "$i" -gt 1 ] && boot="bootstrap = [\"$(underlay 1):7400\", \"$(underlay 4):7400\"]"
    config "h$i" "$i" "address = \"auto\"
device = \"hyphae0\"
$boot" >"$dir/h$i/hyphae.toml"
done
mkdir -p "$dir/r6"
config r6 6 "mode = \"router\"
device = \"hyr0\"
bridge = \"brlan\"
uplink = \"eth1\"
bootstrap = [\"$(underlay 1):7400\", \"$(underlay 4):7400\"]" >"$dir/r6/hyphae.toml"

t0=$(date +%s)
now() { echo $(($(date +%s) - t0)); }
declare -A started restarts back_after
start() { # NAME: `ip netns exec` execs the agent, so $! is its PID
    HYPHAE_LOG=info ip netns exec "$p-$1" "$HYPHAE_BIN" up -c "$dir/$1/hyphae.toml" \
        >>"$dir/$1/agent.log" 2>&1 &
    pid[$1]=$!
    started[$1]=$(now)
}
status() { at "$1" "$HYPHAE_BIN" status --json -c "$dir/$1/hyphae.toml" 2>/dev/null; }
claimed() { # NAME: its address once it holds it
    status "$1" | jq -r '.namespaces[0] | select(.address_claimed) | .address' 2>/dev/null
}
wait_claimed() { # NAME SECONDS
    local i
    for i in $(seq $(($2 * 10))); do
        [ -n "$(claimed "$1")" ] && return 0
        sleep 0.1
    done
    return 1
}
for h in "${members[@]}"; do
    start "$h"
    restarts[$h]=0
    sleep 0.3
done
for h in h1 h2 h3 h4 h5; do
    wait_claimed "$h" 60 || { echo "soak: $h holds no address after 60 s" >&2; tail -20 "$dir/$h/agent.log" >&2; exit 1; }
done
# The router has no address of its own: ready once it read the namespace record.
for _ in $(seq 600); do
    [ "$(status r6 | jq -r '.namespaces[0].subnet' 2>/dev/null)" = 10.217.0.0/24 ] && break
    sleep 0.1
done

# DHCP clients on r6's LAN, renewing every half lease (udhcpc's own timers).
for l in l1 l2; do
    cat >"$dir/$l.sh" <<EOF
#!/bin/sh
case "\$1" in
  bound|renew) ip addr flush dev "\$interface"; ip addr add "\$ip/\$mask" dev "\$interface" ;;
  deconfig) ip addr flush dev "\$interface" ;;
esac
EOF
    chmod +x "$dir/$l.sh"
    ip netns exec "$p-$l" busybox udhcpc -f -i eth0 -x "hostname:$l" -s "$dir/$l.sh" \
        >"$dir/$l.log" 2>&1 &
    others+=($!)
done
lan_address() { at "$1" ip -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1; }
for l in l1 l2; do
    for _ in $(seq 300); do [ -n "$(lan_address "$l")" ] && break; sleep 0.1; done
    [ -n "$(lan_address "$l")" ] || { echo "soak: $l got no DHCP lease" >&2; exit 1; }
done

# The stream: h3 to h2, restarted at once if it breaks (each restart counted).
h2addr=$(claimed h2)
ip netns exec "$p-h2" iperf3 -s -B "$h2addr" >"$dir/iperf-server.log" 2>&1 &
others+=($!)
sleep 1
end=$((t0 + duration))
(
    while [ "$(date +%s)" -lt "$end" ]; do
        left=$((end - $(date +%s)))
        [ "$left" -gt 0 ] || break
        echo "RUN $(date +%s)"
        at h3 iperf3 -c "$h2addr" -t "$left" -b 50M -i 1 --forceflush -f m 2>&1 || true
        sleep 0.5
    done
) >"$dir/stream.log" 2>&1 &
others+=($!)

# The cut: every packet between the two sides' underlay addresses dropped, both ways.
side_a=(h1 h2 h3)
side_b=(h4 h5 r6)
cut_underlay() {
    local h entry peers=()
    for h in "${side_a[@]}"; do peers+=("$h:4 5 6"); done
    for h in "${side_b[@]}"; do peers+=("$h:1 2 3"); done
    for entry in "${peers[@]}"; do
        h=${entry%%:*}
        at "$h" nft add table inet soakcut
        at "$h" nft add chain inet soakcut in '{ type filter hook input priority 0; }'
        at "$h" nft add chain inet soakcut out '{ type filter hook output priority 0; }'
        for i in ${entry#*:}; do
            at "$h" nft add rule inet soakcut in ip saddr "$(underlay "$i")" drop
            at "$h" nft add rule inet soakcut out ip daddr "$(underlay "$i")" drop
        done
    done
}
heal_underlay() { local h; for h in "${members[@]}"; do at "$h" nft delete table inet soakcut 2>/dev/null || true; done; }

# Samples.
samples=$dir/samples.tsv # time name rss_kb fds
: >"$samples"
dup_outside=0; dup_cut=0; lost=0; lost_detail=()
declare -A last_addr first_rss first_fds last_rss last_fds lan_last
cutting=0
kill_restart() { # NAME: SIGKILL, restart 3 s later, time until it holds its address again
    local h=$1 before after t
    before=$(claimed "$h")
    kill -9 "${pid[$h]}" 2>/dev/null || true
    wait "${pid[$h]}" 2>/dev/null || true
    sleep 3
    t=$(date +%s.%N)
    start "$h"
    restarts[$h]=$((restarts[$h] + 1))
    unset "first_rss[$h]" "first_fds[$h]" "last_addr[$h]"
    if wait_claimed "$h" 60; then
        after=$(claimed "$h")
        back_after[$h]+="$(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')s$([ "$before" = "$after" ] || echo " (new address $after)") "
    else
        back_after[$h]+="not-within-60s "
    fi
}
sample() {
    local t h rss fds a holders
    t=$(now)
    holders=$(mktemp)
    for h in "${members[@]}"; do
        [ -d "/proc/${pid[$h]}" ] || continue
        rss=$(awk '/^VmRSS:/ {print $2}' "/proc/${pid[$h]}/status")
        fds=$(ls "/proc/${pid[$h]}/fd" | wc -l)
        echo -e "$t\t$h\t$rss\t$fds" >>"$samples"
        if [ $((t - started[$h])) -ge 60 ] && [ -z "${first_rss[$h]:-}" ]; then
            first_rss[$h]=$rss; first_fds[$h]=$fds
        fi
        last_rss[$h]=$rss; last_fds[$h]=$fds
        status "$h" | jq -r '.namespaces[0].addresses[]?' 2>/dev/null | sed "s/\$/ $h/" >>"$holders"
        a=$(claimed "$h")
        if [ -n "${last_addr[$h]:-}" ] && [ "$a" != "${last_addr[$h]}" ]; then
            lost=$((lost + 1)); lost_detail+=("$t s: $h ${last_addr[$h]} -> ${a:-none}")
        fi
        if [ -n "$a" ]; then last_addr[$h]=$a; fi
    done
    if [ -n "$(awk '{print $1}' "$holders" | sort | uniq -d)" ]; then
        if [ "$cutting" = 1 ]; then dup_cut=$((dup_cut + 1)); else
            dup_outside=$((dup_outside + 1))
            echo "$t s: two holders: $(sort "$holders" | awk '{print $1}' | uniq -d | tr '\n' ' ')" >>"$dir/duplicates.log"
        fi
    fi
    rm -f "$holders"
    for l in l1 l2; do
        a=$(lan_address "$l")
        if [ -n "${lan_last[$l]:-}" ] && [ "$a" != "${lan_last[$l]}" ]; then
            lost=$((lost + 1)); lost_detail+=("$t s: DHCP client $l ${lan_last[$l]} -> ${a:-none}")
        fi
        if [ -n "$a" ]; then lan_last[$l]=$a; fi
    done
}

h1_restart=$((duration * 3 / 10))
cut_at=$((duration * 6 / 10))
next_kill=150
victim=h4
did_h1=0; did_cut=0
while [ "$(now)" -lt "$duration" ]; do
    sample
    t=$(now)
    if [ "$did_h1" = 0 ] && [ "$t" -ge "$h1_restart" ]; then
        did_h1=1
        echo "$t s: restarting the first member h1" >&2
        kill_restart h1
    elif [ "$did_cut" = 0 ] && [ "$t" -ge "$cut_at" ]; then
        did_cut=1
        echo "$t s: cut {h1,h2,h3} | {h4,h5,r6} for 60 s" >&2
        cutting=1
        cut_underlay
        sleep 60
        heal_underlay
        # Leases settle (the merge rule) before duplicates count again.
        sleep 10
        cutting=0
        echo "$(now) s: healed" >&2
    elif [ "$t" -ge "$next_kill" ] && [ "$t" -lt $((duration - 60)) ]; then
        next_kill=$((next_kill + 150))
        echo "$t s: kill -9 and restart $victim" >&2
        kill_restart "$victim"
        if [ "$victim" = h4 ]; then victim=h5; else victim=h4; fi
    fi
    sleep 10
done
sample

# The stream's 1 s reports: seconds delivered, and seconds with nothing delivered.
read -r secs zero < <(awk '/sec .* Mbits\/sec/ && !/sender|receiver/ {
    n++; for (i = 1; i <= NF; i++) if ($i == "Mbits/sec") { if ($(i-1) + 0 == 0) z++ }
} END { print n + 0, z + 0 }' "$dir/stream.log")
runs=$(grep -c '^RUN' "$dir/stream.log" || true)

echo
echo "soak: $duration s, $(date -u +%F), $(nproc) cores"
echo
echo "| agent | restarts | back with its address after | RSS first / last (KiB) | RSS growth | fds first / last | fd growth |"
echo "|---|---|---|---|---|---|---|"
for h in "${members[@]}"; do
    fr=${first_rss[$h]:-0}; lr=${last_rss[$h]:-0}; ff=${first_fds[$h]:-0}; lf=${last_fds[$h]:-0}
    g() { [ "$1" -gt 0 ] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%+.1f%%", (b - a) * 100 / a }' || echo "-"; }
    echo "| $h | ${restarts[$h]} | ${back_after[$h]:--} | $fr / $lr | $(g "$fr" "$lr") | $ff / $lf | $(g "$ff" "$lf") |"
done
echo
echo "stream: $secs s reported, $zero s with nothing delivered, $runs run(s) (1 = never broke)"
echo "addresses with two holders: $dup_outside samples outside the cut, $dup_cut during it (10 s apart)"
echo "leases lost: $lost"
for d in "${lost_detail[@]}"; do echo "  $d"; done
if [ -s "$dir/duplicates.log" ]; then sed 's/^/  /' "$dir/duplicates.log"; fi
r6=$(status r6 | jq -c '.namespaces[0] | {dhcp_requests, dhcp_replies, dhcp_naks}' 2>/dev/null || true)
echo "DHCP at r6: $r6"
