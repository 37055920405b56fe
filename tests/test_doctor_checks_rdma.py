"""InfiniBand/RoCE doctor checks (ib.port, roce.gid, ib.peermem) on recorded real ibstat / ibv_devinfo output.

The node reporter's /sys/class/infiniband listings, the peermem words and a few edits of real output (named as such where they are
made) are synthetic: no recording of them exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from reported import facts_section, sysfs_port

import clusterrun.doctor.checks.rdma  # noqa: F401  (registers the checks)
from clusterrun.doctor.facts import FACTS, MISSING, RDMA_COMMAND, NodeFacts, Section
from clusterrun.doctor.model import Finding, Scope, Verdict
from clusterrun.doctor.probe import SECTIONS
from clusterrun.doctor.registry import CHECKS, Context
from clusterrun.inventory.models import Inventory

IBSTAT = Path(__file__).parent / "fixtures" / "real" / "ibstat"
NOT_INSTALLED = ("ibstat: not installed\n", MISSING)  # what the probe prints for a missing tool
DEVINFO_NOT_INSTALLED = ("ibv_devinfo: not installed\n", MISSING)
BOND_IP = "27.105.179.3"  # the RoCE v2 GID 3 of ibv_devinfo_vv_roce_bond_cx6dx.txt


def real(name: str) -> str:
    return (IBSTAT / name).read_text()


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


def nic(hca: str, kind: str = "infiniband", port: int = 1, **extra: Any) -> dict[str, Any]:
    return {"name": "ib0" if kind == "infiniband" else "ens1f0", "kind": kind, "hca": hca, "port": port, **extra}


def inventory(*nodes: dict[str, Any]) -> Inventory:
    return Inventory.model_validate({"nodes": [{"host": f"192.168.1.{i + 10}", **n} for i, n in enumerate(nodes)]})


def run(name: str, inv: Inventory, *node_facts: NodeFacts) -> list[Finding]:
    return list(CHECKS[name].run(Context(inv, {f.node: f for f in node_facts})))


def one(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, findings
    return findings[0]


def test_registered() -> None:
    assert {name: CHECKS[name].scope for name in ("ib.port", "roce.gid", "ib.peermem")} == {
        "ib.port": Scope.node, "roce.gid": Scope.node, "ib.peermem": Scope.node}


# --- ib.port -------------------------------------------------------------------------------------------------------

IB_OK = {"ibstat": real("ibstat_hdr100.txt"), "ibv_devinfo": real("ibv_devinfo_hdr100.txt")}


@pytest.mark.parametrize(
    ("sections", "listed", "verdict", "subject", "words", "hint_words"),
    [
        (IB_OK, nic("mlx5_0", speed="100gbit"), Verdict.passed, "mlx5_0/1", ["mlx5_0 port 1 is ACTIVE", "LinkUp",
                                                                             "InfiniBand", "100 Gb/s"], []),
        (IB_OK, nic("mlx5_0", speed="200gbit"), Verdict.warned, "mlx5_0/1", ["runs at 100 Gb/s", "listed 200 Gb/s"],
         ["cable", "speed"]),
        ({"ibstat": real("ibstat_mlx4_ib_polling_eth_disabled.txt")}, nic("mlx4_0"), Verdict.failed, "mlx4_0/1",
         ["mlx4_0 port 1 is DOWN (physical state Polling)"], ["cable", "switch port"]),
        ({"ibstat": real("ibstat_mlx4_ib_polling_eth_disabled.txt")}, nic("mlx4_0", "roce", port=2), Verdict.failed,
         "mlx4_0/2", ["mlx4_0 port 2 is DOWN (physical state Disabled)"], ["disabled", "enable"]),
        ({"ibstat": real("ibstat_bf3_ib_down_linkup_no_sm.txt")}, nic("mlx5_1"), Verdict.failed, "mlx5_1/1",
         ["mlx5_1 port 1 is DOWN (physical state LinkUp)"], ["subnet manager", "opensm"]),
        (IB_OK, nic("mlx5_0", "roce"), Verdict.failed, "mlx5_0/1", ["link layer InfiniBand", "as roce (Ethernet)"],
         ["kind: infiniband", "LINK_TYPE_P1"]),
        ({"ibstat": real("ibstat_roce_ethernet_cx5.txt")}, nic("mlx5_0"), Verdict.failed, "mlx5_0/1",
         ["link layer Ethernet", "as infiniband (InfiniBand)"], ["kind: roce"]),
        (IB_OK, nic("mlx5_1"), Verdict.failed, "mlx5_1/1", ["mlx5_1 not found (ibstat lists mlx5_0)"],
         ["ibstat -l", "ibdev2netdev"]),
        (IB_OK, nic("mlx5_0", port=2), Verdict.failed, "mlx5_0/2", ["mlx5_0 has no port 2 (ports: 1)"], ["port"]),
        # ibstat not installed: ibv_devinfo -v alone (state, LINK_UP and 2X x 50 Gbps rate)
        ({"ibstat": NOT_INSTALLED, "ibv_devinfo": real("ibv_devinfo_vv_roce_bond_cx6dx.txt")},
         nic("mlx5_bond_0", "roce", speed="100gbit"), Verdict.passed, "mlx5_bond_0/1",
         ["is ACTIVE (LinkUp, Ethernet, 100 Gb/s)"], []),
        # ibv_devinfo without -v prints no physical state
        ({"ibstat": NOT_INSTALLED, "ibv_devinfo": real("ibv_devinfo_roce_device_ports_cx5.txt")},
         nic("mlx5_0", "roce"), Verdict.passed, "mlx5_0/1", ["ACTIVE (physical state not shown, Ethernet)"], []),
    ],
    ids=["active", "slow", "polling", "disabled", "no-subnet-manager", "ib-listed-as-roce", "roce-listed-as-ib",
         "unknown-hca", "unknown-port", "devinfo-only", "devinfo-without-v"],
)
def test_port(sections: dict[str, Any], listed: dict[str, Any], verdict: Verdict, subject: str, words: list[str],
              hint_words: list[str]) -> None:
    finding, *rest = run("ib.port", inventory({"name": "gpu03", "nics": [listed]}), facts("gpu03", **sections))
    # a wrongly named HCA/port leaves the real one active and unlisted: reported after the port's finding
    assert [(f.verdict, f.data["unlisted"]) for f in rest] == ([(Verdict.passed, ["mlx5_0/1"])] if rest else [])
    assert (finding.verdict, finding.node, finding.subject) == (verdict, "gpu03", subject)
    assert finding.summary.startswith("gpu03: ")
    for word in words:
        assert word in finding.summary
    for word in hint_words:
        assert word in (finding.hint or "")
    assert finding.evidence and finding.evidence[0].node == "gpu03"
    if verdict is not Verdict.passed:
        assert finding.hint


@pytest.mark.parametrize(
    ("fixture", "edits", "kind", "words", "hint"),
    [
        ("ibstat_hdr100.txt", {"Physical state: LinkUp": "Physical state: LinkErrorRecovery"}, "infiniband",
         "is ACTIVE but its physical state is LinkErrorRecovery", "dmesg"),
        ("ibstat_roce_ethernet_cx5.txt", {"State: Active": "State: Down"}, "roce", "is DOWN (physical state LinkUp)",
         "ibdev2netdev"),
        ("ibstat_hdr100.txt", {"State: Active": "State: Initializing", "Physical state: LinkUp":
                               "Physical state: PortConfigurationTraining"}, "infiniband",
         "is INIT (physical state PortConfigurationTraining)", "switch port"),
    ],
    ids=["active-but-recovering", "roce-logical-down", "training"],
)
def test_port_other_states(fixture: str, edits: dict[str, str], kind: str, words: str, hint: str) -> None:
    text = real(fixture)  # synthetic edits of a real recording: these states were not recorded
    for old, new in edits.items():
        text = text.replace(old, new)
    finding = one(run("ib.port", inventory({"name": "gpu03", "nics": [nic("mlx5_0", kind)]}),
                      facts("gpu03", ibstat=text)))
    assert (finding.verdict, finding.subject) == (Verdict.failed, "mlx5_0/1")
    assert words in finding.summary and hint in (finding.hint or "")


def test_port_down_and_rate_carry_measured_and_expected() -> None:
    down = one(run("ib.port", inventory({"name": "gpu03", "nics": [nic("mlx4_0")]}),
                   facts("gpu03", ibstat=real("ibstat_mlx4_ib_polling_eth_disabled.txt"))))
    assert (down.measured, down.expected) == ("DOWN/Polling", "ACTIVE/LinkUp")
    assert down.data["physical_state"] == "Polling" and down.evidence[0].command == "ibstat"
    slow = one(run("ib.port", inventory({"name": "gpu03", "nics": [nic("mlx5_0", speed="200gbit")]}),
                   facts("gpu03", **IB_OK)))
    assert (slow.measured, slow.expected) == ("100 Gb/s", "200 Gb/s")


def test_tools_missing_and_sysfs_empty_fails_once_per_node() -> None:
    inv = inventory({"name": "gpu03", "nics": [nic("mlx5_0"), {**nic("mlx5_1"), "name": "ib1"}]})
    finding = one(run("ib.port", inv, facts("gpu03", ibstat=NOT_INSTALLED, ibv_devinfo=DEVINFO_NOT_INSTALLED,
                                             rdma_sys=[])))
    assert finding.verdict is Verdict.failed and finding.node == "gpu03"
    assert finding.summary == ("gpu03: ibstat/ibv_devinfo not installed on gpu03 and /sys/class/infiniband is empty "
                               "(install infiniband-diags / rdma-core)")
    assert finding.subject == "mlx5_0/1, mlx5_1/1"
    assert "mlx5_ib" in (finding.hint or "") and "infiniband-diags" in (finding.hint or "")


@pytest.mark.parametrize(
    ("rdma_sys", "listed", "verdict", "words"),
    [
        ([sysfs_port("mlx5_0", "InfiniBand", "ib0")], nic("mlx5_0"), Verdict.warned, ["mlx5_0 port 1 exists (InfiniBand)",
                                                                        "state could not be read"]),
        ([sysfs_port("mlx5_0", "Ethernet", "ens1f0")], nic("mlx5_0"), Verdict.failed, ["link layer Ethernet"]),
        ([sysfs_port("mlx5_0", "InfiniBand", "ib0")], nic("mlx5_2"), Verdict.failed, ["mlx5_2 not found (/sys/class/infiniband "
                                                                        "lists mlx5_0)"]),
    ],
    ids=["state-unknown", "wrong-layer", "not-there"],
)
def test_tools_missing_falls_back_to_sysfs(rdma_sys: list[dict[str, Any]], listed: dict[str, Any], verdict: Verdict,
                                          words: list[str]) -> None:
    # synthetic /sys listings without a readable state (as the node reporter gives them)
    node_facts = facts("gpu03", ibstat=NOT_INSTALLED, ibv_devinfo=DEVINFO_NOT_INSTALLED, rdma_sys=rdma_sys)
    finding = one(run("ib.port", inventory({"name": "gpu03", "nics": [listed]}), node_facts))
    assert finding.verdict is verdict and finding.node == "gpu03"
    for word in words:
        assert word in finding.summary
    assert finding.evidence[0].command == RDMA_COMMAND
    if verdict is Verdict.warned:
        assert "infiniband-diags" in (finding.hint or "")
        assert "ibstat is not installed" in finding.summary


def test_unparseable_ibstat_warns_and_ibv_devinfo_answers() -> None:
    node_facts = facts("gpu03", ibstat=(real("ibstat_ibpanic_no_devices_container.txt"), 255),
                       ibv_devinfo=real("ibv_devinfo_hdr100.txt"))
    warned, port = run("ib.port", inventory({"name": "gpu03", "nics": [nic("mlx5_0")]}), node_facts)
    assert (warned.verdict, warned.subject, warned.node) == (Verdict.warned, "ibstat", "gpu03")
    assert "ibpanic" in warned.summary and "does not understand" in warned.summary
    assert warned.hint and warned.data["exit_code"] == 255
    assert port.verdict is Verdict.passed and port.evidence[0].command == "ibv_devinfo -v"


def test_nothing_readable_warns_per_tool_and_per_port() -> None:
    node_facts = facts("gpu03", ibstat=("garbage\n", 0), ibv_devinfo=real("ibv_devinfo_v_roce_gid_fragment.txt"))
    findings = run("ib.port", inventory({"name": "gpu03", "nics": [nic("mlx5_0")]}), node_facts)
    assert [(f.verdict, f.subject) for f in findings] == [
        (Verdict.warned, "ibstat"), (Verdict.warned, "ibv_devinfo"), (Verdict.warned, "mlx5_0/1")]
    assert "could not be read: ibstat output is not understood" in findings[2].summary


def test_unreadable_tools_and_empty_sysfs_fail_the_node() -> None:
    node_facts = facts("gpu03", ibstat=("garbage\n", 0), ibv_devinfo=DEVINFO_NOT_INSTALLED, rdma_sys=[])
    findings = run("ib.port", inventory({"name": "gpu03", "nics": [nic("mlx5_0")]}), node_facts)
    assert [(f.verdict, f.subject) for f in findings] == [(Verdict.warned, "ibstat"), (Verdict.failed, "mlx5_0/1")]
    assert ("no tool output (ibv_devinfo is not installed, ibstat output is not understood) on gpu03 and "
            "/sys/class/infiniband is empty") in findings[1].summary


def test_no_devices_at_all() -> None:
    # ibstat's real no-device panic; "No IB devices found" is ibv_devinfo's own line (exit code not recorded)
    node_facts = facts("gpu03", ibstat=(real("ibstat_ibpanic_no_devices_container.txt"), 255),
                       ibv_devinfo=("No IB devices found\n", 255), rdma_sys=[])
    warned, failed = run("ib.port", inventory({"name": "gpu03", "nics": [nic("mlx5_0")]}), node_facts)
    assert (warned.verdict, warned.subject) == (Verdict.warned, "ibstat") and "ibpanic" in warned.summary
    assert (failed.verdict, failed.subject) == (Verdict.failed, "mlx5_0/1")
    assert failed.summary == "gpu03: mlx5_0 not found (ibv_devinfo lists no RDMA devices)"
    assert "modprobe mlx5_ib" in (failed.hint or "") and failed.measured == "none"


def test_unlisted_active_ports_are_reported_once() -> None:
    # two real ibstat outputs joined; the second CA renamed to mlx5_1 (as in test_parsers_ibstat)
    text = real("ibstat_hdr100.txt") + real("ibstat_roce_ethernet_cx5.txt").replace("mlx5_0", "mlx5_1")
    findings = run("ib.port", inventory({"name": "gpu01", "nics": [nic("mlx5_0")]}), facts("gpu01", ibstat=text))
    assert [f.verdict for f in findings] == [Verdict.passed, Verdict.passed]
    assert findings[1].data["unlisted"] == ["mlx5_1/1"] and "mlx5_1/1" in findings[1].summary


def test_node_without_rdma_nics_is_skipped_and_unreachable_nodes_are_silent() -> None:
    inv = inventory({"name": "cpu01", "nics": [{"name": "eth0", "ip": "10.0.0.1/24"}]},
                    {"name": "gpu09", "nics": [nic("mlx5_0")]})
    findings = run("ib.port", inv, facts("cpu01", ibstat=real("ibstat_hdr100.txt")),
                   NodeFacts("gpu09", error="connection refused"))
    skipped = one(findings)
    assert (skipped.verdict, skipped.node) == (Verdict.skipped, "cpu01")
    assert "no InfiniBand/RoCE NICs listed (but mlx5_0/1 active on the node)" in skipped.summary


# --- roce.gid ------------------------------------------------------------------------------------------------------

BOND = real("ibv_devinfo_vv_roce_bond_cx6dx.txt")
# derived from BOND: the RoCE v2 entry for the address removed, so only its RoCE v1 GID (index 2) is left
BOND_V1_ONLY = BOND.replace("\t\t\tGID[  3]:\t\t::ffff:27.105.179.3, RoCE v2\n", "")
# derived from BOND: GID types removed, as rdma-core releases before they were printed show the table
BOND_NO_TYPES = BOND.replace(", RoCE v1", "").replace(", RoCE v2", "")


def roce(ip: str | None = f"{BOND_IP}/24", hca: str = "mlx5_bond_0", **extra: Any) -> dict[str, Any]:
    return nic(hca, "roce", **({"ip": ip} if ip else {}), **extra)


@pytest.mark.parametrize(
    ("devinfo", "listed", "verdict", "words", "measured", "expected"),
    [
        (BOND, roce(), Verdict.passed, ["RoCE v2 GID index 3 for 27.105.179.3", "gid_index not set"], "3", None),
        (BOND, roce(gid_index=3), Verdict.passed, ["RoCE v2 GID index 3"], "3", "3"),
        (BOND, roce(gid_index=1), Verdict.warned, ["is index 3", "inventory says gid_index 1"], "3", "1"),
        (BOND, roce("10.0.0.5/24"), Verdict.failed, ["no RoCE v2 GID for 10.0.0.5", "its GIDs carry 27.105.179.3"],
         "27.105.179.3", "::ffff:10.0.0.5"),
        (BOND_V1_ONLY, roce(), Verdict.failed, ["only GID 2 (RoCE v1) carries it"], "27.105.179.3", None),
        (BOND_NO_TYPES, roce(), Verdict.warned, ["GID index 2, 3", "does not show GID types"], "2, 3", None),
        (BOND, roce(hca="mlx5_9"), Verdict.failed, ["mlx5_9 port 1 is not in the ibv_devinfo output"], None, None),
        (BOND, roce(ip=None), Verdict.skipped, ["has no ip in the inventory"], None, None),
    ],
    ids=["found", "matches-inventory", "inventory-differs", "no-gid", "only-v1", "no-types", "unknown-hca", "no-ip"],
)
def test_gid(devinfo: str, listed: dict[str, Any], verdict: Verdict, words: list[str], measured: str | None,
             expected: str | None) -> None:
    finding = one(run("roce.gid", inventory({"name": "gpu05", "nics": [listed]}), facts("gpu05", ibv_devinfo=devinfo)))
    assert (finding.verdict, finding.node) == (verdict, "gpu05")
    assert finding.subject == f"{listed['hca']}/1" and finding.summary.startswith("gpu05: ")
    for word in words:
        assert word in finding.summary
    assert finding.measured == measured
    if expected is not None:
        assert finding.expected == expected
    if verdict in (Verdict.warned, Verdict.failed):
        assert finding.hint and finding.evidence[0].command == "ibv_devinfo -v"
    if verdict is Verdict.warned and "inventory" in finding.summary:
        assert "gid_index: 3" in (finding.hint or "")


@pytest.mark.parametrize(
    ("devinfo", "words", "hint"),
    [
        (DEVINFO_NOT_INSTALLED, "ibv_devinfo is not installed", "ibverbs-utils"),
        (real("ibv_devinfo_v_roce_gid_fragment.txt"), "does not understand", "show_gids"),
    ],
    ids=["missing", "unparseable"],
)
def test_gid_without_a_gid_table(devinfo: str | tuple[str, int], words: str, hint: str) -> None:
    finding = one(run("roce.gid", inventory({"name": "gpu05", "nics": [roce()]}), facts("gpu05", ibv_devinfo=devinfo)))
    assert (finding.verdict, finding.node, finding.subject) == (Verdict.warned, "gpu05", "ibv_devinfo")
    assert words in finding.summary and hint in (finding.hint or "")


def test_gid_skips_nodes_without_roce() -> None:
    finding = one(run("roce.gid", inventory({"name": "gpu01", "nics": [nic("mlx5_0")]}), facts("gpu01", **IB_OK)))
    assert (finding.verdict, finding.node, finding.summary) == (Verdict.skipped, "gpu01", "gpu01: no RoCE NICs listed")


# --- ib.peermem ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "peermem", "verdict", "words"),
    [
        ({"gpus": 8, "nics": [nic("mlx5_0")]}, "loaded", Verdict.passed, "nvidia_peermem is loaded"),
        ({"gpus": 8, "nics": [nic("mlx5_0")]}, "absent", Verdict.warned, "nvidia_peermem is not loaded"),
        ({"gpus": 8, "nics": [nic("mlx5_0")]}, None, Verdict.warned, "nvidia_peermem could not be checked"),
        ({"nics": [nic("mlx5_0")]}, "absent", Verdict.skipped, "no GPUs listed"),
        ({"gpus": 8}, "absent", Verdict.skipped, "no InfiniBand/RoCE NICs listed"),
    ],
    ids=["loaded", "absent", "not-probed", "no-gpus", "no-rdma"],
)
def test_peermem(node: dict[str, Any], peermem: str | None, verdict: Verdict, words: str) -> None:
    sections = {"peermem": peermem + "\n"} if peermem else {}  # synthetic: the probe's own words
    finding = one(run("ib.peermem", inventory({"name": "gpu02", **node}), facts("gpu02", **sections)))
    assert (finding.verdict, finding.node) == (verdict, "gpu02")
    assert finding.summary.startswith("gpu02: ") and words in finding.summary
    if verdict is Verdict.warned:
        assert "modprobe nvidia_peermem" in (finding.hint or "") and finding.subject == "nvidia_peermem"
