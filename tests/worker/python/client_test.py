#!/usr/bin/env python3
"""The Python client's edges against real parasync-ps processes: bad input gets one clear
exception (never a hang or a crash), calls waiting on the network let other Python threads
run, SIGTERM stops a waiting worker as it stops parasync-worker (exit 0, metrics written), and
the client tells its metrics port in PARASYNC_READY_FILE.

Usage: client_test.py BIN_DIR PYTHON_DIR SOURCE_DIR
"""

import json
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


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        unreachable_server_times_out_naming_it()
        with Servers(BIN_DIR, shards=2, workers=2, log_dir=d) as servers:
            bad_input_is_one_clear_exception(servers, d)
            a_python_worker_serves_the_worker_metrics(servers, d)
            a_python_worker_tells_its_metrics_port_in_its_ready_file(servers, d)
        term_dir = os.path.join(d, "term")
        os.makedirs(term_dir)
        sigterm_stops_a_waiting_worker(term_dir)
    return report()


if __name__ == "__main__":
    sys.exit(main())
