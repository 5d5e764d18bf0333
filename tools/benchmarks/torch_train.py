#!/usr/bin/env python3
"""The accuracy a model reaches without any parameter server: one PyTorch process on the CPU
trains the model parasync describes (parasync-bench-compute --describe, built by
torch_model.py) on Fashion-MNIST with Adam, and prints the test accuracy after every epoch.
A reference for what the model itself can reach in so many epochs, beside parasync's runs.

  torch_train.py --describe "$(build/bin/parasync-bench-compute --model cnn --describe)" \
      [--epochs 10] [--batch-size 64] [--lr 0.001] [--lr-schedule cosine] [--threads 2]
      [--seed 42]

Runs with Debian's python3 (python3-torch, python3-numpy). Starts itself again with
torch_env.py's allocator in its environment (start_with_allocator) and prints first what
PyTorch ran with (its BLAS, threads and allocator); on the reference BLAS it installs
OpenBLAS, or refuses with one line and exit status 2 (tools/benchmarks/torch_env.py;
PARASYNC_NO_INSTALL=1 installs nothing): its times stand beside parasync's.
"""
import argparse
import gzip
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_env  # noqa: E402
from torch_model import build  # noqa: E402

# Test images per forward pass: as the examples' (worker/python/examples/cnn_local.py), each
# of the cnn's activations under glibc's largest mmap threshold (32 MiB), which the
# allocator's setting keeps for reuse; 1,000 a pass (86 MB of convolution output) is
# mapped and unmapped every pass.
EVAL_BATCH = 250


def load(data, split):
    import numpy as np
    with gzip.open(os.path.join(data, f"{split}-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(data, f"{split}-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return x.astype(np.float32) * np.float32(1 / 255), y.astype(np.int64)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--describe", required=True)
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant",
                        help="cosine: decay the learning rate to 0 over the run's examples, "
                             "as parasync's servers do with --lr-schedule cosine")
    args = parser.parse_args()
    torch_env.start_with_allocator("torch_train.py")  # before torch: this process again
    if not torch_env.ensure("torch_train.py", args.threads):
        return 2
    import torch
    torch.set_num_threads(args.threads)
    if not torch_env.check(torch, "torch_train.py", out=sys.stdout):
        return 2
    torch.manual_seed(args.seed)
    spec = json.loads(args.describe)
    xtr, ytr = load(args.data, "train")
    xte, yte = load(args.data, "t10k")
    xtr, ytr = torch.from_numpy(xtr), torch.from_numpy(ytr)
    xte, yte = torch.from_numpy(xte), torch.from_numpy(yte)
    model = build(torch, spec, list(xtr.shape[1:]))
    # Adam with TensorFlow's epsilon, as parasync's servers apply it.
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, eps=1e-7)
    # The schedule's clock is the examples applied before a step (parasync's servers count
    # them the same way).
    horizon = args.epochs * len(xtr)
    applied = 0
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(len(xtr))
        for i in range(0, len(xtr), args.batch_size):
            idx = order[i:i + args.batch_size]
            if args.lr_schedule == "cosine":
                factor = 0.5 * (1 + math.cos(math.pi * min(applied, horizon) / horizon))
                for group in opt.param_groups:
                    group["lr"] = args.lr * factor
            applied += len(idx)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            logits = torch.cat([model(xte[i:i + EVAL_BATCH])
                                for i in range(0, len(xte), EVAL_BATCH)])
            acc = (logits.argmax(1) == yte).float().mean().item()
            loss = torch.nn.functional.cross_entropy(logits, yte).item()
        print(f"epoch {epoch}: test accuracy {acc:.4f}, test loss {loss:.4f} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
