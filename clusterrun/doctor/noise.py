"""Library noise during a doctor run kept for the report, off the terminal.

paramiko's transport threads log socket errors when a connection closes under them while they read or
write (``Socket exception: Bad file descriptor (9)``, seen as the bandwidth check stops its iperf3
servers and as doctor closes its connections). paramiko has no handler of its own, so Python prints such
records bare on stderr (``logging.lastResort``), where they read like a tool's failure. doctor keeps them
with the report's evidence instead (``evidence/transport.log``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

#: The loggers whose records are kept; lines kept per run at most.
LOGGERS = ("paramiko",)
MAX_LINES = 1000


class _Keeper(logging.Handler):
    """Appends each record to the current run's list; with no run going, drops it (a closing connection's
    thread may log after doctor finished: nothing to report it to, and nothing to print)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
        self.target: list[str] | None = None
        self.guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self.guard:
            if self.target is not None and len(self.target) < MAX_LINES:
                self.target.append(self.format(record))


_KEEPER = _Keeper()


@contextlib.contextmanager
def kept_noise() -> Iterator[list[str]]:
    """Within the block, the records of :data:`LOGGERS` go to the list yielded, not to stderr."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _KEEPER not in logger.handlers:
            logger.addHandler(_KEEPER)  # stays: also silences what arrives after the block
    lines: list[str] = []
    with _KEEPER.guard:
        _KEEPER.target = lines
    try:
        yield lines
    finally:
        with _KEEPER.guard:
            _KEEPER.target = None
