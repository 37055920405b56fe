"""A run's series on the orchestrator: each node's ``sample`` events (clusterrun/remote/sampler.py) kept in the
run directory, bounded however long the run lasts.

Layout, per node (one JSON sample per line, oldest first)::

    runs/<run-id>/<node>/metrics.jsonl         every sample of the last hour (as sent: 1 s by default)
    runs/<run-id>/<node>/metrics-60.jsonl      1-minute means of the last day before that
    runs/<run-id>/<node>/metrics-600.jsonl     10-minute means of the week before that
    runs/<run-id>/<node>/metrics-3600.jsonl    hourly means of anything older

When the newest tier holds a quarter more than its span, its oldest samples are folded into the next tier (whole
buckets, aligned on the bucket size) and the file is written again without them. A folded sample keeps the
time it ends (``t``) and the seconds it covers (``dt``): byte rates are the bytes of the bucket over its whole
span (a NIC missing in part of it counted as idle then, so totals are kept exactly), readings (utilisation,
power, CPU share, load) the time-weighted mean where they were read, ``rss`` the highest, and counters and
names (``energy``, ``pid``, ``gpu``, ``env``) the last. A week at one sample a second stays under 20 MB per
node (docs/metrics.md quotes the sizes).

A restarted run's earlier attempts keep their series in ``attempt-<k>/<node>/``; :func:`read_series` joins them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from clusterrun.remote import answers
from clusterrun.runs.dirs import atomic_write

RAW = "metrics.jsonl"
#: (bucket seconds, seconds the tier spans before its samples go to the next), finest first; 0: as sampled.
TIERS: tuple[tuple[int, float | None], ...] = ((0, 3600.0), (60, 86400.0), (600, 7 * 86400.0), (3600, None))
SLACK = 0.25  # a tier is folded when it spans this much more than its span: one rewrite per quarter span
RATE_KEYS = frozenset({"nics", "rdma", "conns"})  # bytes per second: an absent reading counts as idle
LAST_KEYS = frozenset({"energy", "pid", "gpu", "env", "gaps"})
MAX_KEYS = frozenset({"rss"})


def tier_file(bucket: int) -> str:
    return RAW if bucket == 0 else f"metrics-{bucket}.jsonl"


Sample = dict[str, Any]


def _mean(items: list[tuple[Any, float]], span: float | None) -> Any:
    """The mean of ``items`` (value, seconds) over ``span`` seconds (None: over the seconds each was read)."""
    last = items[-1][0]
    if isinstance(last, dict):
        keys: dict[str, None] = {}
        for value, _ in items:
            if isinstance(value, dict):
                keys.update(dict.fromkeys(value))
        out = {}
        for key in keys:
            present = [(v[key], w) for v, w in items if isinstance(v, dict) and key in v]
            if key in LAST_KEYS:
                out[key] = present[-1][0]
            elif key in MAX_KEYS:
                out[key] = max((v for v, _ in present if isinstance(v, (int, float))), default=present[-1][0])
            else:
                out[key] = _mean(present, span)
        return out
    if isinstance(last, list):
        return [_mean([(v[i], w) for v, w in items if isinstance(v, list) and len(v) > i], span)
                for i in range(len(last))]
    if isinstance(last, bool) or not isinstance(last, (int, float)):
        return last
    numbers = [(v, w) for v, w in items if isinstance(v, (int, float)) and not isinstance(v, bool)]
    weight = span if span else sum(w for _, w in numbers)
    if not weight:
        return last
    mean = sum(v * w for v, w in numbers) / weight
    return round(mean) if abs(mean) >= 1e5 else round(mean, 3)  # bytes to the byte, readings finer


def fold(samples: list[Sample]) -> Sample:
    """One sample standing for ``samples`` (consecutive, oldest first): see the module's docstring."""
    span = sum(float(s.get("dt") or 0.0) for s in samples)
    out: Sample = {"t": samples[-1]["t"], "dt": round(span, 3)}
    keys: dict[str, None] = {}
    for s in samples:
        keys.update(dict.fromkeys(k for k in s if k not in ("t", "dt")))
    weighted = [(s, float(s.get("dt") or 0.0)) for s in samples]
    for key in keys:
        present = [(s[key], w) for s, w in weighted if key in s]
        if key in LAST_KEYS:
            merged: dict[str, Any] = {}
            for value, _ in present:
                merged.update(value if isinstance(value, dict) else {})
            out[key] = merged if merged else present[-1][0]
        else:
            out[key] = _mean(present, span if key in RATE_KEYS else None)
    return out


def buckets(samples: Iterable[Sample], size: int) -> list[Sample]:
    """``samples`` folded by the ``size``-second bucket (of wall time) their end falls in."""
    out: list[Sample] = []
    group: list[Sample] = []
    key = None
    for s in samples:
        k = int(float(s["t"]) // size)
        if group and k != key:
            out.append(fold(group))
            group = []
        key = k
        group.append(s)
    if group:
        out.append(fold(group))
    return out


def _read(path: Path) -> list[Sample]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    return [item for item in map(_parse, text.splitlines()) if item is not None]


def _line(sample: Mapping[str, Any]) -> str:
    return json.dumps(sample, separators=(",", ":")) + "\n"


class SeriesWriter:
    """Appends each node's samples under ``run_dir`` and keeps every tier bounded. ``judge`` (optional, e.g.
    :class:`clusterrun.runs.traffic.WrongNicJudge`) sees every sample; :meth:`on_sample` returns its verdicts."""

    def __init__(self, run_dir: str | Path, judge: Any = None) -> None:
        self.run_dir = Path(run_dir)
        self.judge = judge
        self.first: dict[tuple[str, int], float | None] = {}  # (node, bucket) -> oldest t in that tier's file

    def on_sample(self, node: str, event: answers.Sample) -> list[Any]:
        """Keep one ``sample`` event of ``node`` (the keys it sent); the judge's verdicts, if any."""
        sample = event.series()
        self.extend(node, [sample])
        return list(self.judge.feed(node, sample)) if self.judge is not None else []

    def extend(self, node: str, samples: list[Sample]) -> None:
        """Keep ``samples`` of ``node`` (oldest first), as :meth:`on_sample` keeps one."""
        if samples:
            (self.run_dir / node).mkdir(mode=0o700, parents=True, exist_ok=True)
            self._append(node, 0, samples)

    def _oldest(self, node: str, bucket: int) -> float | None:
        key = (node, bucket)
        if key not in self.first:
            path = self.run_dir / node / tier_file(bucket)
            try:
                with open(path, encoding="utf-8") as fh:
                    first = next((json.loads(line) for line in fh if line.strip()), None)
            except (OSError, ValueError):
                first = None
            self.first[key] = float(first["t"]) if isinstance(first, dict) and "t" in first else None
        return self.first[key]

    def _append(self, node: str, level: int, samples: list[Sample]) -> None:
        bucket, span = TIERS[level]
        path = self.run_dir / node / tier_file(bucket)
        if not path.exists():  # new, or moved to attempt-<k>/ by a restart: its oldest sample is this one
            self.first[(node, bucket)] = None
        with open(path, "a", encoding="utf-8") as fh:
            fh.write("".join(_line(s) for s in samples))
        if self._oldest(node, bucket) is None:
            self.first[(node, bucket)] = float(samples[0]["t"])
        oldest, newest = self._oldest(node, bucket), float(samples[-1]["t"])
        if span is not None and oldest is not None and newest - oldest > span * (1 + SLACK):
            self._pass_on(node, level, newest - span)

    def _pass_on(self, node: str, level: int, cutoff: float) -> None:
        """Fold the samples of tier ``level`` older than ``cutoff`` into the next tier; keep the rest as written
        (only the lines folded are parsed: each sample is read once in its life)."""
        bucket, _ = TIERS[level]
        size = TIERS[level + 1][0]
        cutoff = (cutoff // size) * size  # whole buckets only: a bucket is never split between two writes
        path = self.run_dir / node / tier_file(bucket)
        try:
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        except OSError:
            return
        old: list[Sample] = []
        keep_from = len(lines)
        for i, line in enumerate(lines):
            when = _time_of(line)
            if when is not None and when >= cutoff:
                keep_from = i
                break
            sample = _parse(line)
            if sample is not None:
                old.append(sample)
        if old:
            self._append(node, level + 1, buckets(old, size))
        keep = lines[keep_from:]
        atomic_write(path, "".join(keep))
        self.first[(node, bucket)] = _time_of(keep[0]) if keep else None


def _time_of(line: str) -> float | None:
    """The ``t`` of a line as :func:`_line` writes it (``{"t":<number>,``), without parsing the rest."""
    if line.startswith('{"t":'):
        end = line.find(",", 5)
        try:
            return float(line[5:end])
        except ValueError:
            pass
    sample = _parse(line)
    return float(sample["t"]) if sample is not None else None


def _parse(line: str) -> Sample | None:
    try:
        item = json.loads(line)
    except ValueError:
        return None  # a line cut by a crash: the others stand
    return item if isinstance(item, dict) and "t" in item else None


def node_dirs(run_dir: str | Path) -> list[Path]:
    """Where a run's series are, oldest attempt first: ``attempt-<k>/`` by k, then the run directory itself."""
    root = Path(run_dir)
    attempts = sorted((p for p in root.glob("attempt-*") if p.is_dir() and p.name[8:].isdigit()),
                      key=lambda p: int(p.name[8:]))
    return [*attempts, root]


def nodes(run_dir: str | Path) -> list[str]:
    """The nodes with a series in the run (any attempt), by name."""
    found = {p.parent.name for where in node_dirs(run_dir) for p in where.glob("*/metrics*.jsonl")}
    return sorted(found)


def read_series(run_dir: str | Path, node: str, since: float | None = None) -> list[Sample]:
    """``node``'s samples, oldest first, across its attempts and tiers (those ending after ``since``, if given)."""
    out: list[Sample] = []
    for where in node_dirs(run_dir):
        for bucket, _ in reversed(TIERS):
            out.extend(_read(where / node / tier_file(bucket)))
    out.sort(key=lambda s: float(s["t"]))
    return [s for s in out if since is None or float(s["t"]) > since]


def size(run_dir: str | Path, node: str) -> int:
    """Bytes the node's series take (every tier, every attempt)."""
    return sum(os.path.getsize(p) for where in node_dirs(run_dir) for p in (where / node).glob("metrics*.jsonl"))


def latest(run_dir: str | Path, node: str, count: int = 1, chunk: int = 16384) -> list[Sample]:
    """``node``'s newest ``count`` samples (oldest first) from the end of its current full-resolution file alone:
    cheap enough to call every second however long the run has been going (a week of tiers is never read)."""
    path = Path(run_dir) / node / RAW
    try:
        with open(path, "rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            at, tail = end, b""
            while at > 0:
                at = max(0, at - chunk)
                fh.seek(at)
                tail = fh.read(min(chunk, end - at)) + tail
                end = at
                if tail.count(b"\n") > count or at == 0:
                    break
    except OSError:
        return []
    lines = tail.decode("utf-8", errors="replace").splitlines()
    if at > 0:
        lines = lines[1:]  # the first may be cut at the chunk's start
    found = [s for s in map(_parse, reversed(lines)) if s is not None][:count]
    return found[::-1]
