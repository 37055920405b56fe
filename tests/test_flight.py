"""torch's flight recorder: the digest of real dumps, the workers' environment, and a dump asked of a real
gloo process through the hook clusterrun installs (its FIFO), as the agent asks on a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loadscale import scaled
from procs import free_port

from clusterrun import remote
from clusterrun.facts import flight as flight_facts
from clusterrun.remote import flight, stacks

REAL = Path(__file__).resolve().parent / "fixtures" / "real" / "flight"


def real_dumps(case: str) -> dict[int, bytes]:
    return {int(p.stem.removeprefix("rank")): p.read_bytes() for p in (REAL / case).glob("rank*.json")}


def test_the_rank_that_never_called_the_collective_is_named() -> None:
    assert flight_facts.digest(real_dumps("stuck")) == [
        "default_pg: ranks 0-2 wait in all_reduce #4; rank 3 never called it (last collective: all_reduce #3)"
        "   <- the one to look at"]
    assert flight_facts.behind(real_dumps("stuck")) == [3]


def test_a_rank_that_has_called_no_collective_yet_is_named_not_every_rank_in_it() -> None:
    """Rank 3 sleeps before its first collective: its dump holds no process group at all (real torch 2.13)."""
    lines = flight_facts.digest(real_dumps("first"))
    assert lines == ["default_pg: ranks 0-2 wait in all_reduce #1; rank 3 never called it (last collective: none)"
                     "   <- the one to look at"]
    assert not any("no rank is missing" in line for line in lines)
    assert flight_facts.behind(real_dumps("first")) == [3]


def test_a_rank_missing_from_the_dumps_is_named() -> None:
    dumps = {r: d for r, d in real_dumps("first").items() if r != 3}
    lines = flight_facts.digest(dumps, ranks=range(4))
    assert lines == ["default_pg: ranks 0-2 wait in all_reduce #1; rank 3 gave no flight recorder dump, so whether "
                     "they called it is unknown", "rank 3: no flight recorder dump came back"]
    assert flight_facts.behind(dumps, ranks=range(4)) == []  # no evidence against it: not blamed


def test_every_rank_in_a_collective_that_does_not_complete_suspects_the_network() -> None:
    dumps = {r: d for r, d in real_dumps("first").items() if r != 3}
    assert flight_facts.digest(dumps) == ["default_pg: every rank is in all_reduce #1 and it does not complete: no "
                                          "rank is missing from it; suspect the network or one rank's device"]


def test_no_collective_in_any_dump_is_said_so() -> None:
    assert flight_facts.digest({3: real_dumps("first")[3]}) == [
        "no rank has called a collective yet: they are stuck before the first one"]


def test_a_desync_names_who_called_what() -> None:
    assert flight_facts.digest(real_dumps("desync")) == [
        "default_pg: collective #4 differs between ranks (a desync): ranks 0,2-3 called all_reduce [4]; "
        "rank 1 called broadcast [8]   <- the code paths differ"]


def test_groups_are_read_per_process_group() -> None:
    groups = flight_facts.parse((REAL / "stuck" / "rank0.json").read_bytes())
    assert not isinstance(groups, str)
    assert groups["0"].name == "default_pg" and (groups["0"].enqueued, groups["0"].completed) == (4, 3)
    assert groups["1"].completed == groups["1"].enqueued == 1  # the sub-group of ranks 0 and 1: all done


def test_ranks_without_a_dump_are_named_with_the_reason() -> None:
    dumps = real_dumps("stuck")
    dumps[3] = json.dumps({"error": "torch.distributed is not initialised in this process"}).encode()
    dumps[4] = b"garbage{"
    lines = flight_facts.digest(dumps)
    assert lines[0].startswith("default_pg: ranks 0-2 wait in all_reduce #4")
    assert "rank 3: torch.distributed is not initialised in this process" in lines
    assert "rank 4: its flight recorder dump is not JSON" in lines


def test_everything_complete_means_stuck_outside_collectives() -> None:
    done = {r: d for r, d in real_dumps("stuck").items() if r == 3}
    assert flight_facts.digest(done) == ["every collective the ranks called has completed (last #3): they are "
                                         "stuck outside torch.distributed"]


def test_the_jobs_own_flight_recorder_settings_win(tmp_path: Path) -> None:
    env = flight.env(str(tmp_path), {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}, (2, 13))
    assert not {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT"} & set(env)
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "flight" / "nccl-rank")


@pytest.mark.parametrize(("version", "names"), [
    ((2, 13), {"TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"}),  # the old names warn in every rank
    ((2, 4), {"TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}),
    (None, {"TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_TRACE_BUFFER_SIZE",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}),
])
def test_the_variables_the_nodes_torch_reads(tmp_path: Path, version: tuple[int, int] | None, names: set[str]) -> None:
    env = flight.env(str(tmp_path), {}, version)
    assert set(env) == names | {"CLUSTERRUN_FLIGHT", "TORCH_NCCL_DUMP_ON_TIMEOUT"}
    assert all(env[n] == flight.BUFFER_ENTRIES for n in names if n.endswith("BUFFER_SIZE"))
    assert flight.torch_version() >= (2, 1)  # this interpreter's torch, read without importing it


def test_timeout_dumps_are_found_by_rank(tmp_path: Path) -> None:
    where = Path(flight.folder(str(tmp_path)))
    where.mkdir()
    (where / "nccl-rank3").write_bytes(b"\x80\x04pickle")
    (where / "nccl-rank12").write_bytes(b"x")
    (where / "flight-77.json").write_bytes(b"{}")
    assert flight.timeout_dumps(str(where)) == [(3, str(where / "nccl-rank3")), (12, str(where / "nccl-rank12"))]


WAITER = """
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:%d")
t = torch.ones(3)
for _ in range(2):
    dist.all_reduce(t)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_dump_is_asked_of_a_real_worker_through_its_hook(tmp_path: Path) -> None:
    """The hook as the agent installs it (sitecustomize on PYTHONPATH), in a real gloo process: the FIFO
    answers with torch's JSON dump of its two all-reduces."""
    pytest.importorskip("torch")
    run_dir = str(tmp_path / "run")
    env = {**os.environ, "LOCAL_RANK": "0"}
    env.update(stacks.hook_env(run_dir, remote.source("stackhook"), env))
    env.update(flight.env(run_dir, env, flight.torch_version()))
    proc = subprocess.Popen([sys.executable, "-c", WAITER % free_port()], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        answers = flight.request([proc.pid, 999999999], flight.folder(run_dir), timeout=20)
    finally:
        proc.kill()
        proc.wait()
    data, why = answers[proc.pid]
    assert data is not None, why
    groups = flight_facts.parse(data)
    assert not isinstance(groups, str) and (groups["0"].enqueued, groups["0"].completed) == (2, 2)
    assert groups["0"].op(2) == "all_reduce #2"
    assert answers[999999999] == (None, "the worker has no clusterrun hook (a sitecustomize of its own, or "
                                        "python -S/-I)")


def test_a_worker_without_torch_distributed_says_so(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    env = {**os.environ, "LOCAL_RANK": "0"}
    env.update(stacks.hook_env(run_dir, remote.source("stackhook"), env))
    env.update(flight.env(run_dir, env, flight.torch_version()))
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                            env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        deadline = time.monotonic() + scaled(10)
        while not os.path.exists(os.path.join(flight.folder(run_dir), f"ask-{proc.pid}")):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        (data, _why), = flight.request([proc.pid], flight.folder(run_dir), timeout=10).values()
    finally:
        proc.kill()
        proc.wait()
    assert flight_facts.parse(data or b"") == "torch.distributed is not initialised in this process"
