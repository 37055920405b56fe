"""`clusterrun logs -f` over the files in runs/ (clusterrun/ops/tail.py): half lines wait for their rest, a file
that a restart's next attempt put in its place is read from its start, the events come after the lines."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from clusterrun.ops import tail
from clusterrun.ops.tail import NoLogs, Printer, print_logs
from clusterrun.runs import RunDir, RunRecord, RunState, write_record
from clusterrun.runs.timeline import when

EVENT = {"time": 1_700_000_000.0, "node": "n", "kind": "hang", "text": "no output for 60 s"}


def _run(tmp_path: Path, state: RunState, events: tuple[dict, ...] = ()) -> RunDir:
    run = RunDir.create(tmp_path / "runs", "20261127-120000-0001")
    write_record(run, RunRecord(run.run_id, state, started=1.0, pid=os.getpid(), events=events))
    return run


def _printer(lines: list[str], said: list[str]) -> Printer:
    return Printer(lines.append, lambda: None, said.append)


def _follow(run: RunDir, rounds: list[Callable[[], None]], lines: list[str], said: list[str]) -> int:
    """``logs -f`` of a detached run's mirror: each look between two reads makes the next change."""
    left = list(rounds)

    def refresh(quiet: bool) -> object:
        if quiet:
            left.pop(0)()
        return "looked"

    return print_logs(run, None, None, follow=True, printer=_printer(lines, said), refresh=refresh,
                      ended=lambda _path: None)


def test_follow_waits_for_half_lines_and_reads_a_replaced_file_from_its_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tail, "LOOK_EVERY", 0.0)
    run = _run(tmp_path, RunState.running)
    log = run.node_dir("n") / "rank0.log"
    log.write_bytes(b"one\nhal")

    def append() -> None:
        with open(log, "ab") as fh:
            fh.write(b"f\ntw")  # the half line's rest, and the start of a line that never ends in this file

    def restart() -> None:
        log.unlink()
        log.write_bytes(b"again\nend")  # the next attempt's file: it begins otherwise

    def over() -> None:
        write_record(run, RunRecord(run.run_id, RunState.succeeded, started=1.0, ended=2.0, exit_code=0,
                                    events=(EVENT,)))

    lines: list[str] = []
    said: list[str] = []
    assert _follow(run, [append, restart, over], lines, said) == 0
    assert lines == ["[n:0] one\n", "[n:0] half\n", "[n:0] again\n", "[n:0] end\n",
                     f"[clusterrun] {when(EVENT['time'])} n: no output for 60 s\n"]
    assert not said


def test_a_finished_run_prints_its_last_half_line_and_only_its_nodes_events(tmp_path: Path) -> None:
    run = _run(tmp_path, RunState.failed, events=(EVENT, {**EVENT, "node": "m", "text": "elsewhere"}))
    (run.node_dir("n") / "rank0.log").write_bytes(b"a\nno newline")
    (run.node_dir("m") / "rank1.log").write_bytes(b"b\n")
    lines: list[str] = []
    code = print_logs(run, "n", None, follow=True, printer=_printer(lines, []), refresh=lambda _quiet: None,
                      ended=lambda _path: None)
    assert code == 0
    assert lines == ["[n:0] a\n", "[n:0] no newline\n", f"[clusterrun] {when(EVENT['time'])} n: no output for 60 s\n"]


def test_no_matching_log_of_a_run_that_is_over_raises_with_its_record(tmp_path: Path) -> None:
    run = _run(tmp_path, RunState.failed)
    (run.node_dir("n") / "rank0.log").write_bytes(b"a\n")
    with pytest.raises(NoLogs) as raised:
        print_logs(run, None, 5, follow=True, printer=_printer([], []), refresh=lambda _quiet: None,
                   ended=lambda _path: None)
    assert raised.value.record.state is RunState.failed and raised.value.record.run_id == run.run_id
