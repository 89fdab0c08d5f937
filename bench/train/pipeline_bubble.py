#!/usr/bin/python3
"""Pipeline bubble of `kc train` against (p - 1) / (m + p - 1), p = 2, m in {2, 4, 8}.

For each m and each schedule (GPipe, 1F1B, interleaved with v = 2, ZB-H1), `kc
train MODEL --plan p=2,micro_batch_size=B,micro_batches=m,schedule=S[,v=2]` trains --steps
steps; the summary's bubble is each stage's median share of the pipeline's time spent outside
its forward and backward passes (waiting for inputs, the flush, the sends), and the
pipeline's bubble their mean. The goals (the TP/PP issue): 1F1B's within 3 percentage points
of the ideal for every m, and interleaving and ZB-H1 measurably below 1F1B.

    bench/train/pipeline_bubble.py                   # gpt-tiny, about 2 minutes
    bench/train/pipeline_bubble.py --steps 20 --json out.json

Needs a built kc (cmake --workflow --preset release) and data/fortunes (made with
`kc data prepare` if missing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
GOAL_PP = 3.0
P = 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO_ROOT / "examples/models/gpt-tiny.yaml"))
    ap.add_argument("--kc", default=str(REPO_ROOT / "build/release/apps/kc/kc"))
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if not os.access(args.kc, os.X_OK):
        sys.exit(f"pipeline_bubble: no kc at {args.kc}; build it first")
    data = REPO_ROOT / "data" / "fortunes"
    if not (data / "manifest.json").exists():
        subprocess.run([args.kc, "data", "prepare", "--out", str(data), "--doc-separator", "%",
                        "/usr/share/games/fortunes"], check=True, capture_output=True)

    rows = []
    print(f"{'m':>2} {'ideal':>6} {'schedule':<16} {'pipeline':>8} {'stage 0':>8} {'stage 1':>8} "
          f"{'off by':>7}")
    with tempfile.TemporaryDirectory(prefix="kc_bubble_") as tmp:
        for m in (2, 4, 8):
            for schedule in ("gpipe", "1f1b", "interleaved", "zb-h1"):
                # Interleaving divides the idle time by v: (p - 1) / (v m + p - 1); ZB-H1 by 3
                # when the forward and the two backward halves cost the same.
                v = {"interleaved": 2, "zb-h1": 3}.get(schedule, 1)
                ideal = (P - 1) / (v * m + P - 1)
                metrics = Path(tmp) / "metrics.jsonl"
                plan = (f"p={P},micro_batch_size={args.micro_batch_size},micro_batches={m},"
                        f"schedule={schedule}" + (",v=2" if schedule == "interleaved" else ""))
                p = subprocess.run([args.kc, "train", args.model, "--plan", plan, "--steps",
                                    str(args.steps), "--eval-every", "0", "--progress", "none",
                                    "--data", str(data / "manifest.json"), "--metrics",
                                    str(metrics), "--out", str(Path(tmp) / "run")],
                                   capture_output=True, text=True)
                if p.returncode != 0:
                    sys.exit(f"pipeline_bubble: {plan} failed:\n{p.stderr}")
                summary = [json.loads(l) for l in metrics.read_text().splitlines()
                           if json.loads(l)["type"] == "summary"][0]
                row = {"m": m, "schedule": schedule, "ideal": ideal,
                       "bubble": summary["bubble"], "stage_bubble": summary["stage_bubble"],
                       "step_ms": summary["step_ms"]}
                rows.append(row)
                name = schedule + (" v=2" if schedule == "interleaved" else "")
                print(f"{m:>2} {ideal * 100:5.1f}% {name:<16} {row['bubble'] * 100:7.1f}% "
                      f"{row['stage_bubble'][0] * 100:7.1f}% {row['stage_bubble'][1] * 100:7.1f}% "
                      f"{(row['bubble'] - ideal) * 100:+6.1f}pp", flush=True)
    f1b = [r for r in rows if r["schedule"] == "1f1b"]
    worst = max(abs(r["bubble"] - r["ideal"]) * 100 for r in f1b)
    below = {s: all(r["bubble"] < f["bubble"] for r, f in
                    zip([r for r in rows if r["schedule"] == s], f1b))
             for s in ("interleaved", "zb-h1")}
    ok = worst <= GOAL_PP and all(below.values())
    print(f"\n1F1B pipeline bubble within {worst:.1f} pp of (p-1)/(m+p-1) (goal: within "
          f"{GOAL_PP:.0f} pp for m = 2, 4, 8); below 1F1B at every m: interleaved "
          f"{'yes' if below['interleaved'] else 'no'}, zb-h1 {'yes' if below['zb-h1'] else 'no'}: "
          f"{'PASS' if ok else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "pass": ok}, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
