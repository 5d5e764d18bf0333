#!/usr/bin/python3
"""The reference for tools/bench-worker's PyTorch CNN column: parasync's `cnn` written out as
a plain nn.Sequential (Conv2d(1, 32, 3), ReLU, Flatten, Linear(26 * 26 * 32, 128), ReLU,
Linear(128, 10)), timed as torch_model.py times its CPU step (forward, the mean softmax
cross-entropy, torch.autograd.grad of every parameter; no optimizer), and nothing else: no
torch_model.py, no torch_env.py, no mallopt. Whatever the process runs with, its parent set
before it started (tools/bench-worker --reference sets the allocator torch_env.py names and
OPENBLAS_NUM_THREADS to the threads), so its figure is what a user who tuned the process
from outside gets, beside which bench-worker's own PyTorch column is judged.

  torch_reference.py [--threads 1] [--batches 64] [--seconds 0.5] [--repeats 5]

Prints torch_model.py's CSV (device,batch,median_examples_per_sec,min,max,repeats,
steps_per_repeat), device torch-plain, and on stderr "torch_reference.py: ran with: ..."
(PyTorch's version and threads, and the allocator and thread settings this process found in
its environment at its start, /proc/self/environ, with the allocator library it mapped).

  torch_reference.py --compare glibc,glibc-keep,tcmalloc,jemalloc,mallopt [--rounds 6]

The measurement that chose torch_env.py's ALLOCATOR: per round, one child per allocator
(each started with that allocator's environment, torch_env.allocator_env; `mallopt` is
glibc's defaults with torch_env's old mallopt call made after start; the order rotates every
round), each timing one repeat; prints each allocator's median, min and max over the rounds
and every round's figure. Exit status 2 with one line for bad flags or a missing library.
"""
import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import time

PROGRAM = "torch_reference.py"
HERE = os.path.dirname(os.path.abspath(__file__))
# What the ran-with line reports from the environment the process started with.
SETTINGS = ("LD_PRELOAD", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX",
            "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
ALLOCATOR_LIBRARIES = ("libtcmalloc", "libjemalloc", "libmimalloc")


def fail(message):
    print(f"{PROGRAM}: {message}", file=sys.stderr)
    sys.exit(2)


def parse():
    p = argparse.ArgumentParser(prog=PROGRAM, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--batches", default="64")
    p.add_argument("--seconds", type=float, default=0.5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--compare", help="allocators to time against each other, alternating")
    p.add_argument("--rounds", type=int, default=6, help="--compare: children per allocator")
    p.add_argument("--mallopt", action="store_true", help=argparse.SUPPRESS)  # --compare's
    p.error = fail
    args = p.parse_args()
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        fail(f"--batches {args.batches!r} is not a list of numbers")
    if min(args.batches) < 1 or args.threads < 1 or args.repeats < 1 or args.rounds < 1:
        fail("--batches, --threads, --repeats and --rounds must be at least 1")
    if not args.seconds > 0:
        fail(f"--seconds must be positive, not {args.seconds}")
    return args


def started_with():
    """The settings in the environment this process started with, and the allocator library
    it mapped (a preloaded one), as one phrase."""
    with open("/proc/self/environ", "rb") as f:
        env = dict(e.decode(errors="replace").partition("=")[::2]
                   for e in f.read().split(b"\0") if e)
    with open("/proc/self/maps") as f:
        mapped = sorted({line.split()[-1] for line in f
                         if any(a in line for a in ALLOCATOR_LIBRARIES)})
    found = [f"{k}={env[k]}" for k in SETTINGS if k in env]
    return ((" ".join(found) if found else "none of " + ", ".join(SETTINGS))
            + (f"; mapped {', '.join(mapped)}" if mapped else "; glibc's malloc"))


def measure(args):
    if args.mallopt:  # --compare's "mallopt": torch_env.py's old way, after start
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD
    import torch
    nn = torch.nn
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Flatten(),
                        nn.Linear(26 * 26 * 32, 128), nn.ReLU(), nn.Linear(128, 10)).train()
    params = list(net.parameters())
    x = torch.rand(max(args.batches), 1, 28, 28)
    y = torch.randint(0, 10, (max(args.batches),))
    print(f"{PROGRAM}: ran with: PyTorch {torch.__version__}, {torch.get_num_threads()} "
          f"intra-op thread(s); from the start: {started_with()}"
          + ("; mallopt after start" if args.mallopt else ""), file=sys.stderr, flush=True)

    def step(batch):
        loss = nn.functional.cross_entropy(net(x[:batch]), y[:batch])
        torch.autograd.grad(loss, params)

    print("device,batch,median_examples_per_sec,min,max,repeats,steps_per_repeat")
    for batch in args.batches:
        w0, warm = time.perf_counter(), 0  # warm up as torch_model.py does
        while warm < 3 or time.perf_counter() - w0 < 0.2 * args.seconds:
            step(batch)
            warm += 1
        steps = max(3, int(args.seconds / ((time.perf_counter() - w0) / warm)))
        rates = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for _ in range(steps):
                step(batch)
            rates.append(steps * batch / (time.perf_counter() - t0))
        print(f"torch-plain,{batch},{statistics.median(rates):.0f},{min(rates):.0f},"
              f"{max(rates):.0f},{args.repeats},{steps}", flush=True)
    return 0


def compare(args):
    sys.path.insert(0, HERE)
    import torch_env
    names = args.compare.split(",")
    for n in names:
        if n != "mallopt" and n not in torch_env.ALLOCATORS:
            fail(f"--compare: unknown allocator {n!r} (known: "
                 f"{', '.join([*torch_env.ALLOCATORS, 'mallopt'])})")
        missing = torch_env.missing_library(n) if n != "mallopt" else None
        if missing:
            fail(missing)
    rates = {n: [] for n in names}
    print(f"{PROGRAM}: load average {open('/proc/loadavg').read().split()[0]} at the start",
          file=sys.stderr)
    for r in range(args.rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            env = torch_env.environment_for("glibc" if n == "mallopt" else n)
            env["OPENBLAS_NUM_THREADS"] = str(args.threads)
            env.pop(torch_env.ALLOCATOR_VARIABLE, None)
            argv = [sys.executable, os.path.abspath(__file__), "--threads", str(args.threads),
                    "--batches", str(args.batches[0]), "--seconds", str(args.seconds),
                    "--repeats", "1"] + (["--mallopt"] if n == "mallopt" else [])
            done = subprocess.run(argv, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
            if done.returncode != 0:
                fail(f"{n}: exit status {done.returncode}: {done.stderr.strip()[-300:]}")
            if r == 0:
                print(f"{n}: {done.stderr.strip()}", file=sys.stderr)
            rates[n].append(float(done.stdout.splitlines()[1].split(",")[2]))
    print(f"CNN, batch {args.batches[0]}, {args.threads} thread(s), examples/s; "
          f"{args.rounds} rounds, one child of ~{args.seconds} s per allocator a round; "
          f"load average {open('/proc/loadavg').read().split()[0]} at the end")
    print("| allocator | median | min | max | every round |")
    print("|---|---|---|---|---|")
    for n in names:
        v = rates[n]
        print(f"| {n} | {statistics.median(v):,.0f} | {min(v):,.0f} | {max(v):,.0f} | "
              + " ".join(f"{x:,.0f}" for x in v) + " |")
    return 0


def main() -> int:
    args = parse()
    return compare(args) if args.compare else measure(args)


if __name__ == "__main__":
    sys.exit(main())
