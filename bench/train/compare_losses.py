#!/usr/bin/python3
"""Checks that kc trains exactly like PyTorch: the same losses, step by step.

Runs `kc train CONFIG --ranks N --threads-per-rank 1 --steps S --export DIR --metrics FILE`,
which writes the model (model.json), its initial weights (params.bin) and every step's batch
(batches.bin) before step 0; then trains the PyTorch reference (torch_gpt.py) from the same
weights on the same batches with the same AdamW, schedule and clipping, in float32 (and in
float64 with --double), and prints step / kc loss / torch loss / relative difference.

Exit status: 0 when every relative difference (float32) is within --tolerance, 1 when one is
not, 2 when the comparison could not run (no kc, kc without `train`, a refused export, ...).

    bench/train/compare_losses.py                        # gpt-tiny, 10 steps, 1 rank
    bench/train/compare_losses.py --ranks 2 --double     # 2 kc ranks against 2 DDP ranks
    bench/train/compare_losses.py --export DIR --metrics FILE   # an existing kc run

With --ranks N > 1, batches.bin holds the global batch; the torch side runs N DDP ranks
(gloo), each taking its contiguous share of the global batch. Takes well under a minute with
the defaults.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_gpt  # noqa: E402  (re-executes under /usr/bin/python3 if torch is missing)
from torch_gpt import REPO_ROOT  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402


class Failure(Exception):
    """A comparison that could not run; exit status 2."""


def run_kc(args, export_dir: Path, metrics: Path) -> None:
    try:
        kc = torch_gpt.find_kc(args.kc)
    except FileNotFoundError as e:
        raise Failure(str(e)) from None
    if not torch_gpt.kc_has_train(kc):
        raise Failure(f"{kc} has no `train` subcommand (`kc --help` does not list it); "
                      "build a kc that has it, or pass --export DIR --metrics FILE of a run")
    config = torch_gpt.model_config_path(args.config)
    data = torch_gpt.ensure_data(kc, args.data)
    cmd = [str(kc), "train", str(config), "--ranks", str(args.ranks), "--threads-per-rank", "1",
           "--steps", str(args.steps), "--export", str(export_dir), "--metrics", str(metrics)]
    if args.data or (data and data != torch_gpt.DEFAULT_MANIFEST):
        cmd += ["--data", str(data)]
    print("running:", " ".join(cmd), flush=True)
    try:
        r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True,
                           timeout=args.timeout)
    except subprocess.TimeoutExpired:
        raise Failure(f"kc train did not finish within {args.timeout} s") from None
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-15:])
        if args.ranks > 1 and "export" in tail.lower():
            raise Failure(f"kc refused --export with --ranks {args.ranks} "
                          f"(exit {r.returncode}):\n{tail}")
        raise Failure(f"kc train failed (exit {r.returncode}):\n{tail}")


def load_export(export_dir: Path, steps_wanted: int | None):
    model_json = export_dir / "model.json"
    for f in (model_json, export_dir / "params.bin", export_dir / "batches.bin"):
        if not f.is_file():
            raise Failure(f"the export lacks {f}")
    meta = json.loads(model_json.read_text())
    cfg = torch_gpt.config_from_model_json(meta)
    total = cfg.steps if cfg.steps is not None else steps_wanted
    if total is None:
        raise Failure(f"{model_json} has no 'steps'; pass --steps")
    batches = torch_gpt.read_batches_bin(export_dir / "batches.bin", total, cfg.batch,
                                         cfg.seq_len)
    if batches.size and (batches.min() < 0 or batches.max() >= cfg.vocab):
        raise Failure(f"{export_dir / 'batches.bin'}: tokens in [{batches.min()}, "
                      f"{batches.max()}], outside the vocabulary [0, {cfg.vocab})")
    return meta, cfg, total, batches


def torch_losses(cfg, meta, export_dir: Path, batches: np.ndarray, steps: int, total: int,
                 dtype: torch.dtype, rank: int = 0, world: int = 1) -> list[dict]:
    """Trains the reference; returns per step {"loss", "lr", "grad_norm"} (losses global)."""
    torch.manual_seed(0)
    model = torch_gpt.GPT(cfg)
    torch_gpt.load_params(model, export_dir / "params.bin", meta.get("tensors"))
    model = model.to(dtype)
    trained = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        trained = DDP(model)
    if cfg.batch % world:
        raise Failure(f"the global batch {cfg.batch} does not split evenly over {world} ranks")
    share = cfg.batch // world
    lo, hi = rank * share, (rank + 1) * share

    def gen():
        for s in range(steps):
            inputs = torch.from_numpy(batches[s, 0, lo:hi].astype(np.int64))
            targets = torch.from_numpy(batches[s, 1, lo:hi].astype(np.int64))
            yield inputs, targets

    records = []

    def on_step(s, loss, lr, norm):
        if world > 1:
            import torch.distributed as dist
            t = torch.tensor([loss], dtype=torch.float64)
            dist.all_reduce(t)
            loss = float(t) / world
        records.append({"loss": loss, "lr": lr, "grad_norm": norm})

    optimizer = torch_gpt.make_optimizer(trained, cfg.training)
    torch_gpt.train_steps(trained, gen(), steps, training=cfg.training, optimizer=optimizer,
                          total_steps=total, on_step=on_step)
    return records


def run_torch(args, cfg, meta, export_dir: Path, batches, steps: int, total: int,
              dtype_name: str, world: int) -> list[dict]:
    dtype = {"float32": torch.float32, "float64": torch.float64}[dtype_name]
    if world == 1:
        return torch_losses(cfg, meta, export_dir, batches, steps, total, dtype)
    out = export_dir / f"torch_{dtype_name}_ddp.json"
    argv = [str(Path(__file__).resolve()), "--worker", "--export", str(export_dir),
            "--steps", str(steps), "--worker-out", str(out), "--worker-dtype", dtype_name]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    torch_gpt.launch_ranks(argv, world, timeout=args.timeout)
    return json.loads(out.read_text())


def worker(args) -> None:
    """One DDP rank of the torch side (started by run_torch)."""
    rank, world = torch_gpt.init_distributed()
    export_dir = Path(args.export)
    meta, cfg, total, batches = load_export(export_dir, args.steps)
    dtype = {"float32": torch.float32, "float64": torch.float64}[args.worker_dtype]
    records = torch_losses(cfg, meta, export_dir, batches, args.steps, total, dtype, rank, world)
    if rank == 0:
        Path(args.worker_out).write_text(json.dumps(records))
    torch_gpt.finish_distributed(0)


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="examples/models/gpt-tiny.yaml",
                    help="kc model YAML, a path or a name under examples/models "
                         "(default: %(default)s)")
    ap.add_argument("--steps", type=int, default=10, help="training steps (default: 10)")
    ap.add_argument("--tolerance", type=float, default=1e-4,
                    help="largest relative loss difference accepted (default: 1e-4)")
    ap.add_argument("--ranks", type=int, default=1, help="kc ranks and torch DDP ranks")
    ap.add_argument("--kc", help="the kc binary (default: build/release/apps/kc/kc)")
    ap.add_argument("--data", help="token data manifest for kc (default: kc's, "
                                   "data/fortunes/manifest.json, made if missing)")
    ap.add_argument("--double", action="store_true", help="also train the reference in float64")
    ap.add_argument("--export", help="use this existing kc export directory instead of "
                                     "running kc (needs --metrics)")
    ap.add_argument("--metrics", help="the metrics JSONL of the kc run given by --export")
    ap.add_argument("--keep", action="store_true", help="keep the temporary export directory")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds allowed for each run")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--worker-dtype", default="float32", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        worker(args)
        return 0
    if args.steps < 1 or args.ranks < 1:
        ap.error("--steps and --ranks must be positive")
    if bool(args.export) != bool(args.metrics):
        ap.error("--export and --metrics go together (an existing kc run)")

    tmp = None
    try:
        if args.export:
            export_dir, metrics = Path(args.export), Path(args.metrics)
        else:
            tmp = Path(tempfile.mkdtemp(prefix="kc-compare-"))
            export_dir, metrics = tmp / "export", tmp / "metrics.jsonl"
            run_kc(args, export_dir, metrics)
        meta, cfg, total, batches = load_export(export_dir, args.steps)
        kc_steps, _ = torch_gpt.read_metrics(metrics)
        if not kc_steps:
            raise Failure(f"{metrics} has no step records")
        steps = min(len(kc_steps), total, args.steps if not args.export else total)
        if [r["step"] for r in kc_steps[:steps]] != list(range(1, steps + 1)):
            raise Failure(f"{metrics}: expected step records 1..{steps}, got "
                          f"{[r['step'] for r in kc_steps[:steps]]}")
        print(f"model {cfg.name}: L{cfg.layers} C{cfg.hidden} NH{cfg.heads} F{cfg.ffn_hidden} "
              f"V{cfg.vocab} T{cfg.seq_len}, global batch {cfg.batch}, {steps} of {total} steps,"
              f" {args.ranks} rank(s)", flush=True)
        ref = {"float32": run_torch(args, cfg, meta, export_dir, batches, steps, total,
                                    "float32", args.ranks)}
        if args.double:
            ref["float64"] = run_torch(args, cfg, meta, export_dir, batches, steps, total,
                                       "float64", args.ranks)
    except (Failure, FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"compare_losses: {e}", file=sys.stderr)
        return 2
    finally:
        if tmp is not None:
            if args.keep:
                print(f"kept {tmp}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)

    head = f"{'step':>4}  {'kc loss':>10}  {'torch fp32':>10}  {'rel diff':>9}"
    if args.double:
        head += f"  {'torch fp64':>10}  {'rel diff':>9}"
    head += f"  {'kc lr':>10}  {'torch lr':>10}  {'kc |g|':>9}  {'torch |g|':>9}"
    print(head)
    worst, ok = 0.0, True
    for s in range(steps):
        k = kc_steps[s]
        t = ref["float32"][s]
        d = rel(k["loss"], t["loss"])
        worst = max(worst, d)
        bad = not d <= args.tolerance
        ok &= not bad
        line = f"{s + 1:>4}  {k['loss']:>10.6f}  {t['loss']:>10.6f}  {d:>9.2e}"
        if args.double:
            t64 = ref["float64"][s]
            line += f"  {t64['loss']:>10.6f}  {rel(k['loss'], t64['loss']):>9.2e}"
        line += (f"  {k.get('lr', math.nan):>10.3e}  {t['lr']:>10.3e}"
                 f"  {k.get('grad_norm', math.nan):>9.4f}  {t['grad_norm']:>9.4f}")
        print(line + ("  <-- over tolerance" if bad else ""))
    verdict = "PASS" if ok else "FAIL"
    print(f"{verdict}: largest relative loss difference {worst:.2e}, tolerance "
          f"{args.tolerance:.0e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
