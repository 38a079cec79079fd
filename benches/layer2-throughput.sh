#!/usr/bin/env bash
# A layer-2 namespace against an IP one (issue 30, item 8): two interface members over one
# veth, one TCP flow (iperf3) and 100 pings, round by round alternating
#   ip          the default IP namespace (TAP offloads on)
#   ip-nooff    the IP namespace with `offload = false` (what offloads are worth)
#   l2          `layer = 2`: every frame in an EtherIP envelope, forwarded by MAC
# and prints one line per round and variant, then the mean of each; then, in the layer-2
# namespace, ARP_ROUNDS (50) resolutions of B by A, each after A's ARP cache is flushed:
# how many ARP broadcasts still crossed per resolution (ARP suppression).
# Usage (root): HYPHAE_BIN=target/release/hyphae benches/layer2-throughput.sh [SECONDS]
#   ROUNDS=3 by default; SECONDS (iperf3's -t) 5 by default.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${HYPHAE_BIN:?set HYPHAE_BIN to the hyphae binary}"
secs=${1:-5}
rounds=${ROUNDS:-3}
. "$here/lib/pair.sh"
pair_setup l2tp
hyphae_config A socket
hyphae_config B socket
for side in A B; do
    cp "$dir/$side-socket.toml" "$dir/$side-ip.toml"
    sed 's/^listen = .*/&\noffload = false/' "$dir/$side-socket.toml" >"$dir/$side-ip-nooff.toml"
    sed 's/^device = "hyphae0"/&\nlayer = 2/' "$dir/$side-socket.toml" >"$dir/$side-l2.toml"
done

run() { # variant: one round; appends "variant Gbit/s ping-avg-ms" to $results (in this
    # shell, so its agents stay in $pids for the exit trap if a step fails)
    local v=$1 server gbps ping
    cp "$dir/A-$v.toml" "$dir/A-socket.toml"
    cp "$dir/B-$v.toml" "$dir/B-socket.toml"
    pair_start "$v" "$HYPHAE_BIN"
    ip netns exec "$B" iperf3 -s -1 >/dev/null 2>&1 &
    server=$!
    pids+=("$server")
    sleep 0.3
    gbps=$(ip netns exec "$A" iperf3 -c 10.212.0.12 -t "$secs" -J |
        /usr/bin/python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9))')
    ping=$(ip netns exec "$A" ping -c 100 -i 0.01 -q 10.212.0.12 | awk -F/ '/^rtt/ {print $5}')
    kill "$agent_a" "$agent_b" "$server" 2>/dev/null || true
    wait "$agent_a" "$agent_b" "$server" 2>/dev/null || true
    results+=("$v $gbps $ping")
}

arp_phase() { # l2 only: ARP_ROUNDS resolutions of B by A, each after flushing A's cache;
    # prints how many ARP requests both agents answered themselves and how many they flooded
    # (either way: B's kernel may ask for A too).
    local n=${ARP_ROUNDS:-50} k before after lost=0
    cp "$dir/A-l2.toml" "$dir/A-socket.toml"
    cp "$dir/B-l2.toml" "$dir/B-socket.toml"
    pair_start arp "$HYPHAE_BIN"
    counts() { # suppressed and flooded, A's and B's together
        local s
        for s in A B; do
            "$HYPHAE_BIN" status --json -c "$dir/$s-socket.toml"
        done | /usr/bin/python3 -c '
import json, sys
text = sys.stdin.read()
decoder, at, n = json.JSONDecoder(), 0, [0, 0]
while at < len(text.rstrip()):
    doc, at = decoder.raw_decode(text, at)
    while at < len(text) and text[at].isspace():
        at += 1
    l2 = doc["namespaces"][0]["layer2"]
    n[0] += l2["arp_suppressed"]; n[1] += l2["arp_flooded"]
print(n[0], n[1])'
    }
    before=$(counts)
    for k in $(seq "$n"); do
        ip netns exec "$A" ip neigh flush dev hyphae0
        ip netns exec "$A" ping -c 1 -W 1 -q 10.212.0.12 >/dev/null || lost=$((lost + 1))
    done
    after=$(counts)
    kill "$agent_a" "$agent_b" 2>/dev/null || true
    wait "$agent_a" "$agent_b" 2>/dev/null || true
    echo "$before $after" | awk -v n="$n" -v lost="$lost" '{ printf "arp: %d resolutions (%d pings lost), %d ARP requests answered at the agents, %d flooded (%.2f broadcasts crossed per resolution)\n", n, lost, $3 - $1, $4 - $2, ($4 - $2) / n }'
}

results=()
for r in $(seq "$rounds"); do
    for v in ip ip-nooff l2; do
        run "$v"
        echo "round $r: ${results[-1]}"
    done
done
printf '%s\n' "${results[@]}" | awk '
    { n[$1]++; g[$1] += $2; p[$1] += $3 }
    END { for (v in n) printf "mean %-9s %.2f Gbit/s  ping %.3f ms  (%d rounds)\n", v, g[v] / n[v], p[v] / n[v], n[v] }'
arp_phase
