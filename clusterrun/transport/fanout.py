"""Do one thing on every node at once, within a deadline: per node a result or a typed error.

Every operation on many nodes (preflight, facts, starting agents, collecting logs, sweeps, probes)
goes through :func:`fan_out`. A node's :class:`~clusterrun.errors.ClusterrunError` is kept as its
error, typed, not turned into a string; a node still busy at the deadline gets a
:class:`~clusterrun.errors.CommandTimeout` and is not waited for (its thread is left to finish on
its own: every transport call has its own timeout). Anything that is not a ClusterrunError is a
bug and propagates. Ctrl-C propagates at once too: nodes still connecting are not waited for (the CLI
then exits without joining their threads, see ``clusterrun.cli.main``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from clusterrun.errors import ClusterrunError, CommandTimeout
from clusterrun.waits import ctrl_c_whole, slice_of

T = TypeVar("T")
N = TypeVar("N")

MAX_PARALLEL = 64


@dataclass
class FanOut(Generic[T]):
    """What :func:`fan_out` gathered: ``results`` of the nodes that worked, ``errors`` of the others."""

    results: dict[str, T] = field(default_factory=dict)
    errors: dict[str, ClusterrunError] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def problems(self) -> dict[str, str]:
        """One line per failed node: the error's ``reason`` (its message without the node's name)."""
        return {name: exc.reason for name, exc in self.errors.items()}


def fan_out(nodes: Iterable[N], name: Callable[[N], str], fn: Callable[[N], T], *, label: str = "node",
            deadline: float | None = None, max_parallel: int = MAX_PARALLEL) -> FanOut[T]:
    """``fn(node)`` for every node in parallel, at most ``max_parallel`` at once, for at most ``deadline`` seconds."""
    nodes = list(nodes)
    out: FanOut[T] = FanOut()
    if not nodes:
        return out
    pool = ThreadPoolExecutor(max_workers=min(max_parallel, len(nodes)), thread_name_prefix=label)
    futures: dict[Future[T], str] = {}
    interrupted = True  # until the loop ends by itself: Ctrl-C (or a bug) does not wait for nodes still busy
    try:
        with ctrl_c_whole():  # the threads' starts and the waits: Ctrl-C comes out whole (clusterrun.waits)
            futures = {pool.submit(fn, n): name(n) for n in nodes}
            end = None if deadline is None else time.monotonic() + deadline
            pending = set(futures)
            while pending:  # in slices: a Ctrl-C that the kernel gave another thread is seen (clusterrun.waits)
                done, pending = wait(pending, timeout=slice_of(end), return_when=FIRST_EXCEPTION)
                for future in done:
                    key = futures[future]
                    exc = future.exception()
                    if exc is None:
                        out.results[key] = future.result()
                    elif isinstance(exc, ClusterrunError):
                        out.errors[key] = exc
                    else:
                        raise exc
                if end is not None and time.monotonic() >= end:
                    for future in pending:
                        out.errors[futures[future]] = CommandTimeout(futures[future],
                                                                     f"{label}: no answer within {deadline:g}s")
                    break
        interrupted = False
    finally:
        pool.shutdown(wait=deadline is None and not interrupted, cancel_futures=True)
    # Keep the nodes' order, as callers print per node.
    order = [name(n) for n in nodes]
    out.results = {k: out.results[k] for k in order if k in out.results}
    out.errors = {k: out.errors[k] for k in order if k in out.errors}
    return out


def on_every_node(nodes: Iterable[N], name: Callable[[N], str], fn: Callable[[N], T],
                  label: str = "node", deadline: float | None = None) -> tuple[dict[str, T], dict[str, str]]:
    """:func:`fan_out`, as ``({name: result}, {name: reason})`` for callers that only report the reasons."""
    got = fan_out(nodes, name, fn, label=label, deadline=deadline)
    return got.results, got.problems


__all__ = ["MAX_PARALLEL", "FanOut", "fan_out", "on_every_node"]
