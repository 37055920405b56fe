"""The launch plan: ranks, master address, torchrun argv and the environment rules, from real inventories."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from clusterrun.errors import PlanError
from clusterrun.inventory.yaml_source import load_inventory, parse_inventory_text
from clusterrun.planning.nccl import RULES
from clusterrun.planning.plan import JobSpec, build_plan

INVENTORIES = Path(__file__).resolve().parent.parent / "inventories"


def job(**kw: object) -> JobSpec:
    base: dict[str, object] = {"script": "train.py", "run_id": "r1", "local_runs_dir": "/tmp/runs", "local_cwd": "/work"}
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


def inv(text: str):
    return parse_inventory_text(textwrap.dedent(text).lstrip("\n"), "inv.yaml")


def arg(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_two_node_ethernet_example() -> None:
    plan = build_plan(load_inventory(INVENTORIES / "two-node-ethernet.yaml"), job(args=("--epochs", "3")))
    a, b = plan.nodes
    assert (a.name, a.node_rank, b.name, b.node_rank) == ("gpu-a", 0, "gpu-b", 1)
    # the master is rank 0's address on the data network, not its SSH address
    assert plan.master_addr == "10.10.0.21"
    assert a.host == "192.168.1.21"
    assert a.env_dict()["NCCL_SOCKET_IFNAME"] == "=ens2f0"
    assert b.env_dict()["NCCL_SOCKET_IFNAME"] == "=enp65s0f0"
    assert b.env_dict()["GLOO_SOCKET_IFNAME"] == "enp65s0f0"
    assert a.env_dict()["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_IB_HCA" not in a.env_dict()
    assert a.env_dict()["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert plan.world_size == 16 and b.ranks == range(8, 16)
    assert b.argv[:3] == ("/opt/venvs/train/bin/python", "-m", "torch.distributed.run")
    assert arg(b.argv, "--node-rank") == "1" and arg(b.argv, "--nnodes") == "2"
    assert arg(b.argv, "--master-addr") == "10.10.0.21" and arg(b.argv, "--nproc-per-node") == "8"
    # each torchrun is told its own node's data address: nothing is left to its host name (and DNS)
    assert arg(a.argv, "--local-addr") == "10.10.0.21" and arg(b.argv, "--local-addr") == "10.10.0.22"
    assert b.argv[-3:] == ("~/.clusterrun/runs/r1/gpu-b/code/train.py", "--epochs", "3")


def test_four_node_infiniband_example() -> None:
    plan = build_plan(load_inventory(INVENTORIES / "four-node-infiniband.yaml"), job())
    assert [n.node_rank for n in plan.nodes] == [0, 1, 2, 3]
    assert plan.master_addr == "10.20.0.11"
    for node in plan.nodes:
        env = node.env_dict()
        assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
        assert env["NCCL_SOCKET_IFNAME"] == "=ib0"
        assert "NCCL_IB_DISABLE" not in env and "NCCL_IB_GID_INDEX" not in env
        # shared filesystem: the script runs where it is, in the workdir
        assert node.cwd == "/shared/projects/llm" and node.script == "train.py"


def test_localhost_default_runs_cpu_workers_with_this_python() -> None:
    import sys

    plan = build_plan(load_inventory(INVENTORIES / "localhost.yaml"), job())
    (node,) = plan.nodes
    assert node.nproc_per_node == 2 and node.gpus == ()
    assert node.python == sys.executable
    assert node.script == "/work/train.py" and node.cwd == "/work"
    assert node.run_dir == "/tmp/runs/r1/localhost/node"
    assert "CUDA_VISIBLE_DEVICES" not in node.env_dict()


def test_nothing_that_hides_problems() -> None:
    plan = build_plan(load_inventory(INVENTORIES / "four-node-infiniband.yaml"), job())
    for node in plan.nodes:
        assert not {"NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_GID_INDEX"} & set(node.env_dict())
    assert all(rule.reason for rule in RULES)


def test_gid_index_only_when_set() -> None:
    plan = build_plan(inv("""
        nodes:
          - name: a
            host: 10.0.0.1
            nics:
              - {name: ens1, ip: 10.0.0.1/24, kind: roce, hca: mlx5_2, port: 1, gid_index: 3}
          - name: b
            host: 10.0.0.2
            nics:
              - {name: ens1, ip: 10.0.0.2/24, kind: roce, hca: mlx5_2, port: 1, gid_index: 3}
        """), job())
    assert plan.nodes[0].env_dict()["NCCL_IB_GID_INDEX"] == "3"
    assert plan.nodes[0].env_dict()["NCCL_IB_HCA"] == "=mlx5_2:1"


def test_env_precedence_and_sources() -> None:
    plan = build_plan(inv("""
        defaults:
          env: {NCCL_DEBUG: WARN, A: defaults, B: defaults}
        nodes:
          - name: a
            host: 10.0.0.1
            env: {B: node, C: node}
        """), job(env=(("C", "cli"), ("NCCL_SOCKET_IFNAME", "=eth9"))))
    node = plan.nodes[0]
    env = {v.name: (v.value, v.source) for v in node.env}
    assert env["A"] == ("defaults", "defaults.env")
    assert env["B"] == ("node", "nodes[0].env")
    assert env["C"] == ("cli", "--env")
    assert env["NCCL_SOCKET_IFNAME"] == ("=eth9", "--env")  # the user can always override a rule
    assert env["NCCL_DEBUG"] == ("WARN", "defaults.env")


def test_pinned_ranks_and_gpu_lists() -> None:
    plan = build_plan(inv("""
        network: {data: 10.0.0.0/24}
        nodes:
          - {name: a, host: h1, node_rank: 1, gpus: [2, 3], nics: [{name: eth1, ip: 10.0.0.1/24}]}
          - {name: b, host: h2, node_rank: 0, gpus: 2, nics: [{name: eth2, ip: 10.0.0.2/24}]}
        """), job())
    assert [n.name for n in plan.nodes] == ["b", "a"]
    assert plan.master_addr == "10.0.0.2"
    assert plan.node("a").env_dict()["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert plan.node("a").ranks == range(2, 4)
    assert plan.node_of_rank(3).name == "a"


def test_nproc_override_and_too_many() -> None:
    text = """
        nodes:
          - {name: a, host: 10.0.0.1, gpus: 4}
          - {name: b, host: 10.0.0.2, gpus: 4}
        """
    assert build_plan(inv(text), job(nproc_per_node=2)).world_size == 4
    with pytest.raises(PlanError, match=r"a: 8 processes per node but only 4 GPUs"):
        build_plan(inv(text), job(nproc_per_node=8))


def test_multi_node_master_is_never_localhost() -> None:
    with pytest.raises(PlanError, match="other nodes cannot reach"):
        build_plan(inv("""
            nodes:
              - {name: a, host: 127.0.0.1}
              - {name: b, host: 10.0.0.2}
            """), job())


def test_auto_prefers_the_fast_data_network_over_ssh() -> None:
    plan = build_plan(inv("""
        nodes:
          - name: a
            host: 192.168.1.1
            nics:
              - {name: eno1, ip: 192.168.1.1/24, speed: 1gbit}
              - {name: ens2, ip: 10.1.0.1/24, speed: 25gbit}
          - name: b
            host: 192.168.1.2
            nics:
              - {name: eno1, ip: 192.168.1.2/24, speed: 1gbit}
              - {name: enp3, ip: 10.1.0.2/24, speed: 25gbit}
        """), job())
    assert plan.data_network.startswith("10.1.0.0/24")
    assert [n.data_nic for n in plan.nodes] == ["ens2", "enp3"]


def test_plan_to_dict_has_the_documented_fields() -> None:
    plan = build_plan(load_inventory(INVENTORIES / "two-node-ethernet.yaml"), job())
    data = plan.to_dict()
    for node in data["nodes"]:
        assert {"name", "host", "node_rank", "nproc_per_node", "master_addr", "master_port", "argv", "cwd",
                "env"} <= set(node)


def test_sync_dir_keeps_the_script_path_inside_it() -> None:
    inventory = load_inventory(INVENTORIES / "two-node-ethernet.yaml")
    plan = build_plan(inventory, job(script="src/train.py", local_cwd="/home/me/proj", sync_dir="/home/me/proj"))
    assert plan.nodes[1].script == "~/.clusterrun/runs/r1/gpu-b/code/src/train.py"
    outside = build_plan(inventory, job(script="/elsewhere/train.py", sync_dir="/home/me/proj"))
    assert outside.nodes[0].script == "~/.clusterrun/runs/r1/gpu-a/code/train.py"


def test_one_node_tells_torchrun_its_loopback_address() -> None:
    plan = build_plan(inv("""
        nodes:
          - {name: a, host: 10.0.0.1, gpus: 2}
        """), job())
    assert arg(plan.nodes[0].argv, "--local-addr") == "127.0.0.1" == plan.master_addr
