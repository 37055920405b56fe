"""`clusterrun export sbatch`: a batch script that bash accepts, asks Slurm for the right allocation, and runs
torchrun on every allocated node with that node's environment and the script's arguments byte for byte.

The scripts are run for real under bash, with stand-ins for srun, scontrol, ip and the nodes' python on PATH:
the srun stand-in runs the step once per node with that node's SLURM_NODEID and SLURMD_NODENAME, as Slurm would.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clusterrun.cli.job_options import build_job
from clusterrun.errors import UsageError
from clusterrun.export.sbatch import SbatchOptions, sbatch_script

ROOT = Path(__file__).resolve().parent.parent
TRAIN = str(ROOT / "examples" / "train_ddp.py")
INVENTORIES = sorted((ROOT / "inventories").glob("*.yaml"))
HOSTILE_ARGS = ("--epochs", "3", "two words", "it's", 'say "hi"', "$(touch pwned)", "`touch pwned`", "$HOME", "*",
                "back\\slash", "line\nbreak", "--", "-m", "", "tab\there", "ünïcode")
SECRET = "s3cr3t-value-never-written"


def plan_of(inventory: Path | None, script: str = TRAIN, args: tuple[str, ...] = (), env: tuple[str, ...] = (),
            module: bool = False, tmp_path: Path | None = None, **sources: str) -> tuple[Any, Any]:
    runs = (tmp_path or Path("/tmp")) / "runs"
    return build_job(inventory, script, args, module=module, nproc_per_node=None, master_port=None, env=env,
                     runs_dir=runs, sources=sources)


def script_for(inventory: Path | None, name: str = "job", **kwargs: object) -> str:
    inv, plan = plan_of(inventory, **kwargs)
    return sbatch_script(plan, inv, SbatchOptions(name=name))


def bash_n(text: str, tmp_path: Path) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text(text, encoding="utf-8")
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def directives(text: str) -> list[str]:
    """The #SBATCH options as sbatch reads them: from the lines before the first command."""
    found = []
    for line in text.splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break
        if line.startswith("#SBATCH "):
            found.append(line.removeprefix("#SBATCH "))
    return found


# -- the cluster stand-ins ------------------------------------------------------------------------------------

SRUN = """#!/bin/bash
# srun as Slurm runs a step with one task per node: each node in turn, with its SLURM_NODEID and name.
printf '%s\\n' "$@" > "$STUB_OUT/srun.args"
while [ "${1#-}" != "$1" ]; do shift; done
id=0
for node in $STUB_NODES; do
  ( export SLURM_NODEID=$id SLURMD_NODENAME=$node; "$@" ) || exit $?
  id=$((id + 1))
done
"""
SCONTROL = """#!/bin/bash
[ "$1 $2" = "show hostnames" ] || exit 2
printf '%s\\n' $STUB_NODES
"""
IP = """#!/bin/bash
printf '%s\\n' "$*" >> "$STUB_OUT/ip.calls"
echo "3: ens2f0    inet $STUB_MASTER_IP/24 brd 10.10.0.255 scope global ens2f0\\       valid_lft forever"
"""
PYTHON = """#!{python}
# The nodes' python: records what torchrun would have been started with.
import json, os, sys
keep = {{k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "GLOO_", "ONLY_", "HF_", "MASTER_"))}}
with open(os.path.join(os.environ["STUB_OUT"], os.environ["SLURMD_NODENAME"] + ".json"), "w") as f:
    json.dump({{"argv": sys.argv, "env": keep, "cwd": os.getcwd()}}, f)
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    """A bin/ directory with srun, scontrol, ip and python stand-ins; their records go to out/."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "out").mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("ip", IP),
                       ("python", PYTHON.format(python=sys.executable))):
        (bin_dir / name).write_text(text, encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    return tmp_path


def run_batch(text: str, cluster: Path, nodes: list[str], extra_env: dict[str, str] | None = None,
              master_ip: str = "10.10.0.21") -> subprocess.CompletedProcess[str]:
    """Run the batch script as Slurm would on the allocation's first node."""
    path = cluster / "job.sbatch"
    path.write_text(text, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "NCCL_", "GLOO_", "HF_", "ONLY_"))}
    env.update(PATH=f"{cluster / 'bin'}:{env['PATH']}", STUB_OUT=str(cluster / "out"), STUB_NODES=" ".join(nodes),
               STUB_MASTER_IP=master_ip, SLURM_JOB_NODELIST=",".join(nodes), SLURM_NNODES=str(len(nodes)),
               SLURMD_NODENAME=nodes[0], **(extra_env or {}))
    return subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env, cwd=cluster, timeout=60)


def started(cluster: Path, node: str) -> dict[str, Any]:
    return json.loads((cluster / "out" / f"{node}.json").read_text(encoding="utf-8"))


def write_inventory(tmp_path: Path, python: Path, data: str = "10.10.0.0/24", extra_a: str = "",
                    extra_b: str = "") -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(f"""version: 1
defaults:
  python: {python}
  env: {{NCCL_DEBUG: WARN}}
network:
  data: {data}
nodes:
  - name: gpu-a
    host: 192.168.1.21
    gpus: 2
    nics:
      - {{name: eno1, ip: 192.168.1.21/24}}
      - {{name: ens2f0, ip: 10.10.0.21/24}}
{extra_a}
  - name: gpu-b
    host: 192.168.1.22
    gpus: 2
    nics:
      - {{name: eno1, ip: 192.168.1.22/24}}
      - {{name: enp65s0f0, ip: 10.10.0.22/24}}
{extra_b}
""", encoding="utf-8")
    return path


# -- every input gives a script bash accepts --------------------------------------------------------------------

ONE_LINERS = [
    {"ips": "10.0.0.1"},
    {"ips": "10.0.0.1,10.0.0.2", "gpus": "0-7"},
    {"ips": ",".join(f"10.0.0.{i}" for i in range(1, 17)), "gpus": "0-3", "data_nic": "ib0"},
    {"ips": "gpu-a,gpu-b", "data_nic": "10.10.0.0/24"},
]


@pytest.mark.parametrize("inventory", INVENTORIES, ids=lambda p: p.name)
def test_script_from_each_shipped_inventory_passes_bash_n(inventory: Path, tmp_path: Path) -> None:
    bash_n(script_for(inventory, args=HOSTILE_ARGS), tmp_path)


@pytest.mark.parametrize("sources", ONE_LINERS, ids=lambda s: f"{len(s['ips'].split(','))}-nodes")
def test_script_from_one_liners_passes_bash_n(sources: dict[str, str], tmp_path: Path) -> None:
    bash_n(script_for(None, args=HOSTILE_ARGS, env=("MULTI=line one\nline two",), **sources), tmp_path)


def test_directives_ask_for_the_plans_allocation() -> None:
    inv, plan = plan_of(ROOT / "inventories" / "four-node-infiniband.yaml", script="train.py")
    text = sbatch_script(plan, inv, SbatchOptions(name="llm", time="1-12:00:00", partition="gpu", account="ml"))
    assert directives(text) == ["--job-name=llm", "--nodes=4", "--ntasks-per-node=1", "--gpus-per-node=8",
                                "--time=1-12:00:00", "--partition=gpu", "--account=ml", "--output=%x-%j.out"]
    # sbatch reads #SBATCH lines only up to the first command: none may come after it.
    assert len(directives(text)) == sum(line.startswith("#SBATCH ") for line in text.splitlines())


def test_cpu_nodes_ask_for_no_gpus_and_no_optional_lines() -> None:
    text = script_for(None, ips="10.0.0.1,10.0.0.2")
    assert directives(text) == ["--job-name=job", "--nodes=2", "--ntasks-per-node=1", "--output=%x-%j.out"]


@pytest.mark.parametrize(("field", "value"), [("time", "2 hours"), ("time", "1:00\n#SBATCH --x"), ("partition", "a b"),
                                              ("account", "ml;rm"), ("name", "")])
def test_values_slurm_would_refuse_are_usage_errors(field: str, value: str) -> None:
    options = {"name": "job", field: value}
    with pytest.raises(UsageError, match=f"--{field}"):
        SbatchOptions(**options)


@pytest.mark.parametrize(("inventory", "exports"), [
    ("two-node-ethernet.yaml", ["export NCCL_IB_DISABLE=1"]),
    ("four-node-infiniband.yaml", ["export NCCL_SOCKET_IFNAME==ib0", "export GLOO_SOCKET_IFNAME=ib0",
                                   "export NCCL_IB_HCA==mlx5_0:1,mlx5_1:1"]),
])
def test_settings_derived_from_the_hosts_are_kept_the_script_runs_on_them(inventory: str, exports: list[str]) -> None:
    # Unlike a Kubernetes export: Slurm runs the job on the inventory's hosts, where these settings are true.
    lines = script_for(ROOT / "inventories" / inventory).splitlines()
    assert all(line in lines for line in exports)
    assert not any("pods" in line for line in lines)


def test_secret_values_are_never_written_only_referenced(tmp_path: Path) -> None:
    text = script_for(None, ips="10.0.0.1,10.0.0.2", env=(f"HF_TOKEN={SECRET}", f"DB_PASSWORD={SECRET}x"))
    assert SECRET not in text
    for name in ("HF_TOKEN", "DB_PASSWORD"):
        assert f'export {name}="${{{name}:?set {name} in the submitting environment}}"' in text
    bash_n(text, tmp_path)


# -- run under bash on stand-in nodes --------------------------------------------------------------------------

def test_each_node_starts_torchrun_with_its_rank_and_the_arguments_byte_for_byte(cluster: Path) -> None:
    inventory = write_inventory(cluster, cluster / "bin" / "python")
    inv, plan = plan_of(inventory, args=HOSTILE_ARGS, env=(f"HF_TOKEN={SECRET}",))
    text = sbatch_script(plan, inv, SbatchOptions(name="job"))
    result = run_batch(text, cluster, ["gpu-a", "gpu-b"], {"HF_TOKEN": "from-the-submitter"})
    assert result.returncode == 0, result.stderr
    for rank, (node, nic) in enumerate((("gpu-a", "ens2f0"), ("gpu-b", "enp65s0f0"))):
        seen = started(cluster, node)
        assert seen["argv"][1:] == [
            "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "2",
            "--master-addr", "10.10.0.21", "--master-port", "29500", TRAIN, *HOSTILE_ARGS]
        env = seen["env"]
        assert env["NCCL_SOCKET_IFNAME"] == f"={nic}" and env["GLOO_SOCKET_IFNAME"] == nic
        assert env["NCCL_DEBUG"] == "WARN"
        assert env["HF_TOKEN"] == "from-the-submitter"
    assert not (cluster / "pwned").exists()
    # The master's address was looked up on the data subnet, whatever its NIC is called.
    assert (cluster / "out" / "ip.calls").read_text().split("\n")[0] == "-o -4 addr show to 10.10.0.0/24"
    assert "--kill-on-bad-exit=1" in (cluster / "out" / "srun.args").read_text().splitlines()
    assert "CUDA_VISIBLE_DEVICES=" not in text  # Slurm gives the GPUs and sets it


def test_master_is_found_by_its_data_nic_when_the_network_is_chosen_automatically(cluster: Path) -> None:
    inventory = write_inventory(cluster, cluster / "bin" / "python", data="auto")
    inv, plan = plan_of(inventory)
    text = sbatch_script(plan, inv, SbatchOptions(name="job"))
    result = run_batch(text, cluster, ["gpu-a", "gpu-b"], master_ip="10.10.0.99")
    assert result.returncode == 0, result.stderr
    assert (cluster / "out" / "ip.calls").read_text().splitlines() == ["-o -4 addr show dev ens2f0"]
    assert started(cluster, "gpu-b")["argv"][10] == "10.10.0.99"


def test_a_variable_only_one_node_sets_does_not_reach_the_others(cluster: Path) -> None:
    inventory = write_inventory(cluster, cluster / "bin" / "python",
                                extra_a='    env: {ONLY_A: "x $y\\n$(touch pwned) it\'s"}')
    inv, plan = plan_of(inventory)
    text = sbatch_script(plan, inv, SbatchOptions(name="job"))
    result = run_batch(text, cluster, ["gpu-a", "gpu-b"], {"ONLY_A": "from the login shell"})
    assert result.returncode == 0, result.stderr
    assert started(cluster, "gpu-a")["env"]["ONLY_A"] == "x $y\n$(touch pwned) it's"
    assert "ONLY_A" not in started(cluster, "gpu-b")["env"]
    assert not (cluster / "pwned").exists()


def test_nodes_with_different_process_counts_and_interpreters_each_get_theirs(cluster: Path) -> None:
    other = cluster / "bin" / "python2nd"
    other.symlink_to(cluster / "bin" / "python")
    inventory = write_inventory(cluster, cluster / "bin" / "python",
                                extra_b=f"    nproc_per_node: 1\n    python: {other}")
    inv, plan = plan_of(inventory)
    text = sbatch_script(plan, inv, SbatchOptions(name="job"))
    result = run_batch(text, cluster, ["gpu-a", "gpu-b"])
    assert result.returncode == 0, result.stderr
    a, b = started(cluster, "gpu-a")["argv"], started(cluster, "gpu-b")["argv"]
    assert (a[0], a[a.index("--nproc-per-node") + 1]) == (str(cluster / "bin" / "python"), "2")
    assert (b[0], b[b.index("--nproc-per-node") + 1]) == (str(other), "1")


def test_a_missing_secret_stops_the_script_before_any_node_starts(cluster: Path) -> None:
    inventory = write_inventory(cluster, cluster / "bin" / "python")
    inv, plan = plan_of(inventory, env=(f"WANDB_API_KEY={SECRET}",))
    result = run_batch(sbatch_script(plan, inv, SbatchOptions(name="job")), cluster, ["gpu-a", "gpu-b"])
    assert result.returncode != 0
    assert "set WANDB_API_KEY in the submitting environment" in result.stderr
    assert not list((cluster / "out").glob("*.json"))


def test_an_allocated_node_the_script_does_not_know_is_refused_with_the_reason(cluster: Path) -> None:
    inventory = write_inventory(cluster, cluster / "bin" / "python", data="auto")
    inv, plan = plan_of(inventory)
    result = run_batch(sbatch_script(plan, inv, SbatchOptions(name="job")), cluster, ["gpu-x", "gpu-a"])
    assert result.returncode != 0
    assert re.search(r"gpu-x is not one of the nodes this script was written for \(gpu-a, gpu-b\)", result.stderr)


def test_one_liner_runs_the_module_with_the_allocations_first_node_as_master(cluster: Path) -> None:
    text = script_for(None, script="mypkg.train", module=True, args=("--lr", "0.1"), ips="n1,n2,n3",
                      node_python=str(cluster / "bin" / "python"))
    result = run_batch(text, cluster, ["n1", "n2", "n3"])
    assert result.returncode == 0, result.stderr
    for rank, node in enumerate(["n1", "n2", "n3"]):
        argv = started(cluster, node)["argv"]
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--master-addr") + 1] == "n1"  # the data network is unknown: the host name
        assert argv[-4:] == ["-m", "mypkg.train", "--lr", "0.1"]


def test_shared_filesystem_runs_the_script_in_the_workdir() -> None:
    text = script_for(ROOT / "inventories" / "four-node-infiniband.yaml", script="train.py")
    assert "cd -- /shared/projects/llm" in text.splitlines()
    assert text.rstrip().endswith("train.py")


def test_a_script_path_with_a_line_break_stays_inside_comments_and_quotes(tmp_path: Path) -> None:
    from clusterrun.inventory.yaml_source import parse_inventory_text
    from clusterrun.planning.plan import JobSpec, build_plan

    inv = parse_inventory_text("version: 1\nnodes:\n  - {name: a, host: a}\n  - {name: b, host: b}\n", "two.yaml")
    plan = build_plan(inv, JobSpec(script="odd\n#SBATCH --nodes=99\n$(touch pwned).py", run_id="r1"))
    text = sbatch_script(plan, inv, SbatchOptions(name="job"))
    assert directives(text) == ["--job-name=job", "--nodes=2", "--ntasks-per-node=1", "--output=%x-%j.out"]
    bash_n(text, tmp_path)
