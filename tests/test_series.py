"""A run's series on disk (clusterrun/runs/series.py): bounded for a week at one sample a second, totals kept
through the downsampling, attempts joined; and `clusterrun metrics` reading them back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from report_scenarios import sample_of

from clusterrun.cli.main import cli, main
from clusterrun.runs import RunDir, series, traffic

WEEK = 7 * 86400
MB = 1 << 20


def typical(t: float, i: int) -> dict:
    """A sample as an 8-GPU, 8-rank node with four NICs and two RDMA ports sends it (values vary with ``i``)."""
    busy = 1 + i % 7
    return {
        "t": t, "dt": 1.0,
        "nics": {"eth0": [1200 + i % 100, 3400], "ib0": [busy * 123_456_789, busy * 123_456_000], "lo": [0, 0],
                 "docker0": [0, 0]},
        "rdma": {"mlx5_0/1": [busy * 987_654_321, busy * 987_654_000], "mlx5_1/1": [0, 0]},
        "ranks": {str(r): {"pid": 40000 + r, "cpu": 0.97 + (i % 3) / 100, "rss": 12_345_678_901 + i} for r in range(8)},
        "load": 8.12,
        "gpus": {str(g): {"util": 90 + i % 10, "mem": 71234, "power": 600.25 + i % 50, "temp": 61,
                          "energy": 1_000_000 + i * 650.0} for g in range(8)},
        "conns": {"ib0": {f"192.168.1.1>192.168.1.{p}": {"n": 4, "tx": busy * 10_000_000, "rx": busy * 10_000_000}
                          for p in (2, 3, 4)}},
        "env": {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5_0", "MASTER_PORT": "29500"},
    }


def test_a_week_at_one_sample_a_second_stays_under_20_mb_and_keeps_the_totals(tmp_path: Path) -> None:
    writer = series.SeriesWriter(tmp_path)
    start = 1_800_000_000.0
    total_rx, batch = 0, []
    for i in range(WEEK):
        rx = (i * 7919) % 1_000_003
        total_rx += rx
        batch.append({"t": start + i, "dt": 1.0, "nics": {"ib0": [rx, 5]}, "gpus": {"0": {"power": 100 + i % 10}}})
        if len(batch) == 60:  # a minute at a time: as the samples come, quicker
            writer.extend("gpu01", batch)
            batch = []
    lines = {b: (tmp_path / "gpu01" / series.tier_file(b)).read_text().count("\n") for b, _ in series.TIERS[:3]}
    assert lines[0] <= 3600 * (1 + series.SLACK) + 60  # the last hour (and a quarter) at full resolution
    assert lines[60] <= 1440 * (1 + series.SLACK) + 15  # the day before in minutes
    assert lines[600] <= 7 * 144  # the rest of the week in 10 minutes
    back = series.read_series(tmp_path, "gpu01")
    assert back[0]["t"] < start + 600 and back[-1]["t"] == start + WEEK - 1
    assert sum(s["dt"] for s in back) == pytest.approx(WEEK)
    assert sum(s["nics"]["ib0"][0] * s["dt"] for s in back) == pytest.approx(total_rx, rel=1e-6)
    assert traffic.energy({"gpu01": back}).total == pytest.approx(sum(100 + i % 10 for i in range(WEEK)), rel=1e-6)
    # A full node's samples (8 GPUs, 8 ranks, 4 NICs, 2 RDMA ports, the ranks' connections) in as many lines of
    # each tier: still under 20 MB.
    hour = [typical(start + i, i) for i in range(3600)]
    widest = {0: max(map(len, map(series._line, hour)))}
    widest.update({b: max(map(len, map(series._line, series.buckets(hour, b)))) for b in (60, 600)})
    assert sum(lines[b] * widest[b] for b in lines) <= 20 * MB


def test_folding_keeps_rates_as_bytes_counters_as_last_and_rss_as_highest() -> None:
    a = {"t": 10.0, "dt": 1.0, "nics": {"eth0": [100, 0]}, "ranks": {"0": {"cpu": 1.0, "rss": 5, "pid": 7}},
         "gpus": {"0": {"power": 100.0, "energy": 50.0}}, "gaps": {"nic eth1": "gone"}}
    b = {"t": 13.0, "dt": 3.0, "nics": {}, "ranks": {"0": {"cpu": 0.0, "rss": 3, "pid": 7}},
         "gpus": {"0": {"power": 200.0, "energy": 80.0}}}
    got = series.fold([a, b])
    assert got["t"] == 13.0 and got["dt"] == 4.0
    assert got["nics"]["eth0"] == [25, 0]  # 100 bytes over 4 seconds: absent counts as idle
    assert got["ranks"]["0"] == {"cpu": 0.25, "rss": 5, "pid": 7}
    assert got["gpus"]["0"] == {"power": 175.0, "energy": 80.0}
    assert got["gaps"] == {"nic eth1": "gone"}


def test_energy_is_the_same_from_full_and_folded_samples() -> None:
    samples = [typical(1000.0 + i, i) for i in range(600)]
    by_counter = traffic.energy({"n": samples})
    assert by_counter.how == {"n": "counter+power"}  # the first interval has no counter reading before it
    folded = traffic.energy({"n": series.buckets(samples, 60)})
    assert abs(folded.total - by_counter.total) / by_counter.total < 0.02
    no_counter = [{**s, "gpus": {k: {"power": v["power"]} for k, v in s["gpus"].items()}} for s in samples]
    by_power = traffic.energy({"n": no_counter})
    assert by_power.how == {"n": "power"}
    assert by_power.per_gpu["n"]["0"] == round(sum(600.25 + i % 50 for i in range(600)), 1)


def test_a_counter_that_goes_back_is_bridged_by_power() -> None:
    samples = [{"t": float(i), "dt": 1.0, "gpus": {"0": {"power": 100.0, "energy": e}}}
               for i, e in enumerate([0.0, 100.0, 200.0, 5.0, 105.0])]
    # 3 counter steps of 100 J; the first interval (no reading before it) and the reset by 100 W over 1 s
    assert traffic.energy({"n": samples}).per_node == {"n": 500.0}


def test_a_restarted_run_keeps_its_series_across_attempts(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    writer = series.SeriesWriter(run.path)
    small = [{"ev": "sample", "t": 1000.0 + i, "dt": 1.0, "nics": {"eth1": [1000, 10]}} for i in range(5200)]
    for event in small[:5000]:  # more than an hour and a quarter: the oldest are folded into minutes
        writer.on_sample("gpu01", sample_of(event))
    run.archive_attempt(1)  # the restart moves the first attempt's node directories away
    for event in small[5000:]:
        writer.on_sample("gpu01", sample_of(event))
    back = series.read_series(run.path, "gpu01")
    assert (run.path / "attempt-1" / "gpu01" / "metrics-60.jsonl").is_file()
    assert (run.path / "gpu01" / series.RAW).read_text().count("\n") == 200
    assert sum(s["dt"] for s in back) == pytest.approx(5200)
    assert sum(s["nics"]["eth1"][0] * s["dt"] for s in back) == pytest.approx(5200 * 1000)
    assert back[-1]["t"] == 6199.0 and "ev" not in back[-1]


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "20261127-120000-abcd"
    run.mkdir(parents=True)
    plan = {"nodes": [{"name": "gpu01", "host": "10.0.0.1", "data_nic": "ib0", "data_address": "192.168.1.1",
                       "env": {}, "env_sources": {}},
                      {"name": "gpu02", "host": "10.0.0.2", "data_nic": "ib0", "data_address": "192.168.1.2",
                       "env": {}, "env_sources": {}}]}
    (run / "plan.json").write_text(json.dumps(plan))
    writer = series.SeriesWriter(run)
    for i in range(20):
        writer.on_sample("gpu01", sample_of(typical(1000.0 + i, i)))
        wrong = {"t": 1000.0 + i, "dt": 1.0, "nics": {"eth0": [300_000_000, 300_000_000], "ib0": [0, 0]},
                 "conns": {"eth0": {"10.0.0.2>10.0.0.1": {"n": 2, "tx": 300_000_000, "rx": 300_000_000}}},
                 "env": {"GLOO_SOCKET_IFNAME": "eth0"}}
        writer.on_sample("gpu02", sample_of(wrong))
    return run


def test_metrics_json_gives_each_node_its_samples_energy_and_the_wrong_nic(tmp_path: Path) -> None:
    run = _run(tmp_path)
    result = CliRunner().invoke(cli, ["metrics", "last", "--runs-dir", str(run.parent), "--json"])
    assert result.exit_code == 0, result.output
    view = json.loads(result.output)
    assert list(view["nodes"]) == ["gpu01", "gpu02"]
    first = view["nodes"]["gpu01"]["samples"][0]
    assert first["nics"]["ib0"][0] > 0 and set(first["gpus"]) == {str(g) for g in range(8)}
    assert set(first["ranks"]) == {str(r) for r in range(8)}
    assert view["energy"]["per_node_j"]["gpu01"] > 0 and "gpu02" not in view["energy"]["per_node_j"]
    [verdict] = view["verdicts"]
    assert (verdict["node"], verdict["nic"], verdict["data_nic"], verdict["variable"]) == (
        "gpu02", "eth0", "ib0", "GLOO_SOCKET_IFNAME")


def test_metrics_text_names_the_data_nic_and_a_node_flag_that_matches_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path)
    assert main(["metrics", "--runs-dir", str(run.parent), "--node", "gpu01"]) == 0
    out = capsys.readouterr().out
    # the last 10 samples: busy 1..7 over i = 10..19, in MB/s of ib0's rx
    recent = sum(1 + i % 7 for i in range(10, 20)) * 123_456_789 / 10 / 1e6
    assert f"ib0 rx {recent:.1f} MB/s" in out and "8x 94% 4918 W" in out
    assert "gpu02" not in out and "GPU energy" in out
    assert main(["metrics", "--runs-dir", str(run.parent), "--node", "gpu09"]) == 2
    err = capsys.readouterr().err
    assert "no series of node gpu09" in err and "gpu01, gpu02" in err and "--node" in err
