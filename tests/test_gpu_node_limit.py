"""The node's own CUDA_VISIBLE_DEVICES holds on every path: a node limited to GPUs 2,3 runs on 2 and 3 when its
nvidia-smi is missing (the driver there), fails or hangs, and inside a container; where the value names GPUs by
UUID that cannot be numbered without nvidia-smi's list, it is kept as the node sets it. Never renumbered to 0,1.

The node reporter's parts run here: its GPU count from a driver directory of 8 GPUs (nodefacts.visible_gpus) and
its GPU part (gpufacts.gather) with the stand-in nvidia-smi, absent, failing or hanging (bounded)."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest
from gpunodes import smi_command

from clusterrun.planning.container import build_container
from clusterrun.errors import GpusLeased, StartError
from clusterrun.inventory.container import ContainerSettings
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
IN_DOCKER = ONE_NODE.replace("version: 1\n", "version: 1\ndefaults:\n  container: {image: pytorch:24.05, runtime: docker}\n")
UUIDS = "GPU-6a9c1d02-5b1e-4c3f-9e0a-1f2b3c4d5e62,GPU-6a9c1d02-5b1e-4c3f-9e0a-1f2b3c4d5e63"
#: The bound of each nvidia-smi call in the hanging case: time enough for a stand-in's Python start on a loaded
#: machine, short enough for a test.
HANG_BOUND = 3.0


def driver(tmp_path: Path) -> Path:
    """/proc/driver/nvidia/gpus of an 8-GPU node."""
    root = tmp_path / "driver"
    for bus in ("04", "18", "2a", "3a", "8b", "9a", "ab", "ba"):
        (root / f"0000:{bus}:00.0").mkdir(parents=True, exist_ok=True)
    return root


def reported(tmp_path: Path, smi: str, visible: str = "2,3", **env: str) -> NodeReady:
    """The ready check of a node of 8 GPUs limited to ``visible``: ``smi`` absent, failing or hanging."""
    environ = {"CUDA_VISIBLE_DEVICES": visible, "STANDIN_SMI_NODE": "h100x8_idle", "PATH": str(tmp_path / "none"),
               **env}
    tool = None if smi == "absent" else str(smi_command(tmp_path / "tools"))
    environ.update({"failing": {"STANDIN_SMI_FAIL": "all"}, "hanging": {"STANDIN_SMI_HANG": "all"}}.get(smi, {}))
    gpu = gpufacts.gather(environ, timeout=HANG_BOUND, tool=tool)
    return NodeReady("gpu01", gpus=visible_gpus(str(driver(tmp_path)), environ, smi=None), gpu=gpu)


def plan_for(text: str = ONE_NODE, nproc: int | None = None) -> tuple[Inventory, LaunchPlan]:
    inv = parse_inventory_text(textwrap.dedent(text).lstrip("\n"), "inv.yaml")
    return inv, build_plan(inv, JobSpec(script="train.py", run_id="r1", local_runs_dir="/tmp/runs",
                                        nproc_per_node=nproc))


@pytest.mark.parametrize("smi", ["absent", "failing", "hanging"])
def test_a_node_limited_to_gpus_2_3_runs_on_2_3_whatever_its_nvidia_smi_does(tmp_path: Path, smi: str) -> None:
    started = time.monotonic()
    ready = reported(tmp_path, smi)
    assert time.monotonic() - started < HANG_BOUND + 3  # a hung nvidia-smi is given up on, never waited for
    inv, plan = plan_for()
    _, new = plan_with_facts(inv, plan, {"gpu01": ready})
    node = new.nodes[0]
    assert (node.nproc_per_node, node.gpus) == (2, (2, 3))
    env = node.env_dict()
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    # The node's numbers are CUDA's in the node's own order: clusterrun does not reorder them, nor bind.
    assert "CUDA_DEVICE_ORDER" not in env and CPU_BIND_VAR not in env
    why = "no nvidia-smi there" if smi == "absent" else "nvidia-smi could not list the GPUs"
    assert new.probed[0] == (f"gpu01: 2 GPU(s) allowed, one process each (gpus: 2-3) (the node's "
                             f"CUDA_VISIBLE_DEVICES=2,3; {why}: its GPUs as it numbers them, not renumbered)")
    if smi == "absent":
        assert new.warnings == ()
    else:
        said = "exit 9: NVIDIA-SMI has failed" if smi == "failing" else f"no answer within {HANG_BOUND:g}s"
        assert new.warnings[0].startswith(f"gpu01: nvidia-smi --query-gpu failed: {said}")


def test_a_process_count_takes_gpus_within_the_limit_or_is_refused(tmp_path: Path) -> None:
    ready = {"gpu01": reported(tmp_path, "failing", "3,1,2")}
    inv, plan = plan_for(nproc=2)
    assert plan_with_facts(inv, plan, ready)[1].nodes[0].gpus == (3, 1)  # the first the node allows, in its order
    inv, plan = plan_for(nproc=4)
    with pytest.raises(StartError) as refused:
        plan_with_facts(inv, plan, ready)
    assert refused.value.problems == {"gpu01": "4 GPU(s) needed, 3 of 3 idle (the node's CUDA_VISIBLE_DEVICES=3,1,2 "
                                               "allows GPUs 3,1,2); ask for fewer processes (--nproc-per-node)"}


def test_leases_are_of_the_nodes_own_gpus(tmp_path: Path) -> None:
    lease = {"2": {"run": "r0", "user": "bob", "since": 0.0, "pid": 42}}
    ready = reported(tmp_path, "absent")
    ready.leases = lease
    inv, plan = plan_for()
    with pytest.raises(GpusLeased, match=r"gpu01: GPU 2 is held by run r0 of bob .*\(2-3\), one process each"):
        plan_with_facts(inv, plan, {"gpu01": ready})
    inv, plan = plan_for(nproc=1)
    assert plan_with_facts(inv, plan, {"gpu01": ready})[1].nodes[0].gpus == (3,)


@pytest.mark.parametrize("smi", ["absent", "failing"])
def test_gpus_named_by_uuid_are_kept_as_the_node_sets_them(tmp_path: Path, smi: str) -> None:
    inv, plan = plan_for()
    _, new = plan_with_facts(inv, plan, {"gpu01": reported(tmp_path, smi, UUIDS)})
    node = new.nodes[0]
    assert (node.nproc_per_node, node.gpus) == (2, ())
    assert node.env_dict()["CUDA_VISIBLE_DEVICES"] == UUIDS
    assert new.probed[0].startswith("gpu01: the node's CUDA_VISIBLE_DEVICES names 2 GPU(s) by UUID")


def test_the_node_reporter_and_probe_see_the_nodes_own_indices(tmp_path: Path) -> None:
    ready = reported(tmp_path, "absent")
    assert ready.gpus == 2 and ready.gpu == {"smi": None, "visible": "2,3"}
    assert ready.gpu_indices() == (2, 3)  # what `init` writes and doctor checks
    # Without a driver (the reporter counts no GPU) a CUDA_VISIBLE_DEVICES set by a site profile limits nothing:
    # a CPU node, as before.
    no_driver = NodeReady("gpu01", gpus=0, gpu=reported(tmp_path, "failing", "0").gpu)
    assert no_driver.gpu_indices() == ()
    inv, plan = plan_for()
    _, new = plan_with_facts(inv, plan, {"gpu01": no_driver})
    assert (new.nodes[0].nproc_per_node, new.nodes[0].gpus) == (1, ())
    assert "gpu01: no GPU seen: one CPU process (--nproc-per-node for more)" in new.probed


@pytest.mark.parametrize(("visible", "smi", "devices", "inside"), [
    ("2,3", "absent", '"device=2,3"', "0,1"),
    ("2,3", "hanging", '"device=2,3"', "0,1"),
    (UUIDS, "failing", f'"device={UUIDS}"', "0,1"),
])
def test_a_container_gets_the_nodes_own_gpus(tmp_path: Path, visible: str, smi: str, devices: str,
                                            inside: str) -> None:
    inv, plan = plan_for(IN_DOCKER)
    _, new = plan_with_facts(inv, plan, {"gpu01": reported(tmp_path, smi, visible)})
    container = new.nodes[0].container
    argv = container.argv()
    assert argv[argv.index("--gpus") + 1] == devices
    assert dict(container.env) == {"CUDA_VISIBLE_DEVICES": inside}


@pytest.mark.parametrize(("visible", "devices"), [("-1", None), ("", None), ("2,-1,3", '"device=2"'),
                                                  ("1,x,2", '"device=1"')])
def test_a_container_reads_cuda_visible_devices_as_cuda_does(visible: str, devices: str | None) -> None:
    plan = build_container(ContainerSettings(image="pytorch:24.05"), run_id="r1", node="gpu01", run_dir=None,
                           cwd=None, env={"CUDA_VISIBLE_DEVICES": visible}, gpus=(), rdma=False)
    argv = plan.argv()
    assert (argv[argv.index("--gpus") + 1] if "--gpus" in argv else None) == devices
