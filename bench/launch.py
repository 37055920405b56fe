"""Launch cost of `clusterrun up` and `clusterrun exec` on the simulated cluster, against pdsh doing the same.

    sudo python bench/launch.py [--nodes 1,8,32,64,128] [--repeat 1] [--skip-extra]

One SimCluster of max(--nodes) nodes is started once (needs root, see tests/simcluster.py). For each N:

  (a) up:    `python -m clusterrun up --nproc-per-node 1 <inventory of the first N nodes> report.py`
             (default preflight: the ready check and the path check), against
             pdsh:  `pdsh -R ssh -f 1024 -w node0,...` running the same torchrun command on every node
             (`python -m torch.distributed.run --nnodes N --node-rank <from the host name> --master-addr
             <node0's data address> ... report.py`), after writing a time stamp.
  (b) exec:  `clusterrun exec INV -- true` against `pdsh -w ... true`.

Measures, per command, from its start:
  torchrun  until torchrun's process was running on every node (clusterrun: each node's torchrun start in
            status.json: the ready check's, when the agent warmed it there, else go's `started`; pdsh: the time stamp
            written just before `exec torchrun`); either way the moment torch's import began. Nodes share this
            machine's clock. Also for clusterrun: go, until every node had been told to start the job;
  ranks     until every worker ran its first line (adds torchrun's torch import, the rendezvous and the worker);
  total     until the command ended;
  cpu       the orchestrator's own CPU (user + system, from wait4: for pdsh, with its ssh children);
  rss       its peak resident memory (ru_maxrss); threads: the most it had at once (/proc, every 20 ms).
From those: clusterrun's CPU per added node, (cpu(N) - cpu(1)) / (N - 1), and the ratio of the torchrun times.
clusterrun's CPU is also split (own CPU from /proc, sampled every 20 ms): start, until torchrun ran on every
node; running, per second from then until every rank ran (heartbeats and CPU reports; the nodes are importing
torch meanwhile, which on this machine's 2 cores takes longer the more nodes there are); end, after that. Per
added node (running: per node), start + end + 10 s x running estimates a short run on a real cluster, where a run does not grow
longer with its node count.

  agents: an 8-node (or smaller) job that sleeps: each node agent's CPU per second (its own and its ended
          children's), over 20 s, with the node's sampling on (every second, the default) and off
          (--sample-every 0): the difference is what sampling costs.
  (c) teardown: a 2-node clusterrun job where rank 1 exits 1 after 2 s while rank 0 sleeps: time from that exit
      (a timestamp the worker writes just before sys.exit) to the last process of the run gone.
  (d) orphans: SIGKILL of the orchestrator (clusterrun vs pdsh, `sleep 60` on 2 nodes): processes still alive on
      the nodes 5 s later. Everything left is then killed by PID.

Results are printed and saved to bench/results/launch-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from benchlib import node_agents, save_results  # noqa: E402
from simcluster import SimCluster  # noqa: E402
from simjobs import clusterrun_env, write_inventory  # noqa: E402

POLL = 0.01
START_TIMEOUT = 120.0
RUN_TIMEOUT = 600.0
#: The length of the short run whose CPU per added node the report estimates (a trivial job on a real cluster).
SHORT_RUN_S = 10.0
TICKS = os.sysconf("SC_CLK_TCK")

REPORT_PY = """\
import os, sys
with open(sys.argv[1], "a") as f:
    f.write(f"{os.uname().nodename} {os.environ.get('RANK')}\\n")
print("rank", os.environ.get("RANK"), "runs", flush=True)  # the timeline's first_line
"""

FAIL_PY = """\
import os, sys, time
if os.environ["RANK"] == "1":
    time.sleep(2)
    with open(sys.argv[1], "w") as f:
        f.write(repr(time.time()))
    sys.exit(1)
time.sleep(120)
"""

SLEEP_PY = """\
import os, sys, time
with open(sys.argv[1], "a") as f:
    f.write(f"{os.environ.get('RANK')}\\n")
time.sleep(60)
"""


def lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def wait_lines(path: Path, count: int, start: float, procs: list[subprocess.Popen], timeout: float) -> float | None:
    """Seconds from ``start`` until ``path`` has ``count`` lines; None on timeout or if every process ended first."""
    deadline = start + timeout
    while time.perf_counter() < deadline:
        if lines(path) >= count:
            return time.perf_counter() - start
        if all(p.poll() is not None for p in procs) and lines(path) < count:
            # one last look: the file may have been completed just before the exit
            return time.perf_counter() - start if lines(path) >= count else None
        time.sleep(POLL)
    return None


def finish(procs: list[subprocess.Popen], timeout: float = RUN_TIMEOUT) -> list[int | None]:
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            kill_group(p)
            codes.append(None)
    return codes


def kill_group(p: subprocess.Popen) -> None:
    """Kill the session this benchmark started the process in (its own children only)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=10)


def local_session_left(sid: int) -> list[str]:
    """Processes on this machine still in session ``sid`` (the orchestrator's local children)."""
    out = subprocess.run(["ps", "-o", "pid=,args=", "-s", str(sid)], capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def threads_of(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def own_cpu(pid: int, children: bool = False) -> float | None:
    """A live process's own CPU seconds so far (user + system), from /proc; ``children``: with those of its
    children that ended and were waited for (an agent's nvidia-smi rounds)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(f) for f in fields[11:15 if children else 13]) / TICKS
    except (OSError, ValueError, IndexError):
        return None


def cpu_at(samples: list[tuple[float, float]], when: float | None) -> float | None:
    """The CPU seconds of the last sample taken at or before ``when`` seconds from the start."""
    if when is None:
        return None
    before = [cpu for t, cpu in samples if t <= when]
    return before[-1] if before else None


def sshd_peers(listeners: list[int]) -> set[tuple[int, str]]:
    """The connections to port 22 the nodes' sshd listeners see (their namespaces' /proc/<pid>/net/tcp*):
    (listener, remote end), SYN received or established."""
    out = set()
    for pid in listeners:
        for table in ("tcp", "tcp6"):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                    fields = line.split()
                    if fields[1].endswith(":0016") and fields[3] in ("01", "03"):
                        out.add((pid, fields[2]))
    return out


class Arrival(threading.Thread):
    """When the first new connection reaches any node's sshd (seconds from ``t0``, polled every 2 ms): the
    command's first connect seen from outside it, as the node sees it."""

    def __init__(self, listeners: list[int]) -> None:
        super().__init__(daemon=True)
        self.listeners, self.before = listeners, sshd_peers(listeners)
        self.t0, self.seen_s, self.stop = 0.0, None, threading.Event()

    def begin(self) -> None:
        self.t0 = time.perf_counter()
        self.start()

    def run(self) -> None:
        deadline = self.t0 + 30
        while not self.stop.is_set() and time.perf_counter() < deadline:
            if sshd_peers(self.listeners) - self.before:
                self.seen_s = time.perf_counter() - self.t0
                return
            time.sleep(0.002)


def watch(p: subprocess.Popen, started: Path | None, n: int, t0: float, timeout: float = RUN_TIMEOUT) -> dict:
    """Follow ``p`` to its end: when ``started`` reached ``n`` lines, its most threads, its own CPU over time
    (sampled with the threads, every 20 ms), then its own CPU and peak RSS from wait4 (ended after ``timeout``
    seconds at most: then its session is killed)."""
    ranks_s, most = None, 0
    samples: list[tuple[float, float]] = []
    deadline = t0 + timeout
    status, usage = None, None
    while time.perf_counter() < deadline:
        most = max(most, threads_of(p.pid))
        cpu = own_cpu(p.pid)
        if cpu is not None:
            samples.append((time.perf_counter() - t0, cpu))
        if ranks_s is None and started is not None and lines(started) >= n:
            ranks_s = time.perf_counter() - t0
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.02)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status) if status is not None else None
    if ranks_s is None and started is not None and lines(started) >= n:
        ranks_s = time.perf_counter() - t0
    return {"ranks_s": ranks_s, "total_s": time.perf_counter() - t0, "rc": p.returncode, "threads": most,
            "cpu_s": usage.ru_utime + usage.ru_stime if usage else None,
            "rss_mib": usage.ru_maxrss / 1024 if usage else None, "cpu_samples": samples}


#: The launch timeline's phases (clusterrun.runs.timeline.PHASES), as status.json names them.
PHASES = ("connect", "agent", "ready", "staging", "pathcheck", "go", "torchrun", "first_line")


def torchrun_began(node: dict) -> float:
    """When a node's torchrun process began (and with it its torch import): at the ready check when it was
    warmed there (``timeline.torchrun.since``), else when the agent started it at go (``launched``)."""
    since = (node.get("timeline") or {}).get("torchrun", {}).get("since")
    return since if isinstance(since, (int, float)) else node["launched"]


def timeline_summary(status: dict, t0_wall: float) -> dict:
    """From a run's status.json: per phase, seconds from the command's start until the first node began it and
    until the last node ended it, and the median and slowest node's time in it."""
    out: dict = {}
    nodes = [n.get("timeline") or {} for n in status.get("nodes", {}).values()]
    for phase in PHASES:
        spans = [t[phase] for t in nodes if isinstance(t.get(phase), dict)]
        starts = [s["start"] for s in spans if s.get("start") is not None]
        ends = [s["end"] for s in spans if s.get("end") is not None]
        took = [s["end"] - s["start"] for s in spans if s.get("start") is not None and s.get("end") is not None]
        if starts and ends:
            out[phase] = {"first_start_s": min(starts) - t0_wall, "last_end_s": max(ends) - t0_wall,
                          "median_s": statistics.median(took), "max_s": max(took)}
    return out


def popen(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


class Bench:
    def __init__(self, cluster: SimCluster, work: Path) -> None:
        self.cluster = cluster
        self.work = work
        # As after `pip install`: clusterrun's modules load from their compiled .pyc files.
        self.env = {k: v for k, v in clusterrun_env().items() if k != "PYTHONDONTWRITEBYTECODE"}
        self.counter = 0
        self.inventories: dict[int, Path] = {}
        for name, text in (("report.py", REPORT_PY), ("fail.py", FAIL_PY), ("sleeper.py", SLEEP_PY)):
            (work / name).write_text(text)

    def fresh(self, tag: str) -> tuple[Path, Path]:
        """A new started-file path and a new, empty runs dir."""
        self.counter += 1
        runs = self.work / f"runs-{tag}-{self.counter}"
        runs.mkdir()
        return self.work / f"started-{tag}-{self.counter}.txt", runs

    def inventory(self, n: int) -> Path:
        if n not in self.inventories:
            self.inventories[n] = write_inventory(self.cluster, self.work / f"inv{n}.yaml", n, nproc=1)
        return self.inventories[n]

    def clusterrun_argv(self, n: int, script: str, runs: Path, *args: str, flags: tuple[str, ...] = ()) -> list[str]:
        return [sys.executable, "-m", "clusterrun", "up", "--nproc-per-node", "1", "--runs-dir", str(runs), "-q",
                *flags, str(self.inventory(n)), str(self.work / script), *args]

    def hosts(self, n: int) -> list[str]:
        return [node.name for node in self.cluster.nodes[:n]]

    def pdsh_env(self) -> dict[str, str]:
        return {**os.environ, "PDSH_SSH_ARGS_APPEND": f"-F {self.cluster.ssh_config}"}

    # ------------------------------------------------------------------------------ launch latency

    def listeners(self, n: int) -> list[int]:
        return [pid for node in self.cluster.nodes[:n] if (pid := self.cluster._listener_pid(node))]

    def run_clusterrun(self, n: int) -> dict:
        started, runs = self.fresh(f"cr{n}")
        arrival = Arrival(self.listeners(n))
        t0, t0_wall = time.perf_counter(), time.time()
        arrival.begin()
        p = popen(self.clusterrun_argv(n, "report.py", runs, str(started)), self.work, self.env)
        got = watch(p, started, n, t0)
        arrival.stop.set()
        got["ssh_seen_s"] = arrival.seen_s
        # When every node agent had started its torchrun (nodes share this machine's clock).
        with contextlib.suppress(OSError, ValueError, StopIteration, TypeError, KeyError):
            status = json.loads(next(d for d in runs.iterdir() if d.is_dir()).joinpath("status.json").read_text())
            got["status"] = {k: status.get(k) for k in ("state", "problems", "first_failure")}
            # torchrun's process runs from its start: at go, or at the ready check when it was warmed there (its
            # torch import began then, as pdsh's begins at its time stamp); go_s: when every node had its go.
            got["torchrun_s"] = max(torchrun_began(node) for node in status["nodes"].values()) - t0_wall
            got["go_s"] = max(node["launched"] for node in status["nodes"].values()) - t0_wall
            got["warm"] = sum(bool((node.get("timeline") or {}).get("torchrun", {}).get("warm"))
                              for node in status["nodes"].values())
            got["timeline"] = timeline_summary(status, t0_wall)
        # Its CPU until torchrun ran everywhere (the start), and per second from then until every rank ran (the
        # run's steady cost: heartbeats, CPU reports; here the nodes are importing torch, 2 cores for all).
        samples = got.pop("cpu_samples")
        start, ranks = cpu_at(samples, got.get("torchrun_s")), cpu_at(samples, got.get("ranks_s"))
        got["cpu_start_s"] = start
        if start is not None and ranks is not None and got["ranks_s"] - got["torchrun_s"] > 1.0:
            got["cpu_running_per_s"] = (ranks - start) / (got["ranks_s"] - got["torchrun_s"])
            got["cpu_end_s"] = got["cpu_s"] - ranks if got["cpu_s"] is not None else None
        return got

    def run_pdsh(self, n: int) -> dict:
        started, _ = self.fresh(f"pdsh{n}")
        stamps = started.with_suffix(".stamps")
        self.counter += 1
        torchrun = shlex.join([sys.executable, "-m", "torch.distributed.run", "--nnodes", str(n), "--nproc-per-node",
                               "1", "--master-addr", self.cluster.nodes[0].data_ip, "--master-port",
                               str(29800 + self.counter % 100)])
        command = (f'r=$(hostname); r=${{r#node}}; printf "%s\\n" "$(date +%s.%N)" >> {stamps}; '
                   f"exec {torchrun} --node-rank $r {self.work / 'report.py'} {started}")
        arrival = Arrival(self.listeners(n))
        t0, t0_wall = time.perf_counter(), time.time()
        arrival.begin()
        p = popen(["pdsh", "-R", "ssh", "-f", "1024", "-w", ",".join(self.hosts(n)), command], self.work,
                  self.pdsh_env())
        got = watch(p, started, n, t0)
        arrival.stop.set()
        got["ssh_seen_s"] = arrival.seen_s
        got.pop("cpu_samples")
        with contextlib.suppress(OSError, ValueError):
            times = [float(line) for line in stamps.read_text().split()]
            if len(times) == n:
                got["torchrun_s"] = max(times) - t0_wall
        return got

    def run_exec(self, n: int) -> dict:
        t0 = time.perf_counter()
        p = popen([sys.executable, "-m", "clusterrun", "exec", str(self.inventory(n)), "--", "true"], self.work,
                  self.env)
        got = watch(p, None, n, t0)
        got.pop("cpu_samples")
        return got

    def run_pdsh_exec(self, n: int) -> dict:
        t0 = time.perf_counter()
        p = popen(["pdsh", "-R", "ssh", "-f", "1024", "-w", ",".join(self.hosts(n)), "true"], self.work,
                  self.pdsh_env())
        got = watch(p, None, n, t0)
        got.pop("cpu_samples")
        return got

    # ------------------------------------------------------------------------------------ teardown

    def run_id(self, runs: Path, timeout: float = 60.0) -> str | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dirs = [d for d in runs.iterdir() if d.is_dir()]
            if len(dirs) == 1:
                return dirs[0].name
            time.sleep(0.05)
        return None

    def teardown(self) -> dict:
        stamp, runs = self.fresh("teardown")
        t0 = time.perf_counter()
        p = popen(self.clusterrun_argv(2, "fail.py", runs, str(stamp)), self.work, self.env)
        try:
            rid = self.run_id(runs)
            if rid is None:
                return {"error": "no run directory"}
            deadline = time.monotonic() + 90
            while not stamp.exists() and time.monotonic() < deadline:
                time.sleep(POLL)
            gone_at = None
            while time.monotonic() < deadline:
                left = self.cluster.job_processes(rid)
                if not left and stamp.exists() and stamp.read_text().strip():
                    gone_at = time.time()
                    break
                time.sleep(POLL)
            code = finish([p], timeout=60)[0]
            exit_at = float(stamp.read_text()) if stamp.exists() and stamp.read_text().strip() else None
            return {
                "run_id": rid,
                "teardown_s": (gone_at - exit_at) if gone_at and exit_at else None,
                "orchestrator_total_s": time.perf_counter() - t0,
                "rc": code,
                "left": self.cluster.job_processes(rid),
            }
        finally:
            if p.poll() is None:
                kill_group(p)

    # ------------------------------------------------------------------------------------- orphans

    def reap(self, marker: str) -> list[int]:
        """Kill every node process carrying ``marker`` by PID; returns the PIDs killed."""
        killed = []
        for procs in self.cluster.job_processes(marker).values():
            for pid, _ in procs:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
        self.cluster.wait_no_processes(marker, 10)
        return killed

    def agent_cpu(self, n: int, seconds: float = 20.0) -> dict:
        """The node agents' CPU while a job sleeps, with the node's sampling on (the default) and off."""
        on, off = self._agent_cpu(n, seconds), self._agent_cpu(n, seconds, ("--sample-every", "0"))
        if "error" in on or "error" in off:
            return on if "error" in on else off
        return {**on, "sampling_off_ms_per_s_per_agent": off["cpu_ms_per_s_per_agent"],
                "sampling_ms_per_s_per_agent": on["cpu_ms_per_s_per_agent"] - off["cpu_ms_per_s_per_agent"]}

    def _agent_cpu(self, n: int, seconds: float, flags: tuple[str, ...] = ()) -> dict:
        """The node agents' CPU (their own and their ended children's) while a job sleeps: ``n`` nodes, sampled
        ``seconds`` apart once every rank runs (each agent is found on its node by its command line,
        ``... prepare``)."""
        started, runs = self.fresh(f"agents{n}")
        p = popen(self.clusterrun_argv(n, "sleeper.py", runs, str(started), flags=flags), self.work, self.env)
        try:
            if wait_lines(started, n, time.perf_counter(), [p], START_TIMEOUT) is None:
                return {"error": "the job did not start"}
            agents = node_agents(self.cluster, self.hosts(n))
            before = {pid: own_cpu(pid, children=True) for pid in agents}
            time.sleep(seconds)
            after = {pid: own_cpu(pid, children=True) for pid in agents}
            used = [after[pid] - before[pid] for pid in agents if before[pid] is not None and after[pid] is not None]
            if not used:
                return {"error": "no agent process found"}
            return {"nodes": n, "agents": len(used), "seconds": seconds,
                    "cpu_ms_per_s_per_agent": 1000 * sum(used) / len(used) / seconds}
        finally:
            kill_group(p)

    def orphans_clusterrun(self) -> dict:
        started, runs = self.fresh("orph-cr")
        p = popen(self.clusterrun_argv(2, "sleeper.py", runs, str(started)), self.work, self.env)
        rid = None
        try:
            t = wait_lines(started, 2, time.perf_counter(), [p], START_TIMEOUT)
            rid = self.run_id(runs, timeout=10)
            if t is None or rid is None:
                return {"error": f"job did not start (started={t}, run_id={rid})"}
            before = self.cluster.job_processes(rid)
            p.kill()  # SIGKILL the orchestrator only, as the OOM killer would
            p.wait(timeout=10)
            time.sleep(5)
            after = self.cluster.job_processes(rid)
            local = local_session_left(p.pid)
            return {
                "marker": rid,
                "before": sum(map(len, before.values())),
                "alive_after_5s": sum(map(len, after.values())),
                "alive": after,
                "local_children_left": local,
                "killed_by_bench": self.reap(rid),
            }
        finally:
            kill_group(p)
            if rid:
                self.reap(rid)

    def orphans_pdsh(self) -> dict:
        marker = f"crbench{os.getpid()}x{self.counter}"
        self.counter += 1
        # `export` keeps the marker in the environment of sleep; two commands keep bash -c (with it in argv) alive.
        cmd = f"export CRBENCH_MARK={marker}; sleep 60; true"
        p = popen(["pdsh", "-R", "ssh", "-f", "1024", "-w", ",".join(self.hosts(2)), cmd], self.work, self.pdsh_env())
        try:
            deadline = time.monotonic() + 30
            before: dict = {}
            while time.monotonic() < deadline:
                before = self.cluster.job_processes(marker)
                if len(before) == 2 and all(any(c.strip() == "sleep 60" or c.startswith("sleep") for _, c in v)
                                            for v in before.values()):
                    break
                time.sleep(0.05)
            else:
                return {"error": f"sleep did not start on both nodes: {before}"}
            p.kill()
            p.wait(timeout=10)
            time.sleep(5)
            after = self.cluster.job_processes(marker)
            local = local_session_left(p.pid)
            return {
                "marker": marker,
                "before": sum(map(len, before.values())),
                "alive_after_5s": sum(map(len, after.values())),
                "alive": after,
                "local_children_left": local,
                "killed_by_bench": self.reap(marker),
            }
        finally:
            kill_group(p)
            self.reap(marker)


def med(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def fmt(v: float | None, spec: str = "6.2f") -> str:
    return format(v, spec) if v is not None else "   n/a"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1,8,32,64,128", help="comma-separated node counts (default 1,8,32,64,128)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--exec-nodes", default="",
                        help="more node counts for (b) exec alone, e.g. 240 (connections held at once)")
    parser.add_argument("--skip-extra", action="store_true", help="skip (c) teardown and (d) orphans")
    args = parser.parse_args()
    counts = sorted({int(x) for x in args.nodes.split(",") if x.strip()})
    exec_only = sorted({int(x) for x in args.exec_nodes.split(",") if x.strip()} - set(counts))
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces)")
    size = max(max(counts + exec_only), 2)
    result: dict = {"nodes": counts, "repeat": args.repeat, "cluster_nodes": size, "launch": {}, "exec": {},
                    "python": sys.executable, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    work = Path(tempfile.mkdtemp(prefix="clusterrun-bench-launch-"))
    cluster = SimCluster(size)
    t_start = time.perf_counter()
    try:
        cluster.start()
        result["cluster_start_s"] = time.perf_counter() - t_start
        print(f"cluster of {size} nodes up in {result['cluster_start_s']:.1f} s; work dir {work}", flush=True)
        bench = Bench(cluster, work)
        warm = bench.run_clusterrun(min(max(counts), 8))  # the first run copies files to the nodes: not counted
        print(f"warm-up: rc={warm['rc']}", flush=True)
        for n in counts:
            rows: dict[str, list[dict]] = {"clusterrun": [], "pdsh": []}
            execs: dict[str, list[dict]] = {"clusterrun": [], "pdsh": []}
            for _ in range(args.repeat):  # interleaved, so drift on a shared machine hits both alike
                rows["clusterrun"].append(bench.run_clusterrun(n))
                rows["pdsh"].append(bench.run_pdsh(n))
                execs["clusterrun"].append(bench.run_exec(n))
                execs["pdsh"].append(bench.run_pdsh_exec(n))
            result["launch"][n], result["exec"][n] = rows, execs
            cr, pd = rows["clusterrun"], rows["pdsh"]
            print(f"N={n:3d}  torchrun everywhere: clusterrun {fmt(med([r.get('torchrun_s') for r in cr]))} s, "
                  f"pdsh {fmt(med([r.get('torchrun_s') for r in pd]))} s; clusterrun cpu "
                  f"{fmt(med([r['cpu_s'] for r in cr]))} s, rc {[r['rc'] for r in cr]}/{[r['rc'] for r in pd]}",
                  flush=True)
        for n in exec_only:
            execs = {"clusterrun": [], "pdsh": []}
            for _ in range(args.repeat):
                execs["clusterrun"].append(bench.run_exec(n))
                execs["pdsh"].append(bench.run_pdsh_exec(n))
            result["exec"][n] = execs
            print(f"N={n:3d}  exec: clusterrun {fmt(med([r['total_s'] for r in execs['clusterrun']]))} s, "
                  f"{fmt(med([r['threads'] for r in execs['clusterrun']]), '.0f')} threads", flush=True)
        result["agents"] = bench.agent_cpu(min(max(counts), 8))
        print(f"node agents while the job sleeps: {result['agents']}", flush=True)
        if not args.skip_extra:
            result["teardown"] = bench.teardown()
            print(f"teardown: {fmt(result['teardown'].get('teardown_s'))} s", flush=True)
            result["orphans"] = {"clusterrun": bench.orphans_clusterrun(), "pdsh": bench.orphans_pdsh()}
    finally:
        cluster.stop()
        failed = [r for rows in result["launch"].values() for r in rows["clusterrun"] if r.get("rc") != 0]
        if failed:  # their run directories (status.json, every node's logs) are the evidence: kept
            print(f"{len(failed)} clusterrun run(s) failed; their run directories are kept under {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    report(result, counts, exec_only)
    save_results(result, "launch")
    return 0


def ms(seconds: float | None) -> float | None:
    return seconds * 1000 if seconds is not None else None


def report(result: dict, counts: list[int], exec_only: list[int]) -> None:
    def m(rows: list[dict], key: str) -> float | None:
        return med([r.get(key) for r in rows])

    print()
    print(f"up: {result['cluster_nodes']}-node simulated cluster, median of {result['repeat']}, seconds from the start")
    print(f"{'N':>4} | {'torchrun: cr':>12} | {'pdsh':>6} | {'ratio':>6} | {'go: cr':>6} | {'warm':>4} | "
          f"{'ranks: cr':>9} | {'pdsh':>6} | {'ratio':>6} | {'cr cpu':>6} | {'cpu/added node':>14} | {'cr rss':>7} | "
          f"{'threads':>7} | {'pdsh cpu':>8}")
    print("-" * 140)
    summary: dict = {}
    base = result["launch"][counts[0]]["clusterrun"] if counts[0] == 1 else None
    for n in counts:
        cr, pd = result["launch"][n]["clusterrun"], result["launch"][n]["pdsh"]
        t_cr, t_pd = m(cr, "torchrun_s"), m(pd, "torchrun_s")
        ratio = t_cr / t_pd if t_cr is not None and t_pd else None
        per_node = None
        if base is not None and n > 1 and m(cr, "cpu_s") is not None and m(base, "cpu_s") is not None:
            per_node = (m(cr, "cpu_s") - m(base, "cpu_s")) / (n - 1)
        ranks_ratio = m(cr, "ranks_s") / m(pd, "ranks_s") if m(cr, "ranks_s") and m(pd, "ranks_s") else None
        row = {"torchrun_s": t_cr, "pdsh_torchrun_s": t_pd, "ratio": ratio, "go_s": m(cr, "go_s"),
               "warm_nodes": m(cr, "warm"), "ranks_ratio": ranks_ratio, "ranks_s": m(cr, "ranks_s"),
               "pdsh_ranks_s": m(pd, "ranks_s"), "cpu_s": m(cr, "cpu_s"), "cpu_per_added_node_ms":
               per_node * 1000 if per_node is not None else None, "rss_mib": m(cr, "rss_mib"),
               "threads": m(cr, "threads"), "pdsh_cpu_s": m(pd, "cpu_s"), "pdsh_rss_mib": m(pd, "rss_mib")}
        summary[n] = row
        print(f"{n:>4} | {fmt(t_cr):>12} | {fmt(t_pd):>6} | {fmt(ratio):>5}x | {fmt(row['go_s']):>6} | "
              f"{fmt(row['warm_nodes'], '.0f'):>4} | {fmt(row['ranks_s']):>9} | "
              f"{fmt(row['pdsh_ranks_s']):>6} | {fmt(ranks_ratio):>5}x | {fmt(row['cpu_s']):>6} | "
              f"{fmt(row['cpu_per_added_node_ms'], '.1f') + ' ms':>14} | {fmt(row['rss_mib'], '.0f') + ' MiB':>7} | "
              f"{fmt(row['threads'], '.0f'):>7} | {fmt(row['pdsh_cpu_s']):>8}")
    result["summary"] = summary
    print()
    print("clusterrun's launch timeline (status.json), seconds from the command's start: when the first node began")
    print("connecting (Python's start, imports, the inventory), then when the last node ended each phase;")
    print("[median, slowest node] of each phase's own duration. torchrun ends when each node's ranks had all started;")
    print("first_line when clusterrun had every node's first rank line. `ranks` is when every rank had run its first")
    print("line (the bench's file), for clusterrun and pdsh. `at node` is when the first connection reached a node's")
    print("sshd, seen from outside the command (its listener's /proc/<pid>/net/tcp, every 2 ms), for both.")
    print(f"{'N':>4} | {'connect at':>10} | {'at node':>7} | {'pdsh':>5} | " + " | ".join(f"{p:>17}" for p in PHASES)
          + f" | {'ranks':>6} | {'pdsh':>6}")
    print("-" * (42 + 20 * len(PHASES) + 18))
    for n in counts:
        cr = result["launch"][n]["clusterrun"]
        timelines = [r["timeline"] for r in cr if r.get("timeline")]
        if not timelines:
            print(f"{n:>4} | no timeline in status.json")
            continue

        def tl(phase: str, key: str, ts: list[dict] = timelines) -> float | None:
            return med([t[phase][key] for t in ts if phase in t])

        cells = [f"{fmt(tl(p, 'last_end_s'), '5.2f')} [{fmt(tl(p, 'median_s'), '.2f')},{fmt(tl(p, 'max_s'), '.2f')}]"
                 for p in PHASES]
        summary[n]["timeline"] = {p: {k: tl(p, k) for k in ("first_start_s", "last_end_s", "median_s", "max_s")}
                                  for p in PHASES}
        summary[n]["ssh_seen_s"] = m(cr, "ssh_seen_s")
        summary[n]["pdsh_ssh_seen_s"] = m(result["launch"][n]["pdsh"], "ssh_seen_s")
        print(f"{n:>4} | {fmt(tl('connect', 'first_start_s')):>10} | {fmt(summary[n]['ssh_seen_s']):>7} | "
              f"{fmt(summary[n]['pdsh_ssh_seen_s']):>5} | " + " | ".join(f"{c:>17}" for c in cells)
              + f" | {fmt(summary[n]['ranks_s']):>6} | {fmt(summary[n]['pdsh_ranks_s']):>6}")
    print()
    print("clusterrun's own CPU, split: start (until torchrun ran on every node), running (per second, from then until")
    print("every rank ran), end (after that); start and end per added node against N=1, running per node; a short")
    print(f"run on a real cluster costs about start + end + running x its length: last column, a {SHORT_RUN_S:g} s run")
    print(f"{'N':>4} | {'start':>6} | {'/added node':>11} | {'running':>9} | {'/node/s':>13} | {'end':>6} | "
          f"{'/added node':>11} | {f'{SHORT_RUN_S:g} s run /node':>14}")
    print("-" * 96)
    for n in counts:
        cr = result["launch"][n]["clusterrun"]
        row = summary[n]
        row["cpu_start_s"], row["cpu_running_per_s"], row["cpu_end_s"] = (
            m(cr, "cpu_start_s"), m(cr, "cpu_running_per_s"), m(cr, "cpu_end_s"))
        added = {}
        for key in ("cpu_start_s", "cpu_end_s"):
            here, one = row[key], summary[counts[0]].get(key) if base is not None else None
            added[key] = (here - one) / (n - 1) if n > 1 and here is not None and one is not None else None
        # Per node, its fixed part included (the run's first seconds at N=1 are too few for a baseline).
        added["cpu_running_per_s"] = row["cpu_running_per_s"] / n if row["cpu_running_per_s"] is not None else None
        row["cpu_start_per_added_node_ms"] = ms(added["cpu_start_s"])
        row["cpu_running_per_node_ms_per_s"] = ms(added["cpu_running_per_s"])
        row["cpu_end_per_added_node_ms"] = ms(added["cpu_end_s"])
        short = (None if None in added.values() else
                 added["cpu_start_s"] + added["cpu_end_s"] + SHORT_RUN_S * added["cpu_running_per_s"])
        row["cpu_short_run_per_added_node_ms"] = ms(short)
        print(f"{n:>4} | {fmt(row['cpu_start_s']):>6} | {fmt(row['cpu_start_per_added_node_ms'], '.1f') + ' ms':>11} | "
              f"{fmt(ms(row['cpu_running_per_s']), '.1f') + ' ms/s':>9} | "
              f"{fmt(row['cpu_running_per_node_ms_per_s'], '.2f') + ' ms/s':>13} | {fmt(row['cpu_end_s']):>6} | "
              f"{fmt(row['cpu_end_per_added_node_ms'], '.1f') + ' ms':>11} | "
              f"{fmt(row['cpu_short_run_per_added_node_ms'], '.1f') + ' ms':>14}")
    print()
    print("exec `true`: wall time, own CPU, peak RSS and threads of clusterrun; pdsh's wall time and CPU")
    print(f"{'N':>4} | {'clusterrun':>10} | {'pdsh':>6} | {'ratio':>6} | {'cr cpu':>6} | {'cr rss':>7} | "
          f"{'threads':>7} | {'pdsh cpu':>8} | {'rc':>5}")
    for n in sorted(counts + exec_only):
        cr, pd = result["exec"][n]["clusterrun"], result["exec"][n]["pdsh"]
        a, b = m(cr, "total_s"), m(pd, "total_s")
        row = summary.setdefault(n, {})
        row["exec_s"], row["pdsh_exec_s"] = a, b
        row["exec_cpu_s"], row["pdsh_exec_cpu_s"] = m(cr, "cpu_s"), m(pd, "cpu_s")
        row["exec_rss_mib"], row["exec_threads"] = m(cr, "rss_mib"), m(cr, "threads")
        print(f"{n:>4} | {fmt(a):>10} | {fmt(b):>6} | {fmt(a / b if a and b else None):>5}x | "
              f"{fmt(m(cr, 'cpu_s')):>6} | {fmt(m(cr, 'rss_mib'), '.0f') + ' MiB':>7} | "
              f"{fmt(m(cr, 'threads'), '.0f'):>7} | {fmt(m(pd, 'cpu_s')):>8} | "
              f"{','.join(str(r['rc']) for r in cr + pd):>5}")
    if "agents" in result:
        ag = result["agents"]
        print()
        print(f"node agents while a {ag.get('nodes')}-node job sleeps: "
              + (ag["error"] if "error" in ag else f"{ag['cpu_ms_per_s_per_agent']:.2f} ms of CPU per second each "
                 f"sampling every second, {ag['sampling_off_ms_per_s_per_agent']:.2f} ms without sampling: sampling "
                 f"costs {ag['sampling_ms_per_s_per_agent']:.2f} ms/s per node"))
    if "teardown" in result:
        td = result["teardown"]
        print()
        print(f"(c) teardown, 2 nodes, rank 1 exits 1 after 2 s: last process gone {fmt(td.get('teardown_s'))} s "
              f"after the exit; orchestrator rc={td.get('rc')}, total {fmt(td.get('orchestrator_total_s'))} s")
    if "orphans" in result:
        print("(d) SIGKILL of the orchestrator, `sleep 60` on 2 nodes, processes alive on the nodes 5 s later:")
        for name, o in result["orphans"].items():
            if "error" in o:
                print(f"    {name:10s} error: {o['error']}")
                continue
            print(f"    {name:10s} {o['alive_after_5s']} of {o['before']} still alive "
                  f"(local children left: {len(o['local_children_left'])}; killed by the bench: "
                  f"{len(o['killed_by_bench'])})")


if __name__ == "__main__":
    sys.exit(main())
