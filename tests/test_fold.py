"""Identical lines from many ranks folded on the terminal: once, under all their ranks; the rank logs keep every line.

The console and the log relay are driven as the supervisor drives them (``LogRelay.write`` for every piece of a
rank's output, ``Console.tick`` every quarter second), with the time given by a clock the test moves.
"""

from __future__ import annotations

import io
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from clusterrun.inventory.hostlist import short_hostlist, short_numbers
from clusterrun.launch.console import Console
from clusterrun.launch.fold import (
    HOLD,
    LATE,
    MAX_HELD,
    MAX_SHOWN,
    NOTE_QUIET,
    WARMUP,
    Folder,
    Key,
    Line,
    Note,
    label,
)
from clusterrun.launch.relay import LogRelay
from clusterrun.runs import RunDir

BANNER = [
    "/usr/lib/python3/site-packages/torch/distributed/c10d.py:1024: UserWarning: the same warning on every rank",
    "  warnings.warn(",
    "\x1b[33mNCCL version 2.21.5+cuda12.4\x1b[0m",
]
TICK = 0.25  # the supervisor's tick


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _console(clock: Clock, **kw: object) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(out, io.StringIO(), color=False, fold=True, clock=clock, **kw), out  # type: ignore[arg-type]


def _ticks(console: Console, clock: Clock, seconds: float) -> None:
    """Let ``seconds`` pass, ticking as the supervisor does."""
    end = clock.now + seconds
    while clock.now < end:
        clock.now = min(end, clock.now + TICK)
        console.tick()


def _flood(tmp_path: Path, nodes: int, nproc: int, distinct: int) -> tuple[list[str], RunDir, list[list[str]]]:
    """Every rank prints the banner, then ``distinct`` lines of its own, the banner's lines once more between them
    (as a warning each step would); the ranks' pieces come interleaved, a node after another, within the window.
    Returns the terminal's lines, the run directory and what each rank printed."""
    clock = Clock()
    console, out = _console(clock)
    run = RunDir.create(tmp_path, "r1")
    relay = LogRelay(run, console, {})
    world = nodes * nproc
    printed: list[list[str]] = []
    for rank in range(world):
        mine = [*BANNER, f"rank {rank} of {world} ready"]
        for step in range(distinct):
            mine += [f"step {step} loss {rank * 0.001 + step:.4f}", BANNER[0]] if step == distinct // 2 else \
                [f"step {step} loss {rank * 0.001 + step:.4f}"]
        printed.append(mine)
    pieces = [[("\n".join(lines[i:i + 3]) + "\n") for i in range(0, len(lines), 3)] for lines in printed]
    for turn in range(max(len(p) for p in pieces)):
        for rank in range(world):
            if turn < len(pieces[rank]):
                relay.write(f"crn{rank // nproc}", rank, "stdout", pieces[rank][turn].encode())
        clock.now += 0.0001
    _ticks(console, clock, 1.0)
    shown = out.getvalue().splitlines()
    relay.close()
    assert out.getvalue().splitlines() == shown  # nothing was left for the end
    return shown, run, printed


def _per_rank(shown: list[str], nproc: int) -> dict[int, list[str]]:
    """What the terminal says each rank printed, in the order shown: a folded line counts for each of its ranks."""
    seen: dict[int, list[str]] = {}
    for line in shown:
        prefix, text = line.split(" ", 1)
        for rank in _ranks(prefix):
            seen.setdefault(rank, []).append(text)
    return seen


def _ranks(prefix: str) -> list[int]:
    ranks = re.fullmatch(r"\[.*:([\d,-]+)\]", prefix)
    assert ranks, prefix
    out = []
    for part in ranks.group(1).split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


@pytest.mark.parametrize(("nodes", "nproc", "folded"), [(32, 2, "[crn[0-31]:0-63]"), (64, 8, "[crn[0-63]:0-511]")])
def test_a_flood_of_identical_lines_shows_each_once_with_its_ranks(tmp_path: Path, nodes: int, nproc: int,
                                                                   folded: str) -> None:
    shown, run, printed = _flood(tmp_path, nodes, nproc, distinct=6)
    world = nodes * nproc
    counts = Counter(shown)
    for text in BANNER:  # once each, under every rank (the warning twice: every rank printed it twice)
        assert counts[f"{folded} {text}"] == (2 if text == BANNER[0] else 1), [s for s in shown if text in s][:3]
    assert sum(text in line for line in shown for text in BANNER[1:]) == 2
    # Every distinct line once, under its own rank.
    for rank in range(world):
        for line in printed[rank]:
            if line not in BANNER:
                assert counts[f"[crn{rank // nproc}:{rank}] {line}"] == 1, line
    assert len(shown) == len(BANNER) + 1 + world * (1 + 6)
    # Nothing lost, nothing reordered: each rank's lines, folded ones included, in the order it printed them.
    assert _per_rank(shown, nproc) == dict(enumerate(printed))
    for rank in (0, world // 2, world - 1):  # the rank logs hold every line, as printed
        log = run.rank_log(f"crn{rank // nproc}", rank).read_text()
        assert log.splitlines() == printed[rank]


def test_copies_that_come_later_are_named_in_a_note_not_shown_again(tmp_path: Path) -> None:
    """Half the nodes start 3 s after the others: their copies are not printed again; one note names them."""
    clock = Clock()
    console, out = _console(clock)
    relay = LogRelay(RunDir.create(tmp_path, "r1"), console, {})
    for rank in range(32):
        relay.write(f"crn{rank // 2}", rank, "stdout", f"{BANNER[0]}\nrank {rank} up\n".encode())
    _ticks(console, clock, 3.0)
    for rank in range(32, 64):
        relay.write(f"crn{rank // 2}", rank, "stdout", f"{BANNER[0]}\nrank {rank} up\n".encode())
        clock.now += 0.01  # they come over a third of a second
    _ticks(console, clock, 0.5)
    shown = out.getvalue().splitlines()
    assert shown[0] == f"[crn[0-15]:0-31] {BANNER[0]}"
    assert sum(BANNER[0] in line for line in shown) == 1  # the note is not due yet: copies may still come
    _ticks(console, clock, NOTE_QUIET + TICK)
    shown = out.getvalue().splitlines()
    [note] = [line for line in shown if BANNER[0][:40] in line and line != shown[0]]
    assert note == (f'[crn[16-31]:32-63] (the line "{BANNER[0][:80]}…" also came from these 32 ranks, up to 3.1 s '
                    "after [crn[0-15]:0-31]; not shown again)")
    assert all(f"[crn{r // 2}:{r}] rank {r} up" in shown for r in range(64))  # their own lines, each shown
    relay.close()
    assert out.getvalue().splitlines() == shown  # noted once, not again at the end


def test_a_note_is_written_at_the_end_and_a_copy_after_late_is_a_line_of_its_own() -> None:
    clock = Clock()
    console, out = _console(clock)
    console.rank_output("a", 0, "stdout", b"same\n")
    console.rank_output("b", 1, "stdout", b"same\n")
    _ticks(console, clock, 1.0)
    console.rank_output("c", 2, "stdout", b"same\n")
    console.tick(final=True)
    assert out.getvalue().splitlines() == [
        "[a,b:0-1] same",
        '[c:2] (the line "same" also came from this rank, up to 0.8 s after [a,b:0-1]; not shown again)']
    _ticks(console, clock, LATE)
    console.rank_output("d", 3, "stdout", b"same\n")  # half a minute on: a line of its own
    console.tick(final=True)
    assert out.getvalue().splitlines()[-1] == "[d:3] same"


def test_lines_that_differ_are_never_folded() -> None:
    clock = Clock()
    console, out = _console(clock)
    for rank in range(4):
        console.rank_output("n0", rank, "stdout", f"loss {0.5 + rank / 1000:.4f}\nrank {rank}\nsame \n".encode())
    console.rank_output("n1", 4, "stdout", b"same\n")  # a space short: another line
    console.tick(final=True)
    shown = out.getvalue().splitlines()
    assert "[n0:0-3] same " in shown and "[n1:4] same" in shown
    assert all(f"[n0:{r}] loss {0.5 + r / 1000:.4f}" in shown and f"[n0:{r}] rank {r}" in shown for r in range(4))
    assert len(shown) == 10


def test_a_line_waits_at_most_the_window_and_a_lone_rank_later_not_at_all() -> None:
    clock = Clock()
    console, out = _console(clock)
    console.rank_output("n0", 0, "stdout", b"starting\n")
    assert out.getvalue() == ""  # early in the run every rank prints the same banners: it waits for copies
    console.tick(now=clock.now + HOLD - 0.01)
    assert out.getvalue() == ""
    console.tick(now=clock.now + HOLD)
    assert out.getvalue() == "[n0:0] starting\n"
    clock.now += WARMUP
    console.rank_output("n0", 0, "stdout", b"epoch 1 loss 0.3\n")  # only rank 0 has been printing: at once
    assert out.getvalue().endswith("[n0:0] epoch 1 loss 0.3\n")
    console.rank_output("n1", 1, "stdout", b"rank 1 speaks\n")  # another rank: lines wait for copies again
    console.rank_output("n0", 0, "stdout", b"epoch 2\n")
    assert out.getvalue().endswith("[n0:0] epoch 1 loss 0.3\n")
    clock.now += HOLD
    console.rank_output("n0", 0, "stdout", b"x\n")  # what waited long enough goes out with the next piece
    assert out.getvalue().endswith("[n0:0] epoch 1 loss 0.3\n[n1:1] rank 1 speaks\n[n0:0] epoch 2\n")


def test_a_rank_lines_keep_their_order_when_a_copy_joins_an_earlier_line() -> None:
    """n1 printed its own line before the shared one, which n0 printed first: n1's own line is shown first."""
    clock = Clock()
    console, out = _console(clock)
    console.rank_output("n0", 0, "stdout", b"shared\n")
    clock.now += 0.1
    console.rank_output("n1", 1, "stdout", b"mine first\nshared\nafter\n")
    _ticks(console, clock, 1.0)
    assert out.getvalue().splitlines() == ["[n1:1] mine first", "[n[0-1]:0-1] shared", "[n1:1] after"]


def test_a_rank_printing_its_line_again_shows_it_again() -> None:
    folder = Folder()
    a, b = ("n0", 0), ("n1", 1)
    out = [*folder.add(a, ["same"], 0.0), *folder.add(b, ["same"], 0.0), *folder.due(HOLD)]
    out += folder.add(b, ["same"], 2 * HOLD)  # a second time: not a later copy of the first
    out += folder.flush(3 * HOLD)
    assert out == [Line((a, b), ["same"]), Line((b,), ["same"])]
    # n0 prints it twice, n1 once and then once more: n1's second is a later copy of n0's second.
    folder = Folder()
    out = [*folder.add(a, ["same", "same"], 0.0), *folder.add(b, ["same"], 0.0), *folder.due(HOLD)]
    out += folder.add(b, ["same"], 1.0)
    assert out == [Line((a, b), ["same"]), Line((a,), ["same"])]
    assert folder.flush(2.0) == [Note((b,), "same", (a,), 1 - HOLD)]


def test_torchrun_lines_fold_under_their_nodes_never_with_a_rank_line() -> None:
    clock = Clock()
    console, out = _console(clock)
    for node in range(32):
        console.node_line(f"crn{node}", "Setting OMP_NUM_THREADS environment variable for each process to be 1")
        console.rank_output(f"crn{node}", node, "stdout", b"Setting OMP_NUM_THREADS environment variable for each "
                            b"process to be 1\n")
    console.tick(final=True)
    assert out.getvalue().splitlines() == [
        "[crn[0-31]:0-31] Setting OMP_NUM_THREADS environment variable for each process to be 1",
        "[crn[0-31]] Setting OMP_NUM_THREADS environment variable for each process to be 1"]


def test_labels_compress_nodes_and_ranks_and_shorten_what_does_not() -> None:
    assert label((("gpu01-ib", 0), ("gpu02-ib", 1), ("gpu03-ib", 2), ("login", 3))) == "[gpu[01-03]-ib,login:0-3]"
    assert label((("b", 9), ("a", 3))) == "[a,b:3,9]"  # nodes in the order of their ranks
    names = [f"{word}{i}x" for i, word in enumerate(["alpha", "beta", "gamma", "delta"] * 16)]
    assert short_hostlist(names, 48) == "alpha0x,beta1x,gamma2x,delta3x,alpha4x,beta5x,…(64 nodes)"
    assert short_hostlist(["n1", "n2", "n3", "n5", "login"], 48) == "n[1-3,5],login"
    assert short_numbers(list(range(0, 512, 2)), 40, "ranks") == \
        "0,2,4,6,8,10,12,14,16,18,20,22,24,26,28,…(256 ranks)"
    assert short_hostlist(["with space", "x"], 48) == "with space,x"  # no hostlist can hold it: as it is
    assert label(tuple((f"w{i}", i) for i in range(0, 512, 2))) == (
        "[w[0,2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,…](256 nodes)"
        ":0,2,4,6,8,10,12,14,16,18,20,22,24,26,28,…(256 ranks)]")


def test_no_fold_shows_every_copy(tmp_path: Path) -> None:
    out = io.StringIO()
    console = Console(out, io.StringIO(), color=False)
    for rank in range(3):
        console.rank_output(f"n{rank}", rank, "stdout", b"same\n")
    assert out.getvalue() == "[n0:0] same\n[n1:1] same\n[n2:2] same\n"


def test_the_console_needs_only_the_standard_library() -> None:
    """It also runs on the nodes: with click, rich and pydantic unimportable it still folds and colours."""
    code = """
import io, sys
for name in ("click", "rich", "pydantic", "paramiko", "yaml"):
    sys.modules[name] = None
before = set(sys.modules)
from clusterrun.launch.console import Console
others = [m for m in set(sys.modules) - before if m.split(".")[0] not in {*sys.stdlib_module_names, "clusterrun"}]
assert not others, others
out = io.StringIO()
console = Console(out, io.StringIO(), color=True, fold=True)
console.rank_output("n0", 0, "stdout", b"same\\n")
console.rank_output("n1", 1, "stdout", b"same\\n")
console.rank_output("n1", 1, "stdout", b"own\\n")
console.tick(final=True)
print(repr(out.getvalue()))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr("\x1b[1m[n[0-1]:0-1]\x1b[0m same\n\x1b[36m[n1:1]\x1b[0m own\n")


def test_lines_held_for_copies_are_shown_before_a_message_of_clusterrun() -> None:
    clock = Clock()
    stream = io.StringIO()
    console = Console(stream, stream, color=False, fold=True, clock=clock)
    console.rank_output("n1", 3, "stderr", b"Traceback (most recent call last):\nValueError: bad batch\n")
    console.info("n1 rank 3 failed (exit code 1); stopping all nodes")
    assert stream.getvalue().splitlines() == ["[n1:3] Traceback (most recent call last):",
                                              "[n1:3] ValueError: bad batch",
                                              "clusterrun: n1 rank 3 failed (exit code 1); stopping all nodes"]


def test_a_line_printed_twice_is_matched_time_for_time_when_its_copies_come_late() -> None:
    """torchrun's banner holds its row of stars twice; three nodes print it half a second after the first:
    nothing is shown twice, each later copy is noted (a blank line is shown: a note on it would say nothing)."""
    clock = Clock()
    console, out = _console(clock)
    banner = ["", "*" * 41, "Setting OMP_NUM_THREADS environment variable for each process to be 1", "*" * 41]
    for text in banner:
        console.node_line("node3", text)
    _ticks(console, clock, 0.5)
    for node in range(3):
        for text in banner:
            console.node_line(f"node{node}", text)
    console.tick(final=True)
    assert out.getvalue().splitlines() == [
        "[node3] ", f"[node3] {'*' * 41}", f"[node3] {banner[2]}", f"[node3] {'*' * 41}", "[node[0-2]] ",
        f'[node[0-2]] (the line "{"*" * 41}" also came from these 3 nodes, up to 0.2 s after [node3]; not shown again)',
        f'[node[0-2]] (the line "{banner[2]}" also came from these 3 nodes, up to 0.2 s after [node3]; not shown '
        "again)",
        f'[node[0-2]] (the line "{"*" * 41}" also came from these 3 nodes, up to 0.2 s after [node3]; not shown again)']


def test_random_interleavings_lose_nothing_keep_each_rank_order_and_wait_at_most_half_a_second() -> None:
    """Ranks print shared and own lines in random pieces at random times (some seconds late, some repeating a
    line): every line a rank printed is shown under it or named in a note, exactly once; the lines shown under
    a rank keep its order; none waited more than the window and a tick."""
    runs = [_random_run(seed) for seed in range(40)]
    assert sum(folded for folded, _ in runs) > 100 and sum(noted for _, noted in runs) > 20  # what it is meant to be


def _random_run(seed: int) -> tuple[int, int]:
    """One random run, checked; returns how many folded lines and notes it had."""
    rng = random.Random(seed)
    folder = Folder()
    shared = [f"shared {i}" for i in range(6)] + [""]
    keys = [(f"n{r // 4}", r) for r in range(rng.choice([2, 8, 24]))]
    todo = {}
    for key in keys:
        lines = [rng.choice(shared) if rng.random() < 0.6 else f"own {key[1]} {i}" for i in range(rng.randint(0, 30))]
        todo[key] = lines
    printed: dict[Key, list[tuple[str, float]]] = {key: [] for key in keys}
    shown: dict[Key, list[tuple[str, float]]] = {key: [] for key in keys}
    noted: Counter[tuple[Key, str]] = Counter()
    now, next_tick = 0.0, TICK

    folded = 0

    def take(out: list[Line | Note], at: float) -> None:
        nonlocal folded
        for item in out:
            folded += isinstance(item, Line) and len(item.keys) > 1
            if isinstance(item, Line):
                for key in item.keys:
                    shown[key] += [(text, at) for text in item.texts]
            else:
                for key in item.keys:
                    noted[(key, item.text)] += 1

    while any(todo.values()) or now < 40:
        now += rng.choice([0.001, 0.01, 0.05, 0.2, 1.5])
        while next_tick <= now:
            take(folder.due(next_tick, notes=True), next_tick)
            next_tick += TICK
        for key in rng.sample(keys, k=min(len(keys), 3)):
            n = rng.randint(1, 4)
            piece, todo[key] = todo[key][:n], todo[key][n:]
            if piece:
                printed[key] += [(text, now) for text in piece]
                take(folder.add(key, piece, now), now)
    take(folder.flush(now), now)
    for key in keys:
        texts = [text for text, _ in printed[key]]
        assert Counter(text for text, _ in shown[key]) + Counter({t: noted[(key, t)] for t in set(texts)}) == \
            Counter(texts), key
        # What is shown under the key is what it printed, in order, less what was noted (matched from the end:
        # which of a line's copies a note stands for is not said).
        i = len(printed[key])
        for text, at in reversed(shown[key]):
            i -= 1
            while i >= 0 and printed[key][i][0] != text:
                i -= 1
            assert i >= 0 and at - printed[key][i][1] <= HOLD + TICK + 1e-9, (key, text)
    return folded, sum(noted.values())


def test_a_flood_is_written_before_its_window_ends_so_memory_stays_bounded() -> None:
    """More distinct lines within the half second than MAX_HELD: the oldest go out at once, in order."""
    folder = Folder()
    written: list[str] = []
    added = 0
    for piece in range(3 * MAX_HELD // 1000):
        key = ("n0", piece % 8)
        texts = [f"rank {key[1]} line {piece}.{i}" for i in range(1000)]
        added += len(texts)
        for item in folder.add(key, texts, 0.0):  # all at the same instant: none has waited its window
            assert isinstance(item, Line)
            written += item.texts
        assert added - len(written) <= MAX_HELD
    assert len(written) >= added - MAX_HELD - 1000
    written += [text for item in folder.flush(0.0) if isinstance(item, Line) for text in item.texts]
    assert written == [f"rank {p % 8} line {p}.{i}" for p in range(3 * MAX_HELD // 1000) for i in range(1000)]


def test_after_the_output_ended_a_restarted_job_lines_are_new_lines() -> None:
    clock = Clock()
    console, out = _console(clock)
    console.rank_output("n0", 0, "stdout", b"banner\n")
    console.tick(final=True)  # the attempt's relay closed
    clock.now += 5
    console.rank_output("n1", 1, "stdout", b"banner\n")  # the next attempt, n0 left out: not a later copy
    console.tick(final=True)
    assert out.getvalue() == "[n0:0] banner\n[n1:1] banner\n"


def test_a_flood_of_lines_one_rank_prints_does_not_make_a_later_copy_a_new_line() -> None:
    """Seen at 32 nodes x 2 ranks: every rank prints the same banner, then lines of its own by the thousand. A
    copy coming a second after the banner was shown, behind thousands of other ranks' own lines, is still noted
    (within LATE), whether the banner was shown folded or alone and a copy came before the flood."""
    folder = Folder()
    a, b, c, d, e = (("n0", 0), ("n0", 1), ("n1", 2), ("n2", 3), ("n3", 4))
    out = [*folder.add(a, ["banner", "alone"], 0.0), *folder.add(b, ["banner"], 0.0), *folder.due(HOLD)]
    out += folder.add(c, ["alone"], 2 * HOLD)  # a later copy of a line shown alone
    flood = [[f"R03 L{i:05d} a line only this rank prints" for i in range(j, j + 40)] for j in range(0, 3 * MAX_SHOWN, 40)]
    for lines in flood:  # 40 lines a write
        out += folder.add(d, lines, 3 * HOLD)
    out += folder.due(4 * HOLD)
    out += [*folder.add(e, ["banner", "alone"], 1.0), *folder.add(c, ["banner"], 1.0), *folder.flush(2.0)]
    assert out == [Line((a, b), ["banner"]), Line((a,), ["alone"]), *(Line((d,), lines) for lines in flood),
                   Note((c, e), "alone", (a,), 1 - HOLD), Note((e, c), "banner", (a, b), 1 - HOLD)]
