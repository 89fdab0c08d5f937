#!/usr/bin/python3
"""How long `kc plan` takes to plan, end to end, on large simulated clusters.

Runs `kc plan MODEL --cluster CLUSTER --batch B --json` --reps times per case and reports the
median wall time of the whole command (reading the model and the inventory, building the
topology, the search, the baseline, the output) and the plans the search estimated. The
goal (the planner issue): the 1T-parameter GPT of Narayanan et al. 2021 on 3,072 devices in
under 1 s.

    bench/plan/search_speed.py
    bench/plan/search_speed.py --reps 10 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CASES = [  # model, cluster, global batch
    ("gpt2-124m", "dgx-a100x4", 256),
    ("gpt-small", "h100x128", 1024),
    ("gpt-1t", "synthetic-10k", 10000),
    ("gpt-1t", "a100x3072", 3072),
]
GOAL_S = 1.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kc", default=str(REPO_ROOT / "build/release/apps/kc/kc"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if not os.access(args.kc, os.X_OK):
        sys.exit(f"search_speed: no kc at {args.kc}; build it first")
    rows = []
    print(f"{'model':<10} {'cluster':<14} {'devices':>7} {'batch':>6} {'evaluated':>9} "
          f"{'fit':>6} {'median s':>9}  chosen plan")
    for model, cluster, batch in CASES:
        cmd = [args.kc, "plan", str(REPO_ROOT / f"examples/models/{model}.yaml"), "--cluster",
               str(REPO_ROOT / f"examples/clusters/{cluster}.yaml"), "--batch", str(batch),
               "--json"]
        times = []
        out = None
        for _ in range(args.reps):
            start = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True)
            times.append(time.perf_counter() - start)
            if p.returncode != 0:
                sys.exit(f"search_speed: {' '.join(cmd)} failed:\n{p.stderr}")
            out = json.loads(p.stdout)
        plan = out["chosen"]["plan"]
        row = {"model": model, "cluster": cluster, "devices": out["cluster"]["devices"],
               "batch": batch, "evaluated": out["evaluated"], "fitting": out["fitting"],
               "median_s": statistics.median(times),
               "chosen": f"t={plan['t']} p={plan['p']} d={plan['d']} b={plan['micro_batch_size']}"
                         f" m={plan['micro_batches']} {plan['schedule']} v={plan['v']}"}
        rows.append(row)
        print(f"{model:<10} {cluster:<14} {row['devices']:>7} {batch:>6} {row['evaluated']:>9} "
              f"{row['fitting']:>6} {row['median_s']:>9.3f}  {row['chosen']}")
    target = next(r for r in rows if r["cluster"] == "a100x3072")
    ok = target["median_s"] < GOAL_S
    print(f"\ngpt-1t on 3072 devices: {target['median_s']:.3f} s: {'PASS' if ok else 'FAIL'} "
          f"(goal < {GOAL_S:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "pass": ok}, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
