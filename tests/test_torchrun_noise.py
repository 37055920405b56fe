"""torchrun's end-of-run noise (the exit-barrier error of a node whose ranks had finished) is kept off the
terminal; a real failure's traceback is shown whole. The files are recorded torchrun output (see
tests/fixtures/real/torchrun/SOURCE.md)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from clusterrun.facts.torchrun_noise import HOLD_LINES, HOLD_SECONDS, LOOKUP_NOTE, NoiseFilter, Sorted, is_lookup_note
from clusterrun.launch.console import Console

FIXTURES = Path(__file__).parent / "fixtures" / "real" / "torchrun"
BARRIER = (FIXTURES / "exit_barrier_node2_of_4.txt").read_text().splitlines()
# c10d's reverse-lookup warning as this torchrun wrote it (on the simulated cluster, where no DNS server answers).
LOOKUP = BARRIER[4]

# The same block as torch's _exit_barrier logged it before torch 2.2 (logging's default format, the traceback
# bare), from the text in torch/distributed/elastic/agent/server/api.py and utils/store.py.
LEGACY = """ERROR:torch.distributed.elastic.agent.server.api:Error waiting on exit barrier. Elapsed: 300.06 seconds
Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/torch/distributed/elastic/agent/server/api.py", line 904, in _exit_barrier
    store_util.barrier(
  File "/usr/lib/python3/site-packages/torch/distributed/elastic/utils/store.py", line 78, in barrier
    synchronize(store, data, rank, world_size, key_prefix, barrier_timeout)
  File "/usr/lib/python3/site-packages/torch/distributed/elastic/utils/store.py", line 64, in synchronize
    agent_data = get_all(store, rank, key_prefix, world_size)
  File "/usr/lib/python3/site-packages/torch/distributed/elastic/utils/store.py", line 34, in get_all
    data = store.get(f"{prefix}{idx}")
RuntimeError: Socket Timeout""".splitlines()


def sort(lines: list[str], step: float = 0.01) -> tuple[list[str], bool]:
    """Feed ``lines`` one by one, then end the output: what is shown, and whether noise was recognised."""
    noise_filter, shown, noise = NoiseFilter(), [], False
    for i, line in enumerate(lines):
        got = noise_filter.feed(line, i * step)
        shown += got.show
        noise = noise or got.noise
    last = noise_filter.flush()
    return shown + list(last.show), noise or last.noise


def test_recorded_exit_barrier_noise_of_a_successful_run_is_not_shown() -> None:
    shown, noise = sort(BARRIER)
    assert noise
    assert not any("Traceback" in line or "frame #" in line or "exit barrier" in line for line in shown)
    assert not any("recvValueWithTimeout" in line for line in shown)
    # What came before it (torchrun's banner and warning) is shown as it came.
    assert shown == BARRIER[:5]


def test_the_noise_is_recognised_when_more_output_follows_it() -> None:
    shown, noise = sort([*BARRIER, "after the barrier"])
    assert noise and shown == [*BARRIER[:5], "after the barrier"]


def test_the_noise_in_torchs_older_log_format_is_not_shown() -> None:
    shown, noise = sort(["before", *LEGACY])
    assert noise and shown == ["before"]


@pytest.mark.parametrize("name", ["exit3_other_sigterm.txt", "exit3_and_sigkill.txt",
                                  "node0_of_2_record_traceback.txt", "node1_of_2_record_traceback.txt"])
def test_a_real_failures_traceback_is_shown_whole_and_in_order(name: str) -> None:
    lines = (FIXTURES / name).read_text().splitlines()
    assert sort(lines) == (lines, False)


def test_a_store_warning_without_the_exit_barrier_error_is_shown_whole() -> None:
    # The master died mid-run: the store client's warning and stack, then torchrun's own failure.
    store = BARRIER[5:27]
    lines = [*store, "E1125 15:23:05.000000 1 site-packages/torch/distributed/run.py:1] rendezvous failed"]
    assert sort(lines) == (lines, False)


def test_a_header_without_its_traceback_is_shown() -> None:
    lines = [BARRIER[27], "torchrun went on with something else"]
    assert sort(lines) == (lines, False)


def test_a_traceback_that_goes_on_past_the_bound_is_shown_whole() -> None:
    lines = [*LEGACY[:2], *[f'  File "x.py", line {i}, in f' for i in range(HOLD_LINES)], "RuntimeError: x"]
    assert sort(lines) == (lines, False)


def test_a_block_held_too_long_without_a_line_is_released() -> None:
    noise_filter = NoiseFilter()
    assert noise_filter.feed(LEGACY[0], 0.0) == Sorted()
    assert noise_filter.feed(LEGACY[1], 1.0) == Sorted()
    assert noise_filter.due(1.0 + HOLD_SECONDS / 2) == Sorted()
    assert noise_filter.due(1.0 + HOLD_SECONDS) == Sorted(tuple(LEGACY[:2]))  # not whole: shown
    for i, line in enumerate(LEGACY):
        noise_filter.feed(line, 10.0 + i)
    assert noise_filter.due(10.0 + len(LEGACY) + HOLD_SECONDS) == Sorted(noise=True)  # whole: noise


def console() -> tuple[Console, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return Console(out, err, color=False), out, err


def test_the_terminal_says_once_that_the_noise_is_kept_in_launcher_log() -> None:
    con, out, err = console()
    for node in ("node1", "node2"):
        for i, line in enumerate(BARRIER):
            con.node_line(node, line, [2, 3], now=float(i))
    con.tick(final=True)
    assert "Traceback" not in out.getvalue() and "frame #" not in out.getvalue()
    assert sum("*****" in line for line in out.getvalue().splitlines()) == 4  # each node's banner is shown
    lookup, barrier = err.getvalue().splitlines()  # the recording holds c10d's reverse-lookup warning too
    assert "exit-barrier" in barrier and "launcher.log" in barrier and "harmless" in barrier
    assert lookup == f"clusterrun: node1: {LOOKUP_NOTE}"


def test_a_held_block_is_shown_before_an_error_of_the_same_node() -> None:
    con, out, _ = console()
    con.node_line("node1", LEGACY[0], [0], now=0.0)
    con.node_line("node1", LEGACY[1], [0], now=0.1)
    con.node_line("node1", "torchrun: cannot start", [0], error=True, now=0.2)
    assert out.getvalue().splitlines() == [f"[node1] {line}" for line in (*LEGACY[:2], "torchrun: cannot start")]


def test_with_a_rank_filter_other_nodes_launcher_lines_are_not_shown_but_errors_are() -> None:
    out, err = io.StringIO(), io.StringIO()
    con = Console(out, err, color=False, ranks={0})
    con.node_line("node0", "banner of node0", [0, 1])
    con.node_line("node1", "banner of node1", [2, 3])
    con.node_line("node1", "torchrun could not start", [2, 3], error=True)
    con.tick(final=True)
    assert out.getvalue().splitlines() == ["[node0] banner of node0", "[node1] torchrun could not start"]


def test_c10d_reverse_lookup_warning_is_recognised_alone_in_both_formats() -> None:
    assert is_lookup_note(LOOKUP) and "socket.cpp" in LOOKUP
    # torch before 2.2 (c10's log prefix without a time stamp), as in pytorch issue #85300's output
    assert is_lookup_note("[W socket.cpp:464] [c10d] The hostname of the client socket cannot be retrieved. err=-3")
    assert not is_lookup_note("REPORT {}" + LOOKUP)  # glued to a rank's own output (two writes): shown
    assert not is_lookup_note(BARRIER[5])  # the store's warning is another matter


def test_every_ranks_and_nodes_reverse_lookup_warning_is_said_once_as_harmless() -> None:
    con, out, err = console()
    for node, ranks in (("node0", (0, 1)), ("node1", (2, 3))):
        con.node_line(node, LOOKUP, list(ranks), now=0.0)
        for rank in ranks:
            con.rank_output(node, rank, "stderr", f"{LOOKUP}\nrank {rank} up\n".encode())
    con.tick(final=True)
    assert out.getvalue().splitlines() == [f"[node{r // 2}:{r}] rank {r} up" for r in range(4)]
    assert err.getvalue().splitlines() == [f"clusterrun: node0: {LOOKUP_NOTE}"]
    assert "harmless" in LOOKUP_NOTE and "logs" in LOOKUP_NOTE
