"""Timing bounds that stretch with the machine's load, so a busy machine does not fail a test that is right.

The rule: a bound of ``s`` seconds becomes ``scaled(s) = s * factor()``, where

    factor() = min(MAX_FACTOR, max(1, load / cpus))

``load`` is the 1-minute load average (``os.getloadavg()[0]``) and ``cpus`` the CPUs this process may run on. On an
idle or ordinarily busy machine the factor is 1 and every bound is as written; at load 8 on 2 CPUs a runnable
thread gets about a quarter of a CPU, everything takes about four times as long, and so does every bound. The
factor never exceeds ``MAX_FACTOR`` (10), so a test that hangs still ends.

What scales: timeouts a scenario is built from (a heartbeat or stop timeout, a path's ``dead_after``), waits for a
condition (``until``: the condition is polled up to the scaled deadline, and returns as soon as it holds), and
ceilings on how long something took ("nothing left within 5 s", "the send returned within 0.5 s"). Scaling a
wait for a condition weakens nothing: the condition must still come true. A scaled ceiling must stay below what
the wrong behaviour takes even at ``MAX_FACTOR`` (the webhook test's hook hangs 30 s; its ceilings reach 5 and
11 s): a ceiling that would not is left as written, or turned into a ratio. A scenario that needs one span longer
than another (a backlog longer than the heartbeat timeout) scales both, so the ratio it tests stays as written.

One test sees one factor: :func:`hold` (called by an autouse fixture in conftest.py before each test) samples it,
and every ``scaled`` in the test uses that sample, so spans that must keep their ratio cannot be scaled by
different factors. Outside a test, each call samples the load afresh.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

MAX_FACTOR = 10.0

_held: float | None = None


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def sample() -> float:
    """The factor for the machine's load now (1 when the load is at most one runnable task per CPU)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform: as if idle
        return 1.0
    return min(MAX_FACTOR, max(1.0, load / _cpus()))


def hold() -> float:
    """Sample the factor and keep it for every :func:`factor` until the next ``hold`` (one per test)."""
    global _held
    _held = sample()
    return _held


def factor() -> float:
    """The factor held for this test, or the load's factor now when none is held."""
    return sample() if _held is None else _held


def scaled(seconds: float) -> float:
    """``seconds`` times :func:`factor`: a timing bound as long as the machine's load makes it."""
    return seconds * factor()


def until(condition: Callable[[], bool], timeout: float, step: float = 0.02) -> bool:
    """Poll ``condition`` every ``step`` seconds until it holds (True) or ``scaled(timeout)`` passes (False)."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)  # poll step of a deadline-bounded wait
