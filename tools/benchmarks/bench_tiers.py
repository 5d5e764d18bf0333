#!/usr/bin/python3
"""Tiered embedding tables (issue 38, docs/embeddings.md#tiers-tables-bigger-than-memory) on a
long-tail click-through set, side by side in one invocation: the same data, cluster and
seed, three ways of bounding each server's rows

  unlimited  no bound (--max-table-rows 0): every row in memory, the reference
  tiered     --table-memory BUDGET with --state-dir: rows beyond it demoted to the store
  forget     --table-memory BUDGET, --table-evict forget: rows beyond it forgotten

  stored     as unlimited, with --state-dir (what tiered costs beyond the store, all fitting)
  baseline   as unlimited (or the configuration --baseline-as names), with the binaries of
             --baseline-bin (another build: "today")

and, per configuration, the final test AUC and log-loss, the training examples/sec (and id
rows/sec: examples x fields), and what the servers ended with (their exit snapshots): rows in
memory, rows in the store, rows created, evicted and promoted, cold reads and their mean
latency. With --repeats N the configurations run N times, alternating (a b c a b c ...), and
the table shows each one's median examples/sec, its spread and its ratio to the first one.

  bench_tiers.py [--train 1000000] [--test 50000] [--fields 8] [--vocab 20000000]
                 [--zipf 1.05] [--budget 8MiB] [--epochs 1] [--configs unlimited,tiered,forget]
                 [--repeats 1] [--baseline-bin DIR [--baseline-as tiered]]
                 [--expire-after N|90s]
                 [--bin build/bin] [--work DIR]

The data is generated once into DIR/ctr (kept with --work; its size on disk and the time it
took are printed). 2 servers, 2 workers, async, adagrad. The budget is per server. Exit status
2 with one line for bad flags; 1 if a run fails.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
CONFIGS = ("unlimited", "tiered", "forget", "stored", "baseline")


def fail(line, code=2):
    print(f"bench_tiers.py: {line}", file=sys.stderr)
    sys.exit(code)


def du(path):
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(d, f))
    return total


def metric_sum(log_dir, name):
    """The sum over the servers' exit snapshots (metrics-ps<i>.prom) of series `name`."""
    total, seen = 0.0, False
    for f in sorted(os.listdir(log_dir)):
        if not re.fullmatch(r"metrics-ps\d+\.prom", f):
            continue
        with open(os.path.join(log_dir, f)) as fh:
            for line in fh:
                if line.startswith(name + "{") or line.startswith(name + " "):
                    total += float(line.rsplit(" ", 1)[1])
                    seen = True
    return total if seen else None


def run(args, config, data, work, repeat=0):
    log_dir = os.path.join(work, config if repeat == 0 else f"{config}-{repeat}")
    bin_dir = args.baseline_bin if config == "baseline" else args.bin
    flags = args.baseline_as if config == "baseline" else config
    argv = [os.path.join(bin_dir, "parasync-launch"), "--ps", "2", "--workers", "2",
            "--mode", "async", "--epochs", str(args.epochs), "--model", "ctr",
            "--dataset", data, "--optimizer", "adagrad", "--lr", "0.05", "--batch-size", "256",
            "--log-dir", log_dir]
    if flags in ("unlimited", "stored"):
        argv += ["--ps-arg=--max-table-rows=0"]
    else:
        argv += [f"--ps-arg=--table-memory={args.budget}"]
    if flags in ("tiered", "stored"):
        argv += ["--state-dir", os.path.join(log_dir, "state")]
    if flags == "forget":
        argv += ["--ps-arg=--table-evict=forget"]
    if args.expire_after:
        argv += [f"--ps-arg=--table-expire-after={args.expire_after}"]
    print(f"[{config}] {' '.join(argv)}", flush=True)
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        print(done.stdout[-4000:])
        fail(f"the {config} run exited {done.returncode}", 1)
    with open(os.path.join(log_dir, "summary.json")) as f:
        summary = json.load(f)
    last = None
    with open(os.path.join(log_dir, "eval.jsonl")) as f:
        for line in f:
            if line.strip():
                last = json.loads(line)
    reads = metric_sum(log_dir, "parasync_ps_table_cold_reads_total") or 0
    seconds = metric_sum(log_dir, "parasync_ps_table_cold_read_seconds_total") or 0
    return {
        "config": config,
        "auc": last.get("test_auc"),
        "loss": last.get("test_loss"),
        "examples_per_second": summary.get("examples_per_second"),
        "rows_per_second": (summary.get("examples_per_second") or 0) * args.fields,
        "in_memory": metric_sum(log_dir, "parasync_ps_table_rows"),
        "in_store": metric_sum(log_dir, "parasync_ps_table_cold_rows"),
        "created": metric_sum(log_dir, "parasync_ps_table_rows_created_total"),
        "evicted": metric_sum(log_dir, "parasync_ps_table_rows_evicted_total"),
        "promoted": metric_sum(log_dir, "parasync_ps_table_rows_promoted_total"),
        "cold_reads": reads,
        "cold_read_us": 1e6 * seconds / reads if reads else None,
        "expired": metric_sum(log_dir, "parasync_ps_table_rows_expired_total"),
    }


def compare(args, configs, data, work):
    """--repeats: the configurations alternating, then each one's median examples/sec."""
    speeds = {c: [] for c in configs}
    aucs = {c: [] for c in configs}
    for k in range(args.repeats):
        for c in configs:
            r = run(args, c, data, work, k + 1)
            speeds[c].append(r["examples_per_second"])
            aucs[c].append(r["auc"])
            print(f"  repeat {k + 1} {c}: {r['examples_per_second']:,.0f} examples/s, "
                  f"AUC {fmt(r['auc'], '.4f')}, {fmt(r['expired'], ',.0f')} rows expired",
                  flush=True)
    first = statistics.median(speeds[configs[0]])
    print()
    print(f"budget {args.budget} per server, 2 servers, 2 workers, async, {args.epochs} epoch(s), "
          f"{args.repeats} runs each, alternating")
    print("| configuration | median examples/s | min - max | ratio to "
          f"{configs[0]} | median test AUC |")
    print("|---|---|---|---|---|")
    for c in configs:
        med = statistics.median(speeds[c])
        print(f"| {c} | {med:,.0f} | {min(speeds[c]):,.0f} - {max(speeds[c]):,.0f} "
              f"| {med / first:.3f} | {statistics.median(aucs[c]):.4f} |")
    return 0


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", type=int, default=1000000)
    p.add_argument("--test", type=int, default=50000)
    p.add_argument("--fields", type=int, default=8)
    p.add_argument("--vocab", type=int, default=20000000)
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument("--budget", default="8MiB", help="--table-memory of each server")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--configs", default="unlimited,tiered,forget",
                   help=f"some of {','.join(CONFIGS)}")
    p.add_argument("--expire-after", default=None,
                   help="--table-expire-after of every server (all configurations)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run the configurations this many times, alternating; medians")
    p.add_argument("--baseline-bin", default=None,
                   help="the binaries of configuration baseline (another build)")
    p.add_argument("--baseline-as", default="unlimited",
                   choices=[c for c in CONFIGS if c != "baseline"],
                   help="the configuration whose flags baseline runs with")
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--work", default=None, help="keep the data and the runs here")
    args = p.parse_args()
    configs = args.configs.split(",")
    if any(c not in CONFIGS for c in configs):
        fail(f"--configs takes {', '.join(CONFIGS)}, not {args.configs}")
    if args.train < 1 or args.test < 1 or args.fields < 1 or args.epochs < 1 or args.repeats < 1:
        fail("--train, --test, --fields, --epochs and --repeats must be at least 1")
    if "baseline" in configs and not (
            args.baseline_bin and os.path.exists(os.path.join(args.baseline_bin, "parasync-launch"))):
        fail("configuration baseline needs --baseline-bin DIR with parasync-launch in it")
    if not os.path.exists(os.path.join(args.bin, "parasync-launch")):
        fail(f"no parasync-launch in {args.bin} (build first, or give --bin)")
    work = args.work or tempfile.mkdtemp(prefix="bench-tiers-")
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, "ctr")
    t0 = time.monotonic()
    gen = subprocess.run([os.path.join(args.bin, "parasync-gen-ctr"), "--out", data,
                          "--train", str(args.train), "--test", str(args.test),
                          "--fields", str(args.fields), "--vocab", str(args.vocab),
                          "--zipf", str(args.zipf), "--id-kind", "hash", "--seed", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if gen.returncode != 0:
        fail(f"parasync-gen-ctr failed: {gen.stdout.strip().splitlines()[-1:]}", 1)
    planted = re.search(r"AUC (\d\.\d+)", gen.stdout)
    print(f"data: {args.train} train / {args.test} test examples, {args.fields} fields, vocab "
          f"{args.vocab}, zipf {args.zipf}: {du(data) / 2**20:.1f} MiB on disk, generated in "
          f"{time.monotonic() - t0:.1f} s; planted model's test AUC "
          f"{planted.group(1) if planted else '?'}", flush=True)
    if args.repeats > 1:
        return compare(args, configs, data, work)
    rows = [run(args, c, data, work) for c in configs]
    print()
    print(f"budget {args.budget} per server, 2 servers, 2 workers, async, {args.epochs} epoch(s)")
    print("| configuration | test AUC | test log-loss | examples/s | id rows/s | rows in memory "
          "| rows in store | created | evicted | promoted | cold reads | mean cold read |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {fmt(r['auc'], '.4f')} | {fmt(r['loss'], '.4f')} "
              f"| {fmt(r['examples_per_second'], ',.0f')} | {fmt(r['rows_per_second'], ',.0f')} "
              f"| {fmt(r['in_memory'], ',.0f')} | {fmt(r['in_store'], ',.0f')} "
              f"| {fmt(r['created'], ',.0f')} | {fmt(r['evicted'], ',.0f')} "
              f"| {fmt(r['promoted'], ',.0f')} | {fmt(r['cold_reads'], ',.0f')} "
              f"| {fmt(r['cold_read_us'], '.1f')} us |")
    if args.work is None:
        print(f"(runs kept in {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
