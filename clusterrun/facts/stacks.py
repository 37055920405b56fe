"""Stacks of hung ranks: py-spy's and faulthandler's dumps parsed, and a digest that names the odd ones out.

Each rank's dump is read as threads of frames, innermost first. A rank is *where* its main thread is:
the function it is in and the place in the user's script that led there, e.g. ``all_reduce (train.py:41)``
or ``stuck_here (train.py:12)``. The digest groups ranks by where they are; when most ranks wait in one
place, the others are the odd ones out, the usual cause of a hang (one rank stuck or off on another path
while the rest wait for it in a collective).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from clusterrun.inventory.hostlist import compress_numbers

_PYSPY_THREAD = re.compile(r'^Thread (?:0x)?[0-9a-fA-F]+ \((?:[^)]*)\)(?:: "(?P<name>[^"]*)")?\s*$')
_PYSPY_FRAME = re.compile(r"^\s+(?P<func>.+?) \((?P<file>[^():]+):(?P<line>\d+)\)\s*$")
_FH_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+(?: \[(?P<name>[^\]]*)\])? \(most recent call first\):")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>.+?)\s*$')
_LIBRARY = ("site-packages/", "dist-packages/", "/lib/python3", "<frozen", "runpy.py", "threading.py")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    def short(self) -> str:
        return f"{self.function} ({posixpath.basename(self.file)}:{self.line})"


@dataclass(frozen=True)
class ThreadStack:
    name: str
    frames: tuple[Frame, ...]  # innermost first


def parse(text: str) -> list[ThreadStack]:
    """The threads of a py-spy ``dump`` or a faulthandler dump (both formats are recognised line by line)."""
    threads: list[ThreadStack] = []
    name: str | None = None
    frames: list[Frame] = []

    def close() -> None:
        if name is not None:
            threads.append(ThreadStack(name, tuple(frames)))

    for line in text.splitlines():
        head = _PYSPY_THREAD.match(line) or _FH_THREAD.match(line)
        if head:
            close()
            name, frames = head.group("name") or line.split(" (")[0], []
            continue
        m = _PYSPY_FRAME.match(line) or _FH_FRAME.match(line)
        if m and name is not None:
            frames.append(Frame(m.group("func"), m.group("file"), int(m.group("line"))))
    close()
    return threads


def _is_library(frame: Frame) -> bool:
    return any(mark in frame.file for mark in _LIBRARY) or frame.file.startswith(("torch/", "numpy/"))


def main_thread(threads: Iterable[ThreadStack]) -> ThreadStack | None:
    """The thread that runs the script: it ends in ``<module>`` (else the one py-spy calls MainThread, else
    the first)."""
    threads = list(threads)
    for t in threads:
        if t.frames and t.frames[-1].function == "<module>":
            return t
    return next((t for t in threads if t.name == "MainThread"), threads[0] if threads else None)


def where(threads: Iterable[ThreadStack]) -> str | None:
    """Where a rank is: its main thread's innermost function, and the user's code that called it."""
    main = main_thread(threads)
    if main is None or not main.frames:
        return None
    inner = main.frames[0]
    user = next((f for f in main.frames if not _is_library(f)), None)
    if user is None or user == inner:
        return inner.short()
    return f"{inner.function} ({posixpath.basename(user.file)}:{user.line})"


def ranks_text(ranks: Iterable[int]) -> str:
    """``rank 3`` or ``ranks 0-2,5``."""
    ordered = sorted(set(ranks))
    return f"rank {ordered[0]}" if len(ordered) == 1 else f"ranks {compress_numbers(ordered)}"


def _places(dumps: Mapping[int, str]) -> tuple[list[tuple[str, list[int]]], list[int], int]:
    """The places ranks are in (most ranks first), the ranks whose stack could not be read, and how many ranks the
    one place that holds most of them holds (0 when no single place does)."""
    places: dict[str, list[int]] = {}
    unread: list[int] = []
    for rank, text in dumps.items():
        spot = where(parse(text))
        if spot is None:
            unread.append(rank)
        else:
            places.setdefault(spot, []).append(rank)
    groups = sorted(places.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    top = len(groups[0][1]) if groups else 0
    clear_majority = len(groups) > 1 and sum(len(g) == top for _, g in groups) == 1
    return groups, unread, top if clear_majority else 0


def odd_ones(dumps: Mapping[int, str]) -> list[int]:
    """The ranks that are not where most ranks are (none when no one place holds most ranks)."""
    groups, _unread, top = _places(dumps)
    return sorted(r for _, ranks in groups if len(ranks) < top for r in ranks)


def digest(dumps: Mapping[int, str]) -> list[str]:
    """One line per place, most ranks first; the places fewer ranks are in than the most common one are marked
    as the odd ones out (only when one place holds most ranks). Ranks whose dump could not be read are named."""
    groups, unread, top = _places(dumps)
    lines = []
    for spot, ranks in groups:
        odd = len(ranks) < top
        lines.append(f"{ranks_text(ranks)} in {spot}" + ("   <- the odd one out" if odd else ""))
    if unread:
        lines.append(f"{ranks_text(unread)}: no stack could be read")
    return lines
