"""Doctor and `up` read one nvidia-smi round the same way: the node reporter's GPU part (remote/gpufacts.py, run
here against the stand-in nvidia-smi replaying recorded output) is fed to doctor's ``gpu.busy`` check and to
up's GPU choice (clusterrun/planning/gpuchoice.py), and they must agree on every GPU: busy or free, and why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gpunodes import smi_command

import clusterrun.doctor.checks.gpu  # noqa: F401  (registers the checks)
from clusterrun.doctor.facts import FACTS, NodeFacts, Section
from clusterrun.doctor.model import Verdict
from clusterrun.doctor.probe import PROGRAM_COMMANDS
from clusterrun.doctor.registry import CHECKS, Context, Options
from clusterrun.facts.node import LINE, ProbedNode
from clusterrun.inventory.models import Inventory
from clusterrun.planning import gpuchoice
from clusterrun.remote import gpufacts

FIXTURES = Path(__file__).parent / "fixtures"


def synthetic_node(directory: Path) -> Path:
    """Synthetic, in the H100 recordings' layout: GPU 2 at 60 % with 3 MiB in use and no process listed (another
    container's kernel), GPU 3 at 49 %; the rest idle."""
    directory.mkdir()
    rows = [f"{i}, GPU-6a9c1d02-5b1e-4c3f-9e0a-1f2b3c4d5e6{i}, NVIDIA H100 80GB HBM3, 00000000:{0x18 + i:02X}:00.0, "
            f"81559 MiB, 3 MiB, {dict([(2, 60), (3, 49)]).get(i, 0)} %" for i in range(4)]
    (directory / "query_gpu.csv").write_text("index, uuid, name, pci.bus_id, memory.total [MiB], memory.used [MiB], "
                                             "utilization.gpu [%]\n" + "\n".join(rows) + "\n")
    (directory / "compute_apps.csv").write_text((FIXTURES / "gpu_nodes" / "h100x8_idle" / "compute_apps.csv").read_text())
    (directory / "topo.txt").write_text((FIXTURES / "gpu_nodes" / "h200x4_idle" / "topo.txt").read_text())
    return directory


#: (stand-in settings, the GPUs that are busy): the recorded nodes of tests/fixtures/gpu_nodes/, and real
#: --query-gpu recordings of tests/fixtures/real/nvidia_smi/ (with the H200 node's empty process list).
CASES = {
    "h200x4-busy-by-memory": ({"STANDIN_SMI_NODE": "h200x4_busy"}, {0, 1, 2, 3}),
    "h200x4-idle": ({"STANDIN_SMI_NODE": "h200x4_idle"}, set()),
    "h100x8-one-busy-process": ({"STANDIN_SMI_NODE": "h100x8_one_busy"}, {1}),
    "h100x8-gpu0-busy-process": ({"STANDIN_SMI_NODE": "h100x8_gpu0_busy"}, {0}),
    "h100x8-idle": ({"STANDIN_SMI_NODE": "h100x8_idle"}, set()),
    "gtx1050ti": ({"STANDIN_SMI_CSV": "query_gpu_driver_memory_gtx1050ti.csv"}, set()),
    "rtx5060ti-no-index-column": ({"STANDIN_SMI_CSV": "query_gpu_util_driver_pstate_rtx5060ti.csv"}, set()),
    "two-models-no-use-columns": ({"STANDIN_SMI_CSV": "query_gpu_padded_columns_two_models.csv"}, set()),
    "utilisation-only": ({"STANDIN_SMI_NODE": "synthetic"}, {2}),
}


def doctor_view(raw: dict, indices: list[int]) -> dict[int, str | None]:
    """Each listed GPU by doctor's gpu.busy on the reporter's output: why it is busy, or None."""
    line = LINE + json.dumps({"net": {}, "gpus": len(indices), "gpu": raw})
    facts = NodeFacts("gpu01", {FACTS: Section(FACTS, PROGRAM_COMMANDS[FACTS], 0, line)})
    inv = Inventory.model_validate({"nodes": [{"name": "gpu01", "host": "10.0.0.1", "gpus": indices}]})
    findings = list(CHECKS["gpu.busy"].run(Context(inv, {"gpu01": facts}, Options())))
    assert findings and all(f.verdict in (Verdict.passed, Verdict.warned) for f in findings), findings
    busy = {f.data["index"]: f.data["why"] for f in findings if f.verdict is Verdict.warned}
    return {i: busy.get(i) for i in indices}


def up_view(facts: gpuchoice.NodeGpus) -> dict[int, str | None]:
    """Each GPU by up's choice: taken when listed alone, or refused and why."""
    seen: dict[int, str | None] = {}
    for i in facts.offered:
        try:
            assert gpuchoice.choose(facts, listed=[i]).gpus == (i,)
            seen[i] = None
        except gpuchoice.GpuRefused as exc:
            assert exc.reason.startswith(f"GPU {i} is busy: ") and not exc.leased, exc.reason
            seen[i] = exc.reason.split("; one busy GPU")[0].removeprefix(f"GPU {i} is ")
    return seen


@pytest.mark.parametrize("case", list(CASES))
def test_doctor_and_up_agree_on_every_gpus_use(tmp_path: Path, case: str) -> None:
    env, expected = CASES[case]
    if env.get("STANDIN_SMI_NODE") == "synthetic":
        env = {"STANDIN_SMI_NODE": str(synthetic_node(tmp_path / "synthetic"))}
    raw = gpufacts.gather(env, tool=str(smi_command(tmp_path / "bin")))
    assert raw is not None and "query" in raw and "apps" in raw, raw

    facts = ProbedNode("gpu01", gpus=None, gpu=raw).gpu_facts()
    assert facts is not None and facts.gpus and facts.apps_known
    up = up_view(facts)
    doctor = doctor_view(raw, list(facts.offered))

    assert doctor == up
    busy = {i for i, why in up.items() if why}
    assert busy == expected
    # Without a GPU list or a count, up takes every GPU and refuses naming exactly the busy ones.
    try:
        chosen = gpuchoice.choose(facts)
        assert not busy and chosen.gpus == facts.offered
    except gpuchoice.GpuRefused as exc:
        assert busy and all((f"GPU {i} is {up[i]}" in exc.reason) == (i in busy) for i in up), exc.reason
