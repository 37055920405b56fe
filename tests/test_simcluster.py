"""The simulated cluster itself: ssh, both networks, shaping, every fault and its undo, and a clean teardown.

Everything is real (namespaces, veths, tbf, iptables, one sshd per node); reachability is checked with
one TCP connect from inside a node (:meth:`SimCluster.probe_tcp`), never with timings.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from loadscale import scaled
from simcluster import MAX_NODES, SimCluster, SimNode, _machine_lock, sweep_stale_clusters

pytestmark = pytest.mark.cluster

TESTS_DIR = Path(__file__).resolve().parent
# Short: on a veth an open port answers in well under a millisecond; a dropped one never answers.
PROBE_S = 0.3
SSH_TIMEOUT_S = 20


def ssh(cluster: SimCluster, host: str, command: str) -> subprocess.CompletedProcess[str]:
    """The plain OpenSSH client with the harness config, the way other tests and users connect."""
    return subprocess.run(
        ["ssh", "-F", str(cluster.ssh_config), host, command],
        capture_output=True,
        text=True,
        timeout=SSH_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def root_connects(address: str, port: int = 22) -> bool:
    """One TCP connect from the root namespace (the orchestrator's side)."""
    try:
        with socket.create_connection((address, port), timeout=PROBE_S):
            return True
    except OSError:
        return False


def reach(cluster: SimCluster, src: SimNode, dst: SimNode) -> dict[str, str]:
    return {
        "mgmt": cluster.probe_tcp(src, dst.mgmt_ip, timeout=PROBE_S),
        "data": cluster.probe_tcp(src, dst.data_ip, timeout=PROBE_S),
    }


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The next stdout line of ``proc``, or fail after ``timeout`` seconds."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"no output from {proc.args!r} within {timeout}s")
    return proc.stdout.readline().strip()


def wait_for_jobs(
    cluster: SimCluster, marker: str, count: int, timeout: float = 10
) -> dict[str, list[tuple[int, str]]]:
    """job_processes(marker) once ``count`` processes carry it, each exec'd into ``sleep`` (a job started
    in the background may still be a forked shell when ssh returns); fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = cluster.job_processes(marker)
        jobs = [cmd for procs in found.values() for _, cmd in procs]
        if len(jobs) == count and all(cmd.startswith("sleep") for cmd in jobs):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"expected {count} sleeps carrying {marker} within {timeout}s, found {found}")
        time.sleep(0.05)  # poll step of a deadline-bounded wait


def test_ssh_reaches_every_node_under_its_own_hostname(sim_cluster: SimCluster) -> None:
    for node in sim_cluster.nodes:
        mgmt = ssh(sim_cluster, node.name, "hostname; echo $SSH_CONNECTION")
        assert mgmt.returncode == 0, mgmt.stderr
        hostname, connection = mgmt.stdout.split("\n")[:2]
        assert hostname == node.name
        assert connection.split()[2] == node.mgmt_ip  # server address of the session
        data = ssh(sim_cluster, f"{node.name}-data", "hostname; echo $SSH_CONNECTION")
        assert data.returncode == 0, data.stderr
        assert data.stdout.split("\n")[:1] == [node.name]
        assert data.stdout.split("\n")[1].split()[2] == node.data_ip
    assert socket.gethostname() not in {node.name for node in sim_cluster.nodes}  # host's name untouched


def test_nodes_run_the_test_interpreter_with_torch_and_clusterrun(sim_cluster: SimCluster) -> None:
    code = "import clusterrun, torch; print(clusterrun.__file__)"
    proc = ssh(sim_cluster, "node0", f"{sys.executable} -c '{code}'")
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).resolve() == (TESTS_DIR.parent / "clusterrun" / "__init__.py")


def test_nodes_resolve_each_other_and_never_wait_on_dns(sim_cluster: SimCluster) -> None:
    proc = ssh(sim_cluster, "node2", "getent hosts node0 node1-data; cat /etc/resolv.conf")
    assert proc.returncode == 0, proc.stderr
    n0, n1 = sim_cluster.nodes[0], sim_cluster.nodes[1]
    assert f"{n0.mgmt_ip}" in proc.stdout and "node0" in proc.stdout
    assert f"{n1.data_ip}" in proc.stdout and "node1-data" in proc.stdout
    assert "nameserver 127.0.0.1" in proc.stdout


def test_every_node_reaches_every_other_on_both_networks(sim_cluster: SimCluster) -> None:
    for src in sim_cluster.nodes:
        for dst in sim_cluster.nodes:
            if dst is not src:
                assert reach(sim_cluster, src, dst) == {"mgmt": "open", "data": "open"}, (src.name, dst.name)
    for node in sim_cluster.nodes:
        assert root_connects(node.mgmt_ip) and root_connects(node.data_ip)


def test_the_machine_wide_neighbour_table_holds_all_pairs_of_the_largest_cluster(sim_cluster: SimCluster) -> None:
    # Past gc_thresh3 new ARP entries fail and packets to new peers are dropped: a port would look firewalled.
    limit = int(Path("/proc/sys/net/ipv4/neigh/default/gc_thresh3").read_text())
    assert limit >= 2 * MAX_NODES * MAX_NODES


def test_data_traffic_leaves_through_the_data_nic(sim_cluster: SimCluster) -> None:
    n0, n1 = sim_cluster.nodes[:2]
    data_route = sim_cluster.ns_run(n0, ["ip", "-o", "route", "get", n1.data_ip]).stdout
    mgmt_route = sim_cluster.ns_run(n0, ["ip", "-o", "route", "get", n1.mgmt_ip]).stdout
    assert f"dev {n0.data_nic} " in data_route and f"src {n0.data_ip}" in data_route
    assert f"dev {n0.mgmt_nic} " in mgmt_route and f"src {n0.mgmt_ip}" in mgmt_route


def test_links_are_shaped_with_tbf_at_the_configured_rates(sim_cluster: SimCluster) -> None:
    for node in sim_cluster.nodes:
        qdiscs = sim_cluster.ns_run(node, ["tc", "qdisc", "show"]).stdout
        lines = {line.split(" dev ")[1].split()[0]: line for line in qdiscs.splitlines() if " root " in line}
        assert "tbf" in lines[node.mgmt_nic] and "rate 200Mbit" in lines[node.mgmt_nic], qdiscs
        assert "tbf" in lines[node.data_nic] and "rate 2Gbit" in lines[node.data_nic], qdiscs


def test_shape_changes_the_rate_and_reset_restores_it(sim_cluster: SimCluster) -> None:
    node = sim_cluster.nodes[0]
    sim_cluster.shape(node, "data", "500mbit")
    assert "rate 500Mbit" in sim_cluster.ns_run(node, ["tc", "qdisc", "show", "dev", node.data_nic]).stdout
    sim_cluster.reset()
    assert "rate 2Gbit" in sim_cluster.ns_run(node, ["tc", "qdisc", "show", "dev", node.data_nic]).stdout


def test_drop_nic_on_data_cuts_data_only_and_keeps_the_link_up(sim_cluster: SimCluster) -> None:
    n0, n1 = sim_cluster.nodes[:2]
    sim_cluster.drop_nic(n1, "data")
    assert reach(sim_cluster, n0, n1) == {"mgmt": "open", "data": "timeout"}  # hangs, not refused
    assert reach(sim_cluster, n1, n0) == {"mgmt": "open", "data": "timeout"}
    assert ssh(sim_cluster, n1.name, "true").returncode == 0
    link = sim_cluster.ns_run(n1, ["ip", "-o", "link", "show", "dev", n1.data_nic]).stdout
    assert "LOWER_UP" in link and "state UP" in link  # a dead switch port, not a down link

    sim_cluster.restore_nic(n1, "data")
    assert reach(sim_cluster, n0, n1) == {"mgmt": "open", "data": "open"}
    assert reach(sim_cluster, n1, n0) == {"mgmt": "open", "data": "open"}


def test_drop_nic_on_mgmt_leaves_ssh_over_the_data_alias(sim_cluster: SimCluster) -> None:
    n0, n2 = sim_cluster.nodes[0], sim_cluster.nodes[2]
    sim_cluster.drop_nic(n2, "mgmt")
    assert reach(sim_cluster, n0, n2) == {"mgmt": "timeout", "data": "open"}
    assert not root_connects(n2.mgmt_ip)
    assert ssh(sim_cluster, f"{n2.name}-data", "hostname").stdout.strip() == n2.name
    sim_cluster.restore_nic(n2, "mgmt")
    assert root_connects(n2.mgmt_ip)


def test_partition_isolates_a_node_until_healed(sim_cluster: SimCluster) -> None:
    n0, n1, n2 = sim_cluster.nodes[:3]
    sim_cluster.partition(n2)
    assert reach(sim_cluster, n0, n2) == {"mgmt": "timeout", "data": "timeout"}
    assert reach(sim_cluster, n2, n1) == {"mgmt": "timeout", "data": "timeout"}
    assert not root_connects(n2.mgmt_ip) and not root_connects(n2.data_ip)
    assert reach(sim_cluster, n0, n1) == {"mgmt": "open", "data": "open"}  # the others are unaffected
    assert sim_cluster.probe_tcp(n2, "127.0.0.1", timeout=PROBE_S) == "refused"  # lo still works

    sim_cluster.heal(n2)
    assert reach(sim_cluster, n0, n2) == {"mgmt": "open", "data": "open"}
    assert ssh(sim_cluster, n2.name, "hostname").stdout.strip() == n2.name


def test_stop_sshd_refuses_new_connections_but_keeps_open_sessions(sim_cluster: SimCluster) -> None:
    n0, n1 = sim_cluster.nodes[:2]
    session = subprocess.Popen(
        sim_cluster.ssh_argv(n1, "echo ready; read line; echo got $line"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert read_line(session, SSH_TIMEOUT_S) == "ready"
        sim_cluster.stop_sshd(n1)
        assert reach(sim_cluster, n0, n1) == {"mgmt": "refused", "data": "refused"}
        assert ssh(sim_cluster, n1.name, "true").returncode == 255
        assert sim_cluster.processes(n1, include_sshd_listener=True)  # the session's sshd lives on

        out, _ = session.communicate("hello\n", timeout=SSH_TIMEOUT_S)
        assert out.strip() == "got hello"
        assert session.returncode == 0
    finally:
        if session.poll() is None:
            session.kill()
            session.wait(timeout=scaled(5))

    sim_cluster.start_sshd(n1)
    assert ssh(sim_cluster, n1.name, "hostname").stdout.strip() == n1.name


def test_block_port_drops_remote_connects_but_not_the_nodes_own(sim_cluster: SimCluster) -> None:
    n0, n1 = sim_cluster.nodes[:2]
    sim_cluster.block_port(n0, 22)
    assert reach(sim_cluster, n1, n0) == {"mgmt": "timeout", "data": "timeout"}
    assert sim_cluster.probe_tcp(n0, n0.mgmt_ip, timeout=PROBE_S) == "open"
    assert reach(sim_cluster, n0, n1) == {"mgmt": "open", "data": "open"}  # outgoing untouched
    sim_cluster.unblock_port(n0, 22)
    assert reach(sim_cluster, n1, n0) == {"mgmt": "open", "data": "open"}


def test_process_helpers_see_a_remote_job_until_it_is_gone(sim_cluster: SimCluster) -> None:
    node = sim_cluster.nodes[2]
    marker = f"SIMCLUSTER_TEST_{uuid.uuid4().hex}"
    # ends on its own if the test dies before killing it
    proc = ssh(sim_cluster, node.name, f"{marker}=1 sleep 60 </dev/null >/dev/null 2>&1 & echo $!")
    assert proc.returncode == 0, proc.stderr
    remote_pid = int(proc.stdout.strip())  # no PID namespace: the same PID from here

    found = wait_for_jobs(sim_cluster, marker, 1)  # the marker is in the job's environment
    assert list(found) == [node.name]
    assert [pid for pid, _ in found[node.name]] == [remote_pid]
    assert remote_pid in [pid for pid, _ in sim_cluster.processes(node)]
    listener = [cmd for _, cmd in sim_cluster.processes(node, include_sshd_listener=True) if "[listener]" in cmd]
    assert len(listener) == 1 and not any("[listener]" in cmd for _, cmd in sim_cluster.processes(node))
    assert sim_cluster.wait_no_processes(marker, timeout=0.2) == found  # bounded: returns what is left

    os.kill(remote_pid, signal.SIGKILL)  # we started it; by PID
    assert sim_cluster.wait_no_processes(marker, timeout=5) == {}


def test_reset_kills_what_a_test_left_on_the_nodes(sim_cluster: SimCluster) -> None:
    marker = f"SIMCLUSTER_TEST_{uuid.uuid4().hex}"
    for node in sim_cluster.nodes:
        proc = ssh(sim_cluster, node.name, f"{marker}=1 sleep 60 </dev/null >/dev/null 2>&1 &")
        assert proc.returncode == 0, proc.stderr
    sim_cluster.stop_sshd(sim_cluster.nodes[1])
    assert sorted(wait_for_jobs(sim_cluster, marker, len(sim_cluster.nodes))) == [node.name for node in sim_cluster.nodes]

    killed = sim_cluster.reset()
    assert len([line for line in killed if "sleep 60" in line]) == len(sim_cluster.nodes)
    assert sim_cluster.job_processes(marker) == {}
    assert ssh(sim_cluster, "node1", "hostname").stdout.strip() == "node1"  # listener restarted


# ------------------------------------------------------------------------------------------- teardown


def system_state(prefix: str) -> dict[str, list[str]]:
    """Everything on this machine named for a cluster prefix, found without the harness's help."""

    def run(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout

    return {
        "netns": [line for line in run("ip", "netns", "list").splitlines() if line.startswith(prefix)],
        "links": [line for line in run("ip", "-o", "link", "show").splitlines() if f": {prefix}" in line],
        "iptables": [line for line in run("iptables", "-w", "-S").splitlines() if f"simcluster-{prefix}" in line],
        "processes": [
            line for line in run("ps", "-eo", "pid,stat,args").splitlines() if f"simcluster-{prefix}" in line
        ],
        "workdirs": [str(path) for path in Path("/tmp").glob(f"simcluster-{prefix}-*")],
    }


def is_running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (orphans are reaped by PID 1 in its own time)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def blackhole_ok() -> bool:
    """Our blackhole route exists exactly while some 198.18.0.0/15 address is up in this namespace."""
    addrs = ["ip", "-4", "-o", "addr", "show", "to", "198.18.0.0/15"]
    route = ["ip", "route", "show", "exact", "198.18.0.0/15", "proto", "198"]
    with _machine_lock():  # clusters of other test runs change both under this lock
        up, ours = (subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout for argv in (addrs, route))
    return bool(up.strip()) == bool(ours.strip())


@pytest.mark.usefixtures("cluster_requirements")
def test_stop_leaves_nothing_behind() -> None:
    cluster = SimCluster(1, mgmt_rate="100mbit", data_rate="1gbit")
    with cluster:
        node = cluster.nodes[0]
        state = system_state(cluster.prefix)
        assert len(state["netns"]) == 1 and len(state["links"]) == 4 and len(state["iptables"]) == 4
        listener = cluster.processes(node, include_sshd_listener=True)[0][0]
        background = cluster.ns_popen(node, ["sleep", "60"])
        remote = ssh(cluster, node.name, "sleep 60 </dev/null >/dev/null 2>&1 & echo $!")
        remote_pid = int(remote.stdout.strip())
        session = subprocess.Popen(cluster.ssh_argv(node, "sleep 60"), stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + SSH_TIMEOUT_S
        while len(cluster.processes(node)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)  # poll step of a deadline-bounded wait for the session to open
        assert blackhole_ok()
    try:
        assert background.wait(timeout=scaled(5)) != 0  # killed with the node
        assert session.wait(timeout=scaled(10)) != 0  # its server side is gone
    finally:
        for proc in (background, session):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=scaled(5))
    assert system_state(cluster.prefix) == {"netns": [], "links": [], "iptables": [], "processes": [], "workdirs": []}
    assert not is_running(listener) and not is_running(remote_pid)
    assert cluster.leftovers() == []
    assert blackhole_ok()
    assert not Path(f"/run/clusterrun-simcluster/{cluster.prefix}").exists()


OWNER_SCRIPT = """
import subprocess, sys, time
sys.path.insert(0, {tests!r})
from simcluster import SimCluster
with SimCluster(1) as cluster:
    # a node process of the owner's (not holding the owner's pipes, so this test sees it end)
    cluster.ns_popen(0, ["sleep", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(cluster.prefix, flush=True)
    if sys.argv[1] == "raise":
        raise AssertionError("a failing test")
    time.sleep(60)
"""


@pytest.mark.usefixtures("cluster_requirements")
@pytest.mark.parametrize("how", ["raise", "sigint", "sigkill"])
def test_nothing_is_left_when_the_owner_fails_is_interrupted_or_killed(how: str) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT.format(tests=str(TESTS_DIR)), how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        prefix = read_line(owner, 30)
        assert prefix.startswith("crs"), owner.stderr
        if how == "sigint":
            owner.send_signal(signal.SIGINT)
        elif how == "sigkill":
            owner.kill()
        _, err = owner.communicate(timeout=scaled(30))
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(timeout=scaled(5))
    if how == "raise":
        assert "AssertionError: a failing test" in err
    elif how == "sigint":
        assert "KeyboardInterrupt" in err
    else:
        assert system_state(prefix)["netns"]  # SIGKILL: no stop() ran...
        # ...the next cluster to start cleans up, or this call (another test run may have been first)
        assert prefix in sweep_stale_clusters() or not system_state(prefix)["netns"]
    assert system_state(prefix) == {"netns": [], "links": [], "iptables": [], "processes": [], "workdirs": []}
    assert blackhole_ok()
