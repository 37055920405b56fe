"""The node agent's ``collect`` mode, from clusterrun's side: what a node holds of a run that clusterrun lacks.

One command per node stops any process of the run still alive there (``sweep``; or, for a run that goes on,
only says whether it runs) and sends the rank log bytes that never arrived, as ``out`` events; what was
already received is given as byte offsets per rank file, so nothing arrives twice. ``up`` uses it after a
broken stream (clusterrun.launch.recover), ``clusterrun logs`` to read a detached run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clusterrun.agents.link import answered, start_mode
from clusterrun.agents.spec import collect_spec
from clusterrun.errors import CommandTimeout
from clusterrun.remote import protocol
from clusterrun.remote.answers import Exit, Log, LogSize
from clusterrun.transport.base import Transport

#: Receives fetched output: (global rank, "stdout" | "stderr", bytes, more of this record follows).
OutSink = Callable[[int, str, bytes, bool], None]


@dataclass
class Collected:
    node: str
    files: list[Log] = field(default_factory=list)  # per rank file: rank, stream, bytes, lines, skipped_*
    fetched_bytes: int = 0
    fetched_lines: int = 0
    swept: list[int] = field(default_factory=list)  # processes stopped (sweep=True)
    alive: int | None = None  # processes of the run still there (sweep=False); None when unknown
    record: Exit | None = None  # the node's exit.json once its torchrun ended
    exit_code: int | None = 0  # of the collect command itself (None: it did not say)
    tail: str = ""  # what it wrote to stderr last, for a failure message

    @property
    def skipped_bytes(self) -> int:
        return sum(f.skipped_bytes for f in self.files)

    @property
    def skipped_lines(self) -> int:
        return sum(f.skipped_lines for f in self.files)

    def sizes(self) -> dict[str, LogSize]:
        """Each rank file's size and lines by ``"<rank>/<stream>"``, as the node reported them."""
        return {f"{f.rank}/{f.stream}": LogSize(f.bytes, lines=f.lines) for f in self.files}


def collect(transport: Transport, *, node: str, python: str, run_id: str, run_dir: str,
            rank_offset: int, offsets: Mapping[str, int], sweep: bool, grace: float, max_bytes: int,
            timeout: float, sink: OutSink, partial: bool = True, container: dict[str, Any] | None = None) -> Collected:
    """Run ``collect`` on ``node``; every fetched byte goes to ``sink`` as it arrives.

    ``offsets``: bytes already received per ``"<rank>/<stream>"``; ``partial``: also send a last line that has
    no newline yet (the run is over); ``container``: the node's (its containers of the run are removed with the
    sweep). Raises :class:`ClusterrunError` when the node cannot be reached and
    :class:`CommandTimeout` when it does not finish within ``timeout`` seconds.
    """
    spec = collect_spec(run_id=run_id, node=node, run_dir=run_dir, rank_offset=rank_offset, offsets=offsets,
                        sweep=sweep, grace=grace, max_bytes=max_bytes, partial=partial, container=container)
    stream = start_mode(transport, python, protocol.COLLECT, spec)
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        stream.abort()

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    out = Collected(node)
    try:
        for frame in answered(node, stream.chunks()):
            event = frame.event
            kind = event.ev
            if kind == protocol.OUT:
                sink(event.rank, event.stream, frame.payload, event.open)
                out.fetched_bytes += len(frame.payload)
                out.fetched_lines += frame.payload.count(b"\n")
            elif kind == protocol.LOG:
                out.files.append(event)
            elif kind == protocol.SWEPT:
                out.swept = event.pids
            elif kind == protocol.ALIVE:
                out.alive = len(event.pids)
            elif kind == protocol.RECORD:
                out.record = event.exit
            elif kind in (protocol.LAUNCHER, protocol.ERROR):
                out.tail = event.text
    finally:
        timer.cancel()
    if timed_out.is_set():
        raise CommandTimeout(node, f"collecting the logs did not finish within {timeout:g}s "
                                   f"({out.fetched_bytes} bytes fetched)")
    out.exit_code = stream.wait(5.0)
    stream.abort()
    out.tail = (stream.stderr_text().strip().splitlines() or [out.tail])[-1]
    return out
