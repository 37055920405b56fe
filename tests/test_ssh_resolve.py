"""ssh_config read by OpenSSH's ``ssh -G``: what the config set is applied, clusterrun's defaults stay where it
set nothing, ``ssh -G`` runs once per distinct target and not at all where no file can set anything clusterrun
uses, and OpenSSH's refusal names the node, file and line.

``ssh`` is the real client; where a test must see how often it ran, PATH puts a recording script in front that
hands every call to it.
"""

from __future__ import annotations

import pwd
import shutil
from pathlib import Path

import pytest
from simcluster import SimCluster
from simjobs import CONNECT_TIMEOUT

from clusterrun.errors import UsageError
from clusterrun.inventory.models import HostKeyPolicy, SshSettings
from clusterrun.transport.ssh import resolve as ssh_resolve
from clusterrun.transport.ssh.resolve import DEFAULT_CONNECT_TIMEOUT
from clusterrun.transport.ssh.target import resolve_target
from clusterrun.transport.ssh.transport import SshTransport

SSH = shutil.which("ssh")
pytestmark = pytest.mark.skipif(SSH is None, reason="the OpenSSH client is not installed")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME and the password database's home in tmp_path; the reader as in real use (``ssh`` on PATH: ssh -G
    where a file needs it)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("USER", "me")
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: pwd.struct_passwd(("me", "x", uid, 0, "", str(tmp_path), "")))
    monkeypatch.delenv(ssh_resolve.READER_ENV, raising=False)
    return tmp_path


@pytest.fixture
def always(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ssh -G`` for every target, plain files too."""
    monkeypatch.setenv(ssh_resolve.READER_ENV, "openssh")


@pytest.fixture
def ssh_calls(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A log with one line per ``ssh`` run (its arguments): a script first on PATH records, then runs ssh."""
    bin_dir, log = home / "bin", home / "ssh-calls.log"
    bin_dir.mkdir()
    log.write_text("")
    script = bin_dir / "ssh"
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {SSH} "$@"\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(str(SSH)).parent}:/usr/bin:/bin")
    return log


def calls(log: Path, host: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.endswith(f"-- {host}")]


def test_what_the_config_sets_applies_and_clusterruns_defaults_stay_elsewhere(home: Path, always: None) -> None:
    key = home / "gpu_key"
    key.write_text("")
    config = home / "cfg"
    config.write_text(f"Host gpu1\n    HostName 10.0.0.1\n    User ops\n    Port 2200\n    IdentityFile {key}\n"
                      "    StrictHostKeyChecking yes\n    ConnectTimeout 7\n    HashKnownHosts yes\n"
                      f"    UserKnownHostsFile {home}/kh\n    GlobalKnownHostsFile none\n"
                      "Host *\n    SendEnv LANG\n")
    t = resolve_target("gpu1", SshSettings(config_file=str(config)))
    assert (t.hostname, t.user, t.port, t.identity_files) == ("10.0.0.1", "ops", 2200, (str(key),))
    assert (t.policy, t.connect_timeout, t.hash_known_hosts) == (HostKeyPolicy.strict, 7.0, True)
    assert (t.known_hosts, t.global_known_hosts) == ((f"{home}/kh",), ())
    # Nothing set for this host: not OpenSSH's defaults (ask, no timeout) but clusterrun's.
    other = resolve_target("web1", SshSettings(config_file=str(config)))
    assert (other.hostname, other.user, other.port, other.identity_files) == ("web1", "me", 22, ())
    assert (other.policy, other.connect_timeout, other.hash_known_hosts) == (
        HostKeyPolicy.accept_new, DEFAULT_CONNECT_TIMEOUT, False)
    assert other.known_hosts == (str(home / ".ssh/known_hosts"), str(home / ".ssh/known_hosts2"))


def test_the_inventorys_user_and_port_are_ssh_command_line_options(home: Path, always: None) -> None:
    config = home / "cfg"
    config.write_text("Match user alice\n    HostName alice-gw\nHost *\n    User cfg\n    Port 2200\n"
                      "    ProxyCommand nc %h %p %r\n")
    t = resolve_target("gpu1", SshSettings(config_file=str(config), user="alice", port=2222))
    assert (t.hostname, t.user, t.port) == ("alice-gw", "alice", 2222)
    assert t.proxy_command == "nc alice-gw 2222 alice"
    assert t.proxy_origin == f"ProxyCommand at {config}:6"  # ssh -G prints no origin: found in the file


def test_a_catch_all_proxyjump_reaching_the_jump_host_is_openssh_s_jumphost_loop(home: Path, always: None) -> None:
    config = home / "cfg"
    config.write_text("Host *\n    ProxyJump bastion\n")
    with pytest.raises(UsageError, match=r"^bastion: OpenSSH refuses .*jumphost loop via bastion"):
        resolve_target("gpu1", SshSettings(config_file=str(config)))
    config.write_text("Host bastion\n    ProxyJump none\nHost *\n    ProxyJump bastion\n")
    t = resolve_target("gpu1", SshSettings(config_file=str(config)))
    assert t.jump is not None and (t.jump.alias, t.jump.jump) == ("bastion", None)
    assert t.proxy_origin == f"ProxyJump at {config}:4"


def test_ssh_dash_g_runs_once_per_distinct_target(home: Path, always: None, ssh_calls: Path) -> None:
    config = home / "cfg"
    config.write_text("Host gpu*\n    ProxyJump ops@bastion\nHost bastion\n    HostName 10.0.0.9\n")
    settings = SshSettings(config_file=str(config))
    for host in ("gpu1", "gpu2", "gpu1"):
        assert resolve_target(host, settings).jump is not None
    assert (len(calls(ssh_calls, "gpu1")), len(calls(ssh_calls, "gpu2")), len(calls(ssh_calls, "bastion"))) == (
        1, 1, 1)  # the jump host every node shares asked once
    config.write_text(config.read_text() + "Host *\n    Port 2200\n")  # an edited file is read again
    assert resolve_target("gpu1", settings).port == 2200
    assert len(calls(ssh_calls, "gpu1")) == 2


def test_no_ssh_dash_g_where_no_file_sets_what_clusterrun_uses(home: Path, ssh_calls: Path) -> None:
    config = home / "cfg"
    config.write_text("Host *\n    SendEnv LANG LC_*\n    GSSAPIAuthentication yes\n")
    t = resolve_target("gpu1", SshSettings(config_file=str(config)))
    assert (t.hostname, t.port, t.policy) == ("gpu1", 22, HostKeyPolicy.accept_new)
    assert ssh_calls.read_text() == ""
    # An Include is followed whatever block it is in, and what it sets makes OpenSSH's reading needed (here
    # a plain file: OpenSSH checks each file once, clusterrun's reader answers).
    (home / "inc.conf").write_text("Port 2201\n")
    config.write_text(f"Host other\n    Include {home}/inc.conf\n")
    assert resolve_target("gpu1", SshSettings(config_file=str(config))).port == 22
    assert len(calls(ssh_calls, "clusterrun-check")) == 2
    # A keyword OpenSSH may not know is for OpenSSH to judge.
    config.write_text("Host *\n    SendEnv LANG\n    NoSuchOption yes\n")
    with pytest.raises(UsageError, match="Bad configuration option: nosuchoption"):
        resolve_target("gpu1", SshSettings(config_file=str(config)))


@pytest.mark.parametrize("text", ["Match host gpu*\n    Port 2200\n", "Host gpu*\n    HostName %h.lan\n",
                                  "Host gpu*\n    HostName GPU.lan\n", "Host gpu*\n    ProxyJump none\n",
                                  "CanonicalizeHostname yes\nHost gpu*\n    Port 2200\n"])
def test_outside_the_plain_subset_ssh_dash_g_answers_for_each_node(home: Path, ssh_calls: Path, text: str) -> None:
    config = home / "cfg"
    config.write_text(text)
    resolve_target("gpu1", SshSettings(config_file=str(config)))
    resolve_target("gpu2", SshSettings(config_file=str(config)))
    assert (len(calls(ssh_calls, "gpu1")), len(calls(ssh_calls, "gpu2")), calls(ssh_calls, "clusterrun-check")) == (
        1, 1, [])


@pytest.mark.parametrize(("text", "said"), [
    ("Host 10.0.0.5\n    Port 22\n    Compression maybe\n", 'unsupported option "maybe"'),
    ("Match host 10.*\n    Port 22\n    HostNmae 10.0.0.6\n",
     "Bad configuration option: hostnmae (did you mean 'hostname'?)")], ids=["plain", "match"])
def test_openssh_refusing_the_config_names_the_node_file_and_line(home: Path, text: str, said: str) -> None:
    config = home / "cfg"
    config.write_text(text)
    transport = SshTransport("gpu01", "10.0.0.5", SshSettings(config_file=str(config)))
    with pytest.raises(UsageError) as refused:
        transport.connect()
    asked = f"ssh -G -F {config}" if text.startswith("Host") else "ssh -G 10.0.0.5"  # a plain file: read once
    assert str(refused.value) == (
        f"gpu01: 10.0.0.5: OpenSSH refuses this ssh_config (`{asked}`): {config}:3: {said}")


PLAIN = """\
Include {home}/inc.conf
Host gpu1 gpu2
    HostName 10.0.0.%s
    User ops
Host gpu* !gpu9
    Port 2200
    IdentityFile {home}/k1
    IdentityFile {home}/k2
    StrictHostKeyChecking yes
Host bastion
    HostName 10.9.0.1
    Port 2222
Host web*
    ProxyCommand nc -X connect %h %p
Host gpu*
    ProxyJump admin@bastion
    ConnectTimeout 4
    UserKnownHostsFile {home}/kh {home}/kh2
    HashKnownHosts yes
Host *
    User everyone
    GlobalKnownHostsFile {home}/gkh
    HostKeyAlias shared
"""


@pytest.mark.parametrize(("host", "user", "port"), [("gpu1", None, None), ("gpu2", "alice", 2022), ("gpu9", None, None),
                                                    ("web1", None, None), ("bastion", None, None), ("other", None, 23)])
def test_a_plain_file_read_by_clusterrun_once_openssh_accepted_it_agrees_with_ssh_dash_g_per_target(
        home: Path, ssh_calls: Path, monkeypatch: pytest.MonkeyPatch, host: str, user: str | None,
        port: int | None) -> None:
    for key in ("k1", "k2"):
        (home / key).write_text("")
    (home / "inc.conf").write_text("Host gpu2\n    ConnectTimeout 3\n")
    config = home / "cfg"
    config.write_text(PLAIN.format(home=home).replace("10.0.0.%s", "10.0.0.1"))
    settings = SshSettings(config_file=str(config), user=user, port=port)
    plain = resolve_target(host, settings)
    assert [c.split()[-1] for c in ssh_calls.read_text().splitlines()] == ["clusterrun-check", "clusterrun-check"]
    monkeypatch.setenv(ssh_resolve.READER_ENV, "openssh")
    assert resolve_target(host, settings) == plain
    # Outside the plain subset (a token in a HostName), ssh -G answers for each target.
    config.write_text(PLAIN.format(home=home).replace("10.0.0.%s", "%h.lan"))
    monkeypatch.delenv(ssh_resolve.READER_ENV)
    before = len(calls(ssh_calls, host))
    assert resolve_target(host, settings).hostname == (f"{host}.lan" if host in ("gpu1", "gpu2") else plain.hostname)
    assert len(calls(ssh_calls, host)) == before + 1


def test_forcing_openssh_without_ssh_on_path_is_a_usage_error(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(home))
    monkeypatch.setenv(ssh_resolve.READER_ENV, "openssh")
    with pytest.raises(UsageError, match="CLUSTERRUN_SSH_CONFIG_READER=openssh but no ssh binary is on PATH"):
        ssh_resolve.ssh_binary()
    monkeypatch.setenv(ssh_resolve.READER_ENV, "builtin")
    assert ssh_resolve.ssh_binary() is None


@pytest.mark.cluster
@pytest.mark.parametrize("reader", ["openssh", "builtin"])
def test_proxyjump_proxycommand_and_include_reach_the_simulated_nodes_under_either_reader(
        sim_cluster: SimCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str) -> None:
    """``openssh``: ``ssh -G`` for every target (jump hosts included), as for a config outside the plain subset."""
    monkeypatch.setenv(ssh_resolve.READER_ENV, reader)
    n0, n1, n2 = sim_cluster.nodes[:3]
    config = tmp_path / "ssh_config"
    config.write_text(f"Host via-jump\n    HostName {n1.mgmt_ip}\n    User root\n    ProxyJump node0\n"
                      f"    IdentityFile {sim_cluster.identity_file}\n"
                      f"Host via-command\n    HostName {n2.mgmt_ip}\n    User root\n"
                      f"    IdentityFile {sim_cluster.identity_file}\n"
                      f"    ProxyCommand ssh -F {sim_cluster.ssh_config} -W %h:%p node0\n"
                      f"Host *\n    Include {sim_cluster.ssh_config}\n")
    settings = SshSettings(config_file=str(config), known_hosts=str(sim_cluster.known_hosts),
                           host_key_policy=HostKeyPolicy.strict, connect_timeout=CONNECT_TIMEOUT)
    for alias, node in (("via-jump", n1), ("via-command", n2)):
        with SshTransport(node.name, alias, settings) as t:
            assert t.run(["sh", "-c", "hostname; echo $SSH_CONNECTION"]).stdout.split()[:2] == [node.name, n0.mgmt_ip]
