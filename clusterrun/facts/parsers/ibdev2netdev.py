"""``ibdev2netdev [-v]`` (MLNX_OFED / mlnx-tools): which network interface each RDMA port drives.

One line per port::

    mlx5_0 port 1 ==> ib0 (Up)
    0000:4b:00.0 mlx5_2 (MT4119 - MCX515A-CCAT) CX515A - ConnectX-5 QSFP28 fw 16.27.1016 port 1 (ACTIVE) ==> ens6 (Up)
    mlx4_0 port 1 <===> ib0

The first is the plain form, the second ``-v`` (PCI address, device id and part number, the
adapter's description, firmware, and the RDMA port's own state), the third the script's
"old style" for drivers without ``dev_id`` (no link state). ``(Up)``/``(Down)`` is the
netdev's carrier: for RoCE the Ethernet link itself, for InfiniBand only the IPoIB
interface (an InfiniBand port can carry RDMA while its IPoIB interface is Down).

Lines that are none of these (``cat: ...: Permission denied`` when a non-root user reads the
adapter's VPD, a pasted ``ifconfig`` line, a trailing ``# comment``) are skipped. Output with
no line at all is the script's answer on a node without Mellanox netdevs: no ports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from clusterrun.errors import ParseError
from clusterrun.facts.parsers.ibstat import PortState

TOOL = "ibdev2netdev"

_PCI = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
# -v: "<pci> <hca> (<device id> - <part>) <description> fw <fw> port <n> (<port state>) ==> <netdev> (<state>)";
# the description can be empty or padded with spaces, the PCI address empty when the script did not find it.
_VERBOSE = re.compile(
    rf"^\s*(?:(?P<pci>{_PCI})\s+)?(?P<hca>\S+)\s+\((?P<device>[^\s()]+)\s*-\s*(?P<part>[^()]*?)\s*\)"
    r"(?:\s+.*?)??\s+fw\s+(?P<fw>\S+)\s+port\s+(?P<port>\d+)\s+\((?P<port_state>[^()]*)\)"
    r"\s+==>\s+(?P<netdev>\S+)\s+\((?P<state>[^()]*)\)"
)
_PLAIN = re.compile(r"^\s*(?P<hca>\S+)\s+port\s+(?P<port>\d+)\s+==>\s+(?P<netdev>\S+)\s+\((?P<state>[^()]*)\)")
_OLD_STYLE = re.compile(r"^\s*(?P<hca>\S+)\s+port\s+(?P<port>\d+)\s+<===>\s+(?P<netdev>\S+)\s*$")
_PORT_STATES = {s.value: s for s in PortState}


class NetdevState(Enum):
    """The netdev's carrier as ibdev2netdev prints it; UNKNOWN for ``NA``, ``()`` or the old style."""

    UP = "Up"
    DOWN = "Down"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class PortNetdev:
    """One RDMA port and its netdev. The ``-v`` fields are None in the plain form (``part`` also for ``NA``)."""

    hca: str
    port: int
    netdev: str
    state: NetdevState
    pci: str | None = None
    device: str | None = None  # e.g. MT4119
    part: str | None = None  # e.g. MCX515A-CCAT
    firmware: str | None = None
    port_state: PortState | None = None  # the RDMA port's own state (-v); None for NA

    @property
    def up(self) -> bool:
        return self.state is NetdevState.UP


@dataclass(frozen=True)
class PortNetdevs:
    """Every port ibdev2netdev listed, in its order; empty when it listed none."""

    ports: tuple[PortNetdev, ...]

    def port(self, hca: str, number: int = 1) -> PortNetdev | None:
        return next((p for p in self.ports if p.hca == hca and p.port == number), None)

    def of_netdev(self, netdev: str) -> PortNetdev | None:
        """The port whose netdev is ``netdev``, if any."""
        return next((p for p in self.ports if p.netdev == netdev), None)


def parse(text: str) -> PortNetdevs:
    """Parse ``ibdev2netdev`` or ``ibdev2netdev -v`` output, tolerating lines that are not port lines.

    Raises :class:`ParseError` (naming the first line) when there are lines but not one of them is a port line.
    """
    ports: list[PortNetdev] = []
    first: tuple[int, str] | None = None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        first = first or (n, line)
        if entry := _line(line):
            ports.append(entry)
    if not ports and first is not None:
        raise ParseError(TOOL, "no '<hca> port <n> ==> <netdev> (<state>)' line", line=first[1], lineno=first[0])
    return PortNetdevs(tuple(ports))


def _line(line: str) -> PortNetdev | None:
    if m := _VERBOSE.match(line):
        part = m["part"].strip()
        return PortNetdev(m["hca"], int(m["port"]), m["netdev"], _state(m["state"]), pci=m["pci"],
                          device=m["device"], part=None if part in ("", "NA") else part, firmware=m["fw"],
                          port_state=_PORT_STATES.get(m["port_state"].strip().upper()))
    if m := _PLAIN.match(line):
        return PortNetdev(m["hca"], int(m["port"]), m["netdev"], _state(m["state"]))
    if m := _OLD_STYLE.match(line):
        return PortNetdev(m["hca"], int(m["port"]), m["netdev"], NetdevState.UNKNOWN)
    return None


def _state(word: str) -> NetdevState:
    return {"up": NetdevState.UP, "down": NetdevState.DOWN}.get(word.strip().lower(), NetdevState.UNKNOWN)
