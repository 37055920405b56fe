"""The user and the home ``ssh`` has: the password database's entry of this uid, whatever ``$USER``,
``$LOGNAME`` and ``$HOME`` say (unset in containers and cron, or ``$HOME`` pointed elsewhere).

Where ``ssh`` must see the same account as clusterrun, the case runs in a mount namespace (``unshare -m``)
whose /etc/passwd gives this uid another name ("trainer") and its own home: a real password database for
``ssh -G`` and for clusterrun alike, with ``$USER`` and ``$LOGNAME`` unset and ``$HOME`` a different directory
with its own ``.ssh/config`` and keys. Each such case resolves with each reader (``ssh -G`` where the file
needs it, ``ssh -G`` always, clusterrun's own) and compares with what ``ssh -G`` prints in the same namespace.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from simcluster import SimCluster
from simjobs import CONNECT_TIMEOUT

from clusterrun.errors import AuthError, UsageError
from clusterrun.inventory.models import HostKeyPolicy, SshSettings
from clusterrun.transport.ssh import resolve as ssh_resolve
from clusterrun.transport.ssh.transport import SshTransport
from clusterrun.transport.ssh.target import resolve_target

REPO = Path(__file__).resolve().parents[1]
SSH = shutil.which("ssh")
READERS = {"ssh on PATH": "", "ssh -G always": "openssh", "clusterrun's reader": "builtin"}
RESOLVE = """
import json, sys
from clusterrun.inventory.models import SshSettings
from clusterrun.transport.ssh.target import resolve_target
out = {}
for host in sys.argv[1:]:
    t = resolve_target(host, SshSettings())
    out[host] = [t.user, t.hostname, t.port, list(t.identity_files), list(t.known_hosts)]
print(json.dumps(out))
"""


@functools.lru_cache(maxsize=1)
def _namespaces() -> str | None:
    """Why a mount namespace with its own /etc/passwd cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "not root (a mount namespace with its own /etc/passwd needs root)"
    if shutil.which("unshare") is None:
        return "no `unshare` (Debian package util-linux)"
    done = subprocess.run(["unshare", "-m", "-n", "sh", "-c", "mount --bind /etc/passwd /etc/passwd"],
                          capture_output=True, text=True, timeout=30, check=False)
    return None if done.returncode == 0 else f"unshare -m -n fails: {done.stderr.strip()}"


@dataclass
class Account:
    passwd: Path  # /etc/passwd as it reads in the namespace
    home: Path  # the password database's home of this uid there
    env_home: Path  # $HOME there

    def run(self, argv: list[str], reader: str = "") -> subprocess.CompletedProcess[str]:
        """``argv`` in a mount and network namespace where /etc/passwd is ``self.passwd``: $USER and $LOGNAME
        unset, $HOME the other home, no network (a host name resolves nowhere, at once)."""
        env = {k: v for k, v in os.environ.items() if k not in ("USER", "LOGNAME", ssh_resolve.READER_ENV)}
        env.update(HOME=str(self.env_home), PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                                                     env.get("PYTHONPATH")])))
        if reader:
            env[ssh_resolve.READER_ENV] = reader
        return subprocess.run(["unshare", "-m", "-n", "sh", "-c", 'mount --bind "$0" /etc/passwd && exec "$@"',
                               str(self.passwd), *argv], env=env, capture_output=True, text=True, timeout=120,
                              check=False)

    def resolve(self, reader: str, *hosts: str) -> dict[str, list[object]]:
        done = self.run([sys.executable, "-c", RESOLVE, *hosts], reader)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def ssh_g(self, host: str) -> dict[str, str]:
        done = self.run(["ssh", "-G", host])
        assert done.returncode == 0, done.stderr
        return {k: v for k, _, v in (line.partition(" ") for line in reversed(done.stdout.splitlines()))}


@pytest.fixture
def account(tmp_path: Path) -> Account:
    reason = _namespaces()
    if reason:
        pytest.skip(reason)
    if SSH is None:
        pytest.skip("the OpenSSH client is not installed")
    home, env_home = tmp_path / "pw", tmp_path / "env"
    (home / ".ssh").mkdir(parents=True)
    (env_home / ".ssh").mkdir(parents=True)
    uid = str(os.getuid())
    lines = []
    for line in Path("/etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if len(fields) > 5 and fields[2] == uid:
            fields[0], fields[5] = "trainer", str(home)
        lines.append(":".join(fields))
    passwd = tmp_path / "passwd"
    passwd.write_text("\n".join(lines) + "\n")
    return Account(passwd, home, env_home)


@pytest.mark.parametrize("reader", READERS.values(), ids=READERS.keys())
def test_with_user_and_logname_unset_the_user_is_the_password_databases_and_match_user_sees_it(
        account: Account, reader: str) -> None:
    (account.home / ".ssh/config").write_text("Match user trainer\n    Port 2222\n"
                                              "Match localuser trainer\n    HostName 10.1.1.1\n")
    (account.env_home / ".ssh/config").write_text("Host gpu1\n    User envuser\n    HostName wrong.example\n")
    user, hostname, port = account.resolve(reader, "gpu1")["gpu1"][:3]
    assert (user, hostname, port) == ("trainer", "10.1.1.1", 2222)
    said = account.ssh_g("gpu1")
    assert (said["user"], said["hostname"], said["port"]) == ("trainer", "10.1.1.1", "2222")


@pytest.mark.parametrize("reader", READERS.values(), ids=READERS.keys())
def test_tilde_and_the_default_keys_are_in_the_password_databases_home_as_for_ssh(
        account: Account, reader: str) -> None:
    home, env_home = account.home, account.env_home
    (home / ".ssh/config").write_text("Host gpu1\n    IdentityFile ~/keys/gpu\n    UserKnownHostsFile ~/kh\n")
    for base in (home, env_home):  # the same names in both homes: only the right one may be taken
        (base / "keys").mkdir()
        for key in (base / "keys/gpu", base / ".ssh/id_ed25519"):
            key.write_text("")
    (env_home / ".ssh/id_rsa").write_text("")
    found = account.resolve(reader, "gpu1", "gpu2")
    assert found["gpu1"][3:] == [[f"{home}/keys/gpu"], [f"{home}/kh"]]
    assert found["gpu2"][3:] == [[f"{home}/.ssh/id_ed25519"], [f"{home}/.ssh/known_hosts", f"{home}/.ssh/known_hosts2"]]
    assert account.ssh_g("gpu1")["userknownhostsfile"] == f"{home}/kh"


def test_a_home_config_ssh_does_not_read_is_said_once_and_in_the_unresolved_name_error(account: Account) -> None:
    (account.env_home / ".ssh/config").write_text("Host gpu1\n    HostName gpu1.cluster.internal\n")
    cli = [sys.executable, "-m", "clusterrun", "exec", "--ips", "gpu1,gpu2", "--"]
    done = account.run([*cli, "true"])
    assert done.returncode != 0
    unread = f"{account.env_home}/.ssh/config is not read: ssh reads ~/.ssh/config from the password database's "
    said = [line for line in done.stderr.splitlines() if line.startswith("clusterrun: warning:")]
    assert len(said) == 1 and unread in said[0] and "--ssh-config $HOME/.ssh/config" in said[0], done.stderr
    assert f"({account.home})" in said[0]
    failed = [line for line in done.stdout.splitlines() + done.stderr.splitlines()
              if line.startswith("gpu1:") and "cannot resolve host name 'gpu1'" in line]
    assert failed and unread in failed[0], done.stdout + done.stderr
    # The way to the other file: no note, and its HostName is used.
    done = account.run([*cli[:-1], "--ssh-config", f"{account.env_home}/.ssh/config", "--", "true"])
    assert "is not read" not in done.stdout + done.stderr
    assert "cannot resolve host name 'gpu1.cluster.internal'" in done.stdout + done.stderr


def test_no_note_where_home_is_the_password_databases_or_has_no_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: pwd.struct_passwd(("me", "x", uid, 0, "", str(tmp_path), "")))
    monkeypatch.setenv(ssh_resolve.READER_ENV, "builtin")
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh/config").write_text("Host gpu1\n    Port 2201\n")
    for env_home in (tmp_path, tmp_path / "elsewhere"):  # the same home; another with no .ssh/config
        monkeypatch.setenv("HOME", str(env_home))
        assert resolve_target("gpu1", SshSettings()).port == 2201
    assert "is not read" not in caplog.text


def test_a_uid_without_an_entry_falls_back_to_user_and_else_asks_for_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(ssh_resolve.READER_ENV, "builtin")
    monkeypatch.delenv("LOGNAME", raising=False)
    monkeypatch.setenv("USER", "fromenv")
    assert resolve_target("gpu1", SshSettings()).user == "fromenv"
    monkeypatch.delenv("USER")
    with pytest.raises(UsageError, match=r"no entry in the password database.*--ssh-user"):
        resolve_target("gpu1", SshSettings())
    assert resolve_target("gpu1", SshSettings(user="ops")).user == "ops"  # a user set needs no entry


@pytest.mark.cluster
@pytest.mark.parametrize("reader", ["openssh", "builtin"])
def test_default_keys_come_from_the_password_databases_home_and_identityfile_none_offers_none(
        sim_cluster: SimCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str) -> None:
    """The node accepts the cluster's key, as ``~/.ssh/id_ed25519`` of the password database's home and of
    ``$HOME`` (elsewhere; no agent): the first is taken by default, and neither is offered under ``IdentityFile
    none`` (paramiko's own look for keys, in ``$HOME``, would connect)."""
    home, env_home = tmp_path / "pw", tmp_path / "env"
    for base in (home, env_home):
        (base / ".ssh").mkdir(parents=True)
        shutil.copy(sim_cluster.identity_file, base / ".ssh/id_ed25519")
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: pwd.struct_passwd(("me", "x", uid, 0, "", str(home), "")))
    monkeypatch.setenv("HOME", str(env_home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv(ssh_resolve.READER_ENV, reader)
    node = sim_cluster.nodes[0]
    config = tmp_path / "ssh_config"
    for identity, connects in (("", True), ("    IdentityFile none\n", False)):
        config.write_text(f"Host {node.name}\n    HostName {node.mgmt_ip}\n{identity}")
        settings = SshSettings(user="root", config_file=str(config), known_hosts=str(sim_cluster.known_hosts),
                               host_key_policy=HostKeyPolicy.strict, connect_timeout=CONNECT_TIMEOUT)
        with SshTransport(node.name, node.name, settings) as t:
            if connects:
                assert t.target.identity_files == (str(home / ".ssh/id_ed25519"),)
                assert t.run(["hostname"]).stdout.strip() == node.name
            else:
                assert t.target.identity_files == ()
                with pytest.raises(AuthError, match="ssh-agent only"):
                    t.run(["hostname"])
