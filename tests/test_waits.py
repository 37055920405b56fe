"""Ctrl-C ends the main thread's waits on nodes even when the kernel hands SIGINT to another thread (one that is
connecting to a node that drops every packet): the waits of clusterrun.waits wake at least every WAKE_S."""

from __future__ import annotations

import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

from clusterrun.transport.fanout import fan_out
from clusterrun.waits import WAKE_S, ctrl_c_whole, future_done, queue_get, slice_of


def _sigint_to_another_thread(after: float) -> threading.Event:
    """A thread that blocks (as a connect would) and gets the process's SIGINT ``after`` seconds from now."""
    release = threading.Event()
    holder = threading.Thread(target=release.wait, args=(30,), daemon=True)
    holder.start()
    assert holder.ident is not None
    threading.Timer(after, signal.pthread_kill, args=(holder.ident, signal.SIGINT)).start()
    return release


def _interrupted_within(wait: Callable[[], object]) -> float:
    started = time.monotonic()
    release = _sigint_to_another_thread(0.2)
    try:
        with pytest.raises(KeyboardInterrupt):
            wait()
    finally:
        release.set()
    return time.monotonic() - started


def test_a_queue_wait_sees_ctrl_c_given_to_another_thread() -> None:
    assert _interrupted_within(lambda: queue_get(queue.Queue(), 20)) < 0.2 + WAKE_S + 2


def test_a_future_wait_sees_ctrl_c_given_to_another_thread() -> None:
    assert _interrupted_within(lambda: future_done(Future(), 20)) < 0.2 + WAKE_S + 2


def test_the_fan_out_sees_ctrl_c_given_to_another_thread() -> None:
    gate = threading.Event()
    try:
        took = _interrupted_within(lambda: fan_out([1, 2], str, lambda n: gate.wait(20) if n == 2 else n))
    finally:
        gate.set()
    assert took < 0.2 + WAKE_S + 2


def test_the_waits_still_end_by_themselves() -> None:
    source: queue.Queue[int] = queue.Queue()
    threading.Timer(0.1, source.put, args=(7,)).start()
    assert queue_get(source, 20) == 7
    with pytest.raises(queue.Empty):
        queue_get(source, 0.05)
    done: Future[int] = Future()
    assert not future_done(done, 0.05)
    done.set_result(1)
    assert future_done(done, 0)
    assert slice_of(None) == WAKE_S and slice_of(time.monotonic() - 1) == 0.0


def _ctrl_c_after_the_lock_is_released(wait: Callable[[], object]) -> BaseException:
    """What ``wait`` raises when Ctrl-C lands where CPython can deliver it inside a lock-based wait: just after the
    wait released its condition's lock, before it began waiting (threading's ``Condition._release_save`` returns).
    A trace function raises the KeyboardInterrupt there, as the signal handler would."""

    def call(frame: Any, event: str, _arg: object) -> Any:
        if event == "call" and frame.f_code.co_name == "_release_save" and \
                frame.f_code.co_filename == threading.__file__:
            def ret(_frame: Any, event: str, _arg: object) -> Any:
                if event == "return":
                    sys.settrace(None)
                    raise KeyboardInterrupt
                return ret
            return ret
        return None

    sys.settrace(call)
    try:
        wait()
    except BaseException as exc:  # what came out is the answer
        return exc
    finally:
        sys.settrace(None)
    raise AssertionError("the wait returned")


def test_ctrl_c_that_tears_a_waits_lock_comes_out_as_ctrl_c() -> None:
    # The tear is real: a plain queue wait turns the Ctrl-C into the lock's RuntimeError.
    plain = _ctrl_c_after_the_lock_is_released(lambda: queue.Queue().get(timeout=5))
    assert isinstance(plain, RuntimeError) and isinstance(plain.__context__, KeyboardInterrupt)
    never: Future[int] = Future()
    for wait in (lambda: queue_get(queue.Queue(), 5), lambda: future_done(never, 5),
                 lambda: fan_out(["n"], str, lambda _n: threading.Event().wait(5))):
        assert isinstance(_ctrl_c_after_the_lock_is_released(wait), KeyboardInterrupt)


def test_other_runtime_errors_pass_through() -> None:
    with pytest.raises(RuntimeError, match="release unlocked lock"), ctrl_c_whole():
        raise RuntimeError("release unlocked lock")  # no Ctrl-C behind it
    with pytest.raises(RuntimeError, match="something else"), ctrl_c_whole():
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("something else") from None
