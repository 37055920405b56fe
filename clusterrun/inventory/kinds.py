"""The inventory's plain choices as enums, in a module of their own: the plan's records use them, and those travel
to rank 0's node with the cluster supervisor (standard library only, no pydantic)."""

from __future__ import annotations

import enum


class Transport(str, enum.Enum):
    ssh = "ssh"
    local = "local"
    srun = "srun"  # a Slurm job step per command (inside an allocation: steps of that job)


class Runtime(str, enum.Enum):
    docker = "docker"
    podman = "podman"
    apptainer = "apptainer"
