"""Reading the node agent's output: events, some followed by a raw payload.

The format is defined with the agent (:mod:`clusterrun.launch.node_agent`, "The wire protocol"): one JSON
object per line; an object with ``"n": N`` is followed by exactly N bytes that belong to it. A line that is
not a JSON object (a traceback of a Python too old for the agent, a shell's complaint) becomes a
``launcher`` event with that text, so nothing the node says is dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

MAX_HEADER = 1 << 20  # a "line" longer than this with no newline is not an event header: pass it on as text


@dataclass(frozen=True)
class Frame:
    event: dict[str, Any]
    payload: bytes = b""


class FrameDecoder:
    """Turns the agent's byte stream, cut anywhere, into frames in order. Holds at most one unfinished frame."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._need: int | None = None  # payload bytes still missing for ``_event``
        self._event: dict[str, Any] | None = None
        self._payload: list[bytes] = []

    def feed(self, data: bytes) -> list[Frame]:
        frames: list[Frame] = []
        pos, size = 0, len(data)
        while pos < size:
            if self._need is not None:
                take = data[pos:pos + self._need]
                self._payload.append(take)
                self._need -= len(take)
                pos += len(take)
                if self._need == 0:
                    assert self._event is not None
                    payload = self._payload[0] if len(self._payload) == 1 else b"".join(self._payload)
                    frames.append(Frame(self._event, payload))
                    self._need, self._event, self._payload = None, None, []
                continue
            end = data.find(b"\n", pos)
            if end < 0:
                self._buf += data[pos:]
                pos = size
                if len(self._buf) > MAX_HEADER:
                    frames.append(_text(bytes(self._buf)))
                    self._buf.clear()
                continue
            line = bytes(self._buf) + data[pos:end] if self._buf else data[pos:end]
            self._buf.clear()
            pos = end + 1
            frame = _header(line)
            length = frame.event.get("n") if frame.event.get("ev") != "launcher" else None
            if isinstance(length, int) and length > 0:
                self._event, self._need = frame.event, length
            else:
                frames.append(frame)
        return frames

    def close(self) -> list[Frame]:
        """What is left when the stream ends: an unfinished line as text, an unfinished payload as it is.

        A cut payload is returned with ``"cut": true`` in its event, so the caller can count it as incomplete.
        """
        frames: list[Frame] = []
        if self._need is not None and self._event is not None:
            frames.append(Frame({**self._event, "cut": True}, b"".join(self._payload)))
        elif self._buf:
            frames.append(_text(bytes(self._buf)))
        self._buf.clear()
        self._need, self._event, self._payload = None, None, []
        return frames


def _text(raw: bytes) -> Frame:
    return Frame({"ev": "launcher", "text": raw.decode("utf-8", errors="replace").rstrip("\r")})


def _header(line: bytes) -> Frame:
    if line.startswith(b"{"):
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if isinstance(event, dict) and "ev" in event:
            return Frame(event)
    return _text(line)


def frames(chunks: Iterable[bytes]) -> Iterator[Frame]:
    """Every frame of a whole stream of chunks."""
    decoder = FrameDecoder()
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.close()
