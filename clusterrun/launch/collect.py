"""One call of the node agent's ``collect`` mode: the rank log lines a node has beyond those already received.

Used after a broken stream (:mod:`clusterrun.launch.recover`, which also sweeps what is left of the run)
and to read a detached run's logs (:mod:`clusterrun.launch.remote_logs`, which stops nothing).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from clusterrun.launch.agent_cmd import agent_argv
from clusterrun.transport.base import Transport


@dataclass
class Collected:
    node: str
    lines: list[tuple[int, str, list[str]]] = field(default_factory=list)  # (rank, stream, new lines)
    skipped: int = 0  # older lines left on the node (over max_bytes)
    swept: list[int] = field(default_factory=list)  # processes stopped (sweep=True)
    alive: int | None = None  # processes of the run still there (sweep=False); None when unknown
    record: dict[str, Any] | None = None  # the node's exit.json once its torchrun ended
    exit_code: int = 0  # of the collect command itself
    tail: str = ""  # its last output lines, for a failure message

    @property
    def fetched(self) -> int:
        return sum(len(lines) for _r, _s, lines in self.lines)


def collect(transport: Transport, *, node: str, python: str, inline: bool, run_id: str, run_dir: str,
            rank_offset: int, received: Mapping[tuple[str, int, str], int], sweep: bool, grace: float,
            max_bytes: int, timeout: float) -> Collected:
    """Run ``collect`` on ``node``. Raises :class:`ClusterrunError` when the node cannot be reached."""
    skip = {f"{rank}/{stream}": n for (name, rank, stream), n in received.items() if name == node}
    spec = {"run_id": run_id, "node": node, "grace": grace, "run_dir": run_dir, "sweep": sweep,
            "rank_offset": rank_offset, "max_bytes": max_bytes, "skip": skip}
    res = transport.run(agent_argv(python, "collect", [base64.b64encode(json.dumps(spec).encode()).decode()],
                                   inline=inline), timeout=timeout)
    out = Collected(node, exit_code=res.exit_code, tail=res.tail(2))
    for line in res.stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        kind = event.get("ev")
        if kind == "log":
            out.lines.append((int(event["rank"]), str(event["stream"]), list(event.get("lines") or [])))
            out.skipped += int(event.get("skipped") or 0)
        elif kind == "swept":
            out.swept = list(event.get("pids") or [])
        elif kind == "alive":
            out.alive = len(event.get("pids") or [])
        elif kind == "record":
            out.record = event.get("exit")
    return out
