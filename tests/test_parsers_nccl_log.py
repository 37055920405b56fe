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


# -- NCCL before 2.4: "NET : Using interface" lines (real logs, tests/fixtures/real/nccl_log/SOURCE.md) ----------

def socket(index: int, name: str, address: str) -> NetDevice:
    return NetDevice(index, name, address=address)


def test_old_ib_log_gives_the_ib_ports_and_the_sideband_interface_not_the_socket_transports() -> None:
    # NVIDIA/nccl#147, NCCL 2.3.5: IB is used; the socket transport, set up after it, lists its one interface too
    log = nccl_log.parse(fixture("info_old_ib_sideband_nccl_2_3.txt"))

    assert (log.version, log.network, log.oob) == ("2.3.5+cuda9.0", "IB", "enp1s0f0:100.97.16.164")
    assert log.devices == tuple(NetDevice(i, f"mlx5_{3 - i}", port=1, link="IB") for i in range(4))
    assert (log.failures, log.nccl_lines) == ((), 10)  # the script's "Using device: 5" is not NCCL's


@pytest.mark.parametrize(
    ("name", "devices", "oob"),
    [
        # horovod/horovod#110, NCCL 2.3.5: a bridge and a bond with only an IPv6 link-local address
        ("info_old_socket_ipv6_nccl_2_3.txt",
         (socket(0, "br0", "10.9.22.45"), socket(1, "bond0", "fe80::ae1f:6bff:fe20:f588%bond0")), "br0:10.9.22.45"),
        # horovod/horovod#67, NCCL 2.0: no "NCCL" in the lines; the sideband interface's run is not the socket one
        ("info_oldest_socket_no_nccl_marker.txt",
         (socket(0, "eno1", "192.168.12.50"), socket(1, "eno2", "192.168.255.229"), socket(2, "virbr0", "192.168.122.1"),
          socket(3, "docker0", "10.1.23.1"), socket(4, "tunl0", "172.1.148.64")), "eno1:192.168.12.50"),
        # horovod/horovod#98, NCCL 2.0: Markdown's ** around two lines, no IB at all
        ("info_oldest_libibverbs_warn_markdown_bold.txt",
         (socket(0, "enp30s0", "192.168.178.46"), socket(1, "docker0", "172.17.0.1"),
          socket(2, "br-bb10fb5deea4", "172.18.0.1"), socket(3, "veth1316791", "fe80::6cfa:a5ff:fec7:3d3b%veth1316791"),
          socket(4, "veth144f6e0", "fe80::60aa:ebff:fe04:af8f%veth144f6e0")), None),
    ],
    ids=["nccl-2.3-ipv6", "nccl-2.0-no-marker", "nccl-2.0-markdown"],
)
def test_old_socket_logs_give_every_interface_nccl_found(name: str, devices: tuple[NetDevice, ...],
                                                         oob: str | None) -> None:
    log = nccl_log.parse(fixture(name))

    assert (log.network, log.devices, log.oob) == ("Socket", devices, oob)
    assert log.nccl_lines == len(fixture(name).splitlines())  # each line is NCCL's, with "NCCL" in it or not
    assert log.failures == ()  # NCCL 2.0's "WARN Failed to open libibverbs.so[.1]" is its fallback to sockets


def test_old_socket_log_counts_its_ranks() -> None:
    assert nccl_log.parse(fixture("info_old_socket_ipv6_nccl_2_3.txt")).nranks == 4


def test_an_unknown_warning_in_nccl_2_0s_format_is_still_reported() -> None:
    # the prefix of info_oldest_libibverbs_warn_markdown_bold.txt's first line with another (made-up) warning
    line = "admin-pc:14733:14828 [1] misc/ibvwrap.cu:60 WARN Something NCCL 2.0 did not expect"

    (finding,) = nccl_log.parse(line).failures

    assert (finding.kind, finding.lineno, finding.line) == (FailureKind.OTHER_WARN, 1, line)


def test_the_loopback_log_of_an_old_nccl_gives_its_three_socket_interfaces() -> None:
    # horovod/horovod#584: read by clusterrun.facts.hints before; now the parser sees the same interfaces
    log = nccl_log.parse(fixture("info_loopback_chosen_connect_timeout_old_nccl.txt"))

    assert (log.network, [(d.name, d.address) for d in log.devices]) == (
        "Socket", [("lo", "127.0.0.1"), ("eth0", "10.151.40.240"), ("eth1", "fe80::215:5dff:fe33:ff6d%eth1")])


def test_an_ib_line_without_devices_names_the_oob_interface_and_lists_nothing() -> None:
    # NVIDIA/nccl#2057, NCCL 2.29: no RDMA device ("NET/IB : Using [RO]; OOB ...") and "Bootstrap:" without a space
    log = nccl_log.parse(fixture("info_ib_no_device_oob_nccl_2_29.txt"))

    assert (log.version, log.network, log.devices, log.oob) == ("2.29.2+cuda12.8", None, (), "eth0:172.17.16.64")
    assert log.failures == ()


def test_bootstrap_without_a_space_before_the_colon_is_read() -> None:
    # the second line of info_ib_no_device_oob_nccl_2_29.txt alone
    line = fixture("info_ib_no_device_oob_nccl_2_29.txt").splitlines()[1]

    assert nccl_log.parse(line).oob == "eth0:172.17.16.64"
