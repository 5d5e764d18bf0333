"""parasync.torch: train any PyTorch model on parasync's servers.

    import parasync.torch as pst
    client = pst.connect()                       # the launcher's environment, or explicit
    emb = pst.Embedding("words", dim=64)         # a sharded table on the servers
    model = MyModel(emb)                         # any nn.Module
    opt = pst.Optimizer(client, model, optimizer="adam", lr=1e-3)   # the servers apply it
    for x, y in loader:
        loss = loss_fn(model(x), y)
        opt.zero_grad(); loss.backward()
        opt.step(examples=len(y))                # async / sync / ssp as the cluster runs

The servers hold the parameters and apply the optimizer; a worker computes gradients.
Optimizer registers every trainable parameter under its named_parameters() name (rank 0's
initial values win), pulls them before the first step, pushes each shard's gradients from
the gradient-accumulator hooks as soon as backward has produced them (the way Horovod and
BytePS start their reductions, so communication overlaps the rest of backward), and in
step() waits for what is left and writes the next values into the parameters. Embedding's
forward pulls only the rows of the batch's unique ids; its gradient rows (summed per id)
go with the step. Tensors on a GPU are copied through host buffers.

Not shared through the servers: buffers (e.g. BatchNorm's running statistics) and
parameters with requires_grad False stay each worker's own.
"""

from __future__ import annotations

import atexit
import math
import time
from typing import Sequence

import numpy as np
import torch
from torch import nn

from . import errors
from .client import NEXT_STEP, Client, StepTimes, Table, Variable, stop_on_signals
from .training import Run  # noqa: F401  (re-exported: pst.Run)

__all__ = ["connect", "Embedding", "Optimizer", "Run", "log_eval"]

_finish_at_exit: list[Client] = []


def _finish_clients() -> None:
    for client in _finish_at_exit:
        try:
            client.finish(seconds=1.0)
        except errors.ParasyncError:
            pass
    _finish_at_exit.clear()


def connect(ps_hosts: Sequence[str] | str | None = None, rank: int | None = None,
            workers: int | None = None, **settings) -> Client:
    """A client of the cluster: ``ps_hosts``, ``rank`` and ``workers`` from TF_CONFIG unless
    given; every other setting (parasync.environment.Settings) from the environment unless
    given by name. SIGTERM and SIGINT stop the worker as they stop parasync-worker (exit 0,
    metrics snapshot written), and at exit the client leaves the servers and writes its
    metrics snapshot, unless finish() was called."""
    stop_on_signals()
    client = Client(ps_hosts, workers, rank, **settings)
    if not _finish_at_exit:
        atexit.register(_finish_clients)
    _finish_at_exit.append(client)
    original_finish = client.finish

    def finish(seconds: float = 10.0) -> None:
        if client in _finish_at_exit:
            _finish_at_exit.remove(client)
        original_finish(seconds)

    client.finish = finish
    return client


def log_eval(client: Client, epoch: int, test_accuracy: float, test_loss: float,
             **fields) -> None:
    """Chief: one row of <log-dir>/eval.jsonl (Client.log_eval)."""
    client.log_eval(epoch, test_accuracy, test_loss, **fields)


def _unique_ids(ids: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """The distinct ids of an int64 tensor, sorted as unsigned 64-bit values (the servers'
    order), and each element's index among them."""
    flat = ids.detach().reshape(-1).cpu().numpy().view(np.uint64)
    unique, inverse = np.unique(flat, return_inverse=True)
    return unique, torch.from_numpy(inverse.astype(np.int64)).to(ids.device)


class Embedding(nn.Module):
    """A table of ``dim``-float rows by int64 id, kept on the servers and spread over them by
    id: no process holds the whole table, and ``vocab`` 0 takes any int64 id (hashed features).
    Rows are created on first touch from ``init``: ("uniform", v) in [-v, v) (the default,
    Keras's ±0.05), "zeros" or ("constant", v), from the registration's seed.

    forward(ids) -> [*ids.shape, dim]: pulls the rows of the batch's distinct ids. The rows'
    gradients are summed per id by autograd and pushed with the Optimizer's step.
    """

    def __init__(self, name: str, dim: int, vocab: int = 0, init=("uniform", 0.05)):
        super().__init__()
        if dim < 1:
            raise errors.InvalidArgument(f"Embedding {name!r}: dim {dim} must be at least 1")
        if vocab < 0:
            raise errors.InvalidArgument(f"Embedding {name!r}: vocab {vocab} must be >= 0")
        self.table_name = name
        self.dim = int(dim)
        self.vocab = int(vocab)
        self.init = init
        self._client: Client | None = None
        self._table: int | None = None
        self._lookups: list[tuple[np.ndarray, torch.Tensor]] = []  # this step's (ids, rows)

    def extra_repr(self) -> str:
        return f"{self.table_name!r}, dim={self.dim}, vocab={self.vocab or 'any int64'}"

    def _bind(self, client: Client, table: int) -> None:
        self._client, self._table = client, table

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64:
            got = ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise errors.InvalidArgument(
                f"Embedding {self.table_name!r} takes int64 ids, not {got}")
        if self._client is None:
            raise errors.FailedPrecondition(
                f"Embedding {self.table_name!r} has no table yet: create pst.Optimizer(client, "
                "model) for the model that holds it first")
        if self.vocab and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab):
            raise errors.InvalidArgument(f"Embedding {self.table_name!r}: an id outside "
                                         f"[0, {self.vocab})")
        unique, inverse = _unique_ids(ids)
        values = np.empty((len(unique), self.dim), dtype=np.float32)
        if len(unique):
            started = time.monotonic()
            self._client.pull([], rows=[(self._table, unique, values)])
            self._client.lookup_seconds += time.monotonic() - started
        rows = torch.from_numpy(values).to(ids.device)
        if torch.is_grad_enabled():
            rows.requires_grad_(True)
            self._lookups.append((unique, rows))
        # Gathering by index: autograd's backward sums each id's gradients into its row.
        return nn.functional.embedding(inverse, rows).reshape(*ids.shape, self.dim)

    def _take_gradient(self) -> tuple[np.ndarray, np.ndarray] | None:
        """This step's gradient rows (ids, [n, dim] float32), summed per id over every lookup
        of the step; None when nothing was looked up with gradients."""
        lookups = [(ids, rows.grad) for ids, rows in self._lookups if rows.grad is not None]
        self._lookups = []
        if not lookups:
            return None
        if len(lookups) == 1:
            ids, grad = lookups[0]
            return ids, np.ascontiguousarray(grad.detach().cpu().numpy(), dtype=np.float32)
        ids = np.concatenate([i for i, _ in lookups])
        unique, inverse = np.unique(ids, return_inverse=True)
        summed = torch.zeros(len(unique), self.dim)
        summed.index_add_(0, torch.from_numpy(inverse.astype(np.int64)),
                          torch.cat([g.detach().cpu() for _, g in lookups]))
        return unique, summed.numpy()

    def _forget(self) -> None:
        self._lookups = []


class Optimizer:
    """The servers' optimizer for ``model``'s trainable parameters and pst.Embedding tables.

    ``optimizer``: "sgd", "momentum", "adam" or "adagrad"; ``lr`` its learning rate; further
    server settings by name (momentum, beta1, beta2, epsilon, initial_accumulator,
    staleness_aware, cosine_decay_examples, final_lr_fraction, max_slice_elements). ``seed``:
    the tables' row initialization (default PARASYNC_SEED, else 42).

    ``train_size`` (the training set's examples, every rank's) and ``epochs`` (default
    PARASYNC_EPOCHS, else 5: give what parasync.training.Run trains): the length of the
    cosine schedule PARASYNC_LR_SCHEDULE (parasync-launch --lr-schedule cosine) asks for,
    which the servers then apply as for parasync-worker; cosine without ``train_size`` is
    refused (InvalidArgument) rather than trained at a constant rate.

    ``overlap`` (default True): push each shard's gradients from backward's hooks as soon as
    they are complete. The gradient pushed is then the one backward produced: code that
    changes gradients between backward() and step() (clipping, scaling) or accumulates
    several backward passes into one step needs overlap=False, which pushes everything at
    step(); a second backward before step() with overlap on raises InvalidArgument.

    ``batch_dim``: which dimension of the model's first input counts the examples, for
    pushes sent before step() says how many there were (parasync.training.Run tells them
    exactly; a step() whose ``examples`` differ from what went out early turns overlap off).

    ``compression``: how gradients travel, as ``--wire-dtype`` says it: "float32",
    "bfloat16", "float16", "int8", "int4" or "topk[:R]" (int8, int4 and top-k with error feedback,
    parameters pulled as changes to the client's copy in that format: delta pulls;
    docs/compression.md),
    or an hvd.Compression; default the
    client's (PARASYNC_WIRE_DTYPE, parasync-launch --wire-dtype). Not with pst.Embedding
    tables for int8, int4 and top-k (InvalidArgument).

    In ``sync:delayed`` (a dense model) the exchange runs behind the next step's compute, as
    parasync-worker's does: step() hands the gradient over, starts its push and the pull of
    the next parameters on the client's own thread and returns; the next step() waits for
    it. The model meanwhile holds the parameters of the step before, so each gradient is one
    step old; with ``weight_prediction`` (default True) they are extrapolated one step
    ahead, 2 w[t-1] - w[t-2], to make up for it. Gradients are read at step() (clipping
    between backward and step works). synchronize() waits for the exchange in flight and
    writes the servers' parameters into the model (pull() and the client's finish do).
    """

    def __init__(self, client: Client, model: nn.Module, optimizer: str = "adam",
                 lr: float = 1e-3, *, seed: int | None = None, overlap: bool = True,
                 batch_dim: int = 0, name: str | None = None, train_size: int | None = None,
                 epochs: int | None = None, weight_prediction: bool = True,
                 compression=None, **server_options):
        self.client = client
        self.model = model
        self.overlap = overlap
        self.batch_dim = batch_dim
        self.weight_prediction = weight_prediction
        self._named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._params = [p for _, p in self._named]
        self._embeddings = [m for m in model.modules() if isinstance(m, Embedding)]
        names = set()
        for m in self._embeddings:
            if m.table_name in names:
                raise errors.InvalidArgument(f"two pst.Embedding tables named {m.table_name!r}")
            names.add(m.table_name)
        for n, p in self._named:
            if p.dtype != torch.float32:
                raise errors.InvalidArgument(f"parameter {n} is {p.dtype}: parasync's variables "
                                             "are float32")
        if not self._named:
            raise errors.InvalidArgument("the model has no trainable parameters (pst.Embedding "
                                         "tables need at least one dense parameter beside them)")
        self._on_gpu = any(p.device.type == "cuda" for p in self._params)
        self._host = [self._host_buffer(p) for p in self._params]
        self._staging = [np.empty(p.numel(), dtype=np.float32) for p in self._params]
        self._zeros: list[np.ndarray | None] = [None] * len(self._params)
        variables = [Variable(n, tuple(p.shape) or (1,), "provided") for n, p in self._named]
        tables = [Table(m.table_name, m.dim, m.vocab, m.init) for m in self._embeddings]
        initial = None
        if client.is_chief:
            initial = [np.ascontiguousarray(p.detach().cpu().numpy(), dtype=np.float32)
                       for p in self._params]
        seed = seed if seed is not None else (client.settings.seed or 42)
        if compression is not None:
            client.set_wire_dtype(getattr(compression, "wire_dtype", compression))
        client.register(variables, tables, optimizer=optimizer, lr=lr, seed=seed,
                        name=name or type(model).__name__,
                        description=f'{{"framework": "pytorch", "module": '
                                    f'"{type(model).__name__}"}}',
                        initial_values=initial, train_size=train_size, epochs=epochs,
                        **server_options)
        for t, m in enumerate(self._embeddings):
            m._bind(client, t)
        # The parameters the servers hold (rank 0's, or what training made of them).
        client.pull(self._host)
        self._copy_host_to_params()
        # sync:delayed (dense models): the parameters last pulled, those before them (for the
        # prediction) and where the exchange in flight pulls the next ones.
        self._delayed = client.mode == "sync:delayed" and not self._embeddings
        self._in_flight = False
        self._have_before = False
        if self._delayed:
            self._latest = [np.array(h, dtype=np.float32, copy=True) for h in self._host]
            self._before = [np.empty_like(h) for h in self._latest]
            self._next = [np.empty_like(h) for h in self._latest]
        self._ready = [False] * len(self._params)    # its gradient is in p.grad this step
        self._handed = [False] * len(self._params)   # ... and was handed to the client
        self._open = False          # step_begin was called for the coming push
        self._open_examples = 0
        self._hooks_seen = 0
        self._forward_examples: int | None = None
        self._last_step_end = time.monotonic()
        self.timeline: dict | None = None  # the last step's moments (time.monotonic())
        self._backward_started: float | None = None
        self._first_hook: float | None = None
        self._last_hook: float | None = None
        self._accumulators = []
        for i, p in enumerate(self._params):
            # The gradient accumulator of p (Horovod's and BytePS's hook point): its hook runs
            # once p.grad holds this backward's gradient.
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            accumulator.register_hook(self._make_hook(i))
            self._accumulators.append(accumulator)
        model.register_forward_pre_hook(self._on_forward)
        model.register_forward_hook(self._on_forward_output)

    # ---- buffers -----------------------------------------------------------------------------
    @staticmethod
    def _host_buffer(p: torch.Tensor) -> np.ndarray:
        """Where p's values arrive from the servers: p's own memory for a contiguous CPU
        tensor (no copy), else a host array copied to p after each pull."""
        if p.device.type == "cpu" and p.is_contiguous():
            return p.detach().numpy().reshape(-1)
        host = torch.empty(p.numel(), dtype=torch.float32,
                           pin_memory=torch.cuda.is_available())
        return host.numpy()

    def _device_done(self) -> None:
        """Waits for the copies in flight from the host buffers to GPU parameters (and for the
        GPU gradients' copies), so the host buffers may be written again."""
        if self._on_gpu:
            torch.cuda.current_stream().synchronize()

    def _copy_host_to_params(self) -> None:
        with torch.no_grad():
            for p, host in zip(self._params, self._host):
                if p.device.type == "cpu" and p.is_contiguous():
                    continue  # pulled in place
                p.copy_(torch.from_numpy(host).view_as(p), non_blocking=True)

    # ---- hooks -------------------------------------------------------------------------------
    def _on_forward(self, _module, args) -> None:
        if args and isinstance(args[0], torch.Tensor) and args[0].dim() > self.batch_dim:
            self._forward_examples = int(args[0].shape[self.batch_dim])

    def _on_forward_output(self, _module, _args, output) -> None:
        # The moment backward reaches the model's output: backward has started.
        out = output[0] if isinstance(output, (tuple, list)) and output else output
        if isinstance(out, torch.Tensor) and out.requires_grad:
            def started(grad):
                self._backward_started = time.monotonic()
                return None
            out.register_hook(started)

    def _make_hook(self, i: int):
        def hook(*_):
            self._on_gradient(i)
        return hook

    def _gradient_array(self, i: int, copy: bool) -> np.ndarray:
        """Parameter i's gradient as a float32 host array: p.grad's own memory when it is a
        contiguous CPU tensor and `copy` is False, else a copy in the staging buffer."""
        g = self._params[i].grad
        if g is None:
            if self._zeros[i] is None:
                self._zeros[i] = np.zeros(self._params[i].numel(), dtype=np.float32)
            return self._zeros[i]
        if g.device.type == "cpu" and g.is_contiguous() and g.dtype == torch.float32 and not copy:
            return g.detach().numpy().reshape(-1)
        staging = torch.from_numpy(self._staging[i]).view_as(g)
        staging.copy_(g.detach())  # a GPU gradient: waits for it
        return self._staging[i]

    def _on_gradient(self, i: int) -> None:
        now = time.monotonic()
        if self._first_hook is None:
            self._first_hook = now
        self._last_hook = now
        if self._handed[i]:
            raise errors.InvalidArgument(
                f"a second backward() before step(): the gradient of {self._named[i][0]} "
                "was already pushed; accumulate gradients over several backward passes "
                "with pst.Optimizer(..., overlap=False)")
        if not self._ready[i]:
            self._ready[i] = True
            self._hooks_seen += 1
        if not self.overlap or self._delayed:
            return  # sync:delayed: the exchange before is still out; all goes at step()
        if not self._open:
            examples = self.client.next_step_examples
            if examples is None:
                examples = self._forward_examples
            if examples is None:
                return  # not known before step(): everything goes at step()
            self.client.step_begin(examples)
            self._open, self._open_examples = True, examples
        # Copied: the gradient pushed is the one backward produced, whatever happens to p.grad
        # before step().
        self.client.step_gradient(i, self._gradient_array(i, copy=True))
        self._handed[i] = True

    # ---- the step ----------------------------------------------------------------------------
    def pull(self) -> None:
        """The servers' current values into the parameters, as parasync-worker's chief reads
        them before an evaluation (in sync mode: those of the step this worker last pushed
        to)."""
        wait = NEXT_STEP if self.client.mode.startswith("sync") else 0
        self.synchronize()
        self._device_done()
        self.client.pull(self._host, min_version=wait)
        self._copy_host_to_params()
        if self._delayed:
            self._keep_latest(self._host)

    def synchronize(self):
        """sync:delayed: waits for the exchange in flight and writes the parameters it pulled
        into the model (not extrapolated); returns its StepTimes (None: none was in flight).
        Other modes: nothing to wait for."""
        times = self._await_exchange()
        if times is not None:
            self._write_params(self._latest)
        return times

    # ---- sync:delayed ------------------------------------------------------------------------
    def _keep_latest(self, values: Sequence[np.ndarray]) -> None:
        """`values` (just read from the servers) become the latest parameters; no prediction
        until the next exchange (nothing before them is known)."""
        for latest, v in zip(self._latest, values):
            np.copyto(latest, v)
        self._have_before = False

    def _await_exchange(self):
        """Waits for the exchange in flight, if any: its parameters become the latest, the
        latest those before. Its StepTimes, or None."""
        if not self._in_flight:
            return None
        self._in_flight = False
        times = self.client.step_wait()
        self._before, self._latest, self._next = self._latest, self._next, self._before
        self._have_before = True
        return times

    def _write_params(self, values: Sequence[np.ndarray]) -> None:
        """`values` into the parameters, through their host buffers (a contiguous CPU
        parameter's is its own memory)."""
        self._device_done()
        for host, v in zip(self._host, values):
            np.copyto(host, v)
        self._copy_host_to_params()

    def _predicted(self) -> list[np.ndarray]:
        """Where the next gradient is computed: the latest parameters, or with the prediction
        2 latest - before (written into `before`, which the next exchange no longer needs)."""
        if not (self.weight_prediction and self._have_before):
            return self._latest
        for latest, before in zip(self._latest, self._before):
            np.subtract(2.0 * latest, before, out=before)
        return self._before

    def _step_delayed(self, examples: int):
        """Waits for the step before's exchange, launches this one's and writes the
        parameters to compute the next gradient at. The awaited exchange's times (or None)."""
        times = self._await_exchange()
        self.client.step_begin(examples)
        self._open = True
        for i in range(len(self._params)):
            # Copied: the exchange reads them while the next backward writes p.grad.
            self.client.step_gradient(i, self._gradient_array(i, copy=True))
        self._device_done()
        self.client.step_launch(self._next)
        self._in_flight = True
        self._write_params(self._predicted())
        return times

    def zero_grad(self, set_to_none: bool = False) -> None:
        """As torch.optim's: clears the parameters' gradients."""
        for p in self._params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()

    def step(self, examples: int | None = None, loss: float | None = None) -> None:
        """Pushes this step's gradients (what backward's hooks have not sent yet, and the
        tables' rows), waits until every shard has them, and writes the servers' next values
        into the parameters (in sync mode, those of the step this push completes).
        ``examples``: how many examples the gradient was computed from (default: the batch
        dimension of the model's last input). ``loss`` is reported in the metrics and epoch
        lines. InvalidArgument for a step() with no backward() since the last step."""
        called = time.monotonic()
        if self._hooks_seen == 0:
            raise errors.InvalidArgument("step() without backward(): no parameter has a "
                                         "gradient since the last step")
        if examples is None:
            examples = self.client.next_step_examples or self._forward_examples
        if examples is None:
            raise errors.InvalidArgument("step() needs examples=N: the number of examples "
                                         "this gradient was computed from")
        examples = int(examples)
        if self._open and examples != self._open_examples:
            self.client.log(f"pushes sent during backward counted {self._open_examples} "
                            f"examples but step() says {examples}: overlap is off from now on "
                            "(pass examples in the batch dimension, batch_dim, or use "
                            "parasync.training.Run)", "warn")
            self.overlap = False
        if self._delayed:
            try:
                waited = self._step_delayed(examples)
            finally:
                self._end_hooks()
            self._end_step_delayed(called, examples, loss, waited)
            return
        try:
            if not self._open:
                self.client.step_begin(examples)
                self._open = True
            for i in range(len(self._params)):
                # Not handed over yet: p.grad itself (or zeros for a parameter this forward
                # did not use).
                if not self._handed[i]:
                    self.client.step_gradient(i, self._gradient_array(i, copy=False))
            rows = []
            for m in self._embeddings:
                g = m._take_gradient()
                if g is not None:
                    rows.append((m._table, g[0], g[1]))
            self._device_done()
            times = self.client.step_finish(self._host, push_rows=rows)
        finally:
            self._end_hooks()
        self._copy_host_to_params()
        self._end_step(called, examples, loss, times)

    def _end_hooks(self) -> None:
        self._open = False
        self._ready = [False] * len(self._params)
        self._handed = [False] * len(self._params)
        self._hooks_seen = 0

    def _end_step_delayed(self, called: float, examples: int, loss, waited) -> None:
        """The step's figures under sync:delayed: the wait for the exchange before (what the
        compute did not hide), split as that exchange's own push and pull."""
        now = time.monotonic()
        if waited is None:
            waited = StepTimes(now, now, now, now, 0.0, 0.0, 0)
        whole = waited.push_seconds + waited.pull_seconds
        wait = now - called
        pull = wait * waited.pull_seconds / whole if whole > 0 else 0.0
        self._end_step(called, examples, loss, waited, pull_seconds=pull,
                       push_seconds=wait - pull)

    def _end_step(self, called: float, examples: int, loss, times, pull_seconds=None,
                  push_seconds=None) -> None:
        done = time.monotonic()
        self.timeline = {
            "step_start": self._last_step_end,
            "backward_start": self._backward_started,
            "first_gradient": self._first_hook,
            "last_gradient": self._last_hook,
            "first_push_sent": times.first_push_sent,
            "last_push_sent": times.last_push_sent,
            "step_called": called,
            "pushes_acked": times.pushes_acked,
            "pulled": times.pulled,
            "early_pushes": times.early_pushes,
        }
        lookups = self.client.lookup_seconds  # the tables' row pulls in forward
        self.client.lookup_seconds = 0.0
        compute = called - self._last_step_end - lookups
        pull = times.pull_seconds if pull_seconds is None else pull_seconds
        push = times.push_seconds if push_seconds is None else push_seconds
        self.client.record_step(examples, loss, pull + lookups, compute, push)
        self._last_step_end = done
        self._backward_started = self._first_hook = self._last_hook = None
        for m in self._embeddings:
            m._forget()
