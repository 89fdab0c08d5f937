#!/usr/bin/python3
"""A small PyTorch DDP program, as a user brings one: it reads only torchrun's launch
environment, so it runs the same under torchrun, `kc run` and as a command job on a kc cluster.

    kc run --nproc 2 -- python3 examples/jobs/torch-ddp/train.py --steps 50
    python3 -m torch.distributed.run --nproc_per_node 2 examples/jobs/torch-ddp/train.py
    kc submit examples/jobs/torch-ddp/job.yaml

A two-layer MLP learns a fixed random linear map from random inputs (seeded: every run, under
any launcher, sees the same weights and batches). With KC_CHECKPOINT_DIR set (kc run
--checkpoint-dir, or any kc cluster job) rank 0 saves the model, the optimizer and the step
there every --checkpoint-every steps and on SIGTERM (a pause or a preemption), and every rank
resumes from it when started again. --backend kc uses Kuangchao's torch.distributed backend
(`import kuangchao.torch`). With KC_HEARTBEAT_FILE set (kc run --heartbeat-timeout, or
heartbeat_timeout in the job file) every rank touches it after each step.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP



def leave(code: int) -> None:
    """Ends this rank without tearing torch down. With torch 1.13 a gloo process group's
    destructor (run as DDP's reducer or the group registry lets go of it) joins a worker thread
    that may be waiting for the GIL the destructor's thread holds, and the rank hangs at exit.
    Everything is written by now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=32, help="sequences per rank per step")
    p.add_argument("--backend", default="gloo", choices=["gloo", "kc"])
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--losses", help="rank 0 writes every step's loss here (JSON)")
    a = p.parse_args()

    if a.backend == "kc":
        import kuangchao.torch  # noqa: F401  registers the "kc" backend
    dist.init_process_group(a.backend)  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    torch.manual_seed(0)
    target = torch.randn(16, 4)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)

    ckpt_dir = os.environ.get("KC_CHECKPOINT_DIR", "")
    ckpt = os.path.join(ckpt_dir, "torch-ddp.pt") if ckpt_dir else ""
    start, losses = 0, []
    if ckpt and os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start, losses = state["step"], state["losses"]
        if rank == 0:
            print(f"resumed from step {start} (restart {restart})", flush=True)

    stop = {"asked": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))

    def save(step: int) -> None:
        if ckpt and rank == 0:
            tmp = ckpt + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                        "losses": losses}, tmp)
            os.replace(tmp, ckpt)

    beat = os.environ.get("KC_HEARTBEAT_FILE", "")
    for step in range(start, a.steps):
        if beat:
            pathlib.Path(beat).touch()  # alive: a rank stuck in a step stops beating
        g = torch.Generator().manual_seed(1000 * step + rank)  # this rank's batch of this step
        x = torch.randn(a.batch, 16, generator=g)
        loss = torch.nn.functional.mse_loss(ddp(x), x @ target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
        if rank == 0:
            print(f"step {step + 1} loss {losses[-1]:.6f}", flush=True)
        # Every rank agrees whether to stop (a SIGTERM reaches the ranks at slightly different
        # moments): the step after which all save and exit.
        asked = torch.tensor([1.0 if stop["asked"] else 0.0])
        dist.all_reduce(asked, op=dist.ReduceOp.MAX)
        if (step + 1) % a.checkpoint_every == 0 or asked.item() > 0:
            save(step + 1)
        if asked.item() > 0:
            if rank == 0:
                print(f"stopping after step {step + 1}: saved", flush=True)
            leave(143)
    save(a.steps)
    if rank == 0 and a.losses:
        with open(a.losses, "w") as f:
            json.dump(losses, f)
    leave(0)


if __name__ == "__main__":
    sys.exit(main())
