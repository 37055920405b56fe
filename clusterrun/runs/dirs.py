"""Run directories on the orchestrator: ``runs/<run-id>/``; what each run's ``status.json`` says is
:mod:`clusterrun.runs.record`.

Layout::

    runs/<run-id>/plan.json            the launch plan, exactly as executed
    runs/<run-id>/status.json          state, per node and per rank: exit code or signal, start and end
    runs/<run-id>/<node>/rank<R>.log   every line of global rank R (stdout and stderr, in arrival order)
    runs/<run-id>/<node>/launcher.log  torchrun's own messages on that node
    runs/<run-id>/attempt-<k>/         an earlier attempt of a restarted run: its node directories and plan
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clusterrun.planning.planfile import LaunchPlan

DEFAULT_RUNS_DIR = "runs"


def new_run_id(now: float | None = None) -> str:
    """Sortable and unique: ``20261123-101500-a1b2``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    return f"{stamp}-{secrets.token_hex(2)}"


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def atomic_write(path: Path, text: str, smaller: Callable[[], str] | None = None) -> None:
    """Write ``text`` to ``path`` whole or not at all. On a full disk, where ``path`` exists, it is written over in
    the space the file already holds (a run's last status must land): ``smaller()`` (the same content, compact)
    when ``text`` does not fit there; when neither fits, the file keeps what it had and the error is raised."""
    # Write beside, then rename: a reader (or a crash) never sees half a file. Only the user reads it (0600).
    tmp = path.with_name(f".{path.name}.tmp")
    data = text.encode("utf-8")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if exc.errno not in DISK_FULL or not path.exists():
            raise
        with open(path, "r+b") as fh:
            room = os.fstat(fh.fileno()).st_blocks * 512  # the blocks the file holds: writing there needs no more
            if len(data) > room and smaller is not None:
                data = smaller().encode("utf-8")
            if len(data) > room:
                raise
            fh.write(data)
            fh.truncate()


@dataclass
class RunDir:
    path: Path

    @classmethod
    def create(cls, base: str | Path, run_id: str) -> RunDir:
        path = Path(base) / run_id
        path.mkdir(parents=True, exist_ok=False, mode=0o700)  # logs may hold what the job printed: the user's only
        return cls(path)

    @property
    def run_id(self) -> str:
        return self.path.name

    def node_dir(self, node: str) -> Path:
        d = self.path / node
        d.mkdir(exist_ok=True)
        return d

    def rank_log(self, node: str, rank: int) -> Path:
        return self.path / node / f"rank{rank}.log"

    def open_rank_log(self, node: str, rank: int) -> IO[bytes]:
        """The rank's log, for appending raw bytes (unbuffered: what arrived is on disk at once)."""
        self.node_dir(node)
        return open(self.rank_log(node, rank), "ab", buffering=0)

    def launcher_log(self, node: str) -> Path:
        return self.node_dir(node) / "launcher.log"

    def write_json(self, name: str, data: Mapping[str, Any]) -> None:
        if name == "status.json":
            raise ValueError("status.json is written by clusterrun.runs.record.write_record only")
        atomic_write(self.path / name, json.dumps(data, indent=2, sort_keys=False) + "\n",
                     smaller=lambda: json.dumps(data, separators=(",", ":")) + "\n")

    def read_plan(self) -> LaunchPlan:
        from clusterrun.planning.planfile import LaunchPlan

        return LaunchPlan.from_dict(self.read_json("plan.json"))

    def read_json(self, name: str) -> dict[str, Any]:
        return json.loads((self.path / name).read_text(encoding="utf-8"))

    #: What stays at the top of a run directory across attempts; everything else is the latest attempt's.
    RUN_FILES = ("plan.json", "inventory.json", "status.json", "preflight.json",
                 # a detached run's: where its supervisor is, and the supervisor's own files (clusterrun/detached/)
                 "supervisor.json", "supervisor.pid", "supervisor.log", "console.log", "stop-request.json",
                 "notify-pending.json", "notify-sent.json")

    def archive_attempt(self, number: int) -> Path:
        """Move the finished attempt's files (node directories, stacks, dumps) into ``attempt-<number>/``, so the
        top always holds the attempt that runs now and the earlier ones are kept beside it."""
        dest = self.path / f"attempt-{number}"
        dest.mkdir(mode=0o700, exist_ok=True)
        for entry in sorted(self.path.iterdir()):
            if entry.name in self.RUN_FILES or entry.name.startswith(("attempt-", ".")) or entry == dest:
                continue
            os.replace(entry, dest / entry.name)
        for name in ("plan.json",):  # the plan that attempt ran
            if (self.path / name).is_file():
                (dest / name).write_bytes((self.path / name).read_bytes())
        return dest

    def attempt_dirs(self) -> list[Path]:
        """The earlier attempts' directories (``attempt-<k>/``), the latest first."""
        found = [p for p in self.path.glob("attempt-*") if p.is_dir() and p.name[8:].isdigit()]
        return sorted(found, key=lambda p: int(p.name[8:]), reverse=True)

    def rank_logs(self, node: str | None = None, rank: int | None = None) -> list[tuple[str, int, Path]]:
        """``(node, rank, path)`` of every rank log in ``runs/`` (optionally one node's, one rank's), in rank order.
        Each node's logs come from the latest attempt that holds any: the top for the nodes of the last attempt,
        ``attempt-<k>/`` for a node that earlier attempts had and later ones left out."""
        found: dict[str, list[tuple[int, Path]]] = {}
        for where in (self.path, *self.attempt_dirs()):
            per_node: dict[str, list[tuple[int, Path]]] = {}
            for path in where.glob("*/rank*.log"):
                r = int(path.stem[4:]) if path.stem[4:].isdigit() else -1
                per_node.setdefault(path.parent.name, []).append((r, path))
            for name, logs in per_node.items():
                found.setdefault(name, logs)
        out = [(name, r, path) for name, logs in found.items() for r, path in logs
               if (node is None or name == node) and (rank is None or r == rank)]
        return sorted(out, key=lambda x: (x[1], x[0]))

    def tail(self, node: str, rank: int, lines: int = 20) -> list[str]:
        try:
            text = self.rank_log(node, rank).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        return text.splitlines()[-lines:]


def list_runs(base: str | Path) -> list[RunDir]:
    """Every run directory under ``base`` (those with a plan.json), oldest first (run ids sort by time)."""
    root = Path(base)
    if not root.is_dir():
        return []
    return [RunDir(p) for p in sorted(root.iterdir()) if (p / "plan.json").is_file()]


def find_run(base: str | Path, ref: str) -> RunDir:
    """The run ``ref`` names: a full id, a unique prefix or suffix of one, or ``last``. Raises UsageError."""
    from clusterrun.errors import UsageError

    runs = list_runs(base)
    if not runs:
        raise UsageError(f"no runs in {base}/ (use --runs-dir to look elsewhere)")
    if ref == "last":
        return runs[-1]
    exact = [r for r in runs if r.run_id == ref]
    matches = exact or [r for r in runs if r.run_id.startswith(ref) or r.run_id.endswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UsageError(f"no run {ref!r} in {base}/; `clusterrun runs` lists them (the last is {runs[-1].run_id})")
    raise UsageError(f"{ref!r} matches {len(matches)} runs ({', '.join(r.run_id for r in matches[:5])}); give more of the id")
