"""``clusterrun exec``: one shell command on every node at once, through the node agent's ``exec`` mode.

Each node's command runs in its own session under the agent, which stops it when clusterrun goes away
(Ctrl-C, a killed terminal) or at the time limit, so nothing is left running on any node. Output comes
back as whole lines, one writer at a time.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clusterrun.agents.link import answered, start_mode
from clusterrun.agents.spec import exec_spec
from clusterrun.errors import ClusterrunError, ProtocolError
from clusterrun.inventory.models import Inventory
from clusterrun.remote import protocol
from clusterrun.remote.answers import Line, Said
from clusterrun.transport.base import Stream, Transport


@dataclass
class NodeResult:
    node: str
    exit_code: int | None = None  # None: it never reported (unreachable, connection lost)
    error: str | None = None
    reason: str | None = None  # why the agent stopped the command (time limit), if it did
    lines: list[tuple[str, str]] = field(default_factory=list)  # (stdout|stderr, text)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def run_everywhere(inv: Inventory, transports: Mapping[str, Transport], command: str, *, timeout: float | None,
                   on_line: Callable[[str, str, str], None] = lambda _n, _s, _t: None,
                   stop: threading.Event | None = None) -> dict[str, NodeResult]:
    """Run ``command`` on every node of ``inv``; ``on_line(node, stream, text)`` is called from this thread only."""
    results = {n.name: NodeResult(n.name) for n in inv.nodes}
    events: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=10_000)
    streams: dict[str, Stream] = {}
    spec = exec_spec(command, timeout)

    def start(name: str) -> None:
        node = next(n for n in inv.nodes if n.name == name)
        try:
            stream = start_mode(transports[name], inv.python_of(node), protocol.EXEC, spec)
        except Exception as exc:  # whatever it was, this node ends with it and the others go on
            text = exc.reason if isinstance(exc, ClusterrunError) else (
                f"could not start the command: {type(exc).__name__}: {exc}")
            events.put((name, Said(protocol.ERROR, text)))
            events.put((name, None))
            return
        streams[name] = stream
        try:
            for frame in answered(name, stream.chunks()):
                event = frame.event
                if event.ev == protocol.LAUNCHER:  # a line that is no event (a shell's complaint): as output
                    event = Line(event.text)
                events.put((name, event))
        except ProtocolError as exc:  # the node said what cannot be read: its command's end is unknown
            events.put((name, Said(protocol.ERROR, exc.reason)))
        except Exception as exc:  # a broken connection ends this node's events
            events.put((name, Said(protocol.ERROR, f"connection lost: {exc}")))
        if stream.stderr_text().strip():
            events.put((name, Said(protocol.ERROR, stream.stderr_text().strip().splitlines()[-1])))
        events.put((name, None))

    threads = [threading.Thread(target=start, args=(n.name,), daemon=True, name=f"exec-{n.name}") for n in inv.nodes]
    for t in threads:
        t.start()
    done = 0
    try:
        while done < len(threads):
            if stop is not None and stop.is_set():
                break
            try:
                name, event = events.get(timeout=0.2)
            except queue.Empty:
                continue
            result = results[name]
            if event is None:
                done += 1
            elif event.ev == protocol.LINE:
                result.lines.append((event.stream, event.text))
                on_line(name, event.stream, event.text)
            elif event.ev == protocol.EXIT:
                result.exit_code, result.reason = event.rc, event.reason
                result.error = event.error or result.error
            elif event.ev == protocol.ERROR and result.exit_code is None:
                result.error = event.text
    finally:
        for stream in list(streams.values()):
            stream.abort()  # the agents see the end of input and stop whatever still runs
    return results
