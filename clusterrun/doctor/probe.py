"""Gather a node's facts in one round trip: one shell script, every tool's output in its own section.

The script runs each tool with a time limit and prints its output between markers, so one
SSH command returns everything the node checks need. A tool that is not installed ends
with exit code 127 (see :data:`clusterrun.doctor.facts.MISSING`), which checks turn into
"skip: ... not installed" or a failure where the inventory says the tool must be there.
The inventory python reports itself and torch as JSON (section ``python``); the node's NICs, RDMA
ports and GPUs come from the node reporter (section ``facts``, see :func:`facts_command`): its one nvidia-smi
round is the one ``up`` reads, so doctor runs no nvidia-smi of its own.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Mapping, Sequence

from clusterrun import remote
from clusterrun.doctor.facts import FACTS, MISSING, NodeFacts, Section
from clusterrun.errors import ClusterrunError
from clusterrun.transport.base import Transport, shell_command, shell_path

#: Seconds each tool may take on the node.
TOOL_TIMEOUT = 20
PROBE_TIMEOUT = 90.0


#: Section name -> shell command. Order is the order of the report's evidence.
SECTIONS: dict[str, str] = {
    "uname": "uname -srm",
    "os_release": "cat /etc/os-release",
    "hostname": "hostname",
    "ibstat": "ibstat",
    "ibv_devinfo": "ibv_devinfo -v",
    # MLNX_OFED's scripts: which netdev each RDMA port drives (-v adds the port's state) and each GID's netdev.
    "ibdev2netdev": "ibdev2netdev -v",
    "show_gids": "show_gids",
    "peermem": "if [ -d /sys/module/nvidia_peermem ]; then echo loaded; else echo absent; fi",
    "ulimit_memlock": "ulimit -l",
    "ulimit_nofile": "ulimit -n",
    "shm": "df -Pk /dev/shm",
    "nccl_conf": "for f in /etc/nccl.conf \"$HOME/.nccl.conf\"; do [ -f \"$f\" ] && { echo \"# $f\"; cat \"$f\"; }; done; true",
    "env_nccl": "env | grep -E '^(NCCL_|GLOO_|TORCH_NCCL_|TORCH_DISTRIBUTED_|CUDA_VISIBLE_DEVICES=)' | sort; true",
    "tools": "for t in ping iperf3 ib_write_bw ibstat ibv_devinfo nvidia-smi timeout; do "
             "printf '%s %s\\n' \"$t\" \"$(command -v $t || echo -)\"; done",
}

_BEGIN = "@@clusterrun-probe-begin "
_END = "@@clusterrun-probe-end "
_SECTION = re.compile(r"^@@clusterrun-probe-begin (\S+)\n(.*?)^@@clusterrun-probe-end \1 (\d+)$", re.S | re.M)
_CLOCK = re.compile(r"^@@clusterrun-probe-clock (\d+(?:\.\d+)?)$", re.M)


def path_prefix(path: tuple[str, ...]) -> str:
    """Shell words that put ``path`` (extra tool directories, ``doctor --path``) before the node's PATH."""
    return f"PATH={shlex.quote(':'.join(path))}:\"$PATH\"; export PATH; " if path else ""


#: How the sections that run a python program are shown (the program travels inline).
PROGRAM_COMMANDS = {FACTS: "python -c <nodefacts.py>", "python": "python -c <report>"}


def facts_command(python: str) -> str:
    """The node reporter (the one ``up``, ``plan --probe`` and ``init`` run) under the inventory's python, or
    under python3 where that is missing (it needs the standard library only): a node whose python is wrong
    still has its NICs checked. Exit 127 (not installed) where neither exists."""
    py = shell_path(python)
    return (f"if command -v {py} >/dev/null 2>&1 || [ -x {py} ]; then P={py}; "
            "elif command -v python3 >/dev/null 2>&1; then P=python3; "
            f"else echo 'python: not installed'; exit {MISSING}; fi; "
            f"\"$P\" -c {shlex.quote(remote.program('nodefacts'))}")


def probe_script(python: str, sections: Mapping[str, str] = SECTIONS, path: tuple[str, ...] = ()) -> str:
    """The shell script that prints every section between markers (each tool under ``timeout``)."""
    lines = [path_prefix(path) + "export LC_ALL=C",
             f"if command -v timeout >/dev/null 2>&1; then T='timeout {TOOL_TIMEOUT}'; else T=''; fi",
             "echo \"@@clusterrun-probe-clock $(date +%s.%N)\""]
    programs = {FACTS: facts_command(python), "python": shell_command(remote.argv(python, "pyreport"))}
    for name, command in {**sections, **programs}.items():
        # The sections' commands are ours; the python path is the user's and is only ever a quoted word.
        first, label = (shell_path(python), python) if name == "python" else (command.split()[0],) * 2
        # A missing tool reads as 127 whatever the shell says; builtins and loops run as they are.
        guard = (f"command -v {first} >/dev/null 2>&1 || [ -x {first} ] || {{ echo "
                 f"{shlex.quote(label + ': not installed')}; (exit {MISSING}); }} && "
                 if first not in ("for", "if", "ulimit", "env", "cat", "df", "uname", "hostname") else "")
        lines.append(f"echo '{_BEGIN}{name}'; ( {guard}$T sh -c {shlex.quote(command)} ) 2>&1; "
                     f"echo \"{_END}{name} $?\"")
    return "\n".join(lines) + "\n"


def parse_probe(node: str, text: str, sections: Mapping[str, str] = SECTIONS) -> dict[str, Section]:
    commands = {**sections, **PROGRAM_COMMANDS}
    out: dict[str, Section] = {}
    for m in _SECTION.finditer(text):
        name, body, rc = m.group(1), m.group(2), int(m.group(3))
        out[name] = Section(name, commands.get(name, name), rc, body.rstrip("\n"))
    return out


def probe_node(node: str, python: str, transport: Transport, timeout: float = PROBE_TIMEOUT,
               path: tuple[str, ...] = (), inside: Sequence[str] = (), env: Mapping[str, str] | None = None
               ) -> NodeFacts:
    """Probe one node. Never raises for node problems: they come back in ``NodeFacts.error``.

    ``inside``: the container command (up to its image) the probe runs in, when the job runs in an image: the
    python, torch, NCCL, /dev/shm, memlock and devices the job will see; ``env``: the runtime's settings."""
    try:
        t0 = time.monotonic()
        transport.connect()
        t1 = time.monotonic()
        transport.run(["true"], timeout=timeout)
        t2 = time.monotonic()
        before = time.time()
        result = transport.run([*inside, "sh", "-c", probe_script(python, path=path)], timeout=timeout,
                               env=dict(env) if env else None)
    except ClusterrunError as exc:
        return NodeFacts(node, error=exc.reason)
    sections = parse_probe(node, result.stdout)
    if not sections:
        return NodeFacts(node, error=f"the probe printed nothing usable (exit {result.exit_code}): "
                                     f"{result.tail(3) or 'no output'}")
    clock = _CLOCK.search(result.stdout)
    offset = float(clock.group(1)) - before - (t2 - t1) / 2 if clock else None
    report: dict[str, object] = {}
    py = sections.get("python")
    if py is not None:
        try:
            report = json.loads(py.output.strip().splitlines()[-1]) if py.ok and py.output.strip() else {}
        except ValueError:
            report = {}
    return NodeFacts(node, sections, latency_ms=(t2 - t1) * 1000, connect_ms=(t1 - t0) * 1000,
                     clock_offset_s=offset, python=report)
