#!/usr/bin/env python3
"""parasync's layouts beside PyTorch DDP on emulated links (tools/netlab): each
configuration in a fresh lab of W worker hosts (plus S server hosts for `dedicated`), every
link shaped to --rate both ways, the Keras CNN on Fashion-MNIST, one process per worker host.

  bench_netlab.py [--rate 1gbit] [--workers 2] [--servers 2] [--epochs 1] [--mode sync]
                  [--configs ddp,dedicated,colocated,colocated-tcp,colocated-bf16,
                             colocated-overlap,colocated-overlap-bf16] [--target 0.88]
                  [--eval-every N] [--per-host K] [--max-steps N]
                  [--json FILE] [--keep DIR]

Configurations:
  ddp             PyTorch DDP (gloo), tools/benchmarks/torch_ddp_cnn.py --rank r on host r
  ddp-fp16        the same with PyTorch's fp16_compress_hook (--hook fp16)
  dedicated       parasync, S servers on S hosts of their own, workers on the W others
  colocated       parasync, --ps colocated: one server on every worker host, which the
                  worker beside it reaches over a unix socket (the launcher's default there)
  colocated-tcp   the same over TCP to the local server too (--no-ipc)
  colocated-bf16  the same, --wire-dtype bfloat16
  colocated-int8  the same, --wire-dtype int8 (gradients in int8 with error feedback,
                  parameters pulled as int8 changes to each worker's copy: delta pulls)
  colocated-overlap       colocated, --mode sync:delayed: each step's exchange overlaps the
                          next gradient's compute (needs --mode sync)
  colocated-overlap-bf16  the same, --wire-dtype bfloat16
  colocated-overlap-int8  the same, --wire-dtype int8
  colocated-int4, colocated-overlap-int4  those with --wire-dtype int4 (4 bits an element,
                          both ways, error feedback as int8's)
  colocated-topk          colocated, --wire-dtype topk (or topk:R, --topk-density R): of
                          every 256 gradient elements the largest in int8, error feedback;
                          parameters in top-k delta pulls
  colocated-overlap-topk  the same under sync:delayed
  any compressed configuration + "-noprobe": with --topk-probe off (the format given kept,
                          not checked against int8 and float32)
  colocated-int8-bfpull, colocated-overlap-int8-bfpull, colocated-topk-bfpull
                          those with --delta-pulls off: parameters pulled in bfloat16
  hvd-colocated   colocated, the workers running a Horovod script unchanged:
                  worker/python/examples/horovod_mnist.py --model cnn --loader indexed
                  --clip 0 (DDP's script's loop: batches gathered by indexing, no
                  clipping; parasync.horovod: the
                  servers average, each worker applies its own torch.optim.Adam; started with
                  DDP's allocator variables, tools/benchmarks/torch_env.py)
  hvd-colocated-fp16  the same with hvd.Compression.fp16 (half the bytes each way)
  hvd-colocated-bf16  the same with hvd.Compression.bf16
  hvd-colocated-int8  the same with hvd.Compression.int8 (both ways in int8, error feedback
                      on the workers and the servers)
  hvd-colocated-int4  the same with hvd.Compression.int4
  hvd-colocated-topk  the same with hvd.Compression.topk (both ways in top-k, error feedback
                      on the workers and the servers; --topk-density R: .density(R))
  hvd-colocated2      hvd-colocated with two servers on every worker host (--ps h:2 --ipc):
                      each shard's push smaller, so the one waiting for the last
                      gradients holds less
  hvd-colocated2-fp16 the same with hvd.Compression.fp16
  py-colocated    colocated, the workers running a parasync.torch script:
                  worker/python/examples/train.py --model cnn (pst.Optimizer, the servers'
                  Adam; DDP's allocator variables)
  py-colocated-overlap    the same under sync:delayed: pst.Optimizer's exchange runs
                          behind the next step's compute, at the predicted parameters
  hvd-colocated-overlap   hvd-colocated under sync:delayed: each step applies the step
                          before's average
  NAME+local      any parasync configuration with --local-aggregation: the --per-host K
                  workers of a host exchange each step through one of them (one push and
                  one pull per host; e.g. colocated-bf16+local beside colocated-bf16)
Every configuration trains the same model with Adam 1e-3, batch 64 per worker, seed 1.

Prints a markdown table: examples/s (all workers' training examples over the wall time from
the first evaluation to the last, evaluations included on both sides), the wall time to
--target test accuracy (the first evaluation at or above it; "-" if none), the final
accuracy, the busiest worker host's link bytes per epoch each way (from the links' counters),
a parasync worker's mean step split (pull, compute, push, from
parasync_worker_step_seconds: what the step waited for; with overlap also the whole exchange,
from the workers' epoch lines), and how busy the machine's CPUs were over the run (the CPU
seconds of every process over the wall time times the CPU count: near 100 %, the CPUs are
the bound, not the links); under it, what DDP's rank 0 ran with (its PyTorch, BLAS and the
allocator every rank starts with: tools/benchmarks/torch_ddp_cnn.py). Needs root (network
namespaces) and /usr/bin/python3 with PyTorch for ddp; exit 2 for bad flags, 3 where
namespaces cannot be made.
"""
import argparse
import resource
import time
import importlib.machinery
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
NETLAB = os.path.join(ROOT, "tools", "netlab")
CONFIGS = ("ddp", "ddp-fp16", "dedicated", "colocated", "colocated-tcp", "colocated-bf16",
           "colocated-overlap", "colocated-overlap-bf16", "hvd-colocated", "hvd-colocated-fp16",
           "hvd-colocated-bf16", "hvd-colocated2", "hvd-colocated2-fp16", "colocated-int8",
           "colocated-overlap-int8", "hvd-colocated-int8", "colocated-int4",
           "colocated-overlap-int4", "hvd-colocated-int4", "colocated-topk",
           "colocated-overlap-topk", "hvd-colocated-topk", "py-colocated",
           "py-colocated-overlap", "hvd-colocated-overlap", "colocated-int8-bfpull",
           "colocated-overlap-int8-bfpull", "colocated-topk-bfpull")
DDP_PORT = 29400


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--mode", default="sync")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--target", type=float, default=0.88)
    p.add_argument("--eval-every", type=int, default=0,
                   help="the chief (DDP's rank 0 alike) also evaluates every N of its steps "
                        "within an epoch, for time to --target at that resolution (the "
                        "Horovod and parasync.torch scripts' every rank alike; default 0: none)")
    p.add_argument("--topk-density", type=float, default=None,
                   help="the fraction of each 256 gradient elements the *-topk configurations "
                        "send, in (0, 1] (default: topk's own, 1/32)")
    p.add_argument("--per-host", type=int, default=1,
                   help="worker processes on each worker host (DDP's ranks alike; default 1)")
    p.add_argument("--max-steps", type=int, default=0,
                   help="parasync configurations: each worker stops after N steps (for the "
                        "slow links; default 0: whole epochs; not with ddp)")
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--python", default="/usr/bin/python3")
    p.add_argument("--json", help="write every configuration's figures to FILE")
    p.add_argument("--keep", help="keep each run's logs under DIR/<config>")
    args = p.parse_args()
    args.configs = args.configs.split(",")
    unknown = [c for c in args.configs
               if c.removesuffix("+local").removesuffix("-noprobe") not in CONFIGS or
               (c.endswith("+local") and c.startswith("ddp"))]
    if unknown:
        p.error(f"--configs: unknown {', '.join(unknown)} (known: {', '.join(CONFIGS)})")
    if args.mode != "sync" and any("overlap" in c for c in args.configs):
        p.error("--configs: the overlap configurations run sync:delayed, beside --mode sync")
    if args.workers < 1 or args.servers < 1 or args.epochs < 1 or args.per_host < 1:
        p.error("--workers, --servers, --epochs and --per-host must be at least 1")
    if args.max_steps and any(c.startswith("ddp") for c in args.configs):
        p.error("--max-steps: the ddp configurations run whole epochs")
    return args


def netlab_run(args, name, hosts, command, links):
    """Runs `command` in a fresh lab; returns its status, output and how busy the machine's
    CPUs were meanwhile (the CPU seconds of every process it started, all of them reaped,
    over the wall time times the CPU count)."""
    argv = [sys.executable, NETLAB, "run", "--hosts", str(hosts), "--rate", args.rate,
            "--name", name, "--json", links, "--", "sh", "-c", command]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode == 3:
        print(done.stdout, file=sys.stderr)
        sys.exit(3)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    busy = round(cpu / (wall * (os.cpu_count() or 1)), 3)
    return done.returncode, done.stdout, busy


def link_mb_per_epoch(links, worker_hosts, epochs):
    with open(links) as f:
        hosts = {h["address"]: h for h in json.load(f)["hosts"]}
    tx = max(hosts[a]["tx_bytes"] for a in worker_hosts) / 1e6 / epochs
    rx = max(hosts[a]["rx_bytes"] for a in worker_hosts) / 1e6 / epochs
    return round(tx, 1), round(rx, 1)


def epochs_run(args):
    """The epochs a parasync run trained: --epochs, or --max-steps as a fraction of one
    (60,000 examples shared by every worker, batch 64): link bytes are quoted per epoch."""
    if not args.max_steps:
        return args.epochs
    return min(args.epochs, args.max_steps * 64 * args.workers * args.per_host / 60000)


def lab_hosts(name, count):
    """The addresses tools/netlab gives lab `name` (its subnet_of rule)."""
    loader = importlib.machinery.SourceFileLoader("netlab", NETLAB)
    netlab = types.ModuleType("netlab")
    loader.exec_module(netlab)
    subnet = netlab.subnet_of(name)
    return [f"{subnet}{i + 1}" for i in range(count)]


def run_ddp(args, config, work):
    name = f"bnl-{config}"
    hosts = lab_hosts(name, args.workers)
    ranks = []
    processes = args.workers * args.per_host
    for r in range(processes):
        cmd = (f"{shlex.quote(args.python)} {shlex.quote(os.path.join(HERE, 'torch_ddp_cnn.py'))}"
               f" --processes {processes} --rank {r} --master {hosts[0]}:{DDP_PORT}"
               f" --ifname eth0 --epochs {args.epochs} --data {shlex.quote(args.data)}"
               f" --hook {'fp16' if config == 'ddp-fp16' else 'none'}"
               f" --eval-every {args.eval_every}")
        host = hosts[r // args.per_host]
        ranks.append(f'$NETLAB_EXEC {host} {shlex.quote(cmd)} > {work}/rank{r}.log 2>&1 &')
    command = " ".join(ranks) + " wait"
    links = os.path.join(work, "links.json")
    status, out, busy = netlab_run(args, name, args.workers, command, links)
    record = None
    with open(os.path.join(work, "rank0.log")) as f:
        for line in f:
            if line.startswith("{"):
                record = json.loads(line)
    if record is None:
        return {"config": config, "error": f"no result (exit {status}); see {work}/rank0.log"}
    examples = record["train_examples"] * args.epochs
    evaluated = sorted([(w, a) for a, w in zip(record["test_accuracy"], record["wall_s"])] +
                       [(r["wall_s"], r["test_accuracy"]) for r in record.get("within", [])])
    reached = [w for w, a in evaluated if a >= args.target]
    return {"config": config, "examples_per_sec": round(examples / record["wall_s"][-1]),
            "time_to_target_s": reached[0] if reached else None,
            "final_accuracy": record["test_accuracy"][-1],
            "link_mb_per_epoch": link_mb_per_epoch(links, hosts, args.epochs), "split": None,
            "cpu_busy": busy, "torch": record.get("torch")}


def step_split(log_dir, workers):
    sums, counts = {}, {}
    pattern = re.compile(r'^parasync_worker_step_seconds_(sum|count)\{[^}]*phase="(\w+)"[^}]*\} (\S+)$')
    for i in range(workers):
        path = os.path.join(log_dir, f"metrics-worker{i}.prom")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                m = pattern.match(line.strip())
                if m:
                    target = sums if m.group(1) == "sum" else counts
                    target[m.group(2)] = target.get(m.group(2), 0.0) + float(m.group(3))
    return {k: round(1e3 * sums[k] / counts[k], 2) for k in sums if counts.get(k)}


def exchange_ms(log_dir, workers):
    """The mean of the workers' whole exchange per step (sync:delayed epoch lines), or None."""
    pattern = re.compile(r"the exchange took ([0-9.]+) ms")
    values = []
    for i in range(workers):
        path = os.path.join(log_dir, f"worker{i}.log")
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                values += [float(m.group(1)) for m in pattern.finditer(f.read())]
    return round(sum(values) / len(values), 1) if values else None


def horovod_command(args, config):
    """The Horovod script's command line for an hvd-* configuration (Adam 1e-3 after its
    hvd.size() scaling, as every other configuration's)."""
    sys.path.insert(0, HERE)
    import torch_env  # noqa: E402  (the allocator every PyTorch side starts with)
    env = " ".join(f"{k}={v}" for k, v in torch_env.allocator_env(torch_env.ALLOCATOR).items())
    compression = config.split("-")[2] if config.count("-") == 2 else "none"
    if compression == "overlap":
        compression = "none"
    script = os.path.join(ROOT, "worker", "python", "examples", "horovod_mnist.py")
    return (f"env {env} {args.python} {script} --model cnn --threads 1 "
            f"--lr {0.001 / args.workers} --seed 1 --compression {compression} "
            f"--loader indexed --clip 0 --data {args.data}" +
            (f" --topk-density {args.topk_density}"
             if compression == "topk" and args.topk_density else ""))


def torch_script_command(args):
    """The parasync.torch script's command line for a py-* configuration (its optimizer,
    rate, batch and epochs from the launcher's variables)."""
    sys.path.insert(0, HERE)
    import torch_env  # noqa: E402
    env = " ".join(f"{k}={v}" for k, v in torch_env.allocator_env(torch_env.ALLOCATOR).items())
    script = os.path.join(ROOT, "worker", "python", "examples", "train.py")
    return f"env {env} {args.python} {script} --model cnn --threads 1 --data {args.data}"


def run_parasync(args, config, work):
    local = config.endswith("+local")
    full_name = config
    config = config.removesuffix("+local")
    no_probe = config.endswith("-noprobe")
    config = config.removesuffix("-noprobe")
    bf_pulls = config.endswith("-bfpull")
    config = config.removesuffix("-bfpull")
    name = f"bnl-{config}{'-l' if local else ''}"[:20]
    dedicated = config == "dedicated"
    count = args.workers + (args.servers if dedicated else 0)
    hosts = lab_hosts(name, count)
    workers = hosts[:args.workers]
    ps = ",".join(f"{h}:1" for h in hosts[args.workers:]) if dedicated else "colocated"
    if "colocated2" in config:
        ps = ",".join(f"{h}:2" for h in workers)
    log_dir = os.path.join(work, "run")
    flags = ["--ps", ps, "-H", ",".join(f"{h}:{args.per_host}" for h in workers), "--ssh-command",
             "$NETLAB_EXEC", "--model", "cnn", "--mode",
             "sync:delayed" if "overlap" in config else args.mode, "--epochs",
             str(args.epochs), "--optimizer", "adam", "--lr", "0.001", "--batch-size", "64",
             "--seed", "1", "--dataset", args.data, "--log-dir", log_dir]
    if args.eval_every:
        flags += ["--eval-every", str(args.eval_every)]
    if args.max_steps:
        flags += ["--max-steps", str(args.max_steps)]
    if local:
        flags += ["--local-aggregation"]
    if config.endswith("bf16"):
        flags += ["--wire-dtype", "bfloat16"]
    for narrow in ("int8", "int4"):
        if config.endswith(narrow) and not config.startswith("hvd-"):
            flags += ["--wire-dtype", narrow]
    if config.endswith("topk") and not config.startswith("hvd-"):
        flags += ["--wire-dtype",
                  f"topk:{args.topk_density}" if args.topk_density else "topk"]
    if config == "colocated-tcp":
        flags += ["--no-ipc"]
    if no_probe:
        flags += ["--topk-probe", "off"]
    if bf_pulls:
        flags += ["--delta-pulls", "off"]
    if "colocated2" in config:
        flags += ["--ipc"]
    if config.startswith("hvd-"):
        # The script chooses its optimizer (worker-side) and learning rate.
        drop = {"--model": 2, "--optimizer": 2, "--lr": 2}
        kept, i = [], 0
        while i < len(flags):
            if flags[i] in drop:
                i += drop[flags[i]]
                continue
            kept.append(flags[i])
            i += 1
        flags = kept
        flags += ["--worker-command", horovod_command(args, config)]
    if config.startswith("py-"):
        flags += ["--worker-command", torch_script_command(args)]
    command = " ".join([shlex.quote(os.path.join(args.bin_dir, "parasync-launch"))] +
                       [f'"{f}"' if f == "$NETLAB_EXEC" else shlex.quote(f) for f in flags])
    command += f" > {work}/launch.log 2>&1"
    links = os.path.join(work, "links.json")
    status, _, busy = netlab_run(args, name, count, command, links)
    eval_path = os.path.join(log_dir, "eval.jsonl")
    config = full_name
    if status != 0 or not os.path.exists(eval_path):
        return {"config": config, "error": f"exit {status}; see {work}/launch.log"}
    with open(eval_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    first, last = rows[0], rows[-1]
    if first["epoch"] != 0:  # a Horovod script evaluates after each epoch only: its clock
        first = {"examples": 0, "wall_s": 0.0}  # starts at its training's start
    examples = last["examples"] - first["examples"]
    seconds = last["wall_s"] - first["wall_s"]
    reached = [r["wall_s"] - first["wall_s"] for r in rows[1:] if r["test_accuracy"] >= args.target]
    return {"config": config, "examples_per_sec": round(examples / seconds),
            "time_to_target_s": round(reached[0], 1) if reached else None,
            "final_accuracy": round(last["test_accuracy"], 4),
            "link_mb_per_epoch": link_mb_per_epoch(links, workers, epochs_run(args)),
            "split": step_split(log_dir, args.workers * args.per_host),
            "exchange_ms": exchange_ms(log_dir, args.workers * args.per_host), "cpu_busy": busy}


def main():
    args = parse()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for config in args.configs:
            work = os.path.join(args.keep or tmp, config)
            os.makedirs(work, exist_ok=True)
            print(f"bench_netlab: {config} ...", file=sys.stderr, flush=True)
            r = run_ddp(args, config, work) if config.startswith("ddp") else \
                run_parasync(args, config, work)
            results.append(r)
            print(f"bench_netlab: {json.dumps(r)}", file=sys.stderr, flush=True)
    ddp = next((r for r in results if r["config"] == "ddp" and "error" not in r), None)
    ddp16 = next((r for r in results if r["config"] == "ddp-fp16" and "error" not in r), None)
    print(f"links {args.rate} both ways (tools/netlab, no added delay); {args.workers} worker "
          f"hosts x {args.per_host} worker(s); the CNN, {args.mode}, {args.epochs} epoch(s), batch 64 per worker, Adam 1e-3")
    print()
    print("| configuration | examples/s | × DDP | × DDP-fp16 | time to {:.2f} | final accuracy | "
          "busiest worker link MB/epoch out / in | step ms: pull / compute / push | CPUs busy |"
          .format(args.target))
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['config']} | failed: {r['error']} | | | | | | | |")
            continue
        ratio = f"{r['examples_per_sec'] / ddp['examples_per_sec']:.2f}" if ddp else "-"
        ratio16 = f"{r['examples_per_sec'] / ddp16['examples_per_sec']:.2f}" if ddp16 else "-"
        split = r["split"] or {}
        split_text = (" / ".join(f"{split.get(k, 0):.1f}" for k in ("pull", "compute", "push"))
                      if split else "-")
        if r.get("exchange_ms") is not None:
            split_text += f" (exchange {r['exchange_ms']:.1f}, overlapped)"
        target = f"{r['time_to_target_s']:.1f} s" if r["time_to_target_s"] is not None else "-"
        tx, rx = r["link_mb_per_epoch"]
        print(f"| {r['config']} | {r['examples_per_sec']:,} | {ratio} | {ratio16} | {target} | "
              f"{r['final_accuracy']:.4f} | {tx:,.0f} / {rx:,.0f} | {split_text} | "
              f"{100 * r['cpu_busy']:.0f} % |")
    if ddp:  # its allocator from its start, and its BLAS (tools/benchmarks/torch_env.py)
        print(f"\nPyTorch DDP's rank 0 ran with: {ddp.get('torch') or 'not reported'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rate": args.rate, "workers": args.workers, "epochs": args.epochs,
                       "mode": args.mode, "results": results}, f, indent=1)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
