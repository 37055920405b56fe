"""torch's flight recorder on a node: turned on for the workers, dumped on request, its timeout dumps gathered.

The flight recorder keeps the last collectives each process group ran (operation, sequence number, sizes,
state). With it on, a hang can be explained per collective: which ranks wait in all_reduce #1042 and which
never called it. clusterrun turns it on where the hang watch is on (``--hang-timeout``):

* ``env`` sets the buffer (``TORCH_FR_BUFFER_SIZE``, and ``TORCH_NCCL_TRACE_BUFFER_SIZE`` for torch releases
  before the general recorder) and where NCCL's watchdog writes its dump when a collective times out; values
  the job sets itself are kept;
* the workers' hook (``stackhook.py``) serves dump requests on a FIFO per process, ``ask-<pid>``, and writes
  ``flight-<pid>.json`` (torch's JSON dump) in reply; ``request`` asks every worker at once and waits;
* ``timeout_dumps`` lists what NCCL's watchdog wrote on its own, for the agent to send at the end.

Standard library only: this module travels to the nodes with the agent.
"""

import errno
import os
import time

if __package__:
    from clusterrun.remote import procs
else:
    import procs

BUFFER_ENTRIES = "2000"  # collectives kept per process: torch's own suggestion for debugging hangs
REQUEST_TIMEOUT = 10.0
TIMEOUT_DUMP_PREFIX = "nccl-rank"  # torch appends the rank
MAX_DUMP_BYTES = 32 << 20


def folder(run_dir):
    return os.path.join(run_dir, "flight")


def torch_version():
    """``(major, minor)`` of the torch this interpreter would import (read from its metadata, not imported)."""
    if __package__:
        from clusterrun.remote import ready
    else:
        import ready  # found as the agent finds it, without site (see ready.find_torch)
    try:
        found = ready.find_torch()
        parts = ready.torch_version(found).split(".") if found is not None else ()
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except Exception:  # no torch, odd metadata: the version is unknown
        return None


def env(run_dir, job_env, version=None):
    """The workers' environment for the flight recorder; a variable the job sets itself is left alone.

    torch 2.8 renamed the recorder's variables from ``TORCH_NCCL_*`` to ``TORCH_FR_*`` (it records gloo too)
    and warns in every rank about the old names; older releases read only the old ones. ``version``: the
    node's torch as ``(major, minor)``, or None when unknown (then both names are set).
    """
    where = folder(run_dir)
    os.makedirs(where, exist_ok=True)
    prefix = os.path.join(where, TIMEOUT_DUMP_PREFIX)
    size = job_env.get("TORCH_FR_BUFFER_SIZE", job_env.get("TORCH_NCCL_TRACE_BUFFER_SIZE", BUFFER_ENTRIES))
    wanted = {"CLUSTERRUN_FLIGHT": where, "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    if version is None or version >= (2, 8):
        wanted.update({"TORCH_FR_BUFFER_SIZE": size, "TORCH_FR_DUMP_TEMP_FILE": prefix})
    if version is None or version < (2, 8):
        wanted.update({"TORCH_NCCL_TRACE_BUFFER_SIZE": size, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix})
    taken = set(job_env)
    if taken & {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}:  # the job sized it (0: off): its choice
        wanted.pop("TORCH_FR_BUFFER_SIZE", None)
        wanted.pop("TORCH_NCCL_TRACE_BUFFER_SIZE", None)
    return {key: value for key, value in wanted.items() if key == "CLUSTERRUN_FLIGHT" or key not in taken}


def _ask(where, pid):
    """Open the worker's FIFO without blocking and write one byte: True when a hook was there to read it."""
    try:
        fd = os.open(os.path.join(where, "ask-%d" % procs.ns_pid(pid)), os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.ENOENT):  # no reader (no hook, or the process is gone)
            return False
        raise
    try:
        os.write(fd, b"1")
    finally:
        os.close(fd)
    return True


def request(pids, where, timeout=REQUEST_TIMEOUT):
    """Ask each of ``pids`` for its dump; ``{pid: (bytes or None, why)}`` once all answered or ``timeout``."""
    asked, out = {}, {}
    for pid in pids:
        path = os.path.join(where, "flight-%d.json" % procs.ns_pid(pid))  # the pid the worker sees (a container)
        try:
            os.unlink(path)
        except OSError:
            pass
        try:
            if _ask(where, pid):
                asked[pid] = path
            else:
                out[pid] = (None, "the worker has no clusterrun hook (a sitecustomize of its own, or python -S/-I)")
        except OSError as exc:
            out[pid] = (None, "cannot ask for its flight recorder: %s" % (exc.strerror or exc))
    deadline = time.monotonic() + timeout
    while asked and time.monotonic() < deadline:
        for pid, path in list(asked.items()):
            if os.path.exists(path):  # written beside, then renamed: whole when it appears
                out[pid] = read_dump(path)
                del asked[pid]
        if asked:
            time.sleep(0.05)
    for pid in asked:
        out[pid] = (None, "no flight recorder dump within %.0fs (the worker holds the GIL?)" % timeout)
    return out


def read_dump(path):
    """``(bytes or None, why)`` of one dump file, bounded in size."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_DUMP_BYTES + 1)
    except OSError as exc:
        return None, "cannot read %s: %s" % (path, exc.strerror or exc)
    if len(data) > MAX_DUMP_BYTES:
        return None, "%s is over %d MiB; left on the node" % (path, MAX_DUMP_BYTES >> 20)
    return data, ""


def timeout_dumps(where):
    """``[(local_rank_or_rank, path)]``: the dumps torch's watchdog wrote itself (a collective timed out)."""
    found = []
    try:
        names = sorted(os.listdir(where))
    except OSError:
        return found
    for name in names:
        if name.startswith(TIMEOUT_DUMP_PREFIX) and name[len(TIMEOUT_DUMP_PREFIX):].isdigit():
            found.append((int(name[len(TIMEOUT_DUMP_PREFIX):]), os.path.join(where, name)))
    return sorted(found)
