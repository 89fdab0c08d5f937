#!/usr/bin/env bash
# kc's TCP all-reduce against the link's own limit between two hosts: two network namespaces
# joined by a veth pair shaped with tc tbf, one rank on each. In one run, interleaved:
# `kc bench comm --op wire` (plain sockets streaming both ways: what the link carries), kc's
# ring all-reduce (f32 on the wire, and with --wire bf16: half the bytes), and Open MPI's all-reduce over its tcp BTL between the same namespaces
# (when mpirun and build/bench-baselines/mpi_bench are there: bench/comm/compare.py builds
# it). Prints the medians and each one's share of the wire. Needs root.
# Usage: bench/comm/wire_netns.sh [KC_BINARY] [SIZES] [RATES] [REPEATS]
#   RATES: comma-separated tc rates (default 1gbit,10gbit); SIZES default 64M.
#   MPI_BENCH=PATH overrides the Open MPI benchmark program.
set -euo pipefail
KC=${1:-build/release/apps/kc/kc}
SIZES=${2:-64M}
RATES=${3:-1gbit,10gbit}
REPEATS=${4:-3}
MPI_BENCH=${MPI_BENCH:-build/bench-baselines/mpi_bench}
[ -x "$KC" ] || { echo "wire_netns: no kc binary at $KC (build the release preset)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "wire_netns: needs root for network namespaces" >&2; exit 2; }

. "$(dirname "$0")/two_hosts.sh" 215
WORK=$(mktemp -d)
trap 'cleanup; rm -rf "$WORK"' EXIT

run() {  # run OP EXTRA... -> rank 0's JSON lines
  local op=$1; shift
  local port=$(( 29500 + RANDOM % 1000 ))
  local common="bench comm --ranks 1 --world 2 --hosts a,b --sizes $SIZES --iters 3 --warmup 1 --format json --op $op --group wire-$$-$RANDOM --timeout 120 $*"
  ip netns exec "$B" "$KC" $common --first-rank 1 --bind "$IPB" --store "$IPA:$port" >/dev/null &
  local pid=$!
  ip netns exec "$A" "$KC" $common --first-rank 0 --bind "$IPA" --store "$IPA:$port"
  wait "$pid"
}

# Open MPI across the namespaces: mpirun in A starts its daemons through an "rsh agent" that
# enters the namespace named by the host; the tcp BTL and the daemons use the veth subnet.
MPI=no
if command -v mpirun >/dev/null && [ -x "$MPI_BENCH" ]; then
  MPI=yes
  printf 'ns-a slots=1\nns-b slots=1\n' > "$WORK/hosts"
  cat > "$WORK/agent" <<AGENT
#!/bin/bash
case \$1 in ns-a) ns=$A ;; ns-b) ns=$B ;; *) echo "wire_netns: unknown host \$1" >&2; exit 1 ;; esac
shift
exec ip netns exec "\$ns" sh -c "\$*"
AGENT
  chmod +x "$WORK/agent"
else
  echo "# Open MPI: not measured (no mpirun or no $MPI_BENCH; bench/comm/compare.py builds it)"
fi
run_mpi() {
  local net=${IPA%.*}.0/24
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -s KILL 120 \
    ip netns exec "$A" mpirun --allow-run-as-root -np 2 --hostfile "$WORK/hosts" \
    --mca plm_rsh_agent "$WORK/agent" --mca plm_rsh_no_tree_spawn 1 --mca routed direct \
    --mca btl tcp,self --mca btl_tcp_if_include "$net" --mca oob_tcp_if_include "$net" \
    "$MPI_BENCH" --op allreduce --sizes "$SIZES" --iters 3 --warmup 1 --buffers user
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
    for what in wire allreduce bf16 openmpi; do
      case $what in
        openmpi)
          [ "$MPI" = yes ] || continue
          # A baseline that fails or hangs (mpirun across namespaces sometimes does) costs its
          # sample, not the run.
          lines=$(run_mpi) || { echo "# Open MPI run failed (exit $?)" >&2; lines=""; } ;;
        bf16) lines=$(run allreduce --algo ring --wire bf16) ;;
        *) lines=$(run "$what" --algo ring) ;;
      esac
      while read -r line; do
        [ -n "$line" ] || continue
        read -r size bw < <(field "$line" busbw)
        samples[$what/$size]="${samples[$what/$size]:-} $bw"
      done <<< "$lines"
    done
  done
  echo "# link shaped to $rate (tc tbf, both directions); median busbw in GB/s of $REPEATS interleaved runs"
  printf '%12s %10s %10s %10s %10s %10s %10s %10s\n' size wire kc kc/wire kc-bf16 bf16/wire \
    openmpi mpi/wire
  for key in "${!samples[@]}"; do
    case $key in wire/*) size=${key#wire/};
      python3 - "$size" "${samples[wire/$size]}" "${samples[allreduce/$size]}" \
        "${samples[openmpi/$size]:-}" "${samples[bf16/$size]}" <<'PY'
import statistics, sys
med = lambda s: statistics.median(float(x) for x in s.split()) if s.strip() else None
w, k, m, b = med(sys.argv[2]), med(sys.argv[3]), med(sys.argv[4]), med(sys.argv[5])
mpi = f"{m:10.3f} {m / w:9.0%}" if m is not None else f"{'-':>10} {'-':>10}"
# busbw counts the f32 bytes: the bf16 wire moves half of them, so it may pass the wire.
print(f"{sys.argv[1]:>12} {w:10.3f} {k:10.3f} {k / w:9.0%} {b:10.3f} {b / w:9.0%} {mpi}")
PY
    esac
  done
  unset samples
done
