"""``nvidia-smi`` CSV queries and the banner of plain ``nvidia-smi``.

The commands doctor runs (with ``LC_ALL=C``):

* :data:`GPU_QUERY` → :func:`parse`: one :class:`Gpu` per line.
* :data:`APPS_QUERY` → :func:`parse_compute_apps`: one :class:`GpuProcess` per process.
* ``nvidia-smi`` with no arguments → :func:`parse_banner`: driver and CUDA version
  (``--query-gpu`` has no CUDA version field on older drivers).

Both CSV parsers also read the ``--format=csv`` form with a header and units (what
people paste into issues). nvidia-smi prints requested aliases under their canonical
names (``gpu_name`` → ``name``, ``used_memory`` → ``used_gpu_memory [MiB]``), so the
header, when present, decides the columns. Values nvidia-smi cannot give
(``N/A``, ``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``...) become ``None``.
nvidia-smi's own failures ("couldn't communicate with the NVIDIA driver", "No
devices were found") are returned in ``error``, not raised: they are findings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clusterrun.errors import ParseError

TOOL = "nvidia-smi"

GPU_FIELDS: tuple[str, ...] = (
    "index", "uuid", "name", "pci.bus_id", "driver_version", "memory.total", "memory.used", "utilization.gpu",
)
APP_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "process_name", "used_memory")
GPU_QUERY: tuple[str, ...] = ("nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits")
APPS_QUERY: tuple[str, ...] = (
    "nvidia-smi", f"--query-compute-apps={','.join(APP_FIELDS)}", "--format=csv,noheader,nounits",
)

# Requested name -> the canonical name nvidia-smi prints in the header.
_ALIASES = {"gpu_name": "name", "gpu_bus_id": "pci.bus_id", "gpu_uuid": "uuid"}
_APP_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}
# A header cell: a field name, optionally followed by its unit ("memory.used [MiB]").
_HEADER_CELL = re.compile(r"^(?P<field>[a-z][a-z0-9_.]*)(?: \[(?P<unit>[^\]]+)\])?$")
_KNOWN = frozenset({
    "index", "uuid", "name", "pci.bus_id", "driver_version", "memory.total", "memory.used", "memory.free",
    "utilization.gpu", "utilization.memory", "vbios_version", "compute_cap", "pstate", "timestamp",
    "gpu_uuid", "gpu_name", "gpu_bus_id", "pid", "process_name", "used_gpu_memory", "temperature.gpu",
    "power.draw", "power.limit", "serial", "count",
})
_NUMBER_WITH_UNIT = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(?:MiB|GiB|%|W|MHz|C)$")
_FAILURES = (
    "couldn't communicate with the NVIDIA driver",
    "No devices were found",
    "Failed to initialize NVML",
    "is not a valid field to query",
    "Unable to determine the device handle",
)
_BANNER = re.compile(r"NVIDIA-SMI\s+(?P<smi>\S+)\s+Driver Version:\s+(?P<driver>\S+)(?:\s+CUDA Version:\s+(?P<cuda>[\d.]+|N/A))?")


@dataclass(frozen=True)
class Gpu:
    """One GPU row. Typed fields are ``None`` when not queried or not available.

    ``values`` holds every column as printed (canonical field name, value or None).
    """

    index: int | None
    uuid: str | None
    name: str | None
    pci_bus_id: str | None
    driver_version: str | None
    memory_total_mib: int | None
    memory_used_mib: int | None
    utilization_gpu_pct: int | None
    values: tuple[tuple[str, str | None], ...]

    def value(self, field: str) -> str | None:
        """The raw value of ``field`` (canonical name), ``None`` if absent or unavailable."""
        return dict(self.values).get(_ALIASES.get(field, field))


@dataclass(frozen=True)
class GpuQuery:
    """What ``--query-gpu`` printed: GPUs in index order, warnings, or nvidia-smi's own error."""

    gpus: tuple[Gpu, ...]
    warnings: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class GpuProcess:
    """One compute process on a GPU (from ``--query-compute-apps``)."""

    gpu_uuid: str | None
    pid: int | None
    process_name: str | None
    used_memory_mib: int | None
    values: tuple[tuple[str, str | None], ...]

    def value(self, field: str) -> str | None:
        """The raw value of ``field`` (canonical name, e.g. ``gpu_name``), ``None`` if absent."""
        return dict(self.values).get(_APP_ALIASES.get(field, field))


@dataclass(frozen=True)
class ComputeApps:
    """What ``--query-compute-apps`` printed; no processes is an empty tuple."""

    processes: tuple[GpuProcess, ...]
    warnings: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class SmiBanner:
    """Versions from the first box of plain ``nvidia-smi``; ``cuda_version`` None when it says N/A."""

    smi_version: str
    driver_version: str
    cuda_version: str | None


def parse(text: str, fields: tuple[str, ...] = GPU_FIELDS) -> GpuQuery:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]``.

    ``fields`` names the columns when there is no header (the default is :data:`GPU_QUERY`'s).
    Raises :class:`ParseError` on empty output, a row with the wrong number of columns, or a
    number that is not one.
    """
    columns, rows, warnings, error = _table(text, fields, _ALIASES, allow_empty=False)
    gpus = tuple(
        Gpu(
            index=_int(cells, "index", line, lineno),
            uuid=cells.get("uuid"),
            name=cells.get("name"),
            pci_bus_id=cells.get("pci.bus_id"),
            driver_version=cells.get("driver_version"),
            memory_total_mib=_int(cells, "memory.total", line, lineno),
            memory_used_mib=_int(cells, "memory.used", line, lineno),
            utilization_gpu_pct=_int(cells, "utilization.gpu", line, lineno),
            values=tuple((c, cells[c]) for c in columns),
        )
        for lineno, line, cells in rows
    )
    return GpuQuery(gpus, warnings, error)


def parse_compute_apps(text: str, fields: tuple[str, ...] = APP_FIELDS) -> ComputeApps:
    """Parse ``nvidia-smi --query-compute-apps=<fields> --format=csv[,noheader][,nounits]``.

    Empty output (no header, no processes) means no processes. Raises :class:`ParseError`
    on rows that do not fit the columns.
    """
    columns, rows, warnings, error = _table(text, fields, _APP_ALIASES, allow_empty=True)
    processes = tuple(
        GpuProcess(
            gpu_uuid=cells.get("gpu_uuid"),
            pid=_int(cells, "pid", line, lineno),
            process_name=cells.get("process_name"),
            used_memory_mib=_int(cells, "used_gpu_memory", line, lineno),
            values=tuple((c, cells[c]) for c in columns),
        )
        for lineno, line, cells in rows
    )
    return ComputeApps(processes, warnings, error)


def parse_banner(text: str) -> SmiBanner:
    """Parse the versions line of plain ``nvidia-smi``. Raises :class:`ParseError` when absent."""
    for line in text.splitlines():
        match = _BANNER.search(line)
        if match:
            cuda = match["cuda"]
            return SmiBanner(match["smi"], match["driver"], None if cuda in (None, "N/A") else cuda)
    lineno, first = _first_line(text)
    raise ParseError(TOOL, "no 'NVIDIA-SMI ... Driver Version' line", line=first, lineno=lineno)


Row = tuple[int, str, dict[str, str | None]]


def _table(
    text: str, fields: tuple[str, ...], aliases: dict[str, str], *, allow_empty: bool
) -> tuple[tuple[str, ...], list[Row], tuple[str, ...], str | None]:
    """Split CSV output into (columns, rows, warnings, nvidia-smi error)."""
    lines = [(n, line.rstrip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    for _, line in lines:
        if any(marker in line for marker in _FAILURES):
            return (), [], (), line.strip()
    warnings = tuple(line.strip() for _, line in lines if line.lstrip().startswith("WARNING"))
    lines = [(n, line) for n, line in lines if not line.lstrip().startswith("WARNING")]
    if not lines:
        if allow_empty:
            return (), [], warnings, None
        raise ParseError(TOOL, "empty output")
    columns = _header(lines[0][1])
    if columns is not None:
        lines = lines[1:]
    else:
        columns = tuple(aliases.get(f, f) for f in fields)
    rows = [(n, line, _cells(line, n, columns)) for n, line in lines]
    return columns, rows, warnings, None


def _header(line: str) -> tuple[str, ...] | None:
    """Canonical column names if ``line`` is a CSV header, else None."""
    matches = [_HEADER_CELL.match(cell.strip()) for cell in line.split(",")]
    if not all(matches) or not any(m["field"] in _KNOWN for m in matches if m):
        return None
    return tuple(m["field"] for m in matches if m)


def _cells(line: str, lineno: int, columns: tuple[str, ...]) -> dict[str, str | None]:
    parts = [p.strip() for p in line.split(",")]
    if len(parts) > len(columns) and "process_name" in columns:
        # A process name with commas in it: give the extra cells back to it.
        at, extra = columns.index("process_name"), len(parts) - len(columns)
        parts[at : at + extra + 1] = [", ".join(parts[at : at + extra + 1])]
    if len(parts) != len(columns):
        raise ParseError(
            TOOL, f"expected {len(columns)} columns ({', '.join(columns)}), found {len(parts)}", line=line, lineno=lineno
        )
    return {c: _value(v) for c, v in zip(columns, parts, strict=True)}


def _value(raw: str) -> str | None:
    if raw in ("", "N/A") or (raw.startswith("[") and raw.endswith("]")):
        return None  # [N/A], [Not Supported], [Unknown Error], [Insufficient Permissions], ...
    match = _NUMBER_WITH_UNIT.match(raw)
    return match.group(1) if match else raw


def _int(cells: dict[str, str | None], field: str, line: str, lineno: int) -> int | None:
    raw = cells.get(field)
    if raw is None:
        return None
    try:
        return int(float(raw)) if "." in raw else int(raw)
    except ValueError:
        raise ParseError(TOOL, f"{field} is not a number: {raw!r}", line=line, lineno=lineno) from None


def _first_line(text: str) -> tuple[int | None, str | None]:
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            return n, line
    return None, None
