"""Slurm hostlist expressions: ``gpu[01-04,07]`` <-> ``gpu01 gpu02 gpu03 gpu04 gpu07``.

:func:`expand_hostlist` follows ``scontrol show hostnames`` (Slurm 23.02.5 and later):

* names are separated by commas or whitespace; commas inside ``[...]`` separate
  ranges, not names: ``a,b[1-3],c`` -> ``a b1 b2 b3 c``;
* a range keeps the zero padding of its lower bound, each range on its own:
  ``n[08-11]`` -> ``n08 .. n11``, ``n[9-11]`` -> ``n9 n10 n11``, ``n[005,4]`` -> ``n005 n4``;
* text after the last bracket group is a suffix shared by every name:
  ``gpu[01-02]-ib`` -> ``gpu01-ib gpu02-ib``, ``node[1-2].cluster.local`` ->
  ``node1.cluster.local node2.cluster.local``;
* several bracket groups give every combination, in Slurm's order: the last group varies
  fastest, then the first, the second and so on, the one before the last slowest. With
  two groups that is reading order, ``rack[1-2]-n[1-2]`` -> ``rack1-n1 rack1-n2 rack2-n1
  rack2-n2``; with three it is not, ``a[1-2]b[1-2]c[1-2]`` -> ``a1b1c1 a1b1c2 a2b1c1
  a2b1c2 a1b2c1 ...`` (Slurm expands the groups before the last one from right to left);
* order and duplicates are kept as written (``scontrol`` does not sort either).

It is stricter than Slurm where Slurm quietly guesses: an unmatched ``[`` or ``]``
(Slurm reads ``n[1-2]]`` as ``n1] n2]``), a range with a missing bound (Slurm reads
``n[5-]`` as ``n5``), a sign or space in a range (Slurm reads ``n[+1]`` as ``n01``) and
empty names between commas are errors here. Ranges have no stride, as in Slurm.
Slurm before 23.02.5 refuses a suffix after the last group; clusterrun always reads it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from clusterrun.errors import UsageError
from clusterrun.inventory.hostspec import MAX_HOST_LENGTH

#: Most hosts one expression may expand to (Slurm refuses a range of more than 64K too); the
#: count is checked before any name is made, so a typo like ``n[1-100000000]`` costs no memory.
MAX_HOSTS = 65536
#: Most significant digits in one number: Slurm's numbers are 64-bit (``unsigned long``).
MAX_DIGITS = 18

_RANGE_RE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_HALF_RANGE_RE = re.compile(r"[0-9]*-[0-9]*")
# A name's last run of digits with the text before and after it: 'rack1-n', '12', '-ib'.
_LAST_NUMBER_RE = re.compile(r"(.*?)([0-9]+)([^0-9]*)", re.DOTALL)
_SEPARATORS = frozenset(", \t\n\r")
_HUGE = 10**MAX_DIGITS


@dataclass(frozen=True)
class _Range:
    lo: int
    hi: int
    width: int  # zero-pad every number to this many digits (the lower bound as written)

    @property
    def count(self) -> int:
        return self.hi - self.lo + 1

    @property
    def longest(self) -> int:
        """Characters in the longest number this range makes."""
        return max(self.width, len(str(self.hi)))

    def names(self) -> Iterator[str]:
        return (str(n).zfill(self.width) for n in range(self.lo, self.hi + 1))


# A parsed name: literal text and bracket groups (each a tuple of ranges), in order.
_Part = str | tuple[_Range, ...]


def expand_hostlist(expr: str, flag: str = "--slurm") -> list[str]:
    """Expand a Slurm hostlist expression into host names, in Slurm's order.

    ``flag`` names where the expression came from (a flag or ``SLURM_JOB_NODELIST``)
    in error messages.

    Returns the host names, duplicates included, in the order written.
    Raises :class:`UsageError` naming ``flag``, the expression and the 1-based position
    of the problem: empty expression or empty name, unbalanced or nested brackets, an
    empty, non-numeric or reversed range, a number of more than :data:`MAX_DIGITS` digits,
    an expansion to more than :data:`MAX_HOSTS` hosts or to names longer than
    :data:`~clusterrun.inventory.hostspec.MAX_HOST_LENGTH` (both checked before any name
    is made, so no input can make this use much memory).
    """
    tokens = _split_names(expr, flag)
    parsed = [(start, _parse_name(expr, start, token, flag)) for start, token in tokens]
    counts = [_count(parts) for _, parts in parsed]
    total = sum(counts)
    if total > MAX_HOSTS:
        # Point at the name that crosses the limit: usually the one with the typo.
        crossing = next(i for i, running in enumerate(itertools.accumulate(counts)) if running > MAX_HOSTS)
        shown = str(total) if total < _HUGE else f"over 10^{MAX_DIGITS}"
        raise _error(
            flag, expr, parsed[crossing][0],
            f"expands to {shown} hosts, more than {MAX_HOSTS} hosts (the limit), from the name",
            "check the range bounds for a typo",
        )
    for start, parts in parsed:
        longest = sum(len(part) if isinstance(part, str) else max(r.longest for r in part) for part in parts)
        if longest > MAX_HOST_LENGTH:
            raise _error(flag, expr, start,
                         f"makes names of {longest} characters, more than the {MAX_HOST_LENGTH} a host name may have",
                         "check for a missing comma or a padded number")
    hosts: list[str] = []
    for _, parts in parsed:
        hosts.extend(_expand_name(parts))
    return hosts


def _count(parts: list[_Part]) -> int:
    """How many names one parsed token stands for, or :data:`_HUGE` when at least that many."""
    count = 1
    for part in parts:
        if not isinstance(part, str):
            # Capped as it goes, so a name with thousands of groups stays cheap to count.
            count = min(count * sum(r.count for r in part), _HUGE)
    return count


def _expand_name(parts: list[_Part]) -> Iterator[str]:
    """Every name one parsed token stands for, in the order ``scontrol show hostnames`` prints them."""
    groups = [(i, part) for i, part in enumerate(parts) if not isinstance(part, str)]
    # Slurm takes the last group as the range and expands the rest of the name as a prefix,
    # its own last group first and recursing leftwards: so the last group varies fastest,
    # then the first, second, ..., and the one before the last slowest.
    order = groups[:-1][::-1] + groups[-1:]
    texts = [part if isinstance(part, str) else "" for part in parts]
    for combo in itertools.product(*(_group_names(group) for _, group in order)):
        for (i, _), text in zip(order, combo, strict=True):
            texts[i] = text
        yield "".join(texts)


def compress_hostlist(names: list[str]) -> str:
    """Write host names as a compact Slurm hostlist, for display.

    Order is kept (like ``scontrol show hostlist``, not ``hostlistsorted``), so
    ``expand_hostlist(compress_hostlist(names)) == names``. Neighbouring names that differ
    only in their last number share one bracket group, with the text after that number
    as a suffix; consecutive numbers become a range:
    ``['n1', 'n2', 'n3', 'n5', 'login']`` -> ``'n[1-3,5],login'``,
    ``['gpu01-ib', 'gpu02-ib']`` -> ``'gpu[01-02]-ib'``.

    Returns ``''`` for an empty list.
    Raises :class:`ValueError` if a name is empty or holds ``[``, ``]``, ``,`` or
    whitespace, which no hostlist can express.
    """
    out: list[str] = []
    key: tuple[str, str] | None = None  # (text before, text after) the last number of the current group
    ranges: list[list[int]] = []  # [lo, hi, width] for the current group

    def flush() -> None:
        if key is None:
            return
        head, tail = key
        if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            lo, _, width = ranges[0]
            out.append(f"{head}{str(lo).zfill(width)}{tail}")
            return
        body = ",".join(
            str(lo).zfill(w) if lo == hi else f"{str(lo).zfill(w)}-{str(hi).zfill(w)}" for lo, hi, w in ranges
        )
        out.append(f"{head}[{body}]{tail}")

    for name in names:
        if not name or any(ch in "[]" or ch in _SEPARATORS or ch.isspace() for ch in name):
            raise ValueError(f"cannot write {_quoted(name)} in a hostlist: names must be non-empty, without '[', ']', "
                             "',' or whitespace")
        m = _LAST_NUMBER_RE.fullmatch(name)
        if m is None:
            flush()
            key, ranges = None, []
            out.append(name)
            continue
        head, digits, tail = m.groups()
        number = int(digits)
        if (head, tail) == key:
            last = ranges[-1]
            # Extend the last range only if expanding it would spell this name exactly
            # (n9 -> n10 joins, n08 -> n9 does not: the range would print n09).
            if number == last[1] + 1 and str(number).zfill(last[2]) == digits:
                last[1] = number
            else:
                ranges.append([number, number, len(digits)])
            continue
        flush()
        key, ranges = (head, tail), [[number, number, len(digits)]]
    flush()
    return ",".join(out)


def compress_numbers(values: Iterable[int]) -> str:
    """Numbers as sorted ranges, for display: ``[0, 1, 2, 5, 2]`` -> ``'0-2,5'`` (``''`` for none)."""
    parts: list[str] = []
    for value in sorted(set(values)):
        if parts and value == int(parts[-1].rsplit("-", 1)[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{value}"
        else:
            parts.append(str(value))
    return ",".join(parts)


def short_hostlist(names: list[str], limit: int) -> str:
    """Host names as :func:`compress_hostlist` writes them, for display in at most about ``limit``
    characters: a list that does not fit is cut between names and ends with a count,
    ``alpha,beta,…(64 nodes)``, ``w[0,2,4,…](256 nodes)``. A name no hostlist can hold is shown as it is."""
    try:
        pieces = _top_level(compress_hostlist(names))
    except ValueError:
        pieces = list(names)
    text = ",".join(pieces)
    if len(text) <= limit:
        return text
    kept = _fitting(pieces, limit)
    if len(kept[0]) > limit and "[" in kept[0]:  # one group too long: cut inside its brackets
        head, _, rest = kept[0].partition("[")
        body, _, tail = rest.partition("]")
        ranges = _fitting(body.split(","), limit - len(head) - len(tail) - 3)
        return f"{head}[{','.join(ranges)},…]{tail}({len(names)} nodes)"
    return ",".join(kept) + f",…({len(names)} nodes)"


def short_numbers(values: list[int], limit: int, noun: str) -> str:
    """Numbers as :func:`compress_numbers` writes them, for display in at most about ``limit``
    characters: ``0,2,4,…(256 ranks)`` (``noun``: what they count)."""
    text = compress_numbers(values)
    if len(text) <= limit:
        return text
    return ",".join(_fitting(text.split(","), limit)) + f",…({len(set(values))} {noun})"


def _fitting(pieces: list[str], limit: int) -> list[str]:
    """The first of ``pieces`` that fit in ``limit`` characters joined with commas (at least one)."""
    kept: list[str] = []
    size = -1
    for piece in pieces:
        size += len(piece) + 1
        if kept and size > limit:
            break
        kept.append(piece)
    return kept


def _top_level(hostlist: str) -> list[str]:
    """``a[1-2,4],b`` -> ``['a[1-2,4]', 'b']``: split at the commas outside brackets."""
    pieces, depth, start = [], 0, 0
    for i, ch in enumerate(hostlist):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            pieces.append(hostlist[start:i])
            start = i + 1
    pieces.append(hostlist[start:])
    return pieces


def _split_names(expr: str, flag: str) -> list[tuple[int, str]]:
    """Split at commas and whitespace outside brackets; return (start offset, name) pairs."""
    tokens: list[tuple[int, str]] = []
    start: int | None = None
    open_at: int | None = None
    comma_pending = False  # a comma was seen and no name has followed it yet
    for i, ch in enumerate(expr):
        if open_at is None and (ch in _SEPARATORS or ch.isspace()):
            if start is not None:
                tokens.append((start, expr[start:i]))
                start = None
            if ch == ",":
                if comma_pending or not tokens:
                    raise _error(flag, expr, i, "empty host name before ','", "separate names with one comma")
                comma_pending = True
            continue
        if start is None:
            start, comma_pending = i, False
        if ch == "[":
            if open_at is not None:
                raise _error(flag, expr, i, "nested '['", f"close the '[' at position {open_at + 1} first")
            open_at = i
        elif ch == "]":
            if open_at is None:
                raise _error(flag, expr, i, "']' without a matching '['", "add the '[' or remove the ']'")
            open_at = None
    if open_at is not None:
        raise _error(flag, expr, open_at, "'[' is never closed", "add the matching ']'")
    if start is not None:
        tokens.append((start, expr[start:]))
    elif comma_pending:
        raise _error(flag, expr, len(expr) - 1, "empty host name after ','", "remove the trailing comma")
    if not tokens:
        raise UsageError(f"{flag}: empty hostlist {_quoted(expr)}; give hosts like gpu[01-04,07] or a,b,c")
    return tokens


def _parse_name(expr: str, start: int, token: str, flag: str) -> list[_Part]:
    """Turn ``rack[1-2]-n[01-04]-ib`` into ``['rack', (1-2,), '-n', (01-04,), '-ib']``; brackets are balanced."""
    parts: list[_Part] = []
    pos = 0
    while (open_ := token.find("[", pos)) != -1:
        close = token.index("]", open_)
        if token[pos:open_]:
            parts.append(token[pos:open_])
        parts.append(_parse_ranges(expr, start + open_ + 1, token[open_ + 1:close], flag))
        pos = close + 1
    if pos < len(token):
        parts.append(token[pos:])  # a suffix shared by every name (gpu[01-04]-ib), or a plain name
    return parts


def _parse_ranges(expr: str, start: int, body: str, flag: str) -> tuple[_Range, ...]:
    """Parse ``01-04,07`` (the text between brackets, starting at offset ``start`` of ``expr``)."""
    ranges: list[_Range] = []
    offset = start
    for item in body.split(","):
        if not item:
            raise _error(flag, expr, offset, "empty range", "write a number or a range like 1-4 between commas")
        m = _RANGE_RE.fullmatch(item)
        if m is None:
            if _HALF_RANGE_RE.fullmatch(item):
                raise _error(flag, expr, offset, f"range {_quoted(item)} is missing a bound", "write both, like 1-4")
            raise _error(flag, expr, offset, f"non-numeric range {_quoted(item)}",
                         "use decimal numbers like 01-04 (no letters, signs, spaces or strides)")
        lo_text, hi_text = m.group(1), m.group(2)
        # Checked before int(): Python refuses to convert thousands of digits, and no host
        # is numbered beyond what Slurm can count.
        if any(len(text.lstrip("0")) > MAX_DIGITS for text in (lo_text, hi_text or "")):
            raise _error(flag, expr, offset, f"number in {_quoted(item)} has more than {MAX_DIGITS} digits",
                         "check the range for a typo")
        lo = int(lo_text.lstrip("0") or "0")  # leading zeros are padding: Python refuses 4300+ digits
        hi = lo if hi_text is None else int(hi_text.lstrip("0") or "0")
        if lo > hi:
            fix = f"write it as {hi_text}-{lo_text}" if len(item) <= 40 else "swap the bounds"
            raise _error(flag, expr, offset, f"reversed range {_quoted(item)}", fix)
        ranges.append(_Range(lo, hi, len(lo_text)))
        offset += len(item) + 1
    return tuple(ranges)


def _group_names(group: tuple[_Range, ...]) -> tuple[str, ...]:
    return tuple(itertools.chain.from_iterable(r.names() for r in group))


def _quoted(text: str, limit: int = 60) -> str:
    """``repr(text)``, cut to its first ``limit`` characters with its length when longer, so
    that one absurd value still gives a one-line message."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def _error(flag: str, expr: str, index: int, what: str, fix: str) -> UsageError:
    if len(expr) <= 120:
        shown = repr(expr)
    else:  # a long SLURM_JOB_NODELIST: show the part around the problem
        lo, hi = max(0, index - 40), index + 40
        head, tail = ("..." if lo else ""), ("..." if hi < len(expr) else "")
        shown = f"{head}{expr[lo:hi]!r}{tail} ({len(expr)} characters)"
    return UsageError(f"{flag}: invalid hostlist {shown}: {what} at position {index + 1}; {fix}")
