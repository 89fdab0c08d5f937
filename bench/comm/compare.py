#!/usr/bin/env python3
"""Runs `kc bench comm` and the same collectives with Open MPI and Gloo (Debian packages) in
one session, interleaved, and prints ours/theirs ratios. See bench/comm/README.md.

Usage: bench/comm/compare.py [--only openmpi,gloo,kc] [--ranks 2,4] [--sizes 4K,1M,64M]
           [--ops allreduce] [--reps 3] [--stat median|best] [--iters N --warmup W]
           [--kc build/release/apps/kc/kc] [--build-dir build/bench-baselines]
           [--skip-install] [--json-out FILE]
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGES = ["libopenmpi-dev", "openmpi-bin", "libgloo-dev"]
OPS = ["allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"]
GLOO_OPS = {"allreduce", "allgather", "broadcast", "reduce"}  # What gloo_bench implements.
SMALL_BYTES = 64 << 10  # Sizes up to this get a latency ratio.
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# Every program (ours and the baselines) runs with glibc's mmap threshold raised, so large
# temporary buffers are reused from the heap instead of being mapped fresh per call. On VMs
# whose fresh pages are slow to fault in (this one: Open MPI's 64 MiB all-reduce drops from
# ~3 GB/s to ~0.2 GB/s without it) the per-call page faults would otherwise dominate.
# --no-malloc-tunable measures the defaults instead.
MALLOC_ENV = {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=4294967296"}


def log(msg):
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


def parse_size(s):
    s = s.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
    return int(s[:-1] if mult != 1 else s) * mult


def fmt_size(n):
    for unit, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{unit}"
    return str(n)


def default_iters(size_bytes):
    """(iters, warmup) when --iters is not given: enough iterations that a small size is
    not a handful of microseconds, few enough that 64M stays within the time budget."""
    if size_bytes <= SMALL_BYTES:
        return 200, 20
    if size_bytes <= (4 << 20):
        return 50, 5
    return 5, 1


# ---------------------------------------------------------------------------------------
# Setup: packages and the two baseline programs.

def ensure_packages():
    missing = []
    for pkg in PACKAGES:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg],
                           capture_output=True, text=True)
        if r.returncode != 0 or "install ok installed" not in r.stdout:
            missing.append(pkg)
    if not missing:
        return
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    log(f"installing {' '.join(missing)}")
    cmd = sudo + ["apt-get", "install", "-y", "--no-install-recommends"] + missing
    if subprocess.run(cmd, env=env).returncode != 0:
        subprocess.run(sudo + ["apt-get", "update"], env=env, check=True)
        subprocess.run(cmd, env=env, check=True)


def build_one(out, src, cmd):
    if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(src):
        return
    log(f"building {os.path.relpath(out)}")
    subprocess.run(cmd, check=True)


def build_baselines(build_dir, need_mpi, need_gloo):
    os.makedirs(build_dir, exist_ok=True)
    src = os.path.join(HERE, "baselines")
    bins = {}
    if need_mpi:
        out = os.path.join(build_dir, "mpi_bench")
        cc = os.path.join(src, "mpi_bench.cc")
        build_one(out, cc, ["mpicxx", "-std=c++20", "-O2", "-DOMPI_SKIP_MPICXX", "-o", out, cc])
        bins["openmpi"] = out
    if need_gloo:
        out = os.path.join(build_dir, "gloo_bench")
        cc = os.path.join(src, "gloo_bench.cc")
        build_one(out, cc, ["c++", "-std=c++20", "-O2", "-o", out, cc, "-lgloo", "-pthread"])
        bins["gloo"] = out
    return bins


def versions():
    v = {}
    r = subprocess.run(["mpirun", "--version"], capture_output=True, text=True)
    if r.returncode == 0 and r.stdout:
        v["openmpi"] = r.stdout.splitlines()[0].strip()
    r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libgloo-dev"],
                       capture_output=True, text=True)
    if r.returncode == 0:
        v["gloo"] = "libgloo-dev " + r.stdout.strip()
    return v


def detect_mpi_stack(mpi_bench):
    """Which PML and BTL Open MPI picks here by default, from one tiny verbose run."""
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
           "--mca", "pml_base_verbose", "10", "--mca", "btl_base_verbose", "10",
           mpi_bench, "--sizes", "4", "--iters", "1", "--warmup", "0"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **MPI_ENV))
    text = r.stdout + r.stderr
    pml = sorted(set(re.findall(r"selected (\w+) best priority", text)))
    btl = sorted(set(re.findall(r"Using (\w+) btl for send to", text)) - {"self"})
    copy = ""
    if "vader" in btl:
        q = subprocess.run(["ompi_info", "--param", "btl", "vader", "--level", "9"],
                           capture_output=True, text=True)
        m = re.search(r'single_copy_mechanism" \(current value: "(\w+)"', q.stdout)
        copy = f" (single copy: {m.group(1)})" if m else ""
    return (f"pml {','.join(pml) or '?'}, btl {','.join(btl) or '?'}{copy}, "
            "collectives: Open MPI defaults")


# ---------------------------------------------------------------------------------------
# Running one configuration.

class Config:
    """One thing to measure: an implementation plus its transport/buffers knobs."""

    def __init__(self, impl, transport, buffers):
        self.impl, self.transport, self.buffers = impl, transport, buffers
        self.unavailable = None  # Reason string once a run has failed.

    @property
    def name(self):
        return f"{self.impl}/{self.transport}/{self.buffers}"


def command(cfg, args, bins, ranks, op, size, iters, warmup, gloo_algos=""):
    s = str(size)
    if cfg.impl == "openmpi":
        forward = ["-x", "GLIBC_TUNABLES"] if "GLIBC_TUNABLES" in MPI_ENV else []
        return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)] + forward + [
                bins["openmpi"], "--op", op, "--sizes", s, "--iters", str(iters),
                "--warmup", str(warmup),
                "--buffers", "alloc" if cfg.buffers == "registered" else "user"]
    if cfg.impl == "gloo":
        cmd = [bins["gloo"], "--ranks", str(ranks), "--op", op, "--sizes", s,
               "--iters", str(iters), "--warmup", str(warmup)]
        algos = gloo_algos or args.gloo_algos
        if algos and op == "allreduce":
            cmd += ["--algos", algos]
        return cmd
    wire = []
    if cfg.transport == "wire":
        # The links' limit between the same ranks: plain sockets streaming around the ring
        # (kc bench comm --op wire); its busbw is a ring all-reduce's ceiling.
        op, transport = "wire", "tcp"
    elif cfg.transport == "tcp-bf16":
        # kc's optional bf16 wire (--wire bf16): f32 sums sent as bf16, half the bytes.
        transport, wire = "tcp", ["--wire", "bf16"]
    else:
        transport = cfg.transport
    return [args.kc, "bench", "comm", "--ranks", str(ranks), "--sizes", s, "--op", op,
            "--transport", transport, "--buffers", cfg.buffers, "--iters", str(iters),
            "--warmup", str(warmup), "--format", "json"] + wire


def run_json_lines(cmd, timeout_s):
    """Runs cmd in its own process group; returns (rows, error string or None)."""
    env = dict(os.environ, **MPI_ENV)
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env, start_new_session=True)
    except OSError as e:
        return [], f"cannot start {cmd[0]}: {e}"
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # The group we created for this child.
        p.communicate()
        return [], f"timed out after {timeout_s}s: {' '.join(cmd)}"
    rows = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    if p.returncode != 0:
        tail = " | ".join(err.strip().splitlines()[-3:])
        return rows, f"exit {p.returncode}: {tail}"
    if not rows:
        return rows, "no JSON lines on stdout"
    return rows, None


# ---------------------------------------------------------------------------------------
# Aggregation and printing.

def bus_factor(op, n):
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op in ("reduce_scatter", "allgather"):
        return (n - 1) / n
    return 1.0


def screened(samples, n, op, size, keep):
    """Comma list of the `keep` fastest Gloo algorithms in the first repetition."""
    first = [(rows[0]["time_us"], key[6]) for key, rows in samples.items()
             if key[:4] == ("gloo", op, n, size) and rows and rows[0].get("rep") == 0]
    return ",".join(a for _, a in sorted(first)[:keep])


def aggregate(samples, stat):
    """samples: {key: [row, ...]} -> {key: row} with time from the median (or min) of the
    repetitions and algbw/busbw recomputed from that time."""
    out = {}
    for key, rows in samples.items():
        times = [r["time_us"] for r in rows]
        t = min(times) if stat == "best" else statistics.median(times)
        r = dict(rows[0])
        r["time_us"] = t
        r["algbw"] = r["size"] / (t * 1e-6) / 1e9 if t > 0 else 0.0
        r["busbw"] = r["algbw"] * bus_factor(r["op"], r["ranks"])
        r["reps"] = len(times)
        r["spread_pct"] = 100.0 * (max(times) - min(times)) / t if t > 0 else 0.0
        out[key] = r
    return out


def ratio(a, b):
    return f"{a / b:6.2f}x" if a is not None and b else "    -  "


def cell(v, spec):
    """v formatted with spec ("9.3f"), or a right-aligned "-" of the same width."""
    return format(v, spec) if v is not None else format("-", ">" + spec.split(".")[0])


def print_tables(agg, args, kc_state, vers, load):
    ops, ranks_list, sizes = args.ops, args.ranks, args.sizes

    def get(impl, op, n, size, transport=None, buffers=None, algo=None):
        for (i, o, r, s, t, b, a), row in agg.items():
            if (i, o, r, s) == (impl, op, n, size) and \
                    (transport is None or t == transport) and \
                    (buffers is None or b == buffers) and (algo is None or a == algo):
                return row
        return None

    def gloo_best(op, n, size):
        rows = [row for (i, o, r, s, _, _, _), row in agg.items()
                if (i, o, r, s) == ("gloo", op, n, size)]
        return min(rows, key=lambda r: r["time_us"]) if rows else None

    stat = "median" if args.stat == "median" else "best"
    print(f"\n# kc bench comm vs baselines ({stat} of {args.reps} interleaved repetitions)")
    for k in ("openmpi", "gloo"):
        if k in vers:
            print(f"#   {k}: {vers[k]}")
    if "mpi_stack" in vers:
        print(f"#   Open MPI in use: {vers['mpi_stack']}")
    if "gloo" in vers:
        print("#   Gloo: transport tcp on 127.0.0.1, user buffers")
    print("#   malloc: " + (MPI_ENV.get("GLIBC_TUNABLES", "glibc defaults") +
                             " for every program (see MALLOC_ENV in compare.py)"))
    print(f"#   kc: {kc_state}")
    print(f"#   load average during runs: min {min(load):.1f} max {max(load):.1f} "
          f"on {os.cpu_count()} cpus" + ("  (NOISY: load > cpus)" if max(load) > os.cpu_count()
                                         else ""))
    print("#   busbw in GB/s (nccl-tests definition); ratios are kc / baseline:"
          " busbw ratio > 1 and time ratio < 1 mean kc is faster")

    print("\n## Shared memory: kc --transport shm vs Open MPI (same buffers kind)")
    hdr = (f"{'op':<15}{'ranks':>5} {'size':>6}  {'kc shm/buffers':<16}{'kc busbw':>9}"
           f"{'ompi busbw':>11}{'bw ratio':>9}{'kc us':>10}{'ompi us':>10}{'time ratio':>11}")
    print(hdr)
    for op in ops:
        for n in ranks_list:
            for size in sizes:
                for buffers in ("user", "registered"):
                    kc = get("kc", op, n, size, "shm", buffers)
                    mpi = get("openmpi", op, n, size, "shm", buffers)
                    if kc is None and mpi is None:
                        continue
                    small = size <= SMALL_BYTES
                    print(f"{op:<15}{n:>5} {fmt_size(size):>6}  {'shm/' + buffers:<16}"
                          f"{cell(kc and kc['busbw'], '9.3f')}"
                          f"{cell(mpi and mpi['busbw'], '11.3f')}"
                          f"{ratio(kc and kc['busbw'], mpi and mpi['busbw']):>9}"
                          f"{cell(kc and kc['time_us'], '10.1f')}"
                          f"{cell(mpi and mpi['time_us'], '10.1f')}"
                          + (f"{ratio(kc and kc['time_us'], mpi and mpi['time_us']):>11}"
                             if small else f"{'':>11}"))

    print("\n## TCP: kc --transport tcp vs Gloo's best allreduce algorithm (loopback), and vs "
          "the wire (plain sockets streaming around the same ring: kc bench comm --op wire)")
    print(f"{'op':<15}{'ranks':>5} {'size':>6}  {'gloo best':<18}{'kc busbw':>9}"
          f"{'gloo busbw':>11}{'bw ratio':>9}{'kc us':>10}{'gloo us':>10}{'time ratio':>11}"
          f"{'wire busbw':>11}{'kc/wire':>8}{'gloo/wire':>10}"
          + (f"{'bf16 busbw':>11}{'bf16/gloo':>10}" if args.kc_bf16 else ""))
    for op in ops:
        for n in ranks_list:
            for size in sizes:
                kc = get("kc", op, n, size, "tcp", "user")
                g = gloo_best(op, n, size)
                if kc is None and g is None:
                    continue
                w = get("kc", "wire", n, size, "tcp", "user") if op == "allreduce" else None
                small = size <= SMALL_BYTES
                b = get("kc", op, n, size, "tcp-bf16", "user") if op == "allreduce" else None
                print(f"{op:<15}{n:>5} {fmt_size(size):>6}  {(g['algo'] if g else '-'):<18}"
                      f"{cell(kc and kc['busbw'], '9.3f')}{cell(g and g['busbw'], '11.3f')}"
                      f"{ratio(kc and kc['busbw'], g and g['busbw']):>9}"
                      f"{cell(kc and kc['time_us'], '10.1f')}{cell(g and g['time_us'], '10.1f')}"
                      + (f"{ratio(kc and kc['time_us'], g and g['time_us']):>11}"
                         if small else f"{'':>11}")
                      + f"{cell(w and w['busbw'], '11.3f')}"
                      f"{ratio(kc and kc['busbw'], w and w['busbw']):>8}"
                      f"{ratio(g and g['busbw'], w and w['busbw']):>10}"
                      + (f"{cell(b['busbw'], '11.3f')}{ratio(b['busbw'], g and g['busbw']):>10}"
                         if b else ""))

    algos = sorted({a for (i, _, _, _, _, _, a) in agg if i == "gloo"})
    if algos:
        print("\n## Gloo algorithms (tcp, user buffers): busbw GB/s / time us, * = best, "
              "! = too slow, timed from the single validation call")
        print(f"{'op':<15}{'ranks':>5} {'size':>6}  " +
              "".join(f"{a:>24}" for a in algos))
        for op in ops:
            for n in ranks_list:
                for size in sizes:
                    best = gloo_best(op, n, size)
                    if best is None:
                        continue
                    cells = []
                    for a in algos:
                        r = get("gloo", op, n, size, algo=a)
                        if r is None:
                            cells.append(f"{'-':>24}")
                            continue
                        mark = "*" if r is best else ("!" if r.get("iters") == 0 else " ")
                        cells.append(f"{r['busbw']:>9.3f} / {r['time_us']:>10.1f}{mark}")
                    print(f"{op:<15}{n:>5} {fmt_size(size):>6}  " + "".join(cells))

    noisy = [r for r in agg.values() if r["spread_pct"] > 25 and r["reps"] > 1]
    if noisy:
        print(f"\n# {len(noisy)} measurement(s) varied by more than 25% between repetitions "
              "(see spread_pct in --json-out); treat those ratios with care.")


# ---------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kc", default="build/release/apps/kc/kc", help="kc binary")
    ap.add_argument("--ranks", default="2,4", help="comma list of rank counts")
    ap.add_argument("--sizes", default="4K,1M,64M", help="comma list of bytes, K/M/G suffixes")
    ap.add_argument("--ops", default="allreduce", help=f"comma list of {','.join(OPS)}")
    ap.add_argument("--iters", type=int, help="timed iterations (default: by size, "
                    "200 up to 64K, 50 up to 4M, 5 above)")
    ap.add_argument("--warmup", type=int, help="untimed iterations first (default: by size)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions (default 3)")
    ap.add_argument("--stat", choices=["median", "best"], default="median",
                    help="how repetitions are combined (default median)")
    ap.add_argument("--build-dir", default="build/bench-baselines")
    ap.add_argument("--skip-install", action="store_true",
                    help="do not check or apt-get install Open MPI and Gloo")
    ap.add_argument("--only", default="openmpi,gloo,kc", help="subset of openmpi,gloo,kc")
    ap.add_argument("--kc-bf16", action="store_true",
                    help="also kc's all-reduce with the bf16 wire (--wire bf16), in the TCP table")
    ap.add_argument("--gloo-algos", default="",
                    help="gloo allreduce algorithms (default all: ring,ring_chunked,"
                    "halving_doubling,bcube,new_ring,new_bcube)")
    ap.add_argument("--gloo-screen", type=int, default=2,
                    help="after the first repetition, run only the N fastest Gloo allreduce "
                    "algorithms of that repetition per (ranks, size); 0 = all every time "
                    "(default 2)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per program run")
    ap.add_argument("--json-out", help="write every sample and the aggregated rows here")
    ap.add_argument("--no-malloc-tunable", action="store_true",
                    help="run every program with glibc's default mmap threshold")
    args = ap.parse_args()
    if not args.no_malloc_tunable:
        MPI_ENV.update(MALLOC_ENV)  # the environment of every program run below
    args.ranks = [int(x) for x in args.ranks.split(",") if x]
    args.sizes = [parse_size(x) for x in args.sizes.split(",") if x]
    args.ops = [x for x in args.ops.split(",") if x]
    only = {x for x in args.only.split(",") if x}
    for op in args.ops:
        if op not in OPS:
            ap.error(f"unknown op {op}")
    if not only <= {"openmpi", "gloo", "kc"}:
        ap.error("--only takes openmpi, gloo, kc")
    if args.reps < 1:
        ap.error("--reps must be >= 1")

    need_mpi, need_gloo = "openmpi" in only, "gloo" in only
    if (need_mpi or need_gloo) and not args.skip_install:
        ensure_packages()
    bins = build_baselines(args.build_dir, need_mpi, need_gloo)
    vers = versions() if (need_mpi or need_gloo) else {}
    if need_mpi:
        vers["mpi_stack"] = detect_mpi_stack(bins["openmpi"])
        log(f"Open MPI: {vers['mpi_stack']}")

    configs = []
    if need_mpi:
        configs += [Config("openmpi", "shm", "user"), Config("openmpi", "shm", "registered")]
    if need_gloo:
        configs.append(Config("gloo", "tcp", "user"))
    kc_state = "not requested (--only)"
    if "kc" in only:
        kc_configs = [Config("kc", "shm", "user"), Config("kc", "shm", "registered"),
                      Config("kc", "tcp", "user"), Config("kc", "wire", "user")]
        if args.kc_bf16:
            kc_configs.append(Config("kc", "tcp-bf16", "user"))
        if not (os.path.isfile(args.kc) and os.access(args.kc, os.X_OK)):
            kc_state = f"UNAVAILABLE: {args.kc} not found or not executable"
            log(kc_state)
        else:
            kc_state = args.kc
            configs += kc_configs
    if not configs:
        log("nothing to run")
        return 1

    samples, raw, load = {}, [], []
    failures = []
    started = time.time()
    for rep in range(args.reps):
        # Interleave: every configuration once per (ranks, op, size) per repetition, with the
        # order rotated each repetition so no implementation always runs first (A B C, B C A).
        order = configs[rep % len(configs):] + configs[:rep % len(configs)]
        for n in args.ranks:
            for op in args.ops:
                for size in args.sizes:
                    iters, warmup = default_iters(size)
                    iters = args.iters or iters
                    warmup = args.warmup if args.warmup is not None else warmup
                    for cfg in order:
                        if cfg.unavailable or (cfg.impl == "gloo" and op not in GLOO_OPS):
                            continue
                        if cfg.transport == "wire" and op != "allreduce":
                            continue
                        load.append(os.getloadavg()[0])
                        algos = ""
                        if cfg.impl == "gloo" and rep > 0 and args.gloo_screen > 0:
                            algos = screened(samples, n, op, size, args.gloo_screen)
                        cmd = command(cfg, args, bins, n, op, size, iters, warmup, algos)
                        rows, err = run_json_lines(cmd, args.timeout)
                        if err:
                            msg = f"{cfg.name} ranks={n} op={op} size={size}: {err}"
                            log("FAILED " + msg)
                            failures.append(msg)
                            if cfg.impl == "kc":
                                cfg.unavailable = err  # Keep going with the baselines.
                            continue
                        for r in rows:
                            r["rep"] = rep
                            raw.append(r)
                            key = (r.get("impl", cfg.impl), r.get("op", op),
                                   int(r.get("ranks", n)), size,
                                   cfg.transport if cfg.transport == "tcp-bf16"
                                   else r.get("transport", cfg.transport),
                                   r.get("buffers", cfg.buffers), r.get("algo", ""))
                            samples.setdefault(key, []).append(r)
        log(f"repetition {rep + 1}/{args.reps} done, {time.time() - started:.0f}s elapsed")

    kc_bad = [c for c in configs if c.impl == "kc" and c.unavailable]
    if kc_bad:
        kc_state += "; UNAVAILABLE for " + ", ".join(f"{c.transport}/{c.buffers} ({c.unavailable})"
                                                      for c in kc_bad)
    agg = aggregate(samples, args.stat)
    print_tables(agg, args, kc_state, vers, load or [0.0])
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"versions": vers, "kc": kc_state, "stat": args.stat, "reps": args.reps,
                       "load": load, "samples": raw, "aggregated": list(agg.values())}, f,
                      indent=1)
    baseline_failures = [m for m in failures if not m.startswith("kc/")]
    if baseline_failures:
        print(f"\n# {len(baseline_failures)} baseline run(s) FAILED:", file=sys.stderr)
        for m in baseline_failures:
            print(f"#   {m}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
