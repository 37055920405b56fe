"""A warm torchrun: the job's launcher started at the ready check, importing torch while the check, the staging
and the path probes run, and handed the job's argv and environment at ``go``.

``python -m torch.distributed.run`` spends its first seconds importing torch (1.1-1.5 s of CPU on a quiet
machine; far more from a network filesystem or a cold page cache) before it reaches its rendezvous. A launch
that waits for ``go`` to start it adds that import to every node's critical path after the checks. So when
clusterrun asks for it (the check's ``warm``: the interpreter, the job's environment and directory as planned
before the check), the agent starts ``python -c CODE`` at once: it imports torchrun and then waits for one line
on its stdin.

At ``go`` it is used only when nothing that could change what the import did differs from the job's start:

* the same interpreter running ``-m torch.distributed.run``, in the same directory;
* the same environment, except variables only the workers, NCCL, gloo and the GPUs read (:data:`LATE`:
  ``CUDA_VISIBLE_DEVICES``, ``NCCL_*``, ``GLOO_SOCKET_IFNAME``, clusterrun's own ``CLUSTERRUN_*`` and a few
  more; the ready check decides GPUs and NICs), and the workers' hook directory in front of ``PYTHONPATH``
  (the hook does nothing in torchrun itself).

Otherwise (or when it ended early: no torch, a broken install) it is killed and torchrun starts cold, exactly as
without it; the reason is reported. Used, it takes the job's environment (``os.environ``: its workers get exactly
the job's), its argv and /dev/null as stdin, and runs torchrun as ``python -m`` would.

Its process is what a cold torchrun's would be: the agent's child in a session of its own, with the run's
markers in its environment, killed with the agent (``PR_SET_PDEATHSIG``) and by every sweep of the run.

Standard library only.
"""

import json
import os
import signal
import subprocess
import time

if __package__:
    from clusterrun.remote import procs
else:
    import procs

MODULE = "torch.distributed.run"
#: Variables that may differ between the warm start and the job's (read by workers, NCCL or CUDA, not by
#: torchrun's import): exact names, and prefixes.
LATE = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "MASTER_ADDR",
        "MASTER_PORT")
LATE_PREFIXES = ("NCCL_", "CLUSTERRUN_")
#: The warm process: as ``python -m`` does, the directory it started in first on sys.path (not ''); torchrun and
#: torch imported; then one line, {"env", "args"}, and torchrun run as ``__main__`` by runpy, as ``-m`` runs it,
#: after forgetting the module imported under its own name (as ``-m`` leaves it): its logger is then not under
#: torch's, so its output reads the same, and its exit code is torchrun's.
CODE = (
    "import json,os,runpy,sys\n"
    "sys.path[0]=os.getcwd()\n"
    "import torch.distributed.run\n"
    "_l=sys.stdin.readline()\n"
    "if not _l.strip():\n"
    " os._exit(0)\n"
    "_o=json.loads(_l)\n"
    "_n=os.open(os.devnull,os.O_RDONLY)\n"
    "os.dup2(_n,0)\n"
    "os.close(_n)\n"
    "os.environ.clear()\n"
    "os.environ.update(_o['env'])\n"
    "sys.argv=['']+_o['args']\n"
    "del _l,_o,_n\n"
    "sys.modules.pop('torch.distributed.run',None)\n"
    "vars(sys.modules['torch.distributed']).pop('run',None)\n"
    "runpy.run_module('torch.distributed.run',run_name='__main__',alter_sys=True)\n"
)


def unfit(started_env, env, hooks):
    """The variables of ``env`` (the job's) that keep a torchrun warmed with ``started_env`` from being the
    job's, sorted; ``hooks``: the workers' hook directory, which may lead the job's PYTHONPATH."""
    names = []
    for name in set(started_env) | set(env):
        before, now = started_env.get(name), env.get(name)
        if before == now or name in LATE or name.startswith(LATE_PREFIXES):
            continue
        if name == "PYTHONPATH" and now is not None:
            rest = now.split(os.pathsep)
            if rest[0] == hooks and os.pathsep.join(rest[1:]) == (before or ""):
                continue
        names.append(name)
    return sorted(names)


class Warm:
    """One warm torchrun, between the check and ``go``."""

    def __init__(self, proc, python, cwd, env):
        self.since = time.time()  # when its torch import began
        self.proc = proc
        self.python = python
        self.cwd = cwd
        self.env = env

    def why_not(self, argv, env, cwd, hooks):
        """Why it cannot run ``argv`` with ``env`` in ``cwd`` (None: it can)."""
        if self.proc.poll() is not None:
            return "it ended before go (exit code %s)" % self.proc.returncode
        if list(argv[:3]) != [self.python, "-m", MODULE]:
            return "the job is not %s -m %s" % (self.python, MODULE)
        if os.path.realpath(cwd) != os.path.realpath(self.cwd):
            return "the job runs in %s" % cwd
        names = unfit(self.env, env, hooks)
        if names:
            return "the job's environment differs: %s" % ", ".join(names[:5])
        return None

    def discard(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: anything it started goes too
        except OSError:
            pass
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


_warm = None


def start(python, env, cwd):
    """Start the warm torchrun (at most one per agent) under ``python`` with ``env`` in ``cwd``. Quietly nothing
    where it cannot start: the job's own start says why."""
    global _warm
    if _warm is not None:
        return
    try:
        proc = subprocess.Popen(
            [python, "-c", CODE], cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
            # As a cold torchrun: SIGTERM if this agent dies (from this thread: the agent's main thread).
            preexec_fn=lambda: procs.prctl(procs.PR_SET_PDEATHSIG, signal.SIGTERM),
        )
    except OSError:
        return
    _warm = Warm(proc, python, cwd, env)


def take(argv, env, cwd, hooks):
    """The warm torchrun, now running ``argv`` with ``env`` (its stdout carries torchrun's output), or None; and
    what the ``started`` event says of it: ``warm`` (bool), ``since`` (when its import began) or ``cold`` (why
    it was not used, after killing it)."""
    global _warm
    warm, _warm = _warm, None
    if warm is None:
        return None, {"warm": False}
    why = warm.why_not(argv, env, cwd, hooks)
    if why is None:
        try:
            warm.proc.stdin.write(json.dumps({"env": env, "args": list(argv[3:])}).encode() + b"\n")
            warm.proc.stdin.close()
            return warm.proc, {"warm": True, "since": warm.since}
        except OSError as exc:
            why = "it could not be told to start: %s" % (exc.strerror or exc)
    warm.discard()
    return None, {"warm": False, "cold": why}


def drop():
    """Kill the warm torchrun nobody took (the launch ended before ``go``)."""
    global _warm
    warm, _warm = _warm, None
    if warm is not None:
        warm.discard()
