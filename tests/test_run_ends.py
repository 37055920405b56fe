"""Every way a run ends leaves a status.json that says so: an id already taken is drawn again, Ctrl-C during
the checks before the start is recorded as interrupted."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from simcluster import SimCluster
from simjobs import connecting_to, start_clusterrun, the_run, wait_for_lines, wait_until, write_inventory

from clusterrun.inventory.yaml_source import load_inventory
from clusterrun.launch.up import _new_run_dir
from clusterrun.planning.plan import JobSpec, build_plan

ROOT = Path(__file__).resolve().parent.parent


def test_a_run_id_already_taken_is_drawn_again_and_the_plan_follows(tmp_path: Path) -> None:
    inv = load_inventory(ROOT / "inventories" / "localhost.yaml")
    job = JobSpec(script="train.py", run_id="20261124-100000-abcd", local_runs_dir=str(tmp_path))
    plan = build_plan(inv, job)
    (tmp_path / plan.run_id).mkdir()  # another run took it this very second
    run_dir, fresh = _new_run_dir(tmp_path, inv, plan)
    assert fresh.run_id != plan.run_id and run_dir.path == tmp_path / fresh.run_id and run_dir.path.is_dir()
    node = fresh.nodes[0]
    assert plan.run_id not in " ".join((*node.argv, node.run_dir, *node.env_dict().values()))
    assert node.env_dict()["CLUSTERRUN_RUN_ID"] == fresh.run_id


@pytest.mark.cluster
def test_ctrl_c_during_the_checks_is_recorded(sim_cluster: SimCluster, tmp_path: Path) -> None:
    """A node that does not answer keeps the checks waiting; Ctrl-C then ends clusterrun without waiting for that
    connect, and leaves `interrupted`, not `starting`."""
    # node1's connect must still be waiting when Ctrl-C comes. Its bound (300 s) is far past the wait for
    # clusterrun's end below: clusterrun must not wait for the connect to give up.
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1, connect_timeout=300)
    (tmp_path / "x.py").write_text("print('never')\n")
    sim_cluster.partition(1)  # its packets are dropped: the connection waits
    proc = start_clusterrun("up", str(inv), "x.py", cwd=tmp_path)
    try:
        # The checks have begun when clusterrun waits on node1's connection (status.json says `starting` then).
        # (`up` dials the nodes before it has loaded: the connection alone does not say the checks have begun)
        wait_until(lambda: (connecting_to(proc.pid, sim_cluster.nodes[1].mgmt_ip)
                            and any("starting" in p.read_text() for p in (tmp_path / "runs").glob("*/status.json")))
                   or proc.poll() is not None, 30, "clusterrun connecting to node1 in its checks")
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        sim_cluster.heal(1)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    (status,) = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/status.json")]
    assert status["state"] == "interrupted" and "before the job started" in status["detail"]


@pytest.mark.cluster
def test_a_frozen_orchestrator_finds_a_final_status_when_it_resumes(sim_cluster: SimCluster, tmp_path: Path) -> None:
    """clusterrun stopped (SIGSTOP: a laptop lid, a debugger) past the heartbeat timeout: the agents stop the job on
    their own; when clusterrun resumes it records the end (not `running` forever) and nothing is left."""
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "sleeper.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    proc = start_clusterrun("up", str(inv), "sleeper.py", cwd=tmp_path)
    try:
        wait_for_lines(proc, 2, "] up")
        run = the_run(tmp_path)
        proc.send_signal(signal.SIGSTOP)
        # Frozen until the agents, hearing nothing for their heartbeat timeout (15 s), have stopped the job.
        left = sim_cluster.wait_no_processes(run.name, 90)
        proc.send_signal(signal.SIGCONT)
        assert not left, f"the agents did not stop the job of a frozen clusterrun: {left}"
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()
    assert proc.returncode != 0 and "Traceback" not in err
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed", status["state"]
    reasons = " ".join(str(n.get("reason")) for n in status["nodes"].values())
    assert "no word from clusterrun" in reasons or "watchdog" in reasons, reasons
    assert not sim_cluster.wait_no_processes(run.name, 20)


def test_after_an_id_collision_up_reports_and_pages_the_run_it_really_made(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch,
                                                                           capfd: pytest.CaptureFixture[str]) -> None:
    # The CLI drew an id another run took the same second: `up` makes the run under a new id, and its page, its
    # summary and its record are that run's (nothing is written into the other run's directory).
    from clusterrun import runs
    from clusterrun.cli.main import main

    taken = "20261124-100000-abcd"
    runs_dir = tmp_path / "runs"
    (runs_dir / taken).mkdir(parents=True)
    monkeypatch.setattr(runs, "new_run_id", lambda now=None: taken)  # what the command line draws
    (tmp_path / "hello.py").write_text("print('hello', flush=True)\n")
    monkeypatch.chdir(tmp_path)
    assert main(["up", "--runs-dir", str(runs_dir), str(ROOT / "inventories" / "localhost.yaml"), "hello.py"]) == 0
    made = [p for p in runs_dir.iterdir() if p.name != taken]
    assert len(made) == 1 and (made[0] / "report.html").is_file() and (made[0] / "status.json").is_file()
    assert list((runs_dir / taken).iterdir()) == []
    assert made[0].name in capfd.readouterr().err
