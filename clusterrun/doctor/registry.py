"""The registry of doctor checks.

A check is a function of a :class:`Context` that yields :class:`Finding` objects. It is
registered with :func:`check`, with a dotted name (``gpu.busy``), a title, a scope, and
``needs``: when the check applies, in words (shown by ``doctor --list`` and docs). A check
that does not apply says so with a ``skip`` finding and the reason; it never just stays
silent. ``active`` checks run commands on the nodes (ping, bandwidth, all-reduce); the
others only read the facts every node's probe gathered, and are pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterrun.doctor.facts import NodeFacts
from clusterrun.doctor.model import Finding, PairMeasure, Scope

if TYPE_CHECKING:
    from clusterrun.inventory.models import Inventory, Node
    from clusterrun.transport.base import Transport


@dataclass(frozen=True)
class Options:
    master_port: int | None = None  # default: the inventory's
    bandwidth_seconds: float = 2.0  # per direction of each pair
    bandwidth_rounds: int = 3  # rounds of the tournament measured (0: all); 2+ rounds tell a slow node from a slow pair
    bandwidth_tool: str = "auto"  # iperf3 where every node has it, else builtin
    ping_count: int = 3
    allreduce_mib: float = 16.0
    allreduce_timeout: float = 120.0
    path: tuple[str, ...] = ()  # extra directories for tools on the nodes (perftest, infiniband-diags outside PATH)
    ib_seconds: float = 3.0  # each ib_write_bw run (-D)
    inventory_file: str | None = None  # the YAML file the inventory came from: findings about it name file:line


@dataclass
class Context:
    inventory: Inventory
    facts: Mapping[str, NodeFacts]
    options: Options = field(default_factory=Options)
    transports: Mapping[str, Transport] | None = None  # None for pure (facts-only) runs
    report_dir: Path | None = None
    progress: Callable[[str], None] = lambda _msg: None
    extra: dict[str, Any] = field(default_factory=dict)
    measures: list[PairMeasure] = field(default_factory=list)  # every pair the pair checks measured (for the page)

    def nodes(self) -> list[Node]:
        return list(self.inventory.nodes)

    def reachable(self) -> list[Node]:
        """Inventory nodes whose probe succeeded (checks about unreachable nodes would only repeat that)."""
        return [n for n in self.inventory.nodes if self.facts.get(n.name) and self.facts[n.name].reachable]


CheckFn = Callable[[Context], Iterable[Finding]]


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    scope: Scope
    run: CheckFn
    needs: str = ""
    active: bool = False

    @property
    def group(self) -> str:
        return self.name.split(".", 1)[0]


CHECKS: dict[str, Check] = {}


def check(name: str, title: str, scope: Scope, *, needs: str = "", active: bool = False) -> Callable[[CheckFn], CheckFn]:
    """Register the decorated function as a check."""

    def register(fn: CheckFn) -> CheckFn:
        if name in CHECKS:
            raise ValueError(f"two doctor checks are named {name!r}")
        CHECKS[name] = Check(name, title, scope, fn, needs, active)
        return fn

    return register


def all_checks() -> Mapping[str, Check]:
    """Every registered check, in registration order (importing the check modules registers them)."""
    import clusterrun.doctor.checks  # noqa: F401

    return CHECKS


def select(names: Iterable[str] = (), skip: Iterable[str] = ()) -> list[Check]:
    """Checks chosen by ``--checks``/``--skip``: a full name (``gpu.busy``) or a group (``gpu``).

    Raises ValueError naming an unknown name and listing the known ones.
    """
    checks = all_checks()
    groups = {c.group for c in checks.values()}

    def matches(spec: str, c: Check) -> bool:
        return spec == c.name or spec == c.group

    for spec in (*names, *skip):
        if spec not in checks and spec not in groups:
            raise ValueError(f"unknown check {spec!r}; known: {', '.join(sorted(groups | set(checks)))}")
    names, skip = list(names), list(skip)
    return [c for c in checks.values()
            if (not names or any(matches(s, c) for s in names)) and not any(matches(s, c) for s in skip)]
