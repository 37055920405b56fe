"""TCP connections to the nodes' sshd, dialled before the rest of clusterrun has loaded.

``up`` needs paramiko, pydantic and the rest of itself (a few tenths of a second of imports) before its first SSH
handshake can begin; the TCP connection it needs first does not. :func:`dial` opens it from the first moments
of the process (standard library only), in a thread per host, and :func:`take` hands the socket to the SSH
transport that connects to that host and port (:class:`clusterrun.transport.ssh.transport.SshTransport`), which then
carries on as if it had connected itself: the key exchange, authentication and every check are the same.

A dial that failed hands its error over instead, so a host that refuses or does not answer is reported exactly
as before, once. A socket nobody takes is closed when the process ends (sshd logs a closed pre-auth connection).
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import Future

#: Hosts dialled at most (a larger cluster dials through the transports as before).
MAX_DIALS = 256

_lock = threading.Lock()
_dials: dict[tuple[str, int], Future[tuple[socket.socket, float]]] = {}
_taking: set[Future[tuple[socket.socket, float]]] = set()  # taken, their dial still under way


def _open(future: Future[tuple[socket.socket, float]], host: str, port: int, timeout: float) -> None:
    began = time.time()
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        with _lock:
            if not future.done():
                future.set_exception(exc)
        return
    with _lock:
        if not future.done():  # not given up meanwhile (forget)
            future.set_result((sock, began))
            return
    sock.close()


def dial(host: str, port: int, timeout: float) -> None:
    """Begin a TCP connection to ``host``:``port`` in the background (once per host and port)."""
    with _lock:
        if (host, port) in _dials or len(_dials) >= MAX_DIALS:
            return
        future: Future[tuple[socket.socket, float]] = Future()
        _dials[(host, port)] = future
    threading.Thread(target=_open, args=(future, host, port, timeout), daemon=True, name=f"dial-{host}").start()


def take(host: str, port: int, timeout: float) -> tuple[socket.socket, float] | None:
    """The connection dialled to ``host``:``port`` and when its dialling began (epoch seconds), once; None when
    none was dialled (or it was taken). Raises the dial's OSError; waits for a dial under way at most
    ``timeout`` seconds (its own connect bound ends it first)."""
    with _lock:
        future = _dials.pop((host, port), None)
        if future is None:
            return None
        _taking.add(future)
    try:
        return future.result(timeout=timeout)
    finally:
        with _lock:
            _taking.discard(future)


def dialled() -> set[tuple[str, int]]:
    """The hosts and ports dialled and not taken yet."""
    with _lock:
        return set(_dials)


def forget() -> None:
    """Close every connection dialled and not taken, and give up the dials still under way: a :func:`take`
    waiting on one raises at once (the command is ending: nothing may wait out a connect timeout)."""
    with _lock:
        futures = [*_dials.values(), *_taking]
        _dials.clear()
        for future in futures:
            if not future.done():
                future.set_exception(ConnectionAbortedError("the connection was given up (clusterrun is ending)"))
    for future in futures:
        if future.exception() is None:
            future.result()[0].close()
