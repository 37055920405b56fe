"""A straggler by work: the rank that keeps working while the others wait for it. Pure logic over the ranks' CPU
shares (the agents' ``load`` reports) and, where the run has GPUs, the GPUs' utilisation and power (the nodes'
``sample`` events, clusterrun/remote/sampler.py); no I/O. Standard library only: a detached run's supervisor takes
it to rank 0's node (remote/bundle.py), so attached and detached runs judge alike.

Synchronous data-parallel training runs at the speed of its slowest rank: at every collective the others wait for
it. Waiting is what shows: the slow rank goes on working while the others sit in the collective.

**By CPU.** A rank whose mean share of a CPU over its node's last ``windows`` reports is at least ``busy`` and at
least ``factor`` times the median of every other rank's (all nodes; 5 % at least) is a straggler. This is the rule
of CPU and gloo jobs: a rank waiting in gloo sleeps. On GPU jobs NCCL keeps every rank's CPU busy while it
waits, so this rule stays silent there.

**By GPU.** Over the last ``span`` seconds of samples, a GPU of the run whose mean utilisation is at least
``util_busy`` % and either at least ``factor`` times the other GPUs' median utilisation, or whose mean power is at
least ``power_factor`` times their median power, is a straggler's: its rank is the one the plan gives it (local
rank i on the i-th of its node's GPUs). Power matters because a GPU waiting in an NCCL collective runs NCCL's
kernel, which nvidia-smi counts as 100 % utilisation while it draws little power. A node whose samples have no GPU
readings (no nvidia-smi, a gap) is judged by CPU alone.

Each node is named once, by whichever rule names it first: the node, its busiest rank that qualifies (any other
of that node's that qualify too), and the evidence of both kinds where there is some: the rank's CPU share and its
GPU's utilisation and power, each against the other ranks' (GPUs') median.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

WINDOWS = 3  # CPU reports in a row (every 3 s by default)
BUSY = 0.5  # share of a CPU a straggler's rank uses at least
FACTOR = 2.0  # ... and at least this many times the others' median (CPU share, GPU utilisation)
FLOOR = 0.05  # the others' median CPU share counts as this much at least (idle ranks are not infinitely slower)
SPAN = 10.0  # seconds of GPU samples judged
UTIL_BUSY = 50.0  # % utilisation a straggler's GPU has at least
UTIL_FLOOR = 5.0  # % the others' median utilisation counts as at least
POWER_FACTOR = 1.5  # a straggler's GPU draws this many times the others' median power at least (or FACTOR x util)


@dataclass(frozen=True)
class Straggler:
    """The verdict: ``rank`` of ``node`` (None: a GPU no rank is known to use) named ``by`` ``cpu`` or ``gpu`` at
    ``time``, judged on readings since ``since``; the evidence, each against the others' median (None: no readings
    of that kind); ``also``: the node's other ranks that qualified."""

    node: str
    rank: int | None
    by: str
    time: float
    since: float | None = None
    cpu: float | None = None
    cpu_others: float | None = None
    gpu: str | None = None
    util: float | None = None
    util_others: float | None = None
    power: float | None = None
    power_others: float | None = None
    also: tuple[int, ...] = ()

    def _gpu(self, own: bool) -> str:
        """``97% and 310 W``, or the other GPUs' median as that."""
        util, power = (self.util, self.power) if own else (self.util_others, self.power_others)
        return f"{util or 0:.0f}%" + (f" and {power:.0f} W" if power is not None else "")

    def message(self) -> str:
        who = f"{self.node} rank {self.rank}" if self.rank is not None else f"{self.node} (GPU {self.gpu})"
        gpu = self.util is not None and self.util_others is not None
        cpu = self.cpu is not None and self.cpu_others is not None
        if self.by == "gpu":
            text = (f"{who} looks like a straggler: its GPU {self.gpu} kept working at {self._gpu(True)} while the "
                    f"other GPUs ran at {self._gpu(False)} (their median), waiting for it")
            text += f"; its CPU: {self.cpu:.0%} (the other ranks' median {self.cpu_others:.0%})" if cpu else ""
            why = "a slower, throttled or shared GPU, or more work on its rank"
        else:
            text = (f"{who} looks like a straggler: it kept {self.cpu or 0:.0%} of a CPU busy while the other ranks "
                    f"used {self.cpu_others or 0:.0%} (their median), waiting for it")
            if gpu:
                text += f"; its GPU {self.gpu}: {self._gpu(True)} (the other GPUs' median {self._gpu(False)})"
            why = "a slower or busier machine, or more work on its rank"
        if self.also:
            ranks = ", ".join(map(str, self.also))
            text += f"; {'rank' if len(self.also) == 1 else 'ranks'} {ranks} of {self.node} too"
        return f"{text} ({why}); clusterrun does nothing about it"

    def fields(self) -> dict[str, Any]:
        """The figures, as the record and ``--notify`` keep them."""
        out: dict[str, Any] = {"rank": self.rank, "by": self.by, "since": self.since, "gpu": self.gpu,
                               "also": list(self.also)}
        return {**out, **{key: getattr(self, key) for key in ("cpu", "cpu_others", "util", "util_others", "power",
                                                               "power_others")}}

    def record_event(self) -> dict[str, Any]:
        """The verdict as an event of the run's record (time, node, kind, text, and its figures)."""
        return {"time": self.time, "node": self.node, "kind": "straggler", "text": self.message(), **self.fields()}


class StragglerJudge:
    """Feeds on the ``load`` reports and the samples of each node; names a straggler once per node (see the
    module's docstring). ``gpus``: per node, its GPUs' physical indices (as text) to the global rank using each.

    A report or a sample judges its own node's ranks or GPUs only, against every other's mean as it stands (each
    mean is kept, and changes only with its node's readings): at 64 nodes of 8 GPUs a sample costs a sort of 512
    numbers, not a judgement of every GPU."""

    def __init__(self, gpus: Mapping[str, Mapping[str, int]] | None = None, *, windows: int = WINDOWS,
                 busy: float = BUSY, factor: float = FACTOR, span: float = SPAN, util_busy: float = UTIL_BUSY,
                 power_factor: float = POWER_FACTOR) -> None:
        self.gpus = {node: dict(m) for node, m in (gpus or {}).items()}
        self.windows, self.busy, self.factor, self.span = windows, busy, factor, span
        self.util_busy, self.power_factor = util_busy, power_factor
        self.cpu: dict[str, dict[int, list[tuple[float, float]]]] = {}  # node -> rank -> [(time, share)]
        self.gpu: dict[str, dict[str, list[tuple[float, float, float, float | None]]]] = {}  # [(t, dt, util, W)]
        self.cpu_mean: dict[str, dict[int, float]] = {}  # node -> rank -> mean share (full windows only)
        self.gpu_mean: dict[str, dict[str, tuple[float, float | None]]] = {}  # node -> GPU -> (util, W)
        self.named: set[str] = set()

    # ------------------------------------------------------------ readings

    def on_load(self, node: str, event: Mapping[str, Any]) -> list[Straggler]:
        """A ``load`` report of ``node``: ``{"cpu": {rank: share}, "time"}``. A rank missing from it (ended) is
        judged no more."""
        shares = {}
        for rank, share in (event.get("cpu") or {}).items():
            value = _number(share)
            if value is not None and str(rank).isdigit():
                shares[int(rank)] = value
        if not shares:
            return []
        when = float(event.get("time") or time.time())
        old = self.cpu.get(node, {})
        windows = self.cpu[node] = {rank: [*old.get(rank, []), (when, share)][-self.windows:]
                                    for rank, share in shares.items()}
        self.cpu_mean[node] = {r: sum(s for _, s in w) / len(w) for r, w in windows.items() if len(w) >= self.windows}
        return self._judge_cpu(node, when)

    def on_sample(self, node: str, sample: Mapping[str, Any]) -> list[Straggler]:
        """A sample of ``node``: its ``gpus`` readings (a sample without them drops the node's GPUs from the
        judgement until they come back, for ``span`` seconds again)."""
        gpus = sample.get("gpus")
        readings: dict[str, tuple[float, float | None]] = {}
        for index, reading in (gpus.items() if isinstance(gpus, Mapping) else ()):
            util = _number(reading.get("util")) if isinstance(reading, Mapping) else None
            if util is not None:
                readings[str(index)] = (util, _number(reading.get("power")))
        when, dt = float(sample.get("t") or time.time()), max(_number(sample.get("dt")) or 0.0, 0.0)
        old = self.gpu.get(node, {})
        windows = self.gpu[node] = {index: [*old.get(index, []), (when, dt, util, power)]
                                    for index, (util, power) in readings.items()}
        means = self.gpu_mean[node] = {}
        for index, window in windows.items():
            while len(window) > 1 and sum(w[1] for w in window[1:]) >= self.span:
                del window[0]
            seconds = sum(w[1] for w in window)
            if seconds >= self.span and seconds > 0:
                powers = [(w[3], w[1]) for w in window if w[3] is not None]
                watts = sum(d for _, d in powers)
                means[index] = (sum(w[2] * w[1] for w in window) / seconds,
                                sum(p * d for p, d in powers) / watts if watts else None)
        return self._judge_gpu(node, when) if means else []

    # ------------------------------------------------------------ rules

    def _all(self, table: Mapping[str, Mapping[Any, Any]], pick: int | None = None) -> list[float]:
        """Every mean of ``table`` (the item ``pick`` of each tuple), sorted; None left out."""
        values = (v if pick is None else v[pick] for node in table.values() for v in node.values())
        return sorted(v for v in values if v is not None)

    def _judge_cpu(self, node: str, when: float) -> list[Straggler]:
        ordered = self._all(self.cpu_mean)
        if node in self.named or len(ordered) < 2:
            return []
        found = sorted(((share, rank) for rank, share in self.cpu_mean.get(node, {}).items()
                        if share >= self.busy and share >= self.factor * max(_median_without(ordered, share), FLOOR)),
                       reverse=True)
        if not found:
            return []
        rank = found[0][1]
        return [self._verdict(node, rank, "cpu", when, self.cpu[node][rank][0][0], self._gpu_of(node, rank),
                              [r for _, r in found[1:]])]

    def _judge_gpu(self, node: str, when: float) -> list[Straggler]:
        utils, powers = self._all(self.gpu_mean, 0), self._all(self.gpu_mean, 1)
        if node in self.named or len(utils) < 2:
            return []
        found = []
        for index, (util, power) in self.gpu_mean.get(node, {}).items():
            if util < self.util_busy:
                continue
            others_power = _median_without(powers, power) if power is not None and len(powers) > 1 else None
            if util >= self.factor * max(_median_without(utils, util), UTIL_FLOOR) or (
                    power is not None and others_power and power >= self.power_factor * others_power):
                found.append((util + (power or 0.0), index))
        if not found:
            return []
        found.sort(reverse=True)
        index = found[0][1]
        ranks = self.gpus.get(node, {})
        first = self.gpu[node][index][0]
        return [self._verdict(node, ranks.get(index), "gpu", when, first[0] - first[1], index,
                              [ranks[i] for _, i in found[1:] if i in ranks])]

    def _gpu_of(self, node: str, rank: int) -> str | None:
        return next((index for index, r in self.gpus.get(node, {}).items() if r == rank), None)

    def _verdict(self, node: str, rank: int | None, by: str, when: float, since: float, gpu: str | None,
                 also: list[int]) -> Straggler:
        """The verdict on ``node``, with the evidence of both kinds that there is for ``rank`` and ``gpu``."""
        self.named.add(node)
        cpu = self.cpu_mean.get(node, {}).get(rank) if rank is not None else None
        shares = self._all(self.cpu_mean)
        cpu_others = _median_without(shares, cpu) if cpu is not None and len(shares) > 1 else None
        util, power = self.gpu_mean.get(node, {}).get(gpu, (None, None)) if gpu is not None else (None, None)
        utils, powers = self._all(self.gpu_mean, 0), self._all(self.gpu_mean, 1)
        util_others = _median_without(utils, util) if util is not None and len(utils) > 1 else None
        power_others = _median_without(powers, power) if power is not None and len(powers) > 1 else None
        return Straggler(node, rank, by, round(when, 3), round(since, 3), _round(cpu, 3),
                         _round(cpu_others, 3), gpu, _round(util, 1), _round(util_others, 1), _round(power, 1),
                         _round(power_others, 1), tuple(also))


def _median_without(ordered: Sequence[float], value: float) -> float:
    """The median of sorted ``ordered`` with one ``value`` (one of them) left out; ``ordered`` holds two at least."""
    at = bisect.bisect_left(ordered, value)
    size = len(ordered) - 1

    def nth(k: int) -> float:
        return ordered[k] if k < at else ordered[k + 1]

    mid = size // 2
    return nth(mid) if size % 2 else (nth(mid - 1) + nth(mid)) / 2


def _round(value: float | None, digits: int) -> float | None:
    return round(value, digits) if value is not None else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
