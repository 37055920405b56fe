"""The job as a Slurm batch script: ``#SBATCH`` lines for the allocation, one ``srun`` step that runs torchrun.

Slurm chooses the nodes, so what `up` takes from the node list comes from the allocation instead: the node count
is ``SLURM_NNODES``, each node's rank its ``SLURM_NODEID``, the master the allocation's first node (``scontrol show
hostnames``), reached at its address on the data network when the plan knows how to find it (the data subnet, or
the data NIC's name). The environment that is the same on every node is exported once; what differs between nodes
(the data NIC when the machines name it differently) is set by a ``case`` on the node's Slurm name, run by the step
on each node. A secret's value is never written: the script takes it from the environment sbatch was run in (which
Slurm passes on) and stops with a message when it is missing. Every value is shell-quoted, so the script and its
arguments reach torchrun byte for byte; the result passes ``bash -n``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from clusterrun.errors import UsageError
from clusterrun.export.carry import runtime_only
from clusterrun.export.comments import bullets, one_line, paragraph
from clusterrun.export.environment import JobEnv, job_env
from clusterrun.export.pyxis import pyxis_flags
from clusterrun.inventory.models import Inventory, Transport
from clusterrun.planning.network import LOOPBACK
from clusterrun.planning.plan import LaunchPlan, NodePlan

# Slurm's time limits: MIN, MIN:SEC, H:MIN:SEC, D-H, D-H:MIN, D-H:MIN:SEC, or none.
_TIME_RE = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)
# Job, partition and account names as an #SBATCH line can carry them unquoted (partitions may be a list: a,b).
_SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,+-]*")
_INDENT = "  "


@dataclass(frozen=True)
class SbatchOptions:
    """What the batch script asks Slurm for beyond the plan. Raises :class:`UsageError` for a value Slurm refuses."""

    name: str
    time: str | None = None
    partition: str | None = None
    account: str | None = None

    def __post_init__(self) -> None:
        _check(self.name, "--name", _SLURM_NAME_RE, "--name train-llm")
        if self.time is not None:
            _check(self.time, "--time", _TIME_RE, "--time 2:00:00 (2 hours) or --time 1-12 (1 day 12 hours)")
        if self.partition is not None:
            _check(self.partition, "--partition", _SLURM_NAME_RE, "--partition gpu")
        if self.account is not None:
            _check(self.account, "--account", _SLURM_NAME_RE, "--account ml-team")


def _check(value: str, flag: str, pattern: re.Pattern[str], example: str) -> None:
    if not pattern.fullmatch(value):
        raise UsageError(f"{flag} {value!r}: not a value Slurm takes; give one like {example}")


@dataclass(frozen=True)
class _PerNode:
    """A shell variable the ``case`` block sets on each node (``exported``: for torchrun and the training script)."""

    name: str
    values: dict[str, str | None]  # node -> value; None: the node must not have it
    exported: bool


def _shell_path(path: str) -> str:
    """``path`` quoted for the shell, with a leading ``~`` still meaning the home directory."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def _case_patterns(node: NodePlan) -> str:
    """The names a node answers to in the ``case``: its name, and its host's short name when that differs."""
    names = [node.name]
    short = node.host.split(".")[0]
    if not node.host.replace(".", "").isdigit() and ":" not in node.host and short and short not in names:
        names.append(short)
    return "|".join(shlex.quote(name) for name in names)


def _uniform(values: dict[str, str]) -> str | None:
    """The one value every node has, or None when they differ."""
    distinct = set(values.values())
    return distinct.pop() if len(distinct) == 1 else None


class _Script:
    """The batch script's parts, decided once from the plan."""

    def __init__(self, plan: LaunchPlan, inv: Inventory, options: SbatchOptions) -> None:
        self.plan, self.inv, self.options = plan, inv, options
        self.env: JobEnv = job_env(plan)
        names = [n.name for n in plan.nodes]
        self.python = _uniform({n.name: n.python for n in plan.nodes})
        self.nproc = _uniform({n.name: str(n.nproc_per_node) for n in plan.nodes})
        self.per_node: list[_PerNode] = [
            _PerNode(var.name, {node: var.value_on(node) for node in names}, exported=True) for var in self.env.varying
        ]
        if self.python is None:
            self.per_node.append(_PerNode("PYTHON", {n.name: n.python for n in plan.nodes}, exported=False))
        if self.nproc is None:
            self.per_node.append(_PerNode("NPROC", {n.name: str(n.nproc_per_node) for n in plan.nodes}, exported=False))
        self.lookup, data_nics = self._master_lookup()
        if data_nics:
            self.per_node.append(_PerNode("DATA_NIC", dict(data_nics), exported=False))

    def _master_lookup(self) -> tuple[str | None, dict[str, str]]:
        """(the command that prints the master's addresses on the data network, run on the master, or None to use
        its host name; each node's data NIC when that command needs it set per node). The data subnet finds the
        address whatever the NIC is called; else the data NIC's name does."""
        plan = self.plan
        if plan.master.data_nic == LOOPBACK:
            return None, {}
        subnet = self.inv.network.data_subnet
        if subnet is not None:
            return f"ip -o -{subnet.version} addr show to {subnet}", {}
        nics = {n.name: n.data_nic for n in plan.nodes if n.data_nic is not None}
        if len(nics) < plan.nnodes:
            return None, {}
        nic = _uniform(nics)
        if nic is not None:
            return f"ip -o -4 addr show dev {shlex.quote(nic)}", {}
        return 'ip -o -4 addr show dev "$DATA_NIC"', nics

    # -- the parts, in the order of the script ------------------------------------------------------------------

    def header(self) -> list[str]:
        plan, job = self.plan, self.plan.job
        nproc = self.nproc or "varying numbers of"
        script = one_line(shlex.join([*(["-m"] if job.module else []), job.script]))
        lines = [
            "#!/bin/bash",
            *paragraph(f"{self.options.name}: {script} on {plan.nnodes} node(s), {nproc} process(es) each, under "
                       "torchrun as `clusterrun up` runs it. Written by `clusterrun export sbatch`; submit it with "
                       "`sbatch FILE`."),
            "#",
            *paragraph(self._where_note()),
        ]
        lost = [f"{left.name}: {left.why}" for left in self.env.left_out]
        lost += runtime_only(plan, self.inv)
        lines += ["#", *bullets("Not carried over:", lost)]
        if plan.warnings:
            lines += ["#", *bullets("The plan warned:", plan.warnings)]
        return lines

    def _location(self) -> tuple[str, str | None]:
        """(the script as the nodes run it, the directory to run it in or None: where sbatch was run)."""
        plan, inv = self.plan, self.inv
        same_paths = inv.defaults.shared_fs or all(n.transport is Transport.local for n in plan.nodes)
        if same_paths and len({n.cwd for n in plan.nodes}) == 1 and len({n.script for n in plan.nodes}) == 1:
            return plan.master.script, plan.master.cwd
        return plan.job.script, None

    def _where_note(self) -> str:
        script, cwd = self._location()
        what = f"The nodes import the module {script}" if self.plan.job.module else f"The nodes run {script}"
        if cwd is not None:
            return f"{what} in {cwd}: a directory every node sees at that path."
        return (f"{what} from the directory sbatch is run in: submit it where that path is right, on a filesystem "
                "every node sees (clusterrun's copy of the code to the nodes does not happen under Slurm).")

    def directives(self) -> list[str]:
        plan, options = self.plan, self.options
        lines = [
            f"#SBATCH --job-name={options.name}",
            f"#SBATCH --nodes={plan.nnodes}",
            "#SBATCH --ntasks-per-node=1",
        ]
        gpus = sorted({len(n.gpus) for n in plan.nodes})
        if gpus[-1]:
            lines.append(f"#SBATCH --gpus-per-node={gpus[-1]}")
        if options.time is not None:
            lines.append(f"#SBATCH --time={options.time}")
        if options.partition is not None:
            lines.append(f"#SBATCH --partition={options.partition}")
        if options.account is not None:
            lines.append(f"#SBATCH --account={options.account}")
        lines.append("#SBATCH --output=%x-%j.out")
        lines += paragraph("The one task on each node runs torchrun and all its processes: give it the node's CPUs "
                           "as your site allows (remove one '#' to ask for whole nodes, or use --cpus-per-task).")
        lines.append("##SBATCH --exclusive")
        if len(gpus) > 1:
            lines += paragraph(f"The nodes list {' or '.join(map(str, gpus))} GPUs; Slurm gives every node the "
                               "same number, the most they list.")
        return lines

    def common_env(self) -> list[str]:
        lines: list[str] = []
        if self.env.common:
            lines += ["", "# The same on every node (the srun step below passes it on)."]
            lines += [f"export {var.name}={shlex.quote(var.value)}" for var in self.env.common]
        for name in self.env.secrets:
            lines += [
                "",
                *paragraph(f"{name} holds a secret: its value is not written here. Set it in the shell you run "
                           "sbatch from; Slurm passes that environment on."),
                f'export {name}="${{{name}:?set {name} in the submitting environment}}"',
            ]
        return lines

    def node_env(self) -> list[str]:
        if not self.per_node:
            return []
        what = ", ".join(p.name for p in self.per_node)
        nodes = self.plan.nodes
        lines = ["", *paragraph(f"What differs between the nodes ({what}), by the node's Slurm name."), "node_env() {",
                 f'{_INDENT}local node="${{SLURMD_NODENAME:-$(hostname -s)}}"', f'{_INDENT}case "$node" in']
        for node in nodes:
            lines.append(f"{_INDENT * 2}{_case_patterns(node)})")
            for item in self.per_node:
                value = item.values.get(node.name)
                if value is None:
                    lines.append(f"{_INDENT * 3}unset {item.name}")
                elif item.name == "PYTHON":
                    lines.append(f"{_INDENT * 3}{item.name}={_shell_path(value)}")
                else:
                    lines.append(f"{_INDENT * 3}{'export ' if item.exported else ''}{item.name}={shlex.quote(value)}")
            lines.append(f"{_INDENT * 3};;")
        known = shlex.quote(", ".join(n.name for n in nodes))
        lines += [
            f"{_INDENT * 2}*)",
            f'{_INDENT * 3}echo "$node is not one of the nodes this script was written for ("{known}"), so its '
            f'settings ({what}) are unknown; export the script again for the allocated nodes" >&2',
            f"{_INDENT * 3}return 1",
            f"{_INDENT * 3};;",
            f"{_INDENT}esac",
            "}",
        ]
        return lines

    def master(self) -> list[str]:
        if self.plan.master.data_nic == LOOPBACK:
            return ["", "# One node: its processes reach each other over loopback, as in the plan.",
                    "export MASTER_ADDR=127.0.0.1"]
        lines = [
            "",
            "# The master is the allocation's first node; Slurm runs this script on it.",
            'MASTER_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
            ': "${MASTER_HOST:?scontrol printed no node for SLURM_JOB_NODELIST}"',
            "MASTER_ADDR=$MASTER_HOST",
        ]
        if self.lookup is None:
            lines += paragraph("The plan does not know the data network, so the other nodes reach the master at "
                               "its host name (an inventory with the nodes' NICs, or --data-nic, pins it).")
            return [*lines, "export MASTER_ADDR"]
        network = one_line(self.plan.data_network)
        find_nic = "node_env && " if any(p.name == "DATA_NIC" for p in self.per_node) else ""
        lines += [
            'if [ "${SLURMD_NODENAME:-}" = "$MASTER_HOST" ]; then',
            *[_INDENT + line for line in paragraph(f"The other nodes reach it on the data network, {network}.")],
            # A subshell: node_env's exports must not travel to the other nodes with the step's environment.
            f"{_INDENT}MASTER_ADDR=$({find_nic}{self.lookup} | awk '!found {{split($4, a, \"/\"); print a[1]; "
            "found = 1}')",
            f'{_INDENT}if [ -z "$MASTER_ADDR" ]; then',
            f'{_INDENT * 2}echo "$MASTER_HOST has no address on the data network "{shlex.quote(network)}"; check its '
            'NICs with clusterrun doctor" >&2',
            f"{_INDENT * 2}exit 1",
            f"{_INDENT}fi",
            "else",
            f'{_INDENT}echo "warning: this script runs on ${{SLURMD_NODENAME:-?}}, not on the first node $MASTER_HOST: '
            'the other nodes reach the master at its host name" >&2',
            "fi",
            "export MASTER_ADDR",
        ]
        return lines

    def node_step(self) -> list[str]:
        plan = self.plan
        python = '"$PYTHON"' if self.python is None else _shell_path(self.python)
        nproc = '"$NPROC"' if self.nproc is None else self.nproc
        restarts = f" --max-restarts {plan.job.max_restarts}" if plan.job.max_restarts else ""
        body = [f"{_INDENT}node_env"] if self.per_node else []
        body += [
            f"{_INDENT}exec {python} -m torch.distributed.run --nnodes \"$SLURM_NNODES\" --node-rank \"$SLURM_NODEID\" "
            "\\",
            f"{_INDENT * 2}--nproc-per-node {nproc} --master-addr \"$MASTER_ADDR\" --master-port {plan.master_port}"
            f"{restarts} \"$@\"",
        ]
        return ["", "# On each node: its own settings, then torchrun; the node's rank is its place in the allocation.",
                "node_step() {", *body, "}"]

    def srun(self) -> list[str]:
        script, cwd = self._location()
        lines = [""]
        if cwd is not None:
            lines += [f"cd -- {_shell_path(cwd)}"]
        functions = "node_env node_step" if self.per_node else "node_step"
        argv = [*(["-m"] if self.plan.job.module else []), script, *self.plan.job.args]
        lines += [
            *paragraph("One task per node; when one node's torchrun fails, Slurm stops the others "
                       "(--kill-on-bad-exit). The functions above travel to the nodes as text, the script's arguments "
                       "as they were typed." + (" The step runs inside the image on every node (pyxis and enroot: "
                                                "the node's network, IPC and devices are shared)."
                                                if self.plan.master.container else "")),
            'srun --export=ALL --ntasks-per-node=1 --kill-on-bad-exit=1 ${SLURM_CPUS_PER_TASK:+--cpus-per-task='
            '"$SLURM_CPUS_PER_TASK"} \\',
            *([f"{_INDENT}{' '.join(pyxis_flags(self.plan, cwd))} \\"] if self.plan.master.container else []),
            f'{_INDENT}bash -c "$(declare -f {functions}); node_step \\"\\$@\\"" node_step \\',
            f"{_INDENT}{shlex.join(argv)}",
        ]
        return lines


def sbatch_script(plan: LaunchPlan, inv: Inventory, options: SbatchOptions) -> str:
    """The batch script for ``plan`` (see the module's text). Pure."""
    script = _Script(plan, inv, options)
    lines = [
        *script.header(),
        *script.directives(),
        "",
        "set -eu",
        *script.common_env(),
        *script.node_env(),
        *script.master(),
        *script.node_step(),
        *script.srun(),
    ]
    return "\n".join(lines) + "\n"
