#!/usr/bin/python3
"""Asynchronous checkpoints: the step's stall, the persist rate against the disk, incremental saves.

1. `kc train MODEL` (gpt-small) for --steps steps with `--checkpoint-every 2` and without
   checkpoints, alternated for --rounds rounds: per checkpoint the stall (the step's wait for
   the copy to memory, and for the previous persist if it had not finished) against the median
   step, and the median step with checkpoints against without (the background persist shares
   the cores). The goal (the fault-tolerance issue): stall < 10% of a step.
2. `kc_checkpoint_bench --mib MIB`: a state of that size saved by the checkpoint writer, against
   the same bytes written as one file with the same durable write (the disk's sequential rate);
   then saved again unchanged (the goal: no chunk data written), and with one tensor changed.

    bench/train/checkpoint.py                 # about 2 minutes
    bench/train/checkpoint.py --rounds 3 --json out.json

Needs a built kc and kc_checkpoint_bench (cmake --workflow --preset release) and data/fortunes.
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
GOAL_STALL = 0.10


def train(kc: str, model: str, data: Path, steps: int, tmp: Path, checkpoints: bool) -> dict:
    metrics = tmp / "metrics.jsonl"
    cmd = [kc, "train", model, "--steps", str(steps), "--eval-every", "0", "--progress", "none",
           "--data", str(data / "manifest.json"), "--metrics", str(metrics), "--out",
           str(tmp / "run")]
    if checkpoints:
        ckpt = tmp / "ckpt"
        subprocess.run(["rm", "-rf", str(ckpt)], check=True)
        cmd += ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "2", "--resume", "never"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"checkpoint: kc train failed:\n{p.stderr}")
    records = [json.loads(l) for l in metrics.read_text().splitlines()]
    return {
        "step_ms": [r for r in records if r["type"] == "summary"][0]["step_ms"],
        "checkpoints": [r for r in records if r["type"] == "checkpoint"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO_ROOT / "examples/models/gpt-small.yaml"))
    ap.add_argument("--kc", default=str(REPO_ROOT / "build/release/apps/kc/kc"))
    ap.add_argument("--bench", default=str(REPO_ROOT /
                                            "build/release/bench/fault/kc_checkpoint_bench"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    for exe in (args.kc, args.bench):
        if not os.access(exe, os.X_OK):
            sys.exit(f"checkpoint: no {exe}; build it first")
    data = REPO_ROOT / "data" / "fortunes"
    if not (data / "manifest.json").exists():
        subprocess.run([args.kc, "data", "prepare", "--out", str(data), "--doc-separator", "%",
                        "/usr/share/games/fortunes"], check=True, capture_output=True)
    with tempfile.TemporaryDirectory(prefix="kc_ckpt_bench_", dir=REPO_ROOT / "build") as t:
        tmp = Path(t)
        plain, saving = [], []
        for r in range(args.rounds):
            plain.append(train(args.kc, args.model, data, args.steps, tmp, False))
            saving.append(train(args.kc, args.model, data, args.steps, tmp, True))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        disk = json.loads(subprocess.run([args.bench, "--mib", str(args.mib), "--dir",
                                          str(tmp / "bench")], check=True, capture_output=True,
                                         text=True).stdout)
    step_plain = statistics.median(x["step_ms"] for x in plain)
    step_saving = statistics.median(x["step_ms"] for x in saving)
    stalls = [c["stall_ms"] for x in saving for c in x["checkpoints"]]
    persists = [c["persist_ms"] for x in saving for c in x["checkpoints"]]
    state_mib = saving[0]["checkpoints"][0]["raw_bytes"] / 2**20
    worst_share = max(stalls) / step_saving
    print(f"\n{Path(args.model).stem}: {state_mib:.0f} MiB of state per checkpoint, "
          f"{len(stalls)} checkpoints")
    print(f"  step without checkpoints      {step_plain:8.1f} ms (median)")
    print(f"  step with one every 2 steps   {step_saving:8.1f} ms ({step_saving / step_plain:.2f}x)")
    print(f"  stall per checkpoint          {statistics.median(stalls):8.1f} ms median, "
          f"{max(stalls):.1f} ms worst = {100 * worst_share:.1f}% of a step "
          f"(goal < {100 * GOAL_STALL:.0f}%)")
    print(f"  persist in the background     {statistics.median(persists):8.0f} ms median")
    first, same = disk["first"], disk["unchanged"]
    print(f"\nwriter, {disk['state_mib']} MiB state:")
    print(f"  persist                       {first['persist_mib_per_s']:8.0f} MiB/s "
          f"(hash, write, fsync, rename)")
    print(f"  disk, one file, same write    {disk['disk_sequential_mib_per_s']:8.0f} MiB/s "
          f"-> persist at {100 * disk['persist_vs_disk']:.0f}% of the disk")
    print(f"  save with nothing changed     {same['bytes_written']:8d} bytes written "
          f"({same['chunks_reused']} chunks reused)")
    print(f"  save with one tensor changed  {disk['one_tensor_changed']['bytes_written']:8d} bytes "
          f"written ({disk['one_tensor_changed']['chunks_written']} chunk)")
    ok = worst_share < GOAL_STALL and same["bytes_written"] == 0
    print(f"\nstall under {100 * GOAL_STALL:.0f}% of a step and no data for an unchanged save: "
          f"{'PASS' if ok else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "step_ms_plain": step_plain, "step_ms_checkpointing": step_saving,
            "stall_ms": stalls, "persist_ms": persists, "state_mib": state_mib,
            "writer": disk, "pass": ok}, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
