"""Launch latency, teardown time and orphans of `clusterrun up` on the simulated cluster, against pdsh and ssh.

    sudo python bench/launch.py [--nodes 1,2,4,8,16] [--repeat 3]

One SimCluster of max(--nodes) nodes is started once (needs root, see tests/simcluster.py). For each N:

  (a) clusterrun: `python -m clusterrun up <inventory of the first N nodes> report.py`, nproc_per_node 1;
      report.py appends one line to a shared file and exits 0.
  (b) pdsh:       `pdsh -R ssh -f 1024 -w node0,...` running `echo started >> file`.
  (c) ssh:        N `ssh -F ssh_config nodeI 'echo started >> file'` started at once.

The measure is the wall time from the command's start to the file having N lines (polled every 10 ms).
clusterrun includes its preflight and a torchrun start on every node, pdsh/ssh a trivial command only: the table
shows the absolute times, clusterrun's time minus its 1-node time (the cost of the added nodes) and its ratio to pdsh.

  (d) teardown: a 2-node clusterrun job where rank 1 exits 1 after 2 s while rank 0 sleeps: time from that exit
      (a timestamp the worker writes just before sys.exit) to the last process of the run gone.
  (e) orphans: SIGKILL of the orchestrator (clusterrun vs pdsh, `sleep 60` on 2 nodes): processes still alive on
      the nodes 5 s later. Everything left is then killed by PID.

Results are printed and saved to bench/results/launch-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from benchlib import save_results  # noqa: E402
from simcluster import SimCluster  # noqa: E402
from simjobs import clusterrun_env, write_inventory  # noqa: E402

POLL = 0.01
START_TIMEOUT = 120.0
RUN_TIMEOUT = 180.0

REPORT_PY = """\
import os, sys
with open(sys.argv[1], "a") as f:
    f.write(f"{os.uname().nodename} {os.environ.get('RANK')}\\n")
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


def popen(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


class Bench:
    def __init__(self, cluster: SimCluster, work: Path) -> None:
        self.cluster = cluster
        self.work = work
        self.env = clusterrun_env()
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

    def clusterrun_argv(self, n: int, script: str, runs: Path, *args: str) -> list[str]:
        return [sys.executable, "-m", "clusterrun", "up", "--nproc-per-node", "1", "--runs-dir", str(runs), "-q",
                str(self.inventory(n)), str(self.work / script), *args]

    def hosts(self, n: int) -> list[str]:
        return [node.name for node in self.cluster.nodes[:n]]

    def pdsh_env(self) -> dict[str, str]:
        return {**os.environ, "PDSH_SSH_ARGS_APPEND": f"-F {self.cluster.ssh_config}"}

    # ------------------------------------------------------------------------------ launch latency

    def run_clusterrun(self, n: int) -> dict:
        started, runs = self.fresh(f"cr{n}")
        t0, t0_wall = time.perf_counter(), time.time()
        p = popen(self.clusterrun_argv(n, "report.py", runs, str(started)), self.work, self.env)
        t = wait_lines(started, n, t0, [p], START_TIMEOUT)
        code = finish([p])[0]
        # When every node agent had started its torchrun (nodes share this machine's clock): the fan-out itself,
        # without torch's import in torchrun and the worker.
        launched = None
        with contextlib.suppress(OSError, ValueError, StopIteration, TypeError):
            status = json.loads(next(d for d in runs.iterdir() if d.is_dir()).joinpath("status.json").read_text())
            launched = max(node["launched"] for node in status["nodes"].values()) - t0_wall
        return {"start_s": t, "launched_s": launched, "total_s": time.perf_counter() - t0, "rc": code}

    def run_pdsh(self, n: int) -> dict:
        started, _ = self.fresh(f"pdsh{n}")
        t0 = time.perf_counter()
        p = popen(["pdsh", "-R", "ssh", "-f", "1024", "-w", ",".join(self.hosts(n)), f"echo started >> {started}"],
                  self.work, self.pdsh_env())
        t = wait_lines(started, n, t0, [p], START_TIMEOUT)
        code = finish([p])[0]
        return {"start_s": t, "total_s": time.perf_counter() - t0, "rc": code}

    def run_ssh(self, n: int) -> dict:
        started, _ = self.fresh(f"ssh{n}")
        t0 = time.perf_counter()
        ps = [popen(["ssh", "-F", str(self.cluster.ssh_config), h, f"echo started >> {started}"], self.work)
              for h in self.hosts(n)]
        t = wait_lines(started, n, t0, ps, START_TIMEOUT)
        codes = finish(ps)
        return {"start_s": t, "total_s": time.perf_counter() - t0, "rc": max((c if c is not None else 999) for c in codes)}

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
    parser.add_argument("--nodes", default="1,2,4,8,16", help="comma-separated node counts (default 1,2,4,8,16)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-extra", action="store_true", help="skip (d) teardown and (e) orphans")
    args = parser.parse_args()
    counts = sorted({int(x) for x in args.nodes.split(",") if x.strip()})
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces)")
    size = max(max(counts), 2)
    result: dict = {"nodes": counts, "repeat": args.repeat, "cluster_nodes": size, "launch": {}, "python": sys.executable,
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    work = Path(tempfile.mkdtemp(prefix="clusterrun-bench-launch-"))
    cluster = SimCluster(size)
    t_start = time.perf_counter()
    try:
        cluster.start()
        result["cluster_start_s"] = time.perf_counter() - t_start
        print(f"cluster of {size} nodes up in {result['cluster_start_s']:.1f} s; work dir {work}", flush=True)
        bench = Bench(cluster, work)
        warm = bench.run_clusterrun(max(counts))  # first run copies files to the nodes: not counted
        print(f"warm-up clusterrun on {max(counts)} nodes: {fmt(warm['start_s'])} s rc={warm['rc']}", flush=True)
        for n in counts:
            rows: dict[str, list[dict]] = {"clusterrun": [], "pdsh": [], "ssh": []}
            for _ in range(args.repeat):  # interleaved, so drift on a shared machine hits all alike
                rows["clusterrun"].append(bench.run_clusterrun(n))
                rows["pdsh"].append(bench.run_pdsh(n))
                rows["ssh"].append(bench.run_ssh(n))
            result["launch"][n] = rows
            print(f"N={n:3d}  launched {fmt(med([r.get('launched_s') for r in rows['clusterrun']]))} s  " + "  ".join(
                f"{k} {fmt(med([r['start_s'] for r in v]))} s" for k, v in rows.items()), flush=True)
        if not args.skip_extra:
            result["teardown"] = bench.teardown()
            print(f"teardown: {fmt(result['teardown'].get('teardown_s'))} s", flush=True)
            result["orphans"] = {"clusterrun": bench.orphans_clusterrun(), "pdsh": bench.orphans_pdsh()}
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)

    # ----------------------------------------------------------------------------------------- report
    base = med([r["start_s"] for r in result["launch"][counts[0]]["clusterrun"]]) if counts[0] == 1 else None
    print()
    print(f"time to every rank started (median of {args.repeat}, seconds; cluster of {size} simulated nodes)")
    print("  launched: every node agent has started torchrun (the fan-out: connect, preflight, copy, start);")
    print("  ranks: every worker process has run its first line (adds torchrun's and the worker's torch import)")
    print(f"{'N':>4} | {'launched':>8} | {'ranks':>6} | {'pdsh':>6} | {'ssh':>6} | {'launched / pdsh':>15} | "
          f"{'cr - cr(N=1)':>12} | {'cr rc':>6}")
    print("-" * 88)
    summary = {}
    for n in counts:
        rows = result["launch"][n]
        cr = med([r["start_s"] for r in rows["clusterrun"]])
        pd = med([r["start_s"] for r in rows["pdsh"]])
        ss = med([r["start_s"] for r in rows["ssh"]])
        added = cr - base if cr is not None and base is not None else None
        ratio = cr / pd if cr is not None and pd else None
        rcs = ",".join(str(r["rc"]) for r in rows["clusterrun"])
        launched = med([r.get("launched_s") for r in rows["clusterrun"]])
        fan = launched / pd if launched is not None and pd else None
        summary[n] = {"clusterrun_s": cr, "launched_s": launched, "pdsh_s": pd, "ssh_s": ss,
                      "clusterrun_added_s": added, "ratio_vs_pdsh": ratio, "launched_vs_pdsh": fan}
        print(f"{n:>4} | {fmt(launched):>8} | {fmt(cr):>6} | {fmt(pd):>6} | {fmt(ss):>6} | {fmt(fan, '14.1f'):>14}x | "
              f"{fmt(added, '+6.2f'):>12} | {rcs:>6}")
    result["summary"] = summary
    if "teardown" in result:
        td = result["teardown"]
        print()
        print(f"(d) teardown, 2 nodes, rank 1 exits 1 after 2 s: last process gone {fmt(td.get('teardown_s'), '.2f')} s "
              f"after the exit; orchestrator rc={td.get('rc')}, total {fmt(td.get('orchestrator_total_s'), '.2f')} s")
    if "orphans" in result:
        print("(e) SIGKILL of the orchestrator, `sleep 60` on 2 nodes, processes alive on the nodes 5 s later:")
        for name, o in result["orphans"].items():
            if "error" in o:
                print(f"    {name:10s} error: {o['error']}")
                continue
            print(f"    {name:10s} {o['alive_after_5s']} of {o['before']} still alive "
                  f"(local children left: {len(o['local_children_left'])}; killed by the bench: "
                  f"{len(o['killed_by_bench'])})")
    save_results(result, "launch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
