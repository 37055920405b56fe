"""The ready check a launch runs on every node first (standard library only, any Python 3.8+).

:func:`check` (the node agent's ``check`` command, see session.py) proves this interpreter has torch with
torchrun (found, not imported: an import costs seconds of CPU on every node at every launch), creates the run
directory and the content cache, lists the staged files the cache lacks, checks that the master port is free
(on rank 0), and adds the node's facts as nodefacts.py reports them (``net``, ``gpus``): the same report
``plan --probe``, ``init`` and doctor read.
"""

import glob
import importlib.util
import os
import socket
import sys

if __package__:
    from clusterrun.remote import containers, nodefacts
else:
    import containers
    import nodefacts


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


def _host_torch(out):
    """This interpreter's torch with torchrun, found without importing it: an import costs seconds of CPU on
    every node at every launch."""
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


def check(spec):
    out = {"python": sys.version.split()[0], "executable": sys.executable, "problems": [], "missing": []}
    for d in (spec["run_dir"], spec["cache"]):
        try:
            # The run's own directory holds the ranks' logs: the user's only. The cache is shared by runs.
            os.makedirs(os.path.expanduser(d), mode=0o700 if d == spec["run_dir"] else 0o777, exist_ok=True)
        except OSError as exc:
            out["problems"].append("cannot create %s: %s" % (d, exc.strerror or exc))
    if spec["container"] is None:
        _host_torch(out)
    else:
        # The job runs in the image: its torch is what counts, not the host's (which runs only this agent).
        image = containers.check(spec["container"], spec["python"], dict(os.environ, **spec["env"]))
        out["problems"] += image["problems"]
        out["no_torch"] = False
        out["image_id"], out["pulled"] = image["image_id"], image["pulled"]
        if image["torch"]:
            out["torch"] = image["torch"]
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
    out.update(nodefacts.report())
    return out
