"""Taking the stack of every rank on this node (for clusterrun's hang diagnosis): py-spy when the node has it,
otherwise the faulthandler hook that ``stackhook.py`` installs in every worker.

Standard library only: this module travels to the nodes with the agent.
"""

import os
import shutil
import signal
import subprocess
import time

if __package__:
    from clusterrun.remote import procs
else:
    import procs

# A real-time signal: nothing in Python or torch uses it. It is only sent to processes whose hook says it
# is installed, so a worker without the hook is never killed by it.
HOOK_SIGNAL = int(signal.SIGRTMIN) + 7
PY_SPY_TIMEOUT = 15.0
HOOK_TIMEOUT = 3.0


def hooks_dir(run_dir):
    """Where the workers' hook (their ``sitecustomize``) is written: the first entry of their PYTHONPATH."""
    return os.path.join(run_dir, "hooks")


def hook_env(run_dir, source, env):
    """Write the hook (``source``: stackhook.py's text) under ``run_dir`` and return the environment the
    workers need for it (``env``: the job's environment, whose PYTHONPATH is kept after the hook's)."""
    hooks = hooks_dir(run_dir)
    os.makedirs(hooks, exist_ok=True)
    with open(os.path.join(hooks, "sitecustomize.py"), "w") as fh:
        fh.write(source)
    path = env.get("PYTHONPATH")
    return {"PYTHONPATH": hooks + (os.pathsep + path if path else ""),
            "CLUSTERRUN_STACKS": os.path.join(run_dir, "stacks"), "CLUSTERRUN_STACK_SIGNAL": str(HOOK_SIGNAL)}


def _environ(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            items = fh.read().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode(errors="replace").split("=", 1) for item in items if b"=" in item)


def _ppid(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            stat = fh.read()
        return int(stat[stat.rfind(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def workers(pids):
    """``{local_rank: pid}`` among ``pids``: torchrun's workers (``LOCAL_RANK`` set, by a parent without it,
    so a data-loader process a worker forked is not taken for the worker)."""
    ranked = {}
    for pid in pids:
        local = _environ(pid).get("LOCAL_RANK")
        if local is None or not local.isdigit():
            continue
        parent = _ppid(pid)
        if parent is not None and _environ(parent).get("LOCAL_RANK") is not None:
            continue
        ranked[int(local)] = pid
    return ranked


def cpu_seconds(pid):
    """CPU time ``pid`` has used, with the children it waited for (data-loader processes): seconds, or None."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rfind(b")") + 2:].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _py_spy(pid):
    tool = shutil.which("py-spy")
    if tool is None:
        return None
    try:
        done = subprocess.run([tool, "dump", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=PY_SPY_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 and done.stdout.strip() else None


def _hooked(pid, folder):
    own = procs.ns_pid(pid)  # the hook names its files by the pid it sees (another one in a container)
    if not os.path.exists(os.path.join(folder, "hooked-%d" % own)):
        return None
    path = os.path.join(folder, "stack-%d.txt" % own)
    try:
        before = os.path.getsize(path)
        os.kill(pid, HOOK_SIGNAL)
    except OSError:
        return None
    deadline, last, settled = time.monotonic() + HOOK_TIMEOUT, before, 0
    while time.monotonic() < deadline and settled < 3:  # the dump is written at once; wait until it stops growing
        time.sleep(0.05)
        size = os.path.getsize(path)
        settled = settled + 1 if size == last and size > before else 0
        last = size
    with open(path, "rb") as fh:
        fh.seek(before)
        return fh.read().decode(errors="replace") or None


def dump(pid, folder):
    """``(how, text)``: the stack of every thread of ``pid`` by py-spy, else by the hook; ``("none", why)``."""
    text = _py_spy(pid)
    if text:
        return "py-spy", text
    text = _hooked(pid, folder) if folder else None
    if text:
        return "faulthandler", text
    return "none", ("no py-spy on the node (pip install py-spy) and the worker has no clusterrun stack hook "
                    "(a sitecustomize of its own, or python -S/-I)")
