"""Where a run's lines go on the orchestrator's terminal.

Every line is written whole, by one thread, prefixed ``[node:rank]`` (``[node]`` for
torchrun's own messages); on a terminal each node gets its own colour. What is shown
may be less than what is logged, never more:

* a line longer than DISPLAY_MAX characters is shortened with a visible mark (the rank
  log holds it whole);
* a progress bar (records ending in a lone carriage return, as tqdm writes them) is shown
  at most once per BAR_EVERY_TTY seconds per rank on a terminal and once per BAR_EVERY_PIPE
  seconds when stdout is a file or a pipe; its last state is always shown;
* control characters are shown escaped (``\x1b]0;title\x07`` prints as text), so a rank's output
  cannot retitle, clear or move the terminal, or write to its clipboard; colours (SGR sequences,
  ``ESC [ ... m``) are kept. ``raw`` shows everything as it came;
* torchrun's own lines: with ``ranks``, only the nodes that hold one of them (errors always); torchrun's
  known end-of-run noise (the exit-barrier error of a node whose ranks had finished,
  :mod:`clusterrun.facts.torchrun_noise`) is kept in launcher.log only, and said once in one line;
* c10d's reverse-lookup warning, which every torchrun and every rank writes where no DNS server answers
  (:func:`clusterrun.facts.torchrun_noise.is_lookup_note`), is said once, as harmless; the logs keep each copy;
* with ``fold``, a line many ranks printed alike is shown once under all their ranks, ``[crn[0-63]:0-511]``
  (torchrun's own lines alike under their nodes), after waiting at most half a second for its copies; copies
  that come later are not shown again but named in one note (:mod:`clusterrun.launch.fold`).

Standard library only: it also runs on the nodes.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TextIO

from clusterrun.facts.torchrun_noise import LOOKUP_NOTE, NoiseFilter, Sorted, is_lookup_note
from clusterrun.launch.fold import Folder, Key, Line, Note, label, these

DISPLAY_MAX = 16 << 10  # characters of one line shown on the terminal
BAR_EVERY_TTY = 1.0  # seconds between two shown updates of one rank's progress bar, on a terminal
BAR_EVERY_PIPE = 20.0  # ... when stdout is not a terminal (a log file, CI)
_RECORDS = re.compile(rb"(\r\n|\n|\r)")
# A colour (kept), or any other C0/C1 control character but tab (shown escaped).
_CONTROL = re.compile(r"(\x1b\[[0-9;:]*m)|[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")


def _escape(match: re.Match[str]) -> str:
    return match.group(1) or f"\\x{ord(match.group(0)):02x}"


def safe(text: str) -> str:
    """``text`` with every control character but tab and colours written as ``\\xNN``."""
    return _CONTROL.sub(_escape, text) if _CONTROL.search(text) else text


@dataclass
class _Held:
    text: str = ""  # the first DISPLAY_MAX + 1 characters of an unfinished record
    extra: int = 0  # characters beyond them


@dataclass
class _Bar:
    text: str | None = None  # the latest update not shown yet
    shown_at: float = float("-inf")


def shorten(text: str, limit: int = DISPLAY_MAX) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]} …[{len(text) - limit} more characters; the rank log has the whole line]"

# Each node's prefix colour (SGR foreground: cyan, green, yellow, magenta, blue, their bright forms, red, white);
# a line folded from several nodes gets bold instead, so it is never taken for one node's.
_PALETTE = (36, 32, 33, 35, 34, 96, 92, 93, 95, 94, 31, 37)
_BOLD = 1
QUOTE_MAX = 80  # characters of a line quoted in a note on its later copies


class Console:
    """Prints rank lines and clusterrun's own messages.

    ``ranks``: only these global ranks' lines are shown (all when None);
    ``quiet``: no rank lines at all (the logs are still written); ``fold``: lines many ranks printed alike
    are shown once under all their ranks; ``clock``: the time (seconds) a line came, when not given.
    """

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None, *, color: bool | None = None,
                 ranks: Collection[int] | None = None, quiet: bool = False, show_launcher: bool = True,
                 raw: bool = False, fold: bool = False, clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.color = self.out.isatty() if color is None else color
        self.ranks = set(ranks) if ranks is not None else None
        self.quiet = quiet
        self.show_launcher = show_launcher
        self._colors: dict[str, int] = {}
        self.bar_every = BAR_EVERY_TTY if self.out.isatty() else BAR_EVERY_PIPE
        self._partial: dict[tuple[str, int, str], _Held] = {}  # an unfinished record's first characters
        self._bars: dict[tuple[str, int, str], _Bar] = {}
        self.closed = False  # stdout's reader went away
        self.raw = raw  # show control characters as they came
        self._noise: dict[str, NoiseFilter] = {}  # per node: torchrun's lines held back while they may be noise
        self.noise_said = False  # the one line about torchrun's exit-barrier noise was written
        self.lookup_said = False  # the one line about c10d's reverse-lookup warning was written
        # Identical lines folded: the ranks' lines, and torchrun's own (never folded with a rank's line).
        self._folders = (Folder(), Folder()) if fold else None
        self.folds = fold
        self._prefixes: dict[Key, str] = {}  # one key's prefix, as written
        self.clock = clock  # the time rank lines came, when not given

    def _prefix(self, tag: str, node: str) -> str:
        if not self.color:
            return tag
        color = self._colors.setdefault(node, _PALETTE[len(self._colors) % len(_PALETTE)])
        return f"\x1b[{color}m{tag}\x1b[0m"

    def _label(self, keys: tuple[Key, ...]) -> str:
        if len(keys) == 1:
            prefix = self._prefixes.get(keys[0])
            if prefix is None:
                node, rank = keys[0]
                prefix = self._prefixes[keys[0]] = self._prefix(f"[{node}]" if rank is None else f"[{node}:{rank}]",
                                                                node)
            return prefix
        return f"\x1b[{_BOLD}m{label(keys)}\x1b[0m" if self.color else label(keys)

    def shows(self, rank: int) -> bool:
        return not self.quiet and not self.closed and (self.ranks is None or rank in self.ranks)

    def _emit(self, text: str) -> None:
        """Write to ``out``; once its reader is gone (``clusterrun up ... | head``), show nothing more. The job
        and its logs go on: only the screen was closed."""
        if self.closed:
            return
        try:
            self.out.write(text)
            self.out.flush()
        except (BrokenPipeError, ValueError, OSError):
            self.closed = True
            self._detach_stdout()
            self.info("stdout was closed: rank output is no longer shown; it is still written to runs/")

    def _detach_stdout(self) -> None:
        # Python would try to flush the dead pipe again at exit and complain: point stdout at /dev/null.
        if self.out is sys.stdout:
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)
            except (OSError, ValueError):
                pass

    def _known_note(self, node: str, text: str) -> bool:
        """Whether ``text`` is c10d's reverse-lookup warning, which is then said once, not shown."""
        if not is_lookup_note(text):
            return False
        if not self.lookup_said:
            self.lookup_said = True
            self.info(f"{node}: {LOOKUP_NOTE}")
        return True

    def _write_lines(self, node: str, rank: int, texts: list[str], now: float | None = None) -> None:
        texts = [t for t in texts if not self._known_note(node, t)]
        if not texts:
            return
        if self._folders is not None:
            self._show(self._folders[0].add((node, rank), texts, self.clock() if now is None else now))
            return
        prefix = self._prefix(f"[{node}:{rank}]", node)
        body = "".join(f"{prefix} {shorten(t)}\n" for t in texts)
        self._emit(body if self.raw else safe(body))

    def _show(self, lines: list[Line | Note]) -> None:
        """Write what the folders let out: lines under their ranks, notes on later copies."""
        if not lines:
            return
        parts = []
        for line in lines:
            if isinstance(line, Line):
                prefix = self._label(line.keys)
                parts.extend(f"{prefix} {shorten(text)}\n" for text in line.texts)
                continue
            quote = line.text if len(line.text) <= QUOTE_MAX else f"{line.text[:QUOTE_MAX]}…"
            parts.append(f'{self._label(line.keys)} (the line "{quote}" also came from {these(line.keys)}, up to '
                         f"{line.delay:.1f} s after {label(line.shown)}; not shown again)\n")
        body = "".join(parts)
        self._emit(body if self.raw else safe(body))

    def rank_output(self, node: str, rank: int, stream: str, data: bytes, more: bool = False,
                    now: float | None = None) -> None:
        """Show a piece of a rank's output: whole records, or (``more``) the start of one that goes on."""
        if not self.shows(rank) or not data:
            return
        key = (node, rank, stream)
        if b"\r" not in data and not more and key not in self._partial:  # the common case: whole lines
            texts = data.decode("utf-8", errors="replace").split("\n")
            if texts[-1] == "":
                texts.pop()
            self._write_lines(node, rank, texts, now)
            return
        now = self.clock() if now is None else now
        texts = []
        parts = _RECORDS.split(data)  # text, terminator, text, terminator, ..., text
        for i in range(0, len(parts), 2):
            raw, end = parts[i], parts[i + 1] if i + 1 < len(parts) else None
            if end is None and not raw:
                continue
            text = self._join_partial(key, raw.decode("utf-8", errors="replace"), done=end is not None or not more)
            if text is None:
                continue
            if end == b"\r":  # a progress bar's state (tqdm writes "\r" + bar); an empty one is its start
                if text:
                    bar = self._bars.setdefault(key, _Bar())
                    if now - bar.shown_at >= self.bar_every:
                        texts.append(text)
                        bar.text, bar.shown_at = None, now
                    else:
                        bar.text = text
                continue
            if key in self._bars:
                self._bars[key].text = None  # a finished line (the bar's last state) supersedes pending updates
            texts.append(text)
        self._write_lines(node, rank, texts, now)

    def _join_partial(self, key: tuple[str, int, str], text: str, done: bool) -> str | None:
        """The whole record's text once ``done``; until then, keep its start (a bounded part of it)."""
        held = self._partial.get(key)
        if held is None and done:
            return text
        if held is None:
            held = self._partial[key] = _Held()
        room = max(0, DISPLAY_MAX + 1 - len(held.text))
        held.text += text[:room]
        held.extra += max(0, len(text) - room)
        if not done:
            return None
        del self._partial[key]
        return held.text if not held.extra else f"{shorten(held.text)} …[+{held.extra} characters]"

    def tick(self, now: float | None = None, final: bool = False) -> None:
        """Show progress bar updates held back for longer than the rate allows (all of them when ``final``)."""
        now = self.clock() if now is None else now
        for (node, rank, _stream), bar in self._bars.items():
            if bar.text is not None and (final or now - bar.shown_at >= self.bar_every):
                self._write_lines(node, rank, [bar.text], now)
                bar.text, bar.shown_at = None, now
        self._node_ticks(now, final)
        if final:
            for (node, rank, _stream), held in list(self._partial.items()):
                self._write_lines(node, rank, [held.text], now)
            self._partial.clear()
        for folder in self._folders or ():  # lines that waited their time for copies; notes on later copies
            self._show(folder.flush(now) if final else folder.due(now, notes=True))
        if final and self._folders is not None:  # the output ended: a restarted job's lines are new lines
            self._folders = (Folder(), Folder())

    def node_line(self, node: str, text: str, ranks: Collection[int] | None = None, error: bool = False,
                  now: float | None = None) -> None:
        """A line of torchrun's own output on ``node`` (which holds the global ``ranks``): with a rank filter,
        shown only for a node that holds a shown rank; an ``error`` (torchrun could not start) always."""
        if self.quiet or not self.show_launcher:
            return
        if not error and self.ranks is not None and ranks is not None and not self.ranks.intersection(ranks):
            return  # another node's banner and messages: they stay in its launcher.log
        if error:
            self._node_lines(node, self._noise.pop(node, NoiseFilter()).flush(), now)
            self._node_lines(node, Sorted((text,)), now)
            return
        if self._known_note(node, text):
            return
        now = self.clock() if now is None else now
        noise = self._noise.setdefault(node, NoiseFilter())
        self._node_lines(node, noise.feed(text, now), now)

    def _node_lines(self, node: str, lines: Sorted, now: float | None) -> None:
        if self._folders is not None and lines.show:
            self._show(self._folders[1].add((node, None), list(lines.show), self.clock() if now is None else now))
        else:
            for text in lines.show:
                self._emit(f"{self._prefix(f'[{node}]', node)} {text if self.raw else safe(text)}\n")
        if lines.noise and not self.noise_said:
            self.noise_said = True
            self.info(f"{node}: torchrun's exit-barrier error after its ranks had finished (harmless: the master's "
                      "torchrun had already gone) is kept in its launcher.log")

    def _node_ticks(self, now: float, final: bool) -> None:
        for node, noise in self._noise.items():
            if noise.holding:
                self._node_lines(node, noise.flush() if final else noise.due(now), now)

    def info(self, text: str) -> None:
        for folder in self._folders or ():  # what the ranks printed before this is shown before it
            self._show(folder.release(self.clock()))
        self.err.write(f"clusterrun: {text if self.raw else safe(text)}\n")
        self.err.flush()
