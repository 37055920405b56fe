"""ProxyJump values (ssh_config's, or the inventory's ``jump_host``) read as the hops they name, first hop first."""

from __future__ import annotations

from dataclasses import dataclass

from clusterrun.errors import UsageError
from clusterrun.transport.ssh.words import Origin, parse_port


@dataclass(frozen=True)
class JumpHop:
    user: str | None
    host: str
    port: int | None


def _parse_hop(hop: str, spec: str, origin: Origin | str) -> JumpHop:
    example = "expected [user@]host[:port], [user@][IPv6]:port or ssh://[user@]host[:port]"
    text = hop
    if text.lower().startswith("ssh://"):
        text = text[6:].rstrip("/")
        if "/" in text:
            raise UsageError(f"{origin}: ProxyJump {spec!r}: an ssh:// URI has no path; {example}")
    user, at, rest = text.rpartition("@")
    if at and not user:
        raise UsageError(f"{origin}: ProxyJump {spec!r}: empty user before @; {example}")
    port = None
    if rest.startswith("["):
        host, bracket, tail = rest[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            raise UsageError(f"{origin}: ProxyJump {spec!r}: {example}")
        if tail:
            port = parse_port(tail[1:], f"ProxyJump {spec!r}", origin)
    elif rest.count(":") == 1:
        host, port_text = rest.split(":")
        port = parse_port(port_text, f"ProxyJump {spec!r}", origin)
    else:
        host = rest  # a name, or an IPv6 address without a port
    if not host or any(c.isspace() for c in host):
        raise UsageError(f"{origin}: ProxyJump {spec!r}: {example}")
    return JumpHop(user or None, host, port)


def parse_jump_spec(spec: str, origin: Origin | str = "jump_host") -> tuple[JumpHop, ...] | None:
    """A ProxyJump value as hops, first hop first; None for ``none``. Raises UsageError naming ``origin``."""
    spec = spec.strip()
    if spec.lower() == "none":
        return None
    if not spec:
        raise UsageError(f"{origin}: empty ProxyJump")
    return tuple(_parse_hop(hop.strip(), spec, origin) for hop in spec.split(","))

