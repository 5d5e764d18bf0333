#!/usr/bin/python3
"""Trains one of the example models (models.py) on parasync with parasync.torch, as a worker
of a cluster that parasync-launch starts:

  parasync-launch --ps 2 --workers 2 --mode sync --epochs 10 \\
      --worker-command "/usr/bin/python3 worker/python/examples/train.py --model cnn"

  cnn      parasync's built-in `cnn` (Keras's MNIST CNN) on Fashion-MNIST; test accuracy
  seq2seq  a GRU encoder-decoder rewriting dates (data.dates()), its source and target token
           tables pst.Embedding tables; exact-sequence accuracy with greedy decoding
  ctr      parasync's built-in `ctr` on parasync-gen-ctr's data, its id table a
           pst.Embedding table of any int64 id; test AUC

The loop is parasync.training.Run's: this rank's shard in parasync-worker's order, resumed
where the servers recorded this rank, parasync-worker's epoch lines, and on the chief an
evaluation before training and after every epoch into <log-dir>/eval.jsonl. Epochs, batch
size, learning rate, optimizer and seed come from the launcher (--epochs, --batch-size, ...)
unless given here; the launcher's --lr-schedule cosine decays over the epochs of the
training set used, as for parasync-worker. The chief's last line is one JSON object with the
final metric and, with --timeline, the step split (forward, backward, when the pushes went
out, the waits).

Run with /usr/bin/python3 (Debian's PyTorch on OpenBLAS). Exit status 2 with one line on
stderr for bad flags, missing data or PyTorch on the reference BLAS.
"""
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data  # noqa: E402
import harness  # noqa: E402

PROGRAM = "train.py"
# Per model: (optimizer, learning rate, batch size) when the launcher gives none.
DEFAULTS = {"cnn": ("adam", 1e-3, 64), "seq2seq": ("adam", 1e-2, 64),
            "ctr": ("adagrad", 0.05, 256)}
EVAL_BATCH = {"cnn": 250, "seq2seq": 500, "ctr": 8192}


def parse():
    p = harness.OneLineParser(description=__doc__,
                              formatter_class=harness.argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, choices=sorted(DEFAULTS))
    p.add_argument("--data", help="the data directory (default: PARASYNC_DATA, else "
                                  f"{data.FASHION_MNIST} for cnn; ctr needs one)")
    p.add_argument("--epochs", type=int, help="default: PARASYNC_EPOCHS, else 5")
    p.add_argument("--batch-size", type=int, help="default: PARASYNC_BATCH_SIZE, else the "
                                                  "model's (cnn 64, seq2seq 64, ctr 256)")
    p.add_argument("--lr", type=float, help="default: PARASYNC_LR, else the model's")
    p.add_argument("--optimizer", help="default: PARASYNC_OPTIMIZER, else the model's")
    p.add_argument("--seed", type=int, help="default: PARASYNC_SEED, else 42")
    p.add_argument("--threads", type=int, default=1,
                   help="torch.set_num_threads (default %(default)s: workers share the machine)")
    p.add_argument("--train-examples", type=int, help="train on the first N examples "
                   "(default: all; seq2seq 30000)")
    p.add_argument("--test-examples", type=int, help="evaluate on the first N (default: all; "
                   "seq2seq 2000)")
    p.add_argument("--hidden", type=int, default=128, help="seq2seq: GRU state size "
                   "(default %(default)s)")
    p.add_argument("--no-overlap", action="store_true",
                   help="push every gradient at step(), not from backward's hooks")
    p.add_argument("--no-initial-eval", action="store_true",
                   help="the chief does not evaluate before training (benchmarks)")
    p.add_argument("--device", default="cpu",
                   help="where the model runs: cpu (default) or cuda[:N] (--model cnn only; "
                        "parasync.torch copies through pinned host buffers)")
    p.add_argument("--timeline", action="store_true",
                   help="print the mean step split (forward, backward, pushes, waits)")
    args = p.parse_args()
    for flag in ("epochs", "batch_size", "threads", "train_examples", "test_examples", "hidden"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1, not {value}")
    if args.device != "cpu" and args.model != "cnn":
        p.error(f"--device {args.device}: only --model cnn runs on a GPU in this example")
    if args.lr is not None and not (args.lr > 0 and math.isfinite(args.lr)):
        p.error(f"--lr must be a positive number, not {args.lr}")
    return args


class Task:
    """A model with its data, its loss on a batch and its evaluation."""

    def __init__(self, torch, pst, args, settings):
        self.torch, self.F, self.args = torch, torch.nn.functional, args
        import models
        directory = args.data or settings.data
        name = args.model
        try:
            if name == "cnn":
                x, y = data.fashion_mnist("train", directory or data.FASHION_MNIST)
                tx, ty = data.fashion_mnist("test", directory or data.FASHION_MNIST)
                self.train = (torch.from_numpy(x), torch.from_numpy(y))
                self.test = (torch.from_numpy(tx), torch.from_numpy(ty))
                self.model = models.KerasCnn()
                if args.device != "cpu":
                    if not torch.cuda.is_available():
                        harness.fail(PROGRAM, f"--device {args.device}: PyTorch sees no GPU")
                    # The whole set on the GPU (188 MB): a batch is an index there.
                    dev = torch.device(args.device)
                    self.model = self.model.to(dev)
                    self.train = tuple(t.to(dev) for t in self.train)
                    self.test = tuple(t.to(dev) for t in self.test)
            elif name == "seq2seq":
                train, test = data.dates(args.train_examples or 30000,
                                         args.test_examples or 2000, seed=1)
                target_in = np.concatenate(
                    [np.full((len(train.target), 1), data.START), train.target[:, :-1]], 1)
                self.train = tuple(torch.from_numpy(a) for a in
                                   (train.source, train.source_lengths, target_in, train.target))
                self.test = test
                factory = lambda table, rows, dim: pst.Embedding(table, dim=dim,  # noqa: E731
                                                                  vocab=rows or 0)
                self.model = models.Seq2SeqGru(factory, len(data.VOCAB), hidden=args.hidden)
            else:
                if not directory:
                    harness.fail(PROGRAM, "--model ctr needs --data DIR (parasync-gen-ctr --out "
                                          "DIR), or --dataset DIR given to parasync-launch")
                train, test = data.ctr(directory, "train"), data.ctr(directory, "test")
                self.train = tuple(torch.from_numpy(a) for a in train)
                self.test = test
                factory = lambda table, rows, dim: pst.Embedding(table, dim=dim)  # noqa: E731
                self.model = models.CtrModel(factory, train.ids.shape[1], train.x.shape[1])
        except data.DataError as e:
            harness.fail(PROGRAM, str(e))
        n = len(self.train[-1])
        self.size = min(args.train_examples or n, n) if name != "seq2seq" else n
        if name != "seq2seq" and args.test_examples:
            self.test = (tuple(t[:args.test_examples] for t in self.test) if name == "cnn"
                         else data.CtrSplit(*(a[:args.test_examples] for a in self.test)))

    def loss(self, idx):
        F, model, t = self.F, self.model, self.train
        if self.args.model == "cnn":
            return F.cross_entropy(model(t[0][idx]), t[1][idx])
        if self.args.model == "seq2seq":
            logits = model(t[0][idx], t[1][idx], t[2][idx])
            return F.cross_entropy(logits.flatten(0, 1), t[3][idx].flatten())
        return F.binary_cross_entropy_with_logits(model(t[0][idx], t[1][idx]), t[2][idx])

    def evaluate(self):
        """(metric, loss[, auc]) of the model on the test split, as Run.evaluate returns."""
        torch, F, model = self.torch, self.F, self.model
        b = EVAL_BATCH[self.args.model]
        with torch.no_grad():
            if self.args.model == "cnn":
                x, y = self.test
                logits = torch.cat([model(x[i:i + b]) for i in range(0, len(x), b)])
                return ((logits.argmax(1) == y).float().mean().item(),
                        F.cross_entropy(logits, y).item())
            if self.args.model == "seq2seq":
                split = self.test
                source = torch.from_numpy(split.source)
                lengths = torch.from_numpy(split.source_lengths)
                target = torch.from_numpy(split.target)
                exact, loss_sum = 0, 0.0
                for i in range(0, len(target), b):
                    out = model.greedy(source[i:i + b], lengths[i:i + b], data.START,
                                       data.TARGET_LENGTH)
                    exact += (out == target[i:i + b]).all(dim=1).sum().item()
                    target_in = torch.cat([torch.full((len(out), 1), data.START),
                                           target[i:i + b, :-1]], 1)
                    logits = model(source[i:i + b], lengths[i:i + b], target_in)
                    loss_sum += F.cross_entropy(logits.flatten(0, 1), target[i:i + b].flatten(),
                                                reduction="sum").item()
                return exact / len(target), loss_sum / target.numel()
            split = self.test
            ids, x = torch.from_numpy(split.ids), torch.from_numpy(split.x)
            logits = torch.cat([model(ids[i:i + b], x[i:i + b]) for i in range(0, len(ids), b)])
            y = torch.from_numpy(split.y)
            auc = harness.roc_auc(logits.numpy(), split.y)
            accuracy = ((logits > 0).float() == y).float().mean().item()
            return accuracy, F.binary_cross_entropy_with_logits(logits, y).item(), auc


def timeline_summary(timelines):
    """The mean step split, in ms from the backward's start (forward before it)."""
    def mean(f):
        values = [f(t) for t in timelines if t["backward_start"] is not None]
        return round(1e3 * float(np.mean(values)), 2) if values else None
    start = lambda t: t["backward_start"]  # noqa: E731
    return {
        "steps": len(timelines),
        "forward_ms": mean(lambda t: t["backward_start"] - t["step_start"]),
        "backward_ms": mean(lambda t: t["last_gradient"] - start(t)),
        "first_push_sent_ms": mean(lambda t: t["first_push_sent"] - start(t)),
        "last_push_sent_ms": mean(lambda t: t["last_push_sent"] - start(t)),
        "step_called_ms": mean(lambda t: t["step_called"] - start(t)),
        "pushes_acked_ms": mean(lambda t: t["pushes_acked"] - start(t)),
        "pulled_ms": mean(lambda t: t["pulled"] - start(t)),
        "early_pushes": float(np.mean([t["early_pushes"] for t in timelines])),
    }


def main() -> int:
    args = parse()
    import parasync
    import parasync.torch as pst
    client = pst.connect()
    s = client.settings
    # The seed of the initial values (rank 0's are the servers') and of the shuffles.
    args.seed = args.seed if args.seed is not None else (s.seed if s.seed is not None else 42)
    torch = harness.start(PROGRAM, harness.argparse.Namespace(threads=args.threads,
                                                              seed=args.seed))
    optimizer, lr, batch = DEFAULTS[args.model]
    optimizer = args.optimizer or s.optimizer or optimizer
    lr = args.lr or s.lr or lr
    task = Task(torch, pst, args, s)
    try:
        # The training set and epochs: the length of a cosine schedule (--lr-schedule).
        opt = pst.Optimizer(client, task.model, optimizer=optimizer, lr=lr,
                            overlap=not args.no_overlap, train_size=task.size,
                            epochs=args.epochs)
    except parasync.ParasyncError as e:
        harness.fail(PROGRAM, str(e))

    def evaluate():
        opt.pull()  # the servers' model, as parasync-worker's chief evaluates it
        task.model.eval()
        result = task.evaluate()
        task.model.train()
        return result

    run = pst.Run(client, task.size, epochs=args.epochs, batch_size=args.batch_size or
                  s.batch_size or batch, seed=args.seed, evaluate=evaluate,
                  evaluate_first=not args.no_initial_eval)
    timelines = []
    started = time.monotonic()
    for _ in run.epochs():
        for idx in run.batches():
            idx = torch.from_numpy(idx).to(args.device)
            loss = task.loss(idx)
            opt.zero_grad()
            loss.backward()
            opt.step(examples=len(idx), loss=loss.item())
            if args.timeline and opt.timeline is not None:
                timelines.append(opt.timeline)
    run.finish()
    if client.is_chief:
        record = {"program": PROGRAM, "model": args.model, "mode": client.mode,
                  "workers": client.num_workers, "metric": run.final_accuracy,
                  "steps": run.steps, "seconds": round(time.monotonic() - started, 2),
                  "device": (torch.cuda.get_device_name(torch.device(args.device))
                             if args.device != "cpu" else "cpu"),
                  "torch": harness.ran_with(torch)}
        if args.timeline:
            record["timeline"] = timeline_summary(timelines[5:])
        print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
