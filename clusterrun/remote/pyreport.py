"""Doctor's report of a node's Python and the torch it would import, without importing torch.

Printed as one JSON object. Importing torch costs seconds of CPU and hundreds of MiB on every node, so
this reads what is on disk instead:

* ``torch``, ``cuda``, ``hip``, ``git_version``: ``torch/version.py`` of the torch that ``import torch``
  would load (found with ``importlib.util.find_spec``, which runs none of it), read as text; the
  package metadata's version where that file is missing.
* ``nccl``: the version of the ``nvidia-nccl-*`` package this torch requires, where it is installed
  (pip's CUDA builds load NCCL from it). A build with NCCL linked in says its version only when
  imported: then ``nccl_unknown`` says so.
* ``backends``: what the build provides (``backends_from``: ``build``): gloo in every torch of Linux,
  macOS and Windows, NCCL in CUDA builds (RCCL in ROCm builds). MPI is in source builds only and is not
  told. Whether they load is proven only by importing torch: ``cluster.allreduce`` does, under torchrun.
* ``torch_error``: why there is no torch to report.
* ``prefix``, ``base_prefix``, ``realpath``: where this interpreter took its packages from and the file
  it finally is. ``venv_on_path``: the first virtual environment (a directory with ``pyvenv.cfg``) on the
  symlink chain from ``executable`` to ``realpath``, with the link inside it. Python finds ``pyvenv.cfg``
  only beside the path it was started by: a symlink from elsewhere to a venv's ``bin/python`` starts the
  base installation, without the venv's packages; then ``prefix`` is not that venv.

Standard library only, for any Python 3.8+ a node has.
"""
import ast
import json
import os
import platform
import sys

out = {"python": platform.python_version(), "executable": sys.executable, "imported": False,
       "prefix": sys.prefix, "base_prefix": getattr(sys, "base_prefix", sys.prefix),
       "realpath": os.path.realpath(sys.executable)}


def symlink_chain(path, limit=40):
    """``path`` and every link it goes through, in order (the last is not a link)."""
    chain = [path]
    while os.path.islink(path) and len(chain) < limit:
        target = os.readlink(path)
        path = os.path.normpath(target if os.path.isabs(target) else os.path.join(os.path.dirname(path), target))
        chain.append(path)
    return chain


def venv_of(path):
    """The virtual environment that ``path`` (an interpreter) would start: where its pyvenv.cfg is, else None."""
    for folder in (os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
        if os.path.isfile(os.path.join(folder, "pyvenv.cfg")):
            return folder
    return None


def venv_on_path():
    for link in symlink_chain(sys.executable) if sys.executable else []:
        venv = venv_of(link)
        if venv is not None:
            out["venv_on_path"] = {"venv": venv, "link": link}
            return


def version_file(path):
    """The constants assigned in torch/version.py (``__version__``, ``cuda``, ``hip``, ``git_version``)."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    found = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) and node.value is not None else []
        for target in targets:
            if isinstance(target, ast.Name):
                try:
                    found[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    pass  # computed at import time: not knowable without importing
    return found


def nccl_package(metadata):
    """(name, version) of the nvidia-nccl package this torch requires and that is installed, else None."""
    try:
        requires = metadata.requires("torch") or []
    except metadata.PackageNotFoundError:
        return None
    for req in requires:
        name = req.split(";")[0].strip()
        for sep in "=<>!~[ (":
            name = name.split(sep)[0]
        if name.lower().replace("_", "-").startswith("nvidia-nccl"):
            try:
                return name, metadata.version(name)
            except metadata.PackageNotFoundError:
                return None
    return None


def package_metadata():
    """importlib.metadata (imported only when needed: it costs more than the rest), None before Python 3.8."""
    try:
        import importlib.metadata as metadata
    except ImportError:
        return None
    return metadata


def report():
    import importlib.util
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError) as exc:
        spec, out["torch_error"] = None, "%s: %s" % (type(exc).__name__, exc)
    if spec is None or not spec.submodule_search_locations:
        out.setdefault("torch_error", "no module named 'torch' on this python's path")
        return
    where = next(iter(spec.submodule_search_locations))
    out["torch_path"] = where
    constants = {}
    path = os.path.join(where, "version.py")
    try:
        constants = version_file(path)
    except (OSError, SyntaxError, ValueError) as exc:
        out["version_file_error"] = "%s: %s" % (type(exc).__name__, exc)
    version = constants.get("__version__")
    metadata = package_metadata() if version is None or constants.get("cuda") or constants.get("hip") else None
    if version is None and metadata is not None:
        try:
            version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            pass
    if version is None:
        out["torch_error"] = "torch at %s has no version.py and no package metadata: a broken install" % where
        return
    out["torch"] = str(version)
    for key in ("cuda", "hip", "git_version"):
        if constants.get(key):
            out[key] = str(constants[key])
    backends = ["gloo"]
    if out.get("cuda") or out.get("hip"):
        backends.append("nccl")
        found = nccl_package(metadata) if metadata is not None else None
        if found:
            out["nccl"], out["nccl_from"] = found[1], found[0]
        else:
            out["nccl_unknown"] = "NCCL is part of this torch build: its version shows only when torch is imported"
    out["backends"], out["backends_from"] = backends, "build"


try:
    venv_on_path()
except OSError as exc:  # an unreadable link is a fact, not a reason to print nothing
    out["venv_error"] = "%s: %s" % (type(exc).__name__, exc)
try:
    report()
except Exception as exc:  # the report must always be printed: a failure is one of its facts
    out["torch_error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
