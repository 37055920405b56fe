"""The node agent's process tools: the processes under it or marked with a run's id, and how they are stopped.

Every process of a run carries the run's marks in its environment (``protocol.RUN_ID_VAR`` and ``NODE_VAR``), so
what is left of a run can be found without its agent; the agent itself is a child subreaper, so the processes its
job started stay its descendants even when their parent dies.

Standard library only: this module travels to the nodes with the agent.
"""

import contextlib
import ctypes
import os
import signal
import time

if __package__:
    from clusterrun.remote import protocol
else:
    import protocol

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, value: int) -> bool:
    """Linux's prctl(2) with one value; False where it is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def ns_pid(pid: int) -> int:
    """``pid`` as the process itself sees it: in a container (its own PID namespace) the innermost of its
    ``NSpid``; the same number elsewhere. The workers' hook names its files by the pid it sees."""
    try:
        with open("/proc/%d/status" % pid, "rb") as fh:
            for line in fh:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return pid


def _proc_ppids() -> dict:
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # the command name may contain spaces and parentheses: split after the last ')'
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1:
            out[int(name)] = int(fields[1])
    return out


def _children(pid: int):
    """``pid``'s children from /proc/<pid>/task/*/children; None where the kernel does not offer that file."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone
    out = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended meanwhile
            return None  # a kernel without the file
        except (OSError, ValueError):
            continue
    return out


def descendants(root: int) -> list:
    """Every process under ``root``. Walks the tree from ``root`` down where the kernel lists each process's
    children (read every few seconds for the CPU reports: reading every process's stat on a busy machine costs
    milliseconds each time); else from every process's parent."""
    found, todo = [], [root]
    while todo and len(found) < 100000:
        kids = _children(todo.pop())
        if kids is None:
            return _descendants_by_scan(root)
        found.extend(kids)
        todo.extend(kids)
    return found


def _descendants_by_scan(root: int) -> list:
    ppids = _proc_ppids()
    children: dict = {}
    for pid, ppid in ppids.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def job_environ(job_env: dict, run_id: str, node: str) -> dict:
    """The job's environment before the workers' hook: this node's, the spec's, and the run's markers."""
    env = dict(os.environ)
    env.update(job_env)
    env[protocol.RUN_ID_VAR] = run_id
    env[protocol.NODE_VAR] = node
    return env


def marked(run_id: str, exclude: set, node: str = "") -> list:
    """Processes of our user whose environment carries this run's marker (and this node's, when given:
    two inventory nodes may be one machine)."""
    needle = f"{protocol.RUN_ID_VAR}={run_id}".encode()
    node_needle = f"{protocol.NODE_VAR}={node}".encode()
    uid = os.getuid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in exclude:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        items = env.split(b"\0")
        if needle in items and (not node or node_needle in items):
            found.append(int(name))
    return found


def _started(pid: int, boot: float, tick: float):
    """When process ``pid`` started (seconds since the epoch), from /proc/<pid>/stat; None when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        return boot + int(stat[stat.rfind(")") + 2:].split()[19]) / tick
    except (OSError, ValueError, IndexError):
        return None


def _boot_time() -> float:
    with open("/proc/stat") as f:
        return float(next(line.split()[1] for line in f if line.startswith("btime ")))


def runs(exclude: set) -> dict:
    """Every run with processes here that this user may see (another user's environment is not readable;
    their runs show through their leases): {run id: {"pids", "nodes", "user", "since"}}."""
    prefix, node_prefix = f"{protocol.RUN_ID_VAR}=".encode(), f"{protocol.NODE_VAR}=".encode()
    try:
        boot, tick = _boot_time(), float(os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, StopIteration):
        boot, tick = 0.0, 0.0
    out: dict = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in exclude:
            continue
        try:
            uid = os.stat(f"/proc/{name}").st_uid
            with open(f"/proc/{name}/environ", "rb") as f:
                items = f.read().split(b"\0")
        except OSError:
            continue
        run = next((i[len(prefix):].decode(errors="replace") for i in items if i.startswith(prefix)), None)
        if not run:
            continue
        entry = out.setdefault(run, {"pids": [], "nodes": [], "uid": uid, "since": None})
        entry["pids"].append(int(name))
        node = next((i[len(node_prefix):].decode(errors="replace") for i in items if i.startswith(node_prefix)), "")
        if node and node not in entry["nodes"]:
            entry["nodes"].append(node)
        started = _started(int(name), boot, tick) if tick else None
        if started is not None and (entry["since"] is None or started < entry["since"]):
            entry["since"] = started
    for entry in out.values():
        try:
            import pwd

            entry["user"] = pwd.getpwuid(entry.pop("uid")).pw_name
        except (ImportError, KeyError):
            entry["user"] = str(entry.pop("uid", "?"))
    return out


def _signal_all(pids: list, sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"  # a zombie is already dead


def stop_processes(find, grace: float) -> list:
    """SIGTERM what ``find()`` returns, SIGKILL what is left after ``grace`` seconds. Returns the pids signalled."""
    pids = find()
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = pids
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        reap()
        left = [p for p in find() if _alive(p)]
    if left:
        _signal_all(left, signal.SIGKILL)
        end = time.monotonic() + 2.0
        while time.monotonic() < end and any(_alive(p) for p in left):
            time.sleep(0.02)
            reap()
    return sorted(set(pids) | set(left))


def wait_for(pid: int) -> int:
    """Reap children (this process is a subreaper: orphans come here too) until ``pid`` ends; its wait status."""
    while True:
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue
        if got == pid:
            return status


def reap() -> None:
    """Collect exited children (we are a subreaper: orphans of the job become ours)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
