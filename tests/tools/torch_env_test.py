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
    env = dict(os.environ, LD_LIBRARY_PATH=blas_dir, PARASYNC_NO_INSTALL="1", **extra)
    env.pop("PYTHON", None)
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

    return report()


if __name__ == "__main__":
    sys.exit(main())
