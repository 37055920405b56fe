"""One launch request per `clusterrun up`: made once from the flags over the inventory's ``run`` settings, its modes
as enums, and the same request whether it is built here or read back from a detached run's spec."""

from __future__ import annotations

import dataclasses
import json

import click
import pytest

from clusterrun.cli.up_cmd import up
from clusterrun.inventory.models import RunSettings
from clusterrun.launch.settings import LaunchRequest, OnHang, OnPathLoss, Preflight, SupervisorSettings


def test_the_inventory_applies_unless_a_flag_is_given() -> None:
    run = RunSettings(path_watch=False, on_path_loss="warn", hang_timeout=900, on_hang="stop", max_restarts=2,
                      min_nodes=3, restart_backoff=1.5, sample_every=0, fold=False,
                      notify=["https://hooks.example/a"])
    plain = LaunchRequest.from_flags(run, world_size=8)
    s = plain.supervision
    assert (s.path_watch, s.on_path_loss, s.hang_timeout, s.on_hang, s.sample_every) == (
        False, OnPathLoss.warn, 900, OnHang.stop, 0)
    assert (plain.restarts.max_restarts, plain.restarts.min_nodes, plain.restarts.backoff) == (2, 3, 1.5)
    assert plain.preflight is Preflight.quick and not plain.detach and not plain.terminal.fold
    assert plain.notify == ("https://hooks.example/a",)

    flags = LaunchRequest.from_flags(run, world_size=8, preflight="off", detach=True, time_limit=60, grace=2.0,
                                     path_watch=True, on_path_loss="stop", hang_timeout=30, on_hang="wait",
                                     max_restarts=0, min_nodes=1, restart_backoff=0, wait_gpus=90,
                                     sample_every=5, notify=["https://hooks.example/b"], fold=True)
    s = flags.supervision
    assert (s.path_watch, s.on_path_loss, s.hang_timeout, s.on_hang, s.sample_every) == (
        True, OnPathLoss.stop, 30, OnHang.wait, 5)
    assert (s.timeout, s.grace, flags.wait_gpus) == (60, 2.0, 90)
    assert (flags.restarts.max_restarts, flags.restarts.min_nodes, flags.restarts.backoff) == (0, 1, 0)
    assert flags.preflight is Preflight.off and flags.detach and flags.terminal.fold
    # --notify adds to the inventory's webhooks
    assert flags.notify == ("https://hooks.example/a", "https://hooks.example/b")
    assert LaunchRequest.from_flags(RunSettings(), world_size=2).supervision.path_watch is True


@pytest.mark.parametrize(("world", "ranks", "fold", "folds"), [
    (8, None, None, True),  # the default: fold
    (8, None, False, False),  # --no-fold
    (1, None, True, False),  # one rank: no copy can come
    (8, {0}, None, False),  # one rank shown: no copy shown
    (8, {0, 4}, None, True),
])
def test_folding_waits_only_where_a_copy_can_come(world: int, ranks: set[int] | None, fold: bool | None,
                                                 folds: bool) -> None:
    request = LaunchRequest.from_flags(RunSettings(), world_size=world, ranks=ranks, fold=fold)
    assert request.terminal.fold is folds
    assert request.terminal.ranks == (frozenset(ranks) if ranks is not None else None)


def test_modes_read_back_from_a_detached_runs_spec_are_the_same_enums() -> None:
    """A detached run's supervisor gets the settings as JSON (clusterrun/detached/start.py): the modes travel as
    their values and come back as the same members."""
    settings = SupervisorSettings(on_path_loss=OnPathLoss.warn, on_hang=OnHang.stop, timeout=60)
    spec = json.loads(json.dumps(dataclasses.asdict(settings)))
    assert spec["on_path_loss"] == "warn" and spec["on_hang"] == "stop"
    back = SupervisorSettings(**spec)
    assert back == settings and back.on_path_loss is OnPathLoss.warn and back.on_hang is OnHang.stop
    assert back.paced(256).on_hang is OnHang.stop  # replace keeps them members


def test_a_mode_is_written_as_its_value() -> None:
    assert f"{Preflight.full}" == "full" and str(OnHang.wait) == "wait" and f"{OnPathLoss.warn:>5}" == " warn"
    with pytest.raises(ValueError):
        Preflight("fast")


def test_the_command_line_offers_every_mode_and_nothing_else() -> None:
    choices = {p.name: set(p.type.choices) for p in up.params
               if isinstance(p, click.Option) and isinstance(p.type, click.Choice)}
    assert choices["preflight"] == {m.value for m in Preflight}
    assert choices["on_path_loss"] == {m.value for m in OnPathLoss}
    assert choices["on_hang"] == {m.value for m in OnHang}
