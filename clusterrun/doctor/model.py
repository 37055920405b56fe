"""What doctor reports: verdicts, findings and their evidence (plain data, no I/O)."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class Verdict(str, enum.Enum):
    """Ordered by severity (skip < pass < warn < fail): a check's verdict is the worst of its findings'."""

    skipped = "skip"
    passed = "pass"
    warned = "warn"
    failed = "fail"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {Verdict.skipped: 0, Verdict.passed: 1, Verdict.warned: 2, Verdict.failed: 3}


class Scope(str, enum.Enum):
    node = "node"  # about one node at a time
    pair = "pair"  # about two nodes (or a node and its peers) on one network
    cluster = "cluster"  # about all nodes together


@dataclass(frozen=True)
class Evidence:
    """A command doctor ran and what it printed, kept in the report directory."""

    command: str
    output: str
    exit_code: int | None = None
    node: str | None = None


@dataclass(frozen=True)
class Finding:
    """One verdict of one check about one thing (a node, a NIC, a GPU, a pair...).

    ``summary`` is one line that stands on its own ("gpu02: eth1 is up but reaches no peer").
    ``measured`` and ``expected`` carry the values compared, ``hint`` what to do.
    """

    check: str
    verdict: Verdict
    summary: str
    node: str | None = None
    subject: str | None = None  # what on the node: "eth1", "GPU3", "mlx5_0/1", "gpu01->gpu02"
    measured: str | None = None
    expected: str | None = None
    hint: str | None = None
    evidence: tuple[Evidence, ...] = ()
    data: dict[str, Any] = field(default_factory=dict)  # machine-readable values for --json

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = self.verdict.value
        out["evidence"] = [asdict(e) for e in self.evidence]
        return {k: v for k, v in out.items() if v not in (None, (), [], {})}


@dataclass(frozen=True)
class PairMeasure:
    """One direction of a pair measured on one network (``net.ping``: round trip in ms, ``net.bandwidth``: bit/s),
    kept whole so the report page can draw each network's matrix. ``ok`` is None for a pair not tried (an end was
    known dead), False when nothing got through; ``value`` is None when nothing was measured."""

    check: str
    network: str  # the subnet
    src: str
    dst: str
    value: float | None
    ok: bool | None
    src_nic: str | None = None
    dst_nic: str | None = None
    data_network: bool = False
    note: str = ""  # why nothing was measured

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def worst(verdicts: list[Verdict] | tuple[Verdict, ...]) -> Verdict:
    """The most severe verdict; ``skip`` for none."""
    return max(verdicts, key=lambda v: v.severity, default=Verdict.skipped)
