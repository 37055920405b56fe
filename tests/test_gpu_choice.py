"""Which GPUs a run takes on a node (clusterrun/planning/gpuchoice.py), on recorded topologies: a listed set as given within
what the node allows, a busy or held one refused with the process or run named; without a list idle GPUs only,
the best-linked set (one NVLink island, else one PCIe switch, else one NUMA node); each rank's CPUs."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpunodes import smi_command

from clusterrun.planning import gpuchoice
from clusterrun.facts import gpus as gpu_facts
from clusterrun.facts.gpus import GpuProcess, GpuUse, NodeGpus
from clusterrun.facts.parsers import topo
from clusterrun.planning.gpuchoice import Binding, GpuRefused, choose
from clusterrun.remote import gpufacts

TOPO = Path(__file__).parent / "fixtures" / "real" / "topo"
HELD = "run 20261125-1700-ab12 of alice since 17:00"


@pytest.fixture(scope="module")
def smi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return smi_command(tmp_path_factory.mktemp("smi"))


_gathered: dict[tuple[str, str], dict] = {}


def h100x8(smi: Path, **env: str) -> NodeGpus:
    """8 x H100 on NV18, GPUs 0-3 on NUMA node 0 and 4-7 on 1; GPU 1 busy (a recorded process at 97 %)."""
    key = (str(smi), env.get("CUDA_VISIBLE_DEVICES", "<unset>"))
    if key not in _gathered:  # the same node asked again: what the stand-in said the first time
        _gathered[key] = gpufacts.gather({"STANDIN_SMI_NODE": "h100x8_one_busy", **env}, tool=str(smi))
    facts = gpu_facts.parse("gpu01", _gathered[key])
    assert facts is not None
    return facts


def idle_node(recording: str, count: int) -> NodeGpus:
    """``count`` idle GPUs on a recorded topology."""
    gpus = tuple(GpuUse(i, f"GPU-{i}", "NVIDIA A100", 0, 81920, 0) for i in range(count))
    return NodeGpus("gpu02", gpus, topology=topo.parse((TOPO / recording).read_text()))


def test_four_ranks_take_the_idle_socket_of_an_nvlink_node_with_a_busy_gpu(smi: Path) -> None:
    choice = choose(h100x8(smi), count=4)
    assert choice.gpus == (4, 5, 6, 7)
    assert choice.note == ("gpu01: GPUs 4-7 for 4 process(es): one NVLink island (NV18), one NUMA node (1); left "
                           "out: GPU 1 busy: pid 3999999 /app/llama-server, 45652 MiB")
    assert choice.bindings == (Binding(frozenset(range(52, 104)), 1),) * 4
    assert choice.cpu_bind() == ";".join(["52-103/1"] * 4)


def test_without_a_count_a_busy_gpu_of_the_node_is_refused_never_left_out(smi: Path) -> None:
    with pytest.raises(GpuRefused) as refused:
        choose(h100x8(smi))
    assert str(refused.value) == (
        "gpu01: GPU 1 is busy: pid 3999999 /app/llama-server, 45652 MiB; without a process count the run takes every "
        "GPU the node allows (0-7), one process each, and one busy GPU slows every rank of the job: "
        "`--nproc-per-node 7` takes the 7 best idle GPUs on every node, or add --allow-busy-gpus to use busy GPUs "
        "anyway")
    assert not refused.value.leased  # waiting does not free a GPU someone else's process uses
    # The suggested count is what every node of the run can give.
    with pytest.raises(GpuRefused, match="`--nproc-per-node 5` takes the 5 best idle GPUs on every node"):
        choose(h100x8(smi), fewest_idle=5)
    # Both ways out: a count takes the best idle GPUs; --allow-busy-gpus runs on all eight, with a warning.
    assert choose(h100x8(smi), count=7).gpus == (0, 2, 3, 4, 5, 6, 7)
    anyway = choose(h100x8(smi), allow_busy=True)
    assert anyway.gpus == tuple(range(8))
    assert anyway.note is not None and anyway.note.startswith("gpu01: 8 GPU(s) seen, one process each (gpus: 0-7)")
    assert anyway.warnings == ("gpu01: GPU 1 is busy: pid 3999999 /app/llama-server, 45652 MiB; used anyway "
                               "(--allow-busy-gpus)",)


def test_the_nodes_cuda_visible_devices_gives_physical_gpus(smi: Path) -> None:
    choice = choose(h100x8(smi, CUDA_VISIBLE_DEVICES="2,3"))
    assert choice.gpus == (2, 3)
    assert choice.note == "gpu01: 2 GPU(s) seen, one process each (gpus: 2-3) (the node's CUDA_VISIBLE_DEVICES=2,3)"
    assert choice.cpu_bind() == "0-51/0;0-51/0"


def test_a_listed_busy_gpu_is_refused_naming_node_gpu_process_and_flag(smi: Path) -> None:
    with pytest.raises(GpuRefused) as refused:
        choose(h100x8(smi), listed=[0, 1, 2, 3])
    assert refused.value.node == "gpu01"
    assert str(refused.value) == ("gpu01: GPU 1 is busy: pid 3999999 /app/llama-server, 45652 MiB; one busy GPU slows "
                                  "every rank of the job: list idle GPUs, or add --allow-busy-gpus to use it anyway")
    allowed = choose(h100x8(smi), listed=[0, 1, 2, 3], allow_busy=True)
    assert allowed.gpus == (0, 1, 2, 3) and allowed.note is None
    assert allowed.warnings == ("gpu01: GPU 1 is busy: pid 3999999 /app/llama-server, 45652 MiB; used anyway "
                                "(--allow-busy-gpus)",)


def test_a_listed_gpu_the_node_does_not_allow_is_refused(smi: Path) -> None:
    with pytest.raises(GpuRefused, match=r"^gpu01: GPU 4 is listed, but the node does not offer it \(the node's "
                                         r"CUDA_VISIBLE_DEVICES=2,3 allows GPUs 2-3\)$"):
        choose(h100x8(smi, CUDA_VISIBLE_DEVICES="2,3"), listed=[2, 4])
    with pytest.raises(GpuRefused, match=r"GPU 9 is listed, but the node does not offer it \(nvidia-smi lists GPUs 0-7\)"):
        choose(h100x8(smi), listed=[9])


def test_held_gpus_are_never_taken_and_a_listed_one_names_its_holder(smi: Path) -> None:
    facts = h100x8(smi)
    choice = choose(facts, count=4, held={4: HELD, 5: HELD})
    assert choice.gpus == (0, 2, 3, 6)  # four idle GPUs are left: GPU 0, 2, 3 on one socket, 6 and 7 on the other
    assert 4 not in choice.gpus and 5 not in choice.gpus
    assert f"GPU 4 held by {HELD}" in (choice.note or "")
    with pytest.raises(GpuRefused, match=f"^gpu01: GPU 5 is held by {HELD}$"):
        choose(facts, listed=[5], held={5: HELD}, allow_busy=True)


def test_without_a_count_a_gpu_another_run_holds_refuses_and_may_be_waited_for() -> None:
    facts = idle_node("8gpu_a100_nv12.txt", 8)
    with pytest.raises(GpuRefused) as refused:
        choose(facts, held={4: HELD}, allow_busy=True)  # --allow-busy-gpus never takes another run's GPU
    assert refused.value.leased
    assert refused.value.reason == (
        f"GPU 4 is held by {HELD}; two runs never share a GPU, and without a process count the run takes every GPU "
        "the node allows (0-7), one process each: `--nproc-per-node 7` takes the 7 best idle GPUs on every node, or "
        "`up --wait-gpus` waits until they are free")
    assert choose(facts, held={4: HELD}, count=4).gpus == (0, 1, 2, 3)


def test_too_few_idle_gpus_is_refused_with_what_each_other_is_doing(smi: Path) -> None:
    with pytest.raises(GpuRefused) as refused:
        choose(h100x8(smi), count=8)
    assert str(refused.value) == ("gpu01: 8 GPU(s) needed, 7 of 8 idle (GPU 1 busy: pid 3999999 /app/llama-server, "
                                  "45652 MiB); --allow-busy-gpus takes busy ones too, or ask for fewer processes "
                                  "(--nproc-per-node)")
    assert choose(h100x8(smi), count=8, allow_busy=True).gpus == tuple(range(8))


def test_a_node_with_no_idle_gpu_says_what_each_is_doing() -> None:
    facts = idle_node("4gpu_pcie_nic_legend.txt", 2)
    facts = NodeGpus(facts.node, tuple(GpuUse(g.index, g.uuid, g.name, 70000, 81920, 99) for g in facts.gpus),
                     topology=facts.topology)
    with pytest.raises(GpuRefused, match=r"^gpu02: GPU 0 is busy: 70000 of 81920 MiB in use by processes nvidia-smi "
                                         r"does not list; GPU 1 is busy: .*; without a process count the run takes "
                                         r"every GPU the node allows \(0-1\), one process each, and one busy GPU slows "
                                         r"every rank of the job: add --allow-busy-gpus to use busy GPUs anyway$"):
        choose(facts)
    with pytest.raises(GpuRefused, match=r"^gpu02: 1 GPU\(s\) needed, 0 of 2 idle \(GPU 0 busy: .*\); "
                                         r"--allow-busy-gpus takes busy ones too$"):
        choose(facts, count=1)


def test_a_run_does_not_count_its_own_processes_as_busy() -> None:
    mine = GpuProcess(77, "python", 30000, "alice", "r1")
    gpu = GpuUse(0, "GPU-0", "H100", 30000, 81559, 90, (mine,))
    assert gpuchoice.busy(gpu, "r1") is None
    assert gpuchoice.busy(gpu, "r2") == "busy: pid 77 python (alice), 30000 MiB"
    assert gpuchoice.busy(GpuUse(0, None, None, 2048, 81559, 0), "r1") == (
        "busy: 2048 of 81559 MiB in use by processes nvidia-smi does not list")
    assert gpuchoice.busy(GpuUse(0, None, None, 10, 81559, 97)) == "busy: 97 % utilised"


@pytest.mark.parametrize(("recording", "count", "k", "chosen", "why"), [
    ("4gpu_pcie_nic_legend.txt", 4, 2, (0, 1), "within one NUMA node's PCIe (NODE), one NUMA node (0)"),
    ("4gpu_nv4_mlx5_rows.txt", 4, 2, (0, 1), "one NVLink island (NV4), one NUMA node (0)"),
    ("8gpu_a100_nv12.txt", 8, 4, (0, 1, 2, 3), "one NVLink island (NV12), one NUMA node (0)"),
    ("2gpu_phb_with_legend.txt", 2, 1, (0,), "the first idle ones"),
])
def test_the_best_linked_set_on_recorded_topologies(recording: str, count: int, k: int, chosen: tuple, why: str) -> None:
    choice = choose(idle_node(recording, count), count=k)
    assert choice.gpus == chosen
    assert choice.note == f"gpu02: GPUs {gpu_facts.span(chosen)} for {k} process(es): {why}"


def test_a_busy_gpu_moves_the_choice_to_the_other_pcie_group() -> None:
    facts = idle_node("4gpu_pcie_nic_legend.txt", 4)
    busy = GpuUse(0, "GPU-0", "NVIDIA A100", 40000, 81920, 99)
    facts = NodeGpus(facts.node, (busy, *facts.gpus[1:]), topology=facts.topology)
    assert choose(facts, count=2).gpus == (2, 3)


def test_a_rank_whose_nearest_nic_is_across_the_sockets_is_warned_of() -> None:
    choice = choose(idle_node("4gpu_nv4_mlx5_rows.txt", 4), networked=True)
    assert choice.warnings == tuple(
        f"gpu02: local rank {r} (GPU {r}) reaches its nearest NIC (mlx5_0, mlx5_1, mlx5_2, mlx5_3) only across the "
        "CPU interconnect (SYS): its traffic to other nodes crosses sockets" for r in (2, 3))
    assert choose(idle_node("4gpu_nv4_mlx5_rows.txt", 4)).warnings == ()  # one node: no traffic to other nodes


def test_without_a_topology_gpus_are_taken_in_index_order_and_not_bound(smi: Path) -> None:
    facts = h100x8(smi)
    facts = NodeGpus(facts.node, facts.gpus, topology=None, problems=("gpu01: nvidia-smi topo -m did not parse (...)",))
    choice = choose(facts, count=4)
    assert choice.gpus == (0, 2, 3, 4)
    assert choice.note is not None and "the first idle ones (the topology is not known)" in choice.note
    assert choice.cpu_bind() is None and choice.warnings == facts.problems


def test_mig_instances_keep_the_nodes_own_cuda_visible_devices(smi: Path) -> None:
    mig = "MIG-GPU-6a9c1d02-5b1e-4c3f-9e0a-1f2b3c4d5e60/1/0,MIG-GPU-6a9c1d02-5b1e-4c3f-9e0a-1f2b3c4d5e60/2/0"
    choice = choose(h100x8(smi, CUDA_VISIBLE_DEVICES=mig))
    assert (choice.gpus, choice.node_env) == ((), True)
    with pytest.raises(GpuRefused, match="names MIG instances"):
        choose(h100x8(smi, CUDA_VISIBLE_DEVICES=mig), listed=[0])


def test_a_node_whose_environment_hides_every_gpu_runs_cpu_processes(smi: Path) -> None:
    choice = choose(h100x8(smi, CUDA_VISIBLE_DEVICES="-1"))
    assert choice.gpus == () and choice.note == "gpu01: the node's CUDA_VISIBLE_DEVICES=-1 allows GPUs none: CPU processes"


def test_cpu_lists_are_written_as_the_kernel_writes_them() -> None:
    assert gpuchoice.cpu_list(frozenset({0, 1, 2, 3, 8, 10, 11})) == "0-3,8,10-11"
