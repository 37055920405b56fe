"""GPU doctor checks on recorded real nvidia-smi output, plus small synthetic outputs where no recording exists.

Doctor reads the node reporter's one nvidia-smi round (its ``gpu`` part, the one ``up`` reads): :func:`facts`
puts each output where the reporter puts it. The recorded CSV files carry a header (``--format=csv``), while
the reporter asks for ``noheader``; the parser reads both, so the recordings stand in for its output. Synthetic
text is marked as such.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import clusterrun.doctor.checks.gpu  # noqa: F401  (registers the checks)
from clusterrun.doctor.facts import FACTS, GPU_SECTIONS, MISSING, NodeFacts, Section
from clusterrun.doctor.model import Finding, Verdict
from clusterrun.doctor.probe import PROGRAM_COMMANDS
from clusterrun.doctor.registry import CHECKS, Context, Options
from clusterrun.facts.node import LINE
from clusterrun.inventory.models import Inventory
from clusterrun.remote import gpufacts

REAL = Path(__file__).parent / "fixtures" / "real"

H200_BUSY = "query_gpu_index_uuid_memory_h200_busy.csv"
H100 = "query_gpu_name_busid_vbios_h100.csv"
TWO_MODELS = "query_gpu_padded_columns_two_models.csv"
GTX1050TI = "query_gpu_driver_memory_gtx1050ti.csv"
RTX5060TI = "query_gpu_util_driver_pstate_rtx5060ti.csv"
NO_APPS = "query_compute_apps_header_only_no_processes.csv"
OTHER_APPS = "query_compute_apps_gpu_uuid_name_header.csv"
H200_GPU1 = "GPU-7bdd753d-3af1-11b3-a839-80f10ebdf224"

# Synthetic: what nvidia-smi prints when the kernel module is not loaded (exit code 9).
DRIVER_ERROR = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                "Make sure that the latest NVIDIA driver is installed and running.\n")
NOT_INSTALLED = "nvidia-smi: not installed\n"  # what the probe prints for a missing tool (exit 127)


def smi(name: str) -> str:
    return (REAL / "nvidia_smi" / name).read_text()


def topo(name: str) -> str:
    return (REAL / "topo" / name).read_text()


def synthetic_smi(count: int, model: str = "NVIDIA H100 80GB HBM3", driver: str = "535.104.05",
                  used: dict[int, int] | None = None, ecc: dict[int, str] | None = None,
                  util: dict[int, int] | None = None) -> str:
    """Synthetic ``--query-gpu=<gpufacts.GPU_FIELDS> --format=csv,noheader,nounits`` rows, as the reporter asks."""
    used, ecc, util = used or {}, ecc or {}, util or {}
    return "".join(f"{i}, GPU-00000000-0000-0000-0000-00000000000{i}, {model}, 00000000:{0x18 + i:02X}:00.0, "
                   f"{driver}, 81559, {used.get(i, 3)}, {util.get(i, 0)}, {ecc.get(i, '0')}\n" for i in range(count))


#: The command each GPU section shows: the reporter's nvidia-smi calls.
COMMANDS = {name: " ".join(gpufacts.commands("nvidia-smi")[call]) for name, call in GPU_SECTIONS.items()}


def reported(**sections: str | tuple[str, int]) -> dict[str, Any] | None:
    """The reporter's ``gpu`` part where nvidia-smi printed ``sections`` (each its output, exit 0, or (output,
    exit code)); a call not given failed without output; exit 127 (not installed): no nvidia-smi there."""
    if any(isinstance(v, tuple) and v[1] == MISSING for v in sections.values()):
        return None
    part: dict[str, Any] = {"smi": "/usr/bin/nvidia-smi", "visible": None, "fields": gpufacts.GPU_FIELDS,
                            "owners": {}}
    for name, call in GPU_SECTIONS.items():
        output, rc = (sections[name] if isinstance(sections[name], tuple) else (sections[name], 0)) \
            if name in sections else ("", 1)
        if rc == 0:
            part[call] = output
        else:
            part.update({f"{call}_error": f"exit {rc}", f"{call}_exit": rc, f"{call}_output": output})
    return part


def facts(node: str, **sections: str | tuple[str, int]) -> NodeFacts:
    """A probed node whose reporter's nvidia-smi printed ``sections`` (see :func:`reported`); none given: the
    reporter did not run."""
    if not sections:
        return NodeFacts(node)
    line = LINE + json.dumps({"net": {}, "gpus": None, "gpu": reported(**sections)})
    return NodeFacts(node, {FACTS: Section(FACTS, PROGRAM_COMMANDS[FACTS], 0, line)})


def inventory(*nodes: dict[str, Any], **top: Any) -> Inventory:
    return Inventory.model_validate({
        "nodes": [{"host": f"192.168.1.{i + 10}", **n} for i, n in enumerate(nodes)], **top,
    })


def run(name: str, inv: Inventory, *node_facts: NodeFacts, **options: Any) -> list[Finding]:
    ctx = Context(inv, {f.node: f for f in node_facts}, Options(**options))
    return list(CHECKS[name].run(ctx))


def one(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, findings
    return findings[0]


def by_verdict(findings: list[Finding], verdict: Verdict) -> list[Finding]:
    return [f for f in findings if f.verdict is verdict]


def test_checks_are_registered_with_their_names() -> None:
    names = {"gpu.present", "gpu.indices", "gpu.model", "gpu.busy", "gpu.ecc", "gpu.topology"}
    assert names <= set(CHECKS)
    assert CHECKS["gpu.model"].scope.value == "cluster"
    assert all(CHECKS[n].scope.value == "node" for n in names - {"gpu.model"})


# --- gpu.present ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "section", "verdict", "words", "hint_words"),
    [
        (8, (NOT_INSTALLED, MISSING), Verdict.failed,
         ["nvidia-smi not installed on gpu03 but the inventory lists 8 GPUs"], ["install the NVIDIA driver", "`gpus`"]),
        (8, (DRIVER_ERROR, 9), Verdict.failed, ["gpu03: nvidia-smi failed: NVIDIA-SMI has failed",
         "couldn't communicate with the NVIDIA driver", "installed and running; the inventory lists 8 GPUs"],
         ["dmesg", "reinstall the driver"]),
        (8, ("", 124), Verdict.failed, ["gpu03:", "exited 124", "no output"], ["driver"]),
        (4, smi(H200_BUSY), Verdict.passed, ["gpu03:", "4 GPUs", "NVIDIA H200-141C", "4 listed"], []),
        # Synthetic: a row with too few columns for the probe's query.
        (2, "0, NVIDIA H100 80GB HBM3\n", Verdict.warned, ["gpu03: cannot read nvidia-smi", "expected 9 columns"],
         ["by hand"]),
        (0, (NOT_INSTALLED, MISSING), Verdict.skipped, ["gpu03: no GPUs listed"], []),
        (0, smi(H100), Verdict.warned, ["gpu03:", "2 GPUs", "NVIDIA H100 80GB HBM3", "lists none", "not be used"],
         ["gpus: 2"]),
    ],
    ids=["missing-tool", "driver-error", "timeout", "ok", "unparsable", "no-gpus", "unlisted-gpus"],
)
def test_gpu_present(gpus: int, section: str | tuple[str, int], verdict: Verdict, words: list[str],
                     hint_words: list[str]) -> None:
    f = one(run("gpu.present", inventory({"name": "gpu03", "gpus": gpus}), facts("gpu03", nvidia_smi=section)))

    assert (f.verdict, f.node) == (verdict, "gpu03")
    assert all(w in f.summary for w in words), f.summary
    assert all(w in (f.hint or "") for w in hint_words), f.hint
    assert f.evidence[0].command == COMMANDS["nvidia_smi"] and f.evidence[0].node == "gpu03"
    if verdict in (Verdict.warned, Verdict.failed):
        assert f.hint


def test_gpu_present_without_the_section_skips_and_unreachable_nodes_are_silent() -> None:
    inv = inventory({"name": "gpu01", "gpus": 8}, {"name": "gpu02", "gpus": 8})
    findings = run("gpu.present", inv, facts("gpu01"), NodeFacts("gpu02", error="connection refused"))

    f = one(findings)
    assert (f.verdict, f.node) == (Verdict.skipped, "gpu01")
    assert "no GPU facts: the node's facts were not gathered" in f.summary


# --- gpu.indices ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "verdict", "subject", "words"),
    [
        (4, Verdict.passed, "gpus", ["gpu01: all 4 listed GPUs present", "GPU 0-3"]),
        (8, Verdict.failed, "GPU4-7", ["gpu01: GPU 4-7 listed but not present", "nvidia-smi shows GPU 0-3"]),
        ([0, 5], Verdict.failed, "GPU5", ["GPU 5 listed", "shows GPU 0-3"]),
    ],
)
def test_gpu_indices(gpus: int | list[int], verdict: Verdict, subject: str, words: list[str]) -> None:
    f = one(run("gpu.indices", inventory({"name": "gpu01", "gpus": gpus}), facts("gpu01", nvidia_smi=smi(H200_BUSY))))

    assert (f.verdict, f.node, f.subject) == (verdict, "gpu01", subject)
    assert all(w in f.summary for w in words), f.summary
    if verdict is Verdict.failed:
        assert "nvidia-smi -L" in (f.hint or "") and "inventory" in (f.hint or "")


@pytest.mark.parametrize("check", ["gpu.indices", "gpu.model", "gpu.busy", "gpu.ecc"])
@pytest.mark.parametrize(
    ("gpus", "section", "verdict", "words"),
    [
        (8, (NOT_INSTALLED, MISSING), Verdict.skipped, ["gpu02: nvidia-smi not installed", "see gpu.present"]),
        (8, (DRIVER_ERROR, 9), Verdict.skipped, ["gpu02: nvidia-smi failed (see gpu.present)"]),
        (2, "0, NVIDIA H100 80GB HBM3\n", Verdict.warned, ["gpu02: cannot read nvidia-smi", "unrecognised output"]),
    ],
    ids=["missing-tool", "driver-error", "unparsable"],
)
def test_checks_that_need_nvidia_smi_leave_failures_to_gpu_present(
    check: str, gpus: int, section: str | tuple[str, int], verdict: Verdict, words: list[str]
) -> None:
    f = one(run(check, inventory({"name": "gpu02", "gpus": gpus}), facts("gpu02", nvidia_smi=section)))

    assert (f.verdict, f.node) == (verdict, "gpu02")
    assert all(w in f.summary for w in words), f.summary


@pytest.mark.parametrize("check", ["gpu.model", "gpu.busy", "gpu.ecc"])
def test_checks_skip_a_node_whose_listed_gpus_are_all_missing(check: str) -> None:
    f = one(run(check, inventory({"name": "gpu01", "gpus": [8, 9]}), facts("gpu01", nvidia_smi=smi(H200_BUSY))))

    assert (f.verdict, f.node) == (Verdict.skipped, "gpu01")
    assert f.summary == "gpu01: none of the listed GPUs present (see gpu.indices)"


@pytest.mark.parametrize("check", ["gpu.indices", "gpu.busy", "gpu.ecc", "gpu.topology"])
def test_node_checks_skip_nodes_without_gpus(check: str) -> None:
    inv = inventory({"name": "cpu01", "gpus": 0}, {"name": "gpu01", "gpus": 0})
    findings = run(check, inv, facts("cpu01", nvidia_smi=(NOT_INSTALLED, MISSING)),
                   NodeFacts("gpu01", error="timed out"))

    f = one(findings)
    assert (f.verdict, f.node, f.summary) == (Verdict.skipped, "cpu01", "cpu01: no GPUs listed")


# --- gpu.model -----------------------------------------------------------------------------------------------------


def test_gpu_model_same_everywhere_passes_once_for_the_cluster() -> None:
    inv = inventory({"name": "gpu01", "gpus": 2}, {"name": "gpu02", "gpus": 2})
    f = one(run("gpu.model", inv, facts("gpu01", nvidia_smi=smi(H100)), facts("gpu02", nvidia_smi=smi(H100))))

    assert (f.verdict, f.node, f.subject) == (Verdict.passed, None, "GPU model")
    assert f.summary == "gpu01, gpu02: NVIDIA H100 80GB HBM3 on every listed GPU"
    assert f.data["models"] == {"gpu01": "NVIDIA H100 80GB HBM3", "gpu02": "NVIDIA H100 80GB HBM3"}
    assert len(f.evidence) == 2


def test_gpu_model_names_the_odd_node_and_both_models() -> None:
    inv = inventory({"name": "gpu01", "gpus": 2}, {"name": "gpu02", "gpus": 4}, {"name": "gpu03", "gpus": 2})
    findings = run("gpu.model", inv, facts("gpu01", nvidia_smi=smi(H100)), facts("gpu02", nvidia_smi=smi(H200_BUSY)),
                   facts("gpu03", nvidia_smi=smi(H100)))

    f = one(findings)
    assert (f.verdict, f.node, f.subject) == (Verdict.warned, "gpu02", "GPU model")
    assert f.summary == "gpu02: GPU model NVIDIA H200-141C differs from NVIDIA H100 80GB HBM3 on gpu01, gpu03"
    assert (f.measured, f.expected) == ("NVIDIA H200-141C", "NVIDIA H100 80GB HBM3")
    assert "slowest GPU" in (f.hint or "")


@pytest.mark.parametrize(
    ("gpus", "verdict", "words"),
    [
        (2, Verdict.warned, ["gpu01: mixed GPU models", "GPU0 NVIDIA GeForce RTX 5070 Laptop GPU",
                             "GPU1 NVIDIA GeForce RTX 5060 Ti"]),
        ([1], Verdict.passed, ["NVIDIA GeForce RTX 5060 Ti", "driver 616.92"]),
    ],
)
def test_gpu_model_within_a_node_judges_only_listed_gpus(gpus: int | list[int], verdict: Verdict,
                                                         words: list[str]) -> None:
    f = one(run("gpu.model", inventory({"name": "gpu01", "gpus": gpus}), facts("gpu01", nvidia_smi=smi(TWO_MODELS))))

    assert f.verdict is verdict
    assert all(w in f.summary for w in words), f.summary
    assert "5070" not in f.summary or verdict is Verdict.warned


def test_gpu_model_warns_on_driver_mismatch() -> None:
    inv = inventory(*({"name": f"gpu0{i}", "gpus": 2} for i in (1, 2, 3)))
    findings = run("gpu.model", inv, facts("gpu01", nvidia_smi=synthetic_smi(2)),
                   facts("gpu02", nvidia_smi=synthetic_smi(2, driver="550.54.15")),
                   facts("gpu03", nvidia_smi=synthetic_smi(2)))

    warn, ok = by_verdict(findings, Verdict.warned), by_verdict(findings, Verdict.passed)
    assert len(warn) == 1 and len(ok) == 1
    assert (warn[0].node, warn[0].subject, warn[0].measured, warn[0].expected) == (
        "gpu02", "driver", "550.54.15", "535.104.05")
    assert warn[0].summary == "gpu02: driver 550.54.15 differs from 535.104.05 on gpu01, gpu03"
    assert "same NVIDIA driver" in (warn[0].hint or "")
    assert "driver" not in ok[0].summary  # no single driver to name


def test_gpu_model_two_real_consumer_cards_differ_in_model_and_driver() -> None:
    inv = inventory({"name": "ws01", "gpus": 1}, {"name": "ws02", "gpus": 1})
    findings = run("gpu.model", inv, facts("ws01", nvidia_smi=smi(GTX1050TI)), facts("ws02", nvidia_smi=smi(RTX5060TI)))

    assert {(f.verdict, f.node, f.subject) for f in findings} == {
        (Verdict.warned, "ws02", "GPU model"), (Verdict.warned, "ws02", "driver")}
    model = next(f for f in findings if f.subject == "GPU model")
    assert "NVIDIA GeForce RTX 5060 Ti" in model.summary and "NVIDIA GeForce GTX 1050 Ti" in model.summary


def test_gpu_model_skips_broken_and_gpuless_nodes() -> None:
    inv = inventory({"name": "gpu01", "gpus": 2}, {"name": "gpu02", "gpus": 8}, {"name": "login", "gpus": 0})
    findings = run("gpu.model", inv, facts("gpu01", nvidia_smi=smi(H100)),
                   facts("gpu02", nvidia_smi=(NOT_INSTALLED, MISSING)), facts("login"))

    assert [(f.verdict, f.node) for f in findings] == [(Verdict.skipped, "gpu02"), (Verdict.passed, None)]
    nothing = one(run("gpu.model", inventory({"name": "login"}), facts("login")))
    assert (nothing.verdict, nothing.node) == (Verdict.skipped, None)
    assert "no node lists GPUs" in nothing.summary


# --- gpu.busy ------------------------------------------------------------------------------------------------------

# Synthetic: a compute process on GPU1 of the recorded H200 node (uuid from the recording).
H200_APPS = f"{H200_GPU1}, 4242, python, 131000\n"


def test_gpu_busy_names_gpu_pid_process_and_memory() -> None:
    findings = run("gpu.busy", inventory({"name": "gpu02", "gpus": 4}),
                   facts("gpu02", nvidia_smi=smi(H200_BUSY), nvidia_apps=H200_APPS))

    assert [(f.verdict, f.subject) for f in findings] == [(Verdict.warned, f"GPU{i}") for i in range(4)]
    gpu0, gpu1 = findings[0], findings[1]
    assert gpu1.summary == "gpu02: GPU1 busy: 131470 MiB used by pid 4242 python"
    assert "one busy GPU slows every rank" in (gpu1.hint or "") and "kill 4242" in (gpu1.hint or "")
    assert "leave GPU1 out of `gpus`" in (gpu1.hint or "")
    assert gpu1.data["processes"] == [{"pid": 4242, "name": "python", "used_memory_mib": 131000}]
    assert (gpu1.measured, gpu1.expected) == ("131470 MiB used, 1 processes", "<= 1024 MiB, no processes")
    assert gpu0.summary.startswith("gpu02: GPU0 busy: 45662 MiB used, no compute process listed")
    assert [e.command for e in gpu1.evidence] == [COMMANDS["nvidia_smi"], COMMANDS["nvidia_apps"]]


@pytest.mark.parametrize(
    ("gpus", "smi_text", "apps", "options", "verdict", "words"),
    [
        (8, synthetic_smi(8), smi(NO_APPS), {}, Verdict.passed,
         ["gpu01: 8 GPUs, NVIDIA H100 80GB HBM3, none busy (at most 3 MiB used)"]),
        # Real processes on GPUs of another machine: they are not on any listed GPU here.
        (8, synthetic_smi(8), smi(OTHER_APPS), {}, Verdict.passed, ["none busy"]),
        # Synthetic: GPU5's memory and GPU6's utilisation make them busy, but only GPUs 0 and 1 are listed.
        ([0, 1], synthetic_smi(8, used={5: 40000}, util={6: 90}), smi(NO_APPS), {}, Verdict.passed,
         ["2 GPUs", "none busy (at most 3 MiB used)"]),
        (8, synthetic_smi(8), None, {}, Verdict.passed, ["none busy", "compute processes not listed"]),
        (2, smi(TWO_MODELS), None, {}, Verdict.skipped, ["gpu01: neither GPU memory use nor compute processes"]),
    ],
    ids=["idle", "other-machines-processes", "unlisted-busy-ignored", "no-apps", "nothing-reported"],
)
def test_gpu_busy_passes_and_skips(gpus: int | list[int], smi_text: str, apps: str | None, options: dict[str, int],
                                   verdict: Verdict, words: list[str]) -> None:
    sections = {"nvidia_smi": smi_text, **({"nvidia_apps": apps} if apps is not None else {})}
    f = one(run("gpu.busy", inventory({"name": "gpu01", "gpus": gpus}), facts("gpu01", **sections), **options))

    assert (f.verdict, f.node) == (verdict, "gpu01")
    assert all(w in f.summary for w in words), f.summary


def test_gpu_busy_flags_a_process_with_little_memory_and_lists_several() -> None:
    # Synthetic: two small processes on GPU3 of an otherwise idle node.
    uuid = "GPU-00000000-0000-0000-0000-000000000003"
    apps = f"{uuid}, 77, /usr/bin/python3, 300\n{uuid}, 78, ray::IDLE, 200\n"
    findings = run("gpu.busy", inventory({"name": "gpu01", "gpus": 8}),
                   facts("gpu01", nvidia_smi=synthetic_smi(8, used={3: 500}), nvidia_apps=apps))

    f = one(findings)
    assert (f.verdict, f.subject) == (Verdict.warned, "GPU3")
    assert f.summary == ("gpu01: GPU3 busy: 500 MiB used by pid 77 /usr/bin/python3 (300 MiB), "
                         "pid 78 ray::IDLE (200 MiB)")
    assert "kill 77 78" in (f.hint or "")


def test_gpu_busy_flags_a_gpu_at_half_utilisation_or_more_as_up_does() -> None:
    # Synthetic: GPU2 at 50 % with little memory in use and no process listed (another container's kernel).
    findings = run("gpu.busy", inventory({"name": "gpu01", "gpus": 4}),
                   facts("gpu01", nvidia_smi=synthetic_smi(4, util={1: 49, 2: 50}), nvidia_apps=smi(NO_APPS)))

    f = one(findings)
    assert (f.verdict, f.subject) == (Verdict.warned, "GPU2")
    assert f.summary.startswith("gpu01: GPU2 busy: 3 MiB used, 50 % utilised, no compute process listed")
    assert (f.measured, f.expected) == ("3 MiB used, 0 processes, 50 % utilised", "< 50 % utilised")
    assert f.data["why"] == "busy: 50 % utilised"


def test_gpu_busy_unreadable_process_list_warns_and_still_judges_memory() -> None:
    # Synthetic: a process row with a non-numeric pid.
    findings = run("gpu.busy", inventory({"name": "gpu01", "gpus": 8}),
                   facts("gpu01", nvidia_smi=synthetic_smi(8), nvidia_apps="GPU-x, abc, python, 10\n"))

    assert [f.verdict for f in findings] == [Verdict.warned, Verdict.passed]
    assert findings[0].subject == "processes" and "pid is not a number" in findings[0].summary
    assert findings[0].evidence[0].command == COMMANDS["nvidia_apps"]


# --- gpu.ecc -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "smi_text", "verdicts", "words"),
    [
        (8, synthetic_smi(8), [Verdict.passed], ["gpu01: no uncorrected ECC errors on 8 GPUs"]),
        (8, synthetic_smi(8, ecc={3: "2"}), [Verdict.failed], ["gpu01: GPU3 has 2 uncorrected ECC errors"]),
        ([0, 1, 2], synthetic_smi(8, ecc={3: "2"}), [Verdict.passed], ["no uncorrected ECC errors on 3 GPUs"]),
        (2, synthetic_smi(2, ecc={0: "[N/A]", 1: "[N/A]"}), [Verdict.passed], ["gpu01: ECC not reported on 2 GPUs"]),
        (4, smi(H200_BUSY), [Verdict.skipped], ["gpu01: ECC errors not queried"]),
        (2, synthetic_smi(2, ecc={1: "lots"}), [Verdict.warned, Verdict.passed],
         ["GPU1 ECC error count is not a number"]),
    ],
    ids=["clean", "errors", "unlisted-gpu-errors", "not-reported", "not-queried", "garbage"],
)
def test_gpu_ecc(gpus: int | list[int], smi_text: str, verdicts: list[Verdict], words: list[str]) -> None:
    findings = run("gpu.ecc", inventory({"name": "gpu01", "gpus": gpus}), facts("gpu01", nvidia_smi=smi_text))

    assert [f.verdict for f in findings] == verdicts
    assert all(w in findings[0].summary for w in words), findings[0].summary
    assert all(f.node == "gpu01" for f in findings)
    if verdicts[0] is Verdict.failed:
        f = findings[0]
        assert (f.subject, f.measured, f.expected) == ("GPU3", "2", "0")
        assert all(w in (f.hint or "") for w in ("drain gpu01", "nvidia-smi -q -d ECC", "dmesg", "reset"))


# --- gpu.topology --------------------------------------------------------------------------------------------------

IB_NIC = {"name": "ib0", "ip": "10.20.0.11/16", "kind": "infiniband", "hca": "mlx5_0"}


def topology(gpus: int | list[int], text: str | tuple[str, int] | None, nics: tuple[dict[str, Any], ...] = (),
             **top: Any) -> list[Finding]:
    sections = {"nvidia_topo": text} if text is not None else {}
    return run("gpu.topology", inventory({"name": "gpu01", "gpus": gpus, "nics": list(nics)}, **top),
               facts("gpu01", **sections))


def test_topology_reports_links_numa_and_nearest_nic() -> None:
    f = one(topology(8, topo("8gpu_h100_nv18.txt")))

    assert (f.verdict, f.node, f.subject) == (Verdict.passed, "gpu01", "topology")
    assert f.summary == ("gpu01: 8 GPUs, links NV18 x28; NUMA 0: GPU0-3, 1: GPU4-7; nearest NIC none in the matrix")
    assert set(f.data["gpu_links"].values()) == {"NV18"} and len(f.data["gpu_links"]) == 28
    assert f.data["numa"] == {"0": ["GPU0", "GPU1", "GPU2", "GPU3"], "1": ["GPU4", "GPU5", "GPU6", "GPU7"]}
    assert f.evidence[0].command == COMMANDS["nvidia_topo"]


def test_topology_nearest_nic_by_legend_name() -> None:
    f = one(topology([0, 1], topo("4gpu_pcie_nic_legend.txt"), (IB_NIC,)))

    assert f.verdict is Verdict.passed
    assert f.data["nearest_nic"] == {"GPU0": {"nics": ["mlx5_0", "NIC1"], "link": "NODE"},
                                     "GPU1": {"nics": ["mlx5_0", "NIC1"], "link": "NODE"}}
    assert f.data["gpu_links"] == {"GPU0-GPU1": "NODE"} and f.data["rdma_hcas"] == ["mlx5_0"]
    assert "nearest NIC NODE for GPU0-1" in f.summary


@pytest.mark.parametrize(
    ("name", "gpus", "summary", "hint_words"),
    [
        ("4gpu_nv4_mlx5_rows.txt", 4, "gpu01: GPU2, GPU3 reach mlx5_0 across the CPU interconnect (SYS)",
         ["no HCA is closer", "pin the job to GPUs near mlx5_0 (gpus: 0-1)"]),
        ("4gpu_pcie_nic_legend.txt", 4, "gpu01: GPU2, GPU3 reach mlx5_0 across the CPU interconnect (SYS)",
         ["same PCIe switch/NUMA node (NIC2, NIC3)", "NCCL_IB_HCA", "gpus: 0-1"]),
        ("4gpu_pcie_nic_legend.txt", [2], "gpu01: GPU2 reaches mlx5_0 across the CPU interconnect (SYS)",
         ["NIC2, NIC3"]),
    ],
)
def test_topology_warns_when_a_gpu_reaches_the_hca_only_across_sockets(name: str, gpus: int | list[int],
                                                                      summary: str, hint_words: list[str]) -> None:
    findings = topology(gpus, topo(name), (IB_NIC,))

    warn = one(by_verdict(findings, Verdict.warned))
    assert len(by_verdict(findings, Verdict.passed)) == 1
    assert (warn.node, warn.subject, warn.measured, warn.summary) == ("gpu01", "mlx5_0", "SYS", summary)
    assert all(w in (warn.hint or "") for w in hint_words), warn.hint


def test_topology_uses_the_closest_of_several_listed_hcas() -> None:
    nics = (IB_NIC, {"name": "ib2", "ip": "10.22.0.11/16", "kind": "infiniband", "hca": "mlx5_2"})
    findings = topology(4, topo("4gpu_nv4_mlx5_rows.txt"), nics)

    # GPU2/GPU3 are SYS to every mlx5 device in this matrix.
    assert one(by_verdict(findings, Verdict.warned)).summary.endswith("reach mlx5_0, mlx5_2 across the CPU "
                                                                        "interconnect (SYS)")


@pytest.mark.parametrize(
    "nics",
    [
        ({"name": "eth0", "ip": "10.0.0.11/24"},),
        ({"name": "ib9", "ip": "10.20.0.11/16", "kind": "infiniband", "hca": "mlx5_9"},),
    ],
    ids=["ethernet-only", "hca-not-in-matrix"],
)
def test_topology_no_nic_warning_without_a_listed_hca_in_the_matrix(nics: tuple[dict[str, Any], ...]) -> None:
    f = one(topology(4, topo("4gpu_pcie_nic_legend.txt"), nics))

    assert f.verdict is Verdict.passed and f.data["rdma_hcas"] == []


def test_topology_warns_on_uneven_numa_spread() -> None:
    findings = topology([0, 1, 2, 4], topo("8gpu_a100_nv12.txt"))

    warn = one(by_verdict(findings, Verdict.warned))
    assert (warn.node, warn.subject, warn.measured) == ("gpu01", "NUMA", "3 + 1")
    assert warn.summary == "gpu01: listed GPUs span NUMA nodes unevenly: 3 on NUMA 0 (GPU0-2) and 1 on NUMA 1 (GPU4)"
    assert "same number of GPUs per NUMA node" in (warn.hint or "")
    assert one(by_verdict(findings, Verdict.passed)).data["gpu_links"]["GPU0-GPU4"] == "NV12"


def test_topology_numa_even_or_unknown_is_fine() -> None:
    assert [f.verdict for f in topology([0, 1, 4, 5], topo("8gpu_a100_nv12.txt"))] == [Verdict.passed]
    f = one(topology(2, topo("2gpu_phb_with_legend.txt")))
    assert f.verdict is Verdict.passed and "NUMA unknown" in f.summary and "links PHB x1" in f.summary


@pytest.mark.parametrize(
    ("text", "verdict", "words"),
    [
        (topo("8gpu_pcie_sys_10nics_truncated.txt"), Verdict.warned, ["cannot read the GPU topology", "truncated"]),
        (topo("8gpu_nv8_9nics_truncated.txt"), Verdict.warned, ["cannot read the GPU topology", "GPU7"]),
        (topo("p2p_r_8gpu_not_topo_m.txt"), Verdict.warned, ["cannot read the GPU topology"]),
        ((NOT_INSTALLED, MISSING), Verdict.skipped, ["no topology", "nvidia-smi not installed"]),
        ((DRIVER_ERROR, 9), Verdict.skipped, ["no topology", "exited 9", "couldn't communicate"]),
        (None, Verdict.skipped, ["no topology", "no GPU facts"]),
    ],
    ids=["truncated-sys", "truncated-nv8", "p2p-matrix", "missing-tool", "driver-error", "no-section"],
)
def test_topology_unreadable_or_missing(text: str | tuple[str, int] | None, verdict: Verdict,
                                        words: list[str]) -> None:
    f = one(topology(8, text))

    assert (f.verdict, f.node) == (verdict, "gpu01")
    assert f.summary.startswith("gpu01: ")
    assert all(w in f.summary for w in words), f.summary
    if verdict is Verdict.warned:
        assert f.hint


def test_topology_listed_gpus_absent_from_the_matrix_skip() -> None:
    f = one(topology([8, 9], topo("2gpu_nv2.txt")))
    assert f.verdict is Verdict.skipped and "none of the listed GPUs" in f.summary


def test_topology_data_nic_known_and_unknown() -> None:
    nic = {**IB_NIC, "ip": "10.20.0.11/16"}
    inv = inventory({"name": "gpu01", "gpus": 4, "nics": [nic]},
                    {"name": "gpu02", "gpus": 4, "nics": [{**IB_NIC, "ip": "10.20.0.12/16"}]})
    found = run("gpu.topology", inv, facts("gpu01", nvidia_topo=topo("4gpu_pcie_nic_legend.txt")))
    assert by_verdict(found, Verdict.passed)[0].data["data_nic"] == "ib0"

    # The nodes share no subnet: the data network is unknown, the check still runs.
    inv = inventory({"name": "gpu01", "gpus": 4, "nics": [nic]},
                    {"name": "gpu02", "gpus": 4, "nics": [{"name": "eth0", "ip": "10.30.0.2/16"}]})
    found = run("gpu.topology", inv, facts("gpu01", nvidia_topo=topo("4gpu_pcie_nic_legend.txt")))
    assert [f.verdict for f in found] == [Verdict.passed, Verdict.warned]
    assert found[0].data["data_nic"] is None


# --- every check ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("check", ["gpu.present", "gpu.indices", "gpu.model", "gpu.busy", "gpu.ecc", "gpu.topology"])
def test_every_check_speaks_once_per_gpu_node_with_named_summaries_and_hints(check: str) -> None:
    inv = inventory({"name": "gpu01", "gpus": 8}, {"name": "gpu02", "gpus": 4}, {"name": "gpu03", "gpus": 8},
                    {"name": "gone", "gpus": 8})
    node_facts = [
        facts("gpu01", nvidia_smi=synthetic_smi(8), nvidia_apps=smi(NO_APPS), nvidia_topo=topo("8gpu_h100_nv18.txt")),
        facts("gpu02", nvidia_smi=smi(H200_BUSY), nvidia_apps=H200_APPS,
              nvidia_topo=topo("8gpu_nv8_9nics_truncated.txt")),
        facts("gpu03", nvidia_smi=(DRIVER_ERROR, 9), nvidia_apps=(DRIVER_ERROR, 9), nvidia_topo=(DRIVER_ERROR, 9)),
        NodeFacts("gone", error="connection timed out"),
    ]
    findings = run(check, inv, *node_facts)

    nodes = {f.node for f in findings if f.node is not None}
    assert nodes <= {"gpu01", "gpu02", "gpu03"}
    if check != "gpu.model":
        assert nodes == {"gpu01", "gpu02", "gpu03"}
    for f in findings:
        assert f.check == check and "\n" not in f.summary
        assert f.node is None or f.summary.startswith(f"{f.node}: ")
        assert f.evidence, f
        if f.verdict in (Verdict.warned, Verdict.failed):
            assert f.hint and f.subject
