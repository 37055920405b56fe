"""The GPU leases a node reports (``leases`` in its ready check, ``clusterrun ps``): who holds which GPU.

A run leases each GPU it uses on a node for its whole life (``clusterrun/remote/leases.py``: a lock file the
kernel releases when the holder dies). The node reports the leases held now as ``{"<gpu>": {"run", "user",
"since", "pid", "node"}}``; :func:`parse_leases` reads that, :func:`held_gpus` turns the reports of a run's
nodes into what the GPU choice needs: per node, ``{gpu: "run R of alice since 17:00:03 (pid 4242)"}``, and
:func:`spare_leased_gpus` is the one place where those shape the plan (``launch.replan`` calls it): never a
leased GPU.

* a node whose GPUs were listed (inventory ``gpus:``, ``--gpus``) is used as listed: a listed GPU another run
  holds refuses the run, naming the GPU and the run, user and start time that hold it;
* a node whose GPUs nobody listed, without a process count, runs one process on every GPU it offers: one that
  another run holds refuses the run, naming the holder (never a smaller world size);
* with a process count, that many GPUs nobody holds (in index order); when too few are free the run is refused,
  naming the holders. Pure.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clusterrun.facts.gpus import whole_node
from clusterrun.inventory.models import Inventory, Node


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


WAIT_HINT = "two runs never share a GPU: `up --wait-gpus` waits until they are free"


def _holders(gpus: list[int], held: Mapping[int, str]) -> str:
    return "; ".join(f"GPU {g} is leased by {held[g]}" for g in gpus)


def spare_leased_gpus(given: Inventory, completed: Inventory, nproc: int | None,
                      offered: Mapping[str, Sequence[int] | None],
                      held: Mapping[str, Mapping[int, str]]) -> tuple[Inventory, list[str], dict[str, str]]:
    """``completed`` (the inventory with the GPUs the nodes reported, see ``complete_gpus``) with each node's
    GPUs clear of ``held`` (node -> {gpu: holder}); a line per node whose GPUs changed, and per node a problem
    where the run cannot have the GPUs it needs (the caller refuses the run: :class:`GpusLeased`).

    ``given``: the inventory as the user gave it (which nodes listed their GPUs); ``nproc``: the command line's
    process count; ``offered``: the physical indices of the GPUs each node offers. Without a process count a
    node runs one process on every GPU it offers: one another run holds refuses the run, never a smaller one."""
    listed = {n.name for n in given.nodes if n.gpus}
    nodes: list[Node] = []
    lines: list[str] = []
    problems: dict[str, str] = {}
    for node in completed.nodes:
        here = held.get(node.name) or {}
        pool = list(offered.get(node.name) or ())
        want = nproc or node.nproc_per_node or completed.defaults.nproc_per_node
        if node.spare or (not here and (node.gpus or not want or not pool)):
            nodes.append(node)
            continue
        if node.name in listed or not want:
            taken = [g for g in node.gpus or pool if g in here]
            if taken and node.name in listed:
                problems[node.name] = f"{_holders(taken, here)}; list other GPUs, or {WAIT_HINT}"
            elif taken:
                free = len([g for g in pool if g not in here])
                problems[node.name] = whole_node(node.gpus or pool, [f"GPU {g} is leased by {here[g]}" for g in taken],
                                                 free, busy=False, leased=True)
            nodes.append(node)
            continue
        free = [g for g in pool if g not in here]
        if len(free) < want:
            if here:  # without leases, a count above the GPUs is the user's to give (as before)
                problems[node.name] = (f"{want} GPU(s) needed, {len(free)} of {len(pool)} free; "
                                       f"{_holders(sorted(here), here)}; {WAIT_HINT}")
            nodes.append(node)
            continue
        chosen = free[:want]
        nodes.append(node.model_copy(update={"gpus": chosen}))
        if here:
            lines.append(f"{node.name}: {_holders(sorted(here), here)}; this run takes GPU(s) "
                         f"{','.join(map(str, chosen))}")
        else:
            lines.append(f"{node.name}: {len(pool)} GPU(s) seen, {want} process(es) take GPU(s) "
                         f"{','.join(map(str, chosen))}")
    changed = any(a is not b for a, b in zip(nodes, completed.nodes, strict=True))
    return (completed.model_copy(update={"nodes": nodes}) if changed else completed), lines, problems
