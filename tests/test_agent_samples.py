"""The node agent's ``sample`` events: with ``sample_every`` in the run spec, the agent (sent inline, as to a real
node) samples its job's workers beside the job and sends the node's series; without it, nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from clusterrun import remote
from clusterrun.remote import protocol
from clusterrun.remote.protocol import frames

WORKERS = """
import os, subprocess, sys
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"], env=dict(os.environ, LOCAL_RANK=str(i)))
        for i in range(2)]
for kid in kids:
    kid.wait(timeout=60)
"""


def _run(tmp_path: Path, every: float) -> list[dict]:
    spec = protocol.RUN.fill({"run_id": "samples-1", "node": "n1", "argv": [sys.executable, "-c", WORKERS],
                              "run_dir": str(tmp_path / "run"), "rank_offset": 4, "detached": True,
                              "sample_every": every})
    done = subprocess.run(remote.argv(sys.executable, "agent", "run", inline=True),
                          input=(protocol.encode_spec(spec) + "\n").encode(), capture_output=True, timeout=120)
    events = [f.event for f in frames([done.stdout])]
    assert events[-1]["ev"] == protocol.EXIT and events[-1]["rc"] == 0, done.stderr.decode(errors="replace")
    return [e for e in events if e["ev"] == protocol.SAMPLE]


def test_the_agent_sends_samples_of_its_workers_by_global_rank(tmp_path: Path) -> None:
    samples = _run(tmp_path, 0.2)
    with_ranks = [s for s in samples if set(s.get("ranks", {})) == {"4", "5"}]
    assert with_ranks, samples
    assert all(r["rss"] > 0 and r["pid"] != os.getpid() for r in with_ranks[-1]["ranks"].values())
    assert "lo" in with_ranks[-1]["nics"] and samples[-1]["dt"] > 0


def test_no_samples_unless_the_spec_asks(tmp_path: Path) -> None:
    assert _run(tmp_path, 0.0) == []
