"""ssh_config, read as OpenSSH reads it: the values that apply to one host, each with the file and line it came from.

This is clusterrun's own reader: the one used where the ``ssh`` binary is absent, and for plain files once
OpenSSH has checked them; elsewhere OpenSSH's ``ssh -G`` answers (:mod:`clusterrun.transport.ssh.resolve` says
which when).

``~/.ssh/config`` (or the inventory's ``config_file``, which, like ``ssh -F``, replaces both files) is read
first, then ``/etc/ssh/ssh_config``; for each keyword the first value that applies wins. ``~`` is the home
``ssh`` uses, the password database's (``$HOME`` does not change it; a ``$HOME`` with a ``.ssh/config`` of its
own is said once). ``Include`` is followed (relative names from ``~/.ssh``, or ``/etc/ssh`` in the system
file; globs), ``Host`` and ``Match`` blocks apply as in OpenSSH: ``Match exec`` runs its command (tokens expanded, under the user's shell, bounded)
and its block applies when the command succeeds; ``Match all`` followed by other criteria is refused, as
OpenSSH refuses it. A keyword OpenSSH does not know is an error with its file and line, unless an earlier
``IgnoreUnknown`` names it (OpenSSH stops there too: skipping it would connect where ``ssh`` would not). The
criteria of newer OpenSSH releases (``localnetwork``, ``tagged``) make their block not apply, with a warning
naming the file and line. What the values mean for a connection is
:mod:`clusterrun.transport.ssh.target`'s business.

Why not ``paramiko.SSHConfig``: it skips unknown keywords, does not follow ``Include``, evaluates ``Match exec``
with no bound, knows no origins (every error here names the file and line), and applies ``Host`` blocks after
``Match`` differently from OpenSSH's first-value-wins order in places; a wrong reading changes where clusterrun
connects, so the reader is OpenSSH's rules, tested against ``ssh -G``.
"""

from __future__ import annotations

import difflib
import glob
import logging
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from clusterrun.errors import UsageError
from clusterrun.transport.ssh.keywords import KEYWORDS
from clusterrun.transport.ssh.words import (
    Origin,
    expand_home,
    expand_tokens,
    local_user,
    matches_pattern_list,
    session_tokens,
    split_words,
    ssh_home,
    warn_once,
)

DEFAULT_CONFIG = "~/.ssh/config"
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
_MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Proxy:
    """How ssh_config says to reach a host: ``kind`` is ``command`` or ``jump``; ``value`` None means ``none``."""

    kind: str
    value: str | None
    origin: Origin


@dataclass
class HostConfig:
    """The ssh_config values that apply to one host: the first value of each keyword, lower-cased keys."""

    values: dict[str, tuple[str, Origin]] = field(default_factory=dict)
    identity_files: list[tuple[str, Origin]] = field(default_factory=list)
    proxy: Proxy | None = None

    def get(self, key: str) -> str | None:
        found = self.values.get(key)
        return found[0] if found else None

    def words(self, key: str) -> list[str]:
        found = self.values.get(key)
        return split_words(found[0], found[1]) if found else []

    def origin(self, key: str) -> Origin | None:
        found = self.values.get(key)
        return found[1] if found else None


_KEYWORD = re.compile(r"\s*([A-Za-z][A-Za-z0-9]*)(?:\s*=\s*|\s+|$)(.*)")
# Keywords whose value is the rest of the line, given to a shell as it is.
_WHOLE_LINE = {"proxycommand", "localcommand", "remotecommand", "knownhostscommand"}
# Keywords clusterrun reads (the others are skipped, as long as the line can be read).
_USED = {"hostname", "port", "user", "identityfile", "proxycommand", "proxyjump", "userknownhostsfile",
         "globalknownhostsfile", "stricthostkeychecking", "connecttimeout", "hostkeyalias", "hashknownhosts"}
_MATCH_SUPPORTED = {"all", "canonical", "final", "exec", "host", "originalhost", "user", "localuser"}
_MATCH_NEWER = {"localnetwork", "tagged"}  # criteria of OpenSSH releases after 9.2 that clusterrun does not evaluate
_MATCH_NO_ARGUMENT = {"all", "canonical", "final"}
MATCH_EXEC_TIMEOUT = 30.0  # seconds a `Match exec` command may run (OpenSSH sets none; clusterrun never hangs)
_EXEC_REUSE_S = 60.0  # one answer per expanded command for this long: 128 nodes do not run it 128 times at once
_exec_results: dict[str, tuple[bool, float]] = {}
_exec_lock = threading.Lock()


def _run_match_exec(command: str, origin: Origin) -> bool:
    """Whether ``command`` (tokens already expanded) succeeds, run as OpenSSH runs it: ``$SHELL -c``."""
    with _exec_lock:
        known = _exec_results.get(command)
        if known is not None and time.monotonic() - known[1] < _EXEC_REUSE_S:
            return known[0]
    shell = os.environ.get("SHELL") or "/bin/sh"
    try:
        done = subprocess.run([shell, "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, timeout=MATCH_EXEC_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise UsageError(f"{origin}: `Match exec {command}` ran past {MATCH_EXEC_TIMEOUT:g}s; make the command "
                         "answer quickly (ssh would wait for it forever)") from None
    except OSError as exc:
        raise UsageError(f"{origin}: cannot run `Match exec {command}` with {shell}: {exc}") from None
    with _exec_lock:
        _exec_results[command] = (done.returncode == 0, time.monotonic())
    return done.returncode == 0


@dataclass
class _Lookup:
    """State while reading ssh_config for one host (OpenSSH's readconf.c, the parts clusterrun uses)."""

    host: str  # as given: the inventory's host, an alias or an address
    user: str | None  # the inventory's user, like `ssh user@host`
    final: bool
    config: HostConfig = field(default_factory=HostConfig)
    wants_final: bool = False

    def match(self, text: str, origin: Origin) -> bool:
        words = split_words(text, origin)
        if not words:
            raise UsageError(f"{origin}: Match needs a criterion (for example `Match host gpu*`)")
        if words[0].lower() == "all" and len(words) > 1 and not words[1].startswith("#"):
            raise UsageError(f"{origin}: 'all' cannot be combined with other Match criteria (OpenSSH refuses this "
                             "file too); drop `all`, or give it a Match line of its own")
        result = True
        while words:
            word = words.pop(0)
            negate = word.startswith("!")
            criterion = word[1:].lower() if negate else word.lower()
            if criterion in _MATCH_NEWER:
                warn_once(log, f"{origin}: `Match {criterion}` is not supported by clusterrun: this Match block is "
                               "treated as not matching and its settings are not used (set them under a Host "
                               "line or in the inventory's ssh settings)")
                return False
            if criterion not in _MATCH_SUPPORTED:
                raise UsageError(f"{origin}: unsupported Match criterion {criterion!r} (OpenSSH refuses this file "
                                 "too); the criteria are all, canonical, final, exec, host, originalhost, user, "
                                 "localuser")
            if criterion in _MATCH_NO_ARGUMENT:
                if criterion == "all":
                    passed = True
                elif criterion == "final":
                    self.wants_final = True
                    passed = self.final
                else:  # canonical: clusterrun does not canonicalize host names
                    passed = False
            else:
                if not words:
                    raise UsageError(f"{origin}: `Match {criterion}` needs an argument")
                argument = words.pop(0)
                if criterion == "exec":
                    # As OpenSSH: not run once an earlier criterion failed; run with the tokens known so far.
                    passed = result and _run_match_exec(expand_tokens(argument, self.tokens(origin), origin), origin)
                    if passed == negate:
                        result = False
                    continue
                patterns = argument.split(",")
                hostname = self.config.get("hostname")
                subject = {
                    "host": expand_tokens(hostname, {"h": self.host}, origin) if hostname else self.host,
                    "originalhost": self.host,
                    "user": self.user or self.config.get("user") or local_user(),
                    "localuser": local_user(),
                }[criterion]
                passed = matches_pattern_list(patterns, subject)
            if passed == negate:
                result = False  # keep reading: later criteria still get their checks and warnings
        return result

    def tokens(self, origin: Origin) -> dict[str, str]:
        """The tokens of a ``Match exec`` command: the host, port and user as read so far."""
        hostname = self.config.get("hostname")
        host = expand_tokens(hostname, {"h": self.host}, origin) if hostname else self.host
        port = (self.config.words("port") or ["22"])[0]
        user = self.user or (self.config.words("user") or [local_user()])[0]
        return session_tokens(host, self.host, port, user, (self.config.words("hostkeyalias") or [None])[0])

    def known(self, keyword: str, origin: Origin) -> bool:
        """Whether to read a line of ``keyword``: an OpenSSH keyword, or one an earlier IgnoreUnknown names.
        Raises UsageError for any other (OpenSSH: "Bad configuration option")."""
        if keyword in KEYWORDS:
            return True
        ignored = [p for word in self.config.words("ignoreunknown") for p in word.split(",") if p]
        if matches_pattern_list(ignored, keyword):
            return False
        near = difflib.get_close_matches(keyword, KEYWORDS, n=1, cutoff=0.75)
        raise UsageError(f"{origin}: unknown ssh_config keyword {keyword!r} (OpenSSH refuses this file too: "
                         f"\"Bad configuration option\"){f'; did you mean {near[0]!r}?' if near else '.'} An option of "
                         "another SSH client (such as Apple's UseKeychain) can be named in an IgnoreUnknown line "
                         "before it")

    def read(self, path: Path, *, system: bool, active: bool, never_match: bool, depth: int) -> None:
        for origin, keyword, rest, patterns in config_lines(path):
            if not self.known(keyword, origin):
                continue
            if keyword == "host":
                active = not never_match and matches_pattern_list(patterns, self.host, case_sensitive=True)
            elif keyword == "match":
                matched = self.match(rest, origin)
                active = not never_match and matched
            elif keyword == "include":
                if active:
                    self.include(rest, origin, system=system, depth=depth)
            elif active:
                self.set(keyword, rest, origin)

    def include(self, rest: str, origin: Origin, *, system: bool, depth: int) -> None:
        if depth >= _MAX_INCLUDE_DEPTH:
            raise UsageError(f"{origin}: Include nested more than {_MAX_INCLUDE_DEPTH} deep (does a file include "
                             "itself?)")
        for name in split_words(rest, origin):
            name = expand_home(name)
            if not os.path.isabs(name):
                name = os.path.join("/etc/ssh" if system else os.path.join(ssh_home(), ".ssh"), name)
            for found in sorted(glob.glob(name)):
                if os.path.isfile(found):
                    # An included file starts in the including block's state and cannot leave it.
                    self.read(Path(found), system=system, active=True, never_match=False, depth=depth + 1)

    def set(self, keyword: str, rest: str, origin: Origin) -> None:
        config = self.config
        value = rest.strip() if keyword in _WHOLE_LINE else rest
        if not value.strip():
            if keyword in _USED:
                raise UsageError(f"{origin}: {keyword} needs a value")
            return
        if keyword == "identityfile":
            listed = {name for name, _ in config.identity_files}  # as OpenSSH, each file once
            config.identity_files += [(word, origin) for word in split_words(value, origin) if word not in listed]
        elif keyword in ("proxycommand", "proxyjump"):
            # As OpenSSH: whichever of the two comes first wins, `none` included.
            if config.proxy is None:
                if keyword == "proxyjump":
                    words = split_words(value, origin)
                    value = words[0] if words else ""
                config.proxy = Proxy("command" if keyword == "proxycommand" else "jump",
                                     None if value.lower() == "none" else value, origin)
        elif keyword not in config.values:
            config.values[keyword] = (value, origin)


_ConfigLine = tuple[Origin, str, str, list[str]]  # where, keyword (lower case), the rest, Host's patterns
_parsed: dict[tuple[str, int, int], list[_ConfigLine]] = {}
_parsed_lock = threading.Lock()


def config_lines(path: Path) -> list[_ConfigLine]:
    """The lines of one ssh_config file that say something, split once per version of the file: every node of
    a large inventory looks itself up in the same files, and each lookup walks every Host line."""
    try:
        info = path.stat()
    except OSError:
        info = None
    if info is not None and not path.is_file():  # a FIFO or a device would block or never end
        raise UsageError(f"{path}: is not a regular file, so not read as an ssh_config")
    key = (str(path), info.st_mtime_ns, info.st_size) if info is not None else None
    with _parsed_lock:
        if key is not None and key in _parsed:
            return _parsed[key]
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read this ssh_config: {exc}") from None
    lines: list[_ConfigLine] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        origin = Origin(str(path), lineno)
        parsed = _KEYWORD.fullmatch(stripped)
        if parsed is None:
            raise UsageError(f"{origin}: cannot read this ssh_config line: {stripped}")
        keyword, rest = parsed.group(1).lower(), parsed.group(2)
        patterns: list[str] = []
        if keyword == "host":
            patterns = split_words(rest, origin)
            if not patterns:
                raise UsageError(f"{origin}: Host needs at least one pattern")
        lines.append((origin, keyword, rest, patterns))
    if key is not None:
        with _parsed_lock:
            if len(_parsed) > 64:
                _parsed.clear()
            _parsed[key] = lines
    return lines


def config_files(config_file: str | None) -> list[tuple[Path, bool]]:
    """The ssh_config files to read, in order, each with whether it is the system file."""
    if config_file:
        path = Path(os.path.expanduser(config_file))
        if not path.is_file():
            what = "is not a regular file" if path.exists() else "not found"
            raise UsageError(f"{path}: ssh config_file {what} (set in the inventory's ssh settings or with "
                             "--ssh-config)")
        return [(path, False)]
    note = other_home_note()
    if note:
        warn_once(log, note)
    candidates = [(Path(expand_home(DEFAULT_CONFIG)), False), (Path(SYSTEM_CONFIG), True)]
    return [(path, system) for path, system in candidates if path.is_file()]


def other_home_note() -> str | None:
    """One line for a ``$HOME`` that is not the home ``ssh`` uses (the password database's) and holds a
    ``.ssh/config`` of its own: ``ssh``, and so clusterrun, read the other one; None otherwise."""
    home, env_home = ssh_home(), os.environ.get("HOME")
    if not env_home or os.path.realpath(env_home) == os.path.realpath(home):
        return None
    unread = os.path.join(env_home, ".ssh", "config")
    if not os.path.isfile(unread):
        return None
    return (f"{unread} is not read: ssh reads ~/.ssh/config from the password database's home ({home}), not "
            "$HOME, and so does clusterrun; to use the other file, pass --ssh-config $HOME/.ssh/config (or set "
            "config_file in the inventory's ssh settings)")


def lookup_config(host: str, files: list[tuple[Path, bool]], *, user: str | None = None) -> HostConfig:
    """The ssh_config values for ``host``, reading ``files`` in order (first value wins).

    ``user`` is the user given outside ssh_config (``Match user`` sees it). Raises UsageError naming the
    file and line of a line that cannot be read.
    """
    state = _Lookup(host, user, final=False)
    for path, system in files:
        state.read(path, system=system, active=True, never_match=False, depth=0)
    if state.wants_final:
        # `Match final` blocks apply in a second pass over the files, values of the first pass still first.
        final = _Lookup(host, user, final=True, config=state.config)
        for path, system in files:
            final.read(path, system=system, active=True, never_match=False, depth=0)
        return final.config
    return state.config
