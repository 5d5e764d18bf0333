#!/usr/bin/env python3
"""The same MLP as parasync's worker, in PyTorch eager mode, timed as parasync-bench-compute
times its backends: examples/sec of forward + backward for each batch size, the median of
several repeats. Prints the same CSV (device,batch,median_examples_per_sec,min,max,repeats,
steps_per_repeat), one row per batch size and variant:

  torch-resident   parameters, batch and gradients stay on the GPU (PyTorch's usual loop);
  torch-transfers  each step also does what a parameter-server worker must: parameters and
                   the batch come from page-locked host memory, gradients go back to it
                   (exactly the contract of parasync's ComputeBackend::ForwardBackward).

TF32 is off, as in parasync's cuBLAS calls: both compute in full FP32.
"""
import argparse
import statistics
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="784-256-128-10")
    parser.add_argument("--batches", default="64,128,256,512,1024,2048,4096,8192")
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("torch_mlp.py: PyTorch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_mlp.py: PyTorch sees no GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)
    widths = [int(w) for w in args.model.split("-")]
    batches = [int(b) for b in args.batches.split(",")]
    torch.manual_seed(1)

    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers).to(dev)
    params = list(model.parameters())
    host_params = [p.detach().cpu().pin_memory() for p in params]
    host_grads = [torch.empty_like(h).pin_memory() for h in host_params]
    max_batch = max(batches)
    host_x = torch.rand(max_batch, widths[0]).pin_memory()
    host_y = torch.randint(0, widths[-1], (max_batch,), dtype=torch.uint8).pin_memory()
    dev_x = host_x.to(dev)
    dev_y = host_y.to(dev).long()
    print(f"torch_mlp.py: PyTorch {torch.__version__} on {torch.cuda.get_device_name(dev)}",
          file=sys.stderr)

    def resident_step(batch):
        loss = torch.nn.functional.cross_entropy(model(dev_x[:batch]), dev_y[:batch])
        torch.autograd.grad(loss, params)

    def transfers_step(batch):
        with torch.no_grad():
            for p, h in zip(params, host_params):
                p.copy_(h, non_blocking=True)
        x = host_x[:batch].to(dev, non_blocking=True)
        y = host_y[:batch].to(dev, non_blocking=True).long()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        grads = torch.autograd.grad(loss, params)
        for g, h in zip(grads, host_grads):
            h.copy_(g, non_blocking=True)
        torch.cuda.synchronize(dev)  # the caller reads the gradients now
        return loss

    print("device,batch,median_examples_per_sec,min,max,repeats,steps_per_repeat")
    for name, step in (("torch-resident", resident_step), ("torch-transfers", transfers_step)):
        for batch in batches:
            torch.cuda.synchronize(dev)
            w0 = time.perf_counter()
            warm = 0
            while warm < 3 or time.perf_counter() - w0 < 0.2 * args.seconds:
                step(batch)
                warm += 1
            torch.cuda.synchronize(dev)
            per_step = (time.perf_counter() - w0) / warm
            steps = max(3, int(args.seconds / per_step))
            rates = []
            for _ in range(args.repeats):
                torch.cuda.synchronize(dev)
                t0 = time.perf_counter()
                for _ in range(steps):
                    step(batch)
                torch.cuda.synchronize(dev)
                rates.append(steps * batch / (time.perf_counter() - t0))
            print(f"{name},{batch},{statistics.median(rates):.0f},{min(rates):.0f},"
                  f"{max(rates):.0f},{args.repeats},{steps}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
