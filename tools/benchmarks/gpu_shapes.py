#!/usr/bin/env python3
"""The CNN's heavy GPU operations one at a time, in parasync's orientation beside PyTorch's.

Times (CUDA events, median of --repeats after warm-up) on the GPU, FP32, no TF32:
  - the dense layer's three products (forward, weight gradient, input gradient) as parasync's
    CUDA backend calls them (weights [in, out] row-major; cuBLAS column-major with the
    transposes of worker/compute/cuda/dense_layer.cc) and as nn.Linear does (weights
    [out, in]);
  - the convolution's forward, backward-data and backward-filter passes under cuDNN with
    PyTorch's defaults, with deterministic algorithms only, and with benchmark=True.
Used to find which kernel a batch-size gap comes from (docs/performance.md, GPU).

  gpu_shapes.py [--batches 256,1024,4096] [--in 21632] [--out 128] [--repeats 20]
"""
import argparse
import statistics
import sys


def timed(torch, fn, repeats):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="256,1024,4096")
    p.add_argument("--in", dest="inputs", type=int, default=21632)
    p.add_argument("--out", type=int, default=128)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    try:
        import torch
    except ImportError:
        print("gpu_shapes.py: PyTorch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_shapes.py: PyTorch sees no GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    print(f"gpu_shapes.py: PyTorch {torch.__version__}, {torch.cuda.get_device_name(dev)}, "
          f"cuDNN {torch.backends.cudnn.version()}")
    k, o = args.inputs, args.out
    print("op,batch,parasync_orientation_ms,pytorch_orientation_ms")
    for batch in [int(b) for b in args.batches.split(",")]:
        x = torch.rand(batch, k, device=dev)
        dy = torch.rand(batch, o, device=dev)
        w_io = torch.rand(k, o, device=dev)   # parasync: [in, out]
        w_oi = torch.rand(o, k, device=dev)   # nn.Linear: [out, in]
        rows = [
            ("dense forward", lambda: x @ w_io, lambda: x @ w_oi.t()),
            ("dense weight grad", lambda: x.t() @ dy, lambda: dy.t() @ x),
            ("dense input grad", lambda: dy @ w_io.t(), lambda: dy @ w_oi),
        ]
        for name, ours, theirs in rows:
            print(f"{name},{batch},{timed(torch, ours, args.repeats):.4f},"
                  f"{timed(torch, theirs, args.repeats):.4f}", flush=True)
    print("op,batch,default_ms,deterministic_ms,benchmark_ms")
    conv = torch.nn.Conv2d(1, 32, 3).to(dev)
    for batch in [int(b) for b in args.batches.split(",")]:
        img = torch.rand(batch, 1, 28, 28, device=dev, requires_grad=True)
        out = conv(img)
        g = torch.rand_like(out)

        def fwd():
            conv(img)

        def bwd():
            torch.autograd.grad(conv(img), [img, conv.weight, conv.bias], g)

        for name, fn in (("conv forward", fwd), ("conv forward+backward", bwd)):
            cells = []
            for det, bench in ((False, False), (True, False), (False, True)):
                torch.backends.cudnn.deterministic = det
                torch.backends.cudnn.benchmark = bench
                cells.append(f"{timed(torch, fn, args.repeats):.4f}")
            torch.backends.cudnn.deterministic = False
            torch.backends.cudnn.benchmark = False
            print(f"{name},{batch}," + ",".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
