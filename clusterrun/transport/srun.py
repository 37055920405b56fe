"""The srun transport: every command is a one-task Slurm job step on the node, started by ``srun``.

Inside an allocation (``SLURM_JOB_ID`` set) each command is a step of that job on one node
(``--nodelist``): ``--overlap``, so the node agent's long step and the short ones beside it (the
ready check, copies, sweeps) share the node instead of queueing behind each other; the step takes
the node's whole share of the allocation (``--cpus-per-task`` from ``SLURM_JOB_CPUS_PER_NODE``:
with task binding a one-task step would otherwise get one CPU for all of torchrun's workers), and,
as every step does unless told otherwise, all the job's GPUs there. Outside an allocation each
command is a one-node job of its own. Nothing crosses SSH: the step stays in the job's cgroup
and accounting, and sites that forbid SSH into compute nodes work.

Commands run as ``sh -c 'cd DIR && env K=V argv...'``, the command line the SSH transport sends,
so ``~/`` paths expand on the node. srun hands the step this process's environment (Slurm's
``--export=ALL`` default), our stdin (the node agent's spec and commands) and gives back the
step's stdout and stderr.

Stopping: :meth:`SrunStream.abort` closes srun's stdin; the node agent reads the end of input and
stops its job, as when an SSH channel closes (a detached agent carries on). A signal to srun, or
srun's death, cancels the step at once with no grace for the job, so srun is only signalled when a
short command runs past its timeout or, as the last resort, when an aborted stream's srun is still
there :data:`ABORT_GRACE_S` later: then ``scancel`` of the step (found by its unique name) and
SIGKILL of srun.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import posixpath
import re
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from clusterrun.errors import ClusterrunError, CommandTimeout, ConnectError, TransportError
from clusterrun.inventory.hostlist import expand_hostlist
from clusterrun.transport.base import (
    DEFAULT_COMMAND_TIMEOUT,
    CommandResult,
    Stream,
    Transport,
    shell_command,
    shell_path,
)
from clusterrun.transport.local import LocalStream

#: How long an aborted stream's srun may stay after its stdin closed (the agent's stop grace and the
#: last logs fit well within) before its step is cancelled.
ABORT_GRACE_S = 60.0
#: Bound on each Slurm client command of our own (squeue, scancel, scontrol).
SLURM_COMMAND_TIMEOUT = 10.0
#: After a timed-out command's srun was told to cancel its step, how long before SIGKILL and scancel.
_STOP_WAIT_S = 5.0
#: Copies may take longer than a command: at least this, and a second per this many bytes.
_PUT_MIN_TIMEOUT = 60.0
_PUT_BYTES_PER_S = 5_000_000
# srun's report of a task that ended (the exit code tells it already): "srun: error: node0: task 0: Exited
# with exit code 3", "...: task 0: Killed". Left out of the stderr we give back.
_TASK_ENDED = re.compile(r"^srun: error: \S+: tasks? [0-9,\-]+: .*$")
# srun's own failures: it could not create the step or launch the task (anything it prints as an error
# or fatal line that is not about a task's end).
_SRUN_FAILED = re.compile(r"^srun: (?:error|fatal): (?!\S+: tasks? [0-9,\-]+: )(.*)$")
_CPUS_TERM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
# What srun tells the one task of a step about its tasks: rank 0 of 1 on every node. Frameworks that read them
# (Lightning's SLURMEnvironment, submitit) would take every training rank for that; torchrun's RANK, WORLD_SIZE
# and LOCAL_RANK are the truth. The job's own variables (SLURM_JOB_ID, SLURM_JOB_NODELIST, ...) are kept.
_STEP_TASK_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS",
                   "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS",
                   "SLURM_STEP_TASKS_PER_NODE", "SLURM_GTIDS", "SLURM_TASK_PID")


def allocation_cpus(environ: Mapping[str, str]) -> dict[str, int]:
    """``{node: CPUs of the allocation there}`` from ``SLURM_JOB_NODELIST`` and ``SLURM_JOB_CPUS_PER_NODE``
    (``"72(x2),36"``: 72 on the first two nodes, 36 on the third). Empty when either is missing or unreadable."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
    counts = environ.get("SLURM_JOB_CPUS_PER_NODE", "")
    if not nodelist or not counts:
        return {}
    per_node: list[int] = []
    for term in counts.split(","):
        match = _CPUS_TERM.match(term.strip())
        if match is None:
            return {}
        per_node += [int(match.group(1))] * int(match.group(2) or 1)
    try:
        names = expand_hostlist(nodelist, "SLURM_JOB_NODELIST")
    except ClusterrunError:
        return {}
    return dict(zip(names, per_node, strict=False)) if len(names) == len(per_node) else {}


def _task_noise_removed(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not _TASK_ENDED.match(line.rstrip("\n")))


def _srun_failure(stderr: str) -> str | None:
    """srun's own error (it could not start the step), or None when the step ran."""
    for line in stderr.splitlines():
        match = _SRUN_FAILED.match(line.strip())
        if match:
            return match.group(1).strip()
    return None


class SrunStream(LocalStream):
    """A started step: srun's stdout and stdin are the command's (read and written as a local process's)."""

    def __init__(self, proc: subprocess.Popen[bytes], cancel_step: Callable[[], None],
                 abort_grace: float = ABORT_GRACE_S) -> None:
        super().__init__(proc)
        self._cancel_step = cancel_step
        self._abort_grace = abort_grace
        self._aborted = False

    def abort(self) -> None:
        super().abort()  # stdin closed: the agent reads EOF and stops the job
        with self._lock:
            if self._aborted or self._proc.poll() is not None:
                return
            self._aborted = True
        # A daemon timer, not joined: a detached agent's step must outlive this process, which exits long
        # before the timer fires; a run that goes on here has its lost node's step cancelled.
        timer = threading.Timer(self._abort_grace, self._last_resort)
        timer.daemon = True
        timer.start()

    def _last_resort(self) -> None:
        if self._proc.poll() is None:
            self._cancel_step()
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()

    def stderr_text(self) -> str:
        return _task_noise_removed(bytes(self._stderr).decode("utf-8", errors="replace"))


class SrunTransport(Transport):
    """One Slurm node reached by srun steps. ``host`` is the node's Slurm name (``--nodelist``).

    ``environ``: the environment srun runs with and whose ``SLURM_JOB_ID`` names the allocation.
    ``abort_grace``: how long an aborted stream's step may stay before it is cancelled.
    Thread-safe: every command is its own srun process.
    """

    def __init__(self, node: str, host: str, environ: Mapping[str, str] | None = None, *,
                 abort_grace: float = ABORT_GRACE_S) -> None:
        self.node = node
        self.host = host
        self.abort_grace = abort_grace
        self._environ = dict(os.environ if environ is None else environ)
        self.job_id = self._environ.get("SLURM_JOB_ID") or self._environ.get("SLURM_JOBID") or None
        self._cpus = allocation_cpus(self._environ).get(host) if self.job_id else None
        self._address: str | None = None
        self._address_known = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------ srun

    def _tool(self, name: str) -> str:
        path = shutil.which(name, path=self._environ.get("PATH"))
        if path is None:
            raise ConnectError(self.node, f"`{name}` is not on this machine's PATH: the srun transport needs Slurm's "
                                          "client commands (run inside the allocation, on a node that has them), or "
                                          "use --transport ssh")
        return path

    def srun_argv(self, step_name: str, command: str) -> list[str]:
        """The srun command line that runs the shell ``command`` as a one-task step named ``step_name``."""
        argv = [self._tool("srun"), "--nodes=1", "--ntasks=1", f"--nodelist={self.host}",
                "--kill-on-bad-exit=1", f"--job-name={step_name}",
                # no "job queued"/"step created" chatter in the output we parse; errors still come
                "--quiet",
                # stdin to the task (the default for one task, said out loud: the agent lives on it)
                "--input=all",
                # the task starts in /, which exists everywhere; the command's own cd does the rest
                "--chdir=/"]
        if self.job_id:
            argv.append("--overlap")  # share the allocation with our other steps on the node
            if self._cpus:
                argv.append(f"--cpus-per-task={self._cpus}")
        return [*argv, "/bin/sh", "-c", command]

    def _command(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> str:
        # Without a cwd, start in the home directory, as an SSH command does.
        command = shell_command(argv, env, cwd) if cwd else f"cd 2>/dev/null; {shell_command(argv, env)}"
        return f"unset {' '.join(_STEP_TASK_VARS)}; {command}"

    def _popen(self, argv: list[str], stdin: int | IO[bytes]) -> subprocess.Popen[bytes]:
        try:
            # Its own session: a Ctrl-C at the terminal reaches the whole foreground process group, and srun
            # answers one by cancelling the step with no grace; clusterrun stops the job through the agent.
            return subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=self._environ, start_new_session=True)
        except OSError as exc:
            raise TransportError(self.node, f"cannot start srun: {exc.strerror or exc}") from exc

    def _step_name(self) -> str:
        return f"clusterrun-{self.node[:40]}-{secrets.token_hex(4)}"

    def cancel_step(self, step_name: str) -> None:
        """scancel the step (or one-node job) named ``step_name``, if Slurm still lists it. Never raises."""
        squeue = ["--noheader", "--steps", "--format=%i %j"]
        squeue.append(f"--jobs={self.job_id}" if self.job_id else f"--user={os.getuid()}")
        try:
            listed = subprocess.run([self._tool("squeue"), *squeue], capture_output=True, text=True,
                                    timeout=SLURM_COMMAND_TIMEOUT, env=self._environ, check=False).stdout
            steps = [line.split()[0] for line in listed.splitlines() if line.split()[1:2] == [step_name]]
            if steps:
                subprocess.run([self._tool("scancel"), *steps], capture_output=True, timeout=SLURM_COMMAND_TIMEOUT,
                               env=self._environ, check=False)
        except (OSError, subprocess.SubprocessError, ClusterrunError):
            pass  # the last resort: the allocation's end still takes the step down

    def _stop(self, proc: subprocess.Popen[bytes], step_name: str) -> None:
        """End a step that ran past its time: srun cancels it on SIGTERM; else scancel and SIGKILL."""
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.communicate(timeout=_STOP_WAIT_S)
            return
        except subprocess.TimeoutExpired:
            pass
        self.cancel_step(step_name)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=_STOP_WAIT_S)

    def _finish(self, proc: subprocess.Popen[bytes], step_name: str, shown: str, timeout: float,
                stdin: bytes | None) -> tuple[int, str, str]:
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            self._stop(proc, step_name)
            raise CommandTimeout(self.node, f"{shown} did not finish within {timeout:g}s (srun step on "
                                            f"{self.host}; cancelled)") from None
        stderr = err.decode(errors="replace")
        failure = _srun_failure(stderr) if proc.returncode != 0 else None
        if failure is not None:
            where = f"job {self.job_id}" if self.job_id else "a new job"
            raise ConnectError(self.node, f"srun could not run a step on {self.host} in {where}: {failure}; check "
                                          f"that {self.host} is a node of the allocation (scontrol show hostnames), "
                                          "or use --transport ssh")
        return proc.returncode, out.decode(errors="replace"), _task_noise_removed(stderr)

    # ------------------------------------------------------------ Transport

    def connect(self) -> None:
        """Check that srun is there (a step is started by each command, there is no connection to open)."""
        self._tool("srun")

    def peer_address(self) -> str | None:
        """The node's ``NodeAddr`` (the address Slurm reaches it at), when it is an IP address."""
        with self._lock:
            if not self._address_known:
                self._address_known = True
                self._address = self._node_addr()
            return self._address

    def _node_addr(self) -> str | None:
        try:
            out = subprocess.run([self._tool("scontrol"), "show", "node", "--oneliner", self.host],
                                 capture_output=True, text=True, timeout=SLURM_COMMAND_TIMEOUT, env=self._environ,
                                 check=False).stdout
        except (OSError, subprocess.SubprocessError, ClusterrunError):
            return None
        match = re.search(r"\bNodeAddr=(\S+)", out)
        if match is None:
            return None
        try:
            return str(ipaddress.ip_address(match.group(1)))
        except ValueError:
            return None  # a name: resolving it here could hang on DNS, and is not needed

    def run(self, argv: Sequence[str], *, timeout: float = DEFAULT_COMMAND_TIMEOUT,
            env: Mapping[str, str] | None = None, cwd: str | None = None,
            stdin: bytes | None = None) -> CommandResult:
        command = self._command(argv, env, cwd)
        shown = f"`{' '.join(argv)[:200]}`"
        name = self._step_name()
        started = time.monotonic()
        proc = self._popen(self.srun_argv(name, command), subprocess.PIPE)
        code, out, err = self._finish(proc, name, shown, timeout, stdin or b"")
        return CommandResult(self.node, command, code, out, err, time.monotonic() - started)

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None) -> Stream:
        name = self._step_name()
        proc = self._popen(self.srun_argv(name, self._command(argv, env, cwd)), subprocess.PIPE)
        return SrunStream(proc, lambda: self.cancel_step(name), self.abort_grace)

    def put(self, local: Path, remote: str) -> None:
        """Copy ``local`` through a step's stdin: written beside, then renamed (a node sharing the path never
        reads half a file)."""
        partial = f"{remote}.part-{os.getpid()}-{threading.get_ident()}"
        parent = posixpath.dirname(remote) or "."
        try:
            mode = os.stat(local).st_mode & 0o777
            size = os.path.getsize(local)
            handle = open(local, "rb")  # noqa: SIM115 - closed below, after srun has read it
        except OSError as exc:
            raise TransportError(self.node, f"cannot copy {local} to {remote}: {exc.strerror or exc}") from exc
        script = (f"mkdir -p {shell_path(parent)} && cat > {shell_path(partial)} && chmod {mode:o} "
                  f"{shell_path(partial)} && mv -f {shell_path(partial)} {shell_path(remote)}")
        name = self._step_name()
        timeout = max(_PUT_MIN_TIMEOUT, size / _PUT_BYTES_PER_S)
        with handle:
            proc = self._popen(self.srun_argv(name, f"cd 2>/dev/null; {script}"), handle)
            code, _out, err = self._finish(proc, name, f"the copy of {local}", timeout, None)
        if code != 0:
            raise TransportError(self.node, f"cannot copy {local} to {remote}: "
                                            f"{err.strip().splitlines()[-1] if err.strip() else f'exit {code}'}")
