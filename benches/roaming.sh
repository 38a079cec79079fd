#!/usr/bin/env bash
# Roaming downtime (issue 14, item 3): two interface-mode members A and B on one underlay
# bridge, both listening on all addresses; B pings A's virtual address every 10 ms while
# A's underlay address changes MOVES times (ip addr del + add on its eth0, alternating
# between 10.200.0.1 and 10.200.0.21). Downtime of a move = the longest gap between two
# replies from the move until the next one (the 10 ms ping interval included). Prints the
# median and worst, and the worst gap of the 3 quiet seconds before the first move as the
# floor of the measurement. After each move it waits for a reply (at most 30 s), then 1 s.
# Needs root. Usage:
#   benches/roaming.sh [moves]                     (default 20)
# Environment: HYPHAE_BIN (default $CARGO_TARGET_DIR/debug/hyphae, built if missing);
# HYPHAE_BASE_BIN, if set, is measured the same way in the same run (e.g. a build of the
# commit before roaming) as the baseline.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || exec sudo -E "$0" "$@"
moves=${1:-20}
target=${CARGO_TARGET_DIR:-target}
HYPHAE_BIN=${HYPHAE_BIN:-$target/debug/hyphae}
[ -x "$HYPHAE_BIN" ] || cargo build --quiet --bin hyphae

p=hyr$$
dir=$(mktemp -d /tmp/hyroam.XXXXXX)
namespaces=()
pids=()
# Stops the processes of a series: SIGTERM, and SIGKILL for any still there after 4 s (an
# agent gives its leases back first).
stop() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for _ in $(seq 40); do
        local alive=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
cleanup() {
    stop
    for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT
at() { local ns=$1; shift; ip netns exec "$p-$ns" "$@"; }
newns() { ip netns add "$p-$1"; namespaces+=("$p-$1"); at "$1" ip link set lo up; }
secret=$dir/lab.secret
(umask 077; echo "a namespace secret for the benchmark" >"$secret")

# One series with binary $1, labelled $2: prints "label median worst floor" in ms.
series() {
    local bin=$1 label=$2 run=$dir/$2
    mkdir -p "$run"
    pids=()
    for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    namespaces=()
    newns u
    at u ip link add br0 type bridge
    at u ip link set br0 up
    local i=0
    for h in a:10.200.0.1:10.201.0.11:10.200.0.2 b:10.200.0.2:10.201.0.12:10.200.0.1; do
        IFS=: read -r name ul vip peer <<<"$h"
        i=$((i + 1))
        newns "$name"
        at u ip link add "v$i" type veth peer name eth0 netns "$p-$name"
        at u ip link set "v$i" master br0 up
        at "$name" ip addr add "$ul/24" dev eth0
        at "$name" ip link set eth0 up
        mkdir -p "$run/$name"
        cat >"$run/$name/hyphae.toml" <<TOML
[agent]
state_dir = "$run/$name/state"
control_socket = "$run/$name/hyphae.sock"
listen = "0.0.0.0:7400"

[[namespace]]
name = "lab"
secret_file = "$secret"
subnet = "10.201.0.0/16"
mode = "interface"
address = "$vip"

[[namespace.peer]]
endpoint = "$peer:7400"
TOML
        ip netns exec "$p-$name" "$bin" up -c "$run/$name/hyphae.toml" >"$run/$name/agent.log" 2>&1 &
        pids+=($!)
    done
    for _ in $(seq 60); do at b ping -c1 -W1 10.201.0.11 >/dev/null 2>&1 && break; done
    at b ping -D -i 0.01 -W 1 10.201.0.11 >"$run/ping.log" 2>&1 &
    pids+=($!)
    sleep 3
    local addrs=(10.200.0.1 10.200.0.21) cur=0 marks=$run/moves
    : >"$marks"
    for m in $(seq "$moves"); do
        local next=$((1 - cur))
        date +%s.%N >>"$marks"
        at a ip addr del "${addrs[$cur]}/24" dev eth0
        at a ip addr add "${addrs[$next]}/24" dev eth0
        cur=$next
        local t0 n0
        t0=$(date +%s)
        n0=$(grep -c 'bytes from' "$run/ping.log" || true)
        # Wait for a reply 100 ms or more after the move: one in flight at the move arrives
        # within a round trip, so a later one means the path works again.
        while :; do
            sleep 0.05
            local last
            last=$(grep 'bytes from' "$run/ping.log" | tail -1 | sed 's/^\[\([0-9.]*\)\].*/\1/')
            if [ -n "$last" ] && awk -v l="$last" -v m="$(tail -1 "$marks")" 'BEGIN{exit !(l + 0 > m + 0.1)}'; then break; fi
            if [ $(($(date +%s) - t0)) -gt 30 ]; then echo "$label: move $m: no reply within 30 s" >&2; break; fi
        done
        sleep 1
    done
    sleep 0.5
    grep 'bytes from' "$run/ping.log" | sed 's/^\[\([0-9.]*\)\].*/\1/' >"$run/replies"
    awk -v label="$label" '
        FNR == NR { mark[++m] = $1; next }
        { reply[++r] = $1 }
        END {
            # A move'"'"'s downtime: the longest gap between replies from the move to the next
            # one (a reply in flight at the move may arrive just after it; the outage is
            # the gap that follows).
            for (i = 1; i <= m; i++) {
                end = (i < m) ? mark[i + 1] : 1e18
                g = 0
                for (j = 2; j <= r; j++) {
                    if (reply[j] <= mark[i]) continue
                    if (reply[j - 1] >= end) break
                    d = (reply[j] - reply[j - 1]) * 1000
                    if (d > g) g = d
                }
                gap[i] = g
            }
            # Floor: the worst gap in the quiet seconds before the first move.
            floor = 0
            for (j = 2; j <= r && reply[j] <= mark[1]; j++) {
                d = (reply[j] - reply[j - 1]) * 1000
                if (d > floor) floor = d
            }
            n = m
            for (i = 2; i <= n; i++) {
                v = gap[i]
                for (k = i - 1; k >= 1 && gap[k] > v; k--) gap[k + 1] = gap[k]
                gap[k + 1] = v
            }
            median = (n % 2) ? gap[(n + 1) / 2] : (gap[n / 2] + gap[n / 2 + 1]) / 2
            printf "| %s | %d | %.0f | %.0f | %.0f |\n", label, n, median, gap[n], floor
        }' "$run/moves" "$run/replies"
    stop
}

echo "| agent | moves | median downtime ms | worst ms | worst gap without a move ms |"
echo "|---|---|---|---|---|"
if [ -n "${HYPHAE_BASE_BIN:-}" ]; then series "$HYPHAE_BASE_BIN" baseline; fi
series "$HYPHAE_BIN" roaming
