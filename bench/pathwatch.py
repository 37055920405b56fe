"""The data-path watch of `clusterrun up`: time from a dead data NIC to its verdict, its cost, dead vs busy.

    sudo python bench/pathwatch.py [--nodes 4,16] [--repeat 2] [--parts abc] [--keep]

One SimCluster of max(--nodes) nodes is started once (needs root, see tests/simcluster.py). A worker, job.py,
is written into the work dir (the nodes share this machine's filesystem): init_process_group("gloo",
timeout=300 s), then a loop of one all_reduce of --numel floats (refilled with ones each step), a step line
`step S rank R` every --every steps (step 0 included), and a sleep of --sleep seconds. Rank 0 decides when the
loop ends (--seconds after its first step; 0 = never) and says so inside the all_reduce itself (element 0), so
every rank stops after the same step; each rank then prints `done rank R steps S seconds T` (its own steps and
the seconds since its first step) and exits 0. Every job is `python -m clusterrun up <inventory of the first N
nodes> job.py ... --nproc-per-node 1 --runs-dir <fresh dir>` (1 rank per node, NOT -q: the step lines are
read from clusterrun's stdout); clusterrun's stdout and stderr are read as they come by one thread each, every
line stamped with time.monotonic() on arrival. One uncounted warm-up job (1 s of steps on max(--nodes) nodes)
comes first: the first run copies job.py to the nodes' caches.

For each N:

  (a) fault -> verdict (--repeat runs): the 1024-float loop (step line every 10 steps, 0.05 s sleep) with the
      watch on (the default, --on-path-loss stop). Once every rank has printed a step line, the data NIC of the
      middle node (node<N//2>) is dropped, cluster.drop_nic(node, "data") (iptables DROP in and out, link UP);
      the fault time is taken when that call has returned (the rules are in place; the call's own duration is
      in the JSON). Measured from it: the verdict line on clusterrun's stderr (`clusterrun: <node>: its data
      path died: ...`), the exit of the clusterrun process (seen through a pidfd), and, from status.json
      `events` (the supervisor's wall clock; the nodes share this machine's clock), the first path-lost event.
      Reported: whether the verdict names the faulted node (and status.json's first_failure and path-verdict
      events agree), clusterrun's exit code, and what of the run is still on the nodes 10 s after the exit
      (cluster.wait_no_processes(run_id, 10), then killed by PID). The NIC is restored after each run.
      Times are medians over the runs.
  (b) cost on a healthy job: the same loop for a fixed 20 s of steps, once with the watch and once with
      --no-path-watch. Per node: datagrams/s sent + received by the watch (status.json `watch`: the agent's
      counts over the watch's life, divided by the node's `ended - launched` from status.json; node0 is shown
      apart: every node probes it), and the node agent's CPU time (utime + stime of /proc/<agent>/stat, in
      clock ticks of os.sysconf('SC_CLK_TCK'), all its threads, the watch's included). The agent is found
      as in tests/test_ssh_up.py `_agent_of`: the parent of the node's torchrun, which carries
      CLUSTERRUN_RUN_ID=<run id> and CLUSTERRUN_NODE=<node> in its environment. It is sampled when every
      rank has printed its first step line and 18 s later (the job ends 20 s after rank 0's first step):
      `cpu@18s` is the agent's total CPU since it started, `cpu/s` the CPU it used per second in between
      (the steady state, startup excluded). Steps per second: each rank's steps over its own seconds (its
      `done` line; the step lines, one per 10 steps, are counted too and kept in the JSON), median over ranks.
  (c) dead vs busy: the middle node's data NIC is shaped to 20mbit (cluster.shape(node, "data", "20mbit"): the
      tbf on its egress), and the ranks all_reduce 4 Mi floats (16 MiB) back to back (no sleep, a step line per
      step) for 25 s, so that link stays saturated, with the watch on. Reported: the path-lost events in
      status.json and verdict lines on stderr (there must be none), clusterrun's exit code (must be 0), the
      steps done and seconds per step, the watch's datagrams lost (sent minus received over all nodes, from
      status.json `watch`), and how busy the link was: that tbf's counters (`tc -s qdisc`) are read every
      0.5 s during the job; a half-second in which it sent at 80 % of 20 Mbit/s or more counts as busy, and
      the table shows the busy seconds, the rate during them and the packets the tbf dropped. The shaping
      is then put back to the cluster's data rate (cluster.data_rate, as SimCluster.reset() does).

Every wait is bounded: the ranks' first step lines (120 s + 6 s per node), the verdict (60 s after the fault),
the exit (90 s after the fault in (a); 180 s after the first step lines in (b); in (c), whose first step line
only comes after a whole all_reduce through the slow link, and in the warm-up, 120 s + 6 s per node + 25 s +
180 s after the start). A job past its bound
gets SIGINT (clusterrun stops every node), then, 30 s later, SIGKILL of the session the bench started it in;
afterwards whatever of the run is left on the nodes (found by its run id) or in that session is killed by PID.
The cluster is stopped in `finally`. Results are printed and saved to bench/results/pathwatch-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from benchlib import fmt, kill_pids, local_session_left, med, save_results  # noqa: E402
from simcluster import SimCluster  # noqa: E402
from simjobs import clusterrun_env, write_inventory  # noqa: E402

START_TIMEOUT_BASE = 120.0  # seconds until every rank printed its first step line, plus START_TIMEOUT_PER_NODE * N
START_TIMEOUT_PER_NODE = 6.0
VERDICT_TIMEOUT = 60.0  # after the fault
FAULT_EXIT_TIMEOUT = 90.0  # after the fault
END_TIMEOUT = 180.0  # after the first step lines, for the jobs that end by themselves
STOP_WAIT = 30.0  # after SIGINT, before SIGKILL
KILL_WAIT = 15.0
LEFT_WAIT = 10.0  # "anything of the run left on the nodes 10 s later"
READER_JOIN = 10.0
HEALTHY_SECONDS = 20.0
SAMPLE_AT = 18.0
BUSY_SECONDS = 25.0
BUSY_NUMEL = 4 * 1024 * 1024
BUSY_RATE = "20mbit"
BUSY_RATE_MBIT = 20.0
BUSY_FRACTION = 0.8  # a second of the shaped link counts as busy at this fraction of its rate or more
TC_POLL = 0.5
LOOP_NUMEL = 1024
LOOP_EVERY = 10
LOOP_SLEEP = 0.05
CLK_TCK = os.sysconf("SC_CLK_TCK")

JOB_PY = """\
import argparse, datetime, time
import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=0.0)  # 0: until stopped
parser.add_argument("--numel", type=int, default=1024)
parser.add_argument("--every", type=int, default=10)
parser.add_argument("--sleep", type=float, default=0.05)
args = parser.parse_args()
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))  # gloo alone would wait 30 minutes
rank = dist.get_rank()
t = torch.ones(args.numel)
start = time.monotonic()
step = 0
while True:
    t.fill_(1.0)
    # rank 0 decides the end; the all_reduce carries it, so every rank stops after the same step
    t[0] = 1.0 if rank == 0 and args.seconds and time.monotonic() - start >= args.seconds else 0.0
    dist.all_reduce(t)
    stop = t[0].item() > 0.5
    if step % args.every == 0:
        print(f"step {step} rank {rank}", flush=True)
    step += 1
    if stop:
        break
    if args.sleep:
        time.sleep(args.sleep)
print(f"done rank {rank} steps {step} seconds {time.monotonic() - start:.3f}", flush=True)
dist.destroy_process_group()
"""

STEP = re.compile(rb"\bstep (\d+) rank (\d+)\b")
DONE = re.compile(rb"\bdone rank (\d+) steps (\d+) seconds ([0-9.]+)")
VERDICT = re.compile(r"clusterrun: (\S+): its data path died: (.*)")
TC_SENT = re.compile(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)")


# ------------------------------------------------------------------------------------------ processes






def proc_stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (state) on; index k is field k + 3."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


class Job:
    """One `clusterrun up` process: its stdout and stderr read by a thread each, lines stamped on arrival."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], out_dir: Path, ranks: int) -> None:
        self.argv = argv
        self.out_dir = out_dir
        self.ranks = ranks
        self.cond = threading.Condition()
        self.first_step: dict[int, float] = {}  # rank -> arrival of its first step line
        self.step_lines: dict[int, int] = {}
        self.last_step: dict[int, int] = {}
        self.done: dict[int, tuple[int, float]] = {}  # rank -> (steps, seconds)
        self.stderr: list[tuple[float, str]] = []
        self.verdicts: list[tuple[float, str, str]] = []  # (arrival, node, line)
        self.eof: set[str] = set()
        self.rc: int | None = None
        self.exited_at: float | None = None
        self.stopped_by_bench: str | None = None
        self.closed: dict | None = None
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True, bufsize=0)
        self.pidfd = os.pidfd_open(self.proc.pid)
        self.threads = [threading.Thread(target=self._read, args=(name, pipe), daemon=True, name=f"read-{name}")
                        for name, pipe in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr))]
        for thread in self.threads:
            thread.start()

    def _read(self, name: str, pipe) -> None:
        fd = pipe.fileno()
        buf = b""
        with open(self.out_dir / name, "wb") as sink:
            while True:
                try:
                    chunk = os.read(fd, 1 << 16)
                except OSError:
                    chunk = b""
                now = time.monotonic()
                if not chunk:
                    lines, buf = ([buf] if buf else []), b""
                else:
                    sink.write(chunk)
                    *lines, buf = (buf + chunk).split(b"\n")
                with self.cond:
                    for line in lines:
                        self._line(name, now, line)
                    if not chunk:
                        self.eof.add(name)
                    self.cond.notify_all()
                if not chunk:
                    return

    def _line(self, name: str, now: float, line: bytes) -> None:  # under self.cond
        if name == "stdout":
            m = STEP.search(line)
            if m:
                step, rank = int(m[1]), int(m[2])
                self.first_step.setdefault(rank, now)
                self.step_lines[rank] = self.step_lines.get(rank, 0) + 1
                self.last_step[rank] = step
                return
            m = DONE.search(line)
            if m:
                self.done[int(m[1])] = (int(m[2]), float(m[3]))
            return
        text = line.decode(errors="replace")
        self.stderr.append((now, text))
        m = VERDICT.search(text)
        if m:
            self.verdicts.append((now, m[1], text))

    def wait_for(self, predicate, timeout: float) -> bool:
        """Wait (bounded) until ``predicate()`` holds (checked under the lock) or clusterrun's output ended."""
        with self.cond:
            return self.cond.wait_for(lambda: predicate() or len(self.eof) == 2, timeout) and predicate()

    def all_stepping(self) -> float | None:
        """When the last rank's first step line arrived (None while some rank has printed none)."""
        with self.cond:
            if len(self.first_step) < self.ranks:
                return None
            return max(self.first_step.values())

    def wait_exit(self, deadline: float) -> bool:
        """Wait for clusterrun's exit until ``deadline`` (monotonic); reap it. False on timeout."""
        if self.rc is not None:
            return True
        if not select.select([self.pidfd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            return False
        self.exited_at = time.monotonic()
        _, status, _ = os.wait4(self.proc.pid, 0)  # at once: the pidfd says it has exited
        self.rc = self.proc.returncode = os.waitstatus_to_exitcode(status)  # Popen never waits on a reused PID
        return True

    def stop(self, why: str) -> None:
        """SIGINT (clusterrun stops every node), then SIGKILL of the session the bench started it in."""
        if self.rc is not None:
            return
        self.stopped_by_bench = why
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGINT)
        if self.wait_exit(time.monotonic() + STOP_WAIT):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if not self.wait_exit(time.monotonic() + KILL_WAIT):
            raise RuntimeError(f"clusterrun pid {self.proc.pid} still alive {KILL_WAIT} s after SIGKILL")

    def close(self) -> dict:
        """Stop it if it still runs, join the readers (bounded), kill what is left in its session (once)."""
        if self.closed is not None:
            return self.closed
        self.stop("still running at the end of its run")
        for thread in self.threads:
            thread.join(READER_JOIN)
        os.close(self.pidfd)
        left = local_session_left(self.proc.pid)
        self.closed = {"local_left": [args for _, args in left], "local_killed": kill_pids([pid for pid, _ in left])}
        return self.closed


# ------------------------------------------------------------------------------------------- bench






class Bench:
    def __init__(self, cluster: SimCluster, work: Path, keep: bool) -> None:
        self.cluster = cluster
        self.work = work
        self.keep = keep
        self.env = clusterrun_env()
        self.counter = 0
        self.inventories: dict[int, Path] = {}
        self.job_py = work / "job.py"
        self.job_py.write_text(JOB_PY)

    def inventory(self, n: int) -> Path:
        if n not in self.inventories:
            self.inventories[n] = write_inventory(self.cluster, self.work / f"inv{n}.yaml", n, nproc=1)
        return self.inventories[n]

    def start_timeout(self, n: int) -> float:
        return START_TIMEOUT_BASE + START_TIMEOUT_PER_NODE * n

    def start(self, tag: str, n: int, *args: str, options: tuple[str, ...] = ()) -> tuple[Job, Path]:
        self.counter += 1
        d = self.work / f"{tag}{n}-{self.counter}"
        (d / "runs").mkdir(parents=True)
        argv = [sys.executable, "-m", "clusterrun", "up", "--nproc-per-node", "1", "--runs-dir", str(d / "runs"),
                *options, str(self.inventory(n)), str(self.job_py), *args]
        return Job(argv, self.work, self.env, d, n), d

    @staticmethod
    def run_dir(d: Path) -> Path | None:
        dirs = [x for x in (d / "runs").iterdir() if x.is_dir()] if (d / "runs").is_dir() else []
        return dirs[0] if len(dirs) == 1 else None

    @staticmethod
    def status(run: Path | None) -> dict:
        try:
            return json.loads((run / "status.json").read_text()) if run else {}
        except (OSError, ValueError):
            return {}

    def finish(self, job: Job, d: Path, res: dict, wait_left: float = LEFT_WAIT) -> dict:
        """Close the job, wait (bounded) until nothing of it is left on the nodes, kill what is (by PID), read
        status.json."""
        res.update(job.close())
        run = self.run_dir(d)
        res["run_id"] = run.name if run else None
        res["rc"] = job.rc
        res["stopped_by_bench"] = job.stopped_by_bench
        if run is not None:
            left = self.cluster.wait_no_processes(run.name, wait_left)
            res["node_left"] = {k: [c for _, c in v] for k, v in left.items()}
            killed = kill_pids([pid for procs in left.values() for pid, _ in procs])
            res["node_killed"] = killed
            if killed:
                self.cluster.wait_no_processes(run.name, KILL_WAIT)
        st = self.status(run)
        res["state"] = st.get("state")
        res["first_failure"] = st.get("first_failure")
        res["events"] = st.get("events") or []
        res["watch"] = st.get("watch") or {}
        res["duration_s"] = st.get("duration")
        res["node_spans"] = {name: (node.get("ended") - node.get("launched"))
                             if node.get("ended") and node.get("launched") else None
                             for name, node in (st.get("nodes") or {}).items()}
        res["stderr_tail"] = [text for _, text in job.stderr[-15:]]
        res["argv"] = shlex.join(job.argv)
        with job.cond:
            res["step_lines"] = {str(r): c for r, c in sorted(job.step_lines.items())}
            res["done"] = {str(r): {"steps": s, "seconds": t} for r, (s, t) in sorted(job.done.items())}
        if not self.keep:
            shutil.rmtree(d, ignore_errors=True)
        return res

    # --------------------------------------------------------------------------------- (a) fault

    def fault(self, n: int) -> dict:
        node = self.cluster.nodes[n // 2]
        job, d = self.start("fault", n, "--every", str(LOOP_EVERY), "--sleep", str(LOOP_SLEEP),
                            "--numel", str(LOOP_NUMEL))
        res: dict = {"nodes": n, "faulted": node.name, "nic": node.data_nic}
        dropped = False
        try:
            ok = job.wait_for(lambda: len(job.first_step) >= n, self.start_timeout(n))
            res["start_s"] = (job.all_stepping() or time.monotonic()) - job.t0
            if not ok:
                res["error"] = f"only {len(job.first_step)} of {n} ranks printed a step line"
                return self.finish(job, d, res)
            before = time.monotonic()
            self.cluster.drop_nic(node, "data")
            dropped = True
            fault = time.monotonic()
            fault_wall = time.time()
            res["drop_call_s"] = fault - before
            job.wait_for(lambda: bool(job.verdicts), VERDICT_TIMEOUT)
            exited = job.wait_exit(fault + FAULT_EXIT_TIMEOUT)
            with job.cond:
                verdicts = list(job.verdicts)
            res["verdict_s"] = verdicts[0][0] - fault if verdicts else None
            res["verdict_node"] = verdicts[0][1] if verdicts else None
            res["verdict_line"] = verdicts[0][2] if verdicts else None
            res["verdicts"] = len(verdicts)
            res["exit_s"] = job.exited_at - fault if exited and job.exited_at else None
            if not exited:
                job.stop(f"no exit {FAULT_EXIT_TIMEOUT:.0f} s after the fault")
            res = self.finish(job, d, res)
            lost = [e for e in res["events"] if e.get("kind") == "path-lost"]
            res["lost_s"] = min(e["time"] for e in lost) - fault_wall if lost else None
            res["lost_paths"] = [f"{e['node']}: {e['text']}" for e in lost]
            ff = res.get("first_failure") or {}
            res["named_ok"] = (res["verdict_node"] == node.name and ff.get("node") == node.name
                               and [e["node"] for e in res["events"] if e.get("kind") == "path-verdict"] == [node.name])
            return res
        finally:
            job.close()
            if dropped:
                self.cluster.restore_nic(node, "data")

    # ---------------------------------------------------------------------------------- (b) cost

    def agents(self, run_id: str, names: list[str]) -> dict[str, tuple[int, str]]:
        """node -> (agent pid, its start time): the parent of the node's torchrun, as _agent_of finds it."""
        found: dict[str, tuple[int, str]] = {}
        for node, procs in self.cluster.job_processes(run_id).items():
            for pid, cmd in procs:
                if "torch.distributed.run" not in cmd:
                    continue
                try:
                    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                if f"CLUSTERRUN_NODE={node}".encode() not in environ:
                    continue
                stat = proc_stat(pid)
                if stat is None:
                    continue
                ppid = int(stat[1])
                try:
                    parent = Path(f"/proc/{ppid}/cmdline").read_bytes().decode(errors="replace")
                except OSError:
                    continue
                pstat = proc_stat(ppid)
                if "agent.py" in parent and pstat is not None:
                    found[node] = (ppid, pstat[19])
        return {name: found[name] for name in names if name in found}

    @staticmethod
    def cpu(agents: dict[str, tuple[int, str]]) -> dict[str, float | None]:
        """Each agent's utime + stime in seconds (None once it is gone or its PID is another process)."""
        out: dict[str, float | None] = {}
        for node, (pid, started) in agents.items():
            stat = proc_stat(pid)
            out[node] = (int(stat[11]) + int(stat[12])) / CLK_TCK if stat and stat[19] == started else None
        return out

    def healthy(self, n: int, watch: bool) -> dict:
        names = [x.name for x in self.cluster.nodes[:n]]
        flag = [] if watch else ["--no-path-watch"]
        job, d = self.start("cost", n, "--seconds", str(HEALTHY_SECONDS), "--every", str(LOOP_EVERY),
                            "--sleep", str(LOOP_SLEEP), "--numel", str(LOOP_NUMEL), options=tuple(flag))
        res: dict = {"nodes": n, "watch_on": watch}
        try:
            ok = job.wait_for(lambda: len(job.first_step) >= n, self.start_timeout(n))
            stepping = job.all_stepping()
            res["start_s"] = (stepping or time.monotonic()) - job.t0
            if not ok or stepping is None:
                res["error"] = f"only {len(job.first_step)} of {n} ranks printed a step line"
                return self.finish(job, d, res)
            run = self.run_dir(d)
            agents = self.agents(run.name, names) if run else {}
            cpu0 = self.cpu(agents)
            t_cpu0 = time.monotonic()
            time.sleep(max(0.0, stepping + SAMPLE_AT - time.monotonic()))
            cpu1 = self.cpu(agents)
            window = time.monotonic() - t_cpu0
            res["agents"] = {k: v[0] for k, v in agents.items()}
            res["cpu_at_sample_s"] = cpu1
            res["cpu_window_s"] = window
            res["cpu_per_s"] = {k: (cpu1[k] - cpu0[k]) / window if cpu1.get(k) is not None
                                and cpu0.get(k) is not None and window > 0 else None for k in agents}
            if not job.wait_exit(stepping + END_TIMEOUT):
                job.stop(f"no exit {END_TIMEOUT:.0f} s after the first step lines")
            res = self.finish(job, d, res)
            rates = {}
            for name in names:
                w = res["watch"].get(name)
                span = res["node_spans"].get(name) or res.get("duration_s")
                rates[name] = (w["sent"] + w["received"]) / span if w and span else None
            res["datagrams_per_s"] = rates
            res["watch_lost"] = watch_lost(res["watch"])
            res["steps_per_s"] = {r: v["steps"] / v["seconds"] for r, v in res["done"].items() if v["seconds"] > 0}
            res["path_events"] = [e for e in res["events"] if e.get("kind") in ("path-lost", "path-verdict")]
            return res
        finally:
            job.close()

    # ---------------------------------------------------------------------------------- (c) busy

    def tc_counters(self, node) -> dict | None:
        tc = shutil.which("tc") or "/usr/sbin/tc"
        out = subprocess.run([tc, "-n", node.netns, "-s", "qdisc", "show", "dev", node.data_nic],
                             capture_output=True, text=True, timeout=30).stdout
        m = TC_SENT.search(out)
        return {"bytes": int(m[1]), "packets": int(m[2]), "dropped": int(m[3]), "overlimits": int(m[4])} if m else None

    def busy(self, n: int) -> dict:
        node = self.cluster.nodes[n // 2]
        res: dict = {"nodes": n, "shaped": node.name, "rate": BUSY_RATE, "numel": BUSY_NUMEL}
        self.cluster.shape(node, "data", BUSY_RATE)
        job = None
        try:
            job, d = self.start("busy", n, "--seconds", str(BUSY_SECONDS), "--every", "1", "--sleep", "0",
                                "--numel", str(BUSY_NUMEL))
            # The first step line only comes after a whole 16 MiB all_reduce through the slow link: one bound for
            # the whole job. Meanwhile the tbf's counters are read every TC_POLL seconds.
            deadline = job.t0 + self.start_timeout(n) + BUSY_SECONDS + END_TIMEOUT
            samples = []
            while True:
                c = self.tc_counters(node)
                if c is not None:
                    samples.append((time.monotonic(), c["bytes"], c["dropped"]))
                if job.wait_exit(min(deadline, time.monotonic() + TC_POLL)):
                    break
                if time.monotonic() >= deadline:
                    job.stop("no exit in time")
                    break
            res = self.finish(job, d, res)
            res["tc_samples"] = [(round(t - job.t0, 3), b, dr) for t, b, dr in samples]
            busy_s = busy_bytes = 0.0
            for (t1, b1, _), (t2, b2, _) in itertools.pairwise(samples):
                if t2 > t1 and (b2 - b1) * 8 / 1e6 / (t2 - t1) >= BUSY_FRACTION * BUSY_RATE_MBIT:
                    busy_s += t2 - t1
                    busy_bytes += b2 - b1
            res["link_busy_s"] = busy_s  # seconds the tbf sent at 80 % of its rate or more
            res["link_busy_mbit_s"] = busy_bytes * 8 / 1e6 / busy_s if busy_s else None
            res["link_dropped"] = samples[-1][2] - samples[0][2] if samples else None
            res["path_lost"] = [e for e in res["events"] if e.get("kind") == "path-lost"]
            res["path_verdicts"] = [e for e in res["events"] if e.get("kind") == "path-verdict"]
            res["verdict_lines"] = [text for _, _, text in job.verdicts]
            res["steps"] = {r: v["steps"] for r, v in res["done"].items()}
            res["step_s"] = {r: v["seconds"] / v["steps"] for r, v in res["done"].items() if v["steps"]}
            res["watch_lost"] = watch_lost(res["watch"])
            res["watch_shaped"] = res["watch"].get(node.name)
            return res
        finally:
            if job is not None:
                job.close()
            self.cluster.shape(node, "data", self.cluster.data_rate)

    def warmup(self, n: int) -> dict:
        job, d = self.start("warm", n, "--seconds", "1", "--every", str(LOOP_EVERY), "--sleep", str(LOOP_SLEEP))
        res: dict = {"nodes": n}
        try:
            if not job.wait_exit(job.t0 + self.start_timeout(n) + BUSY_SECONDS + END_TIMEOUT):
                job.stop("no exit in time")
            res["total_s"] = (job.exited_at or time.monotonic()) - job.t0
            return self.finish(job, d, res)
        finally:
            job.close()


# -------------------------------------------------------------------------------------------- report


def watch_lost(watch: dict) -> int | None:
    """Datagrams of the watch sent but never received, over all nodes (a probe or its answer lost, or in flight
    at the end)."""
    if not watch:
        return None
    return sum(w["sent"] for w in watch.values()) - sum(w["received"] for w in watch.values())


def left_count(r: dict) -> int:
    return sum(map(len, (r.get("node_left") or {}).values()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="4,16", help="comma-separated node counts (default 4,16)")
    parser.add_argument("--repeat", type=int, default=2, help="fault runs per N in (a) (default 2)")
    parser.add_argument("--parts", default="abc", help="which parts to run: any of a, b, c (default abc)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (outputs, runs/) and print its path")
    args = parser.parse_args()
    counts = sorted({int(x) for x in args.nodes.split(",") if x.strip()})
    if not counts or counts[0] < 3:
        parser.error("--nodes needs node counts of at least 3 (the faulted node is a middle one)")
    if args.repeat < 1 or not set(args.parts) <= set("abc") or not args.parts:
        parser.error("--repeat must be at least 1 and --parts letters of abc")
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces)")
    size = max(counts)
    result: dict = {"nodes": counts, "repeat": args.repeat, "parts": args.parts, "cluster_nodes": size,
                    "python": sys.executable, "cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    "fault": {}, "cost": {}, "busy": {}}
    work = Path(tempfile.mkdtemp(prefix="clusterrun-bench-pathwatch-"))
    cluster = SimCluster(size)
    t_start = time.perf_counter()
    try:
        cluster.start()
        result["cluster_start_s"] = time.perf_counter() - t_start
        result["data_rate"] = cluster.data_rate
        print(f"cluster of {size} nodes up in {result['cluster_start_s']:.1f} s; work dir {work}", flush=True)
        bench = Bench(cluster, work, args.keep)
        result["warmup"] = bench.warmup(size)
        w = result["warmup"]
        print(f"  warm-up N={size}: rc={w['rc']} {fmt(w.get('total_s'), '.1f')} s", flush=True)
        for n in counts:
            if "a" in args.parts:
                rows = []
                for _ in range(args.repeat):
                    r = bench.fault(n)
                    rows.append(r)
                    print(f"  (a) N={n:3d} drop {r['faulted']}: verdict {fmt(r.get('verdict_s'))} s names "
                          f"{r.get('verdict_node')} exit {fmt(r.get('exit_s'))} s rc={r['rc']} left {left_count(r)}"
                          f"{'  ERROR ' + r['error'] if r.get('error') else ''}", flush=True)
                result["fault"][n] = rows
            if "b" in args.parts:
                pair = {}
                for watch in (True, False):
                    r = bench.healthy(n, watch)
                    pair["with" if watch else "without"] = r
                    print(f"  (b) N={n:3d} watch {'on ' if watch else 'off'}: rc={r['rc']} steps/s "
                          f"{fmt(med(list(r.get('steps_per_s', {}).values())))} agent cpu/s "
                          f"{fmt(med(list(r.get('cpu_per_s', {}).values())), '.4f')}"
                          f"{'  ERROR ' + r['error'] if r.get('error') else ''}", flush=True)
                result["cost"][n] = pair
            if "c" in args.parts:
                r = bench.busy(n)
                result["busy"][n] = r
                print(f"  (c) N={n:3d} {r['shaped']} at {BUSY_RATE}: rc={r['rc']} path-lost {len(r['path_lost'])} "
                      f"verdicts {len(r['verdict_lines'])} link busy {fmt(r.get('link_busy_s'), '.1f')} s at "
                      f"{fmt(r.get('link_busy_mbit_s'), '.1f')} Mbit/s", flush=True)
    finally:
        cluster.stop()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    # ----------------------------------------------------------------------------------------- report
    summary: dict = {"fault": {}, "cost": {}, "busy": {}}
    if result["fault"]:
        print()
        print(f"(a) fault -> verdict: the data NIC of node<N//2> dropped while a 1024-float gloo all_reduce loop runs "
              f"(median of {args.repeat}, seconds from the fault)")
        print("  lost: first path-lost event (status.json); verdict: the line on stderr; exit: clusterrun exits;")
        print("  named: runs whose verdict, first_failure and path-verdict event all name the faulted node;")
        print(f"  left: processes of the run still on the nodes {LEFT_WAIT:.0f} s after the exit (worst run)")
        head = (f"{'N':>3} | {'faulted':>7} | {'named':>5} | {'lost':>6} | {'verdict':>7} | {'exit':>6} | "
                f"{'rc':>5} | {'left':>4}")
        print(head)
        print("-" * len(head))
        for n, rows in result["fault"].items():
            s = {"faulted": rows[0]["faulted"], "named_ok": sum(bool(r.get("named_ok")) for r in rows),
                 "runs": len(rows), "lost_s": med([r.get("lost_s") for r in rows]),
                 "verdict_s": med([r.get("verdict_s") for r in rows]), "exit_s": med([r.get("exit_s") for r in rows]),
                 "rc": [r["rc"] for r in rows], "left": max(left_count(r) for r in rows),
                 "verdict_nodes": [r.get("verdict_node") for r in rows]}
            summary["fault"][n] = s
            print(f"{n:>3} | {s['faulted']:>7} | {s['named_ok']:>2}/{s['runs']:<2} | {fmt(s['lost_s']):>6} | "
                  f"{fmt(s['verdict_s']):>7} | {fmt(s['exit_s']):>6} | {','.join(map(str, s['rc'])):>5} | "
                  f"{s['left']:>4}")
    if result["cost"]:
        print()
        print(f"(b) the watch's cost on a healthy job ({HEALTHY_SECONDS:.0f} s of 1024-float all_reduce steps, "
              "watch on vs --no-path-watch)")
        print("  dgram/s: datagrams sent + received per second by a node's watch (node0; the others: median/max);")
        print(f"  cpu@{SAMPLE_AT:.0f}s: node agent's total CPU seconds (median over nodes) on/off; cpu ms/s: its CPU per "
              f"second of training (median over nodes) on/off; steps/s: median over ranks on/off")
        head = (f"{'N':>3} | {'dgram/s node0':>13} | {'dgram/s others':>14} | {'cpu@18s on/off':>14} | "
                f"{'cpu ms/s on/off':>15} | {'steps/s on/off':>14} | {'rc on/off':>9}")
        print(head)
        print("-" * len(head))
        for n, pair in result["cost"].items():
            on, off = pair["with"], pair["without"]
            rates = on.get("datagrams_per_s") or {}
            others = [v for k, v in rates.items() if k != "node0" and v is not None]
            s = {
                "dgram_per_s_node0": rates.get("node0"),
                "dgram_per_s_others_median": med(others), "dgram_per_s_others_max": max(others) if others else None,
                "agent_cpu_at_sample_s_on": med(list((on.get("cpu_at_sample_s") or {}).values())),
                "agent_cpu_at_sample_s_off": med(list((off.get("cpu_at_sample_s") or {}).values())),
                "agent_cpu_per_s_on": med(list((on.get("cpu_per_s") or {}).values())),
                "agent_cpu_per_s_off": med(list((off.get("cpu_per_s") or {}).values())),
                "agent_cpu_per_s_node0_on": (on.get("cpu_per_s") or {}).get("node0"),
                "agent_cpu_per_s_node0_off": (off.get("cpu_per_s") or {}).get("node0"),
                "steps_per_s_on": med(list((on.get("steps_per_s") or {}).values())),
                "steps_per_s_off": med(list((off.get("steps_per_s") or {}).values())),
                "path_events_on": len(on.get("path_events") or []),
                "rc_on": on["rc"], "rc_off": off["rc"],
            }
            summary["cost"][n] = s

            def ms(v: float | None) -> str:
                return fmt(v * 1000 if v is not None else None, ".1f")

            print(f"{n:>3} | {fmt(s['dgram_per_s_node0'], '.1f'):>13} | "
                  f"{fmt(s['dgram_per_s_others_median'], '.1f') + '/' + fmt(s['dgram_per_s_others_max'], '.1f'):>14} | "
                  f"{fmt(s['agent_cpu_at_sample_s_on']) + '/' + fmt(s['agent_cpu_at_sample_s_off']):>14} | "
                  f"{ms(s['agent_cpu_per_s_on']) + '/' + ms(s['agent_cpu_per_s_off']):>15} | "
                  f"{fmt(s['steps_per_s_on']) + '/' + fmt(s['steps_per_s_off']):>14} | "
                  f"{str(s['rc_on']) + '/' + str(s['rc_off']):>9}")
    if result["busy"]:
        print()
        print(f"(c) dead vs busy: node<N//2>'s data NIC shaped to {BUSY_RATE}, ranks all_reduce {BUSY_NUMEL} floats back "
              f"to back for {BUSY_SECONDS:.0f} s, watch on (no path-lost event and no verdict expected, rc 0)")
        print(f"  busy s / Mbit/s: seconds that NIC's tbf sent at {BUSY_FRACTION:.0%} of {BUSY_RATE} or more, and its rate"
              " then; dropped: packets the tbf dropped;")
        print("  s/step: seconds per all_reduce step (median over ranks); lost dgrams: watch datagrams sent but never "
              "received (all nodes)")
        head = (f"{'N':>3} | {'shaped':>6} | {'busy s':>6} | {'Mbit/s':>6} | {'dropped':>7} | {'steps':>5} | "
                f"{'s/step':>6} | {'lost dgrams':>11} | {'path-lost':>9} | {'verdicts':>8} | {'rc':>3}")
        print(head)
        print("-" * len(head))
        for n, r in result["busy"].items():
            steps = list(r.get("steps", {}).values())
            s = {"shaped": r["shaped"], "link_busy_s": r.get("link_busy_s"), "link_busy_mbit_s": r.get("link_busy_mbit_s"),
                 "dropped": r.get("link_dropped"), "steps_min": min(steps) if steps else None,
                 "s_per_step": med(list(r.get("step_s", {}).values())), "watch_lost": r.get("watch_lost"),
                 "path_lost": len(r["path_lost"]), "verdicts": len(r["verdict_lines"]) + len(r["path_verdicts"]),
                 "rc": r["rc"]}
            summary["busy"][n] = s
            print(f"{n:>3} | {s['shaped']:>6} | {fmt(s['link_busy_s'], '.1f'):>6} | {fmt(s['link_busy_mbit_s'], '.1f'):>6} | "
                  f"{s['dropped']!s:>7} | {s['steps_min']!s:>5} | {fmt(s['s_per_step'], '.1f'):>6} | "
                  f"{s['watch_lost']!s:>11} | {s['path_lost']:>9} | {s['verdicts']:>8} | {s['rc']!s:>3}")
    result["summary"] = summary
    problems = []
    for n, rows in result["fault"].items():
        for r in rows:
            if r.get("error") or not r.get("named_ok") or r["rc"] != 1 or left_count(r) or r.get("stopped_by_bench"):
                problems.append(f"(a) N={n}: {r.get('error') or ''} verdict {r.get('verdict_line')!r} rc={r['rc']} "
                                f"left {r.get('node_left')} stopped by bench: {r.get('stopped_by_bench')}; "
                                f"lost paths {r.get('lost_paths')}; stderr tail {r['stderr_tail'][-4:]}")
    for n, pair in result["cost"].items():
        for tag, r in pair.items():
            if r.get("error") or r["rc"] != 0 or r.get("path_events") or left_count(r):
                problems.append(f"(b) N={n} {tag} watch: {r.get('error') or ''} rc={r['rc']} path events "
                                f"{r.get('path_events')} left {r.get('node_left')}; stderr tail {r['stderr_tail'][-4:]}")
    for n, r in result["busy"].items():
        if r["rc"] != 0 or r["path_lost"] or r["verdict_lines"] or r["path_verdicts"] or left_count(r):
            problems.append(f"(c) N={n}: rc={r['rc']} path-lost {r['path_lost']} verdicts {r['verdict_lines']} "
                            f"left {r.get('node_left')}; stderr tail {r['stderr_tail'][-4:]}")
    if problems:
        print()
        for p in problems:
            print("  " + p)
    save_results(result, "pathwatch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
