#!/usr/bin/env bash
# Instructions per packet of a namespace's policy (issue 28): each case of
# benches/benches/policy.rs runs N times under callgrind, and once with 0 steps (the same
# set-up: policy compiled, tables filled); the difference divided by N is what one packet
# costs, exactly and the same on every machine of this architecture.
#
#   benches/policy-instructions.sh [N]        (default 200000; needs valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200000}
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
cargo bench -p hyphae-benches --bench policy --no-run --quiet 2>/dev/null || cargo bench -p hyphae-benches --bench policy --no-run
bin=$(cargo bench -p hyphae-benches --bench policy --no-run --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "no bench binary" >&2; exit 1; }

# Instructions a whole run of case $1 with $2 steps executes.
count() {
  HYPHAE_POLICY_STEPS="$1:$2" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" 2>&1 \
    | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}

printf '%-34s %s\n' "case" "instructions per packet"
for case in policy/none policy/10_rules_flow_in_table policy/100_rules_flow_in_table \
            policy/10_rules_new_flow policy/100_rules_new_flow \
            policy_decide/10_rules policy_decide/100_rules; do
  base=$(count "$case" 0)
  full=$(count "$case" "$n")
  printf '%-34s %s\n' "$case" "$(awk -v a="$full" -v b="$base" -v n="$n" 'BEGIN { printf "%.1f", (a - b) / n }')"
done
