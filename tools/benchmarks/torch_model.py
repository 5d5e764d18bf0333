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
docs/models.md: kernels OIHW / [in, out], TensorFlow's `same` padding (an odd padding's extra
row after), average pooling without the padding, dropout active (training mode).
"""
import argparse
import json
import statistics
import sys
import time


def build(torch, spec, input_shape):
    """An nn.Module computing the logits of `spec` (a parsed model description)."""
    nn = torch.nn
    F = nn.functional

    class SamePad(nn.Module):
        def __init__(self, begin, end):
            super().__init__()
            self.pad = (begin, end, begin, end)

        def forward(self, x):
            return F.pad(x, self.pad)

    def window(n, k, s, padding):
        if padding == "valid":
            return (n - k) // s + 1, 0, 0
        out = (n + s - 1) // s
        total = max((out - 1) * s + k - n, 0)
        return out, total // 2, total - total // 2

    layers = []
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
            shape = [l["units"]]
        elif t in ("conv2d", "max_pool2d", "avg_pool2d"):
            k = l.get("kernel", l.get("pool", 2))
            s = l.get("stride", 1 if t == "conv2d" else k)
            out, pb, pe = window(shape[1], k, s, l.get("padding", "valid"))
            if pb or pe:
                if t == "max_pool2d":
                    layers.append(nn.ConstantPad2d((pb, pe, pb, pe), float("-inf")))
                elif t == "avg_pool2d" and pb == pe:
                    pass  # handled by the pool's own padding, excluded from the mean
                elif t == "avg_pool2d":
                    raise SystemExit("torch_model.py: uneven avg_pool2d padding is not mapped")
                else:
                    layers.append(SamePad(pb, pe))
            if t == "conv2d":
                layers.append(nn.Conv2d(shape[0], l["filters"], k, stride=s))
                shape = [l["filters"], out, out]
            elif t == "max_pool2d":
                layers.append(nn.MaxPool2d(k, stride=s))
                shape = [shape[0], out, out]
            else:
                layers.append(nn.AvgPool2d(k, stride=s, padding=pb, count_include_pad=False))
                shape = [shape[0], out, out]
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
            layers.append(nn.EmbeddingBag(l["vocab"], l["dim"], mode=l.get("combiner", "sum")))
            shape = [l["dim"]]
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
    return nn.Sequential(*layers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--describe", required=True,
                        help="the model description (JSON), as parasync-bench-compute "
                             "--describe prints it")
    parser.add_argument("--input", default="1,28,28", help="one example's shape: C,H,W or D")
    parser.add_argument("--batches", default="64,128,256,512,1024,2048,4096,8192")
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (--device cpu)")
    args = parser.parse_args()
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
    spec = json.loads(args.describe)
    input_shape = [int(d) for d in args.input.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    dev = torch.device(args.device)
    torch.manual_seed(1)
    model = build(torch, spec, input_shape).to(dev).train()
    params = list(model.parameters())
    max_batch = max(batches)
    first = spec["layers"][0]
    if first["type"] == "embedding":
        host_x = torch.randint(0, first["vocab"], [max_batch] + input_shape)
    else:
        host_x = torch.rand([max_batch] + input_shape)
    sigmoid = spec.get("loss") == "sigmoid_cross_entropy"
    classes = 2 if sigmoid else model(host_x[:2].to(dev)).shape[1]
    host_y = torch.randint(0, classes, (max_batch,), dtype=torch.uint8)

    def loss_of(logits, y):
        if sigmoid:
            return torch.nn.functional.binary_cross_entropy_with_logits(logits[:, 0], y.float())
        return torch.nn.functional.cross_entropy(logits, y.long())

    sync = (lambda: torch.cuda.synchronize(dev)) if on_gpu else (lambda: None)
    variants = []
    if on_gpu:
        host_params = [p.detach().cpu().pin_memory() for p in params]
        host_grads = [torch.empty_like(h).pin_memory() for h in host_params]
        host_x, host_y = host_x.pin_memory(), host_y.pin_memory()
        dev_x, dev_y = host_x.to(dev), host_y.to(dev)

        def resident_step(batch):
            torch.autograd.grad(loss_of(model(dev_x[:batch]), dev_y[:batch]), params)

        def transfers_step(batch):
            with torch.no_grad():
                for p, h in zip(params, host_params):
                    p.copy_(h, non_blocking=True)
            x = host_x[:batch].to(dev, non_blocking=True)
            y = host_y[:batch].to(dev, non_blocking=True)
            grads = torch.autograd.grad(loss_of(model(x), y), params)
            for g, h in zip(grads, host_grads):
                h.copy_(g, non_blocking=True)
            torch.cuda.synchronize(dev)  # the caller reads the gradients now

        variants = [("torch-resident", resident_step), ("torch-transfers", transfers_step)]
        where = torch.cuda.get_device_name(dev)
    else:
        def cpu_step(batch):
            torch.autograd.grad(loss_of(model(host_x[:batch]), host_y[:batch]), params)

        variants = [("torch-cpu", cpu_step)]
        where = f"CPU, {torch.get_num_threads()} thread(s)"
    print(f"torch_model.py: PyTorch {torch.__version__} on {where}, model "
          f"{spec.get('name', '')}", file=sys.stderr)

    print("device,batch,median_examples_per_sec,min,max,repeats,steps_per_repeat")
    for name, step in variants:
        for batch in batches:
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
