#!/usr/bin/env python3
"""Runs the layer-guard benchmark and prints the guard's cost per call over the unguarded
baseline measured in the same run.

Usage: bench/base/guard_overhead.py [BUILD_DIR]   (default build/release)
"""
import json
import subprocess
import sys

build = sys.argv[1] if len(sys.argv) > 1 else "build/release"
out = subprocess.run(
    [f"{build}/bench/base/kc_layer_guard_bench", "--benchmark_format=json",
     "--benchmark_repetitions=5", "--benchmark_report_aggregates_only=true"],
    check=True, capture_output=True, text=True).stdout
rows = {b["name"]: b for b in json.loads(out)["benchmarks"]}
base = rows["BM_Baseline_median"]["cpu_time"]
print(f"baseline call            {base:6.2f} ns (median of 5)")
for name in ("BM_Guarded", "BM_GuardedBlocking"):
    t = rows[f"{name}_median"]["cpu_time"]
    print(f"{name[3:]:<24} {t:6.2f} ns   guard cost {t - base:+6.2f} ns per call"
          f"  ({'meets' if t - base < 20 else 'MISSES'} the < 20 ns bar)")
