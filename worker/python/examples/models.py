"""The example models, as torch.nn.Modules that take their embedding tables from a factory,
so that one model runs on local tables (torch_embeddings()) or on parasync's servers:

    factory = torch_embeddings()                                   # plain PyTorch
    factory = lambda name, rows, dim: pst.Embedding(name, dim=dim)  # parasync.torch

A factory is called as factory(name, num_embeddings, dim) and returns a module mapping an
int64 tensor of ids of any shape to float rows of shape [..., dim]. num_embeddings is the
vocabulary when the model has one, or None for an unbounded one (any int64 id is valid, as
for pst.Embedding, whose rows are created on first touch).

  KerasCnn     parasync's built-in `cnn` (worker/model/model.cc), built by
               tools/benchmarks/torch_model.py (which tests/tools/torch_parity_test.py checks
               against parasync's CPU backend); no embedding
  Seq2SeqGru   a GRU encoder-decoder over characters (data.dates()), source and target token
               tables from the factory
  CtrModel     parasync's built-in `ctr`: one unbounded table from the factory

Dense and convolution kernels start as parasync's do (Keras's defaults: Glorot uniform,
zero biases; tables uniform in [-0.05, 0.05]), in distribution, not bit for bit. The GRUs
keep PyTorch's own initialization.
"""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "tools", "benchmarks"))
import torch_model  # noqa: E402  parasync's model descriptions in PyTorch

# parasync's built-in `cnn`, as `parasync-bench-compute --model cnn --describe` prints it
# (tests/tools/torch_examples_test.py checks that it still does).
CNN_SPEC = {"name": "cnn", "layers": [
    {"type": "conv2d", "name": "conv2d0", "filters": 32, "kernel": 3, "stride": 1,
     "padding": "valid", "activation": "relu"},
    {"type": "flatten", "name": "flatten0"},
    {"type": "dense", "name": "dense0", "units": 128, "activation": "relu"},
    {"type": "dense", "name": "dense1", "units": 10, "activation": "linear"},
], "loss": "softmax_cross_entropy"}
# parasync's built-in `ctr` after its embedding (the first of the layers its --describe
# prints): the MLP on [K * 16 + D].
CTR_DIM = 16
CTR_MLP_SPEC = {"name": "ctr", "layers": [
    {"type": "dense", "name": "dense0", "units": 64, "activation": "relu"},
    {"type": "dense", "name": "dense1", "units": 32, "activation": "relu"},
    {"type": "dense", "name": "dense2", "units": 1, "activation": "linear"},
]}
TABLE_INIT = 0.05  # Keras's default embedding initializer, parasync's: U(-0.05, 0.05)


def keras_init(variables):
    """Initializes parasync variables (torch_model's (name, parameter, transposed) list) as
    parasync does: kernels Glorot uniform (fans from the layout, conv kernels' receptive
    field included), biases zero."""
    with torch.no_grad():
        for name, p, _ in variables:
            if name.endswith("/kernel"):
                nn.init.xavier_uniform_(p)
            elif name.endswith("/bias"):
                p.zero_()


class CompactEmbedding(nn.Module):
    """A local stand-in for an unbounded table (pst.Embedding): a row for each id in
    `known_ids` (the ids training can touch), and one more, shared, for every other id,
    which training never updates, so it keeps its initial value (as an unseen id's row keeps
    its own on parasync's servers). forward(ids: int64, any shape) -> float [..., dim].
    `sparse`: nn.Embedding's sparse gradients (for optimizers that take them: SGD,
    Adagrad, SparseAdam), so a step costs the rows a batch touches, not the whole table."""

    def __init__(self, known_ids, dim, sparse=False):
        super().__init__()
        known = torch.unique(torch.as_tensor(known_ids, dtype=torch.int64).flatten())
        self.register_buffer("known", known, persistent=False)
        self.table = nn.Embedding(len(known) + 1, dim, sparse=sparse)
        nn.init.uniform_(self.table.weight, -TABLE_INIT, TABLE_INIT)

    def forward(self, ids):
        rows = torch.searchsorted(self.known, ids).clamp_(max=len(self.known) - 1)
        rows = torch.where(self.known[rows] == ids, rows, len(self.known))
        return self.table(rows)


def torch_embeddings(known_ids=None, sparse=False):
    """An embedding factory of local tables: for a vocabulary of num_embeddings rows an
    nn.Embedding (initialized as parasync's tables), for an unbounded one (None) a
    CompactEmbedding over known_ids[name] (ids of any shape), raising KeyError when none is
    given for that name. `sparse` as for CompactEmbedding, for every table made."""
    def factory(name, num_embeddings, dim):
        if num_embeddings is None:
            return CompactEmbedding(known_ids[name], dim, sparse)
        table = nn.Embedding(num_embeddings, dim, sparse=sparse)
        nn.init.uniform_(table.weight, -TABLE_INIT, TABLE_INIT)
        return table
    return factory


class KerasCnn(nn.Module):
    """parasync's `cnn` on 1x28x28 images: Conv2d(1, 32, 3) valid + ReLU -> Flatten (21,632)
    -> Linear(21632, 128) + ReLU -> Linear(128, 10). forward(x: float [B, 1, 28, 28])
    -> logits [B, 10]. `parasync_variables`: parasync's variables in its order, each
    (name, parameter, transposed) (torch_model.build's list)."""

    def __init__(self):
        super().__init__()
        self.net = torch_model.build(torch, CNN_SPEC, [1, 28, 28])
        self.parasync_variables = self.net.parasync_variables
        keras_init(self.parasync_variables)

    def forward(self, x):
        return self.net(x)


class Seq2SeqGru(nn.Module):
    """A GRU encoder-decoder over tokens (Cho et al. 2014, without attention): the source's
    token rows (table "source_tokens") run through a GRU; its last hidden state starts a
    second GRU over the target's token rows (table "target_tokens"), and a linear layer
    maps each of its states to logits over the vocabulary. The encoder's last state is also
    fed to every decoder step beside the token (so the source need not survive in the
    decoder's state alone).

    forward(source, lengths, target_in) -> logits [B, T, vocab], with teacher forcing:
      source int64 [B, S] padded after each sequence's `lengths` (int64 [B]) tokens;
      target_in int64 [B, T]: the target shifted right, the start token first.
    greedy(source, lengths, start, steps) -> int64 [B, steps]: each step fed the decoder's
      own previous argmax (no teacher forcing)."""

    def __init__(self, embedding_factory, vocab_size, embed_dim=32, hidden=128):
        super().__init__()
        self.source_tokens = embedding_factory("source_tokens", vocab_size, embed_dim)
        self.target_tokens = embedding_factory("target_tokens", vocab_size, embed_dim)
        self.encoder = nn.GRU(embed_dim, hidden, batch_first=True)
        self.decoder = nn.GRU(embed_dim + hidden, hidden, batch_first=True)
        self.output = nn.Linear(hidden, vocab_size)

    def encode(self, source, lengths):
        """The encoder's state after each sequence's last token: [1, B, hidden]."""
        packed = nn.utils.rnn.pack_padded_sequence(self.source_tokens(source), lengths.cpu(),
                                                   batch_first=True, enforce_sorted=False)
        _, state = self.encoder(packed)
        return state

    def decode(self, target_in, state, context):
        """Logits [B, T, vocab] and the decoder's state after target_in [B, T]."""
        tokens = self.target_tokens(target_in)
        steps = context.transpose(0, 1).expand(-1, tokens.shape[1], -1)
        out, state = self.decoder(torch.cat([tokens, steps], dim=2), state)
        return self.output(out), state

    def forward(self, source, lengths, target_in):
        context = self.encode(source, lengths)
        return self.decode(target_in, context, context)[0]

    def greedy(self, source, lengths, start, steps):
        context = self.encode(source, lengths)
        state = context
        token = torch.full((source.shape[0], 1), start, dtype=torch.int64)
        out = []
        for _ in range(steps):
            logits, state = self.decode(token, state, context)
            token = logits.argmax(dim=2)
            out.append(token)
        return torch.cat(out, dim=1)


class CtrModel(nn.Module):
    """parasync's `ctr`: each of the K id columns' row (one unbounded table,
    "embedding0/table", 16 floats a row: parasync's sparse embedding with a field per
    column, i.e. bags of one id), concatenated with the D dense features, into
    Linear(16 K + D, 64) + ReLU -> Linear(64, 32) + ReLU -> Linear(32, 1).
    forward(ids: int64 [B, K], x: float [B, D]) -> logits [B] (sigmoid cross-entropy
    against 0/1 labels, as parasync's loss)."""

    TABLE = "embedding0/table"  # parasync's name for the ctr table

    def __init__(self, embedding_factory, id_columns, dense_features, dim=CTR_DIM):
        super().__init__()
        self.embedding = embedding_factory(self.TABLE, None, dim)
        self.mlp = torch_model.build(torch, CTR_MLP_SPEC, [id_columns * dim + dense_features])
        keras_init(self.mlp.parasync_variables)

    def forward(self, ids, x):
        rows = self.embedding(ids).flatten(1)
        return self.mlp(torch.cat([rows, x], dim=1)).squeeze(1)


def parameter_counts(model):
    """{top-level child name: its parameter count}, and "total"; a CompactEmbedding's rows
    count as they are held locally."""
    counts = {name: sum(p.numel() for p in child.parameters())
              for name, child in model.named_children()}
    counts["total"] = sum(counts.values())
    return counts
