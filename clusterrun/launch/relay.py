"""Rank output from the nodes into ``runs/<id>/<node>/rank<R>.log`` and onto the terminal, counted.

Every byte a node agent sends of a rank's stdout or stderr is appended to that rank's log as it
arrived (whole records: the agent never interleaves the two streams inside a line) and handed to
the console, which may show less (``--ranks``, ``-q``, shortened lines, rate-limited progress bars)
but never changes what is logged. Bytes and lines are counted per rank and stream, so that the
end of a run can compare them with what each node says its files hold (:meth:`LogRelay.gaps`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from clusterrun.launch.console import Console
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
    """Writes rank logs and counts them. Used by one thread (the supervisor's loop, then the recovery)."""

    def __init__(self, run_dir: RunDir, console: Console | None, node_dirs: Mapping[str, str]) -> None:
        self.run_dir = run_dir
        self.console = console
        self.node_dirs = dict(node_dirs)  # node -> its run directory on the node (where torchrun's logs are)
        self.received: dict[Key, Count] = {}
        self.expected: dict[Key, Count] = {}
        self.reported: set[str] = set()  # nodes that said what their rank files hold
        self._files: dict[tuple[str, int], IO[bytes]] = {}

    def write(self, node: str, rank: int, stream: str, data: bytes, more: bool = False, show: bool = True) -> None:
        """Append ``data`` (whole records, or the start of one when ``more``) to the rank's log; show it."""
        if not data:
            return
        fh = self._files.get((node, rank))
        if fh is None:
            fh = self._files[(node, rank)] = self.run_dir.open_rank_log(node, rank)
        fh.write(data)
        count = self.received.setdefault((node, rank, stream), Count())
        count.bytes += len(data)
        if count.lines is not None:
            count.lines += data.count(b"\n")
        if show and self.console is not None:
            self.console.rank_output(node, rank, stream, data, more)

    def expect(self, node: str, logs: Mapping[str, Any]) -> None:
        """Record what ``node`` says its rank files hold: ``{"<rank>/<stream>": {"bytes", "lines"}}``."""
        self.reported.add(node)
        for key, info in logs.items():
            rank, _, stream = key.partition("/")
            try:
                self.expected[(node, int(rank), stream or "stdout")] = Count(int(info["bytes"]), info.get("lines"))
            except (KeyError, TypeError, ValueError):
                continue

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
            fh.close()
        self._files.clear()
