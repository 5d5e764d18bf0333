#!/usr/bin/python3
"""Trains parasync's `cnn` (models.KerasCnn: Conv2D 32 3x3 ReLU -> Dense 128 ReLU -> Dense
10) on Fashion-MNIST in plain PyTorch with torch.optim.Adam, and prints the test accuracy
after every epoch, then one JSON line:

  {"program": "cnn_local.py", "metric": "test_accuracy", "value": <last epoch's>,
   "per_epoch": [...], "wall_s": [training seconds after each epoch], ..., "torch": "..."}

Pixels are scaled to [0, 1] as parasync's worker scales them. Adam uses TensorFlow's epsilon
(1e-7), as parasync's servers do. With parasync.torch the loop is the same, the optimizer
is pst.Optimizer(client, model, optimizer="adam", lr=...), and opt.step(examples=len(y)).

Run with /usr/bin/python3 (Debian's PyTorch on OpenBLAS). Exit status 2 with one line on
stderr for bad flags, missing data, or PyTorch on the reference BLAS.
"""
import sys

import harness
import data

PROGRAM = "cnn_local.py"
# Test images per forward pass: 250 keeps each activation under glibc's largest mmap
# threshold (the convolution's output is 250 x 32 x 26 x 26 floats, 21.6 MB), so it reuses
# freed memory (harness.keep_freed_memory); 1,000 a pass made the evaluation 5-10x slower.
EVAL_BATCH = 250


def main() -> int:
    p = harness.parser(__doc__, epochs=10, batch_size=64, lr=1e-3, train_examples=None)
    p.add_argument("--data", default=data.FASHION_MNIST,
                   help="directory of Fashion-MNIST's gzipped IDX files (default %(default)s)")
    args = harness.parse(p)
    torch = harness.start(PROGRAM, args)
    import models
    F = torch.nn.functional
    try:
        xtr, ytr = data.fashion_mnist("train", args.data)
        xte, yte = data.fashion_mnist("test", args.data)
    except data.DataError as e:
        harness.fail(PROGRAM, str(e))
    n = min(args.train_examples or len(xtr), len(xtr))
    xtr, ytr = torch.from_numpy(xtr[:n]), torch.from_numpy(ytr[:n])
    xte, yte = torch.from_numpy(xte), torch.from_numpy(yte)

    model = models.KerasCnn()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, eps=1e-7)
    shuffle = torch.Generator().manual_seed(args.seed)
    log = harness.Log(PROGRAM, "test_accuracy", torch, args, train_examples=n,
                      parameters=sum(q.numel() for q in model.parameters()))
    for epoch in range(1, args.epochs + 1):
        log.begin_epoch()
        model.train()
        for idx in harness.batches(torch, n, args.batch_size, shuffle):
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        log.end_training()
        model.eval()
        with torch.no_grad():
            logits = torch.cat([model(xte[i:i + EVAL_BATCH])
                                for i in range(0, len(xte), EVAL_BATCH)])
        accuracy = (logits.argmax(1) == yte).double().mean().item()
        log.end_epoch(epoch, accuracy, n, test_loss=F.cross_entropy(logits, yte).item())
    log.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
