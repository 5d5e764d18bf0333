"""parasync.horovod: Horovod's PyTorch API (horovod.torch, 0.28) on parasync's servers.

    import parasync.horovod as hvd      # was: import horovod.torch as hvd
    hvd.init()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    for x, y in loader:
        optimizer.zero_grad(); F.nll_loss(model(x), y).backward(); optimizer.step()

The workers apply their own optimizer; the servers only move gradients between them:

- sync (parasync-launch --mode sync): each step's gradients go to the servers as backward
  produces them (from the gradient accumulators' hooks, as Horovod starts its allreduces);
  the servers average one gradient per live rank (backup workers and dead ranks as for any
  sync run) and synchronize() writes the average into every p.grad. Every rank then applies
  the same optimizer to the same bits: the parameters stay bitwise identical.
- sync:delayed: each step's exchange runs while the script computes the next step's
  gradients (synchronize() hands this step's gradients over and returns at once with the
  step before's average in every p.grad): every update applies gradients one step old, the
  same on every rank. The first step applies none and the last step's average is not
  applied (N steps, N - 1 updates).
- async and ssp:K: each worker steps its own optimizer on its own gradient, pushes the change
  that made (a delta) and takes the servers' parameters, which add every worker's deltas
  (BytePS's asynchronous mode); ssp bounds how far a worker runs ahead. The optimizer state
  (momentum, Adam's moments) is each worker's own.

Collectives (allreduce, allgather, broadcast, broadcast_object, ...) go through the servers
too: every live rank offers its tensor under the collective's name and gets every rank's
back; the reduction runs on each worker in rank order, so every rank gets the same bits. A
dead rank is not waited for: its peers get the result of those alive (Horovod would hang).
The "async" variants finish before they return (the handle is ready at once). join() lets a
rank out of data stop holding the others up; it ends that rank's training (no step or
collective may follow it, unlike Horovod's).

Not supported (each raises NotSupported naming what to use): Adasum, process sets, alltoall,
reducescatter, sparse gradients (sparse_as_dense=False with sparse grads).
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import time
import warnings

import numpy as np
import torch

from . import errors
from . import horovod_timeline
from .client import Client, Variable, stop_requested
from .torch import connect

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "Compression", "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
    "broadcast_object", "allgather_object", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather", "allgather_async", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "synchronize", "poll", "join", "barrier",
    "log_eval", "client", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "mpi_threads_supported",
    "start_timeline", "stop_timeline", "SyncBatchNorm", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set", "elastic",
]

# Reduction ops: Horovod's names and values.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
             Product: "Product"}


class _State:
    client: Client | None = None
    local_rank = 0
    local_size = 1
    cross_rank = 0
    cross_size = 1
    rounds: dict[str, int] = {}
    unnamed = 0  # collectives without a name, counted alike on every rank
    batch_hook = None
    joined = False  # hvd.join() was called: no step or collective may follow
    # A launcher's restart of a worker, not yet admitted back into the running job
    # (parasync.horovod_elastic): the servers do not count it live.
    joining = False
    sampler = None  # the ElasticSampler the optimizer's pushes report their position in
    timeline = None  # start_timeline's file (horovod_timeline.Timeline), where this rank writes


_state = _State()


def _env_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise errors.InvalidArgument(f"{name}={value!r} is not an integer") from None
    return default


# ---- the world ----------------------------------------------------------------------------
def init(comm=None, process_sets=None) -> None:
    """Connects this worker to the cluster the launcher describes (TF_CONFIG and PARASYNC_*,
    as pst.connect()). Idempotent. ``comm`` (an MPI communicator) and ``process_sets`` are
    refused: parasync's world is the launcher's cluster."""
    if comm is not None:
        raise errors.NotSupported("hvd.init(comm=...): parasync's world is the cluster "
                                  "parasync-launch starts (TF_CONFIG), not an MPI communicator")
    if process_sets not in (None, [], ()):
        _no_process_sets()
    if _state.client is not None:
        return
    restarted = _env_int(("PARASYNC_RESTART",), 0) > 0
    # A restarted worker is joining from its first heartbeat: nobody waits for it until it
    # is admitted back (hvd.elastic.run) or, not elastic, starts training.
    client = connect(joining=restarted)
    _state.client = client
    _state.rounds = {}
    _state.unnamed = 0
    _state.joined = False
    _state.joining = restarted
    _state.sampler = None
    world = client.num_workers
    _state.local_rank = _env_int(("HOROVOD_LOCAL_RANK", "LOCAL_RANK"), 0)
    _state.local_size = _env_int(("HOROVOD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"), world)
    _state.cross_rank = _env_int(("HOROVOD_CROSS_RANK",), 0)
    _state.cross_size = _env_int(("HOROVOD_CROSS_SIZE",), max(1, world // _state.local_size))
    if os.environ.get("HOROVOD_TIMELINE"):  # horovodrun --timeline-filename's variable
        start_timeline(os.environ["HOROVOD_TIMELINE"])


def _c() -> Client:
    if _state.client is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return _state.client


def client() -> Client:
    """The parasync.Client under this API (metrics, eval log, stats)."""
    return _c()


def shutdown() -> None:
    """Leaves the cluster (no barrier or collective waits for this rank any more) and writes
    the metrics snapshot."""
    stop_timeline()
    if _state.client is not None:
        _state.client.finish()
        _state.client = None


def is_initialized() -> bool:
    return _state.client is not None


def size() -> int:
    return _c().num_workers


def rank() -> int:
    return _c().rank


def local_size() -> int:
    _c()
    return _state.local_size


def local_rank() -> int:
    _c()
    return _state.local_rank


def cross_size() -> int:
    _c()
    return _state.cross_size


def cross_rank() -> int:
    _c()
    return _state.cross_rank


def is_homogeneous() -> bool:
    return True


def _not_built() -> bool:
    """False: parasync moves tensors through its servers, not MPI, Gloo, NCCL, DDL, CCL or
    ROCm (Horovod's *_built and *_enabled queries)."""
    return False


mpi_threads_supported = mpi_enabled = mpi_built = gloo_enabled = gloo_built = _not_built
nccl_built = ddl_built = ccl_built = rocm_built = _not_built


def cuda_built() -> bool:
    return torch.cuda.is_available()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Records where every step of DistributedOptimizer goes (forward, backward, the push and
    the pull, the wait) in `file_path`, Chrome's trace-event JSON, on rank 0 as Horovod does;
    a path with "{rank}" is written by every rank, each its own (parasync.horovod_timeline).
    Also started by HOROVOD_TIMELINE=path at init. ``mark_cycles`` is accepted and ignored
    (parasync has no negotiation cycles)."""
    _c()
    stop_timeline()
    path = horovod_timeline.path_for(file_path, rank())
    if path is not None:
        _state.timeline = horovod_timeline.Timeline(path, rank())


def stop_timeline() -> None:
    """Closes start_timeline's file (a JSON array then)."""
    if _state.timeline is not None:
        _state.timeline.close()
        _state.timeline = None


def log_eval(epoch: int, test_accuracy: float, test_loss: float, **fields) -> None:
    """Rank 0: one row of <log-dir>/eval.jsonl, what tools/compare plots (parasync's own
    call; after DistributedOptimizer has registered the model)."""
    opt = next(iter(_DistributedOptimizer._live), None)
    if opt is not None:  # the script's optimizer and rate, not the servers' aggregation
        fields.setdefault("optimizer", type(opt._original).__name__)
        fields.setdefault("learning_rate", float(opt.param_groups[0]["lr"]))
    _c().log_eval(epoch, test_accuracy, test_loss, **fields)


# ---- process sets: not here ---------------------------------------------------------------
def _no_process_sets():
    raise errors.NotSupported("process sets: parasync runs one world per cluster; start a "
                              "second parasync-launch for a second group of workers")


class ProcessSet:
    def __init__(self, *_args, **_kwargs):
        _no_process_sets()


global_process_set = None


def add_process_set(*_args, **_kwargs):
    _no_process_sets()


def remove_process_set(*_args, **_kwargs):
    _no_process_sets()


def _check_process_set(process_set) -> None:
    if process_set is not None and process_set is not global_process_set:
        _no_process_sets()


# ---- compression --------------------------------------------------------------------------
class Compressor:
    """Horovod's interface: compress(tensor) -> (tensor, ctx); decompress(tensor, ctx)."""

    wire_dtype = "float32"

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class NoneCompressor(Compressor):
    pass


class _CastCompressor(Compressor):
    dtype = torch.float16

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.dtype:
            return tensor.to(cls.dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx) if ctx is not None else tensor


class FP16Compressor(_CastCompressor):
    """Tensors travel as float16 (half the bytes); DistributedOptimizer's gradients too."""

    dtype = torch.float16
    wire_dtype = "float16"


class BF16Compressor(_CastCompressor):
    """Tensors travel as bfloat16 (float32's range, half the bytes)."""

    dtype = torch.bfloat16
    wire_dtype = "bfloat16"


class Int8Compressor(Compressor):
    """parasync's own (Horovod has none): DistributedOptimizer's gradients travel as int8, a
    power-of-two scale per 128 elements (a quarter of float32's bytes), with error feedback
    both ways: each rank adds what its last push did not send to the next, and the servers
    do the same for the average they send back (sync). allreduce and the other collectives
    move their tensors as they are."""

    wire_dtype = "int8"


class Int4Compressor(Compressor):
    """parasync's own: as int8 with 4 bits an element (values -7..7 times the chunk's
    power-of-two scale, two to a byte: an eighth of float32's bytes), with error feedback
    both ways, so what one step rounds away goes with the next."""

    wire_dtype = "int4"


class TopKCompressor(Compressor):
    """parasync's own: DistributedOptimizer's gradients travel as top-k, of every 256
    elements the largest (1/32 of them: 8) in int8 with their indices, 17 bytes per 256
    (1/60 of float32's), with error feedback both ways as int8's. ``density(r)`` gives the
    compressor that sends a fraction ``r`` in (0, 1] instead (r * 256 elements of each 256,
    rounded, 1 to 255). allreduce and the other collectives move their tensors as they
    are."""

    wire_dtype = "topk"

    @classmethod
    def density(cls, r: float):
        if not isinstance(r, (int, float)) or not 0.0 < float(r) <= 1.0:
            raise errors.InvalidArgument(f"hvd.Compression.topk.density({r!r}): the fraction "
                                         "sent must be in (0, 1]")
        return type(f"TopKCompressor_{r}", (cls,), {"wire_dtype": f"topk:{float(r)!r}"})


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
    int8 = Int8Compressor
    int4 = Int4Compressor
    topk = TopKCompressor


# ---- the exchange and its encoding ---------------------------------------------------------
_DTYPES = {str(d): d for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                                torch.bool)}


def _encode(tensors: list[torch.Tensor]) -> bytes:
    """Tensors as bytes: for each, its dtype, shape and raw little-endian contents."""
    out = io.BytesIO()
    out.write(struct.pack("<I", len(tensors)))
    for t in tensors:
        if str(t.dtype) not in _DTYPES:
            raise errors.InvalidArgument(f"a collective of a {t.dtype} tensor (supported: "
                                         f"{', '.join(sorted(_DTYPES))})")
        host = t.detach().to("cpu").contiguous()
        raw = host.view(torch.int16) if host.dtype == torch.bfloat16 else host
        data = raw.numpy().tobytes()
        name = str(t.dtype).encode()
        out.write(struct.pack("<BB", len(name), host.dim()))
        out.write(name)
        out.write(struct.pack(f"<{host.dim()}q", *host.shape))
        out.write(struct.pack("<Q", len(data)))
        out.write(data)
    return out.getvalue()


def _decode(payload: bytes) -> list[torch.Tensor]:
    view = memoryview(payload)
    (count,) = struct.unpack_from("<I", view, 0)
    at = 4
    out = []
    for _ in range(count):
        name_len, dims = struct.unpack_from("<BB", view, at)
        at += 2
        dtype = _DTYPES.get(bytes(view[at:at + name_len]).decode(), None)
        if dtype is None:
            raise errors.Corruption("a collective's payload names an unknown dtype")
        at += name_len
        shape = struct.unpack_from(f"<{dims}q", view, at)
        at += 8 * dims
        (length,) = struct.unpack_from("<Q", view, at)
        at += 8
        raw_dtype = torch.int16 if dtype == torch.bfloat16 else dtype
        flat = torch.frombuffer(bytearray(view[at:at + length]), dtype=raw_dtype) \
            if length else torch.empty(0, dtype=raw_dtype)
        at += length
        t = flat.view(dtype) if dtype == torch.bfloat16 else flat
        out.append(t.reshape(shape))
    return out


def _key(kind: str, name: str | None) -> str:
    if name is None:
        _state.unnamed += 1
        return f"{kind}.noname.{_state.unnamed}"
    return f"{kind}.{name}"


def _not_joined(what: str) -> None:
    if _state.joined:
        raise errors.FailedPrecondition(
            f"{what} after hvd.join(): join ends this rank's training (no step or collective "
            "waits for it any more); call collectives before join, and only hvd.shutdown() "
            "after it")


def _leave_joining(what: str) -> None:
    """A restarted worker about to train or take part in a collective outside
    hvd.elastic.run: in sync modes it cannot come back so (it stops with one line); in async
    and ssp it rejoins at once, from the servers' parameters."""
    if not _state.joining:
        return
    c = _c()
    if c.mode.startswith("sync"):
        raise errors.FailedPrecondition(
            f"{what}: rank {c.rank} was restarted into a running {c.mode} job "
            "(PARASYNC_RESTART); a restarted worker comes back into a sync job through "
            "hvd.elastic.run (TorchState, ElasticSampler, state.commit()), which this script "
            "does not use: it stops here, and the others go on without it")
    c.log(f"rank {c.rank} restarted into the running {c.mode} job without hvd.elastic: it "
          "trains on from the servers' parameters with a fresh optimizer state and its data "
          "from the start (what its predecessor trained is trained again)", "warn")
    c.set_joining(False)
    _state.joining = False


def _gather(key: str, payload: bytes, internal: bool = False) -> list[bytes | None]:
    """Every live rank's payload under `key` (this process's next round of it), by rank.
    `internal`: hvd.elastic's own exchanges, which a joining rank takes part in."""
    c = _c()
    _not_joined(f"hvd collective {key!r}")
    if not internal:
        _leave_joining(f"hvd collective {key!r}")
    rnd = _state.rounds.get(key, 0) + 1
    _state.rounds[key] = rnd
    return c.gather(key, rnd, payload)


class Handle:
    """What an *_async call returns: already complete (parasync's collectives finish in the
    call), so synchronize(handle) returns the result and poll(handle) is True."""

    def __init__(self, result):
        self.result = result


def synchronize(handle: Handle):
    """The result of an *_async collective."""
    if not isinstance(handle, Handle):
        raise errors.InvalidArgument("synchronize() takes a handle from an *_async call")
    return handle.result


def poll(handle: Handle) -> bool:
    return True


# ---- allreduce ----------------------------------------------------------------------------
def _resolve_op(average, op) -> int:
    if average is not None and op is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if op is None:
        op = Average if average is None or average else Sum
    if op == Adasum:
        raise errors.NotSupported("op=hvd.Adasum: parasync reduces with Average, Sum, Min, Max "
                                  "or Product; use hvd.Average")
    if op not in _OP_NAMES:
        raise errors.InvalidArgument(f"unknown reduction op {op!r}")
    return op


def _reduce(parts: list[torch.Tensor], op: int) -> torch.Tensor:
    """The parts (one per contributing rank, in rank order) reduced in that order."""
    acc = parts[0].clone()
    for p in parts[1:]:
        if p.shape != acc.shape or p.dtype != acc.dtype:
            raise errors.FailedPrecondition(
                f"allreduce of mismatched tensors across ranks: {tuple(acc.shape)} {acc.dtype} "
                f"and {tuple(p.shape)} {p.dtype}")
        if op in (Average, Sum):
            acc = acc + p
        elif op == Min:
            acc = torch.minimum(acc, p)
        elif op == Max:
            acc = torch.maximum(acc, p)
        else:
            acc = acc * p
    if op == Average:
        n = len(parts)
        acc = acc / n if acc.dtype.is_floating_point else torch.div(acc, n, rounding_mode="floor")
    return acc


def _grouped(tensors: list[torch.Tensor], kind: str, name, op, compression, prescale,
             postscale) -> list[torch.Tensor]:
    compressed, contexts = [], []
    for t in tensors:
        if prescale != 1.0:
            t = t * prescale
        c, ctx = compression.compress(t)
        compressed.append(c)
        contexts.append(ctx)
    results = _gather(_key(kind, name), _encode(compressed))
    parts = [_decode(p) for p in results if p is not None]
    if len(parts) == 0:
        raise errors.Internal("a collective answered with no rank's payload")
    out = []
    for i, t in enumerate(tensors):
        reduced = _reduce([p[i] for p in parts], op)
        if postscale != 1.0:
            reduced = reduced * postscale
        reduced = compression.decompress(reduced, contexts[i])
        out.append(reduced.to(device=t.device, dtype=t.dtype))
    return out


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """The reduction (Average by default, Sum, Min, Max, Product) of ``tensor`` over every
    live rank, as a new tensor on its device."""
    _check_process_set(process_set)
    op = _resolve_op(average, op)
    return _grouped([tensor], "allreduce", name, op, compression, prescale_factor,
                    postscale_factor)[0]


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """allreduce in place: ``tensor`` holds the result."""
    result = allreduce(tensor, average, name, Compression.none, op, prescale_factor,
                       postscale_factor, process_set)
    with torch.no_grad():
        tensor.copy_(result)
    return tensor


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set) -> Handle:
    return Handle(allreduce(tensor, average, name, Compression.none, op, prescale_factor,
                            postscale_factor, process_set))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set) -> Handle:
    return Handle(allreduce_(tensor, average, name, op, prescale_factor, postscale_factor,
                             process_set))


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    """allreduce of a list of tensors in one exchange."""
    _check_process_set(process_set)
    op = _resolve_op(average, op)
    return _grouped(list(tensors), "grouped_allreduce", name, op, compression, prescale_factor,
                    postscale_factor)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    tensors = list(tensors)
    results = grouped_allreduce(tensors, average, name, Compression.none, op, prescale_factor,
                                postscale_factor, process_set)
    with torch.no_grad():
        for t, r in zip(tensors, results):
            t.copy_(r)
    return tensors


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> Handle:
    return Handle(grouped_allreduce(tensors, average, name, Compression.none, op,
                                    prescale_factor, postscale_factor, process_set))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set) -> Handle:
    return Handle(grouped_allreduce_(tensors, average, name, op, prescale_factor,
                                     postscale_factor, process_set))


# ---- allgather, broadcast -----------------------------------------------------------------
def allgather(tensor, name=None, process_set=global_process_set):
    """Every live rank's ``tensor`` concatenated along dimension 0, in rank order (the first
    dimension may differ between ranks, the others must agree)."""
    _check_process_set(process_set)
    results = _gather(_key("allgather", name), _encode([tensor]))
    parts = [_decode(p)[0] for p in results if p is not None]
    for p in parts[1:]:
        if p.shape[1:] != parts[0].shape[1:] or p.dtype != parts[0].dtype:
            raise errors.FailedPrecondition(
                f"allgather of mismatched tensors: {tuple(parts[0].shape)} {parts[0].dtype} "
                f"and {tuple(p.shape)} {p.dtype}")
    return torch.cat([p.reshape(-1, *parts[0].shape[1:]) if p.dim() else p.reshape(1)
                      for p in parts]).to(tensor.device)


def allgather_async(tensor, name=None, process_set=global_process_set) -> Handle:
    return Handle(allgather(tensor, name, process_set))


# A broadcast's payload travels in parts of at most this many bytes (the first part says how
# many bytes there are), so the servers' --max-gather-bytes bounds a round, not a model.
_PART_BYTES = 4 << 20


def _from_root(kind: str, name, payload_if_root, root_rank: int,
               internal: bool = False) -> bytes:
    c = _c()
    if not 0 <= root_rank < c.num_workers:
        raise errors.InvalidArgument(f"root_rank {root_rank} is not a rank of this world of "
                                     f"{c.num_workers}")
    key = _key(kind, name)
    payload = payload_if_root() if c.rank == root_rank else b""
    first = struct.pack("<Q", len(payload)) + payload[:_PART_BYTES] \
        if c.rank == root_rank else b""
    results = _gather(key, first, internal)
    if results[root_rank] is None:
        raise errors.Unavailable(f"{kind}: the root rank {root_rank} took no part (dead or "
                                 "departed)")
    (length,) = struct.unpack_from("<Q", results[root_rank], 0)
    parts = [results[root_rank][8:]]
    received = len(parts[0])
    part = 1
    while received < length:
        chunk = payload[part * _PART_BYTES:(part + 1) * _PART_BYTES] \
            if c.rank == root_rank else b""
        results = _gather(f"{key}.part{part}", chunk, internal)
        if results[root_rank] is None:
            raise errors.Unavailable(f"{kind}: the root rank {root_rank} left during the "
                                     "broadcast")
        parts.append(results[root_rank])
        received += len(results[root_rank])
        part += 1
    return b"".join(parts)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Rank ``root_rank``'s ``tensor``, as a new tensor on this rank's device."""
    _check_process_set(process_set)
    value = _decode(_from_root("broadcast", name, lambda: _encode([tensor]), root_rank))[0]
    if value.shape != tensor.shape:
        raise errors.FailedPrecondition(f"broadcast: the root's tensor is {tuple(value.shape)}, "
                                        f"this rank's {tuple(tensor.shape)}")
    return value.to(device=tensor.device, dtype=tensor.dtype)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    value = broadcast(tensor, root_rank, name, process_set)
    with torch.no_grad():
        tensor.copy_(value)
    return tensor


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    return Handle(broadcast(tensor, root_rank, name, process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    return Handle(broadcast_(tensor, root_rank, name, process_set))


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Rank ``root_rank``'s ``obj`` (pickled; tensors in it too), on every rank."""
    _check_process_set(process_set)

    def pickled():
        out = io.BytesIO()
        torch.save(obj, out)
        return out.getvalue()

    data = _from_root("broadcast_object", name, pickled, root_rank)
    return torch.load(io.BytesIO(data), map_location="cpu")


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Every live rank's ``obj``, in rank order."""
    _check_process_set(process_set)
    out = io.BytesIO()
    torch.save(obj, out)
    results = _gather(_key("allgather_object", name), out.getvalue())
    return [torch.load(io.BytesIO(r), map_location="cpu") for r in results if r is not None]


def _gather_object(obj, name: str) -> list:
    """hvd.elastic's allgather_object: every taking part rank's ``obj``, in rank order."""
    out = io.BytesIO()
    torch.save(obj, out)
    results = _gather(_key("allgather_object", name), out.getvalue(), internal=True)
    return [torch.load(io.BytesIO(r), map_location="cpu") for r in results if r is not None]


def barrier(process_set=global_process_set) -> None:
    """Returns once every live rank has called it."""
    _check_process_set(process_set)
    _gather("barrier", b"")


def join(device=-1) -> int:
    """This rank has no more data: from now on no sync step, staleness bound or collective
    of the other ranks waits for it (Horovod's uneven-data join). Blocks until every rank
    has joined (or finished, or been declared dead) and returns the last rank to join, as
    this rank's polling of the servers saw it (ties: the highest rank). parasync's join ends
    the rank's training: a step or collective after it raises FailedPrecondition (call them
    before), hvd.shutdown() follows. ``device`` is accepted for Horovod's signature."""
    c = _c()
    if _state.joined:
        raise errors.FailedPrecondition("hvd.join() called twice")
    me = c.rank
    c.leave()
    _state.joined = True
    first_seen_done: dict[int, int] = {}  # rank -> the poll that first saw it done
    logged, polls = False, 0
    while True:
        live = set(c.live_ranks())
        for r in range(c.num_workers):
            if r != me and r not in live and r not in first_seen_done:
                first_seen_done[r] = polls
        waiting = sorted(live - {me})
        if not waiting:
            break
        if stop_requested():
            raise errors.Aborted("hvd.join(): stopped while ranks "
                                 f"{', '.join(map(str, waiting))} were still training")
        if not logged:
            c.log(f"hvd.join(): rank {me} waits for rank(s) {', '.join(map(str, waiting))} "
                  "to join")
            logged = True
        c.beat()
        time.sleep(0.05)
        polls += 1
    if not first_seen_done or max(first_seen_done.values()) == 0:
        return me  # every other rank had joined before this one
    last = max(first_seen_done.values())
    return max(r for r, p in first_seen_done.items() if p == last)


def alltoall(*_args, **_kwargs):
    raise errors.NotSupported("hvd.alltoall: use allgather and keep your share")


def reducescatter(*_args, **_kwargs):
    raise errors.NotSupported("hvd.reducescatter: use allreduce and keep your share")


def _named(params) -> list[tuple[str, torch.Tensor]]:
    if isinstance(params, dict):
        return sorted(params.items())
    items = list(params)
    if items and isinstance(items[0], tuple):
        return items
    return [(str(i), p) for i, p in enumerate(items)]


def _restarted_async() -> bool:
    """A worker restarted into a running async or ssp job, not through hvd.elastic: the
    start-of-run broadcasts it calls again have no partner (the others did theirs long ago)."""
    return _state.joining and not _c().mode.startswith("sync")


def broadcast_parameters(params, root_rank: int) -> None:
    """Rank ``root_rank``'s values into ``params`` on every rank, in place: a state_dict(),
    named_parameters() or a list of (name, tensor) — in one exchange."""
    if _restarted_async():
        return  # its DistributedOptimizer takes the servers' parameters
    named = [(n, p) for n, p in _named(params) if p is not None]
    data = _from_root("broadcast_parameters", None,
                      lambda: _encode([p.detach() for _, p in named]), root_rank)
    values = _decode(data)
    if len(values) != len(named):
        raise errors.FailedPrecondition(f"broadcast_parameters: the root sent {len(values)} "
                                        f"tensors for this rank's {len(named)}")
    with torch.no_grad():
        for (n, p), v in zip(named, values):
            if v.shape != p.shape:
                raise errors.FailedPrecondition(f"broadcast_parameters: {n} is {tuple(v.shape)} "
                                                f"on the root, {tuple(p.shape)} here")
            p.copy_(v)


def broadcast_optimizer_state(optimizer, root_rank: int, model=None) -> None:
    """Rank ``root_rank``'s optimizer state (its param_groups' settings, learning rates
    included, and per-parameter state such as momentum buffers) into ``optimizer`` on every
    rank. Rank 0's optimizer must hold the same parameters in the same order."""
    if _restarted_async():
        return  # a fresh optimizer state: the others' start-of-run broadcast is long over
    state = broadcast_object(optimizer.state_dict() if rank() == root_rank else None, root_rank,
                             name="broadcast_optimizer_state")
    if rank() != root_rank:
        optimizer.load_state_dict(state)  # a DistributedOptimizer's shares it with its own


# ---- the optimizer ------------------------------------------------------------------------
def _batch_hook(module, args):
    """A global forward pre-hook: the first module called in training after a step is the
    model; its first argument's leading dimension counts the examples of the step (for
    examples/sec; evaluations under torch.no_grad() or in eval mode do not count)."""
    if not torch.is_grad_enabled() or not module.training:
        return  # an evaluation, not a training step's forward
    for opt in list(_DistributedOptimizer._live):
        if opt._forward_examples is None and args and isinstance(args[0], torch.Tensor) \
                and args[0].dim() > 0:
            opt._forward_examples = int(args[0].shape[0])


class _DistributedOptimizer(torch.optim.Optimizer):
    _live: list = []

    def _parasync_init(self, original, named_parameters, compression, backward_passes_per_step,
                       op, gradient_predivide_factor):
        c = _c()
        self._original = original
        self._client = c
        self._compression = compression
        self._op = _resolve_op(None, op)
        if self._op not in (Average, Sum):
            raise errors.NotSupported(f"DistributedOptimizer(op={_OP_NAMES[self._op]}): "
                                      "gradients are averaged (hvd.Average) or summed (hvd.Sum)")
        if backward_passes_per_step < 1:
            raise errors.InvalidArgument("backward_passes_per_step must be at least 1")
        self._passes_per_step = int(backward_passes_per_step)
        self._predivide = float(gradient_predivide_factor)
        if self._predivide != 1.0 and self._op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(n, tuple) for n in named):
                raise ValueError("named_parameters should be a sequence of tuples (name, "
                                 "parameter), usually produced by model.named_parameters().")
            names = {id(p): n for n, p in named}
            dups = {n for n, _ in named if [m for m, _ in named].count(n) > 1}
            if dups:
                raise ValueError(f"Parameter names in named_parameters must be unique. Found "
                                 f"duplicates: {', '.join(sorted(dups))}")
            missing = [p for p in params if id(p) not in names]
            if missing:
                raise ValueError("named_parameters was specified, but one or more model "
                                 "parameters were not named. Python object ids: "
                                 f"{', '.join(str(id(p)) for p in missing)}")
        else:
            names = {id(p): f"allreduce.noname.{i}" for i, p in enumerate(params)}
        seen = set()
        self._params = [p for p in params if not (id(p) in seen or seen.add(id(p)))]
        self._names = [names[id(p)] for p in self._params]
        for n, p in zip(self._names, self._params):
            if p.dtype != torch.float32:
                raise errors.InvalidArgument(f"parameter {n} is {p.dtype}: parasync moves "
                                             "float32 parameters (keep the master weights in "
                                             "float32, as torch.cuda.amp does)")
        self._mode = c.mode
        self._sync = self._mode.startswith("sync")
        # sync:delayed: each step's exchange runs behind the next step's forward and backward;
        # the average applied is the step before's (see _synchronize_delayed).
        self._delayed = self._mode == "sync:delayed"
        self._in_flight = False
        if compression.wire_dtype != "float32":
            c.set_wire_dtype(compression.wire_dtype)
        variables = [Variable(n, tuple(p.shape) or (1,), "zeros" if self._sync else "provided")
                     for n, p in zip(self._names, self._params)]
        initial = None
        if not self._sync and c.is_chief:
            initial = [np.ascontiguousarray(p.detach().cpu().numpy(), dtype=np.float32)
                       for p in self._params]
        if c.settings.lr_schedule not in ("constant", "", None):
            raise errors.InvalidArgument(
                f"--lr-schedule {c.settings.lr_schedule}: with parasync.horovod the script's "
                "own torch.optim.lr_scheduler sets the learning rate; launch without "
                "--lr-schedule")
        c.register(variables, optimizer="aggregate" if self._sync else "delta", lr=1.0,
                   seed=c.settings.seed or 42, name="horovod",
                   description='{"framework": "pytorch", "api": "horovod"}',
                   initial_values=initial, cosine_decay_examples=0)
        self._on_gpu = any(p.device.type == "cuda" for p in self._params)
        pin = torch.cuda.is_available()
        # Host buffers: what the servers answer (sync: the averaged gradients; async: the
        # parameters) and what this rank pushes (its gradients, or its optimizer's deltas).
        self._pulled = [torch.empty(p.numel(), dtype=torch.float32, pin_memory=pin).numpy()
                        for p in self._params]
        self._pushed = [torch.empty(p.numel(), dtype=torch.float32, pin_memory=pin).numpy()
                        for p in self._params]
        # sync:delayed: where the exchange in flight writes its average.
        self._next = ([torch.empty(p.numel(), dtype=torch.float32, pin_memory=pin).numpy()
                       for p in self._params] if self._delayed else [])
        self._handed = [False] * len(self._params)
        self._staged = [None] * len(self._params)
        self._passes = [0] * len(self._params)
        self._hooks = (None, None)  # a step's first and last gradient hook (the timeline's)
        self._steps = 0
        self._open = False
        self._synchronized = False
        self._should_synchronize = True
        self._forward_examples = None
        self._last_step_end = time.monotonic()
        self._examples_default = c.settings.batch_size
        if not self._sync:
            # Every rank starts from the servers' parameters (rank 0's).
            c.pull(self._pulled)
            self._copy_pulled_to_params()
        self._accumulators = []
        if self._sync:
            for i, p in enumerate(self._params):
                if p.requires_grad:
                    accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
                    accumulator.register_hook(self._make_hook(i))
                    self._accumulators.append(accumulator)
        _DistributedOptimizer._live.append(self)
        if _state.batch_hook is None and hasattr(torch.nn.modules.module,
                                                 "register_module_forward_pre_hook"):
            _state.batch_hook = torch.nn.modules.module.register_module_forward_pre_hook(
                _batch_hook)

    # ---- buffers -----------------------------------------------------------------------------
    def _copy_pulled_to_params(self) -> None:
        with torch.no_grad():
            for p, host in zip(self._params, self._pulled):
                p.copy_(torch.from_numpy(host).view_as(p), non_blocking=True)
        if self._on_gpu:
            torch.cuda.current_stream().synchronize()

    def _own_grad(self, i: int) -> np.ndarray | None:
        """p.grad's own memory as a flat float32 array, for the push to read and the average
        to be written back into without a copy: a contiguous float32 gradient on the CPU
        (None otherwise: on a GPU, or sparse, the host buffers carry it)."""
        g = self._params[i].grad
        if (g is None or g.device.type != "cpu" or g.dtype != torch.float32 or
                g.layout != torch.strided or not g.is_contiguous()):
            return None
        return g.detach().view(-1).numpy()

    def _stage_gradient(self, i: int) -> np.ndarray:
        """What this rank pushes for parameter i: p.grad itself where it can be read in place (see
        _own_grad), else p.grad (zeros when it has none), pre-divided, in the push buffer.
        Kept referenced until the step's push is settled (step_finish)."""
        if self._predivide == 1.0:
            own = self._own_grad(i)
            if own is not None:
                self._staged[i] = own
                return own
        return self._stage_copy(i)

    def _examples(self) -> int:
        n = self._forward_examples or self._client.next_step_examples or self._examples_default
        return int(n) if n else 1

    # ---- sync: gradients out as backward makes them ------------------------------------------
    def _make_hook(self, i: int):
        def hook(*_):
            self._on_gradient(i)
        return hook

    def _on_gradient(self, i: int) -> None:
        if self._handed[i] or self._passes[i] >= self._passes_per_step:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call "
                "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
        self._passes[i] += 1
        if self._passes[i] < self._passes_per_step:
            return
        if _state.timeline is not None:
            now = time.monotonic()
            self._hooks = (self._hooks[0] or now, now)
        if self._delayed:
            return  # the step before's exchange is still out: all goes at synchronize()
        if not self._open:
            _not_joined("a gradient's push (backward)")
            self._before_push("a gradient's push (backward)")
            self._client.step_begin(self._examples())
            self._open = True
        self._client.step_gradient(i, self._stage_gradient(i))
        self._handed[i] = True

    def synchronize(self) -> None:
        """sync: sends what backward's hooks have not sent yet, waits for the step's average
        over the live ranks and writes it into every p.grad (times size() for hvd.Sum). async
        and ssp: nothing to wait for (each worker steps on its own gradient, and step() pushes
        the change)."""
        if not self._sync:
            self._synchronized = True
            return
        if self._synchronized:
            return
        _not_joined("optimizer.synchronize()")
        if self._delayed:
            self._synchronize_delayed()
            return
        called = time.monotonic()
        c = self._client
        try:
            if not self._open:
                self._before_push("optimizer.synchronize()")
                c.step_begin(self._examples())
                self._open = True
            for i in range(len(self._params)):
                if not self._handed[i]:
                    c.step_gradient(i, self._stage_gradient(i))
            # The average lands in p.grad itself where it can (the push read from there and
            # is settled before step_finish writes anything), else in the host buffer.
            into = [self._own_grad(i) if p.requires_grad else None
                    for i, p in enumerate(self._params)]
            into = [own if own is not None else host for own, host in zip(into, self._pulled)]
            times = c.step_finish(into)
        finally:
            self._open = False
            self._handed = [False] * len(self._params)
            self._staged = [None] * len(self._params)
            self._passes = [0] * len(self._params)
        self._average_into_grads(into)
        self._synchronized_now(called, times, times.push_seconds, times.pull_seconds)

    def _average_into_grads(self, into=None) -> None:
        """The step's average into every p.grad (from the host buffer where `into` does not
        say it already landed there), times size() for hvd.Sum and the predivide factor."""
        scale = (size() if self._op == Sum else 1.0) * self._predivide
        with torch.no_grad():
            for i, (p, host) in enumerate(zip(self._params, self._pulled)):
                if not p.requires_grad:
                    continue  # frozen: its optimizer skips it (grad None), as Horovod's
                if into is None or into[i] is host:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    p.grad.copy_(torch.from_numpy(host).view_as(p), non_blocking=True)
                if scale != 1.0:
                    p.grad.mul_(scale)
        if self._on_gpu:
            torch.cuda.current_stream().synchronize()

    def _synchronized_now(self, called: float, times, push: float, pull: float) -> None:
        """synchronize() is done: the timeline's row (when the step exchanged) and the
        step's figures."""
        self._synchronized = True
        if _state.timeline is not None and times is not None:
            first, last = self._hooks
            self._trace(times, [("optimizer + forward", self._last_step_end, first),
                                ("backward", first, last),
                                ("synchronize", called, time.monotonic())])
        self._record(called, push, pull)

    def _synchronize_delayed(self) -> None:
        """sync:delayed: waits for the step before's exchange, hands this step's gradients to
        the next one (which runs while the script goes on to the next forward and backward)
        and writes the step before's average into every p.grad: each update applies the
        average of gradients one step old, the same on every rank. The first step has none
        (every p.grad None: the optimizer leaves the parameters as they are), and the last
        step's average is not applied: N steps make N - 1 updates."""
        called = time.monotonic()
        c = self._client
        times = None
        if self._in_flight:
            self._in_flight = False
            try:
                times = c.step_wait()
            finally:
                self._pulled, self._next = self._next, self._pulled
        try:
            self._before_push("optimizer.synchronize()")
            c.step_begin(self._examples())
            for i in range(len(self._params)):
                c.step_gradient(i, self._stage_copy(i))
            if self._on_gpu:
                torch.cuda.current_stream().synchronize()
            c.step_launch(self._next)
            self._in_flight = True
        finally:
            self._handed = [False] * len(self._params)
            self._staged = [None] * len(self._params)
            self._passes = [0] * len(self._params)
        if times is None:
            for p in self._params:
                p.grad = None  # the first step: no average yet
        else:
            self._average_into_grads()
        waited = time.monotonic() - called
        whole = (times.push_seconds + times.pull_seconds) if times is not None else 0.0
        pull = waited * times.pull_seconds / whole if whole > 0 else 0.0
        self._synchronized_now(called, times, waited - pull, pull)

    def _stage_copy(self, i: int) -> np.ndarray:
        """p.grad (zeros when it has none), pre-divided, copied into the push buffer: the
        exchange reads it after synchronize() returns, while p.grad takes the average."""
        p, out = self._params[i], torch.from_numpy(self._pushed[i])
        if p.grad is None:
            out.zero_()
        else:
            out.copy_(p.grad.detach().reshape(-1))
            if self._predivide != 1.0:
                out.div_(self._predivide)
        self._staged[i] = self._pushed[i]
        return self._pushed[i]

    def _before_push(self, what: str) -> None:
        """A restarted rank outside hvd.elastic comes back now (or stops, in sync); the push
        reports where the state's ElasticSampler is (the servers keep it per rank)."""
        _leave_joining(what)
        if _state.sampler is not None:
            self._client.set_progress(*_state.sampler.progress())

    def _trace(self, times, spans) -> None:
        """The step's row in the timeline (start_timeline): `spans` on the training thread,
        the push and the pull from the client's own clock."""
        end = time.monotonic()
        push_start = times.first_push_sent if times.early_pushes else times.pushes_acked - \
            times.push_seconds
        _state.timeline.step(self._steps, self._last_step_end, end, spans,
                             (push_start, times.pushes_acked), (times.pushes_acked, times.pulled),
                             examples=self._examples(), early_pushes=times.early_pushes)
        self._hooks = (None, None)

    def _record(self, called: float, push: float, pull: float) -> None:
        done = time.monotonic()
        compute = max(0.0, called - self._last_step_end)
        self._client.record_step(self._examples(), None, pull, compute, push)
        self._last_step_end = done
        self._steps += 1
        self._forward_examples = None

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside it does not synchronize: for a script that called synchronize()
        itself (to clip or unscale the averaged gradients first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        _not_joined("optimizer.step()")
        # A scheduler made for the wrapped optimizer counts its steps (and warns without).
        if hasattr(self._original, "_step_count"):
            self._original._step_count += 1
        if self._sync:
            if self._should_synchronize:
                if self._synchronized:
                    warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                                  "context after optimizer.synchronize(). This can cause "
                                  "training slowdown. You may want to consider using "
                                  "optimizer.skip_synchronize() context if you use "
                                  "optimizer.synchronize() in your code.")
                self.synchronize()
            self._synchronized = False
            return super(self.__class__, self).step(closure)
        return self._step_delta(closure)

    def _step_delta(self, closure):
        """async / ssp: steps the local optimizer, pushes the change it made and takes the
        servers' parameters (which hold every worker's changes)."""
        called = time.monotonic()
        with torch.no_grad():
            before = [p.detach().clone() for p in self._params]
        loss = super(self.__class__, self).step(closure)
        stepped = time.monotonic()
        c = self._client
        with torch.no_grad():
            for i, (p, b) in enumerate(zip(self._params, before)):
                torch.from_numpy(self._pushed[i]).copy_((p.detach() - b).reshape(-1))
        self._before_push("optimizer.step()")
        c.step_begin(self._examples())
        try:
            for i in range(len(self._params)):
                c.step_gradient(i, self._pushed[i])
        finally:
            times = c.step_finish(self._pulled)
        self._copy_pulled_to_params()
        self._synchronized = False
        if _state.timeline is not None:
            self._trace(times, [("forward + backward", self._last_step_end, called),
                                ("optimizer", called, stepped),
                                ("exchange", stepped, time.monotonic())])
        self._record(called, times.push_seconds, times.pull_seconds)
        return loss

    def load_state_dict(self, state_dict):
        """torch's load (it makes the state and param_groups anew), shared again with the
        wrapped optimizer, which a scheduler made for it reads."""
        super(self.__class__, self).load_state_dict(state_dict)
        self._original.state = self.state
        self._original.param_groups = self.param_groups

    def zero_grad(self, set_to_none: bool = False):
        if any(self._handed) and not self._synchronized:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(set_to_none)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """``optimizer`` made distributed, as Horovod's: an instance of the same optimizer class,
    over the same parameter groups (schedulers made for ``optimizer`` keep working), whose
    step() first averages the gradients over the live ranks (sync), or pushes the change it
    made (async, ssp). Registers the model's parameters with the servers (by their names in
    ``named_parameters``). ``num_groups`` and ``groups`` are accepted and change nothing:
    each server's share of the gradients already goes out as one message."""
    _check_process_set(process_set)
    if op == Adasum:
        raise errors.NotSupported("DistributedOptimizer(op=hvd.Adasum): use hvd.Average")
    if not isinstance(compression, type) or not issubclass(compression, Compressor):
        if not hasattr(compression, "wire_dtype"):
            raise errors.InvalidArgument("compression must be hvd.Compression.none, .fp16, "
                                         ".bf16, .int8, .int4 or .topk")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    distributed = cls.__new__(cls)
    torch.optim.Optimizer.__init__(distributed, optimizer.param_groups, optimizer.defaults)
    distributed.state = optimizer.state  # the state broadcast or loaded into it stays
    distributed.__class__._parasync_init(distributed, optimizer, named_parameters, compression,
                                         backward_passes_per_step, op,
                                         gradient_predivide_factor)
    return distributed


# ---- SyncBatchNorm ------------------------------------------------------------------------
class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Batch normalization whose batch statistics are those of every live rank's batch
    together (training); evaluation uses the running statistics, as torch's. The statistics
    are allreduced in the forward pass and the gradients of the mean and variance in the
    backward pass."""

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D input)")

    def forward(self, x):
        self._check_input_dim(x)
        if not self.training:
            return super().forward(x)
        return _SyncBatchNormFunction.apply(x, self.weight, self.bias, self.running_mean,
                                            self.running_var, self.eps, self.momentum
                                            if self.momentum is not None else 0.1)


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum):
        dims = [0] + list(range(2, x.dim()))
        count = torch.tensor([x.numel() / x.shape[1]], dtype=torch.float64)
        local_sum = x.sum(dim=dims).double()
        local_sq = (x.double() * x.double()).sum(dim=dims)
        total, sq, n = grouped_allreduce([local_sum, local_sq, count], op=Sum)
        mean = total / n
        var = sq / n - mean * mean
        if running_mean is not None:
            with torch.no_grad():
                unbiased = var * n / max(1.0, float(n) - 1.0)
                running_mean.mul_(1 - momentum).add_(momentum * mean.to(running_mean.dtype))
                running_var.mul_(1 - momentum).add_(momentum * unbiased.to(running_var.dtype))
        shape = [1, -1] + [1] * (x.dim() - 2)
        invstd = torch.rsqrt(var + eps).to(x.dtype)
        mean = mean.to(x.dtype)
        xhat = (x - mean.view(shape)) * invstd.view(shape)
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.count = float(n)
        ctx.dims = dims
        out = xhat
        if weight is not None:
            out = out * weight.view(shape) + bias.view(shape)
        return out

    @staticmethod
    def backward(ctx, grad):
        xhat, weight, invstd = ctx.saved_tensors
        dims, shape = ctx.dims, [1, -1] + [1] * (grad.dim() - 2)
        g = grad * weight.view(shape) if weight is not None else grad
        sum_g, sum_gx = grouped_allreduce([g.sum(dim=dims).double(),
                                           (g * xhat).sum(dim=dims).double()], op=Sum)
        n = ctx.count
        mean_g = (sum_g / n).to(grad.dtype).view(shape)
        mean_gx = (sum_gx / n).to(grad.dtype).view(shape)
        grad_x = (g - mean_g - xhat * mean_gx) * invstd.view(shape)
        grad_w = (grad * xhat).sum(dim=dims) if weight is not None else None
        grad_b = grad.sum(dim=dims) if weight is not None else None
        return grad_x, grad_w, grad_b, None, None, None, None


from . import horovod_elastic as elastic  # noqa: E402  (hvd.elastic; it imports this module)
