"""Folding at scale: 32 simulated nodes x 2 ranks, every rank printing the same 200 lines, a line of its own and a
flood of distinct lines, over SSH. The terminal shows each identical line once under the ranks whose copies came
together, naming the others in a note (docs/up.md "Identical lines folded"), every other line once under its own
rank, each rank's lines in the order it printed them; every rank log holds all of that rank's lines, in order.

The job imports no torch (torchrun itself does). Its ranks meet at a gate of files before printing (the nodes
share this machine's filesystem), as ranks do after a rendezvous, so every copy comes within seconds, well inside
the 30 s in which a copy is a later copy and not a new line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from loadscale import scaled
from simcluster import SimCluster
from simjobs import assert_nothing_left, run_clusterrun, shown_lines, status, the_run, write_inventory

from clusterrun.inventory.hostlist import expand_hostlist

pytestmark = pytest.mark.cluster

NODES, NPROC = 32, 2
WORLD = range(NODES * NPROC)
FLOOD = 1000  # distinct lines per rank: 64,000 through the relay, 8 times what folding remembers (MAX_SHOWN x 2)
SAME = [*(f"UserWarning: the same start-up warning {i} from every rank" for i in range(198)),
        "\tthe same indented line", "NCCL version 2.21.5+cuda12.4 (the same banner)"]
LAST = "the same last line, after the flood"

JOB = """
import os, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
gate, wait, flood, same, last = {gate!r}, {wait!r}, {flood!r}, {same!r}, {last!r}
open(os.path.join(gate, str(rank)), "w").close()
deadline = time.monotonic() + wait
while len(os.listdir(gate)) < world:  # every rank prints at about the same time, as after a rendezvous
    if time.monotonic() > deadline:
        sys.exit(f"rank {{rank}}: {{len(os.listdir(gate))}} of {{world}} ranks came to the gate within {{wait:g}} s")
    time.sleep(0.05)
out = sys.stdout
out.write("".join(line + "\\n" for line in [*same, f"rank {{rank}} own line"]))
out.flush()
for start in range(0, flood, 40):  # 40 lines a write, as a chatty loop with buffered output
    out.write("".join(f"R{{rank:02d}} L{{i:05d}} a line only this rank prints\\n" for i in range(start, start + 40)))
    out.flush()
out.write(last + "\\n")
out.flush()
"""


def _printed(rank: int) -> list[str]:
    """What ``rank`` printed, in order."""
    return [*SAME, f"rank {rank} own line", *(f"R{rank:02d} L{i:05d} a line only this rank prints"
                                              for i in range(FLOOD)), LAST]


@pytest.fixture(scope="module")
def cluster(cluster_requirements: None) -> Iterator[SimCluster]:
    with SimCluster(NODES) as sim:
        yield sim


def test_32_nodes_same_lines_shown_once_and_every_rank_log_holds_all(cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(cluster, tmp_path / "cluster.yaml", NODES, nproc=NPROC)
    gate = tmp_path / "gate"
    gate.mkdir()
    (tmp_path / "same.py").write_text(JOB.format(gate=str(gate), wait=scaled(120), flood=FLOOD, same=SAME, last=LAST))
    done = run_clusterrun("up", str(inv), "same.py", cwd=tmp_path, timeout=scaled(300))
    assert done.returncode == 0, done.stderr[-3000:]
    shown = shown_lines(done.stdout.splitlines())

    # Each prefix names the nodes of its ranks (one rank: [node<R//2>:R]); a long list may end with a count.
    for line in shown:
        nodes = {f"node{rank // NPROC}" for rank in line.ranks}
        if line.count == len(line.ranks) and not line.where.endswith(" nodes)"):
            assert set(expand_hostlist(line.where)) == nodes, line
    # Each identical line is shown once; every rank is named for it once: under that line, or in a note.
    for text in [*SAME, LAST]:
        lines = [line for line in shown if line.text == text]
        assert sum(not line.note for line in lines) == 1, lines[:5]
        listed = [rank for line in lines for rank in line.ranks]
        assert sum(line.count for line in lines) == len(WORLD) and len(listed) == len(set(listed)), lines[:5]
    assert max(line.count for line in shown if line.text in SAME and not line.note) > 1, "no line folded"
    # Every other line once, under its own rank; each rank's lines in the order it printed them. A rank's copy of
    # an identical line is out of both sides where a shortened prefix may hold it.
    hidden = {line.text for line in shown if line.count > len(line.ranks)}
    noted = {(line.text, rank) for line in shown if line.note for rank in line.ranks}
    known = {(line.text, rank) for line in shown for rank in line.ranks}
    for rank in WORLD:
        got = [line.text for line in shown if not line.note and rank in line.ranks]
        expected = [text for text in _printed(rank) if (text, rank) not in noted
                    and (text not in hidden or (text, rank) in known)]
        assert got == expected, (rank, len(got), len(expected),
                                 next(((g, e) for g, e in zip(got, expected, strict=False) if g != e), None))
    assert sum(not line.note for line in shown) == len(SAME) + 1 + len(WORLD) * (FLOOD + 1)

    run = the_run(tmp_path)
    for rank in WORLD:
        log = (run / f"node{rank // NPROC}" / f"rank{rank}.log").read_text().splitlines()
        assert log == _printed(rank), (rank, len(log))
    st = status(run)
    assert st["state"] == "succeeded" and st["logs"]["complete"] is True, st["logs"]
    assert_nothing_left(cluster, run.name)
