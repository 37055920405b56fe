"""A node's GPUs as its reporter gathers them (clusterrun/remote/gpufacts.py, run against the stand-in nvidia-smi
replaying recorded output) and as clusterrun reads them (clusterrun/facts/gpus.py): the GPUs the node's
CUDA_VISIBLE_DEVICES allows, who uses each, the topology; a failing or hung nvidia-smi and a matrix that does not
parse become one sentence naming the node, never a crash."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from gpunodes import smi_command

from clusterrun.facts import gpus as gpu_facts
from clusterrun.facts.parsers import nvidia_smi
from clusterrun.remote import gpufacts

REAL = Path(__file__).parent / "fixtures" / "real"
H100_UUID = "GPU-6a9c1d02-5b1e-4c3f-9e0a-1f2b3c4d5e6"


def gathered(tmp_path: Path, node: str = "h100x8_one_busy", timeout: float = 10.0, **env: str) -> dict:
    return gpufacts.gather({"STANDIN_SMI_NODE": node, **env}, timeout=timeout, tool=str(smi_command(tmp_path)))


def test_the_reporter_asks_for_the_fields_the_parsers_read() -> None:
    assert tuple(gpufacts.GPU_FIELDS.split(",")) == (*nvidia_smi.GPU_FIELDS, gpu_facts.ECC_FIELD)
    assert tuple(gpufacts.APP_FIELDS.split(",")) == nvidia_smi.APP_FIELDS


def test_each_gpus_use_processes_and_topology_from_the_recordings(tmp_path: Path) -> None:
    facts = gpu_facts.parse("gpu01", gathered(tmp_path))
    assert facts is not None and not facts.problems
    # The stand-in prints [N/A] for the ECC count its recording lacks, as nvidia-smi does for a GPU without ECC.
    assert facts.ecc_queried and facts.gpu(0).ecc_uncorrected is None
    assert facts.indices == tuple(range(8)) and facts.allowed is None and facts.offered == tuple(range(8))
    busy = facts.gpu(1)
    assert busy is not None and (busy.memory_used_mib, busy.utilization_pct) == (45662, 97)
    assert [(p.pid, p.name, p.memory_mib) for p in busy.processes] == [(3999999, "/app/llama-server", 45652)]
    assert facts.gpu(0).processes == () and facts.gpu(0).memory_used_mib == 1
    assert facts.topology is not None and len(facts.topology.gpus) == 8


def test_a_node_without_nvidia_smi_reports_no_gpu_part() -> None:
    assert gpufacts.gather({"PATH": str(Path(__file__).parent)}) is None
    assert gpu_facts.parse("gpu01", None) is None


@pytest.mark.parametrize(("visible", "allowed", "mig"), [
    ("2,3", (2, 3), ()),
    ("3, 1", (3, 1), ()),
    (f"{H100_UUID}7,{H100_UUID}0", (7, 0), ()),
    ("-1", (), ()),
    ("", (), ()),
    ("MIG-GPU-6a9c1d02-5b1e-4c3f-9e0a-1f2b3c4d5e60/1/0,MIG-4f1e2d3c-0000-5555-aaaa-0123456789ab", (), 2),
], ids=["indices", "order-kept", "uuids", "minus-one", "empty", "mig"])
def test_the_nodes_cuda_visible_devices_names_physical_gpus(tmp_path: Path, visible: str, allowed: tuple,
                                                           mig: int) -> None:
    facts = gpu_facts.parse("gpu01", gathered(tmp_path, CUDA_VISIBLE_DEVICES=visible))
    assert facts is not None and not facts.problems
    assert (facts.allowed, len(facts.mig)) == (allowed, mig or 0)


@pytest.mark.parametrize(("visible", "kept", "named"), [
    ("2,9,3", (2,), "'9'"), ("GPU-6a9c1d02,1", (), "'GPU-6a9c1d02'"), ("GPU-ffffffff", (), "'GPU-ffffffff'")],
    ids=["no-such-index", "ambiguous-uuid-prefix", "no-such-uuid"])
def test_cuda_visible_devices_naming_no_gpu_of_the_node_is_one_clear_line(tmp_path: Path, visible: str, kept: tuple,
                                                                         named: str) -> None:
    facts = gpu_facts.parse("gpu01", gathered(tmp_path, CUDA_VISIBLE_DEVICES=visible))
    assert facts is not None and facts.allowed == kept
    [problem] = facts.problems
    assert problem.startswith(f"gpu01: the node's CUDA_VISIBLE_DEVICES={visible} names {named}")
    assert "nvidia-smi lists 0-7" in problem


def test_a_hung_nvidia_smi_is_bounded_and_reported(tmp_path: Path) -> None:
    # 5 s: time enough for the calls that do answer on a loaded machine (each stand-in is a Python start).
    started = time.monotonic()
    raw = gathered(tmp_path, timeout=5.0, STANDIN_SMI_HANG="topo")
    assert time.monotonic() - started < 5 + 3  # the deadline, and the killed stand-in reaped
    assert "no answer within 5s" in raw["topo_error"] and "query" in raw and "apps" in raw
    facts = gpu_facts.parse("gpu01", raw)
    assert facts is not None and facts.topology is None and len(facts.gpus) == 8
    assert facts.problems == ("gpu01: nvidia-smi topo -m failed: no answer within 5s (nvidia-smi hangs: a stuck "
                              "driver or GPU?)",)
    # What doctor shows as evidence: the call's exit status as timeout(1) gives it, and the answered ones as is.
    hung = facts.calls["topo"]
    assert (hung.command, hung.exit_code, hung.output) == ("nvidia-smi topo -m", 124, "")
    assert hung.failure == "`nvidia-smi topo -m` exited 124: no output"
    assert facts.calls["query"].exit_code == 0 and facts.calls["query"].output == raw["query"]


def test_a_failing_nvidia_smi_is_reported_with_its_own_words(tmp_path: Path) -> None:
    raw = gathered(tmp_path, STANDIN_SMI_FAIL="all")
    assert raw["query_error"].startswith("exit 9: NVIDIA-SMI has failed because it couldn't communicate")
    facts = gpu_facts.parse("gpu01", raw)
    assert facts is not None and facts.gpus == ()
    assert facts.problems[0].startswith("gpu01: nvidia-smi --query-gpu failed: exit 9: NVIDIA-SMI has failed")
    # The whole of what it printed is kept for doctor's evidence, and its own words for doctor's finding.
    query = facts.calls["query"]
    assert (query.exit_code, query.output) == (9, raw["query_output"]) and "latest NVIDIA driver" in query.output
    assert query.failure is not None and query.failure.startswith(
        "nvidia-smi failed: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")
    assert query.command == f"nvidia-smi --query-gpu={gpufacts.GPU_FIELDS} --format=csv,noheader,nounits"


@pytest.mark.parametrize("recording", ["8gpu_pcie_sys_10nics_truncated.txt", "8gpu_nv8_9nics_truncated.txt",
                                       "p2p_r_8gpu_not_topo_m.txt"])
def test_a_topology_that_does_not_parse_leaves_the_gpus_and_names_the_node(tmp_path: Path, recording: str) -> None:
    raw = {**gathered(tmp_path), "topo": (REAL / "topo" / recording).read_text()}
    facts = gpu_facts.parse("gpu01", raw)
    assert facts is not None and facts.topology is None and len(facts.gpus) == 8
    [problem] = facts.problems
    assert problem.startswith("gpu01: nvidia-smi topo -m did not parse (unrecognised output from nvidia-smi topo -m")


def test_processes_the_node_could_name_carry_their_user_and_run(tmp_path: Path) -> None:
    raw = gathered(tmp_path)
    raw["owners"] = {"3999999": {"user": "bob", "run_id": None}}
    busy = gpu_facts.parse("gpu01", raw).gpu(1)
    assert busy.processes[0].describe() == "pid 3999999 /app/llama-server (bob), 45652 MiB"


def test_the_reporter_names_the_owner_of_a_process_it_may_read() -> None:
    import os

    owner = gpufacts.owners(f"GPU-x, {os.getpid()}, python, 10\n")
    assert owner[str(os.getpid())]["user"] and "run_id" in owner[str(os.getpid())]


def test_span_writes_runs_of_indices_compactly() -> None:
    assert gpu_facts.span([0, 1, 2, 3, 6]) == "0-3,6" and gpu_facts.span([3, 1]) == "3,1" and gpu_facts.span([]) == ""
