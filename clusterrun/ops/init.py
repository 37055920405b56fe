"""``clusterrun init``: write an inventory from what the nodes really have.

The nodes come from ``--ips``/``--hostfile``/``--slurm``. Each is probed over its one SSH connection
(NICs with addresses, speeds and RDMA ports, and GPUs: the same report ``up`` gathers),
the data network is chosen as ``up`` would choose it (the subnet every node shares, RDMA first, then
the fastest, not the SSH network), and a commented YAML inventory is rendered. It is validated by
loading it back before it is written.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from clusterrun.agents.gather import gather
from clusterrun.facts.nics import reconcile
from clusterrun.facts.node import ProbedNode, read_facts
from clusterrun.inventory.models import Inventory, Nic
from clusterrun.inventory.yaml_source import parse_inventory_text
from clusterrun.planning.network import resolve_data_network
from clusterrun.planning.plan import JobSpec, build_plan
from clusterrun.transport.factory import open_node_transports


@dataclass(frozen=True)
class Gpus:
    indices: tuple[int, ...]
    model: str | None


def found_gpus(ready: Mapping[str, ProbedNode]) -> dict[str, Gpus]:
    """Each node's GPUs as its reporter found them (those a process there sees, by their physical indices, so
    CUDA_VISIBLE_DEVICES in the node's environment counts), with nvidia-smi's model name; none on a CPU node."""
    return {name: Gpus(tuple(r.gpu_indices() or ()), r.gpu_model if r.gpus else None) for name, r in ready.items()}


def _rate(bits: int | None) -> str | None:
    if not bits:
        return None
    return f"{bits // 10**9}gbit" if bits % 10**9 == 0 else f"{bits // 10**6}mbit"


def _nic_line(nic: Nic, note: str) -> str:
    parts = [f"name: {nic.name}"]
    if nic.ip:
        parts.append(f"ip: {nic.ip}")
    if nic.kind.value != "ethernet":
        parts += [f"kind: {nic.kind.value}", f"hca: {nic.hca}", f"port: {nic.port}"]
    if _rate(nic.speed):
        parts.append(f"speed: {_rate(nic.speed)}")
    return f"      - {{{', '.join(parts)}}}" + (f"   # {note}" if note else "")


def render(inv: Inventory, gpus: Mapping[str, Gpus], ssh_addresses: Mapping[str, str], command: str) -> str:
    """The commented YAML text of ``inv`` (already completed with the nodes' NICs)."""
    data = resolve_data_network(inv, ssh_addresses)
    subnet = data.description.split(" ", 1)[0]
    lines = [f"# Written by `{command}` on {time.strftime('%Y-%m-%d %H:%M')} from what each node reported over SSH.",
             "# Review it (GPUs, NICs, the data network), then: clusterrun check FILE; clusterrun doctor FILE",
             "version: 1", "defaults:"]
    ssh = inv.defaults.ssh.model_dump(mode="json", exclude_none=True)
    if ssh:
        lines.append("  ssh: {" + ", ".join(f"{k}: {v}" for k, v in ssh.items()) + "}")
    if inv.defaults.python:
        lines.append(f"  python: {inv.defaults.python}")
    lines.append("  transport: ssh")
    why = data.description.split(" ", 1)[1].strip("()") if " " in data.description else ""
    chosen = inv.network.data if inv.network.data != "auto" else (subnet if "/" in subnet else "auto")
    lines += ["network:", f"  data: {chosen}   # {why}", "nodes:"]
    for node in inv.nodes:
        lines += [f"  - name: {node.name}", f"    host: {node.host}"]
        if node.ssh.port:
            lines.append(f"    ssh: {{port: {node.ssh.port}}}")
        g = gpus.get(node.name)
        if node.gpus:  # given with --gpus: the user's word wins over nvidia-smi
            lines.append(f"    gpus: [{', '.join(map(str, node.gpus))}]   # from --gpus")
        elif g and g.indices:
            lines.append(f"    gpus: [{', '.join(map(str, g.indices))}]" + (f"   # {g.model}" if g.model else ""))
        elif g is not None:
            lines.append("    gpus: 0   # none found: one CPU process unless nproc_per_node says more")
        if node.nproc_per_node:
            lines.append(f"    nproc_per_node: {node.nproc_per_node}")
        if node.nics:
            lines.append("    nics:")
            path = data.path_of(node.name)
            for nic in node.nics:
                note = ("data network" if nic.name == path.nic else "") + \
                       ("; " if nic.name == path.nic and nic.address == ssh_addresses.get(node.name) else "") + \
                       ("SSH reaches the node here" if nic.address == ssh_addresses.get(node.name) else "")
                lines.append(_nic_line(nic, note))
    return "\n".join(lines) + "\n"


def complete(inv: Inventory, ready: Mapping[str, ProbedNode]) -> tuple[Inventory, dict[str, str]]:
    """``inv`` with every node's probed NICs, and the addresses SSH reached (from ``agents.gather``)."""
    facts, _unknown, ssh = read_facts(ready)
    return reconcile(inv, facts).inventory, ssh


def inventory_text(inv: Inventory, command: str, source: str = "<init>") -> str:
    """The commented inventory of ``inv``'s nodes from what they report over SSH (each probed once, its connection
    closed after), said to be written by ``command``. It is loaded back as ``source`` first: what is written must
    load, so a failure there is a bug."""
    plan = build_plan(inv, JobSpec(script="-", run_id="init"))
    transports = open_node_transports(inv)
    try:
        ready = gather(plan, transports)
    finally:
        for transport in transports.values():
            transport.close()
    completed, ssh = complete(inv, ready)
    text = render(completed, found_gpus(ready), ssh, command)
    parse_inventory_text(text, source)
    return text
