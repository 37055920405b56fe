"""The node agent's side of the relay: rank files become whole records, fairly, and all of them at the end.

The agent's events go to a real file here (``clusterrun.remote.wire.OUT_FD``) and are read back with the
orchestrator's decoder, so both ends of the wire format are exercised.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterrun import remote
from clusterrun.remote import protocol, tailing
from clusterrun.remote import wire as agent_wire
from clusterrun.remote.protocol import Frame, frames


class Wire:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.read = 0

    def new(self) -> list[Frame]:
        data = self.path.read_bytes()[self.read:]
        self.read += len(data)
        return list(frames([data]))

    def outs(self) -> list[tuple[int, str, bytes, bool]]:
        return [(f.event["rank"], f.event["stream"], f.payload, f.event["open"]) for f in self.new()
                if f.event["ev"] == "out"]


@pytest.fixture
def wire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Wire]:
    path = tmp_path / "wire"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    monkeypatch.setattr(agent_wire, "OUT_FD", fd)
    monkeypatch.setattr(agent_wire, "_out_broken", False)
    try:
        yield Wire(path)
    finally:
        os.close(fd)


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def test_only_whole_records_leave_until_the_file_is_final(tmp_path: Path, wire: Wire) -> None:
    log = tmp_path / "stdout.log"
    _append(log, b"one\ntwo\nthr")
    f = tailing.RankFile(str(log), 3, 1, "stdout")
    f.pump()
    assert wire.outs() == [(3, "stdout", b"one\ntwo\n", False)]
    _append(log, b"ee\n\r 10%|bar|\r 20%|bar|")
    f.pump()
    assert wire.outs() == [(3, "stdout", b"three\n\r 10%|bar|\r", False)]
    f.pump(final=True)  # nothing new, and the writers are gone: the unfinished end goes too
    assert wire.outs() == [(3, "stdout", b" 20%|bar|", False)]
    assert (f.sent, f.lines) == (log.stat().st_size, 3)


def test_a_crlf_is_never_cut_between_its_two_bytes(tmp_path: Path, wire: Wire) -> None:
    log = tmp_path / "stdout.log"
    _append(log, b"windows line\r")
    f = tailing.RankFile(str(log), 0, 0, "stdout")
    f.pump()
    assert wire.outs() == []
    _append(log, b"\n")
    f.pump()
    assert wire.outs() == [(0, "stdout", b"windows line\r\n", False)]


def test_a_long_line_goes_out_in_open_pieces_and_the_other_stream_waits(tmp_path: Path, wire: Wire,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tailing, "MAX_RECORD", 1000)
    monkeypatch.setattr(tailing, "READ_CHUNK", 600)
    root = tmp_path / "torchrun" / "run" / "attempt_0" / "0"
    root.mkdir(parents=True)
    _append(root / "stdout.log", b"a" * 2500)
    _append(root / "stderr.log", b"")
    tailer = tailing.Tailer(str(tmp_path / "torchrun"), rank_offset=4)
    tailer._discover()
    for _ in range(3):
        tailer._round()
    _append(root / "stderr.log", b"warning\n")  # while stdout's line is open
    for _ in range(10):
        tailer._round()
    sent = wire.outs()
    assert [s for s in sent if s[1] == "stderr"] == []  # held: rank 4's log line belongs to stdout
    assert all(more for _r, stream, _d, more in sent if stream == "stdout")
    _append(root / "stdout.log", b"\n")
    for _ in range(10):
        tailer._round()
    sent += wire.outs()
    stdout = b"".join(d for _r, s, d, _m in sent if s == "stdout")
    assert stdout == b"a" * 2500 + b"\n"
    assert sent[-1] == (4, "stderr", b"warning\n", False)  # only after the long line ended
    assert [s for s in sent if s[1] == "stdout"][-1][3] is False


def test_a_flooding_rank_does_not_starve_the_others(tmp_path: Path, wire: Wire,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tailing, "READ_CHUNK", 1000)
    for local in (0, 1):
        d = tmp_path / "torchrun" / "run" / "attempt_0" / str(local)
        d.mkdir(parents=True)
        _append(d / "stdout.log", (b"x" * 99 + b"\n") * (1000 if local == 0 else 3))
    tailer = tailing.Tailer(str(tmp_path / "torchrun"), rank_offset=0)
    tailer._discover()
    tailer._round()
    assert {rank for rank, *_ in wire.outs()} == {0, 1}


def test_after_the_job_every_byte_goes_out_and_sizes_match(tmp_path: Path, wire: Wire) -> None:
    d = tmp_path / "torchrun" / "run" / "attempt_0" / "1"
    d.mkdir(parents=True)
    body = b"".join(f"line {i}\n".encode() for i in range(50_000)) + b"no newline at the end"
    _append(d / "stdout.log", body)
    tailer = tailing.Tailer(str(tmp_path / "torchrun"), rank_offset=8)
    tailer.stop_event.set()
    tailer.start()
    assert tailer.done.wait(30)
    assert b"".join(data for *_, data, _m in wire.outs()) == body
    assert tailer.sizes() == {"9/stdout": {"bytes": len(body), "sent": len(body), "lines": 50_000}}


def _run_collect(spec: dict) -> list[Frame]:
    done = subprocess.run([sys.executable, str(remote.path("agent")), "collect"], capture_output=True, timeout=60,
                          input=(protocol.encode_spec(spec) + "\n").encode(), check=True)
    return list(frames([done.stdout]))


def test_collect_sends_from_the_offset_and_cuts_old_lines_at_a_line_start(tmp_path: Path) -> None:
    d = tmp_path / "run" / "torchrun" / "x" / "attempt_0" / "0"
    d.mkdir(parents=True)
    lines = [f"line {i:04d}\n".encode() for i in range(1000)]  # 10 bytes each
    _append(d / "stdout.log", b"".join(lines))
    spec = {"run_id": "none-such", "node": "n", "run_dir": str(tmp_path / "run"), "rank_offset": 2,
            "sweep": False, "skip": {"2/stdout": 100}, "max_bytes": 10**6}
    got = _run_collect(spec)
    log = next(f.event for f in got if f.event["ev"] == "log")
    assert log == {"ev": "log", "rank": 2, "stream": "stdout", "bytes": 10_000, "lines": 1000, "from": 100,
                   "skipped_bytes": 0, "skipped_lines": 0}
    assert b"".join(f.payload for f in got if f.event["ev"] == "out") == b"".join(lines[10:])
    got = _run_collect({**spec, "max_bytes": 995})  # not a whole number of lines: start at the next line
    log = next(f.event for f in got if f.event["ev"] == "log")
    assert (log["from"], log["skipped_bytes"], log["skipped_lines"]) == (9010, 8910, 891)
    assert b"".join(f.payload for f in got if f.event["ev"] == "out") == b"".join(lines[901:])
