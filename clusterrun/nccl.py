"""The environment clusterrun sets for each node, as one table of rules.

Each rule has a name, the reason it exists (shown by ``clusterrun plan`` and in
docs/network.md), and a function from the node's context to the variables it sets.
Nothing here hides a problem: no rule disables P2P or shared memory, and a GID index
is only set when the inventory names one.

A rule marked ``host_derived`` reads the inventory's hosts (their GPUs, NICs and HCAs): what it sets is true on
those hosts only, so a job exported to run elsewhere (Kubernetes pods) leaves it out (:mod:`clusterrun.export`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from clusterrun.inventory.models import Nic, Node
from clusterrun.planning.network import LOOPBACK, DataPath


@dataclass(frozen=True)
class RuleContext:
    node: Node
    data: DataPath
    nnodes: int


@dataclass(frozen=True)
class EnvRule:
    name: str
    reason: str
    apply: Callable[[RuleContext], dict[str, str]]
    host_derived: bool  # its values describe the inventory's hosts: not true where the pods run


def _rdma_nics(node: Node) -> list[Nic]:
    return [nic for nic in node.nics if nic.kind.is_rdma]


def _cuda_visible(ctx: RuleContext) -> dict[str, str]:
    if not ctx.node.gpus:
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in ctx.node.gpus)}


def _socket_ifname(ctx: RuleContext) -> dict[str, str]:
    if ctx.data.nic is None:
        return {}
    # '=' makes NCCL match the name exactly: a bare 'eth1' would also match 'eth10'.
    return {"NCCL_SOCKET_IFNAME": f"={ctx.data.nic}", "GLOO_SOCKET_IFNAME": ctx.data.nic}


def _ib_hca(ctx: RuleContext) -> dict[str, str]:
    rdma = _rdma_nics(ctx.node)
    if rdma:
        return {"NCCL_IB_HCA": "=" + ",".join(f"{nic.hca}:{nic.port}" for nic in rdma)}
    if ctx.node.nics and ctx.data.nic != LOOPBACK:
        return {"NCCL_IB_DISABLE": "1"}
    return {}


def _gid_index(ctx: RuleContext) -> dict[str, str]:
    indices = [nic.gid_index for nic in _rdma_nics(ctx.node) if nic.gid_index is not None]
    return {"NCCL_IB_GID_INDEX": str(indices[0])} if indices else {}


RULES: tuple[EnvRule, ...] = (
    EnvRule(
        "cuda-visible-devices",
        "the node contributes exactly the GPUs listed in the inventory; torchrun's local ranks map onto them in order",
        _cuda_visible,
        host_derived=True,
    ),
    EnvRule(
        "socket-ifname",
        "NCCL and Gloo otherwise pick an interface themselves; one that is up but cannot reach the peers makes init "
        "fail or hang, and the management NIC makes training silently slow. Pinned per node, because NIC names "
        "differ between machines",
        _socket_ifname,
        host_derived=True,
    ),
    EnvRule(
        "ib-hca",
        "use exactly the RDMA ports listed in the inventory ('=' = exact names, ':1' = port); a node with NICs listed "
        "but none RDMA gets NCCL_IB_DISABLE=1 so NCCL does not probe stray RDMA devices",
        _ib_hca,
        host_derived=True,
    ),
    EnvRule(
        "ib-gid-index",
        "RoCE needs the GID index of the RoCE v2 address; set only when the inventory gives it (a wrong index hangs)",
        _gid_index,
        host_derived=True,
    ),
)


def rule_env(ctx: RuleContext) -> list[tuple[str, str, str]]:
    """Apply every rule: returns ``(name, value, rule name)`` in table order."""
    out: list[tuple[str, str, str]] = []
    for rule in RULES:
        for key, value in rule.apply(ctx).items():
            out.append((key, value, rule.name))
    return out
