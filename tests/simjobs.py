"""Helpers to run `clusterrun` against the simulated cluster: inventories, runs, their output, their processes."""

from __future__ import annotations

import json
import os
import re
import select
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

from loadscale import scaled
from procs import marked_processes
from simcluster import SimCluster

ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT = 180

#: The SSH connect bound of a test inventory. Every simulated node's sshd shares this machine's CPU with the
#: orchestrator and with whatever else runs here: on a loaded 2-core machine a handshake can take several
#: seconds, and a tight bound fails healthy nodes. Tests about connect timeouts set theirs explicitly
#: (``connect_timeout=``, or ``node_connect_timeout=`` for the one node that is meant not to answer).
CONNECT_TIMEOUT = float(os.environ.get("CLUSTERRUN_TEST_CONNECT_TIMEOUT", "20"))

#: A torch.distributed job that reports its environment (``REPORT {json}``, see :func:`reports`) and all-reduces
#: enough bytes that the NIC which carried them shows it.
WORKER = """
import json, os, torch, torch.distributed as dist
dist.init_process_group("gloo")
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
big = torch.ones(4 * 1024 * 1024)
for _ in range(8):  # enough bytes that the NIC that carried them shows it
    dist.all_reduce(big)
print("REPORT " + json.dumps({**{k: os.environ.get(k) for k in keys}, "sum": total.item(),
                              "big": big[0].item(), "host": os.uname().nodename}), flush=True)
dist.destroy_process_group()
"""


def write_inventory(cluster: SimCluster, path: Path, nodes: int, *, nproc: int = 2, python: str | None = None,
                    connect_timeout: float = CONNECT_TIMEOUT, node_connect_timeout: Mapping[str, float] | None = None,
                    data: str | None = None) -> Path:
    """An inventory of the first ``nodes`` simulated nodes: SSH over the management network, data NIC eth1.

    ``connect_timeout`` is every node's SSH connect bound; ``node_connect_timeout`` sets some nodes' own.
    """
    node_connect_timeout = node_connect_timeout or {}
    lines = [
        "version: 1",
        "defaults:",
        f"  ssh: {{config_file: {cluster.ssh_config}, known_hosts: {cluster.known_hosts},",
        f"        host_key_policy: strict, connect_timeout: {connect_timeout}}}",
        # The nodes share this machine's filesystem: its interpreter has torch (a node's PATH python does not).
        f"  python: {python or sys.executable}",
        f"  nproc_per_node: {nproc}",
        f"network: {{data: '{data or cluster.data_subnet}'}}",
        "nodes:",
    ]
    for node in cluster.nodes[:nodes]:
        lines += [
            f"  - name: {node.name}",
            f"    host: {node.name}",
            *([f"    ssh: {{connect_timeout: {node_connect_timeout[node.name]}}}"]
              if node.name in node_connect_timeout else []),
            "    nics:",
            f"      - {{name: {node.mgmt_nic}, ip: {node.mgmt_ip}/24, speed: {cluster.mgmt_rate}}}",
            f"      - {{name: {node.data_nic}, ip: {node.data_ip}/24, speed: {cluster.data_rate}}}",
        ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def clusterrun_env() -> dict[str, str]:
    """This checkout's package first, whatever else is installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_clusterrun(*args: str, cwd: Path, timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clusterrun", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=scaled(timeout), stdin=subprocess.DEVNULL, env=clusterrun_env(), check=False)


def start_clusterrun(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "clusterrun", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=clusterrun_env())


def the_run(cwd: Path) -> Path:
    runs = [p for p in (cwd / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def status(run: Path) -> dict:
    return json.loads((run / "status.json").read_text())


def reports(stdout: str) -> list[dict]:
    """The ``REPORT {json}`` lines of :data:`WORKER` in ``stdout``, decoded."""
    return [json.loads(line.split("REPORT ", 1)[1]) for line in stdout.splitlines() if "REPORT " in line]


def nic_bytes(cluster: SimCluster, node: str, nic: str) -> int:
    """How many bytes ``nic`` of ``node`` has sent so far."""
    out = cluster.ns_run(node, ["cat", f"/sys/class/net/{nic}/statistics/tx_bytes"]).stdout
    return int(out.strip())


def wait_until(condition: Callable[[], object], timeout: float, what: str, *, step: float = 0.05) -> None:
    """Check ``condition`` until it holds; raises AssertionError saying ``what`` was awaited after ``timeout``
    (scaled with the machine's load, tests/loadscale.py)."""
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(step)  # poll step of a deadline-bounded wait


def wait_for_lines(proc: subprocess.Popen[str], count: int, needle: str, timeout: float = 90.0) -> None:
    """Read ``proc``'s stdout until ``count`` lines hold ``needle``; the deadline holds even when nothing comes.

    Reads the pipe itself (not through the text wrapper, whose buffer select cannot see); what it read is
    not seen by a later ``communicate()``.
    """
    assert proc.stdout is not None
    seen, buf = 0, b""
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    while seen < count and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        *lines, buf = (buf + chunk).split(b"\n")
        seen += sum(ranks_of(line.decode(errors="replace")) for line in lines if needle.encode() in line)
    assert seen == count, f"saw {seen} of {count} '{needle}' lines"


def ranks_of(line: str) -> int:
    """How many ranks' copies a terminal line stands for: one, or those of a folded line's prefix
    (``[node[0-1]:0-1] ...``: the same line from ranks 0 and 1, shown once)."""
    if not line.startswith("[") or "] " not in line:
        return 1
    prefix = line[1:line.index("] ")]
    ranks = prefix.rsplit(":", 1)[1] if ":" in prefix else ""
    if not ranks or not all(c.isdigit() or c in ",-" for c in ranks):
        return 1
    return sum(int(b) - int(a) + 1 if "-" in part else 1
               for part in ranks.split(",") for a, _, b in [part.partition("-")])


#: A line of up's terminal: ``[where:ranks] text``, or ``[where] text`` for torchrun's own lines (``where`` a node or
#: a hostlist of nodes, ``ranks`` the global ranks as ranges). A long list is shortened with a count:
#: ``[w[0,2,…](64 nodes):0,2,…(256 ranks)]``.
LABELLED = re.compile(r"^\[(?P<where>.*?)(?::(?P<ranks>[\d,-]+?)(?:,…\((?P<count>\d+) ranks\))?)?\] (?P<text>.*)$")
#: The text of a note on later copies of a folded line (docs/up.md "Identical lines folded").
NOTE = re.compile(r'^\(the line "(?P<text>.*)" also came from (?:these \d+ ranks|this rank), up to [\d.]+ s after '
                  r"\[.*\]; not shown again\)$")


class Shown(NamedTuple):
    """A rank line of up's terminal: the nodes and ranks named (``count`` ranks; ``ranks`` lists fewer when the
    prefix was shortened), the line (the line quoted, for a note on later copies), whether a note."""

    where: str
    ranks: list[int]
    count: int
    text: str
    note: bool


def rank_set(ranks: str) -> list[int]:
    """The ranks of a prefix's rank ranges: ``0-2,5`` is [0, 1, 2, 5]."""
    out: list[int] = []
    for part in ranks.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def shown_lines(terminal: list[str]) -> list[Shown]:
    """The rank lines of ``terminal``, in order; torchrun's own lines are left out. Every line must have a prefix."""
    out = []
    for line in terminal:
        m = LABELLED.match(line)
        assert m, line
        if m["ranks"] is not None:
            note = NOTE.match(m["text"])
            ranks = rank_set(m["ranks"])
            out.append(Shown(m["where"], ranks, int(m["count"] or len(ranks)), note["text"] if note else m["text"],
                             bool(note)))
    return out


def labelled(terminal: list[str]) -> list[tuple[list[int], str, bool]]:
    """The rank lines shown: the ranks named, the line (the line quoted, for a note on later copies), whether a
    note. torchrun's own lines are left out."""
    return [(shown.ranks, shown.text, shown.note) for shown in shown_lines(terminal)]


def assert_nothing_left(cluster: SimCluster, run_id: str, timeout: float = 10.0) -> None:
    """No process of run ``run_id`` is left on any node within ``timeout`` seconds."""
    left = cluster.wait_no_processes(run_id, timeout)
    assert not left, f"processes of run {run_id} left behind: {left}"


def agent_of(run_id: str, node: str) -> int:
    """The node agent of ``node``: the parent of that node's torchrun (the agent itself carries no marker)."""
    for pid, cmd in marked_processes(run_id):
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"CLUSTERRUN_NODE={node}".encode() in environ and "torch.distributed.run" in cmd:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")
            assert argv[1:3] == [b"-S", b"-c"] and b"'agent'" in argv[3] and argv[4] == b"prepare", argv[4:]
            return ppid
    raise AssertionError(f"no torchrun of {node} in run {run_id}")


def fault_mid_run(cwd: Path, script: str, needle: str, fault: Callable[[Path], object]) -> tuple[Path, int, str]:
    """Start `up` on cluster.yaml, wait until both ranks printed ``needle``, apply ``fault`` to the run directory,
    and let clusterrun finish (killed after 90 s). Returns the run directory, clusterrun's exit code and stderr."""
    proc = start_clusterrun("up", str(cwd / "cluster.yaml"), script, cwd=cwd)
    try:
        wait_for_lines(proc, 2, needle)
        run = the_run(cwd)
        fault(run)
        _out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return run, proc.returncode, err


def connecting_to(pid: int, address: str, port: int = 22) -> bool:
    """Whether process ``pid`` has a TCP connection to ``address:port`` that the other end has not answered yet
    (SYN sent): it is waiting on that connect."""
    # /proc prints each address as the 32-bit word it is in memory, in hex, then the port: 0100A8C0:0016.
    wanted = f"{struct.unpack('=I', socket.inet_aton(address))[0]:08X}:{port:04X}"
    try:
        sockets = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        table = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:  # the process ended, or closed a descriptor while it was read
        return False
    for row in table:
        fields = row.split()
        if fields[2] == wanted and fields[3] == "02" and f"socket:[{fields[9]}]" in sockets:  # 02: SYN_SENT
            return True
    return False


def sshd_connections(cluster: SimCluster, node: str) -> list[str]:
    """The TCP connections the node's sshd still holds (``ss`` lines; TIME-WAIT, which holds nothing, left out)."""
    out = cluster.ns_run(node, ["ss", "-Htn", "state", "connected", "sport = :22"]).stdout
    return [line for line in out.splitlines() if line.strip() and not line.startswith("TIME-WAIT")]
