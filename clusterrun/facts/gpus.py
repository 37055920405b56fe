"""A node's GPUs as the plan sees them: which the node's environment allows, who uses each, how they connect.

The node reporter's ``gpu`` part (``clusterrun/remote/gpufacts.py``: nvidia-smi's own output) read with the
parsers of :mod:`clusterrun.facts.parsers.nvidia_smi` and :mod:`clusterrun.facts.parsers.topo`. Nothing here
raises on what a node said: an nvidia-smi that failed or hung, a topology matrix that does not parse or a
``CUDA_VISIBLE_DEVICES`` naming GPUs the node does not have become :attr:`NodeGpus.problems`, one sentence
each naming the node, and the part that could be read is kept. Where nvidia-smi is missing, fails or hangs, the
node's own ``CUDA_VISIBLE_DEVICES`` is still read (:func:`read_unlisted`): the run keeps the node's limit, never
renumbers it. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clusterrun.errors import ParseError
from clusterrun.facts.parsers import nvidia_smi, topo

ALLOW_BUSY_FLAG = "--allow-busy-gpus"
NPROC_FLAG = "--nproc-per-node"


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU; ``user`` and ``run_id`` (its CLUSTERRUN_RUN_ID) when the node could tell."""

    pid: int | None
    name: str
    memory_mib: int | None
    user: str | None = None
    run_id: str | None = None

    def describe(self) -> str:
        """``pid 4242 python (bob), 40960 MiB``."""
        who = f" ({self.user})" if self.user else ""
        memory = f", {self.memory_mib} MiB" if self.memory_mib is not None else ""
        return f"pid {self.pid if self.pid is not None else '?'} {self.name or '?'}{who}{memory}"


@dataclass(frozen=True)
class GpuUse:
    """One GPU by nvidia-smi: its physical index (nvidia-smi's, the one CUDA_VISIBLE_DEVICES takes), what it is,
    how much of it is in use and by which compute processes."""

    index: int
    uuid: str | None
    name: str | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    utilization_pct: int | None
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class NodeGpus:
    """What one node's GPUs are and which of them a run may take.

    ``allowed``: the physical indices the node's own CUDA_VISIBLE_DEVICES lets a process use, in its order (None:
    it is not set, every GPU); where nvidia-smi could not list the GPUs (``gpus`` empty), the indices it names, as
    the node's CUDA reads them. ``mig``: MIG instances it names instead (then none is chosen by index). ``names``:
    GPUs it names by UUID where nvidia-smi could not list the GPUs to number them (the run keeps the node's value).
    ``topology``: None when ``topo -m`` did not run or did not parse. ``apps_known``: the compute processes could
    be listed (else a GPU's use is judged by its memory alone). ``smi``: the node has nvidia-smi.
    """

    node: str
    gpus: tuple[GpuUse, ...]
    allowed: tuple[int, ...] | None = None
    visible: str | None = None  # CUDA_VISIBLE_DEVICES as the node sets it
    mig: tuple[str, ...] = ()
    topology: topo.Topology | None = None
    apps_known: bool = True
    problems: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    smi: bool = True

    @property
    def node_env(self) -> bool:
        """The node's CUDA_VISIBLE_DEVICES names GPUs clusterrun cannot number (MIG instances, or UUIDs nvidia-smi
        could not resolve): the run keeps it as the node sets it."""
        return bool(self.mig or self.names)

    @property
    def limited(self) -> bool:
        """nvidia-smi could not list the GPUs, but the node's CUDA_VISIBLE_DEVICES says which a process may use."""
        return not self.gpus and (bool(self.allowed) or bool(self.names))

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus)

    @property
    def offered(self) -> tuple[int, ...]:
        """The physical indices a run may use here, in the node's order."""
        return self.indices if self.allowed is None else self.allowed

    def gpu(self, index: int) -> GpuUse | None:
        return next((g for g in self.gpus if g.index == index), None)


def offered_indices(facts: NodeGpus | None, count: int | None) -> tuple[int, ...] | None:
    """The physical indices of the GPUs a process on the node may use: nvidia-smi's, cut to the node's
    CUDA_VISIBLE_DEVICES; where nvidia-smi could not list them, the indices the node's CUDA_VISIBLE_DEVICES names
    (never renumbered to 0..n-1); None where it names GPUs by UUID that could not be numbered; 0..count-1 (the
    reporter's count) without nvidia-smi's list or a limit, or where the node names MIG instances; None when
    nothing was reported."""
    if facts is not None and not facts.mig:
        if facts.gpus:
            return facts.offered
        if facts.names:
            return None
        if facts.allowed is not None and count:
            return facts.allowed
    return None if count is None else tuple(range(count))


def span(indices: Sequence[int]) -> str:
    """``0-3,6`` for [0, 1, 2, 3, 6]; in the order given when it is not ascending (``3,1``)."""
    items = list(indices)
    if items != sorted(items):
        return ",".join(str(i) for i in items)
    parts: list[str] = []
    for i in items:
        if parts and i == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{i}"
        else:
            parts.append(str(i))
    return ",".join(parts)


def read_unlisted(value: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """What CUDA makes of ``CUDA_VISIBLE_DEVICES=value`` where nvidia-smi could not list the node's GPUs:
    (indices, names). Entries are read up to the first that can name no GPU (``-1``, a word that is neither an
    index nor a UUID, an index named twice), as CUDA does; ``names`` holds every entry read when one of them is a
    UUID or MIG instance (the value cannot be numbered then), else the indices."""
    entries: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))) or entry in entries:
            break
        entries.append(entry)
    if all(e.isdigit() for e in entries):
        return tuple(int(e) for e in entries), ()
    return (), tuple(entries)


def whole_node(node_gpus: Sequence[int], in_way: Sequence[str], idle: int, *, busy: bool, leased: bool) -> str:
    """Why a run without a process count cannot start on a node (it takes every GPU the node allows,
    ``node_gpus``): ``in_way``, each GPU that is busy or leased in words; and the ways out: ``--nproc-per-node``
    with ``idle`` (the fewest idle GPUs of a node), and ``--allow-busy-gpus`` or ``up --wait-gpus``."""
    whole = f"without a process count the run takes every GPU the node allows ({span(node_gpus)}), one process each"
    if busy:
        why = f"{whole}, and one busy GPU slows every rank of the job" + (
            " (and two runs never share a GPU)" if leased else "")
    else:
        why = f"two runs never share a GPU, and {whole}"
    outs = [f"`{NPROC_FLAG} {idle}` takes the {idle} best idle GPU{'s' if idle > 1 else ''} on every node"
            ] if idle else []
    outs.append(f"add {ALLOW_BUSY_FLAG} to use busy GPUs anyway" if busy else "`up --wait-gpus` waits until they are free")
    return f"{'; '.join(in_way)}; {why}: {', or '.join(outs)}"


def _processes(text: str, owners: Mapping[str, Any]) -> dict[str, list[GpuProcess]]:
    apps = nvidia_smi.parse_compute_apps(text)
    if apps.error:
        raise ParseError(nvidia_smi.TOOL, apps.error)
    by_uuid: dict[str, list[GpuProcess]] = {}
    for p in apps.processes:
        owner = owners.get(str(p.pid)) if isinstance(owners, Mapping) else None
        owner = owner if isinstance(owner, Mapping) else {}
        by_uuid.setdefault(p.gpu_uuid or "", []).append(GpuProcess(
            p.pid, p.process_name or "", p.used_memory_mib, owner.get("user") or None, owner.get("run_id") or None))
    return by_uuid


def resolve_visible(value: str, gpus: Sequence[GpuUse]) -> tuple[tuple[int, ...], tuple[str, ...], str | None]:
    """What CUDA makes of ``CUDA_VISIBLE_DEVICES=value`` on these GPUs: (physical indices, MIG instances, the entry
    it stops at or None). As CUDA does, entries are read up to the first that names no GPU (an index the node does
    not have, an unknown or ambiguous UUID prefix, ``-1``), and that one and all after it are ignored."""
    indices: list[int] = []
    mig: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if entry.startswith("MIG-"):
            mig.append(entry)
            continue
        if entry.isdigit():
            found = [g.index for g in gpus if g.index == int(entry)]
        elif entry.startswith("GPU-"):
            found = [g.index for g in gpus if g.uuid and g.uuid.startswith(entry)]
        else:
            found = []
        if len(found) != 1 or found[0] in indices:
            return tuple(indices), tuple(mig), entry
        indices.append(found[0])
    return tuple(indices), tuple(mig), None


def parse(node: str, raw: Mapping[str, Any] | None) -> NodeGpus | None:
    """The node's GPUs from its reporter's ``gpu`` part; None when it sent no such part (no nvidia-smi there and
    no CUDA_VISIBLE_DEVICES set)."""
    if not isinstance(raw, Mapping):
        return None
    problems: list[str] = []
    gpus: list[GpuUse] = []
    smi = raw.get("smi") is not None
    query = raw.get("query")
    answered = False  # nvidia-smi listed the GPUs (perhaps none)
    if isinstance(query, str):
        try:
            parsed = nvidia_smi.parse(query)
            if parsed.error:
                problems.append(f"{node}: nvidia-smi failed: {parsed.error}")
            answered = not parsed.error
            gpus = [GpuUse(g.index, g.uuid, g.name, g.memory_used_mib, g.memory_total_mib, g.utilization_gpu_pct)
                    for g in parsed.gpus if g.index is not None]
        except ParseError as exc:
            problems.append(f"{node}: nvidia-smi --query-gpu printed what clusterrun cannot read ({exc})")
    elif smi:
        problems.append(f"{node}: nvidia-smi --query-gpu failed: {raw.get('query_error') or 'no output'}")
    apps_known = False
    apps = raw.get("apps")
    if isinstance(apps, str):
        try:
            by_uuid = _processes(apps, raw.get("owners") or {})
            gpus = [GpuUse(g.index, g.uuid, g.name, g.memory_used_mib, g.memory_total_mib, g.utilization_pct,
                           tuple(by_uuid.get(g.uuid or "", ()))) for g in gpus]
            apps_known = True
        except ParseError as exc:
            problems.append(f"{node}: nvidia-smi --query-compute-apps printed what clusterrun cannot read ({exc}); "
                            "GPUs judged by their memory in use")
    elif gpus:
        problems.append(f"{node}: nvidia-smi --query-compute-apps failed: {raw.get('apps_error') or 'no output'}; "
                        "GPUs judged by their memory in use")
    topology = None
    text = raw.get("topo")
    if isinstance(text, str):
        try:
            topology = topo.parse(text)
        except (ParseError, ValueError, IndexError) as exc:  # whatever a broken matrix makes of the parser: a line
            problems.append(f"{node}: nvidia-smi topo -m did not parse ({exc})")
    elif gpus:
        problems.append(f"{node}: nvidia-smi topo -m failed: {raw.get('topo_error') or 'no output'}")
    visible = raw.get("visible")
    allowed, mig, names = None, (), ()
    if isinstance(visible, str) and not gpus and not answered:
        # nvidia-smi is missing, failed or hung: the node's own limit still holds (an nvidia-smi that answered
        # with no GPU leaves nothing to limit)
        allowed, names = read_unlisted(visible)
    elif isinstance(visible, str) and gpus:
        allowed, mig, stop = resolve_visible(visible, gpus)
        if stop is not None and stop != "-1" and (stop or visible.strip()):
            kept = f"GPUs {span(allowed)} only" if allowed else "no GPU"
            problems.append(f"{node}: the node's CUDA_VISIBLE_DEVICES={visible} names {stop!r}, which is no GPU of "
                            f"this node (nvidia-smi lists {span([g.index for g in gpus])}); CUDA ignores it and what "
                            f"follows: {kept}")
    return NodeGpus(node, tuple(gpus), allowed, visible if isinstance(visible, str) else None, mig, topology,
                    apps_known, tuple(problems), names, smi)
