"""A run on nodes whose host names resolve nowhere (no DNS, /etc/hosts names only localhost): every address
torchrun and its workers use comes from the plan, and c10d's reverse-lookup warning, which every process writes
there, is said once on the terminal while the logs keep each copy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from simcluster import SimCluster
from simjobs import WORKER, assert_nothing_left, reports, run_clusterrun, status, the_run, write_inventory

from clusterrun.facts.torchrun_noise import LOOKUP_NOTE, is_lookup_note

pytestmark = pytest.mark.cluster

WARNING = "The hostname of the client socket cannot be retrieved"

# Inside a node: whether each name resolves, and c10d's own lookup (an IPv4 peer as an IPv4-mapped IPv6
# address, without NI_NUMERICHOST), which fails where no DNS server answers.
LOOKUPS = """
import json, socket, sys
out = {}
for name in sys.argv[2:]:
    try:
        socket.getaddrinfo(name, 22)
        out[name] = "resolves"
    except socket.gaierror as e:
        out[name] = e.errno
try:
    socket.getnameinfo(("::ffff:" + sys.argv[1], 22, 0, 0), 0)
    out["reverse"] = "resolves"
except socket.gaierror as e:
    out["reverse"] = e.errno
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def nameless(cluster_requirements: None) -> Iterator[SimCluster]:
    """Two nodes of their own whose /etc/hosts names localhost only (the shared cluster's names resolve)."""
    with SimCluster(2, names_resolve=False) as cluster:
        yield cluster


def test_node_names_resolve_nowhere(nameless: SimCluster) -> None:
    # The premise of the run below: neither node's name, its own included, resolves on a node, and c10d's
    # reverse lookup of a peer fails (EAI_AGAIN), which is what makes it warn.
    names = [n.name for n in nameless.nodes]
    got = json.loads(nameless.ns_run(0, ["python3", "-c", LOOKUPS, nameless.nodes[1].data_ip, *names]).stdout)
    assert all(got[name] != "resolves" for name in names), got
    assert got["reverse"] == -3, got  # socket.EAI_AGAIN


def test_a_gloo_job_runs_without_names_and_says_the_lookup_warning_once(nameless: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(nameless, tmp_path / "cluster.yaml", 2)
    (tmp_path / "worker.py").write_text(WORKER)
    done = run_clusterrun("up", str(inv), "worker.py", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    got = sorted(reports(done.stdout), key=lambda r: int(r["RANK"]))
    assert [int(r["RANK"]) for r in got] == [0, 1, 2, 3]
    assert {r["host"] for r in got} == {"node0", "node1"}
    assert all(r["sum"] == 10 and r["MASTER_ADDR"] == nameless.nodes[0].data_ip for r in got), got
    assert all(r["GLOO_SOCKET_IFNAME"] == "eth1" for r in got), got

    run = the_run(tmp_path)
    assert status(run)["state"] == "succeeded"
    plan = json.loads((run / "plan.json").read_text())
    for planned, node in zip(plan["nodes"], nameless.nodes, strict=True):
        argv = planned["argv"]
        assert argv[argv.index("--local-addr") + 1] == node.data_ip, argv
        assert argv[argv.index("--master-addr") + 1] == nameless.nodes[0].data_ip, argv

    # Every torchrun and every rank wrote the warning (the logs keep each copy); the terminal says it once.
    logged = [line for node in ("node0", "node1") for log in sorted((run / node).glob("*.log"))
              for line in log.read_text().splitlines() if is_lookup_note(line)]
    assert len(logged) >= 4, logged
    terminal = done.stdout + done.stderr
    assert terminal.count(WARNING) == 1 and terminal.count(LOOKUP_NOTE) == 1, terminal
    assert_nothing_left(nameless, run.name)
