#!/usr/bin/env python3
"""PyTorch eager on a GPU: the baseline of bench/gpu/run.sh.

Trains bench/train/torch_gpt.py's model (the model kc's engine trains, written with plain
matmuls and softmax) on random tokens for --steps steps and prints one JSON line: tokens/s over
the steps after --warmup, with the same batch and sequence length as the kc model file.
Each step is the one torch_gpt.train_step takes (zero_grad, forward, backward,
clip_grad_norm_ read back to the host, AdamW with weight decay on the matrices), with the
forward under torch.autocast(bfloat16) for --precision bf16 (PyTorch's mixed precision: fp32
master weights) or in fp32 with TF32 off for --precision fp32.

    bench/gpu/torch_eager.py --config examples/models/gpt2-124m.yaml --precision bf16

--matmul-rate also times an n x n x n product (bf16 and fp32) with torch.matmul, as a check
on the rate kc measures itself.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
import torch_gpt  # noqa: E402  (it imports torch)
import torch  # noqa: E402


def matmul_rate(dtype, n: int = 8192, reps: int = 20) -> float:
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.rand(n, n, device="cuda", dtype=dtype, generator=g) * 2 - 1
    b = torch.rand(n, n, device="cuda", dtype=dtype, generator=g) * 2 - 1
    torch.matmul(a, b)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    return 2.0 * n ** 3 * reps / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="kc model YAML")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--matmul-rate", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch sees no CUDA device"}))
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = torch_gpt.load_config(args.config)
    torch.manual_seed(0)
    model = torch_gpt.GPT(cfg).cuda()
    optimizer = torch_gpt.make_optimizer(model, cfg.training)
    B, T = cfg.batch, cfg.seq_len
    g = torch.Generator(device="cuda").manual_seed(1)
    batches = [(torch.randint(0, cfg.vocab, (B, T), device="cuda", generator=g),
                torch.randint(0, cfg.vocab, (B, T), device="cuda", generator=g))
               for _ in range(4)]
    times = []
    losses = []
    for s in range(args.steps):
        inputs, targets = batches[s % len(batches)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = torch_gpt.lr_at(s, args.steps, cfg.training)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            _, loss = model(inputs, targets)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.training.grad_clip)
        float(norm)  # read back, as kc's step does with its gradient norm
        optimizer.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    measured = sorted(times[args.warmup:]) or sorted(times)
    step_s = measured[len(measured) // 2]
    out = {"framework": "pytorch-eager", "torch": torch.__version__, "model": cfg.name,
           "precision": args.precision, "batch": B, "seq_len": T, "steps": args.steps,
           "step_ms_median": step_s * 1e3, "tokens_per_s": B * T / step_s,
           "flops_per_token": cfg.flops_per_token(), "loss_first": losses[0],
           "loss_last": losses[-1], "gpu": torch.cuda.get_device_name(0),
           "max_memory_gib": torch.cuda.max_memory_allocated() / 2 ** 30}
    if args.matmul_rate:
        out["matmul_bf16_flops"] = matmul_rate(torch.bfloat16)
        out["matmul_fp32_flops"] = matmul_rate(torch.float32)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
