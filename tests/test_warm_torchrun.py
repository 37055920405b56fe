"""The warm torchrun (remote/warm.py): started by the node agent at the ready check, used at ``go`` only when the
job's start is the same in everything torch's import could see, and never left behind. The agent runs here as a
real process in ``prepare`` mode, with the real torch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from loadscale import scaled

from clusterrun import remote
from clusterrun.agents import spec as specs
from clusterrun.inventory.models import Transport as TransportKind
from clusterrun.planning.plan import EnvVar, NodePlan
from clusterrun.remote import protocol, warm
from clusterrun.remote.protocol import frames

pytest.importorskip("torch")

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
HOOKS = "/runs/r1/n1/hooks"
WORKER = """\
import json, os, sys
keep = ("NCCL_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES", "WARM_TEST", "CLUSTERRUN_RUN_ID", "RANK")
with open(sys.argv[1], "w") as f:
    json.dump({"env": {k: os.environ.get(k) for k in keep}, "argv": sys.argv[1:], "cwd": os.getcwd()}, f)
"""


# ---------------------------------------------------------------- which differences keep it from being used


def test_the_same_environment_fits() -> None:
    env = {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/nccl/lib"}
    assert warm.unfit(env, dict(env), HOOKS) == []


def test_what_the_check_decides_may_change_by_go() -> None:
    """GPUs, NICs and clusterrun's own variables are read by the workers, NCCL and CUDA, not by torch's import."""
    before = {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_SOCKET_IFNAME": "eth0"}
    after = {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "4,5", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
             "NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5_0", "GLOO_SOCKET_IFNAME": "ib0",
             "CLUSTERRUN_CPU_BIND": "0-3/0", "CLUSTERRUN_STACKS": "/runs/r1/n1/stacks"}
    assert warm.unfit(before, after, HOOKS) == []


def test_the_hook_directory_may_lead_pythonpath_and_nothing_else_may_change_it() -> None:
    assert warm.unfit({}, {"PYTHONPATH": HOOKS}, HOOKS) == []
    assert warm.unfit({"PYTHONPATH": "/src"}, {"PYTHONPATH": f"{HOOKS}:/src"}, HOOKS) == []
    assert warm.unfit({"PYTHONPATH": "/src"}, {"PYTHONPATH": f"{HOOKS}:/other"}, HOOKS) == ["PYTHONPATH"]
    assert warm.unfit({}, {"PYTHONPATH": "/src"}, HOOKS) == ["PYTHONPATH"]


def test_anything_the_import_could_read_must_be_the_same() -> None:
    before = {"LD_LIBRARY_PATH": "/a", "TORCH_LOGS": "dynamo", "OMP_NUM_THREADS": "4"}
    after = {"LD_LIBRARY_PATH": "/b", "OMP_NUM_THREADS": "4", "LOGLEVEL": "DEBUG"}
    assert warm.unfit(before, after, HOOKS) == ["LD_LIBRARY_PATH", "LOGLEVEL", "TORCH_LOGS"]


def test_only_a_host_torchrun_job_is_warmed(tmp_path: Path) -> None:
    def node(argv: tuple[str, ...]) -> NodePlan:
        return NodePlan(name="n1", host="localhost", transport=TransportKind.ssh, node_rank=0, nproc_per_node=1,
                        rank_offset=0, gpus=(), python=sys.executable, argv=argv, cwd="", run_dir=str(tmp_path),
                        script="train.py", env=(EnvVar("NCCL_SOCKET_IFNAME", "eth1", "network"),), data_nic="eth1",
                        data_address="10.0.0.1")

    spec = specs.warm_spec(node((*TORCHRUN, "--nnodes", "2", "train.py")))
    assert spec == {"python": sys.executable, "env": {"NCCL_SOCKET_IFNAME": "eth1"}, "cwd": ""}
    assert specs.warm_spec(node(("/other/python", "-m", "torch.distributed.run", "train.py"))) is None
    assert specs.warm_spec(node(("bash", "train.sh"))) is None


# ---------------------------------------------------------------- the agent, for real


class Prepared:
    """One agent in ``prepare`` mode, fed commands one at a time."""

    def __init__(self, tmp_path: Path) -> None:
        self.run_id = f"warm-{uuid.uuid4().hex[:8]}"
        self.run_dir = tmp_path / "run"
        self.proc = subprocess.Popen(remote.argv(sys.executable, "agent", "prepare"), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def check(self, env: dict[str, str]) -> None:
        spec = protocol.CHECK.fill({"run_dir": str(self.run_dir), "cache": str(self.run_dir.parent / "cache"),
                                    "run_id": self.run_id, "node": "n1",
                                    "warm": {"python": sys.executable, "env": env}})
        self.send(f"check {protocol.encode_spec(spec)}")

    def warm_pid(self, timeout: float = 60.0) -> int:
        """The warm torchrun, once the agent has started it (its child, importing torch)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for pid in children(self.proc.pid):
                if "import torch.distributed.run" in cmdline(pid):
                    return pid
            time.sleep(0.05)
        raise AssertionError("no warm torchrun started at the check")

    def go(self, argv: list[str], env: dict[str, str]) -> list[dict]:
        spec = protocol.RUN.fill({"run_id": self.run_id, "node": "n1", "argv": argv, "env": env,
                                  "run_dir": str(self.run_dir), "heartbeat_timeout": 0.0})
        self.send(f"go {protocol.encode_spec(spec)}")
        deadline = time.monotonic() + scaled(120)
        while not (self.run_dir / "exit.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.end()

    def end(self) -> list[dict]:
        out, err = self.proc.communicate(timeout=scaled(60))
        assert b"Traceback" not in err, err.decode(errors="replace")
        return [f.event for f in frames([out])]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=scaled(10))


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True  # ended; its parent has not reaped it yet
        time.sleep(0.05)
    return False


@pytest.fixture
def agent(tmp_path: Path):
    prepared = Prepared(tmp_path)
    yield prepared
    prepared.kill()


def _job(tmp_path: Path) -> tuple[list[str], Path]:
    script, out = tmp_path / "worker.py", tmp_path / "seen.json"
    script.write_text(WORKER)
    return [*TORCHRUN, "--standalone", "--nproc-per-node", "1", str(script), str(out)], out


def test_a_fitting_job_runs_in_the_torchrun_started_at_the_check(agent: Prepared, tmp_path: Path) -> None:
    argv, out = _job(tmp_path)
    agent.check({"WARM_TEST": "planned", "NCCL_SOCKET_IFNAME": "eth0"})
    pid = agent.warm_pid()  # started before go: it imports torch while the launch goes on
    events = agent.go(argv, {"WARM_TEST": "planned", "NCCL_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": ""})
    started = next(e for e in events if e["ev"] == protocol.STARTED)
    assert started["warm"] is True and started["pid"] == pid and "cold" not in started
    assert started["since"] < started["time"]  # its torch import began at the check
    assert events[-1]["ev"] == protocol.EXIT and events[-1]["rc"] == 0, events[-3:]
    seen = json.loads(out.read_text())
    # The worker got the job's environment as sent at go, not the one planned before the check.
    assert seen["env"] == {"NCCL_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": "", "WARM_TEST": "planned",
                           "CLUSTERRUN_RUN_ID": agent.run_id, "RANK": "0"}
    assert seen["argv"] == [str(out)] and seen["cwd"] == str(agent.run_dir)


def test_a_job_whose_environment_differs_starts_cold_and_says_why(agent: Prepared, tmp_path: Path) -> None:
    argv, out = _job(tmp_path)
    agent.check({"WARM_TEST": "planned"})
    pid = agent.warm_pid()
    events = agent.go(argv, {"WARM_TEST": "changed", "LD_LIBRARY_PATH": "/opt/other"})
    started = next(e for e in events if e["ev"] == protocol.STARTED)
    assert started["warm"] is False and started["pid"] != pid
    assert started["cold"] == "the job's environment differs: LD_LIBRARY_PATH, WARM_TEST"
    assert gone(pid), "the unused warm torchrun was left running"
    assert events[-1]["rc"] == 0 and json.loads(out.read_text())["env"]["WARM_TEST"] == "changed"


def test_a_launch_that_ends_before_go_leaves_no_torchrun(agent: Prepared) -> None:
    agent.check({})
    pid = agent.warm_pid()
    agent.send("stop")
    events = agent.end()
    assert [e["ev"] for e in events] == ["ready"] and agent.proc.returncode == 0
    assert gone(pid), "the warm torchrun outlived its agent"


def test_a_killed_agent_takes_its_warm_torchrun_with_it(agent: Prepared) -> None:
    agent.check({})
    pid = agent.warm_pid()
    os.kill(agent.proc.pid, signal.SIGKILL)  # the agent alone, as the OOM killer would
    agent.proc.wait(timeout=scaled(10))
    assert gone(pid), "the warm torchrun outlived its SIGKILLed agent"
