"""Slurm hostlist expressions: ``gpu[01-04,07]`` <-> ``gpu01 gpu02 gpu03 gpu04 gpu07``.

:func:`expand_hostlist` follows ``scontrol show hostnames``:

* names are separated by commas or whitespace; commas inside ``[...]`` separate
  ranges, not names: ``a,b[1-3],c`` -> ``a b1 b2 b3 c``;
* a range keeps the zero padding of its lower bound, each range on its own:
  ``n[08-11]`` -> ``n08 .. n11``, ``n[9-11]`` -> ``n9 n10 n11``, ``n[005,4]`` -> ``n005 n4``;
* several bracket groups expand as a cartesian product, the leftmost group
  varying slowest: ``rack[1-2]-n[1-2]`` -> ``rack1-n1 rack1-n2 rack2-n1 rack2-n2``;
* order and duplicates are kept as written (``scontrol`` does not sort either).

It is stricter than Slurm where Slurm quietly guesses: an unmatched ``[`` or ``]``,
a range with a missing bound (Slurm reads ``n[5-]`` as ``n5``) and empty names
between commas are errors here. Like Slurm, nothing may follow the last ``]``
(``n[1-2]-ib`` is rejected) and ranges have no stride.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass

from clusterrun.errors import UsageError

#: Most hosts one expression may expand to; protects against typos like ``n[1-1000000]``.
MAX_HOSTS = 65536

_RANGE_RE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_HALF_RANGE_RE = re.compile(r"[0-9]*-[0-9]*")
_TRAILING_DIGITS_RE = re.compile(r"^(.*?)([0-9]+)$", re.DOTALL)
_SEPARATORS = frozenset(", \t\n\r")


@dataclass(frozen=True)
class _Range:
    lo: int
    hi: int
    width: int  # zero-pad every number to this many digits (the lower bound as written)

    @property
    def count(self) -> int:
        return self.hi - self.lo + 1

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
    of the problem: empty expression or empty name, unbalanced or nested brackets, text
    after the last ``]``, an empty, non-numeric or reversed range, or an expansion to
    more than :data:`MAX_HOSTS` hosts.
    """
    tokens = _split_names(expr, flag)
    parsed = [(start, _parse_name(expr, start, token, flag)) for start, token in tokens]
    total = 0
    for start, parts in parsed:
        count = 1
        for part in parts:
            if not isinstance(part, str):
                count *= sum(r.count for r in part)
        total += count
        if total > MAX_HOSTS:
            raise _error(
                flag, expr, start,
                f"expands to more than {MAX_HOSTS} hosts",
                "check the range bounds for a typo",
            )
    hosts: list[str] = []
    for _, parts in parsed:
        choices = [(part,) if isinstance(part, str) else _group_names(part) for part in parts]
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


def compress_hostlist(names: list[str]) -> str:
    """Write host names as a compact Slurm hostlist, for display.

    Order is kept (like ``scontrol show hostlist``, not ``hostlistsorted``), so
    ``expand_hostlist(compress_hostlist(names)) == names``. Neighbouring names that share
    a prefix and end in digits share one bracket group; consecutive numbers become a
    range: ``['n1', 'n2', 'n3', 'n5', 'login']`` -> ``'n[1-3,5],login'``.

    Returns ``''`` for an empty list.
    Raises :class:`ValueError` if a name is empty or holds ``[``, ``]``, ``,`` or
    whitespace, which no hostlist can express.
    """
    out: list[str] = []
    prefix: str | None = None
    ranges: list[list[int]] = []  # [lo, hi, width] for the current prefix

    def flush() -> None:
        if prefix is None:
            return
        if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            lo, _, width = ranges[0]
            out.append(f"{prefix}{str(lo).zfill(width)}")
            return
        body = ",".join(
            str(lo).zfill(w) if lo == hi else f"{str(lo).zfill(w)}-{str(hi).zfill(w)}" for lo, hi, w in ranges
        )
        out.append(f"{prefix}[{body}]")

    for name in names:
        if not name or any(ch in "[]" or ch in _SEPARATORS or ch.isspace() for ch in name):
            raise ValueError(f"cannot write {name!r} in a hostlist: names must be non-empty, without '[', ']', "
                             "',' or whitespace")
        m = _TRAILING_DIGITS_RE.match(name)
        if m is None:
            flush()
            prefix, ranges = None, []
            out.append(name)
            continue
        head, digits = m.group(1), m.group(2)
        number = int(digits)
        if head == prefix:
            last = ranges[-1]
            # Extend the last range only if expanding it would spell this name exactly
            # (n9 -> n10 joins, n08 -> n9 does not: the range would print n09).
            if number == last[1] + 1 and str(number).zfill(last[2]) == digits:
                last[1] = number
            else:
                ranges.append([number, number, len(digits)])
            continue
        flush()
        prefix, ranges = head, [[number, number, len(digits)]]
    flush()
    return ",".join(out)


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
        raise UsageError(f"{flag}: empty hostlist {expr!r}; give hosts like gpu[01-04,07] or a,b,c")
    return tokens


def _parse_name(expr: str, start: int, token: str, flag: str) -> list[_Part]:
    """Turn ``rack[1-2]-n[01-04]`` into ``['rack', (1-2,), '-n', (01-04,)]``; brackets are balanced."""
    parts: list[_Part] = []
    pos = 0
    while (open_ := token.find("[", pos)) != -1:
        close = token.index("]", open_)
        if token[pos:open_]:
            parts.append(token[pos:open_])
        parts.append(_parse_ranges(expr, start + open_ + 1, token[open_ + 1:close], flag))
        pos = close + 1
    if pos < len(token):
        if parts:
            # Slurm refuses text after the last bracket group too; say so rather than guess.
            raise _error(flag, expr, start + pos, f"text {token[pos:]!r} after the last ']'",
                         "Slurm allows nothing after the last bracket group; list such names in full")
        parts.append(token[pos:])
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
                raise _error(flag, expr, offset, f"range {item!r} is missing a bound", "write both, like 1-4")
            raise _error(flag, expr, offset, f"non-numeric range {item!r}",
                         "use decimal numbers like 01-04 (no letters, signs, spaces or strides)")
        lo_text, hi_text = m.group(1), m.group(2)
        lo = int(lo_text)
        hi = lo if hi_text is None else int(hi_text)
        if lo > hi:
            raise _error(flag, expr, offset, f"reversed range {item!r}", f"write it as {hi_text}-{lo_text}")
        ranges.append(_Range(lo, hi, len(lo_text)))
        offset += len(item) + 1
    return tuple(ranges)


def _group_names(group: tuple[_Range, ...]) -> tuple[str, ...]:
    return tuple(itertools.chain.from_iterable(r.names() for r in group))


def _error(flag: str, expr: str, index: int, what: str, fix: str) -> UsageError:
    return UsageError(f"{flag}: invalid hostlist {expr!r}: {what} at position {index + 1}; {fix}")
