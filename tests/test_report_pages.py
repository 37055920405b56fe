"""The HTML pages of real doctor rounds and runs on the simulated cluster, shown in headless chromium: the doctor
page of a round with a dead data NIC, the page of a failing 4x2 run, the page of a restarted run. Each page's
screenshot and a copy of it are kept (in $CLUSTERRUN_SCREENSHOTS when set, else beside the test's files) for a person
to look at."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from browser import chromium, dom, screenshot, text_of
from report_scenarios import FAILING_JOB, RESTARTED_JOB
from simcluster import SimCluster
from simjobs import run_clusterrun, status, write_inventory

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(chromium() is None and "CI" not in os.environ, reason="no chromium here")]

#: A reference to anything outside the file: an http(s) URL where a browser would fetch it.
REMOTE = re.compile(r"""(?:\b(?:src|href|action|poster|data|srcset|xlink:href)\s*=\s*["']?\s*https?:|url\(\s*["']?"""
                    r"""\s*https?:|@import)""", re.I)


def assert_offline(page: Path) -> None:
    html = page.read_text(encoding="utf-8")
    assert not REMOTE.findall(html), REMOTE.findall(html)[:5]
    assert "default-src 'none'" in html  # and the browser is told to fetch nothing, whatever a rank printed


def keep_screenshot(page: Path, tmp_path: Path, name: str, height: int = 2200) -> Path:
    where = Path(os.environ.get("CLUSTERRUN_SCREENSHOTS") or tmp_path)
    png = screenshot(page, where / f"{name}.png", height=height)
    shutil.copy(page, where / f"{name}.html")  # the page itself, beside its picture
    assert png.stat().st_size > 10_000  # a picture, not a blank window
    return png


def test_doctor_page_of_a_dead_data_nic_names_every_node_and_marks_the_nic(sim_cluster: SimCluster,
                                                                          tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=1)
    nic = sim_cluster.nodes[2].data_nic
    sim_cluster.drop_nic("node2", "data")
    done = run_clusterrun("doctor", str(inv), "--checks", "net.ping,net.bandwidth", "--bandwidth-seconds", "1",
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    page = tmp_path / next((tmp_path / "runs").glob("doctor-*")).relative_to(tmp_path) / "report.html"
    assert f"page: {page.relative_to(tmp_path)}" in done.stdout

    html = dom(page)
    text = text_of(html)
    for node in ("node0", "node1", "node2", "node3"):
        assert node in text
    # The failing node and its NIC are marked on the data network's matrices and in the problems with their fix.
    assert f"node2 \u2717 {nic}" in text
    assert "firewall" in text and "\u2717 fail" in text
    # The matrix is a picture: an SVG of cells per network, node2's cells hatched as failed.
    pictures = re.findall(r'<svg[^>]*aria-label="ping round trip matrix of ([^"]+)"', html)
    assert str(sim_cluster.data_subnet) in pictures and str(sim_cluster.mgmt_subnet) in pictures
    assert re.search(r'aria-label="TCP bandwidth matrix of', html)
    assert html.count('fill="url(#hatch0netping)"') == 6  # node2 <-> 3 peers, both ways
    assert_offline(page)
    keep_screenshot(page, tmp_path, "doctor", height=2600)


def test_run_page_of_a_failing_4x2_run_names_every_rank_and_the_failing_one(sim_cluster: SimCluster,
                                                                            tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=2)
    (tmp_path / "job.py").write_text(FAILING_JOB)
    done = run_clusterrun("up", str(inv), "job.py", cwd=tmp_path, timeout=240)
    assert done.returncode == 3, done.stderr[-3000:]
    run = next(p for p in (tmp_path / "runs").iterdir() if p.is_dir())
    page = run / "report.html"
    assert page.is_file()
    assert status(run)["first_failure"]["rank"] == 5

    text = text_of(dom(page))
    for node in ("node0", "node1", "node2", "node3"):
        assert node in text
    for rank in range(8):
        assert f"rank {rank}" in text
    assert "first failure : node2 rank 5, exit code 3" in " ".join(text.split()).replace("first failure:",
                                                                                          "first failure :")
    assert "FileNotFoundError: data/shard-5.bin" in text  # its last lines
    assert "5 \u2190 first failure" in text
    # The nodes' series from the agents' samples: a row of panels per node, the failure marked on each panel.
    html = page.read_text(encoding="utf-8")
    rows = re.findall(r'<svg[^>]*aria-label="(node\d) over time".*?</svg>', html, re.S)
    assert rows == ["node0", "node1", "node2", "node3"], rows
    assert html.count('stroke="#D55E00" stroke-width="1.6" stroke-dasharray="4 2"') >= 4 * 3
    assert "The red dashed line (\u2717) is the first failure (node2 rank 5" in " ".join(text.split())
    assert_offline(page)
    keep_screenshot(page, tmp_path, "run-failed")

    # `clusterrun report` writes it again, and says where.
    page.unlink()
    again = run_clusterrun("report", "last", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == str(Path("runs") / run.name / "report.html")
    assert page.is_file()


def test_run_page_of_a_restarted_run_shows_both_attempts(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "job.py").write_text(RESTARTED_JOB)
    done = run_clusterrun("up", "--max-restarts", "1", "--restart-backoff", "0.5", str(inv), "job.py", cwd=tmp_path,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    run = next(p for p in (tmp_path / "runs").iterdir() if p.is_dir())
    html = dom(run / "report.html")
    text = " ".join(text_of(html).split())

    assert "Attempts (2)" in text
    assert re.search(r"0 node0, node1 .* \u2717 failed 3 node1 rank 1: exit code 3", text)
    assert re.search(r"1 node0, node1 .* \u2713 succeeded 0", text)
    assert ">attempt 0</text>" in html and ">attempt 1</text>" in html  # both on the timeline
    # The first failure is attempt 0's, with the last lines it printed (kept in attempt-0/).
    assert "node1 rank 1: exit code 3" in text and "(attempt 0)" in text
    assert "CUDA error: an illegal memory access was encountered" in text
    # Both attempts' series on one axis, attempt 1's start marked on every panel.
    assert re.findall(r'<svg[^>]*aria-label="(node\d) over time"', html) == ["node0", "node1"]
    assert html.count('stroke="#8a8a8a" stroke-width="1.6"') >= 2 * 3 and ">\u21bb<title>attempt 1 started" in html
    assert_offline(run / "report.html")
    keep_screenshot(run / "report.html", tmp_path, "run-restarted", height=1800)
