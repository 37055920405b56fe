"""Waits that Ctrl-C can end: the main thread never sleeps longer than :data:`WAKE_S` at a time.

The kernel hands a process's SIGINT to any of its threads that does not block it. Python runs its handler (and
raises KeyboardInterrupt) only in the main thread, and only when that thread wakes: when Ctrl-C lands on a
thread that is connecting to a node which drops every packet, a main thread waiting without a bound on that node
would not stop until the connect gave up (minutes, with a long ``connect_timeout``). So every wait on a node
that the main thread makes goes in slices of at most :data:`WAKE_S` seconds.

A Ctrl-C that lands inside a lock-based wait (a queue's ``get``, an event's or a future's wait, a thread's start)
just after the wait released its lock leaves the ``with`` around it to release the lock again, and the
KeyboardInterrupt comes out as ``RuntimeError: release unlocked lock``. :func:`ctrl_c_whole` turns it back where
a Ctrl-C is handled: the waits here, the fan-out to the nodes, ``up``'s start and a restart's (the record says
``interrupted``), and the command line as a whole (exit 130). (A running job's supervisor takes SIGINT itself.)
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TypeVar

T = TypeVar("T")

#: The longest the main thread sleeps at once while it waits on something else.
WAKE_S = 0.5


#: What a lock-based wait raises when Ctrl-C tore it (CPython's messages: threading's Lock, and RLock).
_TORN = ("release unlocked lock", "cannot release un-acquired lock")


@contextlib.contextmanager
def ctrl_c_whole() -> Iterator[None]:
    """Around a wait in the main thread: a Ctrl-C that tore the wait's lock comes out as the KeyboardInterrupt it
    is, not as the RuntimeError the lock's release raised after it."""
    try:
        yield
    except RuntimeError as exc:
        if isinstance(exc.__context__, KeyboardInterrupt) and str(exc) in _TORN:
            raise exc.__context__ from None
        raise


def slice_of(deadline: float | None) -> float:
    """Seconds to sleep now: at most :data:`WAKE_S`, and no further than the monotonic ``deadline`` (None: none)."""
    if deadline is None:
        return WAKE_S
    return max(0.0, min(WAKE_S, deadline - time.monotonic()))


def queue_get(source: queue.Queue[T], timeout: float) -> T:
    """``source.get(timeout=timeout)``, woken every :data:`WAKE_S`; raises :class:`queue.Empty` at the end."""
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        try:
            with ctrl_c_whole():
                return source.get(timeout=slice_of(deadline))
        except queue.Empty:
            if time.monotonic() >= deadline:
                raise


def future_done(future: Future[T], timeout: float) -> bool:
    """Whether ``future`` is done within ``timeout`` seconds, waiting in slices of :data:`WAKE_S`."""
    deadline = time.monotonic() + max(0.0, timeout)
    while not future.done():
        if time.monotonic() >= deadline:
            return False
        with ctrl_c_whole():
            wait([future], timeout=slice_of(deadline), return_when=FIRST_COMPLETED)
    return True


def exit_without_waiting(code: int) -> None:
    """After Ctrl-C, end now even where threads still wait on a node (a connect to a host that drops every
    packet lasts its whole connect_timeout): Python would join them before it exits. What the run had to record is
    written by then; the nodes' agents stop the job when clusterrun's connections close. Returns (the usual exit
    follows) when no thread is left."""
    import contextlib
    import logging
    import os
    import sys
    import threading

    # A worker of a thread pool is joined at exit even when it is a daemon (it is, when a daemon thread made the
    # pool): any thread left counts.
    if not any(t.is_alive() for t in threading.enumerate() if t is not threading.main_thread()):
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(code)
