"""A run's series (clusterrun/runs/series.py) made ready to draw: per node the lines the page shows, each cut down
to at most :data:`POINTS` points on the run's time axis, with each line's mean and peak over every sample, and
the node's GPU energy (clusterrun/runs/traffic.py).

Lines per node: the data NIC's rx and tx and the RDMA ports' traffic (bytes per second), the two busiest other
NICs (rx + tx; ``lo`` left out), the GPUs' mean and lowest utilisation and their summed power (and, where asked,
one GPU's own: a straggler's), and each rank's CPU share. A point is the time-weighted mean of the samples in its
stretch of the axis; a hole in the samples (an agent restarted, a restart's pause) breaks the line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterrun.report.html import number
from clusterrun.runs import series, traffic

#: Points per line at most: about one every two pixels of a panel (fewer on a page of many nodes).
POINTS = 100
#: A hole longer than this many sampling intervals (and points) breaks a line.
HOLE = 5.0


@dataclass
class Stat:
    """A line's mean (time-weighted) and peak over every sample."""

    mean: float
    peak: float


@dataclass
class NodeSeries:
    name: str
    data_nic: str | None
    samples: int
    span: tuple[float, float]  # first and last sample, seconds since the run's start
    lines: dict[str, list[tuple[float, float | None]]] = field(default_factory=dict)  # key -> (seconds, value)
    stats: dict[str, Stat] = field(default_factory=dict)
    others: list[str] = field(default_factory=list)  # the other NICs drawn, busiest first
    gpus: int = 0
    ranks: list[str] = field(default_factory=list)
    rdma: bool = False
    energy_j: float | None = None
    energy_how: str = ""

    def top(self, *keys: str) -> float:
        """The highest point drawn of the lines whose key starts with one of ``keys``."""
        return max((v for k, pts in self.lines.items() if k.startswith(keys) for _, v in pts if v is not None),
                   default=0.0)


def _num(value: Any) -> float | None:
    return number(value)


def _pair(value: Any) -> tuple[float | None, float | None]:
    if isinstance(value, (list, tuple)) and len(value) >= 2:
        return _num(value[0]), _num(value[1])
    return None, None


def _values(sample: Mapping[str, Any], data_nic: str | None) -> dict[str, float]:
    """The sample's values of every line (key -> value); a line the sample has no reading of is absent."""
    out: dict[str, float] = {}
    nics = sample.get("nics") if isinstance(sample.get("nics"), Mapping) else {}
    for nic, value in nics.items():
        rx, tx = _pair(value)
        if nic == data_nic:
            if rx is not None:
                out["rx"] = rx
            if tx is not None:
                out["tx"] = tx
        elif nic != "lo" and (rx is not None or tx is not None):
            out[f"nic:{nic}"] = (rx or 0.0) + (tx or 0.0)
    rdma = sample.get("rdma") if isinstance(sample.get("rdma"), Mapping) else {}
    if rdma:
        out["rdma"] = sum((a or 0.0) + (b or 0.0) for a, b in map(_pair, rdma.values()))
    gpus = sample.get("gpus") if isinstance(sample.get("gpus"), Mapping) else {}
    utils = [u for g in gpus.values() if isinstance(g, Mapping) and (u := _num(g.get("util"))) is not None]
    if utils:
        out["util"] = sum(utils) / len(utils)
        out["util_min"] = min(utils)
    powers = [p for g in gpus.values() if isinstance(g, Mapping) and (p := _num(g.get("power"))) is not None]
    if powers:
        out["power"] = sum(powers)
    for index, g in gpus.items():  # each GPU's own, drawn for a straggler's GPU
        for key, name in (("util", "gpu_util"), ("power", "gpu_power")):
            value = _num(g.get(key)) if isinstance(g, Mapping) else None
            if value is not None:
                out[f"{name}:{index}"] = value
    ranks = sample.get("ranks") if isinstance(sample.get("ranks"), Mapping) else {}
    for rank, reading in ranks.items():
        cpu = _num(reading.get("cpu")) if isinstance(reading, Mapping) else None
        if cpu is not None:
            out[f"cpu:{rank}"] = cpu
    return out


def node_series(run_dir: Path, node: str, data_nic: str | None, t0: float, total: float,
                points: int = POINTS, gpus_drawn: tuple[str, ...] = ()) -> NodeSeries | None:
    """``node``'s lines on the axis 0 .. ``total`` seconds from ``t0``, ``points`` points each at most (None: the
    node has no samples); ``gpus_drawn``: GPUs (physical indices) whose own utilisation and power are drawn too
    (``gpu_util:<i>``, ``gpu_power:<i>``: a straggler's)."""
    raw = series.read_series(run_dir, node)
    rows: list[tuple[float, float, dict[str, float]]] = []  # (seconds since t0, dt, values)
    gpus: set[str] = set()
    for s in raw:
        t = _num(s.get("t"))
        if t is None:
            continue
        rows.append((t - t0, max(_num(s.get("dt")) or 0.0, 0.0), _values(s, data_nic)))
        if isinstance(s.get("gpus"), Mapping):
            gpus.update(s["gpus"])
    if not rows:
        return None
    used = traffic.energy({node: raw})
    del raw
    out = NodeSeries(node, data_nic, len(rows), (rows[0][0], rows[-1][0]), gpus=len(gpus),
                     energy_j=used.per_node.get(node), energy_how=used.how.get(node, ""))
    sums: dict[str, list[float]] = {}  # key -> [weighted sum, weight, peak]
    for _t, dt, values in rows:
        w = dt or 1.0
        for k, v in values.items():
            acc = sums.setdefault(k, [0.0, 0.0, v])
            acc[0] += v * w
            acc[1] += w
            acc[2] = max(acc[2], v)
    out.stats = {k: Stat(a[0] / a[1] if a[1] else 0.0, a[2]) for k, a in sums.items()}
    busiest = sorted((k for k in sums if k.startswith("nic:") and sums[k][2] > 0), key=lambda k: -sums[k][0])
    out.others = [k[4:] for k in busiest[:2]]
    out.ranks = sorted((k[4:] for k in sums if k.startswith("cpu:")), key=lambda r: (not r.isdigit(), int(r)
                                                                                      if r.isdigit() else 0, r))
    out.rdma = "rdma" in sums and sums["rdma"][2] > 0
    keep = ["rx", "tx", *(["rdma"] if out.rdma else []), *busiest[:2], "util", "util_min", "power",
            *(f"cpu:{r}" for r in out.ranks), *(f"{k}:{g}" for g in gpus_drawn for k in ("gpu_util", "gpu_power"))]
    out.lines = _downsample(rows, [k for k in keep if k in sums], total / max(points, 1))
    return out


def _downsample(rows: list[tuple[float, float, dict[str, float]]], keys: list[str],
                width: float) -> dict[str, list[tuple[float, float | None]]]:
    """Each key's time-weighted mean per stretch of ``width`` seconds; None where the samples have a hole."""
    width = max(width, 1e-6)
    gaps = sorted(dt for _t, dt, _v in rows if dt > 0)
    step = gaps[len(gaps) // 2] if gaps else 1.0  # the usual interval between samples
    groups: list[list[tuple[float, float, dict[str, float]]]] = []
    for row in rows:
        if groups and int(groups[-1][-1][0] // width) == int(row[0] // width):
            groups[-1].append(row)
        else:
            groups.append([row])
    lines: dict[str, list[tuple[float, float | None]]] = {k: [] for k in keys}
    last_t: float | None = None
    for group in groups:
        t = sum(r[0] for r in group) / len(group)
        hole = last_t is not None and group[0][0] - last_t > max(HOLE * step, 2.5 * width, group[0][1] * 1.5)
        last_t = group[-1][0]
        for k in keys:
            weighted = [(r[2][k], r[1] or 1.0) for r in group if k in r[2]]
            if (hole or not weighted) and lines[k] and lines[k][-1][1] is not None:
                lines[k].append((t, None))  # a hole, or this line's reading is missing here (a rank ended)
            if weighted:
                mean = sum(v * w for v, w in weighted) / sum(w for _v, w in weighted)
                lines[k].append((t, mean))
    return lines
