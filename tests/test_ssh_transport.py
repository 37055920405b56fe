"""The SSH transport against the simulated cluster's real sshd: commands, timeouts, host keys, ProxyJump,
ProxyCommand, and known_hosts files as OpenSSH users keep them."""

from __future__ import annotations

import base64
import logging
import os
import time
from pathlib import Path

import pytest
from loadscale import scaled
from simcluster import SimCluster
from simjobs import CONNECT_TIMEOUT, run_clusterrun, write_inventory

from clusterrun.errors import CommandTimeout, ConnectError, HostKeyError
from clusterrun.inventory.models import HostKeyPolicy, SshSettings
from clusterrun.transport.ssh.known_hosts import fingerprint
from clusterrun.transport.ssh.transport import SshTransport

pytestmark = pytest.mark.cluster


def settings(cluster: SimCluster, **kw: object) -> SshSettings:
    base: dict[str, object] = {"config_file": str(cluster.ssh_config), "known_hosts": str(cluster.known_hosts),
                               "host_key_policy": HostKeyPolicy.strict, "connect_timeout": CONNECT_TIMEOUT}
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


OTHER_ED25519 = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


def test_host_key_policies(sim_cluster: SimCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    empty = tmp_path / "known_hosts"
    ip = sim_cluster.nodes[0].mgmt_ip
    with pytest.raises(HostKeyError, match=r"not in .* host_key_policy is strict.*ssh-keyscan"):
        SshTransport("node0", "node0", settings(sim_cluster, known_hosts=str(empty))).connect()
    accept_new = settings(sim_cluster, known_hosts=str(empty), host_key_policy=HostKeyPolicy.accept_new)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):  # the second connection finds the key: nothing added, nothing said
            with SshTransport("node0", "node0", accept_new) as t:
                assert t.run(["true"]).ok
    kind, data = sim_cluster.host_key_line.split()
    assert [r.getMessage() for r in caplog.records] == [
        f"node0: added the host key of {ip} ({kind} {fingerprint(base64.b64decode(data))}) to {empty} "
        "(host_key_policy accept-new)"]
    recorded = empty.read_text()
    assert recorded.split() == [ip, *sim_cluster.host_key_line.split()]


def test_changed_host_key_is_refused_naming_node_file_line_and_fix(sim_cluster: SimCluster, tmp_path: Path) -> None:
    ip = sim_cluster.nodes[0].mgmt_ip
    known = tmp_path / "known_hosts"
    known.write_text(f"# reinstalled last week?\nnode9 {sim_cluster.host_key_line}\n{ip} ssh-ed25519 {OTHER_ED25519}\n")
    for policy in (HostKeyPolicy.accept_new, HostKeyPolicy.strict):
        with pytest.raises(HostKeyError) as refused:
            SshTransport("node0", "node0", settings(sim_cluster, known_hosts=str(known),
                                                      host_key_policy=policy)).connect()
        message = str(refused.value)
        assert message.startswith(f"node0: the host key of {ip} CHANGED: {known}:3 holds ssh-ed25519 SHA256:")
        assert f"`ssh-keygen -R '{ip}' -f {known}`" in message
    assert len(known.read_text().splitlines()) == 3  # nothing was added or rewritten


def test_changed_host_key_with_policy_off_warns_and_connects(sim_cluster: SimCluster, tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"{sim_cluster.nodes[0].mgmt_ip} ssh-ed25519 {OTHER_ED25519}\n")
    with caplog.at_level(logging.WARNING), SshTransport(
            "node0", "node0", settings(sim_cluster, known_hosts=str(known), host_key_policy=HostKeyPolicy.off)) as t:
        assert t.run(["true"]).ok
    assert len(caplog.records) == 1
    assert f"CHANGED: {known}:1" in caplog.text and "connecting anyway because host_key_policy is off" in caplog.text


def test_malformed_known_hosts_lines_do_not_break_connections(sim_cluster: SimCluster, tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    known = tmp_path / "known_hosts"
    good = sim_cluster.known_hosts.read_text()
    known.write_text("gpu77 ssh-ed25519 AAAAC3Nza%%broken\n" + good + "@bogus x y z\ntruncated-line\n")
    with caplog.at_level(logging.WARNING):
        for name in ("node0", "node1"):
            with SshTransport(name, name, settings(sim_cluster, known_hosts=str(known))) as t:
                assert t.run(["hostname"]).stdout.strip() == name
    lines = len(good.splitlines())
    assert [r.getMessage().split(": skipped")[0] for r in caplog.records] == [
        f"{known}:1", f"{known}:{lines + 2}", f"{known}:{lines + 3}"]


def test_clusterrun_exec_with_a_broken_known_hosts_line_warns_once_for_all_nodes(
        sim_cluster: SimCluster, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(sim_cluster.known_hosts.read_text() + "gpu77 ssh-rsa not-base64!\n")
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4)
    inv.write_text(inv.read_text().replace(f"known_hosts: {sim_cluster.known_hosts}", f"known_hosts: {known}"))
    done = run_clusterrun("exec", str(inv), "--", "true", cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(f"{known}:5: skipped a malformed known_hosts line") == 1, done.stderr
    assert "clusterrun: warning: " in done.stderr
    assert "Traceback" not in done.stderr


def _proxy_config(sim_cluster: SimCluster, tmp_path: Path, proxy: str) -> Path:
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host viaproxy\n"
        f"    HostName {sim_cluster.nodes[1].mgmt_ip}\n"
        "    User nobody\n"  # the inventory's user wins, in %r too
        f"    IdentityFile {sim_cluster.identity_file}\n"
        f"    ProxyCommand {proxy}\n"
        f"Host *\n    Include {sim_cluster.ssh_config}\n"
    )
    return config


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def test_proxycommand_is_used_with_tokens_and_ended_on_close(sim_cluster: SimCluster, tmp_path: Path) -> None:
    n0, n1 = sim_cluster.nodes[:2]
    log = tmp_path / "proxy.log"
    marker = tmp_path / "ssh-w.log"  # a name only this test's ProxyCommand has on its command line
    # A hop through node0 with OpenSSH's `ssh -W`, logging what it was asked for first.
    config = _proxy_config(sim_cluster, tmp_path,
                           f"sh -c 'echo \"%r@%h:%p\" >> {log}; exec ssh -F {sim_cluster.ssh_config} -E {marker} -W %h:%p node0'")
    with SshTransport("node1", "viaproxy", settings(sim_cluster, config_file=str(config), user="root")) as t:
        came_from = t.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout.split()[0]
        assert t.run(["hostname"]).stdout.strip() == "node1"  # one ProxyCommand, reused
        assert t.peer_address() is None
        assert _processes_mentioning(str(marker))  # the ProxyCommand runs while connected
    assert came_from == n0.mgmt_ip  # node1 saw the connection come from node0, not from here
    assert log.read_text() == f"root@{n1.mgmt_ip}:22\n"
    assert _processes_mentioning(str(marker)) == []  # ended with the connection


def test_proxycommand_none_in_the_inventory_connects_directly(sim_cluster: SimCluster, tmp_path: Path) -> None:
    config = _proxy_config(sim_cluster, tmp_path, "false")
    with SshTransport("node1", "viaproxy", settings(sim_cluster, config_file=str(config), user="root",
                                                    jump_host="none")) as t:
        assert t.run(["hostname"]).stdout.strip() == "node1"
        assert t.peer_address() == sim_cluster.nodes[1].mgmt_ip


def test_jump_host_uri_form_and_a_first_hop_behind_a_proxycommand(sim_cluster: SimCluster, tmp_path: Path) -> None:
    n0, n2 = sim_cluster.nodes[0], sim_cluster.nodes[2]
    with SshTransport("node1", "node1", settings(sim_cluster, jump_host="ssh://root@node2:22")) as t:
        assert t.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout.split()[0] == n2.mgmt_ip
    # The first hop is reached as ssh_config says: here through a ProxyCommand hop via node0.
    config = tmp_path / "ssh_config"
    config.write_text(f"Host hop2\n    HostName {n2.mgmt_ip}\n    User root\n"
                      f"    IdentityFile {sim_cluster.identity_file}\n"
                      f"    ProxyCommand ssh -F {sim_cluster.ssh_config} -W %h:%p node0\n"
                      f"Host *\n    Include {sim_cluster.ssh_config}\n")
    with SshTransport("node1", "node1", settings(sim_cluster, config_file=str(config), jump_host="hop2")) as t:
        assert t.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout.split()[0] == n2.mgmt_ip
        hop = t.target.jump
        assert hop is not None and hop.proxy_command and f"-W {n2.mgmt_ip}:22 node0" in hop.proxy_command
        # node2's sshd holds the hop's connection, and it came from node0.
        peers = sim_cluster.ns_run("node2", ["ss", "-Htn", "state", "established", "( sport = :22 )"]).stdout
        assert f"{n0.mgmt_ip}:" in peers


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


def _cipher(transport: SshTransport) -> str:
    client = transport._client  # the negotiated cipher is only on paramiko's transport
    assert client is not None
    return str(client.get_transport().remote_cipher)


def test_an_aead_cipher_is_preferred_and_a_server_without_one_still_connects(sim_cluster: SimCluster,
                                                                           tmp_path: Path) -> None:
    with SshTransport("node1", "node1", settings(sim_cluster)) as t:
        assert t.run(["true"]).ok
        assert _cipher(t).endswith("-gcm@openssh.com")  # no MAC to compute per packet
    # A second sshd on node1 that offers only aes128-ctr: the usual ciphers are still offered after GCM.
    node = sim_cluster.node("node1")
    config = (sim_cluster.workdir / "node1" / "sshd_config").read_text().splitlines()
    config = [line for line in config if not line.startswith("ListenAddress")]
    config += [f"ListenAddress {node.mgmt_ip}:2222", "Ciphers aes128-ctr"]
    (tmp_path / "sshd_config").write_text("\n".join(config) + "\n")
    sshd = sim_cluster.ns_popen(node, ["/usr/sbin/sshd", "-D", "-f", str(tmp_path / "sshd_config"),
                                       "-E", str(tmp_path / "sshd.log")], start_new_session=True)
    try:
        for _ in range(100):  # sshd binds within moments of its start
            if sim_cluster.probe_tcp(node, node.mgmt_ip, 2222) == "open":
                break
            time.sleep(0.05)
        with SshTransport("node1", node.mgmt_ip,
                          settings(sim_cluster, port=2222, host_key_policy=HostKeyPolicy.off,
                                   identity_file=str(sim_cluster.identity_file))) as t:
            assert t.run(["true"]).ok
            assert _cipher(t) == "aes128-ctr"
    finally:
        sshd.kill()
        sshd.wait(timeout=scaled(10))
