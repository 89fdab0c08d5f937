#!/usr/bin/python3
"""Training throughput of kc against PyTorch on this machine's CPU cores.

For each model, in one run and interleaved (so that both see the same machine state):

- torch 1x2: one PyTorch process on 2 cores. A quick search first tries the intra-op (OMP)
  threads {1, 2} x BLAS threads (OPENBLAS/MKL_NUM_THREADS) {1, 2} and keeps the fastest;
  the table names the setting that won.
- torch 2x1: PyTorch DDP (gloo), 2 ranks, each pinned to its own core with 1 OMP and 1 BLAS
  thread, batch_per_rank sequences per rank, default buckets.
- kc 1x2: `kc train CONFIG --ranks 1 --threads-per-rank 2`, and kc 2x1: `--ranks 2
  --threads-per-rank 1`; tokens/s from the metrics summary (steady state: kc leaves out its
  warmup steps).

torch times the steps after --warmup warmup steps. Every layout trains batch_per_rank
sequences per rank per step (torch 1x2 and kc 1x2: one rank). MFU = tokens/s x training
FLOPs per token / (cores x the per-core sgemm peak that `kc topo probe` measures), with
FLOPs per token = 6 (N_blocks + V C) + 6 L T C (docs/user-guide/models.md).

    bench/train/throughput.py                          # gpt-tiny and gpt-small, ~4 minutes
    bench/train/throughput.py --models gpt-tiny --steps 20 --reps 3 --json out.json

torch reads real tokens from data/fortunes (made with `kc data prepare` if missing and kc
exists), or random tokens when there is no data (it says so). Without a kc that has `train`,
only the torch columns are filled.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_gpt  # noqa: E402  (re-executes under /usr/bin/python3 if torch is missing)
from torch_gpt import REPO_ROOT  # noqa: E402

GOALS = {"gpt-tiny": 1.3, "gpt-small": 1.1}  # kc / torch tokens/s
CORES = 2
THREAD_SETTINGS = [(1, 2), (1, 1), (2, 1), (2, 2)]  # (OMP threads, BLAS threads)


def thread_env(omp: int, blas: int) -> dict:
    return {"OMP_NUM_THREADS": str(omp), "OPENBLAS_NUM_THREADS": str(blas),
            "MKL_NUM_THREADS": str(blas)}


# ---------------------------------------------------------------------------------------------
# Workers (run in their own processes, so that thread settings take effect at library load).


def _batches(cfg, steps: int, data: str | None, seed: int):
    import numpy as np
    rng = np.random.default_rng(seed)
    if data:
        tokens = torch_gpt.read_manifest_tokens(data)
    else:
        tokens = rng.integers(0, cfg.vocab, size=cfg.seq_len * cfg.batch * 4 + 1).astype(np.uint16)
    return [torch_gpt.random_windows(tokens, cfg.vocab, cfg.batch, cfg.seq_len, rng)
            for _ in range(steps)]


def worker(args) -> None:
    import torch
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = 0
    if world > 1:
        rank, world = torch_gpt.init_distributed()
        if args.pin:
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank % CORES]})
    torch.set_num_threads(args.omp)
    cfg = torch_gpt.load_config(args.config)
    total = args.warmup + args.steps
    batches = _batches(cfg, total, args.data, seed=1 + rank)
    torch.manual_seed(0)
    model = torch_gpt.GPT(cfg)
    trained = model
    if world > 1:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        trained = DDP(model)
    optimizer = torch_gpt.make_optimizer(trained, cfg.training)
    times, losses = [], []
    for s, (inputs, targets) in enumerate(batches):
        if world > 1 and s == args.warmup:
            dist.barrier()
        t0 = time.perf_counter()
        lr = torch_gpt.lr_at(s, total, cfg.training)
        loss, _ = torch_gpt.train_step(trained, optimizer, inputs, targets, lr,
                                       cfg.training.grad_clip)
        losses.append(float(loss))
        times.append(time.perf_counter() - t0)
    if world > 1:
        dist.barrier()
    timed = sum(times[args.warmup:])
    result = {"tokens_per_s": world * cfg.batch * cfg.seq_len * args.steps / timed,
              "step_ms": 1000 * timed / args.steps, "losses": losses,
              "torch_threads": torch.get_num_threads(), "world": world}
    if rank == 0:
        Path(args.out).write_text(json.dumps(result))
    if world > 1:
        torch_gpt.finish_distributed(0)


# ---------------------------------------------------------------------------------------------
# Runs.


def run_torch_single(config: Path, omp: int, blas: int, steps: int, warmup: int, data,
                     timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="kc-tput-") as tmp:
        out = Path(tmp) / "r.json"
        cmd = [torch_gpt.SYSTEM_PYTHON, str(Path(__file__).resolve()), "--worker",
               "--config", str(config), "--steps", str(steps), "--warmup", str(warmup),
               "--omp", str(omp), "--out", str(out)] + (["--data", str(data)] if data else [])
        r = subprocess.run(cmd, env=dict(os.environ, **thread_env(omp, blas)), timeout=timeout,
                           capture_output=True, text=True)
        if r.returncode != 0 or not out.is_file():
            raise RuntimeError(f"torch run failed (exit {r.returncode}): {r.stderr.strip()[-2000:]}")
        return json.loads(out.read_text())


def run_torch_ddp(config: Path, steps: int, warmup: int, data, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="kc-tput-") as tmp:
        out = Path(tmp) / "r.json"
        argv = [str(Path(__file__).resolve()), "--worker", "--pin", "--config", str(config),
                "--steps", str(steps), "--warmup", str(warmup), "--omp", "1", "--out", str(out)]
        argv += ["--data", str(data)] if data else []
        torch_gpt.launch_ranks(argv, CORES, env_per_rank=lambda r: thread_env(1, 1),
                               timeout=timeout)
        return json.loads(out.read_text())


def run_kc(kc: Path, config: Path, ranks: int, threads: int, steps: int, data,
           timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="kc-tput-") as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        cmd = [str(kc), "train", str(config), "--ranks", str(ranks), "--threads-per-rank",
               str(threads), "--steps", str(steps), "--metrics", str(metrics)]
        cmd += ["--data", str(data)] if data else []
        r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed (exit {r.returncode}): "
                               f"{(r.stderr or r.stdout).strip()[-2000:]}")
        _, summary = torch_gpt.read_metrics(metrics)
        if not summary or "tokens_per_s" not in summary:
            raise RuntimeError(f"{metrics} has no summary line with tokens_per_s")
        return summary


def sgemm_peak(kc: Path | None) -> float | None:
    if kc is None:
        return None
    r = subprocess.run([str(kc), "topo", "probe", "--no-write", "--json"], capture_output=True,
                       text=True, timeout=300)
    m = re.search(r"\{.*\}", r.stdout, re.DOTALL)  # the JSON object (logs may precede it)
    if r.returncode != 0 or not m:
        print(f"kc topo probe failed (exit {r.returncode}); MFU left out", file=sys.stderr)
        return None
    try:
        return float(json.loads(m.group(0))["sgemm_flops_per_core"])
    except (ValueError, KeyError) as e:
        print(f"kc topo probe: no sgemm_flops_per_core ({e}); MFU left out", file=sys.stderr)
        return None


def median(xs):
    return statistics.median(xs) if xs else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt-tiny,gpt-small",
                    help="comma-separated names under examples/models or YAML paths "
                         "(default: %(default)s)")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per run (default: 6)")
    ap.add_argument("--warmup", type=int, default=2,
                    help="untimed steps before them (torch; kc runs warmup + steps and "
                         "leaves out its own warmup) (default: 2)")
    ap.add_argument("--reps", type=int, default=1,
                    help="interleaved repetitions; the table shows medians (default: 1)")
    ap.add_argument("--search-steps", type=int, default=3,
                    help="timed steps of each thread setting in the search (default: 3)")
    ap.add_argument("--kc", help="the kc binary (default: build/release/apps/kc/kc)")
    ap.add_argument("--no-kc", action="store_true", help="measure torch only")
    ap.add_argument("--data", help="token data manifest (default: data/fortunes/manifest.json)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE "
                                                   "('-': standard output)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds allowed for each run")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--omp", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--pin", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    if min(args.steps, args.reps, args.search_steps) < 1 or args.warmup < 0:
        ap.error("--steps, --reps and --search-steps must be positive, --warmup not negative")
    if os.cpu_count() and os.cpu_count() < CORES:
        print(f"warning: {os.cpu_count()} cores, the layouts assume {CORES}", file=sys.stderr)

    try:
        configs = {name: torch_gpt.model_config_path(name) for name in args.models.split(",")}
        kc = None
        if not args.no_kc:
            try:
                kc = torch_gpt.find_kc(args.kc)
            except FileNotFoundError as e:
                print(f"{e}; measuring torch only", file=sys.stderr)
        kc_train = kc is not None and torch_gpt.kc_has_train(kc)
        if kc is not None and not kc_train:
            print(f"{kc} has no `train` subcommand yet; measuring torch only", file=sys.stderr)
        data = torch_gpt.ensure_data(kc if kc_train else None, args.data)
        if data is None:
            print("no token data (data/fortunes/manifest.json); torch trains on random tokens",
                  file=sys.stderr)
        peak = sgemm_peak(kc)
    except (FileNotFoundError, RuntimeError, ValueError) as e:
        print(f"throughput: {e}", file=sys.stderr)
        return 2

    results = {}
    try:
        for name, config in configs.items():
            cfg = torch_gpt.load_config(config)
            search = {}
            for omp, blas in THREAD_SETTINGS:
                r = run_torch_single(config, omp, blas, args.search_steps, args.warmup, data,
                                     args.timeout)
                search[f"omp{omp}+blas{blas}"] = r["tokens_per_s"]
                print(f"{name}: torch 1x2 search OMP={omp} BLAS={blas}: "
                      f"{r['tokens_per_s']:.0f} tokens/s", file=sys.stderr, flush=True)
            best = max(search, key=search.get)
            omp, blas = (int(x) for x in re.findall(r"\d+", best))
            results[name] = {"config": str(config.relative_to(REPO_ROOT)
                                           if config.is_relative_to(REPO_ROOT) else config),
                             "flops_per_token": cfg.flops_per_token(),
                             "tokens_per_step_per_rank": cfg.batch * cfg.seq_len,
                             "torch_thread_search": search, "torch_setting": best,
                             "omp": omp, "blas": blas,
                             "runs": {"torch 1x2": [], "torch 2x1": [], "kc 1x2": [],
                                      "kc 2x1": []}, "kc_summaries": {"1x2": [], "2x1": []}}
        for rep in range(args.reps):
            for name, config in configs.items():
                res = results[name]
                runs = res["runs"]
                r = run_torch_single(config, res["omp"], res["blas"], args.steps, args.warmup,
                                     data, args.timeout)
                runs["torch 1x2"].append(r["tokens_per_s"])
                r = run_torch_ddp(config, args.steps, args.warmup, data, args.timeout)
                runs["torch 2x1"].append(r["tokens_per_s"])
                if kc_train:
                    for layout, ranks, threads in (("1x2", 1, 2), ("2x1", 2, 1)):
                        s = run_kc(kc, config, ranks, threads, args.warmup + args.steps,
                                   args.data and data, args.timeout)
                        runs[f"kc {layout}"].append(float(s["tokens_per_s"]))
                        res["kc_summaries"][layout].append(s)
                print(f"rep {rep + 1}/{args.reps} {name}: " + ", ".join(
                    f"{k} {v[-1]:.0f}" for k, v in runs.items() if v) + " tokens/s",
                    file=sys.stderr, flush=True)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"throughput: {e}", file=sys.stderr)
        return 2

    def mfu(tps, flops):
        return None if tps is None or not peak else tps * flops / (CORES * peak)

    rows = []
    for name, res in results.items():
        for layout in ("1x2", "2x1"):
            t = median(res["runs"][f"torch {layout}"])
            k = median(res["runs"][f"kc {layout}"])
            setting = (f"OMP={res['omp']} BLAS={res['blas']}" if layout == "1x2"
                       else "DDP gloo, OMP=1 BLAS=1, pinned")
            rows.append({"model": name, "layout": f"{layout[0]} proc x {layout[2]} core"
                         + ("s" if layout[2] != "1" else ""), "torch_tokens_per_s": t,
                         "torch_setting": setting, "kc_tokens_per_s": k,
                         "ratio": k / t if k and t else None, "goal": GOALS.get(name),
                         "torch_mfu": mfu(t, res["flops_per_token"]),
                         "kc_mfu": mfu(k, res["flops_per_token"])})

    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    def pct(v):
        return "-" if v is None else f"{100 * v:.1f}%"

    print(f"\nsgemm peak per core: {fmt(peak and peak / 1e9, '.1f')} GFLOP/s (kc topo probe); "
          f"{CORES} cores; timed steps {args.steps} after {args.warmup} warmup, "
          f"median of {args.reps} rep(s); data: {data or 'random tokens'}")
    print(f"{'model':<10} {'layout':<16} {'torch tok/s':>11} {'torch setting':<30} "
          f"{'kc tok/s':>9} {'kc/torch':>8} {'goal':>5} {'torch MFU':>9} {'kc MFU':>7}")
    for r in rows:
        print(f"{r['model']:<10} {r['layout']:<16} {fmt(r['torch_tokens_per_s'], '.0f'):>11} "
              f"{r['torch_setting']:<30} {fmt(r['kc_tokens_per_s'], '.0f'):>9} "
              f"{fmt(r['ratio'], '.2f'):>8} {fmt(r['goal'], '.1f'):>5} "
              f"{pct(r['torch_mfu']):>9} {pct(r['kc_mfu']):>7}")
    for name, res in results.items():
        print(f"{name} torch 1x2 thread search (tokens/s): " + ", ".join(
            f"{k} {v:.0f}" for k, v in res["torch_thread_search"].items())
            + f" -> {res['torch_setting']}")
    if not kc_train:
        print("kc columns empty: no kc with `train`")

    if args.json:
        doc = {"cores": CORES, "sgemm_flops_per_core": peak, "steps": args.steps,
               "warmup": args.warmup, "reps": args.reps, "data": str(data) if data else None,
               "rows": rows, "models": results}
        text = json.dumps(doc, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
