# Sourced by benches/netns-throughput.sh and benches/udp-cpu.sh: two hosts, network
# namespaces $A and $B, joined by one veth pair (eth0: 10.210.0.1 and 10.210.0.2); a private
# directory $dir; on exit the PIDs in $pids are stopped (SIGTERM, then SIGKILL), both
# namespaces removed and $dir deleted. `hyphae_config SIDE UNDERLAY` writes
# $dir/SIDE-UNDERLAY.toml (with a third argument N, $dir/SIDE-UNDERLAY-wN.toml and
# `workers = N`): one interface-mode member of namespace "bench" (10.212.0.11 on A,
# .12 on B, device hyphae0) listening on its eth0 address, the other end as its peer.
# `pair_start LABEL BINARY` starts both agents from the socket configs and waits for the tunnel.
# Needs HYPHAE_BIN set. Usage: pair_setup PREFIX   (namespaces PREFIXA$$ and PREFIXB$$)

pair_setup() {
    A=${1}A$$
    B=${1}B$$
    dir=$(mktemp -d "/tmp/$1.XXXXXX")
    pids=()
    trap pair_cleanup EXIT
    ip netns add "$A"
    ip netns add "$B"
    ip netns exec "$A" ip link add eth0 type veth peer name eth0 netns "$B"
    ip netns exec "$A" ip addr add 10.210.0.1/24 dev eth0
    ip netns exec "$B" ip addr add 10.210.0.2/24 dev eth0
    local ns
    for ns in "$A" "$B"; do
        ip netns exec "$ns" ip link set lo up
        ip netns exec "$ns" ip link set eth0 up
    done
    (umask 077; "$HYPHAE_BIN" secret >"$dir/lab.secret")
}

pair_cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 0.3
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$A" 2>/dev/null || true
    ip netns del "$B" 2>/dev/null || true
    rm -rf "$dir"
}

pair_start() { # label binary: starts the agents of $dir/A-socket.toml and B-socket.toml,
    # waits (30 s at most) for A to reach B over the overlay; their PIDs in $agent_a, $agent_b
    rm -rf "$dir/A-socket-state" "$dir/B-socket-state"
    HYPHAE_LOG=warn ip netns exec "$A" "$2" up -c "$dir/A-socket.toml" >>"$dir/$1-A.log" 2>&1 &
    agent_a=$!
    HYPHAE_LOG=warn ip netns exec "$B" "$2" up -c "$dir/B-socket.toml" >>"$dir/$1-B.log" 2>&1 &
    agent_b=$!
    pids+=("$agent_a" "$agent_b")
    local i
    for i in $(seq 150); do
        ip netns exec "$A" ping -c 1 -W 1 10.212.0.12 >/dev/null 2>&1 && return 0
        sleep 0.2
    done
}

policy_file() { # rules: a default-deny policy whose last rule allows the two members
    local n=$1 i
    {
        echo 'default = "deny"'
        for ((i = 1; i < n; i++)); do
            printf '[[rule]]\nfrom = ["10.99.%d.0/24"]\nto = ["10.98.%d.0/24"]\nproto = "tcp"\nports = ["%d", "8000-8100"]\n' $((i % 250)) $((i % 250)) $((1000 + i))
        done
        printf '[[rule]]\nfrom = ["10.212.0.11", "10.212.0.12"]\nto = ["10.212.0.11", "10.212.0.12"]\n'
    } >"$dir/policy-$n.toml"
}
hyphae_config() { # side (A or B), underlay (socket or af_xdp), [workers], [policy rules]
    local side=$1 underlay=$2 workers=${3:-} rules=${4:-} me peer name
    if [ "$side" = A ]; then me=1; peer=2; else me=2; peer=1; fi
    name=$side-$underlay${workers:+-w$workers}${rules:+-p$rules}
    [ -z "$rules" ] || policy_file "$rules"
    cat >"$dir/$name.toml" <<CONFIG
[agent]
state_dir = "$dir/$name-state"
control_socket = "$dir/$side.sock"
listen = "10.210.0.$me:7400"
$([ "$underlay" = af_xdp ] && echo 'underlay = "af_xdp"')
$([ -n "$workers" ] && echo "workers = $workers")
[[namespace]]
name = "bench"
secret_file = "$dir/lab.secret"
subnet = "10.212.0.0/24"
# .1 is the namespace service address (virtual DHCP/DNS): members take .11 and .12.
address = "10.212.0.1$me"
device = "hyphae0"
$([ -n "$rules" ] && echo "policy = \"$dir/policy-$rules.toml\"")
[[namespace.peer]]
endpoint = "10.210.0.$peer:7400"
CONFIG
}
