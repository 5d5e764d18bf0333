#!/usr/bin/env python3
"""parasync.horovod against real servers and real worker processes.

- Equivalence (sync, 2 workers): ranks that start from different random parameters are made
  equal by broadcast_parameters; a script with torch.optim.SGD (momentum), StepLR and
  clip_grad_norm_ between synchronize() and skip_synchronize() ends with the parameters one
  process reaches averaging the two ranks' gradients each step and applying the same
  optimizer, within 1e-5 relative; the same with AdamW; both ranks' parameters are bitwise
  identical. A gradient dropped, counted twice or summed where averaged misses by far more.
  hvd.start_timeline: with "{rank}" in the path (sgd) every rank writes its own file, without
  it (adamw) rank 0 alone; each is JSON with every step's phases in order.
- Collectives (2 and 3 workers): allreduce (Average, Sum, Min, Max; in place; async; fp16),
  grouped_allreduce, allgather (ranks of different lengths), broadcast (one of 6 MB, which
  travels in parts), broadcast_object,
  allgather_object and broadcast_optimizer_state, each against its definition.
- DistributedOptimizer's options (sync, 2 workers): op=Sum with backward_passes_per_step=2
  and gradient_predivide_factor give every rank the sum, or the average, of every rank's
  gradients; a frozen parameter keeps none.
- A dead worker (sync, 2 workers: rank 1 killed with SIGKILL mid-run): rank 0's steps wait
  for it no longer than the servers' worker timeout, and its allreduce goes on without it.
- join (sync, 3 workers, uneven data: rank r has 6 - r batches, then hvd.join()): no step
  waits for a rank that joined, rank 0 names itself the last to join (the others, polling,
  name 0 or 1), a collective after
  join is refused, and the servers applied every batch of every rank once (6 steps, the
  examples of 15 batches).
- elastic (sync, 2 workers, hvd.elastic.run with TorchState and ElasticSampler): rank 1, then
  (a second run) rank 0, is killed (SIGKILL) mid-epoch and started again as the launcher
  restarts it (PARASYNC_RESTART): the other's steps wait for the dead rank no longer than the
  worker timeout, the restarted rank is admitted back at the other's next commit and takes
  the survivor's state (not its own empty one), both end with bitwise-identical parameters,
  every example of every epoch is trained (at most the sampler's padding twice), and the
  servers applied exactly the batches the ranks trained.
- async (2 workers, deltas): the servers end holding the initial parameters plus every delta
  every worker pushed (each exactly once), and each worker's last pull is what the servers
  held then.

Usage: horovod_test.py BIN_DIR PYTHON_DIR SOURCE_DIR
       horovod_test.py --worker SCENARIO OUT   (a worker process; the environment says who)
"""

import glob
import json
import math
import re
import os
import subprocess
import sys
import tempfile
import time

if sys.argv[1] == "--worker":
    SCENARIO, OUT = sys.argv[2], sys.argv[3]
else:
    BIN_DIR, PYTHON_DIR, SOURCE_DIR = sys.argv[1:4]
    sys.path[:0] = [PYTHON_DIR, os.path.join(SOURCE_DIR, "tests", "support")]

import numpy as np  # noqa: E402

STEPS = 6
BATCH = 8


def make_net(torch):
    from torch import nn

    class Net(nn.Module):  # Horovod's MNIST example's shape, smaller
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 4, 3)
            self.conv2 = nn.Conv2d(4, 6, 3)
            self.fc1 = nn.Linear(6 * 4 * 4, 16)
            self.fc2 = nn.Linear(16, 10)

        def forward(self, x):
            F = nn.functional
            x = F.relu(self.conv1(x))
            x = F.relu(F.max_pool2d(self.conv2(x), 2))
            x = F.relu(self.fc1(x.flatten(1)))
            return F.log_softmax(self.fc2(x), dim=1)

    return Net()


def batch(torch, rank: int, step: int):
    rng = np.random.default_rng(1000 * rank + step)
    x = torch.from_numpy(rng.standard_normal((BATCH, 1, 12, 12)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 10, BATCH))
    return x, y


def make_optimizer(torch, name: str, params, lr_scale: float):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05 * lr_scale, momentum=0.9)
    return torch.optim.AdamW(params, lr=0.01 * lr_scale, weight_decay=0.05)


def sync_bn_inputs(torch, ranks: int):
    """A batch of 2 rows per rank (3 channels, 4x4) and the weights of the loss over it."""
    g = torch.Generator().manual_seed(11)
    return (torch.randn(2 * ranks, 3, 4, 4, generator=g) * 3 + 1,
            torch.randn(2 * ranks, 3, 4, 4, generator=g))


# ---- worker side ----------------------------------------------------------------------------
def worker_train(optimizer_name: str) -> dict:
    import torch
    import torch.nn.functional as F

    import parasync.horovod as hvd
    hvd.init()
    torch.manual_seed(100 + hvd.rank())  # different on every rank: broadcast makes them equal
    model = make_net(torch)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = make_optimizer(torch, optimizer_name, model.parameters(), hvd.size())
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    if optimizer_name == "sgd":  # the state broadcast into the optimizer, then wrapped
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    else:  # Horovod's example's order: wrapped, then broadcast (rank 1's rate is made wrong)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        if hvd.rank() == 1:
            for group in optimizer.param_groups:
                group["lr"] *= 3
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    # sgd: every rank's own timeline; adamw: Horovod's, rank 0's alone.
    hvd.start_timeline(os.path.join(os.path.dirname(OUT), f"timeline-{optimizer_name}" +
                                    ("-{rank}" if optimizer_name == "sgd" else "") + ".json"))
    writes_timeline = hvd._state.timeline is not None
    for step in range(STEPS):
        x, y = batch(torch, hvd.rank(), step)
        optimizer.zero_grad()
        F.nll_loss(model(x), y).backward()
        optimizer.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with optimizer.skip_synchronize():
            optimizer.step()
        scheduler.step()
    out = {"before": before, "start": start, "writes_timeline": writes_timeline,
           "end": {n: p.detach().clone() for n, p in model.named_parameters()}}
    hvd.shutdown()
    return out


def worker_collectives() -> dict:
    import torch

    import parasync.horovod as hvd
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out = {"rank": r, "size": n}
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    mine = base * (r + 1) + r
    out["average"] = hvd.allreduce(mine, name="avg")
    out["sum"] = hvd.allreduce(mine, op=hvd.Sum)
    out["min"] = hvd.allreduce(mine * (-1) ** r, op=hvd.Min, name="min")
    out["max"] = hvd.allreduce(mine * (-1) ** r, op=hvd.Max, name="max")
    out["average_again"] = hvd.allreduce(mine + 1, name="avg")  # round 2 of a named key
    out["int_sum"] = hvd.allreduce(torch.tensor([r, 2 * r], dtype=torch.int64), op=hvd.Sum)
    inplace = mine.clone()
    hvd.allreduce_(inplace, op=hvd.Sum, name="inplace")
    out["inplace"] = inplace
    handle = hvd.allreduce_async(mine, op=hvd.Sum, name="async")
    out["poll"] = hvd.poll(handle)
    out["async"] = hvd.synchronize(handle)
    out["fp16"] = hvd.allreduce(mine / 7, name="fp16", compression=hvd.Compression.fp16)
    out["grouped"] = hvd.grouped_allreduce([mine, mine[0]], op=hvd.Sum)
    out["gather"] = hvd.allgather(torch.full((r + 1, 2), float(r)))
    out["broadcast"] = hvd.broadcast(mine, root_rank=n - 1)
    big = torch.arange(1_500_000, dtype=torch.float32) + r  # 6 MB: the broadcast's 2 parts
    out["big_ok"] = bool(torch.equal(hvd.broadcast(big, root_rank=0),
                                     torch.arange(1_500_000, dtype=torch.float32)))
    out["object"] = hvd.broadcast_object({"from": r, "list": [r] * 3}, root_rank=1)
    out["objects"] = hvd.allgather_object(("rank", r))
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9)
    torch.manual_seed(r)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()  # a momentum buffer of its own on every rank
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    out["opt_lr"] = opt.param_groups[0]["lr"]
    out["opt_momentum"] = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    # SyncBatchNorm: each rank normalizes its rows with the statistics of every rank's.
    full, weights = sync_bn_inputs(torch, n)
    x = full[2 * r:2 * r + 2].clone().requires_grad_(True)
    sbn = hvd.SyncBatchNorm(3)
    y = sbn(x)
    (y * weights[2 * r:2 * r + 2]).sum().backward()
    out["sbn"] = (y.detach(), x.grad.detach(), sbn.running_mean.clone(),
                  sbn.running_var.clone(), sbn.weight.grad.clone())
    # An overflowed AMP step: rank 1's gradient is Inf; the servers average it as it is (each
    # rank's GradScaler then skips the step alike) instead of refusing the push.
    lin = torch.nn.Linear(3, 2)
    hvd.broadcast_parameters(lin.state_dict(), root_rank=0)
    dopt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1),
                                    named_parameters=lin.named_parameters())
    (lin(torch.ones(2, 3)).sum() * (float("inf") if r == 1 else 1.0)).backward()
    dopt.synchronize()
    out["inf_averaged"] = bool(torch.isinf(lin.weight.grad).all() and
                               torch.isinf(lin.bias.grad).all())
    hvd.barrier()
    try:
        hvd.allreduce(mine, op=hvd.Adasum)
        out["adasum"] = "no error"
    except Exception as e:  # noqa: BLE001 - the error's type and text are the point
        out["adasum"] = f"{type(e).__name__}: {e}"
    hvd.shutdown()
    return out


# DistributedOptimizer's options (one optimizer a cluster: the servers hold one model).
# "sum": op=Sum with two backward passes a step, the gradient pushed from p.grad itself;
# "predivide": gradient_predivide_factor, the gradient divided in a host buffer first. The
# result lands in p.grad either way; a frozen bias keeps no gradient.
OPTIONS = {"sum": {"op": "Sum", "backward_passes_per_step": 2},
           "predivide": {"gradient_predivide_factor": 2.0},
           # Inputs of (rank + 1) / 5: gradients off int8's grid, so its rounding shows.
           "int8": {"compression": "int8"},
           # 4 bits: 0.4 and 0.8 go as 0.375 and 0.75, their average 0.5625 as 0.5.
           "int4": {"compression": "int4"},
           # top-k keeping 2 of each 256 (density 2/256): of the weight's 6 equal elements
           # the first 2 go (ties: the lower index), in int8, both ways.
           "topk": {"compression": "topk"}}


def int8_round_trip(t, levels=127):
    """common/int8_codec.h for one chunk (the 6 weights are one): a power-of-two scale, the
    smallest with max|t| <= levels * 2^e (int8: 127, int4: 7), and t / 2^e rounded to
    nearest even."""
    m = float(t.abs().max())
    if m == 0.0:
        return t.clone()
    b = levels.bit_length()
    f, k = math.frexp(m)
    e = min(max(k - b if f <= levels / 2 ** b else k - b + 1, -110), 121)
    return torch.round(t * 2.0 ** -e).clamp(-levels, levels) * 2.0 ** e


def worker_options(option: str) -> dict:
    import torch

    import parasync.horovod as hvd
    hvd.init()
    kwargs = dict(OPTIONS[option])
    if "op" in kwargs:
        kwargs["op"] = getattr(hvd, kwargs["op"])
    if "compression" in kwargs:
        kwargs["compression"] = getattr(hvd.Compression, kwargs["compression"])
        if option == "topk":
            kwargs["compression"] = kwargs["compression"].density(2 / 256)
    value = (hvd.rank() + 1) / 5 if option in ("int8", "int4", "topk") else float(hvd.rank() + 1)
    m = torch.nn.Linear(3, 2)
    m.bias.requires_grad_(False)
    o = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                 named_parameters=m.named_parameters(), **kwargs)
    for _ in range(kwargs.get("backward_passes_per_step", 1)):
        m(torch.full((2, 3), value)).sum().backward()  # 2 value each
    o.synchronize()
    out = {"grad": m.weight.grad.clone(), "frozen": m.bias.grad}
    hvd.shutdown()
    return out


def check_options(option: str, workdir: str) -> None:
    n = 2
    results = run_workers(f"options_{option}", n, "sync", workdir)
    if None in results:
        return
    # Every rank's weight gradient is 2 (rank + 1) a backward pass.
    passes = OPTIONS[option].get("backward_passes_per_step", 1)
    mean = 2 * passes * (n + 1) / 2
    want = mean * n if OPTIONS[option].get("op") == "Sum" else mean
    expected = torch.full((2, 3), want)
    if option in ("int8", "int4", "topk"):  # each rank's gradient quantized, then the average
        levels = 7 if option == "int4" else 127
        given = [torch.full((2, 3), 2 * (r + 1) / 5) for r in range(n)]
        sent = [int8_round_trip(g, levels) for g in given]
        want = float(int8_round_trip((sent[0] + sent[1]) * 0.5, levels)[0, 0])
        plain = float((given[0] + given[1])[0, 0] * 0.5)
        check(want != plain, f"options {option}: the gradients are off int8's grid ({want})")
        expected = torch.full((2, 3), want)
        if option == "topk":  # elements 0 and 1 (row-major) went, the rest wait in residuals
            expected = torch.tensor([[want, want, 0.0], [0.0, 0.0, 0.0]])
    for r, res in enumerate(results):
        check(torch.equal(res["grad"], expected) and res["frozen"] is None,
              f"options {option}, rank {r}: gradient {res['grad'][0, 0].item()} (want {want}), "
              f"frozen bias's {res['frozen']}")
    print(f"options {option}: {n} ranks' gradients {want}")


def worker_async() -> dict:
    import torch
    import torch.nn.functional as F

    import parasync.horovod as hvd
    hvd.init()
    torch.manual_seed(7 + hvd.rank())
    model = make_net(torch)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    deltas = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for step in range(STEPS):
        x, y = batch(torch, hvd.rank(), step)
        optimizer.zero_grad()
        F.nll_loss(model(x), y).backward()
        optimizer.step()
        pushed = optimizer._pushed  # the deltas it sent, in parameter order
        for (n, p), d in zip(model.named_parameters(), pushed):
            deltas[n] += torch.from_numpy(d.copy()).view_as(p)
    out = {"start": start, "deltas": deltas,
           "end": {n: p.detach().clone() for n, p in model.named_parameters()}}
    hvd.barrier()  # every rank is done pushing
    optimizer._client.pull(optimizer._pulled)  # what the servers hold now
    out["held"] = {n: torch.from_numpy(h.copy()).view_as(p)
                   for (n, p), h in zip(model.named_parameters(), optimizer._pulled)}
    hvd.shutdown()
    return out


def sgd_worker(seed: int):
    """hvd initialized, the small net and a DistributedOptimizer over plain SGD."""
    import torch

    import parasync.horovod as hvd
    hvd.init()
    torch.manual_seed(seed)
    model = make_net(torch)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters())
    return hvd, model, optimizer


def timed_step(torch, model, optimizer, x, y, waits: list) -> None:
    """One training step; how long step() took (the wait for the others) into `waits`."""
    optimizer.zero_grad()
    torch.nn.functional.nll_loss(model(x), y).backward()
    started = time.monotonic()
    optimizer.step()
    waits.append(time.monotonic() - started)


def worker_dead_peer() -> dict:
    """Rank 1 is killed (SIGKILL) after 2 sync steps; rank 0 trains on, then allreduces."""
    import signal

    import torch

    hvd, model, optimizer = sgd_worker(3)
    waits = []
    for step in range(STEPS):
        if hvd.rank() == 1 and step == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        timed_step(torch, model, optimizer, *batch(torch, hvd.rank(), step), waits)
    total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name="alive")
    hvd.shutdown()
    return {"waits": waits, "alive": float(total)}


def worker_join() -> dict:
    """Rank r trains STEPS - r batches (sync), then hvd.join(). Rank 0 takes its last batch
    once the servers count ranks 1 and 2 gone (a bounded wait), so that it joins last."""
    import torch

    from parasync import errors
    hvd, model, optimizer = sgd_worker(5)
    waits = []
    for step in range(STEPS - hvd.rank()):
        if hvd.rank() == 0 and step == STEPS - 1:
            deadline = time.monotonic() + 60
            while hvd.client().live_ranks() != [0] and time.monotonic() < deadline:
                time.sleep(0.05)
        timed_step(torch, model, optimizer, *batch(torch, hvd.rank(), step), waits)
    last = hvd.join()
    try:
        hvd.allreduce(torch.tensor([1.0]), name="after_join")
        refused = ""
    except errors.FailedPrecondition as e:
        refused = str(e)
    progress = hvd.client().global_progress()
    hvd.shutdown()
    return {"last": last, "waits": waits, "refused": refused, "progress": progress}


ELASTIC_EXAMPLES = 320  # 20 batches of BATCH per rank and epoch


def elastic_dataset(torch):
    rng = np.random.default_rng(99)
    x = torch.from_numpy(rng.standard_normal((ELASTIC_EXAMPLES, 1, 12, 12)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 10, ELASTIC_EXAMPLES))
    return torch.utils.data.TensorDataset(x, y, torch.arange(ELASTIC_EXAMPLES))


def worker_elastic() -> dict:
    """A Horovod elastic script: TorchState, ElasticSampler, a commit after every batch.
    The victim's (ELASTIC_VICTIM's) first process kills itself after its 4th step; once the
    servers count it dead, the other rank commits on (paced, bounded) until the restarted
    victim is admitted back."""
    import signal

    import torch
    import torch.nn.functional as F

    import parasync.horovod as hvd
    hvd.init()
    torch.manual_seed(7)
    model = make_net(torch)
    dataset = elastic_dataset(torch)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
    resets, waits, interrupted = [], [], []

    def snapshot():
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    state.register_reset_callbacks([lambda: resets.append(snapshot())])

    def commit():
        try:
            state.commit()
        except hvd.elastic.HostsUpdatedInterrupt:
            interrupted.append(snapshot())  # the parameters the sync starts from
            raise
    restarted = os.environ.get("PARASYNC_RESTART") == "1"
    victim = int(os.environ["ELASTIC_VICTIM"])
    trained = open(OUT + ".trained", "a")

    def await_restart():
        """The survivor, once the victim is dead: commits until the restart is admitted (the
        commit raises then), within a bound."""
        if hvd.rank() == victim or len(resets) > 1 or victim in hvd.client().live_ranks():
            return
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            commit()
            time.sleep(0.05)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, 2):
            state.sampler.set_epoch(state.epoch)
            for state.batch, (x, y, idx) in enumerate(loader):
                optimizer.zero_grad()
                F.nll_loss(model(x), y).backward()
                started = time.monotonic()
                optimizer.step()
                waits.append(time.monotonic() - started)
                trained.write(json.dumps([state.epoch, idx.tolist()]) + "\n")
                trained.flush()
                if hvd.rank() == victim and not restarted and state.epoch == 0 and \
                        state.batch == 3:
                    os.kill(os.getpid(), signal.SIGKILL)
                commit()
                await_restart()
            state.batch = 0

    train(state)
    out = {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
           "waits": waits, "resets": len(resets),
           # the survivor: its parameters when a sync began and when it ended
           "kept": bool(interrupted) and all(torch.equal(a[n], b[n])
                                             for a, b in zip(interrupted, resets[1:])
                                             for n in a),
           "progress": hvd.client().global_progress()}
    hvd.shutdown()
    return out


if sys.argv[1] == "--worker":
    import torch
    result = {"dead_peer": worker_dead_peer, "join": worker_join, "elastic": worker_elastic,
              "train_sgd": lambda: worker_train("sgd"),
              "train_adamw": lambda: worker_train("adamw"),
              "collectives": worker_collectives,
              "async": worker_async,
              "options_sum": lambda: worker_options("sum"),
              "options_predivide": lambda: worker_options("predivide"),
              "options_int8": lambda: worker_options("int8"),
              "options_int4": lambda: worker_options("int4"),
              "options_topk": lambda: worker_options("topk")}[SCENARIO]()
    torch.save(result, OUT)
    sys.exit(0)


# ---- test side ------------------------------------------------------------------------------
from checks import check, report, require_torch  # noqa: E402

torch = require_torch()
from ps_servers import Servers  # noqa: E402


def start_worker(servers, scenario: str, r: int, workers: int, mode: str, workdir: str,
                 out: str, extra_env: dict | None = None, log_name: str | None = None):
    tf_config = {"cluster": {"ps": servers.addresses,
                             "worker": [f"127.0.0.1:{i + 1}" for i in range(workers)]},
                 "task": {"type": "worker", "index": r}}
    env = dict(os.environ, TF_CONFIG=json.dumps(tf_config), PARASYNC_MODE=mode,
               PARASYNC_LOG_DIR=workdir, PYTHONPATH=PYTHON_DIR,
               PARASYNC_REQUEST_TIMEOUT="60", PARASYNC_CONNECT_TIMEOUT="60", **(extra_env or {}))
    log = open(os.path.join(workdir, log_name or f"{scenario}-worker{r}.log"), "w")
    return subprocess.Popen([sys.executable, __file__, "--worker", scenario, out], env=env,
                            stdout=log, stderr=subprocess.STDOUT)


def run_workers(scenario: str, workers: int, mode: str, workdir: str,
                expect_exit: dict | None = None, extra_env: dict | None = None,
                inspect=None) -> list:
    """Starts `workers` worker processes against 2 fresh shards; returns their results (None
    for a worker that wrote none). `expect_exit`: rank -> the status it must end with (else
    0); `extra_env`: variables every worker gets; `inspect(servers)`: called once the workers
    are done, before the servers stop."""
    expect_exit = expect_exit or {}
    with Servers(BIN_DIR, shards=2, workers=workers, log_dir=workdir, mode=mode) as servers:
        procs, outs = [], []
        for r in range(workers):
            out = os.path.join(workdir, f"{scenario}-{r}.pt")
            procs.append(start_worker(servers, scenario, r, workers, mode, workdir, out,
                                      extra_env=extra_env))
            outs.append(out)
        deadline = time.monotonic() + 240
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        for r, code in enumerate(codes):
            want = expect_exit.get(r, 0)
            if code != want:
                with open(os.path.join(workdir, f"{scenario}-worker{r}.log")) as f:
                    sys.stderr.write(f.read()[-3000:])
            check(code == want, f"{scenario}: worker {r} exited {code} (expected {want})")
        if inspect is not None:
            inspect(servers)
        return [torch.load(o) if os.path.exists(o) else None for o in outs]


def relative(a, b) -> float:
    return float((a - b).abs().max() / max(float(b.abs().max()), 1e-12))


def reference_model(optimizer_name: str, start: dict):
    """The one-process references' model from `start`, its optimizer (for 2 ranks) and
    scheduler, as worker_train makes them."""
    model = make_net(torch)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(start[n])
    optimizer = make_optimizer(torch, optimizer_name, model.parameters(), 2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def rank_gradients(model, step: int) -> list:
    """Each of the two ranks' gradients of `step`'s batch at the model's parameters."""
    import torch.nn.functional as F
    grads = []
    for r in range(2):
        model.zero_grad()
        x, y = batch(torch, r, step)
        F.nll_loss(model(x), y).backward()
        grads.append([p.grad.detach().clone() for p in model.parameters()])
    return grads


def reference(optimizer_name: str, start: dict) -> dict:
    """One process: both ranks' gradients each step, averaged, clipped, one optimizer."""
    model, optimizer, scheduler = reference_model(optimizer_name, start)
    for step in range(STEPS):
        grads = rank_gradients(model, step)
        for p, g0, g1 in zip(model.parameters(), *grads):
            p.grad = (g0 + g1) / 2
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def reference_delayed(start: dict) -> dict:
    """One process, sync:delayed: each step's gradients at the parameters before it, averaged
    over both ranks and applied (clipped) one step later; the first step applies none."""
    model, optimizer, scheduler = reference_model("sgd", start)
    pending = None
    for step in range(STEPS):
        grads = rank_gradients(model, step)
        for i, p in enumerate(model.parameters()):
            p.grad = None if pending is None else pending[i]
        if pending is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        pending = [(g0 + g1) / 2 for g0, g1 in zip(*grads)]
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def server_gradients_by_rank(servers, workdir: str) -> list:
    """parasync_ps_worker_gradients_total of each shard, by rank, read from its /metrics."""
    import urllib.request
    out = []
    for i in range(len(servers.addresses)):
        with open(os.path.join(workdir, f"ps{i}.ready")) as f:
            port = json.load(f)["metrics_port"]
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        counts = {}
        for line in page.decode().splitlines():
            m = re.match(r'parasync_ps_worker_gradients_total\{[^}]*rank="(\d+)"[^}]*\} (\S+)', line)
            if m:
                counts[int(m.group(1))] = float(m.group(2))
        out.append(counts)
    return out


def check_training(optimizer_name: str, workdir: str, grouped: bool = False,
                   delayed: bool = False) -> None:
    """Both ranks against the one-process reference; `grouped`: as one local group (rank 0
    pushes both ranks' summed gradients and pulls for both, parasync.horovod unchanged);
    `delayed`: under sync:delayed, against reference_delayed (and far from reference)."""
    pushes = []
    env = None
    if grouped:
        env = {"PARASYNC_LOCAL_GROUP": "0,1",
               "PARASYNC_LOCAL_GROUP_ENDPOINT": f"ipc://{workdir}/group.sock"}
    scenario = f"train_{optimizer_name}"
    mode = "sync:delayed" if delayed else "sync"
    results = run_workers(scenario, 2, mode, workdir, extra_env=env,
                          inspect=lambda servers: pushes.extend(
                              server_gradients_by_rank(servers, workdir)))
    for shard, counts in enumerate(pushes):
        # Each rank's pushes: one per step; grouped, rank 0's alone (rank 1's go with it).
        want = {0: STEPS, 1: 0 if grouped else STEPS}
        check(all(counts.get(r, 0) == n for r, n in want.items()),
              f"{optimizer_name}{' grouped' if grouped else ''}: shard {shard} counted pushes "
              f"by rank {counts} (expected {want})")
    if None in results:
        return
    r0, r1 = results
    differed = any(not torch.equal(r0["before"][n], r1["before"][n]) for n in r0["before"])
    check(differed, f"{optimizer_name}: the ranks started from different parameters")
    check(all(torch.equal(r0["start"][n], r1["start"][n]) and
              torch.equal(r0["start"][n], r0["before"][n]) for n in r0["start"]),
          f"{optimizer_name}: broadcast_parameters gave rank 1 rank 0's parameters")
    check(all(torch.equal(r0["end"][n], r1["end"][n]) for n in r0["end"]),
          f"{optimizer_name}: both ranks end with bitwise-identical parameters")
    want = reference_delayed(r0["start"]) if delayed else reference(optimizer_name, r0["start"])
    worst = max(relative(r0["end"][n], want[n]) for n in want)
    moved = max(relative(r0["end"][n], r0["start"][n]) for n in want)
    tag = f"{optimizer_name}{' sync:delayed' if delayed else ''}"
    print(f"{tag}: worst relative difference from one process averaging both ranks' "
          f"gradients {worst:.2e} (training moved the parameters {moved:.2e})")
    check(worst < 1e-5, f"{tag}: within 1e-5 of the one-process reference ({worst:.2e})")
    check(moved > 1e-3, f"{tag}: training moved the parameters ({moved:.2e})")
    if delayed:
        undelayed = reference(optimizer_name, r0["start"])
        reach = max(relative(r0["end"][n], undelayed[n]) for n in undelayed)
        check(reach > 1e-3, f"{tag}: within {reach:.2e} of sync's steps: the comparison cannot "
                            "tell a delayed average from a waited one")
        return
    writers = [r["writes_timeline"] for r in results]
    check(writers == ([True, True] if optimizer_name == "sgd" else [True, False]),
          f"{optimizer_name}: ranks writing a timeline {writers}")
    check_timeline(optimizer_name, workdir)


def check_timeline(optimizer_name: str, workdir: str) -> None:
    """hvd.start_timeline: sgd's path holds {rank} (a file per rank), adamw's does not (rank
    0's alone, as Horovod). Each is a JSON array with every step, its phases in order."""
    paths = sorted(glob.glob(os.path.join(workdir, f"timeline-{optimizer_name}*.json")))
    want = [f"timeline-sgd-{r}.json" for r in (0, 1)] if optimizer_name == "sgd" else \
        ["timeline-adamw.json"]
    check([os.path.basename(p) for p in paths] == want, f"{optimizer_name}: timeline files "
          f"{[os.path.basename(p) for p in paths]}, want {want}")
    for rank, path in enumerate(paths):
        with open(path) as f:
            events = json.load(f)
        spans = {}
        for e in events:
            if e["ph"] == "X":
                check(e["pid"] == rank, f"{path}: an event of rank {e['pid']}")
                spans.setdefault(e["name"], []).append((e["ts"], e["ts"] + e["dur"]))
        names = ("step", "optimizer + forward", "backward", "synchronize", "push", "pull")
        counts = [len(spans.get(n, [])) for n in names]
        check(counts == [STEPS] * len(names), f"{path}: spans per name {dict(zip(names, counts))}"
              f", want {STEPS} each")
        if counts != [STEPS] * len(names):
            continue
        def in_order(*times):  # microseconds, each rounded to 0.1 in the file
            return all(a <= b + 1.0 for a, b in zip(times, times[1:]))
        ordered = all(
            in_order(*step[:1], *fwd, *bwd, *sync, step[1]) and
            in_order(bwd[0], *push, *pull, sync[1])
            for step, fwd, bwd, sync, push, pull in zip(*(spans[n] for n in names)))
        check(ordered, f"{path}: every step's phases in order (forward, backward with the push "
              "going out, the wait for the pull): " +
              "; ".join(f"{n} {a - spans['step'][0][0]:.0f}-{b - spans['step'][0][0]:.0f}"
                        for n in names for a, b in spans[n][:1]) + " µs in the first step")
    print(f"{optimizer_name}: timeline files {[os.path.basename(p) for p in paths]}, "
          f"{STEPS} steps each")


def check_collectives(workers: int, workdir: str) -> None:
    results = run_workers("collectives", workers, "sync", workdir)
    if None in results:
        return
    n = workers
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    mine = [base * (r + 1) + r for r in range(n)]
    signed = [mine[r] * (-1) ** r for r in range(n)]
    total = sum(mine[1:], mine[0].clone())
    full, weights = sync_bn_inputs(torch, n)  # BatchNorm2d over every rank's rows at once
    bn_x = full.clone().requires_grad_(True)
    bn = torch.nn.BatchNorm2d(3)
    bn_y = bn(bn_x)
    (bn_y * weights).sum().backward()
    bn_y = bn_y.detach()
    weight_grad = sum(res["sbn"][4] for res in results)
    check(torch.allclose(weight_grad, bn.weight.grad, atol=1e-4),
          f"{n} workers: SyncBatchNorm's weight gradients add up to BatchNorm2d's")
    for res in results:
        tag = f"{n} workers, rank {res['rank']}"
        check(res["size"] == n, f"{tag}: size() {res['size']}")
        check(torch.allclose(res["average"], total / n), f"{tag}: allreduce Average")
        check(torch.allclose(res["average_again"], (total + n) / n),
              f"{tag}: a named allreduce's second round")
        check(torch.allclose(res["sum"], total), f"{tag}: allreduce Sum")
        check(torch.equal(res["min"], torch.stack(signed).min(0).values), f"{tag}: Min")
        check(torch.equal(res["max"], torch.stack(signed).max(0).values), f"{tag}: Max")
        check(res["int_sum"].tolist() == [sum(range(n)), 2 * sum(range(n))], f"{tag}: int64 Sum")
        check(torch.allclose(res["inplace"], total), f"{tag}: allreduce_ in place")
        check(res["poll"] and torch.allclose(res["async"], total),
              f"{tag}: allreduce_async + synchronize")
        check(torch.allclose(res["fp16"], total / 7 / n, rtol=2e-3, atol=1e-3),
              f"{tag}: allreduce with Compression.fp16")
        check(torch.allclose(res["grouped"][0], total) and
              torch.allclose(res["grouped"][1], total[0]), f"{tag}: grouped_allreduce")
        want_gather = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(n)])
        check(torch.equal(res["gather"], want_gather), f"{tag}: allgather of unequal lengths")
        check(torch.equal(res["broadcast"], mine[n - 1]), f"{tag}: broadcast from rank {n - 1}")
        check(res["big_ok"], f"{tag}: a 6 MB broadcast (in parts) is the root's tensor")
        check(res["object"] == {"from": 1, "list": [1, 1, 1]}, f"{tag}: broadcast_object")
        check(res["objects"] == [("rank", r) for r in range(n)], f"{tag}: allgather_object")
        check(res["opt_lr"] == 0.1, f"{tag}: broadcast_optimizer_state's learning rate")
        check(all(torch.equal(a, b) for a, b in zip(res["opt_momentum"],
                                                  results[0]["opt_momentum"])),
              f"{tag}: broadcast_optimizer_state's momentum buffers are rank 0's")
        r = res["rank"]
        got_y, got_grad, got_mean, got_var, _ = res["sbn"]
        check(torch.allclose(got_y, bn_y[2 * r:2 * r + 2], atol=1e-5) and
              torch.allclose(got_grad, bn_x.grad[2 * r:2 * r + 2], atol=1e-5) and
              torch.allclose(got_mean, bn.running_mean, atol=1e-6) and
              torch.allclose(got_var, bn.running_var, atol=1e-5),
              f"{tag}: SyncBatchNorm's output, input gradient and running statistics are "
              "BatchNorm2d's over every rank's rows")
        check(res["inf_averaged"], f"{tag}: an Inf gradient (an AMP overflow) is averaged, "
                                   "not refused")
        check(res["adasum"].startswith("NotSupported") and "Average" in res["adasum"],
              f"{tag}: Adasum refused naming what to use ({res['adasum']})")
    # Rank 1's momentum differed before the broadcast (its own gradient and rate).
    print(f"collectives with {n} workers: {len(results)} ranks checked")


def check_async(workdir: str) -> None:
    results = run_workers("async", 2, "async", workdir)
    if None in results:
        return
    r0, r1 = results
    names = list(r0["start"])
    check(all(torch.equal(r0["start"][n], r1["start"][n]) for n in names),
          "async: both ranks started from rank 0's parameters")
    worst = max(relative(r0["held"][n], r0["start"][n] + r0["deltas"][n] + r1["deltas"][n])
                for n in names)
    moved = max(relative(r0["held"][n], r0["start"][n]) for n in names)
    print(f"async: the servers hold start + every delta within {worst:.2e} (moved {moved:.2e})")
    check(worst < 1e-5, f"async: servers hold the start plus each delta once ({worst:.2e})")
    check(moved > 1e-3, f"async: training moved the parameters ({moved:.2e})")


def check_dead_peer(workdir: str) -> None:
    """A worker killed mid-run stops nobody: the sync step and the collective go on without
    it once the servers declare it dead (--worker-timeout 5 here)."""
    results = run_workers("dead_peer", 2, "sync", workdir, expect_exit={1: -9})
    if results[0] is None:
        return
    waits = results[0]["waits"]
    print(f"dead peer: rank 0's steps waited at most {max(waits):.1f} s (worker timeout 5 s); "
          f"the allreduce after counted {results[0]['alive']:.0f} rank(s)")
    check(max(waits) < 5 + 10, f"dead peer: no step waited much past the worker timeout "
                               f"({max(waits):.1f} s)")
    check(max(waits) > 2, f"dead peer: a step did wait for the dead rank ({max(waits):.1f} s)")
    check(results[0]["alive"] == 1.0, "dead peer: the allreduce went on without the dead rank")


def check_join(workdir: str) -> None:
    results = run_workers("join", 3, "sync", workdir)
    if any(r is None for r in results):
        return
    waits = max(max(r["waits"]) for r in results)
    lasts = [r["last"] for r in results]
    steps, examples = results[0]["progress"]
    print(f"join: last to join as each rank saw it {lasts}; the longest step {waits:.2f} s; "
          f"the servers applied {steps} steps of {examples} examples")
    # Rank 0 joins only after it saw 1 and 2 gone, so it names itself. Ranks 1 and 2 poll
    # every 50 ms: rank 2 may see 1 and 0 go within one poll (a tie, broken to the higher
    # rank), and a rank held off the CPU past rank 0's last step sees everyone gone at its
    # first poll and names itself — so 1 and 2 name 0 or 1, never 2.
    check(lasts[0] == 0 and lasts[1] in (0, 1) and lasts[2] in (0, 1),
          f"join: each rank names the last to join as its polling saw it ({lasts})")
    check(waits < 2.5, f"join: no step waited for a rank that had joined ({waits:.2f} s; the "
                       "worker timeout is 5 s)")
    check(all("after hvd.join()" in r["refused"] for r in results),
          "join: a collective after join is refused with one line")
    want = (STEPS + (STEPS - 1) + (STEPS - 2)) * BATCH
    check(steps == STEPS and examples == want,
          f"join: every batch applied once ({steps} steps of {examples} examples; want "
          f"{STEPS} of {want})")


def run_elastic(workdir: str, victim: int) -> list:
    """Ranks 0 and 1; the victim's first process kills itself, and is started again (as the
    launcher's --kill worker:I@S+R does: PARASYNC_RESTART=1) once it has died. Returns the
    survivor's result and the restarted victim's."""
    scenario = f"elastic{victim}"
    with Servers(BIN_DIR, shards=2, workers=2, log_dir=workdir, mode="sync") as servers:
        outs = [os.path.join(workdir, f"{scenario}-{r}.pt") for r in (0, 1)]
        env = {"ELASTIC_VICTIM": str(victim)}
        first = [start_worker(servers, "elastic", r, 2, "sync", workdir, outs[r], env,
                              f"{scenario}-worker{r}.log") for r in (0, 1)]
        try:
            died = first[victim].wait(timeout=120)
        except subprocess.TimeoutExpired:
            died = None
        check(died == -9, f"{scenario}: rank {victim}'s first process was killed ({died})")
        restart_out = os.path.join(workdir, f"{scenario}-restarted.pt")
        again = start_worker(servers, "elastic", victim, 2, "sync", workdir, restart_out,
                             dict(env, PARASYNC_RESTART="1"), f"{scenario}-restarted.log")
        survivor = 1 - victim
        codes = []
        for name, p in ((f"rank {survivor}", first[survivor]), ("the restarted rank", again)):
            try:
                codes.append(p.wait(timeout=180))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
            check(codes[-1] == 0, f"{scenario}: {name} exited {codes[-1]}")
        if any(codes):
            for log in (f"{scenario}-worker{survivor}.log", f"{scenario}-restarted.log"):
                with open(os.path.join(workdir, log)) as f:
                    sys.stderr.write(f"--- {log}\n" + f.read()[-3000:])
        return [torch.load(o) if os.path.exists(o) else None
                for o in (outs[survivor], restart_out)]


def check_elastic(workdir: str, victim: int) -> None:
    scenario = f"elastic{victim}"
    results = run_elastic(workdir, victim)
    if any(r is None for r in results):
        return
    survivor, back = results
    same = all(torch.equal(survivor["params"][n], back["params"][n]) for n in survivor["params"])
    trained = {0: [], 1: []}  # epoch -> every index trained, by every process
    for name in (f"{scenario}-0.pt", f"{scenario}-1.pt", f"{scenario}-restarted.pt"):
        path = os.path.join(workdir, name + ".trained")
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    epoch, idx = json.loads(line)
                    trained[epoch] += idx
    steps, examples = survivor["progress"]
    counts = {e: len(v) for e, v in trained.items()}
    missing = {e: ELASTIC_EXAMPLES - len(set(v)) for e, v in trained.items()}
    print(f"{scenario}: the survivor's longest step {max(survivor['waits']):.1f} s (worker "
          f"timeout 5 s); syncs: survivor {survivor['resets']}, restarted rank "
          f"{back['resets']}; parameters {'identical' if same else 'DIFFERENT'}; trained per "
          f"epoch {counts} of {ELASTIC_EXAMPLES}, missing {missing}; the servers applied "
          f"{examples} examples")
    check(max(survivor["waits"]) < 5 + 10,
          f"{scenario}: no step waited much past the worker timeout")
    check(survivor["resets"] == 2 and back["resets"] == 1,
          f"{scenario}: the survivor synced at the start and when the victim was admitted "
          "back; the restarted victim once, at its admission")
    check(same, f"{scenario}: both ranks end with bitwise-identical parameters")
    check(survivor["kept"], f"{scenario}: the survivor kept its parameters through the sync "
                            "(the restarted rank took them, not the other way round)")
    # Each sync pads the rest of the epoch to an even split: at most one example twice here.
    check(all(m == 0 for m in missing.values()),
          f"{scenario}: every example trained ({missing})")
    check(counts[0] <= ELASTIC_EXAMPLES + 1 and counts[1] == ELASTIC_EXAMPLES,
          f"{scenario}: no example trained twice but the padding ({counts})")
    check(examples == counts[0] + counts[1],
          f"{scenario}: the servers applied exactly the trained batches ({examples} vs "
          f"{counts[0] + counts[1]})")


def main() -> int:
    # HOROVOD_TEST_ONLY=name[,name]: only those parts (sgd, adamw, local_group, delayed,
    # collectives2,
    # collectives3,
    # async, options_sum, options_predivide, options_int8, options_int4, options_topk,
    # dead_peer, join,
    # elastic, elastic_rank0), for a
    # person debugging one; the workers' logs are printed when one fails.
    only = set(filter(None, os.environ.get("HOROVOD_TEST_ONLY", "").split(",")))
    parts = {"sgd": lambda d: check_training("sgd", d),
             "adamw": lambda d: check_training("adamw", d),
             "local_group": lambda d: check_training("sgd", d, grouped=True),
             "delayed": lambda d: check_training("sgd", d, delayed=True),
             "collectives2": lambda d: check_collectives(2, d),
             "collectives3": lambda d: check_collectives(3, d),
             "async": check_async,
             "options_sum": lambda d: check_options("sum", d),
             "options_predivide": lambda d: check_options("predivide", d),
             "options_int8": lambda d: check_options("int8", d),
             "options_int4": lambda d: check_options("int4", d),
             "options_topk": lambda d: check_options("topk", d),
             "dead_peer": check_dead_peer,
             "join": check_join,
             "elastic": lambda d: check_elastic(d, victim=1),
             "elastic_rank0": lambda d: check_elastic(d, victim=0)}
    with tempfile.TemporaryDirectory(prefix="parasync-horovod-") as workdir:
        for name, part in parts.items():
            if not only or name in only:
                part(workdir)
    return report()


if __name__ == "__main__":
    sys.exit(main())
