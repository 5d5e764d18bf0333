"""parasync.Client: a worker's connection to the parameter servers, at the numpy level.

A thin layer over libparasync_client.so (worker/client/c_api.h): the push/pull client,
heartbeats, metrics and eval log of parasync-worker itself, so a Python worker has that
worker's semantics in every mode (async, sync with backup workers, ssp), across server
restarts (requests resent, pushes applied exactly once) and under the launcher.

Arrays are passed by pointer, never copied here: parameters and gradients must be float32,
C-contiguous numpy arrays (or anything exposing such memory through ``__array_interface__``
with the right size); ids are uint64 (int64 values reinterpreted), sorted ascending as
unsigned and unique. Calls block the calling thread only, never the interpreter: ctypes
releases the GIL while the library waits on the network. One thread uses a client at a time.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import math
import os
import signal
import threading
from ctypes import POINTER, byref, c_float, c_int, c_int64, c_size_t, c_uint64
from typing import Iterable, Sequence

import numpy as np

from . import _capi, errors
from ._capi import call, lib, text
from .environment import Settings

NEXT_STEP = _capi.NEXT_STEP

_INIT_KINDS = {"zeros": _capi.INIT_ZEROS, "constant": _capi.INIT_CONSTANT,
               "uniform": _capi.INIT_UNIFORM, "provided": _capi.INIT_PROVIDED}


def _write_ready_file(rank: int, metrics_port: int) -> None:
    """With PARASYNC_READY_FILE set (parasync-launch sets it, beside PARASYNC_METRICS_PORT=0):
    writes there what parasync-worker --ready-file writes (common/ready_file.h), whole through
    a rename, so the launcher learns the metrics port this worker bound. Unavailable naming
    the file when it cannot be written."""
    path = os.environ.get("PARASYNC_READY_FILE")
    if not path:
        return
    ready = {"role": "worker", "task_index": rank, "pid": os.getpid(), "address": "",
             "metrics_port": metrics_port}
    try:
        with open(path + ".tmp", "w") as f:
            f.write(json.dumps(ready) + "\n")
        os.replace(path + ".tmp", path)
    except OSError as e:
        raise errors.Unavailable(f"PARASYNC_READY_FILE {path}: {e.strerror}") from None


@dataclasses.dataclass(frozen=True)
class Variable:
    """A dense variable: cut into slices over the shards. ``init`` is "provided" (rank 0's
    values, given to Client.register), "zeros", ("constant", v) or ("uniform", v): uniform in
    [-v, v) from the seed."""

    name: str
    shape: tuple
    init: object = "provided"

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))


@dataclasses.dataclass(frozen=True)
class Table:
    """An embedding table: rows of ``dim`` floats by 64-bit id, spread over the shards by id
    and created on first touch from (seed, table, id). ``rows`` 0: any id."""

    name: str
    dim: int
    rows: int = 0
    init: object = ("uniform", 0.05)


@dataclasses.dataclass(frozen=True)
class Progress:
    """A position in a worker's data: epoch (1-based; 0: nothing recorded), examples of that
    epoch done, and examples per epoch in this rank's shard."""

    epoch: int
    done: int
    of: int


@dataclasses.dataclass
class StepTotals:
    """What the steps recorded since the last take_totals() add up to (seconds per phase)."""

    steps: int = 0
    examples: int = 0
    loss_sum: float = 0.0
    loss_steps: int = 0  # steps that reported a loss
    pull: float = 0.0
    compute: float = 0.0
    push: float = 0.0


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """When a step's traffic happened, in time.monotonic() seconds."""

    first_push_sent: float
    last_push_sent: float
    pushes_acked: float
    pulled: float
    push_seconds: float  # within step_finish: until the last push was acknowledged
    pull_seconds: float  # from there until the last pull reply
    early_pushes: int    # shards whose push went out before step_finish


def _init(init) -> tuple[int, float]:
    if isinstance(init, str):
        kind, value = init, 0.0
    else:
        kind, value = init
    if kind not in _INIT_KINDS:
        raise errors.InvalidArgument(f"unknown initializer {init!r} (provided, zeros, "
                                     "('constant', v), ('uniform', v))")
    return _INIT_KINDS[kind], float(value)


def _float_pointer(array, size: int, what: str) -> ctypes.POINTER(c_float):
    """The data pointer of a float32, C-contiguous array of `size` elements."""
    face = getattr(array, "__array_interface__", None)
    if face is None:
        raise errors.InvalidArgument(f"{what} is a {type(array).__name__}, not an array")
    if face["typestr"] != "<f4":
        raise errors.InvalidArgument(f"{what} has dtype {face['typestr']}, not float32")
    shape = face["shape"]
    if int(math.prod(shape)) != size:
        raise errors.InvalidArgument(f"{what} has shape {tuple(shape)}: {size} elements needed")
    strides = face.get("strides")
    if strides is not None:
        expected, step = [], 4
        for dim in reversed(shape):
            expected.append(step)
            step *= dim
        if tuple(s for s, d in zip(strides, shape) if d > 1) != tuple(
                e for e, d in zip(reversed(expected), shape) if d > 1):
            raise errors.InvalidArgument(f"{what} is not contiguous")
    if face["data"][1]:
        raise errors.InvalidArgument(f"{what} is read-only")
    return ctypes.cast(face["data"][0], POINTER(c_float))


class Client:
    """A worker of a parasync cluster.

    ``ps_hosts`` (list or comma-separated "host:port" of every server shard), ``workers``
    (the world size) and ``rank`` default to TF_CONFIG, as parasync-worker's do; the other
    settings default to the environment the launcher gives (parasync.environment.Settings)
    and can be passed by name. Nothing waits for the servers until register().
    """

    def __init__(self, ps_hosts: Sequence[str] | str | None = None, workers: int | None = None,
                 rank: int | None = None, *, settings: Settings | None = None, **overrides):
        known = {f.name for f in dataclasses.fields(Settings)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise errors.InvalidArgument(f"unknown setting(s) {', '.join(unknown)} (the "
                                         f"settings: {', '.join(sorted(known))})")
        s = dataclasses.replace(settings or Settings.from_environment(), **overrides)
        self.settings = s
        self._handle = None
        self._registered = False
        self._variables: list[Variable] = []
        self._tables: list[Table] = []
        self._totals = StepTotals()
        # The examples of the step about to be computed, when the data loop knows them before
        # backward (parasync.training.Run sets it): early pushes carry them.
        self.next_step_examples: int | None = None
        # Seconds spent pulling table rows since the optimizer's last step (pst.Embedding).
        self.lookup_seconds = 0.0
        # The last gather's round and the ranks it admitted back (gather()).
        self.last_gather_round = 0
        self.last_gather_admitted: list[int] = []
        # The arrays a launched step (step_launch) writes and reads until step_wait.
        self._launched: list | None = None
        options = lib.parasync_options_create()
        try:
            hosts = ",".join(ps_hosts) if isinstance(ps_hosts, (list, tuple)) else ps_hosts
            call(lib.parasync_options_set_cluster, options, text(hosts),
                 -1 if workers is None else int(workers), -1 if rank is None else int(rank))
            call(lib.parasync_options_set_mode, options, text(s.mode))
            call(lib.parasync_options_set_timeouts, options, float(s.request_timeout),
                 float(s.connect_timeout), float(s.heartbeat_interval))
            call(lib.parasync_options_set_curve, options, text(s.curve_key),
                 text(s.curve_server_key))
            call(lib.parasync_options_set_wire_dtype, options, text(s.wire_dtype))
            call(lib.parasync_options_set_topk_probe, options, int(bool(s.topk_probe)))
            call(lib.parasync_options_set_delta_pulls, options, int(bool(s.delta_pulls)))
            call(lib.parasync_options_set_joining, options, int(bool(s.joining)))
            call(lib.parasync_options_set_local_group, options, text(s.local_group),
                 text(s.local_group_endpoint))
            call(lib.parasync_options_set_metrics, options, text(s.metrics_bind),
                 int(s.metrics_port), text(s.log_dir))
            call(lib.parasync_options_set_log_level, options, text(s.log_level))
            handle = ctypes.c_void_p()
            call(lib.parasync_client_connect, options, byref(handle))
            self._handle = handle
        finally:
            lib.parasync_options_destroy(options)
        try:
            _write_ready_file(self.rank, self.metrics_port)  # /metrics is up now
        except errors.Unavailable:
            self.close()
            raise

    # ---- what the cluster is ---------------------------------------------------------------
    @property
    def rank(self) -> int:
        return lib.parasync_client_rank(self._h)

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @property
    def num_workers(self) -> int:
        return lib.parasync_client_num_workers(self._h)

    @property
    def num_shards(self) -> int:
        return lib.parasync_client_num_shards(self._h)

    @property
    def mode(self) -> str:
        return lib.parasync_client_mode(self._h).decode()

    @property
    def metrics_port(self) -> int:
        """The port of /metrics (0: none)."""
        return lib.parasync_client_metrics_port(self._h)

    @property
    def variables(self) -> list[Variable]:
        return list(self._variables)

    @property
    def tables(self) -> list[Table]:
        return list(self._tables)

    @property
    def _h(self):
        if self._handle is None:
            raise errors.FailedPrecondition("the client is closed")
        return self._handle

    # ---- the model ---------------------------------------------------------------------------
    def register(self, variables: Sequence[Variable], tables: Sequence[Table] = (), *,
                 optimizer: str = "adam", lr: float = 0.001, seed: int = 42,
                 name: str = "", description: str = "", initial_values=None,
                 train_size: int | None = None, epochs: int | None = None,
                 **optimizer_settings) -> None:
        """Registers the model with every server (waiting up to the connect timeout for
        servers still starting). ``initial_values`` (one float32 array per variable) are the
        values of "provided" variables, sent by the rank that creates the model (rank 0);
        others call without them and wait until rank 0 has. ``optimizer_settings``: momentum,
        beta1, beta2, epsilon, initial_accumulator, staleness_aware, cosine_decay_examples,
        final_lr_fraction, max_slice_elements. The settings' learning-rate schedule
        (PARASYNC_LR_SCHEDULE) is applied unless cosine_decay_examples is given: cosine
        decays over ``epochs`` (default PARASYNC_EPOCHS, else 5) of ``train_size`` examples
        (the whole training set), as parasync-worker's --lr-schedule does, and without
        ``train_size`` is refused (Settings.lr_schedule_options). Raises FailedPrecondition
        when the servers hold another model (naming the first variable that differs) or run
        another mode, TimedOut or Unavailable naming a server that cannot be reached."""
        if "cosine_decay_examples" not in optimizer_settings:
            optimizer_settings = {**self.settings.lr_schedule_options(train_size, epochs),
                                  **optimizer_settings}
        model = lib.parasync_model_create()
        try:
            for v in variables:
                shape = (c_int64 * len(v.shape))(*[int(d) for d in v.shape])
                kind, value = _init(v.init)
                call(lib.parasync_model_add_variable, model, text(v.name), shape,
                     len(v.shape), kind, value)
            for t in tables:
                kind, value = _init(t.init)
                call(lib.parasync_model_add_table, model, text(t.name), int(t.rows), int(t.dim),
                     kind, value)
            call(lib.parasync_model_set_optimizer, model, text(optimizer), float(lr))
            for key, value in optimizer_settings.items():
                call(lib.parasync_model_set, model, text(key), float(value))
            lib.parasync_model_set_seed(model, int(seed))
            lib.parasync_model_set_name(model, text(name))
            lib.parasync_model_set_description(model, text(description))
            call(lib.parasync_model_validate, model)
            values = None
            if initial_values is not None:
                if len(initial_values) != len(variables):
                    raise errors.InvalidArgument(
                        f"{len(initial_values)} initial values for {len(variables)} variables")
                values = (POINTER(c_float) * len(variables))(*[
                    _float_pointer(a, v.size, f"the initial value of {v.name}")
                    for a, v in zip(initial_values, variables)])
            call(lib.parasync_client_register, self._h, model, values)
        finally:
            lib.parasync_model_destroy(model)
        self._variables = list(variables)
        self._tables = list(tables)
        self._registered = True

    @property
    def recorded_progress(self) -> Progress:
        """Where the servers recorded this rank in its data (epoch 0: nothing recorded)."""
        epoch, done, of = c_int(), c_int64(), c_int64()
        lib.parasync_client_recorded_progress(self._h, byref(epoch), byref(done), byref(of))
        return Progress(epoch.value, done.value, of.value)

    def set_progress(self, epoch: int, done: int, of: int) -> None:
        """The position every later push reports (parasync.training.Run keeps it)."""
        lib.parasync_client_set_progress(self._h, int(epoch), int(done), int(of))

    # ---- moving tensors --------------------------------------------------------------------
    def _arrays(self, arrays, what: str):
        if len(arrays) != len(self._variables):
            raise errors.InvalidArgument(
                f"{len(arrays)} {what} arrays for a model of {len(self._variables)} variables")
        return (POINTER(c_float) * len(arrays))(*[
            _float_pointer(a, v.size, f"the {what} of {v.name}")
            for a, v in zip(arrays, self._variables)])

    def _rows(self, rows: Iterable, writable_values: bool):
        """[(table, ids, values)] -> a Rows array (and the arrays it points into)."""
        rows = list(rows)
        out = (_capi.Rows * max(1, len(rows)))()
        keep = []
        for i, (table, ids, values) in enumerate(rows):
            if not 0 <= table < len(self._tables):
                raise errors.InvalidArgument(f"no table {table}")
            ids = np.asarray(ids)
            if ids.dtype == np.int64:
                ids = ids.view(np.uint64)
            if ids.dtype != np.uint64 or ids.ndim != 1 or not ids.flags.c_contiguous:
                raise errors.InvalidArgument(
                    f"the ids of table {self._tables[table].name} must be a contiguous 1-D "
                    f"int64 or uint64 array, not {ids.dtype} of shape {ids.shape}")
            dim = self._tables[table].dim
            pointer = _float_pointer(values, len(ids) * dim,
                                     f"the rows of table {self._tables[table].name}")
            out[i].table = table
            out[i].ids = ids.ctypes.data_as(POINTER(c_uint64))
            out[i].count = len(ids)
            out[i].values = pointer
            keep.append(ids)
        return out, len(rows), keep

    def _need_model(self):
        if not self._registered:
            raise errors.FailedPrecondition("register() the model first")

    def pull(self, params: Sequence, rows: Iterable = (), min_version: int = 0) -> None:
        """Fills params[v] with the servers' values (and each (table, ids, values) of
        ``rows``); with ``params`` empty, only the rows. ``min_version`` NEXT_STEP: wait for
        the step after this client's last push (sync mode)."""
        self._need_model()
        r, n, _keep = self._rows(rows, True)
        # No params but rows: the rows alone (an embedding lookup).
        arrays = None if not params and n else self._arrays(params, "parameter")
        call(lib.parasync_client_pull, self._h, arrays, len(params), int(min_version), r, n)

    def push(self, grads: Sequence, examples: int, rows: Iterable = ()) -> None:
        """Sends the gradient of ``examples`` examples (and gradient rows); returns once every
        shard acknowledged it."""
        self._need_model()
        arrays = self._arrays(grads, "gradient")
        r, n, _keep = self._rows(rows, False)
        call(lib.parasync_client_push, self._h, arrays, len(grads), int(examples), r, n)

    def step_begin(self, examples: int) -> None:
        """Opens a step of ``examples`` examples (see step_gradient)."""
        self._need_model()
        call(lib.parasync_client_step_begin, self._h, int(examples))

    def step_gradient(self, variable: int, grad) -> None:
        """Variable ``variable``'s gradient is complete in ``grad``, which must stay valid and
        unchanged until step_finish returns. Once every variable a shard holds is complete,
        its push goes out at once (overlapping what is left of backward)."""
        v = self._variables[variable]
        pointer = _float_pointer(grad, v.size, f"the gradient of {v.name}")
        call(lib.parasync_client_step_gradient, self._h, int(variable), pointer)

    def step_finish(self, params: Sequence, push_rows: Iterable = (),
                    pull_rows: Iterable = ()) -> StepTimes:
        """Sends the rest of the step's push and pulls the next parameters into ``params``
        (in sync mode those of the step this push completes); waits for every reply."""
        arrays = self._arrays(params, "parameter")
        pr, pn, _keep1 = self._rows(push_rows, False)
        lr, ln, _keep2 = self._rows(pull_rows, True)
        t = _capi.StepTimes()
        call(lib.parasync_client_step_finish, self._h, pr, pn, arrays, len(params), lr, ln,
             byref(t))
        return StepTimes(t.first_push_sent, t.last_push_sent, t.pushes_acked, t.pulled,
                         t.push_seconds, t.pull_seconds, t.early_pushes)

    def step_launch(self, params: Sequence) -> None:
        """sync:delayed: step_finish's exchange on a thread of the client's own; returns at
        once. The next parameters arrive in ``params``, which, with the gradients handed to
        step_gradient, stay the client's until step_wait returns; compute the next gradient
        from the parameters held before. Every other call that talks to the servers waits
        for the exchange first."""
        arrays = self._arrays(params, "parameter")
        call(lib.parasync_client_step_launch, self._h, arrays, len(params))
        self._launched = list(params)

    def step_wait(self) -> StepTimes:
        """Waits for the exchange step_launch started; its times (its error raised)."""
        t = _capi.StepTimes()
        try:
            call(lib.parasync_client_step_wait, self._h, byref(t))
        finally:
            self._launched = None
        return StepTimes(t.first_push_sent, t.last_push_sent, t.pushes_acked, t.pulled,
                         t.push_seconds, t.pull_seconds, t.early_pushes)

    @property
    def last_push_dropped(self) -> bool:
        return bool(lib.parasync_client_last_push_dropped(self._h))

    @property
    def last_version(self) -> int:
        return lib.parasync_client_last_version(self._h)

    @property
    def resends(self) -> int:
        return lib.parasync_client_resends(self._h)

    @property
    def reconnects(self) -> int:
        return lib.parasync_client_reconnects(self._h)

    # ---- what a worker reports -------------------------------------------------------------
    def observe_step(self, examples: int, loss: float, pull_seconds: float,
                     compute_seconds: float, push_seconds: float) -> None:
        """Counts a finished step in the worker metrics (examples/sec, the step split...)."""
        lib.parasync_client_observe_step(self._h, int(examples), float(loss),
                                         float(pull_seconds), float(compute_seconds),
                                         float(push_seconds))

    def record_step(self, examples: int, loss: float | None, pull_seconds: float,
                    compute_seconds: float, push_seconds: float) -> None:
        """observe_step, and the totals the epoch lines report (take_totals)."""
        self.observe_step(examples, math.nan if loss is None else loss, pull_seconds,
                          compute_seconds, push_seconds)
        t = self._totals
        t.steps += 1
        t.examples += int(examples)
        if loss is not None and math.isfinite(loss):
            t.loss_sum += float(loss)
            t.loss_steps += 1
        t.pull += pull_seconds
        t.compute += compute_seconds
        t.push += push_seconds

    def take_totals(self) -> StepTotals:
        """The totals since the last call, which starts new ones."""
        totals, self._totals = self._totals, StepTotals()
        return totals

    @property
    def totals(self) -> StepTotals:
        return self._totals

    def beat(self) -> None:
        """Tells /healthz the training thread is alive (call during long evaluations)."""
        lib.parasync_client_beat(self._h)

    def set_epoch(self, epoch: int) -> None:
        lib.parasync_client_set_epoch(self._h, int(epoch))

    def log_eval(self, epoch: int, test_accuracy: float, test_loss: float, *,
                 train_loss: float = math.nan, test_auc: float = math.nan,
                 examples_per_sec: float = 0.0, wall_seconds: float = 0.0,
                 batch_size: int = 0, optimizer: str | None = None,
                 learning_rate: float = math.nan, epoch_progress: float = 0.0) -> None:
        """Chief: appends a row to <log-dir>/eval.jsonl, as parasync-worker's chief does.
        ``optimizer`` and ``learning_rate``: a worker-side optimizer's (parasync.horovod's),
        written instead of the servers'. ``epoch_progress`` > 0: an evaluation within epoch
        ``epoch``, at that many epochs done (its row's "epoch", with "within_epoch": true)."""
        self._need_model()
        e = _capi.Eval(int(epoch), float(train_loss), float(test_loss), float(test_accuracy),
                       float(test_auc), float(examples_per_sec), float(wall_seconds),
                       int(batch_size), text(optimizer) if optimizer else None,
                       float(learning_rate), float(epoch_progress))
        call(lib.parasync_client_log_eval, self._h, byref(e))

    def last_logged_epoch(self) -> int:
        """The highest epoch eval.jsonl holds (-1: none)."""
        return lib.parasync_client_last_logged_epoch(self._h)

    def wait_for_workers(self, seconds: float) -> None:
        """Chief after its last epoch: leave, then wait up to ``seconds`` for the others."""
        self._need_model()
        call(lib.parasync_client_wait_for_workers, self._h, float(seconds))

    def set_joining(self, joining: bool) -> None:
        """Joining on or off (Settings.joining): while on, the servers do not count this rank
        live, and a gather waits to be admitted at its key's next round."""
        call(lib.parasync_client_set_joining, self._h, int(bool(joining)))

    def leave(self, seconds: float = 10.0) -> None:
        """No sync step, ssp bound or collective waits for this rank any more, until it
        pulls, pushes or registers again (best effort within ``seconds``)."""
        self._need_model()
        call(lib.parasync_client_leave, self._h, float(seconds))

    def live_ranks(self) -> list[int]:
        """The ranks some server still counts as training (neither left nor declared dead)."""
        self._need_model()
        live = (ctypes.c_uint8 * self.num_workers)()
        call(lib.parasync_client_live_ranks, self._h, live)
        return [r for r in range(self.num_workers) if live[r]]

    def global_progress(self) -> tuple[int, int]:
        """(steps, examples) the servers have applied: the largest version over the shards
        and the examples those steps were computed from."""
        self._need_model()
        step, examples = c_int64(), c_int64()
        call(lib.parasync_client_global_progress, self._h, byref(step), byref(examples))
        return step.value, examples.value

    def set_wire_dtype(self, dtype: str) -> None:
        """How tensors travel from now on: "float32", "bfloat16", "float16", "int8", "int4",
        "topk" or "topk:R"; before register() only (parasync.horovod's Compression)."""
        call(lib.parasync_client_set_wire_dtype, self._h, text(dtype))

    def gather(self, key: str, round: int, payload: bytes) -> list[bytes | None]:
        """A collective's exchange (parasync.horovod builds allreduce, allgather and
        broadcast on it): offers ``payload`` for round ``round`` (1, 2, ... per key, counted
        alike on every rank) of ``key`` and waits until every live rank has offered. Returns
        each rank's payload by rank, None for a rank that took no part (dead or departed).
        Works before register(). Also sets ``last_gather_round`` (the round answered: for a
        joining client, the one that admitted it) and ``last_gather_admitted`` (the ranks that
        round admitted back; their payloads are None)."""
        n = self.num_workers
        contributed = (ctypes.c_uint8 * n)()
        sizes = (c_uint64 * n)()
        data = ctypes.c_char_p(payload) if payload else None
        call(lib.parasync_client_gather, self._h, text(key), int(round),
             ctypes.cast(data, ctypes.c_void_p) if data else None, len(payload),
             contributed, sizes)
        self.last_gather_round = int(lib.parasync_client_gather_round(self._h))
        self.last_gather_admitted = [r for r in range(n) if contributed[r] == 2]
        out: list[bytes | None] = []
        for r in range(n):
            if contributed[r] != 1:
                out.append(None)
                continue
            buffer = ctypes.create_string_buffer(max(1, sizes[r]))
            call(lib.parasync_client_gather_copy, self._h, r, buffer, int(sizes[r]))
            out.append(buffer.raw[:sizes[r]])
        return out

    def checkpoint(self) -> None:
        """Asks every server for a snapshot now (they need --state-dir)."""
        self._need_model()
        call(lib.parasync_client_checkpoint, self._h)

    def shard_indices(self, n: int, epoch: int, seed: int, shuffle: bool = True) -> np.ndarray:
        """This rank's example indices of n examples in epoch ``epoch``'s order, exactly as
        parasync-worker walks them (a restarted worker finds its place again)."""
        return shard_indices(n, self.rank, self.num_workers, seed, epoch, shuffle)

    def log(self, message: str, level: str = "info") -> None:
        """One line in parasync's log format (stderr)."""
        lib.parasync_log(text(level), text(message))

    def finish(self, seconds: float = 10.0) -> None:
        """Leaves (so no barrier waits for this rank), marks the metrics final and writes
        <log-dir>/metrics-worker<rank>.prom."""
        call(lib.parasync_client_finish, self._h, float(seconds))

    def close(self) -> None:
        """Closes the connections (without leaving: see finish)."""
        if self._handle is not None:
            lib.parasync_client_destroy(self._handle)
            self._handle = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # at interpreter exit the library may be gone already
            pass


def shard_indices(n: int, rank: int, workers: int, seed: int, epoch: int,
                  shuffle: bool = True) -> np.ndarray:
    """Rank ``rank``'s example indices (i % workers == rank) in epoch ``epoch``'s order, as
    parasync-worker shuffles them (per seed, rank and epoch)."""
    count = c_size_t()
    call(lib.parasync_shard_indices, int(n), int(rank), int(workers), int(seed), int(epoch),
         int(bool(shuffle)), None, 0, byref(count))
    out = np.empty(count.value, dtype=np.int64)
    call(lib.parasync_shard_indices, int(n), int(rank), int(workers), int(seed), int(epoch),
         int(bool(shuffle)), out.ctypes.data_as(POINTER(c_int64)), len(out), byref(count))
    return out


_signals_installed = False


def stop_on_signals() -> None:
    """SIGTERM and SIGINT stop the worker as they stop parasync-worker: a call waiting on the
    servers returns at once (Aborted) and the program exits with status 0 through SystemExit
    (finally blocks and atexit run). Installed once, from the main thread."""
    global _signals_installed
    if _signals_installed or threading.current_thread() is not threading.main_thread():
        return

    def stop(number, _frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    lib.parasync_install_signal_handlers()
    _signals_installed = True


def stop_requested() -> int:
    """The signal that asked to stop (0: none)."""
    return lib.parasync_stop_requested()
