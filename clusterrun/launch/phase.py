"""Where a supervised run is, and the stop orders that move it on.

The phases and their transitions, each one way (as torchrun's ``WorkerState``, the phase is a value, not a set of
loose fields)::

    STARTING ──``go`` sent to every node──────────────────────────► RUNNING
    STARTING | RUNNING ──first failure, signal, time limit────────► STOPPING  (``term``: SIGTERM, SIGKILL after
                                                                               the grace period, on each node)
    STARTING | RUNNING | STOPPING ──a second signal───────────────► KILLING   (``kill``: SIGKILL at once)
    any but ENDED ──every node's stream ended or given up on──────► ENDED

A stop order goes to every node whose stream is still open, once per phase: ``term`` once, ``kill`` once. What the
supervisor does depends on the phase: while it stops, a rank's failure is a consequence, not the run's first
failure, and a node that ends is ``stopped``, not failed.
"""

from __future__ import annotations

import enum
import signal
import time
from collections.abc import Callable

from clusterrun.remote import protocol


class Phase(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    KILLING = "killing"
    ENDED = "ended"

    @property
    def stopping(self) -> bool:
        """A stop order went out (``term`` or ``kill``)."""
        return self in (Phase.STOPPING, Phase.KILLING)


#: The phases each phase may move to.
NEXT: dict[Phase, frozenset[Phase]] = {
    Phase.STARTING: frozenset({Phase.RUNNING, Phase.STOPPING, Phase.KILLING, Phase.ENDED}),
    Phase.RUNNING: frozenset({Phase.STOPPING, Phase.KILLING, Phase.ENDED}),
    Phase.STOPPING: frozenset({Phase.KILLING, Phase.ENDED}),
    Phase.KILLING: frozenset({Phase.ENDED}),
    Phase.ENDED: frozenset(),
}

#: The command each stop phase sends to the nodes' agents.
ORDER = {Phase.STOPPING: protocol.TERM, Phase.KILLING: protocol.KILL}


class RunPhase:
    """The run's phase, when its first stop order went out, and the sending of stop orders.

    ``send`` gives a command line to every node whose stream is still open.
    """

    def __init__(self, send: Callable[[str], None]) -> None:
        self._send = send
        self.phase = Phase.STARTING
        self.stop_sent_at: float | None = None  # monotonic time of the first stop order

    @property
    def stopping(self) -> bool:
        return self.phase.stopping

    def move(self, to: Phase) -> bool:
        """Move to ``to``. Returns False when already there or past it (a second ``term``, say: nothing to do)."""
        if to is self.phase or to not in NEXT[self.phase]:
            return False
        self.phase = to
        return True

    def stop(self, to: Phase) -> None:
        """Send the stop order of ``to`` (STOPPING: ``term``, KILLING: ``kill``) unless the run is already there
        or past it."""
        if to not in ORDER:
            raise ValueError(f"{to} is not a stop phase")
        if not self.move(to):
            return
        self.stop_sent_at = self.stop_sent_at or time.monotonic()
        self._send(f"{ORDER[to]}\n")

    def since_stop(self, now: float) -> float | None:
        """Seconds since the first stop order, None when none went out."""
        return None if self.stop_sent_at is None else now - self.stop_sent_at


#: `clusterrun down`'s request to a detached run's supervisor: stop the run (as a first Ctrl-C does), never kill.
STOP_SIGNAL = signal.SIGUSR1


def signal_order(signum: int, *, first: bool) -> Phase | None:
    """The stop a signal orders: the first stops the run (``term``), a second kills it (``kill``), but
    :data:`STOP_SIGNAL` never kills (two ``clusterrun down`` at once are one stop): None, nothing more to do."""
    if first:
        return Phase.STOPPING
    return None if signum == STOP_SIGNAL else Phase.KILLING
