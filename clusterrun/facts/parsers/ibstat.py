"""InfiniBand/RoCE port status: ``ibstat`` (infiniband-diags) and ``ibv_devinfo [-v]`` (rdma-core).

Both describe the same things with different words (``Active`` / ``PORT_ACTIVE (4)``,
``LinkUp`` / ``LINK_UP (5)``); this module maps both onto one set of records. Only
``ibv_devinfo -v`` lists the GID table (which RoCE v2 GID carries which IP) and only
``ibstat`` prints the port rate directly (``ibv_devinfo -v`` gives width x speed).
``No IB devices found`` is a finding (no CAs), not a parse error.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from clusterrun.errors import ParseError

_E = TypeVar("_E", bound=Enum)


class PortState(Enum):
    """Logical port state; only ACTIVE carries traffic."""

    DOWN = "DOWN"
    INIT = "INIT"
    ARMED = "ARMED"
    ACTIVE = "ACTIVE"
    ACTIVE_DEFER = "ACTIVE_DEFER"


class PhysState(Enum):
    """Physical link state; LINK_UP is the healthy one, POLLING means no cable or no peer."""

    SLEEP = "SLEEP"
    POLLING = "POLLING"
    DISABLED = "DISABLED"
    TRAINING = "TRAINING"
    LINK_UP = "LINK_UP"
    ERROR_RECOVERY = "ERROR_RECOVERY"
    PHY_TEST = "PHY_TEST"


class LinkLayer(Enum):
    INFINIBAND = "InfiniBand"
    ETHERNET = "Ethernet"  # RoCE
    UNSPECIFIED = "Unspecified"


_STATES = {
    "down": PortState.DOWN, "initializing": PortState.INIT, "init": PortState.INIT, "armed": PortState.ARMED,
    "active": PortState.ACTIVE, "active defer": PortState.ACTIVE_DEFER, "active_defer": PortState.ACTIVE_DEFER,
}
_PHYS = {
    "sleep": PhysState.SLEEP, "polling": PhysState.POLLING, "disabled": PhysState.DISABLED,
    "portconfigurationtraining": PhysState.TRAINING, "port_configuration_training": PhysState.TRAINING,
    "linkup": PhysState.LINK_UP, "link_up": PhysState.LINK_UP, "linkerrorrecovery": PhysState.ERROR_RECOVERY,
    "link_error_recovery": PhysState.ERROR_RECOVERY, "phy test": PhysState.PHY_TEST, "phy_test": PhysState.PHY_TEST,
}
_KEY_VALUE = re.compile(r"^\s*(?P<key>[A-Za-z_][\w ]*?)\s*:\s*(?P<value>.*?)\s*$")
_GID = re.compile(r"^\s*GID\[\s*(?P<index>\d+)\]:\s*(?P<gid>[0-9a-fA-F:.]+)(?:,\s*(?P<kind>.+?))?\s*$")
_NO_DEVICES = "No IB devices found"
# ibv_devinfo -v prints some values as one deeper-indented line each under their key: the names of the bits set in a
# mask (``device_cap_flags: 0x...``, then ``BAD_PKEY_CNTR``, ``Unknown flags: 0xC8400000``) or of the capabilities in
# a list (``general_odp_caps:``/``uc_odp_caps:`` then ``ODP_SUPPORT``, ``NO SUPPORT``; ``raw packet caps:`` then
# ``C-VLAN stripping offload``). Only a key whose value is empty or a hex mask has them.
_LIST_KEY_VALUE = re.compile(r"^(?:0x[0-9A-Fa-f]+)?$")
_LIST_ITEM = re.compile(r"^\s+(?:[A-Za-z][\w -]*|Unknown flags: 0x[0-9A-Fa-f]+)$")
# ... and, among the device attributes, a sentence where a capability is missing: ``tag matching not supported``,
# ``completion_timestamp_mask not supported``, ``core clock not supported``.
_NOT_SUPPORTED = re.compile(r"^\s+[A-Za-z][\w ]* not supported$")


@dataclass(frozen=True)
class Gid:
    """One GID table entry from ``ibv_devinfo -v``; ``kind`` is e.g. ``RoCE v2`` (None on old rdma-core)."""

    index: int
    gid: str
    kind: str | None

    @classmethod
    def from_line(cls, line: str) -> Gid | None:
        """The GID on a ``GID[  3]:  ::ffff:10.0.0.1, RoCE v2`` line, None if the line is not one."""
        match = _GID.match(line)
        return cls(int(match["index"]), match["gid"], match["kind"]) if match else None

    @property
    def ipv4(self) -> str | None:
        """The IPv4 address of an IPv4-mapped GID (``::ffff:a.b.c.d``), the one RoCE v2 routes on."""
        try:
            mapped = ipaddress.IPv6Address(self.gid).ipv4_mapped
        except ValueError:
            return None
        return str(mapped) if mapped else None


@dataclass(frozen=True)
class Port:
    """One HCA port. Fields a tool does not print are None (``rate_gbps`` from ``ibv_devinfo`` needs -v)."""

    number: int
    state: PortState
    physical_state: PhysState | None
    rate_gbps: float | None
    link_layer: LinkLayer | None
    port_guid: str | None = None
    base_lid: int | None = None
    sm_lid: int | None = None
    active_mtu: int | None = None
    gids: tuple[Gid, ...] = ()


@dataclass(frozen=True)
class Ca:
    """One channel adapter (HCA), e.g. ``mlx5_0``."""

    name: str
    ca_type: str | None
    firmware: str | None
    node_guid: str | None
    ports: tuple[Port, ...]


@dataclass(frozen=True)
class IbDevices:
    """All adapters the tool listed; empty when it found none."""

    cas: tuple[Ca, ...]

    def port(self, ca: str, number: int = 1) -> Port | None:
        return next((p for c in self.cas if c.name == ca for p in c.ports if p.number == number), None)


def parse(text: str) -> IbDevices:
    """Parse ``ibstat`` (all adapters, or ``ibstat mlx5_0``).

    Raises :class:`ParseError` when the first line is not ``CA '<name>'``, a port lacks a
    ``State``, or a state word is unknown.
    """
    return _parse(text, "ibstat", "CA '<name>'", ca_header=re.compile(r"^CA '(?P<name>[^']+)'$"),
                  port_header=re.compile(r"^\s+Port (?P<n>\d+):$"))


def parse_devinfo(text: str) -> IbDevices:
    """Parse ``ibv_devinfo`` or ``ibv_devinfo -v``/``-vv`` (GID table and width x speed rate with -v).

    Besides ``key: value`` lines it reads the rest of rdma-core's layout: the ``Device ports:`` title of old
    releases, -v's flag and capability names one per deeper-indented line under a mask or list key (see
    ``_LIST_ITEM``), blocks such as ``tso_caps:`` whose deeper ``key: value`` lines belong to them (kept as
    ``tso_caps.max_tso``), the device-level ``... not supported`` sentences, and ``GID[  n]:`` lines with or
    without their ``, RoCE v2`` type.

    Raises :class:`ParseError` with the offending line when the first line is not ``hca_id: <name>``, a port
    lacks a state, or a line is none of these.
    """
    return _parse(text, "ibv_devinfo", "hca_id: <name>", ca_header=re.compile(r"^hca_id:\s*(?P<name>\S+)$"),
                  port_header=re.compile(r"^\s+port:\s*(?P<n>\d+)$"), nesting=_Nesting())


def _parse(
    text: str, tool: str, first: str, ca_header: re.Pattern[str], port_header: re.Pattern[str],
    nesting: _Nesting | None = None,
) -> IbDevices:
    lines = [(n, line.rstrip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise ParseError(tool, "empty output")
    if len(lines) == 1 and _NO_DEVICES in lines[0][1]:
        return IbDevices(())
    cas: list[Ca] = []
    ca: dict[str, str] | None = None
    ports: list[Port] = []
    port: _PortBuilder | None = None
    for n, line in lines:
        if match := ca_header.match(line):
            if ca is not None:
                cas.append(_ca(ca, ports, port, tool))
            ca, ports, port = {"name": match["name"]}, [], None
            if nesting is not None:
                nesting.close(-1)
            continue
        if ca is None:
            raise ParseError(tool, f"expected an adapter line '{first}' first", line=line, lineno=n)
        if nesting is not None:
            nesting.close(_indent(line))  # a line ends the keys it is not indented under
        if match := port_header.match(line):
            if port is not None:
                ports.append(port.build(tool))
            port = _PortBuilder(int(match["n"]), n, line)
            if nesting is not None:
                nesting.close(-1)
        elif gid := Gid.from_line(line):
            if port is None:
                raise ParseError(tool, "GID outside a port section", line=line, lineno=n)
            port.gids.append(gid)
        elif nesting is not None and nesting.is_list_item(line):
            continue  # a flag or capability name: its key's value is read, the names are not needed
        elif match := _KEY_VALUE.match(line):
            key = match["key"].strip().lower()
            if nesting is not None:
                key = nesting.open(_indent(line), key, match["value"])
            (port.fields if port is not None else ca)[key] = match["value"]
        elif line.strip() == "Device ports:":
            continue  # old ibv_devinfo's title over the ports
        elif nesting is not None and port is None and _NOT_SUPPORTED.match(line):
            continue  # a device capability the adapter lacks
        elif nesting is None and re.fullmatch(r"\s+[A-Z0-9_]+", line):
            continue  # ibstat: a lone flag-like word, accepted as it always was
        else:
            raise ParseError(tool, "not a 'key: value' line" + (" or part of ibv_devinfo's layout" if nesting else ""),
                             line=line, lineno=n)
    assert ca is not None  # lines is non-empty and the first line opened a CA
    cas.append(_ca(ca, ports, port, tool))
    return IbDevices(tuple(cas))


class _Nesting:
    """The ``key:`` lines of ibv_devinfo that the lines after them may be indented under.

    A deeper line under a key whose value is empty or a hex mask may be one of its flag names; a deeper
    ``key: value`` line under a key with an empty value (``tso_caps:``, ``cq moderation caps:``) belongs to that
    block and is named ``block.key``. Indentation is compared with tabs expanded, so recordings whose tabs were
    turned into spaces read the same.
    """

    def __init__(self) -> None:
        self._open: list[tuple[int, str, str]] = []  # (indent, dotted key, value), outermost first

    def close(self, indent: int) -> None:
        """Forget the keys a line at ``indent`` is not under (all of them for -1)."""
        while self._open and self._open[-1][0] >= indent:
            self._open.pop()

    def open(self, indent: int, key: str, value: str) -> str:
        """Note a ``key: value`` line; returns its name, dotted under the block it is in."""
        if self._open and self._open[-1][2] == "":
            key = f"{self._open[-1][1]}.{key}"
        self._open.append((indent, key, value))
        return key

    def is_list_item(self, line: str) -> bool:
        """Whether ``line`` is a flag or capability name under the mask or list key just above it."""
        return bool(self._open and _LIST_KEY_VALUE.match(self._open[-1][2]) and _LIST_ITEM.match(line))


def _indent(line: str) -> int:
    return len(line.expandtabs()) - len(line.expandtabs().lstrip())


class _PortBuilder:
    """Collects one port's fields until the next port or adapter starts."""

    def __init__(self, number: int, lineno: int, line: str) -> None:
        self.number, self.lineno, self.line = number, lineno, line
        self.fields: dict[str, str] = {}
        self.gids: list[Gid] = []

    def build(self, tool: str) -> Port:
        f = self.fields
        state = _lookup(f.get("state"), _STATES)
        if state is None:
            raise ParseError(tool, f"port {self.number}: unknown or missing state {f.get('state')!r}",
                             line=self.line, lineno=self.lineno)
        phys_raw = f.get("physical state", f.get("phys_state"))
        physical_state = _lookup(phys_raw, _PHYS)
        if phys_raw is not None and physical_state is None:
            raise ParseError(tool, f"port {self.number}: unknown physical state {phys_raw!r}",
                             line=self.line, lineno=self.lineno)
        layer = f.get("link layer", f.get("link_layer"))
        return Port(
            number=self.number,
            state=state,
            physical_state=physical_state,
            rate_gbps=_rate(f),
            link_layer=LinkLayer(layer) if layer in {m.value for m in LinkLayer} else None,
            port_guid=f.get("port guid"),
            base_lid=_int(f.get("base lid", f.get("port_lid"))),
            sm_lid=_int(f.get("sm lid", f.get("sm_lid"))),
            active_mtu=_int(_word(f.get("active_mtu"))),
            gids=tuple(self.gids),
        )


def _ca(fields: dict[str, str], ports: list[Port], open_port: _PortBuilder | None, tool: str) -> Ca:
    if open_port is not None:
        ports = [*ports, open_port.build(tool)]
    return Ca(
        name=fields["name"],
        ca_type=fields.get("ca type"),  # ibstat only; ibv_devinfo's vendor_part_id is a different spelling
        firmware=fields.get("firmware version", fields.get("fw_ver")),
        node_guid=fields.get("node guid", fields.get("node_guid")),
        ports=tuple(ports),
    )


def sysfs_state(text: str) -> PortState | None:
    """The port state as the kernel writes it in ``/sys/class/infiniband/*/ports/*/state`` (``4: ACTIVE``)."""
    return _lookup(re.sub(r"^\d+:\s*", "", text), _STATES)


def sysfs_phys_state(text: str) -> PhysState | None:
    """The physical state of ``.../ports/*/phys_state`` (``5: LinkUp``, ``2: Polling``)."""
    return _lookup(re.sub(r"^\d+:\s*", "", text), _PHYS)


def sysfs_rate(text: str) -> float | None:
    """Gb/s from ``.../ports/*/rate`` (``100 Gb/sec (2X HDR)``)."""
    match = re.match(r"^(\d+(?:\.\d+)?) Gb/sec", text.strip())
    return float(match.group(1)) if match else None


def _lookup(value: str | None, table: dict[str, _E]) -> _E | None:
    """Map a tool's state word (``Active``, ``PORT_ACTIVE (4)``, ``LINK_UP (5)``) through ``table``."""
    word = _word(value)
    if word is None:
        return None
    word = word.lower()
    return table.get(word) or table.get(word.removeprefix("port_"))


def _word(value: str | None) -> str | None:
    """``PORT_ACTIVE (4)`` -> ``PORT_ACTIVE``; ``Active`` stays."""
    return None if value is None else re.sub(r"\s*\(\d+\)$", "", value).strip()


def _rate(fields: dict[str, str]) -> float | None:
    if "rate" in fields:
        match = re.match(r"^(\d+(?:\.\d+)?)", fields["rate"])
        return float(match.group(1)) if match else None
    width = re.match(r"^(\d+)X", fields.get("active_width", ""))
    speed = re.match(r"^(\d+(?:\.\d+)?) Gbps", fields.get("active_speed", ""))
    return int(width.group(1)) * float(speed.group(1)) if width and speed else None


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value, 0)
    except ValueError:
        return None
