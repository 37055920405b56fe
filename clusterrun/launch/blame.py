"""Which node is at fault, from the paths between nodes that failed (and those that work).

One rule for the check before the start (:mod:`clusterrun.launch.pathcheck`) and the watch during the run
(:mod:`clusterrun.launch.watch`). A dead NIC makes every path through it fail, seen from both ends, so the node
in the most failed paths is the suspect: the master's NIC when no worker reaches the master, one worker's when
only its paths fail. On a tie (two nodes that lost each other, or one worker and the master), the evidence
decides in turn: a node clusterrun cannot hear either (it is down, not just its data path), a node with no path
that works (the other end reaches other nodes, so it is fine), the node that reported the most failures (its own
paths failed). What is still tied cannot be told apart: every such node is returned.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Sequence

#: A path between two nodes: (the node that tried, the node it tried to reach).
Path = tuple[str, str]


def at_fault(lost: Iterable[Path], order: Sequence[str], silent: Collection[str] = (),
             working: Iterable[Path] = ()) -> list[str]:
    """The nodes most likely at fault given the ``lost`` paths, best first (by node rank in ``order`` among
    equals); more than one when the evidence cannot tell them apart, none when nothing was lost. ``silent``: nodes
    clusterrun itself has not heard from lately; ``working``: paths seen to work."""
    lost = list(lost)
    if not lost:
        return []
    count = Counter(n for path in lost for n in path)
    top = max(count.values())
    candidates = [n for n, c in count.items() if c == top]
    candidates = [n for n in candidates if n in silent] or candidates
    fine = {n for path in working for n in path}
    candidates = [n for n in candidates if n not in fine] or candidates
    reporters = Counter(path[0] for path in lost)
    best = max(reporters[n] for n in candidates)
    rank = {name: i for i, name in enumerate(order)}
    return sorted((n for n in candidates if reporters[n] == best), key=lambda n: (rank.get(n, len(rank)), n))
