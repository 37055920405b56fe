"""The rule timing bounds scale by (tests/loadscale.py): the 1-minute load per CPU above 1, at most 10."""

from __future__ import annotations

import os

import loadscale
import pytest


@pytest.mark.parametrize(("load", "cpus", "factor"), [(0.3, 2, 1.0), (2.0, 2, 1.0), (8.0, 2, 4.0), (9.0, 4, 2.25),
                                                      (60.0, 2, 10.0)])
def test_the_factor_is_the_load_per_cpu_from_1_to_10(monkeypatch: pytest.MonkeyPatch, load: float, cpus: int,
                                                    factor: float) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    monkeypatch.setattr(loadscale, "_cpus", lambda: cpus)
    assert loadscale.sample() == factor
    assert loadscale.hold() == factor and loadscale.scaled(0.5) == 0.5 * factor


def test_a_test_keeps_the_factor_it_started_with(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loadscale, "_cpus", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (8.0, 0.0, 0.0))
    loadscale.hold()
    monkeypatch.setattr(os, "getloadavg", lambda: (20.0, 0.0, 0.0))  # the load rose during the test
    assert loadscale.scaled(1.0) == 4.0
    assert loadscale.sample() == 10.0


def test_until_returns_once_the_condition_holds_and_false_at_the_deadline() -> None:
    calls: list[int] = []
    assert loadscale.until(lambda: len(calls) >= 3 or bool(calls.append(1)), 5.0, step=0.001)
    assert len(calls) == 3
    assert loadscale.until(lambda: False, 0.01, step=0.001) is False
