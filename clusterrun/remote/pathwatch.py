"""The data-path watch: while the job runs, each node agent checks that its data NIC still reaches its peers.

Each agent binds one UDP socket on its node's data address (any free port) and answers every probe that
reaches it. clusterrun then gives each agent its targets (the node of rank 0 and the next node in the
ring, each with its address and watch port); the agent sends each target a small probe every
``interval`` seconds. A target that has answered nothing for ``dead_after`` seconds is *lost*, and its
first answer afterwards makes it *ok* again: each change is reported once, with the time of the last
answer. The probes travel on their own port, next to the job's sockets but never through them. A busy
link still lets some probes through, and one answer is enough: only a path that carries nothing at
all for ``dead_after`` seconds is lost, so a saturated link is never mistaken for a dead one.

Standard library only: this module travels to the nodes with the agent.
"""

from __future__ import annotations

import select
import socket
import threading
import time

PROBE, REPLY = b"crw?", b"crw!"
INTERVAL = 1.0  # seconds between two probes to one target
DEAD_AFTER = 5.0  # seconds without any answer before a path is lost


class Target:
    def __init__(self, node: str, address: str, port: int, since: float) -> None:
        self.node, self.address, self.port = node, address, port
        self.last_answer = since  # monotonic; when the watch began for a target that never answered
        self.last_answer_wall = time.time()
        self.lost = False
        self.answered = False


class PathWatch(threading.Thread):
    """Probes the targets and answers the probes of others; ``on_change(target, lost)`` on every change."""

    def __init__(self, address: str, on_change, interval: float = INTERVAL, dead_after: float = DEAD_AFTER,
                 port: int = 0) -> None:
        super().__init__(daemon=True, name="pathwatch")
        self.address = address
        self.on_change = on_change
        self.interval, self.dead_after = interval, dead_after
        self.targets: dict = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((address, port))  # raises OSError when the address is not this node's
        self.port = self.sock.getsockname()[1]
        self.sent = self.received = 0  # datagrams, for the watch's own cost

    def set_targets(self, targets) -> None:
        """``targets``: dicts with node, address, port. Replaces the previous ones (a dropped node is not watched)."""
        now = time.monotonic()
        with self._lock:
            old = self.targets
            self.targets = {}
            for t in targets:
                key = (t["address"], int(t["port"]))
                self.targets[key] = old.get(key) or Target(str(t["node"]), t["address"], int(t["port"]), now)

    def answer_only(self) -> None:
        """Stop probing and judging (this node's job is over: its paths no longer matter), but keep answering the
        others' probes until :meth:`stop`: a node sending its last logs is not a lost path to the rest."""
        with self._lock:
            self.targets = {}

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        next_probe = time.monotonic()
        seq = 0
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                if now >= next_probe:
                    seq += 1
                    self._probe(seq)
                    self._judge(now)
                    next_probe = now + self.interval
                ready, _, _ = select.select([self.sock], [], [], max(0.0, min(0.5, next_probe - now)))
                if ready:
                    self._receive()
        finally:
            self.sock.close()

    def _probe(self, seq: int) -> None:
        with self._lock:
            targets = list(self.targets.values())
        for t in targets:
            try:
                self.sock.sendto(PROBE + b" %d" % seq, (t.address, t.port))
                self.sent += 1
            except OSError:
                pass  # no route right now: the missing answers tell

    def _receive(self) -> None:
        for _ in range(64):  # what is waiting now, bounded
            try:
                data, peer = self.sock.recvfrom(256, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self.received += 1
            if data.startswith(PROBE):
                try:
                    self.sock.sendto(REPLY + data[len(PROBE):], peer)
                    self.sent += 1
                except OSError:
                    pass
            elif data.startswith(REPLY):
                with self._lock:
                    t = self.targets.get((peer[0], peer[1]))
                if t is not None:
                    t.last_answer, t.last_answer_wall, t.answered = time.monotonic(), time.time(), True
                    if t.lost:
                        t.lost = False
                        self.on_change(t, False)

    def _judge(self, now: float) -> None:
        with self._lock:
            targets = list(self.targets.values())
        for t in targets:
            if not t.lost and now - t.last_answer > self.dead_after:
                t.lost = True
                self.on_change(t, True)
