#!/usr/bin/python3
"""The seed's case at this machine's scale: one job over many hosts loses a host, and trains on.

Makes --hosts network namespaces on a bridge (10.215.0.0/16; the launcher in the root
namespace at 10.215.0.1), runs `kc train --hosts` there with --ranks-per-host ranks on each
(a share per host: `kc train --share`), elastic down to half its ranks, and once it has trained
--kill-at steps kills one host's share and ranks with SIGKILL: by default host 0, which holds
rank 0. From the launcher's fault log and metrics:
  - detected: the kill to the launcher taking the host's ranks for lost;
  - training again: the kill to the survivors' state restored (the "recovered" event: the
    next generation's communicator built and its state brought to the newest step a replica
    holds), and to the first step after it;
  - progress lost: steps the restored state does not hold, as a share of the run's steps; and
    the stall (the kill to training again) as a share of this run's time.
Goal (issue 23): at least 64 ranks over 16 or more hosts; kill to training again < 10 s and
< 0.5 % of the run lost (the seed: 128 devices, 90 s, < 2 %). On 2 cores, 64 ranks over 16
hosts run (about 0.4 s a step); 128 over 32 did not reach their first step in 8 minutes: the
ranks, 64 to a core, spin waiting for each other. For two hosts of gpt-tiny:
kill to training again < 3 s (--model examples/models/gpt-tiny.yaml --hosts 2 --ranks-per-host 2).
With --plan p=2,d=2 over two hosts of two, each host holds one stage of both replicas: the
lost stage comes back from the other host's in-memory copies (kc train --memory-copy-every;
`--memory-copy-every 0` for the checkpoint instead, to compare).

A benchmark, not a test: nothing is asserted; the goals are reported met or not. Needs root
(network namespaces), kc built (cmake --build build/release --target kc) and data/fortunes.
Everything it makes (namespaces, the bridge, processes) is removed when it ends, on failure and
Ctrl-C too.

    sudo bench/fault/host_loss.py                               # 64 ranks over 16 hosts
    sudo bench/fault/host_loss.py --hosts 2 --ranks-per-host 2 --model examples/models/gpt-tiny.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
KC = REPO_ROOT / "build" / "release" / "apps" / "kc" / "kc"
DATA = REPO_ROOT / "data" / "fortunes" / "manifest.json"
MICRO = """name: micro
layers: 1
hidden: 64
heads: 2
vocab: 257
seq_len: 32
batch_per_rank: 1
"""
BRIDGE = "kcbr%d" % (os.getpid() % 10000)
GOAL_S, GOAL_LOST, GOAL_TWO_HOSTS_S = 10.0, 0.005, 3.0


def sh(cmd: str) -> None:
    subprocess.run(cmd, shell=True, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def ns(i: int) -> str:
    return "kcb%d_%d" % (os.getpid() % 10000, i)


def address(i: int) -> str:  # host i; the launcher is 10.215.0.1
    n = i + 2
    return "10.215.%d.%d" % (n // 250, n % 250 + 1)


def make_network(hosts: int) -> None:
    sh(f"ip link add {BRIDGE} type bridge")
    sh(f"ip addr add 10.215.0.1/16 dev {BRIDGE}")
    sh(f"ip link set {BRIDGE} up")
    for i in range(hosts):
        a, b = "kva%d_%d" % (os.getpid() % 1000, i), "kvb%d_%d" % (os.getpid() % 1000, i)
        sh(f"ip netns add {ns(i)}")
        sh(f"ip link add {a} type veth peer name {b} netns {ns(i)}")
        sh(f"ip link set {a} master {BRIDGE} up")
        sh(f"ip -n {ns(i)} addr add {address(i)}/16 dev {b}")
        sh(f"ip -n {ns(i)} link set {b} up")
        sh(f"ip -n {ns(i)} link set lo up")


def remove_network(hosts: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave half of it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for i in range(hosts):
        subprocess.run(["ip", "netns", "del", ns(i)], stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "link", "del", "kva%d_%d" % (os.getpid() % 1000, i)],
                       stderr=subprocess.DEVNULL)
    subprocess.run(["ip", "link", "del", BRIDGE], stderr=subprocess.DEVNULL)


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def interrupted(*_) -> None:
    raise KeyboardInterrupt()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--ranks-per-host", type=int, default=4)
    ap.add_argument("--model", default="", help="a model file (default: a micro GPT)")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--kill-at", type=int, default=100, help="kill once this step is reported")
    ap.add_argument("--kill-host", type=int, default=0)
    ap.add_argument("--host-timeout", type=float, default=2.0)
    ap.add_argument("--plan", default="", help="kc train --plan (default: data-parallel)")
    ap.add_argument("--global-batch", type=int, default=0)
    ap.add_argument("--memory-copy-every", default="",
                    help="kc train --memory-copy-every (default: kc train's, auto)")
    ap.add_argument("--json", default="", help="write the figures here")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, interrupted)  # cleans up as Ctrl-C does
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    ranks = args.hosts * args.ranks_per_host
    work = Path(tempfile.mkdtemp(prefix="kc_host_loss_"))
    model = Path(args.model).resolve() if args.model else work / "micro.yaml"
    if not args.model:
        model.write_text(MICRO)
    port = 29900 + os.getpid() % 90
    flags = [str(model), "--ranks", str(ranks), "--min-ranks", str(ranks // 2), "--steps",
             str(args.steps), "--data", str(DATA), "--eval-every", "0", "--threads-per-rank",
             "1", "--checkpoint-dir", str(work / "ckpt"), "--checkpoint-every",
             str(max(1, args.steps // 4)), "--timeout", "600", "--heartbeat-timeout", "60"]
    if args.plan:
        flags += ["--plan", args.plan]
    if args.global_batch:
        flags += ["--global-batch", str(args.global_batch)]
    if args.memory_copy_every:
        flags += ["--memory-copy-every", args.memory_copy_every]
    procs: list[subprocess.Popen] = []
    try:
        make_network(args.hosts)
        hosts = ",".join("h%d:%d" % (i, args.ranks_per_host) for i in range(args.hosts))
        out = work / "out"
        launcher = subprocess.Popen(
            [str(KC), "train", *flags, "--hosts", hosts, "--listen", "10.215.0.1:%d" % port,
             "--host-timeout", str(args.host_timeout), "--progress", "none", "--out", str(out)],
            stdout=subprocess.DEVNULL, stderr=open(work / "launcher.err", "w"),
            start_new_session=True)
        procs.append(launcher)
        shares = []
        for i in range(args.hosts):
            shares.append(subprocess.Popen(
                ["ip", "netns", "exec", ns(i), str(KC), "train", *flags, "--share", "h%d" % i,
                 "--rendezvous", "10.215.0.1:%d" % port],
                stdout=subprocess.DEVNULL, stderr=open(work / ("share%d.err" % i), "w"),
                start_new_session=True))
        procs.extend(shares)
        metrics = out / "metrics.jsonl"
        started = time.time()
        while launcher.poll() is None:
            steps = [r for r in read_jsonl(metrics) if r.get("type") == "step"]
            if steps and steps[-1]["step"] >= args.kill_at:
                break
            time.sleep(0.05)
        first_step_at = started
        killed_at = time.time()
        victim = shares[args.kill_host]
        os.killpg(victim.pid, signal.SIGKILL)
        launcher.wait(timeout=3600)
        ended = time.time()
        faults = read_jsonl(out / "faults.jsonl")
        steps = [r for r in read_jsonl(metrics) if r.get("type") == "step"]
        recovered = [f for f in faults if f.get("event") == "recovered"]
        detected = [f for f in faults if f.get("event") == "detected"]
        if launcher.returncode != 0 or not recovered:
            print((work / "launcher.err").read_text()[-3000:], file=sys.stderr)
            print("the run did not recover (exit %s)" % launcher.returncode, file=sys.stderr)
            return 1
        r = recovered[0]
        detected_s = detected[0]["time_unix"] - killed_at
        restored_s = r["time_unix"] - killed_at
        # The first step the next generation finished (its record's time is when rank 0 said it).
        step_after = next((s for s in steps if s.get("time_unix", 0) > r["time_unix"]), None)
        first_step_s = (step_after["time_unix"] - killed_at) if step_after else float("nan")
        run_s = ended - first_step_at
        steps_lost = r.get("steps_lost", 0)
        fig = {
            "ranks": ranks, "hosts": args.hosts, "model": model.name, "steps": args.steps,
            "plan": args.plan, "memory_copy_every": args.memory_copy_every,
            "killed_host": args.kill_host, "killed_ranks": args.ranks_per_host,
            "generation_ranks": r["ranks"], "source": r["source"],
            "detected_s": round(detected_s, 3), "training_again_s": round(restored_s, 3),
            "first_step_after_s": round(first_step_s, 3),
            "rebuild_s": round(r.get("rebuild_s", 0), 3), "steps_lost": steps_lost,
            "steps_lost_share": steps_lost / args.steps,
            "time_lost_share": restored_s / run_s, "run_s": round(run_s, 1),
        }
        goal = GOAL_TWO_HOSTS_S if args.hosts == 2 else GOAL_S
        print(f"{ranks} ranks over {args.hosts} hosts ({model.name}), host {args.kill_host} "
              f"({args.ranks_per_host} ranks, rank 0's: {args.kill_host == 0}) killed at step "
              f"{args.kill_at}:")
        print(f"  detected after        {detected_s:.2f} s (--host-timeout {args.host_timeout})")
        print(f"  training again after  {restored_s:.2f} s ({r['ranks']} ranks, state from "
              f"{r['source']}; rebuild {r.get('rebuild_s', 0):.2f} s); first step done "
              f"{fig['first_step_after_s']:.2f} s  (goal < {goal:.0f} s: "
              f"{'met' if fig['first_step_after_s'] < goal else 'NOT met'})")
        print(f"  progress lost         {steps_lost} steps ({100 * fig['steps_lost_share']:.2f} % "
              f"of {args.steps}; goal < 0.5 %: "
              f"{'met' if fig['steps_lost_share'] < GOAL_LOST else 'NOT met'}); the stall was "
              f"{100 * fig['time_lost_share']:.2f} % of this {run_s:.0f} s run")
        if args.json:
            Path(args.json).write_text(json.dumps(fig) + "\n")
        return 0
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        remove_network(args.hosts)


if __name__ == "__main__":
    sys.exit(main())
