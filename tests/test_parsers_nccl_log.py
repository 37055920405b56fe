"""NCCL_DEBUG logs: chosen network and devices, rings, and known failures with hints."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.errors import ParseError
from clusterrun.facts.parsers import nccl_log
from clusterrun.facts.parsers.nccl_log import FailureKind, NetDevice

FIXTURES = Path(__file__).parent / "fixtures" / "real" / "nccl_log"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def kinds(log: nccl_log.NcclLog) -> list[FailureKind]:
    return [f.kind for f in log.failures]


def test_healthy_two_node_socket_init() -> None:
    log = nccl_log.parse(fixture("info_socket_2node_init_complete_nccl_2_21.txt"))

    assert (log.version, log.network, log.oob) == ("2.21.5+cuda12.4", "Socket", "eth0:192.168.1.136")
    assert log.devices == (NetDevice(0, "eth0", address="192.168.1.136"),)
    assert (log.channels, log.nranks, log.nnodes, log.init_complete) == (2, 4, 2, 2)
    assert (log.failures, log.gpu_direct_rdma) == ((), False)


def test_old_nccl_single_node_ignores_benign_libibverbs_warning() -> None:
    log = nccl_log.parse(fixture("info_single_node_init_complete_nccl_2_4.txt"))

    assert (log.version, log.network, log.nranks, log.init_complete) == ("2.4.8+cuda10.0", "Socket", 1, 1)
    assert log.oob == "eno1:192.168.50.11"  # old "Bootstrap : Using [0]eno1:..." form
    assert log.failures == ()


@pytest.mark.parametrize(
    ("lineno", "network", "devices", "oob"),
    [
        (1, "FastSocket", [("ibs108", "10.0.19.12", None, None), ("ibs115", "10.0.19.19", None, None)], None),
        (2, "IB", [("mlx5_0", None, 1, "IB"), ("mlx5_7", None, 1, "IB")], "eno1:101.262.0.9"),
        (3, "IB", [("mlx5_0", None, 1, "IB"), ("mlx5_bond_0", None, 1, "RoCE")], "ibp25s0:10.0.12.82"),
        (4, "Socket", [("eth0", "10.0.0.23", None, None)], None),
    ],
)
def test_net_selection_lines(lineno: int, network: str, devices: list[tuple], oob: str | None) -> None:
    line = fixture("info_net_interface_selection.txt").splitlines()[lineno - 1]

    log = nccl_log.parse(line)

    got = [(d.name, d.address, d.port, d.link) for d in log.devices]
    assert log.network == network
    assert [got[0], got[-1]] == devices[:1] + devices[-1:]
    assert [d.index for d in log.devices] == list(range(len(log.devices)))
    assert log.oob == oob


@pytest.mark.parametrize(
    ("name", "expected", "first_lineno"),
    [
        ("warn_socket_no_route_to_host.txt", [FailureKind.SOCKET_CONNECT], 1),
        ("warn_connect_failed_no_route_nccl_2_4.txt", [FailureKind.SOCKET_CONNECT] * 2, 8),
        ("warn_bootstrap_no_socket_interface_torch_traceback.txt",
         [FailureKind.NO_SOCKET_INTERFACE, FailureKind.INTERNAL_ERROR], 3),
        ("warn_ib_completion_error12.txt", [FailureKind.IB_COMPLETION_ERROR], 3),
        ("warn_shm_no_space_docker.txt", [FailureKind.SHM_NO_SPACE, FailureKind.SHM_NO_SPACE, FailureKind.OTHER_WARN], 1),
        ("torch_unhandled_system_error_traceback.txt", [FailureKind.UNHANDLED_SYSTEM_ERROR], 8),
        ("torch_watchdog_timeout_broadcast.txt", [FailureKind.TIMEOUT] * 2, 5),
    ],
)
def test_failures_are_found_with_line_and_hint(name: str, expected: list[FailureKind], first_lineno: int) -> None:
    log = nccl_log.parse(fixture(name))

    assert kinds(log) == expected
    assert log.failures[0].lineno == first_lineno
    assert log.failures[0].line == fixture(name).splitlines()[first_lineno - 1].strip()
    assert all(f.hint for f in log.failures)


def test_socket_failure_hint_points_at_socket_ifname() -> None:
    (first, _) = nccl_log.parse(fixture("warn_connect_failed_no_route_nccl_2_4.txt")).failures

    assert "192.168.80.157<34630>" in first.line
    assert "NCCL_SOCKET_IFNAME" in first.hint


def test_shm_hint_names_shm_size() -> None:
    log = nccl_log.parse(fixture("warn_shm_no_space_docker.txt"))

    assert "--shm-size" in log.failures[0].hint
    assert log.failures[2].line.endswith("NCCL WARN Socket recv failed")


def test_ib_devices_and_oob_from_a_failing_run() -> None:
    log = nccl_log.parse(fixture("warn_ib_completion_error12.txt"))

    assert [(d.name, d.link) for d in log.devices] == [("ibP111p0s0", "IB"), ("rdmaP1111p0s2", "RoCE")]
    assert log.oob == "eth0:10.2.0.4"
    assert "error 12" in log.failures[0].line


@pytest.mark.parametrize("text", ["", "Epoch: [0][ 10/625]\tTime  1.425 ( 2.465)\n"])
def test_log_without_nccl_lines_is_empty(text: str) -> None:
    log = nccl_log.parse(text)

    assert (log.nccl_lines, log.version, log.network, log.failures) == (0, None, None, ())


def test_unknown_device_list_raises() -> None:
    with pytest.raises(ParseError, match="unknown device entry") as err:
        nccl_log.parse("ok\nnode:1:1 [0] NCCL INFO NET/IB : Using mlx5_0 port one\n")

    assert err.value.lineno == 2
