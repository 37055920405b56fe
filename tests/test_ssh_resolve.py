"""ssh_config read by OpenSSH's ``ssh -G``: what the config set is applied, clusterrun's defaults stay where it
set nothing, ``ssh -G`` runs once per distinct target and not at all where no file can set anything clusterrun
uses, and OpenSSH's refusal names the node, file and line.

``ssh`` is the real client; where a test must see how often it ran, PATH puts a recording script in front that
hands every call to it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from clusterrun.errors import UsageError
from clusterrun.inventory.models import HostKeyPolicy, SshSettings
from clusterrun.transport import ssh_resolve
from clusterrun.transport.ssh import SshTransport
from clusterrun.transport.ssh_target import DEFAULT_CONNECT_TIMEOUT, resolve_target

SSH = shutil.which("ssh")
pytestmark = pytest.mark.skipif(SSH is None, reason="the OpenSSH client is not installed")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("USER", "me")
    monkeypatch.setenv(ssh_resolve.READER_ENV, "openssh")
    return tmp_path


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


def test_what_the_config_sets_applies_and_clusterruns_defaults_stay_elsewhere(home: Path) -> None:
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


def test_the_inventorys_user_and_port_are_ssh_command_line_options(home: Path) -> None:
    config = home / "cfg"
    config.write_text("Match user alice\n    HostName alice-gw\nHost *\n    User cfg\n    Port 2200\n"
                      "    ProxyCommand nc %h %p %r\n")
    t = resolve_target("gpu1", SshSettings(config_file=str(config), user="alice", port=2222))
    assert (t.hostname, t.user, t.port) == ("alice-gw", "alice", 2222)
    assert t.proxy_command == "nc alice-gw 2222 alice"
    assert t.proxy_origin == f"ProxyCommand at {config}:6"  # ssh -G prints no origin: found in the file


def test_a_catch_all_proxyjump_reaching_the_jump_host_is_openssh_s_jumphost_loop(home: Path) -> None:
    config = home / "cfg"
    config.write_text("Host *\n    ProxyJump bastion\n")
    with pytest.raises(UsageError, match=r"^bastion: OpenSSH refuses .*jumphost loop via bastion"):
        resolve_target("gpu1", SshSettings(config_file=str(config)))
    config.write_text("Host bastion\n    ProxyJump none\nHost *\n    ProxyJump bastion\n")
    t = resolve_target("gpu1", SshSettings(config_file=str(config)))
    assert t.jump is not None and (t.jump.alias, t.jump.jump) == ("bastion", None)
    assert t.proxy_origin == f"ProxyJump at {config}:4"


def test_ssh_dash_g_runs_once_per_distinct_target(home: Path, ssh_calls: Path) -> None:
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
    # An Include is followed whatever block it is in, and what it sets makes ssh -G needed.
    (home / "inc.conf").write_text("Port 2201\n")
    config.write_text(f"Host other\n    Include {home}/inc.conf\n")
    assert resolve_target("gpu1", SshSettings(config_file=str(config))).port == 22
    assert len(calls(ssh_calls, "gpu1")) == 1
    # A keyword OpenSSH may not know is for OpenSSH to judge.
    config.write_text("Host *\n    SendEnv LANG\n    NoSuchOption yes\n")
    with pytest.raises(UsageError, match="Bad configuration option: nosuchoption"):
        resolve_target("gpu1", SshSettings(config_file=str(config)))


def test_openssh_refusing_the_config_names_the_node_file_and_line(home: Path) -> None:
    config = home / "cfg"
    config.write_text("Host 10.0.0.5\n    Port 22\n    HostNmae 10.0.0.6\n")
    transport = SshTransport("gpu01", "10.0.0.5", SshSettings(config_file=str(config)))
    with pytest.raises(UsageError) as refused:
        transport.connect()
    assert str(refused.value) == (
        f"gpu01: 10.0.0.5: OpenSSH refuses this ssh_config (`ssh -G 10.0.0.5`): {config}:3: Bad configuration "
        "option: hostnmae (did you mean 'hostname'?)")


def test_forcing_openssh_without_ssh_on_path_is_a_usage_error(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(home))
    with pytest.raises(UsageError, match="CLUSTERRUN_SSH_CONFIG_READER=openssh but no ssh binary is on PATH"):
        ssh_resolve.ssh_binary()
    monkeypatch.setenv(ssh_resolve.READER_ENV, "builtin")
    assert ssh_resolve.ssh_binary() is None
