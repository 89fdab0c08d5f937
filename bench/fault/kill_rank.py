#!/usr/bin/python3
"""kill -9 of one rank of a running elastic `kc train`: from the kill to training again.

Starts `kc train MODEL --ranks 2 --min-ranks 1` (gpt-tiny by default), waits until the run has
reported --after steps, kills worker 1's process with SIGKILL from outside (as the OOM killer
or an operator would; not kc's --inject-fault drill), and follows the metrics file as the run
writes it (kc train writes each record through), stamping every record as it arrives. Reported
per repetition:

- to training again: from the kill to the arrival of the first step completed after it (the
  survivor's detection, its rebuild as a generation of one, the state restore, one step);
- recovery: the fault log's duration_s (from the supervisor seeing the death to the new
  generation's state restored) and rebuild_s (the workers' part);
- steps lost: steps reported before the kill that the restored state does not hold;
- the median step time before the kill, for scale;
- the load: this machine's cores and load average before and after (other work on the machine
  slows every figure here).

A benchmark, not a test: nothing is asserted.

    bench/fault/kill_rank.py                       # 3 repetitions, about a minute
    bench/fault/kill_rank.py --repeat 5 --json out.json

Needs a built kc (cmake --workflow --preset release) and data/fortunes (scripts/setup.sh).
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


def worker_pid(launcher: int, worker: int) -> int | None:
    """The pid of the launcher's child that runs --worker-rank `worker`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid != launcher:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"--worker-rank" in argv and argv[argv.index(b"--worker-rank") + 1] == str(worker).encode():
            return int(entry.name)
    return None


def one_run(kc: str, model: str, data: str, steps: int, after: int, tmp: Path) -> dict:
    metrics, faults = tmp / "metrics.jsonl", tmp / "faults.jsonl"
    for f in (metrics, faults):
        f.unlink(missing_ok=True)
    cmd = [kc, "train", model, "--ranks", "2", "--min-ranks", "1", "--steps", str(steps),
           "--eval-every", "0", "--progress", "none", "--data", data, "--metrics", str(metrics),
           "--out", str(tmp / "run"), "--fault-log", str(faults)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    records: list[tuple[float, dict]] = []  # (arrival, record)
    offset, partial = 0, ""
    killed_at = None
    try:
        while True:
            done = proc.poll() is not None
            if metrics.exists():
                with metrics.open() as f:
                    f.seek(offset)
                    chunk = f.read()
                    offset = f.tell()
                now = time.monotonic()
                partial += chunk
                *lines, partial = partial.split("\n")
                records += [(now, json.loads(l)) for l in lines if l]
            steps_seen = [r for _, r in records if r["type"] == "step"]
            if killed_at is None and len(steps_seen) >= after:
                pid = worker_pid(proc.pid, 1)
                if pid is None:
                    sys.exit("kill_rank: worker 1 not found")
                os.kill(pid, signal.SIGKILL)
                killed_at = time.monotonic()
                last_before = steps_seen[-1]["step"]
            if done:
                break
            time.sleep(0.002)  # polling the file: its records carry no clock of their own
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    if proc.returncode != 0:
        sys.exit(f"kill_rank: kc train failed ({proc.returncode}):\n{proc.stderr.read()}")
    if killed_at is None:
        sys.exit("kill_rank: the run ended before the kill; raise --steps")
    events = [json.loads(l) for l in faults.read_text().splitlines()]
    recovered = next(e for e in events if e["event"] == "recovered")
    recovery_at = next(t for t, r in records if r["type"] == "recovery")
    again = next(t for t, r in records
                 if r["type"] == "step" and t >= recovery_at and r["step"] > recovered["step"])
    before = [r["step_ms"] for t, r in records if r["type"] == "step" and t < killed_at]
    return {
        "to_training_again_s": again - killed_at,
        "recovery_s": recovered.get("duration_s"),
        "rebuild_s": recovered.get("rebuild_s"),
        "steps_lost": recovered.get("steps_lost"),
        "killed_after_step": last_before,
        "restored_step": recovered["step"],
        "step_ms_before": statistics.median(before[1:] or before),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--kc", default=str(REPO_ROOT / "build/release/apps/kc/kc"))
    ap.add_argument("--model", default=str(REPO_ROOT / "examples/models/gpt-tiny.yaml"))
    ap.add_argument("--data", default=str(REPO_ROOT / "data/fortunes/manifest.json"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--after", type=int, default=10, help="kill once this many steps are reported")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    load_before = os.getloadavg()
    runs = []
    with tempfile.TemporaryDirectory(prefix="kc_kill_rank_") as tmp:
        for i in range(a.repeat):
            runs.append(one_run(a.kc, a.model, a.data, a.steps, a.after, Path(tmp)))
            r = runs[-1]
            print(f"run {i + 1}: killed after step {r['killed_after_step']}, training again "
                  f"{r['to_training_again_s']:.2f} s later (recovery {r['recovery_s']:.2f} s, "
                  f"rebuild {r['rebuild_s']:.2f} s), restored step {r['restored_step']}, "
                  f"{r['steps_lost']} steps lost; step {r['step_ms_before']:.0f} ms before")
    load_after = os.getloadavg()
    summary = {
        "model": Path(a.model).stem,
        "to_training_again_s_median": statistics.median(r["to_training_again_s"] for r in runs),
        "to_training_again_s_max": max(r["to_training_again_s"] for r in runs),
        "steps_lost_max": max(r["steps_lost"] for r in runs),
        "cores": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "runs": runs,
    }
    print(f"{summary['model']}, 2 ranks, --min-ranks 1: kill -9 of rank 1 -> training again in "
          f"{summary['to_training_again_s_median']:.2f} s (median of {len(runs)}, max "
          f"{summary['to_training_again_s_max']:.2f} s), at most {summary['steps_lost_max']} steps "
          f"lost; {summary['cores']} cores, load average {load_before[0]:.1f} before, "
          f"{load_after[0]:.1f} after")
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
