"""A detached run against an attached one: fail-fast, and what its supervisor on rank 0's node costs.

    sudo python bench/detached.py [--nodes 4] [--nproc 2] [--repeat 3] [--idle-seconds 20] [--keep]

One SimCluster of --nodes nodes (needs root, see tests/simcluster.py), used by every run. The job (fail.py, in the
work dir the nodes share) prints a line on every rank, then rank R = nodes*nproc - 3 prints `FAIL <time.time()>`
and exits 7 after 3 s, while every other rank would sleep 300 s.

  fail-fast: the same job, attached (`clusterrun up`) and detached (`clusterrun up --detach`), alternately
      --repeat times each, on the same nodes. Measured from the failing rank's own time stamp (the nodes share
      this machine's clock) to the moment no process of the run is left on any node but the supervisor
      ("every node stopped"), and to the moment the supervisor is gone too (its record written). Goal: detached
      <= attached + 1 s, and <= 3 s.
  supervisor CPU: a detached job that sleeps on --nodes nodes; the supervisor's CPU seconds (/proc/<pid>/stat,
      all its threads) over --idle-seconds seconds once every rank runs, per node per second; and its RSS.

Bounded: each run has a deadline (120 s to the failure, 60 s after it); what is left is killed by PID. Results are
printed and saved to bench/results/detached-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from benchlib import fmt, kill_pids, med, save_results  # noqa: E402
from simcluster import SimCluster  # noqa: E402
from simjobs import clusterrun_env, write_inventory  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
FAIL_PY = """\
import os, sys, time
rank = int(os.environ["RANK"])
print("up", rank, flush=True)
time.sleep(3)
if rank == int(sys.argv[1]):
    print("FAIL %.6f" % time.time(), flush=True)
    sys.exit(7)
time.sleep(300)
"""
SLEEP_PY = "import time\nprint('up', flush=True)\ntime.sleep(300)\n"
FAIL_LINE = re.compile(r"FAIL (\d+\.\d+)")


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _supervisor(runs: Path) -> dict | None:
    for path in runs.glob("*/supervisor.json"):
        return json.loads(path.read_text())
    return None


def one_failure(cluster: SimCluster, work: Path, inv: Path, nproc: int, ranks: int, detach: bool) -> dict:
    runs = work / ("runs-detached" if detach else "runs-attached") / str(time.monotonic_ns())
    argv = [sys.executable, "-m", "clusterrun", "up", "--nproc-per-node", str(nproc), "--runs-dir", str(runs),
            *(["--detach"] if detach else []), str(inv), str(work / "fail.py"), str(ranks - 3)]
    proc = subprocess.Popen(argv, cwd=work, env=clusterrun_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    out: dict = {"detached": detach}
    run_id = None
    failed_at = None
    deadline = time.monotonic() + 120
    try:
        while failed_at is None and time.monotonic() < deadline:
            time.sleep(0.02)  # poll step of a deadline-bounded wait
            for log in runs.glob("*/*/rank*.log") if not detach else []:
                m = FAIL_LINE.search(log.read_text(errors="replace"))
                failed_at = float(m.group(1)) if m else failed_at
            if detach:
                host = _supervisor(runs)
                if host is not None:
                    folder = Path(os.path.expanduser(host["record_dir"]))
                    for log in folder.glob("*/rank*.log"):
                        m = FAIL_LINE.search(log.read_text(errors="replace"))
                        failed_at = float(m.group(1)) if m else failed_at
        run_id = next((d.name for d in runs.iterdir() if d.is_dir()), None) if runs.is_dir() else None
        if failed_at is None or run_id is None:
            out["error"] = "the rank did not fail in time"
            return out
        host = _supervisor(runs)
        sup_pid = host["pid"] if host else None
        stopped = gone = None
        end = time.monotonic() + 60
        while time.monotonic() < end and gone is None:
            left = [pid for procs in cluster.job_processes(run_id).values() for pid, _ in procs if pid != sup_pid]
            now = time.time()
            if not left and stopped is None:
                stopped = now
            if stopped is not None and (sup_pid is None or cpu_seconds(sup_pid) is None) and (
                    detach or proc.poll() is not None):
                gone = now
            time.sleep(0.01)  # poll step of a deadline-bounded wait
        out.update(stopped_s=None if stopped is None else stopped - failed_at,
                   recorded_s=None if gone is None else gone - failed_at)
        return out
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if run_id:
            kill_pids([pid for procs in cluster.wait_no_processes(run_id, 10).values() for pid, _ in procs])


def supervisor_cost(cluster: SimCluster, work: Path, inv: Path, nproc: int, nodes: int, seconds: float) -> dict:
    runs = work / "runs-idle"
    argv = [sys.executable, "-m", "clusterrun", "up", "--detach", "--nproc-per-node", str(nproc), "--runs-dir",
            str(runs), str(inv), str(work / "sleep.py")]
    done = subprocess.run(argv, cwd=work, env=clusterrun_env(), capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    run_id = done.stdout.strip()
    host = _supervisor(runs)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            procs = cluster.job_processes(run_id)
            if sum(1 for v in procs.values() for _, c in v if c.endswith("sleep.py")) >= nodes * nproc:
                break
            time.sleep(0.2)  # poll step of a deadline-bounded wait
        time.sleep(3)  # the start's own work (the first status writes, the warm-up) is not the running cost
        before, t0 = cpu_seconds(host["pid"]), time.monotonic()
        time.sleep(seconds)
        after, t1 = cpu_seconds(host["pid"]), time.monotonic()
        used = (after or 0) - (before or 0)
        return {"cpu_ms_per_s": 1000 * used / (t1 - t0), "cpu_ms_per_node_per_s": 1000 * used / (t1 - t0) / nodes,
                "rss_mib": rss_mib(host["pid"]), "seconds": t1 - t0}
    finally:
        subprocess.run([sys.executable, "-m", "clusterrun", "down", "--runs-dir", str(runs), run_id], cwd=work,
                       env=clusterrun_env(), capture_output=True, timeout=180)
        kill_pids([pid for procs in cluster.wait_no_processes(run_id, 10).values() for pid, _ in procs])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces)")
    work = Path(tempfile.mkdtemp(prefix="clusterrun-bench-detached-"))
    (work / "fail.py").write_text(FAIL_PY)
    (work / "sleep.py").write_text(SLEEP_PY)
    cluster = SimCluster(args.nodes)
    res: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "nodes": args.nodes, "nproc": args.nproc}
    try:
        cluster.start()
        inv = write_inventory(cluster, work / "cluster.yaml", args.nodes, nproc=args.nproc)
        runs: list[dict] = []
        for i in range(args.repeat):
            for detach in (False, True):
                got = one_failure(cluster, work, inv, args.nproc, args.nodes * args.nproc, detach)
                runs.append(got)
                print(f"  {i}: {'detached' if detach else 'attached'}: every node stopped "
                      f"{fmt(got.get('stopped_s'))} s after the failure, recorded {fmt(got.get('recorded_s'))} s"
                      + (f" ({got['error']})" if got.get("error") else ""), flush=True)
        res["failures"] = runs
        for kind in ("attached", "detached"):
            mine = [r for r in runs if r["detached"] == (kind == "detached")]
            res[kind] = {"stopped_s": med([r.get("stopped_s") for r in mine]),
                         "recorded_s": med([r.get("recorded_s") for r in mine])}
        res["supervisor"] = supervisor_cost(cluster, work, inv, args.nproc, args.nodes, args.idle_seconds)
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    a, d = res.get("attached", {}), res.get("detached", {})
    print(f"\n{args.nodes} nodes x {args.nproc} ranks, median of {args.repeat}:")
    print(f"  every node stopped after a rank's failure: attached {fmt(a.get('stopped_s'))} s, detached "
          f"{fmt(d.get('stopped_s'))} s (detached - attached {fmt((d.get('stopped_s') or 0) - (a.get('stopped_s') or 0))} s)")
    print(f"  the end recorded: attached {fmt(a.get('recorded_s'))} s, detached {fmt(d.get('recorded_s'))} s")
    sup = res.get("supervisor", {})
    print(f"  the supervisor while the job sleeps: {fmt(sup.get('cpu_ms_per_s'))} ms of CPU per second, "
          f"{fmt(sup.get('cpu_ms_per_node_per_s'))} ms per node per second, RSS {fmt(sup.get('rss_mib'), '.1f')} MiB")
    save_results(res, "detached")
    return 0


if __name__ == "__main__":
    sys.exit(main())
