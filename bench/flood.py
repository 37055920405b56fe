"""Log relay under a flood: do `clusterrun up`'s terminal stream and runs/ logs keep every line, against pdsh.

    sudo python bench/flood.py [--nodes 4,16] [--lines 100000] [--nproc 2] [--repeat 1] [--timeout SECONDS]
                               [--up-arg ARG]...

One SimCluster of max(--nodes) nodes is started once (needs root, see tests/simcluster.py). A worker, flood.py,
is written into the work dir (the nodes share this machine's filesystem): each rank (global rank from $RANK)
prints --lines numbered lines of exactly 100 bytes with the newline, f"R{rank:04d} L{i:09d} " padded with 'x'
to 99 characters, as fast as it can through sys.stdout, 40 lines (4000 bytes, whole lines, under PIPE_BUF) per
write + flush, as a chatty training loop with buffered output would; then it exits 0.

For each N, interleaved (clusterrun then pdsh, --repeat times), after one uncounted warm-up of each (10 lines):

  (a) clusterrun: `python -m clusterrun up <inventory of the first N nodes> flood.py --lines L --nproc-per-node P
      --runs-dir <fresh dir> [--up-arg ...]`, NOT -q (the terminal relay is part of what is measured; folding of
      identical lines is on unless `--up-arg=--no-fold`: every line here differs); its stdout goes to a file,
      its stderr to another. Counted: the worker lines on stdout (`[node:rank] ` + the line) and in
      runs/<id>/<node>/rank<R>.log (the line alone).
  (b) pdsh: `pdsh -R ssh -S -f 1024 -w node0,...` (PDSH_SSH_ARGS_APPEND="-F <cluster ssh_config>") running, on
      every node, `python -m torch.distributed.run --nnodes N --nproc-per-node P --node-rank R --master-addr
      <node0's data IP> --master-port <free port> flood.py --lines L` with GLOO_SOCKET_IFNAME=<the node's data
      NIC> and this machine's interpreter (sys.executable). Static rendezvous (torchrun's default backend with
      --master-addr/--master-port). pdsh substitutes nothing per host, so each node looks its rank and data NIC
      up by its own hostname (SimCluster sets each node's hostname to its name) in a rank file the bench writes
      (`node0 0 eth1` ...), and refuses to start (exit 97, on stderr) when its hostname is not in it. Counted:
      the worker lines on pdsh's stdout (`host: ` + the line).

For every run: wall time from Popen to exit (the exit seen through a pidfd, the process then reaped with
os.wait4), exit code, and the rusage wait4 returns: peak RSS (ru_maxrss, KiB on Linux, reported in MiB) and CPU
time (ru_utime + ru_stime) of the orchestrator (clusterrun's or pdsh's process), which include the descendants
it reaped itself (its local ssh clients, if any). Nothing is assumed delivered: every line is parsed. A line
counts as delivered only if it is exactly prefix + one whole record with an in-range rank and line number;
per rank the bench counts unique records, duplicates (a record seen again in the same stream / the same set of
logs), records out of order, records under the wrong [node:rank] / host / rank file, broken lines (anything
else that holds a piece of a record: a partial or cut line, two records glued on one line; whole records found
inside them are reported as `glued`, not as delivered) and other lines (launcher messages and the like).

The table shows, per N: lines expected (N * P * L), delivered to the terminal by clusterrun and by pdsh,
delivered to runs/ by clusterrun, duplicates and broken lines (terminal/runs), wall seconds, delivered lines
per second, the ratio of clusterrun's wall time to pdsh's, and clusterrun's peak RSS and CPU seconds. With
--repeat > 1 the counts are the worst run's (fewest delivered, most duplicates/broken) and the times medians.

Every wait is bounded (--timeout per run; by default 120 s plus 1 s per 5000 lines expected, 760 s for 16 nodes
x 2 ranks x 100000 lines): on timeout the bench SIGKILLs the process group of the process it
started (by its PID), and afterwards kills by PID whatever of a run is left on the nodes (found by the run id
or a marker in the environment) and in the orchestrator's session. The cluster is stopped in `finally`.
Output files are deleted after counting unless --keep. Results are printed and saved to
bench/results/flood-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from benchlib import fmt, kill_pids, local_session_left, med, save_results  # noqa: E402
from simcluster import SimCluster  # noqa: E402
from simjobs import clusterrun_env, write_inventory  # noqa: E402

RUN_TIMEOUT_BASE = 120.0
RUN_TIMEOUT_LINES_PER_S = 5000.0  # the default timeout allows at least this many lines per second
KILL_WAIT = 15.0
NODE_CLEAN_WAIT = 15.0
WARMUP_LINES = 10
LINE_BYTES = 100
RANK_FILE_MISSING = 97

FLOOD_PY = """\
import argparse, os, sys

parser = argparse.ArgumentParser()
parser.add_argument("--lines", type=int, required=True)
args = parser.parse_args()
rank = int(os.environ["RANK"])
out = sys.stdout
CHUNK = 40  # 40 lines of 100 bytes: 4000 bytes per write, whole lines, under PIPE_BUF (4096)
buf = []
for i in range(args.lines):
    buf.append(f"R{rank:04d} L{i:09d} ".ljust(99, "x") + "\\n")
    if len(buf) == CHUNK:
        out.write("".join(buf))
        out.flush()
        buf.clear()
if buf:
    out.write("".join(buf))
out.flush()
sys.exit(0)
"""

# One worker record without its newline: 17 characters of header and 82 x's.
RECORD = rb"R(?P<rank>\d{4}) L(?P<idx>\d{9}) x{82}"
PATTERNS = {
    "clusterrun": re.compile(rb"\[(?P<node>[^\]\s:]+):(?P<prank>\d+)\] " + RECORD),
    "pdsh": re.compile(rb"(?P<node>[^\s:]+): " + RECORD),
    "log": re.compile(RECORD),
}
EMBEDDED = re.compile(RECORD)
FRAGMENT = re.compile(rb"R\d{4} L\d|R\d{4} ?$|x{4}")
SAMPLES = 5


class Tally:
    """What arrived of the N*P*L expected records in one stream (or one set of rank logs)."""

    def __init__(self, nodes: list[str], nproc: int, lines: int) -> None:
        self.nodes = nodes
        self.nproc = nproc
        self.lines = lines
        self.ranks = len(nodes) * nproc
        self.seen = [bytearray(lines) for _ in range(self.ranks)]  # occurrences per record, saturating at 255
        self.last = [-1] * self.ranks
        self.good = 0  # well-formed record lines, duplicates included
        self.duplicates = 0
        self.out_of_order = 0
        self.misattributed = 0
        self.broken = 0
        self.glued = 0
        self.other = 0
        self.partial_tail = 0  # files whose last line had no newline
        self.broken_samples: list[str] = []
        self.other_samples: list[str] = []
        self.bytes = 0

    def _record(self, rank: int, idx: int) -> None:
        count = self.seen[rank][idx]
        if count:
            self.duplicates += 1
        if count < 255:
            self.seen[rank][idx] = count + 1
        if idx < self.last[rank]:
            self.out_of_order += 1
        self.last[rank] = idx
        self.good += 1

    def feed(self, path: Path, kind: str, *, node: str | None = None, file_rank: int | None = None) -> None:
        """Count every line of ``path``; ``kind`` picks the prefix (clusterrun, pdsh or log)."""
        pattern = PATTERNS[kind]
        if not path.is_file():
            return
        with open(path, "rb") as fh:
            for raw in fh:
                self.bytes += len(raw)
                whole = raw.endswith(b"\n")
                line = raw[:-1] if whole else raw
                if not whole:
                    self.partial_tail += 1  # only the last line of a file can lack its newline
                m = pattern.fullmatch(line) if whole else None
                if m is not None:
                    rank, idx = int(m["rank"]), int(m["idx"])
                    if rank < self.ranks and idx < self.lines:
                        self._record(rank, idx)
                        where = m.groupdict()
                        expect_node = self.nodes[rank // self.nproc]
                        if ((where.get("node") is not None and where["node"].decode() != expect_node)
                                or (where.get("prank") is not None and int(where["prank"]) != rank)
                                or (node is not None and node != expect_node)
                                or (file_rank is not None and file_rank != rank)):
                            self.misattributed += 1
                        continue
                if FRAGMENT.search(line):
                    self.broken += 1
                    self.glued += sum(1 for _ in EMBEDDED.finditer(line))
                    if len(self.broken_samples) < SAMPLES:
                        self.broken_samples.append(repr(line[:240]))
                elif line.strip():
                    self.other += 1
                    if len(self.other_samples) < SAMPLES:
                        self.other_samples.append(repr(line[:240]))

    def summary(self) -> dict:
        per_rank = [self.lines - row.count(0) for row in self.seen]
        delivered = sum(per_rank)
        return {
            "expected": self.ranks * self.lines,
            "delivered": delivered,
            "missing": self.ranks * self.lines - delivered,
            "record_lines": self.good,
            "duplicates": self.duplicates,
            "out_of_order": self.out_of_order,
            "misattributed": self.misattributed,
            "broken": self.broken,
            "glued_records": self.glued,
            "other_lines": self.other,
            "partial_tail": self.partial_tail,
            "bytes": self.bytes,
            "per_rank_delivered": per_rank,
            "broken_samples": self.broken_samples,
            "other_samples": self.other_samples,
        }


# ------------------------------------------------------------------------------------------ processes


def start(argv: list[str], cwd: Path, env: dict[str, str], stdout: Path, stderr: Path) -> subprocess.Popen:
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        return subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)






def reap(p: subprocess.Popen, t0: float, timeout: float) -> dict:
    """Wait (bounded) for ``p`` to exit and reap it with os.wait4; kill its process group on timeout."""
    fd = os.pidfd_open(p.pid)
    try:
        timed_out = not select.select([fd], [], [], timeout)[0]
        end = time.perf_counter()
        if timed_out:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # the session the bench started it in: its own children only
            if not select.select([fd], [], [], KILL_WAIT)[0]:
                raise RuntimeError(f"pid {p.pid} still alive {KILL_WAIT} s after SIGKILL")
    finally:
        os.close(fd)
    _, status, ru = os.wait4(p.pid, 0)  # returns at once: the pidfd said it has exited
    p.returncode = os.waitstatus_to_exitcode(status)  # so Popen never waits on a reused PID
    left = local_session_left(p.pid)
    return {
        "rc": None if timed_out else p.returncode,
        "timed_out": timed_out,
        "wall_s": end - t0,
        "maxrss_mib": ru.ru_maxrss / 1024,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "utime_s": ru.ru_utime,
        "stime_s": ru.ru_stime,
        "local_left": [args for _, args in left],
        "local_killed": kill_pids([pid for pid, _ in left]),
    }


def tail(path: Path, n: int = 15) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


class Bench:
    def __init__(self, cluster: SimCluster, work: Path, nproc: int, timeout: float | None, keep: bool,
                 up_args: list[str]) -> None:
        self.cluster = cluster
        self.work = work
        self.nproc = nproc
        self.timeout = timeout
        self.keep = keep
        self.up_args = up_args  # more options for `clusterrun up`
        self.env = clusterrun_env()
        self.counter = 0
        self.inventories: dict[int, Path] = {}
        self.flood = work / "flood.py"
        self.flood.write_text(FLOOD_PY)
        # node name -> node rank and data NIC, looked up by each node under its own hostname (see the docstring)
        self.rank_file = work / "node-ranks.txt"
        self.rank_file.write_text("".join(f"{n.name} {n.index} {n.data_nic}\n" for n in cluster.nodes))

    def run_timeout(self, n: int, lines: int) -> float:
        if self.timeout is not None:
            return self.timeout
        return RUN_TIMEOUT_BASE + n * self.nproc * lines / RUN_TIMEOUT_LINES_PER_S

    def fresh(self, tag: str) -> Path:
        self.counter += 1
        d = self.work / f"{tag}-{self.counter}"
        d.mkdir()
        return d

    def inventory(self, n: int) -> Path:
        if n not in self.inventories:
            self.inventories[n] = write_inventory(self.cluster, self.work / f"inv{n}.yaml", n, nproc=self.nproc)
        return self.inventories[n]

    def names(self, n: int) -> list[str]:
        return [node.name for node in self.cluster.nodes[:n]]

    def clean_nodes(self, marker: str) -> dict:
        """What of a run is left on the nodes after it ended, then killed by PID."""
        left = self.cluster.wait_no_processes(marker, NODE_CLEAN_WAIT)
        killed = kill_pids([pid for procs in left.values() for pid, _ in procs])
        if killed:
            self.cluster.wait_no_processes(marker, NODE_CLEAN_WAIT)
        return {"node_left": {k: [c for _, c in v] for k, v in left.items()}, "node_killed": killed}

    def free_port(self) -> int:
        master = self.cluster.nodes[0]
        for _ in range(100):
            port = 29600 + self.counter % 2000
            self.counter += 1
            if self.cluster.probe_tcp(master, master.data_ip, port, timeout=1.0) == "refused":
                return port
        raise RuntimeError("no free master port on node0")

    # ---------------------------------------------------------------------------------------- runs

    def run_clusterrun(self, n: int, lines: int) -> dict:
        d = self.fresh(f"cr{n}")
        runs = d / "runs"
        runs.mkdir()
        argv = [sys.executable, "-m", "clusterrun", "up", "--nproc-per-node", str(self.nproc), "--runs-dir", str(runs),
                *self.up_args, str(self.inventory(n)), str(self.flood), "--lines", str(lines)]
        t0 = time.perf_counter()
        p = start(argv, self.work, self.env, d / "stdout", d / "stderr")
        res: dict = {"tool": "clusterrun", "nodes": n, "lines": lines, "timeout_s": self.run_timeout(n, lines),
                     "argv": shlex.join(argv)}
        try:
            res.update(reap(p, t0, self.run_timeout(n, lines)))
        finally:
            if p.returncode is None:  # reap() raised: never leave it behind
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            run_dirs = [x for x in runs.iterdir() if x.is_dir()]
            if len(run_dirs) == 1:
                res["run_id"] = run_dirs[0].name
                res.update(self.clean_nodes(run_dirs[0].name))
        names = self.names(n)
        term = Tally(names, self.nproc, lines)
        term.feed(d / "stdout", "clusterrun")
        res["terminal"] = term.summary()
        logs = Tally(names, self.nproc, lines)
        for run_dir in runs.iterdir():
            for log in sorted(run_dir.glob("*/rank*.log")):
                rank = log.stem[4:]
                logs.feed(log, "log", node=log.parent.name, file_rank=int(rank) if rank.isdigit() else None)
        res["logs"] = logs.summary()
        res["stderr_tail"] = tail(d / "stderr")
        if not self.keep:
            shutil.rmtree(d, ignore_errors=True)
        return res

    def run_pdsh(self, n: int, lines: int) -> dict:
        d = self.fresh(f"pdsh{n}")
        master = self.cluster.nodes[0]
        port = self.free_port()
        marker = f"crflood{os.getpid()}x{self.counter}"
        lookup = f"awk -v h=\"$(hostname)\" '$1 == h {{print $2, $3}}' {shlex.quote(str(self.rank_file))}"
        torchrun = shlex.join([sys.executable, "-m", "torch.distributed.run", "--nnodes", str(n),
                               "--nproc-per-node", str(self.nproc), "--master-addr", master.data_ip,
                               "--master-port", str(port)])
        command = (
            f"export CRBENCH_MARK={marker}; set -- $({lookup}); "
            f"if [ -z \"$1\" ] || [ -z \"$2\" ]; then echo \"flood bench: no node rank for $(hostname)\" >&2; "
            f"exit {RANK_FILE_MISSING}; fi; cd {shlex.quote(str(self.work))} && GLOO_SOCKET_IFNAME=\"$2\" "
            f"exec {torchrun} --node-rank \"$1\" {shlex.quote(str(self.flood))} --lines {lines}"
        )
        argv = ["pdsh", "-R", "ssh", "-S", "-f", "1024", "-w", ",".join(self.names(n)), command]
        env = {**os.environ, "PDSH_SSH_ARGS_APPEND": f"-F {self.cluster.ssh_config}"}
        t0 = time.perf_counter()
        p = start(argv, self.work, env, d / "stdout", d / "stderr")
        res: dict = {"tool": "pdsh", "nodes": n, "lines": lines, "timeout_s": self.run_timeout(n, lines),
                     "master_port": port, "command": command}
        try:
            res.update(reap(p, t0, self.run_timeout(n, lines)))
        finally:
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            res.update(self.clean_nodes(marker))
        term = Tally(self.names(n), self.nproc, lines)
        term.feed(d / "stdout", "pdsh")
        res["terminal"] = term.summary()
        res["stderr_tail"] = tail(d / "stderr")
        if not self.keep:
            shutil.rmtree(d, ignore_errors=True)
        return res


# -------------------------------------------------------------------------------------------- report






def worst(rows: list[dict], section: str, key: str, fn=min) -> int | None:
    vals = [r[section][key] for r in rows if section in r]
    return fn(vals) if vals else None


def line_report(tag: str, r: dict) -> str:
    t = r["terminal"]
    text = (f"  {tag:10s} N={r['nodes']:3d} rc={r['rc']} {fmt(r['wall_s'])} s  terminal {t['delivered']}/{t['expected']}"
            f" (dup {t['duplicates']}, broken {t['broken']})")
    if "logs" in r:
        lg = r["logs"]
        text += f"  runs/ {lg['delivered']}/{lg['expected']} (dup {lg['duplicates']}, broken {lg['broken']})"
    return text + f"  rss {fmt(r['maxrss_mib'], '.0f')} MiB cpu {fmt(r['cpu_s'])} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="4,16", help="comma-separated node counts (default 4,16)")
    parser.add_argument("--lines", type=int, default=100_000, help="lines per rank (default 100000)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks per node (default 2)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per run before it is killed (default 120 + expected lines / 5000, per N)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (outputs, runs/) and print its path")
    parser.add_argument("--up-arg", action="append", default=[], metavar="ARG",
                        help="one more option for `clusterrun up` (repeatable), e.g. --up-arg=--no-fold")
    args = parser.parse_args()
    counts = sorted({int(x) for x in args.nodes.split(",") if x.strip()})
    if not counts or counts[0] < 1:
        parser.error("--nodes needs positive node counts")
    if not 1 <= args.lines < 10**9 or args.nproc < 1 or max(counts) * args.nproc > 10**4:
        parser.error("--lines must be 1..999999999 and nodes * nproc at most 10000")
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces)")
    if shutil.which("pdsh") is None:
        parser.error("no pdsh (apt-get install -y pdsh)")
    size = max(counts)
    result: dict = {"nodes": counts, "lines": args.lines, "nproc": args.nproc, "repeat": args.repeat,
                    "up_args": args.up_arg,
                    "line_bytes": LINE_BYTES, "cluster_nodes": size, "python": sys.executable,
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "runs": {}}
    work = Path(tempfile.mkdtemp(prefix="clusterrun-bench-flood-"))
    cluster = SimCluster(size)
    t_start = time.perf_counter()
    try:
        cluster.start()
        result["cluster_start_s"] = time.perf_counter() - t_start
        print(f"cluster of {size} nodes up in {result['cluster_start_s']:.1f} s; work dir {work}", flush=True)
        bench = Bench(cluster, work, args.nproc, args.timeout, args.keep, args.up_arg)
        # The first clusterrun run copies files to the nodes, the first of each warms caches: not counted.
        result["warmup"] = {"clusterrun": bench.run_clusterrun(size, WARMUP_LINES),
                            "pdsh": bench.run_pdsh(size, WARMUP_LINES)}
        for tag, r in result["warmup"].items():
            print(line_report(f"warm {tag}", r), flush=True)
        for n in counts:
            rows: dict[str, list[dict]] = {"clusterrun": [], "pdsh": []}
            for _ in range(args.repeat):  # interleaved, so drift on a shared machine hits both alike
                rows["clusterrun"].append(bench.run_clusterrun(n, args.lines))
                print(line_report("clusterrun", rows["clusterrun"][-1]), flush=True)
                rows["pdsh"].append(bench.run_pdsh(n, args.lines))
                print(line_report("pdsh", rows["pdsh"][-1]), flush=True)
            result["runs"][n] = rows
    finally:
        cluster.stop()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    # ----------------------------------------------------------------------------------------- report
    print()
    print(f"flood: every rank prints {args.lines} lines of {LINE_BYTES} B, {args.nproc} ranks per node "
          f"(cluster of {size} simulated nodes, {args.repeat} run(s) each: counts are the worst run, times medians)")
    print("  term: whole, well-formed lines on the orchestrator's stdout; runs/: in runs/<id>/<node>/rank<R>.log;")
    print("  dup/broken: duplicated records / cut or glued lines (terminal/runs); l/s: delivered terminal lines per s;")
    print("  rss/cpu: clusterrun's peak RSS and user+system CPU (wait4 rusage); pdsh's are in the JSON")
    head = (f"{'N':>3} | {'expected':>9} | {'term cr':>9} | {'term pdsh':>9} | {'runs/ cr':>9} | {'dup cr':>9} | "
            f"{'broken cr':>9} | {'wall cr':>7} | {'wall pdsh':>9} | {'cr/pdsh':>7} | {'l/s cr':>8} | "
            f"{'l/s pdsh':>8} | {'rss MiB':>7} | {'cpu s':>6} | {'rc cr/pdsh':>10}")
    print(head)
    print("-" * len(head))
    summary = {}
    for n in counts:
        cr, pd = result["runs"][n]["clusterrun"], result["runs"][n]["pdsh"]
        expected = n * args.nproc * args.lines
        s = {
            "expected": expected,
            "terminal_clusterrun": worst(cr, "terminal", "delivered"),
            "terminal_pdsh": worst(pd, "terminal", "delivered"),
            "runs_clusterrun": worst(cr, "logs", "delivered"),
            "dup_terminal_clusterrun": worst(cr, "terminal", "duplicates", max),
            "dup_runs_clusterrun": worst(cr, "logs", "duplicates", max),
            "dup_terminal_pdsh": worst(pd, "terminal", "duplicates", max),
            "broken_terminal_clusterrun": worst(cr, "terminal", "broken", max),
            "broken_runs_clusterrun": worst(cr, "logs", "broken", max),
            "broken_terminal_pdsh": worst(pd, "terminal", "broken", max),
            "wall_clusterrun_s": med([r["wall_s"] for r in cr]),
            "wall_pdsh_s": med([r["wall_s"] for r in pd]),
            "lines_per_s_clusterrun": med([r["terminal"]["delivered"] / r["wall_s"] for r in cr]),
            "lines_per_s_pdsh": med([r["terminal"]["delivered"] / r["wall_s"] for r in pd]),
            "maxrss_mib_clusterrun": med([r["maxrss_mib"] for r in cr]),
            "cpu_s_clusterrun": med([r["cpu_s"] for r in cr]),
            "maxrss_mib_pdsh": med([r["maxrss_mib"] for r in pd]),
            "cpu_s_pdsh": med([r["cpu_s"] for r in pd]),
            "rc_clusterrun": [r["rc"] for r in cr],
            "rc_pdsh": [r["rc"] for r in pd],
        }
        wc, wp = s["wall_clusterrun_s"], s["wall_pdsh_s"]
        s["wall_ratio"] = wc / wp if wc is not None and wp else None
        summary[n] = s
        rcs = ",".join(map(str, s["rc_clusterrun"])) + "/" + ",".join(map(str, s["rc_pdsh"]))
        dup = f"{s['dup_terminal_clusterrun']}/{s['dup_runs_clusterrun']}"
        broken = f"{s['broken_terminal_clusterrun']}/{s['broken_runs_clusterrun']}"
        print(f"{n:>3} | {expected:>9} | {s['terminal_clusterrun']!s:>9} | {s['terminal_pdsh']!s:>9} | "
              f"{s['runs_clusterrun']!s:>9} | {dup:>9} | {broken:>9} | {fmt(wc):>7} | "
              f"{fmt(wp):>9} | {fmt(s['wall_ratio']):>6}x | {fmt(s['lines_per_s_clusterrun'], '.0f'):>8} | "
              f"{fmt(s['lines_per_s_pdsh'], '.0f'):>8} | {fmt(s['maxrss_mib_clusterrun'], '.0f'):>7} | "
              f"{fmt(s['cpu_s_clusterrun']):>6} | {rcs:>10}")
    result["summary"] = summary
    for n in counts:
        for tool, rows in result["runs"][n].items():
            for r in rows:
                if r["rc"] != 0 or r["terminal"]["missing"] or r.get("node_left") or r.get("local_left"):
                    print(f"  N={n} {tool}: rc={r['rc']} timed_out={r['timed_out']} missing on terminal "
                          f"{r['terminal']['missing']}, left on nodes {sum(map(len, r.get('node_left', {}).values()))}"
                          f", local {len(r.get('local_left', []))}; stderr tail: {r['stderr_tail'][-3:]}")
    save_results(result, "flood")
    return 0


if __name__ == "__main__":
    sys.exit(main())
