#!/usr/bin/python3
"""Incremental checkpoints: what a periodic save writes, against a full one, and that it restores.

Trains `examples/models/gpt-small.yaml` (10.8 M parameters) for --steps steps on one rank with a
checkpoint every --every steps, keeping them all, as `kc train` does by default: every 8th save
whole, the saves between as deltas against the previous one (the XOR of the float bits, its
bytes grouped by place, zstd). From the run's metrics, for each save: the bytes written against
the bytes of the state it saved (a full save writes exactly those, uncompressed). Then:
  - `kc ckpt verify DIR`: every chunk of every checkpoint decodes and checks its XXH3;
  - bit-exact restore: a second run resumes from the newest checkpoint that is a delta save and
    trains to --steps; its losses must equal the first run's step for step (the resumed state,
    and so every later step, is bit for bit the one saved).
Goal (issue 23, item 7): a periodic save writes <= 40% of a full one, and restores bit-exactly.
The saves in warm-up (gpt-small warms up over 100 steps) move the weights less than those after;
both are reported.

A benchmark, not a test: nothing is asserted; the goals are reported met or not.

    bench/fault/incremental_ckpt.py                  # 160 steps: about 6 minutes on 2 cores
    bench/fault/incremental_ckpt.py --steps 60 --json out.json

Needs kc built (cmake --build build/release --target kc) and data/fortunes (the README's first
command). The runs it starts are stopped when it ends, on failure and Ctrl-C too.
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
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = REPO_ROOT / "examples" / "models" / "gpt-small.yaml"
GOAL_FRACTION = 0.40


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train(kc: Path, data: Path, out: Path, ckpt: Path, steps: int, every: int,
          resume: str) -> list[dict]:
    """Runs kc train in its own process group (killed on the way out); its metrics records."""
    cmd = [str(kc), "train", str(MODEL), "--data", str(data), "--ranks", "1",
           "--steps", str(steps), "--checkpoint-dir", str(ckpt), "--checkpoint-every", str(every),
           "--checkpoint-keep", "1000", "--resume", resume, "--out", str(out),
           "--progress", "none"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode != 0:
        sys.exit(f"kc train failed ({proc.returncode}):\n{output}")
    return read_jsonl(out / "metrics.jsonl")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--kc", type=Path, default=REPO_ROOT / "build" / "release" / "apps" / "kc" / "kc")
    ap.add_argument("--data", type=Path, default=REPO_ROOT / "data" / "fortunes" / "manifest.json")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    for need in (args.kc, args.data):
        if not need.exists():
            sys.exit(f"{need}: missing (see this script's help)")
    warmup = 100  # gpt-small.yaml's training.warmup_steps

    with tempfile.TemporaryDirectory(prefix="kc_incremental_") as tmp:
        root = Path(tmp)
        ckpt = root / "ckpt"
        first = train(args.kc, args.data, root / "run1", ckpt, args.steps, args.every, "never")
        saves = [r for r in first if r.get("type") == "checkpoint"]
        if len(saves) < 2:
            sys.exit("fewer than 2 checkpoints: raise --steps or lower --every")
        rows = []
        for s in saves:
            rows.append({"step": s["step"], "raw_bytes": s["raw_bytes"],
                         "bytes_written": s["bytes_written"],
                         "fraction": s["bytes_written"] / s["raw_bytes"],
                         "delta": s.get("chunks_delta", 0) > 0,
                         "persist_ms": s["persist_ms"]})
        verify = subprocess.run([str(args.kc), "ckpt", "verify", str(ckpt)], capture_output=True,
                                text=True)
        # Resume from the newest delta save before the end and train to the same last step.
        delta_steps = [r["step"] for r in rows if r["delta"] and r["step"] < args.steps]
        resumed_from = delta_steps[-1] if delta_steps else None
        same_losses = None
        if resumed_from is not None:
            second = train(args.kc, args.data, root / "run2", root / "ckpt2", args.steps,
                           args.every, str(ckpt / f"step-{resumed_from:08d}"))
            want = {r["step"]: r["loss"] for r in first if r.get("type") == "step"}
            got = {r["step"]: r["loss"] for r in second if r.get("type") == "step"}
            after = [s for s in got if s > resumed_from]
            same_losses = bool(after) and all(got[s] == want.get(s) for s in after)

    deltas = [r for r in rows if r["delta"]]
    periodic = statistics.median(r["fraction"] for r in deltas) if deltas else None
    after_warmup = [r["fraction"] for r in deltas if r["step"] > warmup]
    report = {
        "model": "gpt-small", "steps": args.steps, "every": args.every, "saves": rows,
        "delta_save_fraction_median": periodic,
        "delta_save_fraction_median_after_warmup":
            statistics.median(after_warmup) if after_warmup else None,
        "all_saves_fraction": sum(r["bytes_written"] for r in rows) /
                              sum(r["raw_bytes"] for r in rows),
        "verify_ok": verify.returncode == 0,
        "resumed_from": resumed_from, "resumed_losses_identical": same_losses,
        "goal_fraction": GOAL_FRACTION,
    }
    print(f"{'step':>6} {'kind':>6} {'MiB written':>12} {'of a full save':>15} {'persist ms':>11}")
    for r in rows:
        print(f"{r['step']:>6} {'delta' if r['delta'] else 'full':>6} "
              f"{r['bytes_written'] / (1 << 20):>12.1f} {100 * r['fraction']:>14.1f}% "
              f"{r['persist_ms']:>11.0f}")
    if periodic is not None:
        met = "met" if periodic <= GOAL_FRACTION else "not met"
        print(f"delta saves write {100 * periodic:.1f}% of a full save (median; goal <= "
              f"{100 * GOAL_FRACTION:.0f}%: {met})")
    if after_warmup:
        print(f"  after warm-up (step > {warmup}): {100 * statistics.median(after_warmup):.1f}%")
    print(f"all saves together: {100 * report['all_saves_fraction']:.1f}% of full saves")
    print(f"kc ckpt verify: {'ok' if report['verify_ok'] else 'FAILED'}")
    if resumed_from is not None:
        print(f"resumed from the delta save of step {resumed_from}: losses "
              f"{'identical' if same_losses else 'DIFFERENT'} to the uninterrupted run's")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
