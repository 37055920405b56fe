"""`clusterrun up` on the local inventory, for real: torchrun, two CPU ranks over gloo, the run directory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loadscale import scaled
from procs import free_port, marked_processes, wait_no_processes

pytest.importorskip("torch", reason="local runs need the torch extra")

ROOT = Path(__file__).resolve().parent.parent
LOCAL = str(ROOT / "inventories" / "localhost.yaml")
TRAIN = str(ROOT / "examples" / "train_ddp.py")
RUN_TIMEOUT = 120

FAIL_RANK_1 = """
import os, sys, time
rank = int(os.environ["RANK"])
print(f"hello from {rank}", flush=True)
if rank == 1:
    time.sleep(0.5)
    print("rank 1 is about to fail", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(100)
print("rank 0 should never get here", flush=True)
"""

SLEEPER = """
import os, time
print("rank", os.environ["RANK"], "sleeping", flush=True)
time.sleep(100)
"""


def clusterrun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # A free master port: another job on this machine may hold the default 29500.
    args = (*args[:1], "--master-port", str(free_port()), *args[1:])
    return subprocess.run([sys.executable, "-m", "clusterrun", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=scaled(RUN_TIMEOUT), stdin=subprocess.DEVNULL, check=False)


def only_run(runs: Path) -> Path:
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    return run


def test_train_ddp_succeeds_and_fills_the_run_directory(tmp_path: Path) -> None:
    done = clusterrun("up", LOCAL, TRAIN, "--epochs", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "[localhost:0] epoch 1 loss " in done.stdout
    assert "[localhost:0] final test loss" in done.stdout
    assert "[localhost:1] rank 1/2 local_rank 1" in done.stdout
    run = only_run(tmp_path / "runs")
    assert f"run {run.name} succeeded" in done.stderr
    plan = json.loads((run / "plan.json").read_text())
    assert plan["world_size"] == 2 and plan["nodes"][0]["argv"][-2:] == ["--epochs", "2"]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "succeeded" and status["exit_code"] == 0
    ranks = status["nodes"]["localhost"]["ranks"]
    for rank in ("0", "1"):
        assert ranks[rank]["exit_code"] == 0 and ranks[rank]["state"] == "succeeded"
        assert ranks[rank]["ended"] >= ranks[rank]["started"] > 0
    assert "epoch 2 loss" in (run / "localhost" / "rank0.log").read_text()
    assert "rank 1/2" in (run / "localhost" / "rank1.log").read_text()
    assert not marked_processes(run.name)


def test_a_failing_rank_stops_the_others_and_is_named(tmp_path: Path) -> None:
    (tmp_path / "fail.py").write_text(FAIL_RANK_1)
    started = time.monotonic()
    done = clusterrun("up", LOCAL, "fail.py", cwd=tmp_path)
    took = time.monotonic() - started
    assert done.returncode == 3, done.stderr
    assert took < 60, "rank 0 sleeps 100 s: it must have been stopped, not waited for"
    assert "rank 0 should never get here" not in done.stdout
    assert "first failure: localhost rank 1: exit code 3" in done.stderr
    assert "rank 1 is about to fail" in done.stderr.split("first failure:")[1]  # the log tail in the summary
    run = only_run(tmp_path / "runs")
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed" and status["exit_code"] == 3
    assert status["first_failure"] == {"node": "localhost", "rank": 1, "exit_code": 3, "signal": None,
                                       "detail": "exited while others ran"}
    assert status["nodes"]["localhost"]["ranks"]["0"]["state"] == "stopped"
    assert not wait_no_processes(run.name)


def test_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    proc = subprocess.Popen([sys.executable, "-m", "clusterrun", "up", "--master-port", str(free_port()), LOCAL,
                             "sleeper.py"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        seen: set[str] = set()
        deadline = time.monotonic() + RUN_TIMEOUT
        assert proc.stdout is not None
        while len(seen) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if "sleeping" in line:
                seen.add(line.split("]")[0])
        assert seen == {"[localhost:0", "[localhost:1"}
        run = only_run(tmp_path / "runs")
        assert len(marked_processes(run.name)) >= 3  # torchrun and two workers, at least
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "SIGINT: stopping all nodes" in err and f"run {run.name} interrupted" in err
    assert json.loads((run / "status.json").read_text())["state"] == "interrupted"
    assert not wait_no_processes(run.name), "processes left behind after Ctrl-C"


def test_quiet_and_rank_filter_still_log_everything(tmp_path: Path) -> None:
    (tmp_path / "hello.py").write_text('import os; print("hello from", os.environ["RANK"], flush=True)\n')
    done = clusterrun("up", "--ranks", "1", LOCAL, "hello.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "[localhost:1] hello from 1" in done.stdout and "hello from 0" not in done.stdout
    run = only_run(tmp_path / "runs")
    assert "hello from 0" in (run / "localhost" / "rank0.log").read_text()
    assert os.path.getsize(run / "localhost" / "rank1.log") > 0


HANG = """
import time
print("importing torch", flush=True)
import torch, torch.distributed as dist

def stuck_here():
    time.sleep(300)

print("joining", flush=True)
dist.init_process_group("gloo")
t = torch.ones(8)
dist.all_reduce(t)
print("warmed up", dist.get_rank(), flush=True)
if dist.get_rank() == 1:
    stuck_here()
dist.all_reduce(t)
"""


def test_hang_timeout_takes_every_ranks_stack_and_waits_with_a_reminder(tmp_path: Path) -> None:
    """--on-hang wait: the stacks and the digest, then a reminder; the job is left to its --timeout. With py-spy
    on this machine's PATH the stacks are py-spy's, otherwise the faulthandler hook's."""
    (tmp_path / "hang.py").write_text(HANG)
    # the job's time limit leaves room for the stacks, the digest and the reminder however busy the machine is
    done = clusterrun("up", "--hang-timeout", "8", "--timeout", f"{scaled(30):.0f}", LOCAL, "hang.py", cwd=tmp_path)
    assert done.returncode == 124, done.stderr  # stopped by its time limit, not by the hang
    assert "rank 0 in all_reduce (hang.py:16)" in done.stderr and "rank 1 in stuck_here (hang.py:7)" in done.stderr
    assert "(--on-hang wait)" in done.stderr  # the reminder after another 8 s of silence
    assert ("default_pg: rank 0 waits in all_reduce #2; rank 1 never called it (last collective: all_reduce #1)"
            in done.stderr)  # torch's flight recorder, asked of every rank through clusterrun's hook
    run = only_run(tmp_path / "runs")
    tool = "py-spy" if shutil.which("py-spy") else "faulthandler"
    for rank in (0, 1):
        assert (run / "localhost" / f"stack-rank{rank}.txt").read_text().startswith(
            f"# rank {rank} on localhost, taken with {tool}")
        assert json.loads((run / "localhost" / f"flight-rank{rank}.json").read_bytes())["entries"]
    assert not marked_processes(run.name)


WATCHDOG_DUMP = """
import os, sys, time
rank = os.environ["RANK"]
prefix = os.environ["TORCH_FR_DUMP_TEMP_FILE"]
# What torch's watchdog does when a collective times out with the flight recorder on: its dump, at the prefix
# it was given, with the rank appended.
with open(prefix + rank, "wb") as fh:
    fh.write(b"dump of rank " + rank.encode())
if rank == "1":  # every rank's watchdog has dumped before the first one fails (rank 0 may start later)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if os.path.exists(prefix + "0") and open(prefix + "0", "rb").read() == b"dump of rank 0":
            break
        time.sleep(0.05)
sys.exit(1 if rank == "1" else 0)
"""


def test_dumps_torchs_watchdog_writes_are_gathered_into_the_run(tmp_path: Path) -> None:
    (tmp_path / "dump.py").write_text(WATCHDOG_DUMP)
    done = clusterrun("up", "--hang-timeout", "60", LOCAL, "dump.py", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    run = only_run(tmp_path / "runs")
    for rank in (0, 1):
        assert (run / "flight" / f"nccl-rank{rank}").read_bytes() == f"dump of rank {rank}".encode()
    assert f"read them with `torchfrtrace {run.relative_to(tmp_path)}/flight -p nccl-rank`" in done.stderr
    status = json.loads((run / "status.json").read_text())
    assert [e["kind"] for e in status["events"]] == ["flight-dump"]


def test_the_script_gets_its_arguments_exactly_as_typed(tmp_path: Path) -> None:
    """As with torchrun: after SCRIPT nothing is clusterrun's (its -q, --timeout, -m), and ~/ is not expanded."""
    (tmp_path / "args.py").write_text("import json, sys\nprint('ARGS', json.dumps(sys.argv[1:]), flush=True)\n")
    args = ["--lr", "0.1", "--timeout", "30", "-q", "--json", "-m", "foo", "~/data", "--", "--dry-run"]
    done = clusterrun("up", LOCAL, "args.py", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run = only_run(tmp_path / "runs")
    for rank in (0, 1):
        line = (run / "localhost" / f"rank{rank}.log").read_text().strip()
        assert json.loads(line.removeprefix("ARGS ")) == args
    assert "note: --dry-run after SCRIPT goes to the script" in done.stderr


def test_a_single_node_paddle_style_command_runs_on_this_machine(tmp_path: Path) -> None:
    """`up --devices=0,1 train.py --lr=0.01`, with no inventory and no --ips/--hostfile/--slurm: this machine, as
    torchrun and paddle.distributed.launch do; --lr=0.01 is the script's (it used to be refused as clusterrun's)."""
    (tmp_path / "train.py").write_text("import json, os, sys\n"
                                       "print('ARGS', json.dumps([sys.argv[1:], os.environ['CUDA_VISIBLE_DEVICES']]), "
                                       "flush=True)\n")
    done = clusterrun("up", "--devices=0,1", "train.py", "--lr=0.01", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run = only_run(tmp_path / "runs")
    for rank in (0, 1):  # one process per listed device
        line = (run / "localhost" / f"rank{rank}.log").read_text().strip()
        assert json.loads(line.removeprefix("ARGS ")) == [["--lr=0.01"], "0,1"]
    plan = json.loads((run / "plan.json").read_text())
    assert [n["name"] for n in plan["nodes"]] == ["localhost"] and plan["world_size"] == 2
    assert not marked_processes(run.name)


def test_secrets_are_neither_stored_nor_printed(tmp_path: Path) -> None:
    """-e HF_TOKEN reaches the ranks; plan.json, inventory.json and `plan` show it masked; only the user can
    read the run directory."""
    secret = "hf_Secret0123456789"
    (tmp_path / "tok.py").write_text("import os\nprint('len', len(os.environ['HF_TOKEN']), flush=True)\n")
    done = clusterrun("up", "-e", f"HF_TOKEN={secret}", LOCAL, "tok.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run = only_run(tmp_path / "runs")
    assert f"len {len(secret)}" in (run / "localhost" / "rank0.log").read_text()
    for path in run.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert json.loads((run / "plan.json").read_text())["nodes"][0]["env"]["HF_TOKEN"] == "*** (19 characters)"
    assert (run.stat().st_mode & 0o777, (run / "plan.json").stat().st_mode & 0o777) == (0o700, 0o600)
    for args in (("plan",), ("plan", "--json"), ("up", "--dry-run")):
        shown = subprocess.run([sys.executable, "-m", "clusterrun", *args, "-e", f"HF_TOKEN={secret}", LOCAL,
                                "tok.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
        assert shown.returncode == 0 and "HF_TOKEN" in shown.stdout and secret not in shown.stdout + shown.stderr


CHATTY = """
import os, sys, time
rank = int(os.environ["RANK"])
for i in range(3000):
    print(f"rank {rank} line {i}", flush=True)
    if i % 500 == 0:
        time.sleep(0.2)
"""


def test_closed_stdout_stops_the_screen_not_the_job(tmp_path: Path) -> None:
    """`clusterrun up ... | head -2`: the reader goes away; the job runs to its end and its logs are whole."""
    (tmp_path / "chatty.py").write_text(CHATTY)
    proc = subprocess.Popen([sys.executable, "-m", "clusterrun", "up", "--master-port", str(free_port()), LOCAL,
                             "chatty.py"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        head = [proc.stdout.readline() for _ in range(2)]
        proc.stdout.close()  # as `head -2` does
        _out, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert all(head) and proc.returncode == 0, err.decode()[-2000:]
    assert b"stdout was closed: rank output is no longer shown" in err
    assert b"Traceback" not in err and b"BrokenPipeError" not in err
    run = only_run(tmp_path / "runs")
    for rank in (0, 1):
        assert (run / "localhost" / f"rank{rank}.log").read_text().count("\n") == 3000
    assert json.loads((run / "status.json").read_text())["logs"]["complete"] is True
