"""Where an SSH connection goes: the inventory's settings over ssh_config over OpenSSH's defaults.

ssh_config is read by OpenSSH's ``ssh -G`` (:mod:`clusterrun.transport.ssh.resolve`), or where ``ssh`` is
absent by :mod:`clusterrun.transport.ssh.config`; ProxyJump values by
:mod:`clusterrun.transport.ssh.jump_spec`; this module turns what they found into a :class:`SshTarget`.
The inventory's ``user``, ``port`` and ``jump_host`` act like ``ssh``'s command line: they win, and ``%r``
and ``%p`` in ``ProxyCommand`` or ``ProxyJump`` expand to them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from clusterrun.errors import UsageError
from clusterrun.inventory.models import HostKeyPolicy, SshSettings
from clusterrun.transport.ssh.config import HostConfig, config_files
from clusterrun.transport.ssh.jump_spec import parse_jump_spec
from clusterrun.transport.ssh.resolve import address_of, connect_timeout_of, host_config
from clusterrun.transport.ssh.words import expand_path, expand_tokens, local_user, session_tokens

DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
#: OpenSSH's default keys, in its order, of the types paramiko can use (not -sk, XMSS or DSA keys).
DEFAULT_IDENTITIES = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ed25519")
MAX_JUMP_DEPTH = 4


@dataclass(frozen=True)
class SshTarget:
    alias: str  # what the inventory says (host or ssh_config alias)
    hostname: str  # what is connected to
    port: int
    user: str
    identity_files: tuple[str, ...]  # the key files to offer (the agent's keys are offered too)
    jump: SshTarget | None  # the hop this host is reached through
    proxy_command: str | None  # or the command whose stdin/stdout is the connection (never both)
    proxy_origin: str  # where jump or proxy_command came from, for messages
    known_hosts: tuple[str, ...]  # the user's known_hosts files; new keys are added to the first
    global_known_hosts: tuple[str, ...]
    host_key_alias: str | None
    hash_known_hosts: bool
    policy: HostKeyPolicy
    connect_timeout: float

    @property
    def known_hosts_name(self) -> str:
        """The name the host key is filed under: ``host`` or ``[host]:port``, as OpenSSH writes it."""
        name = self.host_key_alias or self.hostname
        return name if self.port == 22 else f"[{name}]:{self.port}"

    def describe(self) -> str:
        if self.proxy_command:
            command = self.proxy_command if len(self.proxy_command) <= 80 else self.proxy_command[:77] + "..."
            via = f" via ProxyCommand `{command}`"
        else:
            via = f" via {self.jump.describe()}" if self.jump else ""
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname  # an IPv6 address
        return f"{self.user}@{host}:{self.port}{via}"


def _policy(settings: SshSettings, found: HostConfig) -> HostKeyPolicy:
    if settings.host_key_policy is not None:
        return settings.host_key_policy
    strict = (found.get("stricthostkeychecking") or "accept-new").lower()
    return {"yes": HostKeyPolicy.strict, "true": HostKeyPolicy.strict, "no": HostKeyPolicy.off,
            "false": HostKeyPolicy.off, "off": HostKeyPolicy.off}.get(
        strict, HostKeyPolicy.accept_new)


def resolve_target(host: str, settings: SshSettings) -> SshTarget:
    """Resolve ``host`` the way OpenSSH would, with the inventory's ``settings`` winning over ssh_config.

    Raises UsageError naming the file and line (or the inventory setting) of a value that cannot be used.
    """
    files = config_files(settings.config_file)
    return _resolve(host, settings, files, user=settings.user, port=settings.port,
                    identity_file=settings.identity_file, jump_spec=settings.jump_host, depth=0)


def _resolve(host: str, settings: SshSettings, files: list[tuple[Path, bool]], *, user: str | None,
             port: int | None, identity_file: str | None, jump_spec: str | None, depth: int) -> SshTarget:
    if depth > MAX_JUMP_DEPTH:
        raise UsageError(f"{host}: ProxyJump chain longer than {MAX_JUMP_DEPTH} hops (a loop in ssh_config?)")
    found = host_config(host, settings.config_file, files, user=user, port=port, jump_given=jump_spec is not None)
    hostname, port = address_of(host, found, port)
    user = user or (found.words("user") or [None])[0] or local_user()
    # The tokens OpenSSH offers in ProxyCommand, ProxyJump and file names (%C included: ~/.ssh/%C keys).
    tokens = session_tokens(hostname, host, port, user, (found.words("hostkeyalias") or [None])[0])
    proxy_tokens = {k: tokens[k] for k in "hnpr"}

    identities = _identities(identity_file, found, tokens)

    jump: SshTarget | None = None
    proxy_command: str | None = None
    proxy_origin = ""
    jump_origin = ""
    if jump_spec is not None:
        jump_origin = "the inventory's jump_host"
        hops = parse_jump_spec(expand_tokens(jump_spec, proxy_tokens, jump_origin), jump_origin)
    elif found.proxy is not None and found.proxy.kind == "jump" and found.proxy.value is not None:
        jump_origin = f"ProxyJump at {found.proxy.origin}"
        hops = parse_jump_spec(expand_tokens(found.proxy.value, proxy_tokens, found.proxy.origin), jump_origin)
    else:
        hops = None
        if found.proxy is not None and found.proxy.value is not None:
            proxy_command = expand_tokens(found.proxy.value, proxy_tokens, found.proxy.origin)
            proxy_origin = f"ProxyCommand at {found.proxy.origin}"
    if hops:
        last = hops[-1]
        if (last.host, last.port or 22, last.user or user) == (hostname, port, user):
            # OpenSSH refuses this too ("jumphost loop"): typically `Host *` with a ProxyJump that also
            # matches the jump host itself.
            raise UsageError(f"{jump_origin}: {user}@{hostname}:{port} would be reached through itself; give the "
                             f"jump host `ProxyJump none` (a `Host {host}` block before the one that sets it)")
    for index, hop in enumerate(hops or ()):
        # As `ssh -i KEY -J a,b`: the first hop is reached as ssh_config says (its own ProxyJump or
        # ProxyCommand included), each later hop through the one before it; KEY is the node's alone.
        hop_target = _resolve(hop.host, settings, files, user=hop.user, port=hop.port, identity_file=None,
                              jump_spec=None if index == 0 else "none", depth=depth + 1)
        jump = hop_target if index == 0 else replace(hop_target, jump=jump, proxy_origin="the ProxyJump chain")
    if hops:
        proxy_origin = jump_origin

    if settings.known_hosts:
        known: tuple[str, ...] = (os.path.expanduser(settings.known_hosts),)
    else:
        known = _known_hosts_files(found, "userknownhostsfile", DEFAULT_KNOWN_HOSTS, tokens)
    global_known = _known_hosts_files(found, "globalknownhostsfile", DEFAULT_GLOBAL_KNOWN_HOSTS, tokens)

    timeout = connect_timeout_of(found, settings.connect_timeout)
    return SshTarget(alias=host, hostname=hostname, port=port, user=user, identity_files=identities, jump=jump,
                     proxy_command=proxy_command, proxy_origin=proxy_origin, known_hosts=known,
                     global_known_hosts=global_known, host_key_alias=(found.words("hostkeyalias") or [None])[0],
                     hash_known_hosts=(found.get("hashknownhosts") or "no").lower() == "yes",
                     policy=_policy(settings, found), connect_timeout=timeout)


def _identities(identity_file: str | None, found: HostConfig, tokens: Mapping[str, str]) -> tuple[str, ...]:
    """The key files to offer, as OpenSSH picks them: the inventory's (``ssh -i``), else ssh_config's
    IdentityFile lines that name a file (``none`` names none), else, only where no IdentityFile line applies,
    the default keys in ``~/.ssh`` of the home ssh uses (the password database's)."""
    if identity_file:
        return (os.path.expanduser(identity_file),)
    if found.identity_files:
        named = (expand_path(name, tokens, origin) for name, origin in found.identity_files if name.lower() != "none")
        return tuple(p for p in named if os.path.exists(p))
    return tuple(p for p in (expand_path(name, tokens, name) for name in DEFAULT_IDENTITIES) if os.path.exists(p))


def _known_hosts_files(found: HostConfig, key: str, default: tuple[str, ...],
                       tokens: Mapping[str, str]) -> tuple[str, ...]:
    names = found.words(key) or list(default)
    if [n.lower() for n in names] == ["none"]:
        return ()
    return tuple(expand_path(n, tokens, found.origin(key) or n) for n in names)

