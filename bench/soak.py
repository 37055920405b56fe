"""Soak: does `clusterrun up` stay flat over a long run? The orchestrator's RSS and CPU per minute while ranks print.

    sudo python bench/soak.py [--minutes 10] [--nodes 4] [--nproc 2] [--rate 5] [--sample 5] [--keep] [--detach]

With --detach the run is started with `up --detach` and the process sampled is the run's supervisor on node0 (its
pid from runs/<id>/supervisor.json; the simulated nodes' processes are this machine's); its console.log stands for
clusterrun's stdout, and at the end `clusterrun logs` brings the record and every rank log here (as a user would)
before the lines are counted.

One SimCluster of --nodes nodes is started (needs root, see tests/simcluster.py). A worker, soak.py, is written into
the work dir (the nodes share this machine's filesystem): each rank prints --rate numbered lines a second,
`R{rank:04d} L{i:09d} step ... loss ...`, on a fixed schedule (the i-th line at start + i/rate, so a slow moment
is caught up, not lost), for --minutes minutes plus a margin that covers the ranks' start; then it prints
`R{rank:04d} wrote N lines` and exits 0.

`python -m clusterrun up --nproc-per-node P --runs-dir <dir> <inventory of the nodes> soak.py ...` runs it, NOT -q
(relaying the lines to the terminal is part of the orchestrator's work); its stdout and stderr go to files. Every
--sample seconds the bench reads the orchestrator's /proc/<pid>/status and /proc/<pid>/stat: resident memory
(VmRSS), its own CPU seconds (user + system, all its threads), its threads and open descriptors. The clock starts
when every rank's first line has reached clusterrun's stdout (the start of the run, the ready checks and the
launch are not what a soak is about); each of the --minutes minutes from then is reported: RSS at its end and its
peak, CPU seconds spent in it, threads and descriptors at its end. First minute against last minute, with the
ratio last/first, says whether the orchestrator grows or slows as the run goes on. The node agents (each found on
its node by its command line, `... prepare`; they sample the node every second by default) are read at the same
moments: CPU ms per second per agent and the largest RSS, per minute. At the end, each node's series files
(runs/<id>/<node>/metrics*.jsonl) in bytes and the largest as MB per node-hour of the run.

At the end: every worker line must have arrived. Per rank, the lines of runs/<id>/<node>/rank<R>.log and of
clusterrun's stdout (`[node:rank] ` + the line) are parsed: unique numbered lines against what the rank said it
wrote, duplicates, and anything that looks like a piece of a numbered line but is not one whole (broken). And
status.json's `logs.complete`.

Bounded: the ranks' first lines within 180 s, the run's end within 180 s after the sampled minutes; past that the
orchestrator's session (the one the bench started it in) is killed, and whatever of the run is left on the nodes
is killed by PID. The cluster is stopped in `finally`. Results are printed and saved to
bench/results/soak-<timestamp>.json; the work dir is deleted unless --keep or the run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from benchlib import fmt, kill_pids, local_session_left, node_agents, save_results  # noqa: E402
from simcluster import SimCluster  # noqa: E402
from simjobs import clusterrun_env, write_inventory  # noqa: E402

START_TIMEOUT = 180.0  # until every rank's first line reached clusterrun's stdout
END_TIMEOUT = 180.0  # after the sampled minutes, until clusterrun has ended
MARGIN_S = 30.0  # the workers print this much longer than the sampled minutes: the ranks do not start at once
TICKS = os.sysconf("SC_CLK_TCK")

SOAK_PY = """\
import os, sys, time
rank = int(os.environ["RANK"])
rate, seconds = float(sys.argv[1]), float(sys.argv[2])
total = int(rate * seconds)
start = time.monotonic()
for i in range(total):
    ahead = start + i / rate - time.monotonic()
    if ahead > 0:
        time.sleep(ahead)
    print(f"R{rank:04d} L{i:09d} step {i} loss {1.0 / (i + 1):.6f}", flush=True)
print(f"R{rank:04d} wrote {total} lines", flush=True)
"""

RECORD = re.compile(r"R(\d{4}) L(\d{9}) step (\d+) loss \d+\.\d{6}")
WROTE = re.compile(r"R(\d{4}) wrote (\d+) lines")
PIECE = re.compile(r"R\d{4} L\d")  # something of a numbered line
TERMINAL = re.compile(r"\[(node\d+):(\d+)\] (.*)")


# ------------------------------------------------------------------------------------------ the orchestrator

def sample(pid: int) -> dict | None:
    """The process's resident memory (MiB), own CPU seconds, threads and open descriptors now; None once it ended."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, IndexError):
        return None
    values = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if fields[0] == "Z":
        return None
    return {"rss_mib": int(values["VmRSS"].split()[0]) / 1024, "cpu_s": (int(fields[11]) + int(fields[12])) / TICKS,
            "threads": int(values["Threads"]), "fds": fds}


def sample_agents(pids: list[int]) -> dict:
    """The node agents' CPU seconds (summed) and the largest RSS, with how many of them were read."""
    read = [s for s in map(sample, pids) if s is not None]
    return {"agents": len(read), "agents_cpu_s": sum(s["cpu_s"] for s in read),
            "agents_rss_mib": max((s["rss_mib"] for s in read), default=None)}


def series_bytes(run_dir: Path, names: list[str]) -> dict[str, int]:
    """Each node's series files (runs/<id>/<node>/metrics*.jsonl, every attempt's) in bytes."""
    return {name: sum(f.stat().st_size for f in run_dir.rglob(f"{name}/metrics*.jsonl")) for name in names}


def per_minute(samples: list[dict], minutes: int) -> list[dict]:
    """Each minute from the clock's start: RSS at its end and its peak, CPU seconds spent in it, threads and fds."""
    rows = []
    for m in range(minutes):
        inside = [s for s in samples if 60 * m <= s["t"] <= 60 * (m + 1)]
        before = [s for s in samples if s["t"] <= 60 * m]
        if not inside:
            rows.append({"minute": m + 1})
            continue
        first = before[-1] if before else inside[0]
        last = inside[-1]
        span = last["t"] - first["t"]
        rows.append({
            "minute": m + 1,
            "rss_mib": last["rss_mib"],
            "rss_peak_mib": max(s["rss_mib"] for s in inside),
            # CPU seconds per minute, from the samples around the minute (scaled if they do not span all of it)
            "cpu_s_per_min": (last["cpu_s"] - first["cpu_s"]) * 60 / span if span > 0 else None,
            "threads": last["threads"],
            "fds": last["fds"],
            # the node agents' (sampling every second): CPU ms per second per agent, the largest RSS
            "agent_cpu_ms_per_s": (1000 * (last["agents_cpu_s"] - first["agents_cpu_s"]) / span / last["agents"]
                                   if span > 0 and last.get("agents") and last["agents"] == first.get("agents")
                                   else None),
            "agent_rss_mib": last.get("agents_rss_mib"),
        })
    return rows


# ------------------------------------------------------------------------------------------ the lines

def first_lines_seen(stdout: Path, ranks: int) -> bool:
    """Whether every rank's line 0 is on clusterrun's stdout."""
    try:
        text = stdout.read_text(errors="replace")
    except OSError:
        return False
    return len({m.group(1) for m in re.finditer(r"\] R(\d{4}) L000000000 ", text)}) >= ranks


def tally(lines: list[str]) -> dict:
    """Unique numbered lines, duplicates, broken lines and the `wrote N` count in one rank's lines."""
    seen: Counter[int] = Counter()
    broken, wrote = 0, None
    for line in lines:
        record = RECORD.fullmatch(line)
        if record and record.group(2) == f"{int(record.group(3)):09d}":
            seen[int(record.group(3))] += 1
            continue
        said = WROTE.fullmatch(line)
        if said:
            wrote = int(said.group(2))
        elif PIECE.search(line):
            broken += 1
    return {"unique": len(seen), "duplicates": sum(c - 1 for c in seen.values()), "broken": broken, "wrote": wrote,
            "in_range": wrote is not None and all(0 <= i < wrote for i in seen)}


def check_lines(run_dir: Path, stdout: Path, names: list[str], nproc: int) -> dict:
    """Per rank, what the rank logs in runs/ and clusterrun's stdout hold against what the rank wrote."""
    terminal: dict[int, list[str]] = {}
    for line in stdout.read_text(errors="replace").splitlines():
        m = TERMINAL.fullmatch(line)
        if m:
            terminal.setdefault(int(m.group(2)), []).append(m.group(3))
    ranks: dict[int, dict] = {}
    for index, node in enumerate(names):
        for rank in range(index * nproc, (index + 1) * nproc):
            log = run_dir / node / f"rank{rank}.log"
            text = log.read_text(errors="replace") if log.is_file() else ""
            in_log = tally(text.splitlines())
            on_screen = tally(terminal.get(rank, []))
            wrote = in_log["wrote"] if in_log["wrote"] is not None else on_screen["wrote"]
            ranks[rank] = {"node": node, "wrote": wrote, "log": in_log, "terminal": on_screen,
                           "complete": wrote is not None and all(
                               t["unique"] == wrote and not t["duplicates"] and not t["broken"] and t["in_range"]
                               for t in (in_log, on_screen))}
    return {"ranks": ranks, "every_line_arrived": bool(ranks) and all(r["complete"] for r in ranks.values()),
            "lines_written": sum(r["wrote"] or 0 for r in ranks.values()),
            "lines_in_logs": sum(r["log"]["unique"] for r in ranks.values()),
            "lines_on_terminal": sum(r["terminal"]["unique"] for r in ranks.values())}


# ------------------------------------------------------------------------------------------ the run

def kill_session(p: subprocess.Popen) -> None:
    """SIGKILL the session the bench started ``p`` in (its own children only) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=10)


def soak(cluster: SimCluster, work: Path, args: argparse.Namespace) -> dict:
    names = [node.name for node in cluster.nodes[:args.nodes]]
    ranks = args.nodes * args.nproc
    minutes = math.ceil(args.minutes)
    seconds = 60 * args.minutes + MARGIN_S
    (work / "soak.py").write_text(SOAK_PY)
    inv = write_inventory(cluster, work / "cluster.yaml", args.nodes, nproc=args.nproc)
    runs = work / "runs"
    stdout, stderr = work / "stdout", work / "stderr"
    argv = [sys.executable, "-m", "clusterrun", "up", "--nproc-per-node", str(args.nproc), "--runs-dir", str(runs),
            *(["--detach"] if args.detach else []), str(inv), str(work / "soak.py"), str(args.rate), str(seconds)]
    res: dict = {"argv": argv, "nodes": args.nodes, "nproc": args.nproc, "ranks": ranks, "rate_per_rank": args.rate,
                 "minutes": args.minutes, "sample_s": args.sample, "worker_s": seconds}
    # As after `pip install`: clusterrun's modules load from their compiled .pyc files.
    env = {k: v for k, v in clusterrun_env().items() if k != "PYTHONDONTWRITEBYTECODE"}
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        p = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                             start_new_session=True)
    launched = time.monotonic()
    samples: list[dict] = []
    host = None
    if args.detach:  # the run's supervisor on node0 is what runs the soak: sample it, read its console
        if p.wait(timeout=START_TIMEOUT) != 0:
            res["error"] = f"up --detach failed (rc {p.returncode}): {stderr.read_text()[-2000:]}"
            return res
        run_dir = next(d for d in runs.iterdir() if d.is_dir())
        host = json.loads((run_dir / "supervisor.json").read_text())
        stdout = Path(os.path.expanduser(host["record_dir"])) / "console.log"
        res["supervisor"] = host
    try:
        deadline = launched + START_TIMEOUT
        while not first_lines_seen(stdout, ranks):
            if (p.poll() is not None and host is None) or time.monotonic() > deadline:
                res["error"] = f"not every rank printed within {START_TIMEOUT:g}s (clusterrun rc {p.poll()})"
                return res
            time.sleep(0.2)  # poll step of a deadline-bounded wait
        t0 = time.monotonic()
        res["start_s"] = t0 - launched
        agents = node_agents(cluster, names)
        res["agent_pids"] = agents
        print(f"every rank prints, {res['start_s']:.1f}s after the start; sampling {minutes} minute(s) and "
              f"{len(agents)} node agent(s)", flush=True)
        for k in range(int(60 * minutes / args.sample) + 1):
            ahead = t0 + k * args.sample - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            now = sample(host["pid"] if host else p.pid)
            if now is None:
                res["error"] = f"clusterrun ended {time.monotonic() - t0:.0f}s into the soak (rc {p.poll()})"
                break
            samples.append({"t": time.monotonic() - t0, **now, **sample_agents(agents)})
            if k and k % int(60 / args.sample) == 0:
                row = per_minute(samples, round(k * args.sample / 60))[-1]
                print(f"  minute {row['minute']:3d}: rss {fmt(row.get('rss_mib'), '.1f')} MiB, cpu "
                      f"{fmt(row.get('cpu_s_per_min'))} s/min, threads {row.get('threads')}, fds {row.get('fds')}; "
                      f"agents {fmt(row.get('agent_cpu_ms_per_s'))} ms/s, rss {fmt(row.get('agent_rss_mib'), '.1f')}"
                      " MiB", flush=True)
        try:
            res["rc"] = p.wait(timeout=END_TIMEOUT + seconds - (time.monotonic() - t0))
        except subprocess.TimeoutExpired:
            res["error"] = "clusterrun did not end in time: killed"
            kill_session(p)
        if host is not None:
            end = time.monotonic() + END_TIMEOUT + seconds - (time.monotonic() - t0)
            while sample(host["pid"]) is not None and time.monotonic() < end:
                time.sleep(1.0)  # poll step of a deadline-bounded wait: the supervisor ends with the run
            got = subprocess.run([sys.executable, "-m", "clusterrun", "logs", "--runs-dir", str(runs), "last"],
                                 cwd=work, env=env, capture_output=True, timeout=END_TIMEOUT)
            res["rc"] = got.returncode
            stdout = run_dir / "console.log"  # the mirror of the supervisor's console
    finally:
        if p.poll() is None:
            kill_session(p)
        res["rc"] = p.returncode
        res["local_left"] = [args for _, args in local_session_left(p.pid)]
        kill_pids([pid for pid, _ in local_session_left(p.pid)])
        run_dirs = [d for d in runs.iterdir() if d.is_dir()] if runs.is_dir() else []
        if len(run_dirs) == 1:
            res["run_id"] = run_dirs[0].name
            left = cluster.wait_no_processes(run_dirs[0].name, 15)
            res["node_left"] = {k: [c for _, c in v] for k, v in left.items()}
            kill_pids([pid for procs in left.values() for pid, _ in procs])
    res["samples"] = samples
    res["per_minute"] = per_minute(samples, minutes)
    full = [row for row in res["per_minute"] if row.get("cpu_s_per_min") is not None]
    if full:
        first, last = full[0], full[-1]
        res["first_minute"], res["last_minute"] = first, last
        res["ratio_last_first"] = {key: last[key] / first[key] if first.get(key) and last.get(key) else None
                                   for key in ("rss_mib", "cpu_s_per_min", "agent_cpu_ms_per_s", "agent_rss_mib")}
    if len(run_dirs) == 1:
        run_dir = run_dirs[0]
        res["lines"] = check_lines(run_dir, stdout, names, args.nproc)
        res["series_bytes"] = series_bytes(run_dir, names)
        res["series_mb_per_node_hour"] = (max(res["series_bytes"].values(), default=0) / 1e6
                                          / ((60 * args.minutes + res.get("start_s", 0.0)) / 3600))
        with contextlib.suppress(OSError, ValueError):
            status = json.loads((run_dir / "status.json").read_text())
            res["state"] = status.get("state")
            res["logs_complete"] = (status.get("logs") or {}).get("complete")
    res["stderr_tail"] = stderr.read_text(errors="replace").splitlines()[-15:]
    return res


def report(res: dict) -> None:
    print()
    print(f"soak: {res['nodes']} nodes x {res['nproc']} ranks, {res['rate_per_rank']} lines/s per rank, "
          f"{res['minutes']} minute(s); clusterrun rc {res.get('rc')}, state {res.get('state')}")
    if res.get("error"):
        print(f"  error: {res['error']}")
    print(f"{'minute':>6} | {'rss MiB':>8} | {'peak MiB':>8} | {'cpu s/min':>9} | {'threads':>7} | {'fds':>4} | "
          f"{'agent ms/s':>10} | {'agent MiB':>9}")
    print("-" * 84)
    for row in res.get("per_minute", []):
        print(f"{row['minute']:>6} | {fmt(row.get('rss_mib'), '8.1f')} | {fmt(row.get('rss_peak_mib'), '8.1f')} | "
              f"{fmt(row.get('cpu_s_per_min'), '9.2f')} | {row.get('threads', 'n/a'):>7} | {row.get('fds', 'n/a'):>4} | "
              f"{fmt(row.get('agent_cpu_ms_per_s'), '10.2f')} | {fmt(row.get('agent_rss_mib'), '9.1f')}")
    if "first_minute" in res:
        first, last, ratio = res["first_minute"], res["last_minute"], res["ratio_last_first"]
        print(f"first minute ({first['minute']}): rss {first['rss_mib']:.1f} MiB, cpu {first['cpu_s_per_min']:.2f} s/min;"
              f" last minute ({last['minute']}): rss {last['rss_mib']:.1f} MiB, cpu {last['cpu_s_per_min']:.2f} s/min;"
              f" last/first: rss {fmt(ratio['rss_mib'])}, cpu {fmt(ratio['cpu_s_per_min'])}")
        print(f"node agents: first minute {fmt(first.get('agent_cpu_ms_per_s'))} ms/s, rss "
              f"{fmt(first.get('agent_rss_mib'), '.1f')} MiB; last minute {fmt(last.get('agent_cpu_ms_per_s'))} ms/s, "
              f"rss {fmt(last.get('agent_rss_mib'), '.1f')} MiB; last/first: cpu {fmt(ratio['agent_cpu_ms_per_s'])}, "
              f"rss {fmt(ratio['agent_rss_mib'])}")
    if "series_bytes" in res:
        print(f"series: {res['series_bytes']} bytes per node; {fmt(res['series_mb_per_node_hour'])} MB per node-hour")
    lines = res.get("lines")
    if lines:
        bad = {rank: r for rank, r in lines["ranks"].items() if not r["complete"]}
        print(f"lines: {lines['lines_written']} written, {lines['lines_in_logs']} in the rank logs, "
              f"{lines['lines_on_terminal']} on clusterrun's stdout; every line arrived: {lines['every_line_arrived']}"
              f"; status.json logs complete: {res.get('logs_complete')}")
        for rank, r in bad.items():
            print(f"  rank {rank} ({r['node']}): wrote {r['wrote']}, log {r['log']}, terminal {r['terminal']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes to sample (default 10; 2 for a check)")
    parser.add_argument("--nodes", type=int, default=4, help="simulated nodes (default 4)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks per node (default 2)")
    parser.add_argument("--rate", type=float, default=5.0, help="lines a second per rank (default 5)")
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples (default 5)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, stdout, stderr)")
    parser.add_argument("--detach", action="store_true", help="soak a detached run: sample its supervisor on node0")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces)")
    if args.minutes < 1 or args.nodes < 1 or args.nproc < 1 or args.rate <= 0 or not 0 < args.sample <= 60 \
            or 60 % args.sample:
        parser.error("--minutes >= 1, --nodes, --nproc >= 1, --rate > 0, --sample a divisor of 60")
    work = Path(tempfile.mkdtemp(prefix="clusterrun-bench-soak-"))
    cluster = SimCluster(max(args.nodes, 2))
    res: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "python": sys.executable}
    try:
        cluster.start()
        print(f"cluster of {len(cluster.nodes)} nodes up; work dir {work}", flush=True)
        res.update(soak(cluster, work, args))
    finally:
        cluster.stop()
        ok = res.get("rc") == 0 and (res.get("lines") or {}).get("every_line_arrived")
        if args.keep or not ok:
            print(f"the work dir is kept: {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    report(res)
    save_results(res, "soak")
    return 0 if res.get("rc") == 0 and (res.get("lines") or {}).get("every_line_arrived") else 1


if __name__ == "__main__":
    sys.exit(main())
