"""The agent's wire format read back: events and payloads survive any cutting of the byte stream."""

from __future__ import annotations

import json

import pytest

from clusterrun.remote.protocol import MAX_HEADER, Frame, FrameDecoder, frames


def _encode(event: dict, payload: bytes = b"") -> bytes:
    if payload:
        event = {**event, "n": len(payload)}
    return json.dumps(event).encode() + b"\n" + payload


STREAM = b"".join([
    _encode({"ev": "started", "pid": 7}),
    _encode({"ev": "out", "rank": 0, "stream": "stdout"}, b"line one\nline two\n"),
    b"Traceback (most recent call last): not an event\n",
    _encode({"ev": "out", "rank": 1, "stream": "stderr"}, b'{"ev": "exit"}\n\r50%|bar|\r'),  # looks like events
    _encode({"ev": "exit", "rc": 0}),
])
EXPECTED = [
    Frame({"ev": "started", "pid": 7}),
    Frame({"ev": "out", "rank": 0, "stream": "stdout", "n": 18}, b"line one\nline two\n"),
    Frame({"ev": "launcher", "text": "Traceback (most recent call last): not an event"}),
    Frame({"ev": "out", "rank": 1, "stream": "stderr", "n": 25}, b'{"ev": "exit"}\n\r50%|bar|\r'),
    Frame({"ev": "exit", "rc": 0}),
]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, len(STREAM)])
def test_frames_are_the_same_however_the_stream_is_cut(size: int) -> None:
    chunks = [STREAM[i:i + size] for i in range(0, len(STREAM), size)]
    assert list(frames(chunks)) == EXPECTED


def test_a_payload_cut_by_the_end_of_the_stream_is_marked() -> None:
    data = _encode({"ev": "out", "rank": 0, "stream": "stdout"}, b"0123456789\n")
    decoder = FrameDecoder()
    assert decoder.feed(data[:-4]) == []
    assert decoder.close() == [Frame({"ev": "out", "rank": 0, "stream": "stdout", "n": 11, "cut": True}, b"0123456")]


def test_an_unfinished_text_line_at_the_end_is_kept() -> None:
    assert list(frames([b"bash: python3: command not found"])) == [
        Frame({"ev": "launcher", "text": "bash: python3: command not found"})]


def test_a_json_line_that_is_not_an_event_is_text() -> None:
    assert list(frames([b'{"loss": 0.5}\n[1, 2]\n'])) == [
        Frame({"ev": "launcher", "text": '{"loss": 0.5}'}), Frame({"ev": "launcher", "text": "[1, 2]"})]


def test_endless_text_without_newline_is_passed_on_in_bounded_pieces() -> None:
    decoder = FrameDecoder()
    got = []
    for _ in range(3):
        got += decoder.feed(b"x" * (MAX_HEADER // 2 + 1))
    assert len(got) == 1 and got[0].event["ev"] == "launcher" and len(got[0].event["text"]) > MAX_HEADER
