"""Connections opened early: ``up`` starts making every node's transport and connection as soon as it has the plan,
in the background, and loads the rest of itself (the launch, the supervisor, the watch: a tenth of a second and
more of imports) while the handshakes go on, instead of before them.

Nothing is lost on the way: an error making the transports (an ssh_config the transport refuses) is raised where
``up`` asks for them (:attr:`EarlyConnections.transports`), and each connection's error, typed, where the launch
would have connected (:meth:`EarlyConnections.wait`), so a node that cannot be reached is reported exactly as
before, once, after one connect timeout. :meth:`wait` also says when the connection began and opened, for the
launch timeline's ``connect`` phase.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

from clusterrun.errors import CommandTimeout
from clusterrun.transport.base import Transport
from clusterrun.transport.fanout import MAX_PARALLEL
from clusterrun.transport.ssh import dial
from clusterrun.waits import future_done

#: Seconds to wait for the transports to be made (reading ssh_config and known_hosts, importing paramiko).
MAKE_TIMEOUT = 60.0


class EarlyConnections:
    """Every node's transport, made and connecting in the background from the moment this is made."""

    def __init__(self, make: Callable[[], Mapping[str, Transport]]) -> None:
        self._made: Future[dict[str, Transport]] = Future()
        self._futures: dict[str, Future[tuple[float, float]]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._start, args=(make,), daemon=True, name="connect-early").start()

    def _start(self, make: Callable[[], Mapping[str, Transport]]) -> None:
        try:
            transports = dict(make())
        except BaseException as exc:  # raised to the caller by `transports`, where up would have made them
            self._made.set_exception(exc)
            return
        with self._lock:
            if self._closed:  # `up` stopped while they were being made
                for transport in transports.values():
                    transport.close()
            else:
                self._pool = ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(transports))),
                                                thread_name_prefix="connect")
                self._futures = {name: self._pool.submit(self._connect, t) for name, t in transports.items()}
        self._made.set_result(transports)

    @staticmethod
    def _connect(transport: Transport) -> tuple[float, float]:
        began = time.time()
        transport.connect()
        return min(began, transport.dialled or began), time.time()  # dialled: its TCP connection began earlier

    @property
    def transports(self) -> dict[str, Transport]:
        """Every node's transport. Raises what making them raised."""
        if not future_done(self._made, MAKE_TIMEOUT):  # in slices: Ctrl-C is seen meanwhile
            raise CommandTimeout("clusterrun", f"the nodes' transports were not made in {MAKE_TIMEOUT:g}s")
        return self._made.result()

    def has(self, name: str) -> bool:
        """A connection to ``name`` is under way (or done)."""
        return self._made.done() and name in self._futures

    def wait(self, name: str, timeout: float) -> tuple[float, float]:
        """Until ``name``'s connection is open. Returns when it began and when it opened (epoch seconds). Raises
        its error (a :class:`~clusterrun.errors.TransportError`), or :class:`CommandTimeout` after ``timeout``
        seconds (the transport's own connect timeout ends it first)."""
        try:
            return self._futures[name].result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise CommandTimeout(name, f"the connection did not open in {timeout:g}s") from None

    def close(self) -> None:
        """Stop: connections under way are not waited for (closing their transports ends them)."""
        with self._lock:
            self._closed = True
            pool = self._pool
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if self._made.done() and self._made.exception() is None:
            for transport in self._made.result().values():
                transport.close()
        dial.forget()  # a connect waiting on a dial under way ends now
