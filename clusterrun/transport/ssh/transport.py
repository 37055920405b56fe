"""The SSH transport: one paramiko connection per node, opened on first use and reused for every command.

Where the connection goes (ssh_config, ProxyJump hops, a ProxyCommand) is decided by
:mod:`clusterrun.transport.ssh.target`; the key the node shows is judged by
:mod:`clusterrun.transport.ssh.known_hosts`; a ProxyCommand runs in :mod:`clusterrun.transport.ssh.proxy`, and
a started command's output is read by :mod:`clusterrun.transport.ssh.stream`. Commands run through the login
shell as one command line (``cd DIR && env K=V argv...``), so nothing depends on sshd's ``AcceptEnv``.

paramiko rather than OpenSSH's client with ControlMaster: measured by bench/ssh_transport.py (docs/ssh.md),
a first launch through ``ssh`` costs 2.3-2.8x the CPU and 1.9-3.2x the time, and even a repeat launch through
live masters is no faster and costs more CPU per node, per command (a new ``ssh`` process each, against a
channel on the open connection here).

Every wait is bounded: ``connect_timeout`` bounds the TCP connect, the handshake, authentication,
opening each channel and the node's answer to each exec or sftp request; a command by its own
timeout. paramiko's exceptions become :class:`~clusterrun.errors.TransportError` subclasses that
name the node and say what to do.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from clusterrun.errors import AuthError, CommandTimeout, ConnectError, HostKeyError, TransportError, UsageError
from clusterrun.inventory.models import SshSettings
from clusterrun.transport.base import DEFAULT_COMMAND_TIMEOUT, CommandResult, Stream, Transport, shell_command
from clusterrun.transport.ssh import dial
from clusterrun.transport.ssh.config import other_home_note
from clusterrun.transport.ssh.known_hosts import HostKeyCheck, KnownHosts, prefer_key_types
from clusterrun.transport.ssh.paramiko_lib import paramiko
from clusterrun.transport.ssh.proxy import ProxyCommand
from clusterrun.transport.ssh.stream import SshStream
from clusterrun.transport.ssh.target import SshTarget, resolve_target
from clusterrun.transport.ssh.words import ssh_home

_KEEPALIVE_S = 5
_READ_TICK_S = 1.0
_CLOSE_WAIT_S = 0.5  # close() waits this long for another thread's use of the lock, not for a whole connect
# paramiko's words for a handshake that did not finish in time: no banner, or start_client's timeout
# ran out (it then returns quietly and the next call finds "No existing session").
_HANDSHAKE_STALLED = re.compile(r"banner|No existing session|Negotiation timed out", re.IGNORECASE)


def _connect_error(node: str, target: SshTarget, exc: BaseException,
                   proxy: ProxyCommand | None = None, config_file: str | None = None) -> TransportError:
    where = target.describe()
    if isinstance(exc, HostKeyError):
        return exc
    # paramiko's words where it had nothing to offer (no key file, no agent key): an authentication failure too.
    if isinstance(exc, paramiko.AuthenticationException) or str(exc) == "No authentication methods available":
        keys = f"{', '.join(target.identity_files)} and ssh-agent" if target.identity_files else (
            "ssh-agent only: no key file (IdentityFile none, or no ~/.ssh/id_* of the password database's home "
            f"{ssh_home()})")
        return AuthError(node, f"authentication failed for {where} (tried {keys}); check the user, identity_file "
                               "and the node's ~/.ssh/authorized_keys")
    if proxy is not None:
        ended = proxy.failure()
        if ended:
            return ConnectError(node, f"{ended} ({target.proxy_origin}); check that command by running it in a "
                                      "shell, or set jump_host in the inventory")
        if isinstance(exc, (socket.timeout, TimeoutError)) or (
                isinstance(exc, paramiko.SSHException) and _HANDSHAKE_STALLED.search(str(exc))):
            return ConnectError(node, f"no ssh handshake with {where} within {target.connect_timeout:g}s "
                                      f"({target.proxy_origin}): the command runs, but what it connects to does "
                                      "not answer as an sshd")
    if isinstance(exc, socket.gaierror):
        note = None if config_file else other_home_note()
        return ConnectError(node, f"cannot resolve host name {target.hostname!r}; check `host` in the inventory "
                                  f"or HostName in ssh_config{f' ({note})' if note else ''}")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return ConnectError(node, f"{where} did not answer within {target.connect_timeout:g}s; is the node up and "
                                  "is its ssh port reachable from here (firewall, VPN, wrong address)?")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and exc.errors:
        exc = next(iter(exc.errors.values()))  # one per address tried; the first says why
    if isinstance(exc, ConnectionRefusedError) or (isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED):
        return ConnectError(node, f"connection refused by {where}: sshd is not running there or listens on "
                                  "another port (set ssh.port)")
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return ConnectError(node, f"no route to {target.hostname}; check the address and this machine's routes")
    if isinstance(exc, paramiko.SSHException) and _HANDSHAKE_STALLED.search(str(exc)):
        return ConnectError(node, f"{where} accepted the connection but did not complete the ssh handshake within "
                                  f"{target.connect_timeout:g}s: is sshd (and not another service) listening on "
                                  f"port {target.port}, and is the node not overloaded?")
    if isinstance(exc, paramiko.SSHException):
        return ConnectError(node, f"ssh to {where} failed: {exc}")
    return ConnectError(node, f"cannot connect to {where}: {exc}")


@contextlib.contextmanager
def _answered_within(channel: paramiko.Channel, seconds: float) -> Iterator[threading.Event]:
    """Close ``channel`` if the block is still waiting after ``seconds``; the event tells whether it was.

    paramiko waits for the server's answer to an exec or subsystem request with no timeout at all: a node
    that stalls after the session opened would hold the caller forever.
    """
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            channel.close()

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield expired
    finally:
        timer.cancel()
        timer.join(timeout=1.0)


#: AES-GCM first. An AEAD cipher needs no separate MAC, which paramiko computes and compares in Python for every
#: packet: every heartbeat of every node, for the whole run. OpenSSH has offered both since 6.2; a server without
#: them still gets the usual ciphers, in their usual order.
_AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def _transport_factory(known_key_types: list[str]) -> Callable[..., paramiko.Transport]:
    keyed = prefer_key_types(known_key_types)

    def make(sock: Any, **options: Any) -> paramiko.Transport:
        transport = keyed(sock, **options)
        security = transport.get_security_options()
        ciphers = list(security.ciphers)
        security.ciphers = [c for c in _AEAD_CIPHERS if c in ciphers] + [c for c in ciphers if c not in _AEAD_CIPHERS]
        return transport

    return make


class SshTransport(Transport):
    """One node reached over SSH. Thread-safe: commands may run on several channels at once."""

    def __init__(self, node: str, host: str, settings: SshSettings | None = None) -> None:
        self.node = node
        self.host = host
        self.settings = settings or SshSettings()
        self._target: SshTarget | None = None
        self._client: paramiko.SSHClient | None = None
        self._jump_clients: list[paramiko.SSHClient] = []
        self._proxies: list[ProxyCommand] = []
        self._lock = threading.Lock()
        self._closes = 0  # close() calls made while a connect held the lock: that connect's result is dropped

    @property
    def target(self) -> SshTarget:
        if self._target is None:
            try:
                self._target = resolve_target(self.host, self.settings)
            except UsageError as exc:
                if str(exc).startswith(f"{self.node}:"):
                    raise
                raise UsageError(f"{self.node}: {exc}") from None  # which node's ssh_config lookup failed
        return self._target

    # ------------------------------------------------------------ connection

    def _new_client(self, target: SshTarget, sock: Any = None, proxy: ProxyCommand | None = None,
                    dialled: bool = False) -> paramiko.SSHClient:
        """A client connected to ``target`` over ``sock`` (a ProxyCommand's, a jump's channel) or its own TCP
        connection; ``dialled``: the one dialled at the start (:mod:`clusterrun.transport.ssh.dial`), when there is."""
        # Read on every connect (a malformed line only warns); paramiko's own host key list stays empty so
        # that every key reaches HostKeyCheck, which knows the file and line of what it compares with.
        known = KnownHosts.load(target.known_hosts + target.global_known_hosts)
        for key in target.identity_files:  # paramiko would block on a FIFO or read a device forever
            if os.path.exists(key) and not os.path.isfile(key):
                raise AuthError(self.node, f"identity_file {key} is not a regular file, so not read as a key")
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(HostKeyCheck(self.node, target, known))
        try:
            early = dial.take(target.hostname, target.port, target.connect_timeout) if dialled else None
            if early is not None:
                sock, self.dialled = early
            client.connect(
                target.hostname, port=target.port, username=target.user,
                # The keys OpenSSH would offer, default keys included (paramiko's own look is in $HOME).
                key_filename=list(target.identity_files) or None, look_for_keys=False, allow_agent=True,
                # One bound per phase: TCP connect and key exchange, the banner, authentication, channels.
                timeout=target.connect_timeout, banner_timeout=target.connect_timeout,
                auth_timeout=target.connect_timeout, channel_timeout=target.connect_timeout, sock=sock,
                transport_factory=_transport_factory(known.key_types(target.known_hosts_name)),
            )
        except Exception as exc:
            client.close()
            if isinstance(exc, (paramiko.SSHException, OSError, HostKeyError, EOFError)):
                raise _connect_error(self.node, target, exc, proxy, self.settings.config_file) from None
            raise
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(_KEEPALIVE_S)
            # paramiko's reading thread wakes every 0.1 s when nothing arrives: 10 wakeups a second per node,
            # for the whole run. Once connected it only needs to look for the keepalive, so a second will do
            # (closing does not wait for it).
            with contextlib.suppress(OSError, AttributeError):
                transport.sock.settimeout(_READ_TICK_S)
        return client

    def connect(self) -> None:
        """Open the connection now (it is otherwise opened by the first command)."""
        self._connected()

    def _connected(self) -> paramiko.SSHClient:
        with self._lock:
            if self._client is not None:
                transport = self._client.get_transport()
                if transport is not None and transport.is_active():
                    return self._client
            self._close_locked()
            closes = self._closes
            try:
                self._client = self._open(self.target)
            except BaseException:
                self._close_locked()  # the hops and ProxyCommands opened before the failure
                raise
            if self._closes != closes:  # closed while it connected: what it opened goes too
                self._close_locked()
                raise ConnectError(self.node, "the connection was closed while it was being opened")
            return self._client

    def _open(self, target: SshTarget) -> paramiko.SSHClient:
        """A client connected to ``target`` through its ProxyCommand or jump chain (kept for closing)."""
        if target.proxy_command:
            try:
                proxy = ProxyCommand(target.proxy_command)
            except OSError as exc:
                raise ConnectError(self.node, f"cannot start the ProxyCommand `{target.proxy_command}` "
                                              f"({target.proxy_origin}): {exc}") from None
            self._proxies.append(proxy)
            return self._new_client(target, proxy.sock, proxy)
        if target.jump is None:
            return self._new_client(target, dialled=True)
        jump_client = self._open(target.jump)
        self._jump_clients.append(jump_client)
        transport = jump_client.get_transport()
        if transport is None:
            raise ConnectError(self.node, f"the connection to the jump host {target.jump.describe()} closed")
        try:
            channel = transport.open_channel("direct-tcpip", (target.hostname, target.port), ("", 0),
                                             timeout=target.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectError(self.node, f"the jump host {target.jump.describe()} could not reach "
                                          f"{target.hostname}:{target.port}: {exc}") from None
        return self._new_client(target, channel)

    def _channel(self) -> paramiko.Channel:
        client = self._connected()
        transport = client.get_transport()
        if transport is None:
            raise ConnectError(self.node, "the ssh connection closed")
        try:
            return transport.open_session(timeout=self.target.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectError(self.node, f"cannot open an ssh session on {self.target.describe()}: {exc}") from None

    def _request(self, channel: paramiko.Channel, send: Callable[[], None], what: str, seconds: float) -> None:
        """Send an exec or subsystem request and wait at most ``seconds`` for the node to accept it."""
        with _answered_within(channel, seconds) as expired:
            try:
                send()
            except (paramiko.SSHException, OSError, EOFError) as exc:
                channel.close()
                if expired.is_set():
                    raise CommandTimeout(self.node, f"{self.target.describe()} did not accept {what} within "
                                                    f"{seconds:g}s (is the node or its sshd stalled?)") from None
                raise ConnectError(self.node, f"cannot start {what}: {exc}") from None

    # ------------------------------------------------------------ commands

    def run(self, argv: Sequence[str], *, timeout: float = DEFAULT_COMMAND_TIMEOUT,
            env: Mapping[str, str] | None = None, cwd: str | None = None,
            stdin: bytes | None = None) -> CommandResult:
        command = shell_command(argv, env, cwd)
        shown = f"`{' '.join(argv)[:200]}`"
        started = time.monotonic()
        deadline = started + timeout
        channel = self._channel()
        out, err = bytearray(), bytearray()
        try:
            self._request(channel, lambda: channel.exec_command(command), shown,
                          min(timeout, self.target.connect_timeout))
            if stdin is not None:
                channel.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    channel.sendall(stdin)
                except TimeoutError:
                    raise CommandTimeout(self.node, f"{shown} did not read its stdin within {timeout:g}s") from None
            channel.shutdown_write()
            channel.settimeout(0.2)
            # The channel's poll descriptor is readable while output or the end waits to be taken: the thread
            # sleeps until then (a 10 ms poll instead costs every node's thread CPU for as long as the command runs).
            ready = channel.fileno()
            while True:
                while channel.recv_ready():
                    out += channel.recv(65536)
                while channel.recv_stderr_ready():
                    err += channel.recv_stderr(65536)
                # The end of the output, not the exit status, ends the reading: sshd may send the status while
                # the command's last lines are still on their way (a loaded node), and they would be lost.
                ended = channel.eof_received or channel.closed
                if ended and channel.exit_status_ready() and not channel.recv_ready() \
                        and not channel.recv_stderr_ready():
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommandTimeout(self.node, f"{shown} did not finish within {timeout:g}s")
                if ended:  # the output is complete; the status follows
                    channel.status_event.wait(min(left, 0.5))
                else:
                    select.select([ready], [], [], min(left, 0.5))
            code = channel.recv_exit_status()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectError(self.node, f"the ssh connection broke while running `{argv[0]}`: {exc}") from None
        finally:
            channel.close()
        return CommandResult(self.node, command, code, out.decode(errors="replace"), err.decode(errors="replace"),
                             time.monotonic() - started)

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None) -> Stream:
        channel = self._channel()
        command = shell_command(argv, env, cwd)
        self._request(channel, lambda: channel.exec_command(command), f"`{argv[0]}`", self.target.connect_timeout)
        return SshStream(channel)

    def put(self, local: Path, remote: str) -> None:
        remote_path = remote[2:] if remote.startswith("~/") else remote  # sftp starts in the home directory
        channel = self._channel()
        try:
            self._request(channel, lambda: channel.invoke_subsystem("sftp"), "the sftp subsystem",
                          self.target.connect_timeout)
            # Every sftp reply is waited for at most this long (a stalled node fails the copy, not the caller).
            channel.settimeout(max(60.0, self.target.connect_timeout))
            with paramiko.SFTPClient(channel) as sftp:
                # Write beside, then rename: a node sharing this path (NFS home) never reads half a file.
                partial = f"{remote_path}.part-{os.getpid()}-{threading.get_ident()}"
                sftp.put(str(local), partial)
                sftp.chmod(partial, os.stat(local).st_mode & 0o777)
                sftp.posix_rename(partial, remote_path)
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise TransportError(self.node, f"cannot copy {local} to {remote}: {exc}") from None
        finally:
            channel.close()

    # ------------------------------------------------------------ close

    def _close_locked(self) -> None:
        # The node's connection first, then each hop it went through, then the ProxyCommands under them.
        for client in (self._client, *reversed(self._jump_clients)):
            if client is not None:
                client.close()
        for proxy in reversed(self._proxies):
            proxy.close()
        self._client = None
        self._jump_clients = []
        self._proxies = []

    def peer_address(self) -> str | None:
        """The address this connection reached (None before connecting, through a ProxyJump or ProxyCommand)."""
        with contextlib.suppress(Exception):
            transport = self._client.get_transport() if self._client else None
            if transport is not None and not self.target.jump and not self.target.proxy_command:
                return str(transport.getpeername()[0])
        return None

    def close(self) -> None:
        """Close the connection. A connect under way (to a host that drops every packet it lasts its whole
        connect_timeout) is not waited for: it closes what it opened when it ends, and raises ConnectError."""
        if not self._lock.acquire(timeout=_CLOSE_WAIT_S):
            self._closes += 1
            if not self._lock.acquire(blocking=False):  # still connecting: it sees the count and closes
                return
        try:
            self._close_locked()
        finally:
            self._lock.release()
