#!/usr/bin/env python3
"""ps-lite beside parasync on emulated links (tools/netlab): one worker host pushes and then
pulls one dense tensor of --elements float32 to --servers server hosts, round after round,
every link shaped to --rate both ways.

  bench_pslite.py --kv-bench PATH [--rate 1gbit] [--servers 2] [--elements 2770634]
                  [--rounds 30] [--seconds 20] [--json FILE] [--keep DIR]

  ps-lite   tools/benchmarks/pslite/kv_bench (build it with tools/benchmarks/pslite/build.sh
            from a ps-lite checkout): ps-lite's scheduler and worker on host 1, a server on
            each other host; --rounds rounds of ZPush then ZPull, each awaited (the pattern
            of ps-lite's tests/test_kv_app_benchmark.cc); the median round.
  parasync  parasync-ps (async, SGD) on the same server hosts and parasync-load --workers 1
            on host 1: Pull then Push, each awaited, for --seconds; the mean round (the
            seconds over the rounds acknowledged).

The default size is the Keras CNN's (2,770,634 parameters). Prints a markdown table: the
round's milliseconds, the tensor's megabytes moved per second of round (2 x 4 bytes an
element: one way and back), and the worker link's megabytes per round each way from the
links' counters (ps-lite sends every value's 8-byte key with it, and the keys again to pull).
Needs root (network namespaces); exit 2 for bad flags, 3 where namespaces cannot be made.
"""
import argparse
import json
import os
import re
import shlex
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from bench_netlab import lab_hosts, netlab_run  # noqa: E402  (the same lab rules)

SCHEDULER_PORT = 9091
PS_PORT = 27100


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--kv-bench", required=True, help="tools/benchmarks/pslite/build.sh's binary")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--elements", type=int, default=2770634)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--json", help="write the figures to FILE")
    p.add_argument("--keep", help="keep each run's logs under DIR/<system>")
    args = p.parse_args()
    if not os.access(args.kv_bench, os.X_OK):
        p.error(f"--kv-bench {args.kv_bench} is not an executable "
                "(tools/benchmarks/pslite/build.sh builds it)")
    if args.servers < 1 or args.elements < args.servers or args.rounds < 2 or args.seconds <= 0:
        p.error("--servers >= 1, --elements >= --servers, --rounds >= 2, --seconds > 0")
    return args


def in_lab(args, name, command, work):
    """Runs `command` in a fresh lab of 1 + servers hosts (bench_netlab's netlab_run); returns
    its output and the worker link's (tx, rx) bytes."""
    links = os.path.join(work, "links.json")
    status, out, _ = netlab_run(args, name, 1 + args.servers, command, links)
    with open(os.path.join(work, "run.log"), "w") as f:
        f.write(out)
    if status != 0 or not os.path.exists(links):
        raise RuntimeError(f"{name}: exit {status}; see {work}/run.log")
    with open(links) as f:
        hosts = json.load(f)["hosts"]
    worker = lab_hosts(name, 1)[0]
    link = next(h for h in hosts if h["address"] == worker)
    return out, (link["tx_bytes"], link["rx_bytes"])


def run_pslite(args, work):
    name = "bps-pslite"
    hosts = lab_hosts(name, 1 + args.servers)
    common = (f"DMLC_NUM_SERVER={args.servers} DMLC_NUM_WORKER=1 DMLC_PS_ROOT_URI={hosts[0]} "
              f"DMLC_PS_ROOT_PORT={SCHEDULER_PORT} DMLC_INTERFACE=eth0")
    binary = shlex.quote(os.path.abspath(args.kv_bench))

    def on(host, role, log):
        cmd = f"env {common} DMLC_NODE_HOST={host} DMLC_ROLE={role} {binary} {args.elements} {args.rounds}"
        return f'$NETLAB_EXEC {host} {shlex.quote(cmd)} > {work}/{log} 2>&1'

    parts = [on(hosts[0], "scheduler", "scheduler.log") + " &"]
    parts += [on(h, "server", f"server{i}.log") + " &" for i, h in enumerate(hosts[1:])]
    parts += [on(hosts[0], "worker", "worker.log") + "; rc=$?; wait; exit $rc"]
    _, (tx, rx) = in_lab(args, name, " ".join(parts), work)
    with open(os.path.join(work, "worker.log")) as f:
        record = next((json.loads(line) for line in f if line.startswith("{")), None)
    if record is None:
        raise RuntimeError(f"ps-lite printed no result; see {work}/worker.log")
    return {"system": "ps-lite", "round_ms": record["median_round_ms"], "rounds": args.rounds,
            "link_mb_per_round": (round(tx / 1e6 / args.rounds, 2), round(rx / 1e6 / args.rounds, 2))}


def run_parasync(args, work):
    name = "bps-parasync"
    hosts = lab_hosts(name, 1 + args.servers)
    ps_hosts = ",".join(f"{h}:{PS_PORT}" for h in hosts[1:])
    bin_dir = os.path.abspath(args.bin_dir)
    parts = []
    for i, h in enumerate(hosts[1:]):
        cmd = (f"{shlex.quote(bin_dir)}/parasync-ps --ps-hosts {ps_hosts} --worker-hosts "
               f"{hosts[0]}:40000 --task-index {i} --mode async --log-level warn "
               f"--worker-timeout 60")
        parts.append(f'$NETLAB_EXEC {h} {shlex.quote(cmd)} > {work}/ps{i}.log 2>&1 &')
    load = (f"{shlex.quote(bin_dir)}/parasync-load --workers 1 --ps-hosts {ps_hosts} "
            f"--elements {args.elements} --seconds {args.seconds} --mode async "
            f"--log-dir {work}")
    parts.append(f'$NETLAB_EXEC {hosts[0]} {shlex.quote(load)} > {work}/load.log 2>&1; '
                 "rc=$?; cat " + f"{work}/load.log; exit $rc")
    out, (tx, rx) = in_lab(args, name, " ".join(parts), work)
    m = re.search(r"pushes acknowledged (\d+) ", out)
    t = re.search(r"elements \d+, ([0-9.]+) s", out)
    if not m or not t or int(m.group(1)) < 2:
        raise RuntimeError(f"parasync-load printed no rounds; see {work}/load.log")
    rounds = int(m.group(1))
    return {"system": "parasync", "round_ms": round(1e3 * float(t.group(1)) / rounds, 3),
            "rounds": rounds,
            "link_mb_per_round": (round(tx / 1e6 / rounds, 2), round(rx / 1e6 / rounds, 2))}


def main():
    args = parse()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for system, run in (("ps-lite", run_pslite), ("parasync", run_parasync)):
            work = os.path.join(args.keep or tmp, system)
            os.makedirs(work, exist_ok=True)
            print(f"bench_pslite: {system} ...", file=sys.stderr, flush=True)
            try:
                results.append(run(args, work))
            except RuntimeError as e:
                results.append({"system": system, "error": str(e)})
            print(f"bench_pslite: {json.dumps(results[-1])}", file=sys.stderr, flush=True)
    mb = 2 * 4 * args.elements / 1e6
    print(f"links {args.rate} both ways (tools/netlab); 1 worker host, {args.servers} server "
          f"hosts; {args.elements:,} float32 ({mb / 2:.2f} MB) pushed then pulled per round")
    print()
    print("| system | round ms | tensor MB/s (both ways) | worker link MB per round out / in |")
    print("|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['system']} | failed: {r['error']} | | |")
            continue
        tx, rx = r["link_mb_per_round"]
        print(f"| {r['system']} | {r['round_ms']:.1f} | {mb / (r['round_ms'] / 1e3):.1f} | "
              f"{tx:.2f} / {rx:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rate": args.rate, "servers": args.servers, "elements": args.elements,
                       "results": results}, f, indent=1)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
