"""A command started over SSH: its output read as it arrives, its stderr kept, its end waited for with a bound."""

from __future__ import annotations

import contextlib
import select
import threading
import time
from collections.abc import Iterator

from clusterrun.transport.base import Stream
from clusterrun.transport.ssh.paramiko_lib import paramiko

_STDERR_KEEP = 64 * 1024
_RECV_CHUNK = 1 << 18


class SshStream(Stream):
    """A started command. Its stdout and stderr are both read by whoever reads :meth:`chunks`: one thread per
    stream (a node's agent is one stream), sleeping on the channel's poll descriptor until either has data."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self._channel = channel
        self._stderr = bytearray()
        self._lock = threading.Lock()
        self._stderr_lock = threading.Lock()
        self._poll = channel.fileno()  # readable while stdout or stderr holds data, and once the channel ends

    def _take_stderr(self) -> None:
        with self._stderr_lock, contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            while self._channel.recv_stderr_ready():
                chunk = self._channel.recv_stderr(65536)
                if not chunk:
                    break
                self._stderr += chunk
                del self._stderr[:-_STDERR_KEEP]

    def chunks(self) -> Iterator[bytes]:
        channel = self._channel
        while True:
            self._take_stderr()
            try:
                if channel.recv_ready():
                    chunk = channel.recv(_RECV_CHUNK)
                    if not chunk:
                        return
                    yield chunk
                    continue
                if channel.eof_received or channel.closed:
                    self._take_stderr()
                    return
            except (OSError, EOFError, paramiko.SSHException):
                return
            try:
                select.select([self._poll], [], [], 1.0)
            except (OSError, ValueError):  # the channel was closed meanwhile (abort): its descriptor is gone
                if channel.closed:
                    return
                time.sleep(0.1)

    def send(self, text: str) -> bool:
        with self._lock:
            try:
                if self._channel.closed:
                    return False
                self._channel.sendall(text.encode())
                return True
            except (OSError, EOFError, paramiko.SSHException):
                return False

    def wait(self, timeout: float) -> int | None:
        # paramiko sets status_event when the exit status arrives or the channel closes.
        if not self._channel.status_event.wait(timeout):
            return None
        return self._channel.recv_exit_status()

    def abort(self) -> None:
        with self._lock, contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self._channel.close()  # sshd closes the agent's stdin: it stops the job

    def stderr_text(self) -> str:
        self._take_stderr()
        return bytes(self._stderr).decode("utf-8", errors="replace")
