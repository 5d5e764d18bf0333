#!/usr/bin/python3
"""parasync-bench-compute (tools/benchmarks/bench_compute.cc) and the PyTorch side of
tools/bench-worker (tools/benchmarks/torch_model.py) on a tiny budget: what they print, not
how fast anything is (no figure is compared with a number here).

  1. --model ctr --batches 8: the CSV header and one cpu row of seven fields with a positive
     rate, and a stderr line with the batch's ids, its unique rows (at most its ids) and
     the compact table of SparseRowsNeeded(8, 8) = 64 rows.
  2. --model ctr --describe: JSON with the model (a sparse embedding first) and the
     "sparse_input" object torch_model.py reads, at parasync-gen-ctr's defaults; --model mlp
     --describe: the plain model description, without it.
  3. The dense models keep their CSV: --model mlp --batches 8 prints one cpu row.
  4. Bad input (a ctr input shorter than its ids, an image shape for ctr, --id-columns for a
     dense model, --zipf 0.5) exits with status 2 and one line on stderr, printing no CSV.
  5. torch_model.py --device cpu (under /usr/bin/python3, with PyTorch) builds ctr from that
     description and prints one torch-cpu row and its unique-rows line. Without PyTorch
     this check fails (tools/install-deps.sh --tests installs it); PARASYNC_ALLOW_NO_TORCH=1
     skips it instead, for a machine where PyTorch cannot be installed -- never set in CI.

Usage: bench_compute_test.py BIN_DIR SOURCE_DIR
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from checks import check, report  # noqa: E402

HEADER = "device,batch,median_examples_per_sec,min,max,repeats,steps_per_repeat"
TINY = ["--seconds", "0.01", "--repeats", "1"]



def run(argv):
    print("$ " + " ".join(argv), flush=True)
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=120)
    if proc.returncode not in (0, 2):
        print(proc.stdout + proc.stderr, flush=True)
    return proc


def csv_rows(proc, what, label):
    check(proc.returncode == 0, f"{what}: exit status {proc.returncode}: {proc.stderr[-2000:]}")
    lines = proc.stdout.splitlines()
    check(lines[:1] == [HEADER], f"{what}: header {lines[:1]}, want {HEADER}")
    rows = [l.split(",") for l in lines[1:]]
    check(len(rows) == 1, f"{what}: {len(rows)} rows, want 1: {lines}")
    for r in rows:
        ok = len(r) == 7 and r[0] == label and r[1] == "8" and float(r[2]) > 0 and r[5] == "1"
        check(ok, f"{what}: row {r}")
    return rows


def unique_line(proc, what, program):
    pattern = program + r": batch 8: 64 ids, (\d+) unique rows in a compact table of 64$"
    found = [re.match(pattern, l) for l in proc.stderr.splitlines()]
    found = [m for m in found if m]
    check(len(found) == 1, f"{what}: no unique-rows line for batch 8: {proc.stderr!r}")
    if found:
        unique = int(found[0].group(1))
        check(1 <= unique <= 64, f"{what}: {unique} unique rows of 64 ids")


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    bench = os.path.join(sys.argv[1], "parasync-bench-compute")
    torch_model = os.path.join(sys.argv[2], "tools", "benchmarks", "torch_model.py")

    # 1. ctr's CSV and its batch.
    proc = run([bench, "--model", "ctr", "--batches", "8", *TINY])
    csv_rows(proc, "ctr", "cpu")
    unique_line(proc, "ctr", "parasync-bench-compute")

    # 2. The descriptions.
    proc = run([bench, "--model", "ctr", "--describe"])
    check(proc.returncode == 0, f"ctr --describe: exit status {proc.returncode}")
    describe = proc.stdout
    try:
        d = json.loads(describe)
    except json.JSONDecodeError:
        d = {}
        check(False, f"ctr --describe is not JSON: {describe!r}")
    first = (d.get("layers") or [{}])[0]
    check(first.get("type") == "embedding" and first.get("sparse") is True,
          f"ctr --describe: first layer {first}")
    want = {"id_columns": 8, "dense_features": 4, "zipf": 1.6, "vocab_per_field": 10000000,
            "compact_rows_per_example": 8}
    check(d.get("sparse_input") == want,
          f"ctr --describe: sparse_input {d.get('sparse_input')}, want {want}")
    proc = run([bench, "--model", "mlp", "--describe"])
    mlp = json.loads(proc.stdout) if proc.returncode == 0 else {}
    check(set(mlp) == {"name", "layers", "loss"}, f"mlp --describe: keys {sorted(mlp)}")

    # 3. A dense model as before.
    csv_rows(run([bench, "--model", "mlp", "--batches", "8", *TINY]), "mlp", "cpu")

    # 4. Bad input.
    for args in (["--model", "ctr", "--input", "4"], ["--model", "ctr", "--input", "1,28,28"],
                 ["--model", "cnn", "--id-columns", "3"], ["--model", "ctr", "--zipf", "0.5"]):
        proc = run([bench, *args, "--batches", "8", *TINY])
        check(proc.returncode == 2, f"{args}: exit status {proc.returncode}, want 2")
        check(len(proc.stderr.splitlines()) == 1, f"{args}: stderr {proc.stderr!r}, want a line")
        check(proc.stdout == "", f"{args}: printed {proc.stdout!r}")

    # 5. PyTorch's ctr from the description.
    if subprocess.run(["/usr/bin/python3", "-c", "import torch"],
                      stderr=subprocess.DEVNULL).returncode != 0:
        if os.environ.get("PARASYNC_ALLOW_NO_TORCH") == "1":
            print("SKIP: /usr/bin/python3 has no PyTorch and PARASYNC_ALLOW_NO_TORCH=1")
        else:
            check(False, "/usr/bin/python3 has no PyTorch: tools/install-deps.sh --tests "
                  "installs python3-torch (PARASYNC_ALLOW_NO_TORCH=1 skips this check)")
    else:
        proc = run(["/usr/bin/python3", torch_model, "--device", "cpu", "--describe", describe,
                    "--batches", "8", *TINY])
        csv_rows(proc, "torch_model.py ctr", "torch-cpu")
        unique_line(proc, "torch_model.py ctr", "torch_model.py")

    return report()


if __name__ == "__main__":
    sys.exit(main())
