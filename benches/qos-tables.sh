#!/usr/bin/env bash
# The KU paper's isolation tables on this machine (issue 32, item 5; ../shared/seeds/004_…):
#   Table 3, rate caps: three namespaces capped at 50, 200 and 500 Mbit/s, each measured
#     alone with UDP offered at half its cap (non-saturated), at its cap (saturated) and at
#     twice its cap (over-saturated): the rate reached against the expected one
#     (min(offered, cap)), and by how much it ever exceeded the cap;
#   Table 4, weights: the same three namespaces with weights 6:3:1, 1:1:1 and 5:3:2 sharing
#     `uplink_rate`, each offering more than the link at once: each one's share of what
#     arrived against its weight's share, the total against the link, and pings in the
#     lightest namespace under that load.
# Topology: a sender agent S and a receiver agent R, each in namespaces a, b and c, on one
# underlay bridge; S's underlay link is limited to LINK with tbf, and `uplink_rate` is set a
# little under it (the issue: "the underlay limited with HTB/TBF to a known rate").
# Rates are at the IP level, as the caps count them: iperf3's UDP payload rate times
# (payload + 28) / payload. Prints Markdown tables. Needs root. Usage:
#   benches/qos-tables.sh [seconds-per-run]          (default 10)
# Environment: HYPHAE_BIN (default target/release/hyphae, built if missing),
#              LINK (tbf rate of S's underlay link for Table 3, Mbit/s; default 1000),
#              WLINK (the same for Table 4; default 400: three senders and two agents on
#                     this 2-core machine carry about 600-700 Mbit/s in all, so at 1000 the
#                     CPU, not the agent's scheduler, would decide the shares),
#              TABLES (which to run: "caps weights" by default; "members" adds both
#                      tables per member: caps and weights set per receiving member of one
#                      namespace, three receivers),
#              UPLINK (S's uplink_rate for Table 4, Mbit/s; default 94% of WLINK: the tunnel
#                      adds about 5% to what the link carries).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || exec sudo -E "$0" "$@"
secs=${1:-10}
link=${LINK:-1000}
wlink=${WLINK:-400}
uplink=${UPLINK:-$((wlink * 94 / 100))}
# What each namespace offers in Table 4: more than the largest share (60% of the uplink).
offer=$((wlink * 2 / 3))
len=1200
tables=${TABLES:-caps weights}
scripts/deps iperf3 >/dev/null
HYPHAE_BIN=${HYPHAE_BIN:-target/release/hyphae}
[ -x "$HYPHAE_BIN" ] || cargo build --release --quiet --bin hyphae

p=hyq$$
dir=$(mktemp -d /tmp/hyqos.XXXXXX)
namespaces=()
pids=()
servers=()
cleanup() {
    for pid in "${pids[@]}" "${servers[@]}"; do kill "$pid" 2>/dev/null || true; done
    sleep 0.5
    for pid in "${pids[@]}" "${servers[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT
at() { local ns=$1; shift; ip netns exec "$p-$ns" "$@"; }
newns() { ip netns add "$p-$1"; namespaces+=("$p-$1"); at "$1" ip link set lo up; }
newns u
at u ip link add br0 type bridge
at u ip link set br0 up
n=0
host() { # NAME UNDERLAY-IP
    n=$((n + 1))
    newns "$1"
    at u ip link add "v$n" type veth peer name eth0 netns "$p-$1"
    at u ip link set "v$n" master br0 up
    at "$1" ip link set eth0 up
    at "$1" ip addr add "$2/24" dev eth0
}
host s 10.200.0.1
host r 10.200.0.2
at s tc qdisc add dev eth0 root tbf rate "${link}mbit" burst 256kb latency 50ms

names=(a b c)
caps=(50 200 500)
for k in 1 2 3; do echo "the ${names[k - 1]} namespace secret" >"$dir/${names[k - 1]}.secret"; done
chmod 600 "$dir"/*.secret

# agent NAME UNDERLAY-IP HOST-NUMBER AGENT-LINES NAMESPACE-LINES... (one per namespace)
agent() {
    local name=$1 ip=$2 h=$3 extra=$4
    shift 4
    mkdir -p "$dir/$name"
    {
        printf '[agent]\nstate_dir = "%s/state"\ncontrol_socket = "%s/hyphae.sock"\nlisten = "%s:7400"\n%s\n' \
            "$dir/$name" "$dir/$name" "$ip" "$extra"
        for k in 1 2 3; do
            local ns=${names[k - 1]}
            printf '\n[[namespace]]\nname = "%s"\nsecret_file = "%s/%s.secret"\nsubnet = "10.207.%d.0/24"\n' \
                "$ns" "$dir" "$ns" "$k"
            printf 'address = "10.207.%d.%d"\ndevice = "hy-%s"\nresolvers = []\n%s\n' "$k" "$h" "$ns" "$1"
            shift
        done
    } >"$dir/$name/hyphae.toml"
    ip netns exec "$p-$name" "$HYPHAE_BIN" up -c "$dir/$name/hyphae.toml" >"$dir/$name/agent.log" 2>&1 &
    pids+=($!)
}
stop_agents() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done; done
    pids=()
}
wait_mesh() {
    for k in 1 2 3; do
        for _ in $(seq 120); do
            at s ping -c1 -W1 "10.207.$k.12" >/dev/null 2>&1 && continue 2
            sleep 0.25
        done
        echo "namespace ${names[k - 1]}: no ping across" >&2
        tail -n 5 "$dir"/s/agent.log "$dir"/r/agent.log >&2
        exit 1
    done
}
# Receiver iperf3 servers, one port per namespace (they outlive the agents' restarts).
for k in 1 2 3; do
    ip netns exec "$p-r" iperf3 -s -p $((5200 + k)) >"$dir/iperf-$k.log" 2>&1 &
    servers+=($!)
done
# udp K OFFERED-MBIT-AT-IP-LEVEL SECONDS OUT: one UDP stream from S to R in namespace K.
udp() {
    local payload_rate
    payload_rate=$(awk -v r="$2" -v l="$len" 'BEGIN { printf "%.0f", r * 1e6 * l / (l + 28) }')
    at s iperf3 -c "10.207.$1.12" -p $((5200 + $1)) -u -b "$payload_rate" -l "$len" -t "$3" -J \
        --connect-timeout 3000 >"$4" 2>/dev/null || true
}
# The receiver's rate in an iperf3 JSON report, at the IP level, in Mbit/s.
received() {
    python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
s = j["end"]["sum"]
print("%.1f" % (s["bits_per_second"] * (1 - s["lost_percent"] / 100) * (int(sys.argv[2]) + 28) / int(sys.argv[2]) / 1e6))' "$1" "$len"
}

# CPU time the hypervisor took from this machine (steal), as a share of all CPU time since
# `mark`: a busy host machine slows every row, which this tells apart from the agent.
mark() { read -r _ a b c d e f g h _ < /proc/stat; t0=$((a + b + c + d + e + f + g + h)); s0=$h; }
steal() {
    local a b c d e f g h
    read -r _ a b c d e f g h _ < /proc/stat
    awk -v s="$((h - s0))" -v t="$((a + b + c + d + e + f + g + h - t0))" \
        'BEGIN { printf "CPU stolen by the host during this table: %.1f%%\n", t ? 100 * s / t : 0 }'
}

# caps_rows SEND HEADER: Table 3's rows, each cap of `caps` in its three states; `SEND K
# OFFERED SECONDS OUT` sends to the K-th capped target.
caps_rows() {
    local send=$1 cap state offered expected got
    echo "| $2 | state | offered | expected | reached | reached / expected | over the cap |"
    echo "|---|---|---|---|---|---|---|"
    for k in 1 2 3; do
        cap=${caps[k - 1]}
        for state in non-saturated saturated over-saturated; do
            case $state in
                non-saturated) offered=$((cap / 2)) ;;
                saturated) offered=$cap ;;
                over-saturated) offered=$((cap * 2)) ;;
            esac
            expected=$((offered < cap ? offered : cap))
            "$send" "$k" "$offered" "$secs" "$dir/cap.json"
            got=$(received "$dir/cap.json")
            awk -v c="$cap" -v s="$state" -v o="$offered" -v e="$expected" -v g="$got" 'BEGIN {
                over = g > c ? sprintf("%.2f%%", 100 * (g - c) / c) : "none"
                printf "| %d | %s | %d | %d | %.1f | %.2f%% | %s |\n", c, s, o, e, g, 100 * g / e, over }'
            sleep 1
        done
    done
}

echo "Underlay of S limited with tbf; ${secs} s per run; UDP, ${len}-byte payloads."
echo
if [[ $tables == *caps* ]]; then
echo "### Rate caps (KU Table 3): link ${link} Mbit/s"
echo
agent s 10.200.0.1 11 "" "rate = \"${caps[0]}M\"" "rate = \"${caps[1]}M\"" "rate = \"${caps[2]}M\""
agent r 10.200.0.2 12 "" 'bootstrap = ["10.200.0.1:7400"]' 'bootstrap = ["10.200.0.1:7400"]' 'bootstrap = ["10.200.0.1:7400"]'
wait_mesh
mark
caps_rows udp "cap (Mbit/s)"
stop_agents
echo
steal
fi
if [[ $tables == *members* ]]; then
# The same two tables per member (the paper's per-VM caps and weights): one namespace, S
# and three receivers (R, R2, R3), S capping (then weighing) each receiver by its address.
host r2 10.200.0.3
host r3 10.200.0.4
# member NAME UNDERLAY-IP HOST-NUMBER AGENT-LINES NAMESPACE-LINES: an agent in namespace a only.
member() {
    local name=$1 ip=$2 h=$3
    mkdir -p "$dir/$name"
    printf '[agent]\nstate_dir = "%s/state"\ncontrol_socket = "%s/hyphae.sock"\nlisten = "%s:7400"\n%s\n' \
        "$dir/$name" "$dir/$name" "$ip" "$4" >"$dir/$name/hyphae.toml"
    printf '\n[[namespace]]\nname = "a"\nsecret_file = "%s/a.secret"\nsubnet = "10.207.1.0/24"\n' \
        "$dir" >>"$dir/$name/hyphae.toml"
    printf 'address = "10.207.1.%d"\ndevice = "hy-a"\nresolvers = []\n%b\n' "$h" "$5" >>"$dir/$name/hyphae.toml"
    ip netns exec "$p-$name" "$HYPHAE_BIN" up -c "$dir/$name/hyphae.toml" >"$dir/$name/agent.log" 2>&1 &
    pids+=($!)
}
receivers() {
    member r 10.200.0.2 12 "" 'bootstrap = ["10.200.0.1:7400"]'
    member r2 10.200.0.3 13 "" 'bootstrap = ["10.200.0.1:7400"]'
    member r3 10.200.0.4 14 "" 'bootstrap = ["10.200.0.1:7400"]'
    for h in 12 13 14; do
        for _ in $(seq 120); do
            at s ping -c1 -W1 "10.207.1.$h" >/dev/null 2>&1 && continue 2
            sleep 0.25
        done
        echo "member 10.207.1.$h: no ping across" >&2
        exit 1
    done
}
for h in 13 14; do
    ip netns exec "$p-r$((h - 11))" iperf3 -s -p 5201 >"$dir/iperf-m$h.log" 2>&1 &
    servers+=($!)
done
# mudp HOST OFFERED SECONDS OUT: UDP from S to member 10.207.1.HOST.
mudp() {
    local payload_rate
    payload_rate=$(awk -v r="$2" -v l="$len" 'BEGIN { printf "%.0f", r * 1e6 * l / (l + 28) }')
    at s iperf3 -c "10.207.1.$1" -p 5201 -u -b "$payload_rate" -l "$len" -t "$3" -J \
        --connect-timeout 3000 >"$4" 2>/dev/null || true
}
at s tc qdisc replace dev eth0 root tbf rate "${link}mbit" burst 256kb latency 50ms
echo
echo "### Rate caps per member (KU Table 3, per VM): link ${link} Mbit/s, one namespace"
echo
capped=""
for k in 1 2 3; do
    capped+="[[namespace.cap]]\nmembers = [\"10.207.1.$((11 + k))\"]\negress = \"${caps[k - 1]}M\"\n"
done
member s 10.200.0.1 11 "" "$capped"
receivers
mark
member_udp() { mudp $((11 + $1)) "${@:2}"; }
caps_rows member_udp "member's cap (Mbit/s)"
stop_agents
echo
steal
at s tc qdisc replace dev eth0 root tbf rate "${wlink}mbit" burst 256kb latency 50ms
echo
echo "### Weights per member (KU Table 4, per VM): link ${wlink} Mbit/s, uplink_rate ${uplink} Mbit/s, one namespace, each member offered ${offer} Mbit/s at once"
echo
mark
echo "| weights | R | R2 | R3 | shares | error against the weights (points) | total | of the link |"
echo "|---|---|---|---|---|---|---|---|"
for weights in "6 3 1" "1 1 1" "5 3 2"; do
    read -r wa wb wc <<<"$weights"
    weighed=""
    for w in "12 $wa" "13 $wb" "14 $wc"; do
        read -r h wt <<<"$w"
        weighed+="[[namespace.cap]]\nmembers = [\"10.207.1.$h\"]\nweight = $wt\n"
    done
    member s 10.200.0.1 11 "uplink_rate = \"${uplink}M\"" "$weighed"
    receivers
    streams=()
    for h in 12 13 14; do
        mudp "$h" "$offer" "$secs" "$dir/mw-$h.json" &
        streams+=($!)
    done
    wait "${streams[@]}"
    ra=$(received "$dir/mw-12.json"); rb=$(received "$dir/mw-13.json"); rc=$(received "$dir/mw-14.json")
    awk -v wa="$wa" -v wb="$wb" -v wc="$wc" -v a="$ra" -v b="$rb" -v c="$rc" -v lk="$wlink" 'BEGIN {
        t = a + b + c; w = wa + wb + wc
        ea = 100 * (a / t - wa / w); eb = 100 * (b / t - wb / w); ec = 100 * (c / t - wc / w)
        printf "| %d:%d:%d | %.1f | %.1f | %.1f | %.1f%% / %.1f%% / %.1f%% | %+.1f / %+.1f / %+.1f | %.1f | %.1f%% |\n",
            wa, wb, wc, a, b, c, 100 * a / t, 100 * b / t, 100 * c / t, ea, eb, ec, t, 100 * t / lk }'
    stop_agents
done
echo
steal
fi
[[ $tables == *weights* ]] || exit 0
at s tc qdisc replace dev eth0 root tbf rate "${wlink}mbit" burst 256kb latency 50ms

echo
echo "### Weights (KU Table 4): link ${wlink} Mbit/s, uplink_rate ${uplink} Mbit/s, each namespace offering ${offer} Mbit/s at once"
echo
mark
echo "| weights | a | b | c | shares (a / b / c) | error against the weights (points) | total | of the link | ping in c, quiet avg / loaded avg / loaded max (ms) |"
echo "|---|---|---|---|---|---|---|---|---|"
for weights in "6 3 1" "1 1 1" "5 3 2"; do
    read -r wa wb wc <<<"$weights"
    agent s 10.200.0.1 11 "uplink_rate = \"${uplink}M\"" "weight = $wa" "weight = $wb" "weight = $wc"
    agent r 10.200.0.2 12 "" 'bootstrap = ["10.200.0.1:7400"]' 'bootstrap = ["10.200.0.1:7400"]' 'bootstrap = ["10.200.0.1:7400"]'
    wait_mesh
    quiet=$(at s ping -c 20 -i 0.05 10.207.3.12 | awk -F/ '/^rtt/ { print $5 }')
    streams=()
    for k in 1 2 3; do
        udp "$k" "$offer" "$secs" "$dir/w-$k.json" &
        streams+=($!)
    done
    sleep 2
    loaded=$(at s ping -c 40 -i 0.05 10.207.3.12 | awk -F/ '/^rtt/ { printf "%s / %s", $5, $6 }')
    wait "${streams[@]}"
    ra=$(received "$dir/w-1.json"); rb=$(received "$dir/w-2.json"); rc=$(received "$dir/w-3.json")
    awk -v wa="$wa" -v wb="$wb" -v wc="$wc" -v a="$ra" -v b="$rb" -v c="$rc" -v up="$uplink" \
        -v q="$quiet" -v l="$loaded" -v lk="$wlink" 'BEGIN {
        t = a + b + c; w = wa + wb + wc
        ea = 100 * (a / t - wa / w); eb = 100 * (b / t - wb / w); ec = 100 * (c / t - wc / w)
        printf "| %d:%d:%d | %.1f | %.1f | %.1f | %.1f%% / %.1f%% / %.1f%% | %+.1f / %+.1f / %+.1f | %.1f | %.1f%% | %s / %s |\n",
            wa, wb, wc, a, b, c, 100 * a / t, 100 * b / t, 100 * c / t, ea, eb, ec, t, 100 * t / lk, q, l }'
    stop_agents
done
echo
steal
