#!/usr/bin/env bash
# A fuzzing campaign: every fuzz target (or those named) for SECONDS each, JOBS at a time,
# niced, from the repository's seed corpus. New inputs and crash artifacts go under OUT, never
# into the repository; a crash found becomes a regression input by copying it to
# fuzz/corpus/TARGET/ (then it replays in every build's test suite). Prints, per target, the
# executions, the coverage (libFuzzer's cov and ft), the corpus size and the crashes.
#
#   cmake --workflow --preset fuzz            # or: cmake --preset fuzz && cmake --build --preset fuzz
#   fuzz/run_campaign.sh build/fuzz 600 2 /tmp/kc-fuzz-campaign
set -euo pipefail

build=${1:?usage: run_campaign.sh BUILD_DIR SECONDS [JOBS] [OUT] [TARGET...]}
seconds=${2:?seconds per target}
jobs=${3:-2}
out=${4:-$(mktemp -d -t kc-fuzz-XXXXXX)}
shift $(( $# < 4 ? $# : 4 ))
repo=$(cd "$(dirname "$0")/.." && pwd)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for t in "$build"/fuzz/kc_fuzz_*; do targets+=("$(basename "$t" | sed 's/^kc_fuzz_//')"); done
fi
mkdir -p "$out"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$repo/tools/lsan.supp}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

run() {
  local t=$1
  mkdir -p "$out/$t/corpus" "$out/$t/artifacts"
  # In process (fast); a crash ends the target's run, its input written to artifacts/.
  # FORK=1 keeps going after crashes instead (-fork, far fewer executions a second).
  local keep_going=()
  if [ "${FORK:-0}" = 1 ]; then
    keep_going=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  fi
  nice -n 10 "$build/fuzz/kc_fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "${keep_going[@]}" -artifact_prefix="$out/$t/artifacts/" \
    "$out/$t/corpus" "$repo/fuzz/corpus/$t" >"$out/$t.log" 2>&1 || true
}

running=0
for t in "${targets[@]}"; do
  run "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait

printf '%-18s %12s %8s %8s %8s %8s\n' target executions cov ft corpus crashes
for t in "${targets[@]}"; do
  log="$out/$t.log"
  # The last status line: "#N ... cov: C ft: F corp: U/SIZE" (in process) or
  # "#N: cov: C ft: F corp: U ..." (-fork).
  last=$(grep -E '^#[0-9]+:?[[:space:]]*[A-Z]*[[:space:]]*cov: ' "$log" | tail -1 || true)
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log" | tail -1)
  [ -n "$execs" ] || execs=$(sed -E 's/^#([0-9]+).*/\1/' <<<"$last")
  cov=$(sed -E 's/.* cov: ([0-9]+).*/\1/' <<<"$last")
  ft=$(sed -E 's/.* ft: ([0-9]+).*/\1/' <<<"$last")
  corp=$(sed -E 's/.* corp: ([0-9]+).*/\1/' <<<"$last")
  crashes=$(find "$out/$t/artifacts" -type f | wc -l)
  printf '%-18s %12s %8s %8s %8s %8s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes"
done
echo "logs and artifacts: $out"
