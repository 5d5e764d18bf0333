#!/usr/bin/python3
"""The PyTorch baselines refuse a comparison against the reference BLAS
(tools/benchmarks/torch_env.py, and what runs it: tools/bench-worker, torch_model.py,
torch_train.py), and name the BLAS they ran with otherwise. Tiny budgets; no figure is
compared with a number.

Which BLAS PyTorch loads is forced per run with LD_LIBRARY_PATH, whatever the system's
libblas.so.3 alternative points to: Debian's reference BLAS stays installed (libblas3) in
/usr/lib/x86_64-linux-gnu/blas, OpenBLAS (libopenblas0-pthread) goes to .../openblas-pthread.
PARASYNC_NO_INSTALL=1 everywhere: a test installs nothing.

  1. On the reference BLAS: torch_env.py (with and without --install) exits 2 with the
     refusal line last on stderr, naming the library and the fix; torch_model.py --device
     cpu prints no CSV; torch_train.py trains no epoch; tools/bench-worker prints nothing on
     stdout (no table, no ratio) and its one stderr line is the refusal, exit status 2.
  2. On OpenBLAS (skipped where it is not installed): torch_env.py names it, at the threads
     asked for; tools/bench-worker exits 0 with a "ran with:" header naming OpenBLAS for
     PyTorch and oneDNN for parasync, and the table's ratio.
  3. The allocator (torch_env.ALLOCATOR, set before a baseline's process starts):
     start_with_allocator runs the same process (the same pid) again with the same
     arguments and the allocator's variables in the environment it starts with
     (/proc/self/environ), and not again once they are there; a process marked as started
     again that still lacks them exits 2 with one line instead of looping; an unknown
     PARASYNC_TORCH_ALLOCATOR exits 2 with one line; another allocator asked for where the
     environment holds this one's variables starts again without them; a process that imported torch before
     it is refused by check() (one line, nothing timed); torch_model.py started without the
     variables names the allocator "from the start" in its ran-with line (and tcmalloc,
     preloaded, where PARASYNC_TORCH_ALLOCATOR=tcmalloc and it is installed); tools/bench-worker
     --reference alternates its repeats (the columns' order reversed every repeat), names
     the allocator for PyTorch and for the plain nn.Sequential reference (started by env(1)
     with the variables), and prints the PyTorch / reference ratio; --reference with
     another model exits 2 with one line.

Skips (exit 77) where /usr/bin/python3 has no PyTorch or the reference BLAS is missing.
Usage: torch_env_test.py SOURCE_DIR BIN_DIR
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from checks import check, report  # noqa: E402

PYTHON = "/usr/bin/python3"
LIB = "/usr/lib/x86_64-linux-gnu"
REFERENCE = f"{LIB}/blas"
OPENBLAS = f"{LIB}/openblas-pthread"
REFUSAL = re.compile(r"PyTorch runs on the reference BLAS \(" + re.escape(REFERENCE)
                     + r"/libblas\.so\.3[^)]*\), .*not a fair baseline, so nothing is timed; .+")
TINY = ["--batches", "8", "--seconds", "0.01", "--repeats", "1"]



def run(argv, blas_dir, **extra):
    """Runs argv on the BLAS in `blas_dir`, `extra` added to the environment (an empty value
    removes the variable)."""
    env = dict(os.environ, LD_LIBRARY_PATH=blas_dir, PARASYNC_NO_INSTALL="1", **extra)
    env.pop("PYTHON", None)
    for k in [k for k, v in extra.items() if v == ""]:
        env.pop(k)
    print(f"$ LD_LIBRARY_PATH={blas_dir} " + " ".join(argv), flush=True)
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, timeout=240)
    print(proc.stdout + proc.stderr, flush=True)
    return proc


def refused(proc, what, program):
    """`proc` exited 2 and its last stderr line is PROGRAM's refusal."""
    check(proc.returncode == 2, f"{what}: exit status {proc.returncode}, want 2")
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    check(last.startswith(program + ": ") and REFUSAL.search(last),
          f"{what}: last stderr line {last!r} is not the refusal")


# A probe of start_with_allocator: prints its pid, arguments and whether the environment it
# started with holds every variable of the allocator, then starts with it, and prints again.
PROBE = """
import os, sys
sys.path.insert(0, sys.argv[1])
import torch_env
start = open("/proc/self/environ", "rb").read().decode().split(chr(0))
want = [f"{k}={v}" for k, v in torch_env.allocator_env(torch_env.ALLOCATOR).items()]
print(os.getpid(), sys.argv[2:], all(w in start for w in want), flush=True)
torch_env.start_with_allocator("probe")
print(os.getpid(), sys.argv[2:], all(w in start for w in want), "in force", flush=True)
"""
# A baseline that imports torch before start_with_allocator: check() must refuse it.
LATE = """
import sys
sys.path.insert(0, sys.argv[1])
import torch
import torch_env
torch_env.start_with_allocator("late")
sys.exit(0 if torch_env.check(torch, "late") else 2)
"""


def allocator(source, bin_dir, build):
    """3. The allocator every baseline starts with."""
    benchmarks = os.path.join(source, "tools", "benchmarks")
    sys.path.insert(0, benchmarks)
    import torch_env
    name = getattr(torch_env, "ALLOCATOR", None)
    variables = torch_env.allocator_env(name) if name else {}
    # Empty means unset here (run() drops them): the runs start without the allocator.
    clean = {k: "" for k in ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", *variables,
                             "PARASYNC_TORCH_ALLOCATOR", "PARASYNC_TORCH_ALLOCATOR_REEXECUTED"]}
    if not check(name, "torch_env.py chooses no allocator (ALLOCATOR) for the baselines"):
        allocator_named(None, {}, source, bin_dir, build, clean)
        return
    proc = run([PYTHON, "-c", PROBE, benchmarks, "a b", "--x"], OPENBLAS, **clean)
    lines = proc.stdout.splitlines()
    # Its first start prints one line and starts again: that one prints both.
    check(proc.returncode == 0 and len(lines) == 3,
          f"probe: exit status {proc.returncode}, {len(lines)} lines, want 0 and 3")
    if len(lines) == 3:
        pid = lines[0].split()[0]
        check(lines[0] == f"{pid} ['a b', '--x'] False",
              f"probe: first line {lines[0]!r}, want the arguments without the variables")
        check(lines[1:] == [f"{pid} ['a b', '--x'] True", f"{pid} ['a b', '--x'] True in force"],
              f"probe: then {lines[1:]!r}: not the same process and arguments with "
              f"{variables} in the environment it started with")
    proc = run([PYTHON, "-c", PROBE, benchmarks], OPENBLAS,
               **dict(clean, PARASYNC_TORCH_ALLOCATOR_REEXECUTED=name))
    err = proc.stderr.strip().splitlines()
    check(proc.returncode == 2 and len(err) == 1 and "still not in force" in err[0],
          f"probe marked as started again: exit status {proc.returncode}, stderr {err!r}")
    proc = run([PYTHON, "-c", PROBE, benchmarks], OPENBLAS,
               **dict(clean, PARASYNC_TORCH_ALLOCATOR="no-such-allocator"))
    err = proc.stderr.strip().splitlines()
    check(proc.returncode == 2 and len(err) == 1 and "no-such-allocator is none of" in err[0],
          f"an unknown allocator: exit status {proc.returncode}, stderr {err!r}")
    # Another allocator asked for (an A/B run) where the environment holds this one's
    # variables: started again without them, not refused as "still not in force".
    proc = run([PYTHON, "-c", PROBE, benchmarks], OPENBLAS,
               **dict(clean, PARASYNC_TORCH_ALLOCATOR="glibc", **variables))
    lines = proc.stdout.splitlines()
    check(proc.returncode == 0 and len(lines) == 3 and lines[0].endswith("True")
          and lines[2].endswith("False in force"),
          f"glibc asked for with {variables} set: exit status {proc.returncode}, stdout "
          f"{lines!r}, want 0 and the variables gone after the second start")
    proc = run([PYTHON, "-c", LATE, benchmarks], OPENBLAS, **clean)
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    check(proc.returncode == 2 and last.startswith(f"late: PyTorch did not start with the "
                                                   f"allocator {name} ")
          and "not a fair baseline" in last,
          f"torch imported first: exit status {proc.returncode}, last line {last!r}")
    allocator_named(name, variables, source, bin_dir, build, clean)


def allocator_named(name, variables, source, bin_dir, build, clean):
    """3, continued: the baselines started without the allocator's variables (`clean`) name
    allocator `name` (any, where None), from their start; bench-worker --reference
    alternates and names both, the reference started with `variables`."""
    benchmarks = os.path.join(source, "tools", "benchmarks")
    named = re.escape(name) if name else r"\S+"
    describe = subprocess.run([os.path.join(bin_dir, "parasync-bench-compute"), "--model",
                               "cnn", "--describe"], stdout=subprocess.PIPE, text=True,
                              check=True).stdout
    torch_model = os.path.join(benchmarks, "torch_model.py")
    started = re.compile(r"^torch_model\.py: ran with: PyTorch .*; allocator "
                         + named + r" \(.*from the start[:)]", re.M)
    proc = run([PYTHON, torch_model, "--device", "cpu", "--describe", describe, *TINY],
               OPENBLAS, **clean)
    check(proc.returncode == 0 and started.search(proc.stderr)
          and "mallopt" not in proc.stderr,
          f"torch_model.py: no ran-with line naming the allocator {name or '(any)'} from the start")
    tcmalloc = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
    if name and os.path.exists(tcmalloc):
        proc = run([PYTHON, torch_model, "--device", "cpu", "--describe", describe, *TINY],
                   OPENBLAS, **dict(clean, PARASYNC_TORCH_ALLOCATOR="tcmalloc"))
        check(proc.returncode == 0 and re.search(
            r"; allocator tcmalloc \(preloaded from the start: .*libtcmalloc_minimal", proc.stderr),
            "torch_model.py with PARASYNC_TORCH_ALLOCATOR=tcmalloc: not named preloaded")

    bench_worker = os.path.join(source, "tools", "bench-worker")
    proc = run([bench_worker, "--model", "cnn", "--no-gpu", "--cpu-threads", "1", "--reference",
                "--batches", "8", "--seconds", "0.01", "--repeats", "2"], OPENBLAS,
               **dict(clean, **build))
    check(proc.returncode == 0, f"bench-worker --reference: exit status {proc.returncode}")
    order = re.findall(r"^bench-worker: timing (\S+), repeat (\d) of 2", proc.stderr, re.M)
    want = [("cpu-1", "1"), ("torch-cpu-1", "1"), ("torch-plain-1", "1"),
            ("torch-plain-1", "2"), ("torch-cpu-1", "2"), ("cpu-1", "2")]
    check(order == want, f"bench-worker --reference: timed {order}, want {want} (alternating)")
    out = proc.stdout
    check(re.search(r"^- PyTorch CPU 1t: PyTorch .*; allocator " + named
                    + r" \(.*from the start", out, re.M),
          "bench-worker --reference: PyTorch's ran-with line does not name the allocator")
    env_text = " ".join(f"{k}={v}" for k, v in variables.items())
    check(re.search(r"^- PyTorch plain nn\.Sequential 1t \(reference\): PyTorch .*from the "
                    r"start: .*" + re.escape(env_text), out, re.M),
          f"bench-worker --reference: the reference did not start with {env_text}")
    check(re.search(r"^\| 8 \| [0-9,]+ \| [0-9,]+ \| [0-9,]+ \| [0-9.]+ \| [0-9.]+ \|$", out,
                    re.M) and "| PyTorch CPU 1t / plain 1t |" in out,
          "bench-worker --reference: no row with the PyTorch / reference ratio")
    proc = run([bench_worker, "--model", "mlp", "--reference", *TINY], OPENBLAS,
               **dict(clean, **build))
    err = proc.stderr.strip().splitlines()
    check(proc.returncode == 2 and err[-1:] and "--reference times the plain CNN" in err[-1]
          and proc.stdout == "", f"bench-worker --model mlp --reference: {proc.returncode}, {err}")


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    source, bin_dir = sys.argv[1], sys.argv[2]
    torch_env = os.path.join(source, "tools", "benchmarks", "torch_env.py")
    torch_model = os.path.join(source, "tools", "benchmarks", "torch_model.py")
    torch_train = os.path.join(source, "tools", "benchmarks", "torch_train.py")
    bench_worker = os.path.join(source, "tools", "bench-worker")
    build = {"BUILD_DIR": os.path.dirname(os.path.abspath(bin_dir))}
    if subprocess.run([PYTHON, "-c", "import torch"], stderr=subprocess.DEVNULL).returncode:
        print(f"SKIP: {PYTHON} has no PyTorch (tools/install-deps.sh python3-torch)")
        return 77
    if not os.path.exists(f"{REFERENCE}/libblas.so.3"):
        print(f"SKIP: no reference BLAS in {REFERENCE} (libblas3)")
        return 77
    describe = subprocess.run([os.path.join(bin_dir, "parasync-bench-compute"), "--model",
                               "mlp", "--describe"], stdout=subprocess.PIPE, text=True,
                              check=True).stdout
    json.loads(describe)

    # 1. The reference BLAS: refused everywhere, nothing timed.
    proc = run([PYTHON, torch_env], REFERENCE)
    refused(proc, "torch_env.py", "torch_env.py")
    check("BLAS: the reference BLAS via " + REFERENCE in proc.stdout,
          f"torch_env.py: its ran-with line does not name the reference BLAS: {proc.stdout!r}")
    refused(run([PYTHON, torch_env, "--install"], REFERENCE), "torch_env.py --install",
            "torch_env.py")
    proc = run([PYTHON, torch_model, "--device", "cpu", "--describe", describe, *TINY],
               REFERENCE)
    refused(proc, "torch_model.py", "torch_model.py")
    check(proc.stdout == "", f"torch_model.py: printed {proc.stdout!r} on the reference BLAS")
    proc = run([PYTHON, torch_train, "--describe", describe, "--epochs", "1",
                "--data", "/nonexistent"], REFERENCE)
    refused(proc, "torch_train.py", "torch_train.py")
    check("epoch" not in proc.stdout, "torch_train.py: trained on the reference BLAS")
    proc = run([bench_worker, "--model", "mlp", "--no-gpu", "--cpu-threads", "1", *TINY],
               REFERENCE, **build)
    refused(proc, "bench-worker", "bench-worker")
    check(proc.stdout == "", f"bench-worker: printed {proc.stdout!r} on the reference BLAS")
    lines = [l for l in proc.stderr.splitlines() if not l.startswith("bench-worker: checking")]
    check(len(lines) == 1, f"bench-worker: {len(lines)} lines on stderr, want the refusal only")

    # 2. OpenBLAS: named, and the comparison printed.
    if not os.path.exists(f"{OPENBLAS}/libblas.so.3"):
        print(f"SKIP (part 2): no OpenBLAS in {OPENBLAS} (libopenblas0-pthread)")
    else:
        proc = run([PYTHON, torch_env, "--threads", "1"], OPENBLAS)
        check(proc.returncode == 0, f"torch_env.py on OpenBLAS: exit status {proc.returncode}")
        want = re.compile(r"BLAS: OpenBLAS [0-9.]+ \([^)]*\) via " + re.escape(OPENBLAS)
                          + r"/libblas\.so\.3, 1 thread\(s\);")
        check(want.search(proc.stdout), f"torch_env.py on OpenBLAS: {proc.stdout!r}")
        proc = run([bench_worker, "--model", "mlp", "--no-gpu", "--cpu-threads", "1", *TINY],
                   OPENBLAS, **build)
        check(proc.returncode == 0, f"bench-worker on OpenBLAS: exit status {proc.returncode}")
        out = proc.stdout
        check(re.search(r"^- PyTorch CPU 1t: PyTorch .*BLAS: OpenBLAS .* via "
                        + re.escape(OPENBLAS) + r"/libblas\.so\.3, 1 thread\(s\);", out, re.M),
              "bench-worker on OpenBLAS: no ran-with line naming OpenBLAS for PyTorch")
        check(re.search(r"^- parasync CPU 1t: oneDNN [0-9.]+ \(.*\), 1 thread\(s\), "
                        r"denormals flushed to zero$", out, re.M),
              "bench-worker on OpenBLAS: no ran-with line for parasync")
        check("parasync CPU / PyTorch CPU (bests) |" in out,
              "bench-worker on OpenBLAS: no ratio column")
        check(re.search(r"^\| 8 \| [0-9,]+ \| [0-9,]+ \| [0-9.]+ \|$", out, re.M),
              "bench-worker on OpenBLAS: no row with a ratio for batch 8")

    # 3. The allocator (on OpenBLAS: a CPU baseline refuses the reference BLAS first).
    if os.path.exists(f"{OPENBLAS}/libblas.so.3"):
        allocator(source, bin_dir, build)
    return report()


if __name__ == "__main__":
    sys.exit(main())
