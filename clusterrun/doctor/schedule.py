"""Round-robin pairings: every pair of nodes meets once, each node in at most one pair per round."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def round_robin(items: Sequence[T]) -> list[list[tuple[T, T]]]:
    """The circle method: N-1 rounds of N/2 pairs for even N, N rounds of (N-1)/2 pairs for odd N.

    Pairs of one round are disjoint, so a round's tests can all run at once without two of them
    sharing a node (or its NIC's bandwidth).
    """
    players: list[T | None] = list(items)
    if len(players) < 2:
        return []
    if len(players) % 2:
        players.append(None)  # the bye
    n = len(players)
    rounds: list[list[tuple[T, T]]] = []
    for _ in range(n - 1):
        pairs = [(players[i], players[n - 1 - i]) for i in range(n // 2)]
        rounds.append([(a, b) for a, b in pairs if a is not None and b is not None])
        players = [players[0], players[-1], *players[1:-1]]
    return rounds
