"""Findings told once: the same problem on several nodes or pairs becomes one line that lists them.

Two findings are the same problem when they come from the same check with the same verdict and say the
same thing apart from the node names in them (one name: a node; two, as in ``a -> b``: a pair) and the
numbers they measured: ``crn3: open-files limit is 1024 (ulimit -n), below 65536`` on eight nodes reads

    crn[0-7] (8 nodes): open-files limit is 1024 (ulimit -n), below 65536

and 24 transfers each under half the line rate read ``crn0->crn[5-7], crn1->crn[2,4,6], ... (24 pairs):
3.90-4.01 Gbit/s, under half the listed 10.00 Gbit/s`` (the lowest and highest value measured). Hints must be the same too (node names in them may differ), so the
hint is told once. Anything else (a varying NIC name, a different address) keeps findings apart. Pure:
the report keeps every finding; this only decides how they are told.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from clusterrun.doctor.model import Finding, Verdict
from clusterrun.inventory.hostlist import compress_hostlist

#: A node list longer than this is cut to its first names and a count.
MAX_LIST_CHARS = 60
# A number on its own (not part of a name, an address or a version): "1024", "4.12", the "24" of "/24".
_NUMBER = r"(?<![\w.])\d+(?:\.\d+)?(?!\w|\.\d)"
# What may stand between the two names of a pair: "a -> b", "a <-> b", "a and b".
_PAIR_SEPARATOR = re.compile(r"\s*(?:->|<->|<-|and|to)\s*")

_Template = tuple[str | int, ...]  # literal text, or 0 where a node name stood and 1 where a number did


@dataclass(frozen=True)
class Folded:
    """One problem as doctor tells it: ``summary`` (the nodes or pairs written compactly in it) and ``hint``,
    for every finding in ``findings`` (one, or several that say the same)."""

    check: str
    verdict: Verdict
    summary: str
    hint: str | None
    findings: tuple[Finding, ...]

    @property
    def folded(self) -> bool:
        return len(self.findings) > 1


@dataclass(frozen=True)
class _Split:
    template: _Template
    names: tuple[str, ...]
    numbers: tuple[str, ...]


def fold(findings: Sequence[Finding], nodes: Sequence[str]) -> list[Folded]:
    """``findings`` folded, failures first, then in the order the first of each was found.

    ``nodes`` are the report's node names in inventory order: the names looked for in the text, and the
    order the folded lists are written in.
    """
    names = _names_pattern(nodes)
    order = {name: i for i, name in enumerate(nodes)}
    groups: dict[tuple[object, ...], list[tuple[Finding, _Split, _Split | None]]] = {}
    for f in findings:
        summary = _split(f.summary, names, numbers=True)
        hint = _split(f.hint, names, numbers=False) if f.hint else None
        key = (f.check, f.verdict, summary.template, hint.template if hint else None)
        groups.setdefault(key, []).append((f, summary, hint))
    out: list[Folded] = []
    for members in groups.values():
        out += _tell(members, order)
    return sorted(out, key=lambda g: -g.verdict.severity)  # stable: within a verdict, report order


def _names_pattern(nodes: Sequence[str]) -> re.Pattern[str] | None:
    if not nodes:
        return None
    alternatives = "|".join(re.escape(n) for n in sorted(set(nodes), key=len, reverse=True))
    # A name stands alone: not inside a longer name ("crn1" in "crn10", "n1" in "gpun1.ib").
    return re.compile(rf"(?<![\w.-])(?P<name>{alternatives})(?![\w-])|(?P<number>{_NUMBER})")


def _split(text: str, names: re.Pattern[str] | None, *, numbers: bool) -> _Split:
    pattern = names or re.compile(rf"(?P<name>(?!))|(?P<number>{_NUMBER})")
    template: list[str | int] = []
    found_names: list[str] = []
    found_numbers: list[str] = []
    at = 0
    for match in pattern.finditer(text):
        if match["number"] is not None and not numbers:
            continue
        template.append(text[at:match.start()])
        if match["name"] is not None:
            template.append(0)
            found_names.append(match["name"])
        else:
            template.append(1)
            found_numbers.append(match["number"])
        at = match.end()
    template.append(text[at:])
    return _Split(tuple(template), tuple(found_names), tuple(found_numbers))


def _single(f: Finding) -> Folded:
    return Folded(f.check, f.verdict, f.summary, f.hint, (f,))


def _tell(members: list[tuple[Finding, _Split, _Split | None]], order: dict[str, int]) -> list[Folded]:
    """One :class:`Folded` for ``members`` (same check, verdict and templates), or one each when the names
    that differ between them are neither a node nor a pair."""
    first, template = members[0][0], members[0][1].template
    if len(members) == 1:
        return [_single(first)]
    slots = list(zip(*(s.names for _, s, _ in members), strict=True))
    varying = [i for i, slot in enumerate(slots) if len(set(slot)) > 1]
    name_at = [i for i, part in enumerate(template) if part == 0]  # template index of each name slot
    replace: dict[int, str] = {}  # template index -> what stands there instead
    if varying and all(len({s.names[i] for i in varying}) == 1 for _, s, _ in members):
        # One node per finding, named once or more ("crn1: ... on crn1"): the list, counted where first named.
        nodes = [s.names[varying[0]] for _, s, _ in members]
        for k, i in enumerate(varying):
            replace[name_at[i]] = _nodes_text(nodes, order, count=k == 0)
    elif len(varying) == 2 and name_at[varying[1]] == name_at[varying[0]] + 2 and \
            _PAIR_SEPARATOR.fullmatch(str(template[name_at[varying[0]] + 1])):  # "a -> b": nothing else between
        a, b = name_at[varying[0]], name_at[varying[1]]
        pairs = [(s.names[varying[0]], s.names[varying[1]]) for _, s, _ in members]
        replace.update({a: _pairs_text(pairs, str(template[a + 1]).strip(), order), a + 1: "", b: ""})
    elif varying:
        return [_single(f) for f, _, _ in members]
    summary = _render(template, [s for _, s, _ in members], replace)
    if not varying and all(s.numbers == members[0][1].numbers for _, s, _ in members):
        summary += f" ({len(members)} times)"  # the very same line more than once
    hints = [h for _, _, h in members if h is not None]
    hint = _render_hint(hints, order) if hints else None
    return [Folded(first.check, first.verdict, summary, hint, tuple(f for f, _, _ in members))]


def _render(template: _Template, splits: list[_Split], replace: dict[int, str]) -> str:
    """The shared text: ``replace`` where it says (the varying names), other names as they were, each number
    as it was or as the range it took."""
    out: list[str] = []
    name_i = number_i = 0
    for i, part in enumerate(template):
        if i in replace:
            out.append(replace[i])
        elif part == 0:
            out.append(splits[0].names[name_i])
        elif part == 1:
            out.append(_range([s.numbers[number_i] for s in splits]))
        else:
            out.append(str(part))
        name_i += part == 0
        number_i += part == 1
    return "".join(out)


def _render_hint(splits: list[_Split], order: dict[str, int]) -> str:
    """A hint told once: a node name that differs between the findings becomes their list (no count)."""
    out: list[str] = []
    name_i = 0
    for part in splits[0].template:
        if part == 0:
            names = [s.names[name_i] for s in splits]
            out.append(names[0] if len(set(names)) == 1 else _nodes_text(names, order, count=False))
            name_i += 1
        else:
            out.append(str(part))
    return "".join(out)


def _range(values: list[str]) -> str:
    if len(set(values)) == 1:
        return values[0]
    low = min(values, key=float)
    high = max(values, key=float)
    return f"{low}-{high}"


def _nodes_text(names: list[str], order: dict[str, int], *, count: bool) -> str:
    """``crn[0-7] (8 nodes)``, or ``12 nodes: a, b, c, ...`` when no short hostlist writes them."""
    unique = sorted(set(names), key=lambda n: (order.get(n, len(order)), n))
    try:
        compact = compress_hostlist(unique)
    except ValueError:  # a name no hostlist can hold (odd characters): list them plainly
        compact = ", ".join(unique)
    if len(compact) > MAX_LIST_CHARS:
        shown: list[str] = []
        for name in unique:
            if len(", ".join([*shown, name])) > MAX_LIST_CHARS - 5:
                break
            shown.append(name)
        return f"{len(unique)} nodes: {', '.join(shown)}, ..."
    return f"{compact} ({len(unique)} nodes)" if count else compact


def _pairs_text(pairs: list[tuple[str, str]], separator: str, order: dict[str, int]) -> str:
    """``crn0->crn[1-3], crn1->crn[0,2-3] (12 pairs)``; ``every pair of crn[0-3] (12 pairs)`` when it is."""
    unique = list(dict.fromkeys(pairs))
    members = sorted({n for pair in unique for n in pair}, key=lambda n: (order.get(n, len(order)), n))
    joiner = f" {separator} " if separator.isalpha() else separator
    if len(unique) == len(members) * (len(members) - 1) and len(members) > 2:
        return f"every pair of {_nodes_text(members, order, count=False)} ({len(unique)} pairs)"
    by_source: dict[str, list[str]] = {}
    for src, dst in unique:
        by_source.setdefault(src, []).append(dst)
    entries = [f"{src}{joiner}{_nodes_text(dsts, order, count=False)}"
               for src, dsts in sorted(by_source.items(), key=lambda kv: order.get(kv[0], len(order)))]
    text = ", ".join(entries)
    if len(text) > MAX_LIST_CHARS:
        shown: list[str] = []
        for entry in entries:
            if shown and len(", ".join([*shown, entry])) > MAX_LIST_CHARS - 5:
                break
            shown.append(entry)
        text = ", ".join(shown) + ", ..."
    return f"{text} ({len(unique)} pairs)"
