"""Without --gpus or a process count, every GPU a node sees gets a process (as torchrun --nproc-per-node gpu)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from clusterrun.inventory.models import Inventory
from clusterrun.inventory.yaml_source import parse_inventory_text
from clusterrun.launch.ready import NodeReady
from clusterrun.launch.replan import plan_with_facts
from clusterrun.plan import JobSpec, LaunchPlan, build_plan
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
