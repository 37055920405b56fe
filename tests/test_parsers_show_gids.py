"""``show_gids``: every GID of every RDMA port with its IPv4, RoCE version and netdev, on recorded real outputs."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from clusterrun.errors import ParseError
from clusterrun.facts.parsers import show_gids
from clusterrun.facts.parsers.show_gids import GidRow

FIXTURES = Path(__file__).parent / "fixtures" / "real" / "show_gids"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def rows(name: str) -> list[tuple[object, ...]]:
    return [(r.hca, r.port, r.index, r.gid, r.ipv4, r.version, r.netdev) for r in show_gids.parse(fixture(name)).rows]


LL = "fe80:0000:0000:0000:"  # link-local prefix
V4 = "0000:0000:0000:0000:0000:ffff:"  # IPv4-mapped prefix


@pytest.mark.parametrize(
    ("name", "expected", "count"),
    [
        # tabs as the script prints them; IPv6 rows have empty IPv4 columns
        ("bond_mlx5.txt", [
            ("mlx5_bond_0", 1, 0, LL + "0e42:a1ff:fead:479a", None, "v1", "bond0"),
            ("mlx5_bond_0", 1, 1, LL + "0e42:a1ff:fead:479a", None, "v2", "bond0"),
            ("mlx5_bond_0", 1, 2, V4 + "0a60:531a", "10.96.83.26", "v1", "bond0"),
            ("mlx5_bond_0", 1, 3, V4 + "0a60:531a", "10.96.83.26", "v2", "bond0")], 4),
        # a Huawei hrn3 bond whose table is RoCE v2 only, next to a Mellanox bond with no IPv4 address
        ("bond_hrn3_and_mlx5.txt", [
            ("hrn3_bond_0", 1, 0, LL + "aedc:caff:fe6c:9312", None, "v2", "bond0"),
            ("hrn3_bond_0", 1, 1, V4 + "1b69:b403", "27.105.180.3", "v2", "bond0"),
            ("mlx5_bond_0", 1, 0, LL + "0ac0:ebff:fe8c:3b44", None, "v1", "bond1"),
            ("mlx5_bond_0", 1, 1, LL + "0ac0:ebff:fe8c:3b44", None, "v2", "bond1")], 4),
        # tabs turned into spaces by the page it was pasted on; two link-local GIDs before the IPv4 ones
        ("mlx5_0_two_link_local_and_ipv4.txt", [
            ("mlx5_0", 1, 0, LL + "0e42:a1ff:fe5d:4db8", None, "v1", "ens1f0"),
            ("mlx5_0", 1, 1, LL + "0e42:a1ff:fe5d:4db8", None, "v2", "ens1f0"),
            ("mlx5_0", 1, 2, LL + "1186:a6b1:3f0b:c441", None, "v1", "ens1f0"),
            ("mlx5_0", 1, 3, LL + "1186:a6b1:3f0b:c441", None, "v2", "ens1f0"),
            ("mlx5_0", 1, 4, V4 + "ac13:003c", "172.19.0.60", "v1", "ens1f0"),
            ("mlx5_0", 1, 5, V4 + "ac13:003c", "172.19.0.60", "v2", "ens1f0")], 6),
        # an InfiniBand port: its GID has no netdev
        ("ib_port_without_netdev.txt", [
            ("mlx5_0", 1, 0, LL + "268a:07ff:feb1:bc04", None, "v1", "ens11f0"),
            ("mlx5_0", 1, 1, LL + "268a:07ff:feb1:bc04", None, "v2", "ens11f0"),
            ("mlx5_1", 1, 0, LL + "248a:0703:00b1:bc05", None, "v1", None)], 3),
        # a pod's macvlan: the table starts at index 6, IPv4 before IPv6; no n_gids_found line in the paste
        ("sparse_macvlan_pod.txt", [
            ("mlx5_0", 1, 6, V4 + "0b00:0401", "11.0.4.1", "v1", "net1"),
            ("mlx5_0", 1, 7, V4 + "0b00:0401", "11.0.4.1", "v2", "net1"),
            ("mlx5_0", 1, 8, LL + "e4ea:71ff:feb9:4970", None, "v1", "net1"),
            ("mlx5_0", 1, 9, LL + "e4ea:71ff:feb9:4970", None, "v2", "net1")], None),
        ("macvlan_pod_tabs.txt", [
            ("mlx5_4", 1, 4, V4 + "ac14:0101", "172.20.1.1", "v1", "net1"),
            ("mlx5_4", 1, 5, V4 + "ac14:0101", "172.20.1.1", "v2", "net1")], None),
        # the same address on a bond and on a VXLAN over it: two RoCE v2 GIDs, told apart by their netdev
        ("bond_and_vxlan_same_ipv4.txt", [
            ("mlx5_bond_0", 1, 0, LL + "0ac0:ebff:fe79:391a", None, "v1", "bond1"),
            ("mlx5_bond_0", 1, 1, LL + "0ac0:ebff:fe79:391a", None, "v2", "bond1"),
            ("mlx5_bond_0", 1, 2, V4 + "1e99:0aaf", "30.153.10.175", "v1", "b3.vxlan.30100"),
            ("mlx5_bond_0", 1, 3, V4 + "1e99:0aaf", "30.153.10.175", "v2", "b3.vxlan.30100"),
            ("mlx5_bond_0", 1, 4, V4 + "1e99:0aaf", "30.153.10.175", "v1", "bond1"),
            ("mlx5_bond_0", 1, 5, V4 + "1e99:0aaf", "30.153.10.175", "v2", "bond1")], None),
        # a pod without RDMA netdevs: header, dashes, n_gids_found=0
        ("empty_table_calico_pod.txt", [], 0),
    ],
)
def test_rows(name: str, expected: list[tuple[object, ...]], count: int | None) -> None:
    assert rows(name) == expected
    assert show_gids.parse(fixture(name)).count == count


def test_port_lookup_and_addresses() -> None:
    table = show_gids.parse(fixture("mlx5_0_two_link_local_and_ipv4.txt"))

    v2 = [r for r in table.port("mlx5_0", 1) if r.roce_v2]
    assert [(r.index, r.address) for r in v2] == [
        (1, ipaddress.IPv6Address("fe80::e42:a1ff:fe5d:4db8")), (3, ipaddress.IPv6Address("fe80::1186:a6b1:3f0b:c441")),
        (5, ipaddress.IPv4Address("172.19.0.60"))]
    assert table.port("mlx5_0", 2) == () and table.port("mlx5_1") == ()


def test_warnings_and_blank_lines_around_the_table_are_skipped() -> None:
    # the real recording behind a stderr line of the kind the script's `cat` prints (synthetic line)
    text = "cat: /sys/class/infiniband/mlx5_1/ports/1/gid_attrs/types/2: Invalid argument\n\n" + fixture("bond_mlx5.txt")

    table = show_gids.parse(text)

    assert [r.index for r in table.rows] == [0, 1, 2, 3] and table.count == 4


def test_row_with_masked_gid_is_not_a_row() -> None:
    # authors who mask their GIDs ("fe80:0000:0000:0000:xxxx:...") leave lines that are not rows; the rest is read
    masked = "mlx5_0\t1\t0\tfe80:0000:0000:0000:xxxx:xxxx:xxxx:xxxx\t\t\tv1\tnet1\n"
    text = fixture("macvlan_pod_tabs.txt") + masked

    assert [r.index for r in show_gids.parse(text).rows] == [4, 5]


def test_gid_row_is_a_record() -> None:
    (row,) = show_gids.parse(fixture("ib_port_without_netdev.txt")).port("mlx5_1")

    assert row == GidRow("mlx5_1", 1, 0, LL + "248a:0703:00b1:bc05", None, "v1", None)
    assert not row.roce_v2


@pytest.mark.parametrize(
    ("text", "match", "lineno"),
    [
        ("", "empty output", None),
        ("\n  \n", "empty output", None),
        ("show_gids: command not found\n", "no 'DEV PORT INDEX GID", 1),
        ("\nhca_id: mlx5_0\n\ttransport:\t\t\tInfiniBand (0)\n", "no 'DEV PORT INDEX GID", 2),
    ],
)
def test_nothing_recognisable_raises(text: str, match: str, lineno: int | None) -> None:
    with pytest.raises(ParseError, match=match) as err:
        show_gids.parse(text)

    assert (err.value.tool, err.value.lineno) == ("show_gids", lineno)
