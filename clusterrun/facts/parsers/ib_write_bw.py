"""The perftest ``ib_write_bw`` report (client or server side).

Expected command (doctor runs the server, then the client, both with a timeout)::

    ib_write_bw -d mlx5_0 -i 1 -F --report_gbits [-x <gid index>] -D 5 -p <port> [<server>]

The report is a parameter block, the QP addresses, and a results table whose unit is
Gb/sec with ``--report_gbits`` and MB/sec (2**20 bytes/s, perftest's ``0x100000``)
without it; newer perftest releases print that same unit as ``MiB/sec``. Real reports carry noise this parser keeps apart from the numbers:
"Conflicting CPU frequency" warnings printed inside the table, CUDA chatter before and
after it with ``--use_cuda``, and error lines ("Couldn't connect to ...", "Completion with
error") that end a run early; those give ``errors`` and a ``hint``, not an exception.
Latency reports (``ib_write_lat``) and text with no report raise :class:`ParseError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from clusterrun.errors import ParseError

TOOL = "ib_write_bw"

_DASHES = re.compile(r"^\s*-{20,}\s*$")
_TITLE = re.compile(r"^\s*(?P<title>[A-Za-z_ ]+ (?:BW|Latency) Test)\s*$")
_PARAM = re.compile(r"(?P<key>[A-Za-z][\w*. -]*?)\s*:\s*(?P<value>\S+)")
_TABLE_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(?P<unit>Gb|MB|MiB)/sec\]\s+BW average\[(?:Gb|MB|MiB)/sec\]")
_ROW = re.compile(r"^\s*(?P<bytes>\d+)\s+(?P<iters>\d+)\s+(?P<peak>\d+\.\d+)\s+(?P<avg>\d+\.\d+)\s+(?P<rate>\d+\.\d+)(?:\s+[\d.]+)*\s*$")
_NOISE = re.compile(r"^\s*(?:\*+|\* Waiting for client to connect\.\.\. \*|(?:local|remote) address:.*|GID: [\d:]+)\s*$")
_WARNING = re.compile(r"WARNING|Conflicting CPU frequency|CPU Frequency is not max|Test integrity may be harmed|"
                      r"Requested mtu is higher than active mtu", re.IGNORECASE)
_SIDE_CHANNEL = ("the TCP side channel to the peer failed: start the ib_write_bw server first, check the port (-p) "
                 "and that no firewall drops it")
_ERRORS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"Couldn't connect to \S+|Unable to (?:open file descriptor|init the socket connection)|"
                r"Failed to exchange data between server and clients|Couldn't read remote address"), _SIDE_CHANNEL),
    (re.compile(r"Failed status 12\b"), "transport retry counter exceeded: no RDMA path to the peer (different IB "
                "fabric or subnet, port down, or on RoCE a wrong GID index -x)"),
    (re.compile(r"Completion with error|Failed status \d+"), "an RDMA operation failed: check both ports are ACTIVE "
                "(ibstat), the GID index (-x) on RoCE, and that the nodes share a fabric"),
    (re.compile(r"IB device \S+ not found|No IB devices found|Couldn't get context for|Unable to find the "
                r"Infiniband/RoCE device|Couldn't get device"), "the HCA given with -d does not exist on this node: "
                "see ibv_devices or ibstat"),
    (re.compile(r"Failed to modify QP.*RTR"), "the queue pair could not connect (RTR): on RoCE usually a wrong GID "
                "index (-x) or an MTU mismatch"),
    (re.compile(r"Couldn't allocate MR|Couldn't create CQ|Cannot allocate memory|ibv_reg_mr"), "memory registration "
                "failed: raise the locked-memory limit (ulimit -l unlimited; docker --ulimit memlock=-1)"),
    (re.compile(r"Failed to complete run_iter_bw|Error occurred while running|^scnt=\d+"), "the test aborted"),
)


class BwUnit(Enum):
    """The table's unit: ``Gb/sec`` (10**9 bits/s, with --report_gbits), or ``MB/sec`` / ``MiB/sec``
    (both 2**20 bytes/s: newer perftest names its unit correctly)."""

    GBIT = "Gb/sec"
    MBYTE = "MB/sec"
    MIBYTE = "MiB/sec"

    def to_gbps(self, value: float) -> float:
        return value if self is BwUnit.GBIT else value * 2**20 * 8 / 1e9


@dataclass(frozen=True)
class BwRow:
    """One results line, bandwidths in the report's unit."""

    bytes: int
    iterations: int
    bw_peak: float
    bw_average: float
    msg_rate_mpps: float


@dataclass(frozen=True)
class IbWriteBwReport:
    """A parsed report. ``complete`` is True when the table was closed by its dashes line.

    ``errors`` lists perftest's error lines in order; ``hint`` explains the most specific one.
    """

    test: str | None
    device: str | None
    link_type: str | None  # IB or Ethernet (RoCE)
    gid_index: int | None
    mtu: int | None
    qps: int | None
    unit: BwUnit | None
    rows: tuple[BwRow, ...]
    complete: bool
    warnings: tuple[str, ...]
    errors: tuple[str, ...]
    hint: str | None

    @property
    def average_gbps(self) -> float | None:
        """Average bandwidth of the last (largest message) row, in Gb/s."""
        return self.unit.to_gbps(self.rows[-1].bw_average) if self.rows and self.unit else None

    @property
    def peak_gbps(self) -> float | None:
        """Peak bandwidth of the last row in Gb/s (0.0 with -D, where perftest does not measure it)."""
        return self.unit.to_gbps(self.rows[-1].bw_peak) if self.rows and self.unit else None


def parse(text: str) -> IbWriteBwReport:
    """Parse the output of ``ib_write_bw`` (also ``ib_read_bw``/``ib_send_bw``, same layout).

    Raises :class:`ParseError` for a latency report, a line inside the report that is not
    part of it (such as a cut-off row), or text with neither a report nor a perftest error.
    """
    if not text.strip():
        raise ParseError(TOOL, "empty output")
    test: str | None = None
    params: dict[str, str] = {}
    unit: BwUnit | None = None
    rows: list[BwRow] = []
    warnings: list[str] = []
    errors: list[str] = []
    inside = complete = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        error_hint = _error_hint(line)
        is_warning = bool(_WARNING.search(line))
        if error_hint is not None or (errors and not is_warning):
            # Once perftest reports an error, the lines after it (status, counters) belong to it.
            errors.append(line)
            continue
        if is_warning:
            warnings.append(line)
        elif _DASHES.match(line):
            complete = bool(rows) and unit is not None
            inside = not complete
        elif match := _TITLE.match(line):
            if "Latency" in match["title"]:
                raise ParseError(TOOL, "a latency test report, not a bandwidth report", line=raw, lineno=lineno)
            test, inside = match["title"], True
        elif match := _TABLE_HEADER.search(line):
            unit = BwUnit(f"{match['unit']}/sec")
        elif "#bytes" in line:
            raise ParseError(TOOL, "not a bandwidth results header", line=raw, lineno=lineno)
        elif unit is not None and (match := _ROW.match(line)) and not complete:
            rows.append(BwRow(int(match["bytes"]), int(match["iters"]), float(match["peak"]), float(match["avg"]),
                              float(match["rate"])))
        elif _NOISE.match(line) or not inside or complete:
            continue  # QP addresses, the server banner, tool chatter around the report (CUDA setup)
        elif unit is None and _PARAM.search(line):
            params.update((m["key"].strip(), m["value"]) for m in _PARAM.finditer(line))
        else:
            raise ParseError(TOOL, "unexpected line inside the report (truncated row?)", line=raw, lineno=lineno)
    if test is None and not errors:
        first = next((n, s) for n, s in enumerate(text.splitlines(), 1) if s.strip())  # text is not blank
        raise ParseError(TOOL, "no perftest report and no perftest error", line=first[1], lineno=first[0])
    return IbWriteBwReport(
        test=test,
        device=params.get("Device"),
        link_type=params.get("Link type"),
        gid_index=_int(params.get("GID index")),
        mtu=_int(params.get("Mtu", "").removesuffix("[B]")),
        qps=_int(params.get("Number of qps")),
        unit=unit,
        rows=tuple(rows),
        complete=complete,
        warnings=tuple(warnings),
        errors=tuple(errors),
        hint=_hint(errors),
    )


def _error_hint(line: str) -> str | None:
    return next((hint for pattern, hint in _ERRORS if pattern.search(line)), None)


def _hint(errors: list[str]) -> str | None:
    """The most specific hint any error line earns (``_ERRORS`` is ordered specific first)."""
    matched = [i for i, (pattern, _) in enumerate(_ERRORS) for line in errors if pattern.search(line)]
    return _ERRORS[min(matched)][1] if matched else None


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None
