#!/usr/bin/env python3
"""The Python client's edges against real parasync-ps processes: bad input gets one clear
exception (never a hang or a crash), calls waiting on the network let other Python threads
run, SIGTERM stops a waiting worker as it stops parasync-worker (exit 0, metrics written),
the client tells its metrics port in PARASYNC_READY_FILE, and a Python worker started by
parasync-launch --lr-schedule cosine trains at the rate the schedule gives each step
(measured from the servers' SGD updates), or refuses the schedule in one line where it
cannot know the decay's length.

Usage: client_test.py BIN_DIR PYTHON_DIR SOURCE_DIR
"""

import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

BIN_DIR, PYTHON_DIR, SOURCE_DIR = sys.argv[1:4]
sys.path[:0] = [PYTHON_DIR, os.path.join(SOURCE_DIR, "tests", "support")]
from checks import check, report, require_torch  # noqa: E402

torch = require_torch()
import parasync  # noqa: E402
import parasync.torch as pst  # noqa: E402
from torch import nn  # noqa: E402
from ps_servers import NO_SERVER, Servers  # noqa: E402


def raises(exception, fn, *args, **kwargs):
    """The exception `fn` raised if it is an `exception`, else None (and a failed check)."""
    try:
        fn(*args, **kwargs)
    except exception as e:
        return e
    except Exception as e:  # noqa: BLE001
        check(False, f"{fn.__name__} raised {type(e).__name__}: {e}, not {exception.__name__}")
        return None
    check(False, f"{fn.__name__} raised nothing, not {exception.__name__}")
    return None


def unreachable_server_times_out_naming_it() -> None:
    client = parasync.Client([NO_SERVER], workers=1, rank=0, connect_timeout=1.5,
                             request_timeout=1.5)
    # Meanwhile another Python thread runs: the call does not hold the GIL.
    ticks = [0]
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    start = time.monotonic()
    e = raises(parasync.TimedOut, client.register, [parasync.Variable("w", (3,))],
               initial_values=[np.zeros(3, np.float32)])
    took = time.monotonic() - start
    stop.set()
    ticker.join()
    check(e is not None and NO_SERVER in str(e),
          f"the timeout names the address: {e}")
    check(took < 10, f"gave up after {took:.1f} s, the connect timeout is 1.5 s")
    check(ticks[0] > 100, f"another thread ran only {ticks[0]} times in {took:.1f} s of waiting")
    client.close()


class Small(nn.Module):
    def __init__(self, width=5, embedding=None):
        super().__init__()
        self.fc = nn.Linear(4, width)
        self.embedding = embedding

    def forward(self, x, ids=None):
        out = self.fc(x)
        if ids is not None:
            out = out + self.embedding(ids).sum(1)
        return out


def bad_input_is_one_clear_exception(servers: Servers, log_dir: str) -> None:
    client = parasync.Client(servers.addresses, workers=2, rank=0, log_dir=log_dir,
                             request_timeout=10, connect_timeout=10)
    emb = pst.Embedding("ids", dim=5)
    model = Small(embedding=emb)
    opt = pst.Optimizer(client, model, optimizer="sgd", lr=0.1)
    # step() without backward().
    e = raises(parasync.InvalidArgument, opt.step, examples=4)
    check(e is not None and "backward" in str(e), f"step() without backward(): {e}")
    # Ids of the wrong dtype.
    x = torch.ones(4, 4)
    e = raises(parasync.InvalidArgument, model, x, torch.ones(4, 2, dtype=torch.int32))
    check(e is not None and "int64" in str(e), f"int32 ids: {e}")
    e = raises(parasync.InvalidArgument, model, x, torch.ones(4, 2))
    check(e is not None and "int64" in str(e), f"float ids: {e}")
    # A well-formed step works after those.
    loss = model(x, torch.tensor([[1, 2]] * 4)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step(examples=4)
    # numpy arrays: wrong dtype, wrong shape, not contiguous, read-only.
    w = np.zeros((5, 4), np.float32)
    b = np.zeros(5, np.float32)
    e = raises(parasync.InvalidArgument, client.pull, [w.astype(np.float64), b])
    check(e is not None and "float32" in str(e), f"a float64 array: {e}")
    e = raises(parasync.InvalidArgument, client.pull, [np.zeros((4, 4), np.float32), b])
    check(e is not None and "fc.weight" in str(e) and "shape" in str(e), f"wrong shape: {e}")
    e = raises(parasync.InvalidArgument, client.pull, [np.zeros((4, 5), np.float32).T, b])
    check(e is not None and "contiguous" in str(e), f"a transposed array: {e}")
    readonly = np.zeros(5, np.float32)
    readonly.flags.writeable = False
    e = raises(parasync.InvalidArgument, client.pull, [w, readonly])
    check(e is not None and "read-only" in str(e), f"a read-only array: {e}")
    e = raises(parasync.InvalidArgument, client.pull, [w])
    check(e is not None and "1 parameter arrays" in str(e), f"too few arrays: {e}")
    unsorted = np.array([9, 3], np.uint64)
    e = raises(parasync.InvalidArgument, client.pull, [],
               rows=[(0, unsorted, np.zeros((2, 5), np.float32))])
    check(e is not None and "sorted" in str(e), f"unsorted ids: {e}")
    # A model that differs from the one the servers hold: the first parameter named.
    other = parasync.Client(servers.addresses, workers=2, rank=1, log_dir=log_dir,
                            request_timeout=10, connect_timeout=10)
    e = raises(parasync.FailedPrecondition, pst.Optimizer, other,
               Small(width=6, embedding=pst.Embedding("ids", dim=5)), optimizer="sgd", lr=0.1)
    check(e is not None and "fc.weight" in str(e), f"another model: {e}")
    e = raises(parasync.FailedPrecondition, pst.Optimizer, other, Small(embedding=emb),
               optimizer="adam", lr=0.1)
    check(e is not None and "optimizer" in str(e), f"another optimizer: {e}")
    other.close()
    client.close()


def a_python_worker_serves_the_worker_metrics(servers: Servers, log_dir: str) -> None:
    """/metrics under parasync-worker's names (the same registry code), /healthz."""
    import urllib.request
    client = parasync.Client(servers.addresses, workers=2, rank=1, log_dir=log_dir,
                             metrics_port=0, request_timeout=10, connect_timeout=10)
    model = Small(embedding=pst.Embedding("ids", dim=5))
    opt = pst.Optimizer(client, model, optimizer="sgd", lr=0.1)
    for _ in range(3):
        loss = model(torch.ones(4, 4), torch.tensor([[1, 2]] * 4)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step(examples=4, loss=loss.item())
    base = f"http://127.0.0.1:{client.metrics_port}"
    page = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    series = {}  # (name, frozenset of label pairs) -> value
    for line in page.splitlines():
        m = re.match(r'^(\w+)(?:\{(.*)\})? (\S+)$', line)
        if m:
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            series[(m.group(1), labels)] = float(m.group(3))
    worker = {("rank", "1"), ("role", "worker")}
    for name, labels, value in (
            ("parasync_worker_examples_total", worker, 12),
            ("parasync_worker_steps_total", worker, 3),
            ("parasync_worker_step_seconds_count", worker | {("phase", "compute")}, 3),
            ("parasync_worker_step_seconds_count", worker | {("phase", "push")}, 3),
            ("parasync_worker_step_seconds_count", worker | {("phase", "pull")}, 3),
            ("parasync_worker_model_parameters", worker | {("model", "Small")}, 25)):
        got = series.get((name, frozenset(labels)))
        check(got == value, f"/metrics of a Python worker: {name}{sorted(labels)} is {got}, "
                            f"not {value}")
    for name in ("parasync_worker_train_loss", "parasync_worker_epoch",
                 "process_cpu_seconds_total"):
        check(any(n == name for n, _ in series), f"/metrics of a Python worker lacks {name}")
    health = urllib.request.urlopen(base + "/healthz", timeout=10)
    check(health.status == 200, f"/healthz answered {health.status}")
    client.close()


def a_python_worker_tells_its_metrics_port_in_its_ready_file(servers: Servers,
                                                            log_dir: str) -> None:
    """PARASYNC_READY_FILE (parasync-launch sets it with PARASYNC_METRICS_PORT=0): the client
    writes there what parasync-worker --ready-file writes, once its /metrics is up."""
    path = os.path.join(log_dir, "worker1.ready")
    os.environ["PARASYNC_READY_FILE"] = path
    try:
        client = parasync.Client(servers.addresses, workers=2, rank=1, log_dir=log_dir,
                                 metrics_port=0, request_timeout=10, connect_timeout=10)
        with open(path) as f:
            ready = json.load(f)
        check(ready == {"role": "worker", "task_index": 1, "pid": os.getpid(), "address": "",
                        "metrics_port": client.metrics_port} and client.metrics_port > 0,
              f"the ready file says {ready}, the client's metrics port is {client.metrics_port}")
        client.close()
        os.environ["PARASYNC_READY_FILE"] = os.path.join(log_dir, "missing", "worker1.ready")
        e = raises(parasync.Unavailable, parasync.Client, servers.addresses, workers=2, rank=1,
                   log_dir=log_dir, metrics_port=0, connect_timeout=10)
        check(e is not None and "PARASYNC_READY_FILE" in str(e), f"an unwritable file: {e}")
    finally:
        del os.environ["PARASYNC_READY_FILE"]


def sigterm_stops_a_waiting_worker(log_dir: str) -> None:
    """A sync worker waits at the barrier for rank 1, who never comes; SIGTERM ends it with
    status 0 and its metrics snapshot, as parasync-worker."""
    with Servers(BIN_DIR, shards=1, workers=2, log_dir=log_dir, mode="sync") as servers:
        script = os.path.join(log_dir, "waiter.py")
        with open(script, "w") as f:
            f.write(f"""
import sys
sys.path[:0] = [{PYTHON_DIR!r}]
import numpy as np, parasync.torch as pst, parasync
client = pst.connect({servers.addresses!r}, rank=0, workers=2, mode="sync", log_dir={log_dir!r})
client.register([parasync.Variable("w", (3,))], initial_values=[np.zeros(3, np.float32)])
w = np.zeros(3, np.float32)
client.push([np.ones(3, np.float32)], examples=1)
print("waiting", flush=True)
client.pull([w], min_version=parasync.NEXT_STEP)   # rank 1 never pushes
print("not reached", flush=True)
""")
        worker = subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        lines = []
        for line in worker.stdout:  # ends when the worker does
            lines.append(line)
            if line.strip() == "waiting":
                break
        check(lines and lines[-1].strip() == "waiting", f"the worker printed {lines!r}")
        time.sleep(0.3)  # into the wait (which is bounded by the barrier, not by this)
        start = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        try:
            status = worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            status = worker.wait()
            check(False, "SIGTERM did not stop a worker waiting at the barrier within 20 s")
        rest = worker.stdout.read()
        took = time.monotonic() - start
        check(status == 0, f"a worker stopped by SIGTERM exits 0, not {status}: {rest}")
        check("not reached" not in rest, "the pull returned normally after SIGTERM")
        check(took < 5, f"SIGTERM took {took:.1f} s to stop it")
        check(os.path.exists(os.path.join(log_dir, "metrics-worker0.prom")),
              "no metrics snapshot after SIGTERM")


COSINE_WORKER = """
import json, os, sys
import torch
import parasync.torch as pst
N, BATCH = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(1)
x, y = torch.randn(N, 4), torch.randn(N, 1)
client = pst.connect()
s = client.settings
model = torch.nn.Linear(4, 1)
opt = pst.Optimizer(client, model, optimizer=s.optimizer, lr=s.lr, train_size=N)
run = pst.Run(client, N, batch_size=BATCH)
with open(os.path.join(s.log_dir, "steps.jsonl"), "w") as out:
    for epoch in run.epochs():
        for idx in run.batches():
            before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
            loss = ((model(x[idx]) - y[idx]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            g = torch.cat([p.grad.flatten().clone() for p in model.parameters()])
            opt.step(examples=len(idx), loss=loss.item())
            after = torch.cat([p.detach().flatten() for p in model.parameters()])
            # SGD on the servers: after = before - rate * g.
            rate = float((before - after) @ g / (g @ g))
            out.write(json.dumps({"examples": len(idx), "rate": rate}) + "\\n")
run.finish()
"""


def cosine_rate(lr, applied, horizon):
    """Keras's CosineDecay to 0: the rate after `applied` examples of a `horizon`."""
    return lr * 0.5 * (1 + math.cos(math.pi * min(applied, horizon) / horizon))


def launched_worker_follows_the_cosine_schedule(log_dir: str) -> None:
    """parasync-launch --lr-schedule cosine with a Python worker (PARASYNC_LR_SCHEDULE): each
    step's rate, measured from what the servers' SGD did to the parameters, is the cosine's at
    the examples applied before it, over --epochs of the training set, as for
    parasync-worker."""
    n, batch, epochs, lr = 64, 8, 2, 0.1
    script = os.path.join(log_dir, "cosine_worker.py")
    with open(script, "w") as f:
        f.write(COSINE_WORKER)
    run_dir = os.path.join(log_dir, "cosine")
    launch = subprocess.run(
        [os.path.join(BIN_DIR, "parasync-launch"), "--ps", "1", "--workers", "1", "--epochs",
         str(epochs), "--optimizer", "sgd", "--lr", str(lr), "--lr-schedule", "cosine",
         "--log-dir", run_dir, "--worker-command",
         f"/usr/bin/python3 {script} {n} {batch}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    check(launch.returncode == 0, f"the cosine run exited {launch.returncode}: "
                                  f"{launch.stdout[-3000:]}")
    steps_file = os.path.join(run_dir, "steps.jsonl")
    steps = []
    if os.path.exists(steps_file):
        with open(steps_file) as f:
            steps = [json.loads(line) for line in f]
    check(len(steps) == epochs * n // batch,
          f"the cosine run made {len(steps)} steps, not {epochs * n // batch}")
    horizon, applied, wrong = epochs * n, 0, []
    for k, step in enumerate(steps):
        expected = cosine_rate(lr, applied, horizon)
        if abs(step["rate"] - expected) > 1e-5:
            wrong.append(f"step {k} after {applied} examples: {step['rate']:.6f}, "
                         f"the schedule's {expected:.6f}")
        applied += step["examples"]
    check(not wrong, f"{len(wrong)} of {len(steps)} steps off the cosine schedule: "
                     f"{'; '.join(wrong[:4])}")
    if steps:
        print(f"cosine schedule: rates {steps[0]['rate']:.5f} .. {steps[-1]['rate']:.5f} over "
              f"{len(steps)} steps, {len(wrong)} off the schedule", flush=True)


EVAL_EVERY_WORKER = """
import os, sys
import torch
import parasync.torch as pst
N, BATCH = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(1)
x, y = torch.randn(N, 4), torch.randn(N, 1)
client = pst.connect()
model = torch.nn.Linear(4, 1)
opt = pst.Optimizer(client, model, optimizer="sgd", lr=0.05)

def evaluate():
    opt.pull()  # sync:delayed: waits for the exchange in flight first
    with torch.no_grad():
        loss = float(((model(x) - y) ** 2).mean())
    return 1.0 / (1.0 + loss), loss

run = pst.Run(client, N, batch_size=BATCH, evaluate=evaluate)
for epoch in run.epochs():
    for idx in run.batches():
        loss = ((model(x[idx]) - y[idx]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step(examples=len(idx), loss=loss.item())
run.finish()
"""


def launched_workers_overlap_and_evaluate_within_epochs(log_dir: str) -> None:
    """parasync-launch --mode sync:delayed --eval-every 3 with two Python workers
    (PARASYNC_EVAL_EVERY): the chief's eval.jsonl holds a row every 3 of its steps (within
    an epoch) ("within_epoch", the epochs done as a fraction) besides the whole epochs', the
    servers applied one step per batch pair (the overlapped exchanges each counted once), and
    training lowered the loss."""
    n, batch, epochs = 64, 4, 2   # 8 steps per worker per epoch
    script = os.path.join(log_dir, "eval_every_worker.py")
    with open(script, "w") as f:
        f.write(EVAL_EVERY_WORKER)
    run_dir = os.path.join(log_dir, "eval-every")
    launch = subprocess.run(
        [os.path.join(BIN_DIR, "parasync-launch"), "--ps", "2", "--workers", "2", "--epochs",
         str(epochs), "--mode", "sync:delayed", "--eval-every", "3", "--log-dir", run_dir,
         "--worker-command", f"/usr/bin/python3 {script} {n} {batch}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    check(launch.returncode == 0, f"the sync:delayed --eval-every run exited "
                                  f"{launch.returncode}: {launch.stdout[-3000:]}")
    rows = []
    eval_path = os.path.join(run_dir, "eval.jsonl")
    if os.path.exists(eval_path):
        with open(eval_path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    got = [(r["epoch"], bool(r.get("within_epoch"))) for r in rows]
    # Every 3 of the chief's steps, counted across epochs (steps 3, 6 | 9, 12, 15 of 8 per
    # epoch), as parasync-worker counts them.
    want = [(0, False), (0.375, True), (0.75, True), (1, False), (1.125, True), (1.5, True),
            (1.875, True), (2, False)]
    check(got == want, f"eval.jsonl's rows (epoch, within_epoch): {got}, expected {want}")
    if len(rows) == len(want):
        check(rows[-1]["step"] == epochs * n // (2 * batch),
              f"the servers applied {rows[-1]['step']} steps, not {epochs * n // (2 * batch)} "
              "(one per pair of pushes)")
        check(rows[-1]["test_loss"] < rows[0]["test_loss"],
              f"training did not lower the loss: {rows[0]['test_loss']:.4f} -> "
              f"{rows[-1]['test_loss']:.4f}")
        print(f"sync:delayed, --eval-every 3: {len(rows)} evaluations, loss "
              f"{rows[0]['test_loss']:.4f} -> {rows[-1]['test_loss']:.4f} in "
              f"{rows[-1]['step']} steps", flush=True)


def with_environment(name: str, value: str, fn, *args, **kwargs):
    """fn(*args, **kwargs) with os.environ[name] = value, as the launcher would set it."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        return fn(*args, **kwargs)
    finally:
        if saved is None:
            del os.environ[name]
        else:
            os.environ[name] = saved


def optimizer_compression_narrows_the_pushes(log_dir: str) -> None:
    """pst.Optimizer(..., compression="int8"): the pushes the server counted are a quarter of
    float32's bytes (a byte per element and one per 128-element chunk), training moves the
    parameters; an unknown compression and int8 with a pst.Embedding table are refused."""
    import urllib.request
    steps = 4
    with Servers(BIN_DIR, shards=1, workers=1, log_dir=log_dir, mode="sync") as servers:
        client = parasync.Client(servers.addresses, workers=1, rank=0, mode="sync",
                                 log_dir=log_dir, request_timeout=10, connect_timeout=10)
        e = raises(parasync.InvalidArgument, pst.Optimizer, client, Small(), optimizer="sgd",
                   lr=0.1, compression="int2")
        check(e is not None and "int2" in str(e), f"compression='int2': {e}")
        torch.manual_seed(3)
        model = nn.Linear(256, 64)
        start = model.weight.detach().clone()
        opt = pst.Optimizer(client, model, optimizer="sgd", lr=0.1, compression="int8")
        x, y = torch.randn(32, 256), torch.randn(32, 64)
        for _ in range(steps):
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step(examples=32)
        moved = float((model.weight.detach() - start).abs().max())
        check(moved > 1e-3, f"int8 pushes moved the parameters by {moved:.2e} only")
        with open(os.path.join(log_dir, "ps0.ready")) as f:
            port = json.load(f)["metrics_port"]
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        m = re.search(r'parasync_ps_bytes_total\{[^}]*direction="in"[^}]*type="push"[^}]*\} (\S+)',
                      page.decode())
        pushed = float(m.group(1)) if m else None
        float32 = steps * (256 * 64 + 64) * 4
        ratio = pushed / float32 if pushed else None
        check(ratio is not None and 0.24 <= ratio <= 0.27,
              f"int8 pushes: the server counted {pushed} bytes, {ratio} of float32's {float32}")
        # The parameters come back as int8 changes to the client's copy (delta pulls): a
        # quarter of float32's bytes a pull too.
        text = page.decode()
        m = re.search(r'parasync_ps_bytes_total\{[^}]*direction="out"[^}]*type="pull"[^}]*\} (\S+)',
                      text)
        n = re.search(r'parasync_ps_requests_total\{[^}]*type="pull"[^}]*\} (\S+)', text)
        deltas = re.search(r'^parasync_ps_delta_pulls_total\{[^}]*\} (\S+)', text, re.M)
        pulled, pulls = (float(m.group(1)) if m else None), (float(n.group(1)) if n else None)
        pull_ratio = pulled / (pulls * float32 / steps) if pulled and pulls else None
        check(pull_ratio is not None and 0.24 <= pull_ratio <= 0.27,
              f"int8 delta pulls: {pulled} bytes in {pulls} pulls, {pull_ratio} of float32's")
        check(deltas is not None and float(deltas.group(1)) >= steps - 1,
              f"parasync_ps_delta_pulls_total: {deltas and deltas.group(1)}")
        print(f"pst.Optimizer(compression='int8'): pushes {ratio:.3f} of float32's bytes, "
              f"pulls {pull_ratio:.3f}, parameters moved {moved:.3f}", flush=True)
        client.close()
        other = parasync.Client(servers.addresses, workers=1, rank=0, mode="sync",
                                log_dir=log_dir, request_timeout=10, connect_timeout=10)
        e = raises(parasync.InvalidArgument, pst.Optimizer, other,
                   Small(embedding=pst.Embedding("ids", dim=5)), optimizer="sgd", lr=0.1,
                   compression="int8")
        check(e is not None and "embedding tables" in str(e), f"int8 with a table: {e}")
        other.close()


def a_schedule_that_cannot_be_honoured_is_refused(servers: Servers, log_dir: str) -> None:
    """An unknown PARASYNC_LR_SCHEDULE, and cosine with no training-set size to measure its
    length by: one clear InvalidArgument before anything is registered, not a constant rate."""
    e = with_environment("PARASYNC_LR_SCHEDULE", "step", raises, parasync.InvalidArgument,
                         parasync.Settings.from_environment)
    check(e is not None and "PARASYNC_LR_SCHEDULE='step'" in str(e) and "cosine" in str(e),
          f"PARASYNC_LR_SCHEDULE=step: {e}")
    client = with_environment("PARASYNC_LR_SCHEDULE", "cosine", parasync.Client,
                              servers.addresses, workers=1, rank=0, log_dir=log_dir,
                              request_timeout=10, connect_timeout=10)
    e = raises(parasync.InvalidArgument, pst.Optimizer, client, Small(), optimizer="sgd",
               lr=0.1)
    check(e is not None and "PARASYNC_LR_SCHEDULE=cosine" in str(e) and "train_size" in str(e)
          and "\n" not in str(e), f"cosine without train_size: {e}")
    e = raises(parasync.InvalidArgument, client.register, [parasync.Variable("w", (3,))],
               initial_values=[np.zeros(3, np.float32)])
    check(e is not None and "train_size" in str(e), f"register, cosine without train_size: {e}")
    client.close()


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        unreachable_server_times_out_naming_it()
        with Servers(BIN_DIR, shards=2, workers=2, log_dir=d) as servers:
            bad_input_is_one_clear_exception(servers, d)
            a_python_worker_serves_the_worker_metrics(servers, d)
            a_python_worker_tells_its_metrics_port_in_its_ready_file(servers, d)
        refusal_dir = os.path.join(d, "refusal")
        os.makedirs(refusal_dir)
        with Servers(BIN_DIR, shards=1, workers=1, log_dir=refusal_dir) as servers:
            a_schedule_that_cannot_be_honoured_is_refused(servers, refusal_dir)
        launched_worker_follows_the_cosine_schedule(d)
        launched_workers_overlap_and_evaluate_within_epochs(d)
        compression_dir = os.path.join(d, "compression")
        os.makedirs(compression_dir)
        optimizer_compression_narrows_the_pushes(compression_dir)
        term_dir = os.path.join(d, "term")
        os.makedirs(term_dir)
        sigterm_stops_a_waiting_worker(term_dir)
    return report()


if __name__ == "__main__":
    sys.exit(main())
