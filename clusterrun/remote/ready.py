"""The ready check a launch runs on every node first (standard library only, any Python 3.8+).

:func:`check` (the node agent's ``check`` command, see session.py) proves this interpreter has torch with
torchrun (found, not imported: an import costs seconds of CPU on every node at every launch), creates the run
directory and the content cache, lists the staged files the cache lacks, on rank 0 leases the master port
(the user's, proven free; or, when the user set none, a free one it reports as ``master_port``: see
leases.py), and adds the node's facts as nodefacts.py reports them (``net``, ``gpus``: the same report
``plan --probe``, ``init`` and doctor read), the GPUs other runs hold (``leases``: {index: holder}) and, in a
Slurm step, the node's ``SLURM_TOPOLOGY_ADDR`` (``topology_addr``).
"""

import glob
import importlib.util
import os
import sys

if __package__:
    from clusterrun.remote import containers, leases, nodefacts
else:
    import containers
    import leases
    import nodefacts


def torch_version(found):
    """torch's version from the name of its dist-info directory beside it (importlib.metadata would cost every
    node a dozen milliseconds of imports at every launch); from package metadata when that is not clear."""
    for location in found.submodule_search_locations or ():
        infos = glob.glob(os.path.join(os.path.dirname(location), "torch-*.dist-info"))
        if len(infos) == 1:
            return os.path.basename(infos[0])[len("torch-"):-len(".dist-info")]
    import importlib.metadata

    # Beside the torch found first (the agent runs without site: sys.path alone may not reach it).
    beside = [os.path.dirname(location) for location in found.submodule_search_locations or ()]
    for dist in importlib.metadata.distributions(name="torch", path=beside + sys.path):
        return dist.version
    return "unknown"


def find_torch():
    """The spec of the torch this interpreter's job would import, without importing it.

    The agent runs without ``site`` (``python -S``): its directories are searched here as site would add them
    (the venv's, the user's, the interpreter's site-packages, after PYTHONPATH), without running their .pth
    files. A torch found only through a .pth file (an egg link, a source checkout) is looked for again after
    site has run in full."""
    if not sys.flags.no_site:
        return importlib.util.find_spec("torch")
    import site
    from importlib.machinery import PathFinder

    site.venv(set())  # a venv's pyvenv.cfg: its prefix, and whether the user's site-packages count
    if site.ENABLE_USER_SITE is None:
        site.ENABLE_USER_SITE = site.check_enableusersite()
    dirs = ([site.getusersitepackages()] if site.ENABLE_USER_SITE else []) + site.getsitepackages()
    found = PathFinder.find_spec("torch", sys.path + [d for d in dirs if d not in sys.path])
    if found is None:
        site.main()
        found = importlib.util.find_spec("torch")
    return found


def _host_torch(out):
    """This interpreter's torch with torchrun, found without importing it: an import costs seconds of CPU on
    every node at every launch."""
    found = find_torch()
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
    who = leases.holder(spec["run_id"], spec["node"])
    if spec.get("port"):
        problem = leases.check_port(spec["port"], who)
        if problem:
            out["problems"].append(problem)
    elif spec["choose_port"]:
        out["master_port"] = leases.free_port(who)
        if not out["master_port"]:
            out["problems"].append("no free master port from %d to %d on this node; give one with --master-port"
                                   % (leases.DEFAULT_PORT, leases.DEFAULT_PORT + leases.PORT_TRIES - 1))
    out.update(nodefacts.report())
    out["leases"] = leases.held(leases.GPU)
    # Where Slurm placed this node in its network (topology/tree: "s0.s2.node07"), for the rank order.
    addr, pattern = os.environ.get("SLURM_TOPOLOGY_ADDR"), os.environ.get("SLURM_TOPOLOGY_ADDR_PATTERN")
    if addr and pattern and pattern.count(".") != addr.count("."):
        addr = None  # a node name with dots: the switches cannot be told from the name
    out["topology_addr"] = addr if addr and (pattern or "switch.").startswith("switch.") else None
    return out
