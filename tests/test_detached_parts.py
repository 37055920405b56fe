"""The parts of a detached run's supervision, each on its own: the bundle that takes clusterrun's supervisor to a
node, the handshake that moves an agent to it, how its record ends, and the mirror of that record here."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from clusterrun.detached.host import final_record
from clusterrun.launch.phase import STOP_SIGNAL
from clusterrun.remote import bundle, mirror, protocol, relay, wire
from clusterrun.remote.protocol import frames
from clusterrun.runs import RunDir, RunRecord, RunState
from clusterrun.runs.judge import Failure

BLOCKED = ("pydantic", "pydantic_core", "click", "rich", "paramiko", "yaml", "torch")
# Put in front of the loader: a node that has none of clusterrun's dependencies (nor torch).
BLOCKER = ("import sys\nclass _Blocked:\n    def find_spec(self, name, path=None, target=None):\n"
           f"        if name.split('.')[0] in {BLOCKED!r}:\n            raise ImportError('not on this node: ' + name)\n"
           "sys.meta_path.insert(0, _Blocked())\n")


def _run_bundle(tmp_path: Path, spec_line: bytes, entry: str = bundle.SUPERVISOR_MODULES[0]) -> subprocess.CompletedProcess:
    argv = bundle.argv(sys.executable, entry)
    argv[3] = BLOCKER + argv[3]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([*argv[:2], "-I", *argv[2:]], input=bundle.payload().encode() + b"\n" + spec_line + b"\n",
                          capture_output=True, cwd=tmp_path, env=env, timeout=60, check=False)


def test_the_supervisor_loads_from_its_bundle_without_clusterruns_dependencies(tmp_path: Path) -> None:
    # -I: no site, no user site, nothing of this checkout on the path; the blocker refuses pydantic & co. The
    # supervisor still starts, and answers a spec it cannot read with an error event.
    done = _run_bundle(tmp_path, base64.b64encode(b"not json"))
    assert done.returncode == 2, done.stderr.decode()[-3000:]
    events = [f.event for f in frames([done.stdout])]
    assert events and events[0]["ev"] == protocol.ERROR and "not base64 JSON" in events[0]["text"], events


def test_an_old_python_is_refused_with_a_sentence() -> None:
    assert "sys.version_info < (3, 10)" in bundle.LOADER and "needs Python 3.10 or newer" in bundle.LOADER


def _handshake(secret_agent: str, secret_supervisor: str, node: str = "node1",
               expected: tuple[str, ...] = ("node0", "node1")) -> tuple[object, object]:
    a, b = socket.socketpair()
    results: dict[str, object] = {}

    def supervisor() -> None:
        try:
            results["supervisor"] = relay.supervisor_side(b, secret_supervisor, "run-1", set(expected))
        except relay.HandshakeError as exc:
            results["supervisor"] = exc

    thread = threading.Thread(target=supervisor)
    thread.start()
    try:
        relay.agent_side(a, secret_agent, "run-1", node)
        results["agent"] = "ok"
    except relay.HandshakeError as exc:
        results["agent"] = exc
    thread.join(10)
    a.close()
    b.close()
    return results["agent"], results["supervisor"]


def test_the_handshake_proves_the_secret_both_ways() -> None:
    agent, supervisor = _handshake("s" * 64, "s" * 64)
    assert (agent, supervisor) == ("ok", "node1")


@pytest.mark.parametrize(("agent_secret", "node", "agent_says"), [
    ("x" * 64, "node1", "refused this node: wrong proof"),
    ("s" * 64, "node9", "refused this node: node 'node9' is not part of run run-1"),
])
def test_the_handshake_refuses_a_wrong_secret_or_node(agent_secret: str, node: str, agent_says: str) -> None:
    agent, supervisor = _handshake(agent_secret, "s" * 64, node=node)
    assert isinstance(agent, relay.HandshakeError) and agent_says in str(agent)
    assert isinstance(supervisor, relay.HandshakeError)


def test_a_supervisor_that_does_not_know_the_secret_is_refused_by_the_agent() -> None:
    a, b = socket.socketpair()

    def impostor() -> None:  # knows the run id, not the secret: answers ok with a made-up proof
        relay.write_line(b, {"hello": "clusterrun-supervisor", "run": "run-1", "nonce": "00"})
        relay.read_line(b)
        relay.write_line(b, {"ok": True, "proof": "0" * 64})

    thread = threading.Thread(target=impostor)
    thread.start()
    with pytest.raises(relay.HandshakeError, match="did not prove"):
        relay.agent_side(a, "s" * 64, "run-1", "node1")
    thread.join(10)


def _record(failure: Failure | None) -> RunRecord:
    return RunRecord("run-1", RunState.failed if failure else RunState.interrupted, started=1.0, ended=2.0,
                     exit_code=failure.exit_code if failure else 128 + STOP_SIGNAL, first_failure=failure)


def test_a_run_stopped_by_down_is_recorded_stopped_and_by_whom(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    (tmp_path / "stop-request.json").write_text(json.dumps({"by": "clusterrun down (ann@laptop)"}))
    record = final_record(_record(None), run, STOP_SIGNAL)
    assert (record.state, record.stopped_by, record.exit_code, record.detached) == (
        RunState.stopped, "clusterrun down (ann@laptop)", 128 + signal.SIGTERM, True)


def test_a_down_after_a_failure_keeps_the_failure(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    failure = Failure("node1", 1, 3, None, "exited while others ran")
    record = final_record(_record(failure), run, STOP_SIGNAL)
    assert (record.state, record.first_failure, record.exit_code) == (RunState.failed, failure, 3)
    assert record.stopped_by == "clusterrun down"


def test_a_run_that_ended_by_itself_says_nothing_of_a_stop(tmp_path: Path) -> None:
    record = final_record(RunRecord("run-1", RunState.succeeded, exit_code=0), RunDir(tmp_path), None)
    assert (record.state, record.stopped_by) == (RunState.succeeded, None)


def _mirror(folder: Path, have: dict[str, int], out: Path, monkeypatch: pytest.MonkeyPatch) -> list:
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    monkeypatch.setattr(wire, "OUT_FD", fd)
    try:
        spec = protocol.MIRROR.fill({"run_id": "run-1", "node": "node0/supervisor", "dir": str(folder),
                                     "have": have})
        assert mirror.mirror(spec) == 0
    finally:
        os.close(fd)
    return list(frames([out.read_bytes()]))


def test_the_mirror_mode_sends_logs_past_what_is_here_and_every_other_file_whole(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "record"
    (record / "node0").mkdir(parents=True)
    (record / "status.json").write_text('{"state": "running"}\n')
    (record / "node0" / "rank0.log").write_bytes(b"line 1\nline 2\nhalf a li")
    (record / "supervisor.pid").write_text(f"{os.getpid()}\n")  # not a supervisor: no run marker
    got = _mirror(record, {"node0/rank0.log": [7, mirror.digest(b"line 1\n")]}, tmp_path / "out", monkeypatch)
    files = {f.event["path"]: f for f in got if f.event["ev"] == mirror.FILE}
    assert files["status.json"].payload == b'{"state": "running"}\n' and files["status.json"].event["whole"]
    # The supervisor is gone (no process carries its markers): the unfinished line comes too.
    assert files["node0/rank0.log"].payload == b"line 2\nhalf a li" and files["node0/rank0.log"].event["offset"] == 7
    assert "supervisor.pid" not in files
    assert got[-1].event == {"ev": mirror.SUPERVISOR, "alive": False, "pid": None, "asked": False}
    # A log that begins otherwise than the caller's copy (a restart's new attempt) comes again from its start.
    again = _mirror(record, {"node0/rank0.log": [7, mirror.digest(b"other 1\n")]}, tmp_path / "out", monkeypatch)
    log = next(f for f in again if f.event.get("path") == "node0/rank0.log")
    assert log.event["offset"] == 0 and log.payload == b"line 1\nline 2\nhalf a li"


def test_the_mirror_here_appends_at_the_offset_and_keeps_the_launch_timeline(tmp_path: Path) -> None:
    from clusterrun.ops.mirror import _write

    run = RunDir(tmp_path)
    (tmp_path / "status.json").write_text(json.dumps({"state": "detached", "nodes": {
        "node0": {"timeline": {"connect": {"start": 1.0, "end": 1.2}}}}}))
    theirs = {"state": "running", "nodes": {"node0": {"timeline": {"go": {"start": 2.0, "end": 2.1}}}}}
    assert _write(run, "status.json", 0, True, json.dumps(theirs).encode())
    merged = json.loads((tmp_path / "status.json").read_text())
    assert merged["state"] == "running" and set(merged["nodes"]["node0"]["timeline"]) == {"connect", "go"}
    assert _write(run, "node0/rank0.log", 0, False, b"a\n")
    assert _write(run, "node0/rank0.log", 2, False, b"b\n")
    assert _write(run, "node0/rank0.log", 2, False, b"b\n")  # the same bytes again: never a line twice
    assert (tmp_path / "node0" / "rank0.log").read_bytes() == b"a\nb\n"
    assert not _write(run, "../escape.log", 0, False, b"x")  # only paths inside the run directory
    assert not _write(run, "plan.json", 0, True, b"{}")  # this machine's plan stays


@pytest.mark.parametrize("inventory", sorted(p.name for p in (Path(__file__).parent.parent / "inventories").glob("*.yaml")))
@pytest.mark.parametrize("first", [0, 2])
def test_a_restart_on_the_serialized_plan_is_the_planners(inventory: str, first: int) -> None:
    # A detached run's supervisor restarts the job from the plan it was given (it has no inventory, no planner):
    # the same plan as the planner's for that attempt, whichever attempt it starts from.
    import dataclasses

    from clusterrun.inventory.yaml_source import load_inventory
    from clusterrun.planning.plan import JobSpec, build_plan
    from clusterrun.planning.planfile import LaunchPlan

    inv = load_inventory(Path(__file__).parent.parent / "inventories" / inventory)
    job = JobSpec(script="train.py", run_id="20261127-101500-abcd", args=("--lr", "0.1"), restarts=3)
    given = LaunchPlan.from_dict(build_plan(inv, dataclasses.replace(job, attempt=first)).to_dict(secrets=True))
    for attempt in (first + 1, first + 2):
        want = build_plan(inv, dataclasses.replace(job, attempt=attempt))
        got = given.for_attempt(attempt)
        assert got.to_dict(secrets=True) == want.to_dict(secrets=True)
