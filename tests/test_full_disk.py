"""A run whose run directory's disk fills up: the job goes on, nothing is lost from the screen or the nodes,
the trouble is said once, and status.json still ends with the run's outcome. runs/ on a real 1 MiB tmpfs, the
job on two simulated nodes (whose own disks have room)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from simcluster import SimCluster
from simjobs import run_clusterrun, write_inventory

pytestmark = pytest.mark.cluster
LINES = 20000  # 2 ranks x 20000 x ~100 bytes = 4 MB: four times the disk

FLOOD = f"""
import os
rank = os.environ["RANK"]
for i in range({LINES}):
    print(f"rank {{rank}} line {{i:06d}} " + "x" * 80, flush=(i % 100 == 0))
"""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / "small"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(where)], check=True, timeout=30)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, timeout=30)


def test_a_full_disk_stops_the_logs_not_the_job(sim_cluster: SimCluster, tmp_path: Path, small_disk: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "flood.py").write_text(FLOOD)
    done = run_clusterrun("up", "--runs-dir", str(small_disk), str(inv), "flood.py", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    shown = [line for line in done.stdout.splitlines() if " line " in line]
    assert len(shown) == 2 * LINES  # the screen lost nothing
    assert done.stderr.count("No space left on device") >= 1
    assert done.stderr.count("the job goes on and its output is still shown here") == 1  # said once
    (run,) = [p for p in small_disk.iterdir() if p.is_dir()]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "succeeded"
    assert status["logs"]["complete"] is False and status["logs"]["gaps"]
    for gap in status["logs"]["gaps"]:  # what runs/ lacks is whole on the node
        node_log = Path(os.path.expanduser(gap["where"]))
        assert any(p.stat().st_size == gap["expected_bytes"] for p in node_log.rglob(f"{gap['stream']}.log"))
    for rank in (0, 1):  # what runs/ has is a clean start of the log, not a log with holes
        text = (run / f"node{rank}" / f"rank{rank}.log").read_bytes().decode(errors="replace").splitlines()
        assert all(line == f"rank {rank} line {i:06d} " + "x" * 80 for i, line in enumerate(text[:-1]))
