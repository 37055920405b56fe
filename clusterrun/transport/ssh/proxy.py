"""A ProxyCommand run as OpenSSH runs it, its stdin and stdout the socket an SSH connection is made over."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile

_PROXY_EXIT_WAIT_S = 2.0  # after SIGHUP, how long a ProxyCommand has to exit before SIGKILL


class ProxyCommand:
    """A ProxyCommand run as OpenSSH runs it (``$SHELL -c "exec COMMAND"``), its stdin and stdout the connection.

    The connection is one end of a socketpair rather than paramiko.ProxyCommand's pipes: paramiko's reader
    spins on a pipe whose writer has gone (a command that died reads as "No existing session" after the
    whole banner timeout) and drops the command's stderr. A socket gives paramiko a real end of file and
    its own timeouts; stderr goes to a file kept for the error message.
    """

    def __init__(self, command: str) -> None:
        self.command = command
        ours, theirs = socket.socketpair()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        shell = os.environ.get("SHELL") or "/bin/sh"
        try:
            # Its own session: closing the connection signals the command's whole process group.
            self.process = subprocess.Popen([shell, "-c", f"exec {command}"], stdin=theirs, stdout=theirs,
                                            stderr=self._stderr, start_new_session=True)
        except OSError:
            ours.close()
            self._stderr.close()
            raise
        finally:
            theirs.close()
        self.sock = ours

    def failure(self, grace: float = 0.5) -> str | None:
        """Why the command ended, if it has or does within ``grace`` seconds: exit status, last stderr line."""
        try:
            # Its end of the socket closes as it exits, a moment before it can be reaped.
            code = self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            return None
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - 4096))
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        said = f": {lines[-1].strip()}" if lines else ""
        return f"the ProxyCommand `{self.command}` exited with status {code}{said}"

    def close(self) -> None:
        self.sock.close()
        if self.process.poll() is None:
            # OpenSSH ends its ProxyCommand with SIGHUP too.
            for sig in (signal.SIGHUP, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.process.pid, sig)
                try:
                    self.process.wait(timeout=_PROXY_EXIT_WAIT_S)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._stderr.close()
