"""The ready check a launch runs on every node first (standard library only, any Python 3.8+).

``check SPEC_B64``: proves this interpreter has torch with torchrun (found, not imported: an import costs
seconds of CPU on every node at every launch), creates the run directory and the content cache, lists the
staged files the cache lacks, checks that the master port is free (on rank 0), and gathers the node's network
facts; prints one line ``CLUSTERRUN-PREFLIGHT <json>``.
``facts``: the network facts alone; prints ``CLUSTERRUN-FACTS <json>`` (``plan --probe``, ``init``).
"""

import base64
import glob
import importlib.util
import json
import os
import socket
import subprocess
import sys


def _read(path):
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


def net_facts():
    """The node's NICs: ``ip -j addr``, each interface's speed (Mbit/s) and the RDMA ports."""
    net = {"speeds": {}, "rdma": []}
    try:
        net["ip"] = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
    except Exception as exc:
        net["ip_error"] = "%s: %s" % (type(exc).__name__, exc)
    for d in glob.glob("/sys/class/net/*"):
        speed = _read(d + "/speed")
        if speed.lstrip("-").isdigit():
            net["speeds"][os.path.basename(d)] = int(speed)
    for p in glob.glob("/sys/class/infiniband/*/ports/*"):
        hca, port = p.split("/")[4], p.rsplit("/", 1)[1]
        try:
            netdevs = sorted(os.listdir("/sys/class/infiniband/%s/device/net" % hca))
        except OSError:
            netdevs = []
        net["rdma"].append({"hca": hca, "port": int(port), "state": _read(p + "/state"),
                            "phys_state": _read(p + "/phys_state"), "link_layer": _read(p + "/link_layer"),
                            "rate": _read(p + "/rate"), "netdevs": netdevs})
    return net


def _smi_gpus():
    """GPU indices by nvidia-smi (what the driver reports), or None when it is absent or fails."""
    import shutil

    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    try:
        done = subprocess.run([tool, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [line.strip() for line in done.stdout.splitlines() if line.strip().isdigit()]


def visible_gpus(root="/proc/driver/nvidia/gpus", environ=None, smi=_smi_gpus):
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


def torch_version(found):
    """torch's version from the name of its dist-info directory beside it (importlib.metadata would cost every
    node a dozen milliseconds of imports at every launch); from package metadata when that is not clear."""
    for location in found.submodule_search_locations or ():
        infos = glob.glob(os.path.join(os.path.dirname(location), "torch-*.dist-info"))
        if len(infos) == 1:
            return os.path.basename(infos[0])[len("torch-"):-len(".dist-info")]
    import importlib.metadata

    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def check(spec):
    out = {"python": sys.version.split()[0], "executable": sys.executable, "problems": [], "missing": []}
    # Find torch without importing it: an import costs seconds of CPU on every node at every launch.
    found = importlib.util.find_spec("torch")
    out["no_torch"] = found is None
    if found is None:
        out["problems"].append("python %s has no torch; install torch there or set `python` in the inventory to "
                               "an environment that has it" % sys.executable)
    elif not any(os.path.isfile(os.path.join(d, "distributed", "run.py")) for d in found.submodule_search_locations or ()):
        out["no_torch"] = True
        out["problems"].append("torch at %s has no torch.distributed.run (torchrun); install a full torch build"
                               % found.origin)
    else:
        out["torch"] = torch_version(found)
    for d in (spec["run_dir"], spec["cache"]):
        try:
            # The run's own directory holds the ranks' logs: the user's only. The cache is shared by runs.
            os.makedirs(os.path.expanduser(d), mode=0o700 if d == spec["run_dir"] else 0o777, exist_ok=True)
        except OSError as exc:
            out["problems"].append("cannot create %s: %s" % (d, exc.strerror or exc))
    for digest in spec["hashes"]:
        if not os.path.isfile(os.path.join(os.path.expanduser(spec["cache"]), digest)):
            out["missing"].append(digest)
    if spec.get("port"):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torchrun's store does: TIME_WAIT is no conflict
        try:
            s.bind(("", spec["port"]))
        except OSError as exc:
            out["problems"].append("master port %d is already in use on this node (%s): another job, or a "
                                   "leftover one; pick another with --master-port" % (spec["port"], exc.strerror))
        finally:
            s.close()
    out["net"] = net_facts()
    out["gpus"] = visible_gpus()
    return out


def main(argv):
    if argv[:1] == ["check"] and len(argv) == 2:
        print("CLUSTERRUN-PREFLIGHT " + json.dumps(check(json.loads(base64.b64decode(argv[1])))))
        return 0
    if argv[:1] == ["facts"]:
        print("CLUSTERRUN-FACTS " + json.dumps({"net": net_facts(), "gpus": visible_gpus()}))
        return 0
    sys.stderr.write("usage: ready.py check SPEC_B64 | facts\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
