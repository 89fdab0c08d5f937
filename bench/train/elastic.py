#!/usr/bin/python3
"""Elastic recovery: how long a 4-rank job takes to go on after kill -9 of one worker.

For each model and each drill, `kc train MODEL --ranks 4 --min-ranks 2` runs with
`--inject-fault 2:S:HOW` (worker 2 killed with SIGKILL as step S's forward starts, inside its
gradient all-reduce, or before the step) and, for the grow-back drill, `--max-restarts 1` (a
replacement starts and joins). From the job's fault log (faults.jsonl) and metrics:

- recovery: from the launcher seeing the death (its pidfd: at once) to the new generation's
  leader having restored its state (detection + rebuild + state restore), and the part of it
  the workers spent rebuilding (rendezvous, communicator, engine, state broadcast);
- resume: from the death to the first step completed after it (recovery plus one step);
- steps lost: steps reported before the death minus the step the state was restored to;
- the step time before the fault, for scale.

The goal (the fault-tolerance issue): detection + rebuild + resume < 5 s, steps lost <= those
since the last in-memory state (0: every completed step survives in the replicas).

    bench/train/elastic.py                    # about 2 minutes
    bench/train/elastic.py --models gpt-tiny --json out.json

Needs a built kc (cmake --workflow --preset release) and data/fortunes.
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
GOAL_S = 5.0


def drill(kc: str, model: str, data: Path, tmp: Path, steps: int, fault: str,
          grow: bool) -> dict:
    metrics = tmp / "metrics.jsonl"
    faults = tmp / "faults.jsonl"
    faults.unlink(missing_ok=True)
    cmd = [kc, "train", model, "--ranks", "4", "--threads-per-rank", "1", "--steps", str(steps),
           "--eval-every", "0", "--progress", "none", "--data", str(data / "manifest.json"),
           "--metrics", str(metrics), "--out", str(tmp / "run"), "--fault-log", str(faults),
           "--min-ranks", "2", "--inject-fault", fault]
    if grow:
        cmd += ["--max-restarts", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"elastic: kc train failed:\n{p.stderr}")
    events = [json.loads(l) for l in faults.read_text().splitlines()]
    records = [json.loads(l) for l in metrics.read_text().splitlines()]
    detected = next(e for e in events if e["event"] == "detected")
    recovered = [e for e in events if e["event"] == "recovered"]
    # Step records arrive in order; the first one written after the recovery record ends the
    # resume (metrics lines carry no clock, so the recovery's duration plus that step's time).
    steps_before = [r for r in records if r["type"] == "step"]
    fault_step = int(fault.split(":")[1])
    before = [r["step_ms"] for r in steps_before if r["step"] < fault_step]
    index = next(i for i, r in enumerate(records) if r["type"] == "recovery")
    after = next(r for r in records[index:] if r["type"] == "step")
    last = recovered[-1]
    return {
        "fault": fault,
        "grow": grow,
        "ranks_after": last["ranks"],
        "recovery_s": sum(e["duration_s"] for e in recovered),
        "rebuild_s": last["rebuild_s"],
        "resume_s": sum(e["duration_s"] for e in recovered) + after["step_ms"] / 1e3,
        "steps_lost": sum(e["steps_lost"] for e in recovered),
        "step_s": statistics.median(before) / 1e3 if before else 0.0,
        "detected_worker": detected["worker"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt-tiny,gpt-small")
    ap.add_argument("--kc", default=str(REPO_ROOT / "build/release/apps/kc/kc"))
    ap.add_argument("--data", default=str(REPO_ROOT / "data/fortunes"))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    drills = [("2:{s}:kill-in-forward", False), ("2:{s}:kill-in-allreduce", False),
              ("2:{s}:kill", True)]
    results = []
    with tempfile.TemporaryDirectory(prefix="kc_elastic_bench_") as t:
        tmp = Path(t)
        for name in args.models.split(","):
            model = str(REPO_ROOT / "examples/models" / f"{name}.yaml")
            steps = 8 if name == "gpt-tiny" else 5
            fault_step = 4 if name == "gpt-tiny" else 3
            for template, grow in drills:
                fault = template.format(s=fault_step)
                runs = [drill(args.kc, model, Path(args.data), tmp, steps, fault, grow)
                        for _ in range(args.reps)]
                r = dict(runs[-1])
                for key in ("recovery_s", "rebuild_s", "resume_s", "step_s"):
                    r[key] = statistics.median(x[key] for x in runs)
                r["worst_resume_s"] = max(x["resume_s"] for x in runs)
                r["model"] = name
                results.append(r)
                how = fault.split(":")[2] + (" + replacement joins" if grow else "")
                print(f"{name:10s} {how:32s} recovery {r['recovery_s']:6.2f} s "
                      f"(rebuild {r['rebuild_s']:5.2f} s)  resume {r['resume_s']:6.2f} s "
                      f"(worst {r['worst_resume_s']:.2f}; goal < {GOAL_S:.0f})  "
                      f"steps lost {r['steps_lost']}  ranks after {r['ranks_after']}  "
                      f"step {r['step_s']:.2f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
