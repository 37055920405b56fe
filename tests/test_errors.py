"""The exception tree's ``reason``: what a per-node report shows after the node's name, for our errors and the
standard library's alike (clusterrun/errors.py)."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest

from clusterrun.errors import ClusterrunError, ConnectError, StartError, UsageError, reason_of


def test_a_node_error_s_reason_leaves_out_the_node() -> None:
    exc = ConnectError("gpu03", "connection refused on port 22")
    assert str(exc) == "gpu03: connection refused on port 22"
    assert exc.reason == reason_of(exc) == "connection refused on port 22"


@pytest.mark.parametrize("exc", [UsageError("--nodes must be at least 1"), ClusterrunError("no plan fits"),
                                 StartError({"gpu01": "no torch"}, "install torch there")])
def test_any_other_error_s_reason_is_its_whole_message(exc: ClusterrunError) -> None:
    assert exc.reason == reason_of(exc) == str(exc)


def test_a_refused_connect_through_urllib_gives_the_socket_s_reason() -> None:
    with socket.socket() as held:  # a port of this machine that nothing listens on: connects are refused
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        with pytest.raises(urllib.error.URLError) as caught:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)
    assert reason_of(caught.value) == str(caught.value.reason)
    assert "refused" in reason_of(caught.value).lower()
    assert reason_of(ValueError("unknown url type: 'ftp'")) == "unknown url type: 'ftp'"
