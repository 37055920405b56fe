"""What the node reporter (clusterrun/remote/nodefacts.py) prints, built for doctor's unit tests: the section
``facts`` of a probed node, holding its ``CLUSTERRUN-FACTS`` line (the shape ``test_node_reporter.py`` checks the
real reporter against)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from clusterrun.doctor.facts import FACTS, Section
from clusterrun.doctor.probe import PROGRAM_COMMANDS
from clusterrun.remote.nodefacts import LINE


def sysfs_port(hca: str, link_layer: str, *netdevs: str, port: int = 1, state: str = "", phys_state: str = "",
               rate: str = "") -> dict[str, Any]:
    """One RDMA port as the reporter lists it ("" where /sys had nothing readable)."""
    return {"hca": hca, "port": port, "state": state, "phys_state": phys_state, "link_layer": link_layer,
            "rate": rate, "netdevs": list(netdevs)}


def facts_section(ip: str | tuple[str, int] | None = None, rdma: Iterable[dict[str, Any]] = (),
                  speeds: dict[str, int] | None = None, gpus: int = 0) -> Section:
    """The reporter's section; ``ip`` is what ``ip -j addr show`` printed, or (output, exit code) where it failed
    (the reporter then says why instead), or None where it is not installed."""
    net: dict[str, Any] = {"speeds": speeds or {}, "rdma": list(rdma)}
    text, rc = ip if isinstance(ip, tuple) else (ip, 0)
    if text is None or rc != 0:
        net["ip_error"] = f"FileNotFoundError: [Errno 2] No such file or directory: 'ip' ({text or 'no output'})"
    else:
        net["ip"] = text
    return Section(FACTS, PROGRAM_COMMANDS[FACTS], 0, LINE + json.dumps({"net": net, "gpus": gpus}))
