#!/usr/bin/env bash
# Virtual DNS throughput: dnsperf against the namespace's service address, from a plain host
# on a router agent's LAN and from an interface-mode host, and against dnsmasq answering the
# same names from a host of the same LAN (the anchor), all in the same run. Topology:
#   - interface-mode agent I1 (10.201.0.31, named "ione"), which starts the overlay,
#   - router-mode agent R, whose LAN bridge holds the plain host L1 (10.201.0.11) and the
#     dnsmasq host D (10.201.0.53),
# all agents on one underlay bridge. The query mix has member names (held by the asking
# agent, or read from the DHT once and cached), IPOP automatic names and PTRs.
# `dns_rate = 0` on both agents by default: one dnsperf source offers more than the default
# per-source limit, and the figure asked for is that of clients under their limit.
# DNS_RATE=default measures the agents at their default `dns_rate` instead (a busy client
# over its rate: the last column counts what the agent held back, truncated and dropped).
# Also the server's CPU time per answered query (user + system, from /proc: less sensitive to
# other load on the machine than queries/s). Prints a Markdown table. Needs root. Usage:
#   benches/dns-throughput.sh [seconds-per-run] [clients]      (default 10, 4)
# Environment: DNS_RATE (`dns_rate` of both agents: a number, or `default`; default 0),
#              HYPHAE_BIN (default target/release/hyphae, built if missing),
#              HYPHAE_BASELINE_BIN (optional: another hyphae build measured in the same
#                                   run as extra rows, e.g. the previous commit).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || exec sudo -E "$0" "$@"
secs=${1:-10}
clients=${2:-4}
rate=${DNS_RATE:-0}
rate_line="dns_rate = $rate"
[ "$rate" = default ] && rate_line=""
scripts/deps dnsperf >/dev/null
HYPHAE_BIN=${HYPHAE_BIN:-target/release/hyphae}
[ -x "$HYPHAE_BIN" ] || cargo build --release --quiet --bin hyphae

p=hyd$$
dir=$(mktemp -d /tmp/hydns.XXXXXX)
namespaces=()
pids=()
others=()
cleanup() {
    for pid in "${pids[@]}" "${others[@]}"; do kill "$pid" 2>/dev/null || true; done
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
host() { newns "$1"; plug u "$1" eth0 1500; at "$1" ip addr add "$2/24" dev eth0; }
lanhost() { newns "$2"; plug "$1" "$2" eth0 1420; at "$2" ip addr add "$3/16" brd + dev eth0; }

secret=$dir/lab.secret
(umask 077; echo "a namespace secret for the benchmark" >"$secret")
agent() { # BIN NAME UNDERLAY-IP NAMESPACE-LINES
    mkdir -p "$dir/$2"
    cat >"$dir/$2/hyphae.toml" <<EOF
[agent]
state_dir = "$dir/$2/state"
control_socket = "$dir/$2/hyphae.sock"
listen = "$3:7400"

[[namespace]]
name = "lab"
secret_file = "$secret"
subnet = "10.201.0.0/16"
$rate_line
$4
EOF
    ip netns exec "$p-$2" "$1" up -c "$dir/$2/hyphae.toml" >"$dir/$2/agent.log" 2>&1 &
    pids+=($!)
    sleep 0.5
}
stop_agents() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done; done
    pids=()
}

newswitch u
newswitch lan1
host i1 10.200.0.1
host r 10.200.0.3
plug lan1 r eth1 1500
lanhost lan1 l1 10.201.0.11
lanhost lan1 d 10.201.0.53

# The same names dnsmasq answers (host-record gives the A and the PTR).
cat >"$dir/queries" <<EOF
ione.lab A
C201000031.lab A
C201000011.lab A
31.0.201.10.in-addr.arpa PTR
11.0.201.10.in-addr.arpa PTR
EOF
# Started by `ip netns exec` itself (not the `at` function): $! is dnsmasq's PID.
ip netns exec "$p-d" dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts \
    --listen-address=10.201.0.53 --bind-interfaces --pid-file= --log-facility="$dir/dnsmasq.log" \
    --cache-size=1000 \
    --host-record=ione.lab,10.201.0.31 \
    --host-record=C201000031.lab,10.201.0.31 \
    --host-record=C201000011.lab,10.201.0.11 &
others+=($!)

wait_answer() { # FROM NAME
    for _ in $(seq 60); do
        [ -n "$(at "$1" dig @10.201.0.1 +short +time=1 +tries=1 "$2")" ] && return 0
        sleep 0.5
    done
    echo "$1 gets no answer for $2" >&2
    exit 1
}
# CPU time (user + system) of process PID so far, in clock ticks.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# dnsperf FROM SERVER: "qps lost% noerror% avg-latency-ms completed" of one run.
perf() {
    at "$1" dnsperf -s "$2" -d "$dir/queries" -l "$secs" -c "$clients" -q 200 >"$dir/perf.out" 2>&1 || true
    awk '
        /Queries sent:/ { sent = $3 }
        /Queries completed:/ { done = $3 }
        /Queries lost:/ { lost = $3 }
        /Queries per second:/ { qps = $4 }
        /Average Latency/ { lat = $4 }
        /Response codes:/ { if (match($0, /NOERROR [0-9]+ \([0-9.]+%/)) {
                                ok = substr($0, RSTART, RLENGTH); sub(/.*\(/, "", ok); sub(/%/, "", ok) } }
        END { if (sent == 0) { print "- - - - 0"; exit }
              printf "%d %.2f %s %.3f %d\n", qps, 100 * lost / sent, ok == "" ? "0" : ok, lat * 1000, done }' "$dir/perf.out"
}
# The agent NAME's DNS counters: "delayed truncated dropped" (0 for what a build lacks).
limited() {
    "$HYPHAE_BIN" status -c "$dir/$1/hyphae.toml" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)["namespaces"][0]["dns"]
print(*(d.get(k, 0) for k in ("rate_limited_delayed", "rate_limited_truncated", "rate_limited_dropped")))'
}
row() { # LABEL FROM SERVER [SERVER-PID [AGENT-NAME]]
    local pid=${4:-} name=${5:-} before=0 cpu="—" held="—" d0 t0 x0 d1 t1 x1
    [ -n "$pid" ] && before=$(ticks "$pid")
    [ -n "$name" ] && read -r d0 t0 x0 <<<"$(limited "$name")"
    read -r qps lost ok lat done <<<"$(perf "$2" "$3")"
    if [ -n "$pid" ] && [ "$done" -gt 0 ]; then
        cpu=$(awk -v t="$(( $(ticks "$pid") - before ))" -v hz="$(getconf CLK_TCK)" -v n="$done" \
            'BEGIN { printf "%.1f", t / hz * 1e6 / n }')
    fi
    if [ -n "$name" ]; then
        read -r d1 t1 x1 <<<"$(limited "$name")"
        held="$((d1 - d0)) / $((t1 - t0)) / $((x1 - x0))"
    fi
    echo "| $1 | $qps | $lost | $ok | $lat | $cpu | $held |"
    last_qps=$qps
}

run_agents() { # BIN LABEL
    boot='bootstrap = ["10.200.0.1:7400"]'
    agent "$1" i1 10.200.0.1 $'mode = "interface"\naddress = "10.201.0.31"\nhostname = "ione"'
    agent "$1" r 10.200.0.3 $'mode = "router"\ndevice = "hyr0"\nbridge = "brlan"\nuplink = "eth1"\n'"$boot"
    # Until the names resolve everywhere (the router learns L1 from its traffic).
    at l1 ping -c1 -W1 10.201.0.31 >/dev/null 2>&1 || true
    for q in ione.lab C201000031.lab C201000011.lab; do
        wait_answer l1 "$q"
        wait_answer i1 "$q"
    done
    row "$2, LAN host via router agent" l1 10.201.0.1 "${pids[1]}" r
    lan=$last_qps
    row "$2, interface host" i1 10.201.0.1 "${pids[0]}" i1
    iface=$last_qps
    stop_agents
}

echo "dnsperf: $clients clients, ${secs}s each, up to 200 queries outstanding; agents' dns_rate: $rate; names: $(cut -d' ' -f1 "$dir/queries" | tr '\n' ' ')"
echo
echo "| server | queries/s | lost % | NOERROR % | avg latency ms | server CPU µs/query | delayed / truncated / dropped |"
echo "|---|---|---|---|---|---|---|"
row "dnsmasq, LAN host -> dnsmasq host" l1 10.201.0.53 "${others[0]}"
anchor=$last_qps
if [ -n "${HYPHAE_BASELINE_BIN:-}" ]; then
    run_agents "$HYPHAE_BASELINE_BIN" "baseline"
fi
run_agents "$HYPHAE_BIN" "hyphae"

echo
awk -v a="$anchor" -v l="$lan" -v i="$iface" 'BEGIN {
    printf "ratio to dnsmasq: LAN host %.2f, interface host %.2f\n", l / a, i / a }'
