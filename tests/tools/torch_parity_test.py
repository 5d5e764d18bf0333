#!/usr/bin/python3
"""parasync and tools/benchmarks/torch_model.py build the same model: what tools/bench-worker
claims when it times PyTorch beside parasync ("the same model by construction").

For each case (every built-in model, each also on a non-square input where it takes images,
MLP widths, and model files with uneven `same` padding in a convolution, an average and a
max pooling, a standalone activation, dropout and a mean embedding):

  1. parasync-bench-compute --model M --input S --describe gives the description, from which
     torch_model.build() makes the PyTorch model, as bench-worker does;
  2. parasync-dump-gradients (tests/tools/dump_gradients_main.cc) runs one ForwardBackward of
     the CPU backend on fixed parameters and a fixed batch (--seed) and writes them, the
     dropout masks it drew, the loss and every variable's gradient;
  3. the PyTorch model must hold the same variables: the same names, in the same order, of
     the same shapes in parasync's layout (so the same parameter count per layer), and no
     parameter besides;
  4. with parasync's parameters copied in (torch_model's layout mapping) and each dropout
     layer applying parasync's mask (the rate is torch_model's own: kept elements are scaled
     by 1 / (1 - p) of its nn.Dropout), PyTorch computes the loss and the gradients in
     float64; the loss and each variable's gradient must agree within 1e-5.

The measure is relative: |loss_parasync - loss_torch| / |loss_torch|, and per variable
max|g_parasync - g_torch| / max|g_torch| (the largest error over the variable's largest
gradient). Relative, because gradients span orders of magnitude between models and layers
(a tanh network's first kernel's gradients are ~1e-4, a loss is ~2): an absolute 1e-5 would
be loose for the small ones. parasync computes in float32, so what remains is its rounding
(~1e-7 relative per operation). Every variable's gradient must also be nonzero, so that no
comparison passes by comparing zeros.

PyTorch is /usr/bin/python3's (Debian's python3-torch, which tools/install-deps.sh --tests
installs). Without it the test FAILS; PARASYNC_ALLOW_NO_TORCH=1 makes it skip instead (exit
77), for a machine where PyTorch cannot be installed -- never set in CI.

Usage: torch_parity_test.py BIN_DIR SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from checks import check, report  # noqa: E402

TOLERANCE = 1e-5
BATCH = 8
SEED = 7

# Uneven `same` padding: a 4x4 convolution and a 4x4 average pooling at stride 1 pad 1 before
# and 2 after; 2x2 pools at stride 2 on odd sizes pad 0 before and 1 after (a max pooling of
# tanh's signed values, where padding with zeros instead of -inf would show, and an average
# pooling); a 3x3 convolution at stride 2, valid, leaves a column over. On a
# non-square input 3x15x21 whose splits agree on both axes (parasync refuses one that does
# not): 4x15x21 -> 4x15x21 -> 4x8x11 -> 6x3x5 -> 6x2x3 -> 36 -> 16 -> 5.
UNEVEN = {
    "name": "uneven",
    "layers": [
        {"type": "conv2d", "filters": 4, "kernel": 4, "padding": "same", "activation": "tanh"},
        {"type": "avg_pool2d", "pool": 4, "stride": 1, "padding": "same"},
        {"type": "max_pool2d", "pool": 2, "padding": "same"},
        {"type": "conv2d", "filters": 6, "kernel": 3, "stride": 2, "activation": "tanh"},
        {"type": "avg_pool2d", "pool": 2, "padding": "same"},
        {"type": "flatten"},
        {"type": "dense", "units": 16, "activation": "sigmoid"},
        {"type": "dropout", "rate": 0.25},
        {"type": "activation", "activation": "relu"},
        {"type": "dense", "units": 5},
    ],
}
# A (non-sparse) embedding: 6 ids in 2 fields of 3, each the mean of its rows, then an MLP
# with dropout.
EMBEDDING = {
    "name": "embedding",
    "layers": [
        {"type": "embedding", "vocab": 50, "dim": 4, "fields": 2, "combiner": "mean"},
        {"type": "dense", "units": 8, "activation": "relu"},
        {"type": "dropout", "rate": 0.5},
        {"type": "dense", "units": 3},
    ],
}

# (model, input shape or None for the model's default, a model file's JSON or None).
CASES = [
    ("mlp", "1,28,28", None),
    ("mlp", "1,20,28", None),
    ("cnn", "1,28,28", None),
    ("cnn", "1,20,28", None),
    ("lenet5", "1,28,28", None),
    ("lenet5", "3,16,24", None),
    ("ctr", None, None),
    ("12-7-3", "12", None),
    ("uneven", "3,15,21", UNEVEN),
    ("embedding", "6", EMBEDDING),
]




def run(argv):
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=120)
    if proc.returncode != 0:
        print("$ " + " ".join(argv) + "\n" + proc.stdout + proc.stderr, flush=True)
    return proc


def load(np, directory, name, dtype, shape):
    return np.fromfile(os.path.join(directory, name), dtype=dtype).reshape(shape)


def masked_dropout(torch, dropout, mask):
    """A module for `dropout` (an nn.Dropout) applying parasync's `mask` (1 kept, [batch,
    elements]): kept elements scaled by 1 / (1 - p), p the nn.Dropout's own rate."""
    class MaskedDropout(torch.nn.Module):
        def forward(self, x):
            return x * mask.reshape(x.shape).to(x.dtype) / (1.0 - dropout.p)

    return MaskedDropout()


def compare(torch, np, torch_model, bin_dir, case, work):
    """Runs one case; returns (largest relative gradient difference, its variable, loss
    difference), or None where it could not be compared."""
    model, input_text, model_json = case
    label = f"{model} on {input_text or 'its default input'}"
    spec_arg = model
    if model_json is not None:
        spec_arg = os.path.join(work, model + ".json")
        with open(spec_arg, "w") as f:
            json.dump(model_json, f)
    input_args = ["--input", input_text] if input_text else []

    proc = run([os.path.join(bin_dir, "parasync-bench-compute"), "--model", spec_arg,
                *input_args, "--describe"])
    if not check(proc.returncode == 0, f"{label}: --describe exit status {proc.returncode}"):
        return None
    spec = json.loads(proc.stdout)
    out = os.path.join(work, model + "-" + (input_text or "default").replace(",", "x"))
    os.mkdir(out)
    proc = run([os.path.join(bin_dir, "parasync-dump-gradients"), "--model", spec_arg,
                *input_args, "--batch", str(BATCH), "--seed", str(SEED), "--out", out])
    if not check(proc.returncode == 0, f"{label}: parasync-dump-gradients exit status "
                 f"{proc.returncode}"):
        return None
    with open(os.path.join(out, "index.json")) as f:
        index = json.load(f)
    input_shape = index["input"]

    # The PyTorch model as bench-worker's torch_model.py builds it (a sparse table sized as
    # its make_setup sizes it for this batch).
    sparse = spec.get("sparse_input")
    rows = BATCH * sparse["compact_rows_per_example"] if sparse else None
    net = torch_model.build(torch, spec, input_shape, rows).double()
    variables = net.parasync_variables

    # 3. The same variables.
    theirs = [(v["name"], v["shape"]) for v in index["variables"]]
    ours = [(name, list((p.t() if transposed else p).shape))
            for name, p, transposed in variables]
    if not check(ours == theirs, f"{label}: variables (name, shape) differ:\n  parasync "
                 f"{theirs}\n  torch    {ours}"):
        return None
    mapped = sum(p.numel() for _, p, _ in variables)
    total = sum(p.numel() for p in net.parameters())
    if not check(mapped == total, f"{label}: torch has {total} parameters, {mapped} of them "
                 "parasync's variables"):
        return None

    # 4. parasync's parameters, batch and dropout masks.
    with torch.no_grad():
        for (name, p, transposed), v in zip(variables, index["variables"]):
            values = torch.from_numpy(load(np, out, v["values"], "<f4", v["shape"]))
            p.copy_(values.t() if transposed else values)
    dropouts = [(i, m) for i, m in enumerate(net) if isinstance(m, torch.nn.Dropout)]
    if not check(len(dropouts) == len(index["dropout"]), f"{label}: {len(dropouts)} "
                 f"dropout layers in torch, {len(index['dropout'])} in parasync"):
        return None
    for (i, dropout), d in zip(dropouts, index["dropout"]):
        mask = torch.from_numpy(load(np, out, d["mask"], "u1", d["shape"]))
        net[i] = masked_dropout(torch, dropout, mask)
    x = torch.from_numpy(load(np, out, index["x"], "<f4", [BATCH] + input_shape)).double()
    y = torch.from_numpy(load(np, out, index["y"], "u1", [BATCH]))
    params = [p for _, p, _ in variables]
    loss = torch_model.loss_of(torch, spec, net(x), y)
    grads = torch.autograd.grad(loss, params)

    loss_diff = abs(index["loss"] - loss.item()) / abs(loss.item())
    check(loss_diff <= TOLERANCE, f"{label}: loss {index['loss']:.9g} in parasync, "
          f"{loss.item():.9g} in torch (relative difference {loss_diff:.3g})")
    worst, worst_name = 0.0, ""
    for (name, _, transposed), v, g in zip(variables, index["variables"], grads):
        want = (g.t() if transposed else g).numpy()
        got = load(np, out, v["gradient"], "<f4", v["shape"]).astype("float64")
        scale = float(np.abs(want).max())
        if not check(scale > 0, f"{label}: {name}'s gradient is zero in torch"):
            continue
        diff = float(np.abs(got - want).max()) / scale
        check(diff <= TOLERANCE, f"{label}: {name}'s gradient differs by {diff:.3g} of its "
              f"largest element {scale:.3g}")
        if diff >= worst:
            worst, worst_name = diff, name
    per_layer = ", ".join(f"{n} {p.numel()}" for n, p, _ in variables)
    print(f"{label}: {total} parameters ({per_layer}); loss {index['loss']:.7f}, relative "
          f"difference {loss_diff:.2e}; gradients: largest relative difference {worst:.2e} "
          f"({worst_name})", flush=True)
    return worst


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    bin_dir, source_dir = sys.argv[1], sys.argv[2]
    try:
        import numpy as np
        import torch
    except ImportError as e:
        if os.environ.get("PARASYNC_ALLOW_NO_TORCH") == "1":
            print(f"SKIP: {sys.executable} cannot import {e.name} and PARASYNC_ALLOW_NO_TORCH=1")
            return 77
        print(f"FAIL: {sys.executable} cannot import {e.name}: tools/install-deps.sh --tests "
              "installs python3-torch (PARASYNC_ALLOW_NO_TORCH=1 skips this test instead)")
        return 1
    sys.path.insert(0, os.path.join(source_dir, "tools", "benchmarks"))
    import torch_model
    torch.set_num_threads(1)
    print(f"PyTorch {torch.__version__}, float64; parasync's CPU backend, float32", flush=True)
    with tempfile.TemporaryDirectory(prefix="torch_parity.") as work:
        for case in CASES:
            compare(torch, np, torch_model, bin_dir, case, work)
    return report()


if __name__ == "__main__":
    sys.exit(main())
