"""Every SSH wait is bounded: a host that accepts TCP but never speaks, an sshd that stops answering after
login (exec and sftp requests never acknowledged), and a ProxyCommand that dies or stays silent.

The server is paramiko's own server side on 127.0.0.1, made to stall on purpose: its request handlers
block until the test ends, so the client sees a node that stopped answering mid-conversation.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import paramiko
import pytest
from loadscale import scaled

from clusterrun.errors import CommandTimeout, ConnectError, TransportError, UsageError
from clusterrun.inventory.models import HostKeyPolicy, SshSettings
from clusterrun.transport.ssh.transport import SshTransport

CONNECT_TIMEOUT = 1.0
BOUND = 5.0  # generous: each failure below must come after about CONNECT_TIMEOUT, never "eventually"


class _StallingServer(paramiko.ServerInterface):
    """Lets anyone in with a key, opens sessions, then never answers an exec or subsystem request."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.release.wait(60)
        return False

    def check_channel_subsystem_request(self, channel: paramiko.Channel, name: str) -> bool:
        self.release.wait(60)
        return False


@dataclass
class Server:
    port: int
    settings: SshSettings


@contextlib.contextmanager
def _listener() -> Iterator[socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield sock
    finally:
        sock.close()


def _client_files(tmp_path: Path, host_key: paramiko.PKey, port: int) -> SshSettings:
    key = paramiko.ECDSAKey.generate()
    key.write_private_key_file(str(tmp_path / "id"))
    (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
    (tmp_path / "ssh_config").write_text("")
    return SshSettings(user="me", port=port, identity_file=str(tmp_path / "id"),
                       known_hosts=str(tmp_path / "known_hosts"), config_file=str(tmp_path / "ssh_config"),
                       host_key_policy=HostKeyPolicy.strict, connect_timeout=CONNECT_TIMEOUT)


@pytest.fixture
def stalling_sshd(tmp_path: Path) -> Iterator[Server]:
    host_key = paramiko.ECDSAKey.generate()
    release = threading.Event()
    transports: list[paramiko.Transport] = []
    with _listener() as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            with contextlib.suppress(OSError):
                while not release.is_set():
                    conn, _ = listener.accept()
                    server_side = paramiko.Transport(conn)
                    server_side.add_server_key(host_key)
                    server_side.start_server(server=_StallingServer(release))
                    transports.append(server_side)

        thread = threading.Thread(target=serve, daemon=True, name="stalling-sshd")
        thread.start()
        try:
            yield Server(port, _client_files(tmp_path, host_key, port))
        finally:
            release.set()
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() above
            listener.close()
            for server_side in transports:
                server_side.close()
            thread.join(timeout=scaled(5))


@contextlib.contextmanager
def _takes_about_the_connect_timeout() -> Iterator[None]:
    started = time.monotonic()
    yield
    assert time.monotonic() - started < BOUND


def test_a_command_the_node_never_acknowledges_times_out(stalling_sshd: Server) -> None:
    with SshTransport("stuck", "127.0.0.1", stalling_sshd.settings) as t:
        t.connect()
        with _takes_about_the_connect_timeout(), pytest.raises(
                CommandTimeout, match=r"^stuck: me@127.0.0.1:\d+ did not accept `sleep 1` within 1s"):
            t.run(["sleep", "1"], timeout=600)


def test_a_started_command_the_node_never_acknowledges_times_out(stalling_sshd: Server) -> None:
    with SshTransport("stuck", "127.0.0.1", stalling_sshd.settings) as t, _takes_about_the_connect_timeout(), \
            pytest.raises(CommandTimeout, match=r"did not accept `agent` within 1s"):
        t.start(["agent"])


def test_a_copy_to_a_node_whose_sftp_never_answers_times_out(stalling_sshd: Server, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with SshTransport("stuck", "127.0.0.1", stalling_sshd.settings) as t, _takes_about_the_connect_timeout(), \
            pytest.raises(TransportError, match="did not accept the sftp subsystem within 1s"):
        t.put(tmp_path / "f", "~/f")


def test_a_port_that_accepts_but_never_speaks_ssh(tmp_path: Path) -> None:
    with _listener() as silent:  # the kernel completes the TCP handshake; nobody ever writes
        port = silent.getsockname()[1]
        settings = _client_files(tmp_path, paramiko.ECDSAKey.generate(), port)
        with _takes_about_the_connect_timeout(), pytest.raises(
                ConnectError, match=r"accepted the connection but did not complete the ssh handshake within 1s"):
            SshTransport("quiet", "127.0.0.1", settings).connect()


def test_a_proxycommand_that_dies_says_why_at_once(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host gpu1\n    ProxyCommand sh -c 'echo bastion refused %r@%h:%p >&2; exit 7'\n")
    settings = SshSettings(user="me", config_file=str(config), known_hosts=str(tmp_path / "kh"),
                           connect_timeout=30.0)
    started = time.monotonic()
    with pytest.raises(ConnectError) as failed:
        SshTransport("gpu1", "gpu1", settings).connect()
    assert time.monotonic() - started < BOUND  # not the 30 s connect timeout
    assert str(failed.value) == (
        "gpu1: the ProxyCommand `sh -c 'echo bastion refused me@gpu1:22 >&2; exit 7'` exited with status 7: "
        f"bastion refused me@gpu1:22 (ProxyCommand at {config}:2); check that command by running it in a shell, "
        "or set jump_host in the inventory")


def test_a_silent_proxycommand_times_out_and_is_ended(tmp_path: Path) -> None:
    marker = tmp_path / "proxy-ran"
    config = tmp_path / "ssh_config"
    config.write_text(f"Host gpu1\n    ProxyCommand sh -c 'echo $$ > {marker}; exec sleep 300'\n")
    settings = SshSettings(config_file=str(config), known_hosts=str(tmp_path / "kh"),
                           connect_timeout=CONNECT_TIMEOUT)
    with _takes_about_the_connect_timeout(), pytest.raises(
            ConnectError, match=r"no ssh handshake with .* within 1s \(ProxyCommand at .*ssh_config:2\)"):
        SshTransport("gpu1", "gpu1", settings).connect()
    pid = int(marker.read_text())
    with pytest.raises(ProcessLookupError):  # the ProxyCommand was ended (and reaped), not left behind
        os.kill(pid, 0)


def test_special_files_named_as_ssh_files_never_block(tmp_path: Path) -> None:
    """A FIFO given as identity_file or config_file is refused at once: reading it would wait forever."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(TransportError, match="is not a regular file"):
        SshTransport("n0", "127.0.0.1", SshSettings(port=1, identity_file=str(fifo),
                                                    known_hosts=str(tmp_path / "kh"), connect_timeout=2)).connect()
    with pytest.raises(UsageError, match="is not a regular file"):
        SshTransport("n0", "127.0.0.1", SshSettings(port=1, config_file=str(fifo), connect_timeout=2)).connect()
    assert time.monotonic() - started < 5
