"""ssh_config as OpenSSH reads it: Include, the system file, first value wins, Match, proxies, jump specs.

Each test writes real config files under tmp_path (the password database's home and HOME point there, so
``~/.ssh`` is tmp_path/.ssh; tests/test_ssh_user_home.py has the cases where the two homes differ).
Tests taking ``reader`` run twice: with ``ssh`` on PATH (``ssh -G`` reads the config, the default wherever the
client is installed) and with a PATH that lacks it (clusterrun's own reader). Tests taking ``builtin`` pin
clusterrun's reader: they check its own messages, or rely on what only it sees (the home and user this file
gives the password database in-process, where ``ssh`` reads the real one). Where the OpenSSH client is
installed, ``ssh -G`` resolves the same files and the two must agree.
"""

from __future__ import annotations

import logging
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest
from loadscale import until

from clusterrun.errors import UsageError
from clusterrun.inventory.models import HostKeyPolicy, SshSettings
from clusterrun.transport.ssh import config as ssh_config
from clusterrun.transport.ssh import resolve as ssh_resolve
from clusterrun.transport.ssh.config import config_files, lookup_config
from clusterrun.transport.ssh.jump_spec import JumpHop, parse_jump_spec
from clusterrun.transport.ssh.target import resolve_target

SSH = shutil.which("ssh")  # the real client, for comparing with `ssh -G` whatever PATH a test sets
needs_ssh = pytest.mark.skipif(SSH is None, reason="the OpenSSH client is not installed")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("USER", "me")
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: pwd.struct_passwd(("me", "x", uid, 0, "", str(tmp_path), "")))
    monkeypatch.delenv(ssh_resolve.READER_ENV, raising=False)
    (tmp_path / ".ssh").mkdir()
    return tmp_path


@pytest.fixture(scope="session")
def path_without_ssh(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PATH with every command of /usr/bin and /bin but ``ssh``."""
    bin_dir = tmp_path_factory.mktemp("no-ssh-bin")
    for source in (Path("/usr/local/bin"), Path("/usr/bin"), Path("/bin")):
        for tool in source.iterdir() if source.is_dir() else ():
            if tool.name != "ssh" and not (bin_dir / tool.name).exists():
                (bin_dir / tool.name).symlink_to(tool)
    return str(bin_dir)


@pytest.fixture(params=["ssh on PATH", "ssh -G always", "no ssh on PATH"])
def reader(request: pytest.FixtureRequest, home: Path, monkeypatch: pytest.MonkeyPatch, path_without_ssh: str) -> str:
    """Which reader the case runs under, chosen as in real use by whether ``ssh`` is on PATH (with ssh there,
    a plain file is read by clusterrun's reader once OpenSSH accepted it), or ``ssh -G`` for every target."""
    if request.param == "no ssh on PATH":
        monkeypatch.setenv("PATH", path_without_ssh)
        assert ssh_resolve.ssh_binary() is None
        return "builtin"
    if SSH is None:
        pytest.skip("the OpenSSH client is not installed")
    if request.param == "ssh -G always":
        monkeypatch.setenv(ssh_resolve.READER_ENV, "openssh")
    assert ssh_resolve.ssh_binary() is not None
    return "openssh"


@pytest.fixture
def builtin(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """clusterrun's own reader, whatever is on PATH."""
    monkeypatch.setenv(ssh_resolve.READER_ENV, "builtin")


@pytest.fixture
def openssh(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if SSH is None:
        pytest.skip("the OpenSSH client is not installed")
    monkeypatch.setenv(ssh_resolve.READER_ENV, "openssh")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def target(config: Path, host: str, **settings: object):
    return resolve_target(host, SshSettings(config_file=str(config), **settings))  # type: ignore[arg-type]


def test_include_is_relative_to_dot_ssh_globbed_in_order_and_first_value_wins(home: Path, builtin: None) -> None:
    write(home / ".ssh/conf.d/20-late.conf", "Host gpu*\n    User late\n    Port 2202\n")
    write(home / ".ssh/conf.d/10-early.conf", "Host gpu*\n    User early\n")
    config = write(home / ".ssh/config", "Host gpu01\n    HostName 10.0.0.1\nInclude conf.d/*.conf\n"
                                         "Host *\n    User fallback\n    Port 2299\n")
    t = target(config, "gpu01")
    assert (t.hostname, t.user, t.port) == ("10.0.0.1", "early", 2202)
    assert target(config, "other").user == "fallback"


def test_include_inside_a_host_block_applies_only_to_that_host(home: Path, reader: str) -> None:
    included = write(home / ".ssh/gpu.conf", "User gpuuser\nHost *\n    Port 2222\n")
    config = write(home / ".ssh/config", f"Host gpu*\n    Include {included}\nHost *\n    User plain\n")
    assert (target(config, "gpu3").user, target(config, "gpu3").port) == ("gpuuser", 2222)
    assert (target(config, "cpu3").user, target(config, "cpu3").port) == ("plain", 22)


def test_system_file_is_read_after_the_users_and_only_without_config_file(home: Path) -> None:
    user = write(home / ".ssh/config", "Host gpu*\n    User mine\n")
    system = write(home / "etc/ssh_config", "Host *\n    User systemwide\n    Port 2200\n")
    found = lookup_config("gpu1", [(user, False), (system, True)])
    assert (found.get("user"), found.get("port")) == ("mine", "2200")
    assert str(found.origin("port")) == f"{system}:3"
    # An explicit config_file replaces both files, like `ssh -F`.
    assert config_files(str(user)) == [(user, False)]
    assert config_files(None)[0] == (user, False)
    with pytest.raises(UsageError, match="config_file not found"):
        config_files(str(home / "missing"))


def test_proxycommand_tokens_use_the_inventorys_user_and_port(home: Path, reader: str) -> None:
    config = write(home / "cfg", "Host gpu*\n    HostName %h.cluster\n    User cfguser\n"
                                 "    ProxyCommand ssh -W %h:%p %r@bastion -- %n 100%%\n")
    t = target(config, "gpu1", user="alice", port=2222)
    assert t.proxy_command == "ssh -W gpu1.cluster:2222 alice@bastion -- gpu1 100%"
    assert t.jump is None
    assert t.proxy_origin == f"ProxyCommand at {config}:4"
    assert "via ProxyCommand `ssh -W gpu1.cluster:2222" in t.describe()
    assert target(config, "gpu1").proxy_command == "ssh -W gpu1.cluster:22 cfguser@bastion -- gpu1 100%"


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("Host gpu1\n    ProxyCommand none\nHost *\n    ProxyCommand nc %h %p\n", (None, None)),
        ("Host gpu1\n    ProxyJump none\nHost *\n    ProxyCommand nc %h %p\n", (None, None)),
        ("Host gpu1\n    ProxyCommand none\nHost *\n    ProxyJump bastion\n", (None, None)),
        ("Host bastion\n    ProxyJump none\nHost *\n    ProxyJump bastion\n    ProxyCommand nc %h %p\n",
         (None, "bastion")),
        ("Host *\n    ProxyCommand nc %h %p\n    ProxyJump bastion\n", ("nc gpu1 22", None)),
    ],
    ids=["command-none", "jump-none-blocks-command", "command-none-blocks-jump", "jump-first", "command-first"],
)
def test_proxycommand_and_proxyjump_first_one_wins_and_none_disables_both(
        home: Path, builtin: None, text: str, expect: tuple[str | None, str | None]) -> None:
    t = target(write(home / "cfg", text), "gpu1")
    assert (t.proxy_command, t.jump.alias if t.jump else None) == expect


def test_inventory_jump_host_wins_over_ssh_config_and_none_disables(home: Path, reader: str) -> None:
    config = write(home / "cfg", "Host *\n    ProxyCommand nc %h %p\n")
    t = target(config, "gpu1", jump_host="bastion")
    assert (t.proxy_command, t.jump and t.jump.hostname) == (None, "bastion")
    assert t.proxy_origin == "the inventory's jump_host"
    t = target(config, "gpu1", jump_host="none")
    assert (t.proxy_command, t.jump) == (None, None)


@pytest.mark.parametrize(
    ("spec", "hops"),
    [
        ("bastion", (JumpHop(None, "bastion", None),)),
        ("ops@bastion:2200", (JumpHop("ops", "bastion", 2200),)),
        ("ssh://ops@bastion:2200", (JumpHop("ops", "bastion", 2200),)),
        ("ssh://bastion/", (JumpHop(None, "bastion", None),)),
        ("[fe80::1]:2222", (JumpHop(None, "fe80::1", 2222),)),
        ("ops@[2001:db8::7]", (JumpHop("ops", "2001:db8::7", None),)),
        ("ssh://ops@[2001:db8::7]:22", (JumpHop("ops", "2001:db8::7", 22),)),
        ("2001:db8::7", (JumpHop(None, "2001:db8::7", None),)),
        ("a@first:1, ssh://second,[::1]:3",
         (JumpHop("a", "first", 1), JumpHop(None, "second", None), JumpHop(None, "::1", 3))),
        ("NONE", None),
    ],
)
def test_jump_spec_forms(spec: str, hops: tuple[JumpHop, ...] | None) -> None:
    assert parse_jump_spec(spec) == hops


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("bastion:ssh", r"port 'ssh' is not a number"),
        ("bastion:0", r"port '0' is not a number from 1 to 65535"),
        ("ssh://bastion/home", "no path"),
        ("[::1", r"expected \[user@\]host"),
        ("[::1]2222", r"expected \[user@\]host"),
        ("@bastion", "empty user"),
        ("a,,b", r"expected \[user@\]host"),
    ],
)
def test_bad_jump_specs_name_where_they_come_from(spec: str, error: str) -> None:
    with pytest.raises(UsageError, match=rf"^the inventory's jump_host: ProxyJump .*{error}"):
        parse_jump_spec(spec, "the inventory's jump_host")


def test_tokens_in_a_jump_spec_use_the_inventorys_user_and_port(home: Path, builtin: None) -> None:
    config = write(home / "cfg", "Host gpu*\n    User cfguser\n    ProxyJump ssh://%r@bastion-%h:%p\n"
                                 "Host bastion-*\n    ProxyJump none\n")
    t = target(config, "gpu1", user="alice", port=2200)
    assert t.jump is not None
    assert (t.jump.user, t.jump.hostname, t.jump.port) == ("alice", "bastion-gpu1", 2200)
    assert t.proxy_origin == f"ProxyJump at {config}:3"
    assert t.jump.user == "alice"
    t = target(config, "gpu1")
    assert t.jump is not None and (t.jump.user, t.jump.port) == ("cfguser", 22)


def test_jump_chain_first_hop_keeps_its_own_proxycommand_later_hops_chain(home: Path, reader: str) -> None:
    config = write(home / "cfg", "Host outer\n    ProxyCommand connect-outer %h\n"
                                 "Host inner\n    ProxyJump inner:2200\n")  # replaced by the chain: no loop
    t = target(config, "gpu1", jump_host="outer,root@inner:2200", identity_file="~/node_key")
    assert t.identity_files == (str(home / "node_key"),)
    inner = t.jump
    assert inner is not None and (inner.alias, inner.user, inner.port, inner.proxy_command) == (
        "inner", "root", 2200, None)
    outer = inner.jump
    assert outer is not None and (outer.alias, outer.proxy_command, outer.jump) == ("outer", "connect-outer outer", None)
    assert inner.identity_files == outer.identity_files == ()  # the inventory's key is the node's, as `ssh -i`
    assert t.describe() == "me@gpu1:22 via root@inner:2200 via me@outer:22 via ProxyCommand `connect-outer outer`"


def test_jump_loops_in_ssh_config_are_errors(home: Path, builtin: None) -> None:
    config = write(home / "cfg", "Host a\n    ProxyJump b\nHost b\n    ProxyJump a\n")
    with pytest.raises(UsageError, match="ProxyJump chain longer than"):
        target(config, "a")
    # The usual slip: a catch-all ProxyJump that also applies to the jump host (OpenSSH: "jumphost loop").
    config = write(home / "cfg", "Host *\n    ProxyJump bastion\n")
    with pytest.raises(UsageError, match=r"cfg:2: me@bastion:22 would be reached through itself.*ProxyJump none"):
        target(config, "gpu1")


@pytest.mark.parametrize("criterion", ["localnetwork 10.0.0.0/8", "tagged x", "host gpu* localnetwork 10.0.0.0/8"])
def test_newer_openssh_match_criteria_warn_once_with_file_and_line_and_do_not_apply(
        home: Path, builtin: None, caplog: pytest.LogCaptureFixture, criterion: str) -> None:
    config = write(home / "cfg", f"Host *\n    Port 2200\nMatch {criterion}\n    User wrong\n    Port 1\n")
    with caplog.at_level(logging.WARNING):
        t = target(config, "gpu1")
        target(config, "gpu2")
    assert (t.user, t.port) == ("me", 2200)
    warnings = [r.getMessage() for r in caplog.records if "Match" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"{config}:3: `Match ")
    assert "treated as not matching" in warnings[0]


def test_supported_match_criteria(home: Path, builtin: None) -> None:
    config = write(home / "cfg", "Host gpu*\n    HostName 10.1.0.5\n"
                                 "Match host 10.1.* !originalhost gpu9\n    Port 2201\n"
                                 "Match user alice\n    IdentityFile ~/alice_key\n"
                                 "Match localuser me final\n    ConnectTimeout 7\n"
                                 "Match canonical\n    Port 9\n"
                                 "Match all\n    Port 2209\n")
    (home / "alice_key").write_text("")
    t = target(config, "gpu1", user="alice")
    assert (t.port, t.identity_files, t.connect_timeout) == (2201, (str(home / "alice_key"),), 7.0)
    t = target(config, "gpu9")
    assert (t.port, t.identity_files) == (2209, ())


def test_host_patterns_wildcards_negation_case_and_brackets(home: Path, reader: str) -> None:
    config = write(home / "cfg", "Host gpu?? !gpu13\n    Port 2201\nHost [web]*\n    Port 2202\n"
                                 "Host !*.internal\n    Port 2203\nHost GPU*\n    Port 2204\n")
    assert target(config, "gpu12").port == 2201
    assert target(config, "GPU12").port == 2204  # a Host line takes the name as given, case and all (OpenSSH 9.2)
    assert target(config, "gpu13").port == 22  # only negated patterns match in the last block: never
    assert target(config, "[web]01").port == 2202
    assert target(config, "w1").port == 22


def test_quotes_comments_equals_and_identity_tokens(home: Path, builtin: None) -> None:
    key = home / ".ssh" / "id gpu1"
    key.write_text("")
    config = write(home / "cfg", "# a comment\nHost gpu1 # trailing comment\n"
                                 "    IdentityFile \"~/.ssh/id %h\"\n    IdentityFile ~/.ssh/missing\n"
                                 "    Port=2200\n    StrictHostKeyChecking yes\n"
                                 "    UserKnownHostsFile ~/.ssh/kh_%h ${HOME}/second\n"
                                 "    GlobalKnownHostsFile none\n    HashKnownHosts yes\n    HostKeyAlias gpu-one\n")
    t = target(config, "gpu1")
    assert t.identity_files == (str(key),)  # a listed key that does not exist is left out, as ssh does
    assert t.port == 2200
    assert t.policy is HostKeyPolicy.strict
    assert t.known_hosts == (str(home / ".ssh/kh_gpu1"), str(home / "second"))
    assert t.global_known_hosts == ()
    assert t.hash_known_hosts
    assert t.known_hosts_name == "[gpu-one]:2200"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("Host x\n    Port twentytwo\n", r"cfg:2: Port: port 'twentytwo' is not a number"),
        ("Host x\n    ConnectTimeout soon\n", r"cfg:2: ConnectTimeout 'soon' is not a number"),
        ("Host\n", r"cfg:1: Host needs at least one pattern"),
        ("Match\n", r"cfg:1: Match needs a criterion"),
        ("Match host\n", r"cfg:1: `Match host` needs an argument"),
        ("Host x\n    ProxyCommand nc %z\n", r"cfg:2: unknown token %z"),
        ("Host x\n    User \"unterminated\n", r"cfg:2: unterminated quote"),
        ("Host x\n    ProxyJump bastion:99999\n", r"ProxyJump at .*cfg:2: ProxyJump 'bastion:99999'"),
        ("%bad line\n", r"cfg:1: cannot read this ssh_config line"),
    ],
)
def test_config_errors_name_file_and_line(home: Path, builtin: None, text: str, error: str) -> None:
    with pytest.raises(UsageError, match=error):
        target(write(home / "cfg", text), "x")


def test_include_loop_is_an_error(home: Path, builtin: None) -> None:
    config = write(home / ".ssh/config", "Include config\n")
    with pytest.raises(UsageError, match="Include nested more than 16 deep"):
        target(config, "x")


# ---------------------------------------------------------------- agreement with OpenSSH's own resolution

OPENSSH_CASES = [
    ("gpu01", None, None),
    ("gpu02", "bob", 2022),
    ("gpu99", None, None),
    ("web1", None, None),
    ("10.9.9.9", None, None),
]


@needs_ssh
@pytest.mark.parametrize(("host", "user", "port"), OPENSSH_CASES)
def test_resolution_agrees_with_ssh_dash_g(home: Path, builtin: None, host: str, user: str | None, port: int | None) -> None:
    inc = write(home / "inc" / "a.conf", "Host gpu*\n    User fromincl\n    Port 2201\n")
    config = write(home / "cfg", f"Host gpu01\n    HostName 10.0.0.1\nInclude {inc.parent}/*.conf\n"
                                 "Host gpu* !gpu99\n    User unused\n    ProxyCommand ssh -W %h:%p bastion\n"
                                 "Match host 10.*\n    User tenuser\n    ProxyJump jump1,jump2:2200\n"
                                 "Host web*\n    ProxyCommand none\nHost jump*\n    ProxyJump none\n"
                                 "Host *\n    ProxyJump ssh://ops@jumpy:2200\n")
    argv = [str(SSH), "-G", "-F", str(config)] + (["-l", user] if user else []) + (["-p", str(port)] if port else [])
    out = subprocess.run([*argv, host], capture_output=True, text=True, timeout=20, check=True).stdout
    ssh_g: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        ssh_g.setdefault(key, value)
    found = lookup_config(host, [(config, False)], user=user)
    t = target(config, host, user=user, port=port)
    assert t.hostname == ssh_g["hostname"]
    assert t.port == int(ssh_g["port"])
    if user is None and "user" in ssh_g and ssh_g["user"] != "root":  # ssh -G's default is the real login
        assert t.user == ssh_g["user"]
    proxy = found.proxy
    ours = (proxy.kind, proxy.value) if proxy and proxy.value else None
    theirs = (("command", ssh_g["proxycommand"]) if "proxycommand" in ssh_g else
              ("jump", ssh_g["proxyjump"]) if "proxyjump" in ssh_g else None)
    if ours and theirs and ours[0] == theirs[0] == "jump":  # ssh -G prints ssh:// URIs as user@host:port
        ours, theirs = ("jump", parse_jump_spec(ours[1])), ("jump", parse_jump_spec(theirs[1]))
    assert ours == theirs


# ---------------------------------------------------------------- strict as OpenSSH: Match exec, Match all, keywords


def test_match_exec_applies_when_its_command_succeeds_with_tokens_expanded(home: Path, reader: str) -> None:
    present, absent = home / "on-vpn", home / "off-vpn"
    present.write_text("")
    config = write(home / "cfg", f"Match exec \"test -e {absent}\"\n    User absent\n"
                                 f"Match exec \"test -e {present}\"\n    Port 2201\n"
                                 "Match exec \"test %h = gpu1\" !exec false\n    User viaexec\n"
                                 "Match host gpu* exec true\n    ConnectTimeout 7\n")
    t = target(config, "gpu1")
    assert (t.port, t.user, t.connect_timeout) == (2201, "viaexec", 7.0)
    t = target(config, "web1")
    assert (t.port, t.user, t.connect_timeout) == (2201, "me", 10.0)
    if SSH:  # OpenSSH applies the same blocks
        out = subprocess.run([SSH, "-G", "-F", str(config), "gpu1"], capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL, check=True).stdout.splitlines()
        assert {"port 2201", "user viaexec", "connecttimeout 7"} <= set(out)


def test_match_exec_is_not_run_after_an_earlier_criterion_failed(home: Path, reader: str) -> None:
    ran = home / "ran"
    config = write(home / "cfg", f"Match host nomatch exec \"touch {ran}\"\n    Port 2201\n")
    assert target(config, "gpu1").port == 22
    assert not ran.exists()


def test_match_exec_that_hangs_is_bounded(home: Path, reader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ssh_config, "MATCH_EXEC_TIMEOUT", 0.5)
    monkeypatch.setattr(ssh_resolve, "SSH_G_TIMEOUT", 0.5)
    marker = f"hang-{reader}-{home.name}"  # a command line only this test's command has
    config = write(home / "cfg", f"Host x\n    Port 2200\nMatch exec \"sleep 30; : {marker}\"\n    Port 1\n")
    error = rf"cfg:3: `Match exec sleep 30; : {marker}` ran past 0.5s" if reader == "builtin" else (
        r"^x: `.*ssh -G -F .*cfg -- x` did not answer within 0.5s \(a Match exec command")
    with pytest.raises(UsageError, match=error):
        target(config, "x")
    if reader == "openssh":  # the command ssh started went with it
        gone = until(lambda: subprocess.run(["pgrep", "-f", marker], capture_output=True, check=False).returncode != 0,
                     5.0, step=0.05)  # within 5 s, scaled with the machine's load
        assert gone, f"the Match exec command {marker} outlived ssh -G"


@pytest.mark.parametrize(
    ("text", "builtin_error", "openssh_error"),
    [
        ("Host x\n    HostNmae 10.0.0.5\n", r"cfg:2: unknown ssh_config keyword 'hostnmae'.*did you mean 'hostname'",
         r"^x: OpenSSH refuses .*cfg:2: Bad configuration option: hostnmae \(did you mean 'hostname'\?\)"),
        ("Host other\n    HostNmae 10.0.0.5\n", r"cfg:2: unknown ssh_config keyword 'hostnmae'",
         r"cfg:2: Bad configuration option: hostnmae"),
        ("Host x\n    UseKeychain yes\nIgnoreUnknown UseKeychain\n", r"cfg:2: unknown ssh_config keyword 'usekeychain'",
         r"cfg:2: Bad configuration option: usekeychain \(an option of another SSH client can be named in an "
         "IgnoreUnknown"),
        ("Match all host x\n    User bob\n", r"cfg:1: 'all' cannot be combined with other Match criteria",
         r"cfg:1: 'all' cannot be combined with other Match attributes; .*cfg:1: Bad Match condition"),
        ("Match nosuchthing x\n    User bob\n", r"cfg:1: unsupported Match criterion 'nosuchthing'",
         r"Unsupported Match attribute nosuchthing; .*cfg:1: Bad Match condition"),
        ("Match exec\n    User bob\n", r"cfg:1: `Match exec` needs an argument",
         r"Missing Match criteria for exec; .*cfg:1: Bad Match condition"),
    ],
)
def test_what_openssh_refuses_is_refused_with_file_and_line(home: Path, reader: str, text: str, builtin_error: str,
                                                            openssh_error: str) -> None:
    config = write(home / "cfg", text)
    with pytest.raises(UsageError, match=builtin_error if reader == "builtin" else openssh_error):
        target(config, "x")
    if SSH:  # OpenSSH refuses the same file
        done = subprocess.run([SSH, "-G", "-F", str(config), "x"], capture_output=True, text=True, timeout=20,
                              stdin=subprocess.DEVNULL, check=False)
        assert done.returncode != 0, done.stdout


def test_ignore_unknown_before_a_keyword_lets_it_pass(home: Path, reader: str) -> None:
    config = write(home / "cfg", "IgnoreUnknown UseKeychain,AddKeysTo*\nHost x\n    UseKeychain yes\n"
                                 "    Port 2200\nMatch host x all\n    User bob\n")
    t = target(config, "x")
    assert (t.port, t.user) == (2200, "bob")  # and `all` after another criterion is accepted, as OpenSSH does


def test_percent_c_names_a_key_per_connection_as_openssh_hashes_it(home: Path, reader: str) -> None:
    import hashlib
    import os

    config = write(home / "cfg", "Host x\n    HostName 10.1.2.3\n    User bob\n    Port 2222\n"
                                 "    IdentityFile ~/.ssh/%C\n")
    digest = hashlib.sha1(f"{os.uname().nodename}10.1.2.32222bob".encode()).hexdigest()
    (home / ".ssh" / digest).write_text("")
    assert target(config, "x").identity_files == (str(home / ".ssh" / digest),)
    if SSH:  # OpenSSH's own %C, from a ControlPath it expands in -G
        write(home / "cfg", config.read_text() + "    ControlPath /tmp/%C\n")
        out = subprocess.run([SSH, "-G", "-F", str(config), "x"], capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL, check=True).stdout
        assert f"controlpath /tmp/{digest}" in out.splitlines()


def test_percent_percent_is_a_literal_percent_expanded_once_as_ssh_dash_g_prints_it(home: Path, reader: str) -> None:
    config = write(home / "cfg", "Host gpu1\n    HostName 100%%h.%h\n"
                                 f"    UserKnownHostsFile {home}/kh-%h-%%h\n")
    t = target(config, "gpu1")
    assert (t.hostname, t.known_hosts) == ("100%h.gpu1", (f"{home}/kh-100%h.gpu1-%h",))
    if SSH:
        out = subprocess.run([SSH, "-G", "-F", str(config), "gpu1"], capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL, check=True).stdout.splitlines()
        assert {f"hostname {t.hostname}", f"userknownhostsfile {t.known_hosts[0]}"} <= set(out)


def test_identityfile_none_offers_no_key_file_not_even_the_default_ones(home: Path, reader: str) -> None:
    default = home / ".ssh/id_ed25519"
    default.write_text("")
    (home / "k2").write_text("")
    config = write(home / "cfg", "Host none1\n    IdentityFile none\nHost none2\n    IdentityFile NONE\n"
                                 "    IdentityFile ~/k2\nHost missing\n    IdentityFile ~/absent\n")
    assert target(config, "none1").identity_files == ()
    assert target(config, "none2").identity_files == (str(home / "k2"),)
    assert target(config, "missing").identity_files == ()  # as ssh: a listed key replaces the defaults, found or not
    assert target(config, "other").identity_files == (str(default),)  # no IdentityFile: the default keys
