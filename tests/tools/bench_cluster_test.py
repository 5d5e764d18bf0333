#!/usr/bin/python3
"""tools/bench-cluster on a tiny cluster: what it prints and keeps, not how fast anything is.

No figure is compared with a number here (timings belong to tools/); the checks are on the
rows it must print and on how they relate to the runs' own files:

  1. --devices cpu,cuda:7 --repeats 2 (mlp, 1 PS, 2 workers, 1 epoch): the cpu row in the
     markdown table and in --json, from two runs, with a positive throughput, an accuracy in
     (0, 1], step ms = pull + compute + push, and each phase the median over the runs of
     sum/count of parasync_worker_step_seconds over the workers' metrics-worker<i>.prom.
     cuda:7 (no such GPU here or on a one-GPU machine) is a "not measured" note naming the
     failing process's reason, and is run once, not again in the second repeat.
  2. Bad flags (--devices gpu, --ps 0, --model without a value, an unknown flag) exit with
     status 2 and name the flag, before any cluster starts.

Usage: bench_cluster_test.py SOURCE_DIR BIN_DIR
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from checks import check, failures  # noqa: E402

DATA = os.environ.get("PARASYNC_DATA_DIR", "/usr/share/datasets/fashion-mnist")



def bench_cluster(source_dir, bin_dir, *args):
    argv = [os.path.join(source_dir, "tools", "bench-cluster"), *args]
    print("$ " + " ".join(argv), flush=True)
    env = dict(os.environ, BUILD_DIR=os.path.dirname(os.path.abspath(bin_dir)))
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=240, env=env)


def phase_ms(logs):
    """Mean ms per step of each phase over the workers' metrics files of one run."""
    sums, counts = {}, {}
    pattern = re.compile(r'^parasync_worker_step_seconds_(sum|count)\{[^}]*phase="(\w+)"[^}]*\} (\S+)$')
    for name in os.listdir(logs):
        if re.fullmatch(r"metrics-worker\d+\.prom", name):
            for line in open(os.path.join(logs, name)):
                m = pattern.match(line.strip())
                if m:
                    into = sums if m.group(1) == "sum" else counts
                    into[m.group(2)] = into.get(m.group(2), 0.0) + float(m.group(3))
    return {p: 1000.0 * sums[p] / counts[p] for p in sums if counts.get(p)}


def check_runs(source_dir, bin_dir, tmp):
    runs, out_json = os.path.join(tmp, "runs"), os.path.join(tmp, "out.json")
    proc = bench_cluster(source_dir, bin_dir, "--model", "mlp", "--ps", "1", "--workers", "2",
                         "--epochs", "1", "--devices", "cpu,cuda:7", "--repeats", "2",
                         "--dataset", DATA, "--log-dir", runs, "--json", out_json)
    check(proc.returncode == 0, f"exit status {proc.returncode}: {proc.stderr[-2000:]}")
    print(proc.stdout, flush=True)
    lines = proc.stdout.splitlines()
    check(any(l.startswith("| device | examples/sec end to end |") for l in lines),
          "no table header")
    cpu_lines = [l for l in lines if l.startswith("| cpu |")]
    check(len(cpu_lines) == 1, f"{len(cpu_lines)} cpu rows in the table")
    check(not any(l.startswith("| cuda") for l in lines), "a cuda:7 row in the table")
    check(any(l.startswith("cuda:7: not measured: ") and "worker" in l for l in lines),
          "no note naming the failing worker for cuda:7")
    check(sorted(os.listdir(runs)) == ["cpu-1", "cpu-2", "cuda7-1"],
          f"run folders {sorted(os.listdir(runs))}: cpu twice, the failed cuda:7 once")
    try:
        result = json.load(open(out_json))
    except (OSError, ValueError) as e:
        check(False, f"--json file unreadable: {e}")
        return
    rows = result.get("rows", [])
    check(len(rows) == 1 and rows[0].get("device") == "cpu", f"json rows {rows}")
    check(len(result.get("notes", [])) == 1, f"json notes {result.get('notes')}")
    if not rows:
        return
    row = rows[0]
    check(row["runs"] == 2, f"cpu runs {row['runs']}")
    check(row["examples_per_sec"] is not None and row["examples_per_sec"] > 0,
          f"examples_per_sec {row['examples_per_sec']}")
    check(row["test_accuracy"] is not None and 0 < row["test_accuracy"] <= 1,
          f"test_accuracy {row['test_accuracy']}")
    phases = ("pull", "compute", "push")
    check(all(row[p + "_ms"] is not None and row[p + "_ms"] > 0 for p in phases),
          f"phase ms {[row[p + '_ms'] for p in phases]}")
    if all(row[p + "_ms"] is not None for p in phases):
        total = sum(row[p + "_ms"] for p in phases)
        check(abs(row["step_ms"] - total) <= 1e-9 * max(1.0, total),
              f"step_ms {row['step_ms']} != pull + compute + push {total}")
    per_run = [phase_ms(os.path.join(runs, f"cpu-{r}", "logs")) for r in (1, 2)]
    for p in phases:
        want = statistics.median(m.get(p, 0.0) for m in per_run)
        got = row[p + "_ms"] or 0.0
        check(abs(got - want) <= 1e-9 * max(1.0, want),
              f"{p}_ms {got}, the metrics files give {want}")


def check_bad_flags(source_dir, bin_dir):
    for args, flag in [(["--devices", "gpu"], "--devices"), (["--ps", "0"], "--ps"),
                       (["--model"], "--model"), (["--bogus"], "--bogus")]:
        proc = bench_cluster(source_dir, bin_dir, *args)
        check(proc.returncode == 2, f"{args}: exit status {proc.returncode}, not 2")
        check(flag in proc.stderr and len(proc.stderr.strip().splitlines()) == 1,
              f"{args}: stderr {proc.stderr!r} is not one line naming {flag}")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    source_dir, bin_dir = sys.argv[1], sys.argv[2]
    check_bad_flags(source_dir, bin_dir)
    if not os.path.isfile(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz")):
        print(f"Fashion-MNIST not installed at {DATA}: skipped (the runs need it)")
        return 1 if failures else 77  # ctest's SKIP_RETURN_CODE
    with tempfile.TemporaryDirectory() as tmp:
        check_runs(source_dir, bin_dir, tmp)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
