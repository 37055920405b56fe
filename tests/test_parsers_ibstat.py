"""``ibstat`` and ``ibv_devinfo``: port state, physical state, rate, link layer, GIDs."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.doctor.parsers import ibstat
from clusterrun.doctor.parsers.ibstat import Gid, IbDevices, LinkLayer, PhysState, PortState
from clusterrun.errors import ParseError

FIXTURES = Path(__file__).parent / "fixtures" / "real" / "ibstat"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_ibstat_infiniband_hdr100() -> None:
    (ca,) = ibstat.parse(fixture("ibstat_hdr100.txt")).cas

    assert (ca.name, ca.ca_type, ca.firmware, ca.node_guid) == ("mlx5_0", "MT4123", "20.35.1012", "0xb8599f030022626e")
    (port,) = ca.ports
    assert (port.number, port.state, port.physical_state) == (1, PortState.ACTIVE, PhysState.LINK_UP)
    assert (port.rate_gbps, port.link_layer) == (100.0, LinkLayer.INFINIBAND)
    assert (port.port_guid, port.base_lid, port.sm_lid) == ("0xb8599f030022626e", 762, 8)


def test_ibstat_roce_port_is_ethernet_link_layer() -> None:
    devices = ibstat.parse(fixture("ibstat_roce_ethernet_cx5.txt"))

    port = devices.port("mlx5_0", 1)
    assert port is not None
    assert (port.state, port.physical_state, port.rate_gbps) == (PortState.ACTIVE, PhysState.LINK_UP, 100.0)
    assert port.link_layer is LinkLayer.ETHERNET
    assert port.port_guid == "0x0000000000000000"
    assert devices.port("mlx5_0", 2) is None


@pytest.mark.parametrize(
    ("name", "layer", "mtu", "lid"),
    [
        ("ibv_devinfo_hdr100.txt", LinkLayer.INFINIBAND, 4096, 762),
        ("ibv_devinfo_roce_device_ports_cx5.txt", LinkLayer.ETHERNET, 1024, 0),
    ],
)
def test_ibv_devinfo_ports(name: str, layer: LinkLayer, mtu: int, lid: int) -> None:
    (ca,) = ibstat.parse_devinfo(fixture(name)).cas

    (port,) = ca.ports
    assert (ca.name, port.state, port.link_layer, port.active_mtu, port.base_lid) == ("mlx5_0", PortState.ACTIVE, layer, mtu, lid)
    # Without -v, ibv_devinfo gives neither the physical state nor the rate.
    assert (port.physical_state, port.rate_gbps) == (None, None)


def test_ibv_devinfo_verbose_lines_give_rate_phys_state_and_gids() -> None:
    # The real hdr100 output with -v port lines added: the GID lines are the real fragment's.
    gid_lines = fixture("ibv_devinfo_v_roce_gid_fragment.txt")
    text = (fixture("ibv_devinfo_hdr100.txt")
            + "\t\t\tactive_width:\t\t4X (2)\n\t\t\tactive_speed:\t\t25.0 Gbps (10)\n" + gid_lines)

    port = ibstat.parse_devinfo(text).port("mlx5_0")

    assert port is not None
    assert (port.physical_state, port.rate_gbps) == (PhysState.LINK_UP, 100.0)
    assert [(g.index, g.kind, g.ipv4) for g in port.gids] == [
        (0, "RoCE v1", None), (1, "RoCE v2", None), (2, "RoCE v1", "200.0.209.6"), (3, "RoCE v2", "200.0.209.6"),
    ]


def test_gid_lines_of_the_real_fragment() -> None:
    gids = [g for line in fixture("ibv_devinfo_v_roce_gid_fragment.txt").splitlines() if (g := Gid.from_line(line))]

    roce_v2_ipv4 = [g.index for g in gids if g.kind == "RoCE v2" and g.ipv4 == "200.0.209.6"]
    assert roce_v2_ipv4 == [3]  # index 1 is link-local IPv6, not routable
    assert Gid.from_line("\t\t\tphys_state:\t\tLINK_UP (5)") is None


def test_fragment_without_hca_id_is_not_ibv_devinfo_output() -> None:
    with pytest.raises(ParseError) as err:
        ibstat.parse_devinfo(fixture("ibv_devinfo_v_roce_gid_fragment.txt"))

    assert err.value.lineno == 1
    assert err.value.tool == "ibv_devinfo"


def test_port_down_polling() -> None:
    # The real hdr100 output with its port taken down the way ibstat reports an unplugged cable.
    text = (fixture("ibstat_hdr100.txt").replace("State: Active", "State: Down")
            .replace("Physical state: LinkUp", "Physical state: Polling").replace("Rate: 100", "Rate: 10"))

    port = ibstat.parse(text).port("mlx5_0")

    assert port is not None
    assert (port.state, port.physical_state, port.rate_gbps) == (PortState.DOWN, PhysState.POLLING, 10.0)


def test_several_adapters() -> None:
    text = fixture("ibstat_hdr100.txt") + "\n" + fixture("ibstat_roce_ethernet_cx5.txt").replace("mlx5_0", "mlx5_1")

    cas = ibstat.parse(text).cas

    assert [(c.name, c.ports[0].link_layer) for c in cas] == [("mlx5_0", LinkLayer.INFINIBAND), ("mlx5_1", LinkLayer.ETHERNET)]


def test_no_devices_is_a_finding() -> None:
    assert ibstat.parse_devinfo("No IB devices found\n") == IbDevices(cas=())


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "empty"),
        ("hello\n", "adapter line"),
        (fixture("ibstat_hdr100.txt").replace("State: Active", "State: Sleepy"), "unknown or missing state"),
        (fixture("ibstat_hdr100.txt").replace("\t\tState: Active\n", ""), "unknown or missing state"),
        (fixture("ibstat_hdr100.txt") + "garbage without a colon\n", "key: value"),
    ],
)
def test_not_ibstat_output_raises(text: str, match: str) -> None:
    with pytest.raises(ParseError, match=match):
        ibstat.parse(text)
