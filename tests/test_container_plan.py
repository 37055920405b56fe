"""The container command of each node (docker, podman, apptainer), as `plan` shows it and `up` runs it; the
inventory's `container:` section and the --image / --container-runtime flags."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clusterrun.errors import InventoryError
from clusterrun.inventory.yaml_source import parse_inventory_text
from clusterrun.planning.plan import JobSpec, LaunchPlan, build_plan

ROOT = Path(__file__).resolve().parent.parent

TWO_NODES = """
version: 1
defaults:
  container: {image: nvcr.io/nvidia/pytorch:24.05-py3, runtime: RUNTIME, mounts: ["/data:/data:ro"],
              options: [--ulimit, host]}
  env: {WANDB_API_KEY: s3cret}
nodes:
  - name: gpu01
    host: 10.0.0.1
    gpus: [0, 1, 2, 3]
    nproc_per_node: 2
    nics:
      - {name: eth0, ip: 10.0.0.1/24}
      - {name: ib0, ip: 10.1.0.1/24, kind: infiniband, hca: mlx5_0}
  - name: gpu02
    host: 10.0.0.2
    gpus: [2, 3]
    nics:
      - {name: eth0, ip: 10.0.0.2/24}
"""


def plan_for(runtime: str, **job_kw: object) -> LaunchPlan:
    text = textwrap.dedent(TWO_NODES).replace("RUNTIME", runtime)
    job = JobSpec(script="train.py", run_id="r1", local_runs_dir="/tmp/runs", local_cwd="/work", **job_kw)  # type: ignore[arg-type]
    return build_plan(parse_inventory_text(text, "inv.yaml"), job)


def after(argv: tuple[str, ...], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_podman_command_has_what_nccl_needs_and_torchrun_as_main_process() -> None:
    node = plan_for("podman").node("gpu01")
    argv = node.container.argv(node.argv)
    assert argv[:4] == ("podman", "run", "--rm", "--init")
    assert after(argv, "--label") == ["clusterrun.run=r1", "clusterrun.node=gpu01"]
    assert after(argv, "--network") == ["host"] and after(argv, "--ipc") == ["host"]
    assert after(argv, "--ulimit")[:2] == ["memlock=-1", "stack=67108864"]
    assert after(argv, "--cap-add") == ["SYS_PTRACE", "IPC_LOCK"]
    # only the run's GPUs (the plan's CUDA_VISIBLE_DEVICES), as CDI devices, plus the RDMA devices
    assert after(argv, "--device") == ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=2",
                                       "nvidia.com/gpu=3", "/dev/infiniband"]
    assert dict(node.container.env) == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    run_dir = "~/.clusterrun/runs/r1/gpu01"
    assert after(argv, "--volume") == [f"{run_dir}:{run_dir}", "/data:/data:ro"]
    assert after(argv, "--workdir") == [f"{run_dir}/code"]
    # the user's options come last before the image, then torchrun's argv unchanged
    image_at = argv.index("nvcr.io/nvidia/pytorch:24.05-py3")
    assert argv[image_at - 2:image_at] == ("--ulimit", "host")
    assert argv[image_at + 1:] == node.argv


def test_no_environment_value_is_in_the_container_argv() -> None:
    plan = plan_for("docker", env=(("HF_TOKEN", "hf_abc123"),))
    for node in plan.nodes:
        argv = node.container.argv(node.argv)
        assert "HF_TOKEN" in after(argv, "--env") and "WANDB_API_KEY" in after(argv, "--env")
        assert not any("hf_abc123" in a or "s3cret" in a for a in argv)


def test_docker_gets_only_the_runs_gpus_and_no_rdma_devices_without_rdma_nics() -> None:
    node = plan_for("docker").node("gpu02")
    argv = node.container.argv(node.argv)
    assert after(argv, "--gpus") == ['"device=2,3"']
    assert "--device" not in argv and "IPC_LOCK" not in argv
    assert dict(node.container.env) == {"CUDA_VISIBLE_DEVICES": "0,1"}


def test_private_ipc_gets_a_shm_size_instead_of_the_hosts_ipc() -> None:
    text = textwrap.dedent(TWO_NODES).replace("RUNTIME", "docker").replace("options:", "shm_size: 16g, options:")
    node = build_plan(parse_inventory_text(text, "inv.yaml"), JobSpec(script="t.py", run_id="r1")).nodes[0]
    argv = node.container.argv(node.argv)
    assert after(argv, "--shm-size") == ["16g"] and "--ipc" not in argv


def test_apptainer_binds_the_same_paths_and_keeps_the_hosts_namespaces() -> None:
    node = plan_for("apptainer").node("gpu01")
    argv = node.container.argv(node.argv)
    assert argv[:3] == ("apptainer", "exec", "--nv")
    run_dir = "~/.clusterrun/runs/r1/gpu01"
    assert after(argv, "--bind") == [f"{run_dir}:{run_dir}", "/data:/data:ro"]
    assert after(argv, "--pwd") == [f"{run_dir}/code"]
    assert "--env" not in argv and "--network" not in argv  # apptainer passes the environment and the network
    assert node.container.env == ()  # all GPUs are visible: CUDA_VISIBLE_DEVICES keeps the host's numbers


def test_the_container_command_survives_plan_json() -> None:
    plan = plan_for("podman")
    again = LaunchPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again.node("gpu01").container == plan.node("gpu01").container


def test_a_node_overrides_the_defaults_key_by_key() -> None:
    text = textwrap.dedent(TWO_NODES).replace("RUNTIME", "podman") + "    container: {image: other:1}\n"
    plan = build_plan(parse_inventory_text(text, "inv.yaml"), JobSpec(script="t.py", run_id="r1"))
    assert plan.node("gpu02").container.image == "other:1"
    assert plan.node("gpu02").container.runtime.value == "podman"
    assert plan.node("gpu01").container.image == "nvcr.io/nvidia/pytorch:24.05-py3"


@pytest.mark.parametrize(("snippet", "said"), [
    ("{image: x, runtim: podman}", "inv.yaml:3:"),
    ("{image: x, runtime: rkt}", "runtime"),
    ("{image: x, pull: sometimes}", "pull"),
    ("{image: x, mounts: ['data:/data']}", "absolute path"),
    ("{image: x, mounts: ['/data']}", "SRC:DST"),
    ("{runtime: podman}", "without an image"),
    ("{image: 'a b'}", "without spaces"),
])
def test_bad_container_settings_are_refused_with_the_line(snippet: str, said: str) -> None:
    text = f"version: 1\ndefaults:\n  container: {snippet}\nnodes: [{{name: a, host: b}}]\n"
    with pytest.raises(InventoryError, match=r"inv\.yaml:3") as info:
        parse_inventory_text(text, "inv.yaml")
    assert said in str(info.value)


def _clusterrun(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "clusterrun", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)


def test_plan_json_of_an_infiniband_node_shows_host_network_ipc_memlock_and_devices(tmp_path: Path) -> None:
    (tmp_path / "inv.yaml").write_text(textwrap.dedent("""
        version: 1
        nodes:
          - name: gpu01
            host: 10.0.0.1
            nics:
              - {name: eth0, ip: 10.0.0.1/24}
              - {name: ib0, kind: infiniband, hca: mlx5_0}
        """))
    (tmp_path / "train.py").write_text("print(1)\n")
    done = _clusterrun(tmp_path, "plan", "--json", "--image", "img:1", "--container-runtime", "podman",
                       "inv.yaml", "train.py")
    assert done.returncode == 0, done.stderr
    argv = tuple(json.loads(done.stdout)["nodes"][0]["container"]["argv"])
    assert after(argv, "--network") == ["host"] and after(argv, "--ipc") == ["host"]
    assert "memlock=-1" in after(argv, "--ulimit")
    assert "/dev/infiniband" in after(argv, "--device") and "IPC_LOCK" in after(argv, "--cap-add")
    assert argv[0] == "podman" and "img:1" in argv


def test_a_runtime_without_an_image_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "inv.yaml").write_text("version: 1\nnodes: [{name: a, host: 10.0.0.1}]\n")
    (tmp_path / "train.py").write_text("print(1)\n")
    done = _clusterrun(tmp_path, "plan", "--container-runtime", "podman", "inv.yaml", "train.py")
    assert done.returncode == 2 and "give --image IMAGE" in done.stderr


def test_sbatch_runs_the_step_in_the_image_with_pyxis(tmp_path: Path) -> None:
    (tmp_path / "inv.yaml").write_text(textwrap.dedent(TWO_NODES).replace("RUNTIME", "podman"))
    (tmp_path / "train.py").write_text("print(1)\n")
    done = _clusterrun(tmp_path, "export", "sbatch", "inv.yaml", "train.py")
    assert done.returncode == 0, done.stderr
    step = done.stdout.split("\nsrun ", 1)[1]
    assert "--container-image=nvcr.io#nvidia/pytorch:24.05-py3" in step  # enroot's REGISTRY#IMAGE
    assert '--container-mounts="$PWD:$PWD,/data:/data:ro"' in step and '--container-workdir="$PWD"' in step
    assert subprocess.run(["bash", "-n"], input=done.stdout, text=True, check=False).returncode == 0


def test_kubeflow_exports_take_the_inventorys_image(tmp_path: Path) -> None:
    text = textwrap.dedent(TWO_NODES).replace("RUNTIME", "docker").replace("gpus: [0, 1, 2, 3]", "gpus: [0, 1]")
    (tmp_path / "inv.yaml").write_text(text)
    (tmp_path / "train.py").write_text("print(1)\n")
    for kind in ("pytorchjob", "trainjob"):
        done = _clusterrun(tmp_path, "export", kind, "inv.yaml", "train.py")
        assert done.returncode == 0, done.stderr
        assert "image: nvcr.io/nvidia/pytorch:24.05-py3" in done.stdout
        flagged = _clusterrun(tmp_path, "export", kind, "--image", "ghcr.io/acme/train:1.4", "inv.yaml", "train.py")
        assert "image: ghcr.io/acme/train:1.4" in flagged.stdout, flagged.stderr


@pytest.mark.parametrize(("image", "enroot"), [
    ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io#nvidia/pytorch:24.05-py3"),
    ("localhost:5000/train:1", "localhost:5000#train:1"),
    ("pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime", "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime"),
    ("/shared/images/train.sqsh", "/shared/images/train.sqsh"),
])
def test_enroot_names_the_registry_with_a_hash(image: str, enroot: str) -> None:
    from clusterrun.export.pyxis import enroot_image

    assert enroot_image(image) == enroot


def test_doctor_probes_a_node_in_its_image_with_the_runtimes_settings_only() -> None:
    from clusterrun.doctor.in_image import image_command

    text = textwrap.dedent(TWO_NODES).replace("RUNTIME", "podman").replace(
        "env: {WANDB_API_KEY: s3cret}", "env: {WANDB_API_KEY: s3cret, CONTAINERS_CONF: /etc/c.conf}")
    inv = parse_inventory_text(text, "inv.yaml")
    inside, env = image_command(inv, inv.nodes[0])
    assert inside[:2] == ("podman", "run") and inside[-1] == "nvcr.io/nvidia/pytorch:24.05-py3"
    assert after(inside, "--network") == ["host"] and "/dev/infiniband" in after(inside, "--device")
    assert "--workdir" not in inside and not any(".clusterrun/runs" in a for a in inside)
    assert env == {"CONTAINERS_CONF": "/etc/c.conf"}  # never a secret: the probe's env is on its command line
    bare = parse_inventory_text("version: 1\nnodes: [{name: a, host: b}]\n", "inv.yaml")
    assert image_command(bare, bare.nodes[0]) == ((), {})


def test_up_names_the_image_its_id_and_torch_and_refuses_nodes_whose_image_differs() -> None:
    from clusterrun.launch.ready import NodeReady, image_lines, image_problems

    plan = plan_for("podman")
    ready = {name: NodeReady(name, "3.11.7", "2.3.0") for name in ("gpu01", "gpu02")}
    for r in ready.values():
        r.image_id = "sha256:" + "ab" * 32
    ready["gpu02"].pulled = True
    assert image_lines(plan, ready) == ["image nvcr.io/nvidia/pytorch:24.05-py3 (podman, abababababab) on 2 node(s), "
                                        "torch 2.3.0; pulled on gpu02"]
    assert image_problems(plan, ready) == {}
    ready["gpu02"].image_id = "cd" * 32
    (problem,) = image_problems(plan, ready).items()
    assert problem[1].startswith("the image nvcr.io/nvidia/pytorch:24.05-py3 is ")
    assert "pull the same image on every node" in problem[1]
