"""iputils ``ping``: summaries recorded on loopback and in namespaces with faults injected."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.errors import ParseError
from clusterrun.facts.parsers import ping

FIXTURES = Path(__file__).parent / "fixtures" / "real" / "ping"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("name", "address", "tx", "rx", "loss", "rtt", "reachable"),
    [
        ("loopback_ok.txt", "127.0.0.1", 3, 3, 0.0, (0.039, 0.052, 0.068, 0.011), True),
        ("ipv6_loopback.txt", "::1", 3, 3, 0.0, (0.071, 0.099, 0.137, 0.027), True),
        ("quiet.txt", "127.0.0.1", 5, 5, 0.0, (0.027, 0.084, 0.233, 0.075), True),
        ("partial_loss.txt", "10.9.9.1", 6, 3, 50.0, (0.049, 0.051, 0.053, 0.001), True),
        ("all_dropped.txt", "10.9.9.1", 3, 0, 100.0, (None, None, None, None), False),
        ("dest_host_unreachable.txt", "10.9.9.2", 4, 0, 100.0, (None, None, None, None), False),
    ],
)
def test_recorded_runs(name: str, address: str, tx: int, rx: int, loss: float, rtt: tuple, reachable: bool) -> None:
    result = ping.parse(fixture(name))

    assert (result.address, result.transmitted, result.received, result.loss_pct) == (address, tx, rx, loss)
    assert (result.rtt_min_ms, result.rtt_avg_ms, result.rtt_max_ms, result.rtt_mdev_ms) == rtt
    assert result.reachable is reachable
    assert result.error is None


def test_unreachable_host_reports_icmp_errors() -> None:
    result = ping.parse(fixture("dest_host_unreachable.txt"))

    assert result.icmp_errors == ("Destination Host Unreachable",)
    assert (result.errors, result.time_ms) == (4, 1545)


def test_dropping_interface_reports_loss_without_icmp_errors() -> None:
    result = ping.parse(fixture("all_dropped.txt"))

    assert (result.icmp_errors, result.errors, result.loss_pct) == ((), 0, 100.0)


def test_ping_failing_before_sending() -> None:
    result = ping.parse(fixture("network_unreachable.txt"))

    assert result.error == "connect: Network is unreachable"
    assert (result.transmitted, result.received, result.loss_pct, result.reachable) == (0, 0, 100.0, False)


def test_decimal_commas_from_a_localized_run() -> None:
    text = fixture("partial_loss.txt").replace("0.049/0.051/0.053/0.001", "0,049/0,051/0,053/0,001")

    assert ping.parse(text).rtt_avg_ms == 0.051


def test_busybox_summary_wording() -> None:
    text = (
        "PING 10.0.0.2 (10.0.0.2): 56 data bytes\n\n--- 10.0.0.2 ping statistics ---\n"
        "3 packets transmitted, 2 packets received, 33% packet loss\nround-trip min/avg/max = 0.061/0.074/0.089 ms\n"
    )

    result = ping.parse(text)

    assert (result.transmitted, result.received, result.loss_pct) == (3, 2, 33.0)
    assert (result.rtt_max_ms, result.rtt_mdev_ms) == (0.089, None)


@pytest.mark.parametrize(
    "text",
    ["", "hello\n", "\n".join(fixture("loopback_ok.txt").splitlines()[:4]) + "\n"],  # cut before the summary
    ids=["empty", "garbage", "truncated"],
)
def test_no_summary_raises(text: str) -> None:
    with pytest.raises(ParseError, match="packets transmitted") as err:
        ping.parse(text)

    assert err.value.tool == "ping"
