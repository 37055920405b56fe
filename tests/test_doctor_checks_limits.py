"""Limits, /dev/shm, leaked NCCL settings and clock skew (limits.*, env.*, clock.skew).

``df`` output is recorded (tests/fixtures/real/df/SOURCE.md). ``ulimit`` values are what dash's builtin prints
(a number or ``unlimited``; 64 KiB memlock is the value of openucx/ucx#8229). nccl.conf contents and login
environments are synthetic, in the probe's section format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import clusterrun.doctor.checks.limits  # noqa: F401  (registers the checks)
from clusterrun.doctor.checks.limits import clusterrun_sets, parse_nccl_conf, size_text
from clusterrun.doctor.facts import NodeFacts, Section
from clusterrun.doctor.model import Finding, Scope, Verdict
from clusterrun.doctor.probe import SECTIONS
from clusterrun.doctor.registry import CHECKS, Context
from clusterrun.inventory.models import Inventory

DF = Path(__file__).parent / "fixtures" / "real" / "df"
IB_NIC = {"name": "ib0", "ip": "10.20.0.11/24", "kind": "infiniband", "hca": "mlx5_0"}


def df(name: str) -> str:
    return (DF / name).read_text()


def facts(node: str, clock: float | None = None, **sections: str | tuple[str, int]) -> NodeFacts:
    """A probed node; each section is its output (exit 0) or (output, exit code)."""
    built = {}
    for name, value in sections.items():
        output, rc = value if isinstance(value, tuple) else (value, 0)
        built[name] = Section(name, SECTIONS[name], rc, output)
    return NodeFacts(node, built, clock_offset_s=clock)


def inventory(*nodes: dict[str, Any], **top: Any) -> Inventory:
    return Inventory.model_validate(
        {"nodes": [{"host": f"192.168.1.{i + 10}", **n} for i, n in enumerate(nodes)], **top})


def run(name: str, inv: Inventory, *node_facts: NodeFacts) -> list[Finding]:
    return list(CHECKS[name].run(Context(inv, {f.node: f for f in node_facts})))


def one(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, findings
    return findings[0]


def check_node_finding(finding: Finding, verdict: Verdict, node: str, words: list[str], hint: list[str]) -> None:
    assert (finding.verdict, finding.node) == (verdict, node)
    assert finding.summary.startswith(f"{node}: ")
    for word in words:
        assert word in finding.summary, finding.summary
    for word in hint:
        assert word in (finding.hint or ""), finding.hint
    if verdict in (Verdict.warned, Verdict.failed):
        assert finding.hint
    if verdict is not Verdict.skipped:
        assert finding.evidence and finding.evidence[0].node == node


def test_registered() -> None:
    scopes = {name: CHECKS[name].scope for name in
              ("limits.memlock", "limits.shm", "limits.nofile", "env.nccl_conf", "env.login", "clock.skew")}
    assert scopes.pop("clock.skew") is Scope.cluster and set(scopes.values()) == {Scope.node}


@pytest.mark.parametrize(("kib", "text"), [(64, "64 KiB"), (8192, "8 MiB"), (65536, "64 MiB"),
                                           (24683656, "23.5 GiB"), (1048576, "1 GiB")])
def test_size_text(kib: int, text: str) -> None:
    assert size_text(kib) == text


# --- limits.memlock -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nics", "output", "verdict", "words", "hint"),
    [
        ([IB_NIC], "unlimited\n", Verdict.passed, ["locked-memory limit is unlimited"], []),
        ([IB_NIC], "64\n", Verdict.warned, ["locked-memory limit is 64 KiB", "RDMA needs unlimited"],
         ["memlock unlimited", "/etc/security/limits.conf", "--ulimit memlock=-1"]),
        ([], "8192\n", Verdict.passed, ["locked-memory limit is 8 MiB", "no InfiniBand/RoCE NICs listed"], []),
        ([IB_NIC], ("sh: 1: ulimit: Illegal option -l\n", 2), Verdict.warned, ["could not read the locked-memory "
                                                                             "limit", "Illegal option"], ["ulimit -l"]),
    ],
    ids=["unlimited", "64k-on-rdma", "finite-without-rdma", "unreadable"],
)
def test_memlock(nics: list[dict[str, Any]], output: str | tuple[str, int], verdict: Verdict, words: list[str],
                 hint: list[str]) -> None:
    finding = one(run("limits.memlock", inventory({"name": "gpu04", "nics": nics}),
                      facts("gpu04", ulimit_memlock=output)))
    check_node_finding(finding, verdict, "gpu04", words, hint)
    if verdict is Verdict.warned and "64" in finding.summary:
        assert (finding.measured, finding.expected, finding.subject) == ("64 KiB", "unlimited", "memlock")


# --- limits.nofile ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "verdict", "words", "hint"),
    [
        ("1024\n", Verdict.warned, ["open-files limit is 1024", "below 65536"], ["nofile", "limits.conf"]),
        ("1048576\n", Verdict.passed, ["open-files limit is 1048576"], []),
        ("unlimited\n", Verdict.passed, ["open-files limit is unlimited"], []),
        ("lots\n", Verdict.warned, ["could not read the open-files limit", "'lots'"], []),
    ],
    ids=["1024", "high", "unlimited", "unreadable"],
)
def test_nofile(output: str, verdict: Verdict, words: list[str], hint: list[str]) -> None:
    finding = one(run("limits.nofile", inventory({"name": "gpu04"}), facts("gpu04", ulimit_nofile=output)))
    check_node_finding(finding, verdict, "gpu04", words, hint)
    if output == "1024\n":
        assert (finding.measured, finding.expected) == ("1024", ">= 65536")


# --- limits.shm ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "verdict", "words", "hint", "measured"),
    [
        (df("shm_tmpfs_24g.txt"), Verdict.passed, ["/dev/shm is 23.5 GiB (23.5 GiB free)"], [], "23.5 GiB"),
        (df("shm_tmpfs_64m.txt"), Verdict.warned, ["/dev/shm is 64 MiB, under 1 GiB"], ["--shm-size", "--ipc=host"],
         "64 MiB"),
        (df("shm_tmpfs_1g_full.txt"), Verdict.warned, ["only 4 MiB free of 1 GiB"], ["ls -la /dev/shm"], "4 MiB free"),
        ((df("shm_missing_exit1.txt"), 1), Verdict.failed, ["/dev/shm is missing (df: /dev/shm: No such file or "
                                                            "directory)"], ["tmpfs", "--ipc=host"], None),
        # synthetic: /dev/shm a plain directory of the root filesystem
        ("Filesystem     1024-blocks     Used Available Capacity Mounted on\n"
         "/dev/sda1       102687672 40187264  57241124      42% /\n", Verdict.warned,
         ["not a tmpfs of its own (it is part of /, /dev/sda1)"], ["mount -t tmpfs"], "97.9 GiB"),
        ("df: cannot read table of mounted file systems\n", Verdict.warned, ["could not read the size of /dev/shm"],
         ["df -Pk /dev/shm"], None),
    ],
    ids=["24g", "docker-64m", "full", "missing", "not-tmpfs", "unreadable"],
)
def test_shm(output: str | tuple[str, int], verdict: Verdict, words: list[str], hint: list[str],
             measured: str | None) -> None:
    finding = one(run("limits.shm", inventory({"name": "gpu06"}), facts("gpu06", shm=output)))
    check_node_finding(finding, verdict, "gpu06", words, hint)
    assert finding.measured == measured


def test_sections_not_gathered_are_skipped_and_unreachable_nodes_silent() -> None:
    inv = inventory({"name": "gpu01"}, {"name": "gpu02"})
    for name in ("limits.memlock", "limits.nofile", "limits.shm", "env.nccl_conf", "env.login"):
        finding = one(run(name, inv, facts("gpu01"), NodeFacts("gpu02", error="connection refused")))
        assert (finding.verdict, finding.node) == (Verdict.skipped, "gpu01")
        assert "the probe did not gather" in finding.summary


# --- env.nccl_conf and env.login ----------------------------------------------------------------------------------

# Two nodes on one ethernet data network: clusterrun sets NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_IB_DISABLE.
ETH = inventory({"name": "gpu01", "gpus": 8, "nics": [{"name": "ens2f0", "ip": "10.10.0.21/24"}]},
                {"name": "gpu02", "gpus": 8, "nics": [{"name": "ens2f0", "ip": "10.10.0.22/24"}]},
                defaults={"env": {"NCCL_DEBUG": "WARN"}})

# synthetic, as the probe prints it: "# <path>" then the file
CONF_TWO_FILES = ("# /etc/nccl.conf\nNCCL_SOCKET_IFNAME=eth0\nNCCL_IB_GID_INDEX=3\n# a comment\n\n"
                  "# /home/alice/.nccl.conf\nNCCL_DEBUG=INFO\n")


def test_clusterrun_sets_rules_and_inventory_env() -> None:
    assert clusterrun_sets(ETH, ETH.nodes[0]) == {"CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                                                  "NCCL_IB_DISABLE", "NCCL_DEBUG"}
    assert parse_nccl_conf(CONF_TWO_FILES) == {"/etc/nccl.conf": {"NCCL_SOCKET_IFNAME": "eth0",
                                                                  "NCCL_IB_GID_INDEX": "3"},
                                               "/home/alice/.nccl.conf": {"NCCL_DEBUG": "INFO"}}


def test_nccl_conf_per_file() -> None:
    etc, home = run("env.nccl_conf", ETH, facts("gpu01", nccl_conf=CONF_TWO_FILES))
    check_node_finding(etc, Verdict.warned, "gpu01", ["/etc/nccl.conf sets NCCL_IB_GID_INDEX for every NCCL job"],
                       ["clusterrun sets NCCL_SOCKET_IFNAME itself", "inventory `env`", "/etc/nccl.conf"])
    assert etc.subject == "/etc/nccl.conf" and etc.measured == "NCCL_IB_GID_INDEX, NCCL_SOCKET_IFNAME"
    assert etc.data["leaking"] == ["NCCL_IB_GID_INDEX"]
    # the inventory's defaults.env sets NCCL_DEBUG, so the file's value never reaches a clusterrun job
    check_node_finding(home, Verdict.passed, "gpu01", ["/home/alice/.nccl.conf sets only NCCL_DEBUG, which "
                                                       "clusterrun sets itself"], [])


@pytest.mark.parametrize(
    ("output", "words"),
    [("", ["no /etc/nccl.conf or ~/.nccl.conf"]), ("# /etc/nccl.conf\n# NCCL_DEBUG=INFO\n", ["sets nothing"])],
    ids=["no-files", "only-comments"],
)
def test_nccl_conf_passes(output: str, words: list[str]) -> None:
    check_node_finding(one(run("env.nccl_conf", ETH, facts("gpu02", nccl_conf=output))), Verdict.passed, "gpu02",
                       words, [])


@pytest.mark.parametrize(
    ("output", "verdict", "words", "hint"),
    [
        ("", Verdict.passed, ["no NCCL_*/GLOO_*/TORCH_NCCL_* variables"], []),
        ("NCCL_DEBUG=INFO\nNCCL_P2P_DISABLE=1\nNCCL_SOCKET_IFNAME=eth0\nTORCH_NCCL_BLOCKING_WAIT=1\n", Verdict.warned,
         ["the login environment sets NCCL_P2P_DISABLE, TORCH_NCCL_BLOCKING_WAIT", "every job started over SSH"],
         ["clusterrun sets NCCL_DEBUG, NCCL_SOCKET_IFNAME itself", "inventory `env`", "~/.bashrc"]),
        ("GLOO_SOCKET_IFNAME=eth0\nCUDA_VISIBLE_DEVICES=0\n", Verdict.passed,
         ["sets CUDA_VISIBLE_DEVICES, GLOO_SOCKET_IFNAME, which clusterrun sets itself"], []),
    ],
    ids=["clean", "leaks", "all-overridden"],
)
def test_login_env(output: str, verdict: Verdict, words: list[str], hint: list[str]) -> None:
    finding = one(run("env.login", ETH, facts("gpu01", env_nccl=output)))
    check_node_finding(finding, verdict, "gpu01", words, hint)
    if verdict is Verdict.warned:
        assert finding.data["leaking"] == ["NCCL_P2P_DISABLE", "TORCH_NCCL_BLOCKING_WAIT"]
        assert finding.data["variables"]["NCCL_P2P_DISABLE"] == "1"


def test_login_env_when_the_data_network_is_unknown() -> None:
    # no subnet is shared by the nodes: clusterrun pins no socket interface, so the login one leaks in
    inv = inventory({"name": "gpu01", "nics": [{"name": "ens2f0", "ip": "10.10.0.21/24"}]},
                    {"name": "gpu02", "nics": [{"name": "eth9", "ip": "10.99.0.2/24"}]})
    assert "NCCL_SOCKET_IFNAME" not in clusterrun_sets(inv, inv.nodes[1])
    finding = one(run("env.login", inv, facts("gpu02", env_nccl="NCCL_SOCKET_IFNAME=eth9\n")))
    assert finding.verdict is Verdict.warned and finding.data["leaking"] == ["NCCL_SOCKET_IFNAME"]


def test_clusterrun_sets_only_inventory_env_when_no_plan_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    from clusterrun.errors import PlanError

    def no_plan(inv: Inventory) -> None:
        raise PlanError("no data network")

    monkeypatch.setattr("clusterrun.planning.network.resolve_data_network", no_plan)
    assert clusterrun_sets(ETH, ETH.nodes[0]) == {"NCCL_DEBUG"}


# --- clock.skew ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offsets", "verdict", "node", "words"),
    [
        ({"gpu01": 0.02, "gpu02": -0.3, "gpu03": 0.4}, Verdict.passed, None, ["clocks of 3 nodes agree within 0.70 s"]),
        ({"gpu01": 0.0, "gpu02": 0.1, "gpu03": 5.2}, Verdict.warned, "gpu03",
         ["gpu03: clock is +5.1 s off the median of 3 nodes", "differ by up to 5.2 s"]),
        ({"gpu01": 0.0, "gpu02": -120.0, "gpu03": 0.3}, Verdict.failed, "gpu02",
         ["gpu02: clock is -120.0 s off the median", "differ by up to 120.3 s"]),
    ],
    ids=["in-sync", "5s", "2min"],
)
def test_clock(offsets: dict[str, float], verdict: Verdict, node: str | None, words: list[str]) -> None:
    inv = inventory(*({"name": n} for n in offsets))
    finding = one(run("clock.skew", inv, *(facts(n, clock=o) for n, o in offsets.items())))
    assert (finding.verdict, finding.node, finding.subject) == (verdict, node, "clock")
    for word in words:
        assert word in finding.summary
    assert finding.expected == "<= 1 s" and finding.evidence and "gpu01: +0.0" in finding.evidence[0].output
    if verdict is not Verdict.passed:
        assert "chrony" in (finding.hint or "") and "torch elastic" in (finding.hint or "")


def test_clock_unknown_offsets_and_unreachable_nodes() -> None:
    inv = inventory({"name": "gpu01"}, {"name": "gpu02"}, {"name": "gpu03"}, {"name": "gpu04"})
    findings = run("clock.skew", inv, facts("gpu01", clock=0.1), facts("gpu02"), facts("gpu03", clock=0.2),
                   NodeFacts("gpu04", error="timed out"))
    assert [(f.verdict, f.node) for f in findings] == [(Verdict.skipped, "gpu02"), (Verdict.passed, None)]
    assert "clock offset unknown" in findings[0].summary
    assert findings[1].data["offsets_s"] == {"gpu01": 0.1, "gpu03": 0.2}


@pytest.mark.parametrize(("clocks", "words"), [({"gpu01": 0.5}, "only gpu01's clock is known"),
                                               ({"gpu01": None}, "no node's clock is known")],
                         ids=["one-node", "none"])
def test_clock_needs_two_nodes(clocks: dict[str, float | None], words: str) -> None:
    findings = run("clock.skew", inventory({"name": "gpu01"}), *(facts(n, clock=c) for n, c in clocks.items()))
    assert findings[-1].verdict is Verdict.skipped and words in findings[-1].summary

