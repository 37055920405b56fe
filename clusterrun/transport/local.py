"""The local transport: the node is this machine, commands run as subprocesses."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from clusterrun.errors import CommandTimeout, TransportError
from clusterrun.transport.base import DEFAULT_COMMAND_TIMEOUT, CommandResult, Stream, Transport

_STDERR_KEEP = 64 * 1024


def _expand(path: str | None) -> str | None:
    return os.path.expanduser(path) if path else path


class LocalStream(Stream):
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        self._stderr = bytearray()
        self._lock = threading.Lock()
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True, name="local-stderr")
        self._stderr_thread.start()

    def _drain_stderr(self) -> None:
        assert self._proc.stderr is not None
        for chunk in iter(lambda: self._proc.stderr.read1(4096), b""):  # type: ignore[union-attr]
            self._stderr += chunk
            del self._stderr[:-_STDERR_KEEP]

    def chunks(self) -> Iterator[bytes]:
        stdout = self._proc.stdout
        assert stdout is not None
        yield from iter(lambda: stdout.read1(1 << 18), b"")  # type: ignore[attr-defined]

    def send(self, text: str) -> bool:
        with self._lock:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write(text.encode())
                self._proc.stdin.flush()
                return True
            except (OSError, ValueError):
                return False

    def wait(self, timeout: float) -> int | None:
        try:
            return self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def abort(self) -> None:
        with self._lock:
            if self._proc.stdin and not self._proc.stdin.closed:
                with contextlib.suppress(OSError):
                    self._proc.stdin.close()  # the agent reads EOF and stops the job

    def stderr_text(self) -> str:
        return bytes(self._stderr).decode("utf-8", errors="replace")


class LocalTransport(Transport):
    is_local = True

    def __init__(self, node: str = "localhost") -> None:
        self.node = node

    def run(self, argv: Sequence[str], *, timeout: float = DEFAULT_COMMAND_TIMEOUT,
            env: Mapping[str, str] | None = None, cwd: str | None = None,
            stdin: bytes | None = None) -> CommandResult:
        full_env = {**os.environ, **(env or {})}
        started = time.monotonic()
        command = " ".join(argv)
        try:
            done = subprocess.run(list(argv), input=stdin, capture_output=True, timeout=timeout,
                                  env=full_env, cwd=_expand(cwd), check=False)
        except subprocess.TimeoutExpired:
            raise CommandTimeout(self.node, f"`{command}` did not finish within {timeout:g}s") from None
        except FileNotFoundError:
            return CommandResult(self.node, command, 127, "", f"{argv[0]}: command not found",
                                 time.monotonic() - started)
        except OSError as exc:
            raise TransportError(self.node, f"cannot run `{command}`: {exc}") from exc
        return CommandResult(self.node, command, done.returncode, done.stdout.decode(errors="replace"),
                             done.stderr.decode(errors="replace"), time.monotonic() - started)

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None) -> Stream:
        full_env = {**os.environ, **(env or {})}
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=full_env, cwd=_expand(cwd))
        except OSError as exc:
            raise TransportError(self.node, f"cannot start `{argv[0]}`: {exc.strerror or exc}") from exc
        return LocalStream(proc)

    def put(self, local: Path, remote: str) -> None:
        target = Path(os.path.expanduser(remote))
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.resolve() != Path(local).resolve():
                shutil.copy2(local, target)
        except OSError as exc:
            raise TransportError(self.node, f"cannot copy {local} to {remote}: {exc}") from exc
