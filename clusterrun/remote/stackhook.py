"""Installed as ``sitecustomize`` in each worker of a run whose hangs clusterrun diagnoses (no py-spy needed), or
whose ranks it binds to their GPU's CPUs.

With ``CLUSTERRUN_CPU_BIND`` (each local rank's CPU list and memory node, ``;`` between ranks: ``0-51/0;52-103/1``)
a worker first moves itself onto its local rank's CPUs (``sched_setaffinity``; those it is not allowed are left
out) and prefers its memory node for what it allocates (``set_mempolicy(MPOL_PREFERRED)``, where the node
exists): before the script runs, so every thread torch and its libraries start later runs there too.

The node agent writes this file as ``<run dir>/hooks/sitecustomize.py`` and puts that directory first on
the workers' PYTHONPATH. In a process that torchrun started (``LOCAL_RANK`` is set) and that carries
``CLUSTERRUN_STACKS`` (a directory), it registers :mod:`faulthandler` on signal ``CLUSTERRUN_STACK_SIGNAL``
to write every thread's stack to ``<dir>/stack-<pid>.txt``, and marks ``<dir>/hooked-<pid>`` so that
the agent sends that signal only to processes that will not die of it. With ``CLUSTERRUN_FLIGHT`` (a
directory) it also serves torch's flight recorder: a thread waits on the FIFO ``<dir>/ask-<pid>`` and, each time
the agent writes to it, writes torch's JSON dump of this process's recent collectives to
``<dir>/flight-<pid>.json`` (a thread, because the main thread of a hung rank is blocked inside torch and
would run no Python signal handler). On a restarted job it adds clusterrun's restart count to
``TORCHELASTIC_RESTART_COUNT``, and on a job clusterrun may restart its ``--max-restarts`` to
``TORCHELASTIC_MAX_RESTARTS`` (torchrun itself is told 0: clusterrun restarts the whole job). Then it
runs the site's own ``sitecustomize``, if there is one further along the path, so nothing the
environment sets up is lost.
"""

import os
import sys

CPU_BIND_VAR = "CLUSTERRUN_CPU_BIND"
MPOL_PREFERRED = 1
# set_mempolicy's number where Python has no call for it (asm-generic: aarch64, riscv64).
SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "riscv64": 237, "ppc64le": 261}


def cpu_set(text):
    """The CPUs of a kernel CPU list (``0-3,8``)."""
    cpus = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if low.isdigit():
            cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def _prefer_memory(node):
    import ctypes
    import platform

    number = SET_MEMPOLICY.get(platform.machine())
    if number is None or node >= 64 or not os.path.isdir("/sys/devices/system/node/node%d" % node):
        return
    mask = ctypes.c_ulong(1 << node)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, MPOL_PREFERRED, ctypes.byref(mask), 65) != 0:  # 65: the kernel reads maxnode - 1 bits
        raise OSError(ctypes.get_errno(), "set_mempolicy")


def _bind():
    """This local rank onto its GPU's CPUs and memory node, as CLUSTERRUN_CPU_BIND says."""
    spec, local = os.environ.get(CPU_BIND_VAR), os.environ.get("LOCAL_RANK")
    if not spec or local is None or not local.isdigit():
        return
    entries = spec.split(";")
    if int(local) >= len(entries) or not entries[int(local)].strip():
        return
    text, _, numa = entries[int(local)].partition("/")
    try:
        cpus = cpu_set(text) & os.sched_getaffinity(0)
        if not cpus:
            sys.stderr.write("clusterrun: local rank %s not bound: none of CPUs %s is allowed to it\n" % (local, text))
            return
        os.sched_setaffinity(0, cpus)
        if numa.strip().isdigit():
            _prefer_memory(int(numa))
    except (OSError, AttributeError, ValueError) as exc:  # binding speeds a rank up; it must never stop one
        sys.stderr.write("clusterrun: local rank %s not bound to CPUs %s: %s\n" % (local, text, exc))


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


def _flight_dump():
    """torch's JSON dump of this process's flight recorder, or a JSON note saying why there is none."""
    import json

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return json.dumps({"error": "torch.distributed is not initialised in this process"}).encode()
    c10d = sys.modules.get("torch._C._distributed_c10d")
    dump = getattr(c10d, "_dump_fr_trace_json", None) or getattr(c10d, "_dump_nccl_trace_json", None)
    if dump is None:
        return json.dumps({"error": "this torch has no flight recorder for this backend"}).encode()
    data = dump(includeCollectives=True, onlyActive=False)
    return data if isinstance(data, bytes) else str(data).encode()


def _serve_flight(folder, fifo):
    out = os.path.join(folder, "flight-%d.json" % os.getpid())
    while True:
        try:
            with open(fifo, "rb") as fh:  # blocks until the agent opens it to write
                fh.read()
        except OSError:
            return
        try:
            data = _flight_dump()
        except Exception as exc:  # the dump is a diagnosis: it must never hurt the rank
            data = ('{"error": "flight recorder dump failed: %s"}' % type(exc).__name__).encode()
        try:
            with open(out + ".part", "wb") as fh:
                fh.write(data)
            os.replace(out + ".part", out)  # whole when it appears
        except OSError:
            pass


def _install_flight():
    folder = os.environ.get("CLUSTERRUN_FLIGHT")
    if not folder or os.environ.get("LOCAL_RANK") is None:
        return
    try:
        import threading

        os.makedirs(folder, exist_ok=True)
        fifo = os.path.join(folder, "ask-%d" % os.getpid())
        if os.path.exists(fifo):
            os.unlink(fifo)
        os.mkfifo(fifo, 0o600)
        threading.Thread(target=_serve_flight, args=(folder, fifo), daemon=True, name="clusterrun-flight").start()
    except (OSError, RuntimeError):
        pass  # no flight recorder dumps from this process then


def _restart_count():
    """A restarted job (clusterrun's attempt N) tells its workers so as torchrun would: TORCHELASTIC_RESTART_COUNT
    counts clusterrun's restarts too, for scripts that resume from a checkpoint when it is above 0, and
    TORCHELASTIC_MAX_RESTARTS counts the restarts clusterrun may make."""
    if os.environ.get("LOCAL_RANK") is None:
        return
    for ours, theirs in (("CLUSTERRUN_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"),
                         ("CLUSTERRUN_MAX_RESTARTS", "TORCHELASTIC_MAX_RESTARTS")):
        add = os.environ.get(ours, "0")
        if not add.isdigit() or add == "0":
            continue
        was = os.environ.get(theirs, "0")
        os.environ[theirs] = str(int(add) + (int(was) if was.isdigit() else 0))


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


_bind()
_install()
_install_flight()
_restart_count()
_chain()
