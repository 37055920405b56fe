"""iproute2's JSON: ``ip -j addr show`` and ``ip -j link show``.

Both print a JSON list of interfaces; ``addr`` adds ``addr_info``. ``link`` output gives
interfaces with no addresses. Old iproute2 releases print empty ``{}`` entries for
interfaces a filter dropped (``ip -4 -j addr``); those are skipped.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Any

from clusterrun.errors import ParseError

TOOL = "ip -j"


@dataclass(frozen=True)
class Address:
    """One address on an interface, e.g. ``10.0.0.1/24`` (family ``inet`` or ``inet6``)."""

    family: str
    local: str
    prefixlen: int
    scope: str | None

    @property
    def interface(self) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
        """The address with its prefix, e.g. ``IPv4Interface('10.0.0.1/24')``."""
        return ipaddress.ip_interface(f"{self.local}/{self.prefixlen}")


@dataclass(frozen=True)
class Interface:
    """One network interface. ``operstate`` is the kernel's word: UP, DOWN, UNKNOWN, LOWERLAYERDOWN..."""

    index: int
    name: str
    flags: tuple[str, ...]
    mtu: int
    operstate: str
    link_type: str | None  # ether, loopback, infiniband, none
    mac: str | None
    master: str | None  # the bond or bridge it is enslaved to
    addresses: tuple[Address, ...]

    @property
    def is_up(self) -> bool:
        """Administratively up with carrier (flags UP and LOWER_UP); loopback's operstate is UNKNOWN."""
        return "UP" in self.flags and "LOWER_UP" in self.flags

    @property
    def is_loopback(self) -> bool:
        return "LOOPBACK" in self.flags or self.link_type == "loopback"

    def ipv4(self) -> tuple[Address, ...]:
        return tuple(a for a in self.addresses if a.family == "inet")


@dataclass(frozen=True)
class Interfaces:
    """All interfaces, in kernel index order as printed."""

    interfaces: tuple[Interface, ...]

    def get(self, name: str) -> Interface | None:
        return next((i for i in self.interfaces if i.name == name), None)

    def with_address(self, address: str) -> Interface | None:
        """The interface that carries ``address`` (without prefix), if any."""
        wanted = ipaddress.ip_address(address)
        return next(
            (i for i in self.interfaces for a in i.addresses if ipaddress.ip_address(a.local) == wanted), None
        )


def parse(text: str) -> Interfaces:
    """Parse ``ip -j addr show`` or ``ip -j link show`` (``-p`` pretty form too).

    Raises :class:`ParseError` when the text is not JSON (naming the line, e.g. an old
    ``ip`` that says ``Option "-j" is unknown``) or an entry lacks ``ifname``/``mtu``.
    """
    if not text.strip():
        raise ParseError(TOOL, "empty output")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        line = text.splitlines()[exc.lineno - 1] if exc.lineno <= len(text.splitlines()) else None
        raise ParseError(TOOL, f"not JSON: {exc.msg}", line=line, lineno=exc.lineno) from None
    if not isinstance(data, list):
        raise ParseError(TOOL, f"expected a JSON list of interfaces, got {type(data).__name__}")
    return Interfaces(tuple(_interface(entry, n) for n, entry in enumerate(data) if entry != {}))


def _interface(entry: Any, n: int) -> Interface:
    if not isinstance(entry, dict) or not isinstance(entry.get("ifname"), str) or not isinstance(entry.get("mtu"), int):
        raise ParseError(TOOL, f"entry {n} has no ifname/mtu", line=json.dumps(entry)[:200])
    addr_info = entry.get("addr_info", [])
    return Interface(
        index=int(entry.get("ifindex", 0)),
        name=entry["ifname"],
        flags=tuple(entry.get("flags", ())),
        mtu=entry["mtu"],
        operstate=str(entry.get("operstate", "UNKNOWN")),
        link_type=entry.get("link_type"),
        mac=entry.get("address"),
        master=entry.get("master"),
        addresses=tuple(_address(a, entry["ifname"]) for a in addr_info if a.get("local")),
    )


def _address(info: dict[str, Any], ifname: str) -> Address:
    try:
        address = Address(
            family=str(info["family"]), local=str(info["local"]), prefixlen=int(info["prefixlen"]), scope=info.get("scope")
        )
        address.interface  # noqa: B018 - validates local/prefixlen now, not when a check reads it
    except (KeyError, TypeError, ValueError) as exc:
        raise ParseError(TOOL, f"{ifname}: bad address entry ({exc})", line=json.dumps(info)[:200]) from None
    return address
