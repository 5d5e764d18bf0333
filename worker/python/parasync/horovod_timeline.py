"""hvd.start_timeline's file: where every step of a rank's DistributedOptimizer went, as
Chrome's trace-event JSON (open it in chrome://tracing or ui.perfetto.dev).

Two lanes per rank:
- "training thread": a "step" span from the end of the last step to the end of this one,
  and inside it "optimizer + forward" (to the first gradient's hook), "backward" (first to
  last gradient hook) and "synchronize" (the wait for the averaged gradients and their copy
  into p.grad); in async and ssp "optimizer" (the local step) and "exchange".
- "exchange with the servers": "push" (the first push sent, from backward's hooks if any
  went early, to the last acknowledgement) and "pull" (to the last reply).
Times are the process's monotonic clock in microseconds, the client's (C++ steady_clock)
and Python's alike, so a push sent during backward lies inside the backward span.

Horovod writes its timeline on rank 0 only; so does this, unless the path holds "{rank}",
which every rank replaces with its own (one file each: the ranks' skew side by side).
A file is valid JSON once stop_timeline() or shutdown() closed it; one cut short by a
crash still opens in the trace viewers (they accept a missing "]").
"""

from __future__ import annotations

import json

TRAINING = 1
EXCHANGE = 2


class Timeline:
    def __init__(self, path: str, rank: int):
        self._file = open(path, "w", encoding="utf-8")
        self._rank = rank
        self._first = True
        self._file.write("[\n")
        self._meta("process_name", 0, f"rank {rank}")
        self._meta("thread_name", TRAINING, "training thread")
        self._meta("thread_name", EXCHANGE, "exchange with the servers")

    def _write(self, event: dict) -> None:
        self._file.write(("" if self._first else ",\n") + json.dumps(event))
        self._first = False

    def _meta(self, what: str, lane: int, name: str) -> None:
        self._write({"name": what, "ph": "M", "pid": self._rank, "tid": lane,
                     "args": {"name": name}})

    def span(self, name: str, lane: int, start: float, end: float, **args) -> None:
        """One complete event, `start` and `end` in monotonic seconds."""
        self._write({"name": name, "ph": "X", "pid": self._rank, "tid": lane,
                     "ts": round(start * 1e6, 1), "dur": round(max(0.0, end - start) * 1e6, 1),
                     "args": args})

    def step(self, step: int, prev_end: float, end: float, spans, push, pull,
             **args) -> None:
        """A step: its training-thread spans [(name, start, end)], the exchange's push and
        pull as (start, end), and `args` on the step's span."""
        self.span("step", TRAINING, prev_end, end, step=step, **args)
        for name, start, stop in spans:
            if start is not None and stop is not None:
                self.span(name, TRAINING, start, stop)
        self.span("push", EXCHANGE, *push)
        self.span("pull", EXCHANGE, *pull)
        self._file.flush()

    def close(self) -> None:
        self._file.write("\n]\n")
        self._file.close()


def path_for(path: str, rank: int) -> str | None:
    """Where this rank writes: `path` with {rank} replaced; None where it writes nothing
    (a path without {rank}, on every rank but 0)."""
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    return path if rank == 0 else None
