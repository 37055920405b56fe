"""Rank output from the nodes into ``runs/<id>/<node>/rank<R>.log`` and onto the terminal, counted.

Every byte a node agent sends of a rank's stdout or stderr is appended to that rank's log as it
arrived (whole records: the agent never interleaves the two streams inside a line) and handed to
the console, which may show less (``--ranks``, ``-q``, shortened lines, rate-limited progress bars)
but never changes what is logged. Bytes and lines are counted per rank and stream, so that the
end of a run can compare them with what each node says its files hold (:meth:`LogRelay.gaps`).
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from clusterrun.launch.console import Console
from clusterrun.remote.answers import LogSize
from clusterrun.runs import RunDir

Key = tuple[str, int, str]  # (node, global rank, "stdout" | "stderr")


@dataclass
class Count:
    bytes: int = 0
    lines: int | None = 0


@dataclass(frozen=True)
class Gap:
    """Part of a rank's output that never reached runs/: on the node, it is still in ``where``."""

    node: str
    rank: int
    stream: str
    expected_bytes: int
    received_bytes: int
    missing_lines: int | None
    where: str

    def describe(self) -> str:
        lines = f"{self.missing_lines} line(s), " if self.missing_lines is not None else ""
        return (f"{self.node} rank {self.rank} {self.stream}: {lines}{self.expected_bytes - self.received_bytes} "
                f"byte(s) missing from runs/ (received {self.received_bytes} of {self.expected_bytes}); the whole "
                f"log stays on {self.node} in {self.where}")

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "rank": self.rank, "stream": self.stream, "expected_bytes": self.expected_bytes,
                "received_bytes": self.received_bytes, "missing_bytes": self.expected_bytes - self.received_bytes,
                "missing_lines": self.missing_lines, "where": self.where}


class LogRelay:
    """Writes rank logs and counts them. Used by one thread (the supervisor's loop, then the recovery).

    A write that fails (the disk is full) stops that rank file in runs/ where it is, says so once, and loses
    nothing: the job goes on, the output is still shown, only what reached the disk is counted, so the end of
    the run fetches the rest from the node (where torchrun's files hold it all) or reports it as a gap.
    """

    def __init__(self, run_dir: RunDir, console: Console | None, node_dirs: Mapping[str, str]) -> None:
        self.run_dir = run_dir
        self.console = console
        self.node_dirs = dict(node_dirs)  # node -> its run directory on the node (where torchrun's logs are)
        self.received: dict[Key, Count] = {}
        self.expected: dict[Key, Count] = {}
        self.reported: set[str] = set()  # nodes that said what their rank files hold
        self._files: dict[tuple[str, int], IO[bytes]] = {}
        self._stopped: set[tuple[str, int]] = set()  # rank files a write failed on: left as they are
        self.trouble: str | None = None  # the first failure to write into runs/, as said

    def write(self, node: str, rank: int, stream: str, data: bytes, more: bool = False, show: bool = True) -> None:
        """Append ``data`` (whole records, or the start of one when ``more``) to the rank's log; show it."""
        if not data:
            return
        written = self._append(node, rank, data)
        count = self.received.setdefault((node, rank, stream), Count())
        count.bytes += written
        if count.lines is not None:
            count.lines += data.count(b"\n", 0, written)
        if show and self.console is not None:
            self.console.rank_output(node, rank, stream, data, more)

    def _append(self, node: str, rank: int, data: bytes) -> int:
        """Bytes of ``data`` that reached the rank's log (all of them, unless the disk is full)."""
        if (node, rank) in self._stopped:
            return 0
        written = 0
        try:
            fh = self._files.get((node, rank))
            if fh is None:
                fh = self._files[(node, rank)] = self.run_dir.open_rank_log(node, rank)
            while written < len(data):  # unbuffered: a short write says how much landed
                done = fh.write(data[written:])
                if not done:
                    raise OSError(errno.ENOSPC, "no space left on device")
                written += done
        except OSError as exc:
            self._stopped.add((node, rank))
            self.failed(f"the log of rank {rank} ({node})", exc)
        return written

    def failed(self, what: str, exc: OSError) -> None:
        """A write into the run directory failed: say so the first time (the job goes on)."""
        if self.trouble is not None:
            return
        self.trouble = f"cannot write {what} in {self.run_dir.path}: {exc.strerror or exc}"
        if self.console is not None:
            self.console.info(f"{self.trouble}; the job goes on and its output is still shown here; every rank's "
                              "whole log stays on its node (<node run dir>/torchrun/) and is fetched at the end "
                              "if there is room by then")

    def save(self, relpath: str, data: bytes) -> str:
        """A file of the run (a stack dump, a flight record) into the run directory; a failure is said once (see
        :meth:`failed`). Returns its path."""
        path = self.run_dir.path / relpath
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        except OSError as exc:
            self.failed(relpath, exc)
        return str(path)

    def retry(self) -> None:
        """Let the end of the run write again to the rank files a failure stopped (from what they hold)."""
        for key in self._stopped:
            fh = self._files.pop(key, None)
            if fh is not None:
                with contextlib.suppress(OSError):
                    fh.close()
        self._stopped.clear()

    def expect(self, node: str, logs: Mapping[str, LogSize]) -> None:
        """Record what ``node`` says its rank files hold (its ``exit``'s ``logs``: by ``"<rank>/<stream>"``)."""
        self.reported.add(node)
        for key, info in logs.items():
            rank, _, stream = key.partition("/")
            if rank.isdigit():
                self.expected[(node, int(rank), stream or "stdout")] = Count(info.bytes, info.lines)

    def offsets(self, node: str) -> dict[str, int]:
        """Bytes received per ``"<rank>/<stream>"`` of ``node``: where fetching the rest starts."""
        return {f"{rank}/{stream}": c.bytes for (n, rank, stream), c in self.received.items() if n == node}

    def gaps(self, nodes: set[str] | None = None) -> list[Gap]:
        """Every rank file a node reported that runs/ holds less of."""
        out = []
        for (node, rank, stream), want in sorted(self.expected.items()):
            if nodes is not None and node not in nodes:
                continue
            got = self.received.get((node, rank, stream), Count())
            if got.bytes >= want.bytes:
                continue
            lines = want.lines - got.lines if want.lines is not None and got.lines is not None else None
            out.append(Gap(node, rank, stream, want.bytes, got.bytes, lines,
                           f"{self.node_dirs.get(node, '~/.clusterrun/runs')}/torchrun/"))
        return out

    def totals(self) -> dict[str, dict[str, int | None]]:
        """For status.json: per ``"<node>/<rank>/<stream>"``, bytes and lines received."""
        return {f"{n}/{r}/{s}": {"bytes": c.bytes, "lines": c.lines} for (n, r, s), c in sorted(self.received.items())}

    def close(self) -> None:
        if self.console is not None:
            self.console.tick(final=True)
        for fh in self._files.values():
            with contextlib.suppress(OSError):
                fh.close()
        self._files.clear()
