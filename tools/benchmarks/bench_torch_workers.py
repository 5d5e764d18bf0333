#!/usr/bin/python3
"""parasync's Python workers side by side with PyTorch DDP and with parasync's C++ worker, in
one invocation on this machine: the Keras CNN (parasync's `cnn`) on Fashion-MNIST, 2 workers,
the same per-worker batch, Adam at the same learning rate, 1 thread each, repeats alternating:

  ddp         tools/benchmarks/torch_ddp_cnn.py: DistributedDataParallel over gloo, 2 processes
  py-async    parasync-launch --ps 2 --workers 2 --mode async --worker-command
              "worker/python/examples/train.py --model cnn" (parasync.torch)
  py-sync     the same, --mode sync
  py-*-no-overlap  the same with train.py --no-overlap: every push at step(), none during
              backward (on 2 cores the pushes compete with backward for the CPU)
  *-bf16      the same with --wire-dtype bfloat16 (half the bytes each way; the servers keep
              float32)
  cpp-async   parasync-launch --ps 2 --workers 2 --mode async --model cnn (parasync-worker)
  hvd-sync    parasync-launch --ps 2 --workers 2 --mode sync --worker-command
              "worker/python/examples/horovod_mnist.py --model cnn --loader indexed --clip 0"
              (parasync.horovod: the servers average, each worker applies its own
              torch.optim.Adam; the loop's shape is DDP's script's: the same model,
              per-worker batch and learning rate, each batch gathered from the training
              tensors in one indexing, no clipping)
  hvd-sync-fp16, hvd-sync-bf16  the same with --compression fp16 / bf16 (Horovod's
              Compression: half the bytes each way)
  hvd-async   the same script, --mode async (each worker pushes its optimizer's change)

Per configuration (medians over the repeats): each epoch's test accuracy and wall seconds
since training started (evaluations included, start-up not: DDP's clock starts after its
process group formed, parasync's when the chief's model is registered and pulled), the
training examples/sec of the last epoch over all workers (each worker's epoch line: its
examples over its epoch's training seconds, summed), and the seconds to reach DDP's last-epoch
accuracy: the wall of the first epoch whose accuracy is at least that (or "not reached").
parasync's chief does not evaluate before training (train.py --no-initial-eval; the C++
worker does: its first row is subtracted).

  bench_torch_workers.py [--epochs 2] [--repeats 3] [--configs ddp,py-async,py-sync,cpp-async]

Run with /usr/bin/python3 (Debian's PyTorch on OpenBLAS; tools/benchmarks/torch_env.py refuses
the reference BLAS). DDP's processes run with torch_env.py's allocator from their start
(torch_ddp_cnn.py starts itself again with it); parasync's processes run as they are (the
Python workers' train.py sets glibc's thresholds with mallopt after start, the C++ processes
likewise: common/process.h). Below the table, what PyTorch ran with on each side (DDP's rank
0 and the Python workers' chief, from their JSON lines). The hvd-* workers start with the
same allocator variables as DDP's processes (torch_env.py's, in their environment from the
start), so the two sides differ in what moves the gradients, not in malloc. Exit status 2 with one line for
bad flags or a refused baseline.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import torch_env  # noqa: E402

PROGRAM = "bench_torch_workers.py"
CONFIGS = ("ddp", "py-async", "py-sync", "py-async-no-overlap", "py-sync-no-overlap",
           "py-async-no-overlap-bf16", "cpp-async", "hvd-sync", "hvd-sync-fp16",
           "hvd-sync-bf16", "hvd-async")


def fail(message):
    print(f"{PROGRAM}: {message}", file=sys.stderr)
    sys.exit(2)


def parse():
    p = argparse.ArgumentParser(prog=PROGRAM, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seeds", default="1",
                   help="comma-separated: repeat r uses seed r mod their count, on every side "
                        "(initial values and data order)")
    args = p.parse_args()
    args.seeds = [int(x) for x in args.seeds.split(",")]
    args.configs = args.configs.split(",")
    for c in args.configs:
        if c not in CONFIGS:
            fail(f"--configs: unknown {c!r} (of {', '.join(CONFIGS)})")
    if args.epochs < 1 or args.repeats < 1:
        fail("--epochs and --repeats must be at least 1")
    return args


def run(argv):
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        print(done.stdout[-4000:], file=sys.stderr)
        fail(f"{' '.join(argv[:4])} ... exited {done.returncode}")
    return done.stdout


def ddp(args, seed):
    out = run(["/usr/bin/python3", os.path.join(HERE, "torch_ddp_cnn.py"), "--processes", "2",
               "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--lr",
               str(args.lr), "--threads", "1", "--seed", str(seed)])
    record = json.loads(out.strip().splitlines()[-1])
    return {"accuracy": record["test_accuracy"], "wall": record["wall_s"],
            "examples_per_sec": record["examples_per_sec"][-1], "torch": record["torch"]}


def parasync(args, mode, python, seed, overlap=True, wire="float32"):
    with tempfile.TemporaryDirectory(prefix="bench_torch_workers.") as log_dir:
        argv = [os.path.join(args.bin_dir, "parasync-launch"), "--ps", "2", "--workers", "2",
                "--mode", mode, "--epochs", str(args.epochs), "--batch-size",
                str(args.batch_size), "--lr", str(args.lr), "--optimizer", "adam",
                "--seed", str(seed), "--wire-dtype", wire, "--log-dir", log_dir]
        if python:
            argv += ["--worker-command", "/usr/bin/python3 " + os.path.join(
                ROOT, "worker", "python", "examples", "train.py") + " --model cnn --threads 1 "
                "--no-initial-eval" + ("" if overlap else " --no-overlap")]
        else:
            argv += ["--model", "cnn"]
        out = run(argv)
        with open(os.path.join(log_dir, "eval.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    offset = 0.0
    if rows and rows[0]["epoch"] == 0:  # the C++ chief evaluates before training
        offset = rows[0]["wall_s"]
        rows = rows[1:]
    # Each worker's last epoch line: its examples over its epoch's training seconds.
    last = {}
    for m in re.finditer(r"\[worker(\d+)\].* epoch (\d+)/\d+: (\d+) examples.* in ([0-9.]+) s",
                         out):
        last[m.group(1)] = (int(m.group(2)), int(m.group(3)) / float(m.group(4)))
    epoch = max(e for e, _ in last.values())
    chief = [json.loads(m.group(1)) for m in re.finditer(r'^.*?(\{"program": "train\.py".*\})$',
                                                         out, re.M)]
    return {"torch": chief[-1].get("torch") if chief else None,
            "accuracy": [r["test_accuracy"] for r in rows],
            "wall": [round(r["wall_s"] - offset, 2) for r in rows],
            "examples_per_sec": round(sum(x for e, x in last.values() if e == epoch))}


def horovod(args, mode, seed, compression):
    """horovod_mnist.py --model cnn under parasync-launch: its eval.jsonl (hvd.log_eval: the
    chief's wall since training started, evaluations included) and the last epoch's
    examples/s over all ranks (the script's allreduced rate: examples over training seconds)."""
    env = " ".join(f"{k}={v}" for k, v in
                   torch_env.allocator_env(torch_env.ALLOCATOR).items())
    with tempfile.TemporaryDirectory(prefix="bench_torch_workers.") as log_dir:
        argv = [os.path.join(args.bin_dir, "parasync-launch"), "--ps", "2", "--workers", "2",
                "--mode", mode, "--epochs", str(args.epochs), "--batch-size",
                str(args.batch_size), "--log-dir", log_dir, "--worker-command",
                f"env {env} /usr/bin/python3 " + os.path.join(
                    ROOT, "worker", "python", "examples", "horovod_mnist.py") +
                f" --model cnn --threads 1 --lr {args.lr / 2} --seed {seed} "
                f"--compression {compression} --loader indexed --clip 0"]
        out = run(argv)
        with open(os.path.join(log_dir, "eval.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    rates = re.findall(r"rank 0 epoch \d+: .* ([0-9.]+) examples/s \(all ranks\)", out)
    return {"torch": None, "accuracy": [r["test_accuracy"] for r in rows],
            "wall": [round(r["wall_s"], 2) for r in rows],
            "examples_per_sec": round(float(rates[-1])) if rates else 0}


def time_to(result, target):
    for accuracy, wall in zip(result["accuracy"], result["wall"]):
        if accuracy >= target:
            return wall
    return None


def main() -> int:
    args = parse()
    # The BLAS is checked in a child (torch_env.py): this process times nothing, and starts
    # parasync's processes, which must not inherit a PyTorch baseline's allocator.
    if not torch_env.ensure(PROGRAM, 1):
        return 2
    results = {c: [] for c in args.configs}
    for repeat in range(args.repeats):
        seed = args.seeds[repeat % len(args.seeds)]
        for c in args.configs:
            if c == "ddp":
                r = ddp(args, seed)
            elif c.startswith("hvd-"):
                parts = c.split("-")
                r = horovod(args, parts[1], seed, parts[2] if len(parts) > 2 else "none")
            else:
                r = parasync(args, c.split("-")[1], python=c.startswith("py"), seed=seed,
                             overlap="no-overlap" not in c,
                             wire="bfloat16" if c.endswith("bf16") else "float32")
            results[c].append(r)
            print(f"repeat {repeat + 1} (seed {seed}) {c}: accuracy {r['accuracy']}, wall {r['wall']} s, "
                  f"{r['examples_per_sec']} examples/s", flush=True)
    summary = {}
    for c, rs in results.items():
        summary[c] = {
            "accuracy": [round(statistics.median(r["accuracy"][e] for r in rs), 4)
                         for e in range(args.epochs)],
            "wall": [round(statistics.median(r["wall"][e] for r in rs), 1)
                     for e in range(args.epochs)],
            "examples_per_sec": round(statistics.median(r["examples_per_sec"] for r in rs)),
        }
    print(f"\n{args.epochs} epochs, 2 workers, batch {args.batch_size} each, Adam {args.lr}, "
          f"1 thread each, medians of {args.repeats}")
    for c, rs in results.items():
        if c.startswith(("ddp", "py-")):
            side = "PyTorch DDP" if c == "ddp" else f"{c}'s train.py"
            print(f"{side} ran with: {rs[-1].get('torch') or 'not reported'}")
    print("| config | accuracy per epoch | wall per epoch (s) | examples/s (last epoch) | "
          "time to DDP's final accuracy (s) | DDP's time / this |")
    print("| --- | --- | --- | --- | --- | --- |")
    for c, s in summary.items():
        reach, ratio = "n/a", ""
        if "ddp" in results:
            # Against the DDP run of the same repeat (same seed): its last-epoch accuracy.
            pairs = [(time_to(r, d["accuracy"][-1]), d["wall"][-1])
                     for r, d in zip(results[c], results["ddp"])]
            reached = [(t, d) for t, d in pairs if t is not None]
            if len(reached) == len(pairs):
                reach = f"{statistics.median(t for t, _ in reached):.1f}"
                ratio = f"{statistics.median(d / t for t, d in reached):.2f}"
            else:
                reach = f"reached in {len(reached)} of {len(pairs)}"
        print(f"| {c} | {s['accuracy']} | {s['wall']} | {s['examples_per_sec']} | {reach} | "
              f"{ratio} |")
    print(json.dumps({"summary": summary, "runs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
