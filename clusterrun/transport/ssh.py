"""The SSH transport: one paramiko connection per node, opened on first use and reused for every command.

Commands run through the login shell as one command line (``cd DIR && env K=V argv...``),
so nothing depends on sshd's ``AcceptEnv``. Every connect and every command has a timeout;
paramiko's exceptions become :class:`~clusterrun.errors.TransportError` subclasses that name
the node and say what to do.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import paramiko

from clusterrun.errors import AuthError, CommandTimeout, ConnectError, HostKeyError, TransportError
from clusterrun.inventory.models import HostKeyPolicy, SshSettings
from clusterrun.transport.base import DEFAULT_COMMAND_TIMEOUT, CommandResult, Stream, Transport, shell_command
from clusterrun.transport.ssh_target import SshTarget, resolve_target

_STDERR_KEEP = 64 * 1024
_KEEPALIVE_S = 5
_RECV_CHUNK = 1 << 18
_known_hosts_lock = threading.Lock()


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} SHA256:{key.fingerprint.split(':', 1)[-1]}" if hasattr(key, "fingerprint") else (
        key.get_name())


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """What to do with a host whose key is not in known_hosts (a *changed* key never reaches here)."""

    def __init__(self, node: str, target: SshTarget) -> None:
        self.node = node
        self.target = target

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        t = self.target
        if t.policy is HostKeyPolicy.strict:
            raise HostKeyError(
                self.node,
                f"{hostname} is not in {t.known_hosts} and host_key_policy is strict; after checking the key "
                f"({_fingerprint(key)}), add it: ssh-keyscan -p {t.port} {t.hostname} >> {t.known_hosts}",
            )
        client.get_host_keys().add(hostname, key.get_name(), key)
        if t.policy is HostKeyPolicy.accept_new:
            line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
            with _known_hosts_lock:
                path = Path(t.known_hosts)
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                with open(path, "a", encoding="utf-8") as fh:
                    fh.write(line)


def _connect_error(node: str, target: SshTarget, exc: BaseException) -> TransportError:
    where = target.describe()
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostKeyError(
            node,
            f"the host key of {target.known_hosts_name} CHANGED (expected {_fingerprint(exc.expected_key)}, got "
            f"{_fingerprint(exc.key)}). If the node was reinstalled, remove the old key with "
            f"`ssh-keygen -R '{target.known_hosts_name}' -f {target.known_hosts}`; otherwise do not connect",
        )
    if isinstance(exc, HostKeyError):
        return exc
    if isinstance(exc, paramiko.AuthenticationException):
        keys = ", ".join(target.identity_files) or "ssh-agent and ~/.ssh/id_*"
        return AuthError(node, f"authentication failed for {where} (tried {keys}); check the user, identity_file "
                               "and the node's ~/.ssh/authorized_keys")
    if isinstance(exc, socket.gaierror):
        return ConnectError(node, f"cannot resolve host name {target.hostname!r}; check `host` in the inventory "
                                  "or HostName in ssh_config")
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
    if isinstance(exc, paramiko.SSHException):
        return ConnectError(node, f"ssh to {where} failed: {exc}")
    return ConnectError(node, f"cannot connect to {where}: {exc}")


class SshStream(Stream):
    def __init__(self, channel: paramiko.Channel) -> None:
        self._channel = channel
        self._stderr = bytearray()
        self._lock = threading.Lock()
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True, name="ssh-stderr")
        self._stderr_thread.start()

    def _drain_stderr(self) -> None:
        try:
            while True:
                chunk = self._channel.recv_stderr(4096)
                if not chunk:
                    return
                self._stderr += chunk
                del self._stderr[:-_STDERR_KEEP]
        except (OSError, EOFError, paramiko.SSHException):
            return

    def chunks(self) -> Iterator[bytes]:
        while True:
            try:
                chunk = self._channel.recv(_RECV_CHUNK)
            except (OSError, EOFError, paramiko.SSHException):
                return
            if not chunk:
                return
            yield chunk

    def send(self, text: str) -> bool:
        with self._lock:
            try:
                if self._channel.closed:
                    return False
                self._channel.sendall(text.encode())
                return True
            except (OSError, EOFError, paramiko.SSHException):
                return False

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while not self._channel.exit_status_ready():
            if time.monotonic() >= deadline or self._channel.closed:
                return None if not self._channel.exit_status_ready() else self._channel.recv_exit_status()
            time.sleep(0.05)
        return self._channel.recv_exit_status()

    def abort(self) -> None:
        with self._lock, contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self._channel.close()  # sshd closes the agent's stdin: it stops the job

    def stderr_text(self) -> str:
        return bytes(self._stderr).decode("utf-8", errors="replace")


class SshTransport(Transport):
    """One node reached over SSH. Thread-safe: commands may run on several channels at once."""

    def __init__(self, node: str, host: str, settings: SshSettings | None = None) -> None:
        self.node = node
        self.host = host
        self.settings = settings or SshSettings()
        self._target: SshTarget | None = None
        self._client: paramiko.SSHClient | None = None
        self._jump_clients: list[paramiko.SSHClient] = []
        self._lock = threading.Lock()

    @property
    def target(self) -> SshTarget:
        if self._target is None:
            self._target = resolve_target(self.host, self.settings)
        return self._target

    # ------------------------------------------------------------ connection

    def _new_client(self, target: SshTarget, sock: Any = None) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        if target.policy is not HostKeyPolicy.off and os.path.isfile(target.known_hosts):
            try:
                client.get_host_keys().load(target.known_hosts)  # not load_host_keys: never rewrite the file
            except (OSError, paramiko.SSHException) as exc:
                raise HostKeyError(self.node, f"cannot read {target.known_hosts}: {exc}") from None
        client.set_missing_host_key_policy(_HostKeyPolicy(self.node, target))
        try:
            client.connect(
                target.hostname, port=target.port, username=target.user,
                key_filename=list(target.identity_files) or None,
                look_for_keys=not target.identity_files, allow_agent=True,
                timeout=target.connect_timeout, banner_timeout=target.connect_timeout,
                auth_timeout=target.connect_timeout, channel_timeout=target.connect_timeout, sock=sock,
            )
        except Exception as exc:
            client.close()
            if isinstance(exc, (paramiko.SSHException, OSError, HostKeyError, EOFError)):
                raise _connect_error(self.node, target, exc) from None
            raise
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(_KEEPALIVE_S)
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
            target = self.target
            sock = self._through_jumps(target)
            self._client = self._new_client(target, sock)
            return self._client

    def _through_jumps(self, target: SshTarget) -> paramiko.Channel | None:
        """A channel to ``target`` through its ProxyJump chain (None when it has none)."""
        if target.jump is None:
            return None
        sock = self._through_jumps(target.jump)
        client = self._new_client(target.jump, sock)
        self._jump_clients.append(client)
        transport = client.get_transport()
        assert transport is not None
        try:
            return transport.open_channel("direct-tcpip", (target.hostname, target.port), ("", 0),
                                          timeout=target.connect_timeout)
        except (paramiko.SSHException, OSError) as exc:
            raise ConnectError(self.node, f"the jump host {target.jump.describe()} could not reach "
                                          f"{target.hostname}:{target.port}: {exc}") from None

    def _channel(self) -> paramiko.Channel:
        client = self._connected()
        transport = client.get_transport()
        if transport is None:
            raise ConnectError(self.node, "the ssh connection closed")
        try:
            return transport.open_session(timeout=self.target.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectError(self.node, f"cannot open an ssh session on {self.target.describe()}: {exc}") from None

    # ------------------------------------------------------------ commands

    def run(self, argv: Sequence[str], *, timeout: float = DEFAULT_COMMAND_TIMEOUT,
            env: Mapping[str, str] | None = None, cwd: str | None = None,
            stdin: bytes | None = None) -> CommandResult:
        command = shell_command(argv, env, cwd)
        started = time.monotonic()
        channel = self._channel()
        out, err = bytearray(), bytearray()
        try:
            channel.settimeout(0.2)
            channel.exec_command(command)
            if stdin is not None:
                channel.sendall(stdin)
            channel.shutdown_write()
            deadline = started + timeout
            while True:
                got = False
                while channel.recv_ready():
                    out += channel.recv(65536)
                    got = True
                while channel.recv_stderr_ready():
                    err += channel.recv_stderr(65536)
                    got = True
                if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
                    break
                if time.monotonic() > deadline:
                    raise CommandTimeout(self.node, f"`{' '.join(argv)[:200]}` did not finish within {timeout:g}s")
                if not got:
                    time.sleep(0.01)
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
        try:
            channel.exec_command(shell_command(argv, env, cwd))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            channel.close()
            raise ConnectError(self.node, f"cannot start `{argv[0]}`: {exc}") from None
        return SshStream(channel)

    def put(self, local: Path, remote: str) -> None:
        client = self._connected()
        remote_path = remote[2:] if remote.startswith("~/") else remote  # sftp starts in the home directory
        try:
            with client.open_sftp() as sftp:
                sftp.get_channel().settimeout(max(60.0, self.target.connect_timeout))
                # Write beside, then rename: a node sharing this path (NFS home) never reads half a file.
                partial = f"{remote_path}.part-{os.getpid()}-{threading.get_ident()}"
                sftp.put(str(local), partial)
                sftp.chmod(partial, os.stat(local).st_mode & 0o777)
                sftp.posix_rename(partial, remote_path)
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise TransportError(self.node, f"cannot copy {local} to {remote}: {exc}") from None

    # ------------------------------------------------------------ close

    def _close_locked(self) -> None:
        for client in (self._client, *reversed(self._jump_clients)):
            if client is not None:
                client.close()
        self._client = None
        self._jump_clients = []

    def peer_address(self) -> str | None:
        """The address this connection reached (None before connecting or through a ProxyJump)."""
        with contextlib.suppress(Exception):
            transport = self._client.get_transport() if self._client else None
            if transport is not None and not self.target.jump:
                return str(transport.getpeername()[0])
        return None

    def close(self) -> None:
        with self._lock:
            self._close_locked()
