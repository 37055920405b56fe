"""A node agent's stream moved to a detached run's supervisor on rank 0's node: the handshake, both sides.

``up --detach`` starts a supervisor on rank 0's node (clusterrun/detached/host.py), which listens on a TCP port of
that node's host network. Each node's agent, waiting in ``prepare`` after its checks, is told ``relay <json>``
(``address``, ``port``, ``run_id``, ``node``, ``secret``); it connects, proves it knows the run's secret and has the
supervisor prove it too, and from then on its events go to that socket and its commands come from it: to the
supervisor, the connection is what the ssh channel was to clusterrun (the same frames, ``go``, ``ping``, ``term``).

The secret is per run, random, and travels only on the agents' and the supervisor's stdin: in no argv, no file.
Each side sends a fresh nonce and checks the other's HMAC-SHA256 over it, so the secret never crosses the network
and a replayed answer is worthless. Every step is bounded (:data:`HANDSHAKE_TIMEOUT`).

Standard library only (Python 3.8+): this module travels to the nodes with the agent.
"""

import hashlib
import hmac
import json
import os
import socket

HANDSHAKE_TIMEOUT = 10.0
MAX_LINE = 4096  # a handshake line longer than this is not one of ours
RELAY, RELAYED = "relay", "relayed"  # the agent's command (clusterrun -> agent) and its answer


class HandshakeError(Exception):
    """The other end is not the run's supervisor (or agent), or it broke off."""


def proof(secret: str, role: str, run_id: str, node: str, nonce: str) -> str:
    """The HMAC one side sends to show it holds ``secret`` (``role``: who proves: agent or supervisor)."""
    text = "|".join((role, run_id, node, nonce)).encode()
    return hmac.new(secret.encode(), text, hashlib.sha256).hexdigest()


def read_line(sock: socket.socket) -> dict:
    """One JSON line, read a byte at a time: nothing after its newline is taken from the socket (the stream that
    follows belongs to someone else)."""
    data = bytearray()
    while True:
        byte = sock.recv(1)
        if not byte:
            raise HandshakeError("the connection closed during the handshake")
        if byte == b"\n":
            break
        data += byte
        if len(data) > MAX_LINE:
            raise HandshakeError("a handshake line too long")
    try:
        value = json.loads(data.decode())
    except ValueError:
        raise HandshakeError("not a handshake line: %r" % bytes(data[:60])) from None
    if not isinstance(value, dict):
        raise HandshakeError("not a handshake line: %r" % bytes(data[:60]))
    return value


def write_line(sock: socket.socket, value: dict) -> None:
    sock.sendall((json.dumps(value, separators=(",", ":")) + "\n").encode())


def agent_side(sock: socket.socket, secret: str, run_id: str, node: str) -> None:
    """The agent's half: answer the supervisor's nonce, check its proof. Raises :class:`HandshakeError`."""
    hello = read_line(sock)
    if hello.get("run") != run_id or not isinstance(hello.get("nonce"), str):
        raise HandshakeError("this port is not run %s's supervisor" % run_id)
    mine = os.urandom(16).hex()
    write_line(sock, {"node": node, "nonce": mine, "proof": proof(secret, "agent", run_id, node, hello["nonce"])})
    answer = read_line(sock)
    if not answer.get("ok"):
        raise HandshakeError("the supervisor refused this node: %s" % answer.get("why", "no reason given"))
    if not hmac.compare_digest(str(answer.get("proof", "")), proof(secret, "supervisor", run_id, node, mine)):
        raise HandshakeError("the supervisor did not prove it holds the run's secret")


def supervisor_side(sock: socket.socket, secret: str, run_id: str, expected) -> str:
    """The supervisor's half: the node the agent proved it is (one of ``expected``). Raises :class:`HandshakeError`
    (after telling the agent why, where it got that far)."""
    mine = os.urandom(16).hex()
    write_line(sock, {"hello": "clusterrun-supervisor", "run": run_id, "nonce": mine})
    answer = read_line(sock)
    node = str(answer.get("node", ""))
    if node not in expected:
        write_line(sock, {"ok": False, "why": "node %r is not part of run %s" % (node[:60], run_id)})
        raise HandshakeError("an agent for an unknown node %r" % node[:60])
    if not hmac.compare_digest(str(answer.get("proof", "")), proof(secret, "agent", run_id, node, mine)):
        write_line(sock, {"ok": False, "why": "wrong proof of the run's secret"})
        raise HandshakeError("%s: wrong proof of the run's secret" % node)
    write_line(sock, {"ok": True, "proof": proof(secret, "supervisor", run_id, node, str(answer.get("nonce", "")))})
    return node


def connect(address: str, port: int, secret: str, run_id: str, node: str,
            timeout: float = HANDSHAKE_TIMEOUT) -> socket.socket:
    """A connection to the run's supervisor, handshake done (blocking, no timeout from then on: heartbeats bound
    it). Raises OSError or :class:`HandshakeError`."""
    sock = socket.create_connection((address, port), timeout=timeout)
    try:
        agent_side(sock, secret, run_id, node)
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    return sock
