#!/usr/bin/python3
"""The scheduler issue's figures, from `kc sim` runs on virtual time.

1. The synthetic trace: `kc sim generate` (shaped after Microsoft Philly) for --seeds seeds,
   replayed on examples/clusters/dgx-a100x16.yaml (128 GPUs) with examples/admin/pools.yaml,
   under the scheduler with advised checkpoint intervals, with the seed rule's intervals,
   and under FIFO. Reports utilisation (devices held, while jobs arrive and to the last end;
   useful work over device time), high-priority queueing delay p95, and the cost of
   preemption (work redone and grace time, plus the checkpoints taken while running
   preemptibly), per seed and on average.
2. Decision latency: bench/sched/burst_trace.py on examples/clusters/synthetic-10k.yaml
   (10,000 devices): the cluster full, then a burst of arrivals that queues thousands of jobs;
   the wall time of the scheduling passes made with 5,000 or more jobs pending.

    bench/sched/figures.py                 # 5 seeds, 8000 jobs each, load 1.5
    bench/sched/figures.py --seeds 2 --jobs 2000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def kc_binary() -> str:
    for preset in ("release", "debug"):
        p = REPO_ROOT / "build" / preset / "apps" / "kc" / "kc"
        if p.exists():
            return str(p)
    sys.exit("figures.py: build kc first (cmake --preset release && cmake --build build/release)")


def run(cmd: list[str]) -> str:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=8000)
    ap.add_argument("--load", type=float, default=1.5)
    ap.add_argument("--queued", type=int, default=6000, help="burst size of the latency trace")
    ap.add_argument("--json", help="write the numbers here")
    a = ap.parse_args()
    kc = kc_binary()
    cluster = str(REPO_ROOT / "examples/clusters/dgx-a100x16.yaml")
    pools = str(REPO_ROOT / "examples/admin/pools.yaml")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, a.seeds + 1):
            trace = f"{tmp}/trace{seed}.csv"
            run([kc, "sim", "generate", "--jobs", str(a.jobs), "--devices", "128", "--load",
                 str(a.load), "--seed", str(seed), "-o", trace])
            report = json.loads(run([kc, "sim", "--inventory", cluster, "--trace", trace,
                                     "--pools", pools, "--json"]))
            runs = {r["policy"]: r for r in report["runs"]}
            row = {"seed": seed}
            for name, r in runs.items():
                row[name] = {
                    "util_arrivals": r["utilisation_arrivals"],
                    "util_end": r["utilisation"],
                    "useful": r["useful_utilisation"],
                    "high_p95_s": r["queue_delay"].get("high", {}).get("p95_s", 0),
                    "lost_preemption_h": r["lost_preemption_device_h"],
                    "preemption_cost_h": r["lost_preemption_device_h"]
                    + r["checkpoint_preemptible_device_h"],
                    "preemptions": r["preemptions"],
                }
            rows.append(row)
        burst = f"{tmp}/burst.csv"
        with open(burst, "w") as f:
            subprocess.run([sys.executable, str(REPO_ROOT / "bench/sched/burst_trace.py"),
                            "--queued", str(a.queued)], check=True, stdout=f)
        latency = json.loads(run([kc, "sim", "--inventory",
                                  str(REPO_ROOT / "examples/clusters/synthetic-10k.yaml"),
                                  "--trace", burst, "--no-compare", "--json"]))["runs"][0]

    kc_, seed_, fifo = "kuangchao", "kuangchao/seed-rule", "fifo"
    print(f"synthetic trace: {a.jobs} jobs, load {a.load}, 128 GPUs (dgx-a100x16), "
          "examples/admin/pools.yaml")
    print(f"{'seed':>4} {'util arriving kc/fifo':>24} {'util to end kc/fifo':>22} "
          f"{'useful kc/fifo':>18} {'high p95':>9} {'preempt cost advised/seed':>27} "
          f"{'redone+grace advised/seed':>27}")
    for r in rows:
        print(f"{r['seed']:>4} {100*r[kc_]['util_arrivals']:>10.1f} / {100*r[fifo]['util_arrivals']:>5.1f}"
              f" ({100*(r[kc_]['util_arrivals']-r[fifo]['util_arrivals']):+5.1f})"
              f" {100*r[kc_]['util_end']:>7.1f} / {100*r[fifo]['util_end']:>5.1f}"
              f" ({100*(r[kc_]['util_end']-r[fifo]['util_end']):+5.1f})"
              f" {100*r[kc_]['useful']:>5.1f} / {100*r[fifo]['useful']:>4.1f}"
              f" ({100*(r[kc_]['useful']-r[fifo]['useful']):+5.1f})"
              f" {r[kc_]['high_p95_s']:>7.0f} s"
              f" {r[kc_]['preemption_cost_h']:>12.0f} / {r[seed_]['preemption_cost_h']:<12.0f}"
              f" {r[kc_]['lost_preemption_h']:>12.0f} / {r[seed_]['lost_preemption_h']:<12.0f}")
    mean = lambda key, pol: statistics.mean(r[pol][key] for r in rows)
    print(f"mean gain over FIFO: utilisation while jobs arrive "
          f"{100*(mean('util_arrivals', kc_) - mean('util_arrivals', fifo)):+.1f} points, "
          f"to the last end {100*(mean('util_end', kc_) - mean('util_end', fifo)):+.1f}, "
          f"useful {100*(mean('useful', kc_) - mean('useful', fifo)):+.1f}")
    print(f"high-priority p95 (worst seed): {max(r[kc_]['high_p95_s'] for r in rows):.0f} s")
    print(f"preemption cost, advised / seed rule: "
          f"{mean('preemption_cost_h', kc_) / mean('preemption_cost_h', seed_):.2f}; "
          f"work redone and grace only: "
          f"{mean('lost_preemption_h', kc_) / mean('lost_preemption_h', seed_):.2f}")
    peak = [b for b in latency["decision_ms_by_pending"] if b["min_pending"] >= 5000]
    print(f"\ndecision latency, 10,000 devices, burst of {a.queued} jobs "
          f"(at most {latency['max_pending']} pending):")
    for b in latency["decision_ms_by_pending"]:
        print(f"  pending >= {b['min_pending']:>5}: {b['passes']:>6} passes, p50 {b['p50']:.2f} ms, "
              f"p99 {b['p99']:.2f} ms, max {b['max']:.2f} ms")
    if a.json:
        Path(a.json).write_text(json.dumps({"trace": rows, "latency": latency["decision_ms_by_pending"],
                                            "max_pending": latency["max_pending"]}, indent=2))
    if not peak:
        print("note: no pass had 5,000 jobs pending; raise --queued")


if __name__ == "__main__":
    main()
