#!/usr/bin/env python3
"""The colocated layout's bytes per step on each link, measured in tools/netlab at N hosts
against the model docs/performance.md states ("Scale on paper"): with one server and one
worker per host and a model of M bytes on the wire, every step each host's link carries
2·M·(N−1)/N each way -- the worker's pushes and pulls of the N−1 remote shards, and the
other workers' pushes and pulls of the local one -- as a ring all-reduce does.

  netlab_scale.py [--hosts 2,4,8] [--rate 1gbit] [--steps 40,80] [--model cnn]

For each N: two sync runs of --steps a and b steps per worker (parasync-launch --ps
colocated --max-steps), each in a fresh lab; the per-step bytes are the difference of the
two runs' link counters over b − a steps, so start-up (registration, the first pull, the
chief's evaluations) cancels out. M is what the servers counted as pushed per worker step
(parasync_ps_bytes_total, type push). Prints a markdown table. Root needed (exit 3 where
namespaces cannot be made); timings are not the point here: with N workers and N servers
on a 2-core VM the step time is the CPU's, the bytes are not.
"""
import argparse
import glob
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
NETLAB = os.path.join(ROOT, "tools", "netlab")


def run(args, hosts, steps, work):
    name = f"nls{hosts}-{steps}"
    links = os.path.join(work, f"links-{hosts}-{steps}.json")
    log_dir = os.path.join(work, f"run-{hosts}-{steps}")
    launch = (f'H=$(for h in $NETLAB_HOSTS; do printf "%s:1," "$h"; done); '
              f'exec {shlex.quote(os.path.join(args.bin_dir, "parasync-launch"))} --ps colocated '
              f'-H "${{H%,}}" --ssh-command "$NETLAB_EXEC" --model {args.model} --mode sync '
              f'--epochs 1 --max-steps {steps} --dataset {shlex.quote(args.data)} '
              f'--log-dir {log_dir} > {log_dir}.log 2>&1')
    done = subprocess.run([sys.executable, NETLAB, "run", "--hosts", str(hosts), "--rate",
                           args.rate, "--name", name, "--json", links, "--", "sh", "-c", launch],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode == 3:
        print(done.stdout, file=sys.stderr)
        sys.exit(3)
    if done.returncode != 0:
        sys.exit(f"netlab_scale: {hosts} hosts, {steps} steps failed; see {log_dir}.log")
    with open(links) as f:
        per_host = json.load(f)["hosts"]
    pushed = 0.0
    for path in glob.glob(os.path.join(log_dir, "metrics-ps*.prom")):
        with open(path) as f:
            for line in f:
                if (line.startswith("parasync_ps_bytes_total{") and 'direction="in"' in line
                        and 'type="push"' in line):
                    pushed += float(line.rsplit(" ", 1)[1])
    return per_host, pushed


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--hosts", default="2,4,8")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--steps", default="40,80")
    p.add_argument("--model", default="cnn")
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = p.parse_args()
    a, b = (int(s) for s in args.steps.split(","))
    if not 0 < a < b:
        p.error("--steps A,B with 0 < A < B")
    print(f"colocated layout, {args.model}, sync, links {args.rate} (tools/netlab); per worker "
          f"step, the difference of runs of {a} and {b} steps")
    print()
    print("| hosts N | M (pushed per worker step) | link MB per step out / in, mean (min-max) "
          "| model 2·M·(N−1)/N |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for n in (int(h) for h in args.hosts.split(",")):
            hosts_a, pushed_a = run(args, n, a, work)
            hosts_b, pushed_b = run(args, n, b, work)
            m = (pushed_b - pushed_a) / (n * (b - a))
            out = [(hb["tx_bytes"] - ha["tx_bytes"]) / (b - a) for ha, hb in zip(hosts_a, hosts_b)]
            inn = [(hb["rx_bytes"] - ha["rx_bytes"]) / (b - a) for ha, hb in zip(hosts_a, hosts_b)]
            model = 2 * m * (n - 1) / n
            print(f"| {n} | {m / 1e6:.2f} MB | {statistics.mean(out) / 1e6:.2f} "
                  f"({min(out) / 1e6:.2f}-{max(out) / 1e6:.2f}) / {statistics.mean(inn) / 1e6:.2f} "
                  f"({min(inn) / 1e6:.2f}-{max(inn) / 1e6:.2f}) | {model / 1e6:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
