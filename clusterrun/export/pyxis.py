"""The container of a batch script's step: pyxis's ``srun --container-*`` flags (Slurm's plugin over enroot).

pyxis runs the step's command inside the image on every node, with the node's network, IPC namespace, devices and
limits (enroot shares them by default, unlike docker): what the container command of `up` asks for with flags.
The image reference is enroot's (``REGISTRY#IMAGE``: a ``#`` between the registry and the path); the directory the
script runs in and the inventory's mounts are mounted at their own paths.
"""

from __future__ import annotations

import shlex

from clusterrun.planning.plan import LaunchPlan


def enroot_image(image: str) -> str:
    """``nvcr.io/nvidia/pytorch:24.05-py3`` -> ``nvcr.io#nvidia/pytorch:24.05-py3``; an image of the default
    registry (``pytorch/pytorch:2.3``) or a path (a squashfs file) as it is."""
    if image.startswith(("/", "./", "~")) or "#" in image:
        return image
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return image


def _shell_word(path: str) -> str:
    """A path inside double quotes (``$PWD``/``$HOME`` expand; nothing else does)."""
    if path.startswith("~/"):
        path = "$HOME/" + path[2:]
    return path.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`")


def pyxis_flags(plan: LaunchPlan, cwd: str | None) -> list[str]:
    """The ``--container-*`` flags of the step, each a shell word; none when the job runs on the host.
    ``cwd``: the directory the script runs in (None: where sbatch is run, ``$PWD``)."""
    container = plan.master.container
    if container is None:
        return []
    here = _shell_word(cwd) if cwd is not None else "$PWD"
    mounts = [f"{here}:{here}", *(_shell_word(m) for m in container.mounts)]
    return [shlex.quote(f"--container-image={enroot_image(container.image)}"), f'--container-mounts="{",".join(mounts)}"',
            f'--container-workdir="{here}"']
