"""How the node agent finds the processes under it (its CPU reports, its stops): the tree from the kernel's
children lists, the same as from every process's parent, which is the fallback."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from loadscale import scaled

from clusterrun.remote import procs


@contextlib.contextmanager
def process_tree() -> Iterator[subprocess.Popen[bytes]]:
    """sh with two sleeps of its own and a subshell with a sleep: five processes under the test, three levels."""
    p = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & (sleep 30 & wait) & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + scaled(10)
        while len(procs._descendants_by_scan(p.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)  # poll step of a deadline-bounded wait for the tree to form
        yield p
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=scaled(10))


def test_the_tree_from_the_kernels_children_lists_is_the_tree_from_the_parents() -> None:
    with process_tree() as p:
        found = procs.descendants(p.pid)
        assert len(found) == 4  # two sleeps, the subshell and its sleep
        assert sorted(found) == sorted(procs._descendants_by_scan(p.pid))
        assert p.pid in procs.descendants(os.getpid()) and p.pid not in found


def test_without_children_lists_every_process_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    with process_tree() as p:
        expected = sorted(procs._descendants_by_scan(p.pid))
        monkeypatch.setattr(procs, "_children", lambda pid: None)  # a kernel without /proc/<pid>/task/*/children
        assert sorted(procs.descendants(p.pid)) == expected


def test_a_process_that_is_gone_has_no_descendants() -> None:
    p = subprocess.Popen(["true"])
    p.wait(timeout=scaled(10))
    assert procs.descendants(p.pid) == []
