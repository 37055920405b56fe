"""The one reporter of a node's facts (clusterrun/remote/nodefacts.py), and doctor and `up` reading it alike.

The reporter runs as the real program on a /sys tree built from recorded real ``ibstat`` output, written in the
kernel's own words (``4: ACTIVE``, ``5: LinkUp``, ``100 Gb/sec``; drivers/infiniband/core/sysfs.c), with ``ip``
replaying a recorded ``ip -j`` output (tests/fixtures/real/ip/). What it prints is then read the way `up` reads
it (the ready check's facts, ``read_facts``, the NICs a hosts-only inventory gets) and the way doctor reads it
(its probe's ``facts`` section, the NICs of a one-liner node, the ``ib.port`` check): both must see the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from reported import facts_section

import clusterrun.doctor.checks.rdma  # noqa: F401  (registers the checks)
from clusterrun import remote
from clusterrun.doctor.facts import FACTS, NodeFacts, Section
from clusterrun.doctor.model import Verdict
from clusterrun.doctor.probe import PROGRAM_COMMANDS, SECTIONS, parse_probe, probe_script
from clusterrun.doctor.registry import CHECKS, Context
from clusterrun.doctor.run import with_probed_gpus, with_probed_nics
from clusterrun.facts.nics import reconcile
from clusterrun.facts.node import ProbedNode, parse_output, read_facts
from clusterrun.facts.parsers import ibstat
from clusterrun.facts.parsers.ibstat import PhysState, PortState
from clusterrun.inventory.models import Inventory, Nic, NicKind
from clusterrun.launch.replan import with_found_gpus
from clusterrun.planning.plan import JobSpec, build_plan

REAL = Path(__file__).parent / "fixtures" / "real"
KERNEL_STATE = {PortState.DOWN: "1: DOWN", PortState.INIT: "2: INIT", PortState.ARMED: "3: ARMED",
                PortState.ACTIVE: "4: ACTIVE", PortState.ACTIVE_DEFER: "5: ACTIVE_DEFER"}
KERNEL_PHYS = {PhysState.SLEEP: "1: Sleep", PhysState.POLLING: "2: Polling", PhysState.DISABLED: "3: Disabled",
               PhysState.TRAINING: "4: PortConfigurationTraining", PhysState.LINK_UP: "5: LinkUp",
               PhysState.ERROR_RECOVERY: "6: LinkErrorRecovery", PhysState.PHY_TEST: "7: Phy Test"}


def recorded_ports(fixture: str, hca: str) -> ibstat.Ca:
    """The first adapter of a recorded ibstat output, named ``hca``."""
    ca = ibstat.parse((REAL / "ibstat" / fixture).read_text()).cas[0]
    return ibstat.Ca(hca, ca.ca_type, ca.firmware, ca.node_guid, ca.ports)


def sysfs_tree(root: Path, adapters: list[tuple[ibstat.Ca, list[str]]], speeds: dict[str, int]) -> Path:
    """A /sys with class/infiniband/<hca>/ports/<n>/{state,phys_state,rate,link_layer}, each adapter's netdevs
    under device/net/, and class/net/<if>/speed."""
    for ca, netdevs in adapters:
        device = root / "class" / "infiniband" / ca.name
        for port in ca.ports:
            d = device / "ports" / str(port.number)
            d.mkdir(parents=True)
            (d / "state").write_text(KERNEL_STATE[port.state] + "\n")
            if port.physical_state is not None:
                (d / "phys_state").write_text(KERNEL_PHYS[port.physical_state] + "\n")
            if port.rate_gbps is not None:
                (d / "rate").write_text(f"{port.rate_gbps:g} Gb/sec (2X HDR)\n")
            if port.link_layer is not None:
                (d / "link_layer").write_text(port.link_layer.value + "\n")
        for netdev in netdevs:
            (device / "device" / "net" / netdev).mkdir(parents=True)
    for name, mbit in speeds.items():
        (root / "class" / "net" / name).mkdir(parents=True)
        (root / "class" / "net" / name / "speed").write_text(f"{mbit}\n")
    return root


def run_reporter(tmp_path: Path, sys_root: Path, ip_fixture: str, *, smi: bool = False,
                 visible: str | None = None) -> str:
    """The reporter's output, run as a program, with `ip` replaying ``ip_fixture``; with ``smi``, nvidia-smi is
    the stand-in replaying a real 4 x H200 recording (tests/standins/nvidia_smi.py); ``visible``:
    CUDA_VISIBLE_DEVICES in the node's environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ip").write_text(f"#!/bin/sh\nexec cat {REAL / 'ip' / ip_fixture}\n")
    (bin_dir / "ip").chmod(0o755)
    if smi:
        standin = Path(__file__).parent / "standins" / "nvidia_smi.py"
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\nexec {sys.executable} {standin} \"$@\"\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path),
           **({"CUDA_VISIBLE_DEVICES": visible} if visible is not None else {})}
    done = subprocess.run([sys.executable, str(remote.path("nodefacts")), "--sys", str(sys_root)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def hosts_only(name: str) -> Inventory:
    return Inventory.model_validate({"nodes": [{"name": name, "host": "192.0.2.10"}]})


def up_reading(name: str, output: str) -> tuple[ProbedNode, list[Nic]]:
    """What `up` makes of the report: the ready check's facts (as the agent sends them), and the NICs a
    hosts-only inventory gets from them."""
    raw = json.loads(output.split(" ", 1)[1])
    probed = ProbedNode(name, "3.12", "2.5.0", net=raw["net"], ssh_address="192.0.2.10", gpus=raw["gpus"],
                        gpu=raw.get("gpu"))
    facts, unknown, _ = read_facts({name: probed})
    assert not unknown
    return probed, list(reconcile(hosts_only(name), facts).inventory.nodes[0].nics)


def doctor_reading(name: str, output: str) -> tuple[NodeFacts, list[Nic]]:
    """What doctor makes of the same output in its probe's ``facts`` section: the NICs a one-liner gets."""
    facts = NodeFacts(name, {FACTS: Section(FACTS, PROGRAM_COMMANDS[FACTS], 0, output)})
    return facts, list(with_probed_nics(hosts_only(name), {name: facts}).nodes[0].nics)


def test_doctor_and_up_see_the_same_infiniband_ports_and_nics(tmp_path: Path) -> None:
    # mlx5_0: an ACTIVE HDR100 port; mlx5_1: a port that trained (LinkUp) but no subnet manager made ACTIVE.
    root = sysfs_tree(tmp_path / "sys", [(recorded_ports("ibstat_hdr100.txt", "mlx5_0"), ["ibp12s0"]),
                                         (recorded_ports("ibstat_bf3_ib_down_linkup_no_sm.txt", "mlx5_1"), ["ibp18s0"])],
                      {"ibp12s0": 100000, "ibp18s0": 100000})
    output = run_reporter(tmp_path, root, "link_infiniband_8_ports.json")

    probed, up_nics = up_reading("gpu01", output)
    doctor, doctor_nics = doctor_reading("gpu01", output)

    assert doctor.report is not None
    assert doctor.report.rdma == probed.report().rdma
    assert {(p.hca, p.port): (p.state, p.phys_state, p.link_layer, p.rate_gbps, p.netdevs)
            for p in doctor.report.rdma} == {
        ("mlx5_0", 1): ("4: ACTIVE", "5: LinkUp", "InfiniBand", 100.0, ("ibp12s0",)),
        ("mlx5_1", 1): ("1: DOWN", "5: LinkUp", "InfiniBand", 100.0, ("ibp18s0",))}
    # The ACTIVE port is an InfiniBand NIC for both; the DOWN one for neither (the IPoIB interfaces have no IPv4).
    assert doctor_nics == up_nics
    assert [(n.name, n.kind, n.hca, n.port) for n in up_nics] == [("ibp12s0", NicKind.infiniband, "mlx5_0", 1)]


def test_doctor_and_up_see_the_same_roce_nic(tmp_path: Path) -> None:
    root = sysfs_tree(tmp_path / "sys", [(recorded_ports("ibstat_roce_ethernet_cx5.txt", "mlx5_0"), ["data0"])],
                      {"data0": 100000})
    output = run_reporter(tmp_path, root, "addr_netns_mixed.json")

    _, up_nics = up_reading("gpu01", output)
    _, doctor_nics = doctor_reading("gpu01", output)

    assert doctor_nics == up_nics
    assert [(n.name, str(n.ip), n.kind, n.hca, n.speed) for n in up_nics] == [
        ("data0", "198.19.0.1/16", NicKind.roce, "mlx5_0", 100_000_000_000)]


@pytest.mark.parametrize(
    ("fixture", "verdict", "summary"),
    [("ibstat_hdr100.txt", Verdict.passed, "gpu01: mlx5_0 port 1 is ACTIVE (LinkUp, InfiniBand, 100 Gb/s)"),
     ("ibstat_bf3_ib_down_linkup_no_sm.txt", Verdict.failed, "gpu01: mlx5_0 port 1 is DOWN (physical state LinkUp)")],
    ids=["active", "no-subnet-manager"],
)
def test_ib_port_reads_the_same_verdict_from_sysfs_as_from_ibstat(tmp_path: Path, fixture: str, verdict: Verdict,
                                                                  summary: str) -> None:
    # A node without infiniband-diags: the kernel's port files, as the reporter reads them, decide as ibstat would.
    root = sysfs_tree(tmp_path / "sys", [(recorded_ports(fixture, "mlx5_0"), ["ibp12s0"])], {})
    output = run_reporter(tmp_path, root, "link_infiniband_8_ports.json")
    inv = Inventory.model_validate({"nodes": [{"name": "gpu01", "host": "192.0.2.10", "nics": [
        {"name": "ibp12s0", "kind": "infiniband", "hca": "mlx5_0", "port": 1}]}]})
    not_installed = {t: Section(t, SECTIONS[t], 127, f"{t}: not installed") for t in ("ibstat", "ibv_devinfo")}
    from_sysfs = NodeFacts("gpu01", {**not_installed, FACTS: Section(FACTS, PROGRAM_COMMANDS[FACTS], 0, output)})
    from_ibstat = NodeFacts("gpu01", {"ibstat": Section("ibstat", "ibstat", 0, (REAL / "ibstat" / fixture).read_text())})

    sysfs_port, *_ = CHECKS["ib.port"].run(Context(inv, {"gpu01": from_sysfs}))
    ibstat_port, *_ = CHECKS["ib.port"].run(Context(inv, {"gpu01": from_ibstat}))

    assert (sysfs_port.verdict, sysfs_port.summary) == (verdict, summary)
    assert (sysfs_port.verdict, sysfs_port.summary, sysfs_port.hint) == (
        ibstat_port.verdict, ibstat_port.summary, ibstat_port.hint)
    assert sysfs_port.evidence[0].command == "/sys/class/infiniband/*/ports/*"
    assert "mlx5_0 1 " in sysfs_port.evidence[0].output


@pytest.mark.parametrize(("visible", "gpus"), [(None, [0, 1, 2, 3]), ("2,3", [2, 3]), ("-1", [])],
                         ids=["all", "cuda-visible-devices", "hidden"])
def test_doctor_and_up_give_a_one_liner_the_same_gpus(tmp_path: Path, visible: str | None, gpus: list[int]) -> None:
    output = run_reporter(tmp_path, sysfs_tree(tmp_path / "sys", [], {}), "addr_host.json", smi=True, visible=visible)
    probed, _ = up_reading("gpu01", output)
    doctor, _ = doctor_reading("gpu01", output)
    inv = hosts_only("gpu01")
    plan = build_plan(inv, JobSpec(script="train.py", run_id="r1", local_runs_dir=str(tmp_path / "runs")))

    up_inv, _ = with_found_gpus(inv, plan, {"gpu01": probed})
    doctor_inv = with_probed_gpus(inv, {"gpu01": doctor})

    assert list(up_inv.nodes[0].gpus) == list(doctor_inv.nodes[0].gpus) == gpus
    assert doctor.report is not None and doctor.report.gpu_model == ("NVIDIA H200-141C" if gpus else None)


def probe(python: str, tmp_path: Path, path: str | None = None) -> NodeFacts:
    """doctor's probe script run by a real shell here (only its reporter and python sections)."""
    env = {**os.environ, **({"PATH": path} if path is not None else {})}
    done = subprocess.run(["/bin/sh", "-c", probe_script(python, {})], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, check=False)
    return NodeFacts("n0", parse_probe("n0", done.stdout, {}))


def test_doctor_probe_runs_the_reporter_up_runs(tmp_path: Path) -> None:
    facts = probe(sys.executable, tmp_path)
    direct = subprocess.run([sys.executable, str(remote.path("nodefacts"))], capture_output=True, text=True,
                            timeout=60, check=True).stdout
    expected = parse_output("n0", direct)
    assert facts.report is not None, facts.report_problem
    assert facts.report.interfaces is not None and expected.interfaces is not None
    assert [(i.name, [a.local for a in i.addresses]) for i in facts.report.interfaces.interfaces] == [
        (i.name, [a.local for a in i.addresses]) for i in expected.interfaces.interfaces]
    assert (facts.report.rdma, facts.report.gpus) == (expected.rdma, expected.gpus)


def test_a_node_whose_python_is_wrong_still_has_its_nics_read_by_python3(tmp_path: Path) -> None:
    facts = probe(str(tmp_path / "no" / "python"), tmp_path)
    assert facts.sections["python"].missing  # node.python fails on it, as before
    assert facts.report is not None and facts.report.interfaces is not None, facts.report_problem


def test_a_node_without_any_python_says_why_its_nics_are_not_checked(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # a shell and nothing else
    bin_dir.mkdir()
    (bin_dir / "sh").symlink_to("/bin/sh")
    facts = probe(str(tmp_path / "no" / "python"), tmp_path, path=str(bin_dir))
    inv = Inventory.model_validate({"nodes": [{"name": "n0", "host": "192.0.2.10",
                                               "nics": [{"name": "eth0", "ip": "192.0.2.10/24"}]}]})

    finding, = CHECKS["nic.present"].run(Context(inv, {"n0": facts}))

    assert facts.report is None
    assert finding.verdict is Verdict.warned
    assert finding.summary.startswith("n0: NICs not checked: no python on the node")
    assert "python3" in (finding.hint or "")


@pytest.mark.parametrize(
    ("output", "words"),
    [("", "no CLUSTERRUN-FACTS line"), ("CLUSTERRUN-FACTS {not json", "not JSON"),
     ('CLUSTERRUN-FACTS {"net": {"rdma": [{"port": 1}]}}', "an RDMA port needs hca and port")],
    ids=["nothing", "cut-short", "malformed-port"],
)
def test_a_report_that_is_not_the_reporters_names_what_is_wrong(output: str, words: str) -> None:
    facts = NodeFacts("n0", {FACTS: Section(FACTS, PROGRAM_COMMANDS[FACTS], 0, output)})
    assert facts.report is None and words in facts.report_problem


def test_failed_ip_is_part_of_the_record_not_an_error() -> None:
    facts = NodeFacts("n0", {FACTS: facts_section(ip=("ip: not installed", 127), gpus=2)})
    assert facts.report is not None and facts.report.interfaces is None and not facts.report.ip_ran
    assert facts.report.gpus == 2
