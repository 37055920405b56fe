"""The transport protocol: run a command on a node, or start one and talk to it.

Implementations: :mod:`clusterrun.transport.local` (subprocess, for nodes with
``transport: local``) and :mod:`clusterrun.transport.ssh.transport` (one SSH connection per
node, reused for every command). Library errors are turned into
:class:`clusterrun.errors.TransportError` subclasses at this edge.
"""

from __future__ import annotations

import abc
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Default seconds a short command (probe, preflight, copy) may take.
DEFAULT_COMMAND_TIMEOUT = 30.0


@dataclass(frozen=True)
class CommandResult:
    node: str
    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def tail(self, lines: int = 10) -> str:
        text = (self.stderr or self.stdout).rstrip()
        return "\n".join(text.splitlines()[-lines:])


class Stream(abc.ABC):
    """A started command: read its stdout line by line, write to its stdin."""

    @abc.abstractmethod
    def chunks(self) -> Iterator[bytes]:
        """Yield stdout bytes as they arrive, until the command's output ends."""

    def lines(self) -> Iterator[str]:
        """Yield stdout lines (without the newline) until the command's output ends."""
        buf = b""
        for chunk in self.chunks():
            buf += chunk
            if b"\n" not in chunk:
                continue
            *complete, buf = buf.split(b"\n")
            for raw in complete:
                yield raw.decode("utf-8", errors="replace")
        if buf:
            yield buf.decode("utf-8", errors="replace")

    @abc.abstractmethod
    def send(self, text: str) -> bool:
        """Write to the command's stdin. Returns False when the command can no longer be reached."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> int | None:
        """Exit status, or None if it has not ended within ``timeout`` seconds."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Drop our end: close the channel or kill the local process. Never blocks for long."""

    @abc.abstractmethod
    def stderr_text(self) -> str:
        """What the command wrote to stderr so far (bounded)."""


class Transport(abc.ABC):
    """One node's way in. ``node`` is the inventory name, used in every error.

    ``is_local``: the node is this machine (commands are subprocesses; files are shared).
    """

    node: str
    is_local: bool = False

    def connect(self) -> None:  # noqa: B027 - optional hook
        """Open the connection now (otherwise the first command opens it). Raises TransportError."""

    def peer_address(self) -> str | None:
        """The address the connection reached, when known (None before connecting, through a jump, or local)."""
        return None

    @abc.abstractmethod
    def run(self, argv: Sequence[str], *, timeout: float = DEFAULT_COMMAND_TIMEOUT,
            env: Mapping[str, str] | None = None, cwd: str | None = None,
            stdin: bytes | None = None) -> CommandResult:
        """Run a command to completion. Raises CommandTimeout after ``timeout`` and TransportError if unreachable."""

    @abc.abstractmethod
    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None) -> Stream:
        """Start a long-running command and return its stream."""

    @abc.abstractmethod
    def put(self, local: Path, remote: str) -> None:
        """Copy one file to the node (``remote`` may start with ``~/``)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the connection."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shell_path(path: str) -> str:
    """Quote a path for a POSIX shell, keeping a leading ``~/`` expandable."""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


def shell_command(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """One POSIX shell command line that runs ``argv`` with ``env`` in ``cwd``."""
    parts = []
    if cwd:
        parts.append(f"cd {shell_path(cwd)} &&")
    if env:
        parts.append("env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()))
    parts.append(" ".join(shell_path(a) if a.startswith("~/") else shlex.quote(a) for a in argv))
    return " ".join(parts)
