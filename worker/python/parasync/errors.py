"""parasync's exceptions: one class per status kind of the C API (worker/client/c_api.h).

Every error the servers or the client library report arrives as a ``ParasyncError`` subclass
carrying its one-line message; argument mistakes found in Python (a wrong dtype, a tensor of
the wrong shape, ``step()`` without ``backward()``) are ``InvalidArgument`` too, so one
``except parasync.ParasyncError`` catches everything parasync raises.
"""

from __future__ import annotations


class ParasyncError(Exception):
    """Base class. ``code`` is the C API's status code (``PARASYNC_*``)."""

    code = -1


class InvalidArgument(ParasyncError, ValueError):
    """A bad argument: the call changed nothing."""

    code = 1


class NotFound(ParasyncError):
    code = 2


class Unavailable(ParasyncError):
    """A server could not be reached or refused for now (a retry may succeed)."""

    code = 3


class TimedOut(ParasyncError):
    """No reply within the timeout; the message names the silent server."""

    code = 4


class Aborted(ParasyncError):
    """Stopped: SIGINT or SIGTERM arrived, or a server went silent while a call waited."""

    code = 5


class Corruption(ParasyncError):
    code = 6


class Internal(ParasyncError):
    code = 7


class NotSupported(ParasyncError):
    code = 8


class FailedPrecondition(ParasyncError):
    """Refused for good: e.g. the servers hold another model or run another mode."""

    code = 9


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, Unavailable, TimedOut, Aborted,
                                      Corruption, Internal, NotSupported, FailedPrecondition)}


def from_code(code: int, message: str) -> ParasyncError:
    """The exception for a C API status code and its message."""
    cls = _BY_CODE.get(code, Internal)
    return cls(message)
