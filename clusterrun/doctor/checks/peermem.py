"""GPUDirect RDMA check: nvidia_peermem is loaded where a node has GPUs and RDMA NICs."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from clusterrun.doctor.checks.rdma_view import evidence_of, rdma_nics
from clusterrun.doctor.model import Finding, Scope, Verdict
from clusterrun.doctor.registry import Context, check


@check("ib.peermem", "nvidia_peermem is loaded (GPUDirect RDMA)", Scope.node,
       needs="nodes with GPUs and infiniband/roce NICs in the inventory")
def check_peermem(ctx: Context) -> Iterator[Finding]:
    for node in ctx.reachable():
        finding = partial(Finding, "ib.peermem", node=node.name)
        missing = [what for what, have in (("GPUs", node.gpus), ("InfiniBand/RoCE NICs", rdma_nics(node))) if not have]
        if missing:
            yield finding(Verdict.skipped, f"{node.name}: no {' and no '.join(missing)} listed")
            continue
        section = ctx.facts[node.name].section("peermem")
        state = section.output.strip() if section is not None and section.ok else None
        finding = partial(finding, subject="nvidia_peermem", measured=state or "unknown", expected="loaded",
                          evidence=evidence_of(node.name, [section]))
        if state == "loaded":
            yield finding(Verdict.passed, f"{node.name}: nvidia_peermem is loaded (GPUDirect RDMA)")
            continue
        what = "is not loaded" if state == "absent" else "could not be checked"
        yield finding(Verdict.warned, f"{node.name}: nvidia_peermem {what}: GPUDirect RDMA is off unless NCCL uses "
                      "DMA-BUF, and GPU buffers are staged through host memory", hint="`modprobe nvidia_peermem` (and "
                      "list it in /etc/modules-load.d/ for reboots); with NCCL 2.19+, kernel 5.12+ and the open GPU "
                      "kernel modules, DMA-BUF works without it")
