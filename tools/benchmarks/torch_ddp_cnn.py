#!/usr/bin/python3
"""PyTorch's own data-parallel training, the baseline beside parasync's: N processes on this
machine train parasync's `cnn` (worker/python/examples/models.py, KerasCnn) on Fashion-MNIST
with DistributedDataParallel over gloo (loopback, MASTER_ADDR 127.0.0.1 and a free port),
each on its own shard of the training set (rank r takes examples r, r + N, r + 2N, ...,
every shard cut to the same length so that every step all-reduces across all ranks), with
Adam on every rank (TensorFlow's epsilon, 1e-7, as parasync's servers apply it). After each
epoch rank 0 evaluates on the whole test set while the others wait, and prints:

  epoch E: test accuracy A, wall W s, train T s, X examples/s (all processes)

wall: seconds since training started, evaluations included; train: the same without the
evaluations; examples/s: the epoch's training examples over all processes divided by its
training seconds. Left out of every figure: starting the processes, importing PyTorch,
loading the data, joining the process group and DDP's first broadcast of the parameters
(the clock starts at a barrier after all of them). The last line is JSON with every epoch's
accuracy, wall and train seconds and examples/s, the flags and what PyTorch ran with.

  torch_ddp_cnn.py [--processes 2] [--epochs 10] [--batch-size 64] [--lr 0.001]
                   [--threads 1] [--seed 1] [--train-examples N] [--data DIR] [--hook fp16]
                   [--eval-every N]
                   [--rank R --master HOST:PORT [--ifname IF]]

With --rank, this process is that one rank of --processes, on whatever host it runs (one
invocation per rank, e.g. each in its own tools/netlab host), joining rank 0 at --master
over gloo on interface --ifname (default: gloo's choice); without it the ranks are spawned
here, on loopback.

--batch-size is per process (the global batch is N times it). --threads: torch's threads in
each process, the BLAS's pool included (N x threads should not exceed the cores). Every
process runs with tools/benchmarks/torch_env.py's allocator from its start (this script
starts itself again with it in its environment, start_with_allocator, and the ranks inherit
it: first-touched pages are costly on this VM), named in the JSON's "torch"; rank 0
evaluates 250 images a pass. Run with /usr/bin/python3 (Debian's PyTorch). On the reference
BLAS (tools/benchmarks/torch_env.py) it refuses with one line on stderr and exit status 2,
as on bad flags or missing data; status 1 when a process fails.
"""
import argparse
import io
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "worker", "python", "examples"))
import torch_env  # noqa: E402
import data  # noqa: E402
import harness  # noqa: E402  ran_with, as the examples say it

PROGRAM = "torch_ddp_cnn.py"
EVAL_BATCH = 250  # as cnn_local.py's: each activation under glibc's largest mmap threshold


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        print(f"{PROGRAM}: {message}", file=sys.stderr)
        sys.exit(2)


def parse_args():
    p = OneLineParser(prog=PROGRAM, description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=2, help="ranks (default %(default)s)")
    p.add_argument("--epochs", type=int, default=10, help="default %(default)s")
    p.add_argument("--batch-size", type=int, default=64,
                   help="examples per step per process (default %(default)s)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's (default %(default)s)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per process (default %(default)s)")
    p.add_argument("--seed", type=int, default=1,
                   help="initialization and shuffling (default %(default)s)")
    p.add_argument("--train-examples", type=int, default=None,
                   help="use the first N training examples (default: all 60,000)")
    p.add_argument("--hook", choices=("none", "fp16"), default="none",
                   help="DDP communication hook: fp16 is PyTorch's fp16_compress_hook (gradients "
                        "all-reduced in float16, half the bytes; default %(default)s)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="rank 0 also evaluates every N steps within an epoch (the others wait), "
                        "as parasync-worker --eval-every N; the JSON's \"within\" lists them "
                        "(default 0: at each epoch's end only)")
    p.add_argument("--rank", type=int, help="run only this rank (multi-host)")
    p.add_argument("--master", help="multi-host: rank 0's HOST:PORT")
    p.add_argument("--ifname", help="multi-host: the network interface gloo uses")
    p.add_argument("--data", default=data.FASHION_MNIST,
                   help="Fashion-MNIST's directory (default %(default)s)")
    args = p.parse_args()
    for flag in ("processes", "epochs", "batch_size", "threads", "train_examples"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1, not {value}")
    if not 0 < args.lr < float("inf"):
        p.error(f"--lr must be a positive number, not {args.lr}")
    if args.rank is not None:
        if not 0 <= args.rank < args.processes:
            p.error(f"--rank {args.rank} is not one of the {args.processes} processes")
        host, _, port = (args.master or "").rpartition(":")
        if not host or not port.isdigit():
            p.error("--rank needs --master HOST:PORT (rank 0's address)")
    return args


def rank_main(rank, world, master, args):
    """One rank: joins the group at master (HOST:PORT, or a file:// rendezvous of the ranks
    of one machine), trains its shard, and (rank 0) evaluates and reports."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    import models
    F = torch.nn.functional
    torch.set_num_threads(args.threads)
    # Sizes the BLAS's own pool as torch's threads (OpenBLAS keeps one per core otherwise),
    # and refuses a rank that did not start with the allocator (main's, inherited).
    if not torch_env.check(torch, PROGRAM, out=sys.stdout if rank == 0 else io.StringIO()):
        sys.exit(2)
    if master.startswith("file://"):
        dist.init_process_group("gloo", init_method=master, rank=rank, world_size=world)
    else:
        host, _, port = master.rpartition(":")
        os.environ.update(MASTER_ADDR=host, MASTER_PORT=port)
        dist.init_process_group("gloo", rank=rank, world_size=world)

    xtr, ytr = data.fashion_mnist("train", args.data)
    n = min(args.train_examples or len(xtr), len(xtr))
    per_rank = n // world
    mine = slice(rank, rank + world * per_rank, world)
    x, y = torch.from_numpy(xtr[:n][mine]), torch.from_numpy(ytr[:n][mine])
    if rank == 0:
        xte, yte = (torch.from_numpy(a) for a in data.fashion_mnist("test", args.data))

    torch.manual_seed(args.seed)
    model = models.KerasCnn()
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters
    if args.hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr, eps=1e-7)
    shuffle = torch.Generator().manual_seed(args.seed * 1000 + rank)
    record = {"program": PROGRAM, "processes": world, "threads_per_process": args.threads,
              "batch_size_per_process": args.batch_size,
              "global_batch": args.batch_size * world, "lr": args.lr, "seed": args.seed,
              "train_examples": per_rank * world, "epochs": args.epochs,
              "test_accuracy": [], "wall_s": [], "train_s": [], "examples_per_sec": [],
              "excluded": "process start-up, imports, data loading, process-group join, "
                          "DDP's first parameter broadcast",
              "torch": harness.ran_with(torch)}
    record["within"] = []  # --eval-every's evaluations: epochs done (a fraction), accuracy, wall

    def test_accuracy():
        model.eval()
        with torch.no_grad():
            logits = torch.cat([model(xte[i:i + EVAL_BATCH]) for i in range(0, len(xte), EVAL_BATCH)])
        model.train()
        return (logits.argmax(1) == yte).double().mean().item()

    dist.barrier()
    start = time.perf_counter()
    trained = 0.0
    steps = 0
    for epoch in range(1, args.epochs + 1):
        t0 = time.perf_counter()
        ddp.train()
        order = torch.randperm(per_rank, generator=shuffle)
        for i in range(0, per_rank, args.batch_size):
            idx = order[i:i + args.batch_size]
            loss = F.cross_entropy(ddp(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            done = i + args.batch_size
            if args.eval_every and steps % args.eval_every == 0 and done < per_rank:
                paused = time.perf_counter()
                if rank == 0:
                    record["within"].append({"epoch": round(epoch - 1 + done / per_rank, 4),
                                             "test_accuracy": round(test_accuracy(), 4),
                                             "wall_s": round(paused - start, 2)})
                dist.barrier()  # the others wait, as at an epoch's end
                t0 += time.perf_counter() - paused  # not training time
        dist.barrier()
        seconds = time.perf_counter() - t0
        trained += seconds
        if rank == 0:
            accuracy = test_accuracy()
            wall = time.perf_counter() - start
            rate = per_rank * world / seconds
            record["test_accuracy"].append(round(accuracy, 4))
            record["wall_s"].append(round(wall, 2))
            record["train_s"].append(round(trained, 2))
            record["examples_per_sec"].append(round(rate))
            print(f"epoch {epoch}: test accuracy {accuracy:.4f}, wall {wall:.1f} s, train "
                  f"{trained:.1f} s, {rate:.0f} examples/s (all processes)", flush=True)
        dist.barrier()  # the others wait for rank 0's evaluation
    if rank == 0:
        print(json.dumps(record), flush=True)
    dist.destroy_process_group()


def main() -> int:
    args = parse_args()
    torch_env.start_with_allocator(PROGRAM)  # before torch: this process again; ranks inherit
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        print(f"{PROGRAM}: PyTorch is not installed for {sys.executable}; run /usr/bin/python3 "
              f"(tools/install-deps.sh --tests installs python3-torch)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    # The ranks load the same libblas.so.3 as this process: refused here, none starts.
    if not torch_env.check(torch, PROGRAM, out=io.StringIO()):
        return 2
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        print(f"{PROGRAM}: this PyTorch ({torch.__version__}) has no gloo backend",
              file=sys.stderr)
        return 2
    for split in ("train", "t10k"):
        for part in ("images-idx3", "labels-idx1"):
            path = os.path.join(args.data, f"{split}-{part}-ubyte.gz")
            if not os.path.exists(path):
                print(f"{PROGRAM}: no {path} (Debian's dataset-fashion-mnist installs it)",
                      file=sys.stderr)
                return 2
    n = min(args.train_examples or 60000, 60000)
    if n // args.processes < 1:
        print(f"{PROGRAM}: {n} training examples leave none for each of {args.processes} "
              f"processes", file=sys.stderr)
        return 2
    if args.rank is not None:
        if args.ifname:
            os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
        rank_main(args.rank, args.processes, args.master, args)
        return 0
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only, whatever the hostname
    # The ranks meet through a file, not a port picked in advance (which another program
    # could take before rank 0 binds it); gloo's own connections take ports the kernel gives.
    try:
        with tempfile.TemporaryDirectory(prefix="torch-ddp-") as rendezvous:
            mp.spawn(rank_main, args=(args.processes, f"file://{rendezvous}/store", args),
                     nprocs=args.processes, join=True)
    except Exception as e:  # a rank failed: its traceback is above
        print(f"{PROGRAM}: a process failed: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
