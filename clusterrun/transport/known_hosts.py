"""known_hosts as OpenSSH reads it, and what each host key policy does with the key a node shows.

Read: the user's files (``UserKnownHostsFile``, or the inventory's ``known_hosts``) and the global ones
(``GlobalKnownHostsFile``). Lines are ``[@marker] patterns keytype base64 [comment]``; patterns may be
hashed (``|1|salt|hash``), wildcards (``*``, ``?``), negated (``!``) or ``[host]:port``. A line that cannot
be read, for this host or another, is skipped with one warning naming its file and line, as OpenSSH
skips it. ``@revoked`` keys are refused; ``@cert-authority`` lines are kept out of the comparison
(clusterrun does not check host certificates).

Decide (:class:`HostKeyCheck`), like ``StrictHostKeyChecking``:

    key known                 connect
    key revoked               refuse, whatever the policy
    key changed               refuse (naming the file:line and the ``ssh-keygen -R`` to run);
                              with ``off`` warn and connect, as OpenSSH's ``no`` does
    host unknown              accept-new: add the key to the first user file and say so once;
                              strict: refuse; off: connect, record nothing
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterrun.errors import HostKeyError
from clusterrun.inventory.models import HostKeyPolicy
from clusterrun.transport.ssh.paramiko_lib import paramiko
from clusterrun.transport.ssh.target import SshTarget
from clusterrun.transport.ssh.words import expand_home, matches_pattern_list, warn_once

log = logging.getLogger(__name__)
_write_lock = threading.Lock()
_MARKERS = {"@cert-authority", "@revoked"}


def fingerprint(blob: bytes) -> str:
    """``SHA256:…`` as ``ssh-keygen -l`` prints it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class KnownHost:
    """One readable known_hosts line."""

    path: str
    lineno: int
    marker: str | None  # "@revoked", "@cert-authority" or None
    patterns: tuple[str, ...]
    key_type: str
    blob: bytes

    @property
    def where(self) -> str:
        return f"{self.path}:{self.lineno}"

    def matches(self, name: str) -> bool:
        """Whether this line is about ``name`` (``host`` or ``[host]:port``)."""
        name = name.lower()
        if len(self.patterns) == 1 and self.patterns[0].startswith("|1|"):
            salt_b64, _, hash_b64 = self.patterns[0][3:].partition("|")
            salt, digest = base64.b64decode(salt_b64), base64.b64decode(hash_b64)
            return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest)
        return matches_pattern_list(list(self.patterns), name)


def _blob_type(blob: bytes) -> str | None:
    """The key type written at the start of a public key blob (an SSH string), or None if there is none."""
    if len(blob) < 4:
        return None
    (length,) = struct.unpack(">I", blob[:4])
    if length > len(blob) - 4:
        return None
    try:
        return blob[4:4 + length].decode("ascii")
    except UnicodeDecodeError:
        return None


def parse_line(text: str, path: str, lineno: int) -> KnownHost | None:
    """One known_hosts line as a record; None for a blank or comment line. Raises ValueError saying what is wrong."""
    line = text.strip()
    if not line or line.startswith("#"):
        return None
    fields = line.split()
    marker = None
    if fields[0].startswith("@"):
        marker = fields.pop(0)
        if marker not in _MARKERS:
            raise ValueError(f"unknown marker {marker!r} (known: @cert-authority, @revoked)")
    if len(fields) < 3:
        raise ValueError("expected `host[,host...] key-type base64-key`")
    names, key_type, key_text = fields[:3]
    patterns = tuple(names.split(","))
    if any(not p for p in patterns):
        raise ValueError(f"empty host name in {names!r}")
    for pattern in patterns:
        if pattern.startswith("|"):
            parts = pattern.split("|")
            if len(patterns) != 1 or len(parts) != 4 or parts[1] != "1":
                raise ValueError(f"cannot read the hashed host name {pattern!r}")
            try:
                base64.b64decode(parts[2], validate=True), base64.b64decode(parts[3], validate=True)
            except binascii.Error:
                raise ValueError(f"cannot read the hashed host name {pattern!r}") from None
    try:
        blob = base64.b64decode(key_text, validate=True)
    except binascii.Error:
        raise ValueError("the key is not valid base64") from None
    if _blob_type(blob) != key_type:
        raise ValueError(f"the key data is not a {key_type} key")
    try:
        paramiko.PKey.from_type_string(key_type, blob)
    except paramiko.pkey.UnknownKeyType:
        pass  # a type paramiko cannot use (a security key, say): kept, it just never matches what paramiko sees
    except Exception as exc:  # paramiko's key parsers raise whatever the broken data trips on
        raise ValueError(f"the {key_type} key data is damaged ({type(exc).__name__})") from None
    return KnownHost(path, lineno, marker, patterns, key_type, blob)


def parse_known_hosts(text: str, path: str) -> tuple[list[KnownHost], list[tuple[int, str]]]:
    """The readable lines of a known_hosts file, and ``(line number, why)`` for each line skipped."""
    entries: list[KnownHost] = []
    skipped: list[tuple[int, str]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        try:
            entry = parse_line(line, path, lineno)
        except ValueError as exc:
            skipped.append((lineno, str(exc)))
            continue
        if entry is not None:
            entries.append(entry)
    return entries, skipped


_cache: dict[tuple[str, int, int], tuple[list[KnownHost], list[tuple[int, str]]]] = {}
_cache_lock = threading.Lock()


def _parsed(path: str) -> tuple[list[KnownHost], list[tuple[int, str]]]:
    """:func:`parse_known_hosts` of the file, once per version of it: every node's connection reads the same
    file, and checking each line's key costs tens of microseconds (a cluster's file lists every node)."""
    info = os.stat(path)
    key = (path, info.st_mtime_ns, info.st_size)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    parsed = parse_known_hosts(Path(path).read_text(encoding="utf-8", errors="replace"), path)
    with _cache_lock:
        if len(_cache) > 16:
            _cache.clear()
        _cache[key] = parsed
    return parsed


class Verdict(enum.Enum):
    known = "known"
    unknown = "unknown"
    changed = "changed"
    revoked = "revoked"


@dataclass(frozen=True)
class Check:
    verdict: Verdict
    line: KnownHost | None = None  # the line that decided it (for changed and revoked)


class KnownHosts:
    """The readable lines of several known_hosts files, user files first."""

    def __init__(self, entries: Iterable[KnownHost]) -> None:
        self.entries = list(entries)

    @classmethod
    def load(cls, paths: Iterable[str]) -> KnownHosts:
        """Read ``paths`` (missing ones are skipped); warn once per unreadable line or file."""
        entries: list[KnownHost] = []
        for path in paths:
            if not os.path.isfile(path):
                continue
            try:
                found, skipped = _parsed(path)
            except OSError as exc:
                warn_once(log, f"{path}: cannot read this known_hosts file ({exc.strerror}); its keys are not used")
                continue
            for lineno, why in skipped:
                warn_once(log, f"{path}:{lineno}: skipped a malformed known_hosts line ({why}), as OpenSSH does; "
                               "fix or delete that line")
            entries += found
        return cls(entries)

    def lines_for(self, name: str) -> list[KnownHost]:
        return [e for e in self.entries if e.matches(name)]

    def key_types(self, name: str) -> list[str]:
        """The key types known for ``name``, in file order (to ask the node for one of those first)."""
        types = [e.key_type for e in self.lines_for(name) if e.marker is None]
        return list(dict.fromkeys(types))

    def check(self, name: str, key_type: str, blob: bytes) -> Check:
        lines = self.lines_for(name)
        for line in lines:
            if line.marker == "@revoked" and line.blob == blob:
                return Check(Verdict.revoked, line)
        plain = [line for line in lines if line.marker is None]
        if any(line.blob == blob for line in plain):
            return Check(Verdict.known)
        for line in plain:
            if line.key_type == key_type:
                return Check(Verdict.changed, line)
        return Check(Verdict.unknown)


def add_known_host(path: str, name: str, key: paramiko.PKey, *, hashed: bool) -> bool:
    """Append ``name``'s key to ``path`` unless it is already there; True when it was added."""
    entry_name = paramiko.HostKeys.hash_host(name) if hashed else name
    line = f"{entry_name} {key.get_name()} {key.get_base64()}\n"
    with _write_lock:
        file = Path(path)
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        existing = file.read_bytes() if file.is_file() else b""
        current, _ = parse_known_hosts(existing.decode("utf-8", errors="replace"), path)
        if KnownHosts(current).check(name, key.get_name(), key.asbytes()).verdict is Verdict.known:
            return False  # another connection (a jump host that is also a node) added it meanwhile
        with open(file, "a", encoding="utf-8") as fh:
            # A file whose last line lacks its newline would otherwise glue the new key onto it.
            fh.write(("\n" if existing and not existing.endswith(b"\n") else "") + line)
    return True


def _remove_command(name: str, path: str) -> str:
    # ssh-keygen's own default is ~/.ssh/known_hosts of the password database's home, as ssh's.
    file = "" if path == expand_home("~/.ssh/known_hosts") else f" -f {path}"
    return f"ssh-keygen -R '{name}'{file}"


class HostKeyCheck(paramiko.MissingHostKeyPolicy):
    """Decide on the key ``target`` shows, per its policy (paramiko's own host key list is left empty)."""

    def __init__(self, node: str, target: SshTarget, known: KnownHosts) -> None:
        self.node = node
        self.target = target
        self.known = known

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        t, name = self.target, self.target.known_hosts_name
        blob, offered = key.asbytes(), f"{key.get_name()} {fingerprint(key.asbytes())}"
        found = self.known.check(name, key.get_name(), blob)
        line = found.line
        if found.verdict is Verdict.known:
            return
        if found.verdict is Verdict.revoked and line is not None:
            raise HostKeyError(self.node, f"the host key of {name} ({offered}) is marked @revoked at "
                                          f"{line.where}; not connecting")
        if found.verdict is Verdict.changed and line is not None:
            changed = (f"the host key of {name} CHANGED: {line.where} holds {line.key_type} "
                       f"{fingerprint(line.blob)}, the node offered {offered}")
            if t.policy is HostKeyPolicy.off:
                warn_once(log, f"{self.node}: {changed}; connecting anyway because host_key_policy is off "
                               "(StrictHostKeyChecking no). If the node was not reinstalled, someone may be "
                               "intercepting this connection")
                return
            raise HostKeyError(self.node, f"{changed}. If the node was reinstalled, remove the old key with "
                                          f"`{_remove_command(name, line.path)}` and connect again; otherwise "
                                          "do not connect: someone may be intercepting the connection")
        if t.policy is HostKeyPolicy.strict:
            where = t.known_hosts[0] if t.known_hosts else "~/.ssh/known_hosts"
            raise HostKeyError(
                self.node,
                f"{name} is not in {', '.join(t.known_hosts + t.global_known_hosts) or 'any known_hosts file'} "
                f"and host_key_policy is strict; after checking the key ({offered}), add it: "
                f"ssh-keyscan -p {t.port} {t.hostname} >> {where}",
            )
        if t.policy is HostKeyPolicy.accept_new and t.known_hosts:
            path = t.known_hosts[0]
            try:
                added = add_known_host(path, name, key, hashed=t.hash_known_hosts)
            except OSError as exc:
                raise HostKeyError(self.node, f"cannot add the host key of {name} to {path}: {exc.strerror}; "
                                              "fix the file's permissions or set ssh.known_hosts") from None
            if added:
                warn_once(log, f"{self.node}: added the host key of {name} ({offered}) to {path} "
                               "(host_key_policy accept-new)")


def prefer_key_types(known_types: list[str]) -> Callable[..., paramiko.Transport]:
    """A paramiko transport factory that asks the node for the key types known_hosts holds, first.

    As OpenSSH does: a node with an ed25519 and an RSA key, known here by its RSA key, is checked against
    that RSA key instead of showing its ed25519 key as a new one.
    """
    wanted = {"rsa-sha2-512" if t == "ssh-rsa" else t for t in known_types} | set(known_types)
    if "ssh-rsa" in known_types:
        wanted.add("rsa-sha2-256")

    def make(sock: Any, **options: Any) -> paramiko.Transport:
        transport = paramiko.Transport(sock, **options)
        if wanted:
            security = transport.get_security_options()
            types = list(security.key_types)
            security.key_types = [t for t in types if t in wanted] + [t for t in types if t not in wanted]
        return transport

    return make
