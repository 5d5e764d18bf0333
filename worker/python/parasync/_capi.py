"""ctypes bindings of libparasync_client.so (worker/client/c_api.h). Private: use Client.

The library is looked for, in order, at $PARASYNC_CLIENT_LIBRARY, next to this file (the build
tree and `cmake --install` put it there), and on the loader's path. ctypes releases the GIL
around every foreign call, so a call waiting on the network never blocks other Python threads.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import (POINTER, Structure, c_char_p, c_double, c_float, c_int, c_int64, c_size_t,
                    c_uint8, c_uint32, c_uint64, c_void_p)

from . import errors

NEXT_STEP = -1
INIT_ZEROS, INIT_CONSTANT, INIT_UNIFORM, INIT_PROVIDED = 0, 1, 2, 3


class Rows(Structure):
    _fields_ = [("table", c_uint32), ("ids", POINTER(c_uint64)), ("count", c_size_t),
                ("values", POINTER(c_float))]


class StepTimes(Structure):
    _fields_ = [("first_push_sent", c_double), ("last_push_sent", c_double),
                ("pushes_acked", c_double), ("pulled", c_double), ("push_seconds", c_double),
                ("pull_seconds", c_double), ("early_pushes", c_int)]


class Eval(Structure):
    _fields_ = [("epoch", c_int), ("train_loss", c_double), ("test_loss", c_double),
                ("test_accuracy", c_double), ("test_auc", c_double),
                ("chief_examples_per_sec", c_double), ("wall_seconds", c_double),
                ("batch_size", c_int), ("optimizer", c_char_p), ("learning_rate", c_double),
                ("epoch_progress", c_double)]


_ERR = POINTER(c_char_p)
_FLOATS = POINTER(POINTER(c_float))
_H = c_void_p  # every handle

# name: (restype, argtypes)
_PROTOTYPES = {
    "parasync_free": (None, [c_void_p]),
    "parasync_version": (c_char_p, []),
    "parasync_options_create": (_H, []),
    "parasync_options_destroy": (None, [_H]),
    "parasync_options_set_cluster": (c_int, [_H, c_char_p, c_int, c_int, _ERR]),
    "parasync_options_set_mode": (c_int, [_H, c_char_p, _ERR]),
    "parasync_options_set_timeouts": (c_int, [_H, c_double, c_double, c_double, _ERR]),
    "parasync_options_set_curve": (c_int, [_H, c_char_p, c_char_p, _ERR]),
    "parasync_options_set_wire_dtype": (c_int, [_H, c_char_p, _ERR]),
    "parasync_options_set_topk_probe": (c_int, [_H, c_int, _ERR]),
    "parasync_options_set_delta_pulls": (c_int, [_H, c_int, _ERR]),
    "parasync_options_set_local_group": (c_int, [_H, c_char_p, c_char_p, _ERR]),
    "parasync_options_set_joining": (c_int, [_H, c_int, _ERR]),
    "parasync_options_set_metrics": (c_int, [_H, c_char_p, c_int, c_char_p, _ERR]),
    "parasync_options_set_log_level": (c_int, [_H, c_char_p, _ERR]),
    "parasync_model_create": (_H, []),
    "parasync_model_destroy": (None, [_H]),
    "parasync_model_add_variable": (c_int, [_H, c_char_p, POINTER(c_int64), c_size_t, c_int,
                                            c_float, _ERR]),
    "parasync_model_add_table": (c_int, [_H, c_char_p, c_int64, c_int64, c_int, c_float, _ERR]),
    "parasync_model_set_optimizer": (c_int, [_H, c_char_p, c_double, _ERR]),
    "parasync_model_set": (c_int, [_H, c_char_p, c_double, _ERR]),
    "parasync_model_set_seed": (None, [_H, c_uint64]),
    "parasync_model_set_name": (None, [_H, c_char_p]),
    "parasync_model_set_description": (None, [_H, c_char_p]),
    "parasync_model_num_variables": (c_size_t, [_H]),
    "parasync_model_validate": (c_int, [_H, _ERR]),
    "parasync_client_connect": (c_int, [_H, POINTER(_H), _ERR]),
    "parasync_client_destroy": (None, [_H]),
    "parasync_client_rank": (c_int, [_H]),
    "parasync_client_num_workers": (c_int, [_H]),
    "parasync_client_num_shards": (c_int, [_H]),
    "parasync_client_mode": (c_char_p, [_H]),
    "parasync_client_metrics_port": (c_int, [_H]),
    "parasync_client_register": (c_int, [_H, _H, _FLOATS, _ERR]),
    "parasync_client_recorded_progress": (None, [_H, POINTER(c_int), POINTER(c_int64),
                                                 POINTER(c_int64)]),
    "parasync_client_set_progress": (None, [_H, c_int, c_int64, c_int64]),
    "parasync_client_pull": (c_int, [_H, _FLOATS, c_size_t, c_int64, POINTER(Rows), c_size_t,
                                     _ERR]),
    "parasync_client_push": (c_int, [_H, _FLOATS, c_size_t, c_int64, POINTER(Rows), c_size_t,
                                     _ERR]),
    "parasync_client_step_begin": (c_int, [_H, c_int64, _ERR]),
    "parasync_client_step_gradient": (c_int, [_H, c_size_t, POINTER(c_float), _ERR]),
    "parasync_client_step_finish": (c_int, [_H, POINTER(Rows), c_size_t, _FLOATS, c_size_t,
                                            POINTER(Rows), c_size_t, POINTER(StepTimes), _ERR]),
    "parasync_client_step_launch": (c_int, [_H, _FLOATS, c_size_t, _ERR]),
    "parasync_client_step_wait": (c_int, [_H, POINTER(StepTimes), _ERR]),
    "parasync_client_last_push_dropped": (c_int, [_H]),
    "parasync_client_last_push_staleness": (c_int64, [_H]),
    "parasync_client_last_version": (c_int64, [_H]),
    "parasync_client_observe_step": (None, [_H, c_int64, c_double, c_double, c_double,
                                            c_double]),
    "parasync_client_beat": (None, [_H]),
    "parasync_client_set_epoch": (None, [_H, c_int]),
    "parasync_client_log_eval": (c_int, [_H, POINTER(Eval), _ERR]),
    "parasync_client_last_logged_epoch": (c_int, [_H]),
    "parasync_client_wait_for_workers": (c_int, [_H, c_double, _ERR]),
    "parasync_client_leave": (c_int, [_H, c_double, _ERR]),
    "parasync_client_live_ranks": (c_int, [_H, POINTER(c_uint8), _ERR]),
    "parasync_client_global_progress": (c_int, [_H, POINTER(c_int64), POINTER(c_int64), _ERR]),
    "parasync_client_checkpoint": (c_int, [_H, _ERR]),
    "parasync_client_set_wire_dtype": (c_int, [_H, c_char_p, _ERR]),
    "parasync_client_gather": (c_int, [_H, c_char_p, c_int64, c_void_p, c_size_t,
                                       POINTER(c_uint8), POINTER(c_uint64), _ERR]),
    "parasync_client_gather_copy": (c_int, [_H, c_int, c_void_p, c_size_t, _ERR]),
    "parasync_client_gather_round": (c_int64, [_H]),
    "parasync_client_set_joining": (c_int, [_H, c_int, _ERR]),
    "parasync_client_finish": (c_int, [_H, c_double, _ERR]),
    "parasync_client_resends": (c_int64, [_H]),
    "parasync_client_reconnects": (c_int64, [_H]),
    "parasync_shard_indices": (c_int, [c_int64, c_int, c_int, c_uint64, c_int, c_int,
                                       POINTER(c_int64), c_size_t, POINTER(c_size_t), _ERR]),
    "parasync_install_signal_handlers": (None, []),
    "parasync_stop_requested": (c_int, []),
    "parasync_request_stop": (None, [c_int]),
    "parasync_log": (None, [c_char_p, c_char_p]),
}


def _library_path() -> str:
    explicit = os.environ.get("PARASYNC_CLIENT_LIBRARY")
    if explicit:
        return explicit
    beside = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libparasync_client.so")
    if os.path.exists(beside):
        return beside
    return "libparasync_client.so"  # the loader's search path


def _load() -> ctypes.CDLL:
    path = _library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(
            f"parasync: cannot load the client library {path}: {e} (build it with "
            "tools/build.sh, or set PARASYNC_CLIENT_LIBRARY to libparasync_client.so)") from e
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


lib = _load()


def call(fn, *args) -> None:
    """Calls a C API function whose last argument is char** errmsg; raises on failure."""
    err = c_char_p()
    code = fn(*args, ctypes.byref(err))
    if code != 0:
        message = err.value.decode("utf-8", "replace") if err.value else f"status {code}"
        lib.parasync_free(ctypes.cast(err, c_void_p))
        raise errors.from_code(code, message)


def text(value) -> bytes | None:
    return None if value is None else str(value).encode()
