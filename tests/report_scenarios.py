"""What the page tests and bench/screenshots.py show: the jobs of a failing and of a restarted run, and
directories as big clusters leave them (a doctor round and a run of N nodes, written here as clusterrun writes
them, from its own records), to hold the pages' size and to look at."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

from clusterrun.doctor.model import PairMeasure
from clusterrun.remote import answers
from clusterrun.remote.decode import decode
from clusterrun.runs import NodeRecord, RankRecord, RunDir, RunRecord, RunState, read_record, series, write_record
from clusterrun.runs.judge import Failure, RankState
from clusterrun.runs.stragglers import StragglerJudge


def sample_of(sample: dict) -> answers.Sample:
    """A node's ``sample`` event as clusterrun reads it (decoded with its spec)."""
    return decode({**sample, "ev": "sample"}, "node")


FIXTURES = Path(__file__).resolve().parent / "fixtures" / "real"

#: A 4x2 run whose global rank 5 fails with exit code 3 after a few lines; the others wait to be stopped.
FAILING_JOB = """
import os, sys, time
rank = int(os.environ["RANK"])
for step in range(3):
    print(f"rank {rank} step {step}", flush=True)
    time.sleep(0.2)
if rank == 5:
    print("loading data/shard-5.bin", flush=True)
    print("FileNotFoundError: data/shard-5.bin", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(60)
"""

#: Rank 1 fails in attempt 0 (exit code 3) and the job succeeds in attempt 1.
RESTARTED_JOB = """
import os, sys, time
rank, attempt = int(os.environ["RANK"]), int(os.environ["CLUSTERRUN_RESTART_COUNT"])
print(f"attempt {attempt} rank {rank}", flush=True)
time.sleep(0.5)
if attempt == 0 and rank == 1:
    print("CUDA error: an illegal memory access was encountered", flush=True)
    sys.exit(3)
print(f"rank {rank} finished", flush=True)
"""


def _facts(gpus: int, model: str, nic: str, mbit: int) -> str:
    report = {"net": {"speeds": {nic: mbit, "eth0": 1000}, "rdma": [], "ip": "", "ip_error": "not recorded"},
              "gpus": gpus, "gpu_model": model}
    return f"$ python -c <nodefacts.py>\n# exit 0\nCLUSTERRUN-FACTS {json.dumps(report)}\n"


def big_doctor_round(directory: Path, n: int) -> Path:
    """A doctor round of ``n`` nodes: every pair pinged on two networks, three bandwidth rounds on the data
    network, node 3's data NIC slow, an 8-GPU topology per node (one node wired differently)."""
    names = [f"gpu{i:03d}" for i in range(n)]
    measures = []
    for net, data in (("10.1.0.0/16", True), ("192.168.0.0/16", False)):
        nic = "ens1" if data else "eth0"
        for (i, a), (j, b) in itertools.permutations(enumerate(names), 2):
            rtt = 0.05 + 0.001 * ((7 * i + 13 * j) % 50) + (2.0 if data and "gpu003" in (a, b) else 0.0)
            measures.append(PairMeasure("net.ping", net, a, b, rtt, True, nic, nic, data).to_dict())
    for k in range(1, 4):
        for i, a in enumerate(names):
            b = names[(i + k) % n]
            bps = 3e9 if "gpu003" in (a, b) else 9.4e9
            measures.append(PairMeasure("net.bandwidth", "10.1.0.0/16", a, b, bps, True, "ens1", "ens1",
                                        True).to_dict())
    findings = [{"check": "net.bandwidth", "verdict": "warn", "summary": "gpu003: ens1 sends at 3.00 Gbit/s at best",
                 "node": "gpu003", "subject": "ens1", "hint": "check its negotiated speed (`ethtool`)"}]
    report = {"verdict": "warn", "exit_code": 3, "nodes": names, "started": 1.8e9, "duration_s": 42.0,
              "counts": {"pass": 2, "warn": 1, "fail": 0, "skip": 0},
              "checks": [{"name": "node.ssh", "title": "SSH", "scope": "node", "verdict": "pass",
                          "findings": [{"check": "node.ssh", "verdict": "pass", "summary": f"{x}: ok", "node": x}
                                       for x in names]},
                         {"name": "net.bandwidth", "title": "TCP bandwidth", "scope": "pair", "verdict": "warn",
                          "findings": findings}],
              "recommended": "", "directory": str(directory), "measures": measures}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_text(json.dumps(report))
    topo = (FIXTURES / "topo" / "8gpu_h100_nv18.txt").read_text()
    other = (FIXTURES / "topo" / "8gpu_a100_nv12.txt").read_text()
    for i, name in enumerate(names):
        where = directory / "evidence" / name
        where.mkdir(parents=True, exist_ok=True)
        (where / "facts.txt").write_text(_facts(7 if i == 5 else 8, "NVIDIA H100 80GB HBM3", "ens1",
                                                25000 if i == 3 else 100000))
        (where / "nvidia_topo.txt").write_text(f"$ nvidia-smi topo -m\n# exit 0\n{other if i == 6 else topo}\n")
    return directory


def big_run(directory: Path, n: int, nproc: int, *, seconds: float = 60.0, failing: int = 13,
            fail_at: float | None = None) -> Path:
    """A failed run of ``n`` nodes x ``nproc`` ranks, written with clusterrun's own record: rank ``failing`` fails
    (at ``fail_at`` seconds, else with the others at ``seconds``), the others are stopped at ``seconds``."""
    directory.mkdir(parents=True, exist_ok=True)
    run = RunDir(directory)
    t0 = 1.8e9
    nodes_plan, nodes = [], {}
    for i in range(n):
        name = f"gpu{i:03d}"
        ranks = {r: RankRecord(r, r - i * nproc, RankState.failed if r == failing else RankState.stopped,
                               3 if r == failing else 143, None if r == failing else 15, t0 + 5,
                               t0 + (fail_at if r == failing and fail_at is not None else seconds))
                 for r in range(i * nproc, (i + 1) * nproc)}
        nodes[name] = NodeRecord(RankState.failed if i == failing // nproc else RankState.stopped, 1, None, t0,
                                 t0 + 2, t0 + seconds + 1, ranks)
        nodes_plan.append({"name": name, "host": f"10.0.{i // 256}.{i % 256}", "transport": "ssh", "node_rank": i,
                           "nproc_per_node": nproc, "ranks": [i * nproc, (i + 1) * nproc - 1],
                           "gpus": list(range(nproc)), "data_nic": "ens1", "data_address": f"10.1.0.{i % 256}",
                           "python": "python", "argv": ["torchrun", "train.py"], "cwd": "~", "run_dir": "/tmp/x",
                           "script": "train.py", "env": {"NCCL_SOCKET_IFNAME": "=ens1", "HF_TOKEN": "hf_secret"}})
        (directory / name).mkdir(exist_ok=True)
        for r in ranks:
            (directory / name / f"rank{r}.log").write_text(f"rank {r} step 1\n" * 20)
    (directory / "plan.json").write_text(json.dumps({"run_id": directory.name, "script": "train.py", "args": [],
                                                     "nnodes": n, "world_size": n * nproc, "master_addr": "10.1.0.0",
                                                     "master_port": 29500, "data_network": "10.1.0.0/16",
                                                     "nodes": nodes_plan}))
    write_record(run, RunRecord(directory.name, RunState.failed, t0, t0 + seconds + 2, 3,
                                first_failure=Failure(f"gpu{failing // nproc:03d}", failing, 3, None,
                                                      "exited while others ran"),
                                events=({"time": t0 + 30, "node": "gpu004", "kind": "straggler",
                                         "text": "gpu004 looks like a straggler"},),
                                nodes=nodes))
    return directory


def sampled_run(directory: Path, n: int, nproc: int, *, seconds: int = 120, gpus: bool = True,
                wrong_nic: str | None = None, straggler: str | None = None) -> Path:
    """:func:`big_run` of ``n`` x ``nproc`` whose nodes were sampled every second, kept with the series' own writer:
    the data NIC ens1 busy both ways, eth0 near idle, ``nproc`` GPUs (when ``gpus``) at about 95% and 300 W each,
    every rank at one CPU. Rank ``nproc + 1`` (on gpu001) fails at 70% of the run: its CPU stops, its GPU idles and
    the node's traffic stops. ``wrong_nic``: that node's ranks talk over eth0 instead, and the record names it.
    ``straggler``: from a fifth of the run on, that node's GPU 1 keeps working at 97% and 300 W while every other
    GPU waits at about 35% and 120 W (every rank's CPU stays busy, as NCCL's waiting keeps it), and the record has
    the straggler rule's own verdict on those samples."""
    fail_at = round(seconds * 0.7)
    run = big_run(directory, n, nproc, seconds=seconds, failing=nproc + 1, fail_at=fail_at)
    t0 = 1.8e9
    writer = series.SeriesWriter(run)
    kept: dict[int, list[tuple[str, dict]]] = {}
    for i in range(n):
        name = f"gpu{i:03d}"
        for k in range(1, seconds + 1):
            failed = i == 1 and k > fail_at
            busy = 0.0 if failed else 1.1e9 * (0.8 + 0.2 * math.sin(k / 7 + i))
            data, mgmt = ([2e3, 1e3], [busy * 0.55, busy * 0.55]) if name == wrong_nic else (
                [busy, busy * 0.98], [4e3 + 100 * (k % 5), 2e3])
            sample = {"ev": "sample", "t": t0 + k, "dt": 1.0, "nics": {"ens1": data, "eth0": mgmt, "lo": [9e5, 9e5],
                                                                        "docker0": [0, 0]},
                      "ranks": {str(r): {"pid": 4000 + r, "cpu": 0.97 + 0.02 * math.sin(k + r), "rss": 2e9}
                                for r in range(i * nproc, (i + 1) * nproc) if not (r == nproc + 1 and k > fail_at)},
                      "load": float(nproc)}
            if gpus:
                sample["gpus"] = {str(g): {"util": 0 if failed and g == 1 else 93 + (k + g) % 5, "mem": 40000,
                                           "power": 80.0 if failed and g == 1 else 300.0, "temp": 60,
                                           "energy": 1e6 + k * 300.0} for g in range(nproc)}
                for g, reading in sample["gpus"].items():
                    if straggler is not None and k > seconds // 5 and not failed:
                        reading.update(util=97, power=300.0) if (name, g) == (straggler, "1") else reading.update(
                            util=33 + (k + int(g)) % 5, power=120.0)
            writer.on_sample(name, sample_of(sample))
            kept.setdefault(k, []).append((name, sample))
    if straggler is not None:
        judge = StragglerJudge({f"gpu{i:03d}": {str(g): i * nproc + g for g in range(nproc)} for i in range(n)})
        verdict = next(v for k in sorted(kept) for name, sample in kept[k] for v in [
            *judge.on_load(name, {"cpu": {r: x["cpu"] for r, x in sample["ranks"].items()}, "time": sample["t"]}),
            *judge.on_sample(name, sample)])
        write_record(RunDir(run), read_record(RunDir(run)).with_event(verdict.record_event()))
    if wrong_nic is not None:
        record = read_record(RunDir(run))
        write_record(RunDir(run), record.with_event({
            "time": t0 + 12, "node": wrong_nic, "kind": "wrong-nic", "nic": "eth0", "data_nic": "ens1",
            "rate": 1.2e9, "variable": "GLOO_SOCKET_IFNAME",
            "text": f"{wrong_nic}: the ranks' traffic to the other nodes goes over eth0 at 1.2 GB/s (to 10.0.0.1), "
                    "not the data NIC ens1: GLOO_SOCKET_IFNAME=eth0 in the ranks' environment"}))
    return run
