"""The node agent's output: every event written whole, and nothing once the stream is gone.

Standard library only: this module travels to the nodes with the agent.
"""

import os
import threading
import time

if __package__:
    from clusterrun.remote import protocol
else:
    import protocol

OUT_FD = 1  # where events go: stdout, which is the ssh channel (tests point it at a file)
_out_lock = threading.Lock()
_out_broken = False
_out_progress = time.monotonic()  # when a write last went through (a blocked stream stops moving it)


def emit(event: dict, payload: bytes = b"") -> bool:
    """Write one event (and its payload) with one write, so events never interleave. False once the stream is gone."""
    global _out_broken, _out_progress
    if _out_broken:
        return False
    data = protocol.encode(event, payload)
    with _out_lock:
        try:
            view = memoryview(data)
            while view:
                n = os.write(OUT_FD, view)
                view = view[n:]
                _out_progress = time.monotonic()
        except OSError:
            _out_broken = True  # the stream is gone; logs are still on disk
            return False
    return True


_kept: list = []


def keep(obj) -> None:
    """Hold the object behind OUT_FD (a socket) for the agent's life: its descriptor must not close under us."""
    _kept.append(obj)


def is_broken() -> bool:
    """The stream is gone (clusterrun closed it, or the connection died): nothing more can be sent."""
    return _out_broken


def last_progress() -> float:
    """When a write last went through (monotonic): a stream that stops taking bytes stops moving it."""
    return _out_progress
