"""torchrun's known end-of-run noise, told apart from a real failure in its launcher output, line by line.

When a node's workers have all finished, torchrun's agent waits on an exit barrier in the master's store
(``_exit_barrier`` in torch/distributed/elastic/agent/server/api.py, reached only after the local worker
group SUCCEEDED). The master's torchrun may be gone by then: a non-master node then logs the store
client's C++ warning with its stack, and ``logger.exception``'s block, each of its lines carrying the log
prefix (recorded in tests/fixtures/real/torchrun/exit_barrier_node2_of_4.txt)::

    [W1125 15:23:04.762625136 TCPStore.cpp:138] [c10d] recvValueWithTimeout failed on SocketImpl(...): Failed
        to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?
    Exception raised from recvBytes at .../c10d/Utils.hpp:787 (most recent call first):
    frame #0: c10::Error::Error(...) + 0x9d (0x7f4bcad73b8d in .../libc10.so)
    ...

    E1125 15:23:04.946000 21982 site-packages/torch/distributed/elastic/agent/server/api.py:1008] Error waiting
        on exit barrier. Elapsed: 0.038 seconds
    E1125 15:23:04.946000 21982 site-packages/.../api.py:1008] Traceback (most recent call last):
    E1125 15:23:04.946000 21982 site-packages/.../api.py:1008]   File ".../api.py", line 994, in _exit_barrier
    ...
    E1125 15:23:04.946000 21982 site-packages/.../api.py:1008] torch.distributed.DistNetworkError: Failed to recv

and still exits 0: the run succeeded. :class:`NoiseFilter` holds such a block back while it arrives and
drops it from the screen once it is whole (it stays in launcher.log). Anything else is let through as it
came: a block that turns out not to be that (the store warning not followed by the exit-barrier error, a
line that is no part of a traceback, more than :data:`HOLD_LINES` lines) is released whole and in order,
and a block held :data:`HOLD_SECONDS` without a further line is released unless it is already whole.
Pure: no I/O, times come in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HOLD_LINES = 80  # at most this many lines are held back (the exit-barrier block is about 10 to 20)
HOLD_SECONDS = 5.0  # ... and for at most this long without a further line

# torch >= 2.2 writes ``E1125 15:22:37.512000 4242 .../api.py:1008] Error waiting ...`` and repeats the prefix
# on each line of the traceback; older ones wrote ``ERROR:torch.distributed.elastic.agent.server.api:Error ...``
# and the traceback's lines bare.
_HEADER = re.compile(r"^(?P<prefix>.*?(?:\] ?|:))Error waiting on exit barrier\. Elapsed: [\d.e-]+ seconds\s*$")
# The store client's warning when the master's store closed under it (its C++ stack follows).
_STORE_WARNING = re.compile(r"\[c10d\] recvValueWithTimeout failed on .*Failed to recv, got 0 bytes")
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("The above exception was the direct cause of the following exception:",
            "During handling of the above exception, another exception occurred:")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?::.*)?$")  # ``torch.distributed.DistNetworkError: ...``
# A C++ error's stack (c10::Error): ``Exception raised from recvBytes at ...``, ``frame #3: ...``.
_CPP_TRACE = re.compile(r"^(?:Exception raised from |frame #\d+: |<omitting python frames>$)")


@dataclass(frozen=True)
class Sorted:
    """What to do with the lines so far: ``show`` these now, in order; ``noise`` is True when a whole
    exit-barrier block was recognised (and is not in ``show``)."""

    show: tuple[str, ...] = ()
    noise: bool = False


def is_exit_barrier_header(line: str) -> bool:
    """Whether ``line`` is the first line of torchrun's exit-barrier error."""
    return bool(_HEADER.match(line))


class NoiseFilter:
    """Sorts one node's torchrun lines, in the order they came, into shown and known noise."""

    def __init__(self) -> None:
        self._held: list[str] = []
        self._since = 0.0  # when the last held line came
        # "" (nothing held), "store" (the store warning and its C++ stack), "header" (the exit-barrier error's
        # first line), "trace" (in its traceback), "exception" (the traceback's last line seen)
        self._state = ""
        self._prefix = ""  # the exit-barrier error's log prefix, which its traceback's lines repeat

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def feed(self, line: str, now: float) -> Sorted:
        """The next line of torchrun's output, which came at ``now`` (seconds, any monotonic clock)."""
        if not self._held:
            return self._start(line, now)
        step = self._next_state(line)
        if step is None:  # the held block ended with this line, or was never the known noise
            done = self._release(noise=self._state == "exception")
            after = self._start(line, now)
            return Sorted(done.show + after.show, done.noise or after.noise)
        self._held.append(line)
        self._state, self._since = step, now
        if len(self._held) > HOLD_LINES:
            return self._release(noise=False)
        return Sorted()

    def due(self, now: float) -> Sorted:
        """Release a block held for longer than :data:`HOLD_SECONDS` since its last line (noise if whole)."""
        if self._held and now - self._since >= HOLD_SECONDS:
            return self._release(noise=self._state == "exception")
        return Sorted()

    def flush(self) -> Sorted:
        """torchrun's output ended: what is still held (a whole block is noise, anything else is shown)."""
        return self._release(noise=self._state == "exception") if self._held else Sorted()

    def _start(self, line: str, now: float) -> Sorted:
        header = _HEADER.match(line)
        if header:
            self._held, self._state, self._since, self._prefix = [line], "header", now, header.group("prefix")
        elif _STORE_WARNING.search(line):
            self._held, self._state, self._since, self._prefix = [line], "store", now, ""
        else:
            return Sorted((line,))
        return Sorted()

    def _next_state(self, line: str) -> str | None:
        """The state after ``line`` if it belongs to the held block, else None."""
        if self._state == "store":
            if _CPP_TRACE.match(line) or not line.strip():
                return "store"
            header = _HEADER.match(line)
            if header:
                self._prefix = header.group("prefix")
                return "header"
            return None
        if self._prefix.strip() and line.startswith(self._prefix):
            line = line[len(self._prefix):]
        if line.strip() == _TRACEBACK:
            return "trace" if self._state in ("header", "exception") else None
        if self._state == "header":
            return None  # the header without its traceback: not the block we know
        if line.startswith((" ", "\t")):
            return "trace" if self._state == "trace" else None
        if self._state == "trace":
            return "exception" if _EXCEPTION.match(line) else None
        if line.strip() in _CHAINED or not line.strip() or _CPP_TRACE.match(line):
            return "exception"  # a chained exception's traceback follows, or the C++ stack of the exception
        return None

    def _release(self, noise: bool) -> Sorted:
        held, self._held, self._state = tuple(self._held), [], ""
        return Sorted(noise=True) if noise else Sorted(held)


# c10d's note that it could not look up a peer's name for its own messages (getnameinfo in socket.cpp), written
# once by every torchrun and every rank where no DNS server answers: c10d connects to an IPv4 address as an
# IPv4-mapped IPv6 one, which /etc/hosts never names, so the lookup goes to DNS even when /etc/hosts lists every
# node. The connection itself uses the address. torch >= 2.2 writes ``[W1125 15:22:54.541303615 socket.cpp:207]
# [c10d] The hostname of the client socket cannot be retrieved. err=-3``; older ones ``[W socket.cpp:NNN] ...``.
_LOOKUP_TEXT = "[c10d] The hostname of the client socket cannot be retrieved"
_LOOKUP = re.compile(r"^\s*\[W[^\]]*\]\s*" + re.escape(_LOOKUP_TEXT) + r"\. err=-?\d+\s*$")
#: What the terminal says once instead of every process's copy of that note.
LOOKUP_NOTE = ("c10d could not look up a peer's host name (\"The hostname of the client socket cannot be retrieved\", "
               "from every process where no DNS server answers): harmless, c10d connects by address and only its own "
               "messages lack the name; the rank logs and launcher.log keep each copy")


def is_lookup_note(line: str) -> bool:
    """Whether ``line`` is c10d's reverse-lookup warning and nothing else (a line it was glued to is not)."""
    return _LOOKUP_TEXT in line and bool(_LOOKUP.match(line))


# torchrun's report of being stopped (clusterrun's SIGTERM): "Received 15 death signal, shutting down workers"
# (older torch: "Received Signals.SIGTERM death signal"), then its SignalException traceback.
_STOPPED = re.compile(r"\] ?Received (?:\d+|Signals\.SIG\w+|SIG\w+) death signal, shutting down workers"
                      r"|SignalException: Process \d+ got signal: \d+")
# What torchrun says on every node of every run: its OMP banner, c10d's note on the client socket's name.
_BANNER = re.compile(r"^\s*$|^\*+$|^Setting OMP_NUM_THREADS environment variable for each process"
                     r"|" + re.escape(_LOOKUP_TEXT) + r"|^\[clusterrun\] ")


def stopped_at(lines: list[str]) -> int | None:
    """The index of the first line of torchrun's report of being stopped (by a signal), None without one."""
    return next((i for i, line in enumerate(lines) if _STOPPED.search(line)), None)


def cause_lines(lines: list[str]) -> tuple[int, int] | None:
    """Where a node's launcher.log (``lines``) can hold the cause of a failure: the first and last line numbers
    (from 1) of what torchrun said before it was stopped, its banner left out; None when it said nothing else."""
    end = stopped_at(lines)
    said = [i for i, line in enumerate(lines[:end]) if not _BANNER.search(line)]
    return (said[0] + 1, said[-1] + 1) if said else None
