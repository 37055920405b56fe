"""The node agent's image check (clusterrun/remote/containers.py) on bad input: each problem is one sentence that
says what to do, every question to the runtime is bounded, and nothing is left running."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from clusterrun.remote import containers

CONF = '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n'


def spec(runtime: str = "podman", image: str = "localhost/clusterrun-no-such-image:1", pull: str = "never",
         mounts: tuple[str, ...] = ()) -> dict:
    return {"runtime": runtime, "image": image, "head": [runtime, "run", "--rm"], "options": [],
            "labels": {"clusterrun.run": "check-test", "clusterrun.node": "n1"}, "env": {}, "mounts": list(mounts),
            "pull": pull}


def test_a_runtime_the_node_lacks_is_named() -> None:
    got = containers.check(spec(runtime="no-such-runtime-xyz"), "python3", dict(os.environ))
    assert got["problems"] == ["the container runtime 'no-such-runtime-xyz' is not installed on this node; install "
                               "it, or set container.runtime to one the node has (docker, podman, apptainer)"]


def test_a_runtime_that_hangs_costs_its_bound_and_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for a runtime whose daemon does not answer (a real one cannot be made to hang on cue).
    stuck = tmp_path / "docker"
    stuck.write_text("#!/bin/sh\nexec sleep 60\n")
    stuck.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(containers, "ASK_TIMEOUT", 1.0)
    started = time.monotonic()
    got = containers.check(spec(runtime="docker"), "python3", dict(os.environ))
    assert time.monotonic() - started < 10
    assert got["problems"] == ["`docker` did not answer within 1s (a stuck daemon?); restart docker there"]


@pytest.mark.skipif(shutil.which("podman") is None or shutil.which("runc") is None, reason="needs podman and runc")
def test_a_missing_image_with_pull_never_and_a_missing_mount_source_fail_at_once(tmp_path: Path) -> None:
    (tmp_path / "containers.conf").write_text(CONF)
    env = {**os.environ, "CONTAINERS_CONF": str(tmp_path / "containers.conf")}
    started = time.monotonic()
    got = containers.check(spec(mounts=(f"{tmp_path}/absent:/data:ro",)), "python3", env)
    assert time.monotonic() - started < 30
    assert got["problems"] == [
        f"the mount source {tmp_path}/absent does not exist on this node; create it there or remove "
        f"'{tmp_path}/absent:/data:ro' from container.mounts",
        "the image localhost/clusterrun-no-such-image:1 is not on this node (container.pull: never); pull or load it "
        "there",
    ]


@pytest.mark.skipif(shutil.which("podman") is None or shutil.which("runc") is None, reason="needs podman and runc")
def test_an_image_no_registry_has_is_refused_without_a_pull_loop(tmp_path: Path) -> None:
    (tmp_path / "containers.conf").write_text(CONF)
    env = {**os.environ, "CONTAINERS_CONF": str(tmp_path / "containers.conf")}
    started = time.monotonic()
    got = containers.check(spec(image="localhost:1/clusterrun-no-such-image:1", pull="missing"), "python3", env)
    assert time.monotonic() - started < 60
    (problem,) = got["problems"]
    assert problem.startswith("cannot pull localhost:1/clusterrun-no-such-image:1: ")
    assert problem.endswith("check the image name, or put the image on the node and set container.pull: never")


def test_a_long_pull_says_it_goes_on_and_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    # A stand-in for a registry that is slow: the pull takes 30 s unless it is stopped.
    slow = tmp_path / "docker"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(containers, "PULL_REPORT", 0.5)
    monkeypatch.setattr(containers, "PULL_TIMEOUT", 2.0)
    started = time.monotonic()
    code, _ = containers._pull("docker", "ghcr.io/acme/train:1.4", dict(os.environ))
    assert code is None and time.monotonic() - started < 10
    said = [json.loads(line) for line in capfdbinary.readouterr().out.splitlines()]
    assert len(said) >= 2
    assert all(e["ev"] == containers.PULLING and e["image"] == "ghcr.io/acme/train:1.4" for e in said)
