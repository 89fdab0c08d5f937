#!/usr/bin/python3
"""Tensor parallelism in `kc train`: the same losses as one rank, and what it costs here.

Trains MODEL with the plans t=1 and t=2 (and t=2 x p=2, t=2 x d=2 where the ranks fit) on the
same global batch, alternating them for --rounds rounds so that drift of this noisy machine
hits every plan alike, and reports per plan: the largest relative difference of its loss
trajectory from t=1's (the issue's equivalence bound: 1e-5), the median tokens/s and step
time, and the median time per step in the tensor-parallel all-reduces (the summary's
tp_comm_ms_median), with the throughput as a ratio to t=1 measured in the same round.

    bench/train/tensor_parallel.py                  # gpt-tiny, about 2 minutes
    bench/train/tensor_parallel.py --rounds 5 --json out.json

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
GOAL_REL = 1e-5


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO_ROOT / "examples/models/gpt-tiny.yaml"))
    ap.add_argument("--kc", default=str(REPO_ROOT / "build/release/apps/kc/kc"))
    ap.add_argument("--batch", type=int, default=8, help="global batch, sequences")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if not os.access(args.kc, os.X_OK):
        sys.exit(f"tensor_parallel: no kc at {args.kc}; build it first")
    data = REPO_ROOT / "data" / "fortunes"
    if not (data / "manifest.json").exists():
        subprocess.run([args.kc, "data", "prepare", "--out", str(data), "--doc-separator", "%",
                        "/usr/share/games/fortunes"], check=True, capture_output=True)
    b = args.batch
    plans = {
        "t=1": f"micro_batch_size={b}",
        "t=2": f"t=2,micro_batch_size={b}",
        "t=2 p=2 (1f1b, m=4)": f"t=2,p=2,micro_batch_size={b // 4},micro_batches=4",
        "t=2 d=2": f"t=2,d=2,micro_batch_size={b // 2}",
    }
    runs: dict[str, list[dict]] = {name: [] for name in plans}
    with tempfile.TemporaryDirectory(prefix="kc_tp_") as tmp:
        for r in range(args.rounds):
            for name, plan in plans.items():
                metrics = Path(tmp) / "metrics.jsonl"
                p = subprocess.run([args.kc, "train", args.model, "--plan", plan, "--steps",
                                    str(args.steps), "--eval-every", "0", "--progress", "none",
                                    "--data", str(data / "manifest.json"), "--metrics",
                                    str(metrics), "--out", str(Path(tmp) / "run")],
                                   capture_output=True, text=True)
                if p.returncode != 0:
                    sys.exit(f"tensor_parallel: {plan} failed:\n{p.stderr}")
                records = [json.loads(l) for l in metrics.read_text().splitlines()]
                summary = [x for x in records if x["type"] == "summary"][0]
                runs[name].append({
                    "losses": [x["loss"] for x in records if x["type"] == "step"],
                    "tokens_per_s": summary["tokens_per_s"],
                    "step_ms": summary["step_ms"],
                    "tp_comm_ms": summary.get("tp_comm_ms_median") or 0.0,
                })
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    base = runs["t=1"]
    reference = base[0]["losses"]
    rows = []
    print(f"{'plan':<22} {'max rel. loss diff':>18} {'tokens/s':>9} {'vs t=1':>7} "
          f"{'step ms':>8} {'TP all-reduce ms':>17}")
    for name, rs in runs.items():
        diff = max(abs(a - b) / abs(b) for r in rs for a, b in zip(r["losses"], reference))
        ratio = statistics.median(r["tokens_per_s"] / b0["tokens_per_s"] for r, b0 in zip(rs, base))
        row = {"plan": name, "kc_plan": plans[name], "max_rel_loss_diff": diff,
               "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
               "ratio_to_t1": ratio, "step_ms": statistics.median(r["step_ms"] for r in rs),
               "tp_comm_ms": statistics.median(r["tp_comm_ms"] for r in rs)}
        rows.append(row)
        print(f"{name:<22} {diff:18.2e} {row['tokens_per_s']:9.0f} {ratio:6.2f}x "
              f"{row['step_ms']:8.1f} {row['tp_comm_ms']:17.2f}")
    ok = all(r["max_rel_loss_diff"] < GOAL_REL for r in rows)
    print(f"\nevery plan's losses within {GOAL_REL:g} relative of t=1's over {args.steps} steps: "
          f"{'PASS' if ok else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "pass": ok}, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
