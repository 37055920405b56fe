"""A real Slurm on a simulated cluster: one munged and one slurmctld here, one slurmd inside every node.

Layout (everything under the bed's own temp dir, which every node sees: the nodes share this machine's
filesystem)::

    root namespace                              node i (the SimCluster's namespace, hostname node<i>)
    munged   --socket WORKDIR/munge.socket       slurmd -D -N node<i> (its own mount namespace with the
    slurmctld -D, SlurmctldPort: a free port      host's cgroup mounts rebuilt: slurmd needs them even
    srun/salloc/squeue with SLURM_CONF set        with proctrack/linuxproc)

The controller is named after this machine's host name (slurmctld refuses any other) and reached at the
management bridge's address; each node is ``NodeName=node<i> NodeAddr=<its management address>``.
``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none``: no cgroup confinement, no accounting.

:meth:`SlurmBed.start` waits (every wait with a deadline) until every node is idle and cleans up after
itself when it fails; :meth:`SlurmBed.stop` ends the daemons by PID and removes the temp dir. A bed whose
test process died before stop() (SIGKILL, a CI timeout) is swept by the next start: its munged and slurmctld
(found by the PID files in its dir, checked against their command lines) are killed and the dir removed; its
slurmds went with its cluster's namespaces.
:meth:`SlurmBed.reset` puts a shared bed back between tests: jobs cancelled, node processes other than
slurmd and the sshd listeners killed, sshds started again.

The client commands need :meth:`SlurmBed.env` (``SLURM_CONF``, and no ``SLURM_*`` of an outer job).
Not thread-safe: drive one bed from one thread.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from simcluster import SimCluster, _in_netns, _signal_and_wait, _start_time

__all__ = ["SlurmBed", "slurm_missing"]

# tool -> Debian package that provides it (for the skip reason)
_TOOLS = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "srun": "slurm-client",
    "salloc": "slurm-client",
    "sbatch": "slurm-client",
    "squeue": "slurm-client",
    "scancel": "slurm-client",
    "scontrol": "slurm-client",
    "sinfo": "slurm-client",
}
_SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_START_TIMEOUT = 30.0  # munged, slurmctld and every slurmd up and the nodes idle
_CLIENT_TIMEOUT = 15.0  # one squeue/scontrol/scancel
_DAEMON_EXIT_WAIT = 3.0  # after SIGTERM, before SIGKILL


def _which(tool: str) -> str | None:
    return shutil.which(tool, path=os.environ.get("PATH", "") + ":" + _SEARCH_PATH)


def slurm_missing() -> list[str]:
    """What this machine lacks to run the Slurm test bed (on top of the simulated cluster's needs)."""
    return [f"no `{tool}` (Debian package {package}; run .ci/install-cluster-deps)"
            for tool, package in _TOOLS.items() if _which(tool) is None]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _sweep_stale_beds() -> list[str]:
    """Kill the root-namespace daemons of beds whose owner process is gone and remove their dirs; return the dirs."""
    swept = []
    for workdir in Path(tempfile.gettempdir()).glob("slurmbed-*"):
        try:
            pid, started = (workdir / "owner").read_text().split()
        except (OSError, ValueError):
            continue  # being written, or not a bed
        if pid.isdigit() and _start_time(int(pid)) == started:
            continue  # owner alive: its stop() or atexit cleans up
        for pid_file in ("munged.pid", "slurmctld.pid"):
            with contextlib.suppress(OSError, ValueError):
                daemon = int((workdir / pid_file).read_text().split()[0])
                if str(workdir).encode() in Path(f"/proc/{daemon}/cmdline").read_bytes():
                    os.kill(daemon, signal.SIGKILL)
        shutil.rmtree(workdir, ignore_errors=True)
        swept.append(str(workdir))
    return swept


def _cgroup_script() -> list[str]:
    """Shell steps that rebuild this machine's cgroup mounts under /sys/fs/cgroup.

    ``ip netns exec`` mounts a fresh /sys without them, and slurmd refuses to start without cgroups
    ("No filesystem mounted on /sys/fs/cgroup"). Mounting a hierarchy again with the options it has here
    attaches the same hierarchy, whichever layout (v1, hybrid, v2) the machine uses.
    """
    steps = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _dev, mountpoint, fstype, options = line.split()[:4]
        if mountpoint != "/sys/fs/cgroup" and not mountpoint.startswith("/sys/fs/cgroup/"):
            continue
        if fstype not in ("tmpfs", "cgroup", "cgroup2"):
            continue
        target = shlex.quote(mountpoint)
        steps.append(f"mkdir -p {target} && mount -t {fstype} -o {shlex.quote(options)} {fstype} {target}")
    return steps


class SlurmBed:
    """Slurm on the nodes of ``cluster`` (started, not shared with tests that reset it: that kills slurmd)."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.workdir = Path()
        self.conf = Path()
        self.cluster_name = f"cr{secrets.token_hex(3)}"
        self._tools: dict[str, str] = {}
        self._munged: subprocess.Popen[bytes] | None = None
        self._slurmctld: subprocess.Popen[bytes] | None = None
        self._slurmd: dict[str, subprocess.Popen[bytes]] = {}
        self._started = False
        self._stopped = False

    # ------------------------------------------------------------------------------------ lifecycle

    def __enter__(self) -> SlurmBed:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def node_names(self) -> list[str]:
        return [node.name for node in self.cluster.nodes]

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment for a Slurm client: ``SLURM_CONF`` set, no outer job's ``SLURM_*``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SALLOC_", "SBATCH_", "SRUN_"))}
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra or {})
        return env

    def start(self) -> SlurmBed:
        """Start munged, slurmctld and a slurmd in every node; return once every node is idle.

        Raises RuntimeError naming the daemon that did not come up (with its log's tail) and stops
        whatever it had started before raising.
        """
        if self._started:
            raise RuntimeError("SlurmBed.start() called twice; create a new SlurmBed")
        problems = slurm_missing()
        if problems:
            raise RuntimeError("slurm test bed: " + "; ".join(problems))
        self._tools = {tool: path for tool in _TOOLS if (path := _which(tool))}
        self._started = True
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            with contextlib.suppress(Exception):
                self.stop()
            raise
        return self

    def _start(self) -> None:
        _sweep_stale_beds()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"slurmbed-{self.cluster.prefix}-"))
        self.workdir.chmod(0o755)
        (self.workdir / "owner").write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
        for sub in ("state", "spool", "log"):
            (self.workdir / sub).mkdir()
        key = self.workdir / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        socket_path = self.workdir / "munge.socket"
        log = self.workdir / "log"
        self._munged = self._spawn([
            self._tools["munged"], "--foreground", "--force", f"--key-file={key}", f"--socket={socket_path}",
            f"--pid-file={self.workdir / 'munged.pid'}", f"--log-file={log / 'munged.log'}",
            f"--seed-file={self.workdir / 'munged.seed'}", "--num-threads=4",
        ], log / "munged.out")
        self._wait("munged", lambda: socket_path.exists(), self._munged, log / "munged.log", 10.0)

        self.conf = self.workdir / "slurm.conf"
        self.conf.write_text(self._slurm_conf(socket_path))
        # Read from beside slurm.conf. On a cgroup v2 machine slurmd would otherwise ask systemd (over D-Bus)
        # for a scope of its own; here it runs outside systemd.
        (self.workdir / "cgroup.conf").write_text("CgroupPlugin=autodetect\nIgnoreSystemd=yes\n")
        self._slurmctld = self._spawn([self._tools["slurmctld"], "-D", "-i", "-f", str(self.conf)],
                                      log / "slurmctld.out")
        self._wait("slurmctld", self._controller_up, self._slurmctld, log / "slurmctld.log", _START_TIMEOUT)

        mounts = _cgroup_script()
        for node in self.cluster.nodes:
            script = " && ".join([*mounts, 'exec "$@"'])
            argv = ["sh", "-c", script, "slurmd", self._tools["slurmd"], "-D", "-N", node.name, "-f", str(self.conf)]
            with open(log / f"slurmd-{node.name}.out", "ab") as out:
                # Own session: a Ctrl-C aimed at the test run must not reach the daemons; stop() ends them.
                self._slurmd[node.name] = self.cluster.ns_popen(node, argv, stdin=subprocess.DEVNULL, stdout=out,
                                                                stderr=out, start_new_session=True)
        self._wait_idle(_START_TIMEOUT)

    def _slurm_conf(self, munge_socket: Path) -> str:
        bridge = str(next(ipaddress.ip_network(self.cluster.mgmt_subnet).hosts()))
        cpus = 2
        lines = [
            f"ClusterName={self.cluster_name}",
            # slurmctld only starts where the name is its own host name; the nodes reach it on the bridge.
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({bridge})",
            f"SlurmctldPort={_free_port()}",
            "SlurmdPort=6818",  # each slurmd listens in its own network namespace
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={munge_socket}",
            f"StateSaveLocation={self.workdir / 'state'}",
            f"SlurmdSpoolDir={self.workdir / 'spool'}/%n",
            f"SlurmctldPidFile={self.workdir / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.workdir / 'spool'}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.workdir / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.workdir / 'log'}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "PropagateResourceLimits=NONE",
            # Jobs start as soon as they are submitted (the backfill scheduler waits for its interval).
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            # The configured CPUs, not what slurmd counts on this machine: a node never drains for it.
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "KillWait=2",
            "MessageTimeout=10",
            "InactiveLimit=0",
            "MinJobAge=10",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        for node in self.cluster.nodes:
            lines.append(f"NodeName={node.name} NodeAddr={node.mgmt_ip} CPUs={cpus} RealMemory=1000 State=UNKNOWN")
        lines.append(f"PartitionName=bed Nodes={','.join(self.node_names)} Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _spawn(self, argv: list[str], out: Path) -> subprocess.Popen[bytes]:
        with open(out, "ab") as fh:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh, start_new_session=True,
                                    env=self.env())

    def _wait(self, what: str, ready: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for _ in range(int(timeout / 0.05) + 2):
            if proc.poll() is not None:
                raise RuntimeError(f"slurm test bed: {what} exited with {proc.returncode} during start\n"
                                   f"{self._tail(log)}")
            if ready():
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)  # poll step of a deadline-bounded wait
        raise RuntimeError(f"slurm test bed: {what} not up after {timeout:g}s\n{self._tail(log)}")

    def _controller_up(self) -> bool:
        return self.client(["scontrol", "ping"], timeout=5, check=False).stdout.count("is UP") > 0

    def node_states(self) -> dict[str, str]:
        """``{node: state}`` as sinfo prints it (``idle``, ``alloc``, ``down*``, ...)."""
        out = self.client(["sinfo", "--noheader", "--Node", "--format=%N %t"], check=False).stdout
        return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        for _ in range(int(timeout / 0.1) + 2):
            for name, proc in self._slurmd.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"slurm test bed: {name}: slurmd exited with {proc.returncode} during start\n"
                                       f"{self._tail(self.workdir / 'log' / f'slurmd-{name}.log')}\n"
                                       f"{self._tail(self.workdir / 'log' / f'slurmd-{name}.out')}")
            states = self.node_states()
            if all(states.get(name) == "idle" for name in self.node_names):
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)  # poll step of a deadline-bounded wait
        late = [f"{n} ({states.get(n, 'unknown')})" for n in self.node_names if states.get(n) != "idle"]
        first = late[0].split()[0] if late else self.node_names[0]
        raise RuntimeError(f"slurm test bed: nodes not idle after {timeout:g}s: {', '.join(late)}\n"
                           f"{self._tail(self.workdir / 'log' / f'slurmd-{first}.log')}\n"
                           f"{self._tail(self.workdir / 'log' / 'slurmctld.log')}")

    @staticmethod
    def _tail(path: Path, lines: int = 10) -> str:
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"({path.name}: no log)"

    def stop(self) -> None:
        """Cancel every job, end the daemons (by PID: SIGTERM, then SIGKILL), remove the temp dir. Idempotent."""
        if self._stopped or not self._started:
            return
        if self._slurmctld is not None and self._slurmctld.poll() is None:
            with contextlib.suppress(Exception):
                self.cancel_all(timeout=5.0)
        for proc in [*self._slurmd.values(), self._slurmctld, self._munged]:
            if proc is not None:
                _end(proc)
        if self.workdir != Path() and self.workdir.exists():
            shutil.rmtree(self.workdir, ignore_errors=True)
        self._stopped = True
        atexit.unregister(self.stop)

    # ------------------------------------------------------------------------------------ use

    def client(self, argv: Sequence[str], *, timeout: float = _CLIENT_TIMEOUT, check: bool = True,
               env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (``argv[0]`` a tool name) against the bed; raise on failure when ``check``."""
        tool = self._tools.get(argv[0], argv[0])
        proc = subprocess.run([tool, *argv[1:]], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, env=self.env(env), check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def allocate(self, nodes: int, *, timeout: float = 20.0) -> dict[str, str]:
        """``salloc --no-shell -N nodes``: the environment a command run inside that allocation would see.

        Returns ``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``, ``SLURM_JOB_NUM_NODES`` and
        ``SLURM_JOB_CPUS_PER_NODE``; cancel with :meth:`cancel`.
        """
        done = self.client(["salloc", "--no-shell", f"--nodes={nodes}", f"--immediate={int(timeout)}",
                            "--job-name=bed-alloc"], timeout=timeout + 5)
        match = re.search(r"Granted job allocation (\d+)", done.stderr)
        if match is None:
            raise RuntimeError(f"salloc printed no job id: {done.stderr.strip()}")
        job = match.group(1)
        fields = self.client(["squeue", "--noheader", f"--jobs={job}", "--format=%N|%D"]).stdout.strip().split("|")
        detail = self.client(["scontrol", "show", "job", job, "--oneliner"]).stdout
        cpus = re.search(r"NumCPUs=(\d+)", detail)
        per_node = str(int(cpus.group(1)) // nodes) if cpus else "1"
        return {"SLURM_JOB_ID": job, "SLURM_JOBID": job, "SLURM_JOB_NODELIST": fields[0],
                "SLURM_JOB_NUM_NODES": fields[1], "SLURM_JOB_CPUS_PER_NODE": f"{per_node}(x{nodes})"}

    def cancel(self, job: str) -> None:
        self.client(["scancel", job], check=False)

    def jobs(self) -> list[str]:
        """Ids of the jobs the controller still lists (pending, running or completing)."""
        out = self.client(["squeue", "--noheader", "--format=%i"], check=False).stdout
        return out.split()

    def cancel_all(self, timeout: float = 15.0) -> list[str]:
        """Cancel every job and wait (up to ``timeout``) until none is listed; return those still listed."""
        jobs = self.jobs()
        if jobs:
            self.client(["scancel", *jobs], check=False)
        deadline = time.monotonic() + timeout
        for _ in range(int(timeout / 0.1) + 2):
            if not jobs or time.monotonic() > deadline:
                break
            time.sleep(0.1)  # poll step of a deadline-bounded wait
            jobs = self.jobs()
        return jobs

    def daemon_pids(self) -> set[int]:
        """The PIDs of the node's slurmds (the ``ip netns exec`` chain execs into slurmd)."""
        return {proc.pid for proc in self._slurmd.values() if proc.poll() is None}

    def reset(self) -> list[str]:
        """Put the bed back as started: jobs cancelled, every node process but slurmd and the sshd listeners
        killed (SIGTERM, then SIGKILL), stopped sshds started. Returns ``"node: pid cmdline"`` per process killed."""
        self.cancel_all()
        keep = self.daemon_pids()
        killed = []
        inodes = {os.stat(f"/run/netns/{node.netns}").st_ino for node in self.cluster.nodes}
        for node in self.cluster.nodes:
            killed += [f"{node.name}: {pid} {cmd}" for pid, cmd in self.cluster.processes(node) if pid not in keep]
        for sig, grace in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 2.0)):
            pids = [pid for node in self.cluster.nodes for pid, _ in self.cluster.processes(node) if pid not in keep]
            if not pids:
                break
            _signal_and_wait(pids, sig, grace, still_ours=lambda pid: _in_netns(pid, inodes))
        for node in self.cluster.nodes:
            self.cluster.start_sshd(node)
        return killed


def _end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(timeout=_DAEMON_EXIT_WAIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_DAEMON_EXIT_WAIT)
