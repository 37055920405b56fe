"""Real podman on the simulated nodes: an image made without a registry, the runtime's settings, cgroups in the nodes.

What it takes here (measured, see SIMCLUSTER notes): runc (crun fails on this kernel's cgroup setup), a
``containers.conf`` with ``default_ulimits = []`` (this sandbox cannot raise resource limits), and runs with
``--ulimit host`` (given as the inventory's container ``options``: last, so they win). The image is a skeleton root
(``bin``/``lib``/``sbin`` links into ``usr``, ``etc/passwd``) imported with ``podman import``, with this machine's
``/usr`` and Python prefix mounted read-only: its Python and torch run inside; a marker file only the image holds
tells a process that it runs in the image. The nodes need cgroups in the mount namespace their sshd (and so every
command that arrives over SSH) shares: the same rebuild slurmd gets (tests/slurmbed.py).
"""

from __future__ import annotations

import io
import json
import secrets
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from simcluster import SimCluster
from slurmbed import _cgroup_script

#: The file only the test image holds.
MARKER = "/opt/clusterrun-image-marker"


def podman_missing() -> str | None:
    """Why podman cannot run here, or None."""
    for tool in ("podman", "runc", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (.ci/install-cluster-deps installs it)"
    return None


def _skeleton(marker_text: str) -> bytes:
    """A tar of the image's root: links into /usr, users, empty mount points, the marker."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        def add(name: str, kind: bytes = tarfile.DIRTYPE, data: bytes = b"", link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = kind, link, 0o755 if kind != tarfile.REGTYPE else 0o644
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)

        for d in ("usr", "etc", "proc", "sys", "dev", "tmp", "run", "root", "opt", "var"):
            add(d)
        for d in ("bin", "lib", "lib64", "sbin"):
            add(d, tarfile.SYMTYPE, link=f"usr/{d}")
        add("etc/passwd", tarfile.REGTYPE, b"root:x:0:0:root:/root:/bin/sh\n")
        add("etc/group", tarfile.REGTYPE, b"root:x:0:\n")
        add(MARKER.lstrip("/"), tarfile.REGTYPE, marker_text.encode())
    return out.getvalue()


class PodmanBed:
    """The runtime's settings file and the test image (one per session), in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.conf = workdir / "containers.conf"
        self.conf.write_text('[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n')
        self.image = f"localhost/clusterrun-test:{secrets.token_hex(4)}"
        self.imported: list[tuple[str, list[str]]] = []

    def podman(self, *args: str, store: list[str] | None = None, timeout: float = 60,
               stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["podman", *(store or []), *args], input=stdin, capture_output=True, timeout=timeout,
                              env={"CONTAINERS_CONF": str(self.conf), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                              check=False)

    def import_image(self, name: str, marker_text: str = "image", store: list[str] | None = None) -> str:
        """Import the skeleton as ``name`` (in ``store``: ``--root``/``--runroot`` args, or the default one)."""
        done = self.podman("import", "-", name, store=store, stdin=_skeleton(marker_text))
        assert done.returncode == 0, done.stderr.decode()
        self.imported.append((name, store or []))
        return name

    def options(self) -> list[str]:
        """The inventory's container options: this sandbox keeps the host's limits; the host's Python inside."""
        prefixes = sorted({sys.prefix, sys.base_prefix})
        mounts = ["--volume=/usr:/usr:ro", *(f"--volume={p}:{p}:ro" for p in prefixes)]
        return ["--ulimit", "host", *mounts]

    def private_store(self, root: Path) -> tuple[list[str], Path]:
        """A node-private image store under ``root`` (podman wants its runroot path short: at most 50
        characters): the global flags that use it here, and a storage.conf that a node's CONTAINERS_STORAGE_CONF
        points at, so that every call of the runtime on that node (check, run, removal) uses it."""
        driver = self.podman("info", "--format", "{{.Store.GraphDriverName}}").stdout.decode().strip() or "overlay"
        conf = root / "storage.conf"
        conf.write_text(f'[storage]\ndriver = "{driver}"\ngraphroot = "{root / "root"}"\n'
                        f'runroot = "{root / "run"}"\n')
        return [f"--root={root / 'root'}", f"--runroot={root / 'run'}", f"--storage-driver={driver}"], conf

    def containers(self, run_id: str) -> list[dict]:
        """The containers of run ``run_id`` (any node, any state): the store is shared by every node."""
        done = self.podman("ps", "-a", "--format", "json", "--filter", f"label=clusterrun.run={run_id}")
        assert done.returncode == 0, done.stderr.decode()
        return json.loads(done.stdout or b"[]")

    def remove_all(self) -> None:
        for name, store in self.imported:
            self.podman("rmi", "-f", name, store=store)


def give_cgroups(cluster: SimCluster) -> None:
    """Mount the machine's cgroup hierarchies in each node's sshd mount namespace (runc needs them), once."""
    steps = " && ".join(_cgroup_script())
    for node in cluster.nodes:
        pid = cluster._listener_pid(node)  # the sshd every SSH command of the node is a child of
        assert pid is not None, f"{node.name}: sshd is not running"
        script = f"mountpoint -q /sys/fs/cgroup || {{ {steps}; }}"
        done = subprocess.run(["nsenter", "-t", str(pid), "-m", "sh", "-c", script], capture_output=True,
                              text=True, timeout=30, check=False)
        assert done.returncode == 0, f"{node.name}: {done.stderr}"


def container_inventory(cluster: SimCluster, path: Path, bed: PodmanBed, *, nodes: int = 2, nproc: int = 2,
                        image: str | None = None, node_env: dict[str, str] | None = None,
                        mounts: tuple[str, ...] = ()) -> Path:
    """An inventory of the first ``nodes`` nodes whose job runs in the test image (``node_env``: a node's own
    ``env:`` flow mapping)."""
    from simjobs import write_inventory

    write_inventory(cluster, path, nodes, nproc=nproc)
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("network:"))
    options = json.dumps(bed.options())
    lines[at:at] = [f"  container: {{image: {image or bed.image}, runtime: podman, options: {options}, "
                    f"mounts: {json.dumps(list(mounts))}}}",
                    f"  env: {{CONTAINERS_CONF: {bed.conf}}}"]
    text = "\n".join(lines) + "\n"
    for node, extra in (node_env or {}).items():
        text = text.replace(f"    host: {node}\n", f"    host: {node}\n    env: {extra}\n")
    path.write_text(text)
    return path
