#!/usr/bin/python3
"""Planner calibration: predicted against measured `kc train` step time on this machine.

For each device layout (--devices, default 1 and 2: one device of every core, then one
device per core):

1. `kc plan MODEL --calibrate --devices N --batch B --json --save TMP` measures this machine
   through L1 (memory, sgemm, shared memory), times the model's forward + backward on every
   device at once, fits the cost model's efficiency curve and prints the predicted step time
   of every plan kc train runs for the batch (t=1, p=1; micro-batch size and count, ZeRO-1).
2. `kc train MODEL --plan PLAN --ranks N --steps S` runs each of those plans (all of them, or
   --max-plans per layout, spread over the ranking); the measured step time is the median of
   the metrics' step records after --warmup steps.

The table gives predicted, measured and the error for every plan; the goal (the planner
issue): within 20% for at least 4 different plans. Both run on the same machine in the same
session, the calibration first.

    bench/plan/calibration.py                          # gpt-tiny, batch 16: ~3 minutes
    bench/plan/calibration.py --steps 20 --max-plans 3 --json out.json

Needs a built kc (cmake --workflow --preset release) and data/fortunes (made with
`kc data prepare` if missing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
GOAL = 0.20


def run(cmd: list[str], env: dict | None = None) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"calibration: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    return p.stdout


def ensure_data(kc: str) -> str:
    data = REPO_ROOT / "data" / "fortunes"
    if not (data / "manifest.json").exists():
        run([kc, "data", "prepare", "--out", str(data), "--doc-separator", "%",
             "/usr/share/games/fortunes"])
    return str(data / "manifest.json")


def measured_step_s(metrics: Path, warmup: int) -> float:
    steps = []
    for line in metrics.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("type") == "step" and rec["step"] > warmup:
            steps.append(rec["step_ms"] / 1e3)
    return statistics.median(steps)


def spread(items: list, k: int) -> list:
    """k items spread evenly over the list (its first and last among them)."""
    if k <= 0 or k >= len(items):
        return items
    if k == 1:
        return items[:1]
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO_ROOT / "examples/models/gpt-tiny.yaml"))
    ap.add_argument("--kc", default=str(REPO_ROOT / "build/release/apps/kc/kc"))
    ap.add_argument("--devices", default="1,2", help="device layouts to calibrate and run")
    ap.add_argument("--batch", type=int, default=16, help="global batch, sequences")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--max-plans", type=int, default=0, help="per layout; 0: every plan")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if not os.access(args.kc, os.X_OK):
        sys.exit(f"calibration: no kc at {args.kc}; build it with cmake --workflow --preset release")
    data = ensure_data(args.kc)

    rows = []
    with tempfile.TemporaryDirectory(prefix="kc_calibration_") as tmp:
        for n in [int(x) for x in args.devices.split(",")]:
            save = Path(tmp) / f"calibration-{n}.json"
            cal = json.loads(run([args.kc, "plan", args.model, "--calibrate", "--devices", str(n),
                                  "--batch", str(args.batch), "--json", "--save", str(save)]))
            print(f"devices {n} x {cal['cpus_per_device']} core(s): peak "
                  f"{cal['peak_flops_per_device'] / 1e9:.1f} GFLOP/s, efficiency "
                  f"{cal['matmul_efficiency']:.3f} * s / (s + {cal['efficiency_half_size']:.0f}), "
                  f"optimizer {cal['optimizer_seconds'] * 1e3:.1f} ms", flush=True)
            for pred in spread(cal["predictions"], args.max_plans):
                flag = pred["plan_flag"].replace(" ", ",")
                metrics = Path(tmp) / "metrics.jsonl"
                run([args.kc, "train", args.model, "--plan", flag, "--ranks", str(n),
                     "--steps", str(args.steps), "--eval-every", str(args.steps),
                     "--progress", "none", "--data", data, "--metrics", str(metrics),
                     "--out", str(Path(tmp) / "run")])
                measured = measured_step_s(metrics, args.warmup)
                predicted = pred["estimate"]["step_time_s"]
                row = {"devices": n, "plan": flag, "predicted_s": predicted,
                       "measured_s": measured, "error": predicted / measured - 1}
                rows.append(row)
                print(f"  {flag:<92} predicted {predicted * 1e3:7.1f} ms  measured "
                      f"{measured * 1e3:7.1f} ms  error {row['error'] * 100:+6.1f}%", flush=True)

    within = [r for r in rows if abs(r["error"]) <= GOAL]
    plans = len({r["plan"] for r in within})
    worst = max(abs(r["error"]) for r in rows)
    ok = plans >= 4
    print(f"\n{len(within)} of {len(rows)} plans within {GOAL * 100:.0f}% (worst "
          f"{worst * 100:.1f}%, mean |error| "
          f"{statistics.mean(abs(r['error']) for r in rows) * 100:.1f}%): "
          f"{'PASS' if ok else 'FAIL'} (goal: at least 4 plans within {GOAL * 100:.0f}%)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "pass": ok}, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
