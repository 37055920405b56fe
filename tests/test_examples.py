"""The shipped examples, run for real under torchrun (two CPU processes over gloo), and their helpers."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from procs import free_port

pytest.importorskip("torch", reason="the examples need the torch extra")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TRAIN = EXAMPLES / "train_ddp.py"
BENCH = EXAMPLES / "allreduce_bench.py"
# Generous next to the few seconds a run takes, so a slow CI machine passes but
# a hung rendezvous or collective still fails the test instead of blocking it.
RUN_TIMEOUT_S = 120
# Variables a surrounding torchrun would have set; the child runs must not inherit them.
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

STARTUP_LINE = re.compile(
    r"^rank (?P<rank>\d+)/(?P<world>\d+) local_rank (?P<local>\d+) on \S+ backend (?P<backend>\w+) "
    r"device (?P<device>\S+)$",
    re.MULTILINE,
)
EPOCH_LINE = re.compile(r"^epoch (?P<epoch>\d+) loss (?P<loss>\d+\.\d+) \((?P<rate>\d+) samples/s\)$", re.MULTILINE)
FINAL_LINE = re.compile(
    r"^final test loss (?P<loss>\d+\.\d+) accuracy (?P<accuracy>\d+\.\d)% \((?P<count>\d+) held-out samples\)$",
    re.MULTILINE,
)
TABLE_ROW = re.compile(
    r"^\s+(?P<size>\d+)\s+(?P<count>\d+)\s+float32\s+(?P<time>\d+\.\d+)\s+(?P<algbw>\d+\.\d+)\s+"
    r"(?P<busbw>\d+\.\d+)\s+(?P<check>OK|WRONG)$",
    re.MULTILINE,
)
AVERAGE_LINE = re.compile(r"^# Avg bus bandwidth: (?P<busbw>\d+\.\d+) GB/s$", re.MULTILINE)


def load_example(path: Path) -> ModuleType:
    """Import an example script as a module, without running its main()."""
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their defining module up in sys.modules while building the class.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def child_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in LAUNCHER_VARS}
    # gloo otherwise resolves the hostname to pick an interface, which is slow
    # or wrong on machines with odd /etc/hosts; loopback is all a local run needs.
    env["GLOO_SOCKET_IFNAME"] = "lo"
    # torchrun would set it to 1 anyway (and warn about it) with several processes.
    env["OMP_NUM_THREADS"] = "1"
    return env


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run argv in its own process group; on timeout kill the whole group (torchrun and its workers)."""
    with subprocess.Popen(
        argv,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
            pytest.fail(f"{argv} timed out after {RUN_TIMEOUT_S}s\nstdout:\n{stdout}\nstderr:\n{stderr}")
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def torchrun(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # --backend gloo: these runs must behave the same on a GPU machine with fewer
    # than two GPUs, where auto would pick NCCL for both ranks.
    return run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            str(script),
            "--backend",
            "gloo",
            *args,
        ]
    )


def describe(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit code {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def assert_every_rank_started(result: subprocess.CompletedProcess[str], world_size: int) -> None:
    started = {int(match["rank"]): match for match in STARTUP_LINE.finditer(result.stdout)}
    assert sorted(started) == list(range(world_size)), describe(result)
    for rank, match in started.items():
        assert int(match["world"]) == world_size
        assert int(match["local"]) == rank  # one node: local rank equals global rank
        assert (match["backend"], match["device"]) == ("gloo", "cpu")


# --- train_ddp.py ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def train_run() -> subprocess.CompletedProcess[str]:
    return torchrun(TRAIN)


def test_train_ddp_exits_zero_under_torchrun(train_run: subprocess.CompletedProcess[str]) -> None:
    assert train_run.returncode == 0, describe(train_run)


def test_train_ddp_prints_one_startup_line_per_rank(train_run: subprocess.CompletedProcess[str]) -> None:
    assert_every_rank_started(train_run, world_size=2)


def test_train_ddp_loss_goes_down_and_rank_zero_alone_reports_it(
    train_run: subprocess.CompletedProcess[str],
) -> None:
    epochs = [(int(m["epoch"]), float(m["loss"]), int(m["rate"])) for m in EPOCH_LINE.finditer(train_run.stdout)]
    # Default --epochs 3, each printed once (by rank 0 only).
    assert [epoch for epoch, _, _ in epochs] == [1, 2, 3], describe(train_run)
    assert epochs[-1][1] < epochs[0][1], describe(train_run)
    assert all(rate > 0 for _, _, rate in epochs)


def test_train_ddp_learns_the_task(train_run: subprocess.CompletedProcess[str]) -> None:
    finals = list(FINAL_LINE.finditer(train_run.stdout))
    assert len(finals) == 1, describe(train_run)
    # The labels come from a linear teacher: a model that trained at all gets far above chance (25%).
    assert float(finals[0]["accuracy"]) > 80.0
    assert int(finals[0]["count"]) == 1024


def test_train_ddp_runs_as_one_process_without_torchrun() -> None:
    result = run([sys.executable, str(TRAIN), "--epochs", "2", "--backend", "gloo"])
    assert result.returncode == 0, describe(result)
    assert "not started by torchrun" in result.stderr
    assert_every_rank_started(result, world_size=1)
    assert [m["epoch"] for m in EPOCH_LINE.finditer(result.stdout)] == ["1", "2"]


# --- allreduce_bench.py ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bench_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench") / "allreduce.json"


@pytest.fixture(scope="module")
def bench_run(bench_json: Path) -> subprocess.CompletedProcess[str]:
    # Default sweep (1K to 16M on CPU): the run must stay quick at default settings.
    return torchrun(BENCH, "--json", str(bench_json))


def test_bench_exits_zero_under_torchrun(bench_run: subprocess.CompletedProcess[str]) -> None:
    assert bench_run.returncode == 0, describe(bench_run)


def test_bench_prints_one_startup_line_per_rank(bench_run: subprocess.CompletedProcess[str]) -> None:
    assert_every_rank_started(bench_run, world_size=2)


def test_bench_table_covers_the_default_cpu_sweep_with_positive_busbw(
    bench_run: subprocess.CompletedProcess[str],
) -> None:
    rows = list(TABLE_ROW.finditer(bench_run.stdout))
    assert [int(row["size"]) for row in rows] == [2**k for k in range(10, 25)], describe(bench_run)
    for row in rows:
        assert int(row["count"]) == int(row["size"]) // 4
        assert row["check"] == "OK"
        assert float(row["time"]) > 0
        # Two ranks: 2(n-1)/n = 1, so busbw equals algbw.
        assert float(row["busbw"]) == float(row["algbw"])
    assert float(rows[-1]["busbw"]) > 0
    averages = list(AVERAGE_LINE.finditer(bench_run.stdout))
    assert len(averages) == 1 and float(averages[0]["busbw"]) > 0, describe(bench_run)


def test_bench_writes_json_results(bench_run: subprocess.CompletedProcess[str], bench_json: Path) -> None:
    assert bench_run.returncode == 0, describe(bench_run)
    report = json.loads(bench_json.read_text(encoding="utf-8"))
    assert report["world_size"] == 2
    assert (report["backend"], report["device"], report["dtype"]) == ("gloo", "cpu", "float32")
    assert report["correct"] is True
    assert report["avg_busbw_gbps"] > 0
    assert len(report["results"]) == 15
    for row in report["results"]:
        assert set(row) == {"size_bytes", "count", "time_us", "algbw_gbps", "busbw_gbps", "correct"}
        assert row["correct"] is True
        assert row["busbw_gbps"] > 0
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"])


# --- allreduce_bench.py helpers -------------------------------------------------------------------


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_example(BENCH)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("512B", 512),
        ("1K", 1024),
        ("1k", 1024),
        ("8KB", 8 * 1024),
        ("64M", 64 * 2**20),
        ("16 MiB", 16 * 2**20),
        ("1G", 2**30),
        ("1GiB", 2**30),
        (" 2m ", 2 * 2**20),
    ],
)
def test_parse_size_reads_binary_units(bench: ModuleType, text: str, size: int) -> None:
    assert bench.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "0", "0K", "K", "-1K", "1.5M", "1X", "1KK", "12 bytes"])
def test_parse_size_rejects_what_is_not_a_size(bench: ModuleType, text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        bench.parse_size(text)


def test_bench_cli_names_the_bad_size(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--max-bytes", "4X"])
    assert exit_info.value.code == 2
    assert "--max-bytes: not a size: '4X'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("algbw", "world_size", "busbw"),
    [
        (10.0, 1, 0.0),  # nothing crosses a link
        (10.0, 2, 10.0),  # 2(n-1)/n = 1
        (10.0, 4, 15.0),
        (10.0, 8, 17.5),
        (10.0, 1024, 10.0 * 2 * 1023 / 1024),  # tends to 2x algbw on many ranks
    ],
)
def test_bus_bandwidth_scales_algbw_by_ring_traffic(
    bench: ModuleType, algbw: float, world_size: int, busbw: float
) -> None:
    assert bench.bus_bandwidth(algbw, world_size) == pytest.approx(busbw)


def test_sweep_sizes_multiplies_up_to_the_maximum(bench: ModuleType) -> None:
    assert bench.sweep_sizes(1024, 16 * 2**20, 2, 4) == [2**k for k in range(10, 25)]
    assert bench.sweep_sizes(1000, 5000, 2, 4) == [1000, 2000, 4000]
    assert bench.sweep_sizes(1024, 2**20, 4, 2) == [2**10, 2**12, 2**14, 2**16, 2**18, 2**20]


def test_sweep_sizes_rounds_to_whole_elements(bench: ModuleType) -> None:
    # 1 and 2 bytes round up to one 4-byte element and collapse into the 4-byte size;
    # with 8-byte elements 6 rounds up to 8 and 12 rounds down to 8, so 8 is listed once.
    assert bench.sweep_sizes(1, 16, 2, 4) == [4, 8, 16]
    assert bench.sweep_sizes(3, 24, 2, 8) == [8, 24]
