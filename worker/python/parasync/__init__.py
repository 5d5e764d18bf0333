"""parasync: a Python worker of a parasync parameter-server cluster.

    import parasync
    client = parasync.Client()               # the cluster from TF_CONFIG (parasync-launch)
    client.register([parasync.Variable("w", (784, 10))], optimizer="sgd", lr=0.1,
                    initial_values=[w0])      # rank 0's values win
    client.pull([w]); client.push([grad_w], examples=64)

numpy level; parasync.torch trains any PyTorch model (import it explicitly: it needs torch).
Built on libparasync_client.so (worker/client/c_api.h) through ctypes.
"""

from .client import (NEXT_STEP, Client, Progress, StepTimes, StepTotals, Table, Variable,
                     shard_indices, stop_on_signals, stop_requested)
from .environment import Settings
from .errors import (Aborted, Corruption, FailedPrecondition, Internal, InvalidArgument,
                     NotFound, NotSupported, ParasyncError, TimedOut, Unavailable)
from ._capi import lib as _lib

__version__ = _lib.parasync_version().decode()

__all__ = [
    "Aborted", "Client", "Corruption", "FailedPrecondition", "Internal", "InvalidArgument",
    "NEXT_STEP", "NotFound", "NotSupported", "ParasyncError", "Progress", "Settings",
    "StepTimes", "StepTotals", "Table", "TimedOut", "Unavailable", "Variable", "shard_indices",
    "stop_on_signals", "stop_requested",
]
