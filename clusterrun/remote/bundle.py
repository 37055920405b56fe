"""clusterrun's own modules, taken to a node whole: how a detached run's supervisor reaches rank 0's node.

The cluster supervisor (clusterrun/detached/host.py) is clusterrun's own supervisor: the same modules that
supervise an attached run (launch/supervisor.py and what it imports), not a copy. They need the standard library
only (tests/test_layers.py keeps them so), so a node runs them as it runs the agent, with nothing installed:

* :func:`payload` packs the modules' sources into one line (zlib, base64 JSON), sent on the program's stdin;
* :data:`LOADER` is the program (``python -S -c LOADER``): it reads that line, puts an importer for those modules
  at the front of ``sys.meta_path`` (packages as empty parents unless their ``__init__`` is sent) and runs the
  entry module's ``main()``, which reads the rest of stdin.

Nothing is written on the node: the code lives in the supervisor's memory (and its tracebacks name the modules'
paths as they are in clusterrun). Standard library only.
"""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path

#: What the cluster supervisor imports, the entry first: it is checked complete and standard-library only by
#: tests/test_layers.py (a module missing here fails there, not on a node).
SUPERVISOR_MODULES = (
    "clusterrun.detached.host",
    "clusterrun.detached.links",
    "clusterrun.remote.relay",
    "clusterrun.agents.link", "clusterrun.agents.spec",
    "clusterrun.errors", "clusterrun.redact", "clusterrun.waits", "clusterrun.notify", "clusterrun.planning.planfile",
    "clusterrun.facts.flight", "clusterrun.facts.stacks", "clusterrun.facts.torchrun_noise",
    "clusterrun.facts.parsers.nvidia_smi",
    "clusterrun.inventory.hostlist", "clusterrun.inventory.hostspec", "clusterrun.inventory.kinds",
    "clusterrun.launch.console", "clusterrun.launch.fold", "clusterrun.launch.outcome", "clusterrun.launch.phase",
    "clusterrun.launch.relay", "clusterrun.launch.settings", "clusterrun.launch.supervisor", "clusterrun.launch.watch",
    "clusterrun.remote", "clusterrun.remote.containers", "clusterrun.remote.gpufacts", "clusterrun.remote.leases",
    "clusterrun.remote.nodefacts", "clusterrun.remote.procs", "clusterrun.remote.protocol",
    "clusterrun.remote.ready", "clusterrun.remote.session", "clusterrun.remote.warm", "clusterrun.remote.wire",
    "clusterrun.runs", "clusterrun.runs.dirs", "clusterrun.runs.judge", "clusterrun.runs.live",
    "clusterrun.runs.record", "clusterrun.runs.timeline", "clusterrun.runs.series", "clusterrun.runs.traffic",
    "clusterrun.transport.base",
)
#: Node-side files the supervisor hands on to the agents (the workers' stack hook): see ``remote.source``.
SUPERVISOR_FILES = ("stackhook",)

_PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent


def module_path(name: str) -> Path:
    """The file of module ``name`` (a package's ``__init__.py``)."""
    base = _PACKAGE_ROOT / Path(*name.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def payload(modules: tuple[str, ...] = SUPERVISOR_MODULES, files: tuple[str, ...] = SUPERVISOR_FILES) -> str:
    """One line (no newline) that :data:`LOADER` reads: every module's source, and the node files by name."""
    from clusterrun import remote

    entries = [[name, module_path(name).read_text(encoding="utf-8"), module_path(name).name == "__init__.py"]
               for name in modules]
    data = {"modules": entries, "files": {name: remote.source(name) for name in files}}
    return base64.b64encode(zlib.compress(json.dumps(data).encode(), 9)).decode("ascii")


# The program a node runs (python -S -c LOADER ENTRY). It must run on the node's Python before any of clusterrun is
# there, so it is kept small and plain; what it loads needs Python 3.10 (the loader says so on an older one).
LOADER = r"""
import base64, importlib.abc, importlib.util, json, sys, zlib
if sys.version_info < (3, 10):
    sys.stdout.write('{"ev":"error","text":"the cluster supervisor needs Python 3.10 or newer on this node, not %s"}\n'
                     % sys.version.split()[0])
    sys.exit(2)
_D = json.loads(zlib.decompress(base64.b64decode(sys.stdin.buffer.readline())))
_M = {name: (text, package) for name, text, package in _D["modules"]}
_P = {name.rsplit(".", i)[0] for name in _M for i in range(1, name.count(".") + 1)}
class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name in _M or name in _P:
            return importlib.util.spec_from_loader(name, self, is_package=name in _P or _M[name][1])
        return None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        text = _M.get(module.__name__, ("", True))[0]
        module.__file__ = module.__name__.replace(".", "/") + ".py"
        exec(compile(text, module.__file__, "exec"), module.__dict__)
sys.meta_path.insert(0, _Finder())
import clusterrun.remote
clusterrun.remote.BUNDLED.update(_D["files"])
del _D
sys.exit(importlib.import_module(sys.argv[1]).main(sys.argv[2:]))
"""


def argv(python: str, entry: str = SUPERVISOR_MODULES[0], *args: str) -> list[str]:
    """The command that runs ``entry``'s ``main(args)`` from a bundle under ``python`` on a node (no site: like the
    agent, it needs nothing site-packages holds)."""
    return [python, "-S", "-c", LOADER, entry, *args]
