"""Do one thing on every node at once, and gather what worked and why the rest did not."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from clusterrun.errors import ClusterrunError

T = TypeVar("T")
N = TypeVar("N")

MAX_PARALLEL = 64


def on_every_node(nodes: Iterable[N], name: Callable[[N], str], fn: Callable[[N], T],
                  label: str = "node") -> tuple[dict[str, T], dict[str, str]]:
    """``fn(node)`` for every node in parallel: ``({name: result}, {name: reason})``.

    A node's :class:`ClusterrunError` becomes its reason (the one-line ``reason`` when the error has one);
    anything else is a bug and propagates.
    """
    nodes = list(nodes)
    results: dict[str, T] = {}
    problems: dict[str, str] = {}
    if not nodes:
        return results, problems
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(nodes)), thread_name_prefix=label) as pool:
        futures = {name(n): pool.submit(fn, n) for n in nodes}
        for key, future in futures.items():
            try:
                results[key] = future.result()
            except ClusterrunError as exc:
                problems[key] = getattr(exc, "reason", None) or str(exc)
    return results, problems
