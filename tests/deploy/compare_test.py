#!/usr/bin/python3
"""tools/compare end to end on a small budget: real clusters, real files.

  1. Two short configurations (async, sync) -> results.csv, the four PNGs and report.md
     exist and agree with each run's eval.jsonl.
  2. The same command again skips both runs and leaves them untouched (resumable).
  3. The sync configuration in a second folder reproduces the first one's curve exactly
     (fixed seeds, rank-ordered sync sums).
  4. A straggler scenario reaches the worker it names, and only it.
  5. --seconds, a wall-clock budget, ends a run of many epochs early.
  6. --wire-dtypes adds a bfloat16 run of the same configuration: it moves half the tensor
     bytes of the float32 one and the report says so, at an accuracy close to it.

Usage: compare_test.py SOURCE_DIR BIN_DIR [DATA_DIR]
"""
import csv
import json
import os
import re
import subprocess
import sys
import tempfile

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL: " + message, flush=True)


def run_compare(source, bin_dir, data, out, *extra):
    argv = [os.path.join(source, "tools", "compare"), "--out", out, "--workers", "2",
            "--epochs", "2", "--train-examples", "6000", "--bin-dir", bin_dir, "--data", data,
            *extra]
    print("$ " + " ".join(argv), flush=True)
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600)
    print(proc.stdout, flush=True)
    return proc


def eval_rows(run_dir):
    with open(os.path.join(run_dir, "eval.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    source, bin_dir = sys.argv[1], sys.argv[2]
    data = sys.argv[3] if len(sys.argv) > 3 else "/usr/share/datasets/fashion-mnist"
    if not os.path.isdir(data):
        print(f"SKIP: Fashion-MNIST not installed at {data}")
        return 0
    with tempfile.TemporaryDirectory(prefix="parasync-compare-") as tmp:
        out = os.path.join(tmp, "a")
        proc = run_compare(source, bin_dir, data, out, "--modes", "async,sync")
        check(proc.returncode == 0, f"compare exited {proc.returncode}")
        names = ["async-w2", "sync-w2"]

        # 1. Every eval.jsonl row is in results.csv, and nothing else.
        with open(os.path.join(out, "results.csv")) as f:
            table = list(csv.DictReader(f))
        for name in names:
            rows = eval_rows(os.path.join(out, "runs", name))
            check(len(rows) == 3, f"{name}: {len(rows)} evaluations, want 3 (epochs 0-2)")
            mine = [r for r in table if r["config"] == name]
            check([float(r["test_accuracy"]) for r in mine] == [r["test_accuracy"] for r in rows],
                  f"{name}: results.csv accuracies differ from eval.jsonl")
            check([int(r["examples"]) for r in mine] == [r["examples"] for r in rows],
                  f"{name}: results.csv examples differ from eval.jsonl")
            check(all(r["workers"] == "2" for r in mine), f"{name}: workers column")
        check(len(table) == 6, f"results.csv has {len(table)} rows, want 6")
        # The four plots are real PNG images of some size.
        for png in ("accuracy_vs_time.png", "accuracy_vs_examples.png", "loss_vs_time.png",
                    "loss_vs_examples.png"):
            path = os.path.join(out, png)
            ok = os.path.exists(path)
            check(ok, f"{png} missing")
            if ok:
                with open(path, "rb") as f:
                    head = f.read(8)
                check(head == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG")
                check(os.path.getsize(path) > 10000, f"{png} is only {os.path.getsize(path)} B")
        # The report's row per configuration states its final accuracy and the epoch of it.
        with open(os.path.join(out, "report.md")) as f:
            report = f.read()
        for name in names:
            last = eval_rows(os.path.join(out, "runs", name))[-1]
            want = f"| {name} | {last['test_accuracy']:.4f} ({last['epoch']}) |"
            check(want in report, f"report.md lacks '{want}'")
            check(f"![{'accuracy_vs_time.png'}]" in report, "report.md does not show the plots")
        check("max staleness" in report and "dropped gradients" in report,
              "report.md lacks the staleness/dropped columns")
        sync_row = re.search(r"\| sync-w2 \|.*", report)
        check(sync_row is not None and sync_row.group(0).split("|")[8].strip() == "0",
              "sync's max staleness must be 0")

        # 2. Resumable: the same command runs nothing again.
        before = {n: os.path.getmtime(os.path.join(out, "runs", n, "eval.jsonl")) for n in names}
        again = run_compare(source, bin_dir, data, out, "--modes", "async,sync")
        check(again.returncode == 0, f"second compare exited {again.returncode}")
        check(again.stdout.count("finished earlier, skipped") == 2,
              "the second run did not skip both finished runs")
        after = {n: os.path.getmtime(os.path.join(out, "runs", n, "eval.jsonl")) for n in names}
        check(before == after, "finished runs were run again")

        # 3. Reproducible: sync in a new folder gives the same curve, to the last bit.
        out_b = os.path.join(tmp, "b")
        proc_b = run_compare(source, bin_dir, data, out_b, "--modes", "sync")
        check(proc_b.returncode == 0, f"third compare exited {proc_b.returncode}")
        a = eval_rows(os.path.join(out, "runs", "sync-w2"))
        b = eval_rows(os.path.join(out_b, "runs", "sync-w2"))
        for key in ("step", "examples", "test_accuracy", "test_loss"):
            check([r[key] for r in a] == [r[key] for r in b],
                  f"rerun of sync-w2 differs in {key}: {[r[key] for r in a]} vs "
                  f"{[r[key] for r in b]}")

        # 4. A straggler scenario: its own run name, and --slowdown for worker 1 only.
        proc_s = run_compare(source, bin_dir, data, out_b, "--modes", "sync", "--straggler",
                             "1:3", "--no-baseline")
        check(proc_s.returncode == 0, f"straggler compare exited {proc_s.returncode}")
        run_s = os.path.join(out_b, "runs", "sync-w2-straggler1x3")
        with open(os.path.join(run_s, "cluster.json")) as f:
            processes = json.load(f)["processes"]
        commands = {p["name"]: p["command"] for p in processes}
        check("--slowdown=3" in commands.get("worker1", []), "worker1 was not slowed down")
        check("--slowdown=3" not in commands.get("worker0", []), "worker0 was slowed down too")
        with open(os.path.join(out_b, "report.md")) as f:
            check("sync-w2-straggler1x3" in f.read(), "the report lacks the straggler run")

        # 5. A wall-clock budget ends every run long before its (many) epochs.
        proc_t = run_compare(source, bin_dir, data, os.path.join(tmp, "c"), "--modes", "async",
                             "--seconds", "1.5", "--epochs", "1000")
        check(proc_t.returncode == 0, f"budget compare exited {proc_t.returncode}")
        rows = eval_rows(os.path.join(tmp, "c", "runs", "async-w2"))
        check(rows and rows[-1]["epoch"] < 1000, "the time budget did not stop the run")
        check(rows and rows[-1]["wall_s"] < 15, f"the run went on for {rows[-1]['wall_s']} s")

        # 6. bfloat16 on the wire beside the float32 sync-w2 of folder b (kept, not rerun).
        proc_w = run_compare(source, bin_dir, data, out_b, "--modes", "sync", "--wire-dtypes",
                             "float32,bf16")
        check(proc_w.returncode == 0, f"wire-dtype compare exited {proc_w.returncode}")
        check(proc_w.stdout.count("finished earlier, skipped") == 1,
              "the float32 run was not kept")
        with open(os.path.join(out_b, "runs", "sync-w2-bf16", "cluster.json")) as f:
            commands = [p["command"] for p in json.load(f)["processes"]
                        if p["name"].startswith("worker")]
        check(len(commands) == 2 and all("--wire-dtype=bfloat16" in c for c in commands),
              "the bf16 run's workers were not given --wire-dtype=bfloat16")
        with open(os.path.join(out_b, "report.md")) as f:
            report = f.read()
        cells = {}
        for name in ("sync-w2", "sync-w2-bf16"):
            row = re.search(r"\| " + re.escape(name) + r" \|.*", report)
            check(row is not None, f"report.md lacks a row for {name}")
            if row:
                cells[name] = [c.strip() for c in row.group(0).split("|")[1:-1]]
        if len(cells) == 2:
            check(cells["sync-w2"][9] == "float32" and cells["sync-w2-bf16"][9] == "bfloat16",
                  f"wire column: {cells['sync-w2'][9]}, {cells['sync-w2-bf16'][9]}")
            mb32 = float(cells["sync-w2"][10].replace(",", ""))
            mb16 = float(cells["sync-w2-bf16"][10].replace(",", ""))
            # Same steps and requests, every tensor in half the bytes.
            check(abs(mb16 / mb32 - 0.5) < 0.01, f"bf16 moved {mb16} MB against float32's {mb32}")
            acc32 = float(cells["sync-w2"][1].split()[0])
            acc16 = float(cells["sync-w2-bf16"][1].split()[0])
            print(f"sync-w2 float32: {acc32:.4f}, {mb32} MB; bfloat16: {acc16:.4f}, {mb16} MB")
            check(abs(acc16 - acc32) < 0.03, f"bf16 accuracy {acc16} vs float32 {acc32}")

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
