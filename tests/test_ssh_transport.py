"""The SSH transport against the simulated cluster's real sshd: commands, timeouts, host keys, ProxyJump."""

from __future__ import annotations

from pathlib import Path

import pytest
from simcluster import SimCluster

from clusterrun.errors import CommandTimeout, ConnectError, HostKeyError
from clusterrun.inventory.models import HostKeyPolicy, SshSettings
from clusterrun.transport.ssh import SshTransport

pytestmark = pytest.mark.cluster


def settings(cluster: SimCluster, **kw: object) -> SshSettings:
    base: dict[str, object] = {"config_file": str(cluster.ssh_config), "known_hosts": str(cluster.known_hosts),
                               "host_key_policy": HostKeyPolicy.strict, "connect_timeout": 3.0}
    base.update(kw)
    return SshSettings(**base)  # type: ignore[arg-type]


def test_run_env_cwd_stdin_and_exit_code(sim_cluster: SimCluster) -> None:
    with SshTransport("node1", "node1", settings(sim_cluster)) as t:
        done = t.run(["sh", "-c", 'echo "$A $(pwd) $(hostname)"; cat; exit 3'], env={"A": "x y"}, cwd="/tmp",
                     stdin=b"from stdin")
        assert done.exit_code == 3
        assert done.stdout == "x y /tmp node1\nfrom stdin"
        with pytest.raises(CommandTimeout, match=r"node1: .* did not finish within 0.5s"):
            t.run(["sleep", "5"], timeout=0.5)
        assert t.run(["true"]).ok  # the connection survives a timed-out command


def test_host_key_policies(sim_cluster: SimCluster, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    with pytest.raises(HostKeyError, match=r"not in .* host_key_policy is strict.*ssh-keyscan"):
        SshTransport("node0", "node0", settings(sim_cluster, known_hosts=str(empty))).connect()
    with SshTransport("node0", "node0", settings(sim_cluster, known_hosts=str(empty),
                                                   host_key_policy=HostKeyPolicy.accept_new)) as t:
        assert t.run(["true"]).ok
    recorded = empty.read_text()
    assert sim_cluster.nodes[0].mgmt_ip in recorded
    # The same name with another key: a changed host key is always an error, whatever the policy.
    name, kind, _ = recorded.split()
    other = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    empty.write_text(f"{name} ssh-ed25519 {other}\n")
    with pytest.raises(HostKeyError, match=r"CHANGED.*ssh-keygen -R"):
        SshTransport("node0", "node0", settings(sim_cluster, known_hosts=str(empty),
                                                  host_key_policy=HostKeyPolicy.accept_new)).connect()
    assert kind


def test_two_hop_proxy_jump(sim_cluster: SimCluster) -> None:
    n0, n1, n2 = sim_cluster.nodes[:3]
    with SshTransport("node1", "node1", settings(sim_cluster, jump_host="node0,node2")) as t:
        client_ip = t.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout.split()[0]
        assert t.target.describe().endswith(f"via root@{n2.mgmt_ip}:22 via root@{n0.mgmt_ip}:22")
    assert client_ip == n2.mgmt_ip  # node1 saw the connection come from the last hop
    assert n1.name == "node1"


def test_refused_and_timeout_messages(sim_cluster: SimCluster) -> None:
    sim_cluster.stop_sshd("node3")
    with pytest.raises(ConnectError, match=r"node3: connection refused by root@.*sshd is not running"):
        SshTransport("node3", "node3", settings(sim_cluster)).connect()
    sim_cluster.start_sshd("node3")
    sim_cluster.partition("node3")
    with pytest.raises(ConnectError, match=r"node3: root@.* did not answer within 1s"):
        SshTransport("node3", "node3", settings(sim_cluster, connect_timeout=1.0)).connect()
