"""The results table of nccl-tests (``all_reduce_perf`` and the other ``*_perf`` binaries).

Expected command (one process per GPU under MPI, or ``-g N`` GPUs in one process)::

    all_reduce_perf -b 8 -e 128M -f 2 -g 1

The output is a banner (``# nccl-tests version``, ``# Collective test starting: X``, the
``# Using devices`` rank lines), a table header whose columns changed over the years, one row
per message size, and a footer (``# Out of bounds values : N OK|FAILED``, ``# Avg bus
bandwidth : X``, ``# Collective test concluded: X``). Columns are read from the header, so
the layouts of every version parse alike::

    size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong   (2.x)
    size count type redop      | time algbw busbw error  | time algbw busbw error    (older 2.x)
    bytes N type op            | time algbw busbw res    | time algbw busbw res      (1.x)

Bandwidths are GB/s (10**9 bytes/s), times microseconds. Real outputs carry noise this parser
keeps apart from the numbers: NCCL INFO/WARN lines and launcher messages interleaved with the
rows, mpirun's ``[1,0]<stdout>:`` tags, and failure lines ("Test NCCL failure common.cu:...")
that end a run early; those give ``failures`` and ``complete=False``, not an exception. A row
cut off by the end of the text is dropped (``cut_line``). Text with no results table and no
failure line, or a line inside the table that is none of these, raises :class:`ParseError`.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from clusterrun.errors import ParseError

TOOL = "nccl-tests"

_TAG = re.compile(r"^\s*\[\d+,\d+\]<std(?:out|err)>:")  # mpirun --tag-output
_HEADER = re.compile(r"^#.*\balgbw\b.*\bbusbw\b")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(?P<name>\S+)")
_CONCLUDED = re.compile(r"^#\s*Collective test concluded:")
_VERSION = re.compile(r"^#\s*nccl-tests version\s+(?P<version>\S+)")
_NCCL_VERSION = re.compile(r"^(?:#\s*)?NCCL version\s+(?P<version>\S+)")
_RANK = re.compile(r"^#\s*Rank\s+(?P<rank>\d+)(?:\s+Group\s+\d+)?(?:\s+Pid\s+\d+)?\s+on\s+(?P<host>\S+)\s+"
                   r"device\s+(?P<device>\d+)\s+\[(?P<bus>[^\]]*)\]\s*(?P<gpu>.*)$")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(?P<value>\S+)")
_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(?P<count>\d+)\s+(?P<verdict>OK|FAILED)")
_ROW_START = re.compile(r"^\d+(?:\s|$)")
_NCCL_LINE = re.compile(r"\bNCCL (?:INFO|WARN)\b")
_LAUNCHER = re.compile(r"^\[[\w.-]+:\d+\]|^-{10,}$")  # OpenMPI's "[host:pid] ..." notices and box rules
_FAILURE = re.compile(r"Test (?:NCCL |CUDA )?failure|NCCL failure|Segmentation fault|terminate called|"
                      r"exited on signal|Aborted \(core dumped\)|MPI_ABORT")
_WRONG_COLUMNS = {"#wrong": "wrong", "wrong": "wrong", "error": "error", "res": "error"}
_PREFIX_COLUMNS = {"size": "size", "bytes": "size", "count": "count", "n": "count", "type": "type",
                   "redop": "redop", "op": "redop", "root": "root"}


@dataclass(frozen=True)
class Measurement:
    """One side (out-of-place or in-place) of a row.

    ``wrong`` is the #wrong count (None where the tool prints ``N/A``, as alltoall does in place);
    ``max_error`` is the older versions' maximum error column (``error``/``res``) instead.
    """

    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: int | None
    max_error: float | None


@dataclass(frozen=True)
class PerfRow:
    """One message size. ``redop``/``root`` are None where the version has no such column."""

    size_bytes: int
    count: int
    type: str
    redop: str | None
    root: int | None
    out_of_place: Measurement
    in_place: Measurement | None

    @property
    def busbw_gbs(self) -> float:
        """The better of the two sides' bus bandwidth (what nccl-tests' average is built from)."""
        return max(self.out_of_place.busbw_gbs, self.in_place.busbw_gbs if self.in_place else 0.0)

    @property
    def wrong(self) -> int:
        """Wrong elements on both sides (0 where not counted)."""
        return sum(m.wrong or 0 for m in (self.out_of_place, self.in_place) if m is not None)


@dataclass(frozen=True)
class RankLine:
    """A ``# Rank N ... on HOST device D [BUS] GPU`` line of the banner."""

    rank: int
    host: str
    device: int
    gpu: str


@dataclass(frozen=True)
class NcclTestsReport:
    """A parsed run.

    ``complete`` is True when the footer (average bus bandwidth) was printed. ``failures`` lists the
    lines that reported the run's end by error, ``warnings`` the NCCL WARN lines, both in order.
    """

    collective: str | None
    version: str | None
    nccl_version: str | None
    ranks: tuple[RankLine, ...]
    columns: tuple[str, ...]
    rows: tuple[PerfRow, ...]
    avg_busbw_gbs: float | None
    out_of_bounds: int | None
    complete: bool
    failures: tuple[str, ...]
    warnings: tuple[str, ...]
    cut_line: str | None

    @property
    def peak_busbw_gbs(self) -> float | None:
        """The largest bus bandwidth of any row (the figure to compare with the links' rate)."""
        return max((r.busbw_gbs for r in self.rows), default=None)

    @property
    def largest(self) -> PerfRow | None:
        """The row of the largest message size (the last one printed)."""
        return self.rows[-1] if self.rows else None

    @property
    def wrong_rows(self) -> tuple[PerfRow, ...]:
        """Rows with wrong elements (#wrong > 0): data corruption, not slowness. Older versions print a
        maximum error instead; for them ``out_of_bounds`` is the verdict."""
        return tuple(r for r in self.rows if r.wrong)

    @property
    def repeated_ranks(self) -> tuple[int, ...]:
        """Rank numbers printed by more than one process.

        Several processes each printing ``Rank 0`` means the binary was built without ``MPI=1``:
        mpirun started independent one-rank tests, and no traffic crossed the network.
        """
        return tuple(sorted(rank for rank, n in Counter(r.rank for r in self.ranks).items() if n > 1))


def parse(text: str) -> NcclTestsReport:
    """Parse the output of one nccl-tests ``*_perf`` run.

    Raises :class:`ParseError` for text with neither a results table nor a failure line, for a
    line inside the table that is not a row, a comment, NCCL's log or a launcher notice, and
    for a row whose fields do not match the header.
    """
    if not text.strip():
        raise ParseError(TOOL, "empty output")
    state = _State()
    lines = text.splitlines()
    last = max(i for i, line in enumerate(lines) if line.strip())
    for index, raw in enumerate(lines):
        line = _TAG.sub("", raw).strip()
        if line:
            state.feed(line, raw, index + 1, is_last=index == last)
    if not state.columns and not state.failures:
        first = next((n, s) for n, s in enumerate(lines, 1) if s.strip())
        raise ParseError(TOOL, "no results table (no header with algbw and busbw) and no failure line",
                         line=first[1], lineno=first[0])
    return state.report()


class _State:
    """What has been read so far; ``feed`` takes one stripped line."""

    def __init__(self) -> None:
        self.collective: str | None = None
        self.version: str | None = None
        self.nccl_version: str | None = None
        self.ranks: list[RankLine] = []
        self.columns: tuple[str, ...] = ()
        self.rows: list[PerfRow] = []
        self.avg: float | None = None
        self.bounds: int | None = None
        self.failures: list[str] = []
        self.warnings: list[str] = []
        self.cut: str | None = None
        self.ended = False

    def feed(self, line: str, raw: str, lineno: int, is_last: bool) -> None:
        if _FAILURE.search(line) or (line.startswith(".. ") and self.failures):
            self.failures.append(line)
        elif _NCCL_LINE.search(line):
            if "NCCL WARN" in line:
                self.warnings.append(line)
        elif match := _HEADER.match(line):
            self.columns = _columns(line, raw, lineno)
            self.ended = False
        elif match := _STARTING.match(line):
            self.collective = match["name"]
        elif match := _VERSION.match(line):
            self.version = match["version"]
        elif match := _NCCL_VERSION.match(line):
            self.nccl_version = match["version"]
        elif match := _RANK.match(line):
            self.ranks.append(RankLine(int(match["rank"]), match["host"], int(match["device"]), match["gpu"].strip()))
        elif match := _AVG.match(line):
            self.avg, self.ended = _float(match["value"]), True
        elif match := _BOUNDS.match(line):
            self.bounds = int(match["count"])
        elif _CONCLUDED.match(line):
            self.ended = True
        elif self.columns and not self.ended and _ROW_START.match(line):
            fields = line.split()
            if len(fields) < len(self.columns) and is_last:
                self.cut = line  # the text ends inside this row (output cut off)
            else:
                self.rows.append(_row(self.columns, fields, raw, lineno))
        elif line.startswith("#") or _LAUNCHER.match(line) or not self.columns or self.ended:
            pass  # banner, units line, launcher chatter before the table, anything after its footer
        else:
            raise ParseError(TOOL, "unexpected line inside the results table", line=raw, lineno=lineno)

    def report(self) -> NcclTestsReport:
        return NcclTestsReport(
            collective=self.collective, version=self.version, nccl_version=self.nccl_version,
            ranks=tuple(self.ranks), columns=self.columns, rows=tuple(self.rows), avg_busbw_gbs=self.avg,
            out_of_bounds=self.bounds, complete=self.avg is not None and not self.failures,
            failures=tuple(self.failures), warnings=tuple(self.warnings), cut_line=self.cut,
        )


def _columns(line: str, raw: str, lineno: int) -> tuple[str, ...]:
    """The header's column names, normalised: size count type [redop] [root] then 1 or 2 groups of
    time algbw busbw wrong|error."""
    names = [n.lower() for n in line.lstrip("#").split()]
    if "time" not in names:
        raise ParseError(TOOL, "a header with bandwidths but no time column", line=raw, lineno=lineno)
    split = names.index("time")
    prefix = [_PREFIX_COLUMNS.get(n) for n in names[:split]]
    groups = names[split:]
    if None in prefix or prefix[:3] != ["size", "count", "type"] or len(groups) not in (4, 8):
        raise ParseError(TOOL, "an unknown results header", line=raw, lineno=lineno)
    normal: list[str] = [p for p in prefix if p is not None]
    for start in range(0, len(groups), 4):
        time, algbw, busbw, check = groups[start:start + 4]
        if (time, algbw, busbw) != ("time", "algbw", "busbw") or check not in _WRONG_COLUMNS:
            raise ParseError(TOOL, "an unknown results header", line=raw, lineno=lineno)
        normal += ["time", "algbw", "busbw", _WRONG_COLUMNS[check]]
    return tuple(normal)


def _row(columns: tuple[str, ...], fields: list[str], raw: str, lineno: int) -> PerfRow:
    if len(fields) != len(columns):
        raise ParseError(TOOL, f"a row with {len(fields)} fields under a header of {len(columns)}",
                         line=raw, lineno=lineno)
    head = dict(zip(columns[:columns.index("time")], fields, strict=False))
    rest = fields[len(head):]
    try:
        sides = [_measurement(rest[i:i + 4], columns[len(head) + i + 3]) for i in range(0, len(rest), 4)]
        return PerfRow(int(head["size"]), int(head["count"]), head["type"], head.get("redop"),
                       int(head["root"]) if "root" in head else None, sides[0], sides[1] if len(sides) > 1 else None)
    except ValueError as exc:
        raise ParseError(TOOL, f"a row with a field that is not a number ({exc})", line=raw, lineno=lineno) from exc


def _measurement(fields: list[str], check: str) -> Measurement:
    time, algbw, busbw, value = fields
    if check == "wrong":
        return Measurement(float(time), float(algbw), float(busbw), None if value == "N/A" else int(value), None)
    return Measurement(float(time), float(algbw), float(busbw), None, None if value == "N/A" else float(value))


def _float(value: str) -> float | None:
    try:
        number = float(value)
    except ValueError:
        return None
    return None if number != number else number  # nan: no row was measured
