"""What reading ssh_config with `ssh -G` costs, and paramiko against OpenSSH's client with ControlMaster.

    sudo python bench/ssh_transport.py [--nodes 8,32,128] [--repeat 3]

One SimCluster of max(--nodes) nodes is started once (needs root, see tests/simcluster.py). For each N:

  resolve   every node's SshTarget resolved from the cluster's ssh_config, one thread per node as a launch's
            fan-out does, fresh caches: as by default where ssh exists (the cluster's file is plain: OpenSSH
            checks it once, clusterrun's reader answers), with `ssh -G` for every target
            (CLUSTERRUN_SSH_CONFIG_READER=openssh: one process per distinct target, at most
            ssh_resolve.MAX_PROCESSES at once) and with clusterrun's own reader alone. Wall time, this process's
            CPU and its children's (the ssh -G processes).
  paramiko  a first launch's connections: one SshTransport per node connected in parallel and `true` run on each
            (targets already resolved). A second launch is a new clusterrun process: it pays the same again.
  openssh   `ssh -F <config> -o ControlMaster=auto -o ControlPath=<dir>/%C -o ControlPersist=120 node true`
            for every node at once: cold (each ssh becomes a master: TCP, key exchange, authentication) and then
            warm, a repeat launch within ControlPersist (each ssh is a mux client through the master's socket).
            CPU: the ssh client processes (waited for) plus the masters (read from /proc before they are ended).

Every figure is CPU on this machine, where the simulated nodes' sshds also run: what matters is the
orchestrator's side (this process, the ssh clients and masters it started), per node. Results are printed
and saved to bench/results/ssh_transport-<timestamp>.json; docs/ssh.md quotes them.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from benchlib import med, save_results  # noqa: E402
from simcluster import SimCluster  # noqa: E402

from clusterrun.inventory.models import HostKeyPolicy, SshSettings  # noqa: E402
from clusterrun.transport import ssh_resolve, ssh_scan  # noqa: E402
from clusterrun.transport.ssh.transport import SshTransport  # noqa: E402
from clusterrun.transport.ssh.target import resolve_target  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def pid_cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


class Measure:
    """Wall time, this process's CPU and its waited-for children's CPU over a block."""

    def __enter__(self) -> Measure:
        self.t0, self.own0, self.kids0 = time.perf_counter(), time.process_time(), children_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t0
        self.own = time.process_time() - self.own0
        self.kids = children_cpu() - self.kids0


def settings(cluster: SimCluster) -> SshSettings:
    return SshSettings(config_file=str(cluster.ssh_config), known_hosts=str(cluster.known_hosts),
                       host_key_policy=HostKeyPolicy.strict)


def resolve_all(cluster: SimCluster, names: list[str], reader: str) -> dict:
    os.environ[ssh_resolve.READER_ENV] = reader  # "" is the default: ssh -G where the files need it
    with ssh_resolve._lock:  # a cold start, as a new clusterrun process has
        ssh_resolve._answers.clear()
        ssh_resolve._baseline.clear()
    with ssh_scan._scans_lock:
        ssh_scan._scans.clear()
    s = settings(cluster)
    with Measure() as m, ThreadPoolExecutor(max_workers=len(names)) as pool:
        targets = list(pool.map(lambda name: resolve_target(name, s), names))
    assert all(t.hostname != t.alias for t in targets), "ssh_config's HostName was not applied"
    return {"wall_s": m.wall, "own_cpu_s": m.own, "children_cpu_s": m.kids}


def paramiko_launch(cluster: SimCluster, names: list[str]) -> dict:
    os.environ[ssh_resolve.READER_ENV] = "openssh"
    s = settings(cluster)
    transports = [SshTransport(name, name, s) for name in names]
    for t in transports:
        _ = t.target  # resolved beforehand: measured above
    try:
        with Measure() as m, ThreadPoolExecutor(max_workers=len(names)) as pool:
            codes = list(pool.map(lambda t: t.run(["true"], timeout=60).exit_code, transports))
    finally:
        for t in transports:
            t.close()
    assert codes == [0] * len(names), codes
    return {"wall_s": m.wall, "own_cpu_s": m.own, "children_cpu_s": m.kids}


def openssh_launch(cluster: SimCluster, names: list[str], control_dir: Path) -> dict:
    argv = ["ssh", "-F", str(cluster.ssh_config), "-o", "ControlMaster=auto", "-o",
            f"ControlPath={control_dir}/%C", "-o", "ControlPersist=120"]
    with Measure() as m:
        procs = [subprocess.Popen([*argv, name, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE) for name in names]
        codes = [p.wait(timeout=120) for p in procs]
    errors = [p.stderr.read().decode() for p in procs if p.returncode]  # type: ignore[union-attr]
    assert codes == [0] * len(names), errors[:3]
    return {"wall_s": m.wall, "own_cpu_s": m.own, "children_cpu_s": m.kids}


def masters(cluster: SimCluster, names: list[str], control_dir: Path) -> list[int]:
    pids = []
    for name in names:
        done = subprocess.run(["ssh", "-F", str(cluster.ssh_config), "-o", f"ControlPath={control_dir}/%C",
                               "-O", "check", name], capture_output=True, text=True, timeout=30, check=False)
        found = re.search(r"pid=(\d+)", done.stderr)
        if found:
            pids.append(int(found.group(1)))
    return pids


def end_masters(cluster: SimCluster, names: list[str], control_dir: Path) -> None:
    for name in names:
        subprocess.run(["ssh", "-F", str(cluster.ssh_config), "-o", f"ControlPath={control_dir}/%C", "-O", "exit",
                        name], capture_output=True, timeout=30, check=False)


def one_round(cluster: SimCluster, n: int) -> dict:
    names = [node.name for node in cluster.nodes[:n]]
    row: dict = {"resolve_default": resolve_all(cluster, names, ""),
                 "resolve_ssh_g": resolve_all(cluster, names, "openssh"),
                 "resolve_builtin": resolve_all(cluster, names, "builtin"),
                 "paramiko": paramiko_launch(cluster, names)}
    control_dir = Path(tempfile.mkdtemp(prefix="crcm-", dir="/tmp"))  # a socket path must stay short
    try:
        row["openssh_cold"] = openssh_launch(cluster, names, control_dir)
        pids = masters(cluster, names, control_dir)
        row["masters"] = len(pids)
        cold_master_cpu = sum(pid_cpu(p) for p in pids)
        row["openssh_warm"] = openssh_launch(cluster, names, control_dir)
        row["openssh_cold"]["masters_cpu_s"] = cold_master_cpu
        row["openssh_warm"]["masters_cpu_s"] = sum(pid_cpu(p) for p in pids) - cold_master_cpu
    finally:
        end_masters(cluster, names, control_dir)
        shutil.rmtree(control_dir, ignore_errors=True)
    return row


def per_node_ms(rows: list[dict], key: str, n: int) -> dict:
    def total(r: dict) -> float:
        return r[key]["own_cpu_s"] + r[key]["children_cpu_s"] + r[key].get("masters_cpu_s", 0.0)

    return {"wall_s": med([r[key]["wall_s"] for r in rows]), "cpu_ms_per_node": (med([total(r) for r in rows]) or 0)
            * 1000 / n, "own_cpu_ms_per_node": (med([r[key]["own_cpu_s"] for r in rows]) or 0) * 1000 / n}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="8,32,128")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    counts = sorted({int(x) for x in args.nodes.split(",") if x.strip()})
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces)")
    result: dict = {"nodes": counts, "repeat": args.repeat, "ssh_g_processes_at_once": ssh_resolve.MAX_PROCESSES,
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "rows": {}, "summary": {}}
    cluster = SimCluster(max(counts))
    try:
        t0 = time.perf_counter()
        cluster.start()
        print(f"cluster of {max(counts)} nodes up in {time.perf_counter() - t0:.1f} s", flush=True)
        one_round(cluster, min(counts))  # warm-up: page cache, the sshds' first forks
        for n in counts:
            rows = [one_round(cluster, n) for _ in range(args.repeat)]
            result["rows"][n] = rows
            summary = {key: per_node_ms(rows, key, n) for key in
                       ("resolve_default", "resolve_ssh_g", "resolve_builtin", "paramiko", "openssh_cold", "openssh_warm")}
            result["summary"][n] = summary
            print(f"\nN={n}")
            for key, s in summary.items():
                print(f"  {key:16s} wall {s['wall_s']:6.3f} s   cpu/node {s['cpu_ms_per_node']:6.2f} ms "
                      f"(in this process {s['own_cpu_ms_per_node']:5.2f} ms)", flush=True)
    finally:
        cluster.stop()
    save_results(result, "ssh_transport")
    return 0


if __name__ == "__main__":
    sys.exit(main())
