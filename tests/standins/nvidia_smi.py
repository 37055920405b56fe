"""A stand-in for ``nvidia-smi`` on the simulated nodes, which have no GPUs: it replays recorded output.

The node it plays is a directory of tests/fixtures/gpu_nodes/ (``STANDIN_SMI_NODE``, a name there or a path; the
default is four busy H200s, see that directory's README): ``--query-gpu=FIELDS`` and ``--query-compute-apps=FIELDS``
print the columns asked for from its ``query_gpu.csv`` and ``compute_apps.csv`` (``[N/A]`` for a field the
recording lacks; ``--format`` with ``noheader`` and ``nounits`` as nvidia-smi reads them), ``topo -m`` prints its
``topo.txt``. ``STANDIN_SMI_CSV`` names another query_gpu recording (tests/fixtures/real/nvidia_smi/).

``STANDIN_SMI_NUMA_CPUS`` (``0=0;1=1``) rewrites the topology's CPU affinity: each GPU row gets the CPUs given
for its NUMA node, so the affinity is of CPUs this machine has. ``STANDIN_SMI_HANG`` / ``STANDIN_SMI_FAIL`` (a
word of the command line, or ``all``) make that call hang or fail as a driver fault does. Each call's arguments
are appended to ``STANDIN_SMI_LOG`` when that is set.
"""

import os
import re
import sys
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
ALIASES = {"gpu_uuid": "uuid", "used_memory": "used_gpu_memory", "gpu_name": "name", "gpu_bus_id": "pci.bus_id"}
DRIVER_FAULT = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
                "latest NVIDIA driver is installed and running.")


def _node() -> Path:
    name = os.environ.get("STANDIN_SMI_NODE") or "h200x4_busy"
    return Path(name) if "/" in name else FIXTURES / "gpu_nodes" / name


def _matches(word: str, args: list[str]) -> bool:
    return bool(word) and (word == "all" or any(word in a for a in args))


def table(recorded: str, query: str, fmt: str, app: bool) -> str:
    """The columns ``query`` asks for from a recorded ``--format=csv`` table."""
    lines = [line for line in recorded.splitlines() if line.strip()]
    if not lines:
        return ""
    header, rows = [c.strip() for c in lines[0].split(",")], lines[1:]
    names = [c.split(" [")[0] for c in header]
    out = []
    wanted = []
    for field in query.split(","):
        canonical = field if field in names else ALIASES.get(field, field)
        if canonical == "uuid" and app and "gpu_uuid" in names:
            canonical = "gpu_uuid"
        wanted.append(names.index(canonical) if canonical in names else None)
    if "noheader" not in fmt:
        out.append(", ".join(header[i] if i is not None else f for i, f in zip(wanted, query.split(","), strict=True)))
    for row in rows:
        cells = [cell.strip() for cell in row.split(",")]
        picked = [cells[i] if i is not None else "[N/A]" for i in wanted]
        if "nounits" in fmt:
            picked = [re.sub(r" (MiB|%|W|MHz)$", "", c) for c in picked]
        out.append(", ".join(picked))
    return "\n".join(out) + "\n"


def topology(text: str, numa_cpus: str) -> str:
    """``text`` with each GPU row's CPU affinity replaced by the CPUs ``numa_cpus`` gives its NUMA node."""
    cpus = dict(item.split("=", 1) for item in numa_cpus.split(";") if "=" in item)
    lines = text.splitlines()
    head = next((line for line in lines if line.strip()), "")
    devices = len(head.split("CPU Affinity")[0].split())
    out = []
    for line in lines:
        tokens = line.split()
        if tokens and re.fullmatch(r"GPU\d+", tokens[0]) and len(tokens) > devices + 2 and tokens[devices + 2] in cpus:
            tokens[devices + 1] = cpus[tokens[devices + 2]]
            line = "\t".join(tokens)
        out.append(line)
    return "\n".join(out) + "\n"


def main(args: list[str]) -> int:
    if "-lms" in args:  # the series' GPU loop: synthetic readings from the loop stand-in beside this one
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import nvidia_smi_loop

        return nvidia_smi_loop.main(args)
    if os.environ.get("STANDIN_SMI_LOG"):
        with open(os.environ["STANDIN_SMI_LOG"], "a") as log:
            log.write(" ".join(args) + "\n")
    if _matches(os.environ.get("STANDIN_SMI_HANG", ""), args):
        time.sleep(3600)
    if _matches(os.environ.get("STANDIN_SMI_FAIL", ""), args):
        print(DRIVER_FAULT)
        return 9
    node = _node()
    if args[:2] == ["topo", "-m"]:
        sys.stdout.write(topology((node / "topo.txt").read_text(), os.environ.get("STANDIN_SMI_NUMA_CPUS", "")))
        return 0
    csv = os.environ.get("STANDIN_SMI_CSV")
    recorded = (FIXTURES / "real" / "nvidia_smi" / csv).read_text() if csv else (node / "query_gpu.csv").read_text()
    fmt = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), "")
    for flag, path, app in (("--query-gpu=", None, False), ("--query-compute-apps=", node / "compute_apps.csv", True)):
        query = next((a.split("=", 1)[1] for a in args if a.startswith(flag)), None)
        if query is not None:
            text = recorded if path is None else (path.read_text() if path.exists() else "")
            sys.stdout.write(table(text, query, fmt, app))
            return 0
    sys.stdout.write(recorded)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
