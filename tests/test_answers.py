"""The node agent's answers read with their specs (clusterrun/remote/answers.py, remote/decode.py): every kind
decoded from what the agent sends, a missing required field or a wrong type named with the node and the field,
extra fields tolerated; the real agent's answers (its run, its ready check, its probes, ps) all fit their specs;
and an answer that does not fit ends that node's link with a reason, never a traceback."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from loadscale import scaled

from clusterrun import remote
from clusterrun.agents import spec as specs
from clusterrun.agents.link import AgentLink, answered, open_link, run_mode
from clusterrun.errors import ConnectError, ProtocolError
from clusterrun.remote import answers, protocol, session
from clusterrun.remote.decode import AnswerError, decode
from clusterrun.transport.base import Stream
from clusterrun.transport.local import LocalTransport

EXIT = {"rc": 1, "signal": None, "reason": "finished", "time": 1700000000.5,
        "ranks": {"4": {"rc": 3, "signal": None, "time": "2026-11-25_14:30:01", "root_cause": True, "started": 1.5},
                  "5": {"rc": None, "signal": None, "time": None, "started": 1.6}},
        "logs": {"4/stdout": {"bytes": 120, "sent": 120, "lines": 3}, "5/stderr": {"bytes": 0, "sent": 0, "lines": None}},
        "watch": {"sent": 10, "received": 9}, "gpus_after": None}
REPORT = {"python": "3.11.7", "executable": "/usr/bin/python3", "problems": [], "missing": ["ab12"], "no_torch": False,
          "torch": "2.13.0", "net": {"speeds": {}, "rdma": {}}, "gpus": 0, "gpu_model": None, "gpu": None,
          "leases": {}, "topology_addr": None, "master_port": 29500}

#: One event of every kind, as the agent (or the cluster supervisor, or clusterrun's reader) sends it.
GOOD: dict[str, dict[str, Any]] = {
    "started": {"pid": 4242, "time": 1700000000.25, "warm": True, "since": 1699999990.0},
    "out": {"rank": 5, "local_rank": 1, "stream": "stderr", "open": True, "n": 12},
    "launcher": {"text": "torchrun: starting"},
    "error": {"text": "cannot start torchrun: No such file", "time": 1.0},
    "stream_error": {"text": "Socket is closed"},
    "rank_failed": {"local_rank": 1, "time": 1.0, "rank": 5, "rc": 3, "signal": None},
    "pong": {},
    "watching": {"port": 41000, "address": "10.0.0.1", "nic": "eth1"},
    "path": {"peer": "n2", "address": "10.0.0.3", "nic": "eth1", "state": "lost", "since": 1.0, "answered": True,
             "time": 2.0},
    "load": {"cpu": {"4": 0.97, "5": 0.12}, "time": 1.0},
    "sample": {"t": 1000.5, "dt": 1.0, "nics": {"eth1": [10, 20]}, "load": 1.5, "gaps": {"gpus": "no nvidia-smi"}},
    "stack": {"rank": 4, "how": "py-spy", "pid": 77, "n": 10},
    "flight": {"rank": 4, "pid": 77, "why": None, "format": "json", "n": 2},
    "stacks_done": {"count": 2},
    "exit": EXIT,
    "ready": {"report": REPORT, "time": 1.0},
    "listening": {"port": 29500},
    "reached": {"tcp": "timed out after 3s", "ping": "failed"},
    "pinged": {"results": {"10.0.0.2": "ok"}, "missing": False},
    "pulling": {"image": "nvcr.io/nvidia/pytorch:24.01", "seconds": 30},
    "relayed": {},
    "going": {"time": 1.0},
    "swept": {"pids": [11, 12]},
    "alive": {"pids": [], "runs": {"r1": {"pids": [1], "nodes": ["n1"], "user": "ana", "since": 5.0}},
              "leases": {"gpus": {"0": {"run_id": "r1"}}, "ports": {}}},
    "log": {"rank": 2, "stream": "stdout", "bytes": 10_000, "lines": 1000, "from": 100, "skipped_bytes": 100,
            "skipped_lines": 10},
    "record": {"exit": {"ev": "exit", **EXIT}},  # the node's exit.json: its exit event
    "line": {"stream": "stdout", "text": "hello"},
    "file": {"path": "n1/rank0.log", "offset": 0, "whole": True, "n": 5},
    "supervisor": {"alive": True, "pid": 99, "asked": False},
}
WIRE_ONLY = {"n", "from"}  # on the wire, but no reader needs them


def _wrong(value: Any) -> Any:
    """A value of another JSON type than ``value``'s."""
    return {str: 7, bool: 1, int: "7", float: "7.5", dict: [1], list: {"a": 1}}[type(value)]


def test_every_kind_has_a_spec_and_a_good_event_here() -> None:
    assert set(GOOD) == set(answers.KINDS)


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_a_good_answer_decodes_to_its_typed_event(kind: str) -> None:
    sent = {"ev": kind, **GOOD[kind]}
    got = decode(sent, "n1")
    assert type(got) is answers.KINDS[kind] and got.ev == kind
    for field, value in sent.items():
        if field not in ("ev", *WIRE_ONLY) and not isinstance(value, dict):
            assert getattr(got, field) == value, field
    with pytest.raises(AttributeError):
        got.ev = "other"  # type: ignore[misc]  # immutable
    if got._fields:
        with pytest.raises(AttributeError):
            setattr(got, got._fields[0], None)


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_an_extra_field_is_tolerated_and_dropped(kind: str) -> None:
    sent = {"ev": kind, **GOOD[kind]}
    assert decode({**sent, "from_a_newer_agent": {"x": 1}}, "n1") == decode(sent, "n1")


@pytest.mark.parametrize(("kind", "field"), [(k, f) for k in sorted(GOOD) for f in answers.KINDS[k]._fields
                                              if f not in answers.KINDS[k]._field_defaults and f != "ev"])
def test_a_missing_required_field_is_named_with_the_node(kind: str, field: str) -> None:
    sent = {"ev": kind, **GOOD[kind]}
    del sent[field]
    with pytest.raises(AnswerError) as caught:
        decode(sent, "crn2")
    assert (caught.value.node, caught.value.kind, caught.value.field) == ("crn2", kind, field)
    assert str(caught.value).startswith(f"crn2: the node agent's '{kind}' event lacks '{field}'")


@pytest.mark.parametrize(("kind", "field"), [(k, f) for k in sorted(GOOD) for f, v in GOOD[k].items()
                                              if f not in WIRE_ONLY and v is not None])
def test_a_field_of_the_wrong_type_is_named_with_the_node(kind: str, field: str) -> None:
    if answers.KINDS[kind].__annotations__[field] == "Any":
        pytest.skip("any value fits")
    sent = {"ev": kind, **GOOD[kind], field: _wrong(GOOD[kind][field])}
    with pytest.raises(AnswerError) as caught:
        decode(sent, "crn2")
    assert (caught.value.node, caught.value.field) == ("crn2", field)
    assert f"has '{field}' " in str(caught.value)


def test_a_missing_optional_field_takes_its_default_and_a_mutable_one_is_not_shared() -> None:
    first, second = decode({"ev": "exit", "rc": 0}, "n1"), decode({"ev": "exit", "rc": 0}, "n1")
    assert (first.signal, first.reason, first.ranks, first.logs, first.watch) == (None, None, {}, {}, None)
    assert first.ranks is not second.ranks
    assert decode({"ev": "swept"}, "n1").pids is not decode({"ev": "swept"}, "n1").pids
    assert decode({"ev": "out", "rank": 0, "stream": "stdout"}, "n1") == answers.Out(0, "stdout", 0, False, False)


def test_nested_answers_are_decoded_and_their_fields_named_by_path() -> None:
    got = decode({"ev": "exit", **EXIT}, "n1")
    assert got.ranks["4"] == answers.RankReport(3, None, "2026-11-25_14:30:01", 1.5, True)
    assert got.logs["5/stderr"] == answers.LogSize(0, 0, None)
    ready = decode({"ev": "ready", **GOOD["ready"]}, "n1")
    assert isinstance(ready.report, answers.ReadyReport) and ready.report.master_port == 29500
    bad = json.loads(json.dumps(EXIT))
    bad["ranks"]["5"]["started"] = "soon"
    with pytest.raises(AnswerError, match=r"n1: the node agent's 'exit' event has 'ranks\.5\.started' str 'soon'"):
        decode({"ev": "exit", **bad}, "n1")
    with pytest.raises(AnswerError, match=r"'ready' event lacks 'report\.python'"):
        decode({"ev": "ready", "report": {k: v for k, v in REPORT.items() if k != "python"}}, "n1")
    with pytest.raises(AnswerError, match=r"has 'logs\.4/stdout' int 3, not object"):
        decode({"ev": "exit", "rc": 0, "logs": {"4/stdout": 3}}, "n1")


def test_json_types_as_the_wire_has_them() -> None:
    assert decode({"ev": "started", "pid": 1, "time": 17}, "n1").time == 17  # JSON writes 17.0 as 17
    with pytest.raises(AnswerError, match="'pid' bool True, not int"):
        decode({"ev": "started", "pid": True, "time": 1.0}, "n1")  # a bool is no int
    with pytest.raises(AnswerError, match="'open' int 1, not bool"):
        decode({"ev": "out", "rank": 0, "stream": "stdout", "open": 1}, "n1")


def test_an_unknown_kind_is_kept_as_sent_and_a_kind_that_is_no_string_is_an_error() -> None:
    assert decode({"ev": "newer", "x": 1}, "n1") == answers.Unknown("newer", {"ev": "newer", "x": 1})
    with pytest.raises(AnswerError, match="'ev' int 5, not str"):
        decode({"ev": 5}, "n1")
    with pytest.raises(AnswerError, match=r"'ev' list \[1\], not str"):
        decode({"ev": [1]}, "n1")  # unhashable: no look-up by it


def test_a_nodes_exit_record_is_read_with_the_exit_spec() -> None:
    assert decode({"ev": "record", "exit": {"ev": "exit", **EXIT}}, "n1").exit == decode({"ev": "exit", **EXIT}, "n1")
    with pytest.raises(AnswerError, match=r"n1: the node agent's 'record' event has 'exit' list \[\], not null or object"):
        decode({"ev": "record", "exit": []}, "n1")
    with pytest.raises(AnswerError, match=r"'record' event lacks 'exit\.rc'"):
        decode({"ev": "record", "exit": {"ev": "exit"}}, "n1")


# ---------------------------------------------------------------- the real agent's answers fit their specs

JOB = """
import os, sys, time
base = os.path.join(sys.argv[1], "torchrun", "r1", "attempt_0")
for local_rank in (0, 1):
    os.makedirs(os.path.join(base, str(local_rank)))
    with open(os.path.join(base, str(local_rank), "stdout.log"), "w") as fh:
        fh.write("rank %d says hello\\n" % local_rank)
print("torchrun-like line", flush=True)
time.sleep(1.0)  # long enough for the node's samples
"""


def test_every_answer_of_a_real_run_fits_its_spec(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    spec = protocol.RUN.fill({"run_id": "answers-1", "node": "n1", "argv": [sys.executable, "-c", JOB, str(run_dir)],
                              "run_dir": str(run_dir), "rank_offset": 4, "detached": True, "sample_every": 0.2,
                              "load_every": 0.2})
    with LocalTransport("n1") as transport:
        got = [f.event for f in answered("n1", [transport.run(
            remote.argv(sys.executable, "agent", "run", inline=True), timeout=120,
            stdin=(protocol.encode_spec(spec) + "\n").encode()).stdout.encode()])]
    kinds = {type(e) for e in got}
    assert {answers.Started, answers.Out, answers.Said, answers.Sample, answers.Exit} <= kinds, got
    assert answers.Unknown not in kinds
    end = got[-1]
    assert isinstance(end, answers.Exit) and end.rc == 0, got
    assert {k: (v.bytes, v.lines) for k, v in end.logs.items()} == {"4/stdout": (18, 1), "5/stdout": (18, 1)}
    assert {r.rank for r in got if isinstance(r, answers.Out)} == {4, 5}


def test_the_ready_check_and_the_path_probes_of_a_real_agent_fit_their_specs(tmp_path: Path) -> None:
    node = specs_node(tmp_path)
    with LocalTransport("n1") as transport:
        link = open_link(transport, node)
        try:
            link.check(specs.check_spec(str(tmp_path / "run"), cache=str(tmp_path / "cache"), hashes=["ab12"],
                                        port=None, choose_port=True, run_id="answers-2", node=node))
            ready = link.answer((session.READY, protocol.ERROR), time.monotonic() + scaled(60))
            assert isinstance(ready, answers.Ready), ready
            assert ready.report.python == sys.version.split()[0] and ready.report.missing == ["ab12"]
            assert isinstance(ready.report.master_port, int)
            held = link.ask(session.LISTEN, json.dumps({"port": 0}), (session.LISTENING,), 20)
            assert isinstance(held, answers.Listening) and held.port and held.error is None
            reached = link.ask(session.REACH, json.dumps({"address": "127.0.0.1", "port": held.port, "timeout": 2}),
                               (session.REACHED,), 20)
            assert reached == answers.Reached(None, None)
            pinged = link.ask(session.PING, json.dumps({"addresses": ["127.0.0.1"], "timeout": 2}),
                              (session.PINGED,), 20)
            assert isinstance(pinged, answers.Pinged) and (pinged.missing or pinged.results == {"127.0.0.1": "ok"})
        finally:
            link.abort()


def test_ps_of_a_real_agent_fits_its_spec() -> None:
    with LocalTransport("n1") as transport:
        got, res = run_mode(transport, sys.executable, protocol.PS, specs.ps_spec("", "n1"), timeout=60)
    alive = next(f.event for f in got if isinstance(f.event, answers.Alive))
    assert res.exit_code == 0 and isinstance(alive.leases, answers.Leases)
    assert all(isinstance(r, answers.RunProcs) for r in alive.runs.values())


def specs_node(tmp_path: Path) -> Any:
    from clusterrun.inventory.models import Transport as TransportKind
    from clusterrun.planning.plan import NodePlan

    return NodePlan(name="n1", host="localhost", transport=TransportKind.local, node_rank=0, nproc_per_node=1,
                    rank_offset=0, gpus=(), python=sys.executable, argv=("true",), cwd=str(tmp_path),
                    run_dir=str(tmp_path / "run"), script="true", env=(), data_nic=None, data_address="127.0.0.1")


# ---------------------------------------------------------------- an answer that does not fit: the node's failure


class Scripted(Stream):
    """A node's stream that says ``data`` and ends (or is dropped)."""

    def __init__(self, data: bytes, stderr: str = "") -> None:
        self.data, self.aborted, self._stderr = data, False, stderr

    def chunks(self):  # type: ignore[no-untyped-def]
        for i in range(0, len(self.data), 7):  # cut anywhere
            if self.aborted:
                return
            yield self.data[i:i + 7]

    def send(self, text: str) -> bool:
        return not self.aborted

    def wait(self, timeout: float) -> int | None:
        return None

    def abort(self) -> None:
        self.aborted = True

    def stderr_text(self) -> str:
        return self._stderr


def _items(link: AgentLink) -> list[Any]:
    out = []
    while True:
        item = link._answers.get(timeout=10)
        out.append(item)
        if not hasattr(item, "event"):
            return out


def test_a_malformed_answer_ends_the_link_with_a_reason_that_names_node_and_field() -> None:
    data = (protocol.encode({"ev": "out", "rank": 0, "stream": "stdout"}, b"fine\n")
            + protocol.encode({"ev": "exit", "rc": "0"}) + protocol.encode({"ev": "launcher", "text": "never read"}))
    stream = Scripted(data, stderr="Warning: Permanently added 'crn2'\n")
    link = AgentLink("crn2", stream)
    items = _items(link)
    assert [i.event.ev for i in items[:-1]] == ["out", "stream_error"]  # nothing after the bad one
    assert items[0].payload == b"fine\n"
    said = items[1].event.text
    assert said.startswith("crn2: the node agent's 'exit' event has 'rc' str '0', not int"), said
    assert stream.aborted and link.broken == said
    assert link.stderr_text().splitlines() == ["Warning: Permanently added 'crn2'", said]  # the supervisor's loss


def test_a_malformed_answer_before_the_job_is_a_connect_error_that_says_why() -> None:
    link = AgentLink("crn2", Scripted(protocol.encode({"ev": "ready", "report": {"python": 3}})))
    with pytest.raises(ConnectError, match=r"'ready' event has 'report\.python' int 3, not str"):
        link.answer((session.READY, protocol.ERROR), time.monotonic() + scaled(10))


def test_a_malformed_answer_of_a_mode_run_to_its_end_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match=r"^crn2: the node agent's 'swept' event has 'pids' object"):
        list(answered("crn2", [protocol.encode({"ev": "swept", "pids": {"a": 1}})]))


def test_the_agent_never_loads_the_answers_readers() -> None:
    # They need Python 3.10 (the cluster supervisor's); the agent runs on any 3.8+ and never reads answers.
    assert not {"answers", "decode"} & set(remote.AGENT_MODULES)
    for name in (*remote.AGENT_MODULES, "agent"):
        text = Path(remote.__file__).with_name(f"{name}.py").read_text(encoding="utf-8")
        assert "import answers" not in text and "import decode" not in text and "remote.answers" not in text, name
