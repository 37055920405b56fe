"""``ibstat`` and ``ibv_devinfo``: port state, physical state, rate, link layer, GIDs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from clusterrun.errors import ParseError
from clusterrun.facts.parsers import ibstat
from clusterrun.facts.parsers.ibstat import Gid, IbDevices, LinkLayer, PhysState, PortState

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


CX6DX = "ibv_devinfo_vv_roce_bond_cx6dx.txt"  # real `ibv_devinfo -vv`, device capability lines and all


@pytest.mark.parametrize(
    "text",
    [fixture(CX6DX), fixture(CX6DX).expandtabs()],
    ids=["as-recorded", "tabs-as-spaces"],  # the second: the recording as a copy-paste that turned tabs into spaces
)
@pytest.mark.parametrize(
    ("what", "read", "expected"),
    [
        ("device names", lambda d: [c.name for c in d.cas], ["mlx5_bond_0"]),
        ("firmware and node GUID", lambda d: [(c.firmware, c.node_guid) for c in d.cas],
         [("22.36.1010", "08c0:eb03:00f0:28b2")]),
        ("port states", lambda d: [(c.name, p.number, p.state, p.physical_state) for c in d.cas for p in c.ports],
         [("mlx5_bond_0", 1, PortState.ACTIVE, PhysState.LINK_UP)]),
        ("link layers", lambda d: [p.link_layer for c in d.cas for p in c.ports], [LinkLayer.ETHERNET]),
        ("rate, MTU and LIDs", lambda d: [(p.rate_gbps, p.active_mtu, p.base_lid, p.sm_lid) for c in d.cas
                                          for p in c.ports], [(100.0, 4096, 0, 0)]),  # 2X x 50.0 Gbps
        ("GID table", lambda d: [(g.index, g.kind) for g in d.cas[0].ports[0].gids],
         [(0, "RoCE v1"), (1, "RoCE v2"), (2, "RoCE v1"), (3, "RoCE v2")]),
        ("RoCE v2 GIDs", lambda d: [(g.index, g.gid, g.ipv4) for g in d.cas[0].ports[0].gids if g.kind == "RoCE v2"],
         [(1, "fe80::ac0:ebff:fef0:28b2", None), (3, "::ffff:27.105.179.3", "27.105.179.3")]),
    ],
)
def test_ibv_devinfo_vv_cx6dx_bond(text: str, what: str, read: Callable[[IbDevices], object], expected: object) -> None:
    # NO SUPPORT, C-VLAN stripping offload, tag matching not supported, flag lists under device_cap_flags: ...
    # are all part of the format: the whole recording parses, and these are what it shows.
    assert read(ibstat.parse_devinfo(text)) == expected, what


def test_ibv_devinfo_vv_two_adapters() -> None:
    # the real recording twice, the second renamed and its port taken down (synthetic edits)
    second = fixture(CX6DX).replace("mlx5_bond_0", "mlx5_bond_1").replace("PORT_ACTIVE (4)", "PORT_DOWN (1)")

    cas = ibstat.parse_devinfo(fixture(CX6DX) + "\n" + second).cas

    assert [(c.name, c.ports[0].state, len(c.ports[0].gids)) for c in cas] == [
        ("mlx5_bond_0", PortState.ACTIVE, 4), ("mlx5_bond_1", PortState.DOWN, 4)]


def _insert_after(text: str, anchor: str, line: str) -> tuple[str, int]:
    """``text`` with ``line`` put after the line that is ``anchor``; also the new line's number."""
    lines = text.splitlines(keepends=True)
    at = next(i for i, old in enumerate(lines) if old.rstrip("\n") == anchor) + 1
    return "".join([*lines[:at], line + "\n", *lines[at:]]), at + 1


@pytest.mark.parametrize(
    ("anchor", "line", "match"),
    [
        # not ibv_devinfo output at all: a shell prompt, a stray message
        ("\tmax_qp:\t\t\t\t131072", "[root@host ~]# ibv_devinfo -vv", "key: value"),
        ("\tnum_comp_vectors:\t\t63", "garbage without a colon", "key: value"),
        # a flag name needs a mask or list key above it: vendor_part_id has neither
        ("\tvendor_part_id:\t\t\t4125", "\t\t\t\t\tBAD_PKEY_CNTR", "key: value"),
        # ... nor does a port's link layer
        ("\t\t\tlink_layer:\t\tEthernet", "\t\t\t\t\tsome words here", "key: value"),
        # the "... not supported" sentences are device attributes, never in a port section
        ("\t\t\tactive_mtu:\t\t4096 (5)", "\ttag matching not supported", "key: value"),
        # a GID belongs to a port
        ("\tphys_port_cnt:\t\t\t1", "\t\t\tGID[  0]:\t\tfe80::1, RoCE v2", "GID outside a port"),
    ],
    ids=["prompt", "garbage", "flag-without-mask", "flag-under-port-value", "not-supported-in-port", "gid-outside-port"],
)
def test_ibv_devinfo_vv_rejects_lines_that_are_not_its_format(anchor: str, line: str, match: str) -> None:
    text, lineno = _insert_after(fixture(CX6DX), anchor, line)

    with pytest.raises(ParseError, match=match) as err:
        ibstat.parse_devinfo(text)

    assert (err.value.tool, err.value.line, err.value.lineno) == ("ibv_devinfo", line, lineno)


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
