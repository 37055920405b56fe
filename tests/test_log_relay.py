"""Rank output under a flood, over SSH on the simulated cluster: every line arrives once and whole.

Each rank prints numbered 100-byte lines as fast as it can, interleaved with a stderr warning storm, a
tqdm-style progress bar (carriage returns) and one multi-megabyte line written in pieces. The terminal and
runs/<id>/<node>/rank<R>.log must both hold every numbered line exactly once, the rank log must hold the
long line and the bar's bytes as written, and the run's record must say the logs are complete. When a node
agent dies mid-flood, the record must say exactly what was fetched from the node afterwards. Lines every rank
prints alike are shown once under their ranks (or named in a note when their copies came late), every rank log
holding them all; ``--no-fold`` shows each rank's copy.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from simcluster import SimCluster
from simjobs import (
    agent_of,
    assert_nothing_left,
    fault_mid_run,
    labelled,
    run_clusterrun,
    status,
    the_run,
    write_inventory,
)

pytestmark = pytest.mark.cluster

NODES, NPROC = 4, 2
LINES = 40_000  # per rank: 320,000 lines, 32 MB through the relay
LONG = 3 << 20  # one line of 3 MiB, written in 64 KiB pieces
BAR_STEPS = 500

FLOOD = f"""
import os, sys
rank = int(os.environ["RANK"])
out, err = sys.stdout, sys.stderr
half = {LINES} // 2
for i in range({LINES}):
    out.write(f"R{{rank:04d}} L{{i:09d}} ".ljust(99, "x") + "\\n")
    if i < half and i % 10 == 0:  # a warning storm, then a progress bar (tqdm writes "\\r" + bar)
        err.write(f"W{{rank:04d}} warning {{i // 10}} of a storm\\n")
    elif i >= half and (i - half) % (half // {BAR_STEPS}) == 0:
        err.write(f"\\r{{(i - half) // (half // {BAR_STEPS}):5d}}/{BAR_STEPS} |bar|")
        err.flush()
err.write("\\r done |bar|\\n")
out.flush()
piece = "y" * 65536
for _ in range({LONG} // 65536):
    out.write(piece)
    out.flush()
out.write("END\\n")
out.flush()
"""

NUMBERED = re.compile(r"R(\d{4}) L(\d{9}) x+$")
def _numbered(lines: list[str]) -> tuple[Counter[tuple[int, int]], list[str]]:
    """Counts of (rank, line number) among whole numbered lines, and the lines that look numbered but are not whole."""
    seen: Counter[tuple[int, int]] = Counter()
    broken = []
    for line in lines:
        body = line.split("] ", 1)[1] if line.startswith("[") else line
        if not body.startswith("R0"):
            continue
        m = NUMBERED.match(body)
        if m and len(body) == 99:
            seen[(int(m.group(1)), int(m.group(2)))] += 1
        else:
            broken.append(body[:120])
    return seen, broken


def _assert_every_line_once(seen: Counter[tuple[int, int]], broken: list[str], ranks: range, where: str) -> None:
    assert not broken, f"{where}: {len(broken)} broken lines, e.g. {broken[:3]}"
    missing = [(r, i) for r in ranks for i in range(LINES) if seen[(r, i)] == 0]
    twice = [k for k, n in seen.items() if n > 1]
    assert not missing and not twice, (f"{where}: {len(missing)} lines missing (e.g. {missing[:3]}), "
                                       f"{len(twice)} twice (e.g. {twice[:3]})")


def test_flood_every_line_once_and_whole_in_terminal_and_runs(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", NODES, nproc=NPROC)
    (tmp_path / "flood.py").write_text(FLOOD)
    done = run_clusterrun("up", str(inv), "flood.py", cwd=tmp_path, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    world = range(NODES * NPROC)

    terminal = done.stdout.splitlines()
    _assert_every_line_once(*_numbered(terminal), world, "terminal")
    # The long line is shown shortened, with a mark; the bar at a bounded rate (stdout is a pipe here). Both are
    # the same on every rank: shown once under the ranks whose copies came together, the others named in notes.
    shown = labelled(terminal)
    long_shown = [(ranks, text, note) for ranks, text, note in shown if text.startswith("yyyy")]
    assert sorted(rank for ranks, _, _ in long_shown for rank in ranks) == list(world)
    assert all(note or ("more characters" in text and len(text) < 20_000) for _, text, note in long_shown)
    for rank in world:
        bars = [text for ranks, text, _ in shown if rank in ranks and "|bar|" in text]
        assert 1 <= len(bars) <= 10, bars[:12]
        # The last state is always shown (or noted). A note on a late copy of an earlier state may come after it:
        # notes come once copies stop.
        assert any(bar.endswith(" done |bar|") for bar in bars), bars[-12:]

    run = the_run(tmp_path)
    for rank in world:
        data = (run / f"node{rank // NPROC}" / f"rank{rank}.log").read_bytes()
        # A line of the other stream may follow a progress bar's \r (as with `2>&1`), never split a line.
        lines = re.split(r"\r|\n", data.decode())
        _assert_every_line_once(*_numbered(lines), range(rank, rank + 1), f"rank{rank}.log")
        assert f"y{'y' * (LONG - 1)}END\n".encode() in data  # never split nor cut
        assert data.count(b"|bar|\r") == BAR_STEPS  # carriage returns kept raw
        assert sum(line.startswith(f"W{rank:04d} warning") for line in lines) == LINES // 20  # every 10th of half
    st = status(run)
    assert st["state"] == "succeeded"
    assert st["logs"]["complete"] is True and not st["logs"]["gaps"], st["logs"]
    totals = st["logs"]["received"]
    assert totals[f"node1/{NPROC}/stdout"]["lines"] == LINES + 1  # the numbered lines and the long one
    assert_nothing_left(sim_cluster, run.name)


KILLED_FLOOD = """
import os, signal, sys, time
rank = int(os.environ["RANK"])
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
print("ready", rank, flush=True)
i = 0
while not stopping and i < 2_000_000:
    sys.stdout.write(f"R{rank:04d} L{i:09d} ".ljust(99, "x") + "\\n")
    i += 1
    if i % 1000 == 0:
        time.sleep(0.01)  # a chatty loop, not a pure flood: the node is still alive to be asked
sys.stdout.write(f"rank {rank} wrote {i} lines\\n")
sys.stdout.flush()
"""


def _flood_with_fault(cluster: SimCluster, cwd: Path, fault: Callable[[Path], object]) -> tuple[Path, int, str]:
    """A 2-node flood; once both ranks are ready, ``fault(run directory)``. Returns the run, exit code, stderr."""
    write_inventory(cluster, cwd / "cluster.yaml", 2, nproc=1)
    (cwd / "flood.py").write_text(KILLED_FLOOD)
    return fault_mid_run(cwd, "flood.py", "ready", fault)


def test_killed_agent_mid_flood_the_record_says_what_was_fetched(sim_cluster: SimCluster, tmp_path: Path) -> None:
    run, rc, err = _flood_with_fault(sim_cluster, tmp_path,
                                     lambda run: os.kill(agent_of(run.name, "node1"), signal.SIGKILL))
    assert rc not in (0, None), err
    st = status(run)
    fetched = [n for n in st["notes"] if n.startswith("node1: its stream broke; fetched")]
    assert len(fetched) == 1, st["notes"]
    # What the worker wrote and what runs/ holds are the same bytes: every line once, in order.
    log = (run / "node1" / "rank1.log").read_bytes()
    node_file = next((Path.home() / ".clusterrun" / "runs" / run.name / "node1" / "torchrun").rglob("stdout.log"))
    assert log == node_file.read_bytes()
    total = int(re.search(rb"rank 1 wrote (\d+) lines", log).group(1))
    seen, broken = _numbered(log.decode().split("\n"))
    assert not broken and len(seen) == total and set(seen.values()) == {1}
    m = re.match(r"node1: its stream broke; fetched (\d+) line\(s\) \((\d+) bytes\)", fetched[0])
    assert m and 0 < int(m.group(1)) <= total + 1
    assert st["logs"]["complete"] is True, st["logs"]
    received = st["logs"]["received"]["node1/1/stdout"]
    assert received == {"bytes": len(log), "lines": total + 2}  # with "ready" and the last words
    assert_nothing_left(sim_cluster, run.name)


def test_unreachable_node_the_record_says_what_is_missing(sim_cluster: SimCluster, tmp_path: Path) -> None:
    """node1 is partitioned mid-flood and never answers again: status.json and the summary say its logs are
    incomplete and where they stay."""
    run, _rc, err = _flood_with_fault(sim_cluster, tmp_path, lambda _run: sim_cluster.partition("node1"))
    st = status(run)
    assert st["logs"]["complete"] is False and st["logs"]["unverified"] == ["node1"], st["logs"]
    summary = " ".join(err.split())  # the summary is wrapped to the terminal's width
    assert "its logs in runs/ are incomplete" in summary, err
    assert "node1 never said what its rank logs hold" in summary
    assert any("its rank logs stay on the node in" in n and "torchrun/" in n for n in st["notes"])
    assert json.dumps(st)  # written whole
    assert_nothing_left(sim_cluster, run.name, timeout=30)
    sim_cluster.heal("node1")


SAME = ["UserWarning: the same start-up warning from every rank", "NCCL version 2.21.5+cuda12.4 (the same banner)",
        "\tthe same indented line"]
SAME_PY = f"""
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()  # every rank prints at about the same time, as after a rendezvous
rank = dist.get_rank()
lines = {SAME!r}
print("\\n".join([*lines, f"rank {{rank}} own line"]), flush=True)
dist.barrier()
print(lines[0], flush=True)  # a second time: shown a second time
dist.destroy_process_group()
"""
PRINTED = [*SAME, SAME[0]]  # what every rank printed, besides its own line
def _printed(rank: int) -> list[str]:
    """What ``rank`` of SAME_PY printed, in order (torch's own warnings left out)."""
    return [*SAME, f"rank {rank} own line", SAME[0]]


def test_lines_every_rank_prints_are_shown_once_and_every_rank_log_holds_them(sim_cluster: SimCluster,
                                                                               tmp_path: Path) -> None:
    """8 ranks on 4 nodes print the same lines: each shows once, under its ranks (a rank whose copy came late is
    named in a note instead); every rank's own line shows under it; every rank log holds every line."""
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", NODES, nproc=NPROC)
    (tmp_path / "same.py").write_text(SAME_PY)
    done = run_clusterrun("up", str(inv), "same.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    world = range(NODES * NPROC)
    shown: Counter[str] = Counter()  # how many lines each text got
    named: Counter[tuple[str, int]] = Counter()  # how often each rank is named for each text, in lines and notes
    for ranks, text, note in labelled(done.stdout.splitlines()):
        shown[text] += not note
        for rank in ranks:
            named[(text, rank)] += 1
    for text in SAME:
        assert shown[text] == PRINTED.count(text), (text, done.stdout)
        assert all(named[(text, rank)] == PRINTED.count(text) for rank in world), (text, done.stdout)
    assert all(shown[f"rank {rank} own line"] == 1 for rank in world)
    run = the_run(tmp_path)
    for rank in world:
        log = (run / f"node{rank // NPROC}" / f"rank{rank}.log").read_text().splitlines()
        assert [line for line in log if line in SAME or "own line" in line] == _printed(rank)
    assert_nothing_left(sim_cluster, run.name)


def test_no_fold_shows_every_rank_copy(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=NPROC)
    (tmp_path / "same.py").write_text(SAME_PY)
    done = run_clusterrun("up", "--no-fold", str(inv), "same.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(2 * NPROC):
        prefix = f"[node{rank // NPROC}:{rank}]"
        texts = [line.split("] ", 1)[1] for line in done.stdout.splitlines() if line.startswith(prefix + " ")]
        assert [text for text in texts if text in SAME or "own line" in text] == _printed(rank)
    assert_nothing_left(sim_cluster, the_run(tmp_path).name)
