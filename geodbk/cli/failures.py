"""How a failed ``geodbk`` command ends: one line on stderr and an exit status, never a traceback.

:func:`failure` maps an exception to its exit status and line:

* bad input (:class:`geodbk.errors.GeodbkError`), a file or folder the system refuses
  (``OSError``: unwritable folder, full disk, a parent path that is a file) and a resource
  limit (``MemoryError``, torch's out-of-memory errors): :data:`USAGE_ERROR` (2);
* Ctrl-C: :data:`INTERRUPTED` (130); SIGTERM and SIGHUP, which :func:`sigterm_as_exception` turns
  into :class:`geodbk.errors.Terminated`: 128 + the signal's number (:data:`TERMINATED`, 143, for
  SIGTERM; 129 for SIGHUP);
* anything else is a bug: :data:`INTERNAL_ERROR` (1), naming the exception and ``--debug``,
  which shows the traceback instead.

Every line goes through :func:`redact`, so a password in a URL is never echoed.
"""

from __future__ import annotations

import errno
import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from geodbk.errors import GeodbkError, Terminated

#: Exit status of a failure caused by bad input, the system or a resource limit.
USAGE_ERROR = 2
#: Exit status of a failure no check foresaw (a bug).
INTERNAL_ERROR = 1
#: Exit status after Ctrl-C (128 + SIGINT).
INTERRUPTED = 130
#: Exit status after SIGTERM (128 + SIGTERM); after SIGHUP it is 128 + SIGHUP (129).
TERMINATED = 128 + signal.SIGTERM

_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@:]*:[^/\s@]*@")
_OUT_OF_MEMORY = ("OutOfMemoryError",)
_OS_REASONS = {
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EFBIG: "file size limit reached (ulimit -f), or the file is too large for this file system",
}


def redact(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` replaced by ``***``."""
    return _CREDENTIALS.sub(lambda m: f"{m['scheme']}***:***@", text)


def one_line(text: str) -> str:
    """``text`` on one line (whitespace runs collapsed), passwords redacted."""
    return redact(" ".join(str(text).split()))


def _os_error_text(err: OSError) -> str:
    reason = _OS_REASONS.get(err.errno or 0) or err.strerror or str(err)
    where = " -> ".join(str(name) for name in (err.filename, err.filename2) if name)
    return f"{where}: {reason}" if where else reason


def _out_of_memory(err: BaseException) -> bool:
    return isinstance(err, MemoryError) or type(err).__name__ in _OUT_OF_MEMORY or (
        isinstance(err, RuntimeError) and "can't allocate memory" in str(err)
    )


def failure(err: BaseException) -> tuple[int, str]:
    """The exit status and the one-line message (without the ``geodbk <command>: error:`` prefix) of ``err``."""
    if isinstance(err, Terminated):
        signum = err.args[0] if err.args and isinstance(err.args[0], signal.Signals) else signal.SIGTERM
        return 128 + signum, f"terminated ({signum.name}); nothing half-written was left"
    if isinstance(err, KeyboardInterrupt):
        return INTERRUPTED, "interrupted (Ctrl-C); nothing half-written was left"
    if isinstance(err, GeodbkError):
        return USAGE_ERROR, one_line(str(err))
    if _out_of_memory(err):
        detail = f" ({one_line(str(err))})" if str(err) else ""
        return USAGE_ERROR, ("out of memory" + detail + "; try a coarser --resolution, fewer quarters, a smaller "
                             "--chunk-rows or a smaller model")
    if isinstance(err, OSError):
        return USAGE_ERROR, one_line(_os_error_text(err))
    return INTERNAL_ERROR, one_line(f"internal error: {type(err).__name__}: {err} (rerun with --debug for the "
                                    "traceback, and please report it)")


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signal.Signals(signum))


@contextmanager
def sigterm_as_exception() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP (a closed terminal or SSH session) raise
    :class:`geodbk.errors.Terminated` in the main thread, so that staged outputs are removed as
    after Ctrl-C; a SIGHUP that was ignored (``nohup``) stays ignored. The previous handlers come
    back afterwards. Outside the main thread (signals cannot be set there) the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = [signal.SIGTERM] + ([signal.SIGHUP] if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN else [])
    previous = {signum: signal.signal(signum, _raise_terminated) for signum in caught}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


__all__ = [
    "INTERNAL_ERROR",
    "INTERRUPTED",
    "TERMINATED",
    "USAGE_ERROR",
    "failure",
    "one_line",
    "redact",
    "sigterm_as_exception",
]
