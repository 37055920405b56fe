"""The GPU leases a node reports (``leases`` in its ready check, ``clusterrun ps``): who holds which GPU.

A run leases each GPU it uses on a node for its whole life (``clusterrun/remote/leases.py``: a lock file the
kernel releases when the holder dies). The node reports the leases held now as ``{"<gpu>": {"run", "user",
"since", "pid", "node"}}``; :func:`parse_leases` reads that, :func:`held_gpus` turns the reports of a run's
nodes into what the GPU choice needs: per node, ``{gpu: "run R of alice since 17:00:03 (pid 4242)"}``; the GPU
decision (:mod:`clusterrun.planning.gpuchoice`) never takes a leased GPU. Pure.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Lease:
    """One lease held on a node: a GPU (or a master port) and the run that holds it."""

    key: int  # the GPU index (physical, as CUDA_VISIBLE_DEVICES names it) or the port
    run: str
    user: str
    since: float | None  # when the lease was taken (seconds since the epoch, the node's clock)
    pid: int | None  # the node agent holding it
    node: str = ""  # the inventory node name the holder gave

    def describe(self) -> str:
        """``run 20261125-170000-ab12 of alice since 17:00:03 (pid 4242)``."""
        when = time.strftime("%H:%M:%S", time.localtime(self.since)) if self.since is not None else "?"
        return f"run {self.run} of {self.user} since {when} (pid {self.pid if self.pid is not None else '?'})"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def parse_leases(raw: Any) -> dict[int, Lease]:
    """The node's ``leases`` report as {GPU index: lease}; entries not shaped as the node writes them are left
    out (a lease file another tool scribbled in must not stop a launch: the lock still holds on the node)."""
    out: dict[int, Lease] = {}
    if not isinstance(raw, Mapping):
        return out
    for key, record in raw.items():
        if not str(key).isdigit() or not isinstance(record, Mapping):
            continue
        pid = record.get("pid")
        out[int(key)] = Lease(int(key), str(record.get("run") or "?"), str(record.get("user") or "?"),
                              _number(record.get("since")), pid if isinstance(pid, int) else None,
                              str(record.get("node") or ""))
    return out


def held_gpus(reports: Mapping[str, Any], own_run: str) -> dict[str, dict[int, str]]:
    """Per node, the GPUs other runs hold there, each with its holder in words (``reports``: node -> its raw
    ``leases``). Leases of ``own_run`` are not in the way (two inventory nodes of one run on one machine)."""
    out: dict[str, dict[int, str]] = {}
    for node, raw in reports.items():
        held = {gpu: lease.describe() for gpu, lease in parse_leases(raw).items() if lease.run != own_run}
        if held:
            out[node] = held
    return out
