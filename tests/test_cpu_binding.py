"""The workers' hook (clusterrun/remote/stackhook.py, installed as their sitecustomize) binds each local rank to
the CPUs and memory node CLUSTERRUN_CPU_BIND gives it, before the script runs; a binding that cannot be applied
is said on the rank's stderr and never stops it. Real processes, their affinity and memory policy read back."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from clusterrun import remote
from clusterrun.planning.plan import CPU_BIND_VAR

#: The child says where it may run and its memory policy (get_mempolicy: mode 1 is MPOL_PREFERRED).
REPORT = """
import ctypes, json, os, platform
mode, mask = ctypes.c_int(-1), ctypes.c_ulong(0)
number = {"x86_64": 239, "aarch64": 236}.get(platform.machine())
if number is not None:
    ctypes.CDLL(None).syscall(number, ctypes.byref(mode), ctypes.byref(mask), 65, None, 0)
print(json.dumps({"cpus": sorted(os.sched_getaffinity(0)), "mode": mode.value, "nodes": mask.value}))
"""
CPUS = sorted(os.sched_getaffinity(0))


def run_worker(tmp_path: Path, **env: str) -> tuple[dict, str]:
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(remote.source("stackhook"))
    done = subprocess.run([sys.executable, "-c", REPORT], capture_output=True, text=True, timeout=60, check=True,
                          env={**os.environ, "PYTHONPATH": str(hooks), **env})
    return json.loads(done.stdout), done.stderr


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="get_mempolicy's number is not known here")
def test_a_rank_runs_on_its_gpus_cpus_and_prefers_its_memory_node(tmp_path: Path) -> None:
    spec = f"{CPUS[0]}/0;{CPUS[-1]}/0"
    got, err = run_worker(tmp_path, LOCAL_RANK="1", **{CPU_BIND_VAR: spec})
    assert (got["cpus"], got["mode"], got["nodes"], err) == ([CPUS[-1]], 1, 1, "")


def test_only_workers_are_bound(tmp_path: Path) -> None:
    got, _ = run_worker(tmp_path, **{CPU_BIND_VAR: f"{CPUS[0]}/0"})  # torchrun itself has no LOCAL_RANK
    assert got["cpus"] == CPUS


def test_a_binding_to_cpus_the_rank_may_not_use_is_said_and_skipped(tmp_path: Path) -> None:
    got, err = run_worker(tmp_path, LOCAL_RANK="0", **{CPU_BIND_VAR: "4000-4001/0"})
    assert got["cpus"] == CPUS
    assert err == "clusterrun: local rank 0 not bound: none of CPUs 4000-4001 is allowed to it\n"


@pytest.mark.parametrize("spec", ["", ";", "x/y", "0-1/99"], ids=["empty", "no-entry", "garbage", "no-such-node"])
def test_a_binding_that_says_nothing_usable_leaves_the_rank_alone(tmp_path: Path, spec: str) -> None:
    got, err = run_worker(tmp_path, LOCAL_RANK="0", **{CPU_BIND_VAR: spec})
    assert got["cpus"] == CPUS and "Traceback" not in err
