#!/usr/bin/python3
"""torch.distributed backend "kc" against gloo, side by side in the same processes.

    bench/comm/torch_backend.py [--ranks 2] [--sizes 1M,64M] [--model gpt-tiny] [--steps 12]

Starts --ranks processes (env://, 127.0.0.1), each with a "kc" group (the default one) and a
gloo group over the same ranks, then
  1. all-reduce bus bandwidth, 2(n-1)/n x bytes / time, of float32 tensors of each size: the two
     backends interleaved, --reps timed calls each after warm-up calls, the median;
  2. DDP training of bench/train/torch_gpt.py's model (the model kc trains) on the same random
     batches: tokens/s of each backend (rounds interleaved, the median step), and whether the
     losses are identical.
Each rank runs on a core of its own (--cpu-bind core, the default; the same for both
backends). Prints a table and one JSON line (--json FILE writes it too). Needs the torch backend built
(cmake finds Debian's python3-torch and libtorch-dev; this script installs python3-torch with
apt-get when run as root without it, then the build must be configured again).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench/train"))
import torch_gpt  # noqa: E402  (installs python3-torch if missing, as root)


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def rank_main(args) -> None:
    import torch
    import torch.distributed as dist
    import kuangchao.torch  # noqa: F401

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.cpu_bind == "core":
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(args.threads)
    dist.init_process_group("kc", rank=rank, world_size=world)
    groups = {"kc": dist.group.WORLD,
              "gloo": dist.new_group(list(range(world)), backend="gloo")}
    out = {"ranks": world, "allreduce": [], "ddp": {}}

    # 1. all-reduce bus bandwidth.
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        x = torch.ones(size // 4)
        times = {name: [] for name in groups}
        reps = max(3, min(args.reps, int(2e9 // max(size, 1))))
        for _ in range(3):  # warm-up: connections, buffers, pages
            for g in groups.values():
                dist.all_reduce(x, group=g)
        for _ in range(reps):
            for name, g in groups.items():
                dist.barrier(group=g)
                t0 = time.perf_counter()
                dist.all_reduce(x, group=g)
                times[name].append(time.perf_counter() - t0)
        row = {"bytes": size}
        for name, t in times.items():
            row[f"{name}_busbw_gbs"] = 2 * (world - 1) / world * size / statistics.median(t) / 1e9
        row["ratio"] = row["kc_busbw_gbs"] / row["gloo_busbw_gbs"]
        row["kc_algorithm"] = kuangchao.torch.allreduce_algorithm(groups["kc"], size)
        out["allreduce"].append(row)

    # 2. DDP training of torch_gpt's model, the same batches for both backends.
    cfg = torch_gpt.load_config(REPO / "examples/models" / f"{args.model}.yaml")
    if args.batch:
        cfg.batch = args.batch
    g = torch.Generator().manual_seed(1000 + rank)
    batches = [(torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq_len), generator=g),
                torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq_len), generator=g))
               for _ in range(args.steps)]
    runs = {}
    for name, group in groups.items():
        torch.manual_seed(0)
        model = torch_gpt.GPT(cfg)
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        runs[name] = (ddp, torch_gpt.make_optimizer(ddp, cfg.training), [], [])
    for s in range(args.steps):
        for name, (ddp, opt, losses, times) in runs.items():
            inputs, targets = batches[s]
            dist.barrier(group=groups[name])
            t0 = time.perf_counter()
            loss, _ = torch_gpt.train_step(ddp, opt, inputs, targets,
                                           torch_gpt.lr_at(s, args.steps, cfg.training),
                                           cfg.training.grad_clip)
            times.append(time.perf_counter() - t0)
            losses.append(float(loss))
    tokens = cfg.batch * cfg.seq_len * world
    for name, (_, _, losses, times) in runs.items():
        step = statistics.median(times[args.warmup:])
        out["ddp"][name] = {"step_ms": step * 1e3, "tokens_per_s": tokens / step,
                            "losses": losses}
    out["ddp"]["ratio"] = out["ddp"]["kc"]["tokens_per_s"] / out["ddp"]["gloo"]["tokens_per_s"]
    out["ddp"]["losses_identical"] = runs["kc"][2] == runs["gloo"][2]
    out["model"] = cfg.name
    out["batch"] = cfg.batch
    out["seq_len"] = cfg.seq_len
    if rank == 0:
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--sizes", default="1M,64M")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--model", default="gpt-tiny")
    ap.add_argument("--batch", type=int, default=0,
                    help="sequences per rank per step (default: the model file's batch_per_rank)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--cpu-bind", choices=["core", "none"], default="core",
                    help="core: each rank on a core of its own, as torchrun --bind and mpirun do "
                         "(both backends alike); none: the scheduler's choice")
    ap.add_argument("--python-dir", default=str(REPO / "build/release/python"),
                    help="the build's python/ folder (kuangchao/_kc_torch.so)")
    ap.add_argument("--json", help="also write the JSON result here")
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_main:
        rank_main(args)
        return 0
    if not (Path(args.python_dir) / "kuangchao").is_dir():
        print(f"torch_backend: no kuangchao package in {args.python_dir}: build with Debian's "
              "python3-torch and libtorch-dev installed (cmake --preset release && cmake "
              "--build build/release --target kc_torch)", file=sys.stderr)
        return 2
    env_extra = {"PYTHONPATH": args.python_dir, "OMP_NUM_THREADS": str(args.threads)}
    import subprocess
    port = torch_gpt.free_port()
    procs = []
    for r in range(args.ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.ranks), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), **env_extra)
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-main", *sys.argv[1:]],
                                      env=env, stdout=subprocess.PIPE if r == 0 else None,
                                      text=True))
    out_text, _ = procs[0].communicate()
    codes = [p.wait() for p in procs]
    if any(codes):
        print(f"torch_backend: ranks exited {codes}", file=sys.stderr)
        return 1
    result = json.loads(out_text.strip().splitlines()[-1])
    print(f"{result['ranks']} ranks, all-reduce of float32 (bus bandwidth, median):")
    print(f"{'size':>8}  {'kc GB/s':>8}  {'gloo GB/s':>9}  {'kc/gloo':>7}")
    for row in result["allreduce"]:
        print(f"{row['bytes'] / (1 << 20):>6.0f}Mi  {row['kc_busbw_gbs']:>8.2f}  "
              f"{row['gloo_busbw_gbs']:>9.2f}  {row['ratio']:>7.2f}x")
    d = result["ddp"]
    print(f"\nDDP training of {result['model']} (bench/train/torch_gpt.py's model), "
          f"{result['batch']} x {result['seq_len']} tokens per rank:")
    print(f"  kc   {d['kc']['tokens_per_s']:>9.0f} tokens/s  step {d['kc']['step_ms']:.1f} ms")
    print(f"  gloo {d['gloo']['tokens_per_s']:>9.0f} tokens/s  step {d['gloo']['step_ms']:.1f} ms")
    print(f"  kc / gloo {d['ratio']:.2f}x; losses identical: {d['losses_identical']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
