"""An in-memory Transport for unit tests: each started command is played by a script, like httpx's MockTransport.

``FakeTransport(node, script)``: :meth:`~FakeTransport.start` returns a :class:`FakeStream` and runs
``script(agent)`` on a thread of its own, where ``agent`` (:class:`FakeAgent`) plays the node agent of
:mod:`clusterrun.remote.agent`: it writes events in the wire format of :mod:`clusterrun.remote.protocol`
(``emit``, ``out``, ``exit``) and reads the lines clusterrun writes to its stdin (``next_command``,
``wait_for``). As the real agent does, it answers every ``ping`` with a ``pong`` at once, until the script
calls :meth:`FakeAgent.go_silent` (a node that hangs or whose network is gone, with its connection open).

The stream ends when the script says so: :meth:`FakeAgent.exit` (the final ``exit`` event, then the end),
:meth:`FakeAgent.close` (the end without an ``exit`` event: a broken connection), or the script returning
(the same as ``close``); or when clusterrun drops it (:meth:`FakeStream.abort`). A script that raises ends its
stream too, and :meth:`FakeTransport.check` re-raises the error in the test.

Every wait is bounded: the agent's waits take a timeout, and a stream that nobody ends within ``lifetime``
seconds (scaled with the machine's load, tests/loadscale.py) raises in :meth:`FakeStream.chunks` instead of
hanging the test.
"""

from __future__ import annotations

import base64
import binascii
import collections
import json
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadscale import scaled

from clusterrun.remote import protocol
from clusterrun.transport.base import CommandResult, Stream, Transport

DEFAULT_LIFETIME = 20.0  # seconds a fake stream may stay open at most: a test that forgets to end one fails


class FakeStream(Stream):
    """Both ends of one started command: what the agent emitted (read by ``chunks``), what clusterrun sent."""

    def __init__(self, lifetime: float = DEFAULT_LIFETIME) -> None:
        self._cond = threading.Condition()
        self._out: collections.deque[bytes] = collections.deque()
        self._commands: collections.deque[str] = collections.deque()  # lines for the agent, not yet read
        self.sent: list[str] = []  # every line clusterrun wrote, in order (pings included)
        self._stderr: list[str] = []
        self._ended = False  # the agent ended its output (exit, close, its script returned)
        self._aborted = False  # clusterrun aborted the stream (also done to streams that had ended)
        self._dropped = False  # ... while it was still open
        self._rc: int | None = None
        self._answer_pings = True
        self._deadline = time.monotonic() + scaled(lifetime)
        self.expects_spec = False  # the command is `agent.py prepare`: the spec comes with `go`
        self.spec_line: str | None = None

    # ------------------------------------------------ clusterrun's side (the Stream protocol)

    def chunks(self) -> Iterator[bytes]:
        while True:
            with self._cond:
                while not self._out and not self._ended and not self._aborted:
                    left = self._deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError("FakeStream still open at the end of its lifetime: its script never "
                                           "ended it (exit/close) and clusterrun never aborted it")
                    self._cond.wait(left)
                if self._aborted:
                    return  # a dropped connection: what was in flight is lost
                if not self._out:
                    return  # ended, and everything was read
                chunk = self._out.popleft()
            yield chunk

    def send(self, text: str) -> bool:
        with self._cond:
            if self._ended or self._aborted:
                return False
            for line in text.splitlines():
                if self.expects_spec and self.spec_line is None and line.startswith("go "):
                    self.spec_line = line[3:]  # `agent.py prepare` gets its run's spec with `go`
                    continue
                self.sent.append(line)
                self._commands.append(line)
                if line == protocol.PING and self._answer_pings:
                    self._out.append(protocol.encode({"ev": protocol.PONG}))
            self._cond.notify_all()
            return True

    def wait(self, timeout: float) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: self._ended or self._aborted, timeout)
            return self._rc

    def abort(self) -> None:
        with self._cond:
            if not self._ended and not self._aborted:
                self._rc = -9  # as if the local ssh client were killed
                self._dropped = True
            self._aborted = True
            self._cond.notify_all()

    def stderr_text(self) -> str:
        with self._cond:
            return "".join(self._stderr)[-4000:]

    # ------------------------------------------------ the agent's side (used through FakeAgent)

    @property
    def dropped(self) -> bool:
        """clusterrun aborted the stream before the agent ended it."""
        with self._cond:
            return self._dropped

    def _write(self, data: bytes) -> bool:
        with self._cond:
            if self._ended or self._aborted:
                return False  # a broken pipe: the bytes go nowhere
            self._out.append(data)
            self._cond.notify_all()
            return True

    def _write_stderr(self, text: str) -> None:
        with self._cond:
            self._stderr.append(text)

    def _end(self, rc: int | None) -> None:
        with self._cond:
            if not self._ended and not self._aborted:
                self._rc = rc
            self._ended = True
            self._cond.notify_all()

    def _next(self, timeout: float) -> str | None:
        end = time.monotonic() + timeout
        with self._cond:
            while not self._commands:
                left = end - time.monotonic()
                if self._aborted or self._ended or left <= 0:
                    return None
                self._cond.wait(left)
            return self._commands.popleft()

    def _silence(self) -> None:
        with self._cond:
            self._answer_pings = False

    def _wait_aborted(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._aborted, timeout)

    def _wait_sent(self, line: str, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: line in self.sent, timeout)


class FakeAgent:
    """What a script uses to play a node agent on one :class:`FakeStream`.

    ``spec``: the agent spec clusterrun sent on stdin (``rank_offset``, ``grace``, ...), or ``{}``
    when the command was not an agent's. ``argv``/``env``/``cwd``: the command as started.
    """

    def __init__(self, node: str, stream: FakeStream, argv: Sequence[str], env: Mapping[str, str] | None,
                 cwd: str | None) -> None:
        self.node = node
        self.stream = stream
        self.argv = list(argv)
        self.env = dict(env or {})
        self.cwd = cwd
        self.sizes: dict[str, dict[str, int]] = {}  # "<rank>/<stream>" -> bytes and lines sent so far

    @property
    def spec(self) -> dict[str, Any]:
        """The agent spec clusterrun sent (with ``go`` to ``agent.py prepare``), waited for up to 5 s."""
        if not self.stream.expects_spec:
            return {}
        with self.stream._cond:
            self.stream._cond.wait_for(lambda: self.stream.spec_line is not None, scaled(5.0))
            line = self.stream.spec_line
        try:
            spec = json.loads(base64.b64decode(line or "", validate=True))
        except (binascii.Error, ValueError):
            return {}
        return spec if isinstance(spec, dict) else {}

    # ------------------------------------------------ agent -> clusterrun

    def emit(self, event: dict[str, Any], payload: bytes = b"") -> bool:
        """Send one event (and its payload). Returns False once the stream has ended or was dropped."""
        return self.stream._write(protocol.encode(event, payload))

    def started(self, pid: int = 4242) -> bool:
        return self.emit({"ev": protocol.STARTED, "pid": pid, "time": time.time()})

    def out(self, rank: int, text: str | bytes, stream: str = "stdout", *, open: bool = False) -> bool:
        """Rank output (global ``rank``): whole records, unless ``open`` (the record goes on in the next one)."""
        data = text.encode() if isinstance(text, str) else text
        offset = int(self.spec.get("rank_offset", 0))
        sent = self.emit({"ev": protocol.OUT, "rank": rank, "local_rank": rank - offset, "stream": stream,
                          "open": open}, data)
        if sent:
            size = self.sizes.setdefault(f"{rank}/{stream}", {"bytes": 0, "sent": 0, "lines": 0})
            size["bytes"] += len(data)
            size["sent"] += len(data)
            size["lines"] += data.count(b"\n")
        return sent

    def launcher(self, text: str) -> bool:
        """A line of torchrun's own output."""
        return self.emit({"ev": protocol.LAUNCHER, "text": text})

    def rank_failed(self, rank: int, rc: int, signal: int | None = None) -> bool:
        offset = int(self.spec.get("rank_offset", 0))
        return self.emit({"ev": protocol.RANK_FAILED, "rank": rank, "local_rank": rank - offset, "rc": rc,
                          "signal": signal, "time": time.time()})

    def stderr(self, text: str) -> None:
        """What the command writes to stderr (ssh's complaint on a broken connection, say)."""
        self.stream._write_stderr(text)

    def exit(self, rc: int = 0, ranks: Mapping[int, Mapping[str, Any]] | None = None,
             logs: Mapping[str, Mapping[str, int]] | None = None, *, signal: int | None = None,
             reason: str = "finished") -> bool:
        """The final ``exit`` event, then the end of the stream (the agent process exits 0, as the real one does).

        ``logs`` defaults to the sizes of what :meth:`out` sent, as an agent whose relay kept up reports them.
        """
        event = {"ev": protocol.EXIT, "rc": rc, "signal": signal, "reason": reason, "time": time.time(),
                 "ranks": {str(r): dict(v) for r, v in (ranks or {}).items()},
                 "logs": {k: dict(v) for k, v in (self.sizes if logs is None else logs).items()}}
        sent = self.emit(event)
        self.stream._end(0)
        return sent

    def close(self, rc: int | None = 255) -> None:
        """End the stream without an ``exit`` event: the connection broke (ssh exits 255)."""
        self.stream._end(rc)

    def go_silent(self) -> None:
        """Stop answering pings (and say nothing more unless the script emits): a hung node, a dead network."""
        self.stream._silence()

    # ------------------------------------------------ clusterrun -> agent

    def next_command(self, timeout: float) -> str | None:
        """The next line clusterrun sent ("ping", "term", "kill"), or None after ``timeout`` or once the stream
        was dropped or ended."""
        return self.stream._next(timeout)

    def wait_for(self, command: str, timeout: float) -> bool:
        """Read commands until ``command`` (skipping the others, pings mostly). False if it did not come in time."""
        end = time.monotonic() + timeout
        while True:
            got = self.next_command(max(0.0, end - time.monotonic()))
            if got is None:
                return False
            if got == command:
                return True

    def wait_dropped(self, timeout: float) -> bool:
        """Wait until clusterrun aborts the stream. False if it did not within ``timeout``."""
        return self.stream._wait_aborted(timeout)

    @property
    def dropped(self) -> bool:
        """clusterrun aborted the stream before this agent ended it (exit, close)."""
        return self.stream.dropped


Script = Callable[[FakeAgent], None]


class FakeTransport(Transport):
    """A node whose started commands are played by ``script`` (one thread per start).

    ``start_error``: raised by :meth:`start` instead (a node that cannot be reached), typically a
    :class:`clusterrun.errors.TransportError`. ``lifetime``: see :class:`FakeStream`.
    """

    is_local = False

    def __init__(self, node: str, script: Script, *, start_error: Exception | None = None,
                 lifetime: float = DEFAULT_LIFETIME) -> None:
        self.node = node
        self.script = script
        self.start_error = start_error
        self.lifetime = lifetime
        self.agents: list[FakeAgent] = []
        self.errors: list[BaseException] = []  # what scripts raised
        self._threads: list[threading.Thread] = []
        self._started = threading.Event()  # set once a command was started

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None) -> FakeStream:
        if self.start_error is not None:
            raise self.start_error
        stream = FakeStream(self.lifetime)
        stream.expects_spec = list(argv[-1:]) == ["prepare"]
        agent = FakeAgent(self.node, stream, argv, env, cwd)
        self.agents.append(agent)
        self._started.set()
        thread = threading.Thread(target=self._play, args=(agent,), daemon=True, name=f"fake-{self.node}")
        self._threads.append(thread)
        thread.start()
        return stream

    def _play(self, agent: FakeAgent) -> None:
        try:
            self.script(agent)
        except BaseException as exc:  # kept for the test (check() re-raises); the stream ends like a crash
            self.errors.append(exc)
            agent.stderr(traceback.format_exc())
        finally:
            agent.stream._end(1 if self.errors else 255)  # no-op after exit() or close()

    def run(self, argv: Sequence[str], *, timeout: float = 30.0, env: Mapping[str, str] | None = None,
            cwd: str | None = None, stdin: bytes | None = None) -> CommandResult:
        raise NotImplementedError("FakeTransport plays started commands only (start)")

    def put(self, local: Path, remote: str) -> None:
        raise NotImplementedError("FakeTransport copies no files")

    # ------------------------------------------------ for the test's assertions

    @property
    def received(self) -> list[str]:
        """Every line clusterrun wrote to this node's commands, in order (pings included)."""
        return [line for agent in self.agents for line in agent.stream.sent]

    @property
    def commands(self) -> list[str]:
        """What :attr:`received` holds besides heartbeats: ``["term"]``, ``["term", "kill"]``."""
        return [line for line in self.received if line != protocol.PING]

    def wait_received(self, command: str, timeout: float) -> bool:
        """Wait until the node was started and clusterrun sent it ``command``. False if not within ``timeout``."""
        end = time.monotonic() + timeout
        if not self._started.wait(timeout):
            return False
        return self.agents[-1].stream._wait_sent(command, max(0.0, end - time.monotonic()))

    def check(self, timeout: float = 5.0) -> None:
        """Wait (bounded) for the scripts to finish; raise what one of them raised, or if one is still running."""
        end = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))
        if self.errors:
            raise self.errors[0]
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise AssertionError(f"{self.node}: script still running {timeout:g}s after the test: {alive}")
