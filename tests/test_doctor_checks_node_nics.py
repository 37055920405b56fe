"""Node and NIC doctor checks (node.ssh, node.os, node.python, node.versions, nic.present, nic.mtu, nic.unlisted).

Pure: every check reads :class:`NodeFacts` built by hand. ``ip -j addr`` output is the recording in
tests/fixtures/real/ip/ (see SOURCE.md) where it has the state a test needs; small synthetic ``ip -j addr``
JSON (built by :func:`synthetic_ip`) covers the rest. The python reports are synthetic: what
``probe.PYTHON_REPORT`` prints, as ``NodeFacts.python``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from reported import facts_section

import clusterrun.doctor.checks.node  # noqa: F401  (registers the checks)
from clusterrun.doctor.contradictions import contradictions
from clusterrun.doctor.facts import FACTS, MISSING, NodeFacts, Section
from clusterrun.doctor.model import Finding, Scope, Verdict
from clusterrun.doctor.probe import SECTIONS
from clusterrun.doctor.recommend import recommend
from clusterrun.doctor.registry import CHECKS, Context, Options
from clusterrun.facts.node import IP_COMMAND
from clusterrun.facts.parsers import ip
from clusterrun.inventory.locate import nic_line
from clusterrun.inventory.models import Inventory

IP = Path(__file__).parent / "fixtures" / "real" / "ip"

#: Recorded: lo, ifb0/ifb1 (down, no address), eth0 (up, mtu 1400, 192.0.2.2/24, fd00::2/64, a link-local address).
ADDR_HOST = (IP / "addr_host.json").read_text()
#: Recorded: data0 (up, mtu 9000, 198.19.0.1/16, fd00::1/64), its veth peer data0p, mgmt0 (down, 198.18.0.7/15),
#: br0 (up, link-local only), crv0 (UP flag but NO-CARRIER, operstate LOWERLAYERDOWN, 10.9.9.1/24).
ADDR_NETNS = (IP / "addr_netns_mixed.json").read_text()

PYTHON_COMMAND = "python -c <report>"  # the python section's command as probe.parse_probe names it


# --- builders ------------------------------------------------------------------------------------------------------


def nic_json(index: int, name: str, *addresses: str, mtu: int = 1500, up: bool = True, carrier: bool = True,
             master: str | None = None) -> dict[str, Any]:
    """Synthetic: one ``ip -j addr`` entry; ``addresses`` are ``a.b.c.d/NN`` or IPv6 with a prefix."""
    if up and carrier:
        flags, state = ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], "UP"
    elif up:
        flags, state = ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"], "DOWN"
    else:
        flags, state = ["BROADCAST", "MULTICAST"], "DOWN"
    entry: dict[str, Any] = {"ifindex": index, "ifname": name, "flags": flags, "mtu": mtu, "qdisc": "mq",
                             "operstate": state, "group": "default", "txqlen": 1000, "link_type": "ether",
                             "address": f"02:00:00:00:00:{index:02x}", "broadcast": "ff:ff:ff:ff:ff:ff"}
    if master:
        entry["master"] = master
    entry["addr_info"] = [
        {"family": "inet6" if ":" in a else "inet", "local": a.split("/")[0], "prefixlen": int(a.split("/")[1]),
         "scope": "global", "valid_life_time": 4294967295, "preferred_life_time": 4294967295}
        for a in addresses
    ]
    return entry


LO = {"ifindex": 1, "ifname": "lo", "flags": ["LOOPBACK", "UP", "LOWER_UP"], "mtu": 65536, "operstate": "UNKNOWN",
      "link_type": "loopback", "address": "00:00:00:00:00:00",
      "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8, "scope": "host", "label": "lo"}]}


def synthetic_ip(*entries: dict[str, Any]) -> str:
    """Synthetic ``ip -j addr show`` output: loopback, then ``entries``."""
    return json.dumps([LO, *entries])


def section_map(sections: Mapping[str, str | tuple[str, int]]) -> dict[str, Section]:
    """Probe sections from their output (exit 0) or (output, exit code)."""
    built = {}
    for name, value in sections.items():
        if name == "ip_addr":  # what the node reporter's `ip -j addr show` printed
            built[FACTS] = facts_section(ip=value)
            continue
        output, rc = value if isinstance(value, tuple) else (value, 0)
        built[name] = Section(name, SECTIONS[name], rc, output)
    return built


def facts(node: str, *, python: dict[str, Any] | None = None, python_section: tuple[str, int] | None = None,
          **sections: str | tuple[str, int]) -> NodeFacts:
    """A probed node; each section is its output (exit 0) or (output, exit code).

    ``python`` is the parsed report; unless ``python_section`` says otherwise, the section holds its JSON line.
    """
    built = dict(section_map(sections))
    if python is not None or python_section is not None:
        output, rc = python_section or (json.dumps(python), 0)
        built["python"] = Section("python", PYTHON_COMMAND, rc, output)
    return NodeFacts(node, built, latency_ms=1.0, connect_ms=50.0, python=python or {})


def inventory(*nodes: dict[str, Any], **top: Any) -> Inventory:
    return Inventory.model_validate({"nodes": [{"host": f"192.168.1.{i + 10}", **n} for i, n in enumerate(nodes)],
                                     **top})


def run(name: str, inv: Inventory, *node_facts: NodeFacts) -> list[Finding]:
    return list(CHECKS[name].run(Context(inv, {f.node: f for f in node_facts})))


def one(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, findings
    return findings[0]


def has_words(text: str | None, words: list[str]) -> bool:
    return all(w in (text or "") for w in words)


def test_checks_are_registered_with_their_scopes() -> None:
    scopes = {n: CHECKS[n].scope for n in ("node.ssh", "node.os", "node.python", "node.versions", "nic.present",
                                           "nic.mtu", "nic.unlisted")}
    assert {n for n, s in scopes.items() if s is Scope.cluster} == {"node.versions", "nic.mtu"}
    assert not any(CHECKS[n].active for n in scopes)


# --- node.ssh ------------------------------------------------------------------------------------------------------


def test_ssh_unreachable_node_fails_with_its_error_and_reachable_one_passes_with_latency() -> None:
    inv = inventory({"name": "gpu01"}, {"name": "gpu02"}, {"name": "gpu03"})
    error = "ssh: connect to host 192.168.1.11 port 22: Connection refused"
    found = run("node.ssh", inv, NodeFacts("gpu01", latency_ms=1.234, connect_ms=85.6),
                NodeFacts("gpu02", error=error))  # gpu03 has no facts at all: nothing to say about it

    ok, bad = found
    assert (ok.verdict, ok.node, ok.subject) == (Verdict.passed, "gpu01", "192.168.1.10")
    assert ok.summary == "gpu01: reachable as 192.168.1.10 (connect 86 ms, round trip 1.2 ms)"
    assert ok.measured == "1.2 ms"
    assert ok.data == {"connect_ms": 85.6, "latency_ms": 1.234}
    assert (bad.verdict, bad.node, bad.subject) == (Verdict.failed, "gpu02", "192.168.1.11")
    assert bad.summary == f"gpu02: {error}"
    assert has_words(bad.hint, ["skipped"])


def test_ssh_without_connect_time_shows_the_round_trip_only() -> None:
    f = one(run("node.ssh", inventory({"name": "gpu01"}), NodeFacts("gpu01", latency_ms=0.5)))

    assert f.verdict is Verdict.passed
    assert f.summary == "gpu01: reachable as 192.168.1.10 (round trip 0.5 ms)"


# --- node.os -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sections", "summary"),
    [
        # Synthetic /etc/os-release and uname -srm.
        ({"uname": "Linux 5.15.0-105-generic x86_64\n",
          "os_release": 'NAME="Ubuntu"\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\nID=ubuntu\n'},
         "gpu01: Ubuntu 22.04.4 LTS, Linux 5.15.0-105-generic x86_64"),
        ({"uname": "Linux 6.1.0-18-amd64 x86_64", "os_release": ("cat: /etc/os-release: No such file", 1)},
         "gpu01: unknown OS, Linux 6.1.0-18-amd64 x86_64"),
        ({}, "gpu01: unknown OS, unknown kernel"),
    ],
    ids=["ubuntu", "no-os-release", "nothing"],
)
def test_os_kernel(sections: dict[str, str | tuple[str, int]], summary: str) -> None:
    inv = inventory({"name": "gpu01"}, {"name": "gpu02"})
    f = one(run("node.os", inv, NodeFacts("gpu01", section_map(sections)), NodeFacts("gpu02", error="timed out")))

    assert (f.verdict, f.node, f.summary) == (Verdict.passed, "gpu01", summary)


# --- node.python ---------------------------------------------------------------------------------------------------

# Synthetic reports, as clusterrun/remote/pyreport.py prints them (it reads torch's files, never imports torch).
CPU_REPORT = {"python": "3.10.12", "executable": "/opt/venv/bin/python", "imported": False,
              "torch_path": "/opt/venv/lib/python3.10/site-packages/torch", "torch": "2.3.1+cpu",
              "git_version": "63d5e9221bedd1546b7d364b5ce4171547db12a9", "backends": ["gloo"], "backends_from": "build"}
GPU_REPORT = {**CPU_REPORT, "torch": "2.3.1+cu121", "cuda": "12.1", "backends": ["gloo", "nccl"], "nccl": "2.20.5",
              "nccl_from": "nvidia-nccl-cu12"}
NCCL_BUILT_IN = {**{k: v for k, v in GPU_REPORT.items() if k not in ("nccl", "nccl_from")},
                 "nccl_unknown": "NCCL is part of this torch build: its version shows only when torch is imported"}
ROCM_REPORT = {**CPU_REPORT, "torch": "2.3.1+rocm6.0", "hip": "6.0.32830", "backends": ["gloo", "nccl"],
               "nccl_unknown": NCCL_BUILT_IN["nccl_unknown"]}
TRACEBACK = ('Traceback (most recent call last):\n  File "<string>", line 2, in <module>\n'
             "ImportError: libpython3.10.so.1.0: cannot open shared object file\n")


@pytest.mark.parametrize(
    ("gpus", "report", "section", "verdict", "words", "hint_words"),
    [
        (8, None, ("/opt/venv/bin/python: not installed", MISSING), Verdict.failed,
         ["gpu01: python /opt/venv/bin/python not found"], ["set `python` in the inventory", "absolute path"]),
        (8, None, (TRACEBACK, 1), Verdict.failed,
         ["gpu01: python /opt/venv/bin/python did not run", "cannot open shared object file"], ["`python`"]),
        (8, {"python": "3.10.12", "executable": "/opt/venv/bin/python", "imported": False,
             "torch_error": "no module named 'torch' on this python's path"}, None, Verdict.failed,
         ["gpu01: /opt/venv/bin/python has no torch", "no module named 'torch'"], ["install torch"]),
        (0, {**CPU_REPORT, "backends": []}, None, Verdict.failed,
         ["gpu01: torch has no gloo backend", "torch 2.3.1+cpu", "build lacks it"], ["torch build with gloo"]),
        (8, CPU_REPORT, None, Verdict.failed,
         ["gpu01: torch has no nccl backend", "python 3.10.12, torch 2.3.1+cpu", "CPU-only build"],
         ["CUDA build of torch"]),
        (8, GPU_REPORT, None, Verdict.passed,
         ["gpu01: python 3.10.12, torch 2.3.1+cu121, CUDA 12.1, NCCL 2.20.5; backends gloo, nccl "
          "(read from its files, not imported)"], []),
        (8, NCCL_BUILT_IN, None, Verdict.passed,
         ["torch 2.3.1+cu121, CUDA 12.1, NCCL built in (its version shows on import); backends gloo, nccl"], []),
        (8, ROCM_REPORT, None, Verdict.passed, ["torch 2.3.1+rocm6.0, ROCm 6.0.32830, NCCL built in"], []),
        (0, CPU_REPORT, None, Verdict.passed,
         ["gpu01: python 3.10.12, torch 2.3.1+cpu; backends gloo (read from its files, not imported)"], []),
    ],
    ids=["python-missing", "python-crashed", "no-torch", "cpu-no-gloo", "gpu-cpu-only-build", "gpu-ok",
         "gpu-ok-nccl-built-in", "rocm-ok", "cpu-ok"],
)
def test_python_torch(gpus: int, report: dict[str, Any] | None, section: tuple[str, int] | None, verdict: Verdict,
                      words: list[str], hint_words: list[str]) -> None:
    inv = inventory({"name": "gpu01", "gpus": gpus}, defaults={"python": "/opt/venv/bin/python"})
    f = one(run("node.python", inv, facts("gpu01", python=report, python_section=section)))

    assert (f.verdict, f.node, f.subject) == (verdict, "gpu01", "/opt/venv/bin/python")
    assert has_words(f.summary, words), f.summary
    assert has_words(f.hint, hint_words), f.hint
    assert f.evidence and f.evidence[0].command == PYTHON_COMMAND and f.evidence[0].node == "gpu01"
    if verdict is Verdict.passed:
        assert f.data == report


def test_python_backend_failure_says_what_it_found_and_wanted() -> None:
    inv = inventory({"name": "cpu01"}, {"name": "gpu01", "gpus": 2})
    cpu, gpu = run("node.python", inv, facts("cpu01", python={**CPU_REPORT, "backends": []}),
                   facts("gpu01", python=CPU_REPORT))

    assert (cpu.measured, cpu.expected) == ("none", "gloo")
    assert (gpu.measured, gpu.expected) == ("gloo", "nccl")


def test_python_without_a_python_section_fails_as_not_found_and_unreachable_nodes_are_silent() -> None:
    inv = inventory({"name": "gpu01"}, {"name": "gpu02"})
    f = one(run("node.python", inv, facts("gpu01"), NodeFacts("gpu02", error="timed out")))

    assert (f.verdict, f.node, f.subject) == (Verdict.failed, "gpu01", "python3")
    assert f.summary == "gpu01: python python3 not found"
    assert f.evidence == ()


def test_python_report_without_a_torch_version_fails_rather_than_passing_an_unknown_torch() -> None:
    report = {"python": "3.10.12", "executable": "/opt/venv/bin/python", "imported": False}
    f = one(run("node.python", inventory({"name": "gpu01"}), facts("gpu01", python=report)))

    assert f.verdict is Verdict.failed and "has no torch" in f.summary


def test_no_torch_in_the_venv_itself_shows_where_python_ran_and_asks_for_torch() -> None:
    # Synthetic, as pyreport prints it for a venv's own interpreter (a symlink to the system python): no torch there.
    report = {"python": "3.11.2", "executable": "/opt/venv/bin/python", "imported": False, "prefix": "/opt/venv",
              "base_prefix": "/usr", "realpath": "/usr/bin/python3.11",
              "venv_on_path": {"venv": "/opt/venv", "link": "/opt/venv/bin/python"},
              "torch_error": "no module named 'torch' on this python's path"}
    f = one(run("node.python", inventory({"name": "gpu01"}), facts("gpu01", python=report)))

    assert f.summary.endswith("; sys.executable /opt/venv/bin/python (real path /usr/bin/python3.11), "
                              "sys.prefix /opt/venv")
    assert f.hint == "install torch in that environment, or point `python` at one that has it"
    assert f.data["prefix"] == "/opt/venv"


# --- node.versions -------------------------------------------------------------------------------------------------


def test_versions_all_equal_pass_once_for_the_cluster() -> None:
    inv = inventory({"name": "gpu01", "gpus": 8}, {"name": "gpu02", "gpus": 8}, {"name": "gpu03", "gpus": 8})
    f = one(run("node.versions", inv, *(facts(n, python=GPU_REPORT) for n in ("gpu01", "gpu02", "gpu03"))))

    assert (f.verdict, f.node) == (Verdict.passed, None)
    assert f.summary == "all 3 nodes: python 3.10.12, torch 2.3.1+cu121, CUDA 12.1, NCCL 2.20.5"


def test_versions_one_odd_torch_warns_naming_the_node_and_the_common_version() -> None:
    inv = inventory({"name": "gpu01", "gpus": 8}, {"name": "gpu02", "gpus": 8}, {"name": "gpu03", "gpus": 8})
    f = one(run("node.versions", inv, facts("gpu01", python=GPU_REPORT),
                facts("gpu02", python={**GPU_REPORT, "torch": "2.2.0+cu121"}), facts("gpu03", python=GPU_REPORT)))

    assert (f.verdict, f.node, f.subject) == (Verdict.warned, None, "torch")
    assert f.summary == "torch differs: gpu02 has 2.2.0+cu121; the others have 2.3.1+cu121"
    assert (f.measured, f.expected) == ("gpu02=2.2.0+cu121", "2.3.1+cu121")
    assert has_words(f.hint, ["same torch everywhere"])
    assert f.data["values"] == {"gpu01": "2.3.1+cu121", "gpu02": "2.2.0+cu121", "gpu03": "2.3.1+cu121"}


def test_versions_warn_once_per_differing_component_and_ignore_absent_values() -> None:
    inv = inventory(*({"name": f"gpu0{i}", "gpus": 8} for i in (1, 2, 3, 4)))
    odd = {**GPU_REPORT, "cuda": "11.8", "nccl": "2.19.3"}
    no_nccl = {k: v for k, v in GPU_REPORT.items() if k != "nccl"}  # missing, not different
    found = run("node.versions", inv, facts("gpu01", python=GPU_REPORT), facts("gpu02", python=odd),
                facts("gpu03", python=GPU_REPORT), facts("gpu04", python=no_nccl))

    assert [(f.verdict, f.subject) for f in found] == [(Verdict.warned, "CUDA"), (Verdict.warned, "NCCL")]
    assert all("gpu02 has" in f.summary and "gpu04" not in f.summary for f in found)


@pytest.mark.parametrize(
    "node_facts",
    [
        [facts("gpu01", python=GPU_REPORT)],
        [facts("gpu01", python=GPU_REPORT), facts("gpu02", python={"python": "3.10.12", "torch_error": "ImportError"})],
        [facts("gpu01", python=GPU_REPORT), NodeFacts("gpu02", error="timed out")],
    ],
    ids=["one-node", "other-has-no-torch", "other-unreachable"],
)
def test_versions_skip_with_fewer_than_two_reports(node_facts: list[NodeFacts]) -> None:
    f = one(run("node.versions", inventory({"name": "gpu01"}, {"name": "gpu02"}), *node_facts))

    assert f.verdict is Verdict.skipped
    assert "fewer than two" in f.summary


# --- nic.present ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("addr", "nic", "verdict", "words", "hint_words"),
    [
        (ADDR_HOST, {"name": "eth1", "ip": "10.0.0.11/24"}, Verdict.failed, ["gpu01: no interface eth1"],
         ["fix the NIC name", "this node has: ifb0, ifb1, eth0"]),
        (ADDR_HOST, {"name": "ens5", "ip": "192.0.2.2/24"}, Verdict.failed,
         ["gpu01: no interface ens5; 192.0.2.2 is on eth0"], ["this node has: ifb0, ifb1, eth0"]),
        (ADDR_NETNS, {"name": "mgmt0", "ip": "198.18.0.7/15"}, Verdict.failed,
         ["gpu01: mgmt0 is down (DOWN, no carrier)"], ["ip link set mgmt0 up", "cable"]),
        (ADDR_NETNS, {"name": "crv0", "ip": "10.9.9.1/24"}, Verdict.failed,
         ["gpu01: crv0 is down (LOWERLAYERDOWN, no carrier)"], ["ip link set crv0 up"]),
        (ADDR_HOST, {"name": "eth0", "ip": "192.0.2.3/24"}, Verdict.failed,
         ["gpu01: eth0 does not have 192.0.2.3; it has 192.0.2.2, fd00::2"], ["fix `ip` of this NIC"]),
        (ADDR_NETNS, {"name": "data0", "ip": "10.9.9.1"}, Verdict.failed,
         ["gpu01: data0 does not have 10.9.9.1 (10.9.9.1 is on crv0); it has 198.19.0.1"], ["inventory"]),
        (ADDR_HOST, {"name": "eth0", "ip": "192.0.2.2/24"}, Verdict.passed,
         ["gpu01: eth0 up, 192.0.2.2, fd00::2", "mtu 1400"], []),
        (ADDR_NETNS, {"name": "data0", "ip": "fd00::1/64"}, Verdict.passed, ["gpu01: data0 up, 198.19.0.1, fd00::1",
                                                                            "mtu 9000"], []),
        (ADDR_NETNS, {"name": "data0"}, Verdict.passed, ["gpu01: data0 up", "mtu 9000"], []),
    ],
    ids=["missing-name", "address-on-other-nic", "admin-down", "no-carrier", "address-mismatch",
         "address-mismatch-on-other-nic", "ok", "ok-ipv6", "ok-no-address-listed"],
)
def test_nic_present_on_recorded_ip_addr(addr: str, nic: dict[str, str], verdict: Verdict, words: list[str],
                                         hint_words: list[str]) -> None:
    f = one(run("nic.present", inventory({"name": "gpu01", "nics": [nic]}), facts("gpu01", ip_addr=addr)))

    assert (f.verdict, f.node, f.subject) == (verdict, "gpu01", nic["name"])
    assert has_words(f.summary, words), f.summary
    assert has_words(f.hint, hint_words), f.hint
    assert f.evidence[0].command == IP_COMMAND and f.evidence[0].node == "gpu01"
    if verdict is Verdict.failed:
        assert f.hint


def test_nic_present_missing_name_without_the_address_elsewhere_says_only_what_the_node_has() -> None:
    f = one(run("nic.present", inventory({"name": "gpu01", "nics": [{"name": "eth1", "ip": "10.0.0.11/24"}]}),
                facts("gpu01", ip_addr=ADDR_HOST)))

    assert f.summary == "gpu01: no interface eth1"
    assert (f.measured, f.expected) == ("ifb0, ifb1, eth0", "eth1")


def test_nic_present_down_without_carrier_synthetic() -> None:
    # Synthetic: eth1 administratively up, cable out (NO-CARRIER, operstate DOWN).
    addr = synthetic_ip(nic_json(2, "eth0", "192.168.1.10/24"), nic_json(3, "eth1", "10.0.0.11/24", carrier=False))
    inv = inventory({"name": "gpu01", "nics": [{"name": "eth0", "ip": "192.168.1.10/24"},
                                               {"name": "eth1", "ip": "10.0.0.11/24"}]})
    eth0, eth1 = run("nic.present", inv, facts("gpu01", ip_addr=addr))

    assert (eth0.verdict, eth0.subject, eth0.data) == (Verdict.passed, "eth0",
                                                       {"mtu": 1500, "addresses": ["192.168.1.10"]})
    assert (eth1.verdict, eth1.subject) == (Verdict.failed, "eth1")
    assert eth1.summary == "gpu01: eth1 is down (DOWN, no carrier)"
    assert (eth1.measured, eth1.expected) == ("DOWN, no carrier", "UP")


@pytest.mark.parametrize(
    ("section", "words", "hint_words"),
    [
        (("ip: not installed", MISSING), ["gpu01: `ip -j addr` failed; NICs not checked"], ["iproute2"]),
        # Synthetic: what an iproute2 without JSON output prints (exit 255).
        (('Option "-j" is unknown, try "ip -help".', 255), ["`ip -j addr` failed"], ["iproute2"]),
        ("not json at all", ["gpu01: cannot read `ip -j addr`", "not JSON"], []),
    ],
    ids=["missing-tool", "old-iproute2", "unparsable"],
)
def test_nic_present_without_usable_ip_output_warns(section: str | tuple[str, int], words: list[str],
                                                    hint_words: list[str]) -> None:
    inv = inventory({"name": "gpu01", "nics": [{"name": "eth0", "ip": "192.0.2.2/24"}]})
    f = one(run("nic.present", inv, facts("gpu01", ip_addr=section)))

    assert (f.verdict, f.node) == (Verdict.warned, "gpu01")
    assert has_words(f.summary, words), f.summary
    assert has_words(f.hint, hint_words), f.hint


def test_nic_present_skips_a_node_without_listed_nics_and_ignores_unreachable_ones() -> None:
    inv = inventory({"name": "gpu01"}, {"name": "gpu02", "nics": [{"name": "eth0"}]})
    f = one(run("nic.present", inv, facts("gpu01", ip_addr=ADDR_HOST), NodeFacts("gpu02", error="timed out")))

    assert (f.verdict, f.node) == (Verdict.skipped, "gpu01")
    assert f.summary == "gpu01: no NICs listed in the inventory"


# --- nic.mtu -------------------------------------------------------------------------------------------------------


def three_nodes_two_networks(data_mtus: tuple[int, int, int], prefix: bool = True) -> tuple[Inventory, list[NodeFacts]]:
    """Synthetic: eth0 on 192.168.1.0/24 (mtu 1500 everywhere), eth1 on 10.0.0.0/24 with the given MTUs."""
    nodes, node_facts = [], []
    for i, mtu in enumerate(data_mtus):
        name, mgmt, data = f"gpu0{i + 1}", f"192.168.1.{10 + i}", f"10.0.0.{11 + i}"
        suffix = "/24" if prefix else ""
        nodes.append({"name": name,
                      "nics": [{"name": "eth0", "ip": mgmt + suffix}, {"name": "eth1", "ip": data + suffix}]})
        node_facts.append(facts(name, ip_addr=synthetic_ip(nic_json(2, "eth0", f"{mgmt}/24"),
                                                           nic_json(3, "eth1", f"{data}/24", mtu=mtu))))
    return inventory(*nodes), node_facts


def test_mtu_equal_passes_once_per_network() -> None:
    inv, node_facts = three_nodes_two_networks((9000, 9000, 9000))
    found = run("nic.mtu", inv, *node_facts)

    assert [(f.verdict, f.subject, f.measured) for f in found] == [
        (Verdict.passed, "192.168.1.0/24", "1500"), (Verdict.passed, "10.0.0.0/24", "9000")]
    assert found[1].summary == "10.0.0.0/24: mtu 9000 on all 3 nodes"
    assert all(f.node is None for f in found)


def test_mtu_one_odd_node_warns_naming_node_and_values() -> None:
    inv, node_facts = three_nodes_two_networks((1500, 1500, 9000))
    found = run("nic.mtu", inv, *node_facts)

    assert [(f.verdict, f.subject) for f in found] == [(Verdict.passed, "192.168.1.0/24"), (Verdict.warned, "eth1")]
    warn = found[1]
    assert warn.node == "gpu03"
    assert warn.summary == "gpu03: eth1 has mtu 9000 on 10.0.0.0/24, the other nodes 1500"
    assert (warn.measured, warn.expected) == ("9000", "1500")
    assert has_words(warn.hint, ["ip link set eth1 mtu 1500", "gpu03", "switch"])


def test_mtu_on_recorded_ip_addr_compares_the_listed_nic() -> None:
    # Recorded data0 has mtu 9000; the second node is synthetic with data0 at 1500 and a third at 9000.
    other = synthetic_ip(nic_json(2, "data0", "198.19.0.2/16", mtu=1500))
    third = synthetic_ip(nic_json(2, "data0", "198.19.0.3/16", mtu=9000))
    inv = inventory({"name": "a", "nics": [{"name": "data0", "ip": "198.19.0.1/16"}]},
                    {"name": "b", "nics": [{"name": "data0", "ip": "198.19.0.2/16"}]},
                    {"name": "c", "nics": [{"name": "data0", "ip": "198.19.0.3/16"}]})
    warn = one(run("nic.mtu", inv, facts("a", ip_addr=ADDR_NETNS), facts("b", ip_addr=other),
                   facts("c", ip_addr=third)))

    assert (warn.verdict, warn.node, warn.subject) == (Verdict.warned, "b", "data0")
    assert "mtu 1500 on 198.19.0.0/16, the other nodes 9000" in warn.summary


def test_mtu_skips_without_prefixes_in_the_inventory() -> None:
    inv, node_facts = three_nodes_two_networks((1500, 1500, 9000), prefix=False)
    f = one(run("nic.mtu", inv, *node_facts))

    assert f.verdict is Verdict.skipped
    assert "prefix" in f.summary


# --- nic.unlisted --------------------------------------------------------------------------------------------------

# Synthetic: a GPU node with two listed NICs, docker's bridge and a container veth, a bonded port, a downed NIC.
BUSY_NODE = synthetic_ip(
    nic_json(2, "eth0", "192.168.1.10/24"),
    nic_json(3, "eth1", "10.0.0.11/24", mtu=9000),
    nic_json(4, "docker0", "172.17.0.1/16"),
    nic_json(5, "veth3f2a1b0", "169.254.10.1/16", master="docker0"),
    nic_json(6, "eth3", master="bond0"),
    nic_json(7, "bond0", "10.2.0.5/24", up=False),
    nic_json(8, "eth4", "10.3.0.5/24", up=True, carrier=False),
)
ETH2 = nic_json(9, "eth2", "10.1.0.5/16", "fd10::5/64")
LISTED = [{"name": "eth0", "ip": "192.168.1.10/24"}, {"name": "eth1", "ip": "10.0.0.11/24"}]


@pytest.mark.parametrize(
    ("addr", "nics", "summary", "subject"),
    [
        (BUSY_NODE, LISTED, "gpu01: no other NIC with an IPv4 address is up", None),
        (synthetic_ip(*json.loads(BUSY_NODE)[1:], ETH2), LISTED,
         "gpu01: also up, not in the inventory: eth2 (10.1.0.5)", "eth2"),
        (ADDR_NETNS, [{"name": "data0"}], "gpu01: no other NIC with an IPv4 address is up", None),
        (ADDR_NETNS, [], "gpu01: also up, not in the inventory: data0 (198.19.0.1)", "data0"),
        (ADDR_HOST, [], "gpu01: also up, not in the inventory: eth0 (192.0.2.2)", "eth0"),
    ],
    ids=["virtual-ignored", "extra-eth2", "netns-listed", "netns-unlisted", "host-unlisted"],
)
def test_unlisted(addr: str, nics: list[dict[str, str]], summary: str, subject: str | None) -> None:
    f = one(run("nic.unlisted", inventory({"name": "gpu01", "nics": nics}), facts("gpu01", ip_addr=addr)))

    assert (f.verdict, f.node, f.subject, f.summary) == (Verdict.passed, "gpu01", subject, summary)
    if subject:
        assert f.data == {"unlisted": [subject]}
        assert has_words(f.hint, ["NCCL_SOCKET_IFNAME", "`nics`"])
    else:
        assert f.hint is None


def test_unlisted_is_silent_without_ip_output_or_for_unreachable_nodes() -> None:
    inv = inventory({"name": "gpu01"}, {"name": "gpu02"})
    assert run("nic.unlisted", inv, facts("gpu01", ip_addr=("ip: not installed", MISSING)),
               NodeFacts("gpu02", error="timed out")) == []


def test_is_up_needs_the_up_flag_and_a_carrier() -> None:
    ifaces = ip.parse(ADDR_NETNS).interfaces

    assert {i.name for i in ifaces if i.is_up} == {"lo", "data0p", "data0", "br0"}


def test_nic_address_typo_is_told_as_an_inventory_problem_with_file_line_and_the_nodes_values(tmp_path: Path) -> None:
    source = tmp_path / "cluster.yaml"
    source.write_text("version: 1\nnodes:\n  - name: gpu01\n    nics:\n      - name: eth0\n        ip: 192.0.2.3/24\n")
    inv = inventory({"name": "gpu01", "nics": [{"name": "eth0", "ip": "192.0.2.3/24"}]})
    ctx = Context(inv, {"gpu01": facts("gpu01", ip_addr=ADDR_HOST)}, Options(inventory_file=str(source)))
    f = one(list(CHECKS["nic.present"].run(ctx)))

    assert (f.verdict, f.node, f.subject) == (Verdict.failed, "gpu01", "eth0")
    assert f"({source}:6)" in f.summary  # the line of `ip:`
    assert "{name: eth0, ip: 192.0.2.2/24}" in (f.hint or "") and "inventory problem" in (f.hint or "")
    assert f.data == {"inventory": f"{source}:6", "key": "ip", "listed": "192.0.2.3", "actual": "192.0.2.2/24",
                      "snippet": "{name: eth0, ip: 192.0.2.2/24}"}
    wrong = contradictions(ctx)[("gpu01", "eth0")]
    assert wrong.said == "inventory says 192.0.2.3, node has 192.0.2.2/24"


def test_nic_address_carried_by_another_interface_is_a_name_contradiction() -> None:
    inv = inventory({"name": "gpu01", "nics": [{"name": "ens5", "ip": "192.0.2.2/24"}]})
    ctx = Context(inv, {"gpu01": facts("gpu01", ip_addr=ADDR_HOST)})
    wrong = contradictions(ctx)[("gpu01", "ens5")]

    assert (wrong.key, wrong.listed, wrong.real_nic, wrong.where) == ("name", "ens5", "eth0", "the inventory")
    assert wrong.snippet == "{name: eth0, ip: 192.0.2.2/24}"
    f = one(list(CHECKS["nic.present"].run(ctx)))
    assert "{name: eth0, ip: 192.0.2.2/24} is what the node has" in (f.hint or "")


def test_nics_that_agree_with_the_node_or_are_missing_there_are_no_contradiction() -> None:
    inv = inventory({"name": "gpu01", "nics": [{"name": "eth0", "ip": "192.0.2.2/24"}, {"name": "eth9", "ip": "10.1.1.1"}]})
    assert contradictions(Context(inv, {"gpu01": facts("gpu01", ip_addr=ADDR_HOST)})) == {}


def test_nic_line_finds_the_key_of_the_named_nic_or_says_nothing(tmp_path: Path) -> None:
    source = tmp_path / "inv.yaml"
    source.write_text("nodes:\n  - name: a\n    nics: [{name: eth1, ip: 10.0.0.1/24}]\n"
                      "  - name: b\n    nics:\n      - {name: eth1,\n         ip: 10.0.0.2/24}\n")
    assert nic_line(source, "b", "eth1", "ip") == f"{source}:7"
    assert nic_line(source, "a", "eth1", "ip") == f"{source}:3"
    assert nic_line(source, "b", "eth1", "speed") == f"{source}:6"  # no such key: the NIC's own line
    assert nic_line(source, "c", "eth1", "ip") is None
    assert nic_line(tmp_path / "gone.yaml", "a", "eth1", "ip") is None
    (tmp_path / "bad.yaml").write_text("nodes: [\n")
    assert nic_line(tmp_path / "bad.yaml", "a", "eth1", "ip") is None


def test_snippet_keeps_the_data_network_and_writes_the_real_address_of_a_nic_the_inventory_gets_wrong() -> None:
    # Two nodes: the only data-network pair involves the typo, so no data-network ping ran; the management
    # network (slower) answered. A typo is no evidence against the data network: it stays, with the real address.
    inv = inventory({"name": "gpu01", "nics": [{"name": "eth0", "ip": "192.168.1.10/24"},
                                               {"name": "eth1", "ip": "10.0.0.11/24"}]},
                    {"name": "gpu02", "nics": [{"name": "eth0", "ip": "192.168.1.11/24"},
                                               {"name": "eth1", "ip": "10.0.0.99/24"}]},
                    network={"data": "10.0.0.0/24"})
    node_facts = {f"gpu0{i}": facts(f"gpu0{i}", ip_addr=synthetic_ip(nic_json(2, "eth0", f"192.168.1.1{i - 1}/24"),
                                                                     nic_json(3, "eth1", f"10.0.0.1{i}/24")))
                  for i in (1, 2)}
    ctx = Context(inv, node_facts)
    pinged = [Finding("net.ping", Verdict.passed, "192.168.1.0/24 (other): all 2 directed pairs answer")]
    snippet = recommend(ctx, pinged)

    assert "data: 10.0.0.0/24   # the planned data network; gpu02 not tested (see nic.present)" in snippet
    assert "nics: [{name: eth1, ip: 10.0.0.12/24}]   # the node's own; the inventory says 10.0.0.99" in snippet
    assert "192.168.1." not in snippet
