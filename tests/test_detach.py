"""`up --detach` on the simulated cluster: the run is supervised on rank 0's node as an attached run is here.

clusterrun returns once every node was told to start; the run's supervisor on node0 (clusterrun's own supervisor,
shipped there) fails it fast, records it, and gathers every rank's log; `status`, `logs`, `attach` and `down`
read that record and mirror it here. Nothing of a run is left anywhere afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from loadscale import scaled, until
from simcluster import SimCluster
from simjobs import run_clusterrun, start_clusterrun, write_inventory

pytestmark = pytest.mark.cluster

TICKER = """
import os, sys, time
for i in range(4):
    print("tick", i, "rank", os.environ["RANK"], flush=True)
    time.sleep(1)
sys.exit(0)
"""
SLEEPER = "import time\nprint('sleeping', flush=True)\ntime.sleep(300)\n"
# The case: a 4x2 job whose rank 5 (node2) exits 7 after 3 s while every other rank would run on.
RANK5_FAILS = """
import os, sys, time
rank = int(os.environ["RANK"])
print("hello", rank, flush=True)
time.sleep(3)
if rank == 5:
    print("rank 5 gives up", flush=True)
    sys.exit(7)
time.sleep(300)
"""
#: Ticks until the test says stop (a file appears; 600 s at most), so that the job outlives whatever the test
#: does meanwhile, however busy the machine is.
TICK_UNTIL = """
import os, sys, time
stop, deadline, i = sys.argv[1], time.monotonic() + 600, 0
while not os.path.exists(stop) and time.monotonic() < deadline:
    print("tick", i, "rank", os.environ["RANK"], flush=True)
    i += 1
    time.sleep(1)
print("done rank", os.environ["RANK"], flush=True)
"""
#: Seconds a detached run's nodes may take to stop after a failure here (every node stops within about a second
#: of the failure on an idle machine; this bound is for a loaded one).
STOP_BOUND = 30


def detach(inv: Path, cwd: Path, script: str, *flags: str, args: tuple[str, ...] = ()) -> str:
    done = run_clusterrun("up", "--detach", *flags, str(inv), script, *args, cwd=cwd)
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    assert f"clusterrun attach {run_id}" in done.stderr and f"clusterrun down {run_id}" in done.stderr
    return run_id


def status(run_id: str, cwd: Path) -> dict:
    done = run_clusterrun("status", run_id, "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def wait_running(cluster: SimCluster, run_id: str, nodes: set[str], timeout: float = 60) -> None:
    """Until every node of ``nodes`` runs the job's workers (torchrun's children), not only its agent."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs = cluster.job_processes(run_id)
        if all(len([c for _p, c in procs.get(n, []) if c.endswith(".py")]) >= 1 for n in nodes):
            return
        time.sleep(0.2)
    raise AssertionError(f"the job did not start on {sorted(nodes)}: {cluster.job_processes(run_id)}")


def test_a_failing_rank_stops_every_node_without_down_and_is_recorded_as_attached(sim_cluster: SimCluster,
                                                                                   tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=2)
    (tmp_path / "fail.py").write_text(RANK5_FAILS)
    attached = run_clusterrun("up", str(inv), "fail.py", cwd=tmp_path, timeout=180)
    assert attached.returncode == 7, attached.stderr[-3000:]
    attached_id = json.loads(run_clusterrun("runs", "--json", cwd=tmp_path).stdout)[0]["run_id"]
    run_id = detach(inv, tmp_path, "fail.py")
    # No `down`: the supervisor on node0 stops every node when rank 5 fails.
    assert sim_cluster.wait_no_processes(run_id, 60 + STOP_BOUND) == {}
    records = [status(attached_id, tmp_path), status(run_id, tmp_path)]
    for record in records:
        failure = record["first_failure"]
        assert (failure["node"], failure["rank"], failure["exit_code"]) == ("node2", 5, 7), record
        assert (record["state"], record["exit_code"]) == ("failed", 7)
        assert record["nodes"]["node2"]["ranks"]["5"]["state"] == "failed"
        assert {n["ranks"]["0"]["state"] for n in [record["nodes"]["node0"]]} == {"stopped"}
    assert records[1]["detached"] is True and records[1]["logs"]["complete"] is True
    # Every rank's log reached this machine, without copying by hand.
    logs = run_clusterrun("logs", run_id, cwd=tmp_path)
    assert logs.returncode == 0, logs.stderr
    for rank in range(8):
        node = f"node{rank // 2}"
        assert f"[{node}:{rank}] hello {rank}" in logs.stdout.splitlines()
        assert (tmp_path / "runs" / run_id / node / f"rank{rank}.log").read_text().startswith(f"hello {rank}\n")
    assert "[node2:5] rank 5 gives up" in logs.stdout


def test_detached_job_runs_on_and_logs_follow_it_to_its_end(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "tick.py").write_text(TICKER)
    run_id = detach(inv, tmp_path, "tick.py")
    assert set(sim_cluster.job_processes(run_id)) == {"node0", "node1"}  # clusterrun is gone, the job is not
    record = status(run_id, tmp_path)
    assert record["state"] in ("running", "succeeded") and record["detached"] is True
    done = run_clusterrun("logs", run_id, "-f", cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for rank, node in ((0, "node0"), (1, "node1")):
        assert [x for x in lines if x.startswith(f"[{node}:{rank}] tick")] == [
            f"[{node}:{rank}] tick {i} rank {rank}" for i in range(4)]
    record = status(run_id, tmp_path)
    assert record["state"] == "succeeded" and record["exit_code"] == 0
    assert "clusterrun run " + run_id + ": succeeded" in (tmp_path / "runs" / run_id / "report.html").read_text()
    # The nodes' series, kept by the supervisor, are here too.
    series = json.loads(run_clusterrun("metrics", run_id, "--json", cwd=tmp_path).stdout)["nodes"]
    assert set(series) == {"node0", "node1"} and all(len(n["samples"]) >= 2 for n in series.values())
    assert sim_cluster.wait_no_processes(run_id, STOP_BOUND) == {}
    # A `down` after the end changes nothing, and says so.
    after = run_clusterrun("down", run_id, cwd=tmp_path)
    assert after.returncode == 0 and "already ended (succeeded, exit code 0): nothing to stop" in after.stdout
    assert status(run_id, tmp_path)["state"] == "succeeded"


def test_down_stops_a_detached_job_and_its_logs_are_here(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "sleep.py").write_text(SLEEPER)
    run_id = detach(inv, tmp_path, "sleep.py")
    wait_running(sim_cluster, run_id, {"node0", "node1"})
    done = run_clusterrun("down", run_id, "--grace", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "node0: stopped" in done.stdout and "node1: stopped" in done.stdout
    assert f"run {run_id}: stopped, stopped by clusterrun down" in done.stdout
    assert sim_cluster.wait_no_processes(run_id, STOP_BOUND) == {}
    record = status(run_id, tmp_path)
    assert record["state"] == "stopped" and record["stopped_by"].startswith("clusterrun down")
    assert record["first_failure"] is None
    logs = run_clusterrun("logs", run_id, cwd=tmp_path)
    assert logs.returncode == 0, logs.stderr
    assert "[node0:0] sleeping" in logs.stdout and "[node1:1] sleeping" in logs.stdout


def test_two_downs_at_once_both_return_and_stop_the_run_once(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "sleep.py").write_text(SLEEPER)
    run_id = detach(inv, tmp_path, "sleep.py")
    wait_running(sim_cluster, run_id, {"node0", "node1"})
    downs = [start_clusterrun("down", run_id, "--grace", "1", cwd=tmp_path) for _ in range(2)]
    results = [p.communicate(timeout=scaled(120)) for p in downs]
    assert [p.returncode for p in downs] == [0, 0], results
    assert sim_cluster.wait_no_processes(run_id, STOP_BOUND) == {}
    record = status(run_id, tmp_path)
    assert record["state"] == "stopped" and record["interrupted_by"] == "SIGTERM"  # stopped, not killed
    assert [e for e in record["events"] if "kill" in str(e.get("text", ""))] == []


def test_down_during_the_stop_of_a_failed_run_keeps_its_first_failure(sim_cluster: SimCluster,
                                                                      tmp_path: Path) -> None:
    # Rank 1 fails at once; rank 0 takes its time to stop (it ignores SIGTERM), so the `down` comes while the
    # supervisor is still stopping the run.
    (tmp_path / "slow.py").write_text(
        "import os, signal, sys, time\n"
        "if os.environ['RANK'] == '1':\n    time.sleep(2)\n    sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('holding on', flush=True)\ntime.sleep(300)\n")
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    run_id = detach(inv, tmp_path, "slow.py", "--grace", "8")
    deadline = time.monotonic() + scaled(60)
    while time.monotonic() < deadline and (status(run_id, tmp_path).get("first_failure") is None):
        time.sleep(0.5)
    done = run_clusterrun("down", run_id, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    record = status(run_id, tmp_path)
    failure = record["first_failure"]
    assert (record["state"], failure["node"], failure["rank"], failure["exit_code"]) == ("failed", "node1", 1, 3)
    assert sim_cluster.wait_no_processes(run_id, STOP_BOUND) == {}


def _reader(proc: subprocess.Popen[str], lines: list[str]) -> threading.Thread:
    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_attach_shows_the_run_live_and_ctrl_c_leaves_it_running(sim_cluster: SimCluster, tmp_path: Path) -> None:
    (tmp_path / "tick.py").write_text(TICK_UNTIL)
    stop = tmp_path / "stop"  # the nodes see this machine's files
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    run_id = detach(inv, tmp_path, "tick.py", args=(str(stop),))
    first = start_clusterrun("attach", run_id, cwd=tmp_path)
    second = start_clusterrun("attach", run_id, cwd=tmp_path)
    seen: tuple[list[str], list[str]] = ([], [])
    readers = [_reader(first, seen[0]), _reader(second, seen[1])]

    def both_saw() -> bool:
        return all(any("[node0:0] tick 2 rank 0" in x for x in s) and any("[node1:1] tick 2 rank 1" in x for x in s)
                   for s in seen)

    assert until(both_saw, 90), seen  # both see the output
    first.send_signal(signal.SIGINT)
    # Each stdout has its reader thread: only wait here (communicate would read stdout too, and split the lines).
    assert first.wait(timeout=scaled(30)) == 0
    assert first.stderr is not None and f"detached from run {run_id}; it goes on" in first.stderr.read()
    assert set(sim_cluster.job_processes(run_id)) == {"node0", "node1"}  # still running
    stop.touch()  # the job ends now
    code = second.wait(timeout=scaled(120))
    for reader in readers:
        reader.join(timeout=scaled(5))
    assert second.stderr is not None
    assert code == 0, second.stderr.read()
    shown = "".join(seen[1])
    assert f"run {run_id}: succeeded" in shown, shown[-3000:]  # the summary at the end
    assert [x for x in shown.splitlines() if x.startswith("[node1:1] ")][-1] == "[node1:1] done rank 1"
    assert sim_cluster.wait_no_processes(run_id, STOP_BOUND) == {}


def test_a_killed_supervisor_stops_the_job_everywhere_and_the_record_says_so(sim_cluster: SimCluster,
                                                                           tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 3, nproc=1)
    (tmp_path / "sleep.py").write_text(SLEEPER)
    run_id = detach(inv, tmp_path, "sleep.py")
    wait_running(sim_cluster, run_id, {"node0", "node1", "node2"})
    host = json.loads((tmp_path / "runs" / run_id / "supervisor.json").read_text())
    assert host["node"] == "node0"
    pids = [pid for pid, cmd in sim_cluster.job_processes(run_id)["node0"] if pid == host["pid"]]
    assert pids, "the supervisor's pid is not a process of the run on node0"
    os.kill(host["pid"], signal.SIGKILL)
    # Each agent sees its connection to the supervisor end and stops its node's job.
    assert sim_cluster.wait_no_processes(run_id, STOP_BOUND) == {}
    record = status(run_id, tmp_path)
    assert record["state"] in ("failed", "stopped"), record
    assert any("supervisor on node0 ended before it recorded" in note for note in record["notes"]), record["notes"]
    for node in ("node0", "node1", "node2"):
        assert record["nodes"][node]["state"] is not None


def test_a_dead_data_nic_is_named_in_a_detached_run(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 3, nproc=1)
    (tmp_path / "sleep.py").write_text(SLEEPER)
    run_id = detach(inv, tmp_path, "sleep.py")
    wait_running(sim_cluster, run_id, {"node0", "node1", "node2"})
    sim_cluster.drop_nic("node2", "data")
    assert sim_cluster.wait_no_processes(run_id, 30 + STOP_BOUND) == {}
    record = status(run_id, tmp_path)
    failure = record["first_failure"]
    assert failure["node"] == "node2" and failure["detail"].startswith("its data path died: "), record
    assert [e["node"] for e in record["events"] if e["kind"] == "path-verdict"] == ["node2"]


def test_rank0s_node_cut_off_the_others_stop_by_themselves(sim_cluster: SimCluster, tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 3, nproc=1)
    (tmp_path / "sleep.py").write_text(SLEEPER)
    run_id = detach(inv, tmp_path, "sleep.py")
    wait_running(sim_cluster, run_id, {"node0", "node1", "node2"})
    sim_cluster.partition("node0")
    # node1 and node2 no longer hear the supervisor: their agents stop the job by themselves (heartbeat bound).
    deadline = time.monotonic() + scaled(15) + STOP_BOUND
    while time.monotonic() < deadline and set(sim_cluster.job_processes(run_id)) - {"node0"}:
        time.sleep(0.2)
    assert set(sim_cluster.job_processes(run_id)) <= {"node0"}
    # node0's supervisor lost both: it stops its own node's job and records the failure.
    assert sim_cluster.wait_no_processes(run_id, STOP_BOUND) == {}
    sim_cluster.heal("node0")
    record = status(run_id, tmp_path)
    assert record["state"] == "failed" and record["first_failure"]["node"] in ("node1", "node2"), record


def test_notifications_the_supervisor_cannot_deliver_are_sent_from_here(sim_cluster: SimCluster,
                                                                         tmp_path: Path) -> None:
    # The webhook listens on this machine's loopback: node0 (its own network namespace) has no route to it, as a
    # compute node often has none out; the next look from here sends what the supervisor could not.
    from test_notify import _Hook

    server = _Hook(0.0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
        (tmp_path / "tick.py").write_text(TICKER)
        run_id = detach(inv, tmp_path, "tick.py", "--notify", server.url)
        done = run_clusterrun("logs", run_id, "-f", cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "the 'end' document the run's supervisor could not deliver" in done.stderr, done.stderr
        assert sorted(d["event"] for d in server.received) == ["end", "start"]
        assert all(d["run_id"] == run_id for d in server.received)
        again = run_clusterrun("status", run_id, cwd=tmp_path)  # each document goes once
        assert "could not deliver" not in again.stderr and len(server.received) == 2
    finally:
        server.shutdown()
        server.server_close()


# Fails on its first attempt (rank 1 exits 3), succeeds on the second: CLUSTERRUN_RESTART_COUNT tells which.
FAILS_ONCE = """
import os, sys, time
attempt = int(os.environ["CLUSTERRUN_RESTART_COUNT"])
print("attempt", attempt, "rank", os.environ["RANK"], flush=True)
time.sleep(2)
if attempt == 0 and os.environ["RANK"] == "1":
    sys.exit(3)
time.sleep(1)
"""


def test_a_job_that_fails_once_is_restarted_by_the_supervisor_and_succeeds(sim_cluster: SimCluster,
                                                                          tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "once.py").write_text(FAILS_ONCE)
    run_id = detach(inv, tmp_path, "once.py", "--max-restarts", "2", "--restart-backoff", "0")
    done = run_clusterrun("logs", run_id, "-f", cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr
    record = status(run_id, tmp_path)
    assert (record["state"], record["exit_code"], record["restart_count"]) == ("succeeded", 0, 1), record
    assert [(a["attempt"], a["state"]) for a in record["attempts"]] == [(0, "failed"), (1, "succeeded")]
    first = record["attempts"][0]["first_failure"]
    assert (first["node"], first["rank"], first["exit_code"]) == ("node1", 1, 3)
    # Both attempts' logs are here: the first in attempt-0/, the last at the top.
    assert (tmp_path / "runs" / run_id / "attempt-0" / "node1" / "rank1.log").read_text() == "attempt 0 rank 1\n"
    logs = run_clusterrun("logs", run_id, cwd=tmp_path)
    assert logs.stdout.splitlines() == ["[node0:0] attempt 1 rank 0", "[node1:1] attempt 1 rank 1"], logs.stdout
    # Followed, both attempts show: the restart's new log in the old one's place is read from its start.
    for rank in (0, 1):
        assert f"[node{rank}:{rank}] attempt 1 rank {rank}" in done.stdout.splitlines(), done.stdout
    assert sim_cluster.wait_no_processes(run_id, STOP_BOUND) == {}


def test_down_during_a_restarts_backoff_stops_the_run_before_another_attempt(sim_cluster: SimCluster,
                                                                           tmp_path: Path) -> None:
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    (tmp_path / "once.py").write_text(FAILS_ONCE)
    run_id = detach(inv, tmp_path, "once.py", "--max-restarts", "2", "--restart-backoff", "60")
    deadline = time.monotonic() + scaled(90)
    while time.monotonic() < deadline:
        run_clusterrun("status", run_id, cwd=tmp_path)
        console = tmp_path / "runs" / run_id / "console.log"
        if console.is_file() and "restarting in 60s" in console.read_text():
            break
        time.sleep(0.5)
    done = run_clusterrun("down", run_id, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    record = status(run_id, tmp_path)
    assert record["state"] == "stopped" and record["stopped_by"].startswith("clusterrun down"), record
    assert record["first_failure"]["rank"] == 1  # the failure that came before is kept
    assert [a["attempt"] for a in record["attempts"]] == [0]  # no further attempt
    assert any("stopped before attempt 1 started" in note for note in record["notes"])
    assert sim_cluster.wait_no_processes(run_id, STOP_BOUND) == {}


def _cut_while_training(cluster: SimCluster, cwd: Path, run_id: str, victim: int,
                        idle: str | None = None) -> tuple[subprocess.CompletedProcess[str], dict]:
    """Once rank 0 reports step 20 (every rank reduces), node ``victim`` falls off both networks; `logs -f`
    follows the run to its end, which must be a success. ``idle``: a node that must run none of the job until
    then (a spare). Returns what `logs -f` printed and the record."""
    deadline = time.monotonic() + scaled(120)
    while time.monotonic() < deadline:
        if "step 20" in run_clusterrun("logs", run_id, "--node", "node0", cwd=cwd).stdout:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"no step 20 within 120s: {status(run_id, cwd)}")
    if idle is not None:
        assert not [c for _p, c in cluster.job_processes(run_id).get(idle, []) if c.endswith(".py")]
    cluster.partition(victim)
    try:
        done = run_clusterrun("logs", run_id, "-f", cwd=cwd, timeout=300)
    finally:
        cluster.heal(victim)
    assert done.returncode == 0, done.stderr[-3000:]
    record = status(run_id, cwd)
    assert record["state"] == "succeeded", record
    return done, record


def test_a_lost_worker_is_left_out_by_the_supervisor_with_min_nodes(sim_cluster: SimCluster, tmp_path: Path) -> None:
    # The supervisor on node0 recomposes the next attempt from its plan without node3 (launch/outcome.py's
    # recompose, planfile's on_nodes: what an attached `up` does), and the job goes on with 3 nodes.
    from test_restarts import JOB

    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=1)
    (tmp_path / "job.py").write_text(JOB)
    run_id = detach(inv, tmp_path, "job.py", "--max-restarts", "2", "--restart-backoff", "0.5", "--min-nodes", "3",
                    args=("partition",))
    done, record = _cut_while_training(sim_cluster, tmp_path, run_id, 3)
    first, second = record["attempts"]
    assert first["state"] == "failed" and second["nodes"] == ["node0", "node1", "node2"]
    assert "node3" in second["left_out"] and record["first_failure"]["node"] == "node3"
    shown = [line for line in done.stdout.splitlines() if "attempt 1 rank" in line]
    assert sorted(line.split("] ", 1)[1] for line in shown) == [f"attempt 1 rank {r} world 3 torchelastic 1"
                                                               for r in range(3)]
    console = (tmp_path / "runs" / run_id / "console.log").read_text()
    assert "node3 left out" in console
    plan = json.loads((tmp_path / "runs" / run_id / "plan.json").read_text())
    assert plan["nnodes"] == 3 and [n["node_rank"] for n in plan["nodes"]] == [0, 1, 2]
    # node3's agent stopped its job when the supervisor went silent (the partition): nothing anywhere now
    assert sim_cluster.wait_no_processes(run_id, STOP_BOUND) == {}


def test_a_spare_checked_at_the_start_takes_a_lost_workers_place(sim_cluster: SimCluster, tmp_path: Path) -> None:
    # node3 is a spare: checked with the nodes at the start, its agent waits on the supervisor (pinged), and takes
    # node2's place when node2 falls off the networks; the job goes on with 3 nodes again.
    from test_restarts import JOB

    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 4, nproc=1)
    inv.write_text(inv.read_text().replace("    host: node3\n", "    host: node3\n    spare: true\n"))
    (tmp_path / "job.py").write_text(JOB)
    run_id = detach(inv, tmp_path, "job.py", "--max-restarts", "2", "--restart-backoff", "0.5", args=("partition",))
    plan = json.loads((tmp_path / "runs" / run_id / "plan.json").read_text())
    assert [n["name"] for n in plan["nodes"]] == ["node0", "node1", "node2"] and plan["world_size"] == 3
    assert [n["name"] for n in plan["standby"]] == ["node3"] and plan["spares"] == ["node3"]
    done, record = _cut_while_training(sim_cluster, tmp_path, run_id, 2, idle="node3")
    second = record["attempts"][1]
    assert second["nodes"] == ["node0", "node1", "node3"] and second["replaced"] == {"node2": "node3"}, second
    shown = sorted(line.split("] ", 1)[1] for line in done.stdout.splitlines() if "attempt 1 rank" in line)
    assert shown == [f"attempt 1 rank {r} world 3 torchelastic 1" for r in range(3)]
    assert "spare node3 takes its place" in (tmp_path / "runs" / run_id / "console.log").read_text()
    assert sim_cluster.wait_no_processes(run_id, STOP_BOUND) == {}


def test_a_record_without_a_supervisor_has_its_logs_read_on_the_nodes(sim_cluster: SimCluster,
                                                                       tmp_path: Path) -> None:
    # A run detached by a clusterrun before supervised detach has no supervisor.json: `logs` reads each rank's
    # log on its node (ops/tail.py follow_nodes), `logs -f` follows them there until nothing of the run is left,
    # and then records its end here from what the nodes report.
    (tmp_path / "tick.py").write_text(TICK_UNTIL)
    stop = tmp_path / "stop"  # the nodes see this machine's files
    inv = write_inventory(sim_cluster, tmp_path / "cluster.yaml", 2, nproc=1)
    run_id = detach(inv, tmp_path, "tick.py", args=(str(stop),))
    (tmp_path / "runs" / run_id / "supervisor.json").unlink()
    assert status(run_id, tmp_path)["state"] == "detached"

    def ticked(twice: bool) -> bool:
        out = run_clusterrun("logs", run_id, cwd=tmp_path).stdout.splitlines()
        return all(f"[node{r}:{r}] tick {1 if twice else 0} rank {r}" in out for r in (0, 1))

    assert until(lambda: ticked(True), 90)  # without -f: what each node has so far, and back
    assert status(run_id, tmp_path)["state"] == "detached"  # a look without -f records no end
    follow = start_clusterrun("logs", run_id, "-f", cwd=tmp_path)
    seen: list[str] = []
    reader = _reader(follow, seen)
    assert until(lambda: all(any(x.startswith(f"[node{r}:{r}] tick 2 ") for x in seen) for r in (0, 1)), 90), seen
    stop.touch()  # the job ends now
    assert follow.wait(timeout=scaled(120)) == 0, follow.stderr.read() if follow.stderr else ""
    reader.join(timeout=scaled(5))
    for r in (0, 1):
        mine = [x.rstrip("\n") for x in seen if x.startswith(f"[node{r}:{r}] ")]
        ticks = [x for x in mine if " tick " in x]
        # Every line once, in order, from the first: nothing lost or repeated between two reads on the node.
        assert ticks == [f"[node{r}:{r}] tick {i} rank {r}" for i in range(len(ticks))], mine
        assert mine[-1] == f"[node{r}:{r}] done rank {r}", mine
    record = status(run_id, tmp_path)
    assert (record["state"], record["exit_code"]) == ("succeeded", 0), record
    for r in (0, 1):  # the whole logs are here now
        log = (tmp_path / "runs" / run_id / f"node{r}" / f"rank{r}.log").read_text()
        assert log.startswith(f"tick 0 rank {r}\n") and log.endswith(f"done rank {r}\n")
    assert sim_cluster.wait_no_processes(run_id, STOP_BOUND) == {}
