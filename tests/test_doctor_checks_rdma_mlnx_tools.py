"""What ``ibdev2netdev -v`` and ``show_gids`` add to ib.port and roce.gid, on recorded real outputs.

Both are MLNX_OFED scripts a node may lack; their absence changes nothing. The /sys/class/infiniband
listings (the node reporter's, without a readable state) are synthetic, as in test_doctor_checks_rdma.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from reported import facts_section, sysfs_port

import clusterrun.doctor.checks.rdma  # noqa: F401  (registers the checks)
from clusterrun.doctor.facts import FACTS, MISSING, NodeFacts, Section
from clusterrun.doctor.model import Finding, Verdict
from clusterrun.doctor.probe import SECTIONS
from clusterrun.doctor.registry import CHECKS, Context
from clusterrun.inventory.models import Inventory

REAL = Path(__file__).parent / "fixtures" / "real"
NO_IBSTAT = ("ibstat: not installed\n", MISSING)
NO_DEVINFO = ("ibv_devinfo: not installed\n", MISSING)
TOOLS_MISSING = {"ibstat": NO_IBSTAT, "ibv_devinfo": NO_DEVINFO}


def real(tool: str, name: str) -> str:
    return (REAL / tool / name).read_text()


def facts(node: str, **sections: Any) -> NodeFacts:
    """A probed node; each section is its output (exit 0) or (output, exit code)."""
    built = {}
    for name, value in sections.items():
        if name == "rdma_sys":  # the ports the node reporter lists from /sys/class/infiniband
            built[FACTS] = facts_section(rdma=value)
            continue
        output, rc = value if isinstance(value, tuple) else (value, 0)
        built[name] = Section(name, SECTIONS[name], rc, output)
    return NodeFacts(node, built)


def nic(name: str, hca: str, kind: str = "roce", **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": kind, "hca": hca, "port": 1, **extra}


def run(check: str, node: dict[str, Any], node_facts: NodeFacts) -> list[Finding]:
    inv = Inventory.model_validate({"nodes": [{"host": "192.168.1.10", "name": node_facts.node, **node}]})
    return list(CHECKS[check].run(Context(inv, {node_facts.node: node_facts})))


# --- ib.port -------------------------------------------------------------------------------------------------------

MIXED_V = real("ibdev2netdev", "v_roce_and_ib_mixed_socket_direct.txt")  # one host: RoCE ports and an IB port
MIXED = real("ibdev2netdev", "roce_and_ib_mixed.txt")  # the same host without -v


@pytest.mark.parametrize(
    ("listed", "rdma_sys", "verdict", "summary"),
    [
        (nic("ens6", "mlx5_2"), [sysfs_port("mlx5_2", "Ethernet", "ens6")], Verdict.passed,
         "gpu03: mlx5_2 port 1 is ACTIVE (physical state not shown, Ethernet)"),
        (nic("ib0", "mlx5_5", "infiniband"), [sysfs_port("mlx5_5", "InfiniBand", "ib0")], Verdict.passed,
         "gpu03: mlx5_5 port 1 is ACTIVE (physical state not shown, InfiniBand)"),
        (nic("ens4f0", "mlx5_0"), [sysfs_port("mlx5_0", "Ethernet", "ens4f0")], Verdict.failed, "gpu03: mlx5_0 port 1 is DOWN"),
        # the link layer still comes from /sys
        (nic("ens6", "mlx5_2", "infiniband"), [sysfs_port("mlx5_2", "Ethernet", "ens6")], Verdict.failed,
         "gpu03: mlx5_2 port 1 has link layer Ethernet, but the inventory lists ens6 as infiniband (InfiniBand)"),
        # without /sys the layer is not known, and the port's state alone decides
        (nic("ens6", "mlx5_2"), None, Verdict.passed,
         "gpu03: mlx5_2 port 1 is ACTIVE (physical state not shown, Ethernet)"),
    ],
    ids=["roce-active", "ib-active", "roce-down", "wrong-layer", "no-sysfs"],
)
def test_port_state_from_ibdev2netdev_when_ibstat_and_ibv_devinfo_are_missing(
        listed: dict[str, Any], rdma_sys: list[dict[str, Any]] | None, verdict: Verdict, summary: str) -> None:
    sections: dict[str, Any] = {**TOOLS_MISSING, "ibdev2netdev": MIXED_V}
    if rdma_sys is not None:
        sections["rdma_sys"] = rdma_sys
    finding, *rest = run("ib.port", {"nics": [listed]}, facts("gpu03", **sections))

    assert (finding.verdict, finding.summary, finding.subject) == (verdict, summary, f"{listed['hca']}/1")
    assert SECTIONS["ibdev2netdev"] in [e.command for e in finding.evidence]
    # the other active ports of the host are reported as unlisted, from ibdev2netdev's states
    assert [f.data.get("unlisted") for f in rest] == [
        [p for p in ["mlx5_2/1", "mlx5_3/1", "mlx5_5/1"] if p != f"{listed['hca']}/1"]]


def test_down_roce_port_names_its_netdev_in_the_hint() -> None:
    node_facts = facts("gpu03", **TOOLS_MISSING, ibdev2netdev=MIXED_V, rdma_sys=[sysfs_port("mlx5_0", "Ethernet", "ens4f0")])
    finding = run("ib.port", {"nics": [nic("ens4f0", "mlx5_0")]}, node_facts)[0]

    assert finding.verdict is Verdict.failed
    assert "its interface ens4f0 is Down too (ibdev2netdev)" in (finding.hint or "")
    assert "`ip link set ens4f0 up`" in (finding.hint or "")
    assert (finding.data["netdev"], finding.data["netdev_state"]) == ("ens4f0", "Down")


def test_without_v_a_down_roce_netdev_fails_the_port() -> None:
    # plain ibdev2netdev has no port state: the state stays unread, and the Down netdev is told on its own line
    node_facts = facts("gpu03", **TOOLS_MISSING, ibdev2netdev=MIXED, rdma_sys=[sysfs_port("mlx5_0", "Ethernet", "ens4f0")])
    unread, down = run("ib.port", {"nics": [nic("ens4f0", "mlx5_0")]}, node_facts)

    assert (unread.verdict, unread.subject) == (Verdict.warned, "mlx5_0/1")
    assert "state could not be read" in unread.summary
    assert (down.verdict, down.node, down.subject) == (Verdict.failed, "gpu03", "mlx5_0/1")
    assert down.summary == "gpu03: ens4f0, the interface of mlx5_0 port 1, is Down (ibdev2netdev): RoCE runs over it"
    assert (down.measured, down.expected) == ("Down", "Up")
    assert "ip link set ens4f0 up" in (down.hint or "") and down.evidence[0].command == "ibdev2netdev -v"


@pytest.mark.parametrize(
    ("output", "verdict", "summary"),
    [
        (MIXED, Verdict.warned, "gpu03: mlx5_2 port 1 exists (link layer unknown; ibdev2netdev: ens6 Up) but its state "
                                "could not be read: ibstat is not installed, ibv_devinfo is not installed, ibdev2netdev "
                                "shows no port state for it (`ibdev2netdev -v` does)"),
        (MIXED_V, Verdict.passed, "gpu03: mlx5_2 port 1 is ACTIVE (physical state not shown, Ethernet)"),
    ],
    ids=["plain", "verbose"],
)
def test_a_port_ibdev2netdev_lists_is_never_reported_missing(output: str, verdict: Verdict, summary: str) -> None:
    # The only RDMA source is ibdev2netdev (no ibstat, no ibv_devinfo, no /sys listing). Its plain form lists the
    # port and its netdev but not the port's state: the port exists, its state is unknown (it was once reported as
    # "mlx5_2 has no port 1 (ports: 1)").
    finding, *rest = run("ib.port", {"nics": [nic("ens6", "mlx5_2")]}, facts("gpu03", **TOOLS_MISSING,
                                                                              ibdev2netdev=output))

    assert (finding.verdict, finding.summary, finding.subject) == (verdict, summary, "mlx5_2/1")
    assert [e.command for e in finding.evidence] == [SECTIONS["ibdev2netdev"]]
    if verdict is Verdict.warned:
        assert finding.data["source"] == "ibdev2netdev" and "infiniband-diags" in (finding.hint or "")
        assert rest == []  # ens6 is Up: nothing more to say
    # a port it does not list is still missing, named with what it lists
    (missing, *_) = run("ib.port", {"nics": [nic("ens6", "mlx5_2", port=2)]}, facts("gpu03", **TOOLS_MISSING,
                                                                                      ibdev2netdev=output))
    assert (missing.verdict, missing.summary) == (Verdict.failed, "gpu03: mlx5_2 has no port 2 (ports: 1)")


@pytest.mark.parametrize(
    ("ip", "expected"),
    [
        ("10.10.0.5/24", ["gpu03: the IPoIB interface ibp26s0 of mlx5_0 port 1 is Down (ibdev2netdev), so 10.10.0.5 "
                          "does not answer"]),
        (None, []),  # RDMA does not need IPoIB: without an address listed, a Down IPoIB interface is not a finding
    ],
)
def test_infiniband_ipoib_down_matters_only_with_an_address(ip: str | None, expected: list[str]) -> None:
    # the H100 host's ibdev2netdev (column -t, comments); its ports are InfiniBand with IPoIB Down
    listed = nic("ibp26s0", "mlx5_0", "infiniband", **({"ip": ip} if ip else {}))
    node_facts = facts("gpu03", **TOOLS_MISSING, rdma_sys=[sysfs_port("mlx5_0", "InfiniBand", "ibp26s0")],
                       ibdev2netdev=real("ibdev2netdev", "h100_ib_and_eth_column_t_commented.txt"))
    _port, *extra = run("ib.port", {"nics": [listed]}, node_facts)

    assert [f.summary for f in extra] == expected
    assert all(f.verdict is Verdict.warned and "ip link set ibp26s0 up" in (f.hint or "") for f in extra)


@pytest.mark.parametrize(
    ("listed", "rdma_sys", "summary", "hint"),
    [
        (nic("ens6f1", "mlx5_2"), [sysfs_port("mlx5_2", "Ethernet", "ens6")],
         "gpu03: mlx5_2 port 1 drives ens6, not ens6f1 as the inventory lists it (ens6f1 is on mlx5_6 port 1)",
         "set hca: mlx5_6 for ens6f1, or name the NIC ens6"),
        (nic("eth9", "mlx5_2"), None, "gpu03: mlx5_2 port 1 drives ens6, not eth9 as the inventory lists it",
         "name the NIC on mlx5_2 port 1 ens6, or correct its hca/port"),
    ],
    ids=["netdev-of-another-port", "unknown-netdev"],
)
def test_hca_netdev_pairing_is_checked_against_ibdev2netdev(listed: dict[str, Any], rdma_sys: list[dict[str, Any]] | None,
                                                          summary: str, hint: str) -> None:
    sections: dict[str, Any] = {**TOOLS_MISSING, "ibdev2netdev": MIXED_V}
    if rdma_sys is not None:
        sections["rdma_sys"] = rdma_sys
    port, pairing, _unlisted = run("ib.port", {"nics": [listed]}, facts("gpu03", **sections))

    assert port.verdict is Verdict.passed  # mlx5_2 port 1 itself is fine
    assert (pairing.verdict, pairing.subject, pairing.summary) == (Verdict.warned, "mlx5_2/1", summary)
    assert (pairing.measured, pairing.expected) == ("ens6", listed["name"])
    assert hint in (pairing.hint or "") and "NCCL_IB_HCA" in (pairing.hint or "")
    assert pairing.evidence[0].command == "ibdev2netdev -v"


def test_pairing_that_sysfs_confirms_is_not_questioned() -> None:
    # /sys lists ens6f1 among mlx5_2's netdevs (synthetic): /sys answers, ibdev2netdev is not asked
    node_facts = facts("gpu03", **TOOLS_MISSING, ibdev2netdev=MIXED_V, rdma_sys=[sysfs_port("mlx5_2", "Ethernet", "ens6", "ens6f1")])
    findings = run("ib.port", {"nics": [nic("ens6f1", "mlx5_2")]}, node_facts)

    assert [(f.verdict, f.subject) for f in findings] == [(Verdict.passed, "mlx5_2/1"),
                                                         (Verdict.passed, "mlx5_3/1, mlx5_5/1")]


def test_unknown_hca_hint_names_the_hca_ibdev2netdev_shows() -> None:
    finding = run("ib.port", {"nics": [nic("ens6", "mlx5_9")]},
                  facts("gpu03", **TOOLS_MISSING, ibdev2netdev=MIXED_V))[0]

    assert finding.verdict is Verdict.failed
    assert finding.summary == ("gpu03: mlx5_9 not found (ibdev2netdev lists mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4, "
                               "mlx5_5, mlx5_6, mlx5_7)")
    assert (finding.hint or "").startswith("ibdev2netdev shows ens6 on mlx5_2 port 1: set hca: mlx5_2 for ens6; ")
    assert finding.data["ibdev2netdev"] == "mlx5_2/1"


IB_OK = {"ibstat": real("ibstat", "ibstat_hdr100.txt"), "ibv_devinfo": real("ibstat", "ibv_devinfo_hdr100.txt")}


@pytest.mark.parametrize(
    "extra",
    [
        {"ibdev2netdev": ("ibdev2netdev: not installed\n", MISSING), "show_gids": ("show_gids: not installed\n",
                                                                                    MISSING)},
        {"ibdev2netdev": ("", 255)},  # the script's exit when /sys/class/infiniband is missing
        {"ibdev2netdev": (MIXED_V, 124)},  # cut short by the probe's time limit
        {"ibdev2netdev": "garbage\n"},
    ],
    ids=["not-installed", "no-sysfs", "timed-out", "not-understood"],
)
def test_ibdev2netdev_that_gives_nothing_changes_nothing(extra: dict[str, Any]) -> None:
    listed = {"nics": [nic("ib0", "mlx5_0", "infiniband", speed="100gbit")]}
    before = run("ib.port", listed, facts("gpu03", **IB_OK))
    after = run("ib.port", listed, facts("gpu03", **IB_OK, **extra))

    assert after == before
    assert [(f.verdict, f.summary) for f in after] == [
        (Verdict.passed, "gpu03: mlx5_0 port 1 is ACTIVE (LinkUp, InfiniBand, 100 Gb/s)")]


def test_missing_tools_give_no_finding_on_nodes_without_rdma() -> None:
    node_facts = facts("cpu01", ibstat=NO_IBSTAT, ibv_devinfo=NO_DEVINFO,
                       ibdev2netdev=("ibdev2netdev: not installed\n", MISSING),
                       show_gids=("show_gids: not installed\n", MISSING))
    listed = {"nics": [{"name": "eth0", "ip": "10.0.0.1/24"}]}

    for check in ("ib.port", "roce.gid"):
        assert [f.verdict for f in run(check, listed, node_facts)] == [Verdict.skipped]


# --- roce.gid ------------------------------------------------------------------------------------------------------


def gids(name: str) -> str:
    return real("show_gids", name)


@pytest.mark.parametrize(
    ("table", "listed", "verdict", "summary", "measured"),
    [
        ("bond_mlx5.txt", nic("bond0", "mlx5_bond_0", ip="10.96.83.26/24"), Verdict.passed,
         "gpu05: mlx5_bond_0 port 1 has RoCE v2 GID index 3 for 10.96.83.26 (gid_index not set in the inventory: NCCL "
         "picks one itself)", "3"),
        ("bond_mlx5.txt", nic("bond0", "mlx5_bond_0", ip="10.96.83.26/24", gid_index=2), Verdict.warned,
         "gpu05: the RoCE v2 GID for 10.96.83.26 on mlx5_bond_0 port 1 is index 3, but the inventory says "
         "gid_index 2", "3"),
        # a pod's sparse table (indices 6-9)
        ("sparse_macvlan_pod.txt", nic("net1", "mlx5_0", ip="11.0.4.1/24", gid_index=7), Verdict.passed,
         "gpu05: mlx5_0 port 1 has RoCE v2 GID index 7 for 11.0.4.1", "7"),
        # the same address on the bond and on a VXLAN over it: the GID of the NIC's own netdev
        ("bond_and_vxlan_same_ipv4.txt", nic("bond1", "mlx5_bond_0", ip="30.153.10.175/24"), Verdict.passed,
         "gpu05: mlx5_bond_0 port 1 has RoCE v2 GID index 5 for 30.153.10.175 (gid_index not set in the inventory: "
         "NCCL picks one itself)", "5"),
        ("bond_and_vxlan_same_ipv4.txt", nic("bond1", "mlx5_bond_0", ip="30.153.10.175/24", gid_index=3),
         Verdict.warned, "gpu05: the RoCE v2 GID for 30.153.10.175 on mlx5_bond_0 port 1 is index 5, but the "
         "inventory says gid_index 3 (index 3 is on b3.vxlan.30100)", "5"),
        ("bond_and_vxlan_same_ipv4.txt", nic("b3.vxlan.30100", "mlx5_bond_0", ip="30.153.10.175/24", gid_index=3),
         Verdict.passed, "gpu05: mlx5_bond_0 port 1 has RoCE v2 GID index 3 for 30.153.10.175", "3"),
        # hrn3's table has only RoCE v2 GIDs
        ("bond_hrn3_and_mlx5.txt", nic("bond0", "hrn3_bond_0", ip="27.105.180.3/24"), Verdict.passed,
         "gpu05: hrn3_bond_0 port 1 has RoCE v2 GID index 1 for 27.105.180.3 (gid_index not set in the inventory: "
         "NCCL picks one itself)", "1"),
        ("bond_hrn3_and_mlx5.txt", nic("bond1", "mlx5_bond_0", ip="10.0.0.7/24"), Verdict.failed,
         "gpu05: mlx5_bond_0 port 1 has no RoCE v2 GID for 10.0.0.7: its GID table has no IPv4 entry", "none"),
        # a pod without RDMA netdevs: show_gids lists no GID at all
        ("empty_table_calico_pod.txt", nic("eth0", "mlx5_0", ip="10.0.0.7/24"), Verdict.failed,
         "gpu05: mlx5_0 port 1 is not in the show_gids output", None),
    ],
    ids=["found", "inventory-differs", "sparse", "bond-over-vxlan", "vxlan-index-listed-for-bond", "vxlan-nic",
         "v2-only", "no-ipv4", "empty-table"],
)
def test_gid_from_show_gids_when_ibv_devinfo_is_missing(table: str, listed: dict[str, Any], verdict: Verdict,
                                                         summary: str, measured: str | None) -> None:
    (finding,) = run("roce.gid", {"nics": [listed]}, facts("gpu05", ibv_devinfo=NO_DEVINFO, show_gids=gids(table)))

    assert (finding.verdict, finding.node, finding.subject) == (verdict, "gpu05", f"{listed['hca']}/1")
    assert finding.summary == summary and finding.measured == measured
    assert [e.command for e in finding.evidence] == ["show_gids"]
    if verdict is Verdict.warned:
        assert f"gid_index: {measured}" in (finding.hint or "")
    if finding.data:  # every finding that got as far as the port's GIDs says where they came from
        assert finding.data["source"] == "show_gids"


def test_unreadable_ibv_devinfo_falls_back_to_show_gids() -> None:
    node_facts = facts("gpu05", ibv_devinfo=real("ibstat", "ibv_devinfo_v_roce_gid_fragment.txt"),
                       show_gids=gids("bond_mlx5.txt"))
    (finding,) = run("roce.gid", {"nics": [nic("bond0", "mlx5_bond_0", ip="10.96.83.26/24")]}, node_facts)

    assert finding.verdict is Verdict.passed and "GID index 3 for 10.96.83.26" in finding.summary


def test_ibv_devinfo_answers_first() -> None:
    # both tools present: ibv_devinfo's table is used as before (its bond, its address)
    node_facts = facts("gpu05", ibv_devinfo=real("ibstat", "ibv_devinfo_vv_roce_bond_cx6dx.txt"),
                       show_gids=gids("bond_mlx5.txt"))
    (finding,) = run("roce.gid", {"nics": [nic("bond0", "mlx5_bond_0", ip="27.105.179.3/24")]}, node_facts)

    assert (finding.verdict, finding.measured) == (Verdict.passed, "3")
    assert [e.command for e in finding.evidence] == ["ibv_devinfo -v"] and "source" not in finding.data


@pytest.mark.parametrize(
    "show",
    [("show_gids: not installed\n", MISSING), (gids("bond_mlx5.txt"), 124), ("garbage\n", 0)],
    ids=["not-installed", "timed-out", "not-understood"],
)
def test_without_a_usable_show_gids_the_ibv_devinfo_warning_stays(show: tuple[str, int]) -> None:
    node_facts = facts("gpu05", ibv_devinfo=NO_DEVINFO, show_gids=show)
    (finding,) = run("roce.gid", {"nics": [nic("bond0", "mlx5_bond_0", ip="10.96.83.26/24")]}, node_facts)

    assert (finding.verdict, finding.subject) == (Verdict.warned, "ibv_devinfo")
    assert finding.summary == "gpu05: ibv_devinfo is not installed, so the RoCE GID tables could not be read"
