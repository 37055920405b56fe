"""``ibdev2netdev [-v]``: each RDMA port's netdev and its state, on recorded real outputs (every row checked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.errors import ParseError
from clusterrun.facts.parsers import ibdev2netdev
from clusterrun.facts.parsers.ibdev2netdev import NetdevState, PortNetdev
from clusterrun.facts.parsers.ibstat import PortState

FIXTURES = Path(__file__).parent / "fixtures" / "real" / "ibdev2netdev"
UP, DOWN = NetdevState.UP, NetdevState.DOWN
ACTIVE, PDOWN = PortState.ACTIVE, PortState.DOWN


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def plain(rows: list[tuple[str, str, NetdevState]]) -> list[tuple[str, int, str, NetdevState]]:
    """Plain-form rows: every port is port 1."""
    return [(hca, 1, netdev, state) for hca, netdev, state in rows]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # `| column -t` with the author's `# CX-7 ...` comments: padded fields, trailing text ignored
        ("h100_ib_and_eth_column_t_commented.txt", plain([
            ("mlx5_0", "ibp26s0", DOWN), ("mlx5_1", "enp27s0f0np0", UP), ("mlx5_10", "ibp204s0", DOWN),
            ("mlx5_11", "ibp220s0", DOWN), ("mlx5_2", "enp27s0f1np1", DOWN), ("mlx5_3", "ibp60s0", DOWN),
            ("mlx5_4", "ibp77s0", DOWN), ("mlx5_5", "ibp94s0", DOWN), ("mlx5_6", "ibp156s0", DOWN),
            ("mlx5_7", "enp157s0f0np0", UP), ("mlx5_8", "enp157s0f1np1", DOWN), ("mlx5_9", "ibp188s0", DOWN)])),
        ("pod_sriov_vf_down.txt", plain([("mlx5_3", "net1", DOWN)])),
        ("roce_and_ib_mixed.txt", plain([
            ("mlx5_0", "ens4f0", DOWN), ("mlx5_1", "ens4f1", DOWN), ("mlx5_2", "ens6", UP), ("mlx5_3", "ens14f0", UP),
            ("mlx5_4", "ens14f1", DOWN), ("mlx5_5", "ib0", UP), ("mlx5_6", "ens6f1", DOWN),
            ("mlx5_7", "ens6f2", DOWN)])),
    ],
)
def test_plain_form_rows(name: str, expected: list[tuple[str, int, str, NetdevState]]) -> None:
    ports = ibdev2netdev.parse(fixture(name)).ports

    assert [(p.hca, p.port, p.netdev, p.state) for p in ports] == expected
    # the plain form has none of -v's fields
    assert {(p.pci, p.device, p.part, p.firmware, p.port_state) for p in ports} == {(None, None, None, None, None)}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # ConnectX-4 Lx/5 RoCE ports, a Socket Direct ConnectX-6 on InfiniBand with a space-padded description,
        # and VFs whose VPD gives no part number ("NA") or description
        ("v_roce_and_ib_mixed_socket_direct.txt", [
            ("0000:31:00.0", "mlx5_0", "MT4117", "MT2138K10121", "14.27.1016", 1, PDOWN, "ens4f0", DOWN),
            ("0000:31:00.1", "mlx5_1", "MT4117", "MT2138K10121", "14.27.1016", 1, PDOWN, "ens4f1", DOWN),
            ("0000:4b:00.0", "mlx5_2", "MT4119", "MCX515A-CCAT", "16.27.1016", 1, ACTIVE, "ens6", UP),
            ("0000:98:00.0", "mlx5_3", "MT4117", "MT2138K10336", "14.27.1016", 1, ACTIVE, "ens14f0", UP),
            ("0000:98:00.1", "mlx5_4", "MT4117", "MT2138K10336", "14.27.1016", 1, PDOWN, "ens14f1", DOWN),
            ("0000:b1:00.0", "mlx5_5", "MT4123", "MCX654105A-HCAT", "20.30.1004", 1, ACTIVE, "ib0", UP),
            ("0000:4b:00.1", "mlx5_6", "MT4120", None, "16.27.1016", 1, PDOWN, "ens6f1", DOWN),
            ("0000:4b:00.2", "mlx5_7", "MT4120", None, "16.27.1016", 1, PDOWN, "ens6f2", DOWN)]),
        ("v_sriov_vfs_connectx4.txt", [
            ("0000:02:00.0", "mlx5_0", "MT4115", "MT1523X04353", "12.23.1020", 1, ACTIVE, "enp2s0f0", UP),
            ("0000:02:00.1", "mlx5_1", "MT4115", "MT1523X04353", "12.23.1020", 1, ACTIVE, "enp2s0f1", UP),
            ("0000:02:00.5", "mlx5_2", "MT4116", None, "12.23.1020", 1, PDOWN, "enp2s0f2", DOWN),
            ("0000:02:00.6", "mlx5_3", "MT4116", None, "12.23.1020", 1, PDOWN, "enp2s0f3", DOWN),
            ("0000:02:00.7", "mlx5_4", "MT4116", None, "12.23.1020", 1, PDOWN, "enp2s0f4", DOWN),
            ("0000:02:00.2", "mlx5_5", "MT4116", None, "12.23.1020", 1, PDOWN, "enp2s0f5", DOWN)]),
        # BlueField-3: one port on InfiniBand (IPoIB ibs2f0), one on Ethernet; indented as in the docs it came from
        ("v_bluefield3_openshift_docs.txt", [
            ("0000:0d:00.0", "mlx5_0", "MT41692", "900-9D3B4-00EN-EA0", "32.42.1000", 1, ACTIVE, "ibs2f0", UP),
            ("0000:a0:00.0", "mlx5_1", "MT41692", "900-9D3B4-00EN-EA0", "32.42.1000", 1, ACTIVE, "ens8f0np0", UP)]),
        # ifconfig lines pasted between the port lines, a description with parentheses, "(o2ib)" after the state
        ("v_lustre_interleaved_ifconfig.txt", [
            ("0000:b8:00.1", "mlx5_13", "MT4123", "MCX653106A-ECAT", "20.26.4012", 1, ACTIVE, "ib4", UP),
            ("0000:bd:00.1", "mlx5_15", "MT4123", "MCX653106A-ECAT", "20.26.4012", 1, ACTIVE, "ib5", UP)]),
    ],
)
def test_verbose_form_rows(name: str, expected: list[tuple[object, ...]]) -> None:
    ports = ibdev2netdev.parse(fixture(name)).ports

    assert [(p.pci, p.hca, p.device, p.part, p.firmware, p.port, p.port_state, p.netdev, p.state)
            for p in ports] == expected


def test_lookup_by_port_and_by_netdev() -> None:
    netdevs = ibdev2netdev.parse(fixture("roce_and_ib_mixed.txt"))

    assert netdevs.port("mlx5_5") == PortNetdev("mlx5_5", 1, "ib0", UP)
    assert netdevs.port("mlx5_5", 2) is None and netdevs.port("mlx5_9") is None
    found = netdevs.of_netdev("ens14f1")
    assert found is not None and (found.hca, found.port, found.up) == ("mlx5_4", 1, False)
    assert netdevs.of_netdev("eth0") is None


def test_no_output_is_no_ports() -> None:
    # what the script prints on a node without Mellanox netdevs, or without /sys/class/infiniband: nothing
    assert ibdev2netdev.parse("").ports == ()
    assert ibdev2netdev.parse("\n\n").ports == ()


def test_unknown_lines_around_port_lines_are_skipped() -> None:
    # the real -v recording with a non-root VPD read error in front of it (synthetic line; the script reads
    # /sys/class/infiniband/<hca>/device/vpd, which only root may read on most kernels)
    text = ("cat: /sys/class/infiniband/mlx5_0/device/vpd: Permission denied\n\n"
            + fixture("v_sriov_vfs_connectx4.txt"))

    assert [p.hca for p in ibdev2netdev.parse(text).ports] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4",
                                                               "mlx5_5"]


def test_old_style_line_has_no_state() -> None:
    # the "<===>" form the script prints for drivers without dev_id (format of mlnx-tools' ibdev2netdev)
    (port,) = ibdev2netdev.parse("mlx4_0 port 1 <===> ib0\n").ports

    assert (port.hca, port.port, port.netdev, port.state, port.port_state) == ("mlx4_0", 1, "ib0",
                                                                               NetdevState.UNKNOWN, None)


@pytest.mark.parametrize(
    ("text", "lineno"),
    [
        ("\nibdev2netdev: command not found\n", 2),
        (fixture("v_lustre_interleaved_ifconfig.txt").splitlines(keepends=True)[1], 1),  # an ifconfig line alone
    ],
)
def test_nothing_recognisable_raises(text: str, lineno: int) -> None:
    with pytest.raises(ParseError, match="no '<hca> port <n> ==> <netdev>") as err:
        ibdev2netdev.parse(text)

    assert (err.value.tool, err.value.lineno) == ("ibdev2netdev", lineno)
