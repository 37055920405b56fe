"""Read a stream's lines on a thread, so that a caller can wait for one with a deadline."""

from __future__ import annotations

import queue
import threading
import time

from clusterrun.transport.base import Stream
from clusterrun.waits import queue_get


class LineReader:
    """Read a stream's lines on a thread, so the caller can wait for one with a timeout."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True, name="probe-reader").start()

    def _pump(self) -> None:
        try:
            for line in self.stream.lines():
                self._lines.put(line)
        except Exception:  # a broken stream ends the reading; the caller sees None
            pass
        self._lines.put(None)

    def next(self, timeout: float) -> str | None:
        """The next line, or None at the end of the stream or after ``timeout`` seconds."""
        try:
            return queue_get(self._lines, timeout)  # in slices: Ctrl-C is seen meanwhile
        except queue.Empty:
            return None

    def wait_for(self, prefix: str, timeout: float) -> str | None:
        """The first line starting with ``prefix`` (or ``FAILED``), within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.next(deadline - time.monotonic())
            if line is None or line.startswith((prefix, "FAILED")):
                return line
