#!/usr/bin/python3
"""Trains models.Seq2SeqGru on the dates task (data.dates(): a date written in one of 12
formats, e.g. "27 November 2026", "11/27/26", "Fri 27 Nov 2026", rewritten as
"2026-11-27"; characters as tokens) in plain PyTorch with torch.optim.Adam and teacher
forcing, and prints after every epoch the exact-sequence accuracy on the test split: the
fraction of test examples whose whole output (greedy decoding, each step fed the model's own
previous token, no teacher forcing: the 10 characters and the end token) is exactly right.
Then one JSON line (as cnn_local.py's; metric "exact_sequence_accuracy", and the last epoch's
"character_accuracy": the fraction of the target's 11 tokens greedy decoding gets right in
their place; a model that ignores its source gets about half, from the fixed "-"s, the end
token and the likeliest digits).

The test split's days are never seen in training (data.dates). The seed decides the data,
the initialization and the shuffling. The source and target token tables come from the
embedding factory: with parasync.torch, pass
lambda name, rows, dim: pst.Embedding(name, dim=dim) to Seq2SeqGru and use pst.Optimizer.

Run with /usr/bin/python3. Exit status 2 with one line on stderr for bad flags or PyTorch
on the reference BLAS.
"""
import sys

import harness
import data

PROGRAM = "seq2seq_local.py"


def greedy_accuracy(torch, model, split, batch=1000):
    """(exact, characters): the fraction of `split`'s examples whose greedy output equals
    the target exactly, and the fraction of the target's tokens (END included) it gets right
    in their place."""
    source = torch.from_numpy(split.source)
    lengths = torch.from_numpy(split.source_lengths)
    target = torch.from_numpy(split.target)
    exact = tokens = 0
    with torch.no_grad():
        for i in range(0, len(target), batch):
            out = model.greedy(source[i:i + batch], lengths[i:i + batch], data.START,
                               data.TARGET_LENGTH)
            right = out == target[i:i + batch]
            exact += right.all(dim=1).sum().item()
            tokens += right.sum().item()
    return exact / len(target), tokens / target.numel()


def main() -> int:
    p = harness.parser(__doc__, epochs=3, batch_size=64, lr=1e-2, train_examples=30000,
                       train_help="training examples to generate")
    p.add_argument("--test-examples", type=int, default=2000,
                   help="test examples (default %(default)s)")
    p.add_argument("--hidden", type=int, default=128,
                   help="GRU state size (default %(default)s)")
    p.add_argument("--embed-dim", type=int, default=32,
                   help="token row size (default %(default)s)")
    args = harness.parse(p)
    for flag in ("hidden", "embed_dim"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1, not {getattr(args, flag)}")
    torch = harness.start(PROGRAM, args)
    import models
    F = torch.nn.functional
    train, test = data.dates(args.train_examples, args.test_examples, seed=args.seed)
    source = torch.from_numpy(train.source)
    lengths = torch.from_numpy(train.source_lengths)
    target = torch.from_numpy(train.target)
    # Teacher forcing: the decoder reads the target shifted right, the start token first.
    target_in = torch.cat([torch.full((len(target), 1), data.START), target[:, :-1]], dim=1)

    model = models.Seq2SeqGru(models.torch_embeddings(), len(data.VOCAB),
                              embed_dim=args.embed_dim, hidden=args.hidden)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, eps=1e-7)
    shuffle = torch.Generator().manual_seed(args.seed)
    n = len(target)
    log = harness.Log(PROGRAM, "exact_sequence_accuracy", torch, args, train_examples=n,
                      test_examples=args.test_examples, hidden=args.hidden,
                      embed_dim=args.embed_dim,
                      parameters=sum(q.numel() for q in model.parameters()))
    for epoch in range(1, args.epochs + 1):
        log.begin_epoch()
        model.train()
        total = 0.0
        for idx in harness.batches(torch, n, args.batch_size, shuffle):
            logits = model(source[idx], lengths[idx], target_in[idx])
            loss = F.cross_entropy(logits.flatten(0, 1), target[idx].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        log.end_training()
        model.eval()
        exact, characters = greedy_accuracy(torch, model, test)
        log.end_epoch(epoch, exact, n, character_accuracy=characters, train_loss=total / n)
    log.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
