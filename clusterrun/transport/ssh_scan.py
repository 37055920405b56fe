"""The lines of the ssh_config files OpenSSH would read, without evaluating them: for deciding whether ``ssh -G``
is needed at all, and for naming the file and line a value printed by ``ssh -G`` came from.

The scan follows every ``Include`` whatever block it sits in (a superset of what applies), so "no line sets a
keyword clusterrun uses" read here is true of every host. Like ``ssh`` (and clusterrun's reader), it takes
``~`` from the password database's home, not ``$HOME``.
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from clusterrun.errors import UsageError
from clusterrun.transport.ssh.config import config_lines
from clusterrun.transport.ssh.keywords import KEYWORDS
from clusterrun.transport.ssh.words import Origin, expand_home, split_words, ssh_home

_MAX_DEPTH = 16
#: Values ``ssh -G`` prints as written, tokens and all, which clusterrun then expands as it does for its reader.
_RAW = frozenset({"proxycommand", "identityfile"})


@dataclass
class Scan:
    """Every line of the files and of every file they include, in reading order; ``complete`` is False when an
    Include could not be followed (a token or variable in its name) or a line could not be split."""

    lines: tuple[tuple[Origin, str, str], ...]  # where, keyword (lower case), the rest of the line
    complete: bool
    version: tuple[tuple[str, int, int], ...]  # each file read: path, mtime_ns, size (an answer's cache key)
    globs: tuple[tuple[str, tuple[str, ...]], ...] = ()  # each Include's pattern and the files it found
    _memo: dict[tuple[object, ...], bool] = field(default_factory=dict, compare=False, repr=False)

    def current(self) -> bool:
        """Whether the files are still as scanned (same versions, every Include finding the same files)."""
        for path, mtime, size in self.version:
            try:
                info = os.stat(path)
            except OSError:
                return False
            if (info.st_mtime_ns, info.st_size) != (mtime, size):
                return False
        return all(tuple(sorted(glob.glob(pattern))) == found for pattern, found in self.globs)

    def sets_any(self, keywords: frozenset[str]) -> bool:
        """Whether the files might set one of ``keywords`` for some host, or hold something only OpenSSH can
        judge (a keyword it may not know, a line or Include this scan cannot follow)."""
        key = ("sets_any", keywords)
        if key not in self._memo:
            self._memo[key] = not self.complete or any(
                keyword in keywords or keyword not in KEYWORDS for _, keyword, _ in self.lines)
        return self._memo[key]

    def plain(self, used: frozenset[str]) -> bool:
        key = ("plain", used)
        if key not in self._memo:
            self._memo[key] = self._plain(used)
        return self._memo[key]

    def _plain(self, used: frozenset[str]) -> bool:
        """Whether clusterrun's reader gives what ``ssh -G`` gives for every host of these files, once OpenSSH
        has accepted each file: ``Host`` blocks only (no ``Match``: no exec, final or user criteria), every
        keyword one OpenSSH knows, no ``%`` token or ``${VAR}`` in a value clusterrun uses (but for ProxyCommand
        and IdentityFile, which ``ssh -G`` prints unexpanded as clusterrun's reader keeps them; ``~`` is the same
        for both, the password database's home), no upper case in a HostName (``ssh`` lowers it), no
        ``CanonicalizeHostname`` (OpenSSH reads the files again for the new name), and no ``none`` ProxyJump or ProxyCommand (how OpenSSH 9.2 lets a later one apply after it
        differs from later releases). Checked against ``ssh -G`` in tests/test_ssh_resolve.py."""
        if not self.complete:
            return False
        marks = ("%", "${")
        for _, keyword, rest in self.lines:
            if keyword == "match" or keyword not in KEYWORDS:
                return False
            if keyword in used and keyword not in _RAW and any(mark in rest for mark in marks):
                return False
            if keyword == "hostname" and rest != rest.lower():
                return False
            if keyword == "canonicalizehostname" and rest.strip().lower() not in ("no", "false"):
                return False
            if keyword in ("proxyjump", "proxycommand") and rest.strip().lower().strip("\"'") == "none":
                return False
        return True

    def locate(self, keyword: str, value: str) -> Origin | None:
        """The first line that sets ``keyword`` to ``value`` (as written, or as its words), if any."""
        return self.locate_where(keyword, lambda text: text == value)

    def locate_where(self, keyword: str, same: Callable[[str], bool]) -> Origin | None:
        """The first line of ``keyword`` whose value (as written, its first word, or its words) is ``same``."""
        for origin, word, rest in self.lines:
            if word != keyword:
                continue
            text = rest.strip()
            try:
                words = split_words(text, origin)
            except UsageError:
                words = []
            if same(text) or (words and (same(words[0]) or same(" ".join(words)))):
                return origin
        return None


_scans: dict[tuple[tuple[Path, bool], ...], Scan] = {}
_scans_lock = threading.Lock()


def scan(files: list[tuple[Path, bool]]) -> Scan:
    """The lines of ``files`` (see :class:`Scan`); never raises: what cannot be read makes the scan incomplete.

    Kept while the files stay as they were: every node of a launch asks about the same files."""
    key = tuple(files)
    with _scans_lock:
        known = _scans.get(key)
    if known is not None and known.current():
        return known
    lines: list[tuple[Origin, str, str]] = []
    version: list[tuple[str, int, int]] = []
    globs: list[tuple[str, tuple[str, ...]]] = []
    complete = _scan_into(lines, version, globs, files, 0)
    found = Scan(tuple(lines), complete, tuple(version), tuple(globs))
    with _scans_lock:
        if len(_scans) > 16:
            _scans.clear()
        _scans[key] = found
    return found


def _scan_into(lines: list[tuple[Origin, str, str]], version: list[tuple[str, int, int]],
               globs: list[tuple[str, tuple[str, ...]]], files: list[tuple[Path, bool]], depth: int) -> bool:
    if depth > _MAX_DEPTH:
        return False
    complete = True
    for path, system in files:
        try:
            info = path.stat()
            version.append((str(path), info.st_mtime_ns, info.st_size))
            found = config_lines(path)
        except (OSError, UsageError):
            return False
        for origin, keyword, rest, _ in found:
            lines.append((origin, keyword, rest))
            if keyword != "include":
                continue
            try:
                names = split_words(rest, origin)
            except UsageError:
                return False
            for name in names:
                if "%" in name or "$" in name:
                    return False
                name = expand_home(name)
                if not os.path.isabs(name):
                    name = os.path.join("/etc/ssh" if system else os.path.join(ssh_home(), ".ssh"), name)
                matched = tuple(sorted(glob.glob(name)))
                globs.append((name, matched))
                included = [(Path(p), system) for p in matched if os.path.isfile(p)]
                complete = _scan_into(lines, version, globs, included, depth + 1) and complete
    return complete
