"""The inline agent keeps its compiled code on the node: the first start writes it, later starts load it, and a
damaged or foreign file is compiled over instead of failing the start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from clusterrun import remote
from clusterrun.remote import protocol
from clusterrun.remote.protocol import frames


def _ps(home: Path) -> dict:
    done = subprocess.run(remote.argv(sys.executable, "agent", "ps"), capture_output=True, timeout=60,
                          input=(protocol.encode_spec({"run_id": "no-such-run"}) + "\n").encode(),
                          env={**os.environ, "HOME": str(home)})
    assert done.returncode == 0, done.stderr
    [frame] = frames([done.stdout])
    return frame.event


def _cached(home: Path) -> list[Path]:
    return sorted((home / remote.CODE_CACHE).glob("agent-*.bin"))


def test_first_start_writes_the_compiled_agent_and_later_starts_use_it(tmp_path: Path) -> None:
    assert _ps(tmp_path) == {"ev": "alive", "pids": []}
    [cached] = _cached(tmp_path)
    assert sys.implementation.cache_tag in cached.name
    written = cached.stat().st_mtime_ns
    assert _ps(tmp_path) == {"ev": "alive", "pids": []}
    assert _cached(tmp_path) == [cached] and cached.stat().st_mtime_ns == written  # loaded, not written again
    assert not [p for p in cached.parent.iterdir() if p.name.startswith(cached.name + ".")]  # no temporary left


def test_a_damaged_cache_is_compiled_over(tmp_path: Path) -> None:
    _ps(tmp_path)
    [cached] = _cached(tmp_path)
    cached.write_bytes(b"\x00not marshal data")
    assert _ps(tmp_path) == {"ev": "alive", "pids": []}
    assert cached.read_bytes() != b"\x00not marshal data"


def test_a_home_that_cannot_be_written_still_starts(tmp_path: Path) -> None:
    blocked = tmp_path / "home"
    blocked.mkdir()
    (blocked / ".clusterrun").write_text("a file where the cache directory would be")
    assert _ps(blocked) == {"ev": "alive", "pids": []}
    assert not _cached(blocked)
