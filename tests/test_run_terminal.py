"""What the terminal shows of a run on the simulated cluster: no traceback when the run succeeded (torchrun's
exit-barrier noise stays in launcher.log), only the chosen ranks' nodes with --ranks, and a failure summary that
points at the cause, not at torchrun's report of being stopped."""

from __future__ import annotations

from pathlib import Path

import pytest
from simcluster import SimCluster
from simjobs import WORKER, assert_nothing_left, reports, run_clusterrun, status, the_run, write_inventory

pytestmark = pytest.mark.cluster

FIXTURES = Path(__file__).parent / "fixtures" / "real" / "torchrun"

# A worker of a successful run that, on rank 4 (the third node), writes torchrun's recorded exit-barrier noise
# into its torchrun's own stderr, as that torchrun does when the master's has gone first (racy in a real run).
NOISY_WORKER = WORKER + """
import os, sys
if int(os.environ["RANK"]) == 4:
    with open(f"/proc/{os.getppid()}/fd/2", "w") as fh:
        fh.write(open(sys.argv[1]).read())
"""

SLEEPER = """
import os, time
print("sleeping", os.environ["RANK"], flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("attempt", range(3))  # the exit barrier's noise is racy: about one 4-node run in four
def test_a_successful_4_node_run_shows_no_traceback(sim_cluster: SimCluster, tmp_path: Path, attempt: int) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4)
    (tmp_path / "worker.py").write_text(WORKER)
    done = run_clusterrun("up", str(inv), "worker.py", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert len(reports(done.stdout)) == 8
    terminal = done.stdout + done.stderr
    for noise in ("Traceback", "Error waiting on exit barrier", "frame #", "recvValueWithTimeout"):
        assert noise not in terminal, terminal[-4000:]
    run = the_run(tmp_path)
    assert status(run)["state"] == "succeeded"
    logs = {p.parent.name: p.read_text() for p in run.glob("*/launcher.log")}
    noisy = [name for name, text in logs.items() if "Error waiting on exit barrier" in text]
    said = [line for line in done.stderr.splitlines() if "exit-barrier" in line]
    assert len(said) == (1 if noisy else 0), done.stderr  # once, naming a node whose launcher.log keeps it
    if noisy:
        assert any(name in said[0] for name in noisy) and "launcher.log" in said[0]
    assert_nothing_left(sim_cluster, run.name)


def test_torchruns_recorded_exit_barrier_noise_is_kept_in_launcher_log_and_said_once(sim_cluster: SimCluster,
                                                                                     tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4)
    (tmp_path / "worker.py").write_text(NOISY_WORKER)
    recorded = FIXTURES / "exit_barrier_node2_of_4.txt"
    block = "".join(recorded.read_text().splitlines(keepends=True)[5:])  # the store's warning and the error
    (tmp_path / "noise.txt").write_text(block)
    done = run_clusterrun("up", str(inv), "worker.py", str(tmp_path / "noise.txt"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    terminal = done.stdout + done.stderr
    for noise in ("Traceback", "Error waiting on exit barrier", "frame #", "recvValueWithTimeout"):
        assert noise not in terminal, terminal[-4000:]
    node = sim_cluster.nodes[2].name
    run = the_run(tmp_path)
    assert block in (run / node / "launcher.log").read_text()
    # Said once, naming a node whose launcher.log keeps it: usually the third node, whose rank wrote the recorded
    # block; another node's torchrun may meet the real exit-barrier race first (about one 4-node run in four).
    noisy = [p.parent.name for p in run.glob("*/launcher.log") if "Error waiting on exit barrier" in p.read_text()]
    said = [line for line in done.stderr.splitlines() if "exit-barrier" in line]
    assert len(said) == 1 and "launcher.log" in said[0], done.stderr
    assert any(f"clusterrun: {name}:" in said[0] for name in noisy), (said, noisy)


def test_ranks_0_shows_no_other_nodes_torchrun_lines(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4)
    (tmp_path / "worker.py").write_text(WORKER)
    done = run_clusterrun("up", "--ranks", "0", str(inv), "worker.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    names = [n.name for n in sim_cluster.nodes[:4]]
    shown = {line.split("]", 1)[0] + "]" for line in done.stdout.splitlines() if line.startswith("[")}
    assert shown == {f"[{names[0]}]", f"[{names[0]}:0]"}, done.stdout[-3000:]
    assert [int(r["RANK"]) for r in reports(done.stdout)] == [0]
    run = the_run(tmp_path)
    for name in names[1:]:  # their banners are kept
        assert "OMP_NUM_THREADS" in (run / name / "launcher.log").read_text()


def test_a_stopped_nodes_failure_points_at_its_rank_logs_not_at_its_sigterm_report(sim_cluster: SimCluster,
                                                                                    tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2)
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    done = run_clusterrun("up", "--timeout", "8", str(inv), "sleeper.py", cwd=tmp_path)
    assert done.returncode == 124, done.stderr[-3000:]
    run = the_run(tmp_path)
    master = sim_cluster.nodes[0].name
    assert "SignalException" in (run / master / "launcher.log").read_text()  # torchrun's report, kept
    summary = " ".join(done.stderr.split("first failure:", 1)[1].split())
    assert "SignalException" not in summary and "death signal" not in summary
    assert f"{master}/launcher.log holds only torchrun's banner and its report of being stopped" in summary
    assert f"{master}/rank*.log" in summary
    assert_nothing_left(sim_cluster, run.name)
