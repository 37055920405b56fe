"""``clusterrun logs``: a run's rank logs, each line prefixed ``[node:rank]``, followed while the run goes on.

A run whose logs are in ``runs/`` is read there: each file from where the last round stopped, whole lines only while
the run goes on (a half line waits for its rest), a file that a restart's next attempt put in its place (it begins
otherwise) read again from its start; once the run is over, the half lines left and the events the watch saw. A
detached run's logs stayed on its nodes: they are read there (:func:`clusterrun.ops.logs.fetch`), every two seconds
while following, until nothing of the run is left, and then its end is recorded from what the nodes report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clusterrun.ops.logs import fetch, record_detached_end
from clusterrun.ops.mirror import LOOK_EVERY
from clusterrun.runs import RunDir, RunRecord, RunState, run_record
from clusterrun.runs.timeline import when

#: How much of each file's beginning is kept: a file that begins otherwise is another one.
HEAD = 256
#: Seconds between two reads of the files in ``runs/`` (a detached run's mirror: between two looks, LOOK_EVERY).
READ_EVERY = 0.5
#: Seconds between two reads of a detached run's logs on its nodes ...
FETCH_EVERY = 2.0
#: ... and how many of them in a row may miss a node (about 30 s) before following stops.
MAX_UNREACHABLE_ROUNDS = 15


class NoLogs(Exception):
    """No rank log of the run matches in ``runs/``, and the run is not going on; ``record`` says why (a detached
    run's logs stayed on its nodes)."""

    def __init__(self, record: RunRecord) -> None:
        super().__init__(f"no rank logs of run {record.run_id}")
        self.record = record


@dataclass(frozen=True)
class Printer:
    """Where ``logs`` prints: ``write`` a line (the ranks' and the events'), ``flush`` after each round, ``say`` a
    message for stderr."""

    write: Callable[[str], object]
    flush: Callable[[], object]
    say: Callable[[str], object]


def print_logs(run: RunDir, node: str | None, rank: int | None, *, follow: bool, printer: Printer,
               refresh: Callable[[bool], object], ended: Callable[[Path], object]) -> int:
    """Print the rank logs of ``run`` (one node's, one rank's); with ``follow``, until the run ends. The exit code.

    ``refresh(quiet)`` brings a detached run's mirror up to date (what the look found; None for any other run),
    ``ended(run_dir)`` follows a detached run's end recorded here. Raises :class:`NoLogs` when nothing matches."""
    supervised = refresh(False) is not None  # a detached run's logs come from its supervisor's record
    if run_record(run).state is RunState.detached:
        return follow_nodes(run, node, rank, follow=follow, printer=printer, ended=ended)
    files = _Files()
    while True:
        record = run_record(run)
        going = follow and record.state in (RunState.starting, RunState.running)
        logs = run.rank_logs(node, rank)
        if not logs and not going:
            if record.state is RunState.detached:  # it was detached while we waited: follow it on its nodes
                return follow_nodes(run, node, rank, follow=follow, printer=printer, ended=ended)
            raise NoLogs(record)
        for name, r, path in logs:
            for line in files.new_lines(path):
                printer.write(f"[{name}:{r}] {line.decode('utf-8', errors='replace')}\n")
        printer.flush()
        if not going:
            for path, rest in files.pending.items():
                printer.write(f"[{path.parent.name}:{path.stem[4:]}] {rest.decode('utf-8', errors='replace')}\n")
            for event in record.events:  # what the watch saw, after the lines
                if node is None or event.get("node") == node:
                    printer.write(f"[clusterrun] {when(event.get('time'))} {event.get('node')}: {event.get('text')}\n")
            return 0
        if supervised:
            time.sleep(LOOK_EVERY)
            refresh(True)
        else:
            time.sleep(READ_EVERY)


class _Files:
    """How far each rank log was read, its first bytes as read, and its half last line."""

    def __init__(self) -> None:
        self.offsets: dict[Path, int] = {}
        self.heads: dict[Path, bytes] = {}
        self.pending: dict[Path, bytes] = {}

    def new_lines(self, path: Path) -> list[bytes]:
        """The whole lines written to ``path`` since the last call (a half line waits for its rest)."""
        with open(path, "rb") as fh:
            head = self.heads.get(path, b"")
            if fh.read(len(head)) != head:  # another file in its place (a restart's next attempt): from its start
                self.offsets[path], self.heads[path] = 0, b""
                self.pending.pop(path, None)
            fh.seek(self.offsets.get(path, 0))
            data = self.pending.pop(path, b"") + fh.read()
            self.offsets[path] = fh.tell()
            if len(self.heads.get(path, b"")) < HEAD:
                fh.seek(0)
                self.heads[path] = fh.read(min(self.offsets[path], HEAD))
        *lines, rest = data.split(b"\n")
        if rest:
            self.pending[path] = rest
        return lines


def follow_nodes(run: RunDir, node: str | None, rank: int | None, *, follow: bool, printer: Printer,
                 ended: Callable[[Path], object]) -> int:
    """A detached run's logs live on its nodes: read them there (every 2 s with ``follow``, until nothing of it
    runs; then its end is recorded and ``ended(run_dir)`` called). The exit code."""
    received: dict[tuple[str, int, str], int] = {}
    unreachable_rounds = 0
    while True:
        results = fetch(run, received)
        for name, r in results.items():
            for rk, data in r.by_rank().items():
                if (node is None or name == node) and (rank is None or rk == rank):
                    for line in data.decode("utf-8", errors="replace").splitlines():
                        printer.write(f"[{name}:{rk}] {line}\n")
            if r.problem:
                printer.say(f"clusterrun: {name}: {r.problem}")
        printer.flush()
        problems = any(r.problem for r in results.values())
        unreachable_rounds = unreachable_rounds + 1 if problems else 0
        if not problems and not any(r.alive for r in results.values()):
            record_detached_end(run, results)
            ended(run.path)
            return 0
        if not follow:
            return 0
        if unreachable_rounds >= MAX_UNREACHABLE_ROUNDS:
            printer.say("clusterrun: stopped following: a node stayed unreachable; run `clusterrun logs` again later")
            return 1
        time.sleep(FETCH_EVERY)
