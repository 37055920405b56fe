"""A node's facts, gathered on the node (standard library only, any Python 3.8+).

The one reporter of what a node has: the ready check of ``up`` (``ready.py``, in the node's agent),
``plan --probe``, ``init`` and ``clusterrun doctor`` all run it, and ``clusterrun.facts.node`` parses what it
says. Run as a program it prints one line ``CLUSTERRUN-FACTS <json>``::

    {"net": {"ip": <`ip -j addr show`>,            # or "ip_error": why it did not run
             "speeds": {interface: Mbit/s},          # /sys/class/net/*/speed
             "rdma": [{"hca", "port", "state", "phys_state", "link_layer", "rate", "netdevs"}]},
     "gpus": <how many NVIDIA GPUs a process started here sees>,
     "gpu_model": <nvidia-smi's name of the first, or null>,
     "gpu": <each GPU's use, its processes, the topology and CUDA_VISIBLE_DEVICES: gpufacts.py; null without
             nvidia-smi>}

The RDMA ports are read from ``/sys/class/infiniband/<hca>/ports/<n>/`` as the kernel writes them
(``state`` "4: ACTIVE", ``phys_state`` "5: LinkUp", ``rate`` "100 Gb/sec (2X HDR)"); "" where a file
cannot be read. ``--sys ROOT`` reads another tree than ``/sys`` (a recorded one, in tests).
"""

import glob
import json
import os
import subprocess
import sys

if __package__:
    from clusterrun.remote import gpufacts
else:
    import gpufacts

LINE = "CLUSTERRUN-FACTS "


def _read(path):
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


def rdma_ports(sys_root="/sys"):
    """Every RDMA port under ``sys_root``/class/infiniband: its state, link layer, rate and netdevs."""
    ports = []
    base = os.path.join(sys_root, "class", "infiniband")
    for p in sorted(glob.glob(os.path.join(base, "*", "ports", "*"))):
        hca, port = p.split(os.sep)[-3], os.path.basename(p)
        if not port.isdigit():
            continue
        try:
            netdevs = sorted(os.listdir(os.path.join(base, hca, "device", "net")))
        except OSError:
            netdevs = []
        ports.append({"hca": hca, "port": int(port), "state": _read(p + "/state"),
                      "phys_state": _read(p + "/phys_state"), "link_layer": _read(p + "/link_layer"),
                      "rate": _read(p + "/rate"), "netdevs": netdevs})
    return ports


def net_facts(sys_root="/sys", ip_argv=("ip", "-j", "addr", "show")):
    """The node's NICs: ``ip -j addr``, each interface's speed (Mbit/s) and the RDMA ports."""
    net = {"speeds": {}, "rdma": rdma_ports(sys_root)}
    try:
        net["ip"] = subprocess.run(list(ip_argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   universal_newlines=True, timeout=10).stdout
    except Exception as exc:  # no ip, or it hung: the report says why, the rest is still worth having
        net["ip_error"] = "%s: %s" % (type(exc).__name__, exc)
    for d in glob.glob(os.path.join(sys_root, "class", "net", "*")):
        speed = _read(d + "/speed")
        if speed.lstrip("-").isdigit():
            net["speeds"][os.path.basename(d)] = int(speed)
    return net


def _smi_gpus(gpu):
    """(index, name) of each GPU by nvidia-smi (``gpu``: what gpufacts gathered), or None when it is absent or
    failed."""
    if gpu is None or gpu.get("query") is None:
        return None
    rows = [[cell.strip() for cell in line.split(",")] for line in gpu["query"].splitlines()]
    return [(row[0], row[2] if len(row) > 2 else "") for row in rows if row[0].isdigit()]


def visible_gpus(root="/proc/driver/nvidia/gpus", environ=None, smi=None):
    """How many NVIDIA GPUs a process started here would see: nvidia-smi's list (the driver's directory of GPUs
    when nvidia-smi is absent), cut to as many as CUDA_VISIBLE_DEVICES names when it is set. 0 without a driver."""
    environ = os.environ if environ is None else environ
    listed = smi() if smi is not None else None
    if listed is not None:
        present = len(listed)
    else:
        try:
            present = len([name for name in os.listdir(root) if not name.startswith(".")])
        except OSError:
            return 0
    chosen = environ.get("CUDA_VISIBLE_DEVICES")
    if chosen is None:
        return present
    named = [item for item in chosen.split(",") if item.strip()]
    return min(present, len(named)) if named and named[0].strip() != "-1" else 0


def report(sys_root="/sys"):
    """Everything this module knows about the node (see the module's docstring)."""
    gpu = gpufacts.gather()
    listed = _smi_gpus(gpu)
    gpus = visible_gpus(smi=lambda: listed)
    model = (listed[0][1] or None) if listed and gpus else None
    return {"net": net_facts(sys_root), "gpus": gpus, "gpu_model": model, "gpu": gpu}


def main(argv):
    sys_root = "/sys"
    if argv[:1] == ["--sys"] and len(argv) == 2:
        sys_root = argv[1]
    elif argv:
        sys.stderr.write("usage: nodefacts.py [--sys ROOT]\n")
        return 2
    print(LINE + json.dumps(report(sys_root)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
