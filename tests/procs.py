"""Helpers for tests on this machine: the processes of one run (by their CLUSTERRUN_RUN_ID marker), free ports."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from loadscale import scaled


def marked_processes(run_id: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose environment carries ``CLUSTERRUN_RUN_ID=run_id``."""
    needle = f"CLUSTERRUN_RUN_ID={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append((int(entry.name), cmd))
    return found


def wait_no_processes(run_id: str, timeout: float = 10.0) -> list[tuple[int, str]]:
    """Poll until no process of the run is left; returns what is still there after ``timeout`` (scaled with the
    machine's load, tests/loadscale.py)."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        left = marked_processes(run_id)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def free_port() -> int:
    """A TCP port nobody listens on right now (on loopback)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
