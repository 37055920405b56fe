"""Reading torch's flight recorder dumps (the JSON form) of a hung job: which collective each rank is in.

Every process group numbers its collectives (``collective_seq_id``); each rank's dump says, per group, the last
collective it enqueued and the last one that completed, and lists the recent ones with their operation and
sizes. Set side by side, the dumps show what no stack can: the ranks that wait in all_reduce #1042 of a
group, and the ones that never called it (still computing, stuck elsewhere, or on another code path), or ranks
that called different collectives under the same number (a desync).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from clusterrun.facts.stacks import ranks_text

DEFAULT_GROUP = "0"  # torch numbers the default (world) process group 0: every rank is in it


@dataclass
class GroupState:
    """One rank's view of one process group."""

    name: str
    enqueued: int
    completed: int
    ops: dict[int, tuple[str, str]] = field(default_factory=dict)  # seq -> (operation, input sizes)

    def op(self, seq: int) -> str:
        found = self.ops.get(seq)
        return f"{found[0]} #{seq}" if found else f"collective #{seq}"


def _operation(entry: Mapping[str, Any]) -> str:
    name = str(entry.get("profiling_name") or "collective")
    return name.split(":", 1)[1] if ":" in name else name  # "nccl:all_reduce" -> "all_reduce"


def parse(data: bytes | str) -> dict[str, GroupState] | str:
    """``{group id: GroupState}`` of one rank's JSON dump, or the reason it has none (a string)."""
    try:
        dump = json.loads(data) if data else None
    except (ValueError, UnicodeDecodeError):
        return "its flight recorder dump is not JSON"
    if not isinstance(dump, dict):
        return "no flight recorder dump"
    if "error" in dump:
        return str(dump["error"])
    names: dict[str, str] = {}
    ops: dict[str, dict[int, tuple[str, str]]] = {}
    for entry in dump.get("entries") or []:
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        pg = entry.get("process_group") or []
        gid = str(entry.get("pg_id", pg[0] if pg else ""))
        if len(pg) > 1 and pg[1]:
            names.setdefault(gid, str(pg[1]))
        seq = entry.get("collective_seq_id")
        if isinstance(seq, int):
            sizes = entry.get("input_sizes")
            shapes = ", ".join(str(shape) for shape in sizes) if isinstance(sizes, list) else "?"
            ops.setdefault(gid, {})[seq] = (_operation(entry), shapes or "?")
    groups = {}
    for gid, status in (dump.get("pg_status") or {}).items():
        try:
            enqueued, completed = int(status["last_enqueued_collective"]), int(status["last_completed_collective"])
        except (KeyError, TypeError, ValueError):
            continue
        groups[str(gid)] = GroupState(names.get(str(gid), f"group {gid}"), enqueued, completed, ops.get(str(gid), {}))
    return groups


def digest(dumps: Mapping[int, bytes | str], ranks: Collection[int] = ()) -> list[str]:
    """Lines for the terminal: per process group where the ranks disagree, who waits in which collective and
    who never called it (a rank whose dump holds no collective of the default group has called none); ranks
    without a dump, or in ``ranks`` (every rank there should be) but not in ``dumps``, are named."""
    return _judge(dumps, ranks)[0]


def behind(dumps: Mapping[int, bytes | str], ranks: Collection[int] = ()) -> list[int]:
    """The ranks the others wait for: those that never called a collective the others are in."""
    return _judge(dumps, ranks)[1]


def _judge(dumps: Mapping[int, bytes | str], ranks: Collection[int]) -> tuple[list[str], list[int]]:
    views: dict[int, dict[str, GroupState]] = {}
    missing: dict[str, list[int]] = {}
    for rank, data in dumps.items():
        parsed = parse(data)
        if isinstance(parsed, str):
            missing.setdefault(parsed, []).append(rank)
        else:
            views[rank] = parsed
    for rank in sorted(set(ranks) - set(dumps)):
        missing.setdefault("no flight recorder dump came back", []).append(rank)
    lines: list[str] = []
    late: set[int] = set()
    unknown = sorted(r for rs in missing.values() for r in rs)
    for gid in sorted({g for view in views.values() for g in view}, key=lambda g: (len(g), g)):
        absent = sorted(rank for rank, view in views.items() if gid not in view)
        said, who = _group_lines(gid, {rank: view[gid] for rank, view in views.items() if gid in view}, absent,
                                 unknown)
        lines += said
        late.update(who)
    if views and not lines:
        last = max((s.completed for view in views.values() for s in view.values()), default=-1)
        if not any(views.values()):
            lines.append("no rank has called a collective yet: they are stuck before the first one")
        else:
            lines.append("every collective the ranks called has completed"
                         + (f" (last #{last})" if last > 0 else "")
                         + ": they are stuck outside torch.distributed")
    for why, ranks_without in sorted(missing.items(), key=lambda kv: min(kv[1])):
        lines.append(f"{ranks_text(ranks_without)}: {why}")
    return lines, sorted(late)


def _group_lines(gid: str, states: dict[int, GroupState], absent: list[int],
                 unknown: list[int]) -> tuple[list[str], list[int]]:
    """The lines of one group and the ranks behind in it. ``absent``: ranks whose dump has no record of the group
    (in the default group, of which every rank is a member: no collective yet; in another, perhaps no member)."""
    top = max(s.enqueued for s in states.values())
    if top <= 0 or all(s.completed >= top for s in states.values()):
        return [], []  # nothing outstanding in this group
    name = next(iter(states.values())).name
    if gid == DEFAULT_GROUP:
        states.update({rank: GroupState(name, 0, 0) for rank in absent})
        absent = []
    inside = sorted(r for r, s in states.items() if s.enqueued == top)
    behind = sorted(r for r, s in states.items() if s.enqueued < top)
    first = states[inside[0]]
    lines = []
    calls: dict[tuple[str, str], list[int]] = {}
    for rank in inside:
        calls.setdefault(states[rank].ops.get(top, ("?", "?")), []).append(rank)
    if len(calls) > 1:  # the same number, different collectives: the ranks do not run the same program
        said = "; ".join(f"{ranks_text(rs)} called {op}{'' if sizes == '?' else ' ' + sizes}"
                         for (op, sizes), rs in sorted(calls.items(), key=lambda kv: -len(kv[1])))
        lines.append(f"{name}: collective #{top} differs between ranks (a desync): {said}   <- the code paths "
                     "differ")
        return lines, []
    if not behind and (unknown or absent):
        unsure = ([f"{ranks_text(unknown)} gave no flight recorder dump"] if unknown else []) + (
            [f"{ranks_text(absent)} {'has' if len(absent) == 1 else 'have'} no record of this group (not in it, "
             "or no collective in it yet)"] if absent else [])
        lines.append(f"{name}: {ranks_text(inside)} {_wait(inside)} in {first.op(top)}; {'; '.join(unsure)}, so "
                     "whether they called it is unknown")
        return lines, []
    if not behind:
        lines.append(f"{name}: every rank is in {first.op(top)} and it does not complete: no rank is missing "
                     "from it; suspect the network or one rank's device")
        return lines, []
    line = f"{name}: {ranks_text(inside)} {_wait(inside)} in {first.op(top)}; "
    by_place: dict[int, list[int]] = {}
    for rank in behind:
        by_place.setdefault(states[rank].enqueued, []).append(rank)
    parts = []
    for seq, ranks in sorted(by_place.items(), reverse=True):
        last = states[ranks[0]].op(seq) if seq > 0 else "none"
        parts.append(f"{ranks_text(ranks)} never called it (last collective: {last})")
    lines.append(line + "; ".join(parts) + "   <- the one" + ("s" if len(behind) > 1 else "") + " to look at")
    return lines, behind


def _wait(ranks: list[int]) -> str:
    return "waits" if len(ranks) == 1 else "wait"
