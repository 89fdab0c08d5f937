#!/usr/bin/env python3
"""Writes the decision-latency trace: a cluster filled by long jobs, then a burst of
arrivals that leaves thousands of jobs queued while running jobs keep ending.

  bench/sched/burst_trace.py --devices 10000 --fill-hours 48 --queued 6000 > burst.csv

Fillers: jobs of 8 devices (one host) covering every device, each running 1 to
--fill-hours hours (uniform). Burst: --queued jobs arriving uniformly over the first hour,
sizes 1, 2, 4, 8, 16 or 32 devices (weights 60/10/10/10/5/5), 1-24 h, 5% high, 30%
preemptible, two thirds of the multi-device ones elastic down to half.
"""
import argparse
import random


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=10000)
    ap.add_argument("--host", type=int, default=8)
    ap.add_argument("--fill-hours", type=float, default=48)
    ap.add_argument("--queued", type=int, default=6000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    print("submit_s,job,team,user,class,min_devices,max_devices,duration_s")
    for i in range(a.devices // a.host):
        team = f"team{i % 6}"
        dur = rng.uniform(3600, a.fill_hours * 3600)
        print(f"0,fill{i},{team},{team}-u0,normal,{a.host},{a.host},{dur:.0f}")
    sizes = [1, 2, 4, 8, 16, 32]
    weights = [60, 10, 10, 10, 5, 5]
    for i in range(a.queued):
        size = rng.choices(sizes, weights)[0]
        c = rng.random()
        cls = "high" if c < 0.05 else "preemptible" if c < 0.35 else "normal"
        lo = size // 2 if size > 1 and rng.random() < 2 / 3 else size
        team = f"team{rng.randrange(6)}"
        user = f"{team}-u{rng.randrange(3)}"
        t = rng.uniform(1, 3600)
        dur = rng.uniform(3600, 24 * 3600)
        print(f"{t:.3f},burst{i},{team},{user},{cls},{lo},{size},{dur:.0f}")


if __name__ == "__main__":
    main()
