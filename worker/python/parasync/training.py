"""parasync.training.Run: the loop parasync-worker runs around each step, for a Python worker.

It walks this rank's shard of the training set in parasync-worker's order (i % workers ==
rank, shuffled per seed, rank and epoch), goes on where the servers recorded this rank after a
restart (Keras BackupAndRestore's semantics, as parasync-worker), tells every push where the
worker is, prints parasync-worker's progress and epoch lines, and on the chief evaluates
after every epoch into eval.jsonl (waiting for the other workers before the last one), so
parasync-launch's summary and tools/compare read a Python run as a C++ one::

    run = Run(client, len(train_y), evaluate=evaluate)     # evaluate() -> (accuracy, loss)
    for epoch in run.epochs():
        for idx in run.batches():                           # numpy int64 indices
            loss = train_step(x[idx], y[idx])               # ... opt.step(examples=len(idx))
    run.finish()

Settings not given default to the environment (parasync.environment.Settings: PARASYNC_EPOCHS,
PARASYNC_BATCH_SIZE, PARASYNC_SEED, PARASYNC_MAX_STEPS, PARASYNC_LOG_EVERY,
PARASYNC_WAIT_FOR_WORKERS, PARASYNC_CHECKPOINT_EACH_EPOCH), then to parasync-worker's defaults.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Iterator

import numpy as np

from . import errors
from .client import Client
from .environment import DEFAULT_EPOCHS, parse_eval_every


def _first(*values):
    for v in values:
        if v is not None:
            return v
    return None


class Run:
    """One worker's training run over ``train_size`` examples.

    ``evaluate`` (chief only; may be None): a function of no arguments returning
    (test_accuracy, test_loss) or (test_accuracy, test_loss, test_auc), evaluated on the
    servers' current model after every epoch and, unless ``evaluate_first`` is False, before
    the first. The data loop must push once per batch of ``batches()`` (pst.Optimizer.step
    does).

    ``eval_every`` (default PARASYNC_EVAL_EVERY, parasync-launch --eval-every): the chief
    also evaluates within each epoch, every N of its steps (an int or "N") or every N
    seconds ("Ns"), as parasync-worker --eval-every: a row of eval.jsonl whose "epoch" is
    the epochs done as a fraction ("epoch": 1.25, "within_epoch": true). The epoch's
    examples/sec leaves those evaluations out.
    """

    def __init__(self, client: Client, train_size: int, *, epochs: int | None = None,
                 batch_size: int | None = None, seed: int | None = None, shuffle: bool = True,
                 max_steps: int | None = None, log_every: float | None = None,
                 wait_for_workers: float | None = None,
                 checkpoint_each_epoch: bool | None = None,
                 evaluate: Callable[[], tuple] | None = None, evaluate_first: bool = True,
                 eval_every: int | str | None = None):
        s = client.settings
        self.client = client
        self.epochs_total = int(_first(epochs, s.epochs, DEFAULT_EPOCHS))
        self.batch_size = int(_first(batch_size, s.batch_size, 64))
        self.seed = int(_first(seed, s.seed, 42))
        self.shuffle = shuffle
        self.max_steps = int(_first(max_steps, s.max_steps, 0))
        self.log_every = float(_first(log_every, s.log_every, 0.0))
        self.wait_for_workers = float(_first(wait_for_workers, s.wait_for_workers, 0.0))
        self.checkpoint_each_epoch = bool(_first(checkpoint_each_epoch, s.checkpoint_each_epoch))
        self.evaluate = evaluate
        self.evaluate_first = evaluate_first
        self.eval_every_steps, self.eval_every_seconds = parse_eval_every(
            _first(eval_every, s.eval_every))
        if train_size < client.num_workers:
            raise errors.InvalidArgument(f"{train_size} training examples cannot be shared by "
                                         f"{client.num_workers} workers")
        if self.epochs_total < 1 or self.batch_size < 1:
            raise errors.InvalidArgument("epochs and batch size must be at least 1")
        self.train_size = int(train_size)
        self.shard_size = len(client.shard_indices(train_size, 1, self.seed, False))
        self.steps = 0
        self.stopped = False
        self.final_accuracy: float | None = None
        self._start = time.monotonic()
        self._last_evaluation = self._start  # eval_every seconds count from here
        self._epoch = 0
        self._first_example = 0
        self._resume()

    # ---- where to start --------------------------------------------------------------------
    def _resume(self) -> None:
        """Where the servers recorded this rank; the chief's evaluations a restart owes."""
        recorded = self.client.recorded_progress
        self._start_epoch, self._start_offset, finished = 1, 0, 0
        if recorded.epoch > 0:
            if recorded.of != self.shard_size:
                self.client.log(
                    f"the servers recorded rank {self.client.rank} at epoch {recorded.epoch}, "
                    f"example {recorded.done} of {recorded.of}, but its data shard now holds "
                    f"{self.shard_size} examples: going on from the start of epoch "
                    f"{recorded.epoch}", "warn")
                self._start_epoch = recorded.epoch
            elif recorded.done == recorded.of:
                self._start_epoch, finished = recorded.epoch + 1, recorded.epoch
            else:
                self._start_epoch, self._start_offset = recorded.epoch, recorded.done
            if recorded.of == self.shard_size:
                self.client.log(f"resuming where the servers recorded rank {self.client.rank}: "
                                f"epoch {recorded.epoch}, {recorded.done} of {recorded.of} "
                                "examples done")
        if self.client.is_chief:
            logged = self.client.last_logged_epoch()
            if recorded.epoch == 0 and self.evaluate_first:
                self._evaluate(0, math.nan, 0.0)
            elif finished > logged and finished > 0:
                self._evaluate(finished, math.nan, 0.0)  # its evaluation did not happen
        if self._start_epoch > self.epochs_total:
            self.client.log(f"all {self.epochs_total} epochs were trained before (the servers' "
                            "record): nothing left to do")

    # ---- the loop ----------------------------------------------------------------------------
    def epochs(self) -> Iterator[int]:
        """The epochs left to train (1-based). After each, the epoch line and, on the chief,
        the evaluation."""
        for epoch in range(self._start_epoch, self.epochs_total + 1):
            if self.stopped:
                return
            self._epoch = epoch
            self._first_example = self._start_offset if epoch == self._start_epoch else 0
            self.client.set_epoch(epoch)
            self.client.take_totals()
            self._epoch_start = time.monotonic()
            self._last_line = self._epoch_start
            yield epoch
            totals = self.client.totals
            if totals.steps == 0:
                return
            self._end_epoch(epoch)

    def batches(self) -> Iterator[np.ndarray]:
        """This epoch's batches of example indices (this rank's shard, in parasync-worker's
        order, from where a restart left off). Each push made while a batch is out reports
        the position after it."""
        order = self.client.shard_indices(self.train_size, self._epoch, self.seed, self.shuffle)
        for first in range(self._first_example, len(order), self.batch_size):
            if self._should_stop():
                self.stopped = True
                return
            idx = order[first:first + self.batch_size]
            self.client.set_progress(self._epoch, first + len(idx), len(order))
            self.client.next_step_examples = len(idx)
            steps_before = self.client.totals.steps
            yield idx
            self.client.next_step_examples = None
            if self.client.totals.steps == steps_before:
                raise errors.FailedPrecondition(
                    "a batch of Run.batches() ended without a step: call the optimizer's "
                    "step() once per batch")
            self.steps += 1
            self._maybe_log_progress(first + len(idx), len(order))
            if self.max_steps and self.steps >= self.max_steps:
                self.stopped = True
                return
            self._maybe_evaluate_within(first + len(idx), len(order))

    def _maybe_evaluate_within(self, done: int, of: int) -> None:
        """Chief, eval_every: an evaluation within the epoch when one is due (not after the
        epoch's last batch: its evaluation comes anyway)."""
        if not self.client.is_chief or self.evaluate is None or done >= of or \
                self._should_stop():
            return
        by_steps = self.eval_every_steps > 0 and self.steps % self.eval_every_steps == 0
        by_time = self.eval_every_seconds > 0 and \
            time.monotonic() - self._last_evaluation >= self.eval_every_seconds
        if not (by_steps or by_time):
            return
        started = time.monotonic()
        self._evaluate(self._epoch, math.nan, 0.0, progress=self._epoch - 1 + done / of)
        self._epoch_start += time.monotonic() - started  # not in the epoch's examples/sec

    def _should_stop(self) -> bool:
        from .client import stop_requested
        return stop_requested() != 0

    def _maybe_log_progress(self, done: int, of: int) -> None:
        now = time.monotonic()
        if self.log_every <= 0 or now - self._last_line < self.log_every:
            return
        self._last_line = now
        t = self.client.totals
        loss = t.loss_sum / t.loss_steps if t.loss_steps else math.nan
        self.client.log(f"epoch {self._epoch}/{self.epochs_total}: {done} of {of} examples "
                        f"({100.0 * done / of:.0f}%), {t.examples / (now - self._epoch_start):.0f} "
                        f"examples/sec, train loss {loss:.4f}")

    def _end_epoch(self, epoch: int) -> None:
        seconds = time.monotonic() - self._epoch_start
        t = self.client.totals
        loss = t.loss_sum / t.loss_steps if t.loss_steps else math.nan
        eps = t.examples / seconds if seconds > 0 else 0.0
        resumed = f" (resumed at example {self._first_example})" if self._first_example else ""
        ms = lambda x: 1e3 * x / t.steps  # noqa: E731
        self.client.log(f"epoch {epoch}/{self.epochs_total}: {t.examples} examples{resumed} in "
                        f"{seconds:.2f} s = {eps:.0f} examples/sec, train loss {loss:.4f} (per "
                        f"step: pull {ms(t.pull):.2f} ms, compute {ms(t.compute):.2f} ms, push "
                        f"{ms(t.push):.2f} ms)")
        if not self.client.is_chief or (self.stopped and self._should_stop()):
            return
        if (epoch == self.epochs_total or self.stopped) and self.wait_for_workers > 0:
            self.client.wait_for_workers(self.wait_for_workers)
            if self._should_stop():
                return
        self._evaluate(epoch, loss, eps)
        if self.checkpoint_each_epoch:
            try:
                self.client.checkpoint()
                self.client.log(f"checkpoint after epoch {epoch} saved on every server")
            except errors.ParasyncError as e:
                self.client.log(f"checkpoint after epoch {epoch} failed: {e}", "warn")

    def _evaluate(self, epoch: int, train_loss: float, examples_per_sec: float,
                  progress: float = 0.0) -> None:
        if self.evaluate is None:
            return
        self.client.beat()
        result = self.evaluate()
        self.client.beat()
        self._last_evaluation = time.monotonic()
        accuracy, loss = float(result[0]), float(result[1])
        auc = float(result[2]) if len(result) > 2 and result[2] is not None else math.nan
        self.client.log_eval(epoch, accuracy, loss, train_loss=train_loss, test_auc=auc,
                             examples_per_sec=examples_per_sec,
                             wall_seconds=time.monotonic() - self._start,
                             batch_size=self.batch_size, epoch_progress=progress)
        if progress > 0:
            return  # within an epoch: not the final figure
        self.final_accuracy = accuracy

    def finish(self) -> None:
        """Leaves the servers and writes the metrics snapshot (Client.finish), with
        parasync-worker's closing line."""
        self.client.finish()
        if self.client.is_chief and self.final_accuracy is not None:
            self.client.log(f"training done: {self.steps} steps here; final test accuracy "
                            f"{self.final_accuracy:.4f}; eval log "
                            f"{self.client.settings.log_dir}/eval.jsonl")
        else:
            self.client.log(f"training done: {self.steps} steps")
