"""The ``nvidia-smi topo -m`` matrix: how GPUs and NICs reach each other, and CPU/NUMA affinity.

Reads both layouts drivers print: NICs named in the matrix (``mlx5_0``, older drivers)
and NICs numbered ``NIC0..`` with a trailing ``NIC Legend`` (newer drivers, which also
add a ``GPU NUMA ID`` column). Columns may be tab- or space-separated. A matrix that
stops early (a short row, or rows missing for devices named in the header) raises
:class:`ParseError`: a half matrix would hide exactly the links doctor looks for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from clusterrun.errors import ParseError

TOOL = "nvidia-smi topo -m"

_LABELS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_CPUSET = re.compile(r"^\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*$")
_LEGEND_ENTRY = re.compile(r"^\s*(?:X|SYS|SOC|NODE|PHB|PXB|PIX|NV#|NV\d+)\s+=\s")
_NIC_LEGEND = re.compile(r"^\s*(?P<nic>NIC\d+)\s*:\s*(?P<hca>\S+)\s*$")
_GPU_NAME = re.compile(r"^GPU(\d+)$")


class LinkKind(Enum):
    """Connection types from the ``topo -m`` legend, closest first (``rank`` orders them)."""

    SELF = "X"
    NVLINK = "NV"  # a bonded set of NVLinks; Link.nvlinks says how many
    PIX = "PIX"  # at most one PCIe bridge
    PXB = "PXB"  # several PCIe bridges, no host bridge
    PHB = "PHB"  # through a PCIe host bridge (the CPU)
    NODE = "NODE"  # between host bridges within one NUMA node
    SYS = "SYS"  # across the CPU interconnect between NUMA nodes (QPI/UPI); old drivers say SOC

    @property
    def rank(self) -> int:
        """0 for SELF, then 1 (NVLink) to 6 (SYS): lower is closer."""
        return list(LinkKind).index(self)


@dataclass(frozen=True)
class Link:
    """One matrix cell, e.g. ``NV18`` (kind NVLINK, 18 links) or ``SYS``."""

    kind: LinkKind
    nvlinks: int = 0

    def __str__(self) -> str:
        return f"NV{self.nvlinks}" if self.kind is LinkKind.NVLINK else self.kind.value


@dataclass(frozen=True)
class Device:
    """A matrix row/column. ``hca`` is the RDMA device of a NIC (``mlx5_0``) when known."""

    name: str  # GPU0, NIC3, mlx5_0
    is_gpu: bool
    hca: str | None
    cpus: frozenset[int]  # empty when N/A or not printed (NIC rows)
    numa_nodes: frozenset[int]
    gpu_numa_id: int | None

    @property
    def gpu_index(self) -> int | None:
        match = _GPU_NAME.match(self.name)
        return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Topology:
    """The matrix. ``links[i][j]`` is the connection between ``devices[i]`` and ``devices[j]``."""

    devices: tuple[Device, ...]
    links: tuple[tuple[Link, ...], ...]

    @property
    def gpus(self) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.is_gpu)

    @property
    def nics(self) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if not d.is_gpu)

    def device(self, name: str) -> Device:
        """The device called ``name`` (``GPU0``, ``NIC1``, or a NIC's HCA name); KeyError if absent."""
        for d in self.devices:
            if name in (d.name, d.hca):
                return d
        raise KeyError(name)

    def link(self, a: str, b: str) -> Link:
        """The connection between two devices, by name."""
        return self.links[self.devices.index(self.device(a))][self.devices.index(self.device(b))]

    def nearest_nics(self, gpu: str) -> tuple[Device, ...]:
        """The NICs with the closest link to ``gpu`` (ties kept, matrix order); empty if no NICs."""
        nics = self.nics
        if not nics:
            return ()
        best = min(self.link(gpu, n.name).kind.rank for n in nics)
        return tuple(n for n in nics if self.link(gpu, n.name).kind.rank == best)


def parse(text: str) -> Topology:
    """Parse the output of ``nvidia-smi topo -m``.

    Returns the matrix with each device's CPU and NUMA affinity. Raises :class:`ParseError`
    naming the line when the text is not a ``topo -m`` matrix, a cell is not a legend
    value, or the matrix is truncated.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip()), None)
    if start is None:
        raise ParseError(TOOL, "empty output")
    names, labels = _header(lines[start], start + 1)
    rows: list[tuple[list[str], list[str], int, str]] = []  # (link cells, affinity cells, lineno, line)
    i = start + 1
    while i < len(lines) and lines[i].strip() and len(rows) < len(names):
        rows.append((*_row(lines[i], i + 1, names, labels, len(rows)), i + 1, lines[i]))
        i += 1
    if len(rows) < len(names):
        raise ParseError(TOOL, f"no row for {names[len(rows)]}: the matrix is truncated", line=lines[i - 1], lineno=i)
    legend = _legend(lines[i:], i + 1)
    devices = tuple(
        _device(name, extras, labels, legend, lineno, line)
        for name, (_, extras, lineno, line) in zip(names, rows, strict=True)
    )
    links = tuple(tuple(_cell(c, lineno, line) for c in cells) for cells, _, lineno, line in rows)
    return Topology(devices, links)


def _header(line: str, lineno: int) -> tuple[list[str], list[str]]:
    cut = min((line.find(label) for label in _LABELS if label in line), default=len(line))
    names, rest = line[:cut].split(), line[cut:]
    labels = [label for label in _LABELS if label in rest]
    leftover = rest
    for label in labels:
        leftover = leftover.replace(label, "")
    if not names or names[0] != "GPU0" or leftover.strip():
        raise ParseError(TOOL, "expected a header row 'GPU0 GPU1 ... CPU Affinity'", line=line, lineno=lineno)
    return names, labels


def _row(line: str, lineno: int, names: list[str], labels: list[str], at: int) -> tuple[list[str], list[str]]:
    """(link cells, affinity cells); checks the row is the expected device and complete."""
    tokens = line.split()
    if tokens[0] != names[at]:
        raise ParseError(TOOL, f"expected the row for {names[at]}", line=line, lineno=lineno)
    width = len(tokens) - 1
    if width not in (len(names), len(names) + len(labels)):
        raise ParseError(
            TOOL, f"row {names[at]} has {width} cells, expected {len(names)} links"
            f" (+{len(labels)} affinity): output truncated?", line=line, lineno=lineno,
        )
    return tokens[1 : 1 + len(names)], tokens[1 + len(names) :]


def _cell(cell: str, lineno: int, line: str) -> Link:
    if cell == "X":
        return Link(LinkKind.SELF)
    if re.fullmatch(r"NV\d+", cell):
        return Link(LinkKind.NVLINK, int(cell[2:]))
    if cell == "SOC":  # pre-2017 drivers' name for SYS
        return Link(LinkKind.SYS)
    try:
        return Link(LinkKind(cell))
    except ValueError:
        raise ParseError(TOOL, f"unknown link type {cell!r}", line=line, lineno=lineno) from None


def _legend(lines: list[str], first_lineno: int) -> dict[str, str]:
    """NIC name -> HCA name from a ``NIC Legend``; checks nothing else follows the matrix."""
    nics: dict[str, str] = {}
    for offset, line in enumerate(lines):
        stripped = line.strip()
        match = _NIC_LEGEND.match(line)
        if match:
            nics[match["nic"]] = match["hca"]
        elif stripped and stripped not in ("Legend:", "NIC Legend:") and not _LEGEND_ENTRY.match(line):
            raise ParseError(TOOL, "unexpected line after the matrix", line=line, lineno=first_lineno + offset)
    return nics


def _device(name: str, extras: list[str], labels: list[str], legend: dict[str, str], lineno: int, line: str) -> Device:
    values = dict(zip(labels, extras, strict=False))  # NIC rows have no affinity cells
    is_gpu = bool(_GPU_NAME.match(name))
    hca = None if is_gpu else legend.get(name, None if re.fullmatch(r"NIC\d+", name) else name)
    return Device(
        name=name,
        is_gpu=is_gpu,
        hca=hca,
        cpus=_cpuset(values.get("CPU Affinity"), lineno, line),
        numa_nodes=_cpuset(values.get("NUMA Affinity"), lineno, line),
        gpu_numa_id=_optional_int(values.get("GPU NUMA ID"), lineno, line),
    )


def _cpuset(value: str | None, lineno: int, line: str) -> frozenset[int]:
    if value is None or value == "N/A":
        return frozenset()
    if not _CPUSET.match(value):
        raise ParseError(TOOL, f"not a CPU list: {value!r}", line=line, lineno=lineno)
    out: set[int] = set()
    for part in value.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


def _optional_int(value: str | None, lineno: int, line: str) -> int | None:
    if value is None or value == "N/A":
        return None
    if not value.isdigit():
        raise ParseError(TOOL, f"not a NUMA id: {value!r}", line=line, lineno=lineno)
    return int(value)
