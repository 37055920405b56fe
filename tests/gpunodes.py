"""The stand-in nvidia-smi (tests/standins/nvidia_smi.py) as a command: for the node reporter run here, and for the
simulated nodes, whose interpreter puts it first on the PATH as a site's environment module would the real one."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

STANDIN = Path(__file__).resolve().parent / "standins" / "nvidia_smi.py"


def smi_command(directory: Path) -> Path:
    """A directory holding ``nvidia-smi``: the stand-in under this interpreter."""
    directory.mkdir(parents=True, exist_ok=True)
    smi = directory / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexec {sys.executable} {STANDIN} \"$@\"\n")
    smi.chmod(0o755)
    return smi


def numa_cpus() -> str:
    """``STANDIN_SMI_NUMA_CPUS`` for this machine: NUMA node 0 on its first CPU, node 1 on its last (the same one
    where it has a single CPU), so that a rank bound to its GPU's NUMA node shows on which."""
    cpus = sorted(os.sched_getaffinity(0))
    return f"0={cpus[0]};1={cpus[-1]}"


def python_on_gpu_node(directory: Path, node: str = "h200x4_busy", **env: str) -> Path:
    """An interpreter for the simulated nodes that plays GPU node ``node`` (a directory of
    tests/fixtures/gpu_nodes/): the stand-in first on its PATH, its NUMA CPUs real ones, and ``env`` (the node's
    own CUDA_VISIBLE_DEVICES, say) in its environment."""
    tools = smi_command(directory / "tools").parent
    settings = {"STANDIN_SMI_NODE": node, "STANDIN_SMI_NUMA_CPUS": numa_cpus(), **env}
    words = " ".join(f"{k}={shlex.quote(v)}" for k, v in settings.items())
    python = directory / "python"
    python.write_text(f"#!/bin/sh\nPATH={tools}:$PATH {words} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return python
