"""A node's GPUs as nvidia-smi tells them, gathered on the node (standard library only, any Python 3.8+).

:func:`gather` is the ``gpu`` part of the node reporter (``nodefacts.py``): nvidia-smi's own words, not parsed
here (``clusterrun.facts.gpus`` reads them with the parsers clusterrun tests on recorded output)::

    {"smi": <path of nvidia-smi>,
     "visible": <CUDA_VISIBLE_DEVICES in this environment, or null when it is not set>,
     "fields": <the FIELDS of the query, which name its columns>,
     "query": <--query-gpu=FIELDS --format=csv,noheader,nounits>,   or "query_error": why not
     "apps": <--query-compute-apps=FIELDS --format=csv,noheader,nounits>,   or "apps_error"
     "topo": <topo -m>,   or "topo_error"
     "owners": {pid: {"user": name, "run_id": CLUSTERRUN_RUN_ID or null}}}   # of the compute processes

A call that failed also leaves ``<call>_exit`` (its exit status; 124 when it hung, 126 when it could not run)
and ``<call>_output`` (what it printed, at most OUTPUT_LIMIT characters): the evidence doctor shows. This is
the one nvidia-smi round of a node, for ``up`` and ``doctor`` alike (doctor's GPU checks read the ECC count too).

The three calls run at once, each bounded by ``timeout``: a hung or failing nvidia-smi is reported as a
sentence, never waited on for ever and never a crash. Without nvidia-smi, only ``{"smi": null, "visible": ...}``
where CUDA_VISIBLE_DEVICES is set (the node's own limit holds all the same), else None.
"""

import os
import shutil
import subprocess
import time

if __package__:
    from clusterrun.remote import protocol
else:
    import protocol  # sent before this module, as remote.PROGRAM_MODULES and AGENT_MODULES say

#: What is asked of each GPU and process: the fields of clusterrun.facts.parsers.nvidia_smi (GPU_FIELDS,
#: APP_FIELDS), in the same order, then the uncorrected ECC errors since the driver loaded (doctor's gpu.ecc).
#: Without a header the order names the columns: the report carries the fields.
GPU_FIELDS = "index,uuid,name,pci.bus_id,driver_version,memory.total,memory.used,utilization.gpu," \
             "ecc.errors.uncorrected.volatile.total"
APP_FIELDS = "gpu_uuid,pid,process_name,used_memory"
TIMEOUT = 10.0
TOOL = "nvidia-smi"
OUTPUT_LIMIT = 4000
#: The exit status a call that hung, could not run or was not found is given (as timeout(1) and a shell give them).
HUNG, CANNOT_RUN, NOT_FOUND = 124, 126, 127


def commands(tool, fields=GPU_FIELDS):
    """The argv of each call: ``query`` (the GPUs' ``fields``), ``apps`` (the compute processes), ``topo``."""
    return {"query": [tool, "--query-gpu=" + fields, "--format=csv,noheader,nounits"],
            "apps": [tool, "--query-compute-apps=" + APP_FIELDS, "--format=csv,noheader,nounits"],
            "topo": [tool, "topo", "-m"]}


def _finish(proc, deadline, timeout):
    """(stdout, None, None, "") when the command ended well, else (None, why, exit status, what it printed)."""
    try:
        out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        try:  # a process stuck in the driver may not even die: it is left behind, not waited for
            proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        return None, "no answer within %gs (nvidia-smi hangs: a stuck driver or GPU?)" % timeout, HUNG, ""
    if proc.returncode != 0:
        printed = (out.strip() + "\n" + err.strip()).strip()
        words = printed.splitlines()
        return (None, "exit %d: %s" % (proc.returncode, words[-1][:300] if words else "no output"), proc.returncode,
                printed[-OUTPUT_LIMIT:])
    return out, None, None, ""


def _owner(pid):
    """Who runs ``pid`` here and the clusterrun run it belongs to, as far as this user may read it."""
    user, run_id = None, None
    try:
        with open("/proc/%d/status" % pid) as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    uid = int(line.split()[1])
                    try:
                        import pwd

                        user = pwd.getpwuid(uid).pw_name
                    except (ImportError, KeyError):
                        user = str(uid)
                    break
    except (OSError, ValueError, IndexError):
        return None
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            for item in fh.read().split(b"\0"):
                if item.startswith(protocol.RUN_ID_VAR.encode() + b"="):
                    run_id = item.split(b"=", 1)[1].decode(errors="replace")
    except OSError:
        pass  # another user's process: its environment is not ours to read
    return {"user": user, "run_id": run_id}


def owners(apps_text):
    """``{pid: owner}`` of the processes in ``--query-compute-apps`` output (pid is its second column)."""
    found = {}
    for line in apps_text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) > 1 and cells[1].isdigit():
            owner = _owner(int(cells[1]))
            if owner is not None:
                found[cells[1]] = owner
    return found


def gather(environ=None, timeout=TIMEOUT, tool=None):
    """The node's GPUs in nvidia-smi's words (see the module's docstring); without nvidia-smi, the node's
    CUDA_VISIBLE_DEVICES alone, or None where it is not set."""
    environ = os.environ if environ is None else environ
    tool = tool or shutil.which(TOOL, path=environ.get("PATH"))
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if tool is None:
        return None if visible is None else {"smi": None, "visible": visible}
    out = {"smi": tool, "visible": visible, "fields": GPU_FIELDS}
    env = dict(environ, LC_ALL="C")
    started = time.monotonic()
    procs = {}
    for key, argv in commands(tool).items():
        try:
            procs[key] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          stdin=subprocess.DEVNULL, universal_newlines=True, env=env)
        except OSError as exc:
            out[key + "_error"] = "cannot run %s: %s" % (tool, exc.strerror or exc)
            out[key + "_exit"], out[key + "_output"] = CANNOT_RUN, out[key + "_error"]
    deadline = started + timeout
    for key, proc in procs.items():
        text, error, code, printed = _finish(proc, deadline, timeout)
        if error is None:
            out[key] = text
        else:
            out[key + "_error"], out[key + "_exit"], out[key + "_output"] = error, code, printed
    out["owners"] = owners(out.get("apps") or "")
    return out
