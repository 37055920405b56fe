"""The plan's environment as an exported job needs it: what is the same on every node, what differs, the secrets.

``up`` gives every node its own environment. A batch script or a Kubernetes job states it once for all nodes,
so the per-node environments are folded: a variable with one value on every node is *common*; one whose value
differs (each node's data NIC) or that only some nodes set is *varying*, with its value on each node. A variable
whose name marks a secret (:func:`clusterrun.redact.is_secret`) is neither: only its name travels, and the
exported job takes the value from where it runs.

Left out with the reason: clusterrun's own bookkeeping (the run id, the restart count: nothing reads them outside
`up`) and the ``CUDA_VISIBLE_DEVICES`` clusterrun derives from the inventory's GPU list (the scheduler gives each
node its GPUs and sets it).

What the other host-derived rules of :mod:`clusterrun.planning.nccl` set (the socket interface, the HCAs, ``NCCL_IB_DISABLE``,
the GID index) is true on the inventory's hosts: a batch script runs there and keeps it; a job that runs elsewhere
(``hosts=False``: Kubernetes pods, whose network and HCAs are others) gets it apart, as :attr:`JobEnv.from_hosts`.
A value the user set (``env:`` of the inventory, ``--env``) is the user's, whatever its name.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterrun import redact
from clusterrun.planning.nccl import RULES
from clusterrun.planning.plan import EnvVar, LaunchPlan

#: Where :mod:`clusterrun.planning.plan` marks a variable as clusterrun's own (the run id, the restart count).
_CLUSTERRUN_SOURCE = "clusterrun"
#: The rule that turns the inventory's GPU list into CUDA_VISIBLE_DEVICES.
_GPU_RULE_SOURCE = "rule:cuda-visible-devices"
#: The sources of the variables that rules derive from the inventory's hosts (see the module's text).
HOST_SOURCES = frozenset(f"rule:{rule.name}" for rule in RULES if rule.host_derived) - {_GPU_RULE_SOURCE}


@dataclass(frozen=True)
class Varying:
    """A variable whose value differs between nodes: ``(node, value)`` for each node that sets it, in rank order."""

    name: str
    values: tuple[tuple[str, str], ...]
    source: str

    def value_on(self, node: str) -> str | None:
        return next((value for name, value in self.values if name == node), None)

    def per_node(self) -> str:
        """``gpu-a: =ens2f0, gpu-b: =enp65s0f0``."""
        return ", ".join(f"{node}: {value}" for node, value in self.values)

    def shown(self) -> str:
        """``NAME=value`` when every node that sets it has one value, else ``NAME (node: value, ...)``."""
        values = {value for _, value in self.values}
        return f"{self.name}={values.pop()}" if len(values) == 1 else f"{self.name} ({self.per_node()})"


@dataclass(frozen=True)
class LeftOut:
    """A variable the export does not write, and why (one clause, shown in the document's comments)."""

    name: str
    why: str


@dataclass(frozen=True)
class JobEnv:
    common: tuple[EnvVar, ...]
    varying: tuple[Varying, ...]
    secrets: tuple[str, ...]  # names only: their values are never written
    left_out: tuple[LeftOut, ...]
    #: With ``hosts=False``: what rules derived from the inventory's hosts, each with its value on each node.
    from_hosts: tuple[Varying, ...] = ()

    @property
    def varying_names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.varying)


def job_env(plan: LaunchPlan, hosts: bool = True) -> JobEnv:
    """Fold the nodes' environments (see the module's text). Variables keep the order of rank 0's environment,
    then those only later nodes set. ``hosts``: the job runs on the inventory's hosts (a batch script); False sets
    the host-derived variables apart (:attr:`JobEnv.from_hosts`)."""
    order: list[str] = []
    by_name: dict[str, list[tuple[str, EnvVar]]] = {}
    for node in plan.nodes:
        for var in node.env:
            if var.name not in by_name:
                order.append(var.name)
                by_name[var.name] = []
            by_name[var.name].append((node.name, var))
    common: list[EnvVar] = []
    varying: list[Varying] = []
    secrets: list[str] = []
    left_out: list[LeftOut] = []
    from_hosts: list[Varying] = []
    for name in order:
        setters = by_name[name]
        if not hosts:
            if derived := [(node, var) for node, var in setters if var.source in HOST_SOURCES]:
                from_hosts.append(_varying(name, derived))
            if not (setters := [(node, var) for node, var in setters if var.source not in HOST_SOURCES]):
                continue
        first = setters[0][1]
        if first.source == _CLUSTERRUN_SOURCE:
            continue  # clusterrun's own bookkeeping: meaningless outside `up`, not worth a comment
        if first.source == _GPU_RULE_SOURCE:
            gpus = sorted({var.value for _, var in setters})
            left_out.append(LeftOut(name, f"the inventory's GPU indices ({' / '.join(gpus)}): the scheduler gives each "
                                          "node its GPUs and sets CUDA_VISIBLE_DEVICES itself"))
            continue
        if redact.is_secret(name):
            secrets.append(name)
            continue
        if len(setters) == len(plan.nodes) and len({var.value for _, var in setters}) == 1:
            common.append(first)
        else:
            varying.append(_varying(name, setters))
    return JobEnv(tuple(common), tuple(varying), tuple(secrets), tuple(left_out), tuple(from_hosts))


def _varying(name: str, setters: list[tuple[str, EnvVar]]) -> Varying:
    return Varying(name, tuple((node, var.value) for node, var in setters), setters[0][1].source)
