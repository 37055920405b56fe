"""Identical lines from many ranks, shown once with their ranks: ``[crn[0-63]:0-511] UserWarning: ...``.

Every rank of a job prints the same start-up warnings and library banners; at 64 nodes x 8 that is 512
copies of each. :class:`Folder` sorts the lines the terminal is about to show into what to write:

* **The window.** While several ranks are printing (:meth:`Folder.busy`: in the first :data:`WARMUP`
  seconds of output, and whenever another rank printed in the last :data:`ACTIVE` seconds), a line waits
  :data:`HOLD` seconds for copies; the supervisor looks every 0.25 s, so no line waits more than half a
  second. Copies of it that came meanwhile are written with it, once, under all their ranks. When only
  one rank has been printing (a training loop that logs on rank 0), its lines are written at once. In a
  flood, at most :data:`MAX_HELD` lines wait: beyond that the oldest are written before their window ends.
* **Only identical lines fold**: the whole text after the ``[node:rank]`` prefix, character for
  character; a line with a rank number or a loss value inside differs and is written under its own rank.
* **Order.** A rank's lines are written in the order it printed them: a line is written only after
  every earlier line of its rank (an earlier line of a rank whose copy joins a folded line is written
  first, without waiting out its window).
* **Later copies.** A copy that comes after its line was written (nodes start seconds apart), within
  :data:`LATE` seconds, is not written again: a :class:`Note` names those ranks and the line, once no
  further copy came for :data:`NOTE_QUIET` seconds (at most :data:`NOTE_EVERY` seconds after the first)
  and at the end. Copies are matched time for time: a rank's copy stands for the first time the line was
  written that this rank has no copy of yet; when there is none (the rank prints it once more), it is a
  new line, written again. Blank lines are never noted (a note would say nothing). Written lines are
  remembered in two generations of :data:`MAX_SHOWN`, so in a flood of distinct lines a copy is found
  among the last few thousand; a line known to be printed by several ranks (written folded, or a copy
  came) is remembered apart, so that a flood of lines only one rank prints (64 ranks' training logs right
  after their shared banners) cannot push it out before its later copies come.

Pure: times come in, lines go out as :class:`Line` and :class:`Note`; the rank logs are written
elsewhere and always hold every line. Standard library only (it runs on the nodes too).
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any, NamedTuple

from clusterrun.inventory.hostlist import short_hostlist, short_numbers

HOLD = 0.2  # seconds a line waits for copies from other ranks
WARMUP = 10.0  # the first seconds of output: every rank is starting and printing the same banners
ACTIVE = 10.0  # another rank printed within this many seconds: a copy may come
LATE = 30.0  # a copy this long after its line was written is a new line
NOTE_QUIET = 1.0  # later copies are noted once none came for this long ...
NOTE_EVERY = 10.0  # ... or this long after the first of them
MAX_HELD = 16384  # lines held at most: in a flood, the oldest are written before their window ends
MAX_SHOWN = 4096  # lines remembered for later copies (two generations of this many)
MAX_TIMES = 32  # ... times one line is remembered as written, in one generation
NODES_MAX = 48  # characters of a folded line's node list before it is shortened
RANKS_MAX = 40  # ... of its rank list

Key = tuple[str, int | None]  # (node, global rank); rank None: torchrun's own line on that node


class Line(NamedTuple):
    """Write ``texts``, in order, each once under ``keys`` (one key: as without folding)."""

    keys: tuple[Key, ...]
    texts: list[str]


class Note(NamedTuple):
    """``keys`` printed ``text`` too, up to ``delay`` seconds after it was written under ``shown``."""

    keys: tuple[Key, ...]
    text: str
    shown: tuple[Key, ...]
    delay: float


class _Batch:
    """Lines one key printed at one time, held; ``next``: the first of them not written yet."""

    __slots__ = ("at", "key", "next", "texts")

    def __init__(self, key: Key, texts: list[str], at: float) -> None:
        self.key, self.texts, self.at, self.next = key, texts, at, 0


class _Copies:
    """A written line that later copies came for."""

    __slots__ = ("at", "first", "keys", "late", "late_first", "late_last")

    def __init__(self, first: tuple[Key, ...], at: float) -> None:
        self.at, self.first = at, first
        self.keys = set(first)  # written, or noted as later copies: a further line from one is a new line
        self.late: dict[Key, float] = {}  # later copies not noted yet, with when they came
        self.late_first = self.late_last = at

    def add(self, key: Key, now: float) -> bool:
        """Whether a line ``key`` printed ``now`` is a later copy of this one (counted if so)."""
        if now - self.at >= LATE or key in self.keys or key in self.late:
            return False
        if not self.late:
            self.late_first = now
        self.late[key], self.late_last = now, now
        return True


_Written = tuple[tuple[Key, ...], float]  # a written line's keys and when (shared by the lines written together)
_Record = _Written | _Copies
_Entry = _Record | list[_Record]  # a text written more than once: each time, oldest first


def _append(table: dict[str, Any], text: str, item: object, most: int = 0) -> None:
    """Add ``item`` to ``table[text]``: the item itself while it is the only one, else a list of them, oldest
    first (the oldest dropped past ``most`` when given)."""
    entry = table.get(text)
    if entry is None:
        table[text] = item
    elif isinstance(entry, list):
        entry.append(item)
        if most and len(entry) > most:
            del entry[0]
    else:
        table[text] = [entry, item]


def _copy(record: _Record, key: Key, now: float) -> _Copies | None:
    """``record`` as the written line a copy from ``key`` at ``now`` is a later copy of (counted), or None."""
    if isinstance(record, tuple):
        keys, at = record
        if now - at >= LATE or key in keys:
            return None
        record = _Copies(keys, at)
    return record if record.add(key, now) else None


class _Memory:
    """Written lines, for their later copies: two generations of at most :data:`MAX_SHOWN` texts, the older
    dropped whole when the newer is full or :data:`LATE` old (so remembering costs a few dictionary
    operations per line)."""

    __slots__ = ("older", "shown", "since")

    def __init__(self) -> None:
        self.shown: dict[str, _Entry] = {}
        self.older: dict[str, _Entry] = {}
        self.since = float("-inf")  # when ``shown`` began

    def current(self, now: float) -> dict[str, _Entry]:
        """The generation a line written ``now`` goes to."""
        if now - self.since >= LATE or len(self.shown) >= MAX_SHOWN:
            self.older, self.shown, self.since = self.shown, {}, now
        return self.shown


def _at(record: _Record) -> float:
    return record[1] if isinstance(record, tuple) else record.at


class Folder:
    """Folds the lines of many ranks (or many nodes' torchrun); used by one thread.

    Held lines are kept as the batches they came in, so that a flood of distinct lines costs a few
    dictionary operations per line; written lines are remembered in a :class:`_Memory`, for the same reason:
    one for lines only one key printed so far, one for lines several keys printed.
    """

    def __init__(self) -> None:
        self._queue: deque[_Batch] = deque()  # held batches, oldest first (written ones are skipped)
        self._held = 0  # lines held
        self._keys: dict[Key, deque[_Batch]] = {}  # per key: its held batches, in its order
        self._index: dict[str, _Batch | list[_Batch]] = {}  # per held text: its batch (one per copy held)
        self._alone = _Memory()  # written lines one key printed, for their later copies
        self._shared = _Memory()  # ... several keys printed (written folded, or a later copy came)
        self._late: dict[_Copies, str] = {}  # written lines with later copies not noted yet, and their texts
        self._start: float | None = None
        self._last: tuple[Key | None, float] = (None, float("-inf"))  # the latest line's key and time
        self._other = float("-inf")  # the latest line of a key other than the latest one

    def busy(self, key: Key, now: float) -> bool:
        """Whether a line of ``key`` coming ``now`` may get copies: it is early in the run, or another key
        printed recently."""
        if self._start is None:
            self._start = now
        last_key, last_at = self._last
        if key != last_key:
            self._other = last_at
        self._last = (key, now)
        return now - self._start < WARMUP or now - self._other < ACTIVE

    def add(self, key: Key, texts: list[str], now: float) -> list[Line | Note]:
        """Lines ``key`` printed at ``now``; returns what to write now, in order."""
        out = self.due(now) if self._queue else []
        alone, older = self._alone.shown, self._alone.older
        shared, before = self._shared.shown, self._shared.older
        if alone or older or shared or before:
            texts = [text for text in texts if not ((text in alone or text in older or text in shared or text in before)
                                                    and self._later(key, text, now))]
        hold = self.busy(key, now) or key in self._keys
        if not texts:
            return out
        if not hold:
            self._write((key,), texts, now, out)
            return out
        batch = _Batch(key, texts, now)
        self._keys.setdefault(key, deque()).append(batch)
        self._queue.append(batch)
        self._held += len(texts)
        for text in texts:
            _append(self._index, text, batch)
        if self._held > MAX_HELD:  # a flood: memory is bounded, not the window
            out += self._due(now, HOLD)
        return out

    def due(self, now: float, notes: bool = False) -> list[Line | Note]:
        """What has waited long enough, in order; with ``notes``, the later copies due to be noted too."""
        out = self._due(now, HOLD)
        if notes:
            self._notes(now, out, every=False)
        return out

    def release(self, now: float) -> list[Line | Note]:
        """Every held line, now (what comes next must not overtake them)."""
        return self._due(now, float("-inf")) if self._queue else []

    def flush(self, now: float) -> list[Line | Note]:
        """Everything held, and every later copy not noted yet (the output ended)."""
        out = self._due(now, float("-inf"))
        self._notes(now, out, every=True)
        return out

    def _due(self, now: float, hold: float) -> list[Line | Note]:
        out: list[Line | Note] = []
        queue = self._queue
        while queue:
            batch = queue[0]
            if batch.next < len(batch.texts):
                if now - batch.at < hold and self._held <= MAX_HELD:
                    break
                self._release(batch, now, out)
            queue.popleft()
        return out

    def _later(self, key: Key, text: str, now: float) -> bool:
        """Whether ``text`` from ``key`` is a later copy of a written line (counted for its note if so): of the
        first time it was written that ``key`` has no copy of yet, a copy for each time. Blank lines are never
        later copies (a note on one would say nothing)."""
        if not text.strip():
            return False
        found = []  # (record, its generation, its place in the generation's list or -1, whether alone), oldest first
        for memory in (self._alone, self._shared):
            for generation in (memory.older, memory.shown):
                entry = generation.get(text)
                if isinstance(entry, list):
                    found += [(record, generation, i, memory is self._alone) for i, record in enumerate(entry)]
                elif entry is not None:
                    found.append((entry, generation, -1, memory is self._alone))
        found.sort(key=lambda item: _at(item[0]))
        for record, generation, i, alone in found:
            copies = _copy(record, key, now)
            if copies is None:
                continue
            if alone:
                # its first copy: remembered where a flood of lines one rank prints cannot push it out
                entry = generation[text]
                if isinstance(entry, list) and len(entry) > 1:
                    del entry[i]
                else:
                    del generation[text]
                _append(self._shared.shown, text, copies, MAX_TIMES)  # (turned only as lines are written)
            elif i < 0:
                generation[text] = copies
            else:
                generation[text][i] = copies  # type: ignore[index]
            self._late[copies] = text
            return True
        return False

    def _release(self, batch: _Batch, now: float, out: list[Line | Note]) -> None:
        """Write what is left of the oldest held ``batch``: its lines, each folded with the copies held."""
        index, texts = self._index, batch.texts
        start = i = batch.next
        while i < len(texts):
            text = texts[i]
            held = index[text]
            if held is batch:  # no copy held: the common case, kept short
                del index[text]
                i += 1
                continue
            if all(other is batch for other in held):
                self._unindex(text, batch)
                i += 1
                continue
            if i > start:
                self._write((batch.key,), texts[start:i], now, out, i - start)
            batch.next = i
            self._fold(text, held, now, out)
            start = i = batch.next
        if i > start:
            self._write((batch.key,), texts[start:i], now, out, i - start)
        batch.next = i
        self._done(batch)

    def _fold(self, text: str, held: list[_Batch], now: float, out: list[Line | Note]) -> None:
        """Write ``text`` once for each key holding it (the oldest batch first), after the lines each of those
        keys printed before it (written at once, alone: they would otherwise come after it)."""
        members: dict[Key, _Batch] = {}
        for batch in held:
            members.setdefault(batch.key, batch)
        for batch in members.values():
            at = batch.texts.index(text, batch.next)
            queued = self._keys[batch.key]
            while queued[0] is not batch:
                self._force(queued[0], len(queued[0].texts), now, out)
            self._force(batch, at, now, out)
            self._unindex(text, batch)
            batch.next = at + 1
            if batch.next == len(batch.texts):
                self._done(batch)
        self._write(tuple(members), [text], now, out, len(members))

    def _force(self, batch: _Batch, end: int, now: float, out: list[Line | Note]) -> None:
        """Write ``batch``'s lines up to ``end`` now, each alone."""
        if end > batch.next:
            texts = batch.texts[batch.next:end]
            for text in texts:
                self._unindex(text, batch)
            batch.next = end
            self._write((batch.key,), texts, now, out, len(texts))
        if end == len(batch.texts):
            self._done(batch)

    def _done(self, batch: _Batch) -> None:
        """``batch`` is written: off its key's queue (the global one skips it)."""
        queued = self._keys.get(batch.key)
        if queued and queued[0] is batch:
            queued.popleft()
            if not queued:
                del self._keys[batch.key]

    def _unindex(self, text: str, batch: _Batch) -> None:
        held = self._index[text]
        if held is batch:
            del self._index[text]
            return
        held.remove(batch)
        if not held:
            del self._index[text]

    def _write(self, keys: tuple[Key, ...], texts: list[str], now: float, out: list[Line | Note],
               held: int = 0) -> None:
        """Write ``texts`` under ``keys`` (``held`` of them were held), remembered for their later copies."""
        self._held -= held
        if self._late:  # a line written again closes the notes on its earlier copies
            again = set(texts)
            for copies, text in list(self._late.items()):
                if text in again:
                    self._note(text, copies, out)
        shown, record = (self._alone if len(keys) == 1 else self._shared).current(now), (keys, now)
        fresh = dict.fromkeys(texts, record)
        if len(fresh) == len(texts) and shown.keys().isdisjoint(fresh):  # the common case, kept short
            shown.update(fresh)
        else:
            for text in texts:
                _append(shown, text, record, MAX_TIMES)
        out.append(Line(keys, texts))

    def _notes(self, now: float, out: list[Line | Note], every: bool) -> None:
        for copies, text in list(self._late.items()):
            if every or now - copies.late_last >= NOTE_QUIET or now - copies.late_first >= NOTE_EVERY:
                self._note(text, copies, out)

    def _note(self, text: str, copies: _Copies, out: list[Line | Note]) -> None:
        out.append(Note(tuple(copies.late), text, copies.first, max(copies.late.values()) - copies.at))
        copies.keys.update(copies.late)
        copies.late.clear()
        del self._late[copies]


def _natural(name: str) -> list[str | int]:
    """``crn10`` after ``crn9``: the numbers in a name compared as numbers."""
    return [int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", name))]


def label(keys: tuple[Key, ...]) -> str:
    """``[node:rank]`` for one key; ``[crn[0-63]:0-511]`` for many, the nodes in the order of their ranks;
    ``[crn[0-63]]`` for torchrun's own lines."""
    ordered = sorted(keys, key=lambda k: (-1 if k[1] is None else k[1], _natural(k[0])))
    nodes = list(dict.fromkeys(node for node, _ in ordered))
    ranks = [rank for _, rank in ordered if rank is not None]
    where = nodes[0] if len(nodes) == 1 else short_hostlist(nodes, NODES_MAX)
    return f"[{where}:{short_numbers(ranks, RANKS_MAX, 'ranks')}]" if ranks else f"[{where}]"


def these(keys: tuple[Key, ...]) -> str:
    """``these 37 ranks``, ``this rank``, ``these 3 nodes`` (torchrun's own lines)."""
    what = "rank" if any(rank is not None for _, rank in keys) else "node"
    return f"these {len(keys)} {what}s" if len(keys) > 1 else f"this {what}"
