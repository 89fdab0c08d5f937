#!/usr/bin/python3
"""Submit -> running for a 2-rank job on `kc up`, and where the time goes.

Starts `kc up` (kcd and one agent, 2 CPU devices) in a temporary directory, then submits the
same 2-rank job --jobs times, one after another, and times each from the moment `kc submit`
is started:

- submit:    `kc submit` started -> kcd recorded the job (pending): the kc process, TLS,
             the bearer token check, the submit-time permission and quota checks, the commit;
- plan:      pending -> queued: the L3 planner on the cluster's devices;
- dispatch:  queued -> running: the scheduler's decision (the schedule-time check), the
             start order waiting for the agent's next heartbeat, the execution-time check,
             fork, and the agent's report of the start (sent at once);
- launch:    running -> `kc train` wrote its first metrics record (exec, the launcher's start);
- workers:   first record -> the workers' first record (processes, rendezvous, engine, data);
- step:      -> the first training step completed.

Job phases come from `kc job show --json` (kcd's clock); the metrics records have no clock,
so the script watches the run's metrics.jsonl every few milliseconds and notes when each
record appears. The baseline, in the same run: the same model run directly by `kc train`
(no kcd), from its start to its first step, timed the same way.

    bench/api/submit_to_running.py                 # about a minute
    bench/api/submit_to_running.py --jobs 10 --json out.json

Needs a built kc (cmake --workflow --preset release). Prepares a small corpus of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = REPO_ROOT / "examples" / "models" / "gpt-tiny.yaml"
POLL_S = 0.002


def run(cmd: list[str], env: dict[str, str]) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"submit_to_running: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    return p.stdout


def prepare_corpus(kc: str, tmp: Path, env: dict[str, str]) -> Path:
    words = "the quick brown fox jumps over a lazy dog".split()
    lines = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) for i in range(4000)]
    corpus = tmp / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n")
    run([kc, "data", "prepare", "--out", str(tmp / "data" / "fortunes"), str(corpus)], env)
    return tmp / "data"


def watch(metrics: Path, deadline: float, stop: list[str]) -> dict[str, float]:
    """Wall times at which the first record of each type appeared, until one of `stop`."""
    seen: dict[str, float] = {}
    offset = 0
    while time.time() < deadline:
        if metrics.exists():
            with metrics.open() as f:
                f.seek(offset)
                chunk = f.read()
            now = time.time()
            complete = chunk[: chunk.rfind("\n") + 1]
            offset += len(complete.encode())
            for line in complete.splitlines():
                kind = json.loads(line).get("type", "")
                seen.setdefault(kind, now)
            if any(s in seen for s in stop):
                return seen
        time.sleep(POLL_S)
    sys.exit(f"submit_to_running: {metrics} never showed {stop}: {sorted(seen)}")


def baseline(kc: str, data: Path, out: Path, env: dict[str, str]) -> dict[str, float]:
    metrics = out / "metrics.jsonl"
    start = time.time()
    p = subprocess.Popen([kc, "train", str(MODEL), "--ranks", "2", "--steps", "2", "--out",
                          str(out), "--progress", "none", "--data",
                          str(data / "fortunes" / "manifest.json")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    seen = watch(metrics, start + 120, ["step"])
    _, err = p.communicate()
    if p.returncode != 0:
        sys.exit(f"submit_to_running: kc train failed:\n{err}")
    return {"launch": seen["run"] - start, "workers": seen["start"] - seen["run"],
            "step": seen["step"] - seen["start"], "total": seen["step"] - start}


def one_job(kc: str, job_file: Path, cluster: Path, env: dict[str, str]) -> dict[str, float]:
    start = time.time()
    job = json.loads(run([kc, "submit", str(job_file), "--json"], env))
    job_id = int(job["id"])
    # Its first run's directory (run numbers count the cluster's runs).
    job_dir = cluster / "work" / "jobs" / str(job_id)
    while not list(job_dir.glob("run-*")):
        if time.time() > start + 120:
            sys.exit(f"submit_to_running: job {job_id} never started")
        time.sleep(POLL_S)
    seen = watch(next(job_dir.glob("run-*")) / "metrics.jsonl", start + 120, ["step"])
    # The job is short: wait for its end so the next one finds the devices free.
    shown = json.loads(run([kc, "job", "wait", str(job_id), "--json", "--timeout", "120"], env))
    at = {e["phase"]: float(e["time_s"]) for e in shown["history"]}
    return {
        "submit": at["pending"] - start,
        "plan": at["queued"] - at["pending"],
        "dispatch": at["running"] - at["queued"],
        "launch": seen["run"] - at["running"],
        "workers": seen["start"] - seen["run"],
        "step": seen["step"] - seen["start"],
        "submit_to_running": at["running"] - start,
        "submit_to_first_step": seen["step"] - start,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kc", default=str(REPO_ROOT / "build" / "release" / "apps" / "kc" / "kc"))
    ap.add_argument("--jobs", type=int, default=5, help="jobs to time (the median is reported)")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    if not os.access(args.kc, os.X_OK):
        sys.exit(f"submit_to_running: --kc {args.kc}: not built (cmake --workflow --preset "
                 "release)")
    with tempfile.TemporaryDirectory(prefix="kc_submit_bench_") as t:
        tmp = Path(t)
        env = dict(os.environ, XDG_CONFIG_HOME=str(tmp / "config"))
        data = prepare_corpus(args.kc, tmp, env)
        base = [baseline(args.kc, data, tmp / f"baseline-{i}", env) for i in range(3)]
        cluster = tmp / "cluster"
        up = subprocess.Popen([args.kc, "up", "--dir", str(cluster), "--listen", "127.0.0.1:0",
                               "--devices", "2", "--data-root", str(data)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env)
        try:
            for line in up.stdout:
                if line.startswith("kc up: kcd on"):
                    break
            else:
                sys.exit("submit_to_running: kc up ended before it served")
            job_file = tmp / "job.yaml"
            job_file.write_text(f"name: bench\nmodel: {MODEL}\nranks: 2\nsteps: 2\n")
            jobs = [one_job(args.kc, job_file, cluster, env) for _ in range(args.jobs)]
        finally:
            up.send_signal(signal.SIGTERM)
            up.communicate(timeout=60)

    def median(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    result = {k: median(jobs, k) for k in jobs[0]}
    result["baseline"] = {k: median(base, k) for k in base[0]}
    result["jobs"] = args.jobs
    b = result["baseline"]
    def ms(key: str, base: str = "") -> str:
        line = f"{result[key] * 1e3:8.1f} ms"
        return line + (f"   (kc train alone {b[base] * 1e3:.1f} ms)" if base else "")

    print(f"submit -> running, a 2-rank gpt-tiny job on kc up (median of {args.jobs})")
    print(f"  submit    kc submit -> pending                {ms('submit')}")
    print(f"  plan      pending -> queued                   {ms('plan')}")
    print(f"  dispatch  queued -> running                   {ms('dispatch')}")
    print(f"  = submit -> running                           {ms('submit_to_running')}")
    print(f"  launch    running -> kc train up              {ms('launch', 'launch')}")
    print(f"  workers   kc train up -> workers ready        {ms('workers', 'workers')}")
    print(f"  step      workers ready -> first step done    {ms('step', 'step')}")
    print(f"  = submit -> first step                        {ms('submit_to_first_step', 'total')}"
          f"; ratio {result['submit_to_first_step'] / b['total']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
