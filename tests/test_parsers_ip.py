"""``ip -j addr`` / ``ip -j link``: recorded interfaces, states, MTUs and addresses."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from clusterrun.errors import ParseError
from clusterrun.facts.parsers import ip

FIXTURES = Path(__file__).parent / "fixtures" / "real" / "ip"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_host_addresses_with_prefixes() -> None:
    ifaces = ip.parse(fixture("addr_host.json"))

    assert [i.name for i in ifaces.interfaces] == ["lo", "ifb0", "ifb1", "eth0"]
    eth0 = ifaces.get("eth0")
    assert eth0 is not None
    assert (eth0.mtu, eth0.operstate, eth0.is_up, eth0.link_type) == (1400, "UP", True, "ether")
    assert [str(a.interface) for a in eth0.addresses] == ["192.0.2.2/24", "fd00::2/64", "fe80::fc:ff:fe00:1/64"]
    assert [a.local for a in eth0.ipv4()] == ["192.0.2.2"]
    assert ifaces.with_address("192.0.2.2") is eth0


def test_loopback_and_down_devices() -> None:
    ifaces = ip.parse(fixture("addr_host.json"))

    lo, ifb0 = ifaces.get("lo"), ifaces.get("ifb0")
    assert lo is not None and ifb0 is not None
    assert (lo.is_loopback, lo.is_up, lo.operstate, lo.mtu) == (True, True, "UNKNOWN", 65536)
    assert (ifb0.is_up, ifb0.operstate, ifb0.addresses) == (False, "DOWN", ())


def test_namespace_with_data_mgmt_and_carrierless_interfaces() -> None:
    ifaces = ip.parse(fixture("addr_netns_mixed.json"))

    data0, mgmt0, crv0, br0 = (ifaces.get(n) for n in ("data0", "mgmt0", "crv0", "br0"))
    assert data0 is not None and mgmt0 is not None and crv0 is not None and br0 is not None
    assert (data0.mtu, data0.is_up) == (9000, True)
    assert [str(a.interface) for a in data0.addresses][:2] == ["198.19.0.1/16", "fd00::1/64"]
    # Administratively down but addressed: exists, not usable.
    assert (mgmt0.is_up, mgmt0.operstate) == (False, "DOWN")
    assert mgmt0.addresses[0].interface.network == ipaddress.ip_network("198.18.0.0/15")
    # Up but no carrier (peer down): NCCL would still see it.
    assert "UP" in crv0.flags and not crv0.is_up
    assert crv0.operstate == "LOWERLAYERDOWN"
    assert ifaces.with_address("10.9.9.1") is crv0
    # A bridge with no ports reports UNKNOWN yet has carrier.
    assert (br0.operstate, br0.is_up) == ("UNKNOWN", True)


@pytest.mark.parametrize(("addr", "link"), [("addr_host.json", "link_host.json"), ("addr_netns_mixed.json", "link_netns_mixed.json")])
def test_link_output_lists_the_same_interfaces_without_addresses(addr: str, link: str) -> None:
    with_addr, without = ip.parse(fixture(addr)), ip.parse(fixture(link))

    assert [(i.name, i.mtu, i.operstate, i.mac) for i in without.interfaces] == [
        (i.name, i.mtu, i.operstate, i.mac) for i in with_addr.interfaces
    ]
    assert all(i.addresses == () for i in without.interfaces)


def test_infiniband_link_list() -> None:
    ifaces = ip.parse(fixture("link_infiniband_8_ports.json")).interfaces

    assert len(ifaces) == 8
    assert {(i.link_type, i.mtu, i.is_up) for i in ifaces} == {("infiniband", 2044, True)}
    assert ifaces[0].name == "ibp12s0"
    assert ifaces[0].mac == "00:00:10:29:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:0b:cc:d6"


def test_empty_entries_from_old_iproute2_are_skipped() -> None:
    text = '[{},{"ifindex":1,"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"],"mtu":65536,"operstate":"UNKNOWN"}]'

    assert [i.name for i in ip.parse(text).interfaces] == ["lo"]


def test_truncated_json_names_the_line() -> None:
    lines = fixture("addr_host.json")
    cut = lines[: len(lines) // 2]

    with pytest.raises(ParseError, match="not JSON") as err:
        ip.parse(cut)

    assert err.value.lineno == 1  # ip -j prints one line


@pytest.mark.parametrize(
    "text",
    [
        "",
        'Option "-j" is unknown, try "ip -help".\n',
        '{"ifname": "eth0"}',
        '[{"ifindex": 2, "ifname": "eth0"}]',
        '[{"ifindex": 2, "ifname": "eth0", "mtu": 1500, "addr_info": [{"family": "inet", "local": "10.0.0.300", "prefixlen": 24}]}]',
    ],
)
def test_not_ip_json_raises(text: str) -> None:
    with pytest.raises(ParseError) as err:
        ip.parse(text)

    assert err.value.tool == "ip -j"
