"""Helpers the benchmarks on the simulated cluster share: statistics, formatting, processes they started."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import time
from pathlib import Path


def node_agents(cluster, names: list[str]) -> list[int]:  # type: ignore[no-untyped-def]
    """The pids of the node agents on the simulated nodes ``names``, each found by its command line
    (``... prepare``)."""
    return [pid for name in names for pid, cmd in cluster.processes(name) if cmd.rstrip().endswith(" prepare")]


def med(values: list[float | None]) -> float | None:
    """The median of the values that were measured (None: not measured)."""
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def fmt(v: float | None, spec: str = ".2f") -> str:
    return format(v, spec) if v is not None else "n/a"


def local_session_left(sid: int) -> list[tuple[int, str]]:
    """Processes on this machine still in session ``sid`` (the orchestrator's local children)."""
    out = subprocess.run(["ps", "-o", "pid=,args=", "-s", str(sid)], capture_output=True, text=True,
                         timeout=30).stdout
    left = []
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        if pid.isdigit():
            left.append((int(pid), args.strip()))
    return left


def kill_pids(pids: list[int]) -> list[int]:
    """SIGKILL each of ``pids`` (processes the benchmark started); returns those that were still there."""
    killed = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


def save_results(result: dict, name: str) -> Path:
    """Write ``result`` to bench/results/<name>-<time>.json, say where, and return the path."""
    root = Path(__file__).resolve().parent.parent
    out_dir = root / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nsaved {out.relative_to(root)}")
    return out
