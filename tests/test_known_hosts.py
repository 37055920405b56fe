"""known_hosts read as OpenSSH reads it, on real files: bad lines skipped with one warning, every host-name
form, and each policy's answer to a known, new, changed or revoked key."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import paramiko
import pytest

from clusterrun.errors import HostKeyError
from clusterrun.inventory.models import HostKeyPolicy
from clusterrun.transport.ssh.known_hosts import (
    HostKeyCheck,
    KnownHosts,
    Verdict,
    add_known_host,
    fingerprint,
    parse_known_hosts,
)
from clusterrun.transport.ssh.target import SshTarget

KEY_A = paramiko.ECDSAKey.generate()
KEY_B = paramiko.ECDSAKey.generate()
RSA = paramiko.RSAKey.generate(1024)


def line(names: str, key: paramiko.PKey, marker: str = "") -> str:
    return f"{marker + ' ' if marker else ''}{names} {key.get_name()} {key.get_base64()}\n"


def check(known: KnownHosts, name: str, key: paramiko.PKey) -> Verdict:
    return known.check(name, key.get_name(), key.asbytes()).verdict


def target(tmp_path: Path, policy: HostKeyPolicy, *, port: int = 22, hashed: bool = False) -> SshTarget:
    return SshTarget(alias="gpu1", hostname="10.0.0.1", port=port, user="root", identity_files=(), jump=None,
                     proxy_command=None, proxy_origin="", known_hosts=(str(tmp_path / "known_hosts"),),
                     global_known_hosts=(str(tmp_path / "global"),), host_key_alias=None, hash_known_hosts=hashed,
                     policy=policy, connect_timeout=5.0)


MALFORMED = [
    ("gpu9 ecdsa-sha2-nistp256 !!!notbase64!!!", "not valid base64"),
    (f"gpu9 ssh-ed25519 {KEY_A.get_base64()}", "not a ssh-ed25519 key"),
    ("gpu9 ssh-ed25519", "expected `host"),
    ("just-garbage", "expected `host"),
    (f"@trusted gpu9 {KEY_A.get_name()} {KEY_A.get_base64()}", "unknown marker '@trusted'"),
    (f"|1|nope {KEY_A.get_name()} {KEY_A.get_base64()}", "cannot read the hashed host name"),
    (f"gpu9,,gpu8 {KEY_A.get_name()} {KEY_A.get_base64()}", "empty host name"),
    (f"gpu9 {KEY_A.get_name()} {KEY_A.get_base64()[:-8]}", "key data is damaged"),
]


@pytest.mark.parametrize(("text", "why"), MALFORMED)
def test_malformed_line_is_skipped_with_its_number_and_reason(text: str, why: str) -> None:
    good = line("gpu1", KEY_A)
    entries, skipped = parse_known_hosts(f"# comment\n\n{good}{text}\n{line('gpu2', KEY_B)}", "kh")
    assert [(e.lineno, e.patterns) for e in entries] == [(3, ("gpu1",)), (5, ("gpu2",))]
    assert len(skipped) == 1 and skipped[0][0] == 4 and why in skipped[0][1]


def test_bad_line_for_another_host_warns_once_and_the_rest_still_works(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    user = tmp_path / "known_hosts"
    user.write_text(line("gpu1", KEY_A) + "gpu9 ssh-ed25519 AAAA%%%\n" + "\x00\xff binary junk\n")
    glob = tmp_path / "global"
    glob.write_text("only-two fields\n" + line("gpu2", KEY_B))
    with caplog.at_level(logging.WARNING):
        first = KnownHosts.load([str(user), str(glob), str(tmp_path / "absent")])
        KnownHosts.load([str(user), str(glob)])  # another node of the same run: no second warning
    messages = [r.getMessage() for r in caplog.records]
    assert [m.split(": skipped")[0] for m in messages] == [f"{user}:2", f"{user}:3", f"{glob}:1"]
    assert all("malformed known_hosts line" in m and "fix or delete that line" in m for m in messages)
    assert check(first, "gpu1", KEY_A) is Verdict.known
    assert check(first, "gpu2", KEY_B) is Verdict.known


@pytest.mark.parametrize(
    ("names", "name", "known"),
    [
        ("gpu1,10.0.0.1", "10.0.0.1", True),
        ("GPU1", "gpu1", True),
        ("[10.0.0.1]:2222", "[10.0.0.1]:2222", True),
        ("[10.0.0.1]:2222", "10.0.0.1", False),
        ("10.0.0.1", "[10.0.0.1]:2222", False),
        ("gpu*,!gpu13", "gpu12", True),
        ("gpu*,!gpu13", "gpu13", False),
        ("gpu?", "gpu12", False),
        ("[gpu?]:22*", "[gpu1]:2200", True),
        (paramiko.HostKeys.hash_host("gpu1"), "gpu1", True),
        (paramiko.HostKeys.hash_host("[gpu1]:2200"), "[gpu1]:2200", True),
        (paramiko.HostKeys.hash_host("gpu1"), "gpu2", False),
    ],
)
def test_host_name_forms(names: str, name: str, known: bool) -> None:
    entries, skipped = parse_known_hosts(line(names, KEY_A), "kh")
    assert not skipped
    assert (check(KnownHosts(entries), name, KEY_A) is Verdict.known) is known


def test_verdicts_known_unknown_changed_revoked_and_other_key_types() -> None:
    text = (line("gpu1", KEY_A) + line("gpu2", KEY_A) + line("gpu2", RSA) + line("*", KEY_B, "@revoked")
            + line("gpu3", KEY_A, "@cert-authority"))
    known = KnownHosts(parse_known_hosts(text, "kh")[0])
    assert check(known, "gpu1", KEY_A) is Verdict.known
    changed = known.check("gpu1", KEY_B.get_name(), KEY_B.asbytes())
    assert changed.verdict is Verdict.revoked  # a revoked key is refused before anything else
    other = paramiko.ECDSAKey.generate()
    changed = known.check("gpu1", other.get_name(), other.asbytes())
    assert changed.verdict is Verdict.changed and changed.line is not None and changed.line.where == "kh:1"
    assert check(known, "gpu1", RSA) is Verdict.unknown  # another key type: a new key, as OpenSSH sees it
    assert check(known, "gpu2", RSA) is Verdict.known
    assert check(known, "gpu3", KEY_A) is Verdict.unknown  # a CA line is not a host key
    assert known.key_types("gpu2") == ["ecdsa-sha2-nistp256", "ssh-rsa"]


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="OpenSSH's ssh-keygen is not installed")
def test_what_accept_new_writes_is_what_ssh_keygen_finds(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(line("other", KEY_B).rstrip("\n"))  # no newline at the end: must not be glued to
    assert add_known_host(str(path), "[gpu1]:2200", KEY_A, hashed=False)
    assert add_known_host(str(path), "gpu2", KEY_A, hashed=True)
    assert not add_known_host(str(path), "gpu2", KEY_A, hashed=True)  # already there
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and lines[2].startswith("|1|")
    for name in ("[gpu1]:2200", "gpu2", "other"):
        found = subprocess.run(["ssh-keygen", "-F", name, "-f", str(path)], capture_output=True, text=True,
                               timeout=20)
        assert found.returncode == 0, (name, found.stderr)
    assert not parse_known_hosts(path.read_text(), str(path))[1]
    listed = subprocess.run(["ssh-keygen", "-l", "-f", str(path)], capture_output=True, text=True, timeout=20)
    assert fingerprint(KEY_A.asbytes()) in listed.stdout.split()  # the fingerprints we print are ssh-keygen's


def test_policies(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    known_file = tmp_path / "known_hosts"
    known_file.write_text(line("10.0.0.1", KEY_A))
    known = KnownHosts.load([str(known_file)])
    client = paramiko.SSHClient()
    for policy in HostKeyPolicy:
        HostKeyCheck("gpu1", target(tmp_path, policy), known).missing_host_key(client, "10.0.0.1", KEY_A)

    with pytest.raises(HostKeyError) as refused:
        HostKeyCheck("gpu1", target(tmp_path, HostKeyPolicy.accept_new), known).missing_host_key(
            client, "10.0.0.1", KEY_B)
    assert str(refused.value).startswith(f"gpu1: the host key of 10.0.0.1 CHANGED: {known_file}:1 holds "
                                         f"ecdsa-sha2-nistp256 {fingerprint(KEY_A.asbytes())}")
    assert f"`ssh-keygen -R '10.0.0.1' -f {known_file}`" in str(refused.value)

    with caplog.at_level(logging.WARNING):
        HostKeyCheck("gpu1", target(tmp_path, HostKeyPolicy.off), known).missing_host_key(client, "x", KEY_B)
    assert "CHANGED" in caplog.text and "connecting anyway because host_key_policy is off" in caplog.text

    with pytest.raises(HostKeyError, match=r"gpu1: \[10.0.0.1\]:2200 is not in .* host_key_policy is strict.*"
                                           r"ssh-keyscan -p 2200 10.0.0.1"):
        HostKeyCheck("gpu1", target(tmp_path, HostKeyPolicy.strict, port=2200), known).missing_host_key(
            client, "x", KEY_A)

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            HostKeyCheck("gpu1", target(tmp_path, HostKeyPolicy.accept_new, port=2200, hashed=True),
                         KnownHosts.load([str(known_file)])).missing_host_key(client, "x", KEY_A)
    assert [r.getMessage() for r in caplog.records] == [
        f"gpu1: added the host key of [10.0.0.1]:2200 (ecdsa-sha2-nistp256 {fingerprint(KEY_A.asbytes())}) "
        f"to {known_file} (host_key_policy accept-new)"]
    assert check(KnownHosts.load([str(known_file)]), "[10.0.0.1]:2200", KEY_A) is Verdict.known
    assert len(known_file.read_text().splitlines()) == 2
