#!/usr/bin/python3
"""The scheduler's grow and shrink as a running job sees them: from the ask to training again.

Runs `kc train examples/models/gpt-tiny.yaml --ranks 1 --min-ranks 1 --max-ranks 2
--resize-file FILE` (the flags kc agent gives an elastic job started on one device) and, --rounds
times, once the run has trained --every steps at its size, rewrites FILE as kc agent does (a
rename) to grow it to 2 ranks, then to shrink it back to 1. From the run's fault log
(faults.jsonl, whose records carry time_unix, the same wall clock as the rewrite):
  - ask to new generation: the `recovered` record of the generation at the new size minus the
    rewrite (it includes the at most 0.25 s kc train takes to notice the file, and for a grow
    the new worker's start: a process, its model, its rendezvous);
  - steps lost: the `recovered` record's steps_lost (the last step reported before the change
    minus the step the new generation's state is from).
Goal (issue 21, item 4, by analogy with the kill -9 recovery goal): < 3 s from the ask to
training at the new size, 0 steps lost.

A benchmark, not a test: nothing is asserted; the goals are reported met or not.

    bench/fault/resize.py                 # 3 rounds: about a minute on 2 cores
    bench/fault/resize.py --rounds 6 --json out.json

Needs kc built (cmake --build build/release --target kc) and data/fortunes (the README's first
command). The run it starts is stopped when it ends, on failure and Ctrl-C too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = REPO_ROOT / "examples" / "models" / "gpt-tiny.yaml"
GOAL_S = 3.0


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line being written
    return out


def last_step(metrics: Path) -> int:
    steps = [r.get("step", 0) for r in read_jsonl(metrics) if r.get("type") == "step"]
    return steps[-1] if steps else 0


def wait_for(what: str, pred, proc: subprocess.Popen, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            sys.exit(f"resize.py: kc train ended (exit {proc.returncode}) while waiting for "
                     f"{what}:\n{err}")
        time.sleep(0.005)
    sys.exit(f"resize.py: timed out waiting for {what}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kc", default=str(REPO_ROOT / "build" / "release" / "apps" / "kc" / "kc"))
    ap.add_argument("--data", default=str(REPO_ROOT / "data" / "fortunes" / "manifest.json"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--every", type=int, default=40, help="steps at each size before a change")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="kc_resize_bench") as tmp:
        out = Path(tmp) / "out"
        size = Path(tmp) / "resize.json"
        size.write_text('{"ranks": 1}\n')
        cmd = [args.kc, "train", str(MODEL), "--ranks", "1", "--min-ranks", "1", "--max-ranks",
               "2", "--resize-file", str(size), "--steps", "1000000", "--out", str(out),
               "--data", args.data, "--progress", "none", "--eval-every", "0"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
        changes = []
        try:
            faults, metrics = out / "faults.jsonl", out / "metrics.jsonl"
            for _ in range(args.rounds):
                for ranks in (2, 1):
                    at = last_step(metrics)
                    wait_for(f"step {at + args.every}",
                             lambda: last_step(metrics) >= at + args.every, proc)
                    seen = len([r for r in read_jsonl(faults) if r.get("event") == "recovered"])
                    tmp_size = size.with_suffix(".tmp")
                    tmp_size.write_text(json.dumps({"ranks": ranks}) + "\n")
                    asked = time.time()
                    os.replace(tmp_size, size)
                    rec = wait_for(
                        f"a generation of {ranks}",
                        lambda: ([r for r in read_jsonl(faults) if r.get("event") == "recovered"]
                                 [seen:] or [None])[0], proc)
                    changes.append({"to": ranks, "ranks": rec.get("ranks"),
                                    "ask_to_generation_s": rec["time_unix"] - asked,
                                    "steps_lost": rec.get("steps_lost", 0)})
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    report = {}
    for kind, to in (("grow", 2), ("shrink", 1)):
        xs = [c for c in changes if c["to"] == to]
        times = [c["ask_to_generation_s"] for c in xs]
        report[kind] = {
            "rounds": len(xs),
            "ask_to_generation_s_median": statistics.median(times),
            "ask_to_generation_s_max": max(times),
            "steps_lost_max": max(c["steps_lost"] for c in xs),
            "sizes_reached": sorted({c["ranks"] for c in xs}),
        }
        r = report[kind]
        met = r["ask_to_generation_s_max"] < GOAL_S and r["steps_lost_max"] == 0
        print(f"{kind:6s} 1<->2 ranks, {r['rounds']} times: ask to training at the new size "
              f"{r['ask_to_generation_s_median']:.2f} s median, {r['ask_to_generation_s_max']:.2f} s "
              f"max; steps lost {r['steps_lost_max']} at most; goal < {GOAL_S:.0f} s, 0 lost: "
              f"{'met' if met else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"changes": changes, "summary": report}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
