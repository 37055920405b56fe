"""The run's series on its page (a row of panels per node: the data NIC, the other NICs, GPU utilisation and power,
CPU per rank; the first failure marked on every panel; the GPU energy; traffic on the wrong NIC), the page's size
at 64 nodes, the same pages in headless chromium, and `status --watch` reading the newest samples."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from browser import chromium, dom, screenshot, text_of
from report_scenarios import big_run, sample_of, sampled_run
from rich.console import Console

from clusterrun.cli.main import main
from clusterrun.cli.run_view import live_view, newest_samples
from clusterrun.report import panels, write_run_page
from clusterrun.report.series_data import POINTS, node_series
from clusterrun.runs import RunDir, read_record, series
from clusterrun.runs.record import RunState

T0 = 1.8e9
FAIL_MARK = 'stroke="#D55E00" stroke-width="1.6" stroke-dasharray="4 2"'
#: A page of 64 nodes x 8 ranks sampled for 10 minutes measures 0.98 MB: it must stay under this.
BOUND_64 = 1_300_000


def _rows(html: str) -> dict[str, str]:
    """Each node's row of panels (its SVG), by node."""
    return {m.group(1): m.group(0) for m in re.finditer(r'<svg[^>]*aria-label="(\S+) over time".*?</svg>', html, re.S)}


def _points(html: str, node: str) -> list[list[str]]:
    """The points drawn of ``node`` as the page's text has them: a list of cells per point."""
    block = re.search(rf"<h4>{node}</h4><pre>(.*?)</pre>", html, re.S)
    assert block is not None
    return [line.split("\t") for line in block.group(1).splitlines()]


def test_run_page_draws_a_row_of_panels_per_node_with_the_failure_energy_and_wrong_nic(tmp_path: Path) -> None:
    run = sampled_run(tmp_path / "20261127-101500-a1b2", 4, 2, seconds=120, wrong_nic="gpu002")
    html = write_run_page(run).read_text(encoding="utf-8")
    assert "could not be drawn" not in html
    rows = _rows(html)
    assert list(rows) == ["gpu000", "gpu001", "gpu002", "gpu003"]
    for i, (node, svg) in enumerate(rows.items()):
        titles = re.findall(r'<g transform="translate\(\d+,4\)" class="panel"><title>([^<]*)</title>', svg)
        assert titles == [f"{node}: data NIC ens1 rx/tx", f"{node}: other NICs (eth0)",
                          f"{node}: utilisation of its 2 GPU(s)", f"{node}: power of its 2 GPU(s)",
                          f"{node}: CPU of ranks {2 * i}, {2 * i + 1}"]
        assert svg.count("<path d=\"M") >= 2 + 1 + 2 + 1 + 2  # rx, tx; eth0; mean, lowest GPU; power; two ranks
        # The first failure (rank 3 ended at 84 s of a 122 s axis) marked on every panel at the same place.
        assert svg.count(FAIL_MARK) == 5
        assert set(re.findall(r'<line x1="(\d+)"[^>]*' + re.escape(FAIL_MARK), svg)) == {str(round(214 * 84 / 122))}
    assert "first failure at 84.0s: gpu001 rank 3: exit code 3" in rows["gpu000"]
    assert '>gpu001</text><text x="110" y="46" font-size="10" text-anchor="end" fill="#8a5a00">\u2717 rank 3' \
           in rows["gpu001"]
    text = " ".join(text_of(html).split())
    assert "The red dashed line (\u2717) is the first failure (gpu001 rank 3, at 84.0s)" in text
    # Energy: 2 GPUs x 300 W x 120 s per node, per node and in total.
    assert "GPU energy: 0.080 kWh (288.0 kJ, counter+power): gpu000 72.0 kJ, gpu001 72.0 kJ" in text
    # The wrong-NIC verdict: said, marked on gpu002's other NICs at 12 s, and its eth0 as tall as a data NIC.
    assert "\u25b2 wrong NIC at 12.0s: gpu002: the ranks' traffic to the other nodes goes over eth0" in text
    assert re.search(r'class="panel"><title>gpu002: other NICs \(eth0\)</title>.*?>\u25b2<title>gpu002: ', rows["gpu002"])
    assert "gpu002 \u25b2 wrong NIC" in " ".join(text_of(rows["gpu002"]).split())
    assert "eth0 peak 1.21 GB/s" in rows["gpu002"] and "eth0 peak 6.4 kB/s" in rows["gpu000"]
    # Every value drawn is in the text: the table of means and peaks, and each point.
    assert "gpu002 120 1.0s to 2m00s ens1 2 kB/s / 2 kB/s 1 kB/s / 1 kB/s - eth0 948 MB/s / 1.21 GB/s 2 95% (lowest GPU 94%) 600 W / 600 W 72.0 kJ" in text
    points = _points(html, "gpu001")
    assert points[0][:4] == ["at (s)", "ens1 rx (MB/s)", "ens1 tx (MB/s)", "eth0 rx+tx (MB/s)"]
    assert points[0][-2:] == ["rank 2 CPU (CPU)", "rank 3 CPU (CPU)"]
    assert 60 <= len(points) - 1 <= POINTS
    after = [p for p in points[1:] if float(p[0]) > 85]
    assert after and all(p[-1] == "-" and float(p[1]) == 0 for p in after)  # rank 3 ended, traffic stopped
    assert all(p[-1] != "-" for p in points[1:] if float(p[0]) < 83)
    # The timeline marks the verdict too, and the old promise that nothing is drawn over time is gone.
    assert "traffic on the wrong NIC: gpu002" in html
    assert "totals only" not in html


BROWN_LINE = 'stroke="#8a5a00" stroke-width="1.8"'
BROWN_MARK = 'stroke="#8a5a00" stroke-width="1.6" stroke-dasharray="4 2"'


def test_a_straggler_is_drawn_apart_on_its_node_row_with_its_moment_marked(tmp_path: Path) -> None:
    run = sampled_run(tmp_path / "slow-run", 4, 2, seconds=120, straggler="gpu002")
    verdict = next(e for e in read_record(RunDir(run)).events if e["kind"] == "straggler" and e["node"] == "gpu002")
    assert (verdict["node"], verdict["rank"], verdict["gpu"], verdict["by"]) == ("gpu002", 5, "1", "gpu")
    at = verdict["time"] - T0
    assert 24 < at <= 36  # the others wait from 24 s on; named within the rule's 10 s of samples after
    html = write_run_page(run).read_text(encoding="utf-8")
    text = " ".join(text_of(html).split())
    assert re.search(rf"\u25a0 straggler at {at:.1f}s: gpu002 rank 5 looks like a straggler: its GPU 1 kept working at "
                     r"9\d% and 300 W while the other GPUs ran at \d+% and \d+ W \(their median\)", text), text
    assert "A straggler's evidence is brown" in text
    rows = _rows(html)
    titles = re.findall(r'class="panel"><title>([^<]*)</title>', rows["gpu002"])
    assert titles[2:] == ["gpu002: utilisation of its 2 GPU(s); brown: GPU 1 (rank 5, the straggler)",
                          "gpu002: power of its 2 GPU(s); brown: GPU 1 (rank 5, the straggler)",
                          "gpu002: CPU of ranks 4, 5; brown: rank 5 (the straggler)"]
    # Its GPU's own utilisation and power and its rank's CPU, one brown line each; its moment across its row only.
    assert rows["gpu002"].count(BROWN_LINE) == 3
    assert rows["gpu002"].count(BROWN_MARK) == 5
    assert set(re.findall(r'<line x1="(\d+)"[^>]*' + re.escape(BROWN_MARK), rows["gpu002"])) == {
        str(round(214 * at / 122))}
    assert "gpu002 \u25a0 straggler rank 5" in " ".join(text_of(rows["gpu002"]).split())
    assert all(BROWN_LINE not in svg and BROWN_MARK not in svg for node, svg in rows.items() if node != "gpu002")
    # The brown util line is the GPU's own readings: 97% after the others began to wait, in the points' text too.
    points = _points(html, "gpu002")
    column = points[0].index("GPU 1 util (%)")
    assert all(p[column] == "97" for p in points[1:] if float(p[0]) > 30)
    assert all(30 <= float(p[points[0].index("GPU util (%)")]) <= 70 for p in points[1:] if float(p[0]) > 30)


def test_a_run_without_gpus_has_no_gpu_columns_and_an_unsampled_run_says_so(tmp_path: Path) -> None:
    html = write_run_page(sampled_run(tmp_path / "cpu-run", 2, 2, seconds=30, gpus=False)).read_text()
    assert "GPU utilisation" not in html and "GPU power" not in html and "GPU energy:" not in html
    assert ">CPU per rank</text>" in html and len(_rows(html)) == 2
    plain = write_run_page(big_run(tmp_path / "old-run", 2, 2)).read_text()
    assert "Not sampled: the run directory holds no series" in " ".join(text_of(plain).split())
    assert "over time\"" not in plain


def test_lines_are_cut_to_at_most_points_and_a_hole_breaks_them(tmp_path: Path) -> None:
    """Two hours at one sample a second (the older part already folded into minutes by the writer), with the agent
    silent for ten minutes in the middle: every line has at most POINTS points, a break at the hole, and the
    means over every sample."""
    writer = series.SeriesWriter(tmp_path)
    for k in range(1, 7201):
        if 3000 < k <= 3600:
            continue
        writer.on_sample("n0", sample_of({"ev": "sample", "t": T0 + k, "dt": 1.0, "nics": {"ib0": [k % 100 * 1e6, 5e6]},
                                "ranks": {"0": {"cpu": 0.5}}}))
    assert (tmp_path / "n0" / "metrics-60.jsonl").is_file()  # the oldest part is in minutes now
    got = node_series(tmp_path, "n0", "ib0", T0, 7200.0)
    assert got is not None and got.samples < 7200 - 600  # the folded part counts as fewer samples
    for key in ("rx", "tx", "cpu:0"):
        line = got.lines[key]
        assert len([v for _, v in line if v is not None]) <= POINTS
        holes = [i for i, (_, v) in enumerate(line) if v is None]
        assert len(holes) == 1 and 2900 <= line[holes[0] - 1][0] <= 3000 and 3600 <= line[holes[0] + 1][0] <= 3672
    assert got.stats["rx"].mean == pytest.approx(49.5e6, rel=0.01) and got.stats["tx"].peak == 5e6
    assert got.top("rx") <= 99e6 and got.others == [] and got.gpus == 0


def test_a_path_joins_steps_in_one_direction() -> None:
    flat = panels.Line([(t, 5.0) for t in range(100)], "#000")
    assert panels._path(flat, 100.0, 10.0, 53) == "M0 33l212 0"
    broken = panels.Line([(0, 0.0), (50, None), (60, 10.0)], "#000")
    assert panels._path(broken, 100.0, 10.0, 53) == "M0 53l0 0M128 13l0 0"


def test_page_of_64_nodes_stays_under_its_bound(tmp_path: Path) -> None:
    run = sampled_run(tmp_path / "big", 64, 8, seconds=600, wrong_nic="gpu040")
    page = write_run_page(run)
    html = page.read_text(encoding="utf-8")
    assert page.stat().st_size < BOUND_64, page.stat().st_size
    assert len(_rows(html)) == 64
    assert html.count('aria-label="columns: data NIC, other NICs, GPU utilisation, GPU power, CPU per rank"') == 4
    assert html.count(FAIL_MARK) == 64 * 5
    assert max(len(p) for p in (_points(html, "gpu063"),)) <= 73  # the header and 72 points


def keep(page: Path, tmp_path: Path, name: str, height: int) -> Path:
    where = Path(os.environ.get("CLUSTERRUN_SCREENSHOTS") or tmp_path)
    png = screenshot(page, where / f"{name}.png", height=height)
    shutil.copy(page, where / f"{name}.html")
    assert png.stat().st_size > 10_000
    return png


@pytest.mark.skipif(chromium() is None and "CI" not in os.environ, reason="no chromium here")
@pytest.mark.parametrize("nodes", [4, 64])
def test_series_pages_show_in_a_browser(tmp_path: Path, nodes: int) -> None:
    page = write_run_page(sampled_run(tmp_path / f"run{nodes}", nodes, 8, seconds=300, wrong_nic="gpu002",
                                      straggler="gpu003"))
    html = dom(page)
    assert len(_rows(html)) == nodes
    assert "NICs, GPUs and ranks over time" in text_of(html)
    keep(page, tmp_path, f"run-series-{nodes}", 2600 if nodes == 4 else 4800)


def _text(renderable: object) -> str:
    out = io.StringIO()
    Console(file=out, width=220, highlight=False, color_system=None).print(renderable)
    return out.getvalue()


def test_latest_reads_the_newest_samples_from_the_end_of_the_file(tmp_path: Path) -> None:
    writer = series.SeriesWriter(tmp_path)
    writer.extend("n0", [{"t": T0 + k, "dt": 1.0, "nics": {"ib0": [k, k]}, "pad": "x" * 900} for k in range(500)])
    with open(tmp_path / "n0" / series.RAW, "a") as fh:
        fh.write('{"t": 1800000999, "nics": {"ib0": [1,')  # cut by a crash while written
    newest = series.latest(tmp_path, "n0", 3, chunk=1000)  # chunks smaller than a line: read on until 3 lines
    assert [s["t"] for s in newest] == [T0 + 497, T0 + 498, T0 + 499]
    assert [s["t"] for s in series.latest(tmp_path, "n0")] == [T0 + 499]
    assert len(series.latest(tmp_path, "n0", 10_000)) == 500
    assert series.latest(tmp_path, "nobody") == []


def test_status_watch_shows_each_nodes_data_nic_and_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    run = sampled_run(runs / "20261127-101500-a1b2", 3, 2, seconds=40, wrong_nic="gpu002")
    assert main(["status", "--watch", "a1b2", "--runs-dir", str(runs)]) == 0  # ended: shown once
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:] if line.strip()}
    assert "data NIC" in rows["node"] and "GPUs" in rows["node"]
    newest = series.latest(run, "gpu000", 3)
    rx = sum(s["nics"]["ens1"][0] for s in newest) / 3
    assert f"ens1 rx {rx / 1e6:.1f} MB/s" in rows["gpu000"] and re.search(r"2x 9\d% \(min 9\d%\)", rows["gpu000"])
    assert "ens1 rx 0 B/s tx 0 B/s" in rows["gpu001"] and re.search(r"2x 4\d% \(min 0%\)", rows["gpu001"])  # after its failure
    assert "ens1 rx 2.0 kB/s tx 1.0 kB/s" in rows["gpu002"]  # its traffic is on eth0
    # A running run whose node stopped sending samples: the reading's age is said.
    record = read_record(RunDir(run)).replace(state=RunState.running, ended=None, nodes={})
    shown = _text(live_view(record, [("gpu000", 2), ("gpu009", 2)], now=T0 + 100,
                            samples=newest_samples(run, ["gpu000", "gpu009"]), data_nics={"gpu000": "ens1"}))
    lines = {line.split()[0]: line for line in shown.splitlines()[1:] if line.strip()}
    assert "(60s old)" in lines["gpu000"] and lines["gpu009"].rstrip().endswith("-")
    assert json.loads((run / "plan.json").read_text())["nodes"][0]["data_nic"] == "ens1"


def test_a_node_that_failed_as_a_whole_is_marked_at_its_end(tmp_path: Path) -> None:
    run = sampled_run(tmp_path / "lost-node", 2, 1, seconds=60)
    status = json.loads((run / "status.json").read_text())
    status["first_failure"] = {"node": "gpu001", "rank": None, "exit_code": 1, "detail": "lost its connection"}
    status["nodes"]["gpu001"]["ended"] = T0 + 30
    (run / "status.json").write_text(json.dumps(status))
    html = write_run_page(run).read_text(encoding="utf-8")
    assert "The red dashed line (\u2717) is the first failure (gpu001, at 30.0s)" in " ".join(text_of(html).split())
    assert set(re.findall(r'<line x1="(\d+)"[^>]*' + re.escape(FAIL_MARK), html)) == {str(round(214 * 30 / 62))}
    del status["nodes"]["gpu001"]["ended"]  # no time for it anywhere: said, not marked
    (run / "status.json").write_text(json.dumps(status))
    html = write_run_page(run).read_text(encoding="utf-8")
    assert "The first failure has no time in the record: it is not marked." in html and FAIL_MARK not in html
