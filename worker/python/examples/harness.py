"""What the local example scripts (cnn_local.py, seq2seq_local.py, ctr_local.py) share and
what is not the point of reading them: their common flags, the check of what PyTorch runs on
(tools/benchmarks/torch_env.py), shuffled batches, the metrics, and the output: one line per
epoch and a final JSON line on stdout.

A script's figures name what produced them: the first line ("PROGRAM: ran with: ...") and
the JSON's "torch" say the PyTorch, its BLAS, the threads and the memory allocator. A script
runs with torch_env.py's allocator from its start: start() runs it again with the
allocator's variables in its environment before it imports torch (BASELINES.md, "Memory").
On the reference BLAS a script refuses with one line on stderr and exit status 2 (as every
PyTorch baseline here does).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "tools", "benchmarks"))
import torch_env  # noqa: E402


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr, "PROGRAM: message", exit status 2."""

    def error(self, message):
        print(f"{self.prog}: {message}", file=sys.stderr)
        sys.exit(2)


def parser(doc, epochs, batch_size, lr, train_examples, train_help=None):
    """A parser with the flags every example takes, defaulting as given (train_examples:
    a number, or None for the whole split; train_help: --train-examples' help, if not
    "train on the first N training examples")."""
    p = OneLineParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=epochs, help="passes over the training set "
                   "(default %(default)s)")
    p.add_argument("--batch-size", type=int, default=batch_size,
                   help="examples per step (default %(default)s)")
    p.add_argument("--lr", type=float, default=lr, help="learning rate (default %(default)s)")
    p.add_argument("--seed", type=int, default=1,
                   help="seeds the initialization and the shuffling (default %(default)s); the "
                        "same seed and threads give the same figures")
    p.add_argument("--threads", type=int, default=1,
                   help="torch.set_num_threads, the BLAS's own pool included (default "
                        "%(default)s: the fastest for every example on the 2-core VM, "
                        "BASELINES.md)")
    p.add_argument("--train-examples", type=int, default=train_examples,
                   help=(train_help or "train on the first N training examples") +
                        f" (default: {train_examples or 'all'})")
    return p


def parse(p, argv=None):
    """The parsed flags; every count must be at least 1 and the learning rate positive, or
    the parser fails with one line."""
    args = p.parse_args(argv)
    for flag in ("epochs", "batch_size", "threads", "train_examples", "test_examples"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1, not {value}")
    if not args.lr > 0 or not np.isfinite(args.lr):
        p.error(f"--lr must be a positive number, not {args.lr}")
    return args


def keep_freed_memory():
    """tools/benchmarks/torch_env.py's keep_freed_memory: glibc's thresholds set with mallopt
    now, for a process that imported torch before start() (parasync's Python worker,
    train.py). Weaker than the allocator from the start, which every baseline gets."""
    torch_env.keep_freed_memory()


def start(program, args):
    """Makes the process run with torch_env.py's allocator (a local example: this process
    again, from its start, before torch is imported; one that imported torch already,
    parasync's train.py: mallopt now, keep_freed_memory), imports PyTorch, sets its threads
    (args.threads) and seed (args.seed), and prints what it runs with. Returns the torch
    module; exits 2 with one line on stderr when PyTorch is missing, runs on the reference
    BLAS, or a baseline lacks its allocator."""
    baseline = "torch" not in sys.modules
    if baseline:
        torch_env.start_with_allocator(program)
    elif not torch_env.in_force(torch_env.chosen() or torch_env.ALLOCATOR):
        keep_freed_memory()
    try:
        import torch
    except ImportError:
        print(f"{program}: PyTorch is not installed for {sys.executable}; run "
              f"/usr/bin/python3 (tools/install-deps.sh --tests installs python3-torch)",
              file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(args.threads)
    if not torch_env.check(torch, program, out=sys.stdout, allocator=baseline):
        sys.exit(2)
    torch.manual_seed(args.seed)
    return torch


def ran_with(torch):
    """One line: the PyTorch, BLAS (library, threads), oneDNN and ATen threads of this
    process (torch_env.describe), and its allocator."""
    return torch_env.describe(torch, torch_env.blas(torch))


def fail(program, message):
    """Prints "PROGRAM: message" on stderr and exits 2 (bad input or data)."""
    print(f"{program}: {message}", file=sys.stderr)
    sys.exit(2)


def batches(torch, n, batch_size, generator):
    """The indices of one epoch over n examples in `batch_size` steps (the last one smaller),
    in an order drawn from `generator`."""
    order = torch.randperm(n, generator=generator)
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]


def roc_auc(scores, labels):
    """The area under the ROC curve of `scores` (higher: more likely 1) for 0/1 `labels`
    (NumPy arrays), ties counted half (the Mann-Whitney U statistic)."""
    scores = np.asarray(scores, np.float64)
    labels = np.asarray(labels) > 0.5
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    # Each distinct score's average rank (1-based) over the examples that share it.
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    ranks = (first + (counts + 1) / 2.0)[inverse]
    positives = labels.sum()
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) /
                 (positives * negatives))


class Log:
    """The progress lines (one per epoch) and the final JSON line. `metric` names the
    figure each epoch reports (e.g. "test_accuracy")."""

    def __init__(self, program, metric, torch, args, **setup):
        self.program, self.metric = program, metric
        self.record = {"program": program, "metric": metric, "value": None,
                       "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                       "seed": args.seed, "threads": args.threads, **setup,
                       "per_epoch": [], "wall_s": [], "torch": ran_with(torch)}
        self.train_seconds = 0.0
        self.t0 = None

    def begin_epoch(self):
        self.t0 = time.perf_counter()

    def end_training(self):
        """Marks the end of the epoch's training: its evaluation is not in train_s."""
        self.train_seconds += time.perf_counter() - self.t0
        self.t1 = time.perf_counter()

    def end_epoch(self, epoch, value, examples, **extra):
        """Prints the epoch's line: the metric, `extra` figures, the training time so far
        (evaluations left out) and the epoch's examples/sec."""
        train = self.t1 - self.t0
        self.record["per_epoch"].append(round(value, 4))
        self.record["wall_s"].append(round(self.train_seconds, 2))
        self.record["value"] = round(value, 4)
        more = "".join(f", {k.replace('_', ' ')} {v:.4f}" for k, v in extra.items())
        print(f"epoch {epoch}: {self.metric.replace('_', ' ')} {value:.4f}{more} "
              f"(trained {self.train_seconds:.1f} s, {examples / train:.0f} examples/s; "
              f"evaluated in {time.perf_counter() - self.t1:.1f} s)", flush=True)
        for k, v in extra.items():
            self.record[k] = round(v, 4)

    def finish(self):
        """Prints the final JSON line: the last epoch's metric as "value", every epoch's,
        the training seconds after each epoch (evaluations, data loading and start-up left
        out), the flags and what PyTorch ran with."""
        print(json.dumps(self.record), flush=True)
