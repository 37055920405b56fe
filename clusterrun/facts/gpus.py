"""A node's GPUs as the plan sees them: which the node's environment allows, who uses each, how they connect.

The node reporter's ``gpu`` part (``clusterrun/remote/gpufacts.py``: nvidia-smi's own output) read with the
parsers of :mod:`clusterrun.facts.parsers.nvidia_smi` and :mod:`clusterrun.facts.parsers.topo`. Nothing here
raises on what a node said: an nvidia-smi that failed or hung, a topology matrix that does not parse or a
``CUDA_VISIBLE_DEVICES`` naming GPUs the node does not have become :attr:`NodeGpus.problems`, one sentence
each naming the node, and the part that could be read is kept. Where nvidia-smi is missing, fails or hangs, the
node's own ``CUDA_VISIBLE_DEVICES`` is still read (:func:`read_unlisted`): the run keeps the node's limit, never
renumbers it.

This is the one reading of a node's GPUs: ``up`` chooses from it (:mod:`clusterrun.planning.gpuchoice`) and doctor's GPU
checks judge it (each nvidia-smi call's exit status and output are kept in :attr:`NodeGpus.calls`, the evidence
doctor shows); :func:`busy` is the one rule of when a GPU is in use. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from clusterrun.errors import ParseError
from clusterrun.facts.parsers import nvidia_smi, topo
from clusterrun.remote import gpufacts

#: A GPU with more of its memory in use than this (by processes nvidia-smi may not list: another container's)
#: is busy; so is one with any compute process not of this run, or one this utilised.
BUSY_MEMORY_MIB = 1024
BUSY_UTILIZATION_PCT = 50
#: The uncorrected ECC errors since the driver loaded, as the reporter asks for them.
ECC_FIELD = "ecc.errors.uncorrected.volatile.total"
#: The reporter's columns where it did not say them (a reporter from before it asked for the ECC count).
OLD_FIELDS = ",".join(nvidia_smi.GPU_FIELDS)


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
    driver_version: str | None = None
    ecc_uncorrected: str | None = None  # nvidia-smi's word for the count (None: not reported or N/A)


@dataclass(frozen=True)
class SmiCall:
    """One nvidia-smi call as the node reporter ran it: the command, its exit status and output (127 and "not
    installed" without nvidia-smi), and what went wrong in words without the node's name: ``failure`` (it failed,
    or printed nvidia-smi's own failure) or ``unread`` (it answered with what clusterrun cannot read)."""

    command: str
    exit_code: int
    output: str
    failure: str | None = None
    unread: str | None = None


def busy(gpu: GpuUse, run_id: str = "") -> str | None:
    """Why ``gpu`` is busy, or None when it is idle: the one rule of ``up`` and ``doctor``. Busy: a compute
    process not of run ``run_id`` (the run's own, on a restart, do not count), else more than
    :data:`BUSY_MEMORY_MIB` in use by processes nvidia-smi does not list, else at least
    :data:`BUSY_UTILIZATION_PCT` % utilisation."""
    others = [p for p in gpu.processes if not (run_id and p.run_id == run_id)]
    if others:
        return "busy: " + "; ".join(p.describe() for p in others)
    if len(others) < len(gpu.processes):
        return None  # what is in use is this run's own
    if gpu.memory_used_mib is not None and gpu.memory_used_mib > BUSY_MEMORY_MIB:
        total = f" of {gpu.memory_total_mib}" if gpu.memory_total_mib else ""
        return f"busy: {gpu.memory_used_mib}{total} MiB in use by processes nvidia-smi does not list"
    if gpu.utilization_pct is not None and gpu.utilization_pct >= BUSY_UTILIZATION_PCT:
        return f"busy: {gpu.utilization_pct} % utilised"
    return None


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
    calls: Mapping[str, SmiCall] = field(default_factory=dict, compare=False)  # "query", "apps", "topo"
    ecc_queried: bool = False  # nvidia-smi printed the ECC counts

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


def _processes(text: str, owners: Mapping[str, Any]) -> tuple[dict[str, list[GpuProcess]], str | None]:
    """The compute processes by GPU UUID, and nvidia-smi's own failure where it printed one. Raises
    :class:`ParseError` on what clusterrun cannot read."""
    apps = nvidia_smi.parse_compute_apps(text)
    if apps.error:
        return {}, apps.error
    by_uuid: dict[str, list[GpuProcess]] = {}
    for p in apps.processes:
        owner = owners.get(str(p.pid)) if isinstance(owners, Mapping) else None
        owner = owner if isinstance(owner, Mapping) else {}
        by_uuid.setdefault(p.gpu_uuid or "", []).append(GpuProcess(
            p.pid, p.process_name or "", p.used_memory_mib, owner.get("user") or None, owner.get("run_id") or None))
    return by_uuid, None


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


def _tail(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _failed(raw: Mapping[str, Any], key: str, command: str, fields: tuple[str, ...]) -> SmiCall:
    """The call ``key`` that did not answer: its exit status and output as the reporter kept them."""
    code = raw.get(f"{key}_exit")
    output = raw.get(f"{key}_output")
    output = output if isinstance(output, str) else str(raw.get(f"{key}_error") or "")
    code = code if isinstance(code, int) and not isinstance(code, bool) else 1
    said = None
    if key == "query":
        try:  # nvidia-smi's own words for its failure, where it printed them
            said = nvidia_smi.parse(output, fields).error
        except ParseError:
            said = None
    what = "`nvidia-smi topo -m`" if key == "topo" else "nvidia-smi"
    failure = f"nvidia-smi failed: {said}" if said else f"{what} exited {code}: {_tail(output)}"
    return SmiCall(command, code, output, failure)


def _missing(commands: Mapping[str, str]) -> dict[str, SmiCall]:
    return {key: SmiCall(command, gpufacts.NOT_FOUND, f"{nvidia_smi.TOOL}: not installed",
                         "nvidia-smi not installed") for key, command in commands.items()}


def parse(node: str, raw: Mapping[str, Any] | None) -> NodeGpus | None:
    """The node's GPUs from its reporter's ``gpu`` part; None when it sent no such part (no nvidia-smi there and
    no CUDA_VISIBLE_DEVICES set)."""
    if not isinstance(raw, Mapping):
        return None
    problems: list[str] = []
    gpus: list[GpuUse] = []
    smi = raw.get("smi") is not None
    said = raw.get("fields")
    fields = tuple((said if isinstance(said, str) and said else OLD_FIELDS).split(","))
    commands = {key: " ".join(argv) for key, argv in gpufacts.commands(nvidia_smi.TOOL, ",".join(fields)).items()}
    calls = {} if smi else _missing(commands)
    query = raw.get("query")
    answered = ecc_queried = False  # nvidia-smi listed the GPUs (perhaps none); and their ECC counts
    if isinstance(query, str):
        failure = unread = None
        try:
            parsed = nvidia_smi.parse(query, fields)
            if parsed.error:
                problems.append(f"{node}: nvidia-smi failed: {parsed.error}")
                failure = f"nvidia-smi failed: {parsed.error}"
            answered = not parsed.error
            # Rows come in index order: without an index column (a recording), the position is the index.
            gpus = [GpuUse(n if g.index is None else g.index, g.uuid, g.name, g.memory_used_mib, g.memory_total_mib,
                           g.utilization_gpu_pct, driver_version=g.driver_version, ecc_uncorrected=g.value(ECC_FIELD))
                    for n, g in enumerate(parsed.gpus)]
            ecc_queried = any(ECC_FIELD in dict(g.values) for g in parsed.gpus)
        except ParseError as exc:
            problems.append(f"{node}: nvidia-smi --query-gpu printed what clusterrun cannot read ({exc})")
            unread = str(exc)
        calls["query"] = SmiCall(commands["query"], 0, query, failure, unread)
    elif smi:
        problems.append(f"{node}: nvidia-smi --query-gpu failed: {raw.get('query_error') or 'no output'}")
        calls["query"] = _failed(raw, "query", commands["query"], fields)
    apps_known = False
    apps = raw.get("apps")
    if isinstance(apps, str):
        failure = unread = None
        try:
            by_uuid, failure = _processes(apps, raw.get("owners") or {})
            if failure:
                failure = f"nvidia-smi failed: {failure}"
                problems.append(f"{node}: nvidia-smi --query-compute-apps: {failure}; GPUs judged by their memory "
                                "in use")
            else:
                gpus = [dataclasses.replace(g, processes=tuple(by_uuid.get(g.uuid or "", ()))) for g in gpus]
                apps_known = True
        except ParseError as exc:
            unread = str(exc)
            problems.append(f"{node}: nvidia-smi --query-compute-apps printed what clusterrun cannot read ({exc}); "
                            "GPUs judged by their memory in use")
        calls["apps"] = SmiCall(commands["apps"], 0, apps, failure, unread)
    elif smi:
        if gpus:
            problems.append(f"{node}: nvidia-smi --query-compute-apps failed: {raw.get('apps_error') or 'no output'}; "
                            "GPUs judged by their memory in use")
        calls["apps"] = _failed(raw, "apps", commands["apps"], fields)
    topology = None
    text = raw.get("topo")
    if isinstance(text, str):
        unread = None
        try:
            topology = topo.parse(text)
        except (ParseError, ValueError, IndexError) as exc:  # whatever a broken matrix makes of the parser: a line
            problems.append(f"{node}: nvidia-smi topo -m did not parse ({exc})")
            unread = str(exc)
        calls["topo"] = SmiCall(commands["topo"], 0, text, None, unread)
    elif smi:
        if gpus:
            problems.append(f"{node}: nvidia-smi topo -m failed: {raw.get('topo_error') or 'no output'}")
        calls["topo"] = _failed(raw, "topo", commands["topo"], fields)
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
                    apps_known, tuple(problems), names, smi, calls, ecc_queried)
