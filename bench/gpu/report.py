#!/usr/bin/env python3
"""The table of bench/gpu/run.sh: reads what the run left in DIR and prints the figures.

    bench/gpu/report.py DIR [--tolerance 1e-3]

DIR holds kc's runs (small-cpu, small-fp32, small-bf16, gpt2-bf16, each with metrics.jsonl),
PyTorch's results (torch-*.json) and the GPU tests' logs. Writes DIR/summary.json. Exit status
1 when the fp32 losses differ from the CPU engine's by more than the tolerance or a test
failed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def metrics(path: Path) -> tuple[list[dict], dict | None]:
    steps, summary = [], None
    if not path.is_file():
        return steps, summary
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("type") == "step":
            steps.append(rec)
        elif rec.get("type") == "summary":
            summary = rec
    steps.sort(key=lambda r: r["step"])
    return steps, summary


def torch_result(path: Path) -> dict | None:
    if not path.is_file():
        return None
    for line in reversed(path.read_text().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return None


def test_result(path: Path) -> str:
    if not path.is_file():
        return "not run"
    text = path.read_text()
    passed = [l for l in text.splitlines() if "[  PASSED  ]" in l]
    failed = [l for l in text.splitlines() if "[  FAILED  ]" in l and "listed below" not in l]
    skipped = [l for l in text.splitlines() if "[  SKIPPED ]" in l]
    if failed:
        return f"FAILED ({len(failed)} lines: {failed[0].strip()})"
    if passed:
        return passed[-1].replace("[  PASSED  ]", "").strip() + (
            f", {len(skipped)} skipped" if skipped else "")
    return "no result (crashed?)"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--tolerance", type=float, default=1e-3)
    args = ap.parse_args()
    d = Path(args.dir)
    out: dict = {"tests": {}, "losses": [], "throughput": []}
    ok = True
    for name in ("kernels", "gpt"):
        r = test_result(d / f"test-{name}.txt")
        out["tests"][name] = r
        ok &= not r.startswith("FAILED") and not r.startswith("no result")
        print(f"gpu tests ({name}): {r}")

    cpu, _ = metrics(d / "small-cpu" / "metrics.jsonl")
    gpu, gpu_summary = metrics(d / "small-fp32" / "metrics.jsonl")
    worst = None
    if cpu and gpu:
        print("\ngpt-small fp32, the first steps: kc on the CPU vs kc on the GPU")
        print(f"{'step':>4}  {'cpu loss':>10}  {'cuda loss':>10}  {'rel diff':>9}")
        for c, g in zip(cpu, gpu):
            rel = abs(g["loss"] - c["loss"]) / abs(c["loss"])
            worst = rel if worst is None else max(worst, rel)
            out["losses"].append({"step": c["step"], "cpu": c["loss"], "cuda": g["loss"], "rel": rel})
            print(f"{c['step']:>4}  {c['loss']:>10.6f}  {g['loss']:>10.6f}  {rel:>9.2e}")
        print(f"worst relative difference {worst:.2e} (tolerance {args.tolerance:g}); "
              f"the CUDA run went on to step {gpu[-1]['step']}, loss {gpu[-1]['loss']:.4f}")
        ok &= worst <= args.tolerance
    else:
        print("\ngpt-small fp32 loss comparison: a run is missing")
        ok = False
    out["worst_loss_rel_diff"] = worst

    print(f"\n{'model':<10} {'precision':<9} {'kc tok/s':>12} {'torch tok/s':>12} {'kc/torch':>9} "
          f"{'kc MFU':>7} {'kc step ms':>10} {'torch ms':>9}")
    for model, run in (("gpt-small", "small"), ("gpt2-124m", "gpt2")):
        for precision in ("bf16", "fp32"):
            _, s = metrics(d / f"{run}-{precision}" / "metrics.jsonl")
            t = torch_result(d / f"torch-{run}-{precision}.json")
            if s is None and t is None:
                continue
            kc_tps = s["tokens_per_s"] if s else None
            t_tps = t.get("tokens_per_s") if t else None
            ratio = kc_tps / t_tps if kc_tps and t_tps else None
            row = {"model": model, "precision": precision, "kc_tokens_per_s": kc_tps,
                   "torch_tokens_per_s": t_tps, "ratio": ratio,
                   "kc_mfu": s.get("mfu") if s else None,
                   "kc_gpu_flops": s.get("gpu_flops") if s else None,
                   "kc_step_ms": s.get("step_ms") if s else None,
                   "torch_step_ms": t.get("step_ms_median") if t else None}
            out["throughput"].append(row)
            fmt = lambda v, f: format(v, f) if v is not None else "-"
            print(f"{model:<10} {precision:<9} {fmt(kc_tps, '12.0f')} {fmt(t_tps, '12.0f')} "
                  f"{fmt(ratio, '9.2f')} {fmt(row['kc_mfu'] and 100 * row['kc_mfu'], '6.1f')}% "
                  f"{fmt(row['kc_step_ms'], '10.2f')} {fmt(row['torch_step_ms'], '9.2f')}")
    peaks = [r["kc_gpu_flops"] for r in out["throughput"] if r.get("kc_gpu_flops")]
    rate = next((r for r in (torch_result(p) for p in sorted(d.glob("torch-*.json")))
                 if r and r.get("matmul_bf16_flops")), None)
    if rate:
        out["torch_matmul_bf16_flops"] = rate.get("matmul_bf16_flops")
        print(f"\nmatrix rate (8192^3): kc bf16 {max(peaks) / 1e12 if peaks else 0:.0f} TFLOP/s, "
              f"torch.matmul bf16 {rate.get('matmul_bf16_flops', 0) / 1e12:.0f} TFLOP/s, fp32 "
              f"{rate.get('matmul_fp32_flops', 0) / 1e12:.0f} TFLOP/s")
    (d / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
    print("\nresult:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
