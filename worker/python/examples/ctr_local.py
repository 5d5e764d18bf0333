#!/usr/bin/python3
"""Trains parasync's `ctr` (models.CtrModel: a 16-float row per id column, concatenated
with the dense features, into a 64-32-1 MLP) on a data set written by parasync-gen-ctr, in
plain PyTorch with torch.optim.Adagrad (TensorFlow's form, as parasync's servers apply it:
initial accumulator 0.1, epsilon 1e-7), and prints after every epoch the test AUC and
log-loss; then one JSON line (as cnn_local.py's; metric "test_auc").

  build/bin/parasync-gen-ctr --out data/ctr     # prints the planted model's test AUC
  ctr_local.py --data data/ctr [--epochs 3] [--batch-size 256] [--lr 0.05]

The table is local (models.CompactEmbedding): a row for each id of the training examples
used, one shared row for every id training never saw, and sparse gradients, so a step
updates the rows its batch touched, as parasync's servers do. With parasync.torch the table
is pst.Embedding("embedding0/table", dim=16), which takes the ids as they are.

Run with /usr/bin/python3. Exit status 2 with one line on stderr for bad flags, missing or
malformed data, or PyTorch on the reference BLAS.
"""
import sys

import numpy as np

import harness
import data

PROGRAM = "ctr_local.py"


def evaluate(torch, model, split, batch=8192):
    """(AUC, mean log-loss) of the model's logits on `split`."""
    F = torch.nn.functional
    ids, x = torch.from_numpy(split.ids), torch.from_numpy(split.x)
    with torch.no_grad():
        logits = torch.cat([model(ids[i:i + batch], x[i:i + batch])
                            for i in range(0, len(ids), batch)])
    y = torch.from_numpy(split.y)
    loss = F.binary_cross_entropy_with_logits(logits, y).item()
    return harness.roc_auc(logits.numpy(), split.y), loss


def main() -> int:
    p = harness.parser(__doc__, epochs=3, batch_size=256, lr=0.05, train_examples=None)
    p.add_argument("--data", required=True,
                   help="directory of parasync-gen-ctr's files (train_ids.npy, train_x.npy, "
                        "train_y.npy, test_*)")
    args = harness.parse(p)
    torch = harness.start(PROGRAM, args)
    import models
    F = torch.nn.functional
    try:
        train = data.ctr(args.data, "train")
        test = data.ctr(args.data, "test")
    except data.DataError as e:
        harness.fail(PROGRAM, str(e))
    if train.ids.shape[1] != test.ids.shape[1] or train.x.shape[1] != test.x.shape[1]:
        harness.fail(PROGRAM, f"{args.data}: train has {train.ids.shape[1]} id columns and "
                              f"{train.x.shape[1]} dense features, test "
                              f"{test.ids.shape[1]} and {test.x.shape[1]}")
    n = min(args.train_examples or len(train.y), len(train.y))
    train = data.CtrSplit(train.ids[:n], train.x[:n], train.y[:n])
    ids, x, y = (torch.from_numpy(a) for a in train)

    factory = models.torch_embeddings({models.CtrModel.TABLE: train.ids}, sparse=True)
    model = models.CtrModel(factory, train.ids.shape[1], train.x.shape[1])
    opt = torch.optim.Adagrad(model.parameters(), lr=args.lr, initial_accumulator_value=0.1,
                              eps=1e-7)
    shuffle = torch.Generator().manual_seed(args.seed)
    rows = len(model.embedding.known)
    log = harness.Log(PROGRAM, "test_auc", torch, args, train_examples=n,
                      id_columns=int(train.ids.shape[1]), dense_features=int(train.x.shape[1]),
                      table_rows=rows,
                      unseen_test_ids=float(np.mean(~np.isin(test.ids, train.ids))),
                      parameters=models.parameter_counts(model))
    for epoch in range(1, args.epochs + 1):
        log.begin_epoch()
        model.train()
        for idx in harness.batches(torch, n, args.batch_size, shuffle):
            loss = F.binary_cross_entropy_with_logits(model(ids[idx], x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        log.end_training()
        model.eval()
        auc, logloss = evaluate(torch, model, test)
        log.end_epoch(epoch, auc, n, test_log_loss=logloss)
    log.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
