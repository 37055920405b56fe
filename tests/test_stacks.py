"""Stacks of hung ranks, parsed from real py-spy and faulthandler dumps, and the digest that names the odd one out."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.facts import stacks

REAL = Path(__file__).resolve().parent / "fixtures" / "real" / "stacks"


def real(name: str) -> str:
    return (REAL / name).read_text(encoding="utf-8")


@pytest.mark.parametrize(("name", "where"), [
    ("pyspy_rank0_all_reduce.txt", "all_reduce (hang.py:16)"),
    ("faulthandler_rank0_all_reduce.txt", "all_reduce (hang.py:16)"),
    ("pyspy_rank1_stuck.txt", "stuck_here (hang.py:7)"),
    ("faulthandler_rank1_stuck.txt", "stuck_here (hang.py:7)"),
    ("pyspy_two_threads.txt", "stuck_here (stuck.py:4)"),
])
def test_where_a_rank_is_from_either_tool(name: str, where: str) -> None:
    assert stacks.where(stacks.parse(real(name))) == where


def test_threads_and_frames_are_read_innermost_first() -> None:
    threads = stacks.parse(real("pyspy_two_threads.txt"))
    assert [t.name for t in threads] == ["MainThread", "data-loader"]
    assert [f.short() for f in threads[1].frames] == [
        "worker (stuck.py:8)", "Thread.run (threading.py:982)", "Thread._bootstrap_inner (threading.py:1045)",
        "Thread._bootstrap (threading.py:1002)"]
    fh = stacks.parse(real("faulthandler_rank0_all_reduce.txt"))[0]
    assert fh.frames[0].file.endswith("torch/distributed/distributed_c10d.py") and fh.frames[0].line == 3252


def test_digest_groups_ranks_and_marks_the_odd_one_out() -> None:
    waiting, stuck = real("pyspy_rank0_all_reduce.txt"), real("faulthandler_rank1_stuck.txt")
    dumps = {r: real("faulthandler_rank0_all_reduce.txt") if r % 2 else waiting for r in range(8)}
    dumps[5] = stuck
    dumps[9] = "py-spy: Permission denied (os error 13)"
    assert stacks.digest(dumps) == [
        "ranks 0-4,6-7 in all_reduce (hang.py:16)",
        "rank 5 in stuck_here (hang.py:7)   <- the odd one out",
        "rank 9: no stack could be read",
    ]
    assert stacks.odd_ones(dumps) == [5]  # the rank the hang's verdict falls on


def test_no_odd_one_out_without_a_majority() -> None:
    lines = stacks.digest({0: real("pyspy_rank0_all_reduce.txt"), 1: real("pyspy_rank1_stuck.txt")})
    assert lines == ["rank 0 in all_reduce (hang.py:16)", "rank 1 in stuck_here (hang.py:7)"]
    assert stacks.odd_ones({0: real("pyspy_rank0_all_reduce.txt"), 1: real("pyspy_rank1_stuck.txt")}) == []
