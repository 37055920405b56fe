"""Installed as ``sitecustomize`` in each worker of a run whose hangs clusterrun diagnoses (no py-spy needed).

The node agent writes this file as ``<run dir>/hooks/sitecustomize.py`` and puts that directory first on
the workers' PYTHONPATH. In a process that torchrun started (``LOCAL_RANK`` is set) and that carries
``CLUSTERRUN_STACKS`` (a directory), it registers :mod:`faulthandler` on signal ``CLUSTERRUN_STACK_SIGNAL``
to write every thread's stack to ``<dir>/stack-<pid>.txt``, and marks ``<dir>/hooked-<pid>`` so that
the agent sends that signal only to processes that will not die of it. Then it runs the site's own
``sitecustomize``, if there is one further along the path, so nothing the environment sets up is lost.
"""

import os
import sys


def _install():
    folder = os.environ.get("CLUSTERRUN_STACKS")
    if not folder or os.environ.get("LOCAL_RANK") is None:
        return
    try:
        import faulthandler

        signum = int(os.environ.get("CLUSTERRUN_STACK_SIGNAL", "0"))
        if signum <= 0:
            return
        os.makedirs(folder, exist_ok=True)
        out = open(os.path.join(folder, "stack-%d.txt" % os.getpid()), "w")  # noqa: SIM115 - open for the process's life
        faulthandler.register(signum, file=out, all_threads=True, chain=False)
        open(os.path.join(folder, "hooked-%d" % os.getpid()), "w").close()
    except (OSError, ValueError, RuntimeError):
        pass  # no stacks from this process then; it runs as it would without clusterrun


def _chain():
    """Import the sitecustomize that this one hides, if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import importlib.machinery
        import importlib.util

        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as exc:  # as Python itself does for a failing sitecustomize: say so, go on
        sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s\n"
                         % (type(exc).__name__, exc))


_install()
_chain()
