"""The cluster supervisor's side of the agents' connections: a listener on rank 0's node, one link per node.

Each node's agent connects to the supervisor's port and proves it knows the run's secret
(:mod:`clusterrun.remote.relay`); the connection then becomes a :class:`SocketStream`, the same
:class:`~clusterrun.transport.base.Stream` an ssh channel is, so the supervisor holds the same
:class:`~clusterrun.agents.link.AgentLink` per node as an attached ``up`` does. Standard library only: this module
travels to rank 0's node with the supervisor (clusterrun/remote/bundle.py).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Collection, Iterator

from clusterrun.agents.link import AgentLink
from clusterrun.remote import relay
from clusterrun.transport.base import Stream

#: Bytes read from an agent's connection at a time.
CHUNK = 1 << 16


class SocketStream(Stream):
    """One agent's authenticated connection as a stream: its events in, its commands out."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()
        self._closed = False

    def chunks(self) -> Iterator[bytes]:
        while True:
            try:
                data = self.sock.recv(CHUNK)
            except OSError:
                return
            if not data:
                return
            yield data

    def send(self, text: str) -> bool:
        with self._send_lock:
            if self._closed:
                return False
            try:
                self.sock.sendall(text.encode())
                return True
            except OSError:
                return False

    def wait(self, timeout: float) -> int | None:
        return None  # the agent is a process of another node: only its stream's end is seen here

    def abort(self) -> None:
        with self._send_lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(OSError):  # wakes the reader at once; the agent then stops its job by itself
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def stderr_text(self) -> str:
        return ""


class Listener:
    """The supervisor's port: accepts the run's agents, each proven by the handshake, as :class:`AgentLink` s."""

    def __init__(self, run_id: str, secret: str, nodes: Collection[str], host: str = "") -> None:
        self.run_id, self._secret, self.nodes = run_id, secret, set(nodes)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(128)
        self.port: int = self.sock.getsockname()[1]
        self.refused: list[str] = []  # connections that failed the handshake, said in the supervisor's log
        self._links: queue.Queue[tuple[str, socket.socket]] = queue.Queue()
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True, name="supervisor-accept").start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._greet, args=(conn, peer), daemon=True, name="supervisor-greet").start()

    def _greet(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        conn.settimeout(relay.HANDSHAKE_TIMEOUT)
        try:
            node = relay.supervisor_side(conn, self._secret, self.run_id, self.nodes)
        except (OSError, relay.HandshakeError) as exc:
            self.refused.append(f"{peer[0]}:{peer[1]}: {exc}")
            conn.close()
            return
        conn.settimeout(None)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self._links.put((node, conn))

    def links(self, deadline: float) -> tuple[dict[str, AgentLink], list[str]]:
        """Every node's link, waiting until each agent has connected or the monotonic ``deadline``: (links, the
        nodes that did not come). A node that connects twice keeps its first connection."""
        got: dict[str, AgentLink] = {}
        while len(got) < len(self.nodes):
            try:
                node, conn = self._links.get(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    break
                continue
            if node in got:
                conn.close()
                continue
            got[node] = AgentLink(node, SocketStream(conn))
        return got, sorted(self.nodes - set(got))

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self.sock.close()
