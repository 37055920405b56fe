"""A run as its directory holds it, read back for its page whatever state it was left in: the record
(:func:`clusterrun.runs.read_record`), plan.json as a plain mapping (an older or damaged one still shows what
it has), each attempt's logs, and the launch phases when the record has them. What is not there is said in
:attr:`RunData.missing`, never raised."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterrun import redact
from clusterrun.report.html import number
from clusterrun.runs import RunDir, RunRecord, RunState, read_record, run_record
from clusterrun.runs.record import Failure


@dataclass(frozen=True)
class Phase:
    node: str
    name: str
    start: float
    end: float | None


@dataclass
class RunData:
    run: RunDir
    record: RunRecord
    plan: dict[str, Any] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> list[dict[str, Any]]:
        return [n for n in self.plan.get("nodes") or () if isinstance(n, Mapping) and n.get("name")]

    def node_names(self) -> list[str]:
        """Every node the run had: the plan's, the record's, every attempt's (in that order)."""
        names = [str(n["name"]) for n in self.nodes]
        for name in (*self.record.nodes, *(n for a in self.record.attempts for n in a.nodes)):
            if name not in names:
                names.append(name)
        return names

    def phases(self) -> list[Phase]:
        """The per-node launch phases (``timeline`` in status.json, by node then phase: ``[start, end]`` or
        ``{"start": .., "end": ..}``), where the record has them."""
        raw = self.record.extra.get("timeline")
        out: list[Phase] = []
        sources: list[tuple[str, Any]] = list(raw.items()) if isinstance(raw, Mapping) else []
        if isinstance(raw, list):  # a list of {node, phase, start, end}
            for item in raw:
                if isinstance(item, Mapping):
                    sources.append((str(item.get("node")), {str(item.get("phase")): item}))
        for node, phases in sources:
            if not isinstance(phases, Mapping):
                continue
            for name, span in phases.items():
                start, end = _span(span)
                if start is not None:
                    out.append(Phase(str(node), str(name), start, end))
        return sorted(out, key=lambda p: (p.node, p.start))

    def log_of(self, node: str, rank: int | None, attempt: int | None) -> Path | None:
        """The rank's log (or the node's launcher.log for ``rank`` None) of ``attempt`` (None: the latest)."""
        last = self.record.attempts[-1].number if self.record.attempts else None
        where = self.run.path if attempt is None or attempt == last else self.run.path / f"attempt-{attempt}"
        name = f"rank{rank}.log" if rank is not None else "launcher.log"
        path = where / node / name
        if path.is_file():
            return path
        found = [p for _n, r, p in self.run.rank_logs(node, rank)] if rank is not None else []
        return found[0] if found else None

    def failure_attempt(self, failure: Failure) -> int | None:
        """The attempt whose failure ``failure`` is (None: the run has one attempt)."""
        for a in self.record.attempts:
            if a.first_failure == failure:
                return a.number
        return None

    def axis(self) -> tuple[float, float] | None:
        """The run's time axis for its charts: its start and its end (the latest time the record holds; now for a
        run still going), or None when no start is recorded."""
        rec = self.record
        t0 = rec.started or min((n.started for n in rec.nodes.values() if n.started), default=None)
        if t0 is None:
            return None
        times = [t for t in (rec.ended, *(n.ended for n in rec.nodes.values()), *(a.ended for a in rec.attempts),
                             *(r.ended for n in rec.nodes.values() for r in n.ranks.values()),
                             *(e.get("time") for e in rec.events)) if isinstance(t, (int, float))]
        return t0, max(times, default=time.time() if not rec.state.ended else t0)

    def failure_time(self) -> float | None:
        """When the first failure happened: the failing rank's end (the node's, for a node as a whole), else the end
        of the attempt it ended; None when the record has no failure or no time for it."""
        failure = self.record.first_failure
        if failure is None:
            return None
        attempt = self.failure_attempt(failure)
        last = self.record.attempts[-1].number if self.record.attempts else None
        node = self.record.nodes.get(failure.node)
        if node is not None and (attempt is None or attempt == last):
            rank = node.ranks.get(failure.rank) if failure.rank is not None else None
            when = rank.ended if rank is not None else node.ended
            if when is not None:
                return when
        ends = [a.ended for a in self.record.attempts if a.number == attempt]
        return ends[0] if ends else None

    def received(self) -> dict[tuple[str, int], tuple[int, int]]:
        """(node, rank) -> (bytes, lines) the run's logs received, over stdout and stderr."""
        got = (self.record.logs or {}).get("received")
        if not isinstance(got, Mapping):
            return {}
        out: dict[tuple[str, int], tuple[int, int]] = {}
        for key, counts in got.items():
            parts = str(key).split("/")
            if len(parts) != 3 or not parts[1].lstrip("-").isdigit() or not isinstance(counts, Mapping):
                continue
            b, n = out.get((parts[0], int(parts[1])), (0, 0))
            out[(parts[0], int(parts[1]))] = (b + int(number(counts.get("bytes")) or 0),
                                              n + int(number(counts.get("lines")) or 0))
        return out


def _span(value: Any) -> tuple[float | None, float | None]:
    def num(x: Any) -> float | None:
        return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None

    if isinstance(value, Mapping):
        return num(value.get("start", value.get("started"))), num(value.get("end", value.get("ended")))
    if isinstance(value, (list, tuple)) and value:
        return num(value[0]), num(value[1]) if len(value) > 1 else None
    return num(value), None


def load_run(path: Path) -> RunData:
    """The run in ``path`` as far as it can be read."""
    run = RunDir(path)
    status = path / "status.json"
    record = run_record(run) if status.is_file() else read_record(run)
    data = RunData(run, record)
    if not status.is_file():
        data.missing.append("status.json is not there: the run's states, exit codes and events are unknown "
                            "(its clusterrun stopped before it wrote any)")
    elif record.state is RunState.unknown:
        data.missing.append("status.json cannot be read (cut short while being written, or damaged): the run's "
                            "states, exit codes and events are unknown")
    try:
        plan = json.loads((path / "plan.json").read_text(encoding="utf-8"))
        if not isinstance(plan, dict):
            raise ValueError("not a JSON object")
        data.plan = plan
    except FileNotFoundError:
        data.missing.append("plan.json is not there: the plan (nodes, ranks, GPUs, NICs, environment) is unknown")
    except (OSError, ValueError) as exc:
        data.missing.append(f"plan.json cannot be read ({exc}): the plan is unknown")
    if record.state is not RunState.unknown and not record.nodes and record.state not in (RunState.not_started,
                                                                                          RunState.starting):
        data.missing.append("the record holds no node's end (an older clusterrun, or the run's end was never "
                            "recorded): the timeline shows what is known")
    return data


def masked_env(node: Mapping[str, Any]) -> dict[str, str]:
    """The node's environment as plan.json has it, every secret masked (again: an older plan.json may not have)."""
    env = node.get("env") or {}
    if not isinstance(env, Mapping):
        return {}
    return {str(k): str(v) if str(v).startswith(redact.MASK) else redact.shown(str(k), str(v)) for k, v in env.items()}
