"""``iperf3 -J``: loopback runs recorded with iperf 3.12, including its in-JSON errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.errors import ParseError
from clusterrun.facts.parsers import iperf3

FIXTURES = Path(__file__).parent / "fixtures" / "real" / "iperf3"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_tcp_run() -> None:
    result = iperf3.parse(fixture("tcp_loopback.json"))

    assert (result.protocol, result.streams, result.reverse, result.error) == ("TCP", 1, False, None)
    assert result.sender_bps == pytest.approx(15808131419.46539)
    assert result.receiver_bps == pytest.approx(15806962029.365665)
    assert result.receiver_gbps == pytest.approx(15.807, abs=0.001)
    assert (result.retransmits, result.sender_bytes, result.receiver_bytes) == (0, 1976565760, 1976565760)
    assert result.duration_s == pytest.approx(1.000278)
    assert result.version == "iperf 3.12"


def test_reverse_with_two_streams() -> None:
    result = iperf3.parse(fixture("tcp_reverse_p2.json"))

    assert (result.reverse, result.streams) == (True, 2)
    assert result.receiver_bps == pytest.approx(28743952777.086124)


def test_udp_reports_loss_not_retransmits() -> None:
    result = iperf3.parse(fixture("udp_loopback.json"))

    assert (result.protocol, result.retransmits, result.lost_percent) == ("UDP", None, 0.0)
    assert result.sender_bps == pytest.approx(499605496.3492994)


def test_connection_refused_is_an_error_without_numbers() -> None:
    result = iperf3.parse(fixture("connection_refused.json"))

    assert result.error == "unable to connect to server: Connection refused"
    assert (result.sender_bps, result.receiver_bps, result.protocol) == (None, None, None)


def test_server_killed_mid_test_keeps_error_and_partial_sums() -> None:
    result = iperf3.parse(fixture("server_killed.json"))

    assert result.error == "the server has terminated"
    assert result.sender_bps == pytest.approx(24336962220.75559)
    assert result.receiver_bps == 0.0


@pytest.mark.parametrize(
    ("text", "lineno"),
    [
        ("", None),
        ("iperf3: error - unable to connect to server: Connection refused\n", 1),  # run without -J
        ('{"intervals": []}', None),
        (fixture("tcp_loopback.json")[:700], 30),  # cut mid-output, inside "test_start"
    ],
    ids=["empty", "plain-text", "no-start-end", "truncated"],
)
def test_not_iperf3_json_raises(text: str, lineno: int | None) -> None:
    with pytest.raises(ParseError) as err:
        iperf3.parse(text)

    assert err.value.tool == "iperf3"
    assert err.value.lineno == lineno
