#!/usr/bin/python3
"""The scheduler against FIFO over a family of synthetic traces, from `kc sim` runs.

Each cell of the grid (offered load x share of elastic jobs x size mix) is replayed for
--seeds seeds on examples/clusters/dgx-a100x16.yaml (128 GPUs) with examples/admin/pools.yaml,
the scheduler and FIFO in the same `kc sim` run. The family is the issue's heavy trace:
--jobs jobs, classes high : normal : preemptible = 1 : 5 : 3, elastic jobs with min = max/2,
log-normal run times with sigma 1.2. A second family (--gangs) is rigid and bursty, with
high-priority gangs of up to 64 devices, where a reservation bounds their wait.

Per cell it reports the worst seed of: makespan over FIFO's, useful utilisation minus FIFO's,
average job completion time below FIFO's (percent; in brackets the most any scheduler could
cut, were every job to start at once at its maximum and never checkpoint: its run time over
FIFO's completion time), high-priority p95 queueing delay; and per class the average and p95
completion time (mean over seeds). Cells that miss a goal are marked with '!'.

    bench/sched/sweep.py                         # 3 seeds x 6 loads x 3 elastic shares x 2 mixes
    bench/sched/sweep.py --seeds 5 --json out.json
    bench/sched/sweep.py --gangs
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import kc_binary, run  # noqa: E402  (the same kc, run the same way)

SIZE_MIXES = {"philly": "0.8,0.1,0.07,0.03", "multi": "0.3,0.3,0.2,0.2"}
CLASSES = ("high", "normal", "preemptible")


def generate_args(a: argparse.Namespace, load: float, elastic: float, mix: str,
                  seed: int) -> list[str]:
    common = ["--jobs", str(a.jobs), "--devices", "128", "--load", str(load), "--seed",
              str(seed), "--high-fraction", "0.111", "--preemptible-fraction", "0.333",
              "--duration-sigma", "1.2", "--size-mix", SIZE_MIXES[mix]]
    if a.gangs:
        return common + ["--elastic-fraction", "0", "--burstiness", "8", "--high-max-devices",
                         "64", "--high-max-hours", "4"]
    return common + ["--elastic-fraction", str(elastic), "--elastic-min-ratio", "0.5"]


def one(kc: str, a: argparse.Namespace, tmp: str, cell: tuple) -> dict:
    load, elastic, mix, seed = cell
    trace = f"{tmp}/t-{load}-{elastic}-{mix}-{seed}.csv"
    run([kc, "sim", "generate", *generate_args(a, load, elastic, mix, seed), "-o", trace])
    report = json.loads(run([kc, "sim", "--inventory",
                             str(REPO_ROOT / "examples/clusters/dgx-a100x16.yaml"), "--trace",
                             trace, "--pools", a.pools,
                             "--json"]))
    runs = {r["policy"]: r for r in report["runs"]}
    # No scheduler finishes a job before its run time at max_devices: the cut that bounds.
    with open(trace) as f:
        rows = [line.split(",") for line in f if not line.startswith("#")]
    col = rows[0].index("duration_s")
    floor_s = sum(float(r[col]) for r in rows[1:]) / (len(rows) - 1)
    kc_, fifo = runs["kuangchao"], runs["fifo"]
    out = {"load": load, "elastic": elastic, "mix": mix, "seed": seed,
           "makespan_ratio": kc_["makespan_s"] / fifo["makespan_s"],
           "useful_gain": kc_["useful_utilisation"] - fifo["useful_utilisation"],
           "jct_cut": 1 - kc_["completion"]["all"]["mean_s"] / fifo["completion"]["all"]["mean_s"],
           "jct_cut_bound": 1 - floor_s / fifo["completion"]["all"]["mean_s"],
           "high_p95_s": kc_["queue_delay"].get("high", {}).get("p95_s", 0),
           "decision_p99_ms": kc_["decision_ms"]["p99"],
           "completion": {}}
    for pol, r in (("kuangchao", kc_), ("fifo", fifo)):
        out["completion"][pol] = {c: [r["completion"][c]["mean_s"], r["completion"][c]["p95_s"]]
                                  for c in ("all",) + CLASSES if c in r["completion"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--loads", default="0.5,1,1.5,2,2.5,3")
    ap.add_argument("--elastic", default="0,0.3,0.6", help="shares of elastic multi-device jobs")
    ap.add_argument("--mixes", default="philly,multi", help=f"size mixes: {','.join(SIZE_MIXES)}")
    ap.add_argument("--gangs", action="store_true",
                    help="the rigid bursty family with high-priority gangs up to 64 devices")
    ap.add_argument("--pools", default=str(REPO_ROOT / "examples/admin/pools.yaml"),
                    help="pools and scheduler settings (default examples/admin/pools.yaml)")
    ap.add_argument("--workers", type=int, default=2, help="kc sim runs at once")
    ap.add_argument("--json", help="write every run's numbers here")
    a = ap.parse_args()
    kc = kc_binary()
    loads = [float(x) for x in a.loads.split(",")]
    elastic = [0.0] if a.gangs else [float(x) for x in a.elastic.split(",")]
    mixes = a.mixes.split(",")
    for m in mixes:
        if m not in SIZE_MIXES:
            sys.exit(f"sweep.py: --mixes: unknown mix {m!r} (known: {', '.join(SIZE_MIXES)})")
    cells = [(l, e, m, s) for m in mixes for l in loads for e in elastic
             for s in range(1, a.seeds + 1)]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(a.workers) as pool:
        rows = list(pool.map(lambda c: one(kc, a, tmp, c), cells))

    high_goal_s = 3600 if a.gangs else 600
    print(f"{'family: gangs (rigid, bursty, high gangs up to 64)' if a.gangs else 'family: heavy'}"
          f", {a.jobs} jobs, {a.seeds} seeds; worst seed per cell")
    print(f"{'mix':>6} {'load':>4} {'elastic':>7} {'makespan/FIFO':>13} {'useful-FIFO':>11} "
          f"{'avg JCT cut (bound)':>19} {'high p95':>9}   JCT mean/p95 h: high | normal | preemptible"
          " (FIFO's all)")
    misses = 0
    for m in mixes:
        for l in loads:
            for e in elastic:
                rs = [r for r in rows if (r["load"], r["elastic"], r["mix"]) == (l, e, m)]
                ms = max(r["makespan_ratio"] for r in rs)
                ug = min(r["useful_gain"] for r in rs)
                jc = min(r["jct_cut"] for r in rs)
                jb = min(r["jct_cut_bound"] for r in rs)
                hp = max(r["high_p95_s"] for r in rs)
                bad = [ms > 1.0 + 1e-9, ug < -1e-9, jc < 0.30, hp > high_goal_s]
                misses += any(bad)
                mark = lambda b: "!" if b else " "

                def cls(pol: str, c: str) -> str:
                    v = [r["completion"][pol][c] for r in rs if c in r["completion"][pol]]
                    if not v:
                        return "-"
                    return (f"{statistics.mean(x[0] for x in v) / 3600:.1f}/"
                            f"{statistics.mean(x[1] for x in v) / 3600:.1f}")

                print(f"{m:>6} {l:>4} {e:>7.0%} {ms:>12.3f}{mark(bad[0])} {100*ug:>+10.1f}{mark(bad[1])}"
                      f" {100*jc:>10.0f}% ({100*jb:>3.0f}%){mark(bad[2])} {hp/60:>7.1f}m{mark(bad[3])}   "
                      f"{cls('kuangchao', 'high')} | {cls('kuangchao', 'normal')} | "
                      f"{cls('kuangchao', 'preemptible')} ({cls('fifo', 'all')})")
    print(f"cells missing a goal: {misses} of {len(mixes) * len(loads) * len(elastic)}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
