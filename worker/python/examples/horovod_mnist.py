#!/usr/bin/python3
"""A Horovod PyTorch script on parasync: Horovod's MNIST example's shape on Fashion-MNIST.
Only the import differs from a horovod.torch script:

    import parasync.horovod as hvd      # was: import horovod.torch as hvd

hvd.init(); the data sharded by rank with DistributedSampler; the learning rate scaled by
hvd.size(); hvd.DistributedOptimizer around the script's own optimizer (SGD with momentum
and a StepLR scheduler for --model horovod, Horovod's two-conv network; Adam for --model
cnn, parasync's Keras CNN); the initial parameters and optimizer state broadcast from rank
0; gradients clipped between synchronize() and skip_synchronize(); test metrics averaged
with hvd.allreduce, and rank 0 logs them to <log-dir>/eval.jsonl (hvd.log_eval) for
tools/compare, after every epoch and, with --eval-every N (parasync-launch --eval-every N),
every N steps within it.

    parasync-launch --ps 2 --workers 2 --mode sync --epochs 3 \\
        --worker-command "python3 worker/python/examples/horovod_mnist.py"
    # the same with --mode async or --mode ssp:2
    # Horovod elastic: rank 1 killed 30 s in and restarted 3 s later comes back
    parasync-launch --ps 2 --workers 2 --mode sync --kill worker:1@30+3 \
        --worker-command "python3 worker/python/examples/horovod_mnist.py --elastic 20"

Prints one line per epoch on every rank, then (rank 0) one JSON line:
  {"program": "horovod_mnist.py", "metric": "test_accuracy", "value": ..., "per_epoch": [...]}
Exit status 2 with one line on stderr for bad flags or missing data.
"""
import argparse
import itertools
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tools", "benchmarks"))

import data  # noqa: E402
import torch_env  # noqa: E402

PROGRAM = "horovod_mnist.py"


def parse():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("horovod", "cnn"), default="horovod",
                   help="horovod: Horovod's example's two-conv network with SGD (momentum) "
                        "and StepLR; cnn: parasync's Keras CNN with Adam (default %(default)s)")
    p.add_argument("--epochs", type=int, default=int(os.environ.get("PARASYNC_EPOCHS", 3)),
                   help="passes over the training set (default PARASYNC_EPOCHS, else 3)")
    p.add_argument("--batch-size", type=int,
                   default=int(os.environ.get("PARASYNC_BATCH_SIZE") or 64),
                   help="examples per step and rank (default PARASYNC_BATCH_SIZE, else 64)")
    p.add_argument("--lr", type=float,
                   default=float(os.environ.get("PARASYNC_LR") or 0) or None,
                   help="learning rate before scaling by hvd.size() (default PARASYNC_LR, "
                        "else 0.01 for horovod, 0.001 for cnn)")
    p.add_argument("--momentum", type=float, default=0.5, help="SGD momentum (default "
                   "%(default)s, Horovod's example's)")
    p.add_argument("--train-examples", type=int, default=None,
                   help="train on the first N training examples (default: all 60,000)")
    p.add_argument("--test-examples", type=int, default=None,
                   help="evaluate on the first N test examples (default: all 10,000)")
    p.add_argument("--max-steps", type=int,
                   default=int(os.environ.get("PARASYNC_MAX_STEPS") or 0) or None,
                   help="stop each rank after this many steps in all (default "
                        "PARASYNC_MAX_STEPS, parasync-launch --max-steps; else none)")
    every = os.environ.get("PARASYNC_EVAL_EVERY", "")
    p.add_argument("--eval-every", type=int,
                   default=int(every) if every.isdigit() and int(every) > 0 else None,
                   help="also evaluate every N steps (counted across epochs) within an epoch, "
                        "a row of eval.jsonl with the epochs done as a fraction (default "
                        "PARASYNC_EVAL_EVERY, parasync-launch --eval-every N; steps only: "
                        "every rank evaluates at the same step)")
    p.add_argument("--compression", choices=("none", "fp16", "bf16", "int8", "int4", "topk"),
                   default="none",
                   help="how gradients travel (hvd.Compression; default %(default)s)")
    p.add_argument("--topk-density", type=float, default=None,
                   help="with --compression topk: the fraction of each 256 gradient elements "
                        "sent, in (0, 1] (hvd.Compression.topk.density; default topk's 1/32)")
    p.add_argument("--clip", type=float, default=5.0,
                   help="clip the averaged gradients' norm to this; 0: no clipping (default "
                        "%(default)s)")
    p.add_argument("--loader", choices=("torch", "indexed"), default="torch",
                   help="torch: a DataLoader over the sampler (Horovod's example); indexed: "
                        "the sampler's indices a batch at a time, gathered from the training "
                        "tensors in one indexing (as tools/benchmarks/torch_ddp_cnn.py reads "
                        "its data; default %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default "
                   "%(default)s)")
    p.add_argument("--seed", type=int, default=42, help="torch.manual_seed (default "
                   "%(default)s)")
    p.add_argument("--elastic", type=int, default=0, metavar="N",
                   help="Horovod elastic: hvd.elastic.run with a TorchState and an "
                        "ElasticSampler, committed every N batches, so that a worker the "
                        "launcher restarts (--kill worker:I@S+R) comes back into the run "
                        "(default 0: not elastic)")
    p.add_argument("--data", default=os.environ.get("PARASYNC_DATA") or data.FASHION_MNIST,
                   help="Fashion-MNIST's directory (default PARASYNC_DATA, else %(default)s)")
    if every and not every.isdigit() and "--eval-every" not in sys.argv:
        p.error(f"PARASYNC_EVAL_EVERY={every}: a Horovod script evaluates every N steps (every "
                "rank at the same step), not every N seconds")
    args = p.parse_args()
    for flag in ("epochs", "batch_size", "threads", "train_examples", "test_examples",
                 "max_steps", "eval_every"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1, not {value}")
    return args


def main() -> int:
    args = parse()
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch.utils.data.distributed

    import parasync.horovod as hvd

    class Net(nn.Module):  # Horovod's examples/pytorch/pytorch_mnist.py
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
            self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
            self.conv2_drop = nn.Dropout2d()
            self.fc1 = nn.Linear(320, 50)
            self.fc2 = nn.Linear(50, 10)

        def forward(self, x):
            x = F.relu(F.max_pool2d(self.conv1(x), 2))
            x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
            x = x.view(-1, 320)
            x = F.relu(self.fc1(x))
            x = F.dropout(x, training=self.training)
            return F.log_softmax(self.fc2(x), dim=1)

    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    # Debian's PyTorch leaves OpenBLAS's own pool at one thread per core whatever
    # set_num_threads says: two ranks on two cores would run four BLAS threads, the idle ones
    # spinning in sched_yield. Sized as PyTorch's, as DDP's script does (torch_env.py).
    blas = torch_env.sized_to_torch(torch)
    if hvd.rank() == 0:
        print(f"{PROGRAM}: ran with: {torch_env.describe(torch, blas)}", flush=True)
    try:
        xtr, ytr = data.fashion_mnist("train", args.data)
        xte, yte = data.fashion_mnist("test", args.data)
    except data.DataError as e:
        print(f"{PROGRAM}: {e}", file=sys.stderr)
        return 2
    xtr, ytr = xtr[:args.train_examples], ytr[:args.train_examples]
    xte, yte = xte[:args.test_examples], yte[:args.test_examples]
    train_set = torch.utils.data.TensorDataset(torch.from_numpy(xtr), torch.from_numpy(ytr))
    test_set = torch.utils.data.TensorDataset(torch.from_numpy(xte), torch.from_numpy(yte))
    # Each rank its share of the data, as in Horovod's example.
    if args.elastic:  # what each rank trained survives a restart (docs/python.md)
        train_sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=args.seed)
    else:
        train_sampler = torch.utils.data.distributed.DistributedSampler(
            train_set, num_replicas=hvd.size(), rank=hvd.rank(), seed=args.seed)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size,
                                               sampler=train_sampler)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=500, sampler=test_sampler)

    if args.model == "horovod":
        model = Net()
        loss_of = F.nll_loss
        lr = (args.lr or 0.01) * hvd.size()
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    else:
        import models
        model = models.KerasCnn()
        loss_of = F.cross_entropy
        lr = (args.lr or 0.001) * hvd.size()
        optimizer = torch.optim.Adam(model.parameters(), lr=lr, eps=1e-7)
        scheduler = None
    if not args.elastic:  # hvd.elastic.run syncs every rank to rank 0's state itself
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16,
                   "bf16": hvd.Compression.bf16, "int8": hvd.Compression.int8,
                   "int4": hvd.Compression.int4,
                   "topk": hvd.Compression.topk}[args.compression]
    if args.compression == "topk" and args.topk_density is not None:
        compression = compression.density(args.topk_density)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

    def metric_average(value, name):
        return hvd.allreduce(torch.tensor(value), name=name).item()

    def test():
        model.eval()
        loss, correct, seen = 0.0, 0, 0
        with torch.no_grad():
            for x, y in test_loader:
                out = model(x)
                loss += float(loss_of(out, y, reduction="sum"))
                correct += int((out.argmax(1) == y).sum())
                seen += len(y)
        model.train()
        # Every rank's share counted once: sums over the ranks, then the ratio.
        totals = hvd.allreduce(torch.tensor([loss, correct, seen], dtype=torch.float64),
                               op=hvd.Sum, name="test")
        return float(totals[1] / totals[2]), float(totals[0] / totals[2])

    per_epoch, started, total_steps = [], time.monotonic(), [0]

    def batches():
        """This epoch's batches: the DataLoader's, or the sampler's indices taken lazily a
        batch at a time (an ElasticSampler's position stays that of the batches taken)."""
        if args.loader == "torch":
            yield from train_loader
            return
        xs, ys = train_set.tensors
        indices = iter(train_sampler)
        while idx := list(itertools.islice(indices, args.batch_size)):
            picked = torch.tensor(idx)
            yield xs[picked], ys[picked]

    per_rank_batches = -(-len(train_sampler) // args.batch_size)

    def evaluate_within(epoch: int, done: int) -> None:
        """An evaluation within `epoch` after `done` of its batches (every rank takes part:
        the test set's sums are allreduced); rank 0 logs it with the epochs done."""
        accuracy, test_loss = test()
        if hvd.rank() == 0:
            hvd.log_eval(epoch, accuracy, test_loss, wall_seconds=time.monotonic() - started,
                         batch_size=args.batch_size,
                         epoch_progress=epoch - 1 + done / per_rank_batches)

    def train_epoch(epoch: int, state=None) -> None:
        model.train()
        train_sampler.set_epoch(epoch)
        epoch_start, seen, loss_sum, steps = time.monotonic(), 0, 0.0, 0
        for batch, (x, y) in enumerate(batches()):
            if args.max_steps is not None and total_steps[0] >= args.max_steps:
                break
            total_steps[0] += 1
            optimizer.zero_grad()
            loss = loss_of(model(x), y)
            loss.backward()
            optimizer.synchronize()
            if args.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            with optimizer.skip_synchronize():
                optimizer.step()
            seen += len(y)
            loss_sum += float(loss)
            steps += 1
            if state is not None and (batch + 1) % args.elastic == 0:
                state.batch = batch + 1
                state.commit()  # a restarted worker waiting to come back is admitted here
            if args.eval_every and total_steps[0] % args.eval_every == 0 and \
                    batch + 1 < per_rank_batches:
                evaluate_within(epoch, batch + 1)
        if scheduler is not None:
            scheduler.step()
        seconds = time.monotonic() - epoch_start
        train_loss = metric_average(loss_sum / max(1, steps), "train_loss")
        rate = metric_average(seen / seconds, "examples_per_sec") * hvd.size()
        accuracy, test_loss = test()
        per_epoch.append(round(accuracy, 4))
        print(f"{PROGRAM}: rank {hvd.rank()} epoch {epoch}: train loss {train_loss:.4f}, test "
              f"accuracy {accuracy:.4f}, test loss {test_loss:.4f}, {rate:.0f} examples/s "
              f"(all ranks)", flush=True)
        if hvd.rank() == 0:
            hvd.log_eval(epoch, accuracy, test_loss, train_loss=train_loss,
                         examples_per_sec=rate, wall_seconds=time.monotonic() - started,
                         batch_size=args.batch_size)

    if args.elastic:
        extra = {"scheduler": scheduler} if scheduler is not None else {}
        state = hvd.elastic.TorchState(model, optimizer, sampler=train_sampler, epoch=1,
                                       batch=0, **extra)

        @hvd.elastic.run
        def train(state):
            for state.epoch in range(state.epoch, args.epochs + 1):
                train_epoch(state.epoch, state)
                state.batch = 0

        train(state)
    else:
        for epoch in range(1, args.epochs + 1):
            train_epoch(epoch)
    if hvd.rank() == 0:
        print(json.dumps({"program": PROGRAM, "metric": "test_accuracy", "value": per_epoch[-1],
                          "per_epoch": per_epoch, "model": args.model,
                          "workers": hvd.size(), "mode": hvd.client().mode,
                          "wall_s": round(time.monotonic() - started, 1)}), flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
