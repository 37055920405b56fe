"""``iperf3 -J`` (JSON) on the client side.

Expected command: ``iperf3 -J -c <server> -p <port> -t <seconds> [-P <streams>] [-R]``.
``sum_sent`` is what the sending end pushed (it carries TCP retransmits), ``sum_received``
what arrived; with ``-R`` the server is the sender. iperf3 reports its failures inside the
JSON (``"error": "unable to connect to server: Connection refused"``), sometimes next to
partial results (the server went away mid-test): both are kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from clusterrun.errors import ParseError

TOOL = "iperf3"


@dataclass(frozen=True)
class Iperf3Result:
    """One test. Throughputs in bits per second; None when the test produced no summary."""

    protocol: str | None  # TCP or UDP
    streams: int | None
    reverse: bool
    duration_s: float | None
    sender_bps: float | None
    receiver_bps: float | None
    sender_bytes: int | None
    receiver_bytes: int | None
    retransmits: int | None  # TCP only
    lost_percent: float | None  # UDP only
    error: str | None
    version: str | None

    @property
    def receiver_gbps(self) -> float | None:
        return None if self.receiver_bps is None else self.receiver_bps / 1e9


def parse(text: str) -> Iperf3Result:
    """Parse the JSON ``iperf3 -J`` prints.

    Raises :class:`ParseError` if the text is not JSON or not an iperf3 report (no
    ``start``/``end`` objects), naming the offending line.
    """
    if not text.strip():
        raise ParseError(TOOL, "empty output")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        lines = text.splitlines()
        line = lines[exc.lineno - 1] if 0 < exc.lineno <= len(lines) else None
        raise ParseError(TOOL, f"not JSON ({exc.msg}); was -J given?", line=line, lineno=exc.lineno) from None
    if not isinstance(data, dict) or not isinstance(data.get("start"), dict) or not isinstance(data.get("end"), dict):
        raise ParseError(TOOL, "JSON without iperf3's 'start' and 'end' objects", line=text.splitlines()[0])
    start: dict[str, Any] = data["start"]
    end: dict[str, Any] = data["end"]
    test = start.get("test_start", {})
    protocol = test.get("protocol")
    sent = end.get("sum_sent") or end.get("sum")
    received = end.get("sum_received") or end.get("sum")
    return Iperf3Result(
        protocol=protocol,
        streams=test.get("num_streams"),
        reverse=bool(test.get("reverse", 0)),
        duration_s=_number(sent, "seconds"),
        sender_bps=_number(sent, "bits_per_second"),
        receiver_bps=_number(received, "bits_per_second"),
        sender_bytes=_int(sent, "bytes"),
        receiver_bytes=_int(received, "bytes"),
        retransmits=_int(sent, "retransmits"),
        lost_percent=_number(end.get("sum"), "lost_percent") if protocol == "UDP" else None,
        error=data.get("error"),
        version=start.get("version"),
    )


def _number(block: Any, key: str) -> float | None:
    value = block.get(key) if isinstance(block, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def _int(block: Any, key: str) -> int | None:
    value = _number(block, key)
    return None if value is None else int(value)
