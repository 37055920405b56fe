"""Starting the node agent: one node's agent from its start to its end (one program per node per launch), and
the agent's other modes, each with its spec on stdin.

:func:`open_link` starts ``agent.py prepare`` on a node (inline: nothing is installed there first). Before
the job, clusterrun asks it questions (:meth:`AgentLink.ask`: the ready check, the path probes), each answered
by one event; ``go`` with the run's spec then starts the job in the same process, and the link is handed to
the supervisor (:meth:`AgentLink.hand_over`), whose event queue gets every frame from then on. One reader
thread per node decodes the stream from the first byte to the last, so no byte is read twice or lost
between the two phases.

Every spec goes on stdin, never on the command line: the run's holds the job's environment (-e, --env-forward,
inventory env: tokens, passwords), and any user of a node can read every process's command line; the other
modes' go the same way, so that there is one way in (:func:`start_mode`, :func:`run_mode`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from clusterrun import remote
from clusterrun.errors import CommandTimeout, ConnectError
from clusterrun.planning.planfile import NodePlan
from clusterrun.remote import protocol, session
from clusterrun.remote.containers import PULLING
from clusterrun.remote.protocol import Frame, FrameDecoder, frames
from clusterrun.transport.base import CommandResult, Stream, Transport
from clusterrun.waits import queue_get

#: The end of a node's stream, as it reaches a sink (after every frame).
EOF = object()


def _spec_line(spec: dict[str, Any]) -> str:
    return protocol.encode_spec(spec) + "\n"


def start_mode(transport: Transport, python: str, kind: protocol.Spec, spec: dict[str, Any]) -> Stream:
    """Start the agent's mode ``kind`` on the transport's node and send it ``spec`` (its first line of stdin).

    A stream that closes before the spec is sent ends at once: its reader sees the end, as with any start."""
    stream = transport.start(remote.argv(python, "agent", kind.mode, inline=not transport.is_local))
    stream.send(_spec_line(spec))
    return stream


def run_mode(transport: Transport, python: str, kind: protocol.Spec, spec: dict[str, Any], *,
             timeout: float) -> tuple[list[Frame], CommandResult]:
    """Run the agent's mode ``kind`` to its end with ``spec`` on stdin: its events, decoded, and the command's
    result (exit code, stderr). Raises what :meth:`Transport.run` raises."""
    res = transport.run(remote.argv(python, "agent", kind.mode, inline=not transport.is_local), timeout=timeout,
                        stdin=_spec_line(spec).encode())
    return list(frames([res.stdout.encode()])), res


class AgentLink:
    """The stream of one node's agent and the thread that reads it. Frames go to this link's own queue
    (answers to :meth:`ask`) until :meth:`hand_over` names another sink."""

    def __init__(self, node: str, stream: Stream) -> None:
        self.node = node
        self.stream = stream
        self._lock = threading.Lock()
        self._answers: queue.Queue[Any] = queue.Queue()
        self._sink: queue.Queue[tuple[str, Any]] | None = None
        self._said: list[str] = []  # text the agent printed before the job (a Python too old, a shell's complaint)
        #: When bytes last came from the node (monotonic), set by the reader as they arrive: the node is alive
        #: even while the frames wait in a queue (a busy or starved clusterrun), so silence is the node's own.
        self.heard = time.monotonic()
        self._reader = threading.Thread(target=self._pump, daemon=True, name=f"agent-{node}")
        self._reader.start()

    def _put(self, item: Any) -> None:
        with self._lock:
            sink = self._sink
            if sink is None:
                self._answers.put(item)
        if sink is not None:
            sink.put((self.node, item))  # outside the lock: a full queue holds this reader back, as it should

    def _pump(self) -> None:
        decoder = FrameDecoder()
        try:
            for chunk in self.stream.chunks():
                self.heard = time.monotonic()
                for frame in decoder.feed(chunk):
                    self._put(frame)
            for frame in decoder.close():
                self._put(frame)
        except Exception as exc:  # a broken stream ends it; the reader of the frames hears why
            self._put(Frame({"ev": protocol.STREAM_ERROR, "text": str(exc)}))
        finally:
            self._put(EOF)

    # ------------------------------------------------------------ before the job

    def send(self, line: str) -> bool:
        """One line to the agent's stdin; False when it can no longer be reached."""
        return self.stream.send(line if line.endswith("\n") else line + "\n")

    def answer(self, kinds: Iterable[str], deadline: float,
               progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """The next event of one of ``kinds``, by the monotonic ``deadline``; ``progress`` hears the node's
        ``pulling`` events meanwhile. Raises :class:`ConnectError` when the stream ends first and
        :class:`CommandTimeout` at the deadline."""
        wanted = set(kinds)
        while True:
            try:
                item = queue_get(self._answers, deadline - time.monotonic())  # Ctrl-C is seen meanwhile
            except queue.Empty:
                raise CommandTimeout(self.node, f"the node agent did not answer in time (waiting for "
                                                f"{'/'.join(sorted(wanted))})") from None
            if item is EOF:
                self._answers.put(EOF)  # every later question hears it too
                raise ConnectError(self.node, self._ended_why())
            event = item.event
            if event.get("ev") in wanted:
                return event
            if event.get("ev") == PULLING and progress is not None:
                progress(event)
            if event.get("ev") in (protocol.LAUNCHER, protocol.STREAM_ERROR) and len(self._said) < 50:
                self._said.append(str(event.get("text", "")))

    def ask(self, word: str, arg: str, kinds: Iterable[str], timeout: float) -> dict[str, Any]:
        """Send ``word arg`` and wait for its answer (see :meth:`answer`)."""
        deadline = time.monotonic() + timeout
        if not self.send(f"{word} {arg}"):
            raise ConnectError(self.node, self._ended_why())
        return self.answer(kinds, deadline)

    def check(self, spec: dict[str, Any]) -> None:
        """Send the ready check (``spec``: :func:`clusterrun.agents.spec.check_spec`); its answer, ``ready`` (or
        ``error`` for a spec the node refuses), is read with :meth:`answer`. A closed stream shows there too."""
        self.send(f"{session.CHECK} {protocol.encode_spec(spec)}")

    def _ended_why(self) -> str:
        tail = [line for line in (self._said + self.stream.stderr_text().strip().splitlines()) if line.strip()]
        code = self.stream.wait(0.5)
        return ("the node agent ended before it answered" + (f" (exit {code})" if code is not None else "")
                + (f": {' | '.join(tail[-3:])}" if tail else ""))

    # ------------------------------------------------------------ the job

    def go(self, spec: dict[str, Any]) -> None:
        """Start the job (``spec``: :func:`clusterrun.agents.spec.run_spec`). Raises :class:`ConnectError` when the spec cannot be sent."""
        if not self.send(f"go {protocol.encode_spec(spec)}"):
            raise ConnectError(self.node, "the node agent's connection closed before it got the run's spec")

    def hand_over(self, sink: queue.Queue[tuple[str, Any]]) -> list[Any]:
        """From now on every frame (and the end, as :data:`EOF`) goes to ``sink`` as ``(node, item)``. Returns what
        had arrived and was not taken (older than anything ``sink`` will get), for the caller to handle first:
        it is not put in ``sink``, which may be bounded and not yet read."""
        left: list[Any] = []
        with self._lock:
            while True:
                try:
                    left.append(self._answers.get_nowait())
                except queue.Empty:
                    break
            self._sink = sink
        return left

    def stderr_text(self) -> str:
        return self.stream.stderr_text()

    def abort(self) -> None:
        """Drop the connection: before ``go`` the agent ends at once; after, it stops the job (unless detached)."""
        self.stream.abort()

    def join(self, timeout: float) -> None:
        self._reader.join(timeout)


def open_link(transport: Transport, node: NodePlan) -> AgentLink:
    """Start ``agent.py prepare`` on ``node``; it waits for questions, then ``go``. Inline, the agent travels in
    the command line (compressed): starting a node costs one round trip, and nothing has to be installed first."""
    argv = remote.argv(node.python, "agent", "prepare", inline=not transport.is_local)
    return AgentLink(node.name, transport.start(argv))
