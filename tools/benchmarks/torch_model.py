#!/usr/bin/env python3
"""A parasync model in PyTorch eager mode, built from the same model description
(parasync-bench-compute --describe prints it), timed as parasync-bench-compute times its
backends: examples/sec of forward + backward (the gradients of every parameter, none of the
input) for each batch size, the median of several repeats. Prints the same CSV
(device,batch,median_examples_per_sec,min,max,repeats,steps_per_repeat), one row per batch
size and variant:

  torch-cpu        on the CPU with --threads threads (torch.set_num_threads)
  torch-resident   on the GPU: parameters, batch and gradients stay there (PyTorch's usual loop)
  torch-transfers  on the GPU, and each step also does what a parameter-server worker must:
                   parameters and the batch come from page-locked host memory, gradients go
                   back to it (the contract of parasync's ComputeBackend::ForwardBackward)

TF32 is off, as in parasync's cuBLAS calls: both compute in full FP32. The layers follow
docs/models.md: kernels OIHW / [in, out], TensorFlow's `same` padding per axis (an odd
padding's extra row or column after), average pooling without the padding, dropout active
(training mode). tests/tools/torch_parity_test.py checks that build() makes parasync's model:
the same variables, and the same loss and gradients on the same parameters and batch.

A model with a sparse embedding (ctr) takes what parasync-bench-compute gives its backend,
from the "sparse_input" object of the description: per batch size, a synthetic batch of K id
columns drawn Zipf as parasync-gen-ctr draws them and D normal dense features, the ids
replaced by their indices among the batch's distinct ids, and an nn.Embedding over the
compact table (batch * compact_rows_per_example rows, as the worker sizes it) whose rows
count as parameters: torch-transfers copies them in and their gradient out each step. Each
example's input is one float tensor [K + D] (ids first), as parasync's is.
"""
import argparse
import json
import statistics
import sys
import time

import torch_env  # what PyTorch runs with; refuses a CPU baseline on the reference BLAS
#                   or without its allocator


def build(torch, spec, input_shape, table_rows=None):
    """An nn.Sequential computing the logits of `spec` (a parsed model description) on
    examples of `input_shape` ([C, H, W] or [D]); a first embedding layer's table has
    `table_rows` rows (default: its vocab). Its attribute `parasync_variables` lists
    parasync's variables in Model::variables() order, each (name, parameter, transposed):
    the parameter holding it, transposed where the layouts differ (a dense kernel is
    [in, units] in parasync, nn.Linear's weight [units, in]); conv kernels (OIHW) and
    embedding tables ([rows, dim]) are laid out alike."""
    nn = torch.nn
    F = nn.functional

    class Embedding(nn.Module):
        """parasync's embedding: the first `ids` inputs (floats holding row indices) form
        `fields` bags, each the sum or mean of its rows; the dense features follow."""

        def __init__(self, rows, dim, ids, fields, combiner):
            super().__init__()
            self.ids, self.fields, self.bag = ids, fields, ids // fields
            if self.bag == 1:
                self.table = nn.Embedding(rows, dim)
            else:
                self.table = nn.EmbeddingBag(rows, dim, mode=combiner)

        def forward(self, x):
            ids = x[:, :self.ids].long()
            if self.bag == 1:
                rows = self.table(ids).flatten(1)
            else:
                rows = self.table(ids.reshape(-1, self.bag)).reshape(x.shape[0], -1)
            return torch.cat([rows, x[:, self.ids:]], dim=1) if x.shape[1] > self.ids else rows

    class Pad(nn.Module):
        """Pads (left, right, top, bottom) with `value`."""

        def __init__(self, pad, value):
            super().__init__()
            self.pad, self.value = pad, value

        def forward(self, x):
            return F.pad(x, self.pad, value=self.value)

    class AvgPoolExcludingPad(nn.Module):
        """Average pooling over zero padding (left, right, top, bottom), the padding left
        out of each mean (TensorFlow's `same`), for splits nn.AvgPool2d cannot express (its
        padding is symmetric): the sum over each window divided by its count of inputs."""

        def __init__(self, k, s, pad):
            super().__init__()
            self.k, self.s, self.pad = k, s, pad

        def forward(self, x):
            ones = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=x.dtype, device=x.device)
            total = F.avg_pool2d(F.pad(x, self.pad), self.k, self.s)
            count = F.avg_pool2d(F.pad(ones, self.pad), self.k, self.s)
            return total / count

    def window(n, k, s, padding):
        """(out, pad before, pad after) along one axis, as worker/model/model.cc's Slide."""
        if padding == "valid":
            return (n - k) // s + 1, 0, 0
        out = (n + s - 1) // s
        total = max((out - 1) * s + k - n, 0)
        return out, total // 2, total - total // 2

    layers = []
    variables = []
    shape = list(input_shape)
    first = True
    for l in spec["layers"]:
        t = l["type"]
        if t == "dense":
            if len(shape) > 1:
                layers.append(nn.Flatten())
            n_in = 1
            for d in shape:
                n_in *= d
            layers.append(nn.Linear(n_in, l["units"]))
            variables += [(l["name"] + "/kernel", layers[-1].weight, True),
                          (l["name"] + "/bias", layers[-1].bias, False)]
            shape = [l["units"]]
        elif t in ("conv2d", "max_pool2d", "avg_pool2d"):
            k = l.get("kernel", l.get("pool", 2))
            s = l.get("stride", 1 if t == "conv2d" else k)
            padding = l.get("padding", "valid")
            oh, hb, he = window(shape[1], k, s, padding)
            ow, wb, we = window(shape[2], k, s, padding)
            pad = (wb, we, hb, he)  # F.pad's order: the last axis (width) first
            if t == "conv2d":
                if any(pad):
                    layers.append(Pad(pad, 0.0))
                layers.append(nn.Conv2d(shape[0], l["filters"], k, stride=s))
                variables += [(l["name"] + "/kernel", layers[-1].weight, False),
                              (l["name"] + "/bias", layers[-1].bias, False)]
                shape = [l["filters"], oh, ow]
            elif t == "max_pool2d":
                if any(pad):
                    layers.append(Pad(pad, float("-inf")))
                layers.append(nn.MaxPool2d(k, stride=s))
                shape = [shape[0], oh, ow]
            elif len(set(pad)) == 1:  # no padding, or the same on all four sides
                layers.append(nn.AvgPool2d(k, stride=s, padding=hb, count_include_pad=False))
                shape = [shape[0], oh, ow]
            else:
                layers.append(AvgPoolExcludingPad(k, s, pad))
                shape = [shape[0], oh, ow]
        elif t == "flatten":
            layers.append(nn.Flatten())
            n = 1
            for d in shape:
                n *= d
            shape = [n]
        elif t == "activation":
            pass
        elif t == "dropout":
            layers.append(nn.Dropout(l["rate"]))
        elif t == "embedding":
            if not first:
                raise SystemExit("torch_model.py: embedding must be the first layer")
            sparse = spec.get("sparse_input", {})
            ids = sparse.get("id_columns", shape[0])
            fields = l.get("fields", 1) or ids
            rows = table_rows if table_rows is not None else l["vocab"]
            layers.append(Embedding(rows, l["dim"], ids, fields, l.get("combiner", "sum")))
            variables.append((l["name"] + "/table", layers[-1].table.weight, False))
            shape = [fields * l["dim"] + shape[0] - ids]
        else:
            raise SystemExit(f"torch_model.py: unknown layer type {t}")
        act = l.get("activation", "linear")
        if act == "relu":
            layers.append(nn.ReLU())
        elif act == "tanh":
            layers.append(nn.Tanh())
        elif act == "sigmoid":
            layers.append(nn.Sigmoid())
        first = False
    net = nn.Sequential(*layers)
    net.parasync_variables = variables
    return net


def loss_of(torch, spec, logits, y):
    """The mean loss of the batch, as parasync's: softmax cross-entropy over class labels, or
    sigmoid cross-entropy of the one logit against 0/1 labels."""
    if spec.get("loss") == "sigmoid_cross_entropy":
        return torch.nn.functional.binary_cross_entropy_with_logits(logits[:, 0],
                                                                    y.to(logits.dtype))
    return torch.nn.functional.cross_entropy(logits, y.long())


def zipf_ranks(torch, n, s, count, gen):
    """`count` ranks in 1..n with P(k) proportional to k^-s: rejection-inversion (Hoermann
    and Derflinger 1996), as tools/zipf_sampler.h draws them for parasync-gen-ctr."""
    def log1p_over_x(x):
        small = x.abs() <= 1e-8
        safe = torch.where(small, torch.ones_like(x), x)
        return torch.where(small, 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x)),
                           torch.log1p(safe) / safe)

    def expm1_over_x(x):
        small = x.abs() <= 1e-8
        safe = torch.where(small, torch.ones_like(x), x)
        return torch.where(small, 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x)),
                           torch.expm1(safe) / safe)

    def h(x):
        return torch.exp(-s * torch.log(x))

    def h_integral(x):
        log_x = torch.log(x)
        return expm1_over_x((1.0 - s) * log_x) * log_x

    def h_integral_inverse(x):
        t = (x * (1.0 - s)).clamp(min=-1.0)
        return torch.exp(log1p_over_x(t) * x)

    f64 = lambda v: torch.tensor(float(v), dtype=torch.float64)  # noqa: E731
    x1 = h_integral(f64(1.5)) - 1.0
    hn = h_integral(f64(n + 0.5))
    squeeze = 2.0 - h_integral_inverse(h_integral(f64(2.5)) - h(f64(2.0)))
    out = torch.empty(count, dtype=torch.int64)
    todo = torch.arange(count)
    while todo.numel():
        u = hn + torch.rand(todo.numel(), generator=gen, dtype=torch.float64) * (x1 - hn)
        x = h_integral_inverse(u)
        k = (x + 0.5).long().clamp(1, n)
        kd = k.double()
        ok = (kd - x <= squeeze) | (u >= h_integral(kd + 0.5) - h(kd))
        out[todo[ok]] = k[ok]
        todo = todo[~ok]
    return out


def ctr_batch(torch, sparse, batch):
    """The input [batch, K + D] and labels of a synthetic ctr batch (parasync-bench-compute's
    distribution, not its bits): field f's ids are f * vocab + a Zipf rank, replaced by their
    indices among the batch's distinct ids; then D standard normal features."""
    k, d = sparse["id_columns"], sparse["dense_features"]
    vocab = sparse["vocab_per_field"]
    gen = torch.Generator().manual_seed(batch)
    ranks = zipf_ranks(torch, vocab, sparse["zipf"], batch * k, gen).view(batch, k)
    ids = torch.arange(k).view(1, k) * vocab + ranks - 1
    unique, local = torch.unique(ids, return_inverse=True)
    x = torch.cat([local.float(), torch.randn(batch, d, generator=gen)], dim=1)
    y = torch.randint(0, 2, (batch,), dtype=torch.uint8, generator=gen)
    return x, y, unique.numel()


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--describe", required=True,
                        help="the model description (JSON), as parasync-bench-compute "
                             "--describe prints it")
    parser.add_argument("--input", default=None,
                        help="one example's shape: C,H,W or D (default 1,28,28; a sparse "
                             "model's K + D from the description)")
    parser.add_argument("--batches", default="64,128,256,512,1024,2048,4096,8192")
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (--device cpu)")
    return parser.parse_args()


def make_setup(torch, spec, input_shape, batches, dev, on_gpu, sigmoid):
    """setup(batch): what a step on `batch` examples needs, built once per model."""
    sparse = spec.get("sparse_input")
    setups = {}

    def setup(batch):
        """(model, params, host x, host y, [host params, host grads, device x, device y])
        for `batch`: one model for every batch size, or a sparse model's own per batch."""
        key = batch if sparse else 0
        if key in setups:
            return setups[key]
        torch.manual_seed(1)
        if sparse:
            rows = batch * sparse["compact_rows_per_example"]
            model = build(torch, spec, input_shape, rows).to(dev).train()
            host_x, host_y, unique = ctr_batch(torch, sparse, batch)
            print(f"torch_model.py: batch {batch}: {batch * sparse['id_columns']} ids, "
                  f"{unique} unique rows in a compact table of {rows}", file=sys.stderr)
        else:
            model = build(torch, spec, input_shape).to(dev).train()
            max_batch = max(batches)
            first = spec["layers"][0]
            if first["type"] == "embedding":
                host_x = torch.randint(0, first["vocab"], [max_batch] + input_shape).float()
            else:
                host_x = torch.rand([max_batch] + input_shape)
            classes = 2 if sigmoid else model(host_x[:2].to(dev)).shape[1]
            host_y = torch.randint(0, classes, (max_batch,), dtype=torch.uint8)
        params = list(model.parameters())
        s = [model, params, host_x, host_y]
        if on_gpu:
            host_params = [p.detach().cpu().pin_memory() for p in params]
            host_grads = [torch.empty_like(h).pin_memory() for h in host_params]
            s[2], s[3] = host_x.pin_memory(), host_y.pin_memory()
            s += [host_params, host_grads, s[2].to(dev), s[3].to(dev)]
        setups[key] = s
        return s

    return setup


def time_variants(variants, batches, args, sync, setup):
    """Prints the CSV: a row per variant and batch size."""
    print("device,batch,median_examples_per_sec,min,max,repeats,steps_per_repeat")
    for name, step in variants:
        for batch in batches:
            setup(batch)  # built (and its batch drawn) before the clock starts
            sync()
            w0 = time.perf_counter()
            warm = 0
            while warm < 3 or time.perf_counter() - w0 < 0.2 * args.seconds:
                step(batch)
                warm += 1
            sync()
            per_step = (time.perf_counter() - w0) / warm
            steps = max(3, int(args.seconds / per_step))
            rates = []
            for _ in range(args.repeats):
                sync()
                t0 = time.perf_counter()
                for _ in range(steps):
                    step(batch)
                sync()
                rates.append(steps * batch / (time.perf_counter() - t0))
            print(f"{name},{batch},{statistics.median(rates):.0f},{min(rates):.0f},"
                  f"{max(rates):.0f},{args.repeats},{steps}", flush=True)


def main() -> int:
    args = parse_args()
    torch_env.start_with_allocator("torch_model.py")  # before torch: this process again
    try:
        import torch
    except ImportError:
        print("torch_model.py: PyTorch is not installed", file=sys.stderr)
        return 2
    on_gpu = args.device != "cpu"
    if on_gpu and not torch.cuda.is_available():
        print("torch_model.py: PyTorch sees no GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if not on_gpu:
        torch.set_num_threads(args.threads)
    if not torch_env.check(torch, "torch_model.py", cpu=not on_gpu):
        return 2
    spec = json.loads(args.describe)
    sparse = spec.get("sparse_input")
    if args.input is None:
        args.input = (f"{sparse['id_columns'] + sparse['dense_features']}" if sparse
                      else "1,28,28")
    input_shape = [int(d) for d in args.input.split(",")]
    if sparse and input_shape != [sparse["id_columns"] + sparse["dense_features"]]:
        print(f"torch_model.py: --input {args.input} is not the description's K + D, "
              f"{sparse['id_columns'] + sparse['dense_features']}", file=sys.stderr)
        return 2
    batches = [int(b) for b in args.batches.split(",")]
    dev = torch.device(args.device)
    sigmoid = spec.get("loss") == "sigmoid_cross_entropy"
    setup = make_setup(torch, spec, input_shape, batches, dev, on_gpu, sigmoid)

    sync = (lambda: torch.cuda.synchronize(dev)) if on_gpu else (lambda: None)
    if on_gpu:
        def resident_step(batch):
            model, params, _, _, _, _, dev_x, dev_y = setup(batch)
            torch.autograd.grad(loss_of(torch, spec, model(dev_x[:batch]), dev_y[:batch]), params)

        def transfers_step(batch):
            model, params, host_x, host_y, host_params, host_grads, _, _ = setup(batch)
            with torch.no_grad():
                for p, h in zip(params, host_params):
                    p.copy_(h, non_blocking=True)
            x = host_x[:batch].to(dev, non_blocking=True)
            y = host_y[:batch].to(dev, non_blocking=True)
            grads = torch.autograd.grad(loss_of(torch, spec, model(x), y), params)
            for g, h in zip(grads, host_grads):
                h.copy_(g, non_blocking=True)
            torch.cuda.synchronize(dev)  # the caller reads the gradients now

        variants = [("torch-resident", resident_step), ("torch-transfers", transfers_step)]
        where = torch.cuda.get_device_name(dev)
    else:
        def cpu_step(batch):
            model, params, host_x, host_y = setup(batch)
            torch.autograd.grad(loss_of(torch, spec, model(host_x[:batch]), host_y[:batch]), params)

        variants = [("torch-cpu", cpu_step)]
        where = f"CPU, {torch.get_num_threads()} thread(s)"
    print(f"torch_model.py: PyTorch {torch.__version__} on {where}, model "
          f"{spec.get('name', '')}", file=sys.stderr)

    time_variants(variants, batches, args, sync, setup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
