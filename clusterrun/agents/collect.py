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

from clusterrun.agents.link import start_mode
from clusterrun.agents.spec import collect_spec
from clusterrun.errors import CommandTimeout
from clusterrun.remote import protocol
from clusterrun.remote.protocol import frames
from clusterrun.transport.base import Transport

#: Receives fetched output: (global rank, "stdout" | "stderr", bytes, more of this record follows).
OutSink = Callable[[int, str, bytes, bool], None]


@dataclass
class Collected:
    node: str
    files: list[dict[str, Any]] = field(default_factory=list)  # per rank file: rank, stream, bytes, lines, skipped_*
    fetched_bytes: int = 0
    fetched_lines: int = 0
    swept: list[int] = field(default_factory=list)  # processes stopped (sweep=True)
    alive: int | None = None  # processes of the run still there (sweep=False); None when unknown
    record: dict[str, Any] | None = None  # the node's exit.json once its torchrun ended
    exit_code: int | None = 0  # of the collect command itself (None: it did not say)
    tail: str = ""  # what it wrote to stderr last, for a failure message

    @property
    def skipped_bytes(self) -> int:
        return sum(int(f.get("skipped_bytes") or 0) for f in self.files)

    @property
    def skipped_lines(self) -> int:
        return sum(int(f.get("skipped_lines") or 0) for f in self.files)

    def sizes(self) -> dict[str, dict[str, Any]]:
        """``{"<rank>/<stream>": {"bytes", "lines"}}`` as the node reported its files."""
        return {f"{f['rank']}/{f['stream']}": {"bytes": f.get("bytes"), "lines": f.get("lines")} for f in self.files}


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
        for frame in frames(stream.chunks()):
            event = frame.event
            kind = event.get("ev")
            if kind == protocol.OUT:
                sink(int(event["rank"]), str(event.get("stream", "stdout")), frame.payload, bool(event.get("open")))
                out.fetched_bytes += len(frame.payload)
                out.fetched_lines += frame.payload.count(b"\n")
            elif kind == protocol.LOG:
                out.files.append(event)
            elif kind == protocol.SWEPT:
                out.swept = list(event.get("pids") or [])
            elif kind == protocol.ALIVE:
                out.alive = len(event.get("pids") or [])
            elif kind == protocol.RECORD:
                out.record = event.get("exit")
            elif kind in (protocol.LAUNCHER, protocol.ERROR):
                out.tail = event.get("text", "")
    finally:
        timer.cancel()
    if timed_out.is_set():
        raise CommandTimeout(node, f"collecting the logs did not finish within {timeout:g}s "
                                   f"({out.fetched_bytes} bytes fetched)")
    out.exit_code = stream.wait(5.0)
    stream.abort()
    out.tail = (stream.stderr_text().strip().splitlines() or [out.tail])[-1]
    return out
