"""``show_gids`` (MLNX_OFED / mlnx-tools): the GID table of every RDMA port, with each GID's netdev.

The script prints a header, a dashed line, one tab-separated row per non-zero GID and a count::

    DEV     PORT    INDEX   GID                                     IPv4            VER     DEV
    ---     ----    -----   ---                                     ------------    ---     ---
    mlx5_0  1       2       0000:0000:0000:0000:0000:ffff:ac13:003c 172.19.0.60     v1      ens1f0
    mlx5_0  1       3       0000:0000:0000:0000:0000:ffff:ac13:003c 172.19.0.60     v2      ens1f0
    n_gids_found=2

IPv4 is empty for IPv6 GIDs (link-local ``fe80:...`` ones included), VER is ``v1`` (RoCE v1,
or InfiniBand) or ``v2`` (RoCE v2, the routable one), and both VER and the netdev may be
empty (an InfiniBand port has no netdev per GID). Unlike ``ibv_devinfo -v`` it names the netdev of
each GID, which tells apart two RoCE v2 GIDs of the same address on a bond and a VXLAN on top of it.

Rows are read by their fields, so tabs turned into spaces read the same; lines that are not
rows (warnings before the table, a prompt, a blank line) are skipped. A table with no rows
(``n_gids_found=0``) is a result, not an error.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from clusterrun.errors import ParseError

TOOL = "show_gids"

_GID = re.compile(r"^[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{1,4}){7}$")
_VERSION = re.compile(r"^[vV]\d$")
_HEADER = re.compile(r"^\s*DEV\s+PORT\s+INDEX\s+GID\b")
_DASHES = re.compile(r"^[\s-]+$")
_COUNT = re.compile(r"^\s*n_gids_found=(\d+)\s*$")


@dataclass(frozen=True)
class GidRow:
    """One GID of a port. ``version`` is ``v1``/``v2`` or None; ``ipv4`` and ``netdev`` None when not printed."""

    hca: str
    port: int
    index: int
    gid: str
    ipv4: str | None
    version: str | None
    netdev: str | None

    @property
    def roce_v2(self) -> bool:
        return self.version == "v2"

    @property
    def address(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        """The address the GID carries: the IPv4 of an IPv4-mapped GID, else the GID as an IPv6 address."""
        gid = ipaddress.IPv6Address(self.gid)
        return gid.ipv4_mapped or gid


@dataclass(frozen=True)
class GidTable:
    """Every row, in the script's order; ``count`` is its ``n_gids_found`` (None when the line is missing)."""

    rows: tuple[GidRow, ...]
    count: int | None

    def port(self, hca: str, number: int = 1) -> tuple[GidRow, ...]:
        return tuple(r for r in self.rows if r.hca == hca and r.port == number)


def parse(text: str) -> GidTable:
    """Parse ``show_gids`` output.

    Raises :class:`ParseError` when there is neither the header, a row, nor the ``n_gids_found`` line
    (naming the first line, or "empty output").
    """
    rows: list[GidRow] = []
    count: int | None = None
    header = False
    first: tuple[int, str] | None = None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        first = first or (n, line)
        if _HEADER.match(line):
            header = True
        elif m := _COUNT.match(line):
            count = int(m.group(1))
        elif not _DASHES.match(line) and (row := _row(line)) is not None:
            rows.append(row)
    if first is None:
        raise ParseError(TOOL, "empty output")
    if not (header or rows or count is not None):
        raise ParseError(TOOL, "no 'DEV PORT INDEX GID ...' table", line=first[1], lineno=first[0])
    return GidTable(tuple(rows), count)


def _row(line: str) -> GidRow | None:
    """``DEV PORT INDEX GID [IPv4] [VER] [DEV]``, or None when the line is not one."""
    words = line.split()
    if len(words) < 4 or not (words[1].isdigit() and words[2].isdigit() and _GID.match(words[3])):
        return None
    rest = words[4:]
    ipv4 = rest.pop(0) if rest and _is_ipv4(rest[0]) else None
    version = rest.pop(0).lower() if rest and _VERSION.match(rest[0]) else None
    netdev = rest.pop(0) if rest else None
    if rest:
        return None
    return GidRow(words[0], int(words[1]), int(words[2]), words[3], ipv4, version, netdev)


def _is_ipv4(word: str) -> bool:
    try:
        ipaddress.IPv4Address(word)
    except ValueError:
        return False
    return True
