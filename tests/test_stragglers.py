"""The straggler rule (clusterrun/runs/stragglers.py) on constructed readings: a CPU job's busy rank, a GPU job's one
working GPU (by utilisation, and by power where NCCL's waiting kernel keeps every GPU at 100 %), GPUs evenly busy
(no verdict), GPU readings missing (the CPU rule alone); and the supervisor's side (launch/watch.py): one line,
one event and one --notify document per node."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from clusterrun.launch.watch import StragglerWatch
from clusterrun.remote.decode import decode
from clusterrun.runs.stragglers import Straggler, StragglerJudge

T0 = 1.8e9


def _load(judge: StragglerJudge, node: str, shares: dict[int, float], at: float) -> list[Straggler]:
    return judge.on_load(node, {"ev": "load", "cpu": {str(r): s for r, s in shares.items()}, "time": at})


def _sample(judge: StragglerJudge, node: str, at: float, gpus: dict[int, tuple[float, float]] | None,
            cpu: dict[int, float] | None = None) -> list[Straggler]:
    sample: dict[str, Any] = {"ev": "sample", "t": at, "dt": 1.0,
                              "ranks": {str(r): {"pid": 100 + r, "cpu": c, "rss": 1e9} for r, c in (cpu or {}).items()}}
    if gpus is not None:
        sample["gpus"] = {str(g): {"util": u, "mem": 30000, "power": p, "temp": 60} for g, (u, p) in gpus.items()}
    else:
        sample["gaps"] = {"gpus": "nvidia-smi silent for 5s (hung: a stuck driver or GPU?); killed, started again"}
    return judge.on_sample(node, sample)


def _gpu_job() -> StragglerJudge:
    """2 nodes x 4 GPUs (physical 0-3 each), ranks 0-3 on n0 and 4-7 on n1, local rank i on GPU i."""
    return StragglerJudge({"n0": {str(g): g for g in range(4)}, "n1": {str(g): 4 + g for g in range(4)}})


def test_a_cpu_job_names_the_busy_rank_once_with_its_share_against_the_others() -> None:
    judge = StragglerJudge()
    found: list[Straggler] = []
    for k in range(3):
        found += _load(judge, "n0", {0: 0.10, 1: 0.12}, T0 + 3 * k)
        found += _load(judge, "n1", {2: 0.95, 3: 0.80}, T0 + 3 * k)
        found += _load(judge, "n2", {4: 0.15, 5: 0.11}, T0 + 3 * k)
    found += _load(judge, "n1", {2: 0.99, 3: 0.99}, T0 + 9)
    assert len(found) == 1, found
    v = found[0]
    assert (v.node, v.rank, v.by, v.also, v.gpu) == ("n1", 2, "cpu", (3,), None)
    assert v.cpu == 0.95 and v.cpu_others == 0.12  # the median of the other ranks' shares
    assert v.since == T0 and v.time == T0 + 6
    assert v.message().startswith("n1 rank 2 looks like a straggler: it kept 95% of a CPU busy while the other ranks "
                                  "used 12% (their median), waiting for it; rank 3 of n1 too")
    assert "GPU" not in v.message()
    event = v.record_event()
    assert (event["kind"], event["node"], event["rank"], event["by"], event["cpu"]) == ("straggler", "n1", 2, "cpu",
                                                                                        0.95)


def test_evenly_busy_ranks_and_idle_ranks_are_no_stragglers() -> None:
    judge = StragglerJudge(windows=2)
    found: list[Straggler] = []
    for k in range(4):
        for node, rank in (("n0", 0), ("n1", 1), ("n2", 2)):
            found += _load(judge, node, {rank: 0.9 - 0.05 * rank}, T0 + k)
        found += _load(judge, "n3", {3: 0.3}, T0 + k)  # twice as busy as nobody: below half a CPU
    assert found == []
    idle = StragglerJudge(windows=2)
    assert [v for k in range(4) for n in ("a", "b") for v in _load(idle, n, {ord(n): 0.04 if n == "a" else 0.09},
                                                                  T0 + k)] == []


def test_a_gpu_job_names_the_rank_whose_gpu_keeps_working_while_the_others_wait() -> None:
    judge = _gpu_job()
    found: list[Straggler] = []
    for k in range(1, 30):
        for node in ("n0", "n1"):
            gpus = {g: (97.0, 310.0) if (node, g) == ("n1", 2) else (20.0 + g, 90.0) for g in range(4)}
            found += _sample(judge, node, T0 + k, gpus, cpu={r: 1.0 for r in range(8)})  # NCCL: every CPU busy
            found += _load(judge, node, {r: 1.0 for r in range(4 * (node == "n1"), 4 + 4 * (node == "n1"))}, T0 + k)
        if k < 10:
            assert found == [], k  # not before 10 s of samples
    assert len(found) == 1, found
    v = found[0]
    assert (v.node, v.rank, v.by, v.gpu, v.also) == ("n1", 6, "gpu", "2", ())
    assert v.util == 97.0 and v.util_others == 21.0 and v.power == 310.0 and v.power_others == 90.0
    assert v.cpu == 1.0 and v.cpu_others == 1.0
    assert v.time == T0 + 10 and v.since == T0
    assert v.message() == ("n1 rank 6 looks like a straggler: its GPU 2 kept working at 97% and 310 W while the "
                           "other GPUs ran at 21% and 90 W (their median), waiting for it; its CPU: 100% (the other "
                           "ranks' median 100%) (a slower, throttled or shared GPU, or more work on its rank); "
                           "clusterrun does nothing about it")


def test_where_nccls_waiting_kernel_shows_every_gpu_busy_power_names_the_working_one() -> None:
    judge = _gpu_job()
    found = [v for k in range(1, 15) for node in ("n0", "n1") for v in _sample(
        judge, node, T0 + k, {g: (100.0, 650.0 if (node, g) == ("n0", 1) else 140.0 + g) for g in range(4)})]
    assert [(v.node, v.rank, v.by, v.gpu) for v in found] == [("n0", 1, "gpu", "1")]
    assert found[0].power == 650.0 and found[0].power_others == 142.0 and found[0].cpu is None


def test_gpus_evenly_used_are_no_stragglers() -> None:
    judge = _gpu_job()
    found: list[Straggler] = []
    for k in range(1, 61):
        for node in ("n0", "n1"):
            found += _sample(judge, node, T0 + k, {g: (93.0 + (k + g) % 5, 300.0 - (k + g) % 7) for g in range(4)})
            found += _load(judge, node, {r: 0.98 for r in range(4 * (node == "n1"), 4 + 4 * (node == "n1"))}, T0 + k)
    assert found == []
    # ... nor GPUs all waiting (a job stalled in its data loader: every GPU idle alike).
    idle = _gpu_job()
    assert [v for k in range(1, 30) for n in ("n0", "n1") for v in _sample(idle, n, T0 + k, {g: (3.0, 70.0)
                                                                                            for g in range(4)})] == []


def test_without_gpu_readings_the_cpu_rule_names_the_straggler() -> None:
    judge = _gpu_job()
    found: list[Straggler] = []
    for k in range(1, 20):
        for node in ("n0", "n1"):
            found += _sample(judge, node, T0 + k, None)  # nvidia-smi hung: every sample a gap
            shares = {r: 0.9 if r == 5 else 0.1 for r in range(4 * (node == "n1"), 4 + 4 * (node == "n1"))}
            found += _load(judge, node, shares, T0 + 3 * k)
    assert [(v.node, v.rank, v.by, v.gpu, v.util) for v in found] == [("n1", 5, "cpu", "1", None)]
    assert "GPU" not in found[0].message()


def test_a_gap_in_the_gpu_readings_starts_their_span_again() -> None:
    judge = _gpu_job()
    found: list[Straggler] = []
    for k in range(1, 25):
        for node in ("n0", "n1"):
            gap = node == "n0" and k == 8
            gpus = {g: (97.0, 300.0) if (node, g) == ("n0", 0) else (15.0, 80.0) for g in range(4)}
            found += [(k, v) for v in _sample(judge, node, T0 + k, None if gap else gpus)]
    assert [(k, v.rank) for k, v in found] == [(18, 0)]  # 10 s after the gap


def _plan(gpus: tuple[int, ...]) -> SimpleNamespace:
    nodes = [SimpleNamespace(name=f"n{i}", rank_offset=2 * i, nproc_per_node=2, gpus=gpus) for i in range(2)]
    return SimpleNamespace(run_id="r1", world_size=4, nodes=nodes)


class _Notifier:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    def send(self, event: str, text: str, **fields: Any) -> None:
        self.sent.append((event, text, fields))


def test_the_watch_says_records_and_notifies_each_verdict_once() -> None:
    said: list[str] = []
    events: list[dict[str, Any]] = []
    notifier = _Notifier()
    watch = StragglerWatch.for_plan(_plan((4, 6)), said.append, events.append, notifier)
    assert watch is not None
    for k in range(1, 15):
        for node in ("n0", "n1"):
            gpus = {g: {"util": 99 if (node, g) == ("n1", 6) else 10, "power": 250 if (node, g) == ("n1", 6) else 60}
                    for g in (4, 6)}
            # as the supervisor hands them on: decoded where the frames were read
            watch.on_event(node, decode({"ev": "sample", "t": T0 + k, "dt": 1.0,
                                         "gpus": {str(g): r for g, r in gpus.items()}}, node))
            watch.on_event(node, decode({"ev": "load", "time": T0 + k,
                                         "cpu": {"0": 1.0} if node == "n0" else {"2": 1.0}}, node))
            watch.on_event(node, decode({"ev": "launcher", "text": "x"}, node))  # anything else is not the watch's
    assert len(said) == 1 and said[0].startswith("n1 rank 3 looks like a straggler: its GPU 6 kept working at 99%")
    assert [(e["kind"], e["node"], e["rank"], e["gpu"], e["util"], e["util_others"]) for e in events] == [
        ("straggler", "n1", 3, "6", 99.0, 10.0)]
    assert [(ev, text, f["node"], f["rank"], f["run_id"], f["by"]) for ev, text, f in notifier.sent] == [
        ("straggler", f"clusterrun: run r1: {said[0]}", "n1", 3, "r1", "gpu")]
    assert StragglerWatch.for_plan(SimpleNamespace(run_id="r", world_size=1, nodes=[]), said.append,
                                   events.append) is None


def test_a_gpu_verdict_with_one_ranks_cpu_alone_has_no_cpu_median() -> None:
    judge = StragglerJudge({"n0": {"0": 0, "1": 1}})
    for k in range(3):
        _load(judge, "n0", {0: 1.0}, T0 + k)  # one rank's CPU reported: nothing to compare it with
    found = [v for k in range(1, 12) for v in _sample(judge, "n0", T0 + k, {0: (97.0, 300.0), 1: (10.0, 60.0)})]
    assert [(v.rank, v.cpu, v.cpu_others, v.util_others) for v in found] == [(0, 1.0, None, 10.0)]
    assert "its CPU" not in found[0].message()
