#!/usr/bin/env bash
# kc's TCP all-reduce against the link's own limit between two hosts: two network namespaces
# joined by a veth pair shaped with tc tbf, one kc rank on each. In one run, interleaved:
# `kc bench comm --op wire` (plain sockets streaming both ways: what the link carries) and the
# ring all-reduce; prints the medians and kc's share of the wire. Needs root.
# Usage: bench/comm/wire_netns.sh [KC_BINARY] [SIZES] [RATES] [REPEATS]
#   RATES: comma-separated tc rates (default 1gbit,10gbit); SIZES default 64M.
set -euo pipefail
KC=${1:-build/release/apps/kc/kc}
SIZES=${2:-64M}
RATES=${3:-1gbit,10gbit}
REPEATS=${4:-3}
[ -x "$KC" ] || { echo "wire_netns: no kc binary at $KC (build the release preset)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "wire_netns: needs root for network namespaces" >&2; exit 2; }

. "$(dirname "$0")/two_hosts.sh" 215

run() {  # run OP EXTRA... -> rank 0's JSON lines
  local op=$1; shift
  local port=$(( 29500 + RANDOM % 1000 ))
  local common="bench comm --ranks 1 --world 2 --hosts a,b --sizes $SIZES --iters 3 --warmup 1 --format json --op $op --group wire-$$-$RANDOM --timeout 120 $*"
  ip netns exec "$B" "$KC" $common --first-rank 1 --bind "$IPB" --store "$IPA:$port" >/dev/null &
  local pid=$!
  ip netns exec "$A" "$KC" $common --first-rank 0 --bind "$IPA" --store "$IPA:$port"
  wait "$pid"
}

field() { python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(r["size"], r[sys.argv[2]])' "$1" "$2"; }

IFS=, read -ra rates <<< "$RATES"
for rate in "${rates[@]}"; do
  for ns_dev in "$A:$VA" "$B:$VB"; do
    ip netns exec "${ns_dev%%:*}" tc qdisc replace dev "${ns_dev##*:}" root tbf rate "$rate" \
      burst 1mb latency 50ms
  done
  declare -A samples=()
  for _ in $(seq "$REPEATS"); do
    for op in wire allreduce; do
      while read -r line; do
        read -r size bw < <(field "$line" busbw)
        samples[$op/$size]="${samples[$op/$size]:-} $bw"
      done < <(run "$op" --algo ring)
    done
  done
  echo "# link shaped to $rate (tc tbf, both directions); median busbw in GB/s of $REPEATS interleaved runs"
  printf '%12s %12s %12s %10s\n' size wire allreduce kc/wire
  for key in "${!samples[@]}"; do
    case $key in wire/*) size=${key#wire/};
      python3 - "$size" "${samples[wire/$size]}" "${samples[allreduce/$size]}" <<'PY'
import statistics, sys
w = statistics.median(float(x) for x in sys.argv[2].split())
k = statistics.median(float(x) for x in sys.argv[3].split())
print(f"{sys.argv[1]:>12} {w:12.3f} {k:12.3f} {k / w:9.0%}")
PY
    esac
  done
  unset samples
done
