"""GPU checks: nvidia-smi works, and the GPUs the inventory lists (the only ones the job uses) exist, match,
are idle, have no ECC errors and sit well in the PCIe/NUMA topology. Pure: they read the ``nvidia_smi``,
``nvidia_apps`` and ``nvidia_topo`` sections of each node's probe."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import combinations

from clusterrun.doctor.facts import NodeFacts, Section
from clusterrun.doctor.model import Finding, Scope, Verdict
from clusterrun.doctor.probe import GPU_QUERY_FIELDS
from clusterrun.doctor.registry import Context, check
from clusterrun.errors import ParseError, PlanError
from clusterrun.facts.parsers import nvidia_smi, topo
from clusterrun.facts.parsers.nvidia_smi import Gpu, GpuProcess
from clusterrun.facts.parsers.topo import LinkKind
from clusterrun.inventory.hostlist import compress_numbers
from clusterrun.inventory.models import Node
from clusterrun.planning.network import resolve_data_network

ECC_FIELD = "ecc.errors.uncorrected.volatile.total"
NEEDS = "nodes with GPUs listed in the inventory"
UNPARSED_HINT = ("run the command on the node by hand; if its output looks right, report it together with this "
                 "evidence so doctor learns to read it")
DRIVER_HINT = ("check the driver on the node: run `nvidia-smi` by hand, `lsmod | grep nvidia`, `dmesg | grep -iE "
               "'nvrm|xid'`; reinstall the driver, or reboot after a driver or kernel update")


@dataclass(frozen=True)
class _Smi:
    """What nvidia-smi said on one node: GPUs by index, or why there are none."""

    section: Section | None
    gpus: dict[int, Gpu] = field(default_factory=dict)
    problem: str | None = None  # in words, without the node name
    unparsed: bool = False  # output doctor does not recognise (a warning, not a failure)

    def listed(self, node: Node) -> list[tuple[int, Gpu]]:
        return [(i, self.gpus[i]) for i in node.gpus if i in self.gpus]


def _tail(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _read_smi(facts: NodeFacts) -> _Smi:
    section = facts.section("nvidia_smi")
    if section is None:
        return _Smi(None, problem="the probe has no nvidia-smi output")
    if section.missing:
        return _Smi(section, problem="nvidia-smi not installed")
    try:
        query = nvidia_smi.parse(section.output, GPU_QUERY_FIELDS)
    except ParseError as exc:
        if section.ok:
            return _Smi(section, problem=str(exc), unparsed=True)
        query = None
    if query is not None and query.error:
        return _Smi(section, problem=f"nvidia-smi failed: {query.error}")
    if query is None or not section.ok:
        return _Smi(section, problem=f"nvidia-smi exited {section.exit_code}: {_tail(section.output)}")
    # Rows come in index order: without an index column, the position is the index.
    return _Smi(section, {g.index if g.index is not None else n: g for n, g in enumerate(query.gpus)})


def _finding(name: str, verdict: Verdict, node: str | None, summary: str, *sections: Section | None,
             **kw: object) -> Finding:
    evidence = tuple(s.evidence(node) for s in sections if s is not None)
    return Finding(name, verdict, summary, node=node, evidence=evidence, **kw)  # type: ignore[arg-type]


def _gpu_node(name: str, node: Node, facts: NodeFacts, *, any_listed: bool = True) -> _Smi | Finding:
    """The node's nvidia-smi view when a check can use it (with ``any_listed``: some listed GPU is there),
    else the finding that says why not."""
    if not node.gpus:
        return _finding(name, Verdict.skipped, node.name, f"{node.name}: no GPUs listed")
    smi = _read_smi(facts)
    if smi.unparsed:
        return _finding(name, Verdict.warned, node.name, f"{node.name}: cannot read nvidia-smi: {smi.problem}",
                        smi.section, hint=UNPARSED_HINT)
    if smi.problem:
        # Only the gist ("nvidia-smi failed"): gpu.present reports the whole error.
        gist = smi.problem.split(": ", 1)[0]
        return _finding(name, Verdict.skipped, node.name, f"{node.name}: {gist} (see gpu.present)", smi.section)
    if any_listed and not smi.listed(node):
        return _finding(name, Verdict.skipped, node.name, f"{node.name}: none of the listed GPUs present "
                        "(see gpu.indices)", smi.section)
    return smi


def _gpu_list(names: Iterable[str]) -> str:
    """``GPU0-3`` from ``GPU0``, ``GPU1``..."""
    return "GPU" + compress_numbers(int(g[3:]) for g in names)


def _models(gpus: Iterable[Gpu]) -> str:
    return " + ".join(sorted({g.name or "unknown model" for g in gpus}))


@check("gpu.present", "nvidia-smi works where the inventory lists GPUs", Scope.node, needs="every node")
def gpu_present(ctx: Context) -> Iterator[Finding]:
    name = "gpu.present"
    for node in ctx.reachable():
        n, smi = node.name, _read_smi(ctx.facts[node.name])
        if not node.gpus:
            if smi.gpus:
                yield _finding(name, Verdict.warned, n, f"{n}: nvidia-smi shows {len(smi.gpus)} GPUs "
                               f"({_models(smi.gpus.values())}) but the inventory lists none: they would not be used",
                               smi.section, subject="gpus", measured=f"{len(smi.gpus)} GPUs", expected="0 listed",
                               hint=f"add `gpus: {len(smi.gpus)}` to {n} in the inventory to train on them, or "
                                    "leave them out on purpose")
            else:
                yield _finding(name, Verdict.skipped, n, f"{n}: no GPUs listed", smi.section)
            continue
        listed = len(node.gpus)
        if smi.section is None:
            yield _finding(name, Verdict.skipped, n, f"{n}: {smi.problem}")
        elif smi.section.missing:
            yield _finding(name, Verdict.failed, n, f"nvidia-smi not installed on {n} but the inventory lists "
                           f"{listed} GPUs", smi.section, subject="nvidia-smi", measured="not installed",
                           expected=f"{listed} GPUs", hint="install the NVIDIA driver (it brings nvidia-smi) on "
                           f"{n}, or remove `gpus` from {n} in the inventory if it has no GPUs")
        elif smi.unparsed:
            yield _finding(name, Verdict.warned, n, f"{n}: cannot read nvidia-smi: {smi.problem}", smi.section,
                           subject="nvidia-smi", hint=UNPARSED_HINT)
        elif smi.problem:
            yield _finding(name, Verdict.failed, n, f"{n}: {smi.problem.rstrip('.')}; the inventory lists {listed} "
                           "GPUs", smi.section, subject="nvidia-smi", measured=f"exit {smi.section.exit_code}",
                           expected=f"{listed} GPUs", hint=DRIVER_HINT)
        else:
            drivers = ", ".join(sorted({g.driver_version for g in smi.gpus.values() if g.driver_version}))
            yield _finding(name, Verdict.passed, n, f"{n}: nvidia-smi sees {len(smi.gpus)} GPUs "
                           f"({_models(smi.gpus.values())}){f', driver {drivers}' if drivers else ''}; {listed} listed",
                           smi.section, subject="nvidia-smi", measured=f"{len(smi.gpus)} GPUs",
                           expected=f"{listed} listed", data={"gpus": sorted(smi.gpus), "driver": drivers or None})


@check("gpu.indices", "every listed GPU index exists", Scope.node, needs=NEEDS)
def gpu_indices(ctx: Context) -> Iterator[Finding]:
    name = "gpu.indices"
    for node in ctx.reachable():
        smi = _gpu_node(name, node, ctx.facts[node.name], any_listed=False)
        if isinstance(smi, Finding):
            yield smi
            continue
        n, have = node.name, compress_numbers(smi.gpus)
        missing = [i for i in node.gpus if i not in smi.gpus]
        if missing:
            yield _finding(name, Verdict.failed, n, f"{n}: GPU {compress_numbers(missing)} listed but not present (nvidia-smi "
                           f"shows GPU {have})", smi.section, subject=f"GPU{compress_numbers(missing)}",
                           measured=f"present: {have}", expected=f"listed: {compress_numbers(node.gpus)}",
                           hint=f"fix `gpus` for {n} in the inventory (`nvidia-smi -L` lists the GPUs); if a GPU "
                                "vanished, look for Xid 79 (fallen off the bus) in `dmesg` and drain the node",
                           data={"missing": missing, "present": sorted(smi.gpus)})
        else:
            yield _finding(name, Verdict.passed, n, f"{n}: all {len(node.gpus)} listed GPUs present "
                           f"(GPU {compress_numbers(node.gpus)})", smi.section, subject="gpus", measured=f"present: {have}",
                           expected=f"listed: {compress_numbers(node.gpus)}")


def _odd(name: str, what: str, values: dict[str, tuple[str, Section | None]], hint: str) -> Iterator[Finding]:
    """A warning for each node whose value differs from the most common one (ties: the first node's)."""
    if not values:
        return
    common = Counter(v for v, _ in values.values()).most_common(1)[0][0]
    others = [n for n, (v, _) in values.items() if v == common]
    ref = values[others[0]][1]
    for n, (value, section) in values.items():
        if value != common:
            yield _finding(name, Verdict.warned, n, f"{n}: {what} {value} differs from {common} on "
                           f"{', '.join(others)}", section, ref, subject=what, measured=value, expected=common,
                           hint=hint)


@check("gpu.model", "the same GPU model and driver on every node", Scope.cluster, needs=NEEDS)
def gpu_model(ctx: Context) -> Iterator[Finding]:
    name = "gpu.model"
    models: dict[str, tuple[str, Section | None]] = {}
    drivers: dict[str, tuple[str, Section | None]] = {}
    mixed = said = False
    for node in ctx.reachable():
        smi = _gpu_node(name, node, ctx.facts[node.name])
        if isinstance(smi, Finding):
            if node.gpus:  # nodes without GPUs are not compared
                said = True
                yield smi
            continue
        listed = [g for _, g in smi.listed(node)]
        models[node.name] = (_models(listed), smi.section)
        if len({g.name for g in listed}) > 1:
            mixed = True
            each = ", ".join(f"GPU{i} {g.name}" for i, g in smi.listed(node))
            yield _finding(name, Verdict.warned, node.name, f"{node.name}: mixed GPU models: {each}", smi.section,
                           subject="GPU model", measured=models[node.name][0], expected="one model",
                           hint=f"every rank waits for the slowest GPU: list only GPUs of one model in `gpus` "
                                f"for {node.name}")
        versions = sorted({g.driver_version for g in listed if g.driver_version})
        if versions:
            drivers[node.name] = (", ".join(versions), smi.section)
    if not models:
        if not said:
            yield _finding(name, Verdict.skipped, None, "no node lists GPUs")
        return
    odd_models = list(_odd(name, "GPU model", models, "every rank runs at the speed of the slowest GPU and mixed "
                           "memory sizes fail unevenly: use one GPU model on all nodes, or leave the odd nodes out"))
    yield from odd_models
    yield from _odd(name, "driver", drivers, "install the same NVIDIA driver version on every node (`nvidia-smi` "
                    "shows it); mixed drivers can mean mixed CUDA/NCCL behaviour")
    if not odd_models and not mixed:
        model = next(iter(models.values()))[0]
        driver = {d for d, _ in drivers.values()}
        yield _finding(name, Verdict.passed, None, f"{', '.join(models)}: {model} on every listed GPU"
                       f"{f', driver {driver.pop()}' if len(driver) == 1 else ''}",
                       *(s for _, s in models.values()), subject="GPU model", measured=model,
                       data={"models": {n: m for n, (m, _) in models.items()},
                             "drivers": {n: d for n, (d, _) in drivers.items()}})


def _read_apps(facts: NodeFacts) -> tuple[Section | None, tuple[GpuProcess, ...] | None, str | None]:
    """(section, processes or None when unknown, parse error)."""
    section = facts.section("nvidia_apps")
    if section is None or not section.ok:
        return section, None, None
    try:
        apps = nvidia_smi.parse_compute_apps(section.output)
    except ParseError as exc:
        return section, None, str(exc)
    return section, (None if apps.error else apps.processes), None


@check("gpu.busy", "no listed GPU is in use before the job starts", Scope.node, needs=NEEDS)
def gpu_busy(ctx: Context) -> Iterator[Finding]:
    name, limit = "gpu.busy", ctx.options.busy_memory_mib
    for node in ctx.reachable():
        facts = ctx.facts[node.name]
        smi = _gpu_node(name, node, facts)
        if isinstance(smi, Finding):
            yield smi
            continue
        n, listed = node.name, smi.listed(node)
        apps_section, processes, apps_error = _read_apps(facts)
        if apps_error:
            yield _finding(name, Verdict.warned, n, f"{n}: cannot read the compute process list: {apps_error}",
                           apps_section, subject="processes", hint=UNPARSED_HINT)
        used = [g.memory_used_mib for _, g in listed if g.memory_used_mib is not None]
        if not used and processes is None:
            yield _finding(name, Verdict.skipped, n, f"{n}: neither GPU memory use nor compute processes reported",
                           smi.section, apps_section)
            continue
        busy = False
        for i, g in listed:
            procs = [p for p in processes or () if g.uuid and p.gpu_uuid == g.uuid]
            mib = g.memory_used_mib
            if not procs and (mib is None or mib <= limit):
                continue
            busy = True
            who = ", ".join(f"pid {p.pid} {p.process_name or '(unknown)'}"
                            + (f" ({p.used_memory_mib} MiB)" if len(procs) > 1 else "") for p in procs)
            by = f" by {who}" if procs else ", no compute process listed (another container or a graphics client?)"
            kill = f"`kill {' '.join(str(p.pid) for p in procs)}`" if procs else "`kill PID`"
            yield _finding(name, Verdict.warned, n, f"{n}: GPU{i} busy: {'' if mib is None else f'{mib} MiB '}used{by}",
                           smi.section, apps_section, subject=f"GPU{i}",
                           measured=f"{'?' if mib is None else mib} MiB used, {len(procs)} processes",
                           expected=f"<= {limit} MiB, no processes",
                           hint=f"one busy GPU slows every rank: find the process (`nvidia-smi` on {n}) and stop it "
                                f"({kill}), or leave GPU{i} out of `gpus` for {n}",
                           data={"index": i, "uuid": g.uuid, "memory_used_mib": mib, "processes": [
                               {"pid": p.pid, "name": p.process_name, "used_memory_mib": p.used_memory_mib}
                               for p in procs]})
        if not busy:
            note = f" (at most {max(used)} MiB used)" if used else ""
            note += "; compute processes not listed" if processes is None else ""
            yield _finding(name, Verdict.passed, n, f"{n}: {len(listed)} GPUs, {_models(g for _, g in listed)}, "
                           f"none busy{note}", smi.section, apps_section, subject="gpus",
                           measured=f"max {max(used, default=0)} MiB used", expected=f"<= {limit} MiB, no processes")


@check("gpu.ecc", "no uncorrected ECC errors on the listed GPUs", Scope.node, needs=NEEDS)
def gpu_ecc(ctx: Context) -> Iterator[Finding]:
    name = "gpu.ecc"
    for node in ctx.reachable():
        smi = _gpu_node(name, node, ctx.facts[node.name])
        if isinstance(smi, Finding):
            yield smi
            continue
        n, listed = node.name, smi.listed(node)
        if not any(ECC_FIELD in dict(g.values) for _, g in listed):
            yield _finding(name, Verdict.skipped, n, f"{n}: ECC errors not queried", smi.section)
            continue
        counts: dict[int, int] = {}
        for i, g in listed:
            raw = g.value(ECC_FIELD)
            if raw is not None and not raw.isdigit():
                yield _finding(name, Verdict.warned, n, f"{n}: GPU{i} ECC error count is not a number: {raw!r}",
                               smi.section, subject=f"GPU{i}", hint=UNPARSED_HINT)
            elif raw is not None:
                counts[i] = int(raw)
        bad = {i: c for i, c in counts.items() if c > 0}
        for i, c in bad.items():
            yield _finding(name, Verdict.failed, n, f"{n}: GPU{i} has {c} uncorrected ECC errors since the driver "
                           "loaded", smi.section, subject=f"GPU{i}", measured=str(c), expected="0",
                           hint=f"drain {n}: see `nvidia-smi -q -d ECC -i {i}` (retired/remapped pages) and Xid 48/63/"
                                f"94/95 in `dmesg`, then reset the GPU (`nvidia-smi -r -i {i}`) or reboot; replace "
                                "it if the errors return", data={"index": i, "uncorrected_volatile": c})
        if not bad:
            summary = (f"{n}: no uncorrected ECC errors on {len(counts)} GPUs" if counts
                       else f"{n}: ECC not reported on {len(listed)} GPUs (ECC off or not supported)")
            yield _finding(name, Verdict.passed, n, summary, smi.section, subject="gpus",
                           measured="0" if counts else "N/A", expected="0")


def _data_nics(ctx: Context) -> dict[str, str | None]:
    try:
        network = resolve_data_network(ctx.inventory)
    except PlanError:
        return {}
    return {p.node: p.nic for p in network.paths}


@check("gpu.topology", "listed GPUs are near their NICs and balanced across NUMA nodes", Scope.node, needs=NEEDS)
def gpu_topology(ctx: Context) -> Iterator[Finding]:
    name, data_nics = "gpu.topology", _data_nics(ctx)
    for node in ctx.reachable():
        n, section = node.name, ctx.facts[node.name].section("nvidia_topo")
        if not node.gpus:
            yield _finding(name, Verdict.skipped, n, f"{n}: no GPUs listed")
            continue
        if section is None or not section.ok:
            why = ("the probe has no `nvidia-smi topo -m` output" if section is None else "nvidia-smi not installed"
                   if section.missing else f"`nvidia-smi topo -m` exited {section.exit_code}: {_tail(section.output)}")
            yield _finding(name, Verdict.skipped, n, f"{n}: no topology: {why}", section)
            continue
        try:
            t = topo.parse(section.output)
        except ParseError as exc:
            yield _finding(name, Verdict.warned, n, f"{n}: cannot read the GPU topology: {exc}", section,
                           subject="topology", hint=UNPARSED_HINT)
            continue
        present = {d.name for d in t.gpus}
        gpus = [f"GPU{i}" for i in node.gpus if f"GPU{i}" in present]
        if not gpus:
            yield _finding(name, Verdict.skipped, n, f"{n}: none of the listed GPUs is in the topology", section)
            continue
        pairs = {f"{a}-{b}": str(t.link(a, b)) for a, b in combinations(gpus, 2)}
        nearest = {g: [(nic.hca or nic.name, str(t.link(g, nic.name))) for nic in t.nearest_nics(g)] for g in gpus}
        numa: dict[str, list[str]] = {}
        for g in gpus:
            if t.device(g).numa_nodes:
                numa.setdefault(",".join(map(str, sorted(t.device(g).numa_nodes))), []).append(g)
        hcas = [nic.hca for nic in node.nics if nic.kind.is_rdma and nic.hca
                and any(nic.hca in (d.name, d.hca) for d in t.nics)]
        far = [g for g in gpus if hcas and min(t.link(g, h).kind.rank for h in hcas) == LinkKind.SYS.rank]

        links = ", ".join(f"{k} x{c}" for k, c in Counter(pairs.values()).most_common()) or "none (one GPU)"
        by_link: dict[str, list[str]] = {}
        for g, near in nearest.items():
            if near:
                by_link.setdefault(near[0][1], []).append(g)
        nics = "; ".join(f"{k} for {_gpu_list(v)}" for k, v in by_link.items()) or "none in the matrix"
        numa_text = ", ".join(f"{k}: {_gpu_list(v)}" for k, v in numa.items()) or "unknown"
        yield _finding(name, Verdict.passed, n, f"{n}: {len(gpus)} GPUs, links {links}; NUMA {numa_text}; nearest "
                       f"NIC {nics}", section, subject="topology", measured=links,
                       data={"gpu_links": pairs, "numa": numa, "rdma_hcas": hcas, "data_nic": data_nics.get(n),
                             "nearest_nic": {g: {"nics": [h for h, _ in v], "link": v[0][1]} if v else None
                                             for g, v in nearest.items()}})
        if far:
            better = sorted({h for g in far for h, k in nearest[g] if k != LinkKind.SYS.value})
            near_gpus = [g for g in gpus if g not in far]
            fix = (f"use an HCA on the same PCIe switch/NUMA node ({', '.join(better)}): list it under nics so it "
                   "goes into NCCL_IB_HCA" if better else "no HCA is closer to them")
            pin = f"; or pin the job to GPUs near {', '.join(hcas)} (gpus: {_gpu_list(near_gpus)[3:]})"
            yield _finding(name, Verdict.warned, n, f"{n}: {', '.join(far)} reach{'es' if len(far) == 1 else ''} "
                           f"{', '.join(hcas)} across the CPU interconnect (SYS)", section, subject=", ".join(hcas),
                           measured="SYS", expected="PIX/PXB/PHB/NODE",
                           hint="GPUDirect RDMA then crosses sockets and slows down: " + fix
                                + (pin if near_gpus else ""), data={"gpus": far, "hcas": hcas})
        if len(numa) > 1 and len({len(v) for v in numa.values()}) > 1:
            spread = " and ".join(f"{len(v)} on NUMA {k} ({_gpu_list(v)})" for k, v in numa.items())
            yield _finding(name, Verdict.warned, n, f"{n}: listed GPUs span NUMA nodes unevenly: {spread}", section,
                           subject="NUMA", measured=" + ".join(str(len(v)) for v in numa.values()),
                           expected="the same number per NUMA node",
                           hint="ranks on the crowded NUMA node share less CPU and memory bandwidth and hold back "
                                "the others: list the same number of GPUs per NUMA node, or all from one",
                           data={"numa": numa})
