#!/usr/bin/python3
"""One rank of tests/python/torch_backend_test.cc: every collective of the torch.distributed
backend "kc" against values computed here, then DDP training with "kc" and with "gloo" from the
same weights on the same batches, whose losses must be identical.

Started once per rank with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (env://), and
PYTHONPATH holding the build's python/ folder. Prints "rank R: ok" and exits 0, or raises.
"""

import os
import sys

import torch
import torch.distributed as dist

import kuangchao.torch  # noqa: F401  registers "kc"

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])


def expect(cond, what):
    if not cond:
        raise AssertionError(f"rank {rank}: {what}")


def check_collectives():
    r, w = rank, world
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16):
        x = torch.arange(10, dtype=dtype) + r
        dist.all_reduce(x)
        want = sum(torch.arange(10, dtype=torch.float64) + k for k in range(w))
        expect(torch.equal(x.to(torch.float64), want), f"all_reduce sum {dtype}: {x}")
    x = torch.full((5,), float(r + 1))
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    expect(torch.equal(x, torch.full((5,), float(w))), f"all_reduce max: {x}")
    x = torch.full((5,), float(r + 1))
    dist.all_reduce(x, op=dist.ReduceOp.MIN)
    expect(torch.equal(x, torch.ones(5)), f"all_reduce min: {x}")
    x = torch.full((5,), float(r + 2))
    dist.all_reduce(x, op=dist.ReduceOp.PRODUCT)
    prod = 1.0
    for k in range(w):
        prod *= k + 2
    expect(torch.equal(x, torch.full((5,), prod)), f"all_reduce product: {x}")
    # A size that no chunking divides evenly, and an async handle.
    x = torch.ones(1_000_003) * (r + 1)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    expect(torch.all(x == w * (w + 1) / 2).item(), "async all_reduce of 1,000,003")
    # broadcast from the last rank
    x = torch.arange(7, dtype=torch.float32) * (r + 1)
    dist.broadcast(x, src=w - 1)
    expect(torch.equal(x, torch.arange(7, dtype=torch.float32) * w), f"broadcast: {x}")
    # all_gather into a list, and into one tensor
    outs = [torch.empty(3) for _ in range(w)]
    dist.all_gather(outs, torch.full((3,), float(r)))
    for k in range(w):
        expect(torch.equal(outs[k], torch.full((3,), float(k))), f"all_gather[{k}]: {outs[k]}")
    big = torch.empty(w * 4, dtype=torch.int64)
    dist.all_gather_into_tensor(big, torch.full((4,), r, dtype=torch.int64))
    expect(torch.equal(big, torch.arange(w).repeat_interleave(4)), f"all_gather_into_tensor: {big}")
    # reduce_scatter: rank k receives the sum of every rank's k-th input
    out = torch.empty(6)
    dist.reduce_scatter(out, [torch.full((6,), float(r * 10 + k)) for k in range(w)])
    expect(torch.equal(out, torch.full((6,), float(sum(q * 10 + r for q in range(w))))),
           f"reduce_scatter: {out}")
    out = torch.empty(5)
    dist.reduce_scatter_tensor(out, torch.arange(5 * w, dtype=torch.float32) + r)
    want = (torch.arange(5, dtype=torch.float32) + 5 * r) * w + sum(range(w))
    expect(torch.equal(out, want), f"reduce_scatter_tensor: {out} want {want}")
    parts = [torch.full((3,), float(r)), torch.full((2, 2), float(r + 1))]
    dist.all_reduce_coalesced(parts)
    expect(torch.equal(parts[0], torch.full((3,), float(sum(range(w))))) and
           torch.equal(parts[1], torch.full((2, 2), float(sum(range(1, w + 1))))),
           f"all_reduce_coalesced: {parts}")
    # reduce to rank 0
    x = torch.full((4,), float(r + 1))
    dist.reduce(x, dst=0)
    if r == 0:
        expect(torch.equal(x, torch.full((4,), w * (w + 1) / 2)), f"reduce: {x}")
    # send / recv around the ring
    nxt, prv = (r + 1) % w, (r - 1) % w
    got = torch.empty(8)
    if r % 2 == 0:
        dist.send(torch.full((8,), float(r)), dst=nxt)
        dist.recv(got, src=prv)
    else:
        dist.recv(got, src=prv)
        dist.send(torch.full((8,), float(r)), dst=nxt)
    expect(torch.equal(got, torch.full((8,), float(prv))), f"recv: {got}")
    dist.barrier()
    # A new group of every rank (new_group makes another kc communicator).
    g = dist.new_group(list(range(w)))
    x = torch.ones(3)
    dist.all_reduce(x, group=g)
    expect(torch.equal(x, torch.full((3,), float(w))), "all_reduce on a new group")
    # Unsupported input says why.
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.float16))
        expect(False, "float16 was accepted")
    except RuntimeError as e:
        expect("not supported" in str(e), f"float16 error: {e}")


def train(group, steps=6):
    """DDP on a small MLP over `group`, the same weights and batches on every backend."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group,
                                                    bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 32, generator=g)
        y = torch.randn(16, 8, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return losses, weights



def leave(code: int) -> None:
    """Ends this rank without tearing torch down. With torch 1.13 a gloo process group's
    destructor (run as DDP's reducer or the group registry lets go of it) joins a worker thread
    that may be waiting for the GIL the destructor's thread holds, and the rank hangs at exit.
    Everything is written by now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

def main():
    dist.init_process_group("kc", rank=rank, world_size=world)
    expect(dist.get_backend() == "kc", f"backend {dist.get_backend()}")
    check_collectives()
    dist.barrier()
    # One init (re-initialising env:// races with the old store's teardown): DDP over the
    # default "kc" group, then over a gloo group of the same ranks.
    kc_losses, kc_weights = train(dist.group.WORLD)
    gloo_losses, gloo_weights = train(dist.new_group(list(range(world)), backend="gloo"))
    expect(kc_losses == gloo_losses, f"losses differ: kc {kc_losses}, gloo {gloo_losses}")
    expect(torch.equal(kc_weights, gloo_weights), "weights differ after training")
    print(f"rank {rank}: ok ({len(kc_losses)} DDP steps, loss {kc_losses[0]:.6f} -> "
          f"{kc_losses[-1]:.6f}, identical with gloo)", flush=True)
    leave(0)


if __name__ == "__main__":
    sys.exit(main())
