"""The supervisor's phase: one-way transitions, and each stop order sent once (see clusterrun/launch/phase.py)."""

from __future__ import annotations

import pytest

from clusterrun.launch.phase import NEXT, Phase, RunPhase


def _phase() -> tuple[RunPhase, list[str]]:
    sent: list[str] = []
    return RunPhase(sent.append), sent


def test_a_failure_sends_term_once_however_often_it_is_reported() -> None:
    phase, sent = _phase()
    assert phase.move(Phase.RUNNING)
    for _ in range(3):
        phase.stop(Phase.STOPPING)
    assert sent == ["term\n"]
    assert phase.phase is Phase.STOPPING and phase.stopping


def test_a_second_signal_sends_kill_once_after_term() -> None:
    phase, sent = _phase()
    phase.move(Phase.RUNNING)
    phase.stop(Phase.STOPPING)
    first = phase.stop_sent_at
    phase.stop(Phase.KILLING)
    phase.stop(Phase.KILLING)
    phase.stop(Phase.STOPPING)  # no way back from kill to term
    assert sent == ["term\n", "kill\n"]
    assert phase.phase is Phase.KILLING
    assert phase.stop_sent_at == first  # the stop clock counts from the first order


def test_kill_without_term_first_is_one_kill() -> None:
    phase, sent = _phase()
    phase.move(Phase.RUNNING)
    phase.stop(Phase.KILLING)
    assert sent == ["kill\n"]
    assert phase.since_stop(phase.stop_sent_at or 0.0) == 0.0


def test_a_run_that_is_not_stopping_has_no_stop_clock() -> None:
    phase, sent = _phase()
    phase.move(Phase.RUNNING)
    assert not phase.stopping and phase.since_stop(123.0) is None
    assert phase.move(Phase.ENDED)
    phase.stop(Phase.STOPPING)  # an ended run is told nothing
    assert sent == [] and phase.phase is Phase.ENDED


def test_transitions_only_run_forward() -> None:
    order = list(Phase)
    for here, allowed in NEXT.items():
        assert all(order.index(there) > order.index(here) for there in allowed), here
    phase, _ = _phase()
    phase.move(Phase.RUNNING)
    assert not phase.move(Phase.STARTING)
    assert phase.phase is Phase.RUNNING


def test_only_stop_phases_are_stop_orders() -> None:
    phase, _ = _phase()
    with pytest.raises(ValueError, match="not a stop phase"):
        phase.stop(Phase.RUNNING)
