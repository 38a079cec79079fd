#!/usr/bin/env bash
# Namespace throughput benchmark: two hosts (network namespaces) joined by one veth pair,
# every path measured in the same run:
#   raw veth, kernel VXLAN, wireguard-go, boringtun-cli, easytier (TCP transport), hyphae over
#   sockets, and optionally hyphae over AF_XDP and a baseline hyphae build.
# For each path: iperf3 TCP with 1 and 4 streams, 64-byte UDP packets per second (counted by
# the receiver), ping RTT, each daemon's peak RSS under the 4-stream load, and the daemons' CPU
# seconds per gigabit moved (utime+stime from /proc/PID/stat over the 1-stream run, both ends
# summed). Every figure is the median of $ROUNDS runs. Prints a Markdown table and the ratios
# issue 15 sets as goals. Needs root. Usage:
#   benches/netns-throughput.sh [seconds-per-iperf-run]      (default 5)
# Environment:
#   HYPHAE_BIN           hyphae to measure (default target/release/hyphae, built if missing)
#   HYPHAE_AF_XDP=1      also measure hyphae with `underlay = "af_xdp"` (skipped, with a note,
#                        when the binary rejects that line or its status does not report AF_XDP)
#   HYPHAE_BASELINE_BIN  another hyphae build measured as an extra row (before/after in one run)
#   HYPHAE_WORKERS       worker counts (e.g. "1 4") each measured as an extra hyphae row,
#                        `hyphae-wN` (the `hyphae` row runs the default: one per core)
#   HYPHAE_REALTIME=1    also measure HYPHAE_BIN with `worker_priority = "realtime"` as the row
#                        `hyphae-rt` (its workers SCHED_FIFO threads)
#   HYPHAE_IPV6=1        also measure the `hyphae` row's agents over IPv6 (row `hyphae-ipv6`: the
#                        same daemons, to B's own IPv6 address of the namespace's derived prefix,
#                        read from its status), with the IPv6 / IPv4 ratios (issue 29's 5%)
#   HYPHAE_POLICY_RULES  rule counts (e.g. "10 100") each measured as an extra hyphae row,
#                        `hyphae-pN`: a default-deny policy of N rules, the last of which
#                        allows the two members (docs/POLICY.md; issue 28's cost of a policy)
#   ROUNDS               runs per figure, median taken (default 3)
#   BORINGTUN_BIN        default boringtun-cli on PATH, installed with cargo if missing
#   WIREGUARD_GO_BIN     default $(go env GOPATH)/bin/wireguard, installed with
#                        `go install golang.zx2c4.com/wireguard@latest` if missing
#   EASYTIER_BIN         default easytier-core on PATH, installed with
#                        `cargo install --locked easytier@2.0.3` if missing (needs protoc and
#                        the protobuf well-known types: libprotobuf-dev)
#   SKIP                 space-separated rows not to measure (e.g. "easytier")
#   PERF_DATA            a file: also profile both hyphae agents with `perf record` during one
#                        more 1-stream run (needs perf, and a hyphae built with symbols:
#                        CARGO_PROFILE_RELEASE_STRIP=false)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || exec sudo -E "$0" "$@"
secs=${1:-5}
rounds=${ROUNDS:-3}
skip=" ${SKIP:-} "
scripts/deps iperf3 wireguard-tools jq >/dev/null
# (EasyTier's build alone needs protoc and the protobuf types.)
[[ $skip == *" easytier "* ]] || scripts/deps protobuf-compiler libprotobuf-dev >/dev/null

HYPHAE_BIN=${HYPHAE_BIN:-target/release/hyphae}
[ -x "$HYPHAE_BIN" ] || cargo build --release --quiet --bin hyphae
if [ -z "${BORINGTUN_BIN:-}" ] && [[ $skip != *" boringtun "* ]]; then
    if ! command -v boringtun-cli >/dev/null; then
        echo "installing boringtun-cli from crates.io (once)..." >&2
        cargo install --quiet --locked boringtun-cli
    fi
    BORINGTUN_BIN=$(command -v boringtun-cli)
fi
# The current wireguard-go (TUN offload, UDP GSO/GRO), not Debian's 2022 package the interop
# test uses.
if [ -z "${WIREGUARD_GO_BIN:-}" ] && [[ $skip != *" wireguard-go "* ]]; then
    WIREGUARD_GO_BIN=$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin/wireguard
    if [ ! -x "$WIREGUARD_GO_BIN" ]; then
        echo "installing wireguard-go with go install (once)..." >&2
        go install golang.zx2c4.com/wireguard@latest
    fi
fi
if [ -z "${EASYTIER_BIN:-}" ] && [[ $skip != *" easytier "* ]]; then
    if ! command -v easytier-core >/dev/null; then
        echo "installing easytier 2.0.3 from crates.io (once; a long compile)..." >&2
        cargo install --quiet --locked easytier@2.0.3
    fi
    EASYTIER_BIN=$(command -v easytier-core)
fi

id=$$
. benches/lib/pair.sh
pair_setup hybench
inA() { ip netns exec "$A" "$@"; }
inB() { ip netns exec "$B" "$@"; }

# Kernel VXLAN.
inA ip link add vx0 type vxlan id 42 remote 10.210.0.2 local 10.210.0.1 dstport 4789 dev eth0
inB ip link add vx0 type vxlan id 42 remote 10.210.0.1 local 10.210.0.2 dstport 4789 dev eth0
inA ip addr add 10.211.0.1/24 dev vx0
inB ip addr add 10.211.0.2/24 dev vx0
inA ip link set vx0 up
inB ip link set vx0 up

# The daemons of each row, by PID (both ends), for RSS and CPU time and to stop them.
# Daemons are started with `ip netns exec` directly (not through a shell function, which would
# fork a subshell) so that $! is the daemon itself (ip execs it).
declare -A daemons

# hyphae, written for sockets and (HYPHAE_AF_XDP) for the AF_XDP underlay (lib/pair.sh).
for side in A B; do
    hyphae_config $side socket
    hyphae_config $side af_xdp
    for w in ${HYPHAE_WORKERS:-}; do hyphae_config $side socket "$w"; done
    for n in ${HYPHAE_POLICY_RULES:-}; do hyphae_config $side socket "" "$n"; done
    sed 's|^\[agent\]|&\nworker_priority = "realtime"|' "$dir/$side-socket.toml" >"$dir/$side-socket-rt.toml"
done
declare -A hyphae_bin hyphae_cfg
start_hyphae() { # row binary underlay
    hyphae_bin[$1]=$2; hyphae_cfg[$1]=$3
    HYPHAE_LOG=warn ip netns exec "$A" "$2" up -c "$dir/A-$3.toml" >>"$dir/$1-A.log" 2>&1 &
    pids+=($!); daemons[$1]=$!
    HYPHAE_LOG=warn ip netns exec "$B" "$2" up -c "$dir/B-$3.toml" >>"$dir/$1-B.log" 2>&1 &
    pids+=($!); daemons[$1]+=" $!"
}

# boringtun-cli and wireguard-go: userspace WireGuard on a TUN device, configured with wg(8).
# WireGuard rows get their own underlay ports and tunnel subnets: 10.213 and 10.215.
start_wireguard() { # row subnet port binary...
    local row=$1 net=$2 port=$3 ka kb pa pb
    shift 3
    ka=$(wg genkey); kb=$(wg genkey)
    pa=$(echo "$ka" | wg pubkey); pb=$(echo "$kb" | wg pubkey)
    WG_SUDO=1 WG_PROCESS_FOREGROUND=1 ip netns exec "$A" "$@" "${row:0:4}A$id" >"$dir/$row-A.log" 2>&1 &
    pids+=($!); daemons[$row]=$!
    WG_SUDO=1 WG_PROCESS_FOREGROUND=1 ip netns exec "$B" "$@" "${row:0:4}B$id" >"$dir/$row-B.log" 2>&1 &
    pids+=($!); daemons[$row]+=" $!"
    for i in $(seq 100); do
        inA ip link show "${row:0:4}A$id" >/dev/null 2>&1 && inB ip link show "${row:0:4}B$id" >/dev/null 2>&1 && break
        sleep 0.1
    done
    inA wg set "${row:0:4}A$id" private-key <(echo "$ka") listen-port "$port" \
        peer "$pb" allowed-ips "$net.2/32" endpoint "10.210.0.2:$port"
    inB wg set "${row:0:4}B$id" private-key <(echo "$kb") listen-port "$port" \
        peer "$pa" allowed-ips "$net.1/32" endpoint "10.210.0.1:$port"
    inA ip addr add "$net.1/24" dev "${row:0:4}A$id"
    inB ip addr add "$net.2/24" dev "${row:0:4}B$id"
    inA ip link set "${row:0:4}A$id" mtu 1420 up
    inB ip link set "${row:0:4}B$id" mtu 1420 up
}

# easytier: its own TUN device, peers over its TCP transport only (one TCP listener each, B
# connects to A, TCP as the default protocol, no UDP hole punching), default encryption, its
# multi-threaded runtime (the WireGuard daemons use several threads too).
start_easytier() {
    local common=(--network-name bench --network-secret "bench$id" --default-protocol tcp
        --disable-udp-hole-punching --multi-thread)
    ip netns exec "$A" "$EASYTIER_BIN" "${common[@]}" --ipv4 10.214.0.1 --dev-name "etA$id" \
        --listeners tcp://10.210.0.1:11010 >"$dir/easytier-A.log" 2>&1 &
    pids+=($!); daemons[easytier]=$!
    ip netns exec "$B" "$EASYTIER_BIN" "${common[@]}" --ipv4 10.214.0.2 --dev-name "etB$id" \
        --listeners tcp://10.210.0.2:11010 --peers tcp://10.210.0.1:11010 >"$dir/easytier-B.log" 2>&1 &
    pids+=($!); daemons[easytier]+=" $!"
}

stop_row() {
    local p
    # shellcheck disable=SC2086
    kill ${daemons[$1]} 2>/dev/null || true
    for p in ${daemons[$1]}; do
        for i in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    done
}

wait_ping() {
    for i in $(seq 150); do inA ping -c 1 -W 1 "$1" >/dev/null 2>&1 && return 0; sleep 0.2; done
    echo "no connectivity to $1" >&2
    return 1
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else print v[int((NR + 1) / 2)] }'; }

# CPU ticks (utime + stime) of the row's daemons, summed.
cpu_ticks() {
    local total=0 p
    for p in ${daemons[$1]:-}; do
        total=$((total + $(awk '{ print $14 + $15 }' "/proc/$p/stat")))
    done
    echo "$total"
}

# iperf3 TCP against a one-shot server in B; prints Gbit/s received.
iperf_tcp() { # dst streams
    ip netns exec "$B" iperf3 -s -1 -B "$1" >/dev/null 2>&1 &
    local srv=$!
    sleep 0.3
    inA iperf3 -c "$1" -t "$secs" -P "$2" -J | jq '.end.sum_received.bits_per_second / 1e9'
    wait "$srv" 2>/dev/null || true
}

# 64-byte UDP datagrams as fast as the sender goes; prints the packets per second the
# receiver got (its own count: sent minus lost over its interval).
iperf_pps() { # dst
    ip netns exec "$B" iperf3 -s -1 -B "$1" -J >"$dir/udp-server.json" 2>/dev/null &
    local srv=$!
    sleep 0.3
    inA iperf3 -c "$1" -u -l 64 -b 0 -t "$secs" >/dev/null 2>&1 || true
    wait "$srv" 2>/dev/null || true
    jq '.end.sum | (.packets - .lost_packets) / .seconds' "$dir/udp-server.json"
}

# 50 pings 20 ms apart: the average and the largest round trip (ms), "avg max".
rtt() {
    inA ping -c 50 -i 0.02 -q "$1" | awk -F/ '/^rtt/ { print $5, $6 }'
}

# Peak RSS (MB) of each of the row's daemons while a 4-stream run goes on; prints "a / b".
rss_under_load() { # row dst
    ip netns exec "$B" iperf3 -s -1 -B "$2" >/dev/null 2>&1 &
    local srv=$! p out=""
    sleep 0.3
    inA iperf3 -c "$2" -t "$secs" -P 4 >/dev/null 2>&1 &
    local cli=$!
    declare -A peak
    while kill -0 "$cli" 2>/dev/null; do
        for p in ${daemons[$1]}; do
            local kb
            kb=$(awk '/^VmRSS/ { print $2 }' "/proc/$p/status" 2>/dev/null || echo 0)
            [ "${kb:-0}" -gt "${peak[$p]:-0}" ] && peak[$p]=$kb
        done
        sleep 0.25
    done
    wait "$srv" 2>/dev/null || true
    for p in ${daemons[$1]}; do out+="${out:+ / }$(awk -v k="${peak[$p]:-0}" 'BEGIN { printf "%.1f", k / 1024 }')"; done
    echo "$out"
}

# Per worker of a hyphae row: A's frames read from its TAP queues and B's datagrams received,
# as `hyphae status --json` counts them; prints "A a0,a1,... B b0,b1,...".
worker_counts() { # row
    local a b
    a=$("${hyphae_bin[$1]}" status --json -c "$dir/A-${hyphae_cfg[$1]}.toml" 2>/dev/null |
        jq -r '[.workers[].frames_in] | join(",")')
    b=$("${hyphae_bin[$1]}" status --json -c "$dir/B-${hyphae_cfg[$1]}.toml" 2>/dev/null |
        jq -r '[.workers[].datagrams_in] | join(",")')
    echo "A $a B $b"
}

# What each worker carried between two worker_counts: "A read x / y, B received x / y".
worker_split() { # before after
    awk -v b="$1" -v a="$2" 'BEGIN {
        split(b, bb, " "); split(a, aa, " ")
        for (side = 0; side < 2; side++) {
            n1 = split(bb[2 + 2 * side], x, ","); split(aa[2 + 2 * side], y, ",")
            out = ""
            for (i = 1; i <= n1; i++) out = out (i > 1 ? " / " : "") (y[i] - x[i])
            printf "%s%s %s", (side ? ", " : ""), (side ? "B received" : "A read"), out
        }
    }'
}

declare -A one four pps ping pingmax rss cpu cpu4 split4
notes=()
measure() { # row dst
    local row=$1 dst=$2 r a b t0 t1 gbps
    wait_ping "$dst"
    local ones=() fours=() ppss=() pings=() pingmaxes=() cpus=() cpus4=() w0 w1 rt
    per_gbit() { awk -v t=$(($2 - $1)) -v hz="$(getconf CLK_TCK)" -v g="$3" -v s="$secs" \
        'BEGIN { if (g > 0) printf "%.3f", t / hz / (g * s); else print "-" }'; }
    for r in $(seq "$rounds"); do
        t0=$(cpu_ticks "$row")
        gbps=$(iperf_tcp "$dst" 1)
        t1=$(cpu_ticks "$row")
        ones+=("$gbps")
        [ -n "${daemons[$row]:-}" ] && cpus+=("$(per_gbit "$t0" "$t1" "$gbps")")
        [ -n "${hyphae_cfg[$row]:-}" ] && w0=$(worker_counts "$row")
        t0=$(cpu_ticks "$row")
        gbps=$(iperf_tcp "$dst" 4)
        t1=$(cpu_ticks "$row")
        fours+=("$gbps")
        [ -n "${daemons[$row]:-}" ] && cpus4+=("$(per_gbit "$t0" "$t1" "$gbps")")
        if [ -n "${hyphae_cfg[$row]:-}" ]; then
            w1=$(worker_counts "$row")
            split4[$row]=$(worker_split "$w0" "$w1")
        fi
        ppss+=("$(iperf_pps "$dst")")
        rt=$(rtt "$dst")
        pings+=("${rt% *}")
        pingmaxes+=("${rt#* }")
    done
    one[$row]=$(printf '%s\n' "${ones[@]}" | median)
    four[$row]=$(printf '%s\n' "${fours[@]}" | median)
    pps[$row]=$(printf '%s\n' "${ppss[@]}" | median)
    ping[$row]=$(printf '%s\n' "${pings[@]}" | median)
    pingmax[$row]=$(printf '%s\n' "${pingmaxes[@]}" | median)
    if [ -n "${daemons[$row]:-}" ]; then
        cpu[$row]=$(printf '%s\n' "${cpus[@]}" | median)
        cpu4[$row]=$(printf '%s\n' "${cpus4[@]}" | median)
        rss[$row]=$(rss_under_load "$row" "$dst")
    else
        cpu[$row]="-"; cpu4[$row]="-"; rss[$row]="-"
    fi
    printf '%s: 1 stream %.2f Gb/s, 4 streams %.2f Gb/s, 64B UDP %.0f pps, rtt %.3f ms, RSS %s MB, %s CPU s/Gbit\n' \
        "$row" "${one[$row]}" "${four[$row]}" "${pps[$row]}" "${ping[$row]}" "${rss[$row]}" "${cpu[$row]}" >&2
    rows+=("$row")
}

rows=()
measure raw 10.210.0.2
measure vxlan 10.211.0.2
if [[ $skip != *" wireguard-go "* ]]; then
    start_wireguard wireguard-go 10.215.0 51821 "$WIREGUARD_GO_BIN" -f
    measure wireguard-go 10.215.0.2
    stop_row wireguard-go
fi
if [[ $skip != *" boringtun "* ]]; then
    start_wireguard boringtun 10.213.0 51820 "$BORINGTUN_BIN" --foreground --disable-drop-privileges
    measure boringtun 10.213.0.2
    stop_row boringtun
fi
if [[ $skip != *" easytier "* ]]; then
    start_easytier
    measure easytier 10.214.0.2
    stop_row easytier
fi
start_hyphae hyphae "$HYPHAE_BIN" socket
measure hyphae 10.212.0.12
if [ "${HYPHAE_IPV6:-0}" = 1 ]; then
    # The same agents: no restart between the IPv4 and the IPv6 figures.
    addr6=$("$HYPHAE_BIN" status -c "$dir/B-socket.toml" --json | jq -r '.namespaces[0].address6 // empty')
    if [ -n "$addr6" ]; then
        daemons[hyphae-ipv6]=${daemons[hyphae]}
        hyphae_bin[hyphae-ipv6]=${hyphae_bin[hyphae]}
        hyphae_cfg[hyphae-ipv6]=socket
        measure hyphae-ipv6 "$addr6"
    else
        notes+=("hyphae-ipv6 skipped: B holds no IPv6 address")
    fi
fi
if [ -n "${PERF_DATA:-}" ]; then
    # Where both agents' CPU goes under one more 1-stream run: `perf report -i $PERF_DATA`.
    perf record -F 999 -o "$PERF_DATA" -p "$(tr ' ' , <<<"${daemons[hyphae]}")" -- sleep "$secs" \
        >/dev/null 2>&1 &
    perf_pid=$!
    iperf_tcp 10.212.0.12 1 >/dev/null
    wait "$perf_pid" || true
fi
stop_row hyphae
if [ "${HYPHAE_AF_XDP:-0}" = 1 ]; then
    start_hyphae hyphae-af_xdp "$HYPHAE_BIN" af_xdp
    # `hyphae status` says `underlay af_xdp on IF (...)`, or `underlay socket` after a fallback.
    underlay=""
    for i in $(seq 50); do
        kill -0 ${daemons[hyphae-af_xdp]} 2>/dev/null || break
        underlay=$("$HYPHAE_BIN" status -c "$dir/A-af_xdp.toml" 2>/dev/null | grep -m1 -E '^ *underlay ' || true)
        [ -n "$underlay" ] && break
        sleep 0.2
    done
    if ! kill -0 ${daemons[hyphae-af_xdp]} 2>/dev/null; then
        notes+=("hyphae-af_xdp skipped: this hyphae does not run with \`underlay = \"af_xdp\"\` ($(tail -n 1 "$dir/hyphae-af_xdp-A.log"))")
    elif ! grep -qE '^ *underlay af_xdp' <<<"$underlay"; then
        notes+=("hyphae-af_xdp skipped: the agent is not on AF_XDP (status: ${underlay:-no answer}; log: $(grep -m1 -i 'af_xdp' "$dir/hyphae-af_xdp-A.log" || true))")
    else
        measure hyphae-af_xdp 10.212.0.12
        notes+=("hyphae-af_xdp status: $(sed 's/^ *//' <<<"$underlay")")
    fi
    stop_row hyphae-af_xdp
fi
for w in ${HYPHAE_WORKERS:-}; do
    start_hyphae "hyphae-w$w" "$HYPHAE_BIN" "socket-w$w"
    measure "hyphae-w$w" 10.212.0.12
    stop_row "hyphae-w$w"
done
if [ "${HYPHAE_REALTIME:-0}" = 1 ]; then
    start_hyphae hyphae-rt "$HYPHAE_BIN" socket-rt
    measure hyphae-rt 10.212.0.12
    stop_row hyphae-rt
fi
for n in ${HYPHAE_POLICY_RULES:-}; do
    start_hyphae "hyphae-p$n" "$HYPHAE_BIN" "socket-p$n"
    measure "hyphae-p$n" 10.212.0.12
    stop_row "hyphae-p$n"
done
if [ -n "${HYPHAE_BASELINE_BIN:-}" ]; then
    start_hyphae hyphae-baseline "$HYPHAE_BASELINE_BIN" socket
    measure hyphae-baseline 10.212.0.12
    stop_row hyphae-baseline
fi

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "-" && b > 0) printf "%.2f", a / b; else print "-" }'; }
echo
echo "| path | TCP 1 stream (Gb/s) | TCP 4 streams (Gb/s) | 64 B UDP (kpps, received) | ping RTT avg (ms) | ping max (ms) | RSS under 4 streams, A / B (MB) | daemon CPU s per Gbit, 1 / 4 streams | 1 stream / VXLAN | 64 B pps / VXLAN |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for row in "${rows[@]}"; do
    printf '| %s | %.2f | %.2f | %.0f | %.3f | %.3f | %s | %s / %s | %s | %s |\n' "$row" "${one[$row]}" "${four[$row]}" \
        "$(awk -v p="${pps[$row]}" 'BEGIN { print p / 1000 }')" "${ping[$row]}" "${pingmax[$row]}" "${rss[$row]}" "${cpu[$row]}" \
        "${cpu4[$row]}" "$(ratio "${one[$row]}" "${one[vxlan]}")" "$(ratio "${pps[$row]}" "${pps[vxlan]}")"
done
echo
for row in "${rows[@]}"; do
    [ -n "${split4[$row]:-}" ] && echo "- $row, the last 4-stream run, per worker: ${split4[$row]}"
done
echo
best=""
for row in wireguard-go boringtun easytier; do
    [ -n "${one[$row]:-}" ] || continue
    if [ -z "$best" ] || awk -v a="${one[$row]}" -v b="${one[$best]}" 'BEGIN { exit !(a > b) }'; then best=$row; fi
done
for row in hyphae hyphae-af_xdp; do
    [ -n "${one[$row]:-}" ] || continue
    echo "Goals (issue 15) for $row:"
    [ -n "$best" ] && echo "- TCP 1 stream vs the best userspace peer ($best): $(ratio "${one[$row]}" "${one[$best]}")x (goal >= 2)"
    echo "- TCP 1 stream vs kernel VXLAN: $(ratio "${one[$row]}" "${one[vxlan]}")x (goal >= 0.5)"
    echo "- 64-byte pps vs kernel VXLAN: $(ratio "${pps[$row]}" "${pps[vxlan]}")x (goal >= 1.0)"
    echo "- ping RTT added over raw veth: $(awk -v a="${ping[$row]}" -v b="${ping[raw]}" 'BEGIN { printf "%.3f", a - b }') ms (goal <= 0.1)"
    echo "- RSS per agent under 4 streams: ${rss[$row]} MB (goal <= 24)"
done
if [ -n "${one[hyphae-ipv6]:-}" ]; then
    echo "IPv6 against IPv4, the same agents (issue 29: within 5%):"
    echo "- TCP 1 stream: $(ratio "${one[hyphae-ipv6]}" "${one[hyphae]}")x"
    echo "- TCP 4 streams: $(ratio "${four[hyphae-ipv6]}" "${four[hyphae]}")x"
    echo "- 64-byte pps: $(ratio "${pps[hyphae-ipv6]}" "${pps[hyphae]}")x"
fi
for n in "${notes[@]}"; do echo "Note: $n"; done
echo
echo "$(date -u +%Y-%m-%d), $(nproc) cores, kernel $(uname -r), ${secs}s per iperf3 run, medians of $rounds," \
    "hyphae $("$HYPHAE_BIN" --version | awk '{print $2}'), $([ -n "${BORINGTUN_BIN:-}" ] && "$BORINGTUN_BIN" --version 2>/dev/null | head -1 || echo "boringtun not measured")," \
    "wireguard-go $([ -n "${WIREGUARD_GO_BIN:-}" ] && "$WIREGUARD_GO_BIN" --version 2>/dev/null | awk '{print $2; exit}' || echo "not measured")," \
    "easytier $([ -n "${EASYTIER_BIN:-}" ] && "$EASYTIER_BIN" --version 2>/dev/null | head -1 || echo "not measured")"
