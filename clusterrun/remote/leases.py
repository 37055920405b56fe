"""GPU and master-port leases on a node (standard library only, any Python 3.8+).

A run holds a lease on each GPU it uses, and on its master port, for its whole life: a lock file per GPU
(``gpu<N>.lock``) or port (``port<N>.lock``) in the node's lease directory, locked with ``flock(2)`` by the
run's node agent. The kernel drops a lock when the process holding it ends, however it ends (SIGKILL
included), so a lease can never outlive its run: a file that is there but not locked is free to take. Inside
the file: the holder's run id, user, start time and pid (JSON), for whoever finds the GPU taken.

The lease directory is ``$CLUSTERRUN_LEASES`` when set, else ``/tmp/clusterrun-leases/<hostname>``: on the
node's own disk and shared by every user (a GPU is the machine's, not one user's; a home directory is often
the same NFS share on every node, where one node's GPU 0 would lock every node's), one subdirectory per machine
so that machines sharing a /tmp (or containers sharing the host's) never mix their GPUs. The directories are
world-writable with the sticky bit, like /tmp; the files are readable and writable by everyone, so that any
user can take a lease whose holder has ended. Leases are cooperation between runs, not access control.

A lease taken by the same run (two inventory nodes of one run on one machine) is shared, not refused.
"""

import errno
import fcntl
import json
import os
import socket
import time

DIR_VAR = "CLUSTERRUN_LEASES"
GPU, PORT = "gpu", "port"
#: The master port tried first when the user set none (torchrun's default), then the ones after it.
DEFAULT_PORT = 29500
PORT_TRIES = 100

_held = []  # the open lock files of this process's leases: they stay locked until the process ends


def lease_dir(environ=None):
    environ = os.environ if environ is None else environ
    if environ.get(DIR_VAR):
        return os.path.expanduser(environ[DIR_VAR])
    return os.path.join("/tmp", "clusterrun-leases", socket.gethostname() or "localhost")


def _make_dirs(path):
    parent = os.path.dirname(path)
    for d in (parent, path):
        try:
            os.mkdir(d, 0o1777)
        except FileExistsError:
            continue
        try:
            os.chmod(d, 0o1777)  # mkdir's mode is cut by the umask: every user must be able to add leases
        except OSError:
            pass


def _open(path):
    """An fd of the lock file, created when missing. An existing file is opened without O_CREAT: in a sticky
    directory the kernel (fs.protected_regular) refuses O_CREAT on another user's file."""
    for _ in range(3):
        try:
            return os.open(path, os.O_RDWR)
        except FileNotFoundError:
            pass
        except PermissionError:
            return os.open(path, os.O_RDONLY)  # another user's lease that predates 0666: still lockable
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        try:
            os.fchmod(fd, 0o666)
        except OSError:
            pass
        return fd
    return os.open(path, os.O_RDWR)


def _user():
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return os.environ.get("USER") or str(os.getuid())


def holder(run_id, node=""):
    """What this process writes into a lease it takes."""
    return {"run": run_id, "node": node, "user": _user(), "since": time.time(), "pid": os.getpid()}


def _read(fd):
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 65536)
        found = json.loads(data.decode("utf-8", "replace")) if data.strip() else {}
    except (OSError, ValueError):
        found = {}
    return found if isinstance(found, dict) else {}


def _path(kind, key, environ=None):
    return os.path.join(lease_dir(environ), "%s%s.lock" % (kind, key))


def _lock(fd):
    """Lock ``fd`` exclusively without waiting for a holder: True, or False when a run holds it. A few quick
    tries: :func:`held` probes with a shared lock for a few microseconds, which must not pass for a holder."""
    for attempt in range(3):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                raise
        if attempt < 2:
            time.sleep(0.01)  # bounded: a probe's shared lock lasts microseconds, a run's lasts the run
    return False


def take(kind, key, who, environ=None):
    """Lease ``kind`` ``key`` (a GPU index, a port) for ``who`` (see :func:`holder`), without waiting.

    Returns None when taken (held until this process ends, or :func:`release`), or the holder's record when
    another run holds it. A lease held by ``who``'s own run is shared: None. Raises OSError when the lease
    directory cannot be used."""
    path = _path(kind, key, environ)
    _make_dirs(os.path.dirname(path))
    fd = _open(path)
    if not _lock(fd):
        found = _read(fd)
        os.close(fd)
        if found.get("run") and found.get("run") == who.get("run"):
            return None
        return found or {"run": "?", "user": "?", "since": None, "pid": None}
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(dict(who, kind=kind, key=key)).encode())
    except OSError:
        pass  # a read-only fd (see _open): the lease holds, only its description is not ours
    _held.append((kind, str(key), fd))
    return None


def release(kind, key):
    """Give up this process's lease ``kind`` ``key`` (the file stays: a file that is not locked is free)."""
    for item in list(_held):
        if item[0] == kind and item[1] == str(key):
            _held.remove(item)
            os.close(item[2])


def held(kind, environ=None):
    """{key: holder record} of the leases of ``kind`` held now on this machine, by any process (this one's
    too). A file nobody holds is a lease whose run ended: left out."""
    out = {}
    base = lease_dir(environ)
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return out
    mine = {key: fd for k, key, fd in _held if k == kind}
    for name in names:
        if not (name.startswith(kind) and name.endswith(".lock")):
            continue
        key = name[len(kind):-len(".lock")]
        if not key.isdigit():
            continue
        if key in mine:
            out[key] = _read(mine[key])
            continue
        try:
            fd = os.open(os.path.join(base, name), os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: never blocks a run taking it meanwhile
        except OSError:
            out[key] = _read(fd)  # locked: a live lease
        finally:
            os.close(fd)  # a lock this probe got goes with the fd
    return out


def describe(record):
    """``run 20261125-1700-ab12 of alice since 17:00:03 (pid 4242)``: who holds a lease, in words."""
    since = record.get("since")
    when = time.strftime("%H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "?"
    return "run %s of %s since %s (pid %s)" % (record.get("run") or "?", record.get("user") or "?", when,
                                                record.get("pid") or "?")


def take_gpus(gpus, who, environ=None):
    """Lease every GPU of ``gpus``. Returns "" when all are held now, else the line that says which are taken
    and by whom (the leases this call got are given back: the run does not start here)."""
    got, taken = [], []
    for gpu in gpus:
        try:
            found = take(GPU, gpu, who, environ)
        except OSError as exc:
            taken.append("GPU %s: cannot use the lease directory %s (%s)" % (gpu, lease_dir(environ),
                                                                           exc.strerror or exc))
            continue
        if found is None:
            got.append(gpu)
        else:
            taken.append("GPU %s is leased by %s" % (gpu, describe(found)))
    if not taken:
        return ""
    for gpu in got:
        release(GPU, gpu)
    return "; ".join(taken) + "; two runs never share a GPU: wait for it (up --wait-gpus), or use other GPUs"


def _bindable(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torchrun's store does: TIME_WAIT is no conflict
    try:
        s.bind(("", port))
        return True, ""
    except OSError as exc:
        return False, exc.strerror or str(exc)
    finally:
        s.close()


def check_port(port, who, environ=None):
    """Lease the master port the user gave and prove it free. Returns "" or the problem, naming the run that
    holds the port when a lease says so."""
    try:
        found = take(PORT, port, who, environ)
    except OSError:
        found = None  # no lease directory here: the port's own check below still holds
    if found is not None:
        return ("master port %d is held by %s; pick another with --master-port, or leave the port unset: then a "
                "free one is chosen" % (port, describe(found)))
    free, why = _bindable(port)
    if free:
        return ""
    release(PORT, port)
    return ("master port %d is already in use on this node (%s): another job, or a leftover one; pick another "
            "with --master-port, or leave it unset: then a free one is chosen" % (port, why))


def free_port(who, environ=None, first=DEFAULT_PORT, tries=PORT_TRIES):
    """A master port free on this node, leased for ``who``: ``first`` when free, else the next free one (a port
    another run leased is skipped even before its torchrun binds it). Returns the port, or 0 when none is."""
    for port in range(first, first + tries):
        try:
            if take(PORT, port, who, environ) is not None:
                continue
        except OSError:
            pass  # no lease directory: the bind alone decides
        if _bindable(port)[0]:
            return port
        release(PORT, port)
    return 0
