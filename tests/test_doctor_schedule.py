"""The pair scheduler: every pair exactly once, N-1 rounds for even N, no node twice in one round."""

from __future__ import annotations

import itertools

import pytest

from clusterrun.doctor.schedule import round_robin


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 8, 9, 16, 32, 33])
def test_every_pair_once_and_rounds_disjoint(n: int) -> None:
    nodes = [f"n{i}" for i in range(n)]
    rounds = round_robin(nodes)
    pairs = [frozenset(p) for r in rounds for p in r]
    assert len(pairs) == len(set(pairs)) == n * (n - 1) // 2
    assert set(pairs) == {frozenset(p) for p in itertools.combinations(nodes, 2)}
    for r in rounds:
        members = [x for p in r for x in p]
        assert len(members) == len(set(members)), r
    expected_rounds = 0 if n < 2 else (n - 1 if n % 2 == 0 else n)
    assert len(rounds) == expected_rounds
    if n % 2 == 0 and n:
        assert all(len(r) == n // 2 for r in rounds)  # every node busy in every round
