"""Launch time of `clusterrun up` through srun against through SSH, on the same nodes of the Slurm test bed.

    sudo python bench/srun_launch.py [--nodes 4] [--nproc 2] [--repeat 5]

One SimCluster with the Slurm test bed on it (tests/slurmbed.py: needs root, slurm-wlm and munge) and one
``salloc --no-shell`` allocation of every node; sshd runs on every node too. Each repeat runs, in alternating
order:

  (a) srun: `clusterrun up --slurm --nproc-per-node P first.py` inside the allocation (SLURM_JOB_ID set: srun);
  (b) ssh:  the same with `--transport ssh --ssh-config <the cluster's ssh_config>`.

first.py prints one line per rank and exits. The measures are the wall times from clusterrun's start to the end of
its checks (its `run <id>: ... logs in` line: the part the transport carries), to the last rank's first line
(read as it comes), and to clusterrun's exit. Also, as a floor, one trivial command on every node at once:
N parallel `srun --overlap -N1 true` steps against N parallel `ssh node true`.
Medians are printed and saved to bench/results/srun_launch-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from benchlib import fmt, med, save_results  # noqa: E402
from simcluster import SimCluster  # noqa: E402
from simjobs import clusterrun_env  # noqa: E402
from slurmbed import SlurmBed  # noqa: E402

RUN_TIMEOUT = 120.0
FIRST_PY = """\
import os
print("first line of rank", os.environ["RANK"], flush=True)
"""


def time_up(argv: list[str], env: dict[str, str], cwd: Path,
            ranks: int) -> tuple[float | None, float | None, float | None]:
    """Seconds until the checks were done, until ``ranks`` first lines were printed and until clusterrun exited
    (None: not seen, or it failed)."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    seen, buf, first, checked = 0, b"", None, None
    deadline = started + RUN_TIMEOUT
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            *lines, buf = (buf + chunk).split(b"\n")
            seen += sum(b"first line of rank" in line for line in lines)
            if checked is None and any(b" logs in " in line for line in lines):
                checked = time.monotonic() - started
            if first is None and seen >= ranks:
                first = time.monotonic() - started
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return checked, first, (time.monotonic() - started if proc.returncode == 0 else None)


def time_parallel(argvs: list[list[str]], env: dict[str, str]) -> float | None:
    """Seconds until every command of ``argvs``, started at once, exited 0 (None if one failed)."""
    started = time.monotonic()
    procs = [subprocess.Popen(a, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for a in argvs]
    codes = [p.wait(timeout=RUN_TIMEOUT) for p in procs]
    return time.monotonic() - started if not any(codes) else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    ranks = args.nodes * args.nproc
    times: dict[str, list[float | None]] = {f"{kind}_{what}": [] for kind in ("srun", "ssh")
                                            for what in ("checked", "first", "exit", "true")}
    with SimCluster(args.nodes) as cluster, SlurmBed(cluster) as bed, \
            tempfile.TemporaryDirectory(prefix="srun-launch-") as tmp:
        cwd = Path(tmp)
        (cwd / "first.py").write_text(FIRST_PY)
        allocation = bed.allocate(args.nodes)
        env = bed.env({**clusterrun_env(), **allocation})
        up = [sys.executable, "-m", "clusterrun", "up", "--slurm", "--nproc-per-node", str(args.nproc),
              "--python", sys.executable, "--runs-dir", str(cwd / "runs")]
        kinds = {"srun": [*up, "first.py"],
                 "ssh": [*up, "--transport", "ssh", "--ssh-config", str(cluster.ssh_config), "first.py"]}
        floors = {"srun": [["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={n}", "--quiet", "true"]
                           for n in bed.node_names],
                  "ssh": [cluster.ssh_argv(n, "true") for n in bed.node_names]}
        try:
            for i in range(args.repeat):
                for kind in (("srun", "ssh") if i % 2 == 0 else ("ssh", "srun")):
                    checked, first, done = time_up(kinds[kind], env, cwd, ranks)
                    times[f"{kind}_checked"].append(checked)
                    times[f"{kind}_first"].append(first)
                    times[f"{kind}_exit"].append(done)
                    times[f"{kind}_true"].append(time_parallel(floors[kind], env))
                    print(f"repeat {i + 1} {kind:4}: checks done {fmt(checked)} s, every rank's first line "
                          f"{fmt(first)} s, clusterrun done "
                          f"{fmt(done)} s, `true` on every node {fmt(times[f'{kind}_true'][-1], '.3f')} s", flush=True)
        finally:
            bed.cancel(allocation["SLURM_JOB_ID"])
    medians = {k: med(v) for k, v in times.items()}
    print(f"\n{args.nodes} nodes x {args.nproc} ranks, median of {args.repeat}:")
    print(f"{'':6} {'checks':>8} {'first lines':>12} {'exit':>8} {'true/node':>10}")
    for kind in ("srun", "ssh"):
        print(f"{kind:6} {fmt(medians[f'{kind}_checked']):>8} {fmt(medians[f'{kind}_first']):>12} "
              f"{fmt(medians[f'{kind}_exit']):>8} {fmt(medians[f'{kind}_true'], '.3f'):>10}")
    save_results({"nodes": args.nodes, "nproc_per_node": args.nproc, "repeat": args.repeat, "runs": times,
                  "median": medians}, "srun_launch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
