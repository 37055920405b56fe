"""iputils ``ping`` output: the statistics summary, ICMP errors, and ping's own failures.

Expected command: ``LC_ALL=C ping -n -c <count> -W <timeout> [-I <interface>] <address>``.
Also reads ``-q`` output and the BusyBox summary wording. A decimal comma (from a
locale that was not forced to C) is accepted in numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clusterrun.errors import ParseError

TOOL = "ping"

_NUM = r"\d+(?:[.,]\d+)?"
_HEADER = re.compile(r"^PING (?P<dest>[^\s(]+) ?\((?P<addr>[^)]+)\)")
_STATS = re.compile(
    r"^(?P<tx>\d+) packets transmitted, (?P<rx>\d+)(?: packets)? received"
    r"(?:, \+(?P<dup>\d+) duplicates)?(?:, \+(?P<corrupt>\d+) corrupted)?(?:, \+(?P<err>\d+) errors)?"
    rf", (?P<loss>{_NUM})% packet loss(?:, time (?P<time>\d+)\s*ms)?"
)
_RTT = re.compile(rf"^(?:rtt|round-trip) min/avg/max(?:/(?:mdev|stddev))? = (?P<values>{_NUM}(?:/{_NUM})+) ms")
_ICMP_ERROR = re.compile(r"^From \S+(?: \([^)]*\))?:? icmp_seq=\d+ (?P<what>.+)$")
_PING_FAILURE = re.compile(r"^ping: (?P<message>.+)$")


@dataclass(frozen=True)
class PingResult:
    """One ping run. When ping failed before sending (``error`` set), counts are 0 and loss 100%.

    ``icmp_errors`` holds the distinct ICMP error texts peers or routers sent back, e.g.
    ``Destination Host Unreachable``.
    """

    destination: str | None
    address: str | None
    transmitted: int
    received: int
    errors: int
    duplicates: int
    loss_pct: float
    time_ms: int | None
    rtt_min_ms: float | None
    rtt_avg_ms: float | None
    rtt_max_ms: float | None
    rtt_mdev_ms: float | None
    icmp_errors: tuple[str, ...]
    error: str | None

    @property
    def reachable(self) -> bool:
        return self.received > 0


def parse(text: str) -> PingResult:
    """Parse iputils ``ping`` output.

    Raises :class:`ParseError` when there is neither a statistics line nor a ``ping: ...``
    failure (not ping output, or output cut before the summary).
    """
    destination = address = error = None
    stats: re.Match[str] | None = None
    rtt: list[float | None] = [None, None, None, None]
    icmp_errors: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if match := _HEADER.match(line):
            destination, address = match["dest"], match["addr"]
        elif match := _STATS.match(line):
            stats = match
        elif match := _RTT.match(line):
            values = [_float(v) for v in match["values"].split("/")]
            rtt = [*values, None, None, None, None][:4]  # BusyBox prints no mdev
        elif (match := _ICMP_ERROR.match(line)) and match["what"] not in icmp_errors:
            icmp_errors.append(match["what"])
        elif (match := _PING_FAILURE.match(line)) and error is None:
            error = match["message"]
    if stats is None:
        if error is not None:
            return PingResult(destination, address, 0, 0, 0, 0, 100.0, None, None, None, None, None,
                              tuple(icmp_errors), error)
        lineno, first = next(((n, s) for n, s in enumerate(text.splitlines(), 1) if s.strip()), (None, None))
        raise ParseError(TOOL, "no 'packets transmitted' summary (not ping output, or cut short)",
                         line=first, lineno=lineno)
    return PingResult(
        destination=destination,
        address=address,
        transmitted=int(stats["tx"]),
        received=int(stats["rx"]),
        errors=int(stats["err"] or 0),
        duplicates=int(stats["dup"] or 0),
        loss_pct=_float(stats["loss"]),
        time_ms=int(stats["time"]) if stats["time"] else None,
        rtt_min_ms=rtt[0],
        rtt_avg_ms=rtt[1],
        rtt_max_ms=rtt[2],
        rtt_mdev_ms=rtt[3],
        icmp_errors=tuple(icmp_errors),
        error=error,
    )


def _float(value: str) -> float:
    return float(value.replace(",", "."))
