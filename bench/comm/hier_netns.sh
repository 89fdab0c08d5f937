#!/usr/bin/env bash
# Two hosts as network namespaces joined by a veth pair shaped with tc tbf (default 1 Gbit/s),
# two kc ranks on each: flat ring vs hierarchical all-reduce, interleaved, in one run.
# Needs root. Usage: bench/comm/hier_netns.sh [KC_BINARY] [SIZES] [RATE] [REPEATS]
set -euo pipefail
KC=${1:-build/release/apps/kc/kc}
SIZES=${2:-64M}
RATE=${3:-1gbit}
REPEATS=${4:-3}
[ -x "$KC" ] || { echo "hier_netns: no kc binary at $KC (build the release preset)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "hier_netns: needs root for network namespaces" >&2; exit 2; }

. "$(dirname "$0")/two_hosts.sh" 214
ip netns exec "$A" tc qdisc add dev "$VA" root tbf rate "$RATE" burst 256kb latency 50ms
ip netns exec "$B" tc qdisc add dev "$VB" root tbf rate "$RATE" burst 256kb latency 50ms

run() {  # run ALGO -> JSON lines of rank 0's run
  local algo=$1 port=$(( 29500 + RANDOM % 1000 ))
  local common="bench comm --ranks 2 --world 4 --hosts a,a,b,b --sizes $SIZES --iters 3 --warmup 1 --format json --algo $algo --group hier-$$-$RANDOM --timeout 120"
  ip netns exec "$B" "$KC" $common --first-rank 2 --bind "$IPB" --store "$IPA:$port" >/dev/null &
  local pid=$!
  ip netns exec "$A" "$KC" $common --first-rank 0 --bind "$IPA" --store "$IPA:$port"
  wait "$pid"
}

echo "# 2 hosts x 2 ranks, inter-host veth shaped to $RATE; best of $REPEATS interleaved runs"
declare -A best
for i in $(seq "$REPEATS"); do
  for algo in ring hierarchical; do
    while read -r line; do
      size=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["size"])' "$line")
      t=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["time_us"])' "$line")
      key="$algo/$size"
      if [ -z "${best[$key]:-}" ] || python3 -c "import sys; sys.exit(0 if $t < ${best[$key]} else 1)"; then
        best[$key]=$t
      fi
    done < <(run "$algo")
  done
done
printf '%12s %16s %16s %10s\n' size "ring time(us)" "hier time(us)" "ring/hier"
for key in "${!best[@]}"; do
  case $key in ring/*) size=${key#ring/};
    r=${best[ring/$size]}; h=${best[hierarchical/$size]}
    printf '%12s %16.0f %16.0f %10.2f\n' "$size" "$r" "$h" "$(python3 -c "print($r / $h)")";;
  esac
done
