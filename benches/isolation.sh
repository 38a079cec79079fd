#!/usr/bin/env bash
# Isolation benchmark (issue 26, item 7): does control-plane load on an agent slow the member
# traffic through it? Two hosts (network namespaces A and B) joined by one veth, each running
# an interface-mode hyphae agent (benches/lib/pair.sh), and a third namespace, the stranger,
# on its own veth to B. For each build, two phases of SECONDS_PER_PHASE seconds:
#   quiet   a paced UDP stream A->B over the overlay (iperf3 -u -b $RATE, server in B,
#           datagrams sized to the overlay device) and, at the same time, `ping -i 0.01`
#           A->B over the overlay addresses;
#   loaded  the same stream and pings while B's control plane gets modest load:
#           - $STRANGERS libp2p connections from the stranger namespace to B's libp2p port
#             (hyphae-stranger, crates/testbed: one identity each, no namespace secret, a
#             Kademlia query every $QUERY_EVERY seconds each; they come from several source
#             addresses, since an agent admits 32 connections per address);
#           - /metrics scraped $SCRAPES_PER_SEC times a second inside B (`[agent] metrics`);
#           - $DNS_QPS DNS queries a second (dnsperf) at the namespace's service address
#             (10.212.0.1) from B's own host.
# Before and after each phase B's `hyphae status --json` is read; over the phase:
#   - the UDP stream's loss and out-of-order datagrams (iperf3 server, --json);
#   - the pings' count, p50, p99 and max round-trip time;
#   - the workers' lock-wait histograms (`workers[].lock_wait`: how long each batch waited
#     for the data plane) differenced: the p99 (the smallest bound under which 99% of the
#     phase's batches fell) and the batch count, per worker and all together;
#   - B's drops (`control_queue`, `outbox`), its connected overlay peers (A and the
#     strangers), DNS queries answered, scrapes that succeeded, and the CPU seconds of B's
#     agent and of the stranger.
# Prints a Markdown table and the issue's criteria, PASS or FAIL, from what was measured:
# no loss under load, loaded ping p99 within 0.2 ms of quiet p99, lock-wait p99 < 50 µs.
# Needs root. Usage:
#   benches/isolation.sh
# Environment:
#   HYPHAE_BIN           hyphae to measure (default target/release/hyphae, built with
#                        `cargo build --release -p hyphae-agent` if missing)
#   HYPHAE_BASELINE_BIN  another hyphae build, measured the same way as extra rows (an older
#                        build without `workers[].lock_wait` shows "-" there)
#   STRANGER_BIN         default target/release/hyphae-stranger, built with
#                        `cargo build --release -p hyphae-testbed --bin hyphae-stranger`
#   SECONDS_PER_PHASE    default 20
#   STRANGERS            libp2p connections from the stranger, default 300
#   QUERY_EVERY          seconds between one stranger identity's Kademlia queries, default 10
#   SCRAPES_PER_SEC      /metrics scrapes a second, default 150
#   LOAD_NICE            nice value of the load generators (stranger, scraper, dnsperf),
#                        default 19: they stand for other machines (remote strangers, a
#                        Prometheus server, DNS clients), so on this small box their own CPU
#                        should not count as the agent's; 0 runs them as the data path's equals
#   DNS_QPS              DNS queries a second, default 500
#   RATE                 the UDP stream's rate (iperf3 -b), default 200M
#   IPERF_BUFFER         iperf3's socket buffers (-w, both ends), default 4M: room for
#                        tens of milliseconds of the stream, so that a datagram is lost
#                        only in the overlay, not in the benchmark's own receiving socket
#                        while iperf3 waits for a core (the drops line tells them apart)
#   PRIORITIES           the `[agent] worker_priority` settings to measure HYPHAE_BIN with,
#                        each as its own rows ("hyphae" for normal, "realtime"), default
#                        "normal"; "normal realtime" measures both in one run
#   PIN                  1: give the control plane a core of its own, in both phases: B's
#                        control thread (the agent's main thread) and the load generators
#                        on CPU 1; everything else (both agents' workers, A's control
#                        thread, iperf3, ping) on CPU 0. Default 0: no pinning. This box has
#                        2 cores for two agents, both iperf3 ends and the load; pinned, the
#                        control plane's work has CPU to spare that the data path does not
#                        share, as on a machine with more cores than the data path uses
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || exec sudo -E "$0" "$@"
secs=${SECONDS_PER_PHASE:-20}
strangers=${STRANGERS:-300}
query_every=${QUERY_EVERY:-10}
scrapes=${SCRAPES_PER_SEC:-150}
load_nice=${LOAD_NICE:-19}
dns_qps=${DNS_QPS:-500}
rate=${RATE:-200M}
iperf_buffer=${IPERF_BUFFER:-4M}
priorities=${PRIORITIES:-normal}
pin=${PIN:-0}
# Prefixes: where the data path's processes and the load generators run.
dp_cpu=() load_cpu=()
if [ "$pin" = 1 ]; then
    [ "$(nproc)" -ge 2 ] || { echo "PIN=1 needs 2 cores" >&2; exit 1; }
    dp_cpu=(taskset -c 0) load_cpu=(taskset -c 1)
fi
scripts/deps iperf3 jq dnsperf dnsutils python3 >/dev/null

HYPHAE_BIN=${HYPHAE_BIN:-target/release/hyphae}
[ -x "$HYPHAE_BIN" ] || cargo build --release --quiet -p hyphae-agent
STRANGER_BIN=${STRANGER_BIN:-target/release/hyphae-stranger}
[ -x "$STRANGER_BIN" ] || cargo build --release --quiet -p hyphae-testbed --bin hyphae-stranger

. benches/lib/pair.sh
pair_setup hyiso
# The stranger's namespace, on its own veth to B (its traffic does not share the A-B link):
# source addresses 10.210.1.1.. (25 connections each), B's side 10.210.1.254.
S=hyisoS$$
cleanup() {
    pair_cleanup
    ip netns del "$S" 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "$S"
ip netns exec "$B" ip link add s0 type veth peer name eth0 netns "$S"
ip netns exec "$B" ip addr add 10.210.1.254/24 dev s0
ip netns exec "$B" ip link set s0 up
ip netns exec "$S" ip link set lo up
ip netns exec "$S" ip link set eth0 up
sources=()
for i in $(seq $(((strangers + 24) / 25))); do
    ip netns exec "$S" ip addr add "10.210.1.$i/24" dev eth0
    sources+=("10.210.1.$i")
done
ip netns exec "$S" ip route add 10.210.0.2/32 via 10.210.1.254

# pair.sh's configs, with names in the namespace's DNS (alpha.bench, bravo.bench; no
# upstream resolvers) and /metrics on B's loopback.
hyphae_config A socket
hyphae_config B socket
for side in A B; do
    name=$([ $side = A ] && echo alpha || echo bravo)
    sed -i "s|^device = \"hyphae0\"|&\nhostname = \"$name\"\nresolvers = []|" "$dir/$side-socket.toml"
done
sed -i 's|^listen = .*|&\nmetrics = "127.0.0.1:9400"|' "$dir/B-socket.toml"
printf '%s\n' "alpha.bench A" "bravo.bench A" "a.bench A" >"$dir/queries"

# The /metrics scraper, run inside B: RATE scrapes a second for SECS seconds, each on its own
# connection; prints "succeeded attempted".
cat >"$dir/scrape.py" <<'PY'
import http.client, sys, time
rate, secs = float(sys.argv[1]), float(sys.argv[2])
ok = tried = 0
start = time.monotonic()
while True:
    due = start + tried / rate
    if due - start >= secs:
        break
    wait = due - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    tried += 1
    try:
        c = http.client.HTTPConnection("127.0.0.1", 9400, timeout=2)
        c.request("GET", "/metrics")
        r = c.getresponse()
        body = r.read()
        c.close()
        if r.status == 200 and b"hyphae_" in body:
            ok += 1
    except Exception:
        pass
print(ok, tried)
PY

# The lock-wait histograms of two `hyphae status --json` (before, after), differenced:
# "P99 BATCHES" over all workers, then one "worker K: ..." line each (or "- -" when the
# build reports none).
cat >"$dir/lockwait.py" <<'PY'
import json, sys
def workers(path):
    try:
        return [w.get("lock_wait") for w in json.load(open(path)).get("workers", [])]
    except Exception:
        return []
def p99(bounds, counts):
    total = sum(counts)
    if total == 0:
        return "-"
    seen = 0
    for k, c in enumerate(counts):
        seen += c
        if seen >= 0.99 * total:
            return str(bounds[k]) if k < len(bounds) else ">" + str(bounds[-1])
    return "-"
before, after = workers(sys.argv[1]), workers(sys.argv[2])
if not after or any(w is None or not w.get("bounds_us") for w in after):
    print("- -")
    sys.exit()
bounds = after[0]["bounds_us"]
total = [0] * (len(bounds) + 1)
lines = []
for k, w in enumerate(after):
    b = before[k] if k < len(before) and before[k] else {"counts": [0] * len(w["counts"]), "sum_secs": 0}
    d = [x - y for x, y in zip(w["counts"], b["counts"])]
    total = [x + y for x, y in zip(total, d)]
    n = sum(d)
    mean = (w["sum_secs"] - b["sum_secs"]) / n * 1e6 if n else 0
    q = p99(w["bounds_us"], d)
    lines.append(f"worker {k}: p99 {q}{'' if q == '-' else ' µs'}, {n} batches, mean wait {mean:.2f} µs")
print(p99(bounds, total), sum(total))
print("\n".join(lines))
PY

# Where datagrams can be lost, per namespace: the kernel's UDP receive-buffer overflows (all
# sockets', then the agent's underlay sockets' alone, port 7400) and the overlay device's
# drops (TX: frames the kernel could not queue to the TAP for a worker; RX: frames the agent
# wrote that were dropped).
drops() { # namespace -> "udp-rcvbuf underlay-drops tap-tx-dropped tap-rx-dropped"
    local udp underlay tap
    udp=$(ip netns exec "$1" awk '/^Udp:/ { if (!h) { for (i = 1; i <= NF; i++) if ($i == "RcvbufErrors") c = i; h = 1 } else print $c }' /proc/net/snmp)
    underlay=$(ip netns exec "$1" awk 'NR > 1 && $2 ~ /:1CE8$/ { d += $NF } END { print d + 0 }' /proc/net/udp)
    tap=$(ip netns exec "$1" ip -j -s link show hyphae0 | jq -r '.[0].stats64 | "\(.tx.dropped) \(.rx.dropped)"')
    echo "$udp $underlay $tap"
}
inA() { ip netns exec "$A" "$@"; }
inB() { ip netns exec "$B" "$@"; }
status() { "$1" status --json -c "$dir/B-socket.toml"; }
cpu() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
hz=$(getconf CLK_TCK)
# Takes processes that ended (and were waited for) off the list the cleanup kills.
forget() { # pid...
    local p keep=()
    for p in "${pids[@]}"; do [[ " $* " == *" $p "* ]] || keep+=("$p"); done
    pids=("${keep[@]}")
}
wait_gone() { # pid: a child of this script, stopped (SIGKILL after 5 s) and reaped
    local i
    for i in $(seq 50); do
        [ "$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null || echo Z)" = Z ] && break
        sleep 0.1
    done
    kill -9 "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

declare -A loss lostn ooo pcount p50 p99 pmax lw batches
rows=()
notes=()
details=()

phase() { # label binary agent-pid quiet|loaded
    local row="$1-$4" bin=$2 agent=$3 stranger="" scraper="" dns="" i n
    local out="$dir/$1-$4"
    if [ "$4" = loaded ]; then
        (
            ulimit -n 65536 2>/dev/null || true
            exec ip netns exec "$S" "${load_cpu[@]}" nice -n "$load_nice" "$STRANGER_BIN" 10.210.0.2:7400 "$strangers" "$query_every" "${sources[@]}"
        ) >"$out-stranger.log" 2>&1 &
        stranger=$!
        pids+=("$stranger")
        # Until they are all in (A is the one more), within a minute.
        for i in $(seq 120); do
            n=$(status "$bin" 2>/dev/null | jq '.overlay.connected' || echo 0)
            [ "$n" -gt "$strangers" ] && break
            sleep 0.5
        done
        [ "$n" -gt "$strangers" ] ||
            notes+=("${row/-/ }: only $((n - 1)) of $strangers stranger connections up when the phase began")
    fi
    local cpu0 scpu0=0 dropsA0 dropsB0
    dropsA0=$(drops "$A") dropsB0=$(drops "$B")
    status "$bin" >"$out-before.json"
    cpu0=$(cpu "$agent")
    [ -n "$stranger" ] && scpu0=$(cpu "$stranger")
    # Background processes are started with `ip netns exec` itself (not through a shell
    # function, which would fork a subshell), so that $! is the process to stop.
    ip netns exec "$B" "${dp_cpu[@]}" iperf3 -s -1 -B 10.212.0.12 -p 5402 -J >"$out-iperf.json" 2>&1 &
    local server=$!
    pids+=("$server")
    sleep 0.3
    if [ "$4" = loaded ]; then
        ip netns exec "$B" "${load_cpu[@]}" nice -n "$load_nice" python3 "$dir/scrape.py" "$scrapes" "$secs" >"$out-scrape.txt" 2>&1 &
        scraper=$!
        ip netns exec "$B" "${load_cpu[@]}" nice -n "$load_nice" dnsperf -s 10.212.0.1 -d "$dir/queries" -Q "$dns_qps" -l "$secs" >"$out-dnsperf.txt" 2>&1 &
        dns=$!
        pids+=("$scraper" "$dns")
    fi
    ip netns exec "$A" "${dp_cpu[@]}" ping -i 0.01 -w "$secs" 10.212.0.12 >"$out-ping.txt" 2>&1 &
    local ping=$!
    pids+=("$ping")
    if ! inA "${dp_cpu[@]}" iperf3 -c 10.212.0.12 -p 5402 -u -w "$iperf_buffer" -b "$rate" -l "$len" -t "$secs" >"$out-client.txt" 2>&1; then
        notes+=("${row/-/ }: iperf3 client: $(tail -n 1 "$out-client.txt")")
        kill "$server" 2>/dev/null || true
    fi
    wait "$server" "$ping" 2>/dev/null || true
    forget "$server" "$ping"
    if [ -n "$scraper" ]; then
        wait "$scraper" "$dns" 2>/dev/null || true
        forget "$scraper" "$dns"
    fi
    local cpu1 scpu1=0 dropsA1 dropsB1
    dropsA1=$(drops "$A") dropsB1=$(drops "$B")
    cpu1=$(cpu "$agent")
    [ -n "$stranger" ] && scpu1=$(cpu "$stranger")
    status "$bin" >"$out-after.json"
    if [ -n "$stranger" ]; then
        kill "$stranger" 2>/dev/null || true
        wait_gone "$stranger"
        forget "$stranger"
    fi

    local lost packets
    read -r "loss[$row]" lost packets "ooo[$row]" < <(jq -r '.end |
        "\(.sum.lost_percent * 10000 | round / 10000) \(.sum.lost_packets) \(.sum.packets) \([.streams[].udp.out_of_order] | add)"' \
        "$out-iperf.json" 2>/dev/null || echo "- - - -")
    lostn[$row]=$lost
    read -r "pcount[$row]" "p50[$row]" "p99[$row]" "pmax[$row]" < <(grep -o 'time=[0-9.]*' "$out-ping.txt" | cut -d= -f2 | sort -g |
        awk '{ v[NR] = $1 }
             function at(q) { i = int(q * NR); if (i < q * NR) i++; if (i < 1) i = 1; return v[i] }
             END { if (NR == 0) print "0 - - -"; else printf "%d %.3f %.3f %.3f\n", NR, at(0.5), at(0.99), v[NR] }')
    python3 "$dir/lockwait.py" "$out-before.json" "$out-after.json" >"$out-lockwait.txt"
    read -r "lw[$row]" "batches[$row]" <"$out-lockwait.txt"
    rows+=("$row")

    local d
    d="${row/-/ }: UDP $lost of $packets datagrams lost; B agent CPU $(awk -v t=$((cpu1 - cpu0)) -v hz="$hz" -v s="$secs" 'BEGIN { printf "%.2f s (%.0f%% of one core)", t / hz, 100 * t / hz / s }')"
    d+="; B drops over the phase: $(jq -n -r --slurpfile a "$out-before.json" --slurpfile b "$out-after.json" \
        '["control_queue", "outbox"] | map("\(.) \(($b[0].drops[.] // 0) - ($a[0].drops[.] // 0))") | join(", ")')"
    d+="; kernel drops over the phase (UDP receive buffers, of which the agent's underlay sockets / hyphae0 TX / hyphae0 RX): $(paste -d' ' <(echo "$dropsA0 $dropsB0" | tr ' ' '\n') <(echo "$dropsA1 $dropsB1" | tr ' ' '\n') |
        awk '{ d[NR] = $2 - $1 } END { printf "A %d (%d) / %d / %d, B %d (%d) / %d / %d", d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8] }')"
    d+="; B overlay peers connected: $(jq '.overlay.connected' "$out-before.json") before, $(jq '.overlay.connected' "$out-after.json") after"
    if [ "$4" = loaded ]; then
        d+=" (A and up to $strangers strangers); stranger CPU $(awk -v t=$((scpu1 - scpu0)) -v hz="$hz" 'BEGIN { printf "%.2f s", t / hz }')"
        d+="; DNS: $(awk '/Queries sent:/ { s = $3 } /Queries completed:/ { c = $3 } /Response codes:/ { sub(/.*codes: +/, ""); r = $0 }
            END { printf "%d of %d queries answered (%s)", c, s, r }' "$out-dnsperf.txt")"
        d+="; /metrics: $(awk '{ printf "%d of %d scrapes succeeded", $1, $2 }' "$out-scrape.txt")"
    fi
    details+=("$d")
    while read -r line; do details+=("${row/-/ }: lock wait, $line"); done < <(tail -n +2 "$out-lockwait.txt")
}

measure() { # label binary
    pair_start "$1" "$2"
    local a=$agent_a b=$agent_b i
    if [ "$pin" = 1 ]; then
        # Every thread of both agents on CPU 0, then B's control thread (the main thread,
        # whose id is the process's) on CPU 1.
        taskset -a -p -c 0 "$a" >/dev/null
        taskset -a -p -c 0 "$b" >/dev/null
        taskset -p -c 1 "$b" >/dev/null
    fi
    inA ping -c 1 -W 1 10.212.0.12 >/dev/null 2>&1 || { echo "$1: no tunnel from A to B" >&2; tail "$dir/$1-"*.log >&2; exit 1; }
    # Datagrams that fit the overlay device (no fragments).
    len=$(($(inA cat /sys/class/net/hyphae0/mtu) - 28))
    # The names the DNS load asks for, answered at B's service address (within 30 s).
    for i in $(seq 60); do
        [ -n "$(inB dig @10.212.0.1 +short +time=1 +tries=1 alpha.bench)" ] && break
        sleep 0.5
    done
    [ -n "$(inB dig @10.212.0.1 +short +time=1 +tries=1 alpha.bench)" ] ||
        notes+=("$1: alpha.bench not answered at B's DNS before the phases")
    echo "$1: quiet phase (${secs}s)..." >&2
    phase "$1" "$2" "$b" quiet
    echo "$1: loaded phase (${secs}s)..." >&2
    phase "$1" "$2" "$b" loaded
    kill "$a" "$b" 2>/dev/null || true
    wait_gone "$a"
    wait_gone "$b"
    forget "$a" "$b"
}

# Both agents' `[agent] worker_priority` (none: the default, which older builds also read).
set_priority() { # normal|realtime
    local side
    for side in A B; do
        sed -i '/^worker_priority = /d' "$dir/$side-socket.toml"
        [ "$1" = normal ] || sed -i "s|^\[agent\]|&\nworker_priority = \"$1\"|" "$dir/$side-socket.toml"
    done
}
for priority in $priorities; do
    set_priority "$priority"
    measure "$([ "$priority" = normal ] && echo hyphae || echo "$priority")" "$HYPHAE_BIN"
done
set_priority normal
[ -n "${HYPHAE_BASELINE_BIN:-}" ] && measure baseline "$HYPHAE_BASELINE_BIN"

echo
echo "| phase | UDP loss % | out-of-order | ping count | ping p50 (ms) | ping p99 (ms) | ping max (ms) | lock-wait p99 (µs) | batches |"
echo "|---|---|---|---|---|---|---|---|---|"
for row in "${rows[@]}"; do
    echo "| ${row/-/ } | ${loss[$row]} | ${ooo[$row]} | ${pcount[$row]} | ${p50[$row]} | ${p99[$row]} | ${pmax[$row]} | ${lw[$row]} | ${batches[$row]} |"
done
echo
verdict() { if [ "$1" = 1 ]; then echo PASS; elif [ "$1" = 0 ]; then echo FAIL; else echo "n/a"; fi; }
for label in hyphae realtime baseline; do
    q="$label-quiet" l="$label-loaded"
    [ -n "${pcount[$l]:-}" ] || continue
    no_loss=$(awk -v x="${lostn[$l]}" 'BEGIN { if (x == "-" || x == "null") print "-"; else print (x + 0 == 0) }')
    ping_ok=$(awk -v a="${p99[$l]}" -v b="${p99[$q]}" 'BEGIN { if (a == "-" || b == "-") print "-"; else print (a - b <= 0.2) }')
    lw_ok=$(awk -v x="${lw[$l]}" 'BEGIN { if (x == "-") print "-"; else if (x ~ /^>/) print 0; else print (x + 0 <= 50) }')
    echo "Criteria ($label): no loss under load (${lostn[$l]} datagrams lost): $(verdict "$no_loss");" \
        "loaded ping p99 within 0.2 ms of quiet p99 (${p99[$l]} vs ${p99[$q]} ms): $(verdict "$ping_ok");" \
        "lock wait p99 < 50 µs (under ${lw[$l]} µs): $(verdict "$lw_ok")"
done
echo
for d in "${details[@]}"; do echo "- $d"; done
for n in "${notes[@]}"; do echo "Note: $n"; done
echo
echo "$(date -u +%F), $(nproc) cores, kernel $(uname -r), ${secs}s per phase, UDP $rate in $len-byte datagrams," \
    "$strangers strangers (a Kademlia query each every ${query_every}s), $scrapes scrapes/s, $dns_qps DNS queries/s, load generators at nice $load_nice$([ "$pin" = 1 ] && echo ", pinned (B's control thread and the load on CPU 1, the rest on CPU 0)")," \
    "hyphae $("$HYPHAE_BIN" --version | awk '{print $2}')${HYPHAE_BASELINE_BIN:+, baseline $("$HYPHAE_BASELINE_BIN" --version | awk '{print $2}')}." \
    "Lock-wait p99: the smallest histogram bound under which 99% of the phase's batches waited."
