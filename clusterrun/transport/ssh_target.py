"""Where an SSH connection goes: the inventory's settings over ``~/.ssh/config`` over OpenSSH defaults."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from clusterrun.errors import UsageError
from clusterrun.inventory.models import HostKeyPolicy, SshSettings

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_CONFIG = "~/.ssh/config"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


@dataclass(frozen=True)
class SshTarget:
    alias: str  # what the inventory says (host or ssh_config alias)
    hostname: str  # what is connected to
    port: int
    user: str
    identity_files: tuple[str, ...]
    jump: SshTarget | None
    known_hosts: str
    policy: HostKeyPolicy
    connect_timeout: float

    @property
    def known_hosts_name(self) -> str:
        """The name the host key is filed under: ``host`` or ``[host]:port``, as OpenSSH writes it."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def describe(self) -> str:
        via = f" via {self.jump.describe()}" if self.jump else ""
        return f"{self.user}@{self.hostname}:{self.port}{via}"


def _load_config(path: str | None):
    import paramiko

    config = paramiko.SSHConfig()
    file = Path(os.path.expanduser(path or DEFAULT_CONFIG))
    if file.is_file():
        try:
            with open(file, encoding="utf-8") as fh:
                config.parse(fh)
        except (OSError, UnicodeDecodeError, paramiko.ssh_exception.ConfigParseError) as exc:
            raise UsageError(f"{file}: cannot read this ssh_config: {exc}") from None
    elif path:
        raise UsageError(f"{file}: ssh config_file not found (set in the inventory's ssh settings)")
    return config


def _parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` -> (user, host, port)."""
    user, _, rest = spec.rpartition("@")
    host, port = rest, None
    if rest.count(":") == 1:
        host, port_text = rest.split(":")
        if not port_text.isdigit():
            raise UsageError(f"jump_host {spec!r}: expected [user@]host[:port]")
        port = int(port_text)
    return user or None, host, port


def resolve_target(host: str, settings: SshSettings, *, depth: int = 0) -> SshTarget:
    """Resolve ``host`` the way OpenSSH would, with inventory ``settings`` winning over the config file."""
    if depth > 4:
        raise UsageError(f"{host}: ProxyJump chain longer than 4 hops (a loop in ssh_config?)")
    config = _load_config(settings.config_file)
    found = config.lookup(host)
    hostname = found.get("hostname", host)
    port = settings.port or int(found.get("port", 22))
    user = settings.user or found.get("user") or os.environ.get("USER") or "root"
    if settings.identity_file:
        identities: tuple[str, ...] = (os.path.expanduser(settings.identity_file),)
    else:
        identities = tuple(os.path.expanduser(p) for p in found.get("identityfile", []) if os.path.exists(
            os.path.expanduser(p)))
    jump_spec = settings.jump_host or found.get("proxyjump")
    jump = None
    if jump_spec and jump_spec.lower() != "none":
        # `a,b`: a is reached first, then b through a, then the node through b.
        for hop in (h.strip() for h in jump_spec.split(",")):
            jump_user, jump_host, jump_port = _parse_jump(hop)
            jump_settings = SshSettings(user=jump_user, port=jump_port, config_file=settings.config_file,
                                        known_hosts=settings.known_hosts, host_key_policy=settings.host_key_policy,
                                        connect_timeout=settings.connect_timeout)
            hop_target = resolve_target(jump_host, jump_settings, depth=depth + 1)
            # A hop's own ProxyJump from ssh_config is replaced by the chain given here.
            jump = dataclasses.replace(hop_target, jump=jump)
    known = settings.known_hosts or (found.get("userknownhostsfile") or DEFAULT_KNOWN_HOSTS).split()[0]
    policy = settings.host_key_policy
    if policy is None:
        strict = str(found.get("stricthostkeychecking", "accept-new")).lower()
        policy = {"yes": HostKeyPolicy.strict, "no": HostKeyPolicy.off, "off": HostKeyPolicy.off}.get(
            strict, HostKeyPolicy.accept_new)
    timeout = settings.connect_timeout or float(found.get("connecttimeout", DEFAULT_CONNECT_TIMEOUT))
    return SshTarget(alias=host, hostname=hostname, port=port, user=user, identity_files=identities, jump=jump,
                     known_hosts=os.path.expanduser(known), policy=policy, connect_timeout=timeout)
