"""torchrun's failure summary (``ChildFailedError``), read by the node agent: recorded real stderr of torchrun.

The files in tests/fixtures/real/torchrun/ (see SOURCE.md) are torchrun's whole stderr, as the agent reads it
line by line: banner, log lines, traceback, then the summary, whose ``rank`` fields are global ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.remote.torchrun_summary import parse_failures

FIXTURES = Path(__file__).parent / "fixtures" / "real" / "torchrun"


def stderr_lines(name: str) -> list[str]:
    # The agent keeps each line without its line ending (job.Agent._read_launcher).
    return (FIXTURES / name).read_text(encoding="utf-8").splitlines()


def summary(name: str) -> dict[int, tuple[int, int | None, bool]]:
    """Global rank -> (exit code, signal, root cause)."""
    return {rank: (got["rc"], got["signal"], got["root_cause"]) for rank, got in
            parse_failures(stderr_lines(name)).items()}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # rank 0 SIGKILLed itself (the root cause: torchrun saw it first), rank 1 exited 3
        ("exit3_and_sigkill.txt", {0: (137, 9, True), 1: (3, None, False)}),
        # rank 1 exited 3 (the root cause), torchrun stopped rank 0 with SIGTERM
        ("exit3_other_sigterm.txt", {1: (3, None, True), 0: (143, 15, False)}),
        # node 1 of 2: global ranks 2 and 3, not local ranks 0 and 1; rank 3 raised (error file and traceback)
        ("node1_of_2_record_traceback.txt", {3: (1, None, True), 2: (143, 15, False)}),
        ("node0_of_2_record_traceback.txt", {1: (1, None, True), 0: (143, 15, False)}),
    ],
)
def test_failed_ranks_with_exit_codes_and_root_cause(name: str, expected: dict) -> None:
    assert summary(name) == expected


def test_signal_deaths_read_as_128_plus_the_signal() -> None:
    got = parse_failures(stderr_lines("exit3_and_sigkill.txt"))

    assert (got[0]["rc"], got[0]["signal"]) == (128 + 9, 9)  # "exitcode  : -9 (pid: 6996)  (SIGKILL)"
    assert (got[1]["rc"], got[1]["signal"]) == (3, None)


def test_failure_time_is_torchruns_timestamp() -> None:
    got = parse_failures(stderr_lines("node1_of_2_record_traceback.txt"))

    assert got[3]["time"] == "2026-11-24_05:21:21"
    assert got[2]["time"] == "2026-11-24_05:21:22"


def test_lines_outside_the_summary_are_ignored() -> None:
    lines = stderr_lines("exit3_other_sigterm.txt")
    before = lines[:lines.index("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ")]
    # The banner, "failed (exitcode: 3) local_rank: 1 (pid: ...)", "Sending process ... SIGTERM", the traceback
    assert any("failed (exitcode: 3)" in line for line in before)
    assert parse_failures(before) == {}
    # ... and rank output or anything else around the summary changes nothing
    noise = ["rank 0 starting", "time: 12.5s per step", "  rank 7 is slow", "exitcode=5"]
    assert parse_failures(noise + lines + noise) == parse_failures(lines)


def test_successful_run_has_no_failures() -> None:
    assert parse_failures(stderr_lines("success.txt")) == {}
