"""The node agent's contract: each mode's spec is defined once (remote/protocol.py), the node fills what is missing
from the same defaults clusterrun sends, refuses a spec that does not fit with an error event (never a traceback),
and every mode, ``sweep`` and ``ps`` included, answers in protocol events. The agent runs here as a real process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from loadscale import scaled
from procs import wait_no_processes

from clusterrun import remote
from clusterrun.agents import spec as specs
from clusterrun.agents.sweep import ps, sweep
from clusterrun.cli.runs_cmd import down
from clusterrun.cli.up_cmd import up
from clusterrun.inventory.models import Transport as TransportKind
from clusterrun.launch.settings import SupervisorSettings
from clusterrun.planning.plan import EnvVar, NodePlan
from clusterrun.remote import job, protocol
from clusterrun.remote.protocol import Frame, FrameDecoder, frames
from clusterrun.transport.local import LocalTransport


def _agent(mode: str, stdin: bytes, *, inline: bool = False, timeout: float = 60) -> tuple[int, list[Frame], str]:
    done = subprocess.run(remote.argv(sys.executable, "agent", mode, inline=inline), input=stdin, capture_output=True,
                          timeout=timeout)
    return done.returncode, list(frames([done.stdout])), done.stderr.decode(errors="replace")


def _line(spec: dict) -> bytes:
    return (protocol.encode_spec(spec) + "\n").encode()


def _option_default(command, name: str) -> float:
    return next(p.default for p in command.params if p.name == name)


def _node(tmp_path: Path) -> NodePlan:
    return NodePlan(name="n1", host="localhost", transport=TransportKind.local, node_rank=0, nproc_per_node=2,
                    rank_offset=4, gpus=(), python=sys.executable, argv=("true",), cwd=str(tmp_path),
                    run_dir=str(tmp_path / "run"), script="true", env=(EnvVar("SECRET_TOKEN", "s3cret", "--env"),),
                    data_nic="eth1", data_address="10.0.0.1")


# ---------------------------------------------------------------- one set of defaults


def test_a_run_spec_without_grace_gets_the_grace_that_up_sends_by_default() -> None:
    sent_by_default = _option_default(up, "grace")
    on_node = job.Agent(protocol.decode_spec(protocol.RUN, protocol.encode_spec(
        {"run_id": "r", "argv": ["true"], "run_dir": "/tmp/x"})))
    assert on_node.grace == sent_by_default == protocol.GRACE


def test_sweep_and_collect_specs_without_grace_get_the_grace_of_down() -> None:
    down_default = _option_default(down, "grace")
    assert protocol.SWEEP.fill({"run_id": "r"})["grace"] == down_default
    assert protocol.COLLECT.fill({"run_id": "r", "run_dir": "/x"})["grace"] == down_default


def test_a_watch_without_interval_gets_the_supervisors_interval_and_dead_after() -> None:
    settings = SupervisorSettings()
    watch = protocol.RUN.fill({"run_id": "r", "argv": ["true"], "run_dir": "/x", "watch": {"address": "10.0.0.1"}})
    assert (watch["watch"]["interval"], watch["watch"]["dead_after"]) == (settings.watch_interval,
                                                                          settings.watch_dead_after)


def test_the_spec_clusterrun_builds_is_the_spec_the_node_runs(tmp_path: Path) -> None:
    built = specs.run_spec(_node(tmp_path), "r1", grace=3.0, heartbeat_timeout=15.0, stage=[("a", "b", "file")],
                           script_args=1, stacks=True, flight=True, load_every=3.0, watch_interval=0.5,
                           sample_every=1.0)
    assert protocol.decode_spec(protocol.RUN, protocol.encode_spec(built)) == built  # nothing added, nothing lost
    assert built["watch"] == {"address": "10.0.0.1", "nic": "eth1", "interval": 0.5, "dead_after": 5.0}
    assert built["stacks"]["flight"] is True and built["stacks"]["hook"] == remote.source("stackhook")
    plain = specs.run_spec(_node(tmp_path), "r1", grace=3.0, heartbeat_timeout=15.0)
    assert (plain["watch"], plain["stacks"], plain["load_every"], plain["sample_every"]) == (None, None, 0.0, 0.0)
    assert built["sample_every"] == 1.0


def test_every_mode_is_started_with_its_spec_on_stdin_never_in_argv(tmp_path: Path) -> None:
    for mode in ("run", "exec", "collect", "sweep", "ps"):
        argv = remote.argv(sys.executable, "agent", mode, inline=True)
        assert argv[-1] == mode and not any("s3cret" in a or "SECRET_TOKEN" in a for a in argv)


# ---------------------------------------------------------------- sweep and ps answer in events


@pytest.fixture
def marked_sleep() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A process of a run (it carries the run's and the node's markers), as torchrun's workers do."""
    run_id = f"contract-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "CLUSTERRUN_RUN_ID": run_id, "CLUSTERRUN_NODE": "n1"}
    proc = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    try:
        yield run_id, proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.mark.parametrize("inline", [False, True], ids=["file", "inline"])
def test_ps_and_sweep_answer_in_protocol_events(marked_sleep: tuple[str, subprocess.Popen[bytes]],
                                                inline: bool) -> None:
    run_id, proc = marked_sleep
    rc, got, err = _agent("ps", _line({"run_id": run_id, "node": "n1"}), inline=inline)
    assert rc == 0, err
    assert [f.event for f in got] == [{"ev": protocol.ALIVE, "pids": [proc.pid]}]
    rc, got, _ = _agent("ps", _line({"run_id": run_id, "node": "another-node"}), inline=inline)
    assert [f.event for f in got] == [{"ev": protocol.ALIVE, "pids": []}]  # two inventory nodes on one machine
    rc, got, err = _agent("sweep", _line({"run_id": run_id, "node": "n1", "grace": 1.0}), inline=inline)
    assert rc == 0, err
    assert [f.event for f in got] == [{"ev": protocol.SWEPT, "pids": [proc.pid]}]
    assert proc.wait(10) == -signal.SIGTERM
    assert wait_no_processes(run_id) == []


def test_clusterrun_reads_sweep_and_ps_through_the_protocol(marked_sleep: tuple[str, subprocess.Popen[bytes]]) -> None:
    run_id, proc = marked_sleep
    with LocalTransport("n1") as transport:
        assert ps(transport, python=sys.executable, run_id=run_id, node="n1") == [proc.pid]
        assert sweep(transport, python=sys.executable, run_id=run_id, node="n1", grace=1.0) == [proc.pid]
        assert ps(transport, python=sys.executable, run_id=run_id, node="n1") == []
    assert proc.wait(10) == -signal.SIGTERM


# ---------------------------------------------------------------- a spec that does not fit


@pytest.mark.parametrize(("mode", "spec", "says"), [
    ("sweep", {"run_id": "r", "gracee": 1}, "unknown key(s) in the sweep spec: 'gracee'"),
    ("ps", {"node": "n1"}, "the ps spec lacks 'run_id'"),
    ("collect", {"run_id": "r", "run_dir": "/x", "max_bytes": "lots"}, "'max_bytes' must be int, not str"),
    ("exec", {"command": "true", "timeout": True}, "'timeout' must be float, not bool"),
    ("run", {"run_id": "r", "argv": ["true"], "run_dir": "/x", "watch": {"adress": "10.0.0.1"}},
     "unknown key(s) in the watch spec: 'adress'"),
])
def test_a_spec_that_does_not_fit_gets_an_error_event_not_a_traceback(mode: str, spec: dict, says: str) -> None:
    rc, got, err = _agent(mode, _line(spec))
    assert rc == 2 and "Traceback" not in err
    assert got[0].event["ev"] == protocol.ERROR and says in got[0].event["text"], got
    if mode == "run":  # a run also ends, with the reason, so clusterrun's supervisor records why
        assert [f.event["ev"] for f in got] == [protocol.ERROR, protocol.EXIT]
        assert got[1].event["rc"] == 2 and says in got[1].event["reason"]
    else:
        assert len(got) == 1


def test_a_spec_that_is_not_base64_json_or_missing_is_refused_clearly() -> None:
    rc, got, err = _agent("sweep", b"not a spec\n")
    assert rc == 2 and "Traceback" not in err
    assert [f.event["ev"] for f in got] == [protocol.ERROR] and "not base64 JSON" in got[0].event["text"]
    rc, got, _ = _agent("ps", b"")
    assert rc == 2 and "no ps spec" in got[0].event["text"]


def test_prepare_refuses_a_bad_check_and_a_bad_go_with_error_events(tmp_path: Path) -> None:
    check = protocol.encode_spec({"run_dir": str(tmp_path), "cache": str(tmp_path / "c"), "porrt": 1})
    go = protocol.encode_spec({"run_id": "r", "argv": ["true"], "run_dir": str(tmp_path), "grace": "soon"})
    proc = subprocess.Popen(remote.argv(sys.executable, "agent", "prepare", inline=False), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(f"check {check}\nping\ngo {go}\n".encode(), timeout=60)
    got = [f.event for f in frames([out])]
    assert [e["ev"] for e in got] == [protocol.ERROR, protocol.PONG, protocol.ERROR, protocol.EXIT], got
    assert "unknown key(s) in the check spec: 'porrt'" in got[0]["text"]
    assert "'grace' must be float" in got[2]["text"] and proc.returncode == 2 and b"Traceback" not in err


def test_a_run_without_optional_keys_runs_with_the_defaults(tmp_path: Path) -> None:
    """Only the required keys: the node fills the rest and the job runs to its exit event."""
    spec = {"run_id": f"contract-{uuid.uuid4().hex[:8]}", "argv": ["sh", "-c", "exit 3"], "run_dir": str(tmp_path)}
    # clusterrun stays (stdin open) until the job's exit event: a closed stdin is clusterrun gone, which stops the
    # job, and on a busy machine that could come before the job's own exit.
    proc = subprocess.Popen(remote.argv(sys.executable, "agent", "run"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(_line(spec))
    proc.stdin.flush()
    decoder, got = FrameDecoder(), []
    try:
        for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
            got += decoder.feed(chunk)
            if any(f.event.get("ev") == protocol.EXIT for f in got):
                break
    finally:
        proc.stdin.close()
        rc = proc.wait(timeout=scaled(60))
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    assert rc == 0, err
    kinds = [f.event["ev"] for f in got]
    assert kinds[0] == protocol.STARTED and kinds[-1] == protocol.EXIT and got[-1].event["rc"] == 3, got
