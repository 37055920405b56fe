"""The container command of a node: the exact runtime argv that wraps torchrun, computed without any I/O.

One container per node per run, torchrun its main process. Each flag is there for a reason NCCL or clusterrun
has (docs/containers.md says more):

* ``--init``: a minimal init as PID 1 forwards signals to torchrun and reaps its workers, so a stop reaches
  every rank and no zombie holds a GPU.
* labels ``clusterrun.run`` / ``clusterrun.node``: a run's containers are found (and removed) by label, never by
  name or by a client that may be gone: ``docker run``'s client dying leaves its container running.
* ``--network host``: NCCL and Gloo use the node's NICs and addresses, as without a container (the plan's
  ``NCCL_SOCKET_IFNAME`` names a host NIC).
* ``--ipc host`` (or ``--shm-size`` when the inventory asks for a private IPC namespace): NCCL's shared memory
  transport needs far more than the 64 MB ``/dev/shm`` a private namespace gets by default.
* ``--ulimit memlock=-1``: RDMA registers (pins) memory; ``--ulimit stack=67108864``: NVIDIA's recommendation.
* GPUs: only the run's (the plan's ``CUDA_VISIBLE_DEVICES``: the physical indices chosen within the node's own
  ``CUDA_VISIBLE_DEVICES``, or that value itself where it names MIG instances or UUIDs): docker with the NVIDIA
  toolkit gets ``--gpus "device=…"``, podman CDI's ``--device nvidia.com/gpu=N``; inside, they are numbered
  again starting at 0, so the container's ``CUDA_VISIBLE_DEVICES`` is ``0..n-1``.
* ``--device /dev/infiniband`` and ``--cap-add IPC_LOCK`` on nodes with RDMA NICs: without the devices NCCL
  silently falls back to sockets.
* ``--cap-add SYS_PTRACE``: py-spy can take a hung rank's stack.
* the run directory and the workdir mounted at their own paths: the agent on the host tails the ranks' logs
  and writes the stack hook there, and the plan's paths stay true inside.
* ``--env NAME`` (names only): each value comes from the environment of the runtime's client, which only the
  user can read; no value is ever in an argv that any user of the node can list.
* the user's ``options`` last, so that they can override any of the above.

Apptainer shares the host's network, IPC, devices and limits by default and keeps no container to remove:
``apptainer exec`` with ``--nv`` for GPUs and ``--bind`` for the mounts.
"""

from __future__ import annotations

from clusterrun.facts.gpus import read_unlisted
from clusterrun.inventory.container import ContainerSettings
from clusterrun.inventory.kinds import Runtime
from clusterrun.planning.planfile import ContainerPlan, env_flags  # noqa: F401 - the container command's record

#: Labels that mark a run's containers on a node (``rm -f --filter label=...`` removes them).
RUN_LABEL, NODE_LABEL = "clusterrun.run", "clusterrun.node"
#: NVIDIA's recommended stack limit for CUDA applications in containers (64 MiB).
STACK_LIMIT = "67108864"


#: Variables that configure a runtime's client (not secrets): doctor passes the inventory's values of these on.
RUNTIME_SETTINGS = ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF", "DOCKER_HOST",
                    "DOCKER_CONFIG", "DOCKER_CONTEXT")


def _gpus(env: dict[str, str], gpus: tuple[int, ...]) -> list[str]:
    """The GPUs the container gets: those the plan's CUDA_VISIBLE_DEVICES names (physical indices, or the node's
    own value where it names MIG instances or UUIDs), read as CUDA reads it (up to ``-1`` or a word that names no
    GPU); the node's GPU list where it is not set."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        indices, names = read_unlisted(visible)
        return [str(i) for i in indices] or list(names)
    return [str(g) for g in gpus]


def _mount(spec: str) -> tuple[str, str, bool]:
    parts = spec.split(":")
    return parts[0], parts[1], len(parts) == 3 and parts[2] == "ro"


def build_container(settings: ContainerSettings, *, run_id: str, node: str, run_dir: str | None, cwd: str | None,
                    env: dict[str, str], gpus: tuple[int, ...], rdma: bool) -> ContainerPlan:
    """The container command of one node. Pure. ``env``: the node's planned environment (its names are passed
    on; its ``CUDA_VISIBLE_DEVICES`` says which GPUs the container gets); ``rdma``: the node has RDMA NICs;
    ``run_dir``/``cwd`` None: no run directory (doctor's checks), the image's own working directory."""
    runtime = settings.runtime_or_default
    assert settings.image is not None  # the inventory refuses container settings without an image
    labels = ((RUN_LABEL, run_id), (NODE_LABEL, node))
    devices = _gpus(env, gpus)
    inner_env: tuple[tuple[str, str], ...] = ()
    own = [] if run_dir is None or cwd is None else [run_dir] + (
        [cwd] if cwd != run_dir and not cwd.startswith(run_dir.rstrip("/") + "/") else [])
    mounts = [(path, path, False) for path in own] + [_mount(m) for m in settings.mounts or ()]
    if runtime is Runtime.apptainer:
        head = ["apptainer", "exec", *(["--nv"] if devices else []), *(["--pwd", cwd] if cwd else [])]
        for src, dst, ro in mounts:
            head += ["--bind", f"{src}:{dst}" + (":ro" if ro else "")]
    else:
        head = [runtime.value, "run", "--rm", "--init"]
        for key, value in labels:
            head += ["--label", f"{key}={value}"]
        # The ready check pulled (or refused) the image: the run itself never pulls, so it cannot stall on a registry.
        head += ["--pull", "never", "--network", "host"]
        head += ["--shm-size", settings.shm_size] if settings.shm_size else ["--ipc", "host"]
        head += ["--ulimit", "memlock=-1", "--ulimit", f"stack={STACK_LIMIT}", "--cap-add", "SYS_PTRACE"]
        if devices:
            if runtime is Runtime.docker:
                head += ["--gpus", '"device=' + ",".join(devices) + '"']  # quoted: docker splits the value at commas
            else:
                for device in devices:
                    head += ["--device", f"nvidia.com/gpu={device}"]
            # The runtime exposes only these GPUs, numbered from 0 inside.
            inner_env = (("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(len(devices)))),)
        if rdma:
            head += ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK"]
        for src, dst, ro in mounts:
            head += ["--volume", f"{src}:{dst}" + (":ro" if ro else "")]
        head += ["--workdir", cwd] if cwd else []
    return ContainerPlan(runtime=runtime, image=settings.image, head=tuple(head), env_names=tuple(env),
                         options=tuple(settings.options or ()), labels=labels, pull=settings.pull_or_default.value,
                         env=inner_env, mounts=tuple(settings.mounts or ()))

