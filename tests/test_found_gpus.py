"""Without --gpus or a process count, every GPU a node sees gets a process (as torchrun --nproc-per-node gpu); with
GPU facts from the node, its physical GPUs, the idle ones, and the CPUs of each rank."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
from gpunodes import smi_command

from clusterrun.errors import StartError
from clusterrun.inventory.models import Inventory
from clusterrun.inventory.yaml_source import parse_inventory_text
from clusterrun.launch.ready import NodeReady
from clusterrun.launch.replan import plan_with_facts
from clusterrun.planning.plan import CPU_BIND_VAR, JobSpec, LaunchPlan, build_plan
from clusterrun.remote import gpufacts
from clusterrun.remote.nodefacts import visible_gpus

ONE_NODE = """
version: 1
nodes:
  - {name: gpu01, host: 10.0.0.1}
"""


def plan_for(text: str, nproc: int | None = None) -> tuple[Inventory, LaunchPlan]:
    inv = parse_inventory_text(textwrap.dedent(text).lstrip("\n"), "inv.yaml")
    return inv, build_plan(inv, JobSpec(script="train.py", run_id="r1", local_runs_dir="/tmp/runs",
                                        nproc_per_node=nproc))


def test_a_node_without_listed_gpus_runs_one_process_per_gpu_it_sees() -> None:
    inv, plan = plan_for(ONE_NODE)
    assert plan.nodes[0].nproc_per_node == 1
    _, new = plan_with_facts(inv, plan, {"gpu01": NodeReady("gpu01", gpus=8)})
    node = new.nodes[0]
    assert (node.nproc_per_node, node.gpus) == (8, tuple(range(8)))
    assert node.env_dict()["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert "gpu01: 8 GPU(s) seen, one process each (gpus: 0-7)" in new.probed


def test_what_the_user_set_wins_and_no_gpu_changes_nothing() -> None:
    inv, plan = plan_for(ONE_NODE, nproc=2)
    assert plan_with_facts(inv, plan, {"gpu01": NodeReady("gpu01", gpus=8)})[1].nodes[0].nproc_per_node == 2
    inv, plan = plan_for(ONE_NODE.replace("host: 10.0.0.1}", "host: 10.0.0.1, gpus: [0, 1]}"))
    assert plan_with_facts(inv, plan, {"gpu01": NodeReady("gpu01", gpus=8)})[1].nodes[0].gpus == (0, 1)
    inv, plan = plan_for(ONE_NODE)
    assert plan_with_facts(inv, plan, {"gpu01": NodeReady("gpu01", gpus=0)})[1].nodes[0].nproc_per_node == 1


def test_visible_gpus_from_the_drivers_list_and_cuda_visible_devices(tmp_path: Path) -> None:
    for bus in ("0000:17:00.0", "0000:2a:00.0", "0000:3d:00.0", "0000:63:00.0"):
        (tmp_path / bus).mkdir()
    assert visible_gpus(str(tmp_path), {}, smi=None) == 4  # no nvidia-smi: the driver's list
    assert visible_gpus(str(tmp_path), {"CUDA_VISIBLE_DEVICES": "1,3"}, smi=None) == 2
    assert visible_gpus(str(tmp_path), {"CUDA_VISIBLE_DEVICES": "-1"}, smi=None) == 0
    assert visible_gpus(str(tmp_path / "absent"), {}, smi=None) == 0  # no NVIDIA driver
    assert visible_gpus(str(tmp_path / "absent"), {}, smi=lambda: ["0", "1"]) == 2  # nvidia-smi answers first


# What `up` makes of the GPUs a node reports (the stand-in nvidia-smi replaying recorded GPU nodes): physical
# indices in CUDA_VISIBLE_DEVICES, the GPUs the run needs chosen, each rank's CPUs, a busy GPU refused.

def reported(tmp_path: Path, node: str = "h100x8_one_busy", **env: str) -> NodeReady:
    raw = gpufacts.gather({"STANDIN_SMI_NODE": node, **env}, tool=str(smi_command(tmp_path)))
    return NodeReady("gpu01", gpus=8, gpu=raw)


def test_the_nodes_cuda_visible_devices_reaches_the_ranks_as_physical_gpus(tmp_path: Path) -> None:
    inv, plan = plan_for(ONE_NODE)
    _, new = plan_with_facts(inv, plan, {"gpu01": reported(tmp_path, CUDA_VISIBLE_DEVICES="2,3")})
    node = new.nodes[0]
    assert (node.nproc_per_node, node.gpus) == (2, (2, 3))
    env = node.env_dict()
    assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"], env[CPU_BIND_VAR]) == (
        "2,3", "PCI_BUS_ID", "0-51/0;0-51/0")


def test_a_process_count_without_gpus_listed_gets_the_best_idle_gpus(tmp_path: Path) -> None:
    inv, plan = plan_for(ONE_NODE, nproc=4)
    _, new = plan_with_facts(inv, plan, {"gpu01": reported(tmp_path)})
    assert new.nodes[0].env_dict()["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert new.probed[0].startswith("gpu01: GPUs 4-7 for 4 process(es): one NVLink island (NV18), one NUMA node (1)")
    assert new.probed[1] == "gpu01: each rank on its GPU's CPUs (--cpu-bind numa): GPU 4-7 on CPUs 52-103, NUMA node 1"


def test_cpu_bind_none_binds_nothing(tmp_path: Path) -> None:
    inv, plan = plan_for(ONE_NODE, nproc=4)
    plan = build_plan(inv, dataclasses.replace(plan.job, cpu_bind="none"))
    _, new = plan_with_facts(inv, plan, {"gpu01": reported(tmp_path)})
    assert CPU_BIND_VAR not in new.nodes[0].env_dict() and len(new.probed) == 1


def test_a_listed_busy_gpu_stops_the_start_naming_node_gpu_and_process(tmp_path: Path) -> None:
    inv, plan = plan_for(ONE_NODE.replace("host: 10.0.0.1}", "host: 10.0.0.1, gpus: [0, 1]}"))
    with pytest.raises(StartError) as stopped:
        plan_with_facts(inv, plan, {"gpu01": reported(tmp_path)})
    assert stopped.value.problems == {"gpu01": "GPU 1 is busy: pid 3999999 /app/llama-server, 45652 MiB; one busy GPU "
                                               "slows every rank of the job: list idle GPUs, or add --allow-busy-gpus "
                                               "to use it anyway"}
    assert "no node was started" in str(stopped.value)


def test_a_failing_nvidia_smi_plans_in_plain_order_with_a_warning(tmp_path: Path) -> None:
    inv, plan = plan_for(ONE_NODE)
    _, new = plan_with_facts(inv, plan, {"gpu01": reported(tmp_path, STANDIN_SMI_FAIL="all")})
    assert new.nodes[0].gpus == tuple(range(8))  # the count the reporter had from the driver
    assert new.warnings[-1] == "gpu01: its GPUs could not be read: planned in plain order"
    assert new.warnings[0].startswith("gpu01: nvidia-smi --query-gpu failed: exit 9")
