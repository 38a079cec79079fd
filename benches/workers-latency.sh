#!/usr/bin/env bash
# One member's ping and small-packet rate at `workers = 1` against `workers = 2`, the settings
# alternated round by round in one run (issue 26, item 7). Two hosts in network namespaces
# (benches/lib/pair.sh), one interface-mode member on each. In each round, for each setting:
#   - ping: $PINGS pings $INTERVAL s apart from A to B: average, p50, p99 and maximum (ms);
#   - 64-byte UDP from A to B as fast as iperf3 sends for $SECS s, counted three ways:
#     what hyphae at A read from its TAP (its workers' frames_in), what hyphae at B received
#     from the tunnel (its workers' datagrams_in: hyphae's own rate, whatever the receiving
#     application keeps up with), and what iperf3 at B received (packets minus lost). (B's
#     hyphae0 rx_packets would not do: hyphae coalesces what it writes into super-frames.)
#   - which workers carried the pings, both ways.
# Needs root. Usage: benches/workers-latency.sh
# Environment: HYPHAE_BIN (default target/release/hyphae), ROUNDS (default 4), PINGS (500),
# INTERVAL (0.01), SECS (5), SETTINGS (default "1 2": the worker counts, in round order).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || exec sudo -E "$0" "$@"
scripts/deps iperf3 jq >/dev/null
HYPHAE_BIN=${HYPHAE_BIN:-target/release/hyphae}
[ -x "$HYPHAE_BIN" ] || cargo build --release --quiet -p hyphae-agent --bin hyphae
rounds=${ROUNDS:-4}
pings=${PINGS:-500}
interval=${INTERVAL:-0.01}
secs=${SECS:-5}
settings=${SETTINGS:-1 2}

. benches/lib/pair.sh
pair_setup hywl
inA() { ip netns exec "$A" "$@"; }
inB() { ip netns exec "$B" "$@"; }
for w in $settings; do
    hyphae_config A socket "$w"
    hyphae_config B socket "$w"
done

start() { # workers
    rm -rf "$dir"/*-state
    # `ip netns exec` directly, not through a shell function, so that $! is the agent.
    HYPHAE_LOG=warn ip netns exec "$A" "$HYPHAE_BIN" up -c "$dir/A-socket-w$1.toml" >>"$dir/w$1-A.log" 2>&1 &
    agent_a=$!
    HYPHAE_LOG=warn ip netns exec "$B" "$HYPHAE_BIN" up -c "$dir/B-socket-w$1.toml" >>"$dir/w$1-B.log" 2>&1 &
    agent_b=$!
    pids+=("$agent_a" "$agent_b")
    for _ in $(seq 150); do
        inA ping -c 1 -W 1 10.212.0.12 >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    echo "w$1: no connectivity" >&2
    return 1
}
stop() {
    local p
    kill "$agent_a" "$agent_b" 2>/dev/null || true
    for p in "$agent_a" "$agent_b"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null || true
    done
    wait "$agent_a" "$agent_b" 2>/dev/null || true
    # Stopped and reaped: not the exit trap's to kill (the PIDs may be reused by then).
    local kept=()
    for p in "${pids[@]}"; do [ "$p" = "$agent_a" ] || [ "$p" = "$agent_b" ] || kept+=("$p"); done
    pids=("${kept[@]}")
}
# Per worker, from status: "a0/a1 b0/b1 a'0/a'1 b'0/b'1": A's frames read from its TAP, B's
# datagrams received, B's frames read, A's datagrams received (the request's way, then the
# reply's).
workers() { # workers
    local a b
    a=$("$HYPHAE_BIN" status --json -c "$dir/A-socket-w$1.toml")
    b=$("$HYPHAE_BIN" status --json -c "$dir/B-socket-w$1.toml")
    echo "$(jq -r '[.workers[].frames_in] | join("/")' <<<"$a")" \
        "$(jq -r '[.workers[].datagrams_in] | join("/")' <<<"$b")" \
        "$(jq -r '[.workers[].frames_in] | join("/")' <<<"$b")" \
        "$(jq -r '[.workers[].datagrams_in] | join("/")' <<<"$a")"
}

printf '| round | workers | ping avg | p50 | p99 | max (ms) | 64 B: hyphae read at A (kpps) | hyphae received at B (kpps) | iperf3 received (kpps) | per worker: request A read, B received ; reply B read, A received |\n'
printf '|---|---|---|---|---|---|---|---|---|---|\n'
for r in $(seq "$rounds"); do
    for w in $settings; do
        start "$w"
        sleep 1
        before=$(workers "$w")
        inA ping -c "$pings" -i "$interval" 10.212.0.12 >"$dir/ping.txt"
        after=$(workers "$w")
        lat=$(awk -F'time=' '/time=/ { split($2, t, " "); print t[1] }' "$dir/ping.txt" | sort -g |
            awk '{ v[NR] = $1; s += $1 } END {
                printf "%.3f | %.3f | %.3f | %.3f", s / NR, v[int((NR + 1) / 2)], v[int(NR * 0.99 + 0.5)], v[NR] }')
        split=$(awk -v b="$before" -v a="$after" 'BEGIN {
            split(b, bb, " "); split(a, aa, " ")
            for (s = 1; s <= 4; s++) {
                n = split(bb[s], x, "/"); split(aa[s], y, "/"); o = ""
                for (i = 1; i <= n; i++) o = o (i > 1 ? "/" : "") (y[i] - x[i])
                printf "%s%s", (s == 3 ? " ; " : s > 1 ? " , " : ""), o
            }
        }')
        inB iperf3 -s -1 -B 10.212.0.12 -J >"$dir/udp.json" 2>/dev/null &
        srv=$!
        sleep 0.3
        c0=$(workers "$w")
        inA iperf3 -c 10.212.0.12 -u -l 64 -b 0 -t "$secs" >/dev/null 2>&1 || true
        c1=$(workers "$w")
        # A one-shot server ends with its client; one whose client never came is stopped.
        for _ in $(seq 30); do kill -0 "$srv" 2>/dev/null || break; sleep 0.1; done
        kill "$srv" 2>/dev/null || true
        wait "$srv" 2>/dev/null || true
        got=$(jq '.end.sum | (.packets - .lost_packets) / .seconds' "$dir/udp.json")
        pps=$(awk -v b="$c0" -v a="$c1" -v g="$got" -v s="$secs" 'BEGIN {
            split(b, bb, " "); split(a, aa, " ")
            for (k = 1; k <= 2; k++) {
                n = split(bb[k], x, "/"); split(aa[k], y, "/")
                for (i = 1; i <= n; i++) d[k] += y[i] - x[i]
            }
            printf "%.1f | %.1f | %.1f", d[1] / s / 1000, d[2] / s / 1000, g / 1000 }')
        printf '| %s | %s | %s | %s | %s |\n' "$r" "$w" "$lat" "$pps" "$split"
        stop
    done
done
