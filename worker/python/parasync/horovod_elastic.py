"""hvd.elastic on parasync: a worker killed mid-run comes back into the running job.

Horovod's elastic API, as a Horovod elastic script uses it::

    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=42)
    loader = torch.utils.data.DataLoader(train_set, batch_size=64, sampler=sampler)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            state.sampler.set_epoch(state.epoch)         # (a new epoch: nothing processed)
            for state.batch, (x, y) in enumerate(loader):
                ...; optimizer.step()
                if state.batch % 20 == 0:
                    state.commit()
            state.batch = 0
    train(state)

What differs from Horovod is what a failure does. Horovod stops every worker, rolls them back
to the last commit and restarts the world. On parasync the others never stop: a dead worker
is left out of steps and collectives once the servers declare it dead (--worker-timeout), and
the launcher's restart (--kill worker:I@S+R, or a supervisor) starts it again with
PARASYNC_RESTART set. The restarted process is *joining*: the servers do not count it live,
so nobody waits for it, until the next state.commit() of the others — a collective, as
Horovod's is — admits it. Then every rank leaves its train function (HostsUpdatedInterrupt),
takes rank 0's state (model, optimizer, the state's other attributes; when rank 0 is the one
restarted, the lowest other rank's) and, with
it, the data still to train: every ElasticSampler counts what each rank has trained in this
epoch (the restarted rank's predecessor's count is what the servers recorded from its pushes,
so the batches it pushed before dying are not trained again), and splits the rest of the
epoch evenly over the ranks (padded as Horovod's is, to a whole number per rank: at most
size()-1 examples twice). train(state) then runs again, from state.epoch. The examples are
each applied once, up to that padding and the batch the dead worker was computing.

One ElasticSampler of the state is the data the DistributedOptimizer's pushes report their
position in (the first one the state holds): the servers keep each rank's position, which is
how a restarted rank knows where its predecessor stopped. Read it with a DataLoader that does
not prefetch (num_workers=0): a prefetching loader's position runs ahead of the pushes.
"""

from __future__ import annotations

import copy
import functools
import io
import math

import torch

from . import errors


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by State.commit() on every rank when the commit admitted a restarted worker:
    elastic.run catches it, syncs every rank to the lowest not-joining rank's state and calls
    the function again."""

    def __init__(self, skip_sync: bool = False):
        super().__init__("a restarted worker was admitted back into the run")
        self.skip_sync = skip_sync


def _hvd():
    from . import horovod
    return horovod


COMMIT_KEY = "parasync.elastic.commit"


# ---- data ---------------------------------------------------------------------------------
class ElasticSampler(torch.utils.data.Sampler):
    """This rank's share of ``dataset`` for the epoch (set_epoch), shuffled by ``seed`` and
    the epoch, as DistributedSampler's; after a restarted rank is admitted back, the share of
    what the epoch has left. Horovod's ElasticSampler's interface: set_epoch, record_batch,
    record_indices, state_dict, load_state_dict."""

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0):
        hvd = _hvd()
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = int(seed)
        self.epoch = 0
        self.processed: set[int] = set()  # this epoch's indices trained before the last reset
        self.position = 0  # indices of this rank's share yielded since the last reset
        self._rank = hvd.rank()
        self._size = hvd.size()
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """A new epoch: nothing of it is trained yet. The epoch it is at already changes
        nothing (a function run again after a sync may call it at its top)."""
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self.processed = set()
            self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Horovod's bookkeeping call; parasync counts what the loader took (nothing to do)."""

    def record_indices(self, indices) -> None:
        """Horovod's bookkeeping call; parasync counts what the loader took (nothing to do)."""

    def share_of(self, rank: int) -> list[int]:
        """Rank ``rank``'s indices since the last reset: what the epoch has left, shuffled by
        seed and epoch, padded to a multiple of size() with its own first indices, every
        size()-th from ``rank``."""
        remaining = [i for i in range(len(self.dataset)) if i not in self.processed]
        if self.shuffle and remaining:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(remaining), generator=g).tolist()
            remaining = [remaining[k] for k in order]
        if remaining:
            total = math.ceil(len(remaining) / self._size) * self._size
            remaining += remaining[:total - len(remaining)]
        return remaining[rank::self._size]

    def reset(self) -> None:
        self._share = self.share_of(self._rank)
        self.position = 0

    def __iter__(self):
        self.position = 0
        for index in self._share:
            self.position += 1
            yield index

    def __len__(self) -> int:
        return len(self._share)

    def progress(self) -> tuple[int, int, int]:
        """(epoch + 1, position, share size): what a push reports to the servers."""
        return self.epoch + 1, self.position, len(self._share)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed": sorted(self.processed), "seed": self.seed,
                "shuffle": self.shuffle}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        self.processed = set(state["processed"])
        self.seed = int(state["seed"])
        self.shuffle = bool(state["shuffle"])
        self.reset()

    def absorb(self, positions: dict[int, tuple[int, int]]) -> None:
        """Every rank's (epoch, position) since the last reset: what they trained of their
        shares joins `processed`, and the shares are cut again from what is left."""
        trained = set()
        for r, (epoch, position) in positions.items():
            if epoch == self.epoch and position > 0:
                trained.update(self.share_of(r)[:position])
        self.processed |= trained
        self.reset()


# ---- state --------------------------------------------------------------------------------
class State:
    """What a worker commits and every rank is synced to (Horovod's hvd.elastic.State)."""

    def __init__(self):
        self._reset_callbacks = []
        self._sync_id = 0  # the commit round that admitted the last joiner (0: the start)
        # Whose state every rank takes at a sync: rank 0 at the start; after an admission the
        # lowest rank that was not joining (a restarted rank 0 has no state to give).
        self._sync_root = 0

    def register_reset_callbacks(self, callbacks) -> None:
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Keeps a copy of the state (restore()) and checks, with every rank, whether a
        restarted worker is waiting to come back (HostsUpdatedInterrupt when one is)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        hvd = _hvd()
        c = hvd._c()
        took_part = hvd._gather(COMMIT_KEY, b"", internal=True)
        if c.last_gather_admitted:
            _note_admission(self, took_part)
            c.log(f"rank(s) {', '.join(map(str, c.last_gather_admitted))} admitted back at "
                  f"commit {self._sync_id}: syncing every rank to rank {self._sync_root}'s "
                  "state")
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ObjectState(State):
    """Plain attributes (epoch=0, batch=0, ...): committed by copy, synced from rank 0."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        super().__init__()
        self._known = dict(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._saved = copy.deepcopy(self._known)

    def _values(self) -> dict:
        return {name: getattr(self, name) for name in self._known}

    def save(self) -> None:
        self._saved = copy.deepcopy(self._values())

    def restore(self) -> None:
        for name, value in copy.deepcopy(self._saved).items():
            setattr(self, name, value)

    def sync(self) -> None:
        _sync(self)


class TorchState(ObjectState):
    """A model, an optimizer, ElasticSamplers and plain attributes (Horovod's TorchState):
    commit keeps copies of their state_dicts, sync loads rank 0's into every rank."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        objects = {k: v for k, v in kwargs.items() if hasattr(v, "state_dict")}
        plain = {k: v for k, v in kwargs.items() if k not in objects}
        self.model = model
        self.optimizer = optimizer
        self._objects = {"model": model, "optimizer": optimizer, **objects}
        self._objects = {k: v for k, v in self._objects.items() if v is not None}
        for name, obj in objects.items():
            setattr(self, name, obj)
        super().__init__(**plain)
        samplers = [o for o in self._objects.values() if isinstance(o, ElasticSampler)]
        hvd = _hvd()
        if samplers and hvd._state.sampler is None:
            hvd._state.sampler = samplers[0]  # the data the optimizer's pushes report on
        self._saved_objects = self._object_states()

    def _object_states(self) -> dict:
        return {name: copy.deepcopy(obj.state_dict()) for name, obj in self._objects.items()}

    def save(self) -> None:
        super().save()
        self._saved_objects = self._object_states()

    def restore(self) -> None:
        super().restore()
        for name, state in copy.deepcopy(self._saved_objects).items():
            self._objects[name].load_state_dict(state)


def _note_admission(state: State, took_part: list) -> None:
    """The commit round that admitted a joiner: the next sync's name, and its root (the
    lowest rank whose payload the round carried: not a joiner)."""
    c = _hvd()._c()
    state._sync_id = c.last_gather_round
    state._sync_root = min(r for r, payload in enumerate(took_part) if payload is not None)


def _snapshot(state: State) -> dict:
    hvd = _hvd()
    objects = {}
    if isinstance(state, TorchState):
        objects = {name: obj.state_dict() for name, obj in state._objects.items()}
    return {"values": state._values() if isinstance(state, ObjectState) else {},
            "objects": objects, "rounds": dict(hvd._state.rounds),
            "unnamed": hvd._state.unnamed}


def _positions(state: State) -> dict:
    """This rank's (epoch, position) in each ElasticSampler of the state; a joining rank's
    training sampler's is its predecessor's, as the servers recorded it."""
    hvd = _hvd()
    c = hvd._c()
    out = {}
    for name, obj in getattr(state, "_objects", {}).items():
        if not isinstance(obj, ElasticSampler):
            continue
        out[name] = (obj.epoch, obj.position)
        if hvd._state.joining and obj is hvd._state.sampler:
            recorded = c.recorded_progress
            out[name] = (recorded.epoch - 1, recorded.done) if recorded.epoch > 0 else (0, 0)
    return out


def _sync(state: State) -> None:
    """Every rank (the admitted ones too) to the sync root's state; the samplers' shares cut again
    from what every rank has trained."""
    hvd = _hvd()
    c = hvd._c()
    name = f"parasync.elastic.sync.{state._sync_id}"
    root = state._sync_root
    positions = hvd._gather_object((c.rank, _positions(state)), f"{name}.positions")
    snapshot = _broadcast_snapshot(state, name, root)
    if c.rank != root:
        for key, value in snapshot["values"].items():
            setattr(state, key, value)
        for key, value in snapshot["objects"].items():
            obj = state._objects[key]
            if isinstance(obj, ElasticSampler):
                continue  # its own below
            obj.load_state_dict(value)  # a DistributedOptimizer shares it with its own
        hvd._state.rounds.update(snapshot["rounds"])
        hvd._state.unnamed = snapshot["unnamed"]
    for key, obj in getattr(state, "_objects", {}).items():
        if isinstance(obj, ElasticSampler):
            if c.rank != root:
                obj.load_state_dict(snapshot["objects"][key])
            obj.absorb({r: p[key] for r, p in positions if key in p})
    hvd._state.joining = False
    state.save()
    state.on_reset()


def _broadcast_snapshot(state: State, name: str, root: int) -> dict:
    """The root's snapshot on every rank (the root's own, taken once)."""
    hvd = _hvd()
    c = hvd._c()
    own = _snapshot(state) if c.rank == root else None

    def pickled():
        out = io.BytesIO()
        torch.save(own, out)
        return out.getvalue()

    data = hvd._from_root("broadcast_object", name, pickled, root, internal=True)
    return own if c.rank == root else torch.load(io.BytesIO(data), map_location="cpu")


def _await_admission(state: State) -> None:
    """A restarted worker: waits (not counted live, so nobody waits for it) until the others'
    next commit admits it, then makes every server count it live before the sync."""
    hvd = _hvd()
    c = hvd._c()
    c.log(f"rank {c.rank} restarted into the running job: waiting for the others' next "
          "state.commit() to admit it")
    while True:
        try:
            took_part = c.gather(COMMIT_KEY, 0, b"")
            break
        except errors.TimedOut:
            if hvd.stop_requested():
                raise
            continue  # the others have not committed yet: keep waiting
    _note_admission(state, took_part)
    round_ = state._sync_id
    hvd._state.rounds[COMMIT_KEY] = round_
    c.set_joining(False)
    opt = next(iter(hvd._DistributedOptimizer._live), None)
    if opt is not None:
        c.pull(opt._pulled)  # every server now counts this rank live (before anyone steps)
    c.log(f"rank {c.rank} admitted back at commit {round_}")


def run(func):
    """Horovod's hvd.elastic.run: calls ``func(state, ...)``, first syncing every rank to rank
    0's state (a restarted worker first waits to be admitted back); when a commit admits a
    restarted worker, every rank syncs again and calls ``func`` again."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        hvd = _hvd()
        if hvd._state.joining:
            _await_admission(state)
        state.sync()
        while True:
            try:
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as e:
                if not e.skip_sync:
                    state.sync()

    return wrapper
