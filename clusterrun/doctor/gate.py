"""``up --preflight full``: doctor's network checks over the launch's own connections, before anything starts."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from clusterrun.doctor.model import Verdict
from clusterrun.doctor.registry import Options, all_checks
from clusterrun.doctor.run import run_doctor
from clusterrun.inventory.models import Inventory
from clusterrun.transport.base import Transport

NETWORK_CHECKS = ("net.ping", "net.port", "net.bandwidth", "ib.bandwidth")


def full_check(inv: Inventory, transports: Mapping[str, Transport], report_dir: Path) -> tuple[list[str], Path]:
    """Run the network checks; returns each failure's summary, told once for all the nodes or pairs it was
    found on (empty when all passed), and the report directory (which has every finding)."""
    checks = [all_checks()[name] for name in NETWORK_CHECKS]
    report = run_doctor(inv, checks, Options(), report_dir, transports=transports)
    return [p.summary for p in report.problems() if p.verdict is Verdict.failed], report_dir
