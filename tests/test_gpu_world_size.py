"""The world size is what the user asked for: without a process count, every node runs one process per GPU it
allows, and a busy GPU, or one another run leases, refuses the start (naming node, GPU and holder, with both ways
out) instead of a smaller world. The nodes are stand-in 8-GPU nodes (tests/fixtures/gpu_nodes/) whose
nvidia-smi output the node reporter gathers here."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from gpunodes import smi_command

from clusterrun.errors import GpusLeased, StartError
from clusterrun.inventory.models import Inventory
from clusterrun.inventory.yaml_source import parse_inventory_text
from clusterrun.launch.ready import NodeReady
from clusterrun.launch.replan import plan_with_facts
from clusterrun.planning.plan import JobSpec, LaunchPlan, build_plan
from clusterrun.remote import gpufacts

TWO_NODES = """
version: 1
nodes:
  - {name: gpu01, host: 10.0.0.1}
  - {name: gpu02, host: 10.0.0.2}
"""
#: What the refusal says of GPU 0 of the second node, and the ways out.
GPU0_BUSY = ("GPU 0 is busy: pid 3999999 /app/llama-server, 45652 MiB; without a process count the run takes every "
             "GPU the node allows (0-7), one process each, and one busy GPU slows every rank of the job: "
             "`--nproc-per-node 7` takes the 7 best idle GPUs on every node, or add --allow-busy-gpus to use busy "
             "GPUs anyway")
LEASE = {"run": "20261125-170000-ab12", "user": "alice", "since": 0.0, "pid": 4242, "node": "gpu02"}


@pytest.fixture(scope="module")
def smi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return smi_command(tmp_path_factory.mktemp("smi"))


def node(smi: Path, name: str, playing: str, leases: dict | None = None) -> NodeReady:
    """What node ``name`` reports in its ready check when it plays ``playing`` (a stand-in GPU node)."""
    raw = gpufacts.gather({"STANDIN_SMI_NODE": playing}, tool=str(smi))
    return NodeReady(name, gpus=8, gpu=raw, leases=leases)


def plan_for(nproc: int | None = None, allow_busy: bool = False) -> tuple[Inventory, LaunchPlan]:
    inv = parse_inventory_text(textwrap.dedent(TWO_NODES).lstrip("\n"), "inv.yaml")
    return inv, build_plan(inv, JobSpec(script="train.py", run_id="r1", local_runs_dir="/tmp/runs",
                                        nproc_per_node=nproc, allow_busy_gpus=allow_busy))


def world(plan: LaunchPlan) -> int:
    return sum(n.nproc_per_node for n in plan.nodes)


def test_a_busy_gpu_refuses_the_start_instead_of_a_smaller_world(smi: Path) -> None:
    # Two 8-GPU nodes, GPU 0 busy on the second: not 8 + 7 = 15 ranks, but nothing started, and why.
    inv, plan = plan_for()
    ready = {"gpu01": node(smi, "gpu01", "h100x8_idle"), "gpu02": node(smi, "gpu02", "h100x8_gpu0_busy")}
    with pytest.raises(StartError) as refused:
        plan_with_facts(inv, plan, ready)
    assert not isinstance(refused.value, GpusLeased)  # waiting does not free another job's GPU
    assert refused.value.problems == {"gpu02": GPU0_BUSY}
    assert "no node was started" in str(refused.value)


def test_a_process_count_takes_the_best_idle_gpus_on_every_node(smi: Path) -> None:
    inv, plan = plan_for(nproc=7)
    ready = {"gpu01": node(smi, "gpu01", "h100x8_idle"), "gpu02": node(smi, "gpu02", "h100x8_gpu0_busy")}
    _, new = plan_with_facts(inv, plan, ready)
    assert world(new) == 14
    assert new.node("gpu02").gpus == (1, 2, 3, 4, 5, 6, 7)
    assert new.node("gpu01").gpus == (0, 1, 2, 3, 4, 5, 6)  # one island, lowest indices on a tie
    assert not any("different numbers of processes" in w for w in new.warnings)


def test_allow_busy_gpus_runs_on_every_gpu_with_a_warning(smi: Path) -> None:
    inv, plan = plan_for(allow_busy=True)
    ready = {"gpu01": node(smi, "gpu01", "h100x8_idle"), "gpu02": node(smi, "gpu02", "h100x8_gpu0_busy")}
    _, new = plan_with_facts(inv, plan, ready)
    assert world(new) == 16 and new.node("gpu02").gpus == tuple(range(8))
    assert ("gpu02: GPU 0 is busy: pid 3999999 /app/llama-server, 45652 MiB; used anyway (--allow-busy-gpus)"
            in new.warnings)


def test_an_idle_cluster_runs_every_gpu(smi: Path) -> None:
    inv, plan = plan_for()
    ready = {"gpu01": node(smi, "gpu01", "h100x8_idle"), "gpu02": node(smi, "gpu02", "h100x8_idle")}
    _, new = plan_with_facts(inv, plan, ready)
    assert world(new) == 16
    assert new.node("gpu02").env_dict()["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


def test_a_gpu_another_run_leases_refuses_and_can_be_waited_for(smi: Path) -> None:
    inv, plan = plan_for()
    ready = {"gpu01": node(smi, "gpu01", "h100x8_idle"),
             "gpu02": node(smi, "gpu02", "h100x8_idle", leases={"3": LEASE})}
    with pytest.raises(GpusLeased) as refused:  # `up --wait-gpus` waits on this one
        plan_with_facts(inv, plan, ready)
    why = refused.value.problems["gpu02"]
    assert why.startswith("GPU 3 is held by run 20261125-170000-ab12 of alice since ")
    assert why.endswith("(pid 4242); two runs never share a GPU, and without a process count the run takes every "
                        "GPU the node allows (0-7), one process each: `--nproc-per-node 7` takes the 7 best idle "
                        "GPUs on every node, or `up --wait-gpus` waits until they are free")
    inv, plan = plan_for(nproc=4)
    _, new = plan_with_facts(inv, plan, ready)
    assert 3 not in new.node("gpu02").gpus and world(new) == 8


def test_the_count_suggested_is_one_every_node_can_give(smi: Path) -> None:
    # gpu01 has GPUs 4 and 5 leased and GPU 1 busy: 5 idle; gpu02's refusal suggests 5, not its own 7.
    inv, plan = plan_for()
    ready = {"gpu01": node(smi, "gpu01", "h100x8_one_busy", leases={"4": LEASE, "5": LEASE}),
             "gpu02": node(smi, "gpu02", "h100x8_gpu0_busy")}
    with pytest.raises(StartError) as refused:
        plan_with_facts(inv, plan, ready)
    assert set(refused.value.problems) == {"gpu01", "gpu02"}
    assert "`--nproc-per-node 5` takes the 5 best idle GPUs on every node" in refused.value.problems["gpu02"]
    assert refused.value.problems["gpu01"].startswith("GPU 1 is busy: pid 3999999 /app/llama-server, 45652 MiB; "
                                                      "GPU 4 is held by run 20261125-170000-ab12 of alice")
    inv, plan = plan_for(nproc=5)
    _, new = plan_with_facts(inv, plan, ready)
    assert new.node("gpu01").gpus == (0, 2, 3, 6, 7) and world(new) == 10
