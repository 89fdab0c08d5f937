#!/usr/bin/env python3
"""Communication batching: exposed communication per step, fused and overlapped vs not.

Runs `kc train` with 2 data-parallel ranks in two modes per transport, interleaved,
`--reps` times:

  per-tensor       one all-reduce per parameter tensor after the backward, each waited for
                   in turn (no fusion, no overlap: the baseline)
  bucketed         gradients fused into buckets (--bucket-mb), each all-reduced as soon as its
                   last gradient is final, in the background while the backward goes on

and prints, from each run's metrics summary, the exposed communication per step (time the
step spent on communication that overlap did not hide, waiting for the slower rank included),
the step time and the reduction each bucketed mode achieves over per-tensor (the goal: at
least 60% less).

    bench/train/comm_batching.py [--model examples/models/gpt-small.yaml] [--steps 20]
                                 [--reps 2] [--transports shm,tcp] [--kc PATH]

`shm` is the shared-memory path two ranks on one machine use; `tcp` makes them talk TCP over
loopback, as ranks on two machines would. Run from anywhere; paths are relative to the
repository root. Needs data/fortunes (see docs/user-guide/data.md).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODES = ("per-tensor", "bucketed")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(kc, model, steps, mode, transport, bucket_mb, tmp):
    """One kc train run: its summary, with "step_comm_ms" added: the exposed communication
    of each steady-state step (the steps the summary averages over)."""
    metrics = os.path.join(tmp, f"{mode}-{transport}.jsonl")
    cmd = [kc, "train", model, "--ranks", "2", "--threads-per-rank", "1", "--steps", str(steps),
           "--eval-every", "0", "--progress", "none", "--grad-sync", mode, "--transport",
           transport, "--bucket-mb", str(bucket_mb), "--metrics", metrics,
           "--plot", os.path.join(tmp, "loss.svg")]
    done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"comm_batching: {' '.join(cmd)} failed:\n{done.stderr}")
    steps_ms, summary = [], None
    with open(metrics) as f:
        for line in f:
            record = json.loads(line)
            if record.get("type") == "step":
                steps_ms.append(record["comm_exposed_ms"])
            elif record.get("type") == "summary":
                summary = record
    if summary is None:
        sys.exit(f"comm_batching: no summary in {metrics}")
    summary["step_comm_ms"] = steps_ms[len(steps_ms) - summary["measured_steps"]:]
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="examples/models/gpt-small.yaml")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--bucket-mb", type=float, default=2)
    ap.add_argument("--kc", default=os.path.join(ROOT, "build/release/apps/kc/kc"))
    ap.add_argument("--json", metavar="FILE", help="also write every run's summary here")
    args = ap.parse_args()
    if not os.access(args.kc, os.X_OK):
        sys.exit(f"comm_batching: no kc at {args.kc} (cmake --workflow --preset release)")
    transports = args.transports.split(",")
    results = {}
    with tempfile.TemporaryDirectory(prefix="kc-comm-batching-") as tmp:
        for rep in range(args.reps):
            for transport in transports:
                for mode in MODES:
                    s = run(args.kc, args.model, args.steps, mode, transport, args.bucket_mb, tmp)
                    results.setdefault((transport, mode), []).append(s)
                    print(f"rep {rep + 1}/{args.reps} {transport:3} {mode:10}: exposed comm "
                          f"{s['comm_exposed_ms']:7.2f} ms/step, step {s['step_ms']:7.1f} ms, "
                          f"{s['tokens_per_s']:6.0f} tokens/s", file=sys.stderr)
    model = os.path.splitext(os.path.basename(args.model))[0]
    print(f"\n{model}, 2 ranks x 1 core, {args.steps} steps x {args.reps} runs; exposed "
          f"communication per step: median and mean over all steady-state steps of all runs")
    print(f"{'transport':9}  {'mode':10}  {'median ms':>9}  {'mean ms':>8}  {'share':>6}  "
          f"{'step ms':>8}  {'tokens/s':>8}")
    for transport in transports:
        med = {}
        for mode in MODES:
            runs = results[(transport, mode)]
            med[mode] = {k: statistics.median(r[k] for r in runs)
                         for k in ("exposed_comm_share", "step_ms", "tokens_per_s")}
            pooled = [ms for r in runs for ms in r["step_comm_ms"]]
            med[mode]["median"] = statistics.median(pooled)
            med[mode]["mean"] = statistics.mean(pooled)
            m = med[mode]
            print(f"{transport:9}  {mode:10}  {m['median']:9.2f}  {m['mean']:8.2f}  "
                  f"{100 * m['exposed_comm_share']:5.1f}%  {m['step_ms']:8.1f}  "
                  f"{m['tokens_per_s']:8.0f}")
        for stat in ("median", "mean"):
            base, fused = med["per-tensor"][stat], med["bucketed"][stat]
            cut = 1 - fused / base if base > 0 else 0.0
            print(f"{transport:9}  bucketed exposes {100 * cut:.0f}% less communication per "
                  f"step than per-tensor ({stat}; goal: >= 60%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{t}/{m}": r for (t, m), r in results.items()}, f, indent=2)


if __name__ == "__main__":
    main()
